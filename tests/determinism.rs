//! Fuel-time order (`ResultOrder::Fuel`): the same seeded experiment makes
//! the same decisions whatever the threads' timing. Trainables here are
//! plain Rust (`FnBackend`) whose fuel per step is a function of their
//! config, with delays injected into their steps to reorder the threads.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Map, Value, json};
use wtune::report::{StateFile, TrialFiles};
use wtune::tune::{
    CHECKPOINT_DIR, Callback, CheckpointPolicy, DecisionRecord, FailFast, FailurePolicy, FnBackend,
    FuelMoment, Mode, ResultOrder, RunSpec, Runner, SavedClock, SchedulerSpec, Step, StopCriteria,
    Trial, TrialFailure, TrialStatus,
};

/// How long step `iteration` of the trial with config `x` sleeps.
type Delay = Arc<dyn Fn(f64, u64) -> Duration + Send + Sync>;

/// score = a curve of `x` and the iteration that crosses between trials;
/// fuel per step = the config's `fuel`. A config with `fails_at` fails
/// once at that iteration; one with `fails_to_launch` fails its first that
/// many launches, before it burns any fuel.
fn backend(delay: Delay) -> FnBackend {
    let failed: Arc<Mutex<HashSet<String>>> = Arc::default();
    let launches: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    FnBackend::new(move |config: &Value| {
        let x = config["x"].as_f64().unwrap();
        let fuel = config["fuel"].as_u64().unwrap();
        let launch = {
            let mut launches = launches.lock().unwrap();
            let count = launches.entry(format!("{x}")).or_default();
            *count += 1;
            *count
        };
        if config["fails_to_launch"]
            .as_u64()
            .is_some_and(|k| launch <= k)
        {
            return Err(TrialFailure::new(format!(
                "failing to launch, time {launch}"
            )));
        }
        let fails_at = config["fails_at"].as_u64();
        let fails_for_good_at = config["fails_for_good_at"].as_u64();
        let (delay, failed) = (delay.clone(), failed.clone());
        Ok(move |it: u64| {
            std::thread::sleep(delay(x, it));
            if Some(it) == fails_at && failed.lock().unwrap().insert(format!("{x}")) {
                return Err(TrialFailure::new(format!("failing once at {it}")));
            }
            if Some(it) == fails_for_good_at {
                return Err(TrialFailure::permanent(format!("failing for good at {it}")));
            }
            let score = x * (it as f64).ln_1p() + (x * 7.0 + it as f64 * 0.3).sin();
            Ok(Step {
                metrics: vec![("score".into(), score)],
                done: false,
                fuel,
            })
        })
    })
}

/// What the callbacks saw, in order: each result's trial and iteration,
/// and each trial's end.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<String>>>);

impl Callback for Seen {
    fn on_result(
        &mut self,
        trials: &[Trial],
        index: usize,
        result: &Map<String, Value>,
    ) -> Result<(), String> {
        let line = format!(
            "{} it={} fuel={}",
            trials[index].trial_id, result["training_iteration"], result["fuel_total"]
        );
        self.0.lock().unwrap().push(line);
        Ok(())
    }

    fn on_trial_end(&mut self, trials: &[Trial], index: usize) -> Result<(), String> {
        let t = &trials[index];
        let line = format!("{} ended {} {:?}", t.trial_id, t.status, t.stop_reason);
        self.0.lock().unwrap().push(line);
        Ok(())
    }

    fn on_trial_recover(
        &mut self,
        trials: &[Trial],
        index: usize,
        reason: &str,
    ) -> Result<(), String> {
        let line = format!("{} recovers: {reason}", trials[index].trial_id);
        self.0.lock().unwrap().push(line);
        Ok(())
    }
}

/// One trial's outcome: id, status, iterations, why it stopped, config.
type Outcome = (String, TrialStatus, u64, Option<String>, Value);

/// Runs `configs` under `scheduler` with `delay` in `order`; returns the
/// trials' outcomes and what the callbacks saw.
fn run(
    configs: &[Value],
    scheduler: &Value,
    order: ResultOrder,
    concurrent: usize,
    delay: Delay,
) -> (Vec<Outcome>, Vec<String>) {
    let failure = FailurePolicy {
        max_failures: Some(2),
        fail_fast: FailFast::Stop,
    };
    run_with(configs, scheduler, order, concurrent, delay, failure)
}

/// [`run`] with `failure` as the failure policy.
fn run_with(
    configs: &[Value],
    scheduler: &Value,
    order: ResultOrder,
    concurrent: usize,
    delay: Delay,
    failure: FailurePolicy,
) -> (Vec<Outcome>, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let scheduler: SchedulerSpec = serde_json::from_value(scheduler.clone()).unwrap();
    let spec = RunSpec {
        metric: Some("score".into()),
        mode: Mode::Max,
        stop: StopCriteria {
            training_iteration: Some(12),
            ..Default::default()
        },
        max_concurrent: concurrent,
        configs: configs.to_vec(),
        checkpoint: CheckpointPolicy {
            freq: 3,
            ..CheckpointPolicy::default()
        },
        failure,
        result_order: order,
        ..RunSpec::new("determinism", dir.path())
    };
    let seen = Seen::default();
    let runner = Runner::new(
        backend(delay),
        spec,
        scheduler.build(Some("score"), Mode::Max, 7).unwrap(),
    )
    .callback(TrialFiles::new())
    .callback(seen.clone());
    let summary = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(runner.run())
        .unwrap();
    let outcomes = summary
        .trials
        .iter()
        .map(|t| {
            (
                t.trial_id.clone(),
                t.status,
                t.iterations,
                t.stop_reason.clone(),
                t.config.clone(),
            )
        })
        .collect();
    let seen = seen.0.lock().unwrap().clone();
    (outcomes, seen)
}

