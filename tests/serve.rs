//! The control server's API against real experiments: `wtune run --serve`
//! on the `stateful` guest, and `wtune serve DIR` on a finished one. Each
//! endpoint of `host/src/serve/openapi.json` is called with good and bad
//! input; every wait polls for a state with a generous limit.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// A `wtune` process, killed if the test ends before it does.
struct Wtune {
    child: Child,
    url: String,
}

impl Drop for Wtune {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `wtune` with `args` and waits for its `serving the dashboard at
/// URL` line.
fn start(args: &[&str]) -> Wtune {
    let mut child = common::wtune()
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start wtune");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let url = line
                .split("serving the dashboard at ")
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next());
            if let Some(url) = url {
                let _ = tx.send(Ok(url.to_string()));
            } else {
                let _ = tx.send(Err(line));
            }
        }
    });
    let mut said = String::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(300)) {
            Ok(Ok(url)) => return Wtune { child, url },
            Ok(Err(line)) => said.push_str(&format!("{line}\n")),
            Err(_) => panic!("wtune never served; it said:\n{said}"),
        }
    }
}

/// An HTTP client that returns every status rather than failing on 4xx.
fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into()
}

/// `(status, JSON body)` of a request; `token` as a bearer token.
fn call(method: &str, url: &str, body: Option<&str>, token: Option<&str>) -> (u16, Value) {
    let agent = agent();
    let auth = token.map(|t| format!("Bearer {t}"));
    let response = match (method, body) {
        ("GET", _) => {
            let mut request = agent.get(url);
            if let Some(auth) = &auth {
                request = request.header("Authorization", auth);
            }
            request.call()
        }
        ("POST", body) => {
            let mut request = agent.post(url).header("Content-Type", "application/json");
            if let Some(auth) = &auth {
                request = request.header("Authorization", auth);
            }
            request.send(body.unwrap_or(""))
        }
        ("DELETE", _) => agent.delete(url).call(),
        _ => unreachable!(),
    };
    let mut response = response.unwrap_or_else(|e| panic!("{method} {url}: {e}"));
    let status = response.status().as_u16();
    let text = response
        .body_mut()
        .with_config()
        .limit(64 << 20)
        .read_to_string()
        .unwrap();
    let value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{method} {url} answered {status} with non-JSON ({e}): {text}"));
    (status, value)
}

fn get(url: &str) -> (u16, Value) {
    call("GET", url, None, None)
}

fn post(url: &str, body: &str) -> (u16, Value) {
    call("POST", url, Some(body), None)
}

