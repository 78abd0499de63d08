//! Checkpoint policies, failure recovery, fail_fast, pause and resume in the
//! runner, exercised with plain-Rust trainables (`FnBackend`): the runner's
//! decisions, independent of how a backend takes its checkpoints.

use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value, json};
use wtune::report::{StateFile, TrialFiles, state};
use wtune::tune::resume::{self, ErroredTrials};
use wtune::tune::{
    Callback, CheckpointPolicy, Decision, ExperimentSummary, FailFast, FailurePolicy, Fifo,
    FnBackend, Listed, Mode, RunError, RunSpec, Runner, Scheduler, SearchSpace, SearchSpec,
    Searcher, Step, StopCriteria, Trial, TrialFailure, TrialStatus,
};

fn spec(dir: &Path, configs: Vec<Value>, iterations: u64) -> RunSpec {
    RunSpec {
        metric: Some("score".into()),
        mode: Mode::Max,
        stop: StopCriteria {
            training_iteration: Some(iterations),
            ..Default::default()
        },
        max_concurrent: 2,
        configs,
        checkpoint: CheckpointPolicy::default(),
        failure: FailurePolicy::default(),
        ..RunSpec::new("checkpoints", dir.to_path_buf())
    }
}

fn run_with(
    backend: FnBackend,
    spec: RunSpec,
    scheduler: Box<dyn Scheduler>,
    log: Option<Log>,
) -> Result<ExperimentSummary, RunError> {
    let mut runner = Runner::new(backend, spec, scheduler)
        .callback(TrialFiles::new())
        .callback(StateFile::new(json!({"test": true})));
    if let Some(log) = log {
        runner = runner.callback(log);
    }
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(runner.run())
}

fn run(backend: FnBackend, spec: RunSpec) -> ExperimentSummary {
    run_with(backend, spec, Box::new(Fifo::default()), None).unwrap()
}

/// score = a deterministic function of (x, iteration) that goes up and down.
fn wavy(failures: Arc<AtomicU32>, fail_at: u64) -> FnBackend {
    FnBackend::new(move |config: &Value| {
        let x = config["x"].as_f64().unwrap_or(1.0);
        let fails = config["fails"].as_u64().unwrap_or(0) as u32;
        // A trial that diverged from the start: its score is NaN.
        let diverged = config["diverged"].as_bool() == Some(true);
        // A trial that reports its score under another name.
        let name = match config["mute"].as_bool() {
            Some(true) => "loss",
            _ => "score",
        };
        let failures = failures.clone();
        Ok(move |it: u64| {
            if it == fail_at && failures.load(Ordering::SeqCst) < fails {
                failures.fetch_add(1, Ordering::SeqCst);
                return Err(TrialFailure::new(format!("trap at iteration {it}")));
            }
            Ok(Step {
                metrics: vec![(
                    name.into(),
                    if diverged {
                        f64::NAN
                    } else {
                        x * ((it % 4) as f64 + it as f64 / 10.0)
                    },
                )],
                done: false,
                fuel: 10,
            })
        })
    })
}

/// The saved state of the experiment in `dir`, and its trials prepared as
/// `wtune resume --retry-errored` prepares them.
fn prepared_for_retry(
    backend: &FnBackend,
    dir: &Path,
    policy: &CheckpointPolicy,
) -> (state::ExperimentState, Vec<Trial>, resume::ResumePlan) {
    let mut saved = state::load(dir, false).unwrap().unchecked();
    let mut trials = std::mem::take(&mut saved.trials);
    let plan = resume::prepare(backend, &mut trials, dir, policy, ErroredTrials::Retry);
    (saved, trials, plan)
}

