//! `decisions`: what the scheduler and searcher cost per call with 10,000
//! trials, driven directly (no runner, no sandbox) by a loop that calls
//! them as `Runner::run` does.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};
use wtune::tune::{
    Checkpoint, Decision, Mode, Scheduler, SchedulerSpec, SearchSpace, SearchSpec, Searcher,
    Suggestion, Trial, TrialStatus,
};

/// Trials per experiment.
const TRIALS: usize = 10_000;
/// Trials live at once.
const SLOTS: usize = 16;
/// The per-trial stopping criterion (`training_iteration`), and `max_t` of
/// the schedulers that have one.
const ITERATIONS: u64 = 27;
const METRIC: &str = "val_loss";
const SEED: u64 = 7;

/// The calls timed, in table order.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Call {
    OnTrialAdd,
    OnResult,
    OnTrialComplete,
    ChooseNext,
    TakeStops,
    Suggest,
    /// `suggest` answering `Wait` (a concurrency limit reached).
    SuggestWait,
    SearchOnResult,
    SearchOnTrialComplete,
}

const CALLS: usize = 9;

/// Every call's duration, with the number of trials that existed then.
#[derive(Default)]
struct Timings {
    calls: [Vec<(u32, u32)>; CALLS],
}

impl Timings {
    fn time<T>(&mut self, call: Call, trials: usize, f: impl FnOnce() -> T) -> T {
        let started = Instant::now();
        let out = f();
        self.record(call, trials, started.elapsed());
        out
    }

    fn record(&mut self, call: Call, trials: usize, took: Duration) {
        let ns = took.as_nanos().min(u32::MAX as u128) as u32;
        self.calls[call as usize].push((trials as u32, ns));
    }

    fn stats(&self, call: Call) -> Stats {
        let samples = &self.calls[call as usize];
        let mut ns: Vec<u32> = samples.iter().map(|&(_, ns)| ns).collect();
        ns.sort_unstable();
        let total: u64 = ns.iter().map(|&n| n as u64).sum();
        let mean_where = |keep: &dyn Fn(u32) -> bool| {
            let (sum, count) = samples
                .iter()
                .filter(|(t, _)| keep(*t))
                .fold((0u64, 0u64), |(s, c), &(_, ns)| (s + ns as u64, c + 1));
            (count > 0).then(|| sum as f64 / count as f64 / 1e3)
        };
        Stats {
            count: ns.len(),
            total: Duration::from_nanos(total),
            mean_us: if ns.is_empty() {
                0.0
            } else {
                total as f64 / ns.len() as f64 / 1e3
            },
            p99_us: ns
                .get(((ns.len().max(1) - 1) as f64 * 0.99).round() as usize)
                .map_or(0.0, |&n| n as f64 / 1e3),
            early_us: mean_where(&|t| (t as usize) <= TRIALS / 10),
            late_us: mean_where(&|t| (t as usize) > TRIALS - TRIALS / 10),
        }
    }
}

struct Stats {
    count: usize,
    total: Duration,
    mean_us: f64,
    p99_us: f64,
    /// Mean while at most the first 10% of the trials existed.
    early_us: Option<f64>,
    /// Mean once the last 10% of the trials were being created.
    late_us: Option<f64>,
}

impl Stats {
    fn cell(&self) -> String {
        if self.count == 0 {
            return "-".into();
        }
        format!("{} ({})", us(self.mean_us), us(self.p99_us))
    }

    fn growth(&self) -> String {
        match (self.early_us, self.late_us) {
            (Some(early), Some(late)) => format!("{} → {}", us(early), us(late)),
            _ => "-".into(),
        }
    }
}

