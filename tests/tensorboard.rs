//! TensorBoard event files, read back by TensorBoard itself: its event
//! file loader and multiplexer (tests/python/tensorboard_read.py) and its
//! server's HParams API, from the venv `scripts/python-env.sh` makes. Every
//! numeric metric must be there at every step, once, with the value
//! `result.jsonl` holds; every trial a session with its configuration and
//! how it ended; and a run killed and resumed must read as one that never
//! stopped.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};

/// What TensorBoard reads from `dir` (see tensorboard_read.py).
fn read(dir: &Path) -> Value {
    let script = common::workspace().join("tests/python/tensorboard_read.py");
    let output = Command::new(common::python_env("python"))
        .arg(script)
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

/// A trial's results, from its `result.jsonl`.
fn results(trial: &Path) -> Vec<Map<String, Value>> {
    std::fs::read_to_string(trial.join("result.jsonl"))
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// Result fields that are not scalars in the event file.
const NOT_SCALARS: &[&str] = &[
    "trial_id",
    "training_iteration",
    "timestamp",
    "date",
    "done",
    "config",
    "iterations_since_restore",
    "time_since_restore",
    "fuel_since_restore",
];

/// Every numeric metric of every result, as TensorBoard should show it:
/// tag -> [(step, value as f32)]; with `config`, numeric configuration
/// values too, as `config/NAME`.
fn expected_scalars(
    results: &[Map<String, Value>],
    config: bool,
) -> BTreeMap<String, Vec<(u64, f32)>> {
    let mut out: BTreeMap<String, Vec<(u64, f32)>> = BTreeMap::new();
    for result in results {
        let step = result["training_iteration"].as_u64().unwrap();
        for (key, value) in result {
            if let Some(x) = value.as_f64()
                && !NOT_SCALARS.contains(&key.as_str())
            {
                out.entry(key.clone()).or_default().push((step, x as f32));
            }
        }
        if config {
            for (key, value) in result["config"].as_object().unwrap() {
                if let Some(x) = value.as_f64() {
                    out.entry(format!("config/{key}"))
                        .or_default()
                        .push((step, x as f32));
                }
            }
        }
    }
    out
}

/// Checks one trial's event data against its result files: every scalar
/// at every step once, in the raw records and in what TensorBoard shows,
/// and its HParams session (the configuration it started with: PBT's
/// changes are the `config/` scalars, present when `config`).
fn check_trial(read: &Value, out: &Path, id: &str, ended: &str, config: bool) {
    let results = results(&out.join(id));
    assert!(!results.is_empty(), "{id} has no results");
    let expected = expected_scalars(&results, config);

    let raw = read["raw"][id]
        .as_array()
        .unwrap_or_else(|| panic!("{id}: no event file"));
    assert_eq!(raw[0][0], "file_version", "{id}: {raw:?}");
    let mut seen: BTreeMap<String, Vec<(u64, f32)>> = BTreeMap::new();
    for record in raw {
        let tag = record[0].as_str().unwrap();
        if let Some(x) = record[2].as_f64() {
            seen.entry(tag.to_string())
                .or_default()
                .push((record[1].as_u64().unwrap(), x as f32));
        }
    }
    assert_eq!(seen, expected, "{id}: every record in its event file");

    let shown: BTreeMap<String, Vec<(u64, f32)>> =
        serde_json::from_value(read["scalars"][id].clone()).unwrap();
    assert_eq!(shown, expected, "{id}: what TensorBoard shows");

    let session = &read["sessions"][id];
    assert_eq!(session["start"]["groupName"], id, "{id}: {session}");
    let started = results[0]["config"].as_object().unwrap();
    let hparams = session["start"]["hparams"].as_object().unwrap();
    assert_eq!(hparams.len(), started.len(), "{id}: {hparams:?}");
    for (name, value) in started {
        match value {
            Value::Number(n) => assert_eq!(hparams[name].as_f64(), n.as_f64(), "{id}: {name}"),
            other => assert_eq!(&hparams[name], other, "{id}: {name}"),
        }
    }
    assert_eq!(session["end"]["status"], ended, "{id}: {session}");
}

fn trial_ids(out: &Path) -> Vec<String> {
    let doc: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("experiment.json")).unwrap())
            .unwrap();
    doc["trials"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["trial_id"].as_str().unwrap().to_string())
        .collect()
}

