//! `compare`: ASHA against random search (FIFO) at equal total fuel
//! (`stop_experiment.max_fuel`), on the digits example in the sandbox and
//! on the native replay of `CurveSet::synthetic()`, whose optimum is known.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};
use wtune::config::{self, Overrides};
use wtune::exec::WasmBackend;
use wtune::sandbox::{Program, fuel_text};
use wtune::tune::replay::Sampling;
use wtune::tune::{
    Callback, CurveSet, Fifo, Mode, RunSpec, Runner, Scheduler, SchedulerSpec, SearchSpace,
    SearchSpec, Trial, TrialBackend, replay_backend,
};

/// The best result any trial reported, whatever happened to it later.
#[derive(Clone, Default)]
struct Best(Arc<Mutex<Option<Reached>>>);

#[derive(Clone)]
struct Reached {
    value: f64,
    trial_id: String,
    config: Value,
    iteration: u64,
}

struct Tracker {
    best: Best,
    metric: String,
    mode: Mode,
}

impl Callback for Tracker {
    fn on_result(
        &mut self,
        trials: &[Trial],
        index: usize,
        result: &Map<String, Value>,
    ) -> Result<(), String> {
        let Some(value) = result.get(&self.metric).and_then(Value::as_f64) else {
            return Ok(());
        };
        let mut best = self.best.0.lock().expect("not poisoned");
        if best
            .as_ref()
            .is_none_or(|b| self.mode.better(value, b.value))
        {
            let trial = &trials[index];
            *best = Some(Reached {
                value,
                trial_id: trial.trial_id.clone(),
                config: trial.config.clone(),
                iteration: trial.iterations,
            });
        }
        Ok(())
    }
}

/// What one experiment did.
struct Run {
    best: Reached,
    /// The best trial by its last result, as `wtune run` reports it.
    best_final: f64,
    trials: usize,
    /// Trials that trained the full `max_t` iterations.
    full: usize,
    fuel: u64,
    wall: Duration,
    stopped: Option<String>,
}

fn run_one<B: TrialBackend>(
    runtime: &tokio::runtime::Runtime,
    backend: B,
    spec: RunSpec,
    scheduler: Box<dyn Scheduler>,
    searcher: Box<dyn wtune::tune::Searcher>,
    max_t: u64,
) -> Run {
    let best = Best::default();
    let metric = spec.metric.clone().expect("a metric");
    let tracker = Tracker {
        best: best.clone(),
        metric: metric.clone(),
        mode: spec.mode,
    };
    let runner = Runner::new(backend, spec, scheduler)
        .searcher(searcher)
        .callback(tracker);
    let started = Instant::now();
    let summary = runtime.block_on(runner.run()).expect("the experiment runs");
    let wall = started.elapsed();
    let reached = best.0.lock().expect("not poisoned").clone();
    Run {
        best: reached.expect("some trial reported the metric"),
        best_final: summary
            .best_trial()
            .and_then(|t| t.metric(&metric))
            .unwrap_or(f64::NAN),
        trials: summary.trials.len(),
        full: summary
            .trials
            .iter()
            .filter(|t| t.iterations >= max_t)
            .count(),
        fuel: summary.trials.iter().map(|t| t.fuel_total).sum(),
        wall,
        stopped: summary.stopped,
    }
}

fn asha(max_t: u64, grace: u64) -> SchedulerSpec {
    serde_json::from_value(json!({
        "type": "asha", "time_attr": "training_iteration", "max_t": max_t,
        "grace_period": grace, "reduction_factor": 3,
    }))
    .expect("a valid ASHA spec")
}