fn us(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

/// What one simulated experiment did.
struct Outcome {
    timings: Timings,
    results: usize,
    trials: usize,
    paused: usize,
    stopped_early: usize,
    exploits: usize,
    /// The scheduler's and searcher's `state()` at the end: bytes of JSON,
    /// and the time to build and serialize each.
    scheduler_state: (usize, Duration),
    searcher_state: (usize, Duration),
}

/// The learning curve of the simulated trials: the closed form of
/// `CurveSet::synthetic()` (`val_loss`, minimized) with a continuous `lr`,
/// a penalty for momentum away from 0.9 and seeded noise.
fn val_loss(config: &Value, t: u64, seed: u64) -> f64 {
    let lr = config["lr"].as_f64().unwrap_or(0.01);
    let width = config["width"].as_f64().unwrap_or(64.0);
    let momentum = config["momentum"].as_f64().unwrap_or(0.9);
    let s = width / 16.0;
    let floor = 0.1 + 0.24 / s.sqrt() + 0.9 * lr + 0.3 * (momentum - 0.9).powi(2);
    let rate = 40.0 * lr / s.sqrt();
    let left = (-(rate * t as f64).sqrt()).exp();
    floor + (2.3 - floor) * left + (0.003 + 0.02 * left) * noise(seed, t)
}

/// Uniform-ish noise in [-1, 1) from splitmix64.
fn noise(seed: u64, t: u64) -> f64 {
    let mut z = seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(t.wrapping_mul(0xBF58_476D_1CE4_E5B9));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 52) as f64 - 1.0
}

