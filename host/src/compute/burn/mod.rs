//! burn operations run by the host: the client side of a trial's
//! `wtune-burn-worker` process (host/burn-worker), which checks each burn-ir
//! operation against the trial's tensors, quota and fuel, and runs it.
//!
//! - [`protocol`]: what the two sides say over the worker's pipes; wtune
//!   forwards the guest's frames without decoding them, so it needs no burn
//!   to build.
//! - [`worker`]: [`BurnWorker`], one trial's worker, streamed to and
//!   waited on with deadlines; killed when a wait runs past one.
//! - [`lane`]: [`BurnLane`], the worker as a trial's
//!   [`ComputeSession`](super::ComputeSession) holds it: started at the
//!   first call with the rest of the trial's quota, its fuel settled
//!   through the session's meter. The sandbox offers it to guests as the
//!   WIT `burn` interface.
//!
//! Not built yet: host snapshots of the trial's tensors (refused, with the
//! reason; see ARCHITECTURE.md, "burn on the host").

pub mod lane;
pub mod protocol;
pub mod worker;

pub use lane::BurnLane;

pub use worker::BurnWorker;
