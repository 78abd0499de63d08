//! Hostile guests are contained: each ends as ERROR with a reason that names
//! the cause, while benign trials in the same experiment finish correctly,
//! and nothing outside a trial's own directory changes.
//!
//! The attacks are those of `examples/hostile` (its crate docs list each with
//! its intended outcome), plus one component written here in WAT text for
//! what Rust cannot emit (`table.grow`).

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use wtune::exec::{CheckpointMode, WasmBackend};
use wtune::report::{ExperimentFile, TrialFiles, summary_text};
use wtune::sandbox::{Limits, Program, TrialFault};
use wtune::tune::{
    CheckpointPolicy, ExperimentSummary, FailurePolicy, Fifo, Mode, RunSpec, Runner, StopCriteria,
    Trial, TrialStatus,
};

fn tight_limits() -> Limits {
    Limits {
        fuel_per_call: Some(1_000_000_000),
        fuel_per_trial: None,
        memory_bytes: 64 << 20,
        table_elements: 100_000,
        call_timeout: Some(Duration::from_secs(60)),
        log_bytes: 64 << 10,
        checkpoint_bytes: 64 << 20,
        open_files: 1024,
        result_bytes: 256 << 20,
        disk_bytes: 1 << 30,
        disk_files: 10_000,
    }
}

/// [`tight_limits`] with room for the guest to build 100 MB values (and the
/// copies its allocator and the SDK make of them).
fn roomy_limits() -> Limits {
    Limits {
        memory_bytes: 512 << 20,
        ..tight_limits()
    }
}

/// The size of every enormous value `examples/hostile` returns.
const HUGE: u64 = 100_000_000;

fn attack(name: &str) -> Value {
    json!({"attack": name, "at": 2, "iterations": 3})
}

fn run(configs: Vec<Value>, limits: Limits, out: &Path) -> ExperimentSummary {
    let stop = StopCriteria {
        training_iteration: Some(50),
        ..Default::default()
    };
    common::run_trials(common::load("hostile"), configs, limits, stop, vec![], out)
}

fn by_attack(summary: &ExperimentSummary) -> BTreeMap<String, &Trial> {
    summary
        .trials
        .iter()
        .map(|t| {
            (
                format!("{}#{}", t.config["attack"].as_str().unwrap(), t.trial_id),
                t,
            )
        })
        .collect()
}

fn assert_error(trial: &Trial, expected: &[&str]) {
    assert_eq!(
        trial.status,
        TrialStatus::Error,
        "{} {:?}",
        trial.config,
        trial.error
    );
    let reason = trial.error.as_deref().unwrap();
    for part in expected {
        assert!(
            reason.contains(part),
            "{}: reason {reason:?} lacks {part:?}",
            trial.config
        );
    }
}

fn assert_benign_finished(trial: &Trial) {
    assert_eq!(trial.status, TrialStatus::Terminated, "{:?}", trial.error);
    assert_eq!(trial.iterations, 3);
    assert_eq!(trial.metric("score"), Some(3.0));
    assert_eq!(
        trial.stop_reason.as_deref(),
        Some("the trainable reported done")
    );
}

#[test]
fn every_hostile_guest_errors_with_its_reason_while_benign_trials_finish() {
    let out = tempfile::tempdir().unwrap();
    let names = [
        "none",
        "error",
        "panic",
        "trap",
        "loop_train",
        "loop_setup",
        "memory_bomb",
        "recursion",
        "stdout_flood",
        "log_flood",
        "big_report",
        "reserved_metric",
        "exit",
        "none",
    ];
    let summary = run(
        names.iter().map(|n| attack(n)).collect(),
        tight_limits(),
        out.path(),
    );
    let trials = &summary.trials;

    assert_benign_finished(&trials[0]);
    assert_benign_finished(&trials[13]);
    assert_error(
        &trials[1],
        &["train() at iteration 2 failed: deliberate failure at iteration 2"],
    );
    assert_error(
        &trials[2],
        &["train() at iteration 2 panicked: hostile guest panicked on purpose (at "],
    );
    assert_error(
        &trials[3],
        &["train() at iteration 2 trapped:", "unreachable"],
    );
    assert_error(
        &trials[4],
        &["train() at iteration 2 exceeded the per-call fuel limit of 1e9"],
    );
    assert_error(
        &trials[5],
        &["setup() exceeded the per-call fuel limit of 1e9"],
    );
    assert_error(
        &trials[6],
        &[
            "memory limit 64 MiB exceeded (the guest asked for",
            "during train() at iteration 2",
        ],
    );
    assert_error(&trials[7], &["train() at iteration 2 trapped:"]);
    assert_error(
        &trials[8],
        &["train() at iteration 2 exceeded the per-call fuel limit"],
    );
    assert_error(
        &trials[9],
        &["train() at iteration 2 exceeded the per-call fuel limit"],
    );
    assert_error(
        &trials[10],
        &[
            "train() at iteration 2 returned a bad result: 100000 metrics in one report; at most 1024",
        ],
    );
    assert_error(
        &trials[11],
        &["metric named `training_iteration`, which wtune fills in itself"],
    );
    // WASI 0.2's `exit` carries success or failure only: 3 arrives as 1.
    assert_error(
        &trials[12],
        &[
            "train() at iteration 2 called exit with status 1; a trainable must return from every call",
        ],
    );

    // Floods are capped on disk: the cap plus one truncation marker.
    for (trial, file) in [
        (&trials[8], "stdout.log"),
        (&trials[8], "stderr.log"),
        (&trials[9], "guest.log"),
    ] {
        let path = trial.dir.join(file);
        let len = std::fs::metadata(&path).unwrap().len();
        assert!(
            len > 60 << 10 && len < (64 << 10) + 200,
            "{}: {len} bytes",
            path.display()
        );
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.trim_end().ends_with("the rest was dropped]"),
            "{}",
            path.display()
        );
    }
    // Failed trials keep the results they reported before failing.
    let results = std::fs::read_to_string(trials[1].dir.join("result.jsonl")).unwrap();
    assert_eq!(results.lines().count(), 1);
    assert_eq!(by_attack(&summary).len(), names.len());
}

#[test]
fn printing_costs_fuel_for_every_byte() {
    // The flood hands the host 64 KiB blocks for a few hundred fuel each:
    // without a charge per byte, this call wrote 1.2 GB on 20 million
    // fuel. With it, a call can write at most its fuel in bytes.
    let out = tempfile::tempdir().unwrap();
    let fuel = 20_000_000;
    let limits = Limits {
        fuel_per_call: Some(fuel),
        log_bytes: 1 << 30,
        ..tight_limits()
    };
    let summary = run(vec![attack("stdout_flood")], limits, out.path());
    let trial = &summary.trials[0];
    assert_error(
        trial,
        &["train() at iteration 2 exceeded the per-call fuel limit"],
    );
    let written: u64 = ["stdout.log", "stderr.log"]
        .iter()
        .map(|f| std::fs::metadata(trial.dir.join(f)).unwrap().len())
        .sum();
    // The first call printed nothing; the flood wrote a good share of its
    // budget, but never more bytes than it had fuel.
    assert!(written > fuel / 4 && written <= fuel, "{written} bytes");
}

