//! Population based training end to end: the runner with the PBT scheduler
//! and stateful plain-Rust trainables (`FnBackend::stateful`), against
//! random search at equal budget.
//!
//! The problem is the toy of the PBT paper (Jaderberg et al. 2017, Figure
//! 2): maximize Q(theta) = 1.2 - |theta|^2 from theta = (0.9, 0.9) by
//! gradient steps on a surrogate 1.2 - (h0 theta0^2 + h1 theta1^2) whose
//! weights `h` are one-hot, so a trial with a fixed `h` only ever brings
//! one coordinate down and ends at Q <= 1.2 - 0.81 = 0.39, whatever its
//! learning rate. A population that clones the best trial's theta and
//! switches `h` brings both down: the best `h` changes during training,
//! which is what PBT is for.
//!
//! Equal budget: each experiment gets `POPULATION * ITERATIONS` gradient
//! updates in all, counted by an atomic counter the step functions share.
//! Random search trains each of its trials `ITERATIONS` times. PBT's trials
//! jump back or forward when they clone a checkpoint, so instead of a
//! per-trial limit they train until the shared budget is spent (a step
//! without budget ends its trial). Both spend exactly the budget.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use wtune::tune::space::SearchSpace;
use wtune::tune::{
    ExperimentStop, ExperimentSummary, Fifo, FnBackend, Mode, PoolSpec, RunSpec, Runner, Scheduler,
    SchedulerSpec, StatefulStep, Step, StopCriteria, TrialFailure, TrialStatus,
};

const POPULATION: usize = 8;
const ITERATIONS: u64 = 40;
const SEEDS: u64 = 5;
/// What every step takes: equal steps keep the population roughly in step,
/// as trials of one model on equal hardware are, instead of letting the
/// trials that never checkpoint race ahead of those that do.
const STEP_TIME: Duration = Duration::from_millis(2);

/// Gradient updates shared by a whole experiment: at most `limit`, so
/// that a population whose trials step back to an older checkpoint when
/// they clone one trains no more in all than random search does.
struct Budget {
    used: AtomicU64,
    limit: u64,
}

impl Budget {
    fn new(limit: u64) -> Arc<Self> {
        Arc::new(Self {
            used: AtomicU64::new(0),
            limit,
        })
    }

    /// One update, if any are left.
    fn take(&self) -> bool {
        self.used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |u| {
                (u < self.limit).then_some(u + 1)
            })
            .is_ok()
    }

    fn used(&self) -> u64 {
        self.used.load(Ordering::SeqCst)
    }
}

/// One trial of the toy: theta is its model, the state its checkpoints
/// carry; `h` and `lr` come from the config.
struct Toy {
    theta: [f64; 2],
    h: [f64; 2],
    lr: f64,
    budget: Arc<Budget>,
}

impl StatefulStep for Toy {
    fn step(&mut self, _iteration: u64) -> Result<Step, TrialFailure> {
        std::thread::sleep(STEP_TIME);
        let granted = self.budget.take();
        if granted {
            for k in 0..2 {
                self.theta[k] -= self.lr * 2.0 * self.h[k] * self.theta[k];
            }
        }
        let q = 1.2 - self.theta[0].powi(2) - self.theta[1].powi(2);
        Ok(Step {
            metrics: vec![("q".into(), q)],
            // The experiment's budget is spent: the trial ends here.
            done: !granted,
            fuel: 1,
        })
    }

    fn state(&self) -> Value {
        json!({ "theta": self.theta })
    }
}

fn toy(budget: Arc<Budget>) -> FnBackend {
    FnBackend::stateful(move |config: &Value, state: Option<&Value>| {
        let number = |v: &Value| {
            v.as_f64()
                .ok_or_else(|| TrialFailure::permanent(format!("not a number: {v}")))
        };
        let theta = match state {
            Some(state) => [number(&state["theta"][0])?, number(&state["theta"][1])?],
            None => [0.9, 0.9],
        };
        Ok(Toy {
            theta,
            h: [number(&config["h"][0])?, number(&config["h"][1])?],
            lr: number(&config["lr"])?,
            budget: budget.clone(),
        })
    })
}

/// The initial population: one-hot `h`, log-uniform learning rates.
fn population(seed: u64) -> Vec<Value> {
    SearchSpace::from_json(&json!({
        "h": {"choice": [[1.0, 0.0], [0.0, 1.0]]},
        "lr": {"loguniform": [0.01, 0.2]},
    }))
    .unwrap()
    .generate(POPULATION as u64, seed)
    .unwrap()
}