fn checkpoint_files(trial_dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(trial_dir.join("checkpoints"))
        .map(|entries| {
            entries
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .filter(|n| !n.starts_with('.'))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn checkpoint_freq_and_keep_num_by_score_keep_the_best_and_the_newest() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spec(dir.path(), vec![json!({"x": 1.0})], 10);
    spec.checkpoint = CheckpointPolicy {
        freq: 2,
        at_end: false,
        keep_num: Some(2),
        score_attr: Some("score".into()),
    };
    let summary = run(wavy(Arc::default(), 0), spec);
    let trial = &summary.trials[0];
    assert_eq!(trial.status, TrialStatus::Terminated);
    // Scores at 2, 4, 6, 8, 10: 2.2, 0.4, 2.6, 0.8, 3.0. Best two: 10 and 6;
    // 10 is also the newest.
    assert_eq!(
        checkpoint_files(&trial.dir),
        ["checkpoint_000006.ckpt", "checkpoint_000010.ckpt"]
    );
    let kept: Vec<u64> = trial.checkpoints.iter().map(|c| c.iteration).collect();
    assert_eq!(kept, [6, 10]);
    assert_eq!(trial.checkpoints[1].score, Some(3.0));

    // min- ranks the other way; the newest stays regardless.
    let dir = tempfile::tempdir().unwrap();
    let mut spec2 = self::spec(dir.path(), vec![json!({"x": 1.0})], 10);
    spec2.checkpoint = CheckpointPolicy {
        freq: 2,
        at_end: true,
        keep_num: Some(1),
        score_attr: Some("min-score".into()),
    };
    let summary = run(wavy(Arc::default(), 0), spec2);
    assert_eq!(
        checkpoint_files(&summary.trials[0].dir),
        ["checkpoint_000004.ckpt", "checkpoint_000010.ckpt"]
    );
}

#[test]
fn a_score_that_is_nan_from_the_start_ranks_last_and_halts_nothing() {
    // The first trial diverged at once: its score is NaN in every result.
    // The attribute is there, so checkpoints are ranked (NaN last, the
    // newest kept) and the run goes on.
    let dir = tempfile::tempdir().unwrap();
    let configs = vec![json!({"x": 1.0, "diverged": true}), json!({"x": 2.0})];
    let mut spec = spec(dir.path(), configs, 10);
    spec.max_concurrent = 1;
    spec.checkpoint = CheckpointPolicy {
        freq: 2,
        at_end: false,
        keep_num: Some(1),
        score_attr: Some("score".into()),
    };
    let summary = run(wavy(Arc::default(), 0), spec);
    assert_eq!(summary.halted, None);
    assert_eq!(summary.trials.len(), 2);
    for trial in &summary.trials {
        assert_eq!(trial.iterations, 10, "{}", trial.trial_id);
    }
    assert_eq!(
        checkpoint_files(&summary.trials[0].dir),
        ["checkpoint_000010.ckpt"]
    );
}

#[test]
fn a_score_attr_no_result_reports_deletes_no_checkpoint_and_halts_the_run() {
    // `checkpoint_score_attr` misspelt: every checkpoint would score
    // nothing, the newest would be kept and the best deleted.
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spec(dir.path(), vec![json!({"x": 1.0}), json!({"x": 2.0})], 10);
    spec.max_concurrent = 1;
    spec.checkpoint = CheckpointPolicy {
        freq: 2,
        at_end: false,
        keep_num: Some(1),
        score_attr: Some("scroe".into()),
    };
    let summary = run(wavy(Arc::default(), 0), spec);
    let halted = summary.halted.as_deref().expect("the run halts");
    assert!(
        halted.contains("checkpoint_score_attr `scroe` is in no result so far")
            && halted.contains("reports: score")
            && halted.contains("none is deleted"),
        "{halted}"
    );
    let trial = &summary.trials[0];
    // Both kept, and the halt's own checkpoint after them, to resume from.
    let files = checkpoint_files(&trial.dir);
    assert_eq!(
        files[..2],
        ["checkpoint_000002.ckpt", "checkpoint_000004.ckpt"],
        "{files:?}"
    );
    assert!(trial.iterations < 10, "{}", trial.iterations);
    assert_eq!(summary.trials.len(), 1, "no more trials started");

    // The same key spelt right, with `min-`: ranked, nothing halts.
    let dir = tempfile::tempdir().unwrap();
    let mut spec = self::spec(dir.path(), vec![json!({"x": 1.0})], 10);
    spec.checkpoint = CheckpointPolicy {
        freq: 2,
        at_end: false,
        keep_num: Some(1),
        score_attr: Some("min-score".into()),
    };
    let summary = run(wavy(Arc::default(), 0), spec);
    assert_eq!(summary.halted, None);
}

#[test]
fn checkpoint_at_end_without_freq_writes_one_final_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spec(dir.path(), vec![json!({"x": 1.0}), json!({"x": 2.0})], 3);
    spec.checkpoint.at_end = true;
    let summary = run(wavy(Arc::default(), 0), spec);
    for trial in &summary.trials {
        assert_eq!(checkpoint_files(&trial.dir), ["checkpoint_000003.ckpt"]);
    }
}

#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<String>>>);

impl Callback for Log {
    fn on_result(&mut self, t: &[Trial], i: usize, r: &Map<String, Value>) -> Result<(), String> {
        self.0.lock().unwrap().push(format!(
            "{} it={} since_restore={}",
            t[i].trial_id, r["training_iteration"], r["iterations_since_restore"]
        ));
        Ok(())
    }
    fn on_trial_recover(&mut self, t: &[Trial], i: usize, why: &str) -> Result<(), String> {
        self.0.lock().unwrap().push(format!(
            "{} recover #{}: {why}",
            t[i].trial_id, t[i].num_failures
        ));
        Ok(())
    }
    fn on_trial_pause(&mut self, t: &[Trial], i: usize) -> Result<(), String> {
        self.0
            .lock()
            .unwrap()
            .push(format!("{} paused at {}", t[i].trial_id, t[i].iterations));
        Ok(())
    }
}

#[test]
fn a_trial_that_fails_once_recovers_from_its_checkpoint_under_max_failures() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spec(dir.path(), vec![json!({"x": 1.0, "fails": 1})], 8);
    spec.checkpoint.freq = 2;
    spec.failure.max_failures = Some(1);
    let log = Log::default();
    let summary = run_with(
        wavy(Arc::default(), 5),
        spec,
        Box::new(Fifo::default()),
        Some(log.clone()),
    )
    .unwrap();
    let trial = &summary.trials[0];
    assert_eq!(trial.status, TrialStatus::Terminated, "{:?}", trial.error);
    assert_eq!(trial.num_failures, 1);
    assert_eq!(trial.iterations, 8);
    let log = log.0.lock().unwrap().clone();
    let at = log.iter().position(|l| l.contains("recover")).unwrap();
    assert_eq!(
        log[at], "trial_0000 recover #1: trap at iteration 5",
        "{log:?}"
    );
    // It continues from the checkpoint at 4: iteration 5 again, the first
    // since the restore.
    assert_eq!(log[at + 1], "trial_0000 it=5 since_restore=1", "{log:?}");
    let result = trial.last_result.as_ref().unwrap();
    assert_eq!(result["iterations_since_restore"], json!(4));
    assert_eq!(result["training_iteration"], json!(8));
    // Results are appended, the redone iteration included.
    let lines = std::fs::read_to_string(trial.dir.join("result.jsonl")).unwrap();
    assert_eq!(lines.lines().count(), 8);
}

