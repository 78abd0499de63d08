//! The replay guest (`examples/replay`) through the real sandbox and runner,
//! checked against the native replay (`wtune::tune::replay`): the same
//! numbers, bit for bit, and fuel that is the same on every run. Then the
//! native replay doing what it is for: comparing schedulers on a table with
//! a known optimum, in milliseconds.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_json::{Map, Value, json};
use wtune::config::{Overrides, plan};
use wtune::exec::{CheckpointMode, WasmBackend};
use wtune::report::{ExperimentFile, TrialFiles};
use wtune::sandbox::Limits;
use wtune::tune::replay::{CurveSet, Sampling, replay_backend};
use wtune::tune::space::SearchSpace;
use wtune::tune::{
    AshaConfig, Decision, ExperimentSummary, Fifo, Mode, RunSpec, Runner, Scheduler, SchedulerSpec,
    SearchSpec, StopCriteria, Suggestion, Trial, TrialStatus,
};

/// The set the guest embeds.
fn shipped() -> CurveSet {
    CurveSet::load(&common::workspace().join("examples/replay/curves/synthetic.json")).unwrap()
}

fn spec(out: &Path, configs: Vec<Value>, max_concurrent: usize) -> RunSpec {
    RunSpec {
        metric: Some("val_loss".into()),
        mode: Mode::Min,
        stop: StopCriteria::default(),
        max_concurrent,
        configs,
        ..RunSpec::new("replay", out.to_path_buf())
    }
}

/// Runs the native replay of `set` with the result files written.
fn run_native(set: CurveSet, spec: RunSpec, scheduler: Box<dyn Scheduler>) -> ExperimentSummary {
    let runner = Runner::new(replay_backend(set), spec, scheduler)
        .callback(TrialFiles::new())
        .callback(ExperimentFile::new(Value::Null));
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(runner.run())
        .unwrap()
}

