//! The runner's bookkeeping, exercised with plain-Rust trainables
//! (`FnBackend`), so these run in milliseconds without a sandbox.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use wtune::report::{ExperimentFile, TrialFiles};
use wtune::tune::{
    Bound, Callback, Decision, ExperimentSummary, Fifo, FnBackend, HyperBandConfig, Mode, PoolSpec,
    Resources, RunSpec, Runner, Scheduler, SchedulerSpec, SearchSpace, SearchSpec, Searcher, Step,
    StopCriteria, Suggestion, Threshold, Trial, TrialFailure, TrialStatus,
};

fn spec(
    dir: &std::path::Path,
    configs: Vec<Value>,
    stop: StopCriteria,
    max_concurrent: usize,
) -> RunSpec {
    RunSpec {
        metric: Some("score".into()),
        mode: Mode::Max,
        stop,
        max_concurrent,
        configs,
        ..RunSpec::new("runner-test", dir.to_path_buf())
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

/// A searcher that suggests one trial, then waits until it has heard a
/// result before suggesting the rest, logging what it does.
struct AfterFirstResult {
    log: Arc<std::sync::Mutex<Vec<String>>>,
    heard: bool,
    left: usize,
}

impl Searcher for AfterFirstResult {
    fn suggest(&mut self, trial_id: &str) -> Suggestion {
        if self.left == 0 {
            return Suggestion::Finished;
        }
        if !self.heard && self.left < 2 {
            return Suggestion::Wait;
        }
        self.left -= 1;
        self.log.lock().unwrap().push(format!("suggest {trial_id}"));
        Suggestion::Config(json!({ "x": 1.0 }))
    }

    fn on_result(&mut self, _: &str, _: &serde_json::Map<String, Value>) {
        self.heard = true;
    }

    fn on_trial_complete(
        &mut self,
        trial_id: &str,
        _: Option<&serde_json::Map<String, Value>>,
        _: bool,
    ) {
        self.log
            .lock()
            .unwrap()
            .push(format!("complete {trial_id}"));
    }

    fn name(&self) -> &'static str {
        "after-first-result"
    }
}

/// Results that simply continue are settled on the trial's own thread
/// without the loop; a result that lets the searcher suggest again must
/// still reach the loop while a slot is free, or the second trial would
/// start only when the first ends.
#[test]
fn a_result_that_frees_the_searcher_starts_a_trial_while_others_run() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(std::sync::Mutex::new(Vec::new()));
    let searcher = AfterFirstResult {
        log: log.clone(),
        heard: false,
        left: 2,
    };
    let runner = Runner::new(
        linear(),
        spec(dir.path(), Vec::new(), iterations(500), 2),
        Box::new(Fifo::default()),
    )
    .searcher(Box::new(searcher));
    let summary = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(runner.run())
        .unwrap();
    assert_eq!(summary.count(TrialStatus::Terminated), 2);
    let log = log.lock().unwrap();
    let at = |line: &str| log.iter().position(|l| l == line);
    assert!(
        at("suggest trial_0001").is_some() && at("suggest trial_0001") < at("complete trial_0000"),
        "trial_0001 is suggested after trial_0000's first result, not after its last: {log:?}"
    );
}

/// Steps that record how much of each resource runs at once: every step
/// adds its trial's request (`cpu`, `gpu` in its config) for its duration.
fn metered(
    in_use: Arc<std::sync::Mutex<(f64, f64)>>,
    peak: Arc<std::sync::Mutex<(f64, f64)>>,
) -> FnBackend {
    FnBackend::new(move |config: &Value| {
        let cpu = config["cpu"].as_f64().unwrap_or(1.0);
        let gpu = config["gpu"].as_f64().unwrap_or(0.0);
        let (in_use, peak) = (in_use.clone(), peak.clone());
        Ok(move |it: u64| {
            {
                let mut now = in_use.lock().unwrap();
                now.0 += cpu;
                now.1 += gpu;
                let mut peak = peak.lock().unwrap();
                peak.0 = peak.0.max(now.0);
                peak.1 = peak.1.max(now.1);
            }
            std::thread::sleep(Duration::from_millis(4));
            let mut now = in_use.lock().unwrap();
            now.0 -= cpu;
            now.1 -= gpu;
            Ok(Step {
                metrics: vec![("score".into(), it as f64)],
                done: false,
                fuel: 1,
            })
        })
    })
}