#[test]
fn without_retries_left_the_trial_ends_in_error_and_minus_one_retries_forever() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec1 = spec(dir.path(), vec![json!({"fails": 2})], 6);
    spec1.failure.max_failures = Some(1);
    let summary = run(wavy(Arc::default(), 3), spec1);
    let trial = &summary.trials[0];
    assert_eq!(trial.status, TrialStatus::Error);
    assert_eq!(trial.num_failures, 1);
    assert_eq!(trial.error.as_deref(), Some("trap at iteration 3"));

    let dir = tempfile::tempdir().unwrap();
    let mut spec2 = spec(dir.path(), vec![json!({"fails": 5})], 6);
    spec2.failure.max_failures = None;
    let summary = run(wavy(Arc::default(), 3), spec2);
    let trial = &summary.trials[0];
    assert_eq!(trial.status, TrialStatus::Terminated);
    // No checkpoints: every recovery starts from scratch.
    assert_eq!(trial.num_failures, 5);
    assert_eq!(trial.iterations, 6);
}

fn slow_or_failing() -> FnBackend {
    FnBackend::new(|config: &Value| {
        let fail = config["fail"].as_bool().unwrap_or(false);
        Ok(move |it: u64| {
            if fail && it == 2 {
                return Err(TrialFailure::new("boom"));
            }
            std::thread::sleep(std::time::Duration::from_millis(if fail { 1 } else { 20 }));
            Ok(Step {
                metrics: vec![("score".into(), it as f64)],
                done: false,
                fuel: 1,
            })
        })
    })
}

