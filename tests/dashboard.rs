//! The dashboard end to end: the real `wtune` binary runs an experiment with
//! `--serve`, and headless Chromium, driven over chromedriver's W3C WebDriver
//! protocol, watches the trials on the page, stops one, and stops the
//! experiment.
//!
//! Needs Debian's `chromium` and `chromium-driver` (`bash scripts/test.sh`
//! installs them). Every wait polls with a generous deadline: the trials are
//! slow on purpose and the machine may be busy, so nothing here times them.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const PATIENCE: Duration = Duration::from_secs(60);
/// The key of an element reference in WebDriver answers.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| common::workspace().join("target"))
}

/// Polls `probe` until it gives a value; its errors (a stale element, a page
/// still loading) count as "not yet".
fn wait_for<T>(what: &str, mut probe: impl FnMut() -> Result<Option<T>, String>) -> T {
    let start = Instant::now();
    let mut last = String::from("none");
    loop {
        match probe() {
            Ok(Some(value)) => return value,
            Ok(None) => {}
            Err(e) => last = e,
        }
        assert!(
            start.elapsed() < PATIENCE,
            "gave up after {PATIENCE:?} waiting for {what} (last error: {last})"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// A W3C WebDriver client: the handful of commands this test needs.
struct WebDriver {
    agent: ureq::Agent,
    base: String,
    session: Option<String>,
}

impl WebDriver {
    fn new(port: u16) -> Self {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .proxy(None)
            .timeout_global(Some(Duration::from_secs(60)))
            .build()
            .into();
        WebDriver {
            agent,
            base: format!("http://127.0.0.1:{port}"),
            session: None,
        }
    }

    /// Sends a command and gives its `value`, or the driver's error.
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, String> {
        let url = format!("{}{path}", self.base);
        let answer = match (method, body) {
            ("GET", _) => self.agent.get(&url).call(),
            ("DELETE", _) => self.agent.delete(&url).call(),
            (_, body) => self
                .agent
                .post(&url)
                .header("Content-Type", "application/json")
                .send(body.unwrap_or_else(|| json!({})).to_string()),
        };
        let mut answer = answer.map_err(|e| format!("{method} {path}: {e}"))?;
        let status = answer.status();
        let text = answer
            .body_mut()
            .with_config()
            .limit(64 << 20)
            .read_to_string()
            .map_err(|e| format!("{method} {path}: {e}"))?;
        let mut doc: Value =
            serde_json::from_str(&text).map_err(|e| format!("{method} {path}: {e}: {text}"))?;
        if !status.is_success() {
            return Err(format!("{method} {path}: {status}: {}", doc["value"]));
        }
        Ok(doc["value"].take())
    }

    fn session_call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, String> {
        let id = self.session.as_deref().ok_or("no session")?;
        self.call(method, &format!("/session/{id}{path}"), body)
    }

    fn start_session(&mut self, profile: &Path) {
        let args = [
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--window-size=1400,1800",
            &format!("--user-data-dir={}", profile.display()),
        ];
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": CHROMIUM, "args": args},
        }}});
        let value = self.call("POST", "/session", Some(caps)).unwrap();
        let id = value["sessionId"]
            .as_str()
            .expect("a session id")
            .to_string();
        self.session = Some(id);
    }

    fn navigate(&self, url: &str) {
        self.session_call("POST", "/url", Some(json!({ "url": url })))
            .unwrap();
    }

    fn element_ids(value: Value) -> Vec<String> {
        let list = value.as_array().cloned().unwrap_or_default();
        list.iter()
            .filter_map(|e| e[ELEMENT].as_str().map(String::from))
            .collect()
    }

    /// Every element matching the CSS selector, under `within` or the page.
    fn find_all(&self, within: Option<&str>, css: &str) -> Result<Vec<String>, String> {
        let path = match within {
            Some(parent) => format!("/element/{parent}/elements"),
            None => "/elements".to_string(),
        };
        let query = json!({"using": "css selector", "value": css});
        Ok(Self::element_ids(self.session_call(
            "POST",
            &path,
            Some(query),
        )?))
    }

    fn find_one(&self, within: Option<&str>, css: &str) -> Result<String, String> {
        self.find_all(within, css)?
            .into_iter()
            .next()
            .ok_or_else(|| format!("no element matches {css}"))
    }

    fn attribute(&self, element: &str, name: &str) -> Result<Option<String>, String> {
        let value =
            self.session_call("GET", &format!("/element/{element}/attribute/{name}"), None)?;
        Ok(value.as_str().map(String::from))
    }

    fn text(&self, element: &str) -> Result<String, String> {
        let value = self.session_call("GET", &format!("/element/{element}/text"), None)?;
        Ok(value.as_str().unwrap_or_default().to_string())
    }

    fn enabled(&self, element: &str) -> Result<bool, String> {
        let value = self.session_call("GET", &format!("/element/{element}/enabled"), None)?;
        Ok(value.as_bool() == Some(true))
    }

    fn click(&self, element: &str) -> Result<(), String> {
        self.session_call(
            "POST",
            &format!("/element/{element}/click"),
            Some(json!({})),
        )
        .map(drop)
    }

    fn execute(&self, script: &str) -> Result<Value, String> {
        self.session_call(
            "POST",
            "/execute/sync",
            Some(json!({"script": script, "args": []})),
        )
    }

    fn accept_alert(&self) -> Result<String, String> {
        let text = self.session_call("GET", "/alert/text", None)?;
        self.session_call("POST", "/alert/accept", Some(json!({})))?;
        Ok(text.as_str().unwrap_or_default().to_string())
    }

    fn screenshot(&self) -> Result<Vec<u8>, String> {
        let value = self.session_call("GET", "/screenshot", None)?;
        base64_decode(value.as_str().ok_or("no screenshot data")?)
    }

    fn quit(&mut self) {
        if let Some(id) = self.session.take() {
            let _ = self.call("DELETE", &format!("/session/{id}"), None);
        }
    }
}

