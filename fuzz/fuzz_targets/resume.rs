//! What a run killed with SIGKILL leaves in its trials' directories, and the
//! next run that picks it up.
//!
//! Each input describes the directories of an experiment's trials as an
//! interrupted run may have left them (or as anyone who can write there may
//! have made them): `params.json` (this trial's configuration, another one,
//! arbitrary bytes or none), `result.jsonl` and `progress.csv` (lines as
//! wtune writes them for chosen iterations, out of order or repeated,
//! arbitrary lines, a last line cut short, or arbitrary bytes), and
//! checkpoint files (valid ones for the iteration their name says or for
//! another, or arbitrary bytes). Then a real run of the experiment goes over
//! them: `tune::Runner` with a native backend, the per-trial result files
//! (`report::TrialFiles`, which cut each file back to the iteration the
//! trial continues after) and `tune::resume::adopt_reported` on every new
//! trial, as `wtune resume` does.
//!
//! Invariants checked: the run ends without a runner-internal error; a trial
//! continues after the iteration of a checkpoint that was in its directory
//! (or from scratch), never past its stop condition unless the checkpoint
//! was; every line of a trial's `result.jsonl` is whole JSON naming its
//! iteration, and the iterations this run trained each appear exactly once,
//! in order, after those kept from before; `progress.csv` holds whole lines;
//! no temporary file is left behind.

#![no_main]

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value, json};
use wtune::report::TrialFiles;
use wtune::tune::{
    CHECKPOINT_DIR, CheckpointPolicy, FnBackend, Mode, RunError, RunSpec, Runner, SchedulerSpec,
    Step, StopCriteria, resume,
};

const METRIC: &str = "loss";

#[derive(Arbitrary, Debug)]
struct Input {
    /// 1 to 3 trials.
    trials: u8,
    /// `[stop] training_iteration`, 1 to 10.
    iterations: u8,
    /// `checkpoint_freq`, 0 to 3.
    checkpoint_freq: u8,
    left: Vec<Left>,
}

/// One trial's directory as the interrupted run left it.
#[derive(Arbitrary, Debug)]
struct Left {
    /// Which trial (modulo the number of trials).
    trial: u8,
    params: Params,
    results: Lines,
    progress: Lines,
    checkpoints: Vec<(u8, CheckpointBody)>,
}

#[derive(Arbitrary, Debug)]
enum Params {
    /// The trial's own configuration.
    Same,
    /// Another trial's.
    Other,
    Raw(Vec<u8>),
    Missing,
}

#[derive(Arbitrary, Debug)]
enum Lines {
    /// Lines as wtune writes them, then maybe a last line cut short.
    Ours(Vec<Line>, Option<u8>),
    Raw(Vec<u8>),
    Missing,
}

#[derive(Arbitrary, Debug)]
enum Line {
    /// A result of this iteration.
    Iteration(u8),
    /// Any text (its newlines stripped).
    Text(String),
}

#[derive(Arbitrary, Debug)]
enum CheckpointBody {
    /// A checkpoint of this iteration (the file's name says its own).
    Valid(u8),
    Raw(Vec<u8>),
}

fn trial_id(trial: usize) -> String {
    format!("trial_{trial:04}")
}

fn config(trial: usize) -> Value {
    json!({"trial": trial, "lr": 0.1})
}

/// The loss trial `trial` reports at `iteration`: the same in every run.
fn loss(trial: u64, iteration: u64) -> f64 {
    1.0 / (1.0 + (trial * 10 + iteration) as f64)
}

fn result_line(trial: usize, iteration: u64) -> String {
    let line = json!({
        METRIC: loss(trial as u64, iteration),
        "training_iteration": iteration,
        "trial_id": trial_id(trial),
    });
    format!("{line}\n")
}

fn csv_row(trial: usize, iteration: u64) -> String {
    format!(
        "{},{iteration},{}\n",
        loss(trial as u64, iteration),
        trial_id(trial)
    )
}

fn lines(lines: &Lines, header: &str, row: impl Fn(u64) -> String) -> Option<Vec<u8>> {
    match lines {
        Lines::Missing => None,
        Lines::Raw(bytes) => Some(bytes.clone()),
        Lines::Ours(lines, cut) => {
            let mut text = header.to_string();
            for line in lines {
                match line {
                    Line::Iteration(i) => text.push_str(&row(u64::from(*i))),
                    Line::Text(t) => {
                        text.push_str(&t.replace(['\n', '\r'], " "));
                        text.push('\n');
                    }
                }
            }
            let mut bytes = text.into_bytes();
            if let Some(cut) = cut {
                let partial = row(u64::from(*cut));
                bytes.extend_from_slice(&partial.as_bytes()[..partial.len() / 2]);
            }
            Some(bytes)
        }
    }
}

