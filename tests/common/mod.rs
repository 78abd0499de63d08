//! Helpers shared by the end-to-end suites.
#![allow(dead_code, reason = "each suite uses a different subset")]

use std::path::{Path, PathBuf};

use serde_json::Value;
use wtune::exec::WasmBackend;
use wtune::report::{ExperimentFile, TrialFiles};
use wtune::sandbox::{Limits, Program, Sandbox, SandboxOptions, TrialEnv};
use wtune::tune::{ExperimentSummary, Fifo, Mode, RunSpec, Runner, StopCriteria};

pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target"))
}

/// A guest component built by `scripts/setup.sh`.
pub fn guest(name: &str) -> PathBuf {
    let path = target_dir()
        .join("wasm32-wasip2/release")
        .join(format!("{name}.wasm"));
    assert!(
        path.is_file(),
        "{} is missing: build the guests first with `bash scripts/setup.sh`",
        path.display()
    );
    path
}

/// A trial's filesystem under `dir`: `dir/work` for the guest (created),
/// `dir` for the logs.
pub fn trial_env(dir: &Path, data: Vec<(String, PathBuf)>) -> TrialEnv {
    let work_dir = dir.join("work");
    std::fs::create_dir_all(&work_dir).unwrap();
    TrialEnv {
        work_dir,
        log_dir: dir.to_path_buf(),
        data,
        gpu: None,
    }
}

/// A sandbox whose compile cache is shared by all tests (and kept in target/).
pub fn sandbox() -> Sandbox {
    Sandbox::new(SandboxOptions {
        cache_dir: Some(target_dir().join("wtune-test-cache")),
        ..SandboxOptions::default()
    })
    .expect("engine")
}

pub fn load(name: &str) -> Program {
    sandbox()
        .load(&guest(name))
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Runs `configs` on `program` with the given limits, one trial each, and
/// writes the usual files under `out`.
pub fn run_trials(
    program: Program,
    configs: Vec<Value>,
    limits: Limits,
    stop: StopCriteria,
    data: Vec<(String, PathBuf)>,
    out: &Path,
) -> ExperimentSummary {
    let spec = RunSpec {
        metric: None,
        mode: Mode::Max,
        stop,
        max_concurrent: 4,
        configs,
        ..RunSpec::new("test", out.to_path_buf())
    };
    let runner = Runner::new(
        WasmBackend::new(program, limits, data),
        spec,
        Box::new(Fifo::default()),
    )
    .callback(TrialFiles::new())
    .callback(ExperimentFile::new(Value::Null));
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(runner.run())
        .expect("run")
}

/// The `wtune` binary, with a private compile cache.
pub fn wtune() -> std::process::Command {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_wtune"));
    cmd.env("WTUNE_CACHE_DIR", target_dir().join("wtune-test-cache"));
    cmd
}

/// `wtune resume OUT` with `args` after it, which must succeed.
pub fn resume_ok(out: &Path, args: &[&str]) {
    let resumed = wtune().arg("resume").arg(out).args(args).output().unwrap();
    assert!(
        resumed.status.success(),
        "{}",
        String::from_utf8_lossy(&resumed.stderr)
    );
}

/// `wtune run GUEST --config CONFIG --seed 1 --output-dir OUT`, to run or
/// spawn.
pub fn wtune_run(guest_name: &str, config: &Path, out: &Path) -> std::process::Command {
    let mut cmd = wtune();
    cmd.arg("run")
        .arg(guest(guest_name))
        .arg("--config")
        .arg(config)
        .args(["--seed", "1", "--output-dir"])
        .arg(out);
    cmd
}

/// Waits (up to two minutes) until `ready` holds, while `child` still
/// runs: the moment a test interrupts a run at.
pub fn wait_while_running(child: &mut std::process::Child, mut ready: impl FnMut() -> bool) {
    let began = std::time::Instant::now();
    while !ready() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended before the moment the test waits for"
        );
        assert!(began.elapsed() < std::time::Duration::from_secs(120));
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// A program of the Python environment `scripts/python-env.sh` makes
/// (`python`, `tensorboard`, `mlflow`), or of the one whose Python
/// `WTUNE_TEST_PYTHON` names.
pub fn python_env(program: &str) -> PathBuf {
    let python = std::env::var_os("WTUNE_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target/python-env/bin/python"));
    let path = python.with_file_name(program);
    assert!(
        path.exists(),
        "{} is missing: run `bash scripts/python-env.sh` (scripts/test.sh does) or point \
         WTUNE_TEST_PYTHON at a Python with tests/python/requirements.txt installed",
        path.display()
    );
    path
}

/// A loopback port nothing listens on (as of now).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// An experiment run through the `wtune` binary: the directory holding its
/// `experiment.toml` (results in `out/`), and what the command did.
pub struct CliRun {
    pub dir: tempfile::TempDir,
    pub output: std::process::Output,
}

impl CliRun {
    /// The experiment's output directory.
    pub fn out(&self) -> PathBuf {
        self.dir.path().join("out")
    }

    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.output.stdout).into_owned()
    }

    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.output.stderr).into_owned()
    }
}

/// `wtune run` of the guest `guest` with `toml` as its experiment file and
/// `args` after it, into a fresh directory.
pub fn run_cli(guest_name: &str, toml: &str, args: &[&str]) -> CliRun {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("experiment.toml");
    std::fs::write(&config, toml).unwrap();
    let output = wtune()
        .arg("run")
        .arg(guest(guest_name))
        .arg("--config")
        .arg(&config)
        .arg("--output-dir")
        .arg(dir.path().join("out"))
        .args(args)
        .output()
        .unwrap();
    CliRun { dir, output }
}

/// The trials `OUT/experiment.json` lists, as JSON objects.
pub fn experiment_trials(out: &Path) -> Vec<Value> {
    let path = out.join("experiment.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let mut doc: Value = serde_json::from_str(&text).unwrap();
    match doc["trials"].take() {
        Value::Array(trials) => trials,
        other => panic!("{}: trials is {other}", path.display()),
    }
}