#[test]
fn fail_fast_stops_the_others_and_raise_ends_the_run_with_the_error() {
    let configs = vec![json!({}), json!({"fail": true}), json!({}), json!({})];
    let dir = tempfile::tempdir().unwrap();
    let mut stop = spec(dir.path(), configs.clone(), 50);
    stop.failure.fail_fast = FailFast::Stop;
    let summary = run(slow_or_failing(), stop);
    let halted = summary.halted.clone().unwrap();
    assert!(halted.contains("trial_0001 failed"), "{halted}");
    assert_eq!(summary.trials[1].status, TrialStatus::Error);
    // A trial still running is released unfinished, for `wtune resume`.
    let first = &summary.trials[0];
    assert_eq!(first.status, TrialStatus::Paused);
    assert!(first.iterations < 50, "stopped early: {}", first.iterations);
    assert_eq!(first.stop_reason.as_deref(), Some(halted.as_str()));
    // Trials not yet started stay PENDING, for `wtune resume`.
    assert!(
        summary.trials[2..]
            .iter()
            .all(|t| t.status == TrialStatus::Pending)
    );

    let dir = tempfile::tempdir().unwrap();
    let mut raise = spec(dir.path(), configs, 50);
    raise.failure.fail_fast = FailFast::Raise;
    match run_with(slow_or_failing(), raise, Box::new(Fifo::default()), None) {
        Err(RunError::TrialFailed { trial_id, reason }) => {
            assert_eq!((trial_id.as_str(), reason.as_str()), ("trial_0001", "boom"));
        }
        other => panic!("expected TrialFailed, got {:?}", other.map(|s| s.halted)),
    }
    // The state on disk says where the run stood.
    let saved = state::load(dir.path(), false).unwrap().unchecked();
    assert_eq!(saved.trials[1].status, TrialStatus::Error);
}

/// A trial that would train for minutes is dropped at its next result once
/// the run has ended with another trial's error: nobody would see its
/// results, and the runtime could not shut down while it trained.
#[test]
fn trials_still_running_when_raise_ends_the_run_stop_training() {
    let steps = Arc::new(AtomicUsize::new(0));
    let counted = steps.clone();
    let backend = FnBackend::new(move |config: &Value| {
        let fail = config.get("fail").is_some();
        let steps = counted.clone();
        Ok(move |_: u64| {
            if fail {
                return Err(TrialFailure::new("boom"));
            }
            steps.fetch_add(1, Ordering::Relaxed);
            Ok(Step {
                metrics: vec![("score".into(), 1.0)],
                done: false,
                fuel: 1,
            })
        })
    });
    let dir = tempfile::tempdir().unwrap();
    let mut raise = spec(
        dir.path(),
        vec![json!({}), json!({"fail": true})],
        100_000_000,
    );
    raise.failure.fail_fast = FailFast::Raise;
    let runner = Runner::new(backend, raise, Box::new(Fifo::default()));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let outcome = runtime.block_on(runner.run());
    runtime.shutdown_background();
    assert!(matches!(outcome, Err(RunError::TrialFailed { .. })));
    let after_return = steps.load(Ordering::Relaxed);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let later = steps.load(Ordering::Relaxed);
    assert!(
        later <= after_return + 1,
        "trial_0000 trained on after the run ended: {after_return} steps, then {later}"
    );
}

/// Pauses every trial once at iteration 3, and resumes paused trials before
/// starting new ones.
#[derive(Default)]
struct PauseOnce {
    paused: HashSet<String>,
}

impl Scheduler for PauseOnce {
    fn on_result(&mut self, trial: &Trial, _result: &Map<String, Value>) -> Decision {
        if trial.iterations == 3 && self.paused.insert(trial.trial_id.clone()) {
            Decision::Pause
        } else {
            Decision::Continue
        }
    }
    fn choose_next(&mut self, trials: &[Trial]) -> Option<usize> {
        trials
            .iter()
            .position(|t| t.status == TrialStatus::Paused)
            .or_else(|| trials.iter().position(|t| t.status == TrialStatus::Pending))
    }
    fn name(&self) -> &'static str {
        "pause-once"
    }
}