/// Delays in 0..`most_ms` ms, a pseudo-random function of `seed`, the
/// trial's `x` and the iteration.
fn scrambled(seed: u64, most_ms: u64) -> Delay {
    Arc::new(move |x: f64, it: u64| {
        let mut h = seed ^ (x.to_bits().rotate_left(17)) ^ it.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 29;
        Duration::from_millis(h % (most_ms + 1))
    })
}

/// Trials whose fuel per step differs, so that their results interleave
/// in fuel time; one fails once and is retried.
fn population(n: usize) -> Vec<Value> {
    (0..n)
        .map(|i| {
            let mut config = json!({
                "x": 0.4 + 0.23 * i as f64,
                "fuel": 70 + (i as u64 * 37) % 60,
            });
            if i == 2 {
                config["fails_at"] = json!(4);
            }
            config
        })
        .collect()
}

#[test]
fn the_old_arrival_order_decides_by_which_thread_was_faster() {
    // Two trials burn the same fuel per step, so they reach ASHA's first
    // rung at the same fuel time; the tie goes to trial_0000 in fuel order.
    // The first at a rung always goes on; the second only if it is in the
    // top half. trial_0000 is the worse.
    let configs = [
        json!({"x": 1.0, "fuel": 100}),
        json!({"x": 2.0, "fuel": 100}),
    ];
    let asha = json!({"type": "asha", "time_attr": "fuel_total", "max_t": 800,
                      "grace_period": 100, "reduction_factor": 2});
    let late = |slow: f64| -> Delay {
        Arc::new(move |x: f64, it: u64| {
            Duration::from_millis(if x == slow && it == 1 { 400 } else { 0 })
        })
    };
    let iterations = |outcomes: &[Outcome]| -> Vec<u64> { outcomes.iter().map(|o| o.2).collect() };
    let (first_slow, _) = run(&configs, &asha, ResultOrder::Arrival, 2, late(1.0));
    let (second_slow, _) = run(&configs, &asha, ResultOrder::Arrival, 2, late(2.0));
    assert_ne!(
        iterations(&first_slow),
        iterations(&second_slow),
        "arrival order should have decided differently"
    );
    let (first_slow, seen_a) = run(&configs, &asha, ResultOrder::Fuel, 2, late(1.0));
    let (second_slow, seen_b) = run(&configs, &asha, ResultOrder::Fuel, 2, late(2.0));
    assert_eq!(first_slow, second_slow);
    assert_eq!(seen_a, seen_b);
    // trial_0000 went first at the rung and on.
    assert!(first_slow[0].2 > 1, "{first_slow:?}");
}

fn assert_same_whatever_the_timing(scheduler: Value, concurrent: usize, configs: Vec<Value>) {
    let (outcomes, seen) = run(
        &configs,
        &scheduler,
        ResultOrder::Fuel,
        concurrent,
        scrambled(1, 0),
    );
    for seed in [2, 3] {
        let (again, seen_again) = run(
            &configs,
            &scheduler,
            ResultOrder::Fuel,
            concurrent,
            scrambled(seed, 12),
        );
        assert_eq!(outcomes, again, "{scheduler}, delays {seed}");
        assert_eq!(seen, seen_again, "{scheduler}, delays {seed}");
    }
    assert!(
        outcomes.iter().any(|o| o.2 < 12),
        "{scheduler}: no trial was stopped early, so nothing was decided: {outcomes:?}"
    );
}

#[test]
fn asha_decides_the_same_whatever_the_timing() {
    assert_same_whatever_the_timing(
        json!({"type": "asha", "time_attr": "fuel_total", "max_t": 1200,
               "grace_period": 150, "reduction_factor": 3}),
        3,
        population(9),
    );
}

#[test]
fn hyperband_decides_the_same_whatever_the_timing() {
    assert_same_whatever_the_timing(
        json!({"type": "hyperband", "time_attr": "fuel_total", "max_t": 1200,
               "reduction_factor": 3}),
        3,
        population(9),
    );
}

#[test]
fn median_stopping_decides_the_same_whatever_the_timing() {
    assert_same_whatever_the_timing(
        json!({"type": "median_stopping", "time_attr": "fuel_total", "grace_period": 200,
               "min_samples_required": 2}),
        3,
        // Later trials are worse, so they are judged against finished
        // ones and stopped.
        population(9).into_iter().rev().collect(),
    );
}