/// Gives each trial the resources its config names.
struct ConfiguredResources;

impl Scheduler for ConfiguredResources {
    fn on_result(&mut self, _: &Trial, _: &serde_json::Map<String, Value>) -> Decision {
        Decision::Continue
    }

    fn resources(&mut self, trial: &Trial) -> Option<Resources> {
        Some(Resources {
            cpu: trial.config["cpu"].as_f64().unwrap_or(1.0),
            gpu: trial.config["gpu"].as_f64().unwrap_or(0.0),
            ..Resources::default()
        })
    }

    fn choose_next(&mut self, trials: &[Trial]) -> Option<usize> {
        trials.iter().position(|t| t.status == TrialStatus::Pending)
    }

    fn name(&self) -> &'static str {
        "configured-resources"
    }
}

fn pool(cpu: f64, gpu: f64) -> PoolSpec {
    PoolSpec {
        cpu: Some(cpu),
        gpu: Some(gpu),
        ..PoolSpec::default()
    }
}

#[test]
fn four_trials_asking_half_a_gpu_run_two_at_a_time_on_one_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let (in_use, peak): (_, Arc<std::sync::Mutex<(f64, f64)>>) = (Arc::default(), Arc::default());
    let configs = vec![json!({"gpu": 0.5}); 4];
    let mut spec = spec(dir.path(), configs, iterations(5), 4);
    spec.resources = pool(8.0, 1.0);
    spec.resources_per_trial = Resources {
        gpu: 0.5,
        ..Resources::default()
    };
    let summary = run(metered(in_use, peak.clone()), spec);
    assert_eq!(summary.count(TrialStatus::Terminated), 4);
    assert_eq!(peak.lock().unwrap().1, 1.0, "two half-GPU trials at most");
}

#[test]
fn a_trial_asking_more_than_exists_is_an_error_not_a_wait() {
    // The experiment's own request: refused before anything runs.
    let dir = tempfile::tempdir().unwrap();
    let mut too_big = spec(dir.path(), vec![json!({})], iterations(1), 1);
    too_big.resources = pool(2.0, 1.0);
    too_big.resources_per_trial = Resources {
        gpu: 2.0,
        ..Resources::default()
    };
    let runner = Runner::new(linear(), too_big, Box::new(Fifo::default()));
    let err = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(runner.run())
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("trial asks for 2 GPUs but the experiment has 1"),
        "{err}"
    );

    // One trial's request, set by the scheduler: that trial fails, the
    // others run.
    let dir = tempfile::tempdir().unwrap();
    let configs = vec![json!({"cpu": 1}), json!({"cpu": 3}), json!({"cpu": 1})];
    let mut spec = spec(dir.path(), configs, iterations(2), 3);
    spec.resources = pool(2.0, 0.0);
    let (in_use, peak): (_, Arc<std::sync::Mutex<(f64, f64)>>) = (Arc::default(), Arc::default());
    let runner = Runner::new(metered(in_use, peak), spec, Box::new(ConfiguredResources));
    let summary = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(runner.run())
        .unwrap();
    let statuses: Vec<_> = summary.trials.iter().map(|t| t.status).collect();
    assert_eq!(
        statuses,
        [
            TrialStatus::Terminated,
            TrialStatus::Error,
            TrialStatus::Terminated
        ]
    );
    let error = summary.trials[1].error.as_deref().unwrap();
    assert!(error.contains("3 CPUs but the experiment has 2"), "{error}");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]

    /// Whatever trials ask for, what runs at once never exceeds the pool,
    /// and every trial that fits the pool finishes.
    #[test]
    fn trials_running_at_once_never_hold_more_than_the_pool(
        requests in proptest::collection::vec((1u32..=8, 0u32..=4), 1..10),
        max_concurrent in 1usize..6,
    ) {
        let dir = tempfile::tempdir().unwrap();
        // CPUs in quarters up to 2, GPUs in quarters up to 1, on a pool of
        // 2.5 CPUs and 1 GPU.
        let configs: Vec<Value> = requests
            .iter()
            .map(|&(cpu, gpu)| json!({"cpu": cpu as f64 / 4.0, "gpu": gpu as f64 / 4.0}))
            .collect();
        let mut spec = spec(dir.path(), configs, iterations(3), max_concurrent);
        spec.resources = pool(2.5, 1.0);
        let (in_use, peak) = (Arc::default(), Arc::new(std::sync::Mutex::new((0.0, 0.0))));
        let runner = Runner::new(metered(in_use, peak.clone()), spec, Box::new(ConfiguredResources));
        let summary = tokio::runtime::Runtime::new().unwrap().block_on(runner.run()).unwrap();
        let (cpu, gpu) = *peak.lock().unwrap();
        proptest::prop_assert!(cpu <= 2.5 + 1e-9, "peak {cpu} CPUs");
        proptest::prop_assert!(gpu <= 1.0 + 1e-9, "peak {gpu} GPUs");
        proptest::prop_assert_eq!(summary.count(TrialStatus::Terminated), requests.len());
    }
}

