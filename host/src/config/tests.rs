//! The plan's checks, through [`plan`] as users reach them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::*;
use crate::compute::ComputeOptions;
use crate::tune::{
    CheckpointPolicy, FailFast, FailurePolicy, Mode, SchedulerSpec, SearchSpec, StopCriteria,
};
use crate::wasm_backend::CheckpointMode;

fn write(dir: &Path, text: &str) -> PathBuf {
    let path = dir.join("experiment.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn plan_of(text: &str) -> Result<Plan, ConfigError> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("data")).unwrap();
    let path = write(dir.path(), text);
    let overrides = Overrides {
        output_dir: Some(dir.path().join("out")),
        ..Default::default()
    };
    plan(Path::new("model.wasm"), Some(&path), &overrides)
}

#[test]
fn compute_backend_and_quotas_are_read_and_checked() {
    let plan = plan_of("").unwrap();
    assert_eq!(plan.compute, ComputeOptions::default());
    let plan = plan_of(
        r#"
        compute = "cpu"
        [limits]
        compute_memory = "8GiB"
        "#,
    )
    .unwrap();
    assert_eq!(plan.compute.mode, crate::compute::ComputeMode::Cpu);
    assert_eq!(plan.compute.trial_quota, 8 << 30);
    assert_eq!(
        plan.compute.total_quota,
        8 << 30,
        "the total grows to one trial's"
    );

    let err = plan_of("compute = \"tpu\"").unwrap_err().to_string();
    assert!(err.contains("compute = \"tpu\" is not a backend"), "{err}");
    let gpu = plan_of("compute = \"gpu\"").unwrap();
    assert_eq!(gpu.compute.mode, crate::compute::ComputeMode::Gpu);
    let err = plan_of("[limits]\ncompute_memory = \"2GiB\"\ncompute_memory_total = \"1GiB\"")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("is more than limits.compute_memory_total"),
        "{err}"
    );
    let err = plan_of("[limits]\ncompute_memory = \"lots\"")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("limits.compute_memory must be a size"),
        "{err}"
    );
}

#[test]
fn full_file_is_read() {
    let plan = plan_of(
        r#"
        name = "x"
        metric = "acc"
        mode = "max"
        num_samples = 3
        seed = 1
        max_concurrent_trials = 2
        [stop]
        training_iteration = 4
        [limits]
        fuel_per_call = 5e9
        fuel_per_trial = "1e11"
        memory = "128MiB"
        call_timeout = "30s"
        [data]
        d = "data"
        [param_space]
        lr = { grid_search = [0.1, 0.2] }
        "#,
    )
    .unwrap();
    assert_eq!(plan.searcher().unwrap().total(), Some(6));
    assert_eq!(plan.spec.max_concurrent, 2);
    assert_eq!(plan.limits.fuel_per_call, Some(5_000_000_000));
    assert_eq!(plan.limits.fuel_per_trial, Some(100_000_000_000));
    assert_eq!(plan.limits.memory_bytes, 128 << 20);
    assert_eq!(plan.limits.call_timeout, Some(Duration::from_secs(30)));
    assert_eq!(plan.data[0].0, "d");
    assert!(plan.data[0].1.is_absolute());
    assert!(plan.notes.is_empty());
    assert_eq!(plan.spec.checkpoint, CheckpointPolicy::default());
    assert_eq!(plan.spec.failure, FailurePolicy::default());
}

#[test]
fn checkpoint_and_failure_keys_are_read() {
    let plan = plan_of(
        r#"
        seed = 1
        checkpoint = "guest"
        checkpoint_freq = 5
        checkpoint_at_end = true
        keep_checkpoints_num = 2
        checkpoint_score_attr = "min-loss"
        max_failures = -1
        fail_fast = "raise"
        "#,
    )
    .unwrap();
    assert_eq!(plan.checkpoint_mode, Some(CheckpointMode::Guest));
    assert_eq!(
        plan.spec.checkpoint,
        CheckpointPolicy {
            freq: 5,
            at_end: true,
            keep_num: Some(2),
            score_attr: Some("min-loss".into()),
        }
    );
    assert_eq!(plan.spec.failure.max_failures, None);
    assert_eq!(plan.spec.failure.fail_fast, FailFast::Raise);
    let stop = plan_of("seed = 1\nfail_fast = true\nmax_failures = 3").unwrap();
    assert_eq!(stop.spec.failure.fail_fast, FailFast::Stop);
    assert_eq!(stop.spec.failure.max_failures, Some(3));
}

