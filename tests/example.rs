//! The digits example end to end through the `wtune` binary, as a user runs
//! it, and the binary's handling of bad input.

mod common;

use serde_json::Value;

fn read_json(path: &std::path::Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn the_example_experiment_tunes_the_digits_mlp() {
    let out = tempfile::tempdir().unwrap();
    let results = out.path().join("results");
    let example = common::workspace().join("examples/digits-mlp");
    let output = common::wtune()
        .arg("run")
        .arg(common::guest("digits_mlp"))
        .arg("--config")
        .arg(example.join("experiment.toml"))
        .args([
            "--num-samples",
            "1",
            "--seed",
            "7",
            "--stop",
            "training_iteration=8",
        ])
        .arg("--output-dir")
        .arg(&results)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("Best trial: trial_"), "{stdout}");
    assert!(stdout.contains("Best config:\n  batch_size = "), "{stdout}");
    assert!(stdout.contains("  lr = "), "{stdout}");

    let experiment = read_json(&results.join("experiment.json"));
    assert_eq!(experiment["status"], "finished");
    let trials = experiment["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 2, "one sample of a two-value grid");
    assert_eq!(experiment["counts"]["terminated"], 2);
    let best = experiment["best_trial"]["metric_value"].as_f64().unwrap();
    assert!(best >= 0.9, "validation accuracy {best}");
    assert_eq!(experiment["run"]["seed"], 7);

    for trial in trials {
        let dir = results.join(trial["trial_id"].as_str().unwrap());
        assert_eq!(read_json(&dir.join("params.json")), trial["config"]);
        let lines: Vec<Value> = std::fs::read_to_string(dir.join("result.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 8);
        for (i, line) in lines.iter().enumerate() {
            assert_eq!(line["training_iteration"], i as u64 + 1);
            assert!(
                line["fuel_this_iter"].as_u64().unwrap() > 1_000_000,
                "fuel is metered"
            );
            assert!(line["val_accuracy"].as_f64().is_some());
            assert!(line["time_total_s"].as_f64().unwrap() > 0.0);
        }
        assert!(lines[7]["fuel_total"].as_u64() > lines[0]["fuel_total"].as_u64());
        let csv = std::fs::read_to_string(dir.join("progress.csv")).unwrap();
        assert_eq!(csv.lines().count(), 9, "header plus 8 rows");
        assert!(csv.lines().next().unwrap().contains("config/lr"));
        let guest_log = std::fs::read_to_string(dir.join("guest.log")).unwrap();
        assert!(guest_log.contains(" INFO "), "{guest_log}");
        // The model prints nothing: its stdout and stderr files are never created.
        assert!(!dir.join("stderr.log").exists());
        assert!(dir.join("work").is_dir());
    }
}

#[test]
fn bad_input_to_run_is_a_one_line_error_with_status_2() {
    let dir = tempfile::tempdir().unwrap();
    let model = common::guest("hostile");
    let bad_config = dir.path().join("bad.toml");
    std::fs::write(&bad_config, "num_samples = \"many\"\n").unwrap();
    let nan_config = dir.path().join("nan.toml");
    std::fs::write(&nan_config, "[param_space]\nwd = { choice = [0.1, nan] }\n").unwrap();
    let garbage = dir.path().join("garbage.wasm");
    std::fs::write(&garbage, "not wasm").unwrap();
    let out_dir = dir.path().join("out");

    let cases: Vec<(Vec<std::ffi::OsString>, &str)> = vec![
        (
            vec![
                "run".into(),
                model.clone().into(),
                "--config".into(),
                bad_config.into(),
            ],
            "bad.toml",
        ),
        (
            vec![
                "run".into(),
                model.clone().into(),
                "--config".into(),
                nan_config.into(),
            ],
            "param_space.wd.choice[1] = NaN: numbers must be finite",
        ),
        (
            vec![
                "run".into(),
                model.clone().into(),
                "--stop".into(),
                "training_iteration=inf".into(),
            ],
            "\"inf\" is not a finite number",
        ),
        (
            vec!["run".into(), garbage.into()],
            "not a WebAssembly binary",
        ),
        (
            vec!["run".into(), dir.path().join("nope.wasm").into()],
            "cannot read",
        ),
        (
            vec![
                "run".into(),
                model.clone().into(),
                "--memory".into(),
                "lots".into(),
            ],
            "--memory must be a size",
        ),
        (
            vec![
                "run".into(),
                model.clone().into(),
                "--mode".into(),
                "max".into(),
            ],
            "mode is set but metric is not",
        ),
        (
            vec![
                "run".into(),
                model.clone().into(),
                "--data".into(),
                "d=/definitely/missing".into(),
            ],
            "data directory `d`",
        ),
        (
            vec![
                "run".into(),
                model.into(),
                "--stop".into(),
                "training_iteration".into(),
            ],
            "expected KEY=VALUE",
        ),
    ];
    for (args, expected) in cases {
        let output = common::wtune()
            .args(&args)
            .arg("--output-dir")
            .arg(&out_dir)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.starts_with("error: ") && stderr.contains(expected),
            "{args:?}: {stderr}"
        );
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
        assert!(!out_dir.exists(), "nothing is written for a refused run");
    }
}

/// Runs started together name their directories alike (to the second):
/// each takes the first free one, and every run completes in its own.
#[test]
fn runs_started_together_each_get_a_directory_of_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let runs: Vec<std::process::Child> = (1..=3)
        .map(|seed| {
            common::wtune()
                .current_dir(dir.path())
                .arg("run")
                .arg(common::guest("hostile"))
                .args(["--seed", &seed.to_string()])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for run in runs {
        let output = run.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{stderr}");
    }
    let made: Vec<std::path::PathBuf> = std::fs::read_dir(dir.path().join("wtune_results"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    assert_eq!(made.len(), 3, "{made:?}");
    for experiment in made {
        assert!(
            experiment.join("experiment_state.json").is_file(),
            "{}",
            experiment.display()
        );
    }
}

#[test]
fn a_run_where_every_trial_fails_exits_non_zero_and_keeps_the_reasons() {
    let run = common::run_cli(
        "hostile",
        "[param_space]\nattack = \"no_such_attack\"\n",
        &["--seed", "1"],
    );
    let (stdout, stderr) = (run.stdout(), run.stderr());
    assert_eq!(run.output.status.code(), Some(1), "{stdout}{stderr}");
    assert!(
        stdout.contains("setup() failed:") && stdout.contains("no_such_attack"),
        "{stdout}"
    );
    assert!(stderr.contains("all 1 trials failed"), "{stderr}");
    let experiment = read_json(&run.out().join("experiment.json"));
    assert_eq!(experiment["counts"]["error"], 1);
}

#[test]
fn a_pool_that_fits_fewer_trials_than_max_concurrent_is_named_in_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("experiment.toml");
    std::fs::write(
        &config,
        "num_samples = 2\nmax_concurrent_trials = 8\n\
         resources_per_trial = { cpu = 1 }\n[resources]\ncpu = 2\n\
         [param_space]\nattack = \"none\"\niterations = 1\n",
    )
    .unwrap();
    let output = common::wtune()
        .arg("run")
        .arg(common::guest("hostile"))
        .arg("--config")
        .arg(&config)
        .arg("--output-dir")
        .arg(dir.path().join("results"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains(
            "at most 2 trial(s) can run at once, not max_concurrent_trials = 8: each asks \
             resources_per_trial.cpu = 1 of the experiment's 2; lower \
             resources_per_trial.cpu or raise resources.cpu"
        ),
        "{stderr}"
    );
    // The header counts what can run, not what was asked.
    assert!(stderr.contains("2 trials, up to 2 at a time"), "{stderr}");
}

/// A trial's GPU share is counted against the adapter host compute runs on
/// (software Vulkan here), and dropped with a note where compute runs on
/// the CPU, so one experiment file serves both machines.
#[test]
fn a_gpu_share_is_counted_on_the_gpu_and_dropped_on_the_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("experiment.toml");
    std::fs::write(
        &config,
        "num_samples = 4\nmax_concurrent_trials = 4\n\
         resources_per_trial = { cpu = 0.25, gpu = 0.5 }\n\
         [param_space]\nwidth = 16\niterations = 1\n",
    )
    .unwrap();
    let run = |compute: &str| {
        let output = common::wtune()
            .arg("run")
            .arg(common::guest("kernels"))
            .arg("--config")
            .arg(&config)
            .args(["--compute", compute])
            .arg("--output-dir")
            .arg(dir.path().join(compute))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert_eq!(output.status.code(), Some(0), "{stderr}");
        let experiment = read_json(&dir.path().join(compute).join("experiment.json"));
        assert_eq!(experiment["counts"]["terminated"], 4, "{stderr}");
        stderr
    };

    let gpu = run("gpu");
    assert!(
        gpu.contains(
            "at most 2 trial(s) can run at once, not max_concurrent_trials = 4: each asks \
             resources_per_trial.gpu = 0.5 of the experiment's 1"
        ),
        "{gpu}"
    );
    assert!(gpu.contains("4 trials, up to 2 at a time"), "{gpu}");

    let cpu = run("cpu");
    assert!(
        cpu.contains(
            "note: host compute does not run on a GPU here, so resources_per_trial.gpu = 0.5 \
             is not counted"
        ),
        "{cpu}"
    );
    assert!(cpu.contains("4 trials, up to 4 at a time"), "{cpu}");

    // Refused on the GPU backend before any trial starts: the stderr.
    let refused = |toml: &str, out: &str| {
        let config = dir.path().join(format!("{out}.toml"));
        std::fs::write(
            &config,
            format!("num_samples = 1\n{toml}[param_space]\nwidth = 16\n"),
        )
        .unwrap();
        let output = common::wtune()
            .arg("run")
            .arg(common::guest("kernels"))
            .arg("--config")
            .arg(&config)
            .args(["--compute", "gpu"])
            .arg("--output-dir")
            .arg(dir.path().join(out))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert!(!dir.path().join(out).join("trial_0000").exists());
        stderr
    };

    // More than the one adapter, once the share is fitted.
    let two = refused("resources_per_trial = { gpu = 2 }\n", "two");
    assert!(
        two.contains("error: resources_per_trial: trial asks for 2 GPUs but the experiment has 1"),
        "{two}"
    );

    // More GPUs declared than host compute has: trials placed on the
    // missing ones could not compute.
    let declared = refused(
        "resources_per_trial = { gpu = 0.5 }\n[resources]\ngpu = 2\n",
        "declared",
    );
    assert!(
        declared.contains(
            "error: resources.gpu = 2 but host compute has 1 GPU to place trials on (the Vulkan \
             adapters it found); lower resources.gpu to 1 or leave it out"
        ),
        "{declared}"
    );
}

/// Each trial of a program that uses host compute is sure of its whole
/// compute quota: when the total holds fewer quotas than max_concurrent,
/// fewer trials run at once (with a note), and none is refused memory.
#[test]
fn compute_trials_run_only_as_many_at_once_as_the_total_holds_quotas() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("experiment.toml");
    std::fs::write(
        &config,
        "num_samples = 3\nmax_concurrent_trials = 3\ncompute = \"cpu\"\n\
         [limits]\ncompute_memory = \"8MiB\"\ncompute_memory_total = \"16MiB\"\n\
         [param_space]\nwidth = 64\niterations = 2\n",
    )
    .unwrap();
    let output = common::wtune()
        .arg("run")
        .arg(common::guest("kernels"))
        .arg("--config")
        .arg(&config)
        .arg("--output-dir")
        .arg(dir.path().join("results"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains(
            "note: running at most 2 trials at once (not 3), so that each is sure of its \
             limits.compute_memory (8 MiB) within limits.compute_memory_total (16 MiB)"
        ),
        "{stderr}"
    );
    assert!(stdout.contains("3 TERMINATED, 0 ERROR"), "{stdout}");
}

#[test]
fn a_space_that_does_not_fit_the_config_type_stops_the_run_at_the_first_trials() {
    // The hostile trainable's `at` is a number; the space gives words.
    // Every trial would fail the same way: the first trial's setup is a
    // probe (the others wait for it), so the run halts after one failure,
    // naming the parameter.
    let run = common::run_cli(
        "hostile",
        "num_samples = 8\nmax_concurrent_trials = 4\n\
         [param_space]\nat = { choice = [\"two\", \"three\"] }\n",
        &["--seed", "1"],
    );
    let (stdout, stderr) = (run.stdout(), run.stderr());
    assert_eq!(run.output.status.code(), Some(1), "{stdout}{stderr}");
    assert!(
        stderr.contains("parameter `at`: invalid type: string")
            && stderr.contains("check param_space"),
        "{stderr}"
    );
    let experiment = read_json(&run.out().join("experiment.json"));
    let counts = &experiment["counts"];
    assert_eq!(counts["error"], 1, "{stdout}");
    assert_eq!(counts["terminated"], 0, "{stdout}");
}