#[test]
fn rewriting_a_file_in_place_costs_fuel_for_every_byte() {
    // Overwriting the same bytes grows no quota: without a charge for the
    // host's work, each MiB cost a few hundred fuel and the call ran until
    // its deadline. With it, a call moves at most its fuel in bytes.
    let out = tempfile::tempdir().unwrap();
    let fuel = 50_000_000;
    let limits = Limits {
        fuel_per_call: Some(fuel),
        ..tight_limits()
    };
    let summary = run(
        vec![attack("disk_churn"), attack("none")],
        limits,
        out.path(),
    );
    let trial = &summary.trials[0];
    assert_error(
        trial,
        &["train() at iteration 2 exceeded the per-call fuel limit"],
    );
    assert_eq!(
        std::fs::metadata(trial.dir.join("work/churn"))
            .unwrap()
            .len(),
        1 << 20
    );
    // The same limits leave a trial that writes little its fuel.
    assert_benign_finished(&summary.trials[1]);
}

#[test]
fn a_tree_nested_past_path_max_does_not_keep_its_trial_from_starting_again() {
    // The guest builds the tree through its own descriptors, then fails;
    // the retry's new instance measures the trial's directory for its disk
    // quota. Measured by paths, the tree failed that start as a host error
    // ("File name too long"), at every retry and resume.
    let out = tempfile::tempdir().unwrap();
    let mut spec = spec(out.path(), vec![attack("deep_tree"), attack("none")], 50);
    spec.failure = FailurePolicy {
        max_failures: Some(1),
        ..Default::default()
    };
    let summary = run_backend(backend(tight_limits(), CheckpointMode::Guest), spec);
    let deep = &summary.trials[0];
    assert_benign_finished(deep);
    assert_eq!(deep.num_failures, 1);
    assert!(deep.dir.join("work").join("d".repeat(200)).is_dir());
    assert_benign_finished(&summary.trials[1]);
}

#[test]
fn a_runaway_call_is_ended_by_its_wall_clock_deadline() {
    let out = tempfile::tempdir().unwrap();
    let limits = Limits {
        fuel_per_call: None,
        call_timeout: Some(Duration::from_millis(500)),
        ..tight_limits()
    };
    let summary = run(
        vec![attack("loop_train"), attack("none")],
        limits,
        out.path(),
    );
    assert_error(
        &summary.trials[0],
        &["train() at iteration 2 exceeded its 500ms deadline"],
    );
    assert_benign_finished(&summary.trials[1]);
}

#[test]
fn the_per_trial_fuel_budget_ends_a_trial_and_names_the_iteration() {
    let out = tempfile::tempdir().unwrap();
    let limits = Limits {
        fuel_per_trial: Some(3_000_000),
        ..tight_limits()
    };
    let endless = json!({"attack": "none", "iterations": 1_000_000_000u64});
    let summary = common::run_trials(
        common::load("hostile"),
        vec![endless],
        limits,
        StopCriteria {
            training_iteration: Some(1_000_000),
            ..Default::default()
        },
        vec![],
        out.path(),
    );
    let trial = &summary.trials[0];
    assert_error(
        trial,
        &["fuel budget 3e6 exhausted during train() at iteration"],
    );
    assert!(trial.iterations > 1, "some iterations fit in the budget");
    assert!(trial.fuel_total <= 3_000_000, "{}", trial.fuel_total);
}

#[test]
fn a_memory_cap_below_the_initial_memory_fails_at_instantiation() {
    let out = tempfile::tempdir().unwrap();
    let limits = Limits {
        memory_bytes: 64 << 10,
        ..tight_limits()
    };
    let summary = run(vec![attack("none")], limits, out.path());
    assert_error(
        &summary.trials[0],
        &["memory limit 64 KiB exceeded", "during instantiation"],
    );
}

#[test]
fn escapes_are_denied_and_nothing_outside_the_trial_changes() {
    let out = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    std::fs::write(data.path().join("train.csv"), "1,2,3\n").unwrap();
    let grants = vec![("digits".to_string(), data.path().to_path_buf())];
    let stop = StopCriteria {
        training_iteration: Some(5),
        ..Default::default()
    };
    let configs = vec![
        json!({"attack": "escape", "at": 1}),
        json!({"attack": "probe"}),
        attack("none"),
    ];
    // What the guest's planted link `planted-outside` points at, from its
    // `work/` directory: a file beside the trial directories.
    let outside = out.path().join("outside.txt");
    std::fs::write(&outside, "the host's own file\n").unwrap();
    let summary = common::run_trials(
        common::load("hostile"),
        configs,
        tight_limits(),
        stop,
        grants,
        out.path(),
    );

    let escape = &summary.trials[0];
    assert_error(
        escape,
        &[
            "train() at iteration 1 failed: all escape attempts denied: ",
            "read ../params.json: Operation not permitted",
            "read /proc/self/environ: No such file or directory",
            "read /proc/self/mem: No such file or directory",
            "list /: shows only the sandbox",
            "hard link ../params.json: Operation not permitted",
            // Absolute paths resolve inside the sandbox, where there is no
            // /etc.
            "hard link /etc/passwd: No such file or directory",
            // The data grant is read-only, so it cannot be linked into the
            // writable directory and written through the link.
            "hard link /data/digits/train.csv: Operation not permitted",
            "symlink to /etc/passwd: Operation not permitted",
            "symlink to ../params.json: Operation not permitted",
            "read via planted-params: link not planted",
            "write via planted-params: link not planted",
            "list via planted-up: link not planted",
            "write via planted-up/pwned: link not planted",
            "read via planted-outside: link not planted",
            "write via planted-outside: link not planted",
            "write /data/digits/pwned: Operation not permitted",
            "write ../pwned: Operation not permitted",
            // No symbolic link can be made, even one that only dangles in
            // the trial's own directory: left behind, it would lead a later
            // copy of the directory (`tar -h`, `rsync -L`) outside it.
            "(planted links: planted-params not created (Operation not permitted), \
             planted-up not created (Operation not permitted), \
             planted-outside not created (Operation not permitted))",
        ],
    );
    assert_eq!(
        escape.metric("escaped"),
        None,
        "the sandbox leaked: {:?}",
        escape.last_result
    );
    // The granted data is untouched, and nothing was written beside the
    // guest's own work directory.
    let data_files: Vec<_> = std::fs::read_dir(data.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(data_files, ["train.csv"]);
    assert!(!escape.dir.join("pwned").exists());
    assert!(!out.path().join("pwned").exists());
    let params: Value =
        serde_json::from_str(&std::fs::read_to_string(escape.dir.join("params.json")).unwrap())
            .unwrap();
    assert_eq!(params["attack"], json!("escape"));
    assert_eq!(
        std::fs::read_to_string(&outside).unwrap(),
        "the host's own file\n"
    );
    // Nothing is left in the trial's directory: no link was made, symbolic
    // or hard.
    let work = escape.dir.join("work");
    let left: Vec<_> = std::fs::read_dir(&work).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");

    let probe = &summary.trials[1];
    assert_eq!(probe.status, TrialStatus::Terminated, "{:?}", probe.error);
    assert_eq!(
        probe.metric("env_count"),
        Some(0.0),
        "no environment leaks in"
    );
    assert_eq!(
        probe.metric("args_count"),
        Some(0.0),
        "no arguments leak in"
    );
    assert_eq!(
        probe.metric("cwd_write_ok"),
        Some(1.0),
        "the trial may write its own directory"
    );
    // Clocks and random bytes work on purpose (see examples/hostile's
    // "What the sandbox is meant to allow").
    for flag in ["wall_clock_ok", "monotonic_ok", "random_ok"] {
        assert_eq!(probe.metric(flag), Some(1.0), "{flag}");
    }
    assert!(probe.dir.join("work/probe.txt").is_file());
    assert_benign_finished(&summary.trials[2]);
}

/// A spec for `configs`, four at a time, each stopped after `iterations`.
fn spec(out: &Path, configs: Vec<Value>, iterations: u64) -> RunSpec {
    RunSpec {
        metric: None,
        mode: Mode::Max,
        stop: StopCriteria {
            training_iteration: Some(iterations),
            ..Default::default()
        },
        max_concurrent: 4,
        configs,
        ..RunSpec::new("hostile", out.to_path_buf())
    }
}

/// Runs `spec` on `backend`, writing the usual per-trial files and
/// `experiment.json`.
fn run_backend(backend: WasmBackend, spec: RunSpec) -> ExperimentSummary {
    let runner = Runner::new(backend, spec, Box::new(Fifo::default()))
        .callback(TrialFiles::new())
        .callback(ExperimentFile::new(Value::Null));
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(runner.run())
        .expect("run")
}

/// The hostile guest with checkpoints taken the given way.
fn backend(limits: Limits, mode: CheckpointMode) -> WasmBackend {
    WasmBackend::new(common::load("hostile"), limits, vec![])
        .checkpoint_mode(mode)
        .unwrap()
}

/// Every file under `dir`, links not followed, with its size.
fn files_under(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        if meta.is_dir() {
            files.extend(files_under(&path));
        } else {
            files.push((path, meta.len()));
        }
    }
    files
}

