//! burn models whose tensor operations the host runs, end to end through
//! the `wtune` binary: the `wtune:trainable/burn` interface, the trial's
//! `wtune-burn-worker` behind it, and the guest's transport
//! (`burn_remote::host()`).
//!
//! - `examples/burn-hostile` attacks the interface, one attack per trial,
//!   beside a benign trial training on the host in the same experiment,
//!   on the CPU worker and on the GPU one;
//! - `examples/digits-cnn` with `backend = "host"` trains the same CNN as
//!   with `backend = "wasm"`, to float tolerance, and continues bit for bit
//!   from a host snapshot that carries its host tensors; with
//!   `compute = "gpu"` it trains on the GPU and continues from a snapshot
//!   to float tolerance; a snapshot of its CPU worker's tensors is refused
//!   on a GPU, with the flag that resumes it, and is kept.

mod common;

use std::path::Path;

use serde_json::Value;

/// Each trial's status and error by its config's `attack`.
fn by_attack(out: &Path) -> Vec<(String, String, String)> {
    common::experiment_trials(out)
        .iter()
        .map(|t| {
            (
                t["config"]["attack"].as_str().unwrap().to_owned(),
                t["status"].as_str().unwrap().to_owned(),
                t["error"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

/// The benign trial's losses, iteration by iteration.
fn losses(out: &Path, trial: &str) -> Vec<f64> {
    std::fs::read_to_string(out.join(trial).join("result.jsonl"))
        .unwrap()
        .lines()
        .map(|line| {
            serde_json::from_str::<Value>(line).unwrap()["loss"]
                .as_f64()
                .unwrap()
        })
        .collect()
}

const HOSTILE: &str = r#"
name = "burn-hostile"
metric = "loss"
mode = "min"
max_concurrent_trials = 2
[limits]
fuel_per_call = 2_000_000_000
compute_memory = "64MiB"
[param_space]
attack = { grid_search = ["benign", "foreign", "after-free", "overflow", "gigantic", "garbage", "ignore-errors", "fuel"] }
"#;

#[test]
fn hostile_burn_guests_get_errors_and_their_neighbour_trains_as_if_alone() {
    hostile_beside_benign(HOSTILE, 0.0);
}

#[test]
fn hostile_burn_guests_on_a_gpu_get_the_same_errors() {
    // The same attacks against a worker running burn's wgpu backend
    // (lavapipe where there is no hardware GPU), whose checks are the
    // CPU's. Autotuning may pick another kernel in another process, so the
    // benign trial alone agrees to float tolerance.
    let gpu = HOSTILE.replacen(
        "max_concurrent_trials = 2",
        "max_concurrent_trials = 2\ncompute = \"gpu\"",
        1,
    );
    hostile_beside_benign(&gpu, 1e-4);
}

/// Runs the attacks of `toml` (HOSTILE's, perhaps on another backend), checks
/// each fails its own trial with its error, and that the benign trial's
/// losses are those it has alone, to `tolerance` (relative).
fn hostile_beside_benign(toml: &str, tolerance: f64) {
    let run = common::run_cli("burn_hostile", toml, &[]);
    // Every attack fails its own trial; the experiment goes on.
    assert!(run.output.status.success(), "{}", run.stderr());
    let trials = by_attack(&run.out());
    assert_eq!(trials.len(), 8, "{trials:?}");
    let expected = [
        ("benign", "TERMINATED", ""),
        (
            "foreign",
            "ERROR",
            "NumericFloat(Neg) was refused: tensor 1099511627783 is not one of this trial's \
             tensors (never made, or already freed)",
        ),
        (
            "after-free",
            "ERROR",
            "burn command 3: NumericFloat(Neg) was refused: tensor 1099511627777 is not one of \
             this trial's tensors",
        ),
        ("overflow", "ERROR", "overflows"),
        (
            "gigantic",
            "ERROR",
            "would take 4398046511104 bytes, over its quota of 67108864 (hold fewer or smaller \
             tensors, or raise limits.compute_memory)",
        ),
        (
            "garbage",
            "ERROR",
            "command 0 of the frame (byte 0) does not decode",
        ),
        // The refusal it never asked about is what its next read answers.
        (
            "ignore-errors",
            "ERROR",
            "NumericFloat(Neg) was refused: tensor 1099511627783",
        ),
        // Work it never waits for is charged all the same.
        ("fuel", "ERROR", "exceeded the per-call fuel limit of 2e9"),
    ];
    for (attack, status, error) in expected {
        let (_, got_status, got_error) = trials
            .iter()
            .find(|(a, _, _)| a == attack)
            .unwrap_or_else(|| panic!("no {attack} trial in {trials:?}"));
        assert_eq!(got_status, status, "{attack}: {got_error}");
        assert!(got_error.contains(error), "{attack}: {got_error}");
    }

    // The benign trial, alone, learns exactly the same.
    let benign = trials.iter().position(|(a, _, _)| a == "benign").unwrap();
    let alone = common::run_cli(
        "burn_hostile",
        &toml.replace(
            r#"attack = { grid_search = ["benign", "foreign", "after-free", "overflow", "gigantic", "garbage", "ignore-errors", "fuel"] }"#,
            r#"attack = "benign""#,
        ),
        &[],
    );
    assert!(alone.output.status.success(), "{}", alone.stderr());
    let together = losses(&run.out(), &format!("trial_{benign:04}"));
    assert_eq!(together.len(), 5);
    assert!(together[4] < together[0] / 10.0, "{together:?}");
    let by_itself = losses(&alone.out(), "trial_0000");
    assert_eq!(by_itself.len(), together.len());
    for (a, b) in by_itself.iter().zip(&together) {
        assert!(
            (a - b).abs() <= tolerance * b.abs(),
            "{by_itself:?} vs {together:?}"
        );
    }
}

#[test]
fn a_burn_wait_past_the_call_deadline_kills_only_that_trials_worker() {
    let toml = r#"
name = "burn-stall"
metric = "loss"
mode = "min"
max_concurrent_trials = 2
[limits]
call_timeout = "1s"
fuel_per_call = 1_000_000_000_000_000
[param_space]
attack = { grid_search = ["stall", "benign"] }
"#;
    let run = common::run_cli("burn_hostile", toml, &[]);
    let trials = by_attack(&run.out());
    let (_, status, error) = trials.iter().find(|(a, _, _)| a == "stall").unwrap();
    assert_eq!(status, "ERROR");
    assert_eq!(
        error,
        "train() at iteration 1 lost its compute device: a burn read ran past the guest \
         call's deadline (limits.call_timeout); the burn worker was killed, taking this \
         trial's host tensors with it"
    );
    let (_, status, error) = trials.iter().find(|(a, _, _)| a == "benign").unwrap();
    assert_eq!(status, "TERMINATED", "{error}");
}

/// The CNN example's curve for `backend` over `epochs`, one fixed config.
fn cnn_curve(backend: &str, extra: &str, epochs: u32) -> (common::CliRun, Vec<[f64; 3]>) {
    let toml = format!(
        "name = \"cnn-{backend}\"\nmetric = \"val_accuracy\"\nmode = \"max\"\n{extra}\n\
         [stop]\ntraining_iteration = {epochs}\n\
         [data]\ndigits = \"{}\"\n\
         [param_space]\nlr = 0.004\nchannels = 4\ndropout = 0.2\nseed = 3\nbackend = \"{backend}\"\n",
        common::workspace()
            .join("examples/digits-mlp/data")
            .display()
    );
    let run = common::run_cli("digits_cnn", &toml, &[]);
    let curve = curve(&run.out());
    (run, curve)
}

/// The first trial's metrics under `out`, epoch by epoch.
fn curve(out: &Path) -> Vec<[f64; 3]> {
    std::fs::read_to_string(out.join("trial_0000/result.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|line| {
            let r: Value = serde_json::from_str(line).unwrap();
            ["train_loss", "val_loss", "val_accuracy"].map(|k| r[k].as_f64().unwrap())
        })
        .collect()
}

#[test]
fn the_cnn_trained_on_the_host_matches_the_cnn_trained_in_the_guest() {
    let (guest_run, in_guest) = cnn_curve("wasm", "", 3);
    assert!(guest_run.output.status.success(), "{}", guest_run.stderr());
    let (host_run, on_host) = cnn_curve("host", "", 3);
    assert!(host_run.output.status.success(), "{}", host_run.stderr());
    assert_eq!(in_guest.len(), 3);
    assert_eq!(on_host.len(), 3);
    // The same kernels compiled for wasm SIMD and for the host's CPU: the
    // sums may round differently, nothing more.
    for (guest, host) in in_guest.iter().zip(&on_host) {
        for (g, h) in guest.iter().zip(host) {
            assert!(
                (g - h).abs() <= 1e-5 * g.abs().max(1.0),
                "{in_guest:?} vs {on_host:?}"
            );
        }
    }
    assert!(on_host[2][2] > 0.8, "{on_host:?}");
}

#[test]
fn a_cnn_on_the_host_continues_bit_identically_from_a_host_snapshot() {
    // Four epochs in one go, and two (a snapshot at their end) extended to
    // four by `wtune resume`: the snapshot carries the worker's tensors and
    // its random generator's place, so the dropout masks after the resume
    // are the ones the uninterrupted run drew.
    let (whole, expected) = cnn_curve("host", "checkpoint_at_end = true", 4);
    assert!(whole.output.status.success(), "{}", whole.stderr());
    assert_eq!(expected.len(), 4);
    let (split, _) = cnn_curve("host", "checkpoint_at_end = true", 2);
    assert!(split.output.status.success(), "{}", split.stderr());
    common::resume_ok(&split.out(), &["--stop", "training_iteration=4"]);
    assert_eq!(curve(&split.out()), expected);
}

#[test]
fn a_cnn_on_the_host_gpu_learns_and_continues_from_a_host_snapshot() {
    // With `compute = "gpu"` the trial's burn worker runs its operations
    // on the Vulkan adapter host compute uses (lavapipe where there is no
    // hardware GPU), with burn's wgpu backend. Its kernels and random
    // generator are not the CPU's, so the curve is compared with itself:
    // three epochs in one go, and two extended to three by `wtune resume`
    // from the snapshot that carries the worker's tensors. The GPU's sums
    // may round differently from one process to the next (autotuning picks
    // each matmul's kernel by timing it), and training makes a difference
    // in the sixth digit one in the fourth within an epoch: the curves are
    // compared to 1%, where a resume that lost the weights would start
    // again near chance (a loss of 2.3). The first call compiles every
    // kernel the CNN uses, with LLVM when the adapter is lavapipe: on two
    // busy cores that alone came near the default two-minute deadline.
    let gpu = "compute = \"gpu\"\ncheckpoint_at_end = true\n[limits]\ncall_timeout = \"10m\"";
    let (whole, expected) = cnn_curve("host", gpu, 3);
    assert!(whole.output.status.success(), "{}", whole.stderr());
    assert_eq!(expected.len(), 3, "{}", whole.stderr());
    assert!(expected[2][2] > 0.8, "{expected:?}");
    let (split, _) = cnn_curve("host", gpu, 2);
    assert!(split.output.status.success(), "{}", split.stderr());
    common::resume_ok(&split.out(), &["--stop", "training_iteration=3"]);
    let resumed = curve(&split.out());
    assert_eq!(resumed.len(), 3);
    for (a, b) in resumed.iter().flatten().zip(expected.iter().flatten()) {
        assert!(
            (a - b).abs() <= 1e-2 * b.abs().max(1.0),
            "{resumed:?} vs {expected:?}"
        );
    }
}

#[test]
fn a_snapshot_of_burn_tensors_resumes_only_on_the_kind_of_backend_that_held_them() {
    // burn's CPU backend stores bools as bytes and its GPU backend as
    // words, and the guest's burn client chose one when it connected: a
    // session cannot move between them. Resumed onto a GPU, the trial is
    // refused with the flag that puts it back; the checkpoint stays, and
    // resuming with that flag continues bit for bit.
    let cpu = "compute = \"cpu\"\ncheckpoint_at_end = true";
    let (whole, expected) = cnn_curve("host", cpu, 3);
    assert!(whole.output.status.success(), "{}", whole.stderr());
    let (split, _) = cnn_curve("host", cpu, 2);
    assert!(split.output.status.success(), "{}", split.stderr());
    let moved = common::wtune()
        .arg("resume")
        .arg(split.out())
        .args(["--stop", "training_iteration=3", "--compute", "gpu"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&moved.stderr);
    assert!(
        stderr.contains("from now on, compute = \"gpu\" (was \"cpu\")"),
        "{stderr}"
    );
    let trials = common::experiment_trials(&split.out());
    assert_eq!(trials[0]["status"], "ERROR", "{stderr}");
    let error = trials[0]["error"].as_str().unwrap();
    assert!(
        error.contains("burn tensors kept by the CPU (burn's CPU backend)")
            && error
                .contains("compute = \"cpu\" (`wtune resume DIR --retry-errored --compute cpu`)"),
        "{error}"
    );
    assert_eq!(curve(&split.out()).len(), 2);
    common::resume_ok(&split.out(), &["--retry-errored", "--compute", "cpu"]);
    assert_eq!(curve(&split.out()), expected);
}

#[test]
fn population_based_training_clones_trials_whose_tensors_the_host_holds() {
    // Two trials at once, one with a learning rate too small to learn in
    // six epochs: at its perturbations it is the lower half, clones the
    // other's host snapshot (its worker's tensors included) and goes on
    // from there. Only a clone that carried the weights ends trained.
    let toml = format!(
        "name = \"cnn-pbt\"\nmetric = \"val_accuracy\"\nmode = \"max\"\n\
         max_concurrent_trials = 2\ncheckpoint_freq = 1\n\
         [resources_per_trial]\ncpu = 0.5\n\
         [stop]\ntraining_iteration = 6\n\
         [scheduler]\ntype = \"pbt\"\nperturbation_interval = 2\nquantile_fraction = 0.5\n\
         [scheduler.hyperparam_mutations]\nlr = {{ loguniform = [1e-6, 1e-5] }}\n\
         [data]\ndigits = \"{}\"\n\
         [param_space]\nlr = {{ grid_search = [1e-6, 0.004] }}\nchannels = 4\n\
         dropout = 0.2\nseed = 3\nbackend = \"host\"\n",
        common::workspace()
            .join("examples/digits-mlp/data")
            .display()
    );
    let run = common::run_cli("digits_cnn", &toml, &[]);
    assert!(run.output.status.success(), "{}", run.stderr());
    let trials = common::experiment_trials(&run.out());
    assert!(
        trials.iter().all(|t| t["status"] == "TERMINATED"),
        "{trials:#?}"
    );
    let decisions = std::fs::read_to_string(run.out().join("decisions.jsonl")).unwrap();
    assert!(
        decisions
            .lines()
            .any(|line| line.contains("\"trial_id\":\"trial_0000\"")
                && line.contains("\"decision\":\"EXPLOIT\"")),
        "{decisions}"
    );
    // The slow learner, whose every lr after a clone is as small, ends
    // where only the other's weights could have taken it.
    let slow = &trials[0];
    let accuracy = slow["last_result"]["val_accuracy"].as_f64().unwrap();
    assert!(accuracy > 0.6, "{slow:#}");
}