#[test]
fn pbt_exploits_the_same_whatever_the_timing() {
    let pbt = json!({"type": "pbt", "time_attr": "fuel_total", "perturbation_interval": 250,
                     "hyperparam_mutations": {"x": [0.5, 1.0, 1.5, 2.0, 2.5]}});
    let configs = population(6);
    let (outcomes, seen) = run(&configs, &pbt, ResultOrder::Fuel, 3, scrambled(1, 0));
    for seed in [2, 3] {
        let (again, seen_again) = run(&configs, &pbt, ResultOrder::Fuel, 3, scrambled(seed, 12));
        assert_eq!(outcomes, again, "delays {seed}");
        assert_eq!(seen, seen_again, "delays {seed}");
    }
    assert!(
        outcomes
            .iter()
            .zip(&configs)
            .any(|(o, c)| o.4["x"] != c["x"]),
        "no trial exploited another: {outcomes:?}"
    );
}

#[test]
fn a_trial_that_keeps_failing_to_launch_does_not_hold_the_others_back() {
    // trial_0000 fails its first 30 launches, each at the fuel time it
    // started at (it burns nothing), and is retried forever; trial_0001
    // trains. Retried at its failure's fuel time, trial_0000 would have
    // the earliest event 30 times over while trial_0001 waited (and for
    // good, were it never to launch).
    let configs = [
        json!({"x": 1.0, "fuel": 100, "fails_to_launch": 30}),
        json!({"x": 2.0, "fuel": 100}),
    ];
    let fifo = json!({"type": "fifo"});
    let forever = || FailurePolicy {
        max_failures: None,
        fail_fast: FailFast::Stop,
    };
    let (outcomes, seen) = run_with(
        &configs,
        &fifo,
        ResultOrder::Fuel,
        2,
        scrambled(1, 0),
        forever(),
    );
    let at = |prefix: &str| {
        seen.iter()
            .position(|line| line.starts_with(prefix))
            .unwrap()
    };
    assert!(
        at("trial_0001 ended") < at("trial_0000 it="),
        "trial_0001 waited for trial_0000's retries: {seen:#?}"
    );
    // Once trial_0001 trains, each retry starts at its next result.
    let recovers = |line: &String| line.starts_with("trial_0000 recovers");
    let training = &seen[at("trial_0001 it=1")..at("trial_0001 ended")];
    assert!(
        training
            .windows(2)
            .all(|w| !(recovers(&w[0]) && recovers(&w[1]))),
        "{seen:#?}"
    );
    assert!(outcomes.iter().all(|o| o.2 == 12), "{outcomes:?}");
    for seed in [2, 3] {
        let (again, seen_again) = run_with(
            &configs,
            &fifo,
            ResultOrder::Fuel,
            2,
            scrambled(seed, 12),
            forever(),
        );
        assert_eq!((&outcomes, &seen), (&again, &seen_again), "delays {seed}");
    }
}

/// What the runner decided, as `ITERATION DECISION` lines.
#[derive(Clone, Default)]
struct Decided(Arc<Mutex<Vec<String>>>);

impl Callback for Decided {
    fn on_decision(&mut self, record: &DecisionRecord) -> Result<(), String> {
        let line = format!("{} {}", record.iteration, record.decision);
        self.0.lock().unwrap().push(line);
        Ok(())
    }
}

/// The moment of a run of one trial, `trial_id`, started at fuel time 0
/// and burning `fuel` per step, after it decided on step `iteration` (none
/// of its decisions counted).
fn one_trial_moment(trial_id: &str, iteration: u64, fuel: u64) -> FuelMoment {
    FuelMoment {
        now: iteration * fuel,
        decisions: 0,
        clocks: vec![SavedClock {
            trial_id: trial_id.into(),
            start: 0,
            fuel_at_start: Some(0),
            floor: iteration * fuel,
            iteration,
            pending: None,
            deferred: false,
        }],
    }
}