/// Nothing the experiment wrote (results, logs, checkpoints,
/// `experiment.json`) nor its summary holds an enormous value: the largest
/// file is under 1 MiB, each error under 5 KB, the summary under 64 KiB.
fn assert_nothing_enormous_kept(out: &Path, summary: &ExperimentSummary) {
    let files = files_under(out);
    assert!(files.iter().any(|(p, _)| p.ends_with("experiment.json")));
    for (path, len) in files {
        assert!(len < 1 << 20, "{} holds {len} bytes", path.display());
    }
    for trial in &summary.trials {
        let error = trial.error.as_deref().unwrap_or("");
        assert!(
            error.len() < 5000,
            "{}: {} bytes",
            trial.trial_id,
            error.len()
        );
    }
    let text = summary_text(summary);
    assert!(text.len() < 64 << 10, "summary of {} bytes", text.len());
}

#[test]
fn enormous_values_are_refused_or_cut_and_never_kept() {
    let out = tempfile::tempdir().unwrap();
    let names = ["none", "huge_error", "huge_metric_name", "huge_log", "none"];
    let summary = run(
        names.iter().map(|n| attack(n)).collect(),
        roomy_limits(),
        out.path(),
    );
    let trials = &summary.trials;
    assert_benign_finished(&trials[0]);
    assert_benign_finished(&trials[4]);
    assert_error(
        &trials[1],
        &[
            &format!(
                "train() at iteration 2 failed with an error message of {HUGE} bytes; its start: eeee"
            ),
            "eeee [...]",
        ],
    );
    assert_error(
        &trials[2],
        &[&format!(
            "train() at iteration 2 returned a bad result: metric names must be 1 to 256 bytes \
             long (got one of {HUGE} bytes)"
        )],
    );
    // A log line is cut, not fatal: the trial goes on.
    assert_benign_finished(&trials[3]);
    let log = std::fs::read_to_string(trials[3].dir.join("guest.log")).unwrap();
    assert!(
        log.contains(&format!(" [wtune: a line of {HUGE} bytes, cut at 16384]\n")),
        "{}",
        &log[log.len().saturating_sub(200)..]
    );
    assert!(log.len() < 17 << 10, "{} bytes", log.len());
    assert_nothing_enormous_kept(out.path(), &summary);
}

/// Each metric name is a column, a series on the dashboard and a key on the
/// tracking server: a guest that reports names it never used before at
/// every step is stopped once its reports would use more than 1,024 in all.
#[test]
fn a_guest_that_invents_metric_names_at_every_step_is_stopped() {
    let out = tempfile::tempdir().unwrap();
    let summary = run(
        vec![attack("metric_name_flood"), attack("none")],
        tight_limits(),
        out.path(),
    );
    let trials = &summary.trials;
    // `score` at iteration 1, then 255 new names at each from the 2nd: the
    // 6th would take it to 1,276.
    assert_error(
        &trials[0],
        &[
            "train() at iteration 6 returned a bad result: the trial's reports use more than \
           1024 metric names in all (1021 so far, 255 new in this one)",
        ],
    );
    assert_eq!(trials[0].iterations, 5);
    assert_benign_finished(&trials[1]);
}

#[test]
fn runaway_or_enormous_guest_checkpoints_fail_their_trial_and_write_nothing() {
    let out = tempfile::tempdir().unwrap();
    let names = ["none", "loop_save", "loop_restore", "big_save", "none"];
    let mut spec = spec(out.path(), names.iter().map(|n| attack(n)).collect(), 50);
    // A checkpoint after every iteration (save), and one recovery from the
    // newest of them (restore) for the trial that fails on purpose.
    spec.checkpoint = CheckpointPolicy {
        freq: 1,
        ..Default::default()
    };
    spec.failure = FailurePolicy {
        max_failures: Some(1),
        ..Default::default()
    };
    let summary = run_backend(backend(roomy_limits(), CheckpointMode::Guest), spec);
    let trials = &summary.trials;

    assert_benign_finished(&trials[0]);
    assert_benign_finished(&trials[4]);
    assert_eq!(
        checkpoint_files(&trials[0]),
        [
            "checkpoint_000001.wtsnap",
            "checkpoint_000002.wtsnap",
            "checkpoint_000003.wtsnap"
        ]
    );
    assert_error(
        &trials[1],
        &["checkpoint at iteration 2 failed: save() exceeded the per-call fuel limit of 1e9"],
    );
    assert_error(
        &trials[2],
        &[
            "restoring ",
            "checkpoint_000001.wtsnap: restore() exceeded the per-call fuel limit of 1e9",
        ],
    );
    assert_eq!(trials[2].num_failures, 1, "{:?}", trials[2].error);
    assert_error(
        &trials[3],
        &[&format!(
            "checkpoint at iteration 2 failed: save() returned a bad result: {HUGE} bytes of \
             state; guest checkpoints may hold at most 64 MiB (limits.checkpoint_size)"
        )],
    );
    // The refused state never reached the disk, not even as a temporary file.
    for trial in &trials[1..4] {
        assert_eq!(
            checkpoint_files(trial),
            ["checkpoint_000001.wtsnap"],
            "{}",
            trial.config
        );
    }
    assert_nothing_enormous_kept(out.path(), &summary);
}

