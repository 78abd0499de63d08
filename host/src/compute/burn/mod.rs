//! burn operations run by the host: the client side of a trial's
//! `wtune-burn-worker` process (host/burn-worker), which checks each burn-ir
//! operation against the trial's tensors, quota and fuel, and runs it.
//!
//! - [`protocol`]: what the two sides say over the worker's pipes; wtune
//!   forwards the guest's frames without decoding them, so it needs no burn
//!   to build.
//! - [`worker`]: [`BurnWorker`], one trial's worker, streamed to and
//!   waited on with deadlines; killed when a wait runs past one.
//!
//! Not offered to guests yet: the WIT interface, fuel settlement with the
//! store and host snapshots of the trial's tensors are the next steps (see
//! ARCHITECTURE.md, "burn on the host").

pub mod protocol;
pub mod worker;

pub use worker::BurnWorker;
