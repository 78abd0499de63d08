//! Tabulates digits-cnn's learning curves over a grid of hyperparameters:
//! `examples/replay/curves/digits-cnn.json`, a curve set for wtune's replay
//! backend (`wtune::tune::replay::CurveSet`) from real training, as
//! NAS-Bench and LCBench tabulate theirs.
//!
//! `cargo run --release --example tabulate -- [--jobs N] > digits-cnn.json`
//!
//! Every configuration of [`GRID`] trains for [`EPOCHS`] epochs from seed 0
//! and records `val_loss` and `val_accuracy` after each epoch. Its
//! operations run on wtune's burn executor in this process (as with
//! `backend = "host"`, without the sandbox), whose charge for an epoch's
//! work (flops and bytes moved, on the host compute scale) is the curve's
//! `fuel_per_epoch`: the mean over its epochs, so cost is a function of
//! the configuration's shapes, not of this machine's speed. The numbers
//! are this machine's burn-flex arithmetic; another CPU may round a few
//! sums differently.
//!
//! burn-flex's random generator is process-global, so the grid is split
//! between `--jobs` child processes (`--shard K/N`: every N-th
//! configuration from the K-th), not threads.

mod common;

use std::fmt::Write as _;
use std::process::{Command, Stdio};

use burn::tensor::Device;
use common::InProcessWorker;
use digits_cnn::{Backend, Config, DigitsCnn};

/// Epochs per curve: 27 = 3^3, whole rungs for ASHA with reduction factor 3.
const EPOCHS: usize = 27;

/// The grid's axes, in the order of the set's `params`.
const LRS: [f64; 6] = [1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2];
const CHANNELS: [usize; 4] = [2, 4, 8, 16];
const HIDDEN: [usize; 3] = [16, 64, 256];
const DROPOUT: [f64; 3] = [0.0, 0.25, 0.5];
const BATCH: [usize; 3] = [16, 64, 256];

const DESCRIPTION: &str = "Learning curves of examples/digits-cnn (burn 0.22, a two-convolution CNN \
     with Adam) on the shipped digits data, one curve per configuration of the grid, trained from \
     seed 0 for 27 epochs by examples/digits-cnn/examples/tabulate.rs; val_loss and val_accuracy \
     on the fixed 20% validation split after each epoch. fuel_per_epoch is what wtune's burn \
     executor charges for an epoch's operations (host compute scale), the mean over the epochs.";

/// One configuration's place in the grid.
fn grid() -> Vec<(f64, usize, usize, f64, usize)> {
    let mut configs = Vec::new();
    for lr in LRS {
        for channels in CHANNELS {
            for hidden in HIDDEN {
                for dropout in DROPOUT {
                    for batch in BATCH {
                        configs.push((lr, channels, hidden, dropout, batch));
                    }
                }
            }
        }
    }
    configs
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        [] => parent(1),
        ["--jobs", n] => parent(n.parse().expect("--jobs takes a number")),
        ["--shard", shard] => {
            let (k, n) = shard.split_once('/').expect("--shard K/N");
            child(k.parse().expect("K"), n.parse().expect("N"));
        }
        _ => panic!("usage: tabulate [--jobs N] | --shard K/N"),
    }
}