/// PBT as an experiment file asks for it: `[scheduler]` with `type =
/// "pbt"`, defaults but for the mutations.
fn pbt(seed: u64) -> Box<dyn Scheduler> {
    let spec: SchedulerSpec = serde_json::from_value(json!({
        "type": "pbt",
        "hyperparam_mutations": {
            "h": [[1.0, 0.0], [0.0, 1.0]],
            "lr": {"loguniform": [0.01, 0.2]},
        },
    }))
    .unwrap();
    assert!(!spec.ends_trials());
    spec.build(Some("q"), Mode::Max, seed).unwrap()
}

/// The population of `seed`, all at once, sharing the budget of updates;
/// `iterations`, when given, also ends each trial there.
fn run(
    dir: &Path,
    seed: u64,
    scheduler: Box<dyn Scheduler>,
    iterations: Option<u64>,
) -> (ExperimentSummary, Arc<Budget>) {
    let budget = Budget::new(POPULATION as u64 * ITERATIONS);
    let spec = RunSpec {
        metric: Some("q".into()),
        mode: Mode::Max,
        stop: StopCriteria {
            training_iteration: iterations,
            ..Default::default()
        },
        max_concurrent: POPULATION,
        configs: population(seed),
        // A CPU per trial, however many the machine has: the population
        // trains side by side.
        resources: PoolSpec {
            cpu: Some(POPULATION as f64),
            ..Default::default()
        },
        ..RunSpec::new("pbt", dir.to_path_buf())
    };
    let runner = Runner::new(toy(budget.clone()), spec, scheduler);
    let summary = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(runner.run())
        .unwrap();
    (summary, budget)
}

/// The best final objective among the experiment's trials.
fn best(summary: &ExperimentSummary) -> f64 {
    summary
        .trials
        .iter()
        .filter_map(|t| t.metric("q"))
        .fold(f64::MIN, f64::max)
}

/// Checkpoint files in a trial's directory that another trial wrote: the
/// copies its exploits cloned.
fn clones(dir: &Path, trial_id: &str) -> usize {
    let Ok(entries) = std::fs::read_dir(dir.join(wtune::tune::CHECKPOINT_DIR)) else {
        return 0;
    };
    entries
        .filter_map(|e| std::fs::read(e.ok()?.path()).ok())
        .filter_map(|bytes| serde_json::from_slice::<Value>(&bytes).ok())
        .filter(|c| c["trial_id"] != trial_id && c.get("state").is_some())
        .count()
}

#[test]
fn pbt_beats_random_search_at_equal_budget() {
    let budget = POPULATION as u64 * ITERATIONS;
    let mut gains = Vec::new();
    for seed in 0..SEEDS {
        let random_dir = tempfile::tempdir().unwrap();
        let (random, random_used) = run(
            random_dir.path(),
            seed,
            Box::new(Fifo::default()),
            Some(ITERATIONS),
        );
        let pbt_dir = tempfile::tempdir().unwrap();
        let (pbt, pbt_used) = run(pbt_dir.path(), seed, pbt(seed), None);
        assert_eq!(
            (random_used.used(), pbt_used.used()),
            (budget, budget),
            "seed {seed}: both spend the whole budget"
        );

        let (random_best, pbt_best) = (best(&random), best(&pbt));
        eprintln!("seed {seed}: random search {random_best:.4}, pbt {pbt_best:.4}");
        assert!(
            random_best <= 1.2 - 0.81 + 1e-9,
            "seed {seed}: a fixed one-hot h cannot pass 0.39, got {random_best}"
        );
        gains.push(pbt_best - random_best);

        // Exploits happened: configs moved away from where they started,
        // and the runner copied other trials' checkpoints, state included,
        // into the exploiting trials' directories.
        let changed = pbt
            .trials
            .iter()
            .zip(population(seed))
            .filter(|(t, initial)| t.config != *initial)
            .count();
        assert!(changed > 0, "seed {seed}: no trial's config changed");
        let cloned: usize = pbt.trials.iter().map(|t| clones(&t.dir, &t.trial_id)).sum();
        assert!(cloned > 0, "seed {seed}: no cloned checkpoint on disk");
    }
    let mean = gains.iter().sum::<f64>() / gains.len() as f64;
    let worst = gains.iter().copied().fold(f64::MAX, f64::min);
    eprintln!("pbt - random search: mean {mean:.4}, worst {worst:.4}");
    // Random search is capped at 0.39; the population gets most of the way
    // to 1.2 (measured over repeated runs: mean gain 0.78 to 0.80, the
    // worst seed's 0.69 to 0.75). Thread timing orders the results, so the
    // bounds leave room.
    assert!(mean > 0.5, "pbt's gains over random search: {gains:?}");
    assert!(worst > 0.3, "pbt's gains over random search: {gains:?}");
}