fn base64_decode(text: &str) -> Result<Vec<u8>, String> {
    let digit = |c: u8| match c {
        b'A'..=b'Z' => Ok(c - b'A'),
        b'a'..=b'z' => Ok(c - b'a' + 26),
        b'0'..=b'9' => Ok(c - b'0' + 52),
        b'+' => Ok(62),
        b'/' => Ok(63),
        _ => Err(format!("bad base64 byte {c}")),
    };
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let (mut acc, mut bits) = (0u32, 0);
    for &c in text
        .as_bytes()
        .iter()
        .filter(|c| !c.is_ascii_whitespace() && **c != b'=')
    {
        acc = (acc << 6) | u32::from(digit(c)?);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    Ok(out)
}

/// The processes and the browser session, ended on every way out of the
/// test; on a failure it first keeps a screenshot and shows wtune's output.
struct Harness {
    wtune: Option<Child>,
    wtune_output: Arc<Mutex<String>>,
    chromedriver: Option<Child>,
    driver: Option<WebDriver>,
}

impl Drop for Harness {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Some(png) = self.driver.as_ref().and_then(|d| d.screenshot().ok()) {
                let path = target_dir().join("dashboard-failure.png");
                if std::fs::write(&path, png).is_ok() {
                    eprintln!("the page when the test failed: {}", path.display());
                }
            }
            let output = self.wtune_output.lock().map(|o| o.clone());
            eprintln!("wtune's output:\n{}", output.unwrap_or_default());
        }
        if let Some(driver) = &mut self.driver {
            driver.quit();
        }
        for child in [&mut self.chromedriver, &mut self.wtune] {
            if let Some(mut child) = child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// Three slow trials (an 8 MiB buffer rewritten per step, 100000 steps):
/// they run until stopped.
fn experiment(dir: &Path) -> PathBuf {
    let path = dir.join("experiment.toml");
    let text = r#"
name = "dashboard"
metric = "counter"
mode = "max"
max_concurrent_trials = 3
[stop]
training_iteration = 100000
[param_space]
seed = { grid_search = [1, 2, 3] }
buffer_kib = 8192
iterations = 100000
"#;
    std::fs::write(&path, text).unwrap();
    path
}

/// Starts `wtune run --serve` and gives the dashboard's URL from its stderr.
fn start_wtune(harness: &mut Harness, config: &Path, out: &Path) -> String {
    let mut child = common::wtune()
        .arg("run")
        .arg(common::guest("stateful"))
        .arg("--config")
        .arg(config)
        .args(["--seed", "1", "--output-dir"])
        .arg(out)
        .arg("--serve=127.0.0.1:0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start wtune");
    let (url_tx, url_rx) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    let output = Arc::clone(&harness.wtune_output);
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let url = line.split("serving the dashboard at ").nth(1);
            if let Some(url) = url.and_then(|rest| rest.split_whitespace().next()) {
                let _ = url_tx.send(url.to_string());
            }
            output.lock().unwrap().push_str(&format!("{line}\n"));
        }
    });
    let mut stdout = child.stdout.take().unwrap();
    let output = Arc::clone(&harness.wtune_output);
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        output.lock().unwrap().push_str(&text);
    });
    harness.wtune = Some(child);
    url_rx
        .recv_timeout(Duration::from_secs(180))
        .expect("wtune printed `serving the dashboard at URL`")
}