/// The runner's loop in miniature (see `Runner::run`): fills free slots
/// with `take_stops` + `choose_next`, else a new trial from the searcher
/// (`suggest`, `Trial::new`, `on_trial_add`, then `choose_next` again);
/// steps running trials round robin; a result that meets the stopping
/// criterion goes to `on_trial_complete`, others to `on_result`; the
/// searcher gets every result and every end.
fn simulate(scheduler: &mut dyn Scheduler, searcher: &mut dyn Searcher) -> Outcome {
    let mut timings = Timings::default();
    let mut trials: Vec<Trial> = Vec::with_capacity(TRIALS);
    let mut running: VecDeque<usize> = VecDeque::new();
    let mut search_over = false;
    let (mut results, mut paused, mut stopped_early, mut exploits) = (0, 0, 0, 0);
    // The runner's `take_stops` + `choose_next`.
    fn choose(
        timings: &mut Timings,
        scheduler: &mut dyn Scheduler,
        searcher: &mut dyn Searcher,
        trials: &mut [Trial],
    ) -> Option<usize> {
        take_stops(timings, scheduler, searcher, trials);
        let n = trials.len();
        timings.time(Call::ChooseNext, n, || scheduler.choose_next(trials))
    }
    fn take_stops(
        timings: &mut Timings,
        scheduler: &mut dyn Scheduler,
        searcher: &mut dyn Searcher,
        trials: &mut [Trial],
    ) {
        let n = trials.len();
        let stops = timings.time(Call::TakeStops, n, || scheduler.take_stops(trials));
        for i in stops {
            let trial = &mut trials[i];
            assert!(
                matches!(trial.status, TrialStatus::Pending | TrialStatus::Paused),
                "take_stops returned {} which is {}",
                trial.trial_id,
                trial.status
            );
            trial.status = TrialStatus::Terminated;
            let trial = &trials[i];
            timings.time(Call::SearchOnTrialComplete, n, || {
                searcher.on_trial_complete(&trial.trial_id, trial.last_result.as_ref(), false)
            });
        }
    }

    loop {
        while running.len() < SLOTS {
            let chosen = match choose(&mut timings, scheduler, searcher, &mut trials) {
                Some(i) => Some(i),
                None => {
                    // The runner's `create_trial`.
                    if search_over
                        || trials
                            .last()
                            .is_some_and(|t| t.status == TrialStatus::Pending)
                    {
                        None
                    } else if trials.len() >= TRIALS {
                        search_over = true;
                        scheduler.on_no_more_trials();
                        choose(&mut timings, scheduler, searcher, &mut trials)
                    } else {
                        let id = format!("trial_{:05}", trials.len());
                        let n = trials.len();
                        let asked = Instant::now();
                        let suggestion = searcher.suggest(&id);
                        let call = match suggestion {
                            Suggestion::Wait => Call::SuggestWait,
                            _ => Call::Suggest,
                        };
                        timings.record(call, n, asked.elapsed());
                        match suggestion {
                            Suggestion::Config(config) => {
                                let trial = Trial::new(id, config, "/nonexistent".into());
                                timings.time(Call::OnTrialAdd, n + 1, || {
                                    scheduler.on_trial_add(&trial)
                                });
                                trials.push(trial);
                                choose(&mut timings, scheduler, searcher, &mut trials)
                            }
                            Suggestion::Wait => None,
                            Suggestion::Finished => {
                                search_over = true;
                                scheduler.on_no_more_trials();
                                choose(&mut timings, scheduler, searcher, &mut trials)
                            }
                        }
                    }
                }
            };
            let Some(i) = chosen else { break };
            let trial = &mut trials[i];
            assert!(
                matches!(trial.status, TrialStatus::Pending | TrialStatus::Paused),
                "the {} scheduler chose {} which is {}",
                scheduler.name(),
                trial.trial_id,
                trial.status
            );
            trial.status = TrialStatus::Running;
            running.push_back(i);
        }
        take_stops(&mut timings, scheduler, searcher, &mut trials);
        let Some(i) = running.pop_front() else {
            break;
        };

        // One step of trial i, and its result record.
        let n = trials.len();
        let trial = &mut trials[i];
        trial.iterations += 1;
        trial.iterations_since_restore += 1;
        let t = trial.iterations;
        trial.fuel_total += 1_000_000;
        trial.time_total_s += 0.5;
        let loss = val_loss(&trial.config, t, i as u64);
        let mut record = Map::new();
        record.insert(METRIC.into(), json!(loss));
        record.insert("trial_id".into(), trial.trial_id.clone().into());
        record.insert("training_iteration".into(), t.into());
        record.insert("time_total_s".into(), json!(trial.time_total_s));
        record.insert("fuel_total".into(), trial.fuel_total.into());
        record.insert("done".into(), false.into());
        record.insert("config".into(), trial.config.clone());
        results += 1;

        let trial = &trials[i];
        let decision = if t >= ITERATIONS {
            timings.time(Call::OnTrialComplete, n, || {
                scheduler.on_trial_complete(trial, &record)
            });
            Decision::Stop
        } else {
            let decision = timings.time(Call::OnResult, n, || scheduler.on_result(trial, &record));
            if decision == Decision::Stop {
                stopped_early += 1;
            }
            decision
        };
        timings.time(Call::SearchOnResult, n, || {
            searcher.on_result(&trial.trial_id, &record)
        });
        trials[i].last_result = Some(record);
        match decision {
            Decision::Continue => running.push_back(i),
            Decision::Checkpoint => {
                checkpoint(&mut trials[i]);
                running.push_back(i);
            }
            Decision::Stop => {
                trials[i].status = TrialStatus::Terminated;
                let trial = &trials[i];
                timings.time(Call::SearchOnTrialComplete, n, || {
                    searcher.on_trial_complete(&trial.trial_id, trial.last_result.as_ref(), false)
                });
            }
            Decision::Pause => {
                // A pause leaves a checkpoint to continue from.
                checkpoint(&mut trials[i]);
                trials[i].status = TrialStatus::Paused;
                paused += 1;
            }
            Decision::Exploit { source, config } => {
                // Continues from a copy of the source's newest checkpoint
                // (here: its counters) with the new config; unchanged when
                // the source has none.
                if let Some(from) = trials[source].latest_checkpoint().cloned() {
                    exploits += 1;
                    let trial = &mut trials[i];
                    trial.config = config;
                    trial.iterations = from.iteration;
                    trial.fuel_total = from.fuel_total;
                    trial.time_total_s = from.time_total_s;
                    trial.iterations_since_restore = 0;
                    trial.checkpoints = vec![from];
                }
                running.push_back(i);
            }
        }
    }
    let unfinished = trials.iter().filter(|t| !t.status.is_finished()).count();
    assert_eq!(
        unfinished,
        0,
        "the {} scheduler left trials unfinished",
        scheduler.name()
    );
    Outcome {
        scheduler_state: state_cost(|| scheduler.state()),
        searcher_state: state_cost(|| searcher.state()),
        timings,
        results,
        trials: trials.len(),
        paused,
        stopped_early,
        exploits,
    }
}

