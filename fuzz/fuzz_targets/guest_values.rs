//! Host handling of whatever a guest's `train()` returns.
//!
//! Each input is a structured list of returned values (`arbitrary`): a
//! report (a metric list and the `done` flag) or an error string. Each goes
//! through `wtune::sandbox::check_train_return`, the checks the sandbox
//! applies after `train()` returns (metric count, name length, control
//! characters, duplicates, all names together; error messages cut to
//! size). The values it
//! accepts then drive a real experiment: the runner with a native backend
//! whose trials return exactly those values, under a fuzzer-chosen scheduler
//! (FIFO, ASHA, median stopping, HyperBand or PBT, optionally with a
//! guest-reported metric as the scheduler's `time_attr`), stopping criteria
//! that include a threshold on the guest's metric, retries, checkpoints and
//! the per-trial result files, in a temporary directory per input.
//! Metric names mix the experiment's metric, wtune's own result fields
//! (reserved), and arbitrary strings; values are arbitrary `f64`s (NaN,
//! infinities, subnormals).
//!
//! Invariants checked: an accepted report keeps the guest's metrics in order
//! and satisfies every documented limit; a refused one breaks one of them;
//! a guest error keeps at most its first 4 KiB; the run ends with each trial
//! within its iteration limit, its reserved fields filled in by wtune, and
//! result files that parse.

#![no_main]

mod common;

use std::collections::HashSet;
use std::sync::Arc;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value, json};
use wtune::report::{TrialFiles, summary_text};
use wtune::sandbox::{GuestReport, TrialFault, check_train_return};
use wtune::tune::{
    AUTO_FIELDS, CheckpointPolicy, FailurePolicy, FnBackend, Mode, RunError, RunSpec, Runner,
    SchedulerSpec, Step, StopCriteria, TrialFailure,
};

const MAX_METRICS: usize = 1024;
const MAX_METRIC_NAME: usize = 256;
/// Most bytes of metric names in one report.
const MAX_REPORT_NAMES: usize = 64 << 10;
const MAX_GUEST_MESSAGE: usize = 4096;
const METRIC: &str = "loss";
/// A guest metric a scheduler may take as its `time_attr`.
const TIME_METRIC: &str = "epoch";

#[derive(Arbitrary, Debug)]
enum Name {
    /// The experiment's metric.
    Metric,
    /// The guest-reported time (`time_attr` when chosen).
    Time,
    /// One of the fields wtune fills in.
    Reserved(u8),
    Other(String),
}

impl Name {
    fn text(&self) -> String {
        match self {
            Name::Metric => METRIC.into(),
            Name::Time => TIME_METRIC.into(),
            Name::Reserved(i) => AUTO_FIELDS[*i as usize % AUTO_FIELDS.len()].into(),
            Name::Other(name) => name.clone(),
        }
    }
}

#[derive(Arbitrary, Debug)]
enum Returned {
    Report {
        metrics: Vec<(Name, f64)>,
        done: bool,
    },
    Error(String),
}

#[derive(Arbitrary, Debug)]
enum SchedulerChoice {
    Fifo,
    Asha,
    MedianStopping,
    HyperBand,
    Pbt,
}

#[derive(Arbitrary, Debug)]
struct Input {
    scheduler: SchedulerChoice,
    /// The scheduler's `time_attr` is the guest's `epoch` metric.
    guest_time: bool,
    minimize: bool,
    trials: u8,
    max_concurrent: u8,
    checkpoint_freq: u8,
    max_failures: u8,
    iterations: u8,
    /// A stopping threshold on the metric.
    threshold: Option<f64>,
    /// Write the per-trial result files.
    files: bool,
    /// What `train()` returns, call after call.
    calls: Vec<Returned>,
}

fuzz_target!(|input: Input| {
    let steps: Vec<Result<Step, String>> = input
        .calls
        .iter()
        .enumerate()
        .map(|(i, returned)| checked(returned, i as u64 + 1))
        .collect();
    if !steps.is_empty() {
        run(&input, steps);
    }
});

/// The host's checks on one returned value, with the invariants they keep.
fn checked(returned: &Returned, iteration: u64) -> Result<Step, String> {
    let value = match returned {
        Returned::Report { metrics, done } => Ok((
            metrics
                .iter()
                .map(|(n, v)| (n.text(), *v))
                .collect::<Vec<_>>(),
            *done,
        )),
        Returned::Error(message) => Err(message.clone()),
    };
    let outcome = check_train_return(value.clone(), iteration);
    match (&value, &outcome) {
        (
            Ok((metrics, done)),
            Ok(GuestReport {
                metrics: kept,
                done: kept_done,
            }),
        ) => {
            assert_eq!(done, kept_done);
            assert_eq!(metrics.len(), kept.len());
            assert!(kept.len() <= MAX_METRICS);
            assert!(kept.iter().map(|(name, _)| name.len()).sum::<usize>() <= MAX_REPORT_NAMES);
            let mut seen = HashSet::new();
            for ((name, value), (kept_name, kept_value)) in metrics.iter().zip(kept) {
                assert_eq!(name, kept_name);
                assert_eq!(value.to_bits(), kept_value.to_bits());
                assert!(
                    !name.is_empty() && name.len() <= MAX_METRIC_NAME,
                    "{name:?}"
                );
                assert!(!name.chars().any(char::is_control), "{name:?}");
                assert!(seen.insert(name), "{name:?} twice");
            }
        }
        (Ok((metrics, _)), Err(TrialFault::BadOutput { .. })) => {
            let mut seen = HashSet::new();
            let names: usize = metrics.iter().map(|(name, _)| name.len()).sum();
            let broken = metrics.len() > MAX_METRICS
                || names > MAX_REPORT_NAMES
                || metrics.iter().any(|(name, _)| {
                    name.is_empty()
                        || name.len() > MAX_METRIC_NAME
                        || name.chars().any(char::is_control)
                        || !seen.insert(name)
                });
            assert!(broken, "a valid report was refused: {outcome:?}");
        }
        (
            Err(sent),
            Err(TrialFault::GuestError {
                message,
                full_length,
                ..
            }),
        ) => {
            if sent.len() <= MAX_GUEST_MESSAGE {
                assert_eq!(message, sent);
                assert_eq!(*full_length, None);
            } else {
                assert_eq!(*full_length, Some(sent.len()));
                let kept = message
                    .strip_suffix(" [...]")
                    .expect("a cut message is marked");
                assert!(kept.len() <= MAX_GUEST_MESSAGE && sent.starts_with(kept));
            }
        }
        _ => panic!("{value:?} became {outcome:?}"),
    }
    match outcome {
        Ok(report) => Ok(Step {
            metrics: report.metrics,
            done: report.done,
            fuel: 1,
        }),
        Err(fault) => Err(fault.to_string()),
    }
}

