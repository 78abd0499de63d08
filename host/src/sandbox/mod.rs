//! The sandbox layer: the only part of wtune that touches wasmtime.
//!
//! A [`Sandbox`] owns the engine (fuel metering and epoch interruption on),
//! the linker with WASI and the wtune host imports, and the on-disk cache of
//! compiled components. [`Sandbox::load`] turns a `.wasm` file into a
//! [`Program`] (compiled once, checked against the `wtune:trainable` world,
//! pre-instantiated); [`Program::instantiate`] gives one trial its own
//! [`TrialInstance`] with its own store, limits and filesystem view.
//!
//! Everything a guest can do wrong comes back as a [`TrialFault`] whose
//! message names the call and the cause; the host is never disturbed.

mod accessor;
mod bindings;
mod burn;
mod cache;
mod capture;
mod compile;
mod compute;
mod contract;
mod disk;
mod engine;
mod fault;
mod instance;
mod limits;
mod memory;
mod program;
mod random;
mod signals;
mod store_data;
mod waits;
mod wit_text;

pub use crate::units::{fuel_text, human_bytes};
pub use accessor::SnapshotError;
pub use cache::ArtifactCache;
pub use compile::worker_main as compile_worker_main;
pub use contract::{ComponentDescription, ContractError, WORLD};
pub use engine::{CompileIsolation, CompileOptions, Sandbox, SandboxOptions};
pub use fault::{At, Call, FaultKind, TrialFault};
pub use instance::{CallStats, GuestReport, TrialInstance, check_train_return};
pub use limits::{DESCRIPTORS_PER_TRIAL, HOST_DESCRIPTORS, Limits, descriptor_limit};
pub use program::{LoadError, Program, TrialEnv};
pub use signals::reinstate_trap_handlers;