/// One trial with `config` ran to iteration 8 in fuel order; the run was
/// killed at a moment that had decided up to 8, with the trial's
/// checkpoint at 2 listed. Resumed with `training_iteration = stop`, it
/// redoes steps 3 to 8 without deciding on them again. Returns the trial
/// and what the resumed run decided.
fn resumed_from_a_moment_at_8(config: Value, stop: u64) -> (Trial, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let spec = |stop: u64| RunSpec {
        metric: Some("score".into()),
        mode: Mode::Max,
        stop: StopCriteria {
            training_iteration: Some(stop),
            ..Default::default()
        },
        configs: vec![config.clone()],
        checkpoint: CheckpointPolicy {
            freq: 2,
            ..CheckpointPolicy::default()
        },
        failure: FailurePolicy {
            max_failures: Some(2),
            fail_fast: FailFast::Off,
        },
        result_order: ResultOrder::Fuel,
        ..RunSpec::new("moment", dir.path())
    };
    let fifo = || Box::new(wtune::tune::Fifo::default());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    // The run before the kill fails nowhere: its `fails_at` is spent.
    let mut once = config.clone();
    once.as_object_mut().unwrap().remove("fails_at");
    let mut first = spec(8);
    first.configs = vec![once];
    let first = Runner::new(backend(scrambled(1, 0)), first, fifo());
    let mut trials = runtime.block_on(first.run()).unwrap().trials;
    trials[0].config = config.clone();
    let trial = &mut trials[0];
    assert_eq!(trial.iterations, 8);
    trial.status = TrialStatus::Running;
    trial.checkpoints.retain(|c| c.iteration == 2);
    let moment = one_trial_moment(&trial.trial_id, 8, config["fuel"].as_u64().unwrap());
    let policy = CheckpointPolicy::default();
    let errored = wtune::tune::resume::ErroredTrials::Keep;
    let backend = backend(scrambled(1, 0));
    let moment_ref = Some(&moment);
    wtune::tune::resume::prepare_at(
        &backend,
        &mut trials,
        dir.path(),
        &policy,
        errored,
        moment_ref,
    );
    assert_eq!(trials[0].iterations, 2);
    let decided = Decided::default();
    let resumed = Runner::new(backend, spec(stop), fifo())
        .with_trials(trials)
        .continue_at(moment)
        .callback(decided.clone());
    let trial = runtime.block_on(resumed.run()).unwrap().trials.remove(0);
    let decided = decided.0.lock().unwrap().clone();
    (trial, decided)
}

#[test]
fn a_stop_tightened_on_resume_ends_a_trial_among_the_steps_it_redoes() {
    // Not redone up to 8 to stop at 9: it ends at 5.
    let (trial, decided) = resumed_from_a_moment_at_8(json!({"x": 1.0, "fuel": 10}), 5);
    assert_eq!(
        (trial.status, trial.iterations, trial.stop_reason.as_deref()),
        (
            TrialStatus::Terminated,
            5,
            Some("training_iteration reached 5")
        )
    );
    assert_eq!(decided, ["5 STOP"]);
}

#[test]
fn a_trial_that_fails_while_redoing_steps_does_not_decide_on_them_again() {
    // It fails at 5 among the steps it redoes and restarts from its
    // checkpoint at 4: steps 5 to 8 were decided before the kill.
    let config = json!({"x": 1.0, "fuel": 10, "fails_at": 5});
    let (trial, decided) = resumed_from_a_moment_at_8(config, 10);
    assert_eq!(
        (trial.status, trial.iterations),
        (TrialStatus::Terminated, 10)
    );
    assert_eq!(
        decided,
        ["4 RECOVER", "4 START", "9 CONTINUE", "10 STOP"],
        "steps decided before the kill were decided again"
    );
}

mod common;

/// A spinning thread per core while alive: another machine's timing.
struct Load(
    Arc<std::sync::atomic::AtomicBool>,
    Vec<std::thread::JoinHandle<()>>,
);

impl Load {
    fn start() -> Self {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let threads = (0..cores)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut x = 0u64;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                    }
                })
            })
            .collect();
        Self(stop, threads)
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        for thread in self.1.drain(..) {
            thread.join().unwrap();
        }
    }
}

#[test]
fn wtune_run_decides_the_same_on_a_loaded_machine_and_says_so() {
    // The replay example under ASHA with fuel as its clock, three trials at
    // a time: fuel order is on by default. Once on an idle machine, once
    // with every core busy; `wtune decisions` compares the records.
    let dir = tempfile::tempdir().unwrap();
    let example =
        std::fs::read_to_string(common::workspace().join("examples/replay/experiment.toml"))
            .unwrap();
    let space = &example[example.find("[param_space]").unwrap()..];
    let config = dir.path().join("experiment.toml");
    std::fs::write(
        &config,
        format!(
            "name = \"det\"\nmetric = \"val_loss\"\nmode = \"min\"\nnum_samples = 1\nseed = 3\n\
             max_concurrent_trials = 3\n\
             [scheduler]\ntype = \"asha\"\ntime_attr = \"fuel_total\"\ngrace_period = 2e7\n\
             max_t = 4e8\nreduction_factor = 3\n\
             [stop]\ntraining_iteration = 81\n{space}"
        ),
    )
    .unwrap();
    let run = |out: &Path| {
        let output = common::wtune()
            .arg("run")
            .arg(common::guest("replay"))
            .arg("--config")
            .arg(&config)
            .arg("--output-dir")
            .arg(out)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
    };
    let (idle, loaded) = (dir.path().join("idle"), dir.path().join("loaded"));
    run(&idle);
    {
        let _load = Load::start();
        run(&loaded);
    }
    let compared = common::wtune()
        .arg("decisions")
        .arg(&idle)
        .arg(&loaded)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&compared.stdout);
    assert!(
        compared.status.success() && said.starts_with("the same "),
        "{said}{}",
        String::from_utf8_lossy(&compared.stderr)
    );
    let record = std::fs::read_to_string(idle.join("decisions.jsonl")).unwrap();
    let records: Vec<Value> = record
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records[0]["decision"], "START");
    assert_eq!(records[0]["fuel_time"], 0);
    let stopped = records
        .iter()
        .filter(|r| r["decision"] == "STOP" && r["why"] == "stopped by the asha scheduler")
        .count();
    assert!(stopped > 0, "ASHA stopped no trial: {record}");
    let times: Vec<u64> = records
        .iter()
        .map(|r| r["fuel_time"].as_u64().unwrap())
        .collect();
    assert!(
        times.windows(2).all(|w| w[0] <= w[1]),
        "not in fuel order: {times:?}"
    );

    // A directory that decided otherwise is named with the first
    // difference, and exits 1.
    let other = dir.path().join("other");
    std::fs::create_dir(&other).unwrap();
    let mut changed = records.clone();
    changed[3]["decision"] = json!("PAUSE");
    let lines: Vec<String> = changed.iter().map(Value::to_string).collect();
    std::fs::write(other.join("decisions.jsonl"), lines.join("\n") + "\n").unwrap();
    let differ = common::wtune()
        .arg("decisions")
        .arg(&idle)
        .arg(&other)
        .output()
        .unwrap();
    assert_eq!(differ.status.code(), Some(1));
    let err = String::from_utf8_lossy(&differ.stderr);
    assert!(err.contains("differ from decision 4 on"), "{err}");

    // A record torn by a kill is no difference: it cannot be read (exit 2).
    let torn = dir.path().join("torn");
    std::fs::create_dir(&torn).unwrap();
    std::fs::write(
        torn.join("decisions.jsonl"),
        record.clone() + "{\"trial_id\":",
    )
    .unwrap();
    let unreadable = common::wtune()
        .arg("decisions")
        .arg(&idle)
        .arg(&torn)
        .output()
        .unwrap();
    assert_eq!(unreadable.status.code(), Some(2));
    let err = String::from_utf8_lossy(&unreadable.stderr);
    assert!(
        err.contains("is not a decision") && err.contains("torn last line"),
        "{err}"
    );
}