#[test]
fn search_resources_and_experiment_stoppers_are_read_and_checked() {
    let plan = plan_of(
        r#"
        seed = 1
        metric = "a"
        num_samples = 20
        search = { type = "tpe", n_initial_points = 5, max_concurrent = 2 }
        scheduler = { type = "hyperband", max_t = 27 }
        resources_per_trial = { cpu = 0.5, gpu = 0.25, memory = "64MiB" }
        resources = { cpu = 2, gpu = 1 }
        stop_experiment = { max_trials = 10, max_time = "5m", max_fuel = 1e12 }
        [param_space]
        lr = { loguniform = [1e-4, 1e-1] }
        "#,
    )
    .unwrap();
    assert_eq!(plan.searcher().unwrap().name(), "tpe");
    assert_eq!(plan.searcher().unwrap().total(), Some(20));
    assert!(matches!(plan.scheduler, SchedulerSpec::HyperBand(_)));
    assert_eq!(plan.spec.resources_per_trial.gpu, 0.25);
    assert_eq!(plan.spec.resources_per_trial.memory, 64 << 20);
    assert_eq!(plan.spec.resources.gpu, Some(1.0));
    let stop = &plan.spec.stop_experiment;
    assert_eq!(
        (stop.max_trials, stop.max_time, stop.max_fuel),
        (Some(10), Some(300.0), Some(1_000_000_000_000))
    );

    let err = |text: &str| {
        plan_of(&format!("seed = 1\nmetric = \"a\"\n{text}"))
            .unwrap_err()
            .to_string()
    };
    let message = err("search = \"bayes\"");
    assert!(
        message.contains("random") && message.contains("tpe"),
        "{message}"
    );
    let message = err("search = { type = \"tpe\", gama = 0.3 }");
    assert!(message.contains("unknown key `gama`"), "{message}");
    let message = err("search = \"grid\"\n[param_space]\nlr = { uniform = [0, 1] }");
    assert!(message.contains("param_space.lr"), "{message}");
    let message = err("resources_per_trial = { gpus = 1 }");
    assert!(
        message.contains("[resources_per_trial]") && message.contains("gpus"),
        "{message}"
    );
    let message = err("resources_per_trial = { gpu = 2 }\nresources = { gpu = 1 }");
    assert!(
        message.contains("asks for 2 GPUs but the experiment has 1"),
        "{message}"
    );
    let message = err("stop_experiment = { max_trials = 0 }");
    assert!(message.contains("stop_experiment.max_trials"), "{message}");
    let message = err("stop_experiment = { max_trails = 3 }");
    assert!(
        message.contains("[stop_experiment]") && message.contains("max_trails"),
        "{message}"
    );
}

#[test]
fn scheduler_and_search_flags_override_the_file_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "seed = 1\nmetric = \"a\"\n[scheduler]\ntype = \"asha\"\nmax_t = 27\n\
         [search]\ntype = \"tpe\"\nn_initial_points = 3",
    );
    let with = |scheduler: &str, search: &str| {
        let overrides = Overrides {
            output_dir: Some(dir.path().join("out")),
            scheduler: Some(scheduler.into()),
            search: Some(search.into()),
            ..Default::default()
        };
        plan(Path::new("m.wasm"), Some(&path), &overrides)
    };
    // Same names: the file's parameters apply.
    let plan = with("asha", "tpe").unwrap();
    let SchedulerSpec::Asha(asha) = &plan.scheduler else {
        panic!("asha expected")
    };
    assert_eq!(asha.max_t, 27.0);
    assert_eq!(
        plan.search,
        SearchSpec::from_json(&serde_json::json!({"type": "tpe", "n_initial_points": 3})).unwrap()
    );
    // Other names: their defaults.
    let plan = with("hyperband", "random").unwrap();
    assert!(matches!(plan.scheduler, SchedulerSpec::HyperBand(_)));
    assert_eq!(plan.search, SearchSpec::default());
    let message = with("bohb", "random").unwrap_err().to_string();
    assert!(
        message.contains("bohb") && message.contains("hyperband"),
        "{message}"
    );
}