/// Pauses nothing itself, but asks for 2 CPUs for `trial_0000` after its
/// first result.
struct GrowFirst;

impl Scheduler for GrowFirst {
    fn on_result(&mut self, _: &Trial, _: &serde_json::Map<String, Value>) -> Decision {
        Decision::Continue
    }

    fn resources(&mut self, trial: &Trial) -> Option<Resources> {
        (trial.trial_id == "trial_0000" && trial.iterations >= 1).then(|| Resources {
            cpu: 2.0,
            ..Resources::default()
        })
    }

    fn choose_next(&mut self, trials: &[Trial]) -> Option<usize> {
        trials.iter().position(|t| t.status == TrialStatus::Pending)
    }

    fn name(&self) -> &'static str {
        "grow-first"
    }
}

#[test]
fn a_scheduler_can_give_a_trial_more_resources_between_steps() {
    let dir = tempfile::tempdir().unwrap();
    let configs = vec![json!({"cpu": 1}), json!({"cpu": 1})];
    let mut spec = spec(dir.path(), configs, iterations(6), 2);
    spec.resources = pool(2.0, 0.0);
    let (in_use, peak) = (Arc::default(), Arc::new(std::sync::Mutex::new((0.0, 0.0))));
    let runner = Runner::new(metered(in_use, peak.clone()), spec, Box::new(GrowFirst));
    let summary = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(runner.run())
        .unwrap();
    // trial_0000 could not grow while trial_0001 held a CPU: it was
    // checkpointed, paused, and continued with 2 CPUs once trial_0001 was
    // done, losing nothing.
    let first = &summary.trials[0];
    assert_eq!(first.status, TrialStatus::Terminated, "{:?}", first.error);
    assert_eq!(first.iterations, 6);
    assert_eq!(first.resources.as_ref().unwrap().cpu, 2.0);
    assert!(
        first.iterations_since_restore < 6,
        "it was paused and resumed"
    );
    assert!(peak.lock().unwrap().0 <= 2.0);
}

/// Starts `trial_0000` with 2 CPUs and takes one back after its first
/// result.
struct ShrinkFirst;

impl Scheduler for ShrinkFirst {
    fn on_result(&mut self, _: &Trial, _: &serde_json::Map<String, Value>) -> Decision {
        Decision::Continue
    }

    fn resources(&mut self, trial: &Trial) -> Option<Resources> {
        (trial.trial_id == "trial_0000").then(|| Resources {
            cpu: if trial.iterations == 0 { 2.0 } else { 1.0 },
            ..Resources::default()
        })
    }

    fn choose_next(&mut self, trials: &[Trial]) -> Option<usize> {
        trials.iter().position(|t| t.status == TrialStatus::Pending)
    }

    fn name(&self) -> &'static str {
        "shrink-first"
    }
}

/// Logs when trials start and end.
struct Events(Arc<std::sync::Mutex<Vec<String>>>);

impl Callback for Events {
    fn on_trial_start(&mut self, trials: &[Trial], index: usize) -> Result<(), String> {
        let line = format!("start {}", trials[index].trial_id);
        self.0.lock().unwrap().push(line);
        Ok(())
    }

    fn on_trial_end(&mut self, trials: &[Trial], index: usize) -> Result<(), String> {
        let line = format!("end {}", trials[index].trial_id);
        self.0.lock().unwrap().push(line);
        Ok(())
    }
}