#[test]
fn a_fail_fast_halt_keeps_the_fuel_order() {
    // One trial fails for good mid-run and fail_fast halts the experiment:
    // the results the others still report are decided in the same order
    // whatever the timing, so they end (stopped or paused) alike.
    let mut configs = population(9);
    configs[0]["fails_for_good_at"] = json!(3);
    let asha = json!({"type": "asha", "time_attr": "fuel_total", "max_t": 1200,
                      "grace_period": 150, "reduction_factor": 3});
    let (outcomes, seen) = run(&configs, &asha, ResultOrder::Fuel, 3, scrambled(1, 0));
    assert!(
        outcomes.iter().any(|o| o.1 == TrialStatus::Error),
        "{outcomes:?}"
    );
    // The two trials beside it had results in flight when it failed.
    assert!(outcomes[1..3].iter().all(|o| o.2 >= 2), "{outcomes:?}");
    for seed in [2, 3] {
        let (again, seen_again) = run(&configs, &asha, ResultOrder::Fuel, 3, scrambled(seed, 12));
        assert_eq!(outcomes, again, "delays {seed}");
        assert_eq!(seen, seen_again, "delays {seed}");
    }
}

/// Runs `guest` under `config` into `out`, stopping it at pseudo-random
/// points of its first attempts, with SIGKILL or with SIGINT (Ctrl-C: the
/// run halts, checkpointing its trials), and resuming it with `wtune
/// resume` until it finishes; returns how many stops landed. The points are
/// measured in progress, not time (so that a machine slower or faster than
/// when the uninterrupted run was timed still stops each attempt midway):
/// a share of the decisions left, of the `decisions` an uninterrupted run
/// records.
fn stopped_and_resumed(guest: &str, config: &Path, out: &Path, decisions: usize, seed: u64) -> u32 {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let recorded = || {
        std::fs::read_to_string(out.join("decisions.jsonl")).map_or(0, |log| log.lines().count())
    };
    // Every attempt but the one that finishes is stopped.
    for attempt in 0..30 {
        // Killed before its first state was written, an experiment has
        // nothing to resume: it is run again.
        let mut command = if out.join("experiment_state.json").exists() {
            let mut resume = common::wtune();
            resume.arg("resume").arg(out);
            resume
        } else {
            let _ = std::fs::remove_dir_all(out);
            common::wtune_run(guest, config, out)
        };
        let mut child = command
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let (before, share) = (recorded(), rng.random_range(0.1..0.9));
        let target = if attempt < 6 {
            before + ((decisions.saturating_sub(before)) as f64 * share).ceil() as usize
        } else {
            usize::MAX
        };
        loop {
            if child.try_wait().unwrap().is_some() {
                let output = child.wait_with_output().unwrap();
                let stderr = String::from_utf8_lossy(&output.stderr);
                assert!(output.status.success(), "attempt {attempt}: {stderr}");
                assert!(
                    !stderr.contains("decisions may differ"),
                    "attempt {attempt}: {stderr}"
                );
                return attempt;
            }
            if recorded() >= target {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        if rng.random_bool(0.5) {
            let interrupted = std::process::Command::new("kill")
                .args(["-INT", &child.id().to_string()])
                .status()
                .unwrap();
            assert!(interrupted.success());
        } else {
            child.kill().unwrap(); // SIGKILL
        }
        child.wait().unwrap();
    }
    panic!("{guest} under {} never finished", config.display());
}

/// One trial's end, as `experiment.json` records it.
#[derive(Debug, PartialEq)]
struct FinalTrial {
    trial_id: String,
    status: String,
    iterations: u64,
    config: Value,
    /// The last result's metric.
    metric: Value,
    /// `(iteration, fuel_total)` of each checkpoint it lists, but those
    /// taken only for a halt: what a later exploit or resume can start
    /// from.
    checkpoints: Vec<(u64, u64)>,
}

fn final_trials(out: &Path, metric: &str) -> Vec<FinalTrial> {
    common::experiment_trials(out)
        .iter()
        .map(|t| FinalTrial {
            trial_id: t["trial_id"].as_str().unwrap().to_string(),
            status: t["status"].as_str().unwrap().to_string(),
            iterations: t["iterations"].as_u64().unwrap(),
            config: t["config"].clone(),
            metric: t["last_result"][metric].clone(),
            checkpoints: t["checkpoints"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|c| c["halt"] != Value::Bool(true))
                .map(|c| {
                    let count = |key: &str| c[key].as_u64().unwrap();
                    (count("iteration"), count("fuel_total"))
                })
                .collect(),
        })
        .collect()
}

/// A seeded experiment in fuel order, killed outright or interrupted at
/// random moments and resumed each time, makes the decisions of an
/// uninterrupted run and ends with its results. Before saved states marked
/// a moment of the run, a resume restarted every trial's clock at fuel time
/// 0 and decided again on the steps it redid, and a halt decided on the
/// steps trials finished after it: the records parted at the first stop.
fn assert_stops_and_resumes_decide_as_one_run(
    guest: &str,
    toml: &str,
    metric: &str,
    seeds: &[u64],
) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("experiment.toml");
    std::fs::write(&config, toml).unwrap();
    let clean = dir.path().join("clean");
    let output = common::wtune_run(guest, &config, &clean).output().unwrap();
    let decisions = std::fs::read_to_string(clean.join("decisions.jsonl"))
        .unwrap()
        .lines()
        .count();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let expected = final_trials(&clean, metric);
    let mut kills = 0;
    for &seed in seeds {
        let out = dir.path().join(format!("killed-{seed}"));
        kills += stopped_and_resumed(guest, &config, &out, decisions, seed);
        let compared = common::wtune()
            .arg("decisions")
            .arg(&clean)
            .arg(&out)
            .output()
            .unwrap();
        assert!(
            compared.status.success(),
            "{guest}, stops seeded {seed}: {}",
            String::from_utf8_lossy(&compared.stderr)
        );
        assert_eq!(
            final_trials(&out, metric),
            expected,
            "{guest}, stops seeded {seed}"
        );
    }
    assert!(
        kills >= seeds.len() as u32,
        "only {kills} kills landed: make the runs longer"
    );
}

/// Twelve trials of two fuel costs per step, so their results interleave
/// in fuel time; ASHA stops most of them at its rungs.
const FUEL_ASHA: &str = r#"
name = "fuel-asha"
metric = "digest"
mode = "max"
max_concurrent_trials = 2
checkpoint_freq = 2
[stop]
training_iteration = 12
[scheduler]
type = "asha"
time_attr = "fuel_total"
max_t = 2e8
grace_period = 3e7
reduction_factor = 2
[param_space]
seed = { grid_search = [1, 2, 3, 4, 5, 6] }
buffer_kib = { grid_search = [2048, 3072] }
iterations = 1000
"#;

#[test]
fn asha_in_fuel_order_decides_across_kills_interrupts_and_resumes_as_in_one_run() {
    assert_stops_and_resumes_decide_as_one_run("stateful", FUEL_ASHA, "digest", &[1, 2, 3]);
}

#[test]
fn steps_redone_after_a_kill_write_the_checkpoints_an_uninterrupted_run_wrote() {
    // Only each trial's best-scoring checkpoint (and its newest) is kept,
    // so which ones a trial ends with depends on every checkpoint and its
    // score: a stopped and resumed run must write and score them as the
    // uninterrupted run did, or a later resume or PBT clone starts from
    // another state. Steps redone after a kill write the periodic
    // checkpoints the uninterrupted run wrote; a checkpoint taken at a
    // halt before its step was decided is scored with that step's result
    // once it is (before, with the result before it, which a resume also
    // read back from the file). Each kept a worse checkpoint than the
    // uninterrupted run.
    let toml = FUEL_ASHA.replace(
        "checkpoint_freq = 2\n",
        "checkpoint_freq = 2\nkeep_checkpoints_num = 1\ncheckpoint_score_attr = \"digest\"\n",
    );
    assert_stops_and_resumes_decide_as_one_run("stateful", &toml, "digest", &[1, 2, 3, 4, 5, 6]);
}

/// How many trials held slots at the moment the saved state of `out`
/// marks (0 when it marks none).
fn slots_at_saved_moment(out: &Path) -> usize {
    wtune::report::state::load(out, false)
        .ok()
        .and_then(|state| state.unchecked().decisions.moment)
        .map_or(0, |moment| moment.clocks.len())
}

#[test]
fn a_resume_with_fewer_slots_than_its_moment_held_goes_on_and_says_so() {
    // Both slots were held at the moment the killed run saved; resumed with
    // one, the trial left without a slot must not hold back the other's
    // results for a slot only those results can free. Before, it did: the
    // resumed run waited forever.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("experiment.toml");
    std::fs::write(&config, FUEL_ASHA).unwrap();
    let out = dir.path().join("out");
    // The state may be written again between the check and the kill.
    for _ in 0..20 {
        let _ = std::fs::remove_dir_all(&out);
        let mut child = common::wtune_run("stateful", &config, &out)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        common::wait_while_running(&mut child, || slots_at_saved_moment(&out) == 2);
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        if slots_at_saved_moment(&out) == 2 {
            break;
        }
    }
    assert_eq!(slots_at_saved_moment(&out), 2);
    let mut resume = common::wtune()
        .args(["resume", "--max-concurrent", "1"])
        .arg(&out)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let began = std::time::Instant::now();
    while resume.try_wait().unwrap().is_none() {
        if began.elapsed() > Duration::from_secs(300) {
            resume.kill().unwrap();
            panic!("the resumed run with fewer slots never finished");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = resume.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("max_concurrent_trials (1) leaves no slot for 1 of the trials")
            && stderr.contains("decisions may differ"),
        "{stderr}"
    );
    let trials = final_trials(&out, "digest");
    assert_eq!(trials.len(), 12);
    assert!(
        trials.iter().all(|t| t.status == "TERMINATED"),
        "every trial ends: {trials:?}"
    );
    // The trial that found no slot starts later on a new clock, but the
    // steps decided before the kill stay decided: each result once.
    let log = std::fs::read_to_string(out.join("decisions.jsonl")).unwrap();
    let mut decided = HashSet::new();
    for line in log.lines() {
        let record: Value = serde_json::from_str(line).unwrap();
        if record["decision"] != "START" {
            let step = (record["trial_id"].clone(), record["iteration"].clone());
            assert!(decided.insert(step), "decided twice: {line}");
        }
    }
}

#[test]
fn pbt_in_fuel_order_exploits_across_kills_interrupts_and_resumes_as_in_one_run() {
    // Exploits clone checkpoints over the exploiting trial's own: a resume
    // must not continue from a clone made after the moment it resumes.
    let data = common::workspace().join("examples/digits-mlp/data");
    let toml = format!(
        r#"
name = "fuel-pbt"
metric = "val_accuracy"
mode = "max"
num_samples = 6
seed = 7
max_concurrent_trials = 2
checkpoint_freq = 2
[stop]
training_iteration = 16
[scheduler]
type = "pbt"
time_attr = "fuel_total"
perturbation_interval = 1.3e8
[scheduler.hyperparam_mutations]
lr = {{ loguniform = [0.03, 0.3] }}
[data]
digits = {data:?}
[param_space]
lr = {{ loguniform = [0.03, 0.3] }}
hidden = 32
batch_size = 64
momentum = 0.8
weight_decay = 1e-4
math = "wasm"
"#,
        data = data.display().to_string()
    );
    assert_stops_and_resumes_decide_as_one_run("digits_mlp", &toml, "val_accuracy", &[1, 2, 3]);
}

/// Every checkpoint `state` (the bytes of a saved state) lists, as
/// `wtune resume` would look for it: at its path, or moved aside by the
/// run that dropped it after the state was taken. Returns the ones missing.
fn listed_but_gone(out: &Path, state: &[u8]) -> Vec<String> {
    let state = wtune::report::state::decode(out, state)
        .unwrap()
        .unchecked();
    let mut gone = Vec::new();
    for trial in &state.trials {
        let dir = out.join(&trial.trial_id);
        for checkpoint in &trial.checkpoints {
            let path = dir.join(&checkpoint.path);
            // Looked for at its path first: the run may move it aside
            // meanwhile, never back.
            if path.exists() {
                continue;
            }
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let aside = std::fs::read_dir(path.parent().unwrap().join(".dropped"))
                .into_iter()
                .flatten()
                .any(|e| {
                    let n = e.unwrap().file_name().to_string_lossy().into_owned();
                    n.strip_prefix(&name).is_some_and(|s| s.starts_with('.'))
                });
            if !aside {
                gone.push(path.display().to_string());
            }
        }
    }
    gone
}

#[test]
fn a_saved_state_never_lists_a_checkpoint_that_is_gone() {
    // keep_checkpoints_num = 1 drops a trial's checkpoint at each new one,
    // and PBT's exploits drop the trajectories they abandon. Before dropped
    // files waited for the saved states to move past them, a kill between a
    // drop and the next state write left a state listing a file that was
    // gone: the trial redid its work from an older checkpoint.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_path_buf();
    let pbt = json!({"type": "pbt", "time_attr": "fuel_total", "perturbation_interval": 250,
                     "hyperparam_mutations": {"x": [0.5, 1.0, 1.5, 2.0, 2.5]}});
    let scheduler: SchedulerSpec = serde_json::from_value(pbt).unwrap();
    let spec = RunSpec {
        metric: Some("score".into()),
        mode: Mode::Max,
        stop: StopCriteria {
            training_iteration: Some(80),
            ..Default::default()
        },
        max_concurrent: 3,
        configs: population(6),
        checkpoint: CheckpointPolicy {
            freq: 1,
            keep_num: Some(1),
            ..CheckpointPolicy::default()
        },
        result_order: ResultOrder::Fuel,
        ..RunSpec::new("dropped", &out)
    };
    let runner = Runner::new(
        backend(scrambled(5, 3)),
        spec,
        scheduler.build(Some("score"), Mode::Max, 7).unwrap(),
    )
    .callback(StateFile::new(json!({})));
    // Watches the saved states while the run goes on: the current one and,
    // until the run ends, the previous one kept beside it. A check counts
    // only when neither file changed while their files were looked at.
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (out, done) = (out.clone(), done.clone());
        std::thread::spawn(move || {
            let read = |file: &str| std::fs::read(out.join(file)).ok();
            let (mut checks, mut gone) = (0, Vec::new());
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                let before = (
                    read("experiment_state.json"),
                    read("experiment_state.prev.json"),
                );
                let (Some(current), previous) = &before else {
                    continue;
                };
                let running = wtune::report::state::decode(&out, current)
                    .is_ok_and(|s| s.unchecked().status == "running");
                let mut missing = listed_but_gone(&out, current);
                if let (Some(previous), true) = (previous, running) {
                    missing.extend(listed_but_gone(&out, previous));
                }
                if (
                    read("experiment_state.json"),
                    read("experiment_state.prev.json"),
                ) == before
                {
                    checks += 1;
                    gone.extend(missing);
                }
            }
            (checks, gone)
        })
    };
    let summary = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(runner.run())
        .unwrap();
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let (checks, gone) = watcher.join().unwrap();
    assert!(
        checks >= 20,
        "only {checks} states checked: make the run longer"
    );
    assert_eq!(
        gone,
        Vec::<String>::new(),
        "listed by a saved state but gone"
    );
    assert!(
        summary
            .trials
            .iter()
            .zip(population(6))
            .any(|(t, c)| t.config["x"] != c["x"]),
        "no trial exploited another"
    );
    // The end deletes what waited: each trial keeps its one checkpoint.
    for trial in &summary.trials {
        let dir = trial.dir.join(CHECKPOINT_DIR);
        let names: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert_eq!(names.len(), 1, "{}: {names:?}", dir.display());
    }
}