#[test]
fn pbt_notes_a_population_that_cannot_train_side_by_side() {
    let text = |concurrent: u32| {
        format!(
            "seed = 1\nmetric = \"a\"\nnum_samples = 8\nmax_concurrent_trials = {concurrent}\n\
             resources = {{ cpu = 8 }}\n[scheduler]\ntype = \"pbt\"\n\
             hyperparam_mutations = {{ lr = [0.1, 0.2] }}\n[param_space]\nlr = 0.1"
        )
    };
    let plan = plan_of(&text(2)).unwrap();
    assert!(
        plan.notes
            .iter()
            .any(|n| n.starts_with("pbt: only 2 of the 8 trials")),
        "{:?}",
        plan.notes
    );
    let plan = plan_of(&text(8)).unwrap();
    assert!(
        !plan.notes.iter().any(|n| n.starts_with("pbt:")),
        "{:?}",
        plan.notes
    );
}

#[test]
fn schedulers_by_name_or_table() {
    let plan = plan_of("seed = 1\nmetric = \"a\"\nscheduler = \"asha\"").unwrap();
    assert_eq!(plan.scheduler, SchedulerSpec::Asha(Default::default()));
    assert_eq!(
        plan.spec.stop,
        StopCriteria::default(),
        "max_t bounds trials, not the default stop"
    );
    let plan = plan_of(
        "seed = 1\nmetric = \"a\"\n[scheduler]\ntype = \"asha\"\nmax_t = 27\n\
         reduction_factor = 3\ntime_attr = \"fuel_total\"\nbrackets = 2",
    )
    .unwrap();
    let SchedulerSpec::Asha(asha) = plan.scheduler else {
        panic!("asha expected")
    };
    assert_eq!(
        (asha.max_t, asha.reduction_factor, asha.brackets),
        (27.0, 3.0, 2)
    );
    assert_eq!(asha.time_attr, "fuel_total");
    assert_eq!(plan_of("seed = 1").unwrap().scheduler, SchedulerSpec::Fifo);
    let plan = plan_of(
        "seed = 1\nmetric = \"a\"\n[scheduler]\ntype = \"median_stopping\"\n\
         grace_period = 5\ntime_attr = \"training_iteration\"",
    )
    .unwrap();
    let SchedulerSpec::MedianStopping(median) = plan.scheduler else {
        panic!("median_stopping expected")
    };
    assert_eq!((median.grace_period, median.min_samples_required), (5.0, 3));
}