/// Counts its steps; the count is the state a clone takes over. Trial
/// `slow`'s checkpoint is written only after trial `fast` has reached its
/// exploit, and `fast` reaches it only once that checkpoint has begun (or
/// after a second each), so the exploit finds the save in flight: results
/// that simply continue do not wait for the runner's loop, so `fast` could
/// otherwise reach its exploit before `slow` has a first result.
struct Counter {
    count: u64,
    slow: bool,
    fast_at_exploit: Arc<AtomicU64>,
    slow_saving: Arc<AtomicU64>,
    /// How long `slow`'s save takes once `fast` is at its exploit.
    save_delay: Duration,
}

/// Waits for `flag` to be set, for a second at most.
fn wait_for(flag: &AtomicU64) {
    let since = std::time::Instant::now();
    while flag.load(Ordering::SeqCst) == 0 && since.elapsed() < Duration::from_secs(1) {
        std::thread::sleep(Duration::from_millis(1));
    }
}

impl StatefulStep for Counter {
    fn step(&mut self, _iteration: u64) -> Result<Step, TrialFailure> {
        self.count += 1;
        if !self.slow && self.count == 3 {
            self.fast_at_exploit.store(1, Ordering::SeqCst);
            wait_for(&self.slow_saving);
        }
        Ok(Step {
            metrics: vec![("count".into(), self.count as f64)],
            done: false,
            fuel: 1,
        })
    }

    fn state(&self) -> Value {
        if self.slow {
            self.slow_saving.store(1, Ordering::SeqCst);
            wait_for(&self.fast_at_exploit);
            // Time for the runner to handle the fast trial's result.
            std::thread::sleep(self.save_delay);
        }
        json!({"count": self.count})
    }
}

/// `trial_0000` checkpoints at iteration 1; `trial_0001` clones it at its
/// iteration 3, once.
struct CloneWhileSaving {
    exploited: bool,
}

impl Scheduler for CloneWhileSaving {
    fn on_result(
        &mut self,
        trial: &wtune::tune::Trial,
        _: &serde_json::Map<String, Value>,
    ) -> wtune::tune::Decision {
        use wtune::tune::Decision;
        match (trial.trial_id.as_str(), trial.iterations) {
            ("trial_0000", 1) => Decision::Checkpoint,
            ("trial_0001", 3) if !std::mem::replace(&mut self.exploited, true) => {
                Decision::Exploit {
                    source: 0,
                    config: json!({"slow": false, "cloned": true}),
                }
            }
            _ => Decision::Continue,
        }
    }

    fn choose_next(&mut self, trials: &[wtune::tune::Trial]) -> Option<usize> {
        Fifo::default().choose_next(trials)
    }

    fn name(&self) -> &'static str {
        "clone-while-saving"
    }
}

/// What [`clone_while_saving`] saw: whether `fast` reached its exploit,
/// and how many sessions were launched.
struct Counted {
    at_exploit: u64,
    launches: u64,
}

/// Runs `slow` and `fast` [`Counter`]s for 5 iterations under
/// [`CloneWhileSaving`], `slow`'s save taking `save_delay` once `fast` is
/// at its exploit.
fn clone_while_saving(
    name: &str,
    save_delay: Duration,
    stop_experiment: ExperimentStop,
) -> (ExperimentSummary, Counted) {
    let at_exploit = Arc::new(AtomicU64::new(0));
    let saving = Arc::new(AtomicU64::new(0));
    let launches = Arc::new(AtomicU64::new(0));
    let (flag, counted) = (at_exploit.clone(), launches.clone());
    let backend = FnBackend::stateful(move |config: &Value, state: Option<&Value>| {
        counted.fetch_add(1, Ordering::SeqCst);
        Ok(Counter {
            count: state.and_then(|s| s["count"].as_u64()).unwrap_or(0),
            slow: config["slow"].as_bool().unwrap_or(false),
            fast_at_exploit: flag.clone(),
            slow_saving: saving.clone(),
            save_delay,
        })
    });
    let out = tempfile::tempdir().unwrap();
    let spec = RunSpec {
        metric: Some("count".into()),
        mode: Mode::Max,
        stop: StopCriteria {
            training_iteration: Some(5),
            ..Default::default()
        },
        stop_experiment,
        max_concurrent: 2,
        configs: vec![json!({"slow": true}), json!({"slow": false})],
        ..RunSpec::new(name, out.path().to_path_buf())
    };
    let runner = Runner::new(
        backend,
        spec,
        Box::new(CloneWhileSaving { exploited: false }),
    );
    let summary = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(runner.run())
        .unwrap();
    let counted = Counted {
        at_exploit: at_exploit.load(Ordering::SeqCst),
        launches: launches.load(Ordering::SeqCst),
    };
    (summary, counted)
}