/// Writes what `left` describes into trial `trial`'s directory under `out`.
fn leave(out: &Path, trial: usize, trials: usize, left: &Left) {
    let dir = out.join(trial_id(trial));
    std::fs::create_dir_all(dir.join(CHECKPOINT_DIR)).unwrap();
    let params = match &left.params {
        Params::Same => Some(config(trial).to_string().into_bytes()),
        Params::Other => Some(config((trial + 1) % (trials + 1)).to_string().into_bytes()),
        Params::Raw(bytes) => Some(bytes.clone()),
        Params::Missing => None,
    };
    if let Some(params) = params {
        std::fs::write(dir.join("params.json"), params).unwrap();
    }
    if let Some(bytes) = lines(&left.results, "", |i| result_line(trial, i)) {
        std::fs::write(dir.join("result.jsonl"), bytes).unwrap();
    }
    let header = format!("{METRIC},training_iteration,trial_id\n");
    if let Some(bytes) = lines(&left.progress, &header, |i| csv_row(trial, i)) {
        std::fs::write(dir.join("progress.csv"), bytes).unwrap();
    }
    for (named, body) in left.checkpoints.iter().take(8) {
        let path = dir
            .join(CHECKPOINT_DIR)
            .join(format!("checkpoint_{named:06}.ckpt"));
        let bytes = match body {
            CheckpointBody::Valid(iteration) => {
                let iteration = u64::from(*iteration);
                let result: Map<String, Value> = [
                    (METRIC.to_string(), json!(loss(trial as u64, iteration))),
                    ("training_iteration".to_string(), json!(iteration)),
                ]
                .into_iter()
                .collect();
                json!({
                    "trial_id": trial_id(trial),
                    "iteration": iteration,
                    "fuel_total": iteration,
                    "time_total_s": iteration as f64 * 0.01,
                    "result": result,
                })
                .to_string()
                .into_bytes()
            }
            CheckpointBody::Raw(bytes) => bytes.clone(),
        };
        std::fs::write(path, bytes).unwrap();
    }
}

fuzz_target!(|input: Input| {
    let trials = 1 + usize::from(input.trials % 3);
    let iterations = 1 + u64::from(input.iterations % 10);
    let dir = common::scratch();
    let out = dir.path().join("out");
    for left in input.left.iter().take(6) {
        leave(&out, usize::from(left.trial) % trials, trials, left);
    }

    let backend = FnBackend::new(|config: &Value| {
        let trial = config["trial"].as_u64().unwrap_or(0);
        Ok(move |iteration: u64| {
            Ok(Step {
                metrics: vec![(METRIC.to_string(), loss(trial, iteration))],
                done: false,
                fuel: 1,
            })
        })
    });
    let mut spec = RunSpec::new("fuzz", out.clone());
    spec.metric = Some(METRIC.into());
    spec.mode = Mode::Min;
    let stop: Map<String, Value> = [("training_iteration".to_string(), json!(iterations))]
        .into_iter()
        .collect();
    spec.stop = StopCriteria::from_json(&stop).expect("valid stopping criteria");
    spec.max_concurrent = 1;
    spec.configs = (0..trials).map(config).collect();
    spec.checkpoint = CheckpointPolicy {
        freq: u64::from(input.checkpoint_freq % 4),
        ..CheckpointPolicy::default()
    };
    let policy = spec.checkpoint.clone();
    let scheduler: SchedulerSpec = serde_json::from_value(json!({"type": "fifo"})).unwrap();
    let scheduler = scheduler.build(Some(METRIC), Mode::Min, 0).unwrap();

    // The iteration each trial continues after, as adoption found it.
    let continued: Arc<Mutex<BTreeMap<String, u64>>> = Arc::default();
    let adopter = backend.clone();
    let seen = continued.clone();
    let runner = Runner::new(backend, spec, scheduler)
        .callback(TrialFiles::new())
        .adopt_from_disk(move |trial| {
            resume::adopt_reported(&adopter, trial, &policy);
            seen.lock()
                .unwrap()
                .insert(trial.trial_id.clone(), trial.iterations);
        });
    let summary = match common::runtime().block_on(runner.run()) {
        Ok(summary) => summary,
        Err(RunError::Internal(e)) => panic!("the runner failed: {e}"),
        Err(_) => return,
    };
    assert_eq!(summary.trials.len(), trials);
    let continued = continued.lock().unwrap().clone();
    for trial in &summary.trials {
        let after = continued[&trial.trial_id];
        assert!(
            trial.iterations <= iterations.max(after),
            "{} ran to iteration {} (stop at {iterations}, continued after {after})",
            trial.trial_id,
            trial.iterations
        );
        check_results(&trial.dir, after, trial.iterations);
        check_whole_lines(&trial.dir.join("progress.csv"));
        for entry in std::fs::read_dir(&trial.dir).unwrap() {
            let name = entry.unwrap().file_name();
            let name = name.to_string_lossy();
            assert!(!name.starts_with(".wtune-tmp-"), "{name} left behind");
        }
    }
});

/// `result.jsonl` holds whole JSON lines, each naming its iteration; those
/// past `after` are `after + 1 ..= last`, once each and in order.
fn check_results(dir: &Path, after: u64, last: u64) {
    let path = dir.join("result.jsonl");
    let Ok(bytes) = std::fs::read(&path) else {
        assert!(last <= after, "{} is missing", path.display());
        return;
    };
    assert!(
        bytes.is_empty() || bytes.ends_with(b"\n"),
        "{} ends in a partial line",
        path.display()
    );
    let mut trained = Vec::new();
    for line in bytes.split_inclusive(|&b| b == b'\n') {
        let record: Value = serde_json::from_slice(line).unwrap_or_else(|e| {
            panic!(
                "{}: {e}: {:?}",
                path.display(),
                String::from_utf8_lossy(line)
            )
        });
        let iteration = record["training_iteration"]
            .as_u64()
            .unwrap_or_else(|| panic!("{}: no iteration in {record}", path.display()));
        if iteration > after {
            trained.push(iteration);
        } else {
            assert!(
                trained.is_empty(),
                "{}: iteration {iteration} kept after this run's lines",
                path.display()
            );
        }
    }
    let expected: Vec<u64> = (after + 1..=last).collect();
    assert_eq!(trained, expected, "{}", path.display());
}

fn check_whole_lines(path: &Path) {
    if let Ok(bytes) = std::fs::read(path) {
        assert!(
            bytes.is_empty() || bytes.ends_with(b"\n"),
            "{} ends in a partial line",
            path.display()
        );
    }
}