#[test]
fn defaults_make_a_bare_run_useful() {
    let plan = plan(
        Path::new("dir/model.wasm"),
        None,
        &Overrides {
            seed: Some(3),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(plan.spec.name, "model");
    assert_eq!(plan.searcher().unwrap().total(), Some(1));
    assert_eq!(plan.spec.stop.training_iteration, Some(DEFAULT_ITERATIONS));
    assert!(plan.spec.output_dir.starts_with("wtune_results"));
    assert_eq!(plan.notes.len(), 1, "{:?}", plan.notes);
}

#[test]
fn every_bad_value_gets_a_message_naming_its_key() {
    let cases = [
        ("num_sample = 3", "unknown field `num_sample`"),
        ("num_samples = 0", "num_samples must be at least 1"),
        (
            "max_concurrent_trials = 0",
            "max_concurrent_trials must be at least 1",
        ),
        (
            "metric = \"a\"\nmode = \"best\"",
            "mode must be \"min\" or \"max\"",
        ),
        ("mode = \"min\"", "mode is set but metric is not"),
        ("scheduler = \"magic\"", "scheduler \"magic\" is not known"),
        (
            "metric = \"a\"\n[scheduler]\ntype = \"asha\"\nreduction_factor = 1",
            "scheduler.reduction_factor must be greater than 1",
        ),
        (
            "metric = \"a\"\n[scheduler]\ntype = \"asha\"\nmax_tt = 1",
            "unknown field `max_tt`",
        ),
        (
            "metric = \"a\"\n[scheduler]\ntype = \"asha\"\ngrace_period = \"x\"",
            "scheduler.grace_period: invalid type: string \"x\", expected f64",
        ),
        (
            "[scheduler]\ntype = \"fifo\"\ngrace_period = 1",
            "scheduler: unknown key `grace_period`: the fifo scheduler takes no parameters",
        ),
        (
            "metric = \"a\"\n[search]\ntype = \"tpe\"\nrank_weights = 1",
            "search.rank_weights: invalid type: integer `1`, expected a boolean",
        ),
        ("scheduler = \"asha\"", "set `metric`"),
        ("[scheduler]\nmax_t = 3", "[scheduler] needs `type`"),
        (
            "[limits]\nmemory = \"lots\"",
            "limits.memory must be a size",
        ),
        (
            "[limits]\nfuel_per_call = -5",
            "limits.fuel_per_call must be a positive amount",
        ),
        (
            "[limits]\ncall_timeout = \"soon\"",
            "limits.call_timeout must be a duration",
        ),
        (
            "[limits]\ncall_timeout = 1e20",
            "limits.call_timeout is longer than 100 years",
        ),
        (
            "[stop_experiment]\nmax_time = 1e19",
            "stop_experiment.max_time is longer than 100 years",
        ),
        (
            "[limits]\ncompile_timeout = 1e20",
            "limits.compile_timeout must be a duration such as \"2m\" or a number of seconds, at most 100 years",
        ),
        ("[limits]\nstack = 10", "limits.stack must be between"),
        ("[limits]\nmemroy = 1", "unknown field `memroy`"),
        ("[data]\nd = \"missing\"", "data directory `d`"),
        ("[data]\n\"../x\" = \"data\"", "data grant name \"../x\""),
        (
            "[stop]\ntraining_iteration = 0",
            "stop.training_iteration must be a positive whole number",
        ),
        (
            "[param_space]\nlr = { loguniform = [0, 1] }",
            "param_space.lr: loguniform",
        ),
        ("num_samples = ", "experiment.toml"),
        ("checkpoint = \"memory\"", "checkpoint must be \"snapshot\""),
        (
            "keep_checkpoints_num = 0",
            "keep_checkpoints_num must be at least 1",
        ),
        ("max_failures = -2", "max_failures must be 0 or more, or -1"),
        (
            "fail_fast = \"yes\"",
            "fail_fast must be true, false or \"raise\"",
        ),
        ("restore_from = \"nope.wtsnap\"", "restore_from: "),
        (
            "checkpoint_score_attr = \"min-\"",
            "checkpoint_score_attr must name a result field",
        ),
        ("snapshot_key_file = \"nokey\"", "snapshot_key_file: "),
        ("checkpoint_freq = -1", "checkpoint_freq"),
    ];
    for (text, expected) in cases {
        let message = plan_of(text).unwrap_err().to_string();
        assert!(
            message.contains(expected),
            "{text:?} gave {message:?}, expected {expected:?}"
        );
        assert!(!message.contains('\n'), "one line: {message:?}");
    }
}

#[test]
fn overrides_win_over_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "num_samples = 5\nmetric = \"a\"\n[stop]\ntraining_iteration = 3\n",
    );
    let overrides = Overrides {
        num_samples: Some(2),
        metric: Some("b".into()),
        mode: Some("min".into()),
        stop: vec!["training_iteration=7".into(), "b=0.5".into()],
        fuel: Some("2e9".into()),
        memory: Some("64MiB".into()),
        timeout: Some("5s".into()),
        seed: Some(1),
        output_dir: Some(dir.path().join("out")),
        ..Default::default()
    };
    let plan = plan(Path::new("m.wasm"), Some(&path), &overrides).unwrap();
    assert_eq!(plan.searcher().unwrap().total(), Some(2));
    assert_eq!(plan.spec.metric.as_deref(), Some("b"));
    assert_eq!(plan.spec.mode, Mode::Min);
    assert_eq!(plan.spec.stop.training_iteration, Some(7));
    assert_eq!(plan.spec.stop.thresholds.len(), 1);
    assert_eq!(plan.limits.fuel_per_trial, Some(2_000_000_000));
    assert_eq!(plan.limits.memory_bytes, 64 << 20);
    assert_eq!(plan.limits.call_timeout, Some(Duration::from_secs(5)));
    let bad_stop = Overrides {
        stop: vec!["nonsense".into()],
        seed: Some(1),
        ..Default::default()
    };
    assert!(plan_of_overrides(&bad_stop).contains("expected KEY=VALUE"));
}