/// Polls `probe` until it gives a value.
fn wait_for<T>(what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let started = Instant::now();
    loop {
        if let Some(value) = probe() {
            return value;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "gave up waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The trial `id` as the list shows it.
fn listed(url: &str, id: &str) -> Option<Value> {
    let (status, body) = get(&format!("{url}api/trials"));
    assert_eq!(status, 200, "{body}");
    body["trials"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["trial_id"] == id)
        .cloned()
}

/// Three trials that run until stopped (a 2 MiB buffer rewritten per
/// step, 100,000 steps), two at a time.
fn slow_experiment(dir: &Path) -> PathBuf {
    let path = dir.join("experiment.toml");
    std::fs::write(
        &path,
        r#"
name = "served"
metric = "counter"
mode = "max"
max_concurrent_trials = 2
[param_space]
seed = { grid_search = [1, 2, 3] }
buffer_kib = 2048
iterations = 100000
[stop]
training_iteration = 100000
"#,
    )
    .unwrap();
    path
}

/// Sends `head` (a request line and headers, without the blank line) as
/// is, with no body, and gives the answer's status and text: for headers
/// an HTTP client would not send (another `Host`), and for announcing a
/// body too large without sending it (sending it all would race the server
/// closing the connection).
fn raw(url: &str, head: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let host = url.trim_start_matches("http://").trim_end_matches('/');
    let mut stream = std::net::TcpStream::connect(host).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let head = head.replace("HOST", host);
    write!(stream, "{head}\r\nConnection: close\r\n\r\n").unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP status in {answer:?}"));
    (status, answer)
}

fn assert_error(answer: (u16, Value), status: u16, says: &str) {
    assert_eq!(answer.0, status, "{}", answer.1);
    let message = answer.1["error"]
        .as_str()
        .unwrap_or_else(|| panic!("{}", answer.1));
    assert!(message.contains(says), "{message:?} should say {says:?}");
}

#[test]
fn the_api_shows_a_running_experiment_and_carries_out_requests() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let config = slow_experiment(dir.path());
    let guest = common::guest("stateful");
    let mut wtune = start(&[
        "run",
        guest.to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
        "--seed",
        "1",
        "--output-dir",
        out.to_str().unwrap(),
        "--serve=127.0.0.1:0",
    ]);
    let url = wtune.url.clone();

    let experiment = wait_for("the first state", || {
        let (status, body) = get(&format!("{url}api/experiment"));
        (status == 200).then_some(body)
    });
    assert_eq!(experiment["name"], "served");
    assert_eq!(experiment["control"], true);
    assert_eq!(experiment["status"], "running");
    assert_eq!(experiment["metric"], "counter");
    assert_eq!(experiment["mode"], "max");
    wait_for("two running trials with results", || {
        let (_, body) = get(&format!("{url}api/experiment"));
        (body["counts"]["RUNNING"] == 2 && body["best"].is_object()).then_some(())
    });

    // Results come incrementally from an offset.
    let results = |offset: u64| {
        let (status, body) = get(&format!(
            "{url}api/trials/trial_0000/results?offset={offset}"
        ));
        assert_eq!(status, 200, "{body}");
        body
    };
    let first = wait_for("results of trial_0000", || {
        let body = results(0);
        (!body["results"].as_array().unwrap().is_empty()).then_some(body)
    });
    let seen = first["results"].as_array().unwrap().len() as u64;
    assert_eq!(first["results"][0]["training_iteration"], 1);
    let next = first["next_offset"].as_u64().unwrap();
    let more = wait_for("newer results", || {
        let body = results(next);
        (!body["results"].as_array().unwrap().is_empty()).then_some(body)
    });
    assert_eq!(more["results"][0]["training_iteration"], seen + 1);
    // The offset is in the file the answer named: in another (a cut back
    // replaces it), the answer starts over.
    let file = first["file"].as_str().unwrap();
    let (_, same) = get(&format!(
        "{url}api/trials/trial_0000/results?offset={next}&file={file}"
    ));
    assert_eq!(same["reset"], false, "{same}");
    let (_, other) = get(&format!(
        "{url}api/trials/trial_0000/results?offset={next}&file=1"
    ));
    assert_eq!(other["reset"], true, "{other}");
    assert_eq!(other["results"][0]["training_iteration"], 1);
    let (_, limited) = get(&format!("{url}api/trials/trial_0000/results?limit=1"));
    assert_eq!(limited["results"].as_array().unwrap().len(), 1);
    let (_, logs) = get(&format!("{url}api/trials/trial_0000/logs?tail=4096"));
    assert!(logs["text"].as_str().unwrap().contains("seed 1"), "{logs}");

    // Bad requests: JSON errors, nothing changes.
    assert_error(get(&format!("{url}api/trials/trial_0042")), 404, "no trial");
    assert_error(
        post(&format!("{url}api/trials/trial_0042/stop"), ""),
        404,
        "no trial",
    );
    assert_error(
        get(&format!("{url}api/trials/..%2F..%2Fetc/logs")),
        404,
        "no trial",
    );
    assert_error(get(&format!("{url}api/nowhere")), 404, "no such route");
    assert_error(
        call("DELETE", &format!("{url}api/trials"), None, None),
        405,
        "not allowed",
    );
    assert_error(
        get(&format!("{url}api/trials/trial_0000/results?offset=-1")),
        400,
        "offset",
    );
    assert_error(
        get(&format!("{url}api/trials/trial_0000/results?limit=0")),
        400,
        "limit",
    );
    assert_error(
        get(&format!("{url}api/trials/trial_0000/logs?offset=1&tail=1")),
        400,
        "not both",
    );
    assert_error(
        post(&format!("{url}api/trials"), "{not json"),
        400,
        "config",
    );
    assert_error(
        post(&format!("{url}api/trials"), r#"{"config": [1]}"#),
        400,
        "JSON object",
    );
    assert_error(
        post(&format!("{url}api/trials"), r#"{"config": {}, "extra": 1}"#),
        400,
        "extra",
    );
    let (status, body) = raw(
        &url,
        "POST /api/trials HTTP/1.1\r\nHost: HOST\r\nContent-Type: application/json\r\n\
         Content-Length: 2097152",
    );
    assert_eq!(status, 413, "{body}");
    assert!(body.contains("limited to"), "{body}");
    // What another site's page could make a browser send is refused: a
    // request under another name (DNS rebinding), a write from another
    // origin, a body that is not JSON (which needs no CORS preflight).
    let (status, body) = raw(&url, "GET /api/trials HTTP/1.1\r\nHost: evil.example");
    assert_eq!(status, 403, "{body}");
    let (status, body) = raw(
        &url,
        "POST /api/experiment/stop HTTP/1.1\r\nHost: HOST\r\nOrigin: http://evil.example\r\n\
         Content-Length: 0",
    );
    assert_eq!(status, 403, "{body}");
    let (status, body) = raw(
        &url,
        "POST /api/trials HTTP/1.1\r\nHost: HOST\r\nContent-Type: text/plain\r\n\
         Content-Length: 0",
    );
    assert_eq!(status, 415, "{body}");
    assert_error(
        post(&format!("{url}api/trials/trial_0000/resume"), ""),
        409,
        "not held",
    );

    // Pause: checkpointed, then held PAUSED; the third trial takes the slot.
    let (status, paused) = post(&format!("{url}api/trials/trial_0001/pause"), "");
    assert_eq!(status, 202, "{paused}");
    assert_eq!(paused["trial"]["held"], true);
    let held = wait_for("trial_0001 PAUSED", || {
        let (_, trial) = get(&format!("{url}api/trials/trial_0001"));
        (trial["status"] == "PAUSED").then_some(trial)
    });
    assert_eq!(held["held"], true);
    let checkpoints = held["checkpoints"].as_array().unwrap();
    assert_eq!(
        checkpoints.last().unwrap()["iteration"],
        held["iterations"],
        "paused at a checkpoint of its last step: {held}"
    );
    wait_for("trial_0002 running in the freed slot", || {
        let trial = listed(&url, "trial_0002")?;
        (trial["status"] == "RUNNING").then_some(())
    });

    // Stop: the trial ends TERMINATED after its step; the others go on.
    let (status, stopping) = post(&format!("{url}api/trials/trial_0000/stop"), "");
    assert_eq!(status, 202, "{stopping}");
    let stopped = wait_for("trial_0000 TERMINATED in the list", || {
        let trial = listed(&url, "trial_0000")?;
        (trial["status"] == "TERMINATED").then_some(trial)
    });
    assert_eq!(stopped["stop_reason"], "stopped by a control request");
    assert_error(
        post(&format!("{url}api/trials/trial_0000/stop"), ""),
        409,
        "already ended",
    );
    assert_eq!(listed(&url, "trial_0002").unwrap()["status"], "RUNNING");

    // Resume the held trial: it takes the slot trial_0000 left.
    let (status, resumed) = post(&format!("{url}api/trials/trial_0001/resume"), "");
    assert_eq!(status, 202, "{resumed}");
    wait_for("trial_0001 running again", || {
        let (_, trial) = get(&format!("{url}api/trials/trial_0001"));
        (trial["status"] == "RUNNING"
            && trial["iterations"].as_u64()? > held["iterations"].as_u64()?)
        .then_some(())
    });

    // Add a trial: it gets the next id and exactly this config, and runs.
    let config = json!({"seed": 7, "buffer_kib": 64, "iterations": 5});
    let (status, added) = post(
        &format!("{url}api/trials"),
        &json!({"config": config}).to_string(),
    );
    assert_eq!(status, 201, "{added}");
    let id = added["trial"]["trial_id"].as_str().unwrap().to_string();
    assert_eq!(id, "trial_0003");
    assert_eq!(added["trial"]["config"], config);
    // Stop one of the slow trials to make room for it.
    post(&format!("{url}api/trials/trial_0002/stop"), "");
    let finished = wait_for("the added trial to finish", || {
        let (_, trial) = get(&format!("{url}api/trials/{id}"));
        (trial["status"] == "TERMINATED").then_some(trial)
    });
    assert_eq!(finished["iterations"], 5);

    // Stop the experiment: running trials are paused for `wtune resume`,
    // and wtune exits 0.
    let (status, body) = post(&format!("{url}api/experiment/stop"), "");
    assert_eq!(status, 202, "{body}");
    let exit = wait_for("wtune to exit", || wtune.child.try_wait().unwrap());
    assert!(exit.success(), "{exit:?}");
    let state = wtune::report::state::load(&out, false).unwrap().unchecked();
    let status_of = |id: &str| {
        state
            .trials
            .iter()
            .find(|t| t.trial_id == id)
            .map(|t| t.status.to_string())
            .unwrap()
    };
    assert_eq!(status_of("trial_0000"), "TERMINATED");
    assert_eq!(status_of("trial_0001"), "PAUSED");
    assert_eq!(status_of("trial_0003"), "TERMINATED");

    // `wtune serve DIR` shows the stopped experiment, without control.
    let viewer = start(&["serve", out.to_str().unwrap(), "--addr", "127.0.0.1:0"]);
    let (status, experiment) = get(&format!("{}api/experiment", viewer.url));
    assert_eq!(status, 200, "{experiment}");
    assert_eq!(experiment["control"], false);
    assert_eq!(experiment["status"], "halted");
    assert_eq!(experiment["counts"]["TERMINATED"], 3);
    assert_error(
        post(&format!("{}api/trials/trial_0001/resume", viewer.url), ""),
        409,
        "wtune resume",
    );
    let (status, results) = get(&format!("{}api/trials/trial_0003/results", viewer.url));
    assert_eq!(status, 200);
    assert_eq!(results["results"].as_array().unwrap().len(), 5);
}

/// A finished experiment of one short trial, for `wtune serve`.
fn finished_experiment(dir: &Path) -> PathBuf {
    let out = dir.join("out");
    let status = common::wtune()
        .arg("run")
        .arg(common::guest("stateful"))
        .args([
            "--num-samples",
            "1",
            "--stop",
            "training_iteration=3",
            "--seed",
            "1",
        ])
        .arg("--output-dir")
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    out
}

#[test]
fn any_loopback_address_serves_without_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let out = finished_experiment(dir.path());
    // All of 127.0.0.0/8 is this machine's: the check at start lets it
    // through, so requests addressed to it must be answered.
    let server = start(&["serve", out.to_str().unwrap(), "--addr", "127.0.0.2:0"]);
    let (status, experiment) = get(&format!("{}api/experiment", server.url));
    assert_eq!(status, 200, "{experiment}");
    let (status, body) = raw(&server.url, "GET /api/trials HTTP/1.1\r\nHost: [::1]:8267");
    assert_eq!(status, 200, "{body}");
    // A name is still refused: it may have been rebound to this address.
    let (status, body) = raw(
        &server.url,
        "GET /api/trials HTTP/1.1\r\nHost: evil.example",
    );
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("a loopback address"), "{body}");
}

#[test]
fn a_token_guards_the_api_and_the_network_needs_one() {
    let dir = tempfile::tempdir().unwrap();
    let out = finished_experiment(dir.path());
    let out_arg = out.to_str().unwrap();
    let token = "a-long-random-token-0123456789";
    let server = start(&["serve", out_arg, "--addr", "127.0.0.1:0", "--token", token]);
    let url = &server.url;
    assert_error(get(&format!("{url}api/trials")), 401, "Bearer");
    assert_error(
        call(
            "GET",
            &format!("{url}api/trials"),
            None,
            Some("wrong-token-wrong-token"),
        ),
        401,
        "wrong",
    );
    let (status, body) = call("GET", &format!("{url}api/trials"), None, Some(token));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["trials"].as_array().unwrap().len(), 1);
    // The page itself holds no data: it loads without the token.
    let mut page = agent().get(url.as_str()).call().unwrap();
    assert_eq!(page.status().as_u16(), 200);
    assert!(page.body_mut().read_to_string().unwrap().contains("<html"));

    // Refused before anything listens.
    for (args, says) in [
        (
            vec!["serve", out_arg, "--addr", "0.0.0.0:0"],
            "reachable from other machines",
        ),
        (
            vec![
                "serve",
                out_arg,
                "--addr",
                "127.0.0.1:0",
                "--token",
                "short",
            ],
            "at least 16",
        ),
        (
            vec![
                "serve",
                dir.path().to_str().unwrap(),
                "--addr",
                "127.0.0.1:0",
            ],
            "experiment directory",
        ),
    ] {
        let output = common::wtune()
            .args(&args)
            .env_remove("WTUNE_SERVE_TOKEN")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}

#[test]
fn the_openapi_document_describes_every_route() {
    let dir = tempfile::tempdir().unwrap();
    let out = finished_experiment(dir.path());
    let server = start(&["serve", out.to_str().unwrap(), "--addr", "127.0.0.1:0"]);
    let (status, doc) = get(&format!("{}api/openapi.json", server.url));
    assert_eq!(status, 200);
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let mut paths: Vec<(String, String)> = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, ops)| {
            ops.as_object()
                .unwrap()
                .keys()
                .filter(|k| ["get", "post"].contains(&k.as_str()))
                .map(move |op| (op.clone(), path.clone()))
        })
        .collect();
    paths.sort();
    let expected = [
        ("get", "/"),
        ("get", "/app.js"),
        ("get", "/style.css"),
        ("get", "/api/experiment"),
        ("get", "/api/openapi.json"),
        ("get", "/api/trials"),
        ("get", "/api/trials/{id}"),
        ("get", "/api/trials/{id}/logs"),
        ("get", "/api/trials/{id}/results"),
        ("post", "/api/experiment/stop"),
        ("post", "/api/trials"),
        ("post", "/api/trials/{id}/pause"),
        ("post", "/api/trials/{id}/resume"),
        ("post", "/api/trials/{id}/stop"),
    ];
    let mut expected: Vec<(String, String)> = expected
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    expected.sort();
    assert_eq!(paths, expected);
}