/// A resize that frees resources reaches the loop even though the trial
/// itself simply continues: the trial waiting for them starts at once.
#[test]
fn resources_a_trial_gives_back_start_a_waiting_trial_while_it_runs() {
    let dir = tempfile::tempdir().unwrap();
    let configs = vec![json!({"x": 1}), json!({"x": 2})];
    let mut spec = spec(dir.path(), configs, iterations(500), 2);
    spec.resources = pool(2.0, 0.0);
    let log = Arc::new(std::sync::Mutex::new(Vec::new()));
    let runner = Runner::new(linear(), spec, Box::new(ShrinkFirst)).callback(Events(log.clone()));
    let summary = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(runner.run())
        .unwrap();
    assert_eq!(summary.count(TrialStatus::Terminated), 2);
    let log = log.lock().unwrap();
    let at = |line: &str| log.iter().position(|l| l == line);
    assert!(
        at("start trial_0001").is_some() && at("start trial_0001") < at("end trial_0000"),
        "trial_0001 starts once trial_0000 gives a CPU back, not when it ends: {log:?}"
    );
}

#[test]
fn experiment_stoppers_end_the_run_by_trial_count_fuel_and_time() {
    // max_trials: only two of five trials are created.
    let dir = tempfile::tempdir().unwrap();
    let configs: Vec<Value> = (1..=5).map(|x| json!({ "x": x })).collect();
    let mut limited = spec(dir.path(), configs.clone(), iterations(2), 1);
    limited.stop_experiment.max_trials = Some(2);
    let summary = run(linear(), limited);
    assert_eq!(summary.trials.len(), 2);
    assert_eq!(summary.stopped, None);

    // max_fuel: 7 fuel per step, one trial at a time; the run stops at the
    // first result whose total reaches 30 (the fifth step: 35), and that
    // trial ends TERMINATED with the reason.
    let dir = tempfile::tempdir().unwrap();
    let mut fuel = spec(dir.path(), configs.clone(), iterations(3), 1);
    fuel.stop_experiment.max_fuel = Some(30);
    let summary = run(linear(), fuel);
    let reason = summary.stopped.clone().unwrap();
    assert!(reason.starts_with("total fuel reached 35"), "{reason}");
    let file: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("experiment.json")).unwrap())
            .unwrap();
    assert_eq!(file["stopped"], reason.as_str());
    assert_eq!(file["status"], "finished");
    assert_eq!(summary.trials.len(), 2);
    let second = &summary.trials[1];
    assert_eq!(second.status, TrialStatus::Terminated);
    assert_eq!(second.iterations, 2);
    assert!(
        second
            .stop_reason
            .as_deref()
            .unwrap()
            .starts_with("the experiment stopped: total fuel"),
        "{:?}",
        second.stop_reason
    );

    // max_time: trials that would run for 10 s end after about 0.3 s.
    let dir = tempfile::tempdir().unwrap();
    let slow = FnBackend::new(|_: &Value| {
        Ok(|it: u64| {
            std::thread::sleep(Duration::from_millis(20));
            Ok(Step {
                metrics: vec![("score".into(), it as f64)],
                done: false,
                fuel: 1,
            })
        })
    });
    let mut timed = spec(dir.path(), configs, iterations(500), 2);
    timed.stop_experiment.max_time = Some(0.3);
    let summary = run(slow, timed);
    let reason = summary.stopped.clone().unwrap();
    assert!(reason.starts_with("total time reached"), "{reason}");
    assert!(
        summary
            .trials
            .iter()
            .all(|t| t.status == TrialStatus::Terminated && t.iterations < 500)
    );
}

#[test]
fn a_run_that_stops_while_trials_wait_for_resources_ends_cleanly() {
    // One CPU, two slots: the second trial always waits for the first.
    let dir = tempfile::tempdir().unwrap();
    let configs: Vec<Value> = (1..=3).map(|x| json!({ "x": x })).collect();
    let mut stopping = spec(dir.path(), configs, iterations(5), 2);
    stopping.resources = pool(1.0, 0.0);
    stopping.stop_experiment.max_fuel = Some(14);
    let summary = run(linear(), stopping);
    assert!(summary.stopped.is_some());
    assert_eq!(summary.count(TrialStatus::Terminated), 1);
    assert_eq!(summary.count(TrialStatus::Error), 0);
}