fn plan_of_overrides(overrides: &Overrides) -> String {
    plan(Path::new("m.wasm"), None, overrides)
        .unwrap_err()
        .to_string()
}

#[test]
fn a_non_empty_output_dir_is_never_reused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("experiment.json"), "{}").unwrap();
    let overrides = Overrides {
        output_dir: Some(dir.path().to_path_buf()),
        seed: Some(1),
        ..Default::default()
    };
    assert!(plan_of_overrides(&overrides).contains("already exists and is not empty"));
}

#[test]
fn fuel_order_is_the_default_with_a_fuel_clock_and_wall_time_is_noted() {
    use crate::tune::ResultOrder;
    let asha = |time_attr: &str| {
        format!(
            "metric = \"loss\"\nmode = \"min\"\n[scheduler]\ntype = \"asha\"\n\
             time_attr = \"{time_attr}\"\nmax_t = 100\ngrace_period = 10\n"
        )
    };
    let order = |text: &str| plan_of(text).unwrap().spec.result_order;
    assert_eq!(order(&asha("fuel_total")), ResultOrder::Fuel);
    assert_eq!(order(&asha("training_iteration")), ResultOrder::Arrival);
    assert_eq!(order("metric = \"loss\""), ResultOrder::Arrival);
    let chosen = format!("deterministic = true\n{}", asha("training_iteration"));
    assert_eq!(order(&chosen), ResultOrder::Fuel);
    let declined = format!("deterministic = false\n{}", asha("fuel_total"));
    assert_eq!(order(&declined), ResultOrder::Arrival);
    // Wall time still decides: said once, at the start.
    let timed = format!(
        "{}[stop_experiment]\nmax_time = \"1h\"\n[stop]\ntime_total_s = 60\n",
        asha("fuel_total")
    );
    let plan = plan_of(&timed).unwrap();
    assert_eq!(plan.spec.result_order, ResultOrder::Fuel);
    let note = plan
        .notes
        .iter()
        .find(|n| n.contains("fuel order"))
        .unwrap_or_else(|| panic!("{:?}", plan.notes));
    assert!(
        note.contains("stop.time_total_s") && note.contains("stop_experiment.max_time"),
        "{note}"
    );
    assert!(
        plan_of("deterministic = \"yes\"")
            .err()
            .unwrap()
            .to_string()
            .contains("deterministic"),
    );
}

#[test]
fn in_fuel_order_max_concurrent_trials_alone_sets_how_many_run_at_once() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let asha = |extra: &str| {
        format!(
            "metric = \"loss\"\n{extra}\n[scheduler]\ntype = \"asha\"\n\
             time_attr = \"fuel_total\"\nmax_t = 100\ngrace_period = 10\n"
        )
    };
    let more = format!("max_concurrent_trials = {}", cores + 2);
    let plan = plan_of(&asha(&more)).unwrap();
    let sharing = |plan: &Plan| {
        plan.notes
            .iter()
            .any(|n| n.contains("sharing this machine's"))
    };
    // The file-descriptor limit may run fewer (with its own note).
    if plan.spec.max_concurrent > cores {
        assert_eq!(
            plan.spec.pool_spec().cpu,
            Some(plan.spec.max_concurrent as f64)
        );
        assert!(sharing(&plan), "{:?}", plan.notes);
    }
    // The spec keeps what was declared: a resume elsewhere fits its cores.
    assert_eq!(plan.spec.resources.cpu, None);
    let cpu_of = |text: &str| plan_of(text).unwrap().spec.pool_spec().cpu;
    // Declared CPUs, arrival order, or trials that fit: as declared.
    let declared = format!("{more}\n[resources]\ncpu = 1\n");
    assert_eq!(cpu_of(&asha(&declared)), Some(1.0));
    let arrival = format!("{more}\ndeterministic = false");
    assert_eq!(cpu_of(&asha(&arrival)), None);
    assert_eq!(cpu_of(&asha("max_concurrent_trials = 1")), None);
    // Left to default to the cores, the count is noted.
    let defaulted = |text: &str| {
        let plan = plan_of(text).unwrap();
        plan.notes
            .iter()
            .any(|n| n.contains("defaults to this machine's cores"))
    };
    assert!(defaulted(&asha("num_samples = 4")));
    // One trial decides the same however many may run.
    assert!(!defaulted(&asha("")));
    assert!(!defaulted(&asha("max_concurrent_trials = 1")));
    assert!(!defaulted("metric = \"loss\""));
}