/// The names of the files in a trial's `checkpoints/`, hidden ones included.
fn checkpoint_files(trial: &Trial) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(trial.dir.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

#[test]
fn a_runaway_reset_fails_the_switch_to_a_new_config() {
    // A host snapshot of a benign trial at its end...
    let first = tempfile::tempdir().unwrap();
    let mut earlier = spec(
        first.path(),
        vec![json!({"attack": "none", "iterations": 2})],
        2,
    );
    earlier.checkpoint.at_end = true;
    let snapshots = backend(tight_limits(), CheckpointMode::Snapshot);
    let done = run_backend(snapshots.clone(), earlier);
    let source = &done.trials[0];
    let snapshot = source.dir.join(&source.checkpoints.last().unwrap().path);

    // ... that every trial of a second experiment starts from. Its config
    // differs from each trial's, so the host restores the memory and asks
    // the trainable to switch with reset(new config).
    let out = tempfile::tempdir().unwrap();
    let mut spec = spec(
        out.path(),
        vec![
            json!({"attack": "loop_reset"}),
            json!({"attack": "none", "iterations": 4}),
        ],
        50,
    );
    spec.restore_from = Some(snapshot);
    let summary = run_backend(snapshots, spec);
    assert_error(
        &summary.trials[0],
        &[
            "switching ",
            "checkpoint_000002.wtsnap to this trial's config: reset() exceeded the per-call \
             fuel limit of 1e9",
        ],
    );
    let benign = &summary.trials[1];
    assert_eq!(benign.status, TrialStatus::Terminated, "{:?}", benign.error);
    assert_eq!(benign.iterations, 4, "continued from iteration 2");
    assert_eq!(benign.metric("score"), Some(4.0));
}

/// A `tracing` writer that keeps what it is given.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_runaway_cleanup_is_ended_and_its_trial_keeps_its_results() {
    // The call is bounded and named...
    let program = common::load("hostile");
    let dir = tempfile::tempdir().unwrap();
    let env = common::trial_env(dir.path(), vec![]);
    let mut instance = program.instantiate(&env, &tight_limits()).unwrap();
    instance.setup(&attack("loop_cleanup").to_string()).unwrap();
    instance.train().unwrap();
    let fault = instance.cleanup().unwrap_err();
    assert!(matches!(fault, TrialFault::FuelPerCall { .. }), "{fault:?}");
    assert_eq!(
        fault.to_string(),
        "cleanup() exceeded the per-call fuel limit of 1e9"
    );

    // ... and in an experiment with one slot, the next trial starts once
    // the cleanup has been ended; the trial keeps its (complete) results and
    // a warning names it and the call.
    let out = tempfile::tempdir().unwrap();
    let mut spec = spec(out.path(), vec![attack("loop_cleanup"), attack("none")], 50);
    spec.max_concurrent = 1;
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .finish();
    let summary = tracing::subscriber::with_default(subscriber, || {
        run_backend(backend(tight_limits(), CheckpointMode::Guest), spec)
    });
    assert_benign_finished(&summary.trials[0]);
    assert_benign_finished(&summary.trials[1]);
    let warnings = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let line = warnings
        .lines()
        .find(|l| l.contains("cleanup failed"))
        .unwrap_or_else(|| panic!("no warning in {warnings:?}"));
    assert!(
        line.contains("trial_0000")
            && line.contains("cleanup failed: cleanup() exceeded the per-call fuel limit of 1e9"),
        "{line}"
    );
}

#[test]
fn every_export_is_also_bounded_by_the_wall_clock_deadline() {
    let program = common::load("hostile");
    let limits = Limits {
        fuel_per_call: None,
        call_timeout: Some(Duration::from_millis(300)),
        ..tight_limits()
    };
    let dir = tempfile::tempdir().unwrap();
    let instance = |name: &str| {
        let env = common::trial_env(&dir.path().join(name), vec![]);
        program.instantiate(&env, &limits).unwrap()
    };
    let config = |name: &str| json!({"attack": name, "at": 1}).to_string();
    let expect = |result: Result<(), TrialFault>, call: &str| {
        let fault = result.unwrap_err();
        assert_eq!(
            fault.to_string(),
            format!("{call} exceeded its 300ms deadline")
        );
    };

    let mut setup = instance("loop_setup");
    expect(setup.setup(&config("loop_setup")).map(drop), "setup()");

    let mut save = instance("loop_save");
    save.setup(&config("loop_save")).unwrap();
    save.train().unwrap();
    expect(save.save().map(drop), "save()");

    let mut restore = instance("loop_restore");
    restore.setup(&config("loop_restore")).unwrap();
    expect(restore.restore(&0u64.to_le_bytes()).map(drop), "restore()");

    let mut reset = instance("reset");
    reset.setup(&config("none")).unwrap();
    expect(reset.reset(&config("loop_reset")).map(drop), "reset()");

    let mut cleanup = instance("loop_cleanup");
    cleanup.setup(&config("loop_cleanup")).unwrap();
    expect(cleanup.cleanup().map(drop), "cleanup()");
    // An instance stopped mid-call is never entered again.
    assert!(matches!(cleanup.train(), Err(TrialFault::Poisoned)));
}

#[test]
fn sockets_are_denied_and_nothing_reaches_the_host() {
    // A TCP listener and a UDP socket on the same loopback port: the guest
    // tries to reach both.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let udp = std::net::UdpSocket::bind(("127.0.0.1", port)).unwrap();
    udp.set_nonblocking(true).unwrap();

    let out = tempfile::tempdir().unwrap();
    let summary = run(
        vec![
            json!({"attack": "sockets", "at": 2, "iterations": 3, "port": port}),
            attack("none"),
        ],
        tight_limits(),
        out.path(),
    );
    assert_error(
        &summary.trials[0],
        &[&format!(
            "train() at iteration 2 failed: all socket attempts denied: \
             tcp connect 127.0.0.1:{port}: Permission denied; \
             tcp listen 127.0.0.1:0: Permission denied; \
             udp send 127.0.0.1:{port}: Permission denied; \
             dns lookup localhost: failed to lookup address information: Non-recoverable error"
        )],
    );
    assert_eq!(summary.trials[0].metric("escaped"), None);
    assert_benign_finished(&summary.trials[1]);
    assert_eq!(
        listener.accept().map(drop).unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock,
        "the listener was connected to"
    );
    let mut buffer = [0u8; 64];
    assert_eq!(
        udp.recv_from(&mut buffer).map(drop).unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock,
        "a datagram arrived"
    );
}