#[test]
fn max_fuel_counts_fuel_burned_before_recoveries() {
    // Fails at iteration 3 every time and retries forever from scratch:
    // only the fuel budget can end it.
    let dir = tempfile::tempdir().unwrap();
    let backend = FnBackend::new(|_: &Value| {
        Ok(|it: u64| {
            if it == 3 {
                return Err(TrialFailure::new("fails at 3"));
            }
            Ok(Step {
                metrics: vec![("score".into(), it as f64)],
                done: false,
                fuel: 7,
            })
        })
    });
    let mut spec = spec(dir.path(), vec![json!({})], iterations(10), 1);
    spec.failure.max_failures = None;
    spec.stop_experiment.max_fuel = Some(50);
    let summary = run(backend, spec);
    let reason = summary.stopped.clone().unwrap();
    assert!(reason.starts_with("total fuel reached 56"), "{reason}");
    assert!(summary.trials[0].num_failures >= 3);
}

#[test]
fn a_resumed_fuel_count_is_kept_and_only_a_missing_one_is_made_up() {
    // The saved trial holds more fuel than the run burned (a PBT clone
    // carries its source's count): a kept count is not raised to it. A
    // state from before the count was kept (0) counts what trials hold.
    let burned = |kept: u64| {
        let dir = tempfile::tempdir().unwrap();
        let mut saved = Trial::new(
            "trial_0".into(),
            json!({"x": 1.0}),
            dir.path().join("trial_0"),
        );
        saved.status = TrialStatus::Terminated;
        saved.iterations = 10;
        saved.fuel_total = 1000;
        let configs = vec![json!({"x": 1.0}), json!({"x": 2.0})];
        let spec = spec(dir.path(), configs, iterations(10), 1);
        let runner = Runner::new(linear(), spec, Box::new(Fifo::default()))
            .with_trials(vec![saved])
            .fuel_burned(kept);
        let summary = tokio::runtime::Runtime::new()
            .unwrap()
            .block_on(runner.run())
            .unwrap();
        summary.decisions.fuel_burned
    };
    assert_eq!(burned(300), 300 + 70);
    assert_eq!(burned(0), 1000 + 70);
}

#[test]
fn a_limited_search_under_hyperband_does_not_wait_forever() {
    // HyperBand pauses the two live trials at their first milestone to wait
    // for their bracket, while the search admits only two live trials: the
    // runner ends the search, and HyperBand decides with what it has.
    let dir = tempfile::tempdir().unwrap();
    let space = SearchSpace::from_json(&json!({"x": {"uniform": [1, 2]}})).unwrap();
    let spec = spec(dir.path(), Vec::new(), StopCriteria::default(), 4);
    let searcher = SearchSpec::from_json(&json!({"max_concurrent": 2}))
        .unwrap()
        .build(&space, 9, Some("score"), Mode::Max, 1)
        .unwrap();
    let scheduler = SchedulerSpec::HyperBand(HyperBandConfig {
        max_t: 9.0,
        ..HyperBandConfig::default()
    })
    .build(Some("score"), Mode::Max, 1)
    .unwrap();
    let mut spec = spec;
    spec.checkpoint.freq = 0;
    let runner = Runner::new(linear(), spec, scheduler).searcher(searcher);
    let summary = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(runner.run())
        .unwrap();
    assert!(summary.trials.len() >= 2);
    assert!(
        summary
            .trials
            .iter()
            .all(|t| t.status == TrialStatus::Terminated),
        "{:?}",
        summary.trials.iter().map(|t| t.status).collect::<Vec<_>>()
    );
}

#[test]
fn a_max_time_beyond_the_clock_is_no_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spec(dir.path(), vec![json!({"x": 1})], iterations(3), 1);
    spec.stop_experiment.max_time = Some(1e19);
    let summary = run(linear(), spec);
    assert_eq!(summary.trials[0].iterations, 3);
    assert_eq!(summary.stopped, None);
}

