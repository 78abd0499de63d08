//! The runner's bookkeeping, exercised with plain-Rust trainables
//! (`FnBackend`), so these run in milliseconds without a sandbox.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use wtune::report::{ExperimentFile, TrialFiles};
use wtune::tune::{
    Bound, ExperimentSummary, Fifo, FnBackend, Mode, RunSpec, Runner, Searcher, Step, StopCriteria,
    Suggestion, Threshold, TrialFailure, TrialStatus,
};

fn spec(
    dir: &std::path::Path,
    configs: Vec<Value>,
    stop: StopCriteria,
    max_concurrent: usize,
) -> RunSpec {
    RunSpec {
        name: "runner-test".into(),
        output_dir: dir.to_path_buf(),
        metric: Some("score".into()),
        mode: Mode::Max,
        stop,
        max_concurrent,
        configs,
        checkpoint: Default::default(),
        failure: Default::default(),
        restore_from: None,
    }
}

fn run(backend: FnBackend, spec: RunSpec) -> ExperimentSummary {
    let runner = Runner::new(backend, spec, Box::new(Fifo::default()))
        .callback(TrialFiles::new())
        .callback(ExperimentFile::new(Value::Null));
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(runner.run())
        .unwrap()
}

fn iterations(n: u64) -> StopCriteria {
    StopCriteria {
        training_iteration: Some(n),
        ..Default::default()
    }
}

/// score = x * iteration, where x is the trial's config.
fn linear() -> FnBackend {
    FnBackend::new(|config: &Value| {
        let x = config["x"]
            .as_f64()
            .ok_or_else(|| TrialFailure::new("x missing"))?;
        Ok(move |it: u64| {
            Ok(Step {
                metrics: vec![("score".into(), x * it as f64)],
                done: false,
                fuel: 7,
            })
        })
    })
}

#[test]
fn concurrency_never_exceeds_the_limit_and_every_trial_finishes() {
    let active = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let (a, p) = (active.clone(), peak.clone());
    let backend = FnBackend::new(move |_: &Value| {
        let (a, p) = (a.clone(), p.clone());
        Ok(move |_: u64| {
            let now = a.fetch_add(1, Ordering::SeqCst) + 1;
            p.fetch_max(now, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(3));
            a.fetch_sub(1, Ordering::SeqCst);
            Ok(Step {
                metrics: vec![("score".into(), 1.0)],
                done: false,
                fuel: 1,
            })
        })
    });
    let dir = tempfile::tempdir().unwrap();
    let configs = (0..12).map(|i| json!({"i": i})).collect();
    let summary = run(backend, spec(dir.path(), configs, iterations(3), 3));
    assert_eq!(summary.count(TrialStatus::Terminated), 12);
    assert!(
        peak.load(Ordering::SeqCst) <= 3,
        "peak {}",
        peak.load(Ordering::SeqCst)
    );
    assert!(peak.load(Ordering::SeqCst) >= 2, "trials should overlap");
    for t in &summary.trials {
        assert_eq!(t.iterations, 3);
        assert_eq!(t.fuel_total, 3);
        assert_eq!(
            t.stop_reason.as_deref(),
            Some("training_iteration reached 3")
        );
    }
}

#[test]
fn best_trial_follows_metric_and_mode() {
    let dir = tempfile::tempdir().unwrap();
    let configs = vec![json!({"x": 1.0}), json!({"x": 3.0}), json!({"x": 2.0})];
    let summary = run(
        linear(),
        spec(dir.path(), configs.clone(), iterations(2), 2),
    );
    assert_eq!(summary.best_trial().unwrap().config, json!({"x": 3.0}));
    let mut min = spec(
        tempfile::tempdir().unwrap().path(),
        configs,
        iterations(2),
        2,
    );
    let min_dir = tempfile::tempdir().unwrap();
    min.output_dir = min_dir.path().to_path_buf();
    min.mode = Mode::Min;
    let summary = run(linear(), min);
    assert_eq!(summary.best_trial().unwrap().config, json!({"x": 1.0}));
}