/// A trainable in WAT text, for what Rust cannot emit (`table.grow`,
/// malformed or aliased return values). `items` are extra fields of the core
/// module, whose memory has `pages` pages; `train` and `save` are the bodies
/// of those core functions, each leaving the address of its result. Every
/// other export succeeds with an empty result. Results are read from
/// address 16: zero unless a body writes there, `ok` with zero payload.
///
/// The canonical ABI puts a `result<report, string>` there as a tag byte,
/// then (from offset 4) the report's metric list pointer and length and its
/// `done` flag; a `result<list<u8>, string>` as the tag, then pointer and
/// length. A metric is 16 bytes: name pointer, name length, value (f64).
fn wat_trainable(pages: u32, items: &str, train: &str, save: &str) -> String {
    format!(
        r#"(component
  (core module $m
    (memory (export "memory") {pages})
    {items}
    (global $heap (mut i32) (i32.const 1024))
    (func (export "realloc") (param i32 i32 i32 i32) (result i32)
      (local $p i32)
      (local.set $p (i32.and (i32.add (global.get $heap) (i32.const 7)) (i32.const -8)))
      (global.set $heap (i32.add (local.get $p) (local.get 3)))
      (local.get $p))
    (func (export "setup") (param i32 i32) (result i32) (i32.const 16))
    (func (export "train") (result i32) {train})
    (func (export "save") (result i32) {save})
    (func (export "restore") (param i32 i32) (result i32) (i32.const 16))
    (func (export "reset") (param i32 i32) (result i32) (i32.const 16))
    (func (export "cleanup")))
  (core instance $i (instantiate $m))
  (type $metric (record (field "name" string) (field "value" f64)))
  (export $metric-ex "metric" (type $metric))
  (type $report (record (field "metrics" (list $metric-ex)) (field "done" bool)))
  (export $report-ex "report" (type $report))
  (func (export "setup") (param "config" string) (result (result (error string)))
    (canon lift (core func $i "setup") (memory (core memory $i "memory")) (realloc (core func $i "realloc"))))
  (func (export "train") (result (result $report-ex (error string)))
    (canon lift (core func $i "train") (memory (core memory $i "memory")) (realloc (core func $i "realloc"))))
  (func (export "save") (result (result (list u8) (error string)))
    (canon lift (core func $i "save") (memory (core memory $i "memory")) (realloc (core func $i "realloc"))))
  (func (export "restore") (param "state" (list u8)) (result (result (error string)))
    (canon lift (core func $i "restore") (memory (core memory $i "memory")) (realloc (core func $i "realloc"))))
  (func (export "reset") (param "config" string) (result (result bool (error string)))
    (canon lift (core func $i "reset") (memory (core memory $i "memory")) (realloc (core func $i "realloc"))))
  (func (export "cleanup") (canon lift (core func $i "cleanup")))
)"#
    )
}

/// A WAT body that returns the `ok` result at address 16 as it stands.
const OK: &str = "(i32.const 16)";

/// Loads a [`wat_trainable`].
fn wat_program(wat: &str) -> Program {
    let bytes = wat::parse_str(wat).unwrap();
    common::sandbox()
        .load_bytes(&bytes)
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Runs one trial of `program` for at most `iterations`.
fn run_one(program: Program, limits: Limits, iterations: u64, out: &Path) -> Trial {
    let stop = StopCriteria {
        training_iteration: Some(iterations),
        ..Default::default()
    };
    let mut summary = common::run_trials(program, vec![json!({})], limits, stop, vec![], out);
    summary.trials.remove(0)
}

#[test]
fn table_growth_past_the_cap_is_stopped_with_the_limit_named() {
    // Each `train()` grows a function table by 40 000 elements.
    let grow = "(if (i32.eq (table.grow $t (ref.null func) (i32.const 40000)) (i32.const -1))
        (then unreachable))
      (i32.const 16)";
    let program = wat_program(&wat_trainable(1, "(table $t 1 funcref)", grow, OK));
    let out = tempfile::tempdir().unwrap();
    let trial = &run_one(program, tight_limits(), 10, out.path());
    // 40 001 and 80 001 elements fit under the cap of 100 000; 120 001 not.
    assert_error(
        trial,
        &[
            "table limit of 100000 elements exceeded (the guest asked for 120001) during \
           train() at iteration 3",
        ],
    );
    assert_eq!(trial.iterations, 2);
}

#[test]
fn memory_is_capped_for_all_of_a_trials_memories_together() {
    // 37.5 MiB in its first memory, and each `train()` grows a second one
    // by 12.5 MiB: each memory stays under the cap of 64 MiB, the two
    // together pass it at the third call.
    let grow = "(if (i32.eq (memory.grow $more (i32.const 200)) (i32.const -1))
        (then unreachable))
      (i32.const 16)";
    let program = wat_program(&wat_trainable(600, "(memory $more 0)", grow, OK));
    let out = tempfile::tempdir().unwrap();
    let trial = &run_one(program, tight_limits(), 10, out.path());
    assert_error(
        trial,
        &[
            "memory limit 64 MiB exceeded (the guest asked for 75 MiB) during train() at \
           iteration 3",
        ],
    );
    assert_eq!(trial.iterations, 2);
}

#[test]
fn a_growth_past_a_memorys_own_maximum_fails_and_holds_nothing() {
    // Each `train()` asks to grow a memory declared with at most 10 pages
    // by 200: the guest gets -1, and nothing is counted against the cap
    // (37.5 MiB and three such asks would pass 64 MiB).
    let grow = "(drop (memory.grow $capped (i32.const 200))) (i32.const 16)";
    let program = wat_program(&wat_trainable(600, "(memory $capped 0 10)", grow, OK));
    let out = tempfile::tempdir().unwrap();
    let trial = &run_one(program, tight_limits(), 10, out.path());
    assert_eq!(trial.status, TrialStatus::Terminated, "{:?}", trial.error);
    assert_eq!(trial.iterations, 10);
}

/// `train()`'s body for a report of `count` metrics at address 4096, each
/// named by the same `len` bytes at address 65536: `first`, then zeros.
fn aliased_report(count: u32, len: u32, first: u8) -> String {
    format!(
        "(local $i i32)
      (i32.store8 (i32.const 65536) (i32.const {first}))
      (loop $each
        (i32.store (i32.add (i32.const 4096) (i32.mul (local.get $i) (i32.const 16))) (i32.const 65536))
        (i32.store (i32.add (i32.const 4100) (i32.mul (local.get $i) (i32.const 16))) (i32.const {len}))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br_if $each (i32.lt_u (local.get $i) (i32.const {count}))))
      (i32.store (i32.const 20) (i32.const 4096))
      (i32.store (i32.const 24) (i32.const {count}))
      (i32.const 16)"
    )
}

