//! # wtune: hyperparameter tuning with sandboxed WebAssembly trainables
//!
//! Trainables are WebAssembly components built against the
//! `wtune:trainable` WIT world (see the `wtune-guest` crate for writing
//! them). Each trial runs in its own wasmtime instance with metered fuel,
//! capped memory, a wall-clock deadline per call and a filesystem limited to
//! its own directory plus read-only data grants.
//!
//! Layers, each usable on its own:
//! - [`sandbox`]: wasmtime: loading, checking and instantiating components;
//!   the only module that names wasmtime types.
//! - [`tune`]: trials, search spaces, stopping, schedulers and the runner
//!   loop, independent of how trials execute.
//! - [`compute`]: the native kernels behind the guests' `compute` interface,
//!   with per-trial buffers, quotas and fuel charges.
//! - [`wasm_backend`]: the backend that runs the runner's trials in the
//!   sandbox (also reachable as `exec`, its earlier name).
//! - [`report`]: result files, `experiment.json`, progress and summaries.
//! - [`config`]: the experiment file and command-line overrides.
//! - [`units`] and [`machine`]: the ground floor every layer may use (sizes,
//!   fuel and durations as people write them; the GPUs and memory this
//!   process can use).
//!
//! Embedding, in short:
//! ```no_run
//! use wtune::{config, wasm_backend::WasmBackend, report, sandbox::{Sandbox, SandboxOptions}, tune::{self, Fifo, Runner}};
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let model = std::path::Path::new("model.wasm");
//! let plan = config::plan(model, Some("experiment.toml".as_ref()), &Default::default())?;
//! let sandbox = Sandbox::new(SandboxOptions::default())?;
//! let program = sandbox.load(model)?;
//! // GPU shares count against the adapters host compute runs on, if any.
//! let mut spec = plan.spec;
//! tune::fit_gpu(&mut spec.resources, &mut spec.resources_per_trial, program.compute_gpus())?;
//! let backend = WasmBackend::new(program, plan.limits, plan.data);
//! let summary = Runner::new(backend, spec, Box::new(Fifo::default()))
//!     .callback(report::TrialFiles::new())
//!     .run()
//!     .await?;
//! println!("{}", report::summary_text(&summary));
//! # Ok(()) }
//! ```

pub mod cli;
pub mod compute;
pub mod config;
pub mod machine;
pub mod persist;
pub mod process;
pub mod report;
pub mod sandbox;
pub mod serve;
pub mod snapshot;
pub mod text;
pub mod tune;
pub mod units;
pub mod wasm_backend;

/// The wasm trial backend under its earlier name, kept so that code written
/// against it still builds.
pub mod exec {
    pub use crate::wasm_backend::*;
}