#[test]
fn a_paused_trial_releases_its_slot_and_continues_from_its_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spec(
        dir.path(),
        vec![json!({"x": 1.0}), json!({"x": 2.0}), json!({"x": 3.0})],
        6,
    );
    spec.max_concurrent = 1;
    let log = Log::default();
    let summary = run_with(
        wavy(Arc::default(), 0),
        spec,
        Box::new(PauseOnce::default()),
        Some(log.clone()),
    )
    .unwrap();
    for trial in &summary.trials {
        assert_eq!(trial.status, TrialStatus::Terminated);
        assert_eq!(trial.iterations, 6);
        assert_eq!(checkpoint_files(&trial.dir), ["checkpoint_000003.ckpt"]);
        let result = trial.last_result.as_ref().unwrap();
        assert_eq!(result["iterations_since_restore"], json!(3));
    }
    let log = log.0.lock().unwrap().clone();
    let paused = log
        .iter()
        .position(|l| l == "trial_0000 paused at 3")
        .unwrap();
    assert_eq!(
        log[paused + 1],
        "trial_0000 it=4 since_restore=1",
        "{log:?}"
    );
}

#[test]
fn a_metric_reported_before_a_resume_is_no_misspelling_after_it() {
    // A result without the metric halts the run only while no result has
    // carried it (a misspelt `metric`). The first result of a resumed run
    // is not the experiment's first: a trial that leaves the metric out
    // then fails alone, and the next one starts.
    let dir = tempfile::tempdir().unwrap();
    let backend = wavy(Arc::default(), 0);
    let first = run(
        backend.clone(),
        spec(dir.path(), vec![json!({"x": 1.0})], 2),
    );
    assert_eq!(first.trials[0].status, TrialStatus::Terminated);

    // The same list, two configurations longer: the searcher skips the
    // one the saved trial ran.
    let more = vec![json!({"x": 1.0}), json!({"mute": true}), json!({"x": 2.0})];
    let mut after = spec(dir.path(), more, 2);
    after.max_concurrent = 1;
    let (_, trials, _) = prepared_for_retry(&backend, dir.path(), &after.checkpoint);
    let resumed = Runner::new(backend, after, Box::new(Fifo::default()))
        .with_trials(trials)
        .callback(TrialFiles::new());
    let summary = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(resumed.run())
        .unwrap();
    assert_eq!(summary.halted, None);
    let statuses: Vec<_> = summary.trials.iter().map(|t| t.status).collect();
    assert_eq!(
        statuses,
        [
            TrialStatus::Terminated,
            TrialStatus::Error,
            TrialStatus::Terminated
        ]
    );
    let error = summary.trials[1].error.as_deref().unwrap_or_default();
    assert!(
        error.contains("metric `score` is not in the trainable's report (it reports: loss"),
        "{error}"
    );
}

#[test]
fn an_interrupted_experiment_resumes_from_its_state_and_checkpoints() {
    let configs: Vec<Value> = (0..4).map(|i| json!({"x": i as f64 + 1.0})).collect();
    let dir = tempfile::tempdir().unwrap();
    let uninterrupted = run(
        wavy(Arc::default(), 0),
        spec(dir.path(), configs.clone(), 9),
    );

    // The same experiment, stopped by a failure under fail_fast = "raise".
    let dir = tempfile::tempdir().unwrap();
    let mut first = spec(dir.path(), configs.clone(), 9);
    first.configs.insert(0, json!({"x": 0.0, "fails": 1}));
    first.checkpoint.freq = 2;
    first.failure.fail_fast = FailFast::Raise;
    let failures = Arc::new(AtomicU32::new(0));
    let backend = wavy(failures.clone(), 4);
    let mut spec_after = first.clone();
    assert!(run_with(backend.clone(), first, Box::new(Fifo::default()), None).is_err());

    let (saved, trials, plan) = prepared_for_retry(&backend, dir.path(), &spec_after.checkpoint);
    let counted = plan.continued.len() + plan.restarted.len() + plan.pending + plan.finished;
    assert_eq!(counted, trials.len(), "{plan:?}");
    // The failed trial continues from its checkpoint at iteration 2.
    assert!(
        plan.continued.contains(&("trial_0000".into(), 2)),
        "{plan:?}"
    );
    assert!(plan.damaged.is_empty(), "{:?}", plan.damaged);
    spec_after.failure.fail_fast = FailFast::Off;
    // Trials are created as the run goes: the searcher's saved state says
    // which configurations are still to come.
    assert!(trials.len() < 5, "{} trials were created", trials.len());
    let mut searcher = Listed::new(std::mem::take(&mut spec_after.configs));
    searcher
        .restore_state(&saved.decisions.searcher.unwrap().state)
        .unwrap();
    let resumed = Runner::new(backend, spec_after, Box::new(Fifo::default()))
        .searcher(Box::new(searcher))
        .with_trials(trials)
        .callback(TrialFiles::new());
    let summary = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(resumed.run())
        .unwrap();
    assert_eq!(summary.trials[0].status, TrialStatus::Terminated);
    for (a, b) in uninterrupted.trials.iter().zip(&summary.trials[1..]) {
        assert_eq!(b.status, TrialStatus::Terminated, "{:?}", b.error);
        assert_eq!(a.metric("score"), b.metric("score"), "{}", a.trial_id);
        assert_eq!(a.iterations, b.iterations);
    }
}