#[test]
fn a_value_that_points_at_the_same_bytes_many_times_is_cut_off_at_the_memory_cap() {
    // Three metrics share one 30 MB name: 90 MB to copy out of a guest that
    // may hold 64 MiB. The host stops reading at the cap rather than
    // allocating every reference (wasmtime's own default would let 128 MiB
    // through; a million references would be terabytes).
    let program = wat_program(&wat_trainable(
        460,
        "",
        &aliased_report(3, 30_000_000, 0),
        OK,
    ));
    let out = tempfile::tempdir().unwrap();
    let trial = run_one(program, tight_limits(), 1, out.path());
    assert_error(
        &trial,
        &[
            "train() at iteration 1 passed the host a value it refuses: more than 64 MiB in one \
             value, the guest's memory limit (limits.memory); strings and lists count once for \
             every reference to them",
        ],
    );
}

#[test]
fn a_malformed_return_value_is_the_guests_fault_named_as_such() {
    // A metric list that points past the end of memory, and a metric name
    // that is not UTF-8.
    let out_of_bounds = "(i32.store (i32.const 20) (i32.const 0x7fff0000))
      (i32.store (i32.const 24) (i32.const 10))
      (i32.const 16)";
    let not_utf8 = aliased_report(1, 1, 0xff);
    for (body, reason) in [
        (out_of_bounds, "list pointer/length out of bounds of memory"),
        (not_utf8.as_str(), "invalid utf-8"),
    ] {
        let program = wat_program(&wat_trainable(2, "", body, OK));
        let out = tempfile::tempdir().unwrap();
        let trial = run_one(program, tight_limits(), 1, out.path());
        assert_error(
            &trial,
            &[
                "train() at iteration 1 passed the host a value it refuses: ",
                reason,
            ],
        );
    }
}

#[test]
fn a_guest_checkpoint_over_128_mib_is_taken_when_the_limits_allow_it() {
    // 140 MB: over wasmtime's default cap on one value (128 MiB), under the
    // 256 MiB this experiment allows for memory and checkpoints.
    const STATE: u32 = 140_000_000;
    let save = format!(
        "(i32.store (i32.const 20) (i32.const 65536))
      (i32.store (i32.const 24) (i32.const {STATE}))
      (i32.const 16)"
    );
    let program = wat_program(&wat_trainable(STATE / 65536 + 2, "", OK, &save));
    let limits = Limits {
        memory_bytes: 256 << 20,
        checkpoint_bytes: 256 << 20,
        ..tight_limits()
    };
    let backend = WasmBackend::new(program, limits, vec![])
        .checkpoint_mode(CheckpointMode::Guest)
        .unwrap();
    let out = tempfile::tempdir().unwrap();
    let mut spec = spec(out.path(), vec![json!({})], 1);
    spec.checkpoint = CheckpointPolicy {
        freq: 1,
        ..Default::default()
    };
    let summary = run_backend(backend, spec);
    let trial = &summary.trials[0];
    assert_eq!(trial.status, TrialStatus::Terminated, "{:?}", trial.error);
    assert_eq!(checkpoint_files(trial), ["checkpoint_000001.wtsnap"]);
}

/// The host's own memory stays bounded while guests misbehave: a memory
/// bomb, 100 MB values and a 100 000-metric report, two at a time under a
/// 256 MiB guest cap, leave the `wtune` process's peak resident memory
/// within what two capped guests plus one copy of each value explain.
#[cfg(target_os = "linux")]
#[test]
fn the_host_memory_stays_bounded_under_hostile_guests() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("experiment.toml");
    std::fs::write(
        &config,
        "max_concurrent_trials = 2\nseed = 1\n\
         [limits]\nmemory = \"256MiB\"\nfuel_per_call = 2e10\ncall_timeout = \"60s\"\n\
         [param_space]\niterations = 2\nat = 1\nattack = { grid_search = [\"memory_bomb\", \
         \"huge_error\", \"huge_metric_name\", \"huge_log\", \"big_report\", \"none\"] }\n",
    )
    .unwrap();
    #[allow(clippy::zombie_processes, reason = "reaped by wait4 below")]
    let child = common::wtune()
        .arg("run")
        .arg(common::guest("hostile"))
        .arg("--config")
        .arg(&config)
        .arg("--output-dir")
        .arg(dir.path().join("out"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // wait4 rather than Child::wait, for the child's own peak RSS.
    let mut status = 0;
    // SAFETY: rusage is plain data that wait4 fills in; the pid is our
    // child's, not yet reaped.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = child.id() as libc::pid_t;
    let reaped = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(reaped, pid);
    assert!(libc::WIFEXITED(status), "wtune died of a signal: {status}");
    let peak_mib = usage.ru_maxrss as u64 / 1024;
    // Two guests at their 256 MiB cap, each with one 100 MB copy of what it
    // returned, plus the runtime: about 1 GiB at worst. Unbounded handling
    // (an uncapped bomb, values kept or copied repeatedly) goes far past.
    assert!(peak_mib < 1536, "peak resident memory {peak_mib} MiB");

    let experiment: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("out/experiment.json")).unwrap())
            .unwrap();
    let statuses: Vec<&str> = experiment["trials"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["status"].as_str().unwrap())
        .collect();
    assert_eq!(
        statuses.iter().filter(|s| **s == "ERROR").count(),
        4,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == "TERMINATED").count(),
        2,
        "{statuses:?}"
    );
}

// ----- containment under attack: blocking calls, the operator's terminal,
// handles, disk ----------------------------------------------------------

/// Limits whose only wall-clock bound is a short deadline: no fuel limit
/// could end a guest that waits.
fn short_deadline() -> Limits {
    Limits {
        fuel_per_call: None,
        call_timeout: Some(Duration::from_secs(1)),
        ..tight_limits()
    }
}

#[test]
fn a_guest_blocked_in_a_wasi_wait_is_ended_at_its_deadline() {
    let out = tempfile::tempdir().unwrap();
    let summary = run(
        vec![attack("sleep_train"), attack("none")],
        short_deadline(),
        out.path(),
    );
    assert_error(
        &summary.trials[0],
        &["train() at iteration 2 exceeded its 1s deadline"],
    );
    assert_benign_finished(&summary.trials[1]);
}

