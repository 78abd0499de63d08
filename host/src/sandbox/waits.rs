//! WASI's blocking waits, bounded by the call's deadline.
//!
//! Epoch interruption only fires while wasm runs: a guest blocked inside a
//! host function (`std::thread::sleep`, a poll on a monotonic-clock
//! subscription, a wait on any pollable) burns no fuel and never reaches an
//! epoch check. Every such wait in WASI preview 2 goes through
//! `wasi:io/poll` (`poll` and `pollable.block`), so these two are replaced
//! here by versions that give up at the call's deadline and fail the call
//! with [`WaitedPastDeadline`], which the sandbox reports as the call's
//! timeout.
//!
//! Not covered, because they cannot block for long: the stream functions
//! (`blocking-read`, `blocking-write-and-flush`, ...) on the streams a trial
//! can hold, which are its files (bounded by the disk), an empty stdin and
//! stdout/stderr sinks that are always ready. Sockets cannot be created
//! (the WASI context refuses TCP, UDP and name lookups).

use std::fmt;
use std::future::Future;
use std::time::Instant;

use wasmtime::component::{HasData, Linker, Resource, ResourceTable};
use wasmtime_wasi::p2::DynPollable;
use wasmtime_wasi::p2::bindings::io::poll as async_poll;
use wasmtime_wasi::p2::bindings::sync::io::poll;
use wasmtime_wasi::runtime::in_tokio;

/// The error a wait returns when the call's deadline passes first; the call
/// then fails as a timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WaitedPastDeadline;

impl fmt::Display for WaitedPastDeadline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the call's deadline passed while the guest waited in wasi:io/poll")
    }
}

impl std::error::Error for WaitedPastDeadline {}

/// A trial's resource table seen through its current call's deadline.
pub(crate) struct Waits<'a> {
    table: &'a mut ResourceTable,
    deadline: Option<Instant>,
}

struct HasWaits;

impl HasData for HasWaits {
    type Data<'a> = Waits<'a>;
}

impl<'a> Waits<'a> {
    /// The waits on `table`'s pollables, bounded by `deadline`.
    pub(crate) fn new(table: &'a mut ResourceTable, deadline: Option<Instant>) -> Self {
        Self { table, deadline }
    }
}

/// Replaces `wasi:io/poll` in a linker that already holds WASI preview 2
/// (`wasmtime_wasi::p2::add_to_linker_sync`) with the bounded waits `get`
/// gives of a store's data.
pub(crate) fn add_to_linker<T: 'static>(
    linker: &mut Linker<T>,
    get: fn(&mut T) -> Waits<'_>,
) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let added = poll::add_to_linker::<T, HasWaits>(linker, get);
    linker.allow_shadowing(false);
    added
}

/// Runs `wait` until it finishes or `deadline` passes.
fn bounded<F: Future>(deadline: Option<Instant>, wait: F) -> wasmtime::Result<F::Output> {
    match deadline {
        None => Ok(in_tokio(wait)),
        // The timer is made inside the runtime `in_tokio` enters.
        Some(deadline) => {
            in_tokio(async move { tokio::time::timeout_at(deadline.into(), wait).await })
                .map_err(|_| wasmtime::Error::new(WaitedPastDeadline))
        }
    }
}

impl poll::Host for Waits<'_> {
    fn poll(&mut self, pollables: Vec<Resource<DynPollable>>) -> wasmtime::Result<Vec<u32>> {
        bounded(self.deadline, async_poll::Host::poll(self.table, pollables))?
    }
}

impl poll::HostPollable for Waits<'_> {
    fn ready(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<bool> {
        // Checks readiness without waiting; bounded all the same, since the
        // check runs the pollable's future once.
        bounded(
            self.deadline,
            async_poll::HostPollable::ready(self.table, pollable),
        )?
    }

    fn block(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<()> {
        bounded(
            self.deadline,
            async_poll::HostPollable::block(self.table, pollable),
        )?
    }

    fn drop(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<()> {
        async_poll::HostPollable::drop(self.table, pollable)
    }
}