/// A trial that ended in ERROR and runs again under `wtune resume
/// --retry-errored` completes once for the searcher: TPE learns from its
/// retry, and a concurrency limit frees its place once, not twice.
#[test]
fn a_retried_error_trial_completes_once_for_the_searcher() {
    let space = SearchSpace::from_json(&json!({"x": {"uniform": [1, 2]}})).unwrap();
    let search = SearchSpec::from_json(&json!({"type": "tpe", "max_concurrent": 1})).unwrap();
    let searcher = || {
        search
            .build(&space, 3, Some("score"), Mode::Max, 4)
            .unwrap()
    };
    // The first trial traps at iteration 2, once.
    let trapped = Arc::new(AtomicU32::new(0));
    let backend = FnBackend::new(move |config: &Value| {
        let x = config["x"].as_f64().unwrap();
        let trapped = trapped.clone();
        Ok(move |it: u64| {
            if it == 2 && trapped.fetch_add(1, Ordering::SeqCst) == 0 {
                return Err(TrialFailure::new("trap at iteration 2"));
            }
            Ok(Step {
                metrics: vec![("score".into(), x * it as f64)],
                done: false,
                fuel: 10,
            })
        })
    });
    let dir = tempfile::tempdir().unwrap();
    let experiment = spec(dir.path(), Vec::new(), 3);
    let first = Runner::new(
        backend.clone(),
        experiment.clone(),
        Box::new(Fifo::default()),
    )
    .searcher(searcher())
    .callback(StateFile::new(json!({"test": true})));
    let summary = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(first.run())
        .unwrap();
    let statuses: Vec<TrialStatus> = summary.trials.iter().map(|t| t.status).collect();
    assert_eq!(
        statuses,
        [
            TrialStatus::Error,
            TrialStatus::Terminated,
            TrialStatus::Terminated
        ]
    );

    let (saved, trials, plan) = prepared_for_retry(&backend, dir.path(), &experiment.checkpoint);
    assert_eq!(plan.retried, ["trial_0000"]);
    let mut scheduler: Box<dyn Scheduler> = Box::new(Fifo::default());
    let mut restored = searcher();
    restored
        .restore_state(&saved.decisions.searcher.unwrap().state)
        .unwrap();
    resume::retry_errored(&plan, &trials, scheduler.as_mut(), restored.as_mut());
    let resumed = Runner::new(backend, experiment, scheduler)
        .searcher(restored)
        .with_trials(trials);
    let summary = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(resumed.run())
        .unwrap();
    assert_eq!(summary.trials.len(), 3, "no trial is created twice");
    assert!(
        summary
            .trials
            .iter()
            .all(|t| t.status == TrialStatus::Terminated)
    );
    let state = &summary.decisions.searcher.as_ref().unwrap().state;
    assert_eq!(state["live"], json!([]), "{state}");
    assert_eq!(
        state["inner"]["observations"].as_array().unwrap().len(),
        3,
        "the retried trial is learned from: {state}"
    );
}

/// Sends an interrupt when `trial_0000` reports iteration `at`.
struct InterruptAt {
    at: u64,
    times: usize,
    send: tokio::sync::mpsc::UnboundedSender<()>,
}

impl Callback for InterruptAt {
    fn on_result(&mut self, t: &[Trial], i: usize, _: &Map<String, Value>) -> Result<(), String> {
        if i == 0 && t[i].iterations == self.at {
            for _ in 0..self.times {
                let _ = self.send.send(());
            }
        }
        Ok(())
    }
}

