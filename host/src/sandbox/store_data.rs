//! The per-trial host state kept in each store, and the host side of the
//! `wtune:trainable/host` interface.

use std::time::SystemTime;

use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::bindings::wtune::trainable::{host, types};
use super::capture::{CappedSink, MemorySink};
use super::limits::TrialLimiter;

/// Longest log line kept; longer ones are cut with a marker.
const MAX_LOG_LINE: usize = 16 << 10;

/// What one trial's store holds besides the guest itself.
pub(crate) struct TrialHost {
    pub(crate) wasi: WasiCtx,
    pub(crate) table: ResourceTable,
    pub(crate) limiter: TrialLimiter,
    pub(crate) guest_log: CappedSink,
    /// Shares its file with the guest's stderr; read for panic messages.
    pub(crate) stderr: CappedSink,
    pub(crate) stdout: CappedSink,
    /// Receives memory contents while a host snapshot is taken.
    pub(crate) sink: Option<MemorySink>,
    /// The trial's host compute buffers and fuel meter.
    pub(crate) compute: crate::compute::ComputeSession,
    /// Bytes of stdout and stderr already charged fuel.
    pub(crate) output_charged: u64,
    /// When the current call must end; WASI waits give up then (see
    /// [`super::waits`]).
    pub(crate) call_deadline: Option<std::time::Instant>,
    /// What the trial keeps in its directory (see [`super::disk`]).
    pub(crate) disk: std::sync::Arc<super::disk::DiskQuota>,
    /// What the trial's `wasi:random` generators drew (see [`super::random`]).
    pub(crate) random: super::random::RandomMeter,
}

impl TrialHost {
    /// Charges fuel for what the guest wrote to stdout and stderr, read and
    /// wrote through its files, and drew from `wasi:random`, since the last
    /// charge: a byte each, as for `log` lines (a sync as a mebibyte, a
    /// random byte as the four its generator draws). The host makes every
    /// byte (past the output cap too), so this must not be free, or a guest
    /// could spend host time without spending its budget.
    ///
    /// Also lets go of files the trial removed and no longer holds (see
    /// [`super::disk::DiskQuota::sweep`]): a stream dropped is a host call
    /// that ends here, and the file's host handle must not outlive it.
    pub(crate) fn charge_output(&mut self) {
        let offered = self.stdout.offered() + self.stderr.offered();
        let new = offered.saturating_sub(self.output_charged);
        let work = self.disk.take_work().saturating_add(self.random.take());
        if new > 0 || work > 0 {
            self.output_charged = offered;
            self.compute.charge_host_work(new.saturating_add(work));
        }
        self.disk.sweep();
    }
}

impl TrialHost {
    /// WASI's waits, bounded by the current call's deadline.
    pub(crate) fn waits(&mut self) -> super::waits::Waits<'_> {
        super::waits::Waits::new(&mut self.table, self.call_deadline)
    }

    /// WASI's filesystem, charged to the trial's disk quota.
    pub(crate) fn guarded_fs(&mut self) -> super::disk::GuardedFs<'_> {
        let view = wasmtime_wasi::filesystem::WasiFilesystemCtxView {
            ctx: self.wasi.filesystem(),
            table: &mut self.table,
        };
        super::disk::GuardedFs::new(view, &self.disk)
    }
}

impl WasiView for TrialHost {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl types::Host for TrialHost {}

impl host::Host for TrialHost {
    fn log(&mut self, level: types::Level, message: String) {
        // The host copied the whole message out of the guest before this
        // call began, whatever part of it is kept: a byte of fuel per byte,
        // about what writing it in wasm would cost.
        self.compute.charge_host_work(message.len() as u64);
        let level = match level {
            types::Level::Trace => "TRACE",
            types::Level::Debug => "DEBUG",
            types::Level::Info => "INFO",
            types::Level::Warn => "WARN",
            types::Level::Error => "ERROR",
        };
        let mut line = format!(
            "{} {level:<5} ",
            humantime::format_rfc3339_millis(SystemTime::now())
        );
        if message.len() > MAX_LOG_LINE {
            let cut = message.floor_char_boundary(MAX_LOG_LINE);
            line.push_str(&message[..cut]);
            line.push_str(&format!(
                " [wtune: a line of {} bytes, cut at {MAX_LOG_LINE}]",
                message.len()
            ));
        } else {
            line.push_str(&message);
        }
        line.push('\n');
        // A log file that cannot be written must not fail the guest's call:
        // logging is best effort, like a full disk under any logger.
        if let Err(err) = self.guest_log.write(line.as_bytes()) {
            tracing::debug!("guest log write failed: {err}");
        }
    }
}