#[test]
fn thresholds_and_done_stop_trials_with_a_reason() {
    let backend = FnBackend::new(|config: &Value| {
        let done_at = config["done_at"].as_u64().unwrap_or(u64::MAX);
        Ok(move |it: u64| {
            Ok(Step {
                metrics: vec![("score".into(), it as f64)],
                done: it >= done_at,
                fuel: 0,
            })
        })
    });
    let stop = StopCriteria {
        training_iteration: Some(100),
        thresholds: vec![Threshold {
            metric: "score".into(),
            bound: Bound::AtLeast(5.0),
        }],
        ..Default::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let summary = run(
        backend,
        spec(dir.path(), vec![json!({}), json!({"done_at": 2})], stop, 2),
    );
    assert_eq!(summary.trials[0].iterations, 5);
    assert_eq!(
        summary.trials[0].stop_reason.as_deref(),
        Some("score reached 5 (>=)")
    );
    assert_eq!(summary.trials[1].iterations, 2);
    assert_eq!(
        summary.trials[1].stop_reason.as_deref(),
        Some("the trainable reported done")
    );
    let last = summary.trials[1].last_result.as_ref().unwrap();
    assert_eq!(last["done"], json!(true));
}

#[test]
fn one_failing_trial_leaves_the_others_alone() {
    let backend = FnBackend::new(|config: &Value| {
        let fail = config["fail"].as_bool().unwrap_or(false);
        if config["bad_setup"].as_bool().unwrap_or(false) {
            return Err(TrialFailure::new("setup refused this config"));
        }
        Ok(move |it: u64| {
            if fail && it == 2 {
                return Err(TrialFailure::new("boom at 2"));
            }
            Ok(Step {
                metrics: vec![("score".into(), 1.0)],
                done: false,
                fuel: 0,
            })
        })
    });
    let dir = tempfile::tempdir().unwrap();
    let configs = vec![
        json!({}),
        json!({"fail": true}),
        json!({"bad_setup": true}),
        json!({}),
    ];
    let summary = run(backend, spec(dir.path(), configs, iterations(4), 2));
    let statuses: Vec<TrialStatus> = summary.trials.iter().map(|t| t.status).collect();
    use TrialStatus::*;
    assert_eq!(statuses, [Terminated, Error, Error, Terminated]);
    assert_eq!(summary.trials[1].error.as_deref(), Some("boom at 2"));
    assert_eq!(summary.trials[1].iterations, 1);
    assert_eq!(
        summary.trials[2].error.as_deref(),
        Some("setup refused this config")
    );
    assert_eq!(summary.trials[3].iterations, 4);
}

#[test]
fn a_typo_in_metric_or_stop_fails_trials_with_what_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = spec(dir.path(), vec![json!({"x": 1.0})], iterations(3), 1);
    s.metric = Some("scroe".into());
    let summary = run(linear(), s);
    let error = summary.trials[0].error.clone().unwrap();
    assert!(
        error.contains("`scroe`") && error.contains("it reports: score"),
        "{error}"
    );

    let dir = tempfile::tempdir().unwrap();
    let stop = StopCriteria {
        thresholds: vec![Threshold {
            metric: "acc".into(),
            bound: Bound::AtLeast(1.0),
        }],
        ..Default::default()
    };
    let summary = run(linear(), spec(dir.path(), vec![json!({"x": 1.0})], stop, 1));
    assert!(
        summary.trials[0]
            .error
            .as_deref()
            .unwrap()
            .contains("stop criterion `acc`")
    );
}

#[test]
fn files_record_every_result_and_the_experiment() {
    let dir = tempfile::tempdir().unwrap();
    let summary = run(
        linear(),
        spec(
            dir.path(),
            vec![json!({"x": 2.0}), json!({"x": 1.0})],
            iterations(3),
            2,
        ),
    );
    let trial_dir = &summary.trials[0].dir;
    let lines: Vec<Value> = std::fs::read_to_string(trial_dir.join("result.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    assert_eq!(lines[2]["score"], json!(6.0));
    assert_eq!(lines[2]["training_iteration"], json!(3));
    assert_eq!(lines[2]["fuel_total"], json!(21));
    assert_eq!(lines[2]["done"], json!(true));
    assert_eq!(lines[1]["done"], json!(false));
    let csv = std::fs::read_to_string(trial_dir.join("progress.csv")).unwrap();
    let header = csv.lines().next().unwrap();
    assert!(
        header.starts_with("score,trial_id,training_iteration,"),
        "{header}"
    );
    assert!(header.ends_with(",config/x"), "{header}");
    assert_eq!(csv.lines().count(), 4);

    let experiment: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("experiment.json")).unwrap())
            .unwrap();
    assert_eq!(experiment["status"], json!("finished"));
    assert_eq!(experiment["counts"]["terminated"], json!(2));
    assert_eq!(experiment["best_trial"]["trial_id"], json!("trial_0000"));
    assert_eq!(experiment["trials"][1]["status"], json!("TERMINATED"));
    assert_eq!(experiment["format_version"], json!(1));
}

#[test]
fn zero_trials_is_a_clean_empty_run() {
    let dir = tempfile::tempdir().unwrap();
    let summary = run(linear(), spec(dir.path(), vec![], iterations(1), 1));
    assert!(summary.trials.is_empty());
    assert!(summary.best.is_none());
}