#[test]
fn an_interrupt_checkpoints_running_trials_and_a_second_one_exits_at_once() {
    let configs: Vec<Value> = (0..4).map(|i| json!({"x": i as f64 + 1.0})).collect();
    let dir = tempfile::tempdir().unwrap();
    let (send, receive) = tokio::sync::mpsc::unbounded_channel();
    let runner = Runner::new(
        slow_or_failing(),
        spec(dir.path(), configs.clone(), 50),
        Box::new(Fifo::default()),
    )
    .interrupts(receive)
    .callback(StateFile::new(json!({})))
    .callback(InterruptAt {
        at: 3,
        times: 1,
        send,
    });
    let summary = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(runner.run())
        .unwrap();
    assert_eq!(summary.halted.as_deref(), Some("interrupted"));
    let first = &summary.trials[0];
    assert_eq!(first.status, TrialStatus::Paused);
    // Checkpointed after the step it was in: nothing is lost.
    let newest = first.latest_checkpoint().unwrap();
    assert_eq!(newest.iteration, first.iterations);
    assert!(first.iterations >= 3 && first.iterations < 50);
    assert!(
        summary.trials[2..]
            .iter()
            .all(|t| t.status == TrialStatus::Pending)
    );
    let saved = state::load(dir.path(), false).unwrap().unchecked();
    assert_eq!(saved.trials[0].status, TrialStatus::Paused);

    let dir = tempfile::tempdir().unwrap();
    let (send, receive) = tokio::sync::mpsc::unbounded_channel();
    let runner = Runner::new(
        slow_or_failing(),
        spec(dir.path(), configs, 50),
        Box::new(Fifo::default()),
    )
    .interrupts(receive)
    .callback(StateFile::new(json!({})))
    .callback(InterruptAt {
        at: 3,
        times: 2,
        send,
    });
    let outcome = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(runner.run());
    assert!(
        matches!(outcome, Err(RunError::Interrupted)),
        "{:?}",
        outcome.map(|s| s.halted)
    );
    let saved = state::load(dir.path(), false).unwrap().unchecked();
    assert_eq!(saved.status, "halted");
    assert_eq!(saved.trials[0].status, TrialStatus::Running);
}

#[test]
fn permanent_failures_are_not_retried_even_under_minus_one() {
    let backend = FnBackend::new(|_: &Value| {
        Ok(|it: u64| {
            if it == 2 {
                return Err(TrialFailure::permanent("fuel budget of 1e9 spent"));
            }
            Ok(Step {
                metrics: vec![("score".into(), 1.0)],
                done: false,
                fuel: 1,
            })
        })
    });
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spec(dir.path(), vec![json!({})], 5);
    spec.failure.max_failures = None;
    let summary = run(backend, spec);
    let trial = &summary.trials[0];
    assert_eq!(trial.status, TrialStatus::Error);
    assert_eq!(trial.num_failures, 0);
    assert_eq!(trial.error.as_deref(), Some("fuel budget of 1e9 spent"));
}

/// score = iteration × x; counts every `train()` call in `calls`.
fn counted(calls: Arc<AtomicUsize>) -> FnBackend {
    FnBackend::new(move |config: &Value| {
        let x = config["x"].as_f64().unwrap_or(1.0);
        let calls = calls.clone();
        Ok(move |it: u64| {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok(Step {
                metrics: vec![("score".into(), x * it as f64)],
                done: false,
                fuel: 10,
            })
        })
    })
}

/// Lines of `trial`'s `result.jsonl`, as `training_iteration`s.
fn result_iterations(trial: &Trial) -> Vec<u64> {
    std::fs::read_to_string(trial.dir.join("result.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["training_iteration"]
                .as_u64()
                .unwrap()
        })
        .collect()
}

