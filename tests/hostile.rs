//! Hostile guests are contained: each ends as ERROR with a reason that names
//! the cause, while benign trials in the same experiment finish correctly,
//! and nothing outside a trial's own directory changes.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use wtune::sandbox::Limits;
use wtune::tune::{ExperimentSummary, StopCriteria, Trial, TrialStatus};

fn tight_limits() -> Limits {
    Limits {
        fuel_per_call: Some(1_000_000_000),
        fuel_per_trial: None,
        memory_bytes: 64 << 20,
        table_elements: 100_000,
        call_timeout: Some(Duration::from_secs(60)),
        log_bytes: 64 << 10,
    }
}

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
        "none",
    ];
    let summary = run(
        names.iter().map(|n| attack(n)).collect(),
        tight_limits(),
        out.path(),
    );
    let trials = &summary.trials;

    assert_benign_finished(&trials[0]);
    assert_benign_finished(&trials[12]);
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
    let summary = common::run_trials(
        common::load("hostile"),
        configs,
        tight_limits(),
        stop,
        grants,
        out.path(),
    );

    let escape = &summary.trials[0];
    assert_error(escape, &["all escape attempts denied"]);
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
    assert!(probe.dir.join("work/probe.txt").is_file());
    assert_benign_finished(&summary.trials[2]);
}