#[test]
fn an_experiment_given_as_a_value_is_checked_as_a_file_is() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("data")).unwrap();
    let value = |json: &str| serde_json::from_str::<serde_json::Value>(json).unwrap();
    let plan_value_of = |json: &str| {
        plan_value(
            Path::new("model.wasm"),
            &value(json),
            "experiment",
            dir.path(),
            &Overrides::default(),
        )
    };
    let plan = plan_value_of(
        r#"{"limits": {"memory": "64MiB", "fuel_per_call": 1e9}, "data": {"d": "data"},
            "compute": "cpu", "checkpoint": "guest"}"#,
    )
    .unwrap();
    assert_eq!(plan.limits.memory_bytes, 64 << 20);
    assert_eq!(plan.limits.fuel_per_call, Some(1_000_000_000));
    // Relative paths start at the base given, as a file's start at its directory.
    assert_eq!(plan.data, vec![("d".to_string(), dir.path().join("data"))]);
    assert_eq!(plan.checkpoint_mode, Some(CheckpointMode::Guest));
    // serde names the field; the message also names the table it is in.
    let err = plan_value_of(r#"{"compute": "cpu", "limits": {"memroy": "1GiB"}}"#).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("experiment: limits: unknown field `memroy`"),
        "{err}"
    );
    let err = plan_value_of(r#"{"limits": {"memory": "lots"}}"#).unwrap_err();
    assert!(err.to_string().contains("limits.memory"), "{err}");
}

/// The plan of `text` as the experiment file, with `overrides` (and an
/// output directory in a temporary one) over it.
fn plan_with(text: &str, overrides: Overrides) -> Result<Plan, ConfigError> {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), text);
    let overrides = Overrides {
        output_dir: Some(dir.path().join("out")),
        ..overrides
    };
    plan(Path::new("model.wasm"), Some(&path), &overrides)
}

fn stop_overrides(flags: &[&str]) -> Overrides {
    Overrides {
        stop: flags.iter().map(|f| f.to_string()).collect(),
        seed: Some(1),
        ..Default::default()
    }
}

#[test]
fn stop_flags_say_their_direction_or_keep_the_one_they_replace() {
    use crate::tune::Bound;
    let file = "metric = \"loss\"\nmode = \"min\"\n[stop]\nloss = { at_most = 0.1 }\n";
    let bounds = |flags: &[&str]| {
        let plan = plan_with(file, stop_overrides(flags)).unwrap();
        let mut thresholds = plan.spec.stop.thresholds;
        thresholds.sort_by(|a, b| a.metric.cmp(&b.metric));
        thresholds
            .into_iter()
            .map(|t| (t.metric, t.bound))
            .collect::<Vec<_>>()
    };
    // `=` keeps the file's `at_most`, where it used to turn it into `>=`.
    assert_eq!(
        bounds(&["loss=0.05"]),
        [("loss".to_string(), Bound::AtMost(0.05))]
    );
    assert_eq!(
        bounds(&["loss<=0.2", "loss=0.05"]),
        [("loss".to_string(), Bound::AtMost(0.05))]
    );
    assert_eq!(
        bounds(&["loss > = 9", "acc<=0.5", "lr=1e-3"]),
        [
            ("acc".to_string(), Bound::AtMost(0.5)),
            ("loss".to_string(), Bound::AtLeast(9.0)),
            ("lr".to_string(), Bound::AtLeast(1e-3)),
        ]
    );
    for (flag, said) in [
        ("training_iteration<=5", "training_iteration is a limit"),
        ("<=5", "no KEY before the `=`"),
        ("loss<=x", "\"x\" is not a finite number"),
        ("loss", "expected KEY=VALUE, KEY<=VALUE or KEY>=VALUE"),
    ] {
        let message = plan_with(file, stop_overrides(&[flag]))
            .unwrap_err()
            .to_string();
        assert!(message.contains(said), "{flag}: {message}");
    }
}