/// A trial whose files cannot be made (its directory's path is taken by a
/// file) fails with the path before its trainable is launched; the trials
/// beside it run to the end.
#[test]
fn a_trial_whose_files_cannot_be_made_fails_alone_and_is_never_launched() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("trial_0001"), "taken").unwrap();
    let launched = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = launched.clone();
    let backend = FnBackend::new(move |config: &Value| {
        seen.lock().unwrap().push(config["x"].clone());
        let x = config["x"].as_f64().unwrap_or(0.0);
        Ok(move |it: u64| {
            Ok(Step {
                metrics: vec![("score".into(), x * it as f64)],
                done: false,
                fuel: 1,
            })
        })
    });
    let configs = vec![json!({"x": 1}), json!({"x": 2}), json!({"x": 3})];
    let summary = run(backend, spec(dir.path(), configs, iterations(3), 2));
    let statuses: Vec<TrialStatus> = summary.trials.iter().map(|t| t.status).collect();
    assert_eq!(
        statuses,
        [
            TrialStatus::Terminated,
            TrialStatus::Error,
            TrialStatus::Terminated
        ]
    );
    let error = summary.trials[1].error.clone().unwrap_or_default();
    assert!(
        error.contains("cannot create directory") && error.contains("trial_0001"),
        "{error}"
    );
    assert_eq!(summary.trials[1].iterations, 0);
    let mut launched = launched.lock().unwrap().clone();
    launched.sort_by_key(|x| x.as_i64());
    assert_eq!(launched, [json!(1), json!(3)]);
    for id in ["trial_0000", "trial_0002"] {
        let lines = std::fs::read_to_string(dir.path().join(id).join("result.jsonl")).unwrap();
        assert_eq!(lines.lines().count(), 3, "{id}");
    }
    // The file in the way is left as it was.
    assert_eq!(
        std::fs::read_to_string(dir.path().join("trial_0001")).unwrap(),
        "taken"
    );
}

#[test]
fn a_metric_no_result_reports_halts_the_run_once_naming_what_is_reported() {
    // `metric` misspelt: the first result lacks it, so the run stops
    // rather than fail every trial the same way.
    let dir = tempfile::tempdir().unwrap();
    let configs: Vec<Value> = (1..=8).map(|x| json!({"x": x})).collect();
    let spec = RunSpec {
        metric: Some("scroe".into()),
        ..spec(dir.path(), configs, iterations(3), 2)
    };
    let runner = Runner::new(linear(), spec, Box::new(Fifo::default()));
    let summary = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(runner.run())
        .unwrap();
    let halted = summary.halted.as_deref().unwrap();
    assert!(
        halted.contains("metric `scroe` is not in the trainable's report (it reports: score)")
            && halted.contains("check `metric`"),
        "{halted}"
    );
    let errors = summary.count(TrialStatus::Error);
    assert!((1..=2).contains(&errors), "{errors} trials failed");
    assert!(
        summary
            .trials
            .iter()
            .all(|t| t.status != TrialStatus::Terminated),
        "{:?}",
        summary.trials
    );
    assert!(summary.trials.len() <= 2, "trials went on starting");
}

#[test]
fn a_scheduler_time_attr_no_result_reports_halts_the_run() {
    // ASHA ends trials itself, so no default stop applies: with its
    // `time_attr` misspelt, no rung would ever judge a trial and none
    // would end. The first result lacking it halts the run instead.
    let dir = tempfile::tempdir().unwrap();
    let configs: Vec<Value> = (1..=8).map(|x| json!({"x": x})).collect();
    use wtune::tune::{Asha, AshaConfig};
    let config = AshaConfig {
        time_attr: "training_iterations".into(),
        ..AshaConfig::default()
    };
    let asha = Asha::new(config, "score", Mode::Max, 0).unwrap();
    // A bound, so that a regression fails rather than runs for ever.
    let spec = spec(dir.path(), configs, iterations(50), 2);
    let runner = Runner::new(linear(), spec, Box::new(asha));
    let summary = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(runner.run())
        .unwrap();
    let halted = summary.halted.as_deref().unwrap();
    assert!(
        halted.contains(
            "time_attr `training_iterations` is not a number in the trainable's report \
             (it reports: score)"
        ) && halted.contains("check `scheduler.time_attr`"),
        "{halted}"
    );
    assert!(
        summary.trials.iter().all(|t| t.iterations <= 1),
        "{:?}",
        summary.trials
    );
}
