//! wtune's burn executor: one trial's burn tensors, run on the host.
//!
//! A guest built with burn and wtune's `burn-remote` client sends its
//! tensor operations as frames of burn-ir commands (`burn_remote::wire`).
//! This crate runs them on burn's CPU backend (`flex`), or on a GPU
//! through burn's wgpu backend ([`gpu`]), for one trial,
//! after checking each one: that it names only tensors the trial holds, as
//! they are; that its outputs have the shapes its inputs make
//! ([`shapes`]); that they fit the trial's memory quota ([`ledger`]), with
//! the scratch space the backend takes beside them ([`scratch`]); and
//! that the trial can pay its fuel ([`cost`]). See [`Session`].
//!
//! The `wtune-burn-worker` executable serves one [`Session`] over its
//! stdin and stdout ([`protocol`]): wtune starts one per trial, so a burn
//! kernel that misbehaves on hostile input takes down that trial's worker,
//! not wtune or another trial. On the CPU the worker runs under a system
//! call filter that leaves it its pipes and its memory; on a GPU, whose
//! driver needs files and executable memory, under one that refuses new
//! processes, sockets and signals to others ([`confine`]).
//!
//! [`Session::image`] and [`Session::restore`] carry a session through the
//! host's snapshots.
//!
//! Not covered: the operations [`shapes`] does not list.

pub mod confine;
pub mod cost;
pub mod gpu;
pub mod ledger;
pub mod protocol;
pub mod scratch;
mod session;
pub mod shapes;
pub mod storage;

pub use session::{MAX_DRAW_RUNS, MAX_REPLAY_ELEMENTS, Session, Usage};
