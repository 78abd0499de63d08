//! The burn CNN example (`examples/digits-cnn`) end to end through the
//! `wtune` binary: a real framework's model (convolutions, pooling,
//! dropout, Adam, autodiff) trains inside the sandbox, is tuned with ASHA,
//! and continues bit-identically from a host snapshot.

mod common;

use std::path::Path;

use serde_json::Value;

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The metrics of every line of a trial's `result.jsonl`, by iteration.
fn curve(trial: &Path) -> Vec<(u64, [f64; 3])> {
    std::fs::read_to_string(trial.join("result.jsonl"))
        .unwrap()
        .lines()
        .map(|line| {
            let r: Value = serde_json::from_str(line).unwrap();
            let metric = |k: &str| r[k].as_f64().unwrap();
            (
                r["training_iteration"].as_u64().unwrap(),
                [
                    metric("train_loss"),
                    metric("val_loss"),
                    metric("val_accuracy"),
                ],
            )
        })
        .collect()
}

fn example_config() -> std::path::PathBuf {
    common::workspace().join("examples/digits-cnn/experiment.toml")
}

#[test]
fn the_cnn_example_is_tuned_with_asha_inside_the_sandbox() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let run = common::wtune()
        .arg("run")
        .arg(common::guest("digits_cnn"))
        .arg("--config")
        .arg(example_config())
        .args(["--num-samples", "2", "--stop", "training_iteration=3"])
        .arg("--output-dir")
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    let experiment = read_json(&out.join("experiment.json"));
    assert_eq!(experiment["counts"]["terminated"], 2, "{experiment:#}");
    let best = experiment["best_trial"]["metric_value"].as_f64().unwrap();
    assert!(best > 0.85, "best val_accuracy after 3 epochs: {best}");
    // Every epoch is metered: burn's math runs in the guest.
    let first = std::fs::read_to_string(out.join("trial_0000/result.jsonl")).unwrap();
    let first: Value = serde_json::from_str(first.lines().next().unwrap()).unwrap();
    assert!(first["fuel_this_iter"].as_u64().unwrap() > 100_000_000);
}

#[test]
fn a_cnn_trial_continues_bit_identically_from_a_host_snapshot() {
    // The same trial run to 4 epochs in one go, and run to 2 (snapshot at
    // its end) then extended to 4 by `wtune resume`: the model, Adam's
    // moments and both random generators live in guest memory, so the
    // resumed epochs must equal the uninterrupted ones bit for bit.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("experiment.toml");
    std::fs::write(
        &config,
        format!(
            "name = \"cnn\"\nmetric = \"val_accuracy\"\nmode = \"max\"\n\
             checkpoint_at_end = true\n\
             [data]\ndigits = \"{}\"\n\
             [param_space]\nlr = 0.004\nchannels = 4\ndropout = 0.2\nseed = 3\n",
            common::workspace()
                .join("examples/digits-mlp/data")
                .display()
        ),
    )
    .unwrap();
    let run = |out: &Path, iterations: &str| {
        let output = common::wtune()
            .arg("run")
            .arg(common::guest("digits_cnn"))
            .arg("--config")
            .arg(&config)
            .args(["--stop", iterations, "--output-dir"])
            .arg(out)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
    };
    let whole = dir.path().join("whole");
    run(&whole, "training_iteration=4");
    let split = dir.path().join("split");
    run(&split, "training_iteration=2");
    common::resume_ok(&split, &["--stop", "training_iteration=4"]);
    let expected = curve(&whole.join("trial_0000"));
    assert_eq!(expected.len(), 4);
    assert_eq!(curve(&split.join("trial_0000")), expected);
}