/// The digits example: `examples/digits-mlp/experiment.toml` as `wtune run`
/// plans it, with checkpoints off and `max_fuel` set.
pub fn digits(root: &Path, program: &Program) {
    /// Seeds compared.
    const SEEDS: [u64; 10] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10];
    /// The budget, in full 15-iteration trials of the example's average
    /// configuration.
    const FULL_TRIALS: u64 = 12;
    let experiment = root.join("examples/digits-mlp/experiment.toml");
    let model = root.join("target/wasm32-wasip2/release/digits_mlp.wasm");
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let plan_for = |seed: u64, out: &Path| {
        let overrides = Overrides {
            seed: Some(seed),
            num_samples: Some(100),
            output_dir: Some(out.to_path_buf()),
            ..Default::default()
        };
        config::plan(&model, Some(&experiment), &overrides).expect("the example's plan")
    };

    // The fuel of one full trial, averaged over the first PROBE trials of
    // another seed, so that the budget means "FULL_TRIALS trials".
    const PROBE: usize = 12;
    let probe = {
        let dir = crate::scratch();
        let plan = plan_for(99, &dir.path().join("out"));
        let max_t = plan
            .spec
            .stop
            .training_iteration
            .expect("the example stops");
        let mut spec = plan.spec.clone();
        spec.checkpoint = Default::default();
        spec.stop_experiment.max_trials = Some(PROBE);
        let backend = WasmBackend::new(program.clone(), plan.limits.clone(), plan.data.clone());
        let run = run_one(
            &runtime,
            backend,
            spec,
            Box::new(Fifo::default()),
            plan.searcher().expect("a searcher"),
            max_t,
        );
        assert_eq!(run.full, PROBE, "every probe trial runs to the end");
        (run.fuel / PROBE as u64, max_t)
    };
    let (per_trial, max_t) = probe;
    let budget = per_trial * FULL_TRIALS;
    out!(
        "\n### ASHA vs random search at equal fuel: digits example in the sandbox \
         ({} fuel = {FULL_TRIALS} x {} for a full {max_t}-iteration trial, mean of {PROBE} of seed 99)\n",
        fuel_text(budget),
        fuel_text(per_trial)
    );
    out!(
        "Each cell: random search (FIFO) / ASHA (grace 1, rf 3, max_t {max_t}); both draw the \
         same configurations in the same order (random search, the seed's draws).\n"
    );
    out!(
        "| seed | best val_accuracy reached (trial, iteration) | best trial's last val_accuracy \
         | trials started (run to {max_t}) | fuel used | wall (s) |"
    );
    out!("| --- | --- | --- | --- | --- | --- |");
    let mut fifo_runs = Vec::new();
    let mut asha_runs = Vec::new();
    for seed in SEEDS {
        let mut pair = Vec::new();
        for name in ["fifo", "asha"] {
            let dir = crate::scratch();
            let plan = plan_for(seed, &dir.path().join("out"));
            let mut spec = plan.spec.clone();
            spec.checkpoint = Default::default();
            spec.stop_experiment.max_fuel = Some(budget);
            let metric = spec.metric.clone();
            let scheduler = match name {
                "fifo" => Box::new(Fifo::default()) as Box<dyn Scheduler>,
                _ => asha(max_t, 1)
                    .build(metric.as_deref(), spec.mode, seed)
                    .expect("asha"),
            };
            let backend = WasmBackend::new(program.clone(), plan.limits.clone(), plan.data.clone());
            let run = run_one(
                &runtime,
                backend,
                spec,
                scheduler,
                plan.searcher().expect("a searcher"),
                max_t,
            );
            assert!(
                run.stopped.is_some(),
                "the {name} run ended before its budget: raise num_samples"
            );
            pair.push(run);
        }
        let (fifo, asha) = (&pair[0], &pair[1]);
        out!(
            "| {seed} | {:.4} ({}, {}) / {:.4} ({}, {}) | {:.4} / {:.4} | {} ({}) / {} ({}) | {} / {} \
             | {:.1} / {:.1} |",
            fifo.best.value,
            fifo.best.trial_id,
            fifo.best.iteration,
            asha.best.value,
            asha.best.trial_id,
            asha.best.iteration,
            fifo.best_final,
            asha.best_final,
            fifo.trials,
            fifo.full,
            asha.trials,
            asha.full,
            fuel_text(fifo.fuel),
            fuel_text(asha.fuel),
            fifo.wall.as_secs_f64(),
            asha.wall.as_secs_f64()
        );
        let mut pair = pair.into_iter();
        fifo_runs.extend(pair.next());
        asha_runs.extend(pair.next());
    }
    let mean =
        |runs: &[Run], f: &dyn Fn(&Run) -> f64| runs.iter().map(f).sum::<f64>() / runs.len() as f64;
    let both = |f: &dyn Fn(&Run) -> f64, digits: usize| {
        format!(
            "{:.digits$} / {:.digits$}",
            mean(&fifo_runs, f),
            mean(&asha_runs, f)
        )
    };
    let wins = fifo_runs
        .iter()
        .zip(&asha_runs)
        .fold([0; 3], |mut w, (f, a)| {
            w[if a.best.value > f.best.value {
                0
            } else if a.best.value < f.best.value {
                2
            } else {
                1
            }] += 1;
            w
        });
    out!(
        "| mean | **{}** | {} | {} ({}) | {} / {} | {} |",
        both(&|r| r.best.value, 4),
        both(&|r| r.best_final, 4),
        both(&|r| r.trials as f64, 1),
        both(&|r| r.full as f64, 1),
        fuel_text(mean(&fifo_runs, &|r| r.fuel as f64) as u64),
        fuel_text(mean(&asha_runs, &|r| r.fuel as f64) as u64),
        both(&|r| r.wall.as_secs_f64(), 1),
    );
    out!(
        "\nBest reached, ASHA against random search: {} better, {} equal, {} worse (one \
         validation example is 1/359 = 0.0028).",
        wins[0],
        wins[1],
        wins[2]
    );
}

/// The native replay of `CurveSet::synthetic()` (val_loss, minimized;
/// known optimum) over many seeds.
pub fn replay() {
    let set = CurveSet::synthetic();
    let max_t = set.epochs();
    replay_rows(
        &set,
        "CurveSet::synthetic()",
        "ASHA vs random search at equal fuel",
        vec![
            ("random search (FIFO)".into(), None, json!("random")),
            (
                "ASHA (grace 1, rf 3)".into(),
                Some(asha(max_t, 1)),
                json!("random"),
            ),
            (
                "ASHA (grace 3, rf 3)".into(),
                Some(asha(max_t, 3)),
                json!("random"),
            ),
            (
                "ASHA (grace 9, rf 3)".into(),
                Some(asha(max_t, 9)),
                json!("random"),
            ),
        ],
        200,
    );
}