/// The digits example tuned with PBT (so configurations change during
/// trials), read with TensorBoard's reader and served by TensorBoard:
/// its HParams API lists every trial with its final configuration and
/// metrics.
#[test]
fn a_pbt_run_of_the_digits_example_reads_back_in_tensorboard() {
    let data = common::workspace().join("examples/digits-mlp/data");
    let toml = format!(
        r#"
name = "digits-pbt"
metric = "val_accuracy"
mode = "max"
num_samples = 4
seed = 3
max_concurrent_trials = 2
compute = "cpu"
checkpoint_freq = 2
[scheduler]
type = "pbt"
perturbation_interval = 2
hyperparam_mutations = {{ lr = [0.01, 0.03, 0.1, 0.3] }}
[stop]
training_iteration = 8
[data]
digits = "{}"
[param_space]
lr = {{ loguniform = [0.01, 0.3] }}
hidden = {{ choice = [16, 32] }}
batch_size = 32
math = "host"
"#,
        data.display()
    );
    let run = common::run_cli("digits_mlp", &toml, &["--seed", "3"]);
    assert!(run.output.status.success(), "{}", run.stderr());
    let out = run.out();
    let pointer = format!("tensorboard --logdir {}", out.display());
    assert!(run.stdout().contains(&pointer), "{}", run.stdout());
    let read = read(&out);
    let ids = trial_ids(&out);
    assert_eq!(ids.len(), 4);
    for id in &ids {
        check_trial(&read, &out, id, "STATUS_SUCCESS", true);
    }
    let changed = ids.iter().any(|id| {
        let results = results(&out.join(id));
        results.first().unwrap()["config"] != results.last().unwrap()["config"]
    });
    assert!(changed, "PBT changed no trial's configuration");

    // TensorBoard's own server: the HParams tab's API.
    let server = Server::start(&out);
    let groups = server.post(
        "/data/plugin/hparams/session_groups",
        json!({"experimentName": "", "startIndex": 0, "sliceSize": 100,
               "allowedStatuses": ["STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING",
                                   "STATUS_UNKNOWN"],
               "colParams": []}),
    );
    let groups = groups["sessionGroups"].as_array().unwrap();
    let mut names: Vec<&str> = groups.iter().map(|g| g["name"].as_str().unwrap()).collect();
    names.sort();
    assert_eq!(names, ids.iter().map(String::as_str).collect::<Vec<_>>());
    for group in groups {
        let id = group["name"].as_str().unwrap();
        let results = results(&out.join(id));
        let last = results.last().unwrap();
        assert_eq!(
            group["hparams"]["lr"].as_f64(),
            results[0]["config"]["lr"].as_f64(),
            "{id}"
        );
        let accuracy = group["metricValues"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"]["tag"] == "val_accuracy")
            .unwrap_or_else(|| panic!("{id}: no val_accuracy in {group}"));
        assert_eq!(accuracy["trainingStep"], 8, "{id}");
        assert_eq!(
            accuracy["value"].as_f64().map(|x| x as f32),
            last["val_accuracy"].as_f64().map(|x| x as f32),
            "{id}"
        );
    }
}

/// `tensorboard --logdir DIR` on a free loopback port, stopped on drop.
struct Server {
    child: std::process::Child,
    url: String,
}

impl Server {
    fn start(dir: &Path) -> Server {
        let port = common::free_port();
        let child = Command::new(common::python_env("tensorboard"))
            .arg("--logdir")
            .arg(dir)
            .args(["--host", "127.0.0.1", "--load_fast=false", "--port"])
            .arg(port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let server = Server {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        let began = Instant::now();
        while ureq::get(&format!("{}/data/runs", server.url))
            .call()
            .is_err()
        {
            assert!(
                began.elapsed() < Duration::from_secs(60),
                "tensorboard did not answer"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }

    fn post(&self, path: &str, body: Value) -> Value {
        ureq::post(&format!("{}{path}", self.url))
            .send_json(body)
            .unwrap()
            .body_mut()
            .read_json()
            .unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `stateful` guest's experiment: four trials whose results depend only
/// on their seed and iteration.
fn stateful(dir: &Path, extra: &str) -> PathBuf {
    let path = dir.join("experiment.toml");
    let text = format!(
        r#"
name = "stateful"
metric = "counter"
max_concurrent_trials = 2
checkpoint_freq = 2
{extra}
[stop]
training_iteration = 12
[param_space]
seed = {{ grid_search = [1, 2, 3, 4] }}
buffer_kib = 2048
iterations = 1000
"#
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// Killed outright twice while trials are mid-way (results written past
/// their newest checkpoint, which resume runs again), then resumed to the
/// end: each step of each tag is in the event file once.
#[test]
fn a_run_killed_and_resumed_has_each_step_once() {
    let dir = tempfile::tempdir().unwrap();
    let config = stateful(dir.path(), "");
    let out = dir.path().join("out");
    for attempt in 0..3 {
        let mut command = if attempt == 0 {
            common::wtune_run("stateful", &config, &out)
        } else {
            let mut resume = common::wtune();
            resume.arg("resume").arg(&out);
            resume
        };
        let mut child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        if attempt == 2 {
            assert!(child.wait().unwrap().success());
            break;
        }
        // Killed once some trial has results past its checkpoint at 2.
        common::wait_while_running(&mut child, || {
            let lines = |id: &str| {
                std::fs::read_to_string(out.join(id).join("result.jsonl"))
                    .map_or(0, |t| t.lines().count())
            };
            ["trial_0000", "trial_0001"]
                .iter()
                .any(|id| lines(id) >= 3 + 4 * attempt)
        });
        child.kill().unwrap();
        child.wait().unwrap();
    }
    let read = read(&out);
    let ids = trial_ids(&out);
    assert_eq!(ids.len(), 4);
    for id in &ids {
        let steps: Vec<u64> = results(&out.join(id))
            .iter()
            .map(|r| r["training_iteration"].as_u64().unwrap())
            .collect();
        assert_eq!(steps, (1..=12).collect::<Vec<_>>(), "{id}");
        check_trial(&read, &out, id, "STATUS_SUCCESS", false);
    }
}

/// A trial that fails ends its session as a failure, and what it reported
/// before is there.
#[test]
fn a_failed_trial_ends_its_session_as_a_failure() {
    let dir = tempfile::tempdir().unwrap();
    let config = stateful(dir.path(), "max_failures = 0");
    let toml = std::fs::read_to_string(&config)
        .unwrap()
        .replace("iterations = 1000", "iterations = 1000\ntrap_at = 3");
    let run = common::run_cli("stateful", &toml, &["--seed", "1"]);
    let out = run.out();
    let read = read(&out);
    for id in trial_ids(&out) {
        check_trial(&read, &out, &id, "STATUS_FAILURE", false);
    }
}

/// `--no-tensorboard` and `[tracking] tensorboard = false` write no event
/// file; a mistaken `[tracking]` is refused before anything runs.
#[test]
fn tensorboard_files_can_be_turned_off_and_bad_tracking_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let base = std::fs::read_to_string(stateful(dir.path(), "")).unwrap();
    let event_files = |out: &Path| {
        trial_ids(out)
            .iter()
            .flat_map(|id| std::fs::read_dir(out.join(id)).unwrap())
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .contains("tfevents")
            })
            .count()
    };
    let flag = common::run_cli("stateful", &base, &["--no-tensorboard"]);
    assert!(flag.output.status.success(), "{}", flag.stderr());
    assert_eq!(event_files(&flag.out()), 0);
    assert!(!flag.stdout().contains("tensorboard"), "{}", flag.stdout());
    let off = format!("{base}\n[tracking]\ntensorboard = false\n");
    let file = common::run_cli("stateful", &off, &[]);
    assert!(file.output.status.success(), "{}", file.stderr());
    assert_eq!(event_files(&file.out()), 0);
    let doc: Value =
        serde_json::from_str(&std::fs::read_to_string(file.out().join("experiment.json")).unwrap())
            .unwrap();
    assert_eq!(doc["run"]["tracking"]["tensorboard"], false, "{doc}");
    let on = common::run_cli("stateful", &base, &[]);
    assert_eq!(event_files(&on.out()), 4);

    for (bad, expected) in [
        ("[tracking]\ntensorboard = \"yes\"\n", "tensorboard"),
        (
            "[tracking]\ntensorbord = true\n",
            "unknown field `tensorbord`",
        ),
    ] {
        let run = common::run_cli("stateful", &format!("{base}\n{bad}"), &[]);
        assert_eq!(run.output.status.code(), Some(2), "{bad}: {}", run.stderr());
        assert!(run.stderr().contains(expected), "{bad}: {}", run.stderr());
        assert!(!run.out().exists(), "{bad}: an output directory was made");
    }
}