/// An exploit whose source is still writing its checkpoint waits for it
/// (as Ray Tune does) instead of cloning an older one, or, as here, finding
/// none and not cloning at all.
#[test]
fn an_exploit_waits_for_the_source_checkpoint_in_flight() {
    let (summary, counted) = clone_while_saving(
        "clone-while-saving",
        Duration::from_millis(100),
        ExperimentStop::default(),
    );
    assert_eq!(counted.at_exploit, 1);
    let clone = &summary.trials[1];
    assert_eq!(clone.config, json!({"slow": false, "cloned": true}));
    // From trial_0000's checkpoint at iteration 1 (count 1), it steps to
    // iteration 5: count 5, and one checkpoint, the clone's.
    assert_eq!(clone.iterations, 5);
    assert_eq!(clone.metric("count"), Some(5.0));
    let cloned: Vec<u64> = clone.checkpoints.iter().map(|c| c.iteration).collect();
    assert_eq!(cloned, [1]);
}

/// An exploit still waiting for its source's checkpoint when the experiment
/// stopper fires ends with the experiment, TERMINATED on its own
/// trajectory, instead of being relaunched from the clone only to be
/// stopped.
#[test]
fn an_exploit_waiting_when_the_experiment_stops_ends_without_relaunching() {
    // The save takes well past `max_time`: the stopper fires while the
    // exploit waits.
    let stop = ExperimentStop {
        max_time: Some(0.5),
        ..Default::default()
    };
    let (summary, counted) =
        clone_while_saving("stop-while-parked", Duration::from_millis(1500), stop);
    assert!(summary.stopped.is_some(), "the stopper fired");
    assert_eq!(counted.at_exploit, 1, "fast reached its exploit");
    let parked = &summary.trials[1];
    assert_eq!(parked.status, TrialStatus::Terminated);
    assert_eq!(parked.config, json!({"slow": false}), "not cloned");
    assert_eq!(parked.iterations, 3);
    assert!(
        parked
            .stop_reason
            .as_deref()
            .is_some_and(|r| r.starts_with("the experiment stopped")),
        "{:?}",
        parked.stop_reason
    );
    assert_eq!(counted.launches, 2, "no relaunch from the clone");
}

/// Sets `flag`, for a [`Racer`] that waits on it.
fn raise(flag: &AtomicU64) {
    flag.store(1, Ordering::SeqCst);
}

/// Waits for `flag` without sleeping, for a second at most: a racer
/// waiting this way reaches the runner's lock within microseconds of the
/// flag, before the loop's task has been woken.
fn spin_for(flag: &AtomicU64) {
    let since = std::time::Instant::now();
    while flag.load(Ordering::SeqCst) == 0 && since.elapsed() < Duration::from_secs(1) {
        std::hint::spin_loop();
    }
}

/// Flags two [`Racer`]s and their scheduler share.
#[derive(Default)]
struct RaceFlags {
    /// The source is in its last step.
    source_ending: AtomicU64,
    /// The scheduler has decided the exploit.
    decided: AtomicU64,
}

/// Counts its steps, as [`Counter`]. The source's last step (its 4th)
/// waits until the recipient's exploit is decided, so that it settles
/// right after the decision, before the loop carries the exploit out; the
/// recipient's 2nd step waits until the source is in its last one.
struct Racer {
    count: u64,
    source: bool,
    flags: Arc<RaceFlags>,
}

impl StatefulStep for Racer {
    fn step(&mut self, _iteration: u64) -> Result<Step, TrialFailure> {
        self.count += 1;
        match (self.source, self.count) {
            (true, 4) => {
                raise(&self.flags.source_ending);
                spin_for(&self.flags.decided);
            }
            (false, 2) => spin_for(&self.flags.source_ending),
            _ => {}
        }
        Ok(Step {
            metrics: vec![("count".into(), self.count as f64)],
            done: false,
            fuel: 1,
        })
    }

