//! MLflow logging against a real MLflow server (`mlflow server` from the
//! venv `scripts/python-env.sh` makes, on loopback with its own SQLite
//! store), read back through its REST API: one run per trial with its
//! params, tags, metric histories and status; the same runs and each step
//! once after a kill and `wtune resume`; an outage in the middle (a proxy
//! in front of the real server stops answering) costs nothing and is said
//! once; and servers that are absent, fail or answer garbage leave the
//! experiment as it would be without them.

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};

/// `mlflow server` on a free loopback port, killed (with its workers) on
/// drop.
struct MlflowServer {
    child: Child,
    url: String,
    _store: tempfile::TempDir,
}

impl MlflowServer {
    fn start() -> MlflowServer {
        let mlflow = common::python_env("mlflow");
        let store = tempfile::tempdir().unwrap();
        let port = common::free_port();
        use std::os::unix::process::CommandExt;
        let child = Command::new(mlflow)
            .args(["server", "--host", "127.0.0.1", "--workers", "1", "--port"])
            .arg(port.to_string())
            .arg("--backend-store-uri")
            .arg(format!("sqlite:///{}/mlflow.db", store.path().display()))
            .arg("--default-artifact-root")
            .arg(store.path().join("artifacts"))
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let server = MlflowServer {
            child,
            url: format!("http://127.0.0.1:{port}"),
            _store: store,
        };
        let began = Instant::now();
        while ureq::get(format!("{}/health", server.url)).call().is_err() {
            assert!(
                began.elapsed() < Duration::from_secs(180),
                "mlflow server did not answer"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        server
    }

    fn get(&self, path: &str, query: &[(&str, &str)]) -> Value {
        let mut request = ureq::get(format!("{}/api/2.0/mlflow/{path}", self.url));
        for (k, v) in query {
            request = request.query(*k, *v);
        }
        request.call().unwrap().body_mut().read_json().unwrap()
    }

    fn post(&self, path: &str, body: Value) -> Value {
        ureq::post(format!("{}/api/2.0/mlflow/{path}", self.url))
            .send_json(body)
            .unwrap()
            .body_mut()
            .read_json()
            .unwrap()
    }

    /// The runs of the MLflow experiment `name`, by run name.
    fn runs(&self, name: &str) -> BTreeMap<String, Value> {
        self.every_run(name)
            .into_iter()
            .map(|run| (run["info"]["run_name"].as_str().unwrap().to_string(), run))
            .collect()
    }

    /// Every run of experiment `name`, several of one name included.
    fn every_run(&self, name: &str) -> Vec<Value> {
        let id = self.get("experiments/get-by-name", &[("experiment_name", name)])["experiment"]
            ["experiment_id"]
            .as_str()
            .unwrap()
            .to_string();
        let found = self.post(
            "runs/search",
            json!({"experiment_ids": [id], "max_results": 1000}),
        );
        found["runs"].as_array().cloned().unwrap_or_default()
    }

    /// `(step, value)` of every point of a run's metric, in order.
    fn history(&self, run: &Value, key: &str) -> Vec<(u64, f64)> {
        let run_id = run["info"]["run_id"].as_str().unwrap();
        let answer = self.get(
            "metrics/get-history",
            &[
                ("run_id", run_id),
                ("metric_key", key),
                ("max_results", "25000"),
            ],
        );
        let mut points: Vec<(u64, f64)> = answer["metrics"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|m| {
                (
                    m["step"]
                        .as_u64()
                        .or_else(|| m["step"].as_str()?.parse().ok())
                        .unwrap(),
                    m["value"].as_f64().unwrap(),
                )
            })
            .collect();
        points.sort_by(|a, b| a.partial_cmp(b).unwrap());
        points
    }
}

impl Drop for MlflowServer {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-9", "--", &format!("-{}", self.child.id())])
            .status();
        let _ = self.child.wait();
    }
}

/// A key/value list (MLflow's params and tags) as a map.
fn pairs(list: &Value) -> BTreeMap<String, String> {
    list.as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|p| {
            (
                p["key"].as_str().unwrap().to_string(),
                p["value"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn results(trial: &Path) -> Vec<Map<String, Value>> {
    std::fs::read_to_string(trial.join("result.jsonl"))
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

fn experiment_doc(out: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(out.join("experiment.json")).unwrap()).unwrap()
}

/// The `stateful` guest's experiment, logging to `uri` as `name`.
fn experiment(uri: &str, name: &str, iterations: u64, extra: &str) -> String {
    format!(
        r#"
name = "stateful"
metric = "counter"
mode = "max"
max_concurrent_trials = 2
checkpoint_freq = 2
{extra}
[tracking]
mlflow = "{uri}"
mlflow_experiment = "{name}"
[stop]
training_iteration = {iterations}
[param_space]
seed = {{ grid_search = [1, 2, 3, 4] }}
buffer_kib = 1024
iterations = 1000
"#
    )
}

/// Every trial of `out` is a run of `name` on `server` with its config,
/// tags, every metric at every step once (the values `result.jsonl` holds)
/// and `status`; the best trial is tagged.
fn check_runs(server: &MlflowServer, name: &str, out: &Path, status: &str) {
    check_runs_but(server, name, out, status, None);
}

/// [`check_runs`], for every trial but `except`, which may have a run or
/// not.
fn check_runs_but(
    server: &MlflowServer,
    name: &str,
    out: &Path,
    status: &str,
    except: Option<&str>,
) {
    let runs = server.runs(name);
    let doc = experiment_doc(out);
    let trials = doc["trials"].as_array().unwrap();
    let checked = trials.len() - usize::from(except.is_some());
    assert!(runs.len() >= checked, "{:?}", runs.keys());
    if except.is_none() {
        assert_eq!(runs.len(), trials.len(), "{:?}", runs.keys());
    }
    for trial in trials {
        let id = trial["trial_id"].as_str().unwrap();
        if except == Some(id) {
            continue;
        }
        let run = &runs[id];
        let dir = std::path::absolute(out.join(id)).unwrap();
        assert_eq!(run["info"]["status"], status, "{id}");
        let params = pairs(&run["data"]["params"]);
        let config = trial["config"].as_object().unwrap();
        assert_eq!(params.len(), config.len(), "{id}: {params:?}");
        for (key, value) in config {
            let text = match value {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            assert_eq!(params[key], text, "{id}: {key}");
        }
        let tags = pairs(&run["data"]["tags"]);
        assert_eq!(tags["wtune.trial_id"], id);
        assert_eq!(Path::new(&tags["wtune.trial_dir"]), dir);
        let best = doc["best_trial"]["trial_id"].as_str();
        assert_eq!(
            tags.get("wtune.best_trial").map(String::as_str),
            (best == Some(id)).then_some("true"),
            "{id}"
        );
        let results = results(&dir);
        for metric in ["counter", "digest", "fuel_total", "time_total_s"] {
            let expected: Vec<(u64, f64)> = results
                .iter()
                .map(|r| {
                    (
                        r["training_iteration"].as_u64().unwrap(),
                        r[metric].as_f64().unwrap(),
                    )
                })
                .collect();
            assert_eq!(server.history(run, metric), expected, "{id}: {metric}");
        }
    }
}

/// A TCP proxy in front of the real server that can stop answering: new
/// connections are closed at once and open ones are cut.
struct Proxy {
    url: String,
    down: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    fn start(upstream: &str) -> Proxy {
        let upstream = upstream.trim_start_matches("http://").to_string();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let down = Arc::new(AtomicBool::new(false));
        let open: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (down2, open2) = (down.clone(), open.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if down2.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let Ok(server) = TcpStream::connect(&upstream) else {
                    continue;
                };
                open2.lock().unwrap().push(client.try_clone().unwrap());
                open2.lock().unwrap().push(server.try_clone().unwrap());
                let copy = |mut from: TcpStream, mut to: TcpStream| {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                };
                copy(client.try_clone().unwrap(), server.try_clone().unwrap());
                copy(server, client);
            }
        });
        Proxy { url, down, open }
    }

    fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
        if down {
            for stream in self.open.lock().unwrap().drain(..) {
                let _ = stream.shutdown(std::net::Shutdown::Both);
            }
        }
    }
}

/// An HTTP proxy in front of the real server that fails, with MLflow's
/// own answer to an error in its store, every request whose body holds
/// `marker` (without whitespace), and passes the others on (each on a
/// connection of its own).
fn failing_proxy(upstream: &str, marker: &'static str) -> String {
    let upstream = upstream.trim_start_matches("http://").to_string();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { continue };
            let upstream = upstream.clone();
            std::thread::spawn(move || {
                let mut reader = std::io::BufReader::new(client.try_clone().unwrap());
                let mut client = client;
                while let Some((head, body)) = http_request(&mut reader) {
                    // Whatever whitespace the client lays its JSON out with.
                    let compact: String =
                        String::from_utf8_lossy(&body).split_whitespace().collect();
                    let answer = if compact.contains(marker) {
                        let error = r#"{"error_code": "INTERNAL_ERROR", "message": "injected"}"#;
                        format!(
                            "HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n\
                             Content-Length: {}\r\n\r\n{error}",
                            error.len()
                        )
                        .into_bytes()
                    } else {
                        let Ok(mut server) = TcpStream::connect(&upstream) else {
                            return;
                        };
                        let head: String = head
                            .lines()
                            .filter(|l| !l.to_ascii_lowercase().starts_with("connection:"))
                            .map(|l| format!("{l}\r\n"))
                            .collect();
                        server.write_all(head.as_bytes()).unwrap();
                        server.write_all(b"Connection: close\r\n\r\n").unwrap();
                        server.write_all(&body).unwrap();
                        let mut answer = Vec::new();
                        let _ = server.read_to_end(&mut answer);
                        answer
                    };
                    if client.write_all(&answer).is_err() {
                        return;
                    }
                }
            });
        }
    });
    url
}