#[test]
fn trials_a_resumed_run_finds_on_disk_are_continued_not_redone() {
    // A finished run whose state was never written past its start (a
    // process killed at once, as far as the state knows): resuming, the
    // runner is handed no trial, and the searcher suggests them again.
    let dir = tempfile::tempdir().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let configs = vec![json!({"x": 1.0}), json!({"x": 2.0})];
    let mut first = spec(dir.path(), configs.clone(), 6);
    first.checkpoint = CheckpointPolicy {
        freq: 2,
        at_end: true,
        ..CheckpointPolicy::default()
    };
    let done = run(counted(calls.clone()), first.clone());
    assert!(
        done.trials
            .iter()
            .all(|t| t.status == TrialStatus::Terminated)
    );
    assert_eq!(calls.load(Ordering::SeqCst), 12);

    // The second trial's directory is also given another configuration's
    // files, as when an adaptive searcher suggests differently this time.
    let mut second = first.clone();
    second.configs[1] = json!({"x": 3.0});
    let policy = second.checkpoint.clone();
    let adopter = counted(calls.clone());
    let runner = Runner::new(counted(calls.clone()), second, Box::new(Fifo::default()))
        .adopt_from_disk(move |trial| resume::adopt_reported(&adopter, trial, &policy))
        .callback(TrialFiles::new());
    let summary = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(runner.run())
        .unwrap();
    let [kept, redone] = &summary.trials[..] else {
        panic!("{:?}", summary.trials)
    };
    // The first trial was restored at its last checkpoint, which already
    // met the stopping criteria: it ended there, untrained, its results
    // once each.
    assert_eq!(kept.status, TrialStatus::Terminated);
    assert_eq!(kept.iterations, 6);
    assert_eq!(
        kept.stop_reason.as_deref(),
        Some("training_iteration reached 6")
    );
    assert_eq!(kept.metric("score"), Some(6.0));
    assert_eq!(result_iterations(kept), (1..=6).collect::<Vec<_>>());
    // The second ran afresh in a directory of its own; the old one was
    // moved aside, whole.
    assert_eq!(redone.metric("score"), Some(18.0));
    assert_eq!(result_iterations(redone), (1..=6).collect::<Vec<_>>());
    assert_eq!(
        calls.load(Ordering::SeqCst),
        12 + 6,
        "only the new trial trained"
    );
    // The adopted trial's fuel, burned before the kill, counts toward
    // `max_fuel` with the new trial's: 10 per iteration.
    assert_eq!(summary.decisions.fuel_burned, 60 + 60);
    let aside: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.starts_with("trial_0001.stale-"))
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    let old: Value = serde_json::from_slice(
        &std::fs::read(dir.path().join(&aside[0]).join("params.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(old, json!({"x": 2.0}));
}

/// `(iteration, iterations in result.jsonl)` at each checkpoint.
type Seen = Arc<Mutex<Vec<(u64, Vec<u64>)>>>;

/// Records, each time its checkpoint state is taken, the iteration and the
/// iterations already in its trial's `result.jsonl` on disk.
struct Witness {
    results: std::path::PathBuf,
    iteration: u64,
    seen: Seen,
}

impl wtune::tune::StatefulStep for Witness {
    fn step(&mut self, iteration: u64) -> Result<Step, TrialFailure> {
        self.iteration = iteration;
        Ok(Step {
            metrics: vec![("score".into(), iteration as f64)],
            done: false,
            fuel: 10,
        })
    }

    fn state(&self) -> Value {
        let on_disk = std::fs::read_to_string(&self.results)
            .unwrap_or_default()
            .lines()
            .map(|l| {
                serde_json::from_str::<Value>(l).unwrap()["training_iteration"]
                    .as_u64()
                    .unwrap()
            })
            .collect();
        self.seen.lock().unwrap().push((self.iteration, on_disk));
        json!(self.iteration)
    }
}

#[test]
fn every_result_up_to_a_checkpoint_is_on_disk_before_the_checkpoint_is_taken() {
    // `wtune resume` continues from the newest checkpoint file on disk: a
    // process killed just after one was written must not have lost the
    // results before it, which nothing would ever write again.
    let dir = tempfile::tempdir().unwrap();
    let results = dir.path().join("trial_0000/result.jsonl");
    let seen: Seen = Arc::default();
    let backend = {
        let seen = seen.clone();
        FnBackend::stateful(move |config: &Value, _state| {
            Ok(Witness {
                results: config["results"].as_str().unwrap().into(),
                iteration: 0,
                seen: seen.clone(),
            })
        })
    };
    let mut spec = spec(
        dir.path(),
        vec![json!({"results": results.to_str().unwrap()})],
        9,
    );
    spec.checkpoint.freq = 2;
    spec.checkpoint.at_end = true;
    let done = run(backend, spec);
    assert_eq!(done.trials[0].status, TrialStatus::Terminated);
    let seen = seen.lock().unwrap();
    let taken: Vec<u64> = seen.iter().map(|(iteration, _)| *iteration).collect();
    assert_eq!(taken, [2, 4, 6, 8, 9]);
    for (iteration, on_disk) in seen.iter() {
        let expected: Vec<u64> = (1..=*iteration).collect();
        assert_eq!(
            on_disk, &expected,
            "when the checkpoint at {iteration} was taken"
        );
    }
}