/// Records a checkpoint of the trial as it is now, keeping only the
/// newest (`keep_checkpoints_num = 1`).
fn checkpoint(trial: &mut Trial) {
    trial.checkpoints = vec![Checkpoint {
        path: format!("checkpoints/checkpoint_{:06}.bin", trial.iterations).into(),
        iteration: trial.iterations,
        time_total_s: trial.time_total_s,
        fuel_total: trial.fuel_total,
        score: None,
        bytes: 0,
        halt: false,
    }];
}

/// Bytes of `state()` as JSON, and the best of 3 times to build and
/// serialize it (what the runner pays per state write).
fn state_cost(state: impl Fn() -> Value) -> (usize, Duration) {
    let mut best = Duration::MAX;
    let mut size = 0;
    for _ in 0..3 {
        let started = Instant::now();
        let bytes = serde_json::to_vec(&state()).expect("states serialize");
        best = best.min(started.elapsed());
        size = bytes.len();
    }
    (size, best)
}

fn space() -> SearchSpace {
    SearchSpace::from_json(&json!({
        "lr": {"loguniform": [1e-4, 0.3]},
        "width": {"choice": [16, 32, 64, 128]},
        "momentum": {"uniform": [0.5, 0.99]},
        "batch_size": {"choice": [16, 32, 64, 128]},
        "weight_decay": 1e-4,
    }))
    .expect("a valid space")
}

fn searcher(spec: Value, num_samples: u64) -> Box<dyn Searcher> {
    SearchSpec::from_json(&spec)
        .and_then(|s| s.build(&space(), num_samples, Some(METRIC), Mode::Min, SEED))
        .unwrap_or_else(|e| panic!("{spec}: {e}"))
}