fn require_browser() {
    for tool in [CHROMIUM, CHROMEDRIVER] {
        assert!(
            Path::new(tool).is_file(),
            "{tool} is missing: this test drives Chromium through chromedriver; \
             run `bash scripts/test.sh` or `apt-get install chromium chromium-driver`"
        );
    }
}

fn start_chromedriver(harness: &mut Harness, profile: &Path) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let child = Command::new(CHROMEDRIVER)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start chromedriver");
    harness.chromedriver = Some(child);
    let mut driver = WebDriver::new(port);
    wait_for("chromedriver to be ready", || {
        let status = driver.call("GET", "/status", None)?;
        Ok((status["ready"] == json!(true)).then_some(()))
    });
    driver.start_session(profile);
    harness.driver = Some(driver);
}

/// `(trial_id, data-status)` of every row of the trials table, in page order.
fn rows(driver: &WebDriver) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for row in driver.find_all(None, "tr[data-trial]")? {
        let id = driver.attribute(&row, "data-trial")?.unwrap_or_default();
        let cell = driver.find_one(Some(&row), "td.status")?;
        let status = driver.attribute(&cell, "data-status")?.unwrap_or_default();
        out.push((id, status));
    }
    Ok(out)
}

fn plotted_points(driver: &WebDriver) -> Result<u64, String> {
    let canvas = driver.find_one(None, "#curves")?;
    let points = driver
        .attribute(&canvas, "data-points")?
        .unwrap_or_default();
    Ok(points.parse().unwrap_or(0))
}

fn row_button(driver: &WebDriver, trial: &str, action: &str) -> Result<String, String> {
    driver.find_one(
        None,
        &format!("tr[data-trial='{trial}'] button[data-action='{action}']"),
    )
}