/// Clients that trickle a byte of a request that never ends into every
/// connection the server will serve at once hold those places only until
/// someone else comes: a page's request is still answered, and the server
/// answers the tricklers nothing.
#[test]
fn clients_trickling_requests_into_every_place_do_not_lock_the_dashboard_out() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let out = finished_experiment(dir.path());
    let server = start(&["serve", out.to_str().unwrap(), "--addr", "127.0.0.1:0"]);
    let host = server
        .url
        .trim_start_matches("http://")
        .trim_end_matches('/');
    // One more than the server serves at once (64), so some wait in the
    // backlog as the attacker's would.
    let mut tricklers: Vec<std::net::TcpStream> = (0..65)
        .map(|_| {
            let mut stream = std::net::TcpStream::connect(host).unwrap();
            write!(stream, "GET /api/trials HTTP/1.1\r\nHost: {host}\r\n").unwrap();
            stream
        })
        .collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let trickling = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for stream in &mut tricklers {
                    // A header line a byte at a time, never the blank line
                    // that ends the request; a closed one stays closed.
                    let _ = stream.write_all(b"X");
                }
                std::thread::sleep(Duration::from_millis(500));
            }
        })
    };
    // Longer than the server's patience (5 s) with an unanswered place.
    std::thread::sleep(Duration::from_secs(6));
    let (status, experiment) = get(&format!("{}api/experiment", server.url));
    assert_eq!(status, 200, "{experiment}");
    let (status, trials) = get(&format!("{}api/trials", server.url));
    assert_eq!(status, 200, "{trials}");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    trickling.join().unwrap();
}
