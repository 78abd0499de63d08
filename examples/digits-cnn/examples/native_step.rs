//! Times the trainable natively (no sandbox, no fuel metering) to compare
//! with the per-epoch wall time wtune reports for the wasm component.
//!
//! `cargo run --release --example native_step -- [channels] [epochs] [place]`
//!
//! `place` is where the tensor operations run:
//! - `flex` (the default): burn-flex in this process, as the guest's
//!   `backend = "wasm"` runs them inside the sandbox;
//! - `worker`: the model's code stays here and sends every operation, as
//!   `backend = "host"` does, to wtune's burn executor (the
//!   `wtune-burn-worker` session) in this process. Against `flex` this
//!   measures what checking and charging each operation costs; against the
//!   sandboxed `host` backend, what the sandbox and the pipe cost.

mod common;

use std::time::Instant;

use common::InProcessWorker;
use digits_cnn::{Backend, Config, DigitsCnn};

fn main() {
    let mut args = std::env::args().skip(1);
    let channels = args.next().map_or(8, |a| a.parse().expect("channels"));
    let epochs: usize = args.next().map_or(5, |a| a.parse().expect("epochs"));
    let backend = match args.next().as_deref() {
        None | Some("flex") => Backend::Wasm,
        Some("worker") => {
            InProcessWorker::install();
            Backend::Host
        }
        Some(other) => panic!("place `{other}`: expected `flex` or `worker`"),
    };
    let config = Config {
        lr: 4e-3,
        channels,
        hidden: 64,
        dropout: 0.1,
        batch_size: 64,
        weight_decay: 0.0,
        seed: 0,
        data_dir: concat!(env!("CARGO_MANIFEST_DIR"), "/../digits-mlp/data").to_owned(),
        backend,
    };
    let start = Instant::now();
    let mut trainable = DigitsCnn::from_config(config).expect("setup");
    println!(
        "setup: {:.3}s ({} parameters)",
        start.elapsed().as_secs_f64(),
        trainable.parameter_count()
    );
    for epoch in 1..=epochs {
        let start = Instant::now();
        let train_loss = trainable.train_epoch().expect("an epoch");
        let trained = start.elapsed().as_secs_f64();
        let val = trainable.evaluate().expect("an evaluation");
        println!(
            "epoch {epoch}: train {trained:.3}s + eval {:.3}s, train_loss {train_loss:.4}, val_loss {:.4}, val_accuracy {:.4}",
            start.elapsed().as_secs_f64() - trained,
            val.loss,
            val.accuracy
        );
    }
}