    fn state(&self) -> Value {
        json!({"count": self.count})
    }
}

/// `trial_0001` clones `trial_0000` at its own iteration 2, once; the
/// decision raises `decided`.
struct ExploitOnce {
    flags: Arc<RaceFlags>,
    exploited: bool,
}

impl Scheduler for ExploitOnce {
    fn on_result(
        &mut self,
        trial: &wtune::tune::Trial,
        _: &serde_json::Map<String, Value>,
    ) -> wtune::tune::Decision {
        use wtune::tune::Decision;
        if trial.trial_id == "trial_0001"
            && trial.iterations == 2
            && !std::mem::replace(&mut self.exploited, true)
        {
            raise(&self.flags.decided);
            return Decision::Exploit {
                source: 0,
                config: json!({"source": false, "cloned": true}),
            };
        }
        Decision::Continue
    }

    fn choose_next(&mut self, trials: &[wtune::tune::Trial]) -> Option<usize> {
        Fifo::default().choose_next(trials)
    }

    fn name(&self) -> &'static str {
        "exploit-once"
    }
}

/// Runs a source and a recipient [`Racer`] to 4 iterations each, with a
/// checkpoint every 2, under [`ExploitOnce`]: the recipient's clone,
/// found in `runs` runs.
fn race(runs: usize, max_concurrent: usize) -> Vec<ExperimentSummary> {
    (0..runs)
        .map(|_| {
            let flags = Arc::new(RaceFlags::default());
            let shared = flags.clone();
            let backend = FnBackend::stateful(move |config: &Value, state: Option<&Value>| {
                Ok(Racer {
                    count: state.and_then(|s| s["count"].as_u64()).unwrap_or(0),
                    source: config["source"].as_bool().unwrap_or(false),
                    flags: shared.clone(),
                })
            });
            let out = tempfile::tempdir().unwrap();
            let spec = RunSpec {
                metric: Some("count".into()),
                mode: Mode::Max,
                stop: StopCriteria {
                    training_iteration: Some(4),
                    ..Default::default()
                },
                checkpoint: wtune::tune::CheckpointPolicy {
                    freq: 2,
                    ..Default::default()
                },
                max_concurrent,
                configs: vec![json!({"source": true}), json!({"source": false})],
                ..RunSpec::new("race", out.path().to_path_buf())
            };
            let scheduler = ExploitOnce {
                flags,
                exploited: false,
            };
            let runner = Runner::new(backend, spec, Box::new(scheduler));
            tokio::runtime::Runtime::new()
                .unwrap()
                .block_on(runner.run())
                .unwrap()
        })
        .collect()
}

/// An exploit clones the checkpoint its source had when the scheduler
/// ranked it, not one the source took while the exploit waited for the
/// loop. Here the source ends (at iteration 4, checkpointed) between the
/// decision and the clone: cloning that checkpoint took the recipient to
/// iteration 5, past `stop.training_iteration = 4`.
#[test]
fn an_exploit_clones_the_checkpoint_its_source_was_ranked_at() {
    for (run, summary) in race(5, 2).iter().enumerate() {
        let recipient = &summary.trials[1];
        assert_eq!(recipient.config["cloned"], true, "run {run}");
        assert_eq!(recipient.status, TrialStatus::Terminated, "run {run}");
        assert_eq!(recipient.iterations, 4, "run {run}: {recipient:?}");
        // From the source's checkpoint at 2 (count 2), two more steps.
        assert_eq!(recipient.metric("count"), Some(4.0), "run {run}");
        let cloned: Vec<u64> = recipient.checkpoints.iter().map(|c| c.iteration).collect();
        assert_eq!(cloned[0], 2, "run {run}: {cloned:?}");
    }
}

/// A scheduler may ask to clone a trial that has ended; the checkpoint it
/// ended at is not cloned (training on from it would go past the stopping
/// criteria that ended it), and the recipient goes on with its own.
#[test]
fn no_exploit_clones_the_checkpoint_its_source_ended_at() {
    // One at a time: the source has ended (checkpointed at 4) before the
    // recipient starts.
    let summary = race(1, 1).pop().unwrap();
    let (source, recipient) = (&summary.trials[0], &summary.trials[1]);
    assert_eq!(source.iterations, 4);
    assert_eq!(recipient.status, TrialStatus::Terminated);
    assert_eq!(recipient.config, json!({"source": false}), "not cloned");
    assert_eq!(recipient.iterations, 4, "{recipient:?}");
    assert_eq!(recipient.metric("count"), Some(4.0));
}