#[test]
fn the_dashboard_shows_the_trials_and_stops_one() {
    require_browser();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let mut harness = Harness {
        wtune: None,
        wtune_output: Arc::default(),
        chromedriver: None,
        driver: None,
    };
    let url = start_wtune(&mut harness, &experiment(dir.path()), &out);
    println!("wtune serves the dashboard at {url}");
    start_chromedriver(&mut harness, &dir.path().join("chromium-profile"));
    let driver = harness.driver.as_ref().unwrap();
    driver.navigate(&url);

    // The table lists the three trials and the plot has points.
    let running = wait_for("three trials, one RUNNING, and a plotted curve", || {
        let rows = rows(driver)?;
        let running = rows.iter().find(|(_, status)| status == "RUNNING");
        Ok(match running {
            Some((id, _)) if rows.len() == 3 && plotted_points(driver)? > 0 => Some(id.clone()),
            _ => None,
        })
    });
    let ids: Vec<String> = rows(driver)
        .unwrap()
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(ids, ["trial_0000", "trial_0001", "trial_0002"]);
    let name = driver
        .text(&driver.find_one(None, "#exp-name").unwrap())
        .unwrap();
    assert_eq!(name, "dashboard");

    // Sorting by a header click flips the order and keeps the same rows.
    let header = driver.find_one(None, "th[data-sort='trial_id']").unwrap();
    driver.click(&header).unwrap();
    wait_for("the rows in descending trial order", || {
        let first = rows(driver)?.first().map(|r| r.0.clone());
        Ok((first.as_deref() == Some("trial_0002")).then_some(()))
    });
    driver.click(&header).unwrap();
    wait_for("the rows in ascending trial order", || {
        let first = rows(driver)?.first().map(|r| r.0.clone());
        Ok((first.as_deref() == Some("trial_0000")).then_some(()))
    });

    // Ticking a trial plots it alone.
    let tick = driver
        .find_one(
            None,
            &format!("tr[data-trial='{running}'] input[data-select]"),
        )
        .unwrap();
    driver.click(&tick).unwrap();
    wait_for("a legend of the ticked trial only", || {
        let items = driver.find_all(None, "#legend .legend-item")?;
        if items.len() != 1 {
            return Ok(None);
        }
        let trial = driver.attribute(&items[0], "data-trial")?;
        Ok((trial.as_deref() == Some(running.as_str())).then_some(()))
    });
    driver.click(&tick).unwrap();

    // Its logs show what the guest logged in setup.
    let link = driver
        .find_one(None, &format!("tr[data-trial='{running}'] [data-logs]"))
        .unwrap();
    driver.click(&link).unwrap();
    wait_for("the trial's guest.log", || {
        let text = driver.text(&driver.find_one(None, "#logs")?)?;
        Ok(text.contains("set up with seed").then_some(()))
    });

    // Stop one RUNNING trial from its row.
    let stop = wait_for("its Stop button enabled", || {
        let button = row_button(driver, &running, "stop")?;
        Ok(driver.enabled(&button)?.then_some(button))
    });
    driver.click(&stop).unwrap();
    println!("stopped {running} from the page");
    wait_for("the stopped trial shown TERMINATED", || {
        let rows = rows(driver)?;
        let status = rows
            .iter()
            .find(|(id, _)| *id == running)
            .map(|r| r.1.clone());
        Ok((status.as_deref() == Some("TERMINATED")).then_some(()))
    });
    for action in ["stop", "pause", "resume"] {
        let button = row_button(driver, &running, action).unwrap();
        assert!(
            !driver.enabled(&button).unwrap(),
            "{action} stays disabled on a TERMINATED trial"
        );
    }
    for (id, status) in rows(driver).unwrap() {
        if id != running {
            assert!(
                status == "RUNNING" || status == "PENDING",
                "{id} was left alone but shows {status}"
            );
        }
    }
    let text = driver
        .execute("return document.getElementById('message').hidden ? '' : document.getElementById('message-text').textContent")
        .unwrap();
    println!("the page's message: {text}");

    // Let a few more polls land, then keep a picture of the page.
    let before = plotted_points(driver).unwrap();
    wait_for("the curves to change", || {
        Ok((plotted_points(driver)? != before).then_some(()))
    });
    let png = driver.screenshot().unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG screenshot");
    let shot = target_dir().join("dashboard-screenshot.png");
    std::fs::write(&shot, png).unwrap();
    println!("screenshot of the dashboard: {}", shot.display());

    // Stop the experiment with the page's button, through its confirm().
    let stop_all = wait_for("Stop experiment enabled", || {
        let button = driver.find_one(None, "#stop-experiment")?;
        Ok(driver.enabled(&button)?.then_some(button))
    });
    driver.click(&stop_all).unwrap();
    let question = wait_for("the confirmation", || driver.accept_alert().map(Some));
    assert!(question.contains("wtune resume"), "{question}");
    let started = Instant::now();
    let status = loop {
        let child = harness.wtune.as_mut().unwrap();
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "wtune did not exit after Stop experiment"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    harness.wtune = None;
    assert!(
        status.success(),
        "wtune exits 0 when stopped from the page: {status}"
    );

    // As with Ctrl-C: the running trials were checkpointed and paused, the stopped one stays so.
    let doc: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("experiment.json")).unwrap())
            .unwrap();
    for trial in doc["trials"].as_array().unwrap() {
        let (id, status) = (
            trial["trial_id"].as_str().unwrap(),
            trial["status"].as_str().unwrap(),
        );
        if id == running {
            assert_eq!(status, "TERMINATED", "{trial}");
        } else {
            assert!(
                status == "PAUSED" || status == "PENDING",
                "{id} ended {status}: {trial}"
            );
        }
    }
}