/// Runs the shards and writes the set, its curves in grid order.
fn parent(jobs: usize) {
    let jobs = jobs.max(1);
    let me = std::env::current_exe().expect("this program's path");
    // One thread per shard drains its output as it comes: a shard blocked
    // on a full pipe would wait for the shards before it.
    let shards: Vec<_> = (0..jobs)
        .map(|k| {
            let child = Command::new(&me)
                .args(["--shard", &format!("{k}/{jobs}")])
                .stdout(Stdio::piped())
                .spawn()
                .expect("a shard starts");
            std::thread::spawn(move || child.wait_with_output().expect("a shard runs"))
        })
        .collect();
    let mut lines: Vec<(usize, String)> = Vec::new();
    for (k, shard) in shards.into_iter().enumerate() {
        let output = shard.join().expect("a shard's reader");
        assert!(
            output.status.success(),
            "shard {k}/{jobs} failed ({}); its configurations are those of index {k} mod {jobs}",
            output.status
        );
        for line in String::from_utf8(output.stdout).expect("UTF-8").lines() {
            let (index, curve) = line.split_once(' ').expect("index and curve");
            lines.push((index.parse().expect("an index"), curve.to_owned()));
        }
    }
    lines.sort_by_key(|(index, _)| *index);
    assert_eq!(lines.len(), grid().len(), "every configuration tabulated");

    // One curve per line, so a regenerated set diffs by configuration.
    let json = |value: serde_json::Value| value.to_string();
    let axes = [
        ("lr", json(LRS.into())),
        ("channels", json(CHANNELS.into())),
        ("hidden", json(HIDDEN.into())),
        ("dropout", json(DROPOUT.into())),
        ("batch_size", json(BATCH.into())),
    ];
    let mut out = String::new();
    out.push_str("{\n  \"name\": \"digits-cnn\",\n");
    let _ = writeln!(out, "  \"description\": {},", json(DESCRIPTION.into()));
    out.push_str("  \"metric\": \"val_loss\",\n  \"mode\": \"min\",\n");
    let _ = writeln!(out, "  \"epochs\": {EPOCHS},\n  \"params\": {{");
    let params: Vec<String> = axes
        .iter()
        .map(|(name, values)| format!("    \"{name}\": {values}"))
        .collect();
    let _ = writeln!(out, "{}", params.join(",\n"));
    out.push_str("  },\n  \"curves\": [\n");
    let curves: Vec<String> = lines.iter().map(|(_, c)| format!("    {c}")).collect();
    let _ = writeln!(out, "{}", curves.join(",\n"));
    out.push_str("  ]\n}\n");
    print!("{out}");
}

/// Trains every `n`-th configuration from the `k`-th; prints each as
/// `index curve-json`.
fn child(k: usize, n: usize) {
    let worker = InProcessWorker::install();
    let host = Device::new(burn_remote::host());
    let data_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../digits-mlp/data");
    let grid = grid();
    for (index, &(lr, channels, hidden, dropout, batch_size)) in
        grid.iter().enumerate().skip(k).step_by(n)
    {
        let config = Config {
            lr,
            channels,
            hidden,
            dropout,
            batch_size,
            weight_decay: 0.0,
            seed: 0,
            data_dir: data_dir.to_owned(),
            backend: Backend::Host,
        };
        let mut trainable = DigitsCnn::from_config(config).expect("a valid config");
        // The previous configuration's frees and this one's initial weights
        // are still queued in the client: run them before the meter starts,
        // so every curve's cost is its epochs' alone.
        host.sync().expect("the executor runs the set-up");
        worker.take_fuel_spent();
        let (mut losses, mut accuracies, mut fuel) = (Vec::new(), Vec::new(), 0u64);
        for _ in 0..EPOCHS {
            let train_loss = trainable.train_epoch().expect("an epoch");
            let val = trainable.evaluate().expect("an evaluation");
            fuel += worker.take_fuel_spent();
            // A diverged run reports the worst loss, as a failing trial
            // would be scored; JSON has no NaN.
            let loss = if train_loss.is_finite() && val.loss.is_finite() {
                val.loss
            } else {
                f64::MAX
            };
            losses.push(round6(loss.min(1e6)));
            accuracies.push(round6(val.accuracy));
        }
        let curve = serde_json::json!({
            "config": {
                "lr": lr, "channels": channels, "hidden": hidden,
                "dropout": dropout, "batch_size": batch_size,
            },
            "fuel_per_epoch": fuel / EPOCHS as u64,
            "metrics": {"val_loss": losses, "val_accuracy": accuracies},
        });
        println!("{index} {curve}");
        eprintln!(
            "[{index}/{}] lr {lr} channels {channels} hidden {hidden} dropout {dropout} batch {batch_size}: val_loss {}",
            grid.len(),
            losses[EPOCHS - 1]
        );
    }
}

fn round6(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}