#[test]
fn a_resume_puts_back_a_listed_checkpoint_the_killed_run_had_moved_aside() {
    // A run in fuel order, killed at a moment whose state lists the trial's
    // checkpoints at 2, 4, 6 and 8, after it dropped the one at 8 (moved
    // aside) and wrote another file under its name.
    let dir = tempfile::tempdir().unwrap();
    let config = json!({"x": 1.0, "fuel": 10});
    let spec = RunSpec {
        metric: Some("score".into()),
        mode: Mode::Max,
        stop: StopCriteria {
            training_iteration: Some(8),
            ..Default::default()
        },
        configs: vec![config],
        checkpoint: CheckpointPolicy {
            freq: 2,
            ..CheckpointPolicy::default()
        },
        result_order: ResultOrder::Fuel,
        ..RunSpec::new("put-back", dir.path())
    };
    let fifo = Box::new(wtune::tune::Fifo::default());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let first = Runner::new(backend(scrambled(1, 0)), spec, fifo);
    let mut trials = runtime.block_on(first.run()).unwrap().trials;
    let trial = &mut trials[0];
    trial.status = TrialStatus::Running;
    let listed: Vec<_> = trial.checkpoints.iter().map(|c| c.iteration).collect();
    assert_eq!(listed, [2, 4, 6, 8]);
    let at = |i: usize| trial.dir.join(&trial.checkpoints[i].path);
    let aside_dir = at(3).parent().unwrap().join(".dropped");
    std::fs::create_dir_all(&aside_dir).unwrap();
    let name = at(3).file_name().unwrap().to_string_lossy().into_owned();
    // The same name dropped twice: the first file aside is another one.
    std::fs::copy(at(0), aside_dir.join(format!("{name}.0"))).unwrap();
    std::fs::rename(at(3), aside_dir.join(format!("{name}.1"))).unwrap();
    std::fs::copy(at(2), at(3)).unwrap();
    let moment = one_trial_moment(&trial.trial_id, 8, 10);
    let plan = wtune::tune::resume::prepare_at(
        &backend(scrambled(1, 0)),
        &mut trials,
        dir.path(),
        &CheckpointPolicy::default(),
        wtune::tune::resume::ErroredTrials::Keep,
        Some(&moment),
    );
    assert_eq!(plan.continued, [(trials[0].trial_id.clone(), 8)]);
    assert_eq!(plan.damaged, []);
    assert_eq!(trials[0].iterations, 8);
    assert!(!aside_dir.exists(), "what waited aside is gone");
}