/// The ASHA schedule [`replay_rows`] compares searchers under on `set`.
pub fn asha_grace(set: &CurveSet, grace: u64) -> SchedulerSpec {
    asha(set.epochs(), grace)
}

/// One row per `(label, scheduler, search)` (FIFO where the scheduler is
/// `None`; `search` as `[search]` gives it), each run with seeds 0 to
/// `seeds - 1` on `set` (called `source` in the heading) replayed natively
/// at equal fuel; `title` heads the table.
pub fn replay_rows(
    set: &CurveSet,
    source: &str,
    title: &str,
    rows: Vec<(String, Option<SchedulerSpec>, Value)>,
    seeds: u64,
) {
    const FULL_TRIALS: u64 = 12;
    const SLOTS: usize = 2;
    let set = Arc::new(set.clone());
    let max_t = set.epochs();
    let configs = set.curves().len() as u64;
    let per_trial = set.grid_fuel() / configs;
    let budget = per_trial * FULL_TRIALS;
    let optimum = set.best_final();
    let anytime = set.best_anytime();
    let metric = set.metric();
    let space = SearchSpace::from_json(&set.param_space(Sampling::Choice)).expect("a space");
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    out!(
        "\n### {title}: native replay of {source} \
         ({seeds} seeds, {SLOTS} at a time, {} fuel = {FULL_TRIALS} full {max_t}-epoch trials of \
         the mean config)\n",
        fuel_text(budget)
    );
    out!(
        "Optimum: {} (final {metric} {:.4}; best anywhere {:.4} at epoch {}). Regret of the \
         best reached = best {metric} any result reported - {:.4}; regret of its config = that \
         config's final {metric} - {:.4} (CurveSet::regret).\n",
        Value::Object(optimum.config.clone()),
        optimum.value,
        anytime.value,
        anytime.epoch,
        anytime.value,
        optimum.value
    );
    out!(
        "| scheduler | regret of best reached: mean / median / p90 | regret of its config: mean / \
         median | found the optimum config | trials started | trials run to {max_t} | fuel used | \
         ms per run |"
    );
    out!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    for (name, scheduler, search) in rows {
        let mut runs = Vec::new();
        for seed in 0..seeds {
            let spec = RunSpec {
                name: "replay".into(),
                output_dir: "/nonexistent/wtune-bench-replay".into(),
                metric: Some(set.metric().to_string()),
                mode: set.mode(),
                stop: Default::default(),
                max_concurrent: SLOTS,
                configs: Vec::new(),
                checkpoint: Default::default(),
                failure: Default::default(),
                restore_from: None,
                resources_per_trial: Default::default(),
                resources: Default::default(),
                stop_experiment: wtune::tune::ExperimentStop {
                    max_fuel: Some(budget),
                    ..Default::default()
                },
                result_order: Default::default(),
            };
            let scheduler = match &scheduler {
                None => Box::new(Fifo::default()) as Box<dyn Scheduler>,
                Some(spec) => spec
                    .build(Some(set.metric()), set.mode(), seed)
                    .expect("asha"),
            };
            let searcher = SearchSpec::from_json(&search)
                .and_then(|s| s.build(&space, 100_000, Some(set.metric()), set.mode(), seed))
                .expect("a valid searcher");
            let run = run_one(
                &runtime,
                replay_backend(set.clone()),
                spec,
                scheduler,
                searcher,
                max_t,
            );
            assert!(run.stopped.is_some(), "the budget ends every run");
            runs.push(run);
        }
        let reached: Vec<f64> = runs.iter().map(|r| r.best.value - anytime.value).collect();
        let config: Vec<f64> = runs
            .iter()
            .map(|r| set.regret(&r.best.config).expect("a tabulated config"))
            .collect();
        let found = config.iter().filter(|&&r| r == 0.0).count();
        let n = runs.len() as f64;
        let mean = |f: &dyn Fn(&Run) -> f64| runs.iter().map(f).sum::<f64>() / n;
        out!(
            "| {name} | {:.4} / {:.4} / {:.4} | {:.4} / {:.4} | {}/{} ({:.0}%) | {:.1} | {:.1} | {} | {:.1} |",
            mean_of(&reached),
            quantile(&reached, 0.5),
            quantile(&reached, 0.9),
            mean_of(&config),
            quantile(&config, 0.5),
            found,
            runs.len(),
            found as f64 / n * 100.0,
            mean(&|r| r.trials as f64),
            mean(&|r| r.full as f64),
            fuel_text(mean(&|r| r.fuel as f64) as u64),
            mean(&|r| r.wall.as_secs_f64() * 1e3),
        );
    }
}

fn mean_of(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len() as f64
}

fn quantile(values: &[f64], q: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}