/// A run whose trials return `steps`: trial `t`'s `k`-th call returns
/// `steps[(t + (k - 1) * trials) % steps.len()]`.
fn run(input: &Input, steps: Vec<Result<Step, String>>) {
    let trials = 1 + usize::from(input.trials % 4);
    let iterations = 1 + u64::from(input.iterations % 12);
    let steps = Arc::new(steps);
    let backend = FnBackend::new(move |config: &Value| {
        let trial = config["trial"].as_u64().unwrap_or(0);
        let steps = steps.clone();
        Ok(move |iteration: u64| {
            let at = (trial + (iteration - 1) * trials as u64) as usize % steps.len();
            steps[at].clone().map_err(TrialFailure::new)
        })
    });

    let dir = common::scratch();
    let mode = if input.minimize { Mode::Min } else { Mode::Max };
    let mut stop = Map::new();
    stop.insert("training_iteration".into(), json!(iterations));
    if let Some(threshold) = input.threshold.filter(|t| t.is_finite()) {
        stop.insert(METRIC.into(), json!(threshold));
    }
    let mut spec = RunSpec::new("fuzz", dir.path().join("out"));
    spec.metric = Some(METRIC.into());
    spec.mode = mode;
    spec.stop = StopCriteria::from_json(&stop).expect("valid stopping criteria");
    spec.max_concurrent = 1 + usize::from(input.max_concurrent % 3);
    spec.configs = (0..trials)
        .map(|t| json!({"trial": t, "lr": 0.1}))
        .collect();
    spec.checkpoint = CheckpointPolicy {
        freq: u64::from(input.checkpoint_freq % 4),
        ..CheckpointPolicy::default()
    };
    spec.failure = FailurePolicy {
        max_failures: Some(u32::from(input.max_failures % 3)),
        ..FailurePolicy::default()
    };

    let time_attr = if input.guest_time {
        TIME_METRIC
    } else {
        "training_iteration"
    };
    let scheduler = match input.scheduler {
        SchedulerChoice::Fifo => json!({"type": "fifo"}),
        SchedulerChoice::Asha => json!({
            "type": "asha", "time_attr": time_attr, "max_t": 8.0, "grace_period": 1.0,
            "reduction_factor": 2.0,
        }),
        SchedulerChoice::MedianStopping => json!({
            "type": "median_stopping", "time_attr": time_attr, "grace_period": 1.0,
            "min_samples_required": 1,
        }),
        SchedulerChoice::HyperBand => json!({
            "type": "hyperband", "time_attr": time_attr, "max_t": 8.0, "reduction_factor": 2.0,
        }),
        SchedulerChoice::Pbt => json!({
            "type": "pbt", "time_attr": time_attr, "perturbation_interval": 2.0,
            "hyperparam_mutations": {"lr": {"uniform": [0.001, 1.0]}},
        }),
    };
    let scheduler: SchedulerSpec = serde_json::from_value(scheduler).unwrap();
    let scheduler = scheduler.build(Some(METRIC), mode, 0).unwrap();

    let mut runner = Runner::new(backend, spec, scheduler);
    if input.files {
        runner = runner.callback(TrialFiles::new());
    }
    let summary = match common::runtime().block_on(runner.run()) {
        Ok(summary) => summary,
        Err(RunError::Internal(e)) => panic!("the runner failed: {e}"),
        Err(_) => return,
    };
    let _ = summary_text(&summary);
    assert_eq!(summary.trials.len(), trials);
    for trial in &summary.trials {
        assert!(
            trial.iterations <= iterations,
            "{} ran {} iterations, more than {iterations}",
            trial.trial_id,
            trial.iterations
        );
        if let Some(result) = &trial.last_result {
            assert_eq!(result["trial_id"], json!(trial.trial_id), "{result:?}");
        }
        if input.files && trial.iterations > 0 {
            let path = trial.dir.join("result.jsonl");
            if let Ok(text) = std::fs::read_to_string(&path) {
                for line in text.lines() {
                    let record: Value = serde_json::from_str(line)
                        .unwrap_or_else(|e| panic!("{}: {e}: {line}", path.display()));
                    assert_eq!(record["trial_id"], json!(trial.trial_id));
                }
            }
        }
    }
}