#[test]
fn every_export_that_waits_in_wasi_is_ended_at_its_deadline() {
    let program = common::load("hostile");
    let dir = tempfile::tempdir().unwrap();
    let limits = short_deadline();
    let config = |name: &str| json!({"attack": name, "at": 1}).to_string();

    let env = common::trial_env(&dir.path().join("setup"), vec![]);
    let mut setup = program.instantiate(&env, &limits).unwrap();
    let fault = setup.setup(&config("sleep_setup")).unwrap_err();
    assert!(matches!(fault, TrialFault::Timeout { .. }), "{fault:?}");
    assert_eq!(fault.to_string(), "setup() exceeded its 1s deadline");

    let env = common::trial_env(&dir.path().join("cleanup"), vec![]);
    let mut cleanup = program.instantiate(&env, &limits).unwrap();
    cleanup.setup(&config("sleep_cleanup")).unwrap();
    cleanup.train().unwrap();
    let fault = cleanup.cleanup().unwrap_err();
    assert_eq!(fault.to_string(), "cleanup() exceeded its 1s deadline");
    assert!(matches!(cleanup.train(), Err(TrialFault::Poisoned)));
}

#[test]
fn a_sleeping_cleanup_is_ended_and_the_next_trial_runs() {
    // One slot: the second trial starts only once the first one's cleanup,
    // blocked in WASI, has been ended by its deadline.
    let out = tempfile::tempdir().unwrap();
    let mut spec = spec(
        out.path(),
        vec![attack("sleep_cleanup"), attack("none")],
        50,
    );
    spec.max_concurrent = 1;
    let summary = run_backend(backend(short_deadline(), CheckpointMode::Guest), spec);
    assert_benign_finished(&summary.trials[0]);
    assert_benign_finished(&summary.trials[1]);
}

/// What `examples/hostile`'s `terminal` attack returns as its error.
const TERMINAL_ATTACK: &str =
    "\x1b[2J\x1b]0;pwned\x07\x1b[8mhidden\x1b[0m\r\nBest trial: trial_9999 (forged)";

/// Whether `text` holds a character a terminal would act on, other than
/// the newlines that end lines.
fn has_terminal_controls(text: &str) -> bool {
    text.chars().any(|c| c != '\n' && c.is_control())
}

#[test]
fn guest_text_reaches_files_raw_and_the_terminal_inert() {
    // In the library: the reason keeps the guest's text for the files,
    // the summary shows it escaped, on one line.
    let out = tempfile::tempdir().unwrap();
    let summary = run(
        vec![attack("terminal"), attack("none")],
        tight_limits(),
        out.path(),
    );
    let reason = summary.trials[0].error.as_deref().unwrap();
    assert!(reason.contains(TERMINAL_ATTACK), "{reason:?}");
    assert_benign_finished(&summary.trials[1]);
    let text = summary_text(&summary);
    assert!(!has_terminal_controls(&text), "{text:?}");
    assert!(
        text.contains("\\u{1b}[2J\\u{1b}]0;pwned\\u{7}")
            && text.contains("\\r\\nBest trial: trial_9999"),
        "{text}"
    );
    assert!(
        !text
            .lines()
            .any(|l| l.starts_with("Best trial: trial_9999")),
        "a forged line: {text}"
    );
    let state = std::fs::read_to_string(out.path().join("experiment.json")).unwrap();
    let saved: Value = serde_json::from_str(&state).unwrap();
    assert!(
        saved.to_string().contains("pwned"),
        "the files keep the guest's text"
    );

    // Through the CLI: the progress lines, warnings, summary and errors on
    // the operator's terminal carry no control character, with fail_fast's
    // error too.
    for fail_fast in ["false", "\"raise\""] {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("experiment.toml");
        std::fs::write(
            &config,
            format!(
                "metric = \"score\"\nmode = \"max\"\nmax_concurrent_trials = 1\n\
                 fail_fast = {fail_fast}\n\
                 [param_space]\nattack = {{ grid_search = [\"none\", \"terminal\"] }}\nat = 1\n\
                 iterations = 2\n"
            ),
        )
        .unwrap();
        let run = common::wtune()
            .arg("run")
            .arg(common::guest("hostile"))
            .arg("--config")
            .arg(&config)
            .arg("--output-dir")
            .arg(dir.path().join("out"))
            .env("WTUNE_LOG", "info")
            .output()
            .unwrap();
        let stdout = String::from_utf8(run.stdout).unwrap();
        let stderr = String::from_utf8(run.stderr).unwrap();
        assert!(
            stderr.contains("pwned") || stdout.contains("pwned"),
            "the reason is shown: {stdout}{stderr}"
        );
        for text in [&stdout, &stderr] {
            assert!(!has_terminal_controls(text), "{fail_fast}: {text:?}");
            assert!(
                !text
                    .lines()
                    .any(|l| l.starts_with("Best trial: trial_9999")),
                "{fail_fast}: a forged line: {text}"
            );
        }
    }
}

#[test]
fn open_handles_are_capped_per_trial_with_the_limit_named() {
    let out = tempfile::tempdir().unwrap();
    let limits = Limits {
        open_files: 64,
        ..tight_limits()
    };
    let summary = run(
        vec![attack("open_files"), attack("none"), attack("open_files")],
        limits,
        out.path(),
    );
    for hoarder in [&summary.trials[0], &summary.trials[2]] {
        assert_error(
            hoarder,
            &[
                "open-file limit of 64 handles exceeded (limits.open_files",
                "during train() at iteration 2",
            ],
        );
    }
    assert_benign_finished(&summary.trials[1]);
}

#[test]
fn random_bytes_cost_fuel_and_one_call_draws_at_most_a_mebibyte() {
    // Without a charge, `random_flood` would draw until its 60 s deadline
    // on fuel it never spends.
    let out = tempfile::tempdir().unwrap();
    let summary = run(
        vec![
            attack("random_flood"),
            attack("random_huge"),
            attack("none"),
        ],
        tight_limits(),
        out.path(),
    );
    assert_error(
        &summary.trials[0],
        &["train() at iteration 2 exceeded the per-call fuel limit of 1e9"],
    );
    assert_error(
        &summary.trials[1],
        &[
            "train() at iteration 2 passed the host a value it refuses: requested len 67108864 exceeds limit 1048576",
        ],
    );
    assert_benign_finished(&summary.trials[2]);
}

/// The process's descriptors open on files removed from under `dir`.
fn removed_files_held_under(dir: &Path) -> Vec<String> {
    let dir = dir.canonicalize().unwrap();
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .map(|target| target.to_string_lossy().into_owned())
        .filter(|target| {
            target.starts_with(dir.to_str().unwrap()) && target.ends_with(" (deleted)")
        })
        .collect()
}

#[test]
fn a_removed_file_is_let_go_with_the_last_stream_that_held_it() {
    // `unlinked_streams` drops 32 streams on removed files after their
    // descriptors: the host's handles to those files must close with the
    // streams, or a trial could hold more host descriptors than its
    // `open_files` budget (the table counts only live descriptors and
    // streams).
    let program = common::load("hostile");
    let dir = tempfile::tempdir().unwrap();
    let env = common::trial_env(dir.path(), vec![]);
    let mut instance = program.instantiate(&env, &tight_limits()).unwrap();
    instance
        .setup(&attack("unlinked_streams").to_string())
        .unwrap();
    instance.train().unwrap();
    assert_eq!(removed_files_held_under(dir.path()), Vec::<String>::new());
    instance.train().unwrap();
    assert_eq!(removed_files_held_under(dir.path()), Vec::<String>::new());
    // The files were made and removed (the attack ran).
    assert!(!dir.path().join("work/gone-0").exists());
}