#[test]
fn asha_stops_exactly_the_trials_hand_computed_on_linear_curves() {
    use wtune::tune::{Asha, AshaConfig};
    // One at a time, so the order results arrive in is fixed.
    let dir = tempfile::tempdir().unwrap();
    let configs = [1.0, 0.5, 2.0, 0.8].map(|x| json!({"x": x})).to_vec();
    let config = AshaConfig {
        max_t: 4.0,
        grace_period: 1.0,
        reduction_factor: 2.0,
        ..AshaConfig::default()
    };
    let asha = Asha::new(config, "score", Mode::Max, 0).unwrap();
    let runner = Runner::new(
        linear(),
        spec(dir.path(), configs, iterations(100), 1),
        Box::new(asha),
    );
    let summary = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(runner.run())
        .unwrap();
    // Rungs at 1 and 2, max_t 4. trial 0 is first everywhere and runs to
    // max_t; trial 1 (0.5) is below rung 1's median of {1}; trial 2 (2.0)
    // beats every median; trial 3 (0.8) is below median{1, 0.5, 2} = 1.
    let iterations: Vec<u64> = summary.trials.iter().map(|t| t.iterations).collect();
    assert_eq!(iterations, [4, 1, 4, 1]);
    assert!(
        summary
            .trials
            .iter()
            .all(|t| t.status == TrialStatus::Terminated)
    );
    assert_eq!(
        summary.trials[1].stop_reason.as_deref(),
        Some("stopped by the asha scheduler")
    );
}

/// A searcher that proposes `x = best so far + 1` and logs what it hears,
/// so the order of suggestions and results can be checked.
struct Adaptive {
    log: Arc<std::sync::Mutex<Vec<String>>>,
    best: f64,
    left: usize,
    /// After this many suggestions, waits for every live trial to complete.
    live: usize,
    limit: usize,
}

impl Searcher for Adaptive {
    fn suggest(&mut self, trial_id: &str) -> Suggestion {
        if self.left == 0 {
            return Suggestion::Finished;
        }
        if self.live >= self.limit {
            return Suggestion::Wait;
        }
        self.left -= 1;
        self.live += 1;
        self.log.lock().unwrap().push(format!("suggest {trial_id}"));
        Suggestion::Config(json!({ "x": self.best + 1.0 }))
    }

    fn on_result(&mut self, trial_id: &str, result: &serde_json::Map<String, Value>) {
        let score = result["score"].as_f64().unwrap();
        self.log
            .lock()
            .unwrap()
            .push(format!("result {trial_id} {score}"));
    }

    fn on_trial_complete(
        &mut self,
        trial_id: &str,
        result: Option<&serde_json::Map<String, Value>>,
        error: bool,
    ) {
        let score = result.and_then(|r| r["score"].as_f64()).unwrap();
        self.best = self.best.max(score);
        self.live -= 1;
        self.log
            .lock()
            .unwrap()
            .push(format!("complete {trial_id} {score} error={error}"));
    }

    fn name(&self) -> &'static str {
        "adaptive"
    }
}

#[test]
fn a_searcher_creates_trials_as_slots_free_and_learns_from_their_results() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(std::sync::Mutex::new(Vec::new()));
    let searcher = Adaptive {
        log: log.clone(),
        best: 0.0,
        left: 3,
        live: 0,
        limit: 1,
    };
    let runner = Runner::new(
        linear(),
        spec(dir.path(), Vec::new(), iterations(2), 4),
        Box::new(Fifo::default()),
    )
    .searcher(Box::new(searcher));
    let summary = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(runner.run())
        .unwrap();
    // One at a time (the searcher waits while a trial is live), each
    // configured from the previous best: x = 1, then 1*2 + 1 = 3, then
    // 3*2 + 1 = 7.
    let xs: Vec<f64> = summary
        .trials
        .iter()
        .map(|t| t.config["x"].as_f64().unwrap())
        .collect();
    assert_eq!(xs, [1.0, 3.0, 7.0]);
    assert_eq!(
        *log.lock().unwrap(),
        [
            "suggest trial_0000",
            "result trial_0000 1",
            "result trial_0000 2",
            "complete trial_0000 2 error=false",
            "suggest trial_0001",
            "result trial_0001 3",
            "result trial_0001 6",
            "complete trial_0001 6 error=false",
            "suggest trial_0002",
            "result trial_0002 7",
            "result trial_0002 14",
            "complete trial_0002 14 error=false",
        ]
    );
    assert_eq!(summary.decisions.searcher.unwrap().name, "adaptive");
}

#[test]
fn a_searcher_that_waits_while_nothing_runs_is_reported_not_hung() {
    let dir = tempfile::tempdir().unwrap();
    let searcher = Adaptive {
        log: Arc::default(),
        best: 0.0,
        left: 3,
        live: 0,
        limit: 0,
    };
    let runner = Runner::new(
        linear(),
        spec(dir.path(), Vec::new(), iterations(2), 4),
        Box::new(Fifo::default()),
    )
    .searcher(Box::new(searcher));
    let err = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(runner.run())
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("the adaptive searcher suggests nothing while no trial runs"),
        "{err}"
    );
}