fn results(dir: &Path) -> Vec<Map<String, Value>> {
    std::fs::read_to_string(dir.join("result.jsonl"))
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

fn column(lines: &[Map<String, Value>], key: &str) -> Vec<Value> {
    lines.iter().map(|line| line[key].clone()).collect()
}

fn configs() -> Vec<Value> {
    vec![
        json!({"lr": 0.3, "width": 16}),
        json!({"lr": 0.03, "width": 128}),
        json!({"lr": 0.001, "width": 32}),
        json!({"lr": 0.01, "width": 64}),
    ]
}

#[test]
fn the_guest_reports_exactly_what_the_native_replay_does_with_fuel_that_tracks_the_table() {
    let set = shipped();
    let run_guest = |out: &Path| {
        common::run_trials(
            common::load("replay"),
            configs(),
            Limits::default(),
            StopCriteria::default(),
            vec![],
            out,
        )
    };
    let (first, second, native) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let guest = run_guest(first.path());
    let again = run_guest(second.path());
    let native = run_native(
        set.clone(),
        spec(native.path(), configs(), 4),
        Box::new(Fifo::default()),
    );

    let mut per_epoch = Vec::new();
    for (i, config) in configs().iter().enumerate() {
        let (g, n) = (&guest.trials[i], &native.trials[i]);
        assert_eq!(g.status, TrialStatus::Terminated, "{:?}", g.error);
        assert_eq!(g.config, *config);
        assert_eq!(g.iterations, 81);
        assert_eq!(
            g.stop_reason.as_deref(),
            Some("the trainable reported done")
        );
        assert_eq!(n.stop_reason, g.stop_reason);

        let (g_lines, n_lines) = (results(&g.dir), results(&n.dir));
        assert_eq!(g_lines.len(), 81);
        for key in ["val_loss", "epoch", "training_iteration", "done"] {
            assert_eq!(
                column(&g_lines, key),
                column(&n_lines, key),
                "{key} of {config}"
            );
        }
        let curve = set.lookup(config).unwrap();
        let reported: Vec<f64> = g_lines
            .iter()
            .map(|l| l["val_loss"].as_f64().unwrap())
            .collect();
        assert_eq!(reported, curve.metric("val_loss").unwrap(), "{config}");
        assert_eq!(n.fuel_total, 81 * curve.fuel_per_epoch);

        // Fuel counts WebAssembly operations, so a second run burns the same,
        // call by call (and so does any other machine).
        let a = &again.trials[i];
        assert_eq!(a.fuel_total, g.fuel_total, "{config}");
        let fuel = column(&g_lines, "fuel_this_iter");
        assert_eq!(column(&results(&a.dir), "fuel_this_iter"), fuel, "{config}");
        let fuel: Vec<u64> = fuel.iter().map(|f| f.as_u64().unwrap()).collect();
        // Every epoch of a curve costs the same.
        assert!(
            fuel[1..].iter().all(|&f| f == fuel[1]),
            "{config}: {fuel:?}"
        );
        per_epoch.push((curve.fuel_per_epoch as f64, fuel[1] as f64));
    }
    // ... and what it costs is the table's cost times a constant, plus a
    // small fixed overhead per call.
    per_epoch.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (low, high) = (per_epoch[0], per_epoch[per_epoch.len() - 1]);
    let slope = (high.1 - low.1) / (high.0 - low.0);
    let overhead = low.1 - slope * low.0;
    assert!(
        slope >= 1.0,
        "at least one unit of fuel per tabulated unit: {slope}"
    );
    assert!(
        overhead.abs() < 0.05 * low.1,
        "overhead {overhead} vs {low:?}"
    );
    for (cost, fuel) in &per_epoch {
        let predicted = overhead + slope * cost;
        assert!(
            (fuel - predicted).abs() < 1e-3 * fuel,
            "fuel {fuel} for cost {cost}, predicted {predicted}: {per_epoch:?}"
        );
    }
}

#[test]
fn guest_checkpoints_keep_the_epoch_and_reset_switches_the_curve() {
    let set = shipped();
    let program = common::load("replay");
    let dir = tempfile::tempdir().unwrap();
    let env = common::trial_env(dir.path(), vec![]);
    let start = |config: &Value| {
        let mut instance = program.instantiate(&env, &Limits::default()).unwrap();
        instance.setup(&config.to_string()).unwrap();
        instance
    };
    let table = |config: &Value, epoch: usize| {
        set.lookup(config).unwrap().metric("val_loss").unwrap()[epoch - 1]
    };
    let reported = |report: &wtune::sandbox::GuestReport| -> (f64, f64) {
        let get = |name: &str| {
            report
                .metrics
                .iter()
                .find(|(n, _)| n == name)
                .unwrap_or_else(|| panic!("no {name} in {report:?}"))
                .1
        };
        (get("val_loss"), get("epoch"))
    };

    let (a, b, c) = (
        json!({"lr": 0.1, "width": 16}),
        json!({"lr": 0.003, "width": 128}),
        json!({"lr": 0.03, "width": 32}),
    );
    let mut first = start(&a);
    for _ in 0..5 {
        first.train().unwrap();
    }
    let (state, _) = first.save().unwrap();

    // Population based training's exploit with guest checkpoints: a new
    // config, set up fresh, restored from another trial's state.
    let mut second = start(&b);
    second.restore(&state).unwrap();
    let (report, _) = second.train().unwrap();
    assert_eq!(reported(&report), (table(&b, 6), 6.0));

    // The same on a live instance: reset keeps the epoch, switches the curve.
    let (reused, _) = first.reset(&c.to_string()).unwrap();
    assert!(reused);
    let (report, _) = first.train().unwrap();
    assert_eq!(reported(&report), (table(&c, 6), 6.0));
    let err = first.reset(r#"{"lr": 0.5, "width": 32}"#).unwrap_err();
    assert!(
        err.to_string().contains("lr = 0.5 is not tabulated"),
        "{err}"
    );
}

#[test]
fn an_untabulated_config_fails_with_the_valid_values() {
    let out = tempfile::tempdir().unwrap();
    let summary = common::run_trials(
        common::load("replay"),
        vec![
            json!({"lr": 0.02, "width": 64}),
            json!({"lr": 0.01, "width": 64}),
        ],
        Limits::default(),
        StopCriteria {
            training_iteration: Some(2),
            ..Default::default()
        },
        vec![],
        out.path(),
    );
    let error = summary.trials[0].error.as_deref().unwrap();
    assert!(
        error.contains("lr = 0.02 is not tabulated")
            && error.contains("valid values: 0.0001, 0.0003, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3"),
        "{error}"
    );
    assert_eq!(summary.trials[1].status, TrialStatus::Terminated);
}

#[test]
fn the_example_experiment_covers_the_table() {
    let set = shipped();
    let file = common::workspace().join("examples/replay/experiment.toml");
    let plan = plan(Path::new("replay.wasm"), Some(&file), &Overrides::default()).unwrap();
    assert_eq!(plan.spec.metric.as_deref(), Some(set.metric()));
    assert_eq!(plan.spec.mode, set.mode());
    let mut searcher = plan.searcher().unwrap();
    let mut configs = Vec::new();
    while let Suggestion::Config(config) = searcher.suggest(&format!("trial_{}", configs.len())) {
        set.lookup(&config).unwrap();
        configs.push(config);
    }
    assert_eq!(configs.len(), set.curves().len());
    let SchedulerSpec::Asha(asha) = &plan.scheduler else {
        panic!("the example uses ASHA: {:?}", plan.scheduler);
    };
    assert_eq!(asha.max_t, set.epochs() as f64);

    // The experiment, replayed natively: ASHA spends a fraction of a grid
    // search's fuel and still lands close to the optimum.
    let out = tempfile::tempdir().unwrap();
    let mut spec = plan.spec.clone();
    spec.output_dir = out.path().to_path_buf();
    // One trial at a time, so ASHA sees results in the same order on every
    // run (with more, the order depends on thread timing).
    spec.max_concurrent = 1;
    let scheduler = plan
        .scheduler
        .build(spec.metric.as_deref(), spec.mode, plan.seed)
        .unwrap();
    let runner = Runner::new(replay_backend(set.clone()), spec, scheduler)
        .searcher(plan.searcher().unwrap());
    let summary = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(runner.run())
        .unwrap();
    let fuel: u64 = summary.trials.iter().map(|t| t.fuel_total).sum();
    assert!(
        fuel * 10 < set.grid_fuel() * 6,
        "{fuel} of {}",
        set.grid_fuel()
    );
    let best = summary.best_trial().unwrap();
    assert!(set.regret(&best.config).unwrap() < 0.03, "{}", best.config);
}

/// What the table is for: the trade-off between early stopping and
/// finding the optimum, measured in milliseconds. The curves cross, so ASHA
/// with a one-epoch grace period keeps the fast starters and stops the
/// optimum; waiting nine epochs finds it, for more fuel. One trial at a
/// time, in a fixed mixed order, so every run decides the same.
#[test]
fn schedulers_compare_on_the_native_replay_in_milliseconds() {
    let set = shipped();
    let grid = SearchSpace::from_json(&set.param_space(Sampling::Grid))
        .unwrap()
        .generate(1, 0)
        .unwrap();
    // The grid's own order runs the weakest configs first, which flatters
    // asynchronous halving; a stride of 13 (coprime to 32) mixes it.
    let mixed: Vec<Value> = (0..grid.len())
        .map(|i| grid[i * 13 % grid.len()].clone())
        .collect();
    let run = |scheduler: Box<dyn Scheduler>| {
        let out = tempfile::tempdir().unwrap();
        let summary = run_native(set.clone(), spec(out.path(), mixed.clone(), 1), scheduler);
        let fuel: u64 = summary.trials.iter().map(|t| t.fuel_total).sum();
        (summary, fuel)
    };
    let asha = |grace_period: f64| {
        let config = AshaConfig {
            max_t: 81.0,
            grace_period,
            reduction_factor: 3.0,
            ..Default::default()
        };
        run(SchedulerSpec::Asha(config)
            .build(Some("val_loss"), Mode::Min, 0)
            .unwrap())
    };

    let (fifo, fifo_fuel) = run(Box::<Fifo>::default());
    let optimum = set.best_final();
    let best = fifo.best_trial().unwrap();
    assert_eq!(best.config, Value::Object(optimum.config.clone()));
    assert_eq!(
        best.last_result.as_ref().unwrap()["val_loss"],
        json!(optimum.value)
    );
    assert_eq!(fifo_fuel, set.grid_fuel());

    let (eager, eager_fuel) = asha(1.0);
    let pick = &eager.best_trial().unwrap().config;
    assert!(eager_fuel * 5 < fifo_fuel, "{eager_fuel} of {fifo_fuel}");
    assert!(set.regret(pick).unwrap() > 0.04, "{pick}");
    assert!(
        pick["lr"].as_f64().unwrap() > 0.03,
        "a fast starter wins: {pick}"
    );
    let iterations =
        |s: &ExperimentSummary| -> Vec<u64> { s.trials.iter().map(|t| t.iterations).collect() };
    assert_eq!(
        iterations(&asha(1.0).0),
        iterations(&eager),
        "deterministic"
    );

    let (patient, patient_fuel) = asha(9.0);
    let pick = &patient.best_trial().unwrap().config;
    assert_eq!(set.regret(pick).unwrap(), 0.0, "{pick}");
    assert!(
        eager_fuel < patient_fuel && patient_fuel * 2 < fifo_fuel,
        "{patient_fuel}"
    );
}

/// The issue's determinism promise: with `time_attr = "fuel_total"` and a
/// seed, the same experiment makes the same decisions on any machine. Fuel
/// is counted by the sandbox instruction by instruction, so it is the same
/// on every machine; the model-based searcher (TPE) and ASHA see the same
/// numbers in the same order (one trial at a time) and decide alike.
#[test]
fn the_same_seed_with_fuel_as_time_makes_the_same_decisions_twice() {
    let set = shipped();
    let space = SearchSpace::from_json(&set.param_space(Sampling::Choice)).unwrap();
    let decide = |out: &Path| {
        let asha = AshaConfig {
            time_attr: "fuel_total".into(),
            grace_period: 2e7,
            max_t: 4e8,
            reduction_factor: 3.0,
            ..AshaConfig::default()
        };
        let spec = spec(out, Vec::new(), 1);
        let scheduler = SchedulerSpec::Asha(asha)
            .build(spec.metric.as_deref(), spec.mode, 11)
            .unwrap();
        let searcher = SearchSpec::from_json(&json!({"type": "tpe", "n_initial_points": 4}))
            .unwrap()
            .build(&space, 12, spec.metric.as_deref(), spec.mode, 11)
            .unwrap();
        let backend = WasmBackend::new(common::load("replay"), Limits::default(), vec![]);
        let runner = Runner::new(backend, spec, scheduler).searcher(searcher);
        let summary = tokio::runtime::Runtime::new()
            .unwrap()
            .block_on(runner.run())
            .unwrap();
        summary
            .trials
            .iter()
            .map(|t| {
                (
                    t.config.clone(),
                    t.iterations,
                    t.fuel_total,
                    t.stop_reason.clone(),
                )
            })
            .collect::<Vec<_>>()
    };
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let first = decide(a.path());
    assert_eq!(first, decide(b.path()));
    assert_eq!(first.len(), 12);
    let stopped_early = first
        .iter()
        .filter(|(_, iterations, _, _)| *iterations < set.epochs())
        .count();
    assert!(
        stopped_early > 0 && stopped_early < 12,
        "ASHA should stop some trials and keep others: {first:?}"
    );
}

/// Checkpoints `trial_0000` at iteration 2, and `trial_0001` at 3 (before
/// its exploit only); the
/// first time `trial_0001` reaches iteration 4, it clones `trial_0000`'s
/// checkpoint and continues with the optimum's config (once: the clone
/// passes iteration 4 again). Its own checkpoint at 3 belongs to the
/// trajectory it leaves.
struct ScriptedExploit {
    exploited: bool,
}

impl Scheduler for ScriptedExploit {
    fn on_result(&mut self, trial: &Trial, _: &Map<String, Value>) -> Decision {
        match (trial.trial_id.as_str(), trial.iterations) {
            ("trial_0000", 2) => Decision::Checkpoint,
            ("trial_0001", 3) if !self.exploited => Decision::Checkpoint,
            ("trial_0001", 4) if !std::mem::replace(&mut self.exploited, true) => {
                Decision::Exploit {
                    source: 0,
                    config: json!({"lr": 0.03, "width": 128}),
                }
            }
            _ => Decision::Continue,
        }
    }

    fn choose_next(&mut self, trials: &[Trial]) -> Option<usize> {
        trials.iter().position(|t| t.status == TrialStatus::Pending)
    }

    fn name(&self) -> &'static str {
        "scripted-exploit"
    }
}

#[test]
fn an_exploit_clones_a_checkpoint_and_continues_with_the_new_config_in_both_modes() {
    let set = shipped();
    let optimum = set.lookup(&json!({"lr": 0.03, "width": 128})).unwrap();
    for mode in [CheckpointMode::Guest, CheckpointMode::Snapshot] {
        let out = tempfile::tempdir().unwrap();
        let mut spec = spec(
            out.path(),
            vec![
                json!({"lr": 0.3, "width": 16}),
                json!({"lr": 0.001, "width": 32}),
            ],
            1,
        );
        spec.stop.training_iteration = Some(5);
        let backend = WasmBackend::new(common::load("replay"), Limits::default(), vec![])
            .checkpoint_mode(mode)
            .unwrap();
        let runner = Runner::new(
            backend,
            spec,
            Box::new(ScriptedExploit { exploited: false }),
        )
        .callback(TrialFiles::new());
        let summary = tokio::runtime::Runtime::new()
            .unwrap()
            .block_on(runner.run())
            .unwrap();
        let clone = &summary.trials[1];
        assert_eq!(
            clone.status,
            TrialStatus::Terminated,
            "{mode}: {:?}",
            clone.error
        );
        assert_eq!(clone.config, json!({"lr": 0.03, "width": 128}));
        // Its own copy (a hard link) of trial_0000's checkpoint at
        // iteration 2, in place of its own.
        use std::os::unix::fs::MetadataExt;
        let inode = |trial: &Trial| {
            std::fs::metadata(trial.dir.join("checkpoints/checkpoint_000002.wtsnap"))
                .unwrap()
                .ino()
        };
        assert_eq!(inode(clone), inode(&summary.trials[0]), "{mode}");
        let iterations: Vec<u64> = clone.checkpoints.iter().map(|c| c.iteration).collect();
        assert_eq!(iterations, [2], "{mode}");
        let left_behind = clone.dir.join("checkpoints/checkpoint_000003.wtsnap");
        assert!(!left_behind.exists(), "{mode}");
        // Iterations 1-4 on its first config, then 3-5 continue from the
        // clone (iteration 2) on the optimum's curve.
        let lines = results(&clone.dir);
        assert_eq!(
            column(&lines, "training_iteration"),
            [1, 2, 3, 4, 3, 4, 5].map(Value::from),
            "{mode}"
        );
        let tail: Vec<f64> = lines[4..]
            .iter()
            .map(|l| l["val_loss"].as_f64().unwrap())
            .collect();
        assert_eq!(tail, optimum.metric("val_loss").unwrap()[2..5], "{mode}");
    }
}

/// Interrupts the run (as Ctrl-C does) when `trial` reports `iteration`.
struct InterruptAt {
    trial: &'static str,
    iteration: u64,
    send: tokio::sync::mpsc::UnboundedSender<()>,
}

impl wtune::tune::Callback for InterruptAt {
    fn on_result(&mut self, t: &[Trial], i: usize, _: &Map<String, Value>) -> Result<(), String> {
        if t[i].trial_id == self.trial && t[i].iterations == self.iteration {
            let _ = self.send.send(());
        }
        Ok(())
    }
}

/// A model-based search survives an interruption: resumed from
/// `experiment_state.json`, TPE suggests exactly the configurations an
/// uninterrupted run does (its observations and draws are in the state).
#[test]
fn an_interrupted_tpe_search_resumes_with_the_same_suggestions() {
    interrupted_search_resumes_with_the_same_suggestions("tpe");
}

/// The same for GP-BO, whose state also holds its last fit.
#[test]
fn an_interrupted_gp_search_resumes_with_the_same_suggestions() {
    interrupted_search_resumes_with_the_same_suggestions("gp");
}

/// And for GP over configuration and iteration, which also learns from
/// the intermediate results of the trials running when it was stopped.
#[test]
fn an_interrupted_joint_gp_search_resumes_with_the_same_suggestions() {
    interrupted_search_resumes_with_the_same_suggestions_of(
        json!({"type": "gp", "n_initial_points": 3, "multi_fidelity": "joint"}),
    );
}

fn interrupted_search_resumes_with_the_same_suggestions(name: &str) {
    interrupted_search_resumes_with_the_same_suggestions_of(
        json!({"type": name, "n_initial_points": 3}),
    );
}

fn interrupted_search_resumes_with_the_same_suggestions_of(search: Value) {
    let name = search["type"].as_str().unwrap().to_string();
    let set = shipped();
    let space = SearchSpace::from_json(&set.param_space(Sampling::Choice)).unwrap();
    let search = SearchSpec::from_json(&search).unwrap();
    let searcher = |spec: &RunSpec| {
        search
            .build(&space, 10, spec.metric.as_deref(), spec.mode, 5)
            .unwrap()
    };
    let experiment = |out: &Path| {
        let mut spec = spec(out, Vec::new(), 1);
        spec.stop.training_iteration = Some(6);
        spec.checkpoint.freq = 2;
        spec
    };
    let configs = |summary: &ExperimentSummary| -> Vec<Value> {
        summary.trials.iter().map(|t| t.config.clone()).collect()
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();

    let clean = tempfile::tempdir().unwrap();
    let spec = experiment(clean.path());
    let searcher_clean = searcher(&spec);
    let runner = Runner::new(replay_backend(set.clone()), spec, Box::new(Fifo::default()))
        .searcher(searcher_clean);
    let expected = runtime.block_on(runner.run()).unwrap();
    assert_eq!(expected.trials.len(), 10);

    let out = tempfile::tempdir().unwrap();
    let spec = experiment(out.path());
    let (send, interrupts) = tokio::sync::mpsc::unbounded_channel();
    let first = Runner::new(
        replay_backend(set.clone()),
        spec.clone(),
        Box::new(Fifo::default()),
    )
    .searcher(searcher(&spec))
    .interrupts(interrupts)
    .callback(wtune::report::StateFile::new(json!({})))
    .callback(InterruptAt {
        trial: "trial_0005",
        iteration: 3,
        send,
    });
    let halted = runtime.block_on(first.run()).unwrap();
    assert_eq!(halted.halted.as_deref(), Some("interrupted"));
    assert_eq!(halted.trials.len(), 6);

    let saved = wtune::report::state::load(out.path(), false)
        .unwrap()
        .unchecked();
    let mut trials = saved.trials;
    wtune::tune::resume::prepare(
        &replay_backend(set.clone()),
        &mut trials,
        out.path(),
        &spec.checkpoint,
        wtune::tune::resume::ErroredTrials::Keep,
    );
    let mut resumed_searcher = searcher(&spec);
    let saved_search = saved.decisions.searcher.unwrap();
    assert_eq!(saved_search.name, name);
    resumed_searcher.restore_state(&saved_search.state).unwrap();
    let resumed = Runner::new(replay_backend(set.clone()), spec, Box::new(Fifo::default()))
        .searcher(resumed_searcher)
        .with_trials(trials);
    let resumed = runtime.block_on(resumed.run()).unwrap();
    assert_eq!(configs(&resumed), configs(&expected));
    for (a, b) in expected.trials.iter().zip(&resumed.trials) {
        assert_eq!(a.metric("val_loss"), b.metric("val_loss"), "{}", a.trial_id);
    }
}

/// The digits CNN's tabulated curves (`examples/digits-cnn/examples/tabulate.rs`):
/// a full grid of real training runs, each costed by its shapes.
#[test]
fn the_tabulated_cnn_curves_are_a_full_grid_of_real_runs_costed_by_shape() {
    let path = common::workspace().join("examples/replay/curves/digits-cnn.json");
    let set = CurveSet::load(&path).unwrap();
    assert_eq!(
        (set.metric(), set.mode(), set.epochs()),
        ("val_loss", Mode::Min, 27)
    );
    let axes: Vec<(&str, usize)> = set
        .params()
        .iter()
        .map(|(name, values)| (name.as_str(), values.len()))
        .collect();
    assert_eq!(
        axes,
        [
            ("lr", 6),
            ("channels", 4),
            ("hidden", 3),
            ("dropout", 3),
            ("batch_size", 3)
        ]
    );
    assert_eq!(set.curves().len(), 648);
    let curve = |lr: f64, channels: u64, batch_size: u64| {
        set.lookup(
            &json!({"lr": lr, "channels": channels, "hidden": 64, "dropout": 0.25,
                           "batch_size": batch_size}),
        )
        .unwrap()
    };
    for c in set.curves() {
        let accuracy = c.metric("val_accuracy").unwrap();
        assert!(
            accuracy.iter().all(|a| (0.0..=1.0).contains(a)),
            "{:?}",
            c.config
        );
    }
    // Cost follows the shapes, not the learning rate: wider convolutions
    // cost more per epoch, the same shapes exactly the same at every
    // learning rate, wherever a curve fell in the tabulating run.
    assert!(curve(1e-3, 16, 64).fuel_per_epoch > 2 * curve(1e-3, 4, 64).fuel_per_epoch);
    let mut by_shape: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
    for c in set.curves() {
        let mut shape = c.config.clone();
        shape.remove("lr");
        by_shape
            .entry(Value::Object(shape).to_string())
            .or_default()
            .insert(c.fuel_per_epoch);
    }
    let shapes: usize = set
        .params()
        .iter()
        .filter(|(name, _)| name.as_str() != "lr")
        .map(|(_, values)| values.len())
        .product();
    assert_eq!(by_shape.len(), shapes);
    for (shape, fuel) in &by_shape {
        assert_eq!(fuel.len(), 1, "{shape}: {fuel:?}");
    }
    // Real training: a good configuration ends far below chance (ln 10 =
    // 2.30) and classifies most digits; the smallest step barely moves.
    let best = set.best_final();
    assert!(best.value < 0.2, "{best:?}");
    let slow = curve(1e-4, 2, 256).metric("val_loss").unwrap();
    assert!(slow[26] > 1.5, "{slow:?}");
    let good = curve(3e-3, 8, 64);
    assert!(good.metric("val_accuracy").unwrap()[26] > 0.9);
}