fn scheduler(spec: &Value) -> Result<Box<dyn Scheduler>, String> {
    let spec: SchedulerSpec = serde_json::from_value(spec.clone()).map_err(|e| e.to_string())?;
    spec.build(Some(METRIC), Mode::Min, SEED)
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

fn state_cell((bytes, time): (usize, Duration)) -> String {
    format!(
        "{} / {} ms",
        wtune::sandbox::human_bytes(bytes as u64),
        ms(time)
    )
}

/// Runs every scheduler and searcher whose name contains `only` (all when
/// `None`).
pub fn run(only: Option<&str>) {
    let wanted = |name: &str| only.is_none_or(|o| name.contains(o));
    out!(
        "\n### Decision cost: {TRIALS} trials, {SLOTS} at a time, up to {ITERATIONS} iterations \
         each (no runner, no sandbox)\n"
    );
    out!(
        "Per call: mean (p99) in µs; \"first → last 10%\": mean of the costliest call while \
         the first 1,000 trials existed, and while the last 1,000 were created.\n"
    );
    out!(
        "| scheduler (random search) | results | stopped early / paused / exploits | on_result | \
         on_trial_complete | choose_next | take_stops | costliest call: first → last 10% | \
         scheduler total (s) | state() at the end: size / build + serialize |"
    );
    out!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    let asha = |variant: &str| {
        json!({"type": "asha", "time_attr": "training_iteration", "max_t": ITERATIONS,
               "grace_period": 1, "reduction_factor": 3, "variant": variant})
    };
    let schedulers: Vec<(&str, Value)> = vec![
        ("fifo", json!({"type": "fifo"})),
        ("asha (stopping)", asha("stopping")),
        ("asha (promotion)", asha("promotion")),
        (
            "hyperband",
            json!({"type": "hyperband", "time_attr": "training_iteration",
                   "max_t": ITERATIONS, "reduction_factor": 3}),
        ),
        (
            "median_stopping",
            json!({"type": "median_stopping", "time_attr": "training_iteration",
                   "grace_period": 3, "min_samples_required": 3}),
        ),
        (
            "pbt",
            json!({"type": "pbt", "time_attr": "training_iteration",
                   "perturbation_interval": 3,
                   "hyperparam_mutations": {"lr": {"loguniform": [1e-4, 0.3]},
                                            "momentum": {"uniform": [0.5, 0.99]}}}),
        ),
    ];
    // A scheduler this build does not know (or that refuses the
    // parameters) is listed below the table instead.
    let mut missing = Vec::new();
    for (name, spec) in schedulers {
        if !wanted(name) {
            continue;
        }
        let mut scheduler = match scheduler(&spec) {
            Ok(built) => built,
            Err(why) => {
                missing.push(format!("{name}: {why}"));
                continue;
            }
        };
        let mut search = searcher(json!("random"), TRIALS as u64);
        let out = simulate(scheduler.as_mut(), search.as_mut());
        let t = &out.timings;
        let calls = [
            Call::OnTrialAdd,
            Call::OnResult,
            Call::OnTrialComplete,
            Call::ChooseNext,
            Call::TakeStops,
        ];
        let total: Duration = calls.iter().map(|&c| t.stats(c).total).sum();
        let costliest = calls
            .iter()
            .map(|&c| (c, t.stats(c)))
            .max_by_key(|(_, s)| s.total)
            .expect("calls");
        out!(
            "| {name} | {} | {} / {} / {} | {} | {} | {} | {} | {} {} | {:.2} | {} |",
            out.results,
            out.stopped_early,
            out.paused,
            out.exploits,
            t.stats(Call::OnResult).cell(),
            t.stats(Call::OnTrialComplete).cell(),
            t.stats(Call::ChooseNext).cell(),
            t.stats(Call::TakeStops).cell(),
            call_name(costliest.0),
            costliest.1.growth(),
            total.as_secs_f64(),
            state_cell(out.scheduler_state),
        );
        assert_eq!(out.trials, TRIALS);
    }
    for line in &missing {
        out!("\n(not measured: {line})");
    }

    out!(
        "\n| searcher (FIFO) | suggest | suggest: first → last 10% | suggest answering Wait: \
         calls, mean (p99) | on_result | on_trial_complete | searcher total (s) | state() at \
         the end: size / build + serialize |"
    );
    out!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    let searchers = [
        ("random", json!("random"), TRIALS as u64),
        (
            "grid (points = 10)",
            json!({"type": "grid", "points": 10}),
            7,
        ),
        ("tpe", json!("tpe"), TRIALS as u64),
        (
            "random + ConcurrencyLimiter(8)",
            json!({"type": "random", "max_concurrent": 8}),
            TRIALS as u64,
        ),
        (
            "tpe + ConcurrencyLimiter(8)",
            json!({"type": "tpe", "max_concurrent": 8}),
            TRIALS as u64,
        ),
    ];
    for (name, spec, num_samples) in searchers {
        if !wanted(name) {
            continue;
        }
        let mut search = searcher(spec, num_samples);
        let mut fifo = scheduler(&json!({"type": "fifo"})).expect("fifo");
        let out = simulate(fifo.as_mut(), search.as_mut());
        let t = &out.timings;
        let calls = [
            Call::Suggest,
            Call::SuggestWait,
            Call::SearchOnResult,
            Call::SearchOnTrialComplete,
        ];
        let total: Duration = calls.iter().map(|&c| t.stats(c).total).sum();
        let wait = t.stats(Call::SuggestWait);
        out!(
            "| {name} | {} | {} | {} | {} | {} | {:.2} | {} |",
            t.stats(Call::Suggest).cell(),
            t.stats(Call::Suggest).growth(),
            if wait.count == 0 {
                "-".to_string()
            } else {
                format!("{}, {}", wait.count, wait.cell())
            },
            t.stats(Call::SearchOnResult).cell(),
            t.stats(Call::SearchOnTrialComplete).cell(),
            total.as_secs_f64(),
            state_cell(out.searcher_state),
        );
    }
}

fn call_name(call: Call) -> &'static str {
    match call {
        Call::OnTrialAdd => "on_trial_add",
        Call::OnResult => "on_result",
        Call::OnTrialComplete => "on_trial_complete",
        Call::ChooseNext => "choose_next",
        Call::TakeStops => "take_stops",
        Call::Suggest => "suggest",
        Call::SuggestWait => "suggest (Wait)",
        Call::SearchOnResult => "on_result",
        Call::SearchOnTrialComplete => "on_trial_complete",
    }
}