/// Bytes of regular files and entries under `dir`.
fn disk_usage(dir: &Path) -> (u64, usize) {
    let files = files_under(dir);
    (files.iter().map(|(_, size)| size).sum(), files.len())
}

#[test]
fn a_trial_that_fills_its_directory_is_stopped_at_its_disk_quota() {
    // Three ways to fill it: plain writes, rewrites and removals
    // (`disk_fill`); files removed while open, which free nothing while a
    // handle holds them (`disk_unlinked`); and streams opened before a
    // truncation, which may not write up to the old end for free
    // (`disk_stale_stream`). Each keeps more on disk every round, so each
    // stops at the quota, not at the open-file limit or fuel long after.
    let out = tempfile::tempdir().unwrap();
    let limits = Limits {
        disk_bytes: 8 << 20,
        fuel_per_call: Some(20_000_000_000),
        ..tight_limits()
    };
    let attacks = ["disk_fill", "disk_unlinked", "disk_stale_stream"];
    let mut trials: Vec<_> = attacks.iter().map(|name| attack(name)).collect();
    trials.push(attack("none"));
    let summary = run(trials, limits, out.path());
    for trial in &summary.trials[..attacks.len()] {
        assert_error(
            trial,
            &[
                "disk limit 8 MiB of the trial's directory exceeded (limits.disk",
                "during train() at iteration 2",
            ],
        );
        // Nothing past the quota reached the disk.
        let (bytes, _) = disk_usage(&trial.dir.join("work"));
        assert!(bytes <= 8 << 20, "{}: {bytes} bytes kept", trial.trial_id);
    }
    assert_benign_finished(&summary.trials[attacks.len()]);
    // Files rewritten in place or removed were credited: the quota was
    // spent on data that is there.
    let (bytes, _) = disk_usage(&summary.trials[0].dir.join("work"));
    assert!(
        bytes >= 6 << 20,
        "only {bytes} bytes kept: the quota counted phantom bytes"
    );
}

#[test]
fn a_trial_that_floods_its_directory_with_files_is_stopped_at_its_file_quota() {
    let out = tempfile::tempdir().unwrap();
    let limits = Limits {
        disk_files: 100,
        ..tight_limits()
    };
    let summary = run(
        vec![attack("file_flood"), attack("none")],
        limits,
        out.path(),
    );
    let flooder = &summary.trials[0];
    assert_error(
        flooder,
        &[
            "limit of 100 files and directories in the trial's directory exceeded (limits.disk_files)",
        ],
    );
    assert_benign_finished(&summary.trials[1]);
    let (_, entries) = disk_usage(&flooder.dir.join("work"));
    assert_eq!(entries, 100);
}

#[test]
fn nan_and_infinities_stay_apart_in_the_result_files() {
    // A report of three metrics at 256 (names at 512): nan = NaN,
    // pos = +inf, neg = -inf.
    let items = r#"(data (i32.const 16) "\00\00\00\00\00\01\00\00\03\00\00\00\01")
    (data (i32.const 256)
      "\00\02\00\00\03\00\00\00\00\00\00\00\00\00\f8\7f"
      "\03\02\00\00\03\00\00\00\00\00\00\00\00\00\f0\7f"
      "\06\02\00\00\03\00\00\00\00\00\00\00\00\00\f0\ff")
    (data (i32.const 512) "nanposneg")"#;
    let program = wat_program(&wat_trainable(1, items, OK, OK));
    let out = tempfile::tempdir().unwrap();
    let trial = run_one(program, tight_limits(), 1, out.path());
    assert_eq!(trial.status, TrialStatus::Terminated, "{:?}", trial.error);
    let line = std::fs::read_to_string(trial.dir.join("result.jsonl")).unwrap();
    let result: Value = serde_json::from_str(line.lines().next().unwrap()).unwrap();
    assert_eq!(
        (&result["nan"], &result["pos"], &result["neg"]),
        (&json!("NaN"), &json!("Infinity"), &json!("-Infinity"))
    );
    let csv = std::fs::read_to_string(trial.dir.join("progress.csv")).unwrap();
    assert!(
        csv.lines()
            .nth(1)
            .unwrap()
            .starts_with("NaN,Infinity,-Infinity,"),
        "{csv}"
    );
    // Not numbers a scheduler could rank by.
    assert_eq!(trial.metric("pos"), None);
}

#[test]
fn result_files_stay_under_the_result_limit_across_retries() {
    // The guest reports the largest legal report at every call and fails
    // every 5th, so each retry starts a new instance with a new count of its
    // own; the trial's files are capped over all of them.
    let run = common::run_cli(
        "hostile",
        "metric = \"score\"\nmode = \"max\"\nmax_concurrent_trials = 2\nmax_failures = 40\n\
         [limits]\nresult_size = \"2MiB\"\n\
         [param_space]\nattack = { grid_search = [\"report_flood\", \"none\"] }\nat = 1\n\
         iterations = 3\n",
        &[],
    );
    let (out, stderr) = (run.out(), run.stderr());
    let state = wtune::report::state::load(&out, false).unwrap().unchecked();
    let of = |attack: &str| {
        state
            .trials
            .iter()
            .find(|t| t.config["attack"] == attack)
            .unwrap()
    };
    let (flooder, benign) = (of("report_flood"), of("none"));
    assert_error(
        flooder,
        &[
            "its results reached the limit of 2 MiB in result.jsonl, progress.csv and its \
           TensorBoard event file",
        ],
    );
    assert!(flooder.num_failures >= 2, "retried: {stderr}");
    // Every file the results went to: the two tables and the event file.
    let written: u64 = std::fs::read_dir(out.join(&flooder.trial_id))
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name == "result.jsonl" || name == "progress.csv" || name.contains("tfevents")
        })
        .map(|e| e.metadata().unwrap().len())
        .sum();
    assert!(written <= 2 << 20, "{written} bytes of results");
    assert!(
        written >= 1800 << 10,
        "{written} bytes: the cap counted too much"
    );
    // The result that would have crossed the cap is not the trial's last
    // result either: that is the last one its files hold.
    let written =
        std::fs::read_to_string(out.join(&flooder.trial_id).join("result.jsonl")).unwrap();
    let last_written: Value = serde_json::from_str(written.lines().last().unwrap()).unwrap();
    let last_result = flooder.last_result.as_ref().expect("a result was kept");
    assert_eq!(
        last_result["training_iteration"], last_written["training_iteration"],
        "{stderr}"
    );
    assert_eq!(benign.status, TrialStatus::Terminated, "{:?}", benign.error);
    assert_eq!(benign.iterations, 3);
}