/// One request's head (without its blank line) and body, or `None` at the
/// connection's end.
fn http_request(reader: &mut impl std::io::BufRead) -> Option<(String, Vec<u8>)> {
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if line == "\r\n" {
            break;
        }
        head.push_str(&line);
    }
    let length = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some((head, body))
}

fn write_config(dir: &Path, toml: &str) -> PathBuf {
    let config = dir.join("experiment.toml");
    std::fs::write(&config, toml).unwrap();
    config
}

fn run_wtune(toml: &str, dir: &Path, extra_args: &[&str]) -> std::process::Output {
    common::wtune_run("stateful", &write_config(dir, toml), &dir.join("out"))
        .args(extra_args)
        .output()
        .unwrap()
}

fn mlflow_warnings(stderr: &str) -> Vec<&str> {
    stderr.lines().filter(|l| l.contains("MLflow")).collect()
}

/// One server for every scenario: it takes seconds to start.
#[test]
fn trials_are_runs_on_a_real_mlflow_server() {
    let server = MlflowServer::start();
    a_run_logs_every_trial(&server);
    a_failed_trial_is_a_failed_run(&server);
    a_trial_that_starts_over_is_a_new_run(&server);
    a_killed_and_resumed_run_logs_each_step_once(&server);
    steps_a_killed_run_never_sent_are_sent_on_resume(&server);
    an_outage_in_the_middle_loses_nothing_and_is_said_once(&server);
    an_outage_past_the_end_is_counted_and_sent_on_resume(&server);
    a_request_the_server_always_fails_holds_back_no_other_trial(&server);
    a_result_the_server_always_fails_costs_only_that_result(&server);
    a_server_stopped_for_good_is_said_once_and_counted(server);
}