#[test]
fn a_threshold_the_mode_moves_away_from_is_noted() {
    let plan = plan_with(
        "metric = \"loss\"\nmode = \"min\"\n[stop]\nloss = 0.05\n",
        stop_overrides(&[]),
    )
    .unwrap();
    assert!(
        plan.notes
            .iter()
            .any(|n| n.contains("once loss >= 0.05") && n.contains("--stop 'loss<=0.05'")),
        "{:?}",
        plan.notes
    );
    let plan = plan_with(
        "metric = \"loss\"\nmode = \"min\"\n",
        stop_overrides(&["loss<=0.05"]),
    )
    .unwrap();
    assert!(
        !plan.notes.iter().any(|n| n.starts_with("stop.")),
        "{:?}",
        plan.notes
    );
}

#[test]
fn a_metric_without_a_mode_is_maximised_and_noted() {
    let plan = plan_with("metric = \"loss\"\n", stop_overrides(&[])).unwrap();
    assert_eq!(plan.spec.mode, Mode::Max);
    assert!(
        plan.notes
            .iter()
            .any(|n| n.starts_with("no mode given; maximising loss")),
        "{:?}",
        plan.notes
    );
    let plan = plan_with("metric = \"acc\"\nmode = \"max\"\n", stop_overrides(&[])).unwrap();
    assert!(
        !plan.notes.iter().any(|n| n.starts_with("no mode")),
        "{:?}",
        plan.notes
    );
}

#[test]
fn values_given_by_flags_are_refused_by_the_flags_name() {
    for (overrides, said) in [
        (
            Overrides {
                memory: Some("lots".into()),
                ..stop_overrides(&[])
            },
            "--memory must be a size",
        ),
        (
            Overrides {
                fuel: Some("-1".into()),
                ..stop_overrides(&[])
            },
            "--fuel must be a positive amount of fuel",
        ),
        (
            Overrides {
                fuel_per_call: Some("x".into()),
                ..stop_overrides(&[])
            },
            "--fuel-per-call must be",
        ),
        (
            Overrides {
                timeout: Some("soon".into()),
                ..stop_overrides(&[])
            },
            "--timeout must be a duration",
        ),
        (
            Overrides {
                compute: Some("tpu".into()),
                ..stop_overrides(&[])
            },
            "--compute \"tpu\" is not a backend",
        ),
        (
            Overrides {
                mode: Some("best".into()),
                metric: Some("a".into()),
                ..stop_overrides(&[])
            },
            "--mode \"best\": use min or max",
        ),
        (
            Overrides {
                mlflow: Some("mlflow.lan".into()),
                ..stop_overrides(&[])
            },
            "--mlflow \"mlflow.lan\": expected http://",
        ),
    ] {
        let message = plan_with("", overrides).unwrap_err().to_string();
        assert!(message.contains(said), "{said}: {message}");
    }
}

#[test]
fn pbt_mutations_of_parameters_the_space_lacks_are_refused_before_the_run() {
    let text = |mutations: &str| {
        format!(
            "seed = 1\nmetric = \"a\"\nmode = \"max\"\n[scheduler]\ntype = \"pbt\"\n\
             hyperparam_mutations = {mutations}\n\
             [param_space]\nlr = {{ loguniform = [1e-4, 1e-1] }}\n\
             arch = {{ choice = [{{ width = 8 }}, {{ depth = 2 }}] }}\n\
             [param_space.optimizer]\nmomentum = 0.9\n"
        )
    };
    for held in [
        "{ lr = [0.1, 0.2] }",
        "{ optimizer = { momentum = [0.8, 0.9] } }",
        "{ arch = { width = [4, 8] } }",
    ] {
        plan_of(&text(held))
            .and_then(|plan| plan.check_mutations())
            .unwrap_or_else(|e| panic!("{held}: {e}"));
    }
    for (missing, name) in [
        ("{ learning_rate = [0.1, 0.2] }", "learning_rate"),
        ("{ optimizer = { beta = [0.8, 0.9] } }", "optimizer.beta"),
        ("{ lr = { x = [1, 2] } }", "lr.x"),
        ("{ arch = { height = [4, 8] } }", "arch.height"),
    ] {
        // The plan itself is made: Ray's PBT samples a missing parameter.
        let plan = plan_of(&text(missing)).unwrap();
        let message = plan.check_mutations().unwrap_err().to_string();
        assert!(
            message.contains(&format!(
                "mutates `{name}`, which param_space does not have"
            )),
            "{missing}: {message}"
        );
    }
}