fn a_run_logs_every_trial(server: &MlflowServer) {
    let dir = tempfile::tempdir().unwrap();
    let output = run_wtune(&experiment(&server.url, "plain", 6, ""), dir.path(), &[]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(mlflow_warnings(&stderr).is_empty(), "{stderr}");
    let out = dir.path().join("out");
    check_runs(server, "plain", &out, "FINISHED");

    // The tag moved to a run that is not the best any more (as an earlier
    // end with fewer trials would have left it) and off the best one: a
    // resume, which finds every run complete, puts it back on the best
    // alone.
    let best = experiment_doc(&out)["best_trial"]["trial_id"]
        .as_str()
        .unwrap()
        .to_string();
    let runs = server.runs("plain");
    let run_id = |id: &str| runs[id]["info"]["run_id"].as_str().unwrap().to_string();
    let other = runs.keys().find(|id| **id != best).unwrap().clone();
    server.post(
        "runs/delete-tag",
        json!({"run_id": run_id(&best), "key": "wtune.best_trial"}),
    );
    server.post(
        "runs/set-tag",
        json!({"run_id": run_id(&other), "key": "wtune.best_trial", "value": "true"}),
    );
    let resumed = common::wtune().arg("resume").arg(&out).output().unwrap();
    let stderr = String::from_utf8_lossy(&resumed.stderr);
    assert!(resumed.status.success(), "{stderr}");
    assert!(mlflow_warnings(&stderr).is_empty(), "{stderr}");
    check_runs(server, "plain", &out, "FINISHED");
}

fn a_failed_trial_is_a_failed_run(server: &MlflowServer) {
    let dir = tempfile::tempdir().unwrap();
    let toml = experiment(&server.url, "failed", 6, "max_failures = 0")
        .replace("iterations = 1000", "iterations = 1000\ntrap_at = 3");
    let output = run_wtune(&toml, dir.path(), &[]);
    assert_eq!(output.status.code(), Some(1), "every trial fails");
    check_runs(server, "failed", &dir.path().join("out"), "FAILED");
}

/// `--restart-errored` runs failed trials again from scratch: each gets a
/// new run with the new attempt's steps, its old run (the failed attempt's
/// steps) ended as KILLED rather than taking the new steps for ones it has.
fn a_trial_that_starts_over_is_a_new_run(server: &MlflowServer) {
    let dir = tempfile::tempdir().unwrap();
    let toml = experiment(&server.url, "restarted", 6, "max_failures = 0")
        .replace("iterations = 1000", "iterations = 1000\ntrap_at = 3");
    assert_eq!(run_wtune(&toml, dir.path(), &[]).status.code(), Some(1));
    let out = dir.path().join("out");
    let resumed = common::wtune()
        .arg("resume")
        .arg(&out)
        .arg("--restart-errored")
        .output()
        .unwrap();
    // The guest traps once (it leaves `recovered.txt` behind): run again,
    // the trials finish.
    assert!(
        resumed.status.success(),
        "{}",
        String::from_utf8_lossy(&resumed.stderr)
    );
    // Per trial: each run's status and `(step, counter)` points.
    type Runs = Vec<(String, Vec<(u64, f64)>)>;
    let mut by_trial: BTreeMap<String, Runs> = BTreeMap::new();
    for run in server.every_run("restarted") {
        let name = run["info"]["run_name"].as_str().unwrap().to_string();
        let status = run["info"]["status"].as_str().unwrap().to_string();
        let steps = server.history(&run, "counter");
        by_trial.entry(name).or_default().push((status, steps));
    }
    assert_eq!(by_trial.len(), 4, "{by_trial:?}");
    for (id, mut runs) in by_trial {
        runs.sort_by(|a, b| a.0.cmp(&b.0));
        let logged = |r: &Vec<(u64, f64)>| r.iter().map(|p| p.0).collect::<Vec<_>>();
        assert_eq!(runs.len(), 2, "{id}: {runs:?}");
        let all: Vec<u64> = (1..=6).collect();
        assert_eq!(
            (runs[0].0.as_str(), logged(&runs[0].1)),
            ("FINISHED", all),
            "{id}"
        );
        assert_eq!(
            (runs[1].0.as_str(), logged(&runs[1].1)),
            ("KILLED", vec![1, 2]),
            "{id}"
        );
        let results = results(&out.join(&id));
        let counters: Vec<f64> = results
            .iter()
            .map(|r| r["counter"].as_f64().unwrap())
            .collect();
        let new: Vec<f64> = runs[0].1.iter().map(|p| p.1).collect();
        assert_eq!(new, counters, "{id}");
    }
}

fn a_killed_and_resumed_run_logs_each_step_once(server: &MlflowServer) {
    let dir = tempfile::tempdir().unwrap();
    let toml = experiment(&server.url, "resumed", 12, "")
        .replace("buffer_kib = 1024", "buffer_kib = 4096");
    let out = dir.path().join("out");
    let mut child = common::wtune_run("stateful", &write_config(dir.path(), &toml), &out)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Killed once the server has some steps of a trial past its checkpoint
    // at 2, which the resumed trial runs again.
    common::wait_while_running(&mut child, || {
        std::fs::read(out.join("trial_0000/mlflow_run.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .and_then(|v| v["sent_through"].as_u64())
            .is_some_and(|sent| sent >= 3)
    });
    child.kill().unwrap();
    child.wait().unwrap();
    // A kill between a batch's arrival and the file's update leaves the
    // file behind the server; the worst case, a file that says nothing was
    // sent, must still send no step twice: the server's own steps count.
    for entry in std::fs::read_dir(&out).unwrap() {
        let file = entry.unwrap().path().join("mlflow_run.json");
        if let Ok(bytes) = std::fs::read(&file) {
            let mut saved: Value = serde_json::from_slice(&bytes).unwrap();
            saved["sent_through"] = 0.into();
            std::fs::write(&file, saved.to_string()).unwrap();
        }
    }
    let resumed = common::wtune().arg("resume").arg(&out).output().unwrap();
    assert!(
        resumed.status.success(),
        "{}",
        String::from_utf8_lossy(&resumed.stderr)
    );
    // `check_runs` compares histories with result.jsonl, which the resumed
    // run rewrote from the checkpoint on: values of redone steps may
    // differ in time only, so the deterministic metrics are checked
    // against it and every metric's steps are 1..=12 once.
    let runs = server.runs("resumed");
    assert_eq!(runs.len(), 4, "{:?}", runs.keys());
    for (id, run) in &runs {
        assert_eq!(run["info"]["status"], "FINISHED", "{id}");
        let results = results(&out.join(id));
        for metric in ["counter", "digest", "fuel_total", "time_total_s"] {
            let steps: Vec<u64> = server.history(run, metric).iter().map(|p| p.0).collect();
            assert_eq!(steps, (1..=12).collect::<Vec<_>>(), "{id}: {metric}");
        }
        let digests: Vec<f64> = results
            .iter()
            .map(|r| r["digest"].as_f64().unwrap())
            .collect();
        let logged: Vec<f64> = server.history(run, "digest").iter().map(|p| p.1).collect();
        assert_eq!(logged, digests, "{id}");
    }
}

/// Killed while the server was away: nothing reached it, and the resumed
/// trials restore checkpoints whose steps no launch reports again. They
/// come from the trials' `result.jsonl`, so every run still has every step.
fn steps_a_killed_run_never_sent_are_sent_on_resume(server: &MlflowServer) {
    let proxy = Proxy::start(&server.url);
    let dir = tempfile::tempdir().unwrap();
    let toml =
        experiment(&proxy.url, "unsent", 12, "").replace("buffer_kib = 1024", "buffer_kib = 4096");
    let out = dir.path().join("out");
    proxy.set_down(true);
    let mut child = common::wtune_run("stateful", &write_config(dir.path(), &toml), &out)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let checkpoints = out.join("trial_0000/checkpoints");
    common::wait_while_running(&mut child, || {
        std::fs::read_dir(&checkpoints).is_ok_and(|entries| {
            entries.filter_map(Result::ok).any(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with("checkpoint_000004.")
            })
        })
    });
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!out.join("trial_0000/mlflow_run.json").exists());
    proxy.set_down(false);
    let resumed = common::wtune().arg("resume").arg(&out).output().unwrap();
    let stderr = String::from_utf8_lossy(&resumed.stderr);
    assert!(resumed.status.success(), "{stderr}");
    assert!(mlflow_warnings(&stderr).is_empty(), "{stderr}");
    // It continued from a checkpoint: started over, it would have reported
    // every step again and proved nothing here.
    let last = results(&out.join("trial_0000")).pop().unwrap();
    assert_eq!(last["training_iteration"], 12);
    assert!(
        last["iterations_since_restore"].as_u64().unwrap() <= 8,
        "{last:?}"
    );
    check_runs(server, "unsent", &out, "FINISHED");
}

fn an_outage_in_the_middle_loses_nothing_and_is_said_once(server: &MlflowServer) {
    let proxy = Proxy::start(&server.url);
    let dir = tempfile::tempdir().unwrap();
    // About four seconds of training here: the outage ends long before.
    let toml =
        experiment(&proxy.url, "outage", 40, "").replace("buffer_kib = 1024", "buffer_kib = 4096");
    let out = dir.path().join("out");
    let mut child = common::wtune_run("stateful", &write_config(dir.path(), &toml), &out)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Down once the server has the first steps; up again a little later,
    // while trials still run.
    common::wait_while_running(&mut child, || {
        out.join("trial_0000/mlflow_run.json").exists()
    });
    proxy.set_down(true);
    std::thread::sleep(Duration::from_millis(500));
    proxy.set_down(false);
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let warnings = mlflow_warnings(&stderr);
    let down: Vec<_> = warnings.iter().filter(|l| l.contains("goes on")).collect();
    assert_eq!(down.len(), 1, "{stderr}");
    assert!(stderr.contains("answers again"), "{stderr}");
    assert!(!stderr.contains("were not sent"), "{stderr}");
    check_runs(server, "outage", &out, "FINISHED");
}

fn an_outage_past_the_end_is_counted_and_sent_on_resume(server: &MlflowServer) {
    let proxy = Proxy::start(&server.url);
    let dir = tempfile::tempdir().unwrap();
    let toml = experiment(&proxy.url, "gone", 6, "");
    // Down before anything is sent: the experiment is made, nothing more.
    proxy.set_down(true);
    let output = run_wtune(&toml, dir.path(), &[]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let warnings = mlflow_warnings(&stderr);
    assert_eq!(warnings.len(), 2, "said once, counted once: {stderr}");
    assert!(warnings[1].contains("were not sent"), "{stderr}");
    // 4 trials x 6 results, each with its metrics, all in the files.
    let out = dir.path().join("out");
    for i in 0..4 {
        assert_eq!(results(&out.join(format!("trial_{i:04}"))).len(), 6);
    }
    // Every trial had ended, so `wtune resume` launches none of them: it
    // sends each run whole from the trial files, and then nothing more.
    proxy.set_down(false);
    for _ in 0..2 {
        let resumed = common::wtune().arg("resume").arg(&out).output().unwrap();
        let stderr = String::from_utf8_lossy(&resumed.stderr);
        assert!(resumed.status.success(), "{stderr}");
        assert!(mlflow_warnings(&stderr).is_empty(), "{stderr}");
        check_runs(server, "gone", &out, "FINISHED");
    }
}

/// A request the server fails every time while it answers others (here one
/// trial's params; in the wild, a metric name its store cannot keep) is
/// given up after a few tries and said once: the other trials' runs are
/// logged whole, not held behind it until the end and then counted unsent.
fn a_request_the_server_always_fails_holds_back_no_other_trial(server: &MlflowServer) {
    let proxy = failing_proxy(&server.url, r#"{"key":"seed","value":"3"}"#);
    let dir = tempfile::tempdir().unwrap();
    let output = run_wtune(&experiment(&proxy, "poisoned", 6, ""), dir.path(), &[]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let warnings = mlflow_warnings(&stderr);
    assert!(
        warnings
            .iter()
            .any(|l| l.contains("refused a request") && l.contains("time(s) in a row while")),
        "{stderr}"
    );
    assert!(!stderr.contains("were not sent"), "{stderr}");
    let out = dir.path().join("out");
    let poisoned = experiment_doc(&out)["trials"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["config"]["seed"] == 3)
        .unwrap()["trial_id"]
        .as_str()
        .unwrap()
        .to_string();
    check_runs_but(server, "poisoned", &out, "FINISHED", Some(&poisoned));
}

/// A result the server fails every time (here step 4 of every trial) is
/// given up alone: a batch that merged it with other results is sent again
/// a result at a time, so each run lacks that step and nothing else.
fn a_result_the_server_always_fails_costs_only_that_result(server: &MlflowServer) {
    let proxy = failing_proxy(&server.url, r#"{"key":"counter","value":4.0,"#);
    let dir = tempfile::tempdir().unwrap();
    let output = run_wtune(&experiment(&proxy, "one_result", 6, ""), dir.path(), &[]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        mlflow_warnings(&stderr)
            .iter()
            .any(|l| l.contains("refused a request")),
        "{stderr}"
    );
    assert!(!stderr.contains("were not sent"), "{stderr}");
    let out = dir.path().join("out");
    let runs = server.runs("one_result");
    for trial in experiment_doc(&out)["trials"].as_array().unwrap() {
        let id = trial["trial_id"].as_str().unwrap();
        let expected: Vec<(u64, f64)> = results(&out.join(id))
            .iter()
            .map(|r| {
                let step = r["training_iteration"].as_u64().unwrap();
                (step, r["counter"].as_f64().unwrap())
            })
            .filter(|&(step, _)| step != 4)
            .collect();
        assert_eq!(expected.len(), 5, "{id}");
        assert_eq!(server.history(&runs[id], "counter"), expected, "{id}");
    }
}

/// The real server killed in the middle of a run and never started again:
/// the experiment finishes whole, the problem is said once and what never
/// reached the server is counted.
fn a_server_stopped_for_good_is_said_once_and_counted(server: MlflowServer) {
    let dir = tempfile::tempdir().unwrap();
    let toml = experiment(&server.url, "stopped", 40, "")
        .replace("buffer_kib = 1024", "buffer_kib = 4096");
    let out = dir.path().join("out");
    let mut child = common::wtune_run("stateful", &write_config(dir.path(), &toml), &out)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    common::wait_while_running(&mut child, || {
        out.join("trial_0000/mlflow_run.json").exists()
    });
    drop(server);
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let warnings = mlflow_warnings(&stderr);
    assert_eq!(warnings.len(), 2, "said once, counted once: {stderr}");
    assert!(warnings[0].contains("goes on"), "{stderr}");
    // "... N metric values (...) and M run updates were not sent ..."
    let unsent: u64 = warnings[1]
        .split(" metric values (")
        .next()
        .and_then(|before| before.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no count in {}", warnings[1]));
    assert!(unsent > 0, "{stderr}");
    for i in 0..4 {
        assert_eq!(results(&out.join(format!("trial_{i:04}"))).len(), 40);
    }
}

/// A server that answers every request with `status` and `body`, on a
/// free port; and how many requests it has had.
fn bad_server(status: &str, content_type: &str, body: &str) -> (String, Arc<AtomicUsize>) {
    let answer = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let requests = Arc::new(AtomicUsize::new(0));
    let counted = requests.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            counted.fetch_add(1, Ordering::SeqCst);
            let answer = answer.clone();
            std::thread::spawn(move || {
                let mut buffer = [0u8; 65536];
                let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
                let _ = stream.read(&mut buffer);
                let _ = stream.write_all(answer.as_bytes());
            });
        }
    });
    (url, requests)
}

/// What is not an MLflow server, or not a URI, never touches the
/// experiment: a bad URI is refused before anything runs; a server that is
/// absent, fails or answers garbage is said once and counted at the end,
/// and the trials' results are whole.
#[test]
fn bad_tracking_servers_and_uris_leave_the_experiment_alone() {
    for uri in [
        "not a uri",
        "ftp://127.0.0.1:5000",
        "http://",
        "https://127.0.0.1:5000",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let output = run_wtune(&experiment(uri, "x", 2, ""), dir.path(), &[]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{uri}: {stderr}");
        assert!(stderr.contains("tracking.mlflow"), "{uri}: {stderr}");
        assert!(!dir.path().join("out").exists(), "{uri}");
    }
    let closed = format!("http://127.0.0.1:{}", common::free_port());
    let (failing, _) = bad_server("500 Internal Server Error", "text/plain", "boom");
    let (garbage, _) = bad_server("200 OK", "text/html", "<html>\x1b[31m</html>");
    // Credentials refused, as MLflow's basic-auth app answers.
    let (unauthorized, asked) = bad_server(
        "401 Unauthorized",
        "application/json",
        r#"{"error_code": "UNAUTHENTICATED", "message": "You are not authenticated."}"#,
    );
    for (uri, said) in [
        (closed.as_str(), "goes on"),
        (failing.as_str(), "HTTP 500"),
        (garbage.as_str(), "not MLflow's"),
        (unauthorized.as_str(), "HTTP 401: UNAUTHENTICATED"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let began = Instant::now();
        let output = run_wtune(&experiment(uri, "x", 4, ""), dir.path(), &[]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{uri}: {stderr}");
        let warnings = mlflow_warnings(&stderr);
        assert_eq!(warnings.len(), 2, "{uri}: {stderr}");
        assert!(warnings[0].contains(said), "{uri}: {stderr}");
        assert!(warnings[1].contains("were not sent"), "{uri}: {stderr}");
        assert!(
            !stderr.contains('\x1b'),
            "{uri}: raw escape on the terminal"
        );
        let out = dir.path().join("out");
        for i in 0..4 {
            assert_eq!(
                results(&out.join(format!("trial_{i:04}"))).len(),
                4,
                "{uri}"
            );
        }
        // The end does not wait on a server that is away.
        assert!(began.elapsed() < Duration::from_secs(60), "{uri}");
    }
    // A refused experiment is asked for once or twice (looked up, made),
    // not again for each of the 16 results.
    assert!(
        asked.load(Ordering::SeqCst) <= 3,
        "{} requests",
        asked.load(Ordering::SeqCst)
    );
}
