//! Per-trial resource limits and the store limiter that enforces memory and
//! table caps with an error that says which limit was hit.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::units::human_bytes;

/// What one trial may consume. Every field has a safe default; `None` means
/// unlimited where that is allowed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    /// Fuel one call into the guest (`setup`, one `train`, ...) may burn.
    pub fuel_per_call: Option<u64>,
    /// Fuel the whole trial may burn, setup included.
    pub fuel_per_trial: Option<u64>,
    /// Cap on the trial's linear memories together, in bytes (a component
    /// may have several; at most 16, in at most 256 core instances).
    pub memory_bytes: u64,
    /// Cap on the elements of the trial's tables together (function tables
    /// mostly; at most 64 tables).
    pub table_elements: u64,
    /// Wall-clock deadline for one call into the guest.
    pub call_timeout: Option<Duration>,
    /// Cap on each captured stream (stdout, stderr, guest log), in bytes.
    pub log_bytes: u64,
    /// Cap on the state one `save()` may return for a guest checkpoint, in
    /// bytes. The guest memory cap already bounds what the host copies out
    /// (see [`Limits::transfer_bytes`]);
    /// this bounds what lands on disk per checkpoint, so a guest cannot turn
    /// every checkpoint into a disk-filling write. Host snapshots are not
    /// affected (their size follows the guest's memory).
    #[serde(default = "default_checkpoint_bytes")]
    pub checkpoint_bytes: u64,
    /// Cap on the WASI handles a trial holds at once: its open files and
    /// directories, their streams and its pollables. Every open file is a
    /// host file descriptor, so without a cap one trial could take the
    /// descriptors the host and the other trials need (see
    /// [`descriptor_limit`] for the host's side). Crossing it ends the trial
    /// with the limit named.
    #[serde(default = "default_open_files")]
    pub open_files: u64,
    /// Cap on the results one trial's instance reports, in bytes as the
    /// host writes them (each metric's name plus [`RESULT_BYTES_PER_METRIC`]
    /// and [`RESULT_BYTES_PER_REPORT`] for the fields the host adds), so a
    /// guest reporting the largest legal report at every call cannot fill
    /// the disk with `result.jsonl` and `progress.csv`. Crossing it ends the
    /// trial with the limit named. Counted from the instance's start; `wtune
    /// run` also caps the trial's two files at this size over all of its
    /// instances (`report::TrialFiles::cap_per_trial`), so a trial that fails
    /// and is retried cannot write past it either.
    #[serde(default = "default_result_bytes")]
    pub result_bytes: u64,
    /// Cap on what the trial keeps in its own directory (`work/`), in bytes
    /// of file length; counted from what is there when an instance starts.
    /// The write, resize or stream write that would cross it ends the trial
    /// with the limit named.
    #[serde(default = "default_disk_bytes")]
    pub disk_bytes: u64,
    /// Cap on the entries (files, directories, links) in the trial's own
    /// directory.
    #[serde(default = "default_disk_files")]
    pub disk_files: u64,
}

/// 1 GiB of scratch space per trial: data shards and outputs, not a disk.
fn default_disk_bytes() -> u64 {
    1 << 30
}

/// 10,000 entries per trial.
fn default_disk_files() -> u64 {
    10_000
}

/// What the host writes for one metric besides its name, in both result
/// files: a value, quotes and separators.
pub const RESULT_BYTES_PER_METRIC: u64 = 32;
/// What the host writes for one report besides its metrics: the fields it
/// adds (times, fuel, ids, the trial's config is not counted).
pub const RESULT_BYTES_PER_REPORT: u64 = 512;

/// 256 MiB: a hundred metrics for a hundred thousand iterations, far
/// beyond the shipped trainables, far below what hurts a disk.
fn default_result_bytes() -> u64 {
    256 << 20
}

/// 64 MiB: far above what the shipped trainables save, far below what would
/// hurt a disk when every trial checkpoints every few iterations.
fn default_checkpoint_bytes() -> u64 {
    64 << 20
}

/// 1024: a trainable holds a handful of files (its data, a log, its
/// outputs); a thousand leaves room for sharded data sets.
fn default_open_files() -> u64 {
    1024
}

/// Host file descriptors kept for the host itself whatever the trials
/// hold: result, log and checkpoint files, the compile cache, the compute
/// worker's pipes, the dashboard's sockets.
pub const HOST_DESCRIPTORS: u64 = 256;

/// Host file descriptors each running trial needs besides its guest's
/// handles: its three log sinks, its result files and checkpoint writes.
pub const DESCRIPTORS_PER_TRIAL: u64 = 16;

/// How many file descriptors this process may hold, after raising its soft
/// limit (`ulimit -n`) to the hard one, once. `max_concurrent` trials at
/// `open_files` handles each fit when
/// `max_concurrent * (open_files + DESCRIPTORS_PER_TRIAL) + HOST_DESCRIPTORS`
/// is at most this, which is how `wtune run` checks an experiment before
/// starting it.
pub fn descriptor_limit() -> u64 {
    static LIMIT: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *LIMIT.get_or_init(|| {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit/setrlimit only read and write the struct passed.
        unsafe {
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
                return 1024;
            }
            if limit.rlim_cur < limit.rlim_max {
                let raised = libc::rlimit {
                    rlim_cur: limit.rlim_max,
                    rlim_max: limit.rlim_max,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                    limit = raised;
                }
            }
        }
        #[allow(
            clippy::unnecessary_cast,
            reason = "rlim_t is not u64 on every platform"
        )]
        let limit = limit.rlim_cur as u64;
        limit
    })
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            // Roughly 10-30 s of guest work per call on a current core.
            fuel_per_call: Some(50_000_000_000),
            fuel_per_trial: None,
            memory_bytes: 512 << 20,
            table_elements: 100_000,
            call_timeout: Some(Duration::from_secs(120)),
            log_bytes: 10 << 20,
            checkpoint_bytes: default_checkpoint_bytes(),
            open_files: default_open_files(),
            result_bytes: default_result_bytes(),
            disk_bytes: default_disk_bytes(),
            disk_files: default_disk_files(),
        }
    }
}

impl Limits {
    /// Most bytes the host takes out of the guest for one value it reads:
    /// a returned report, checkpoint or message, or the arguments of one
    /// host call. It is the memory cap, since nothing the guest holds once
    /// is larger, so every honest value passes, while a value whose strings
    /// or lists point at the same bytes many times (each reference is a
    /// copy) cannot make the host allocate more than the guest could hold.
    /// Wasmtime's own default, 128 MiB, would refuse a checkpoint that
    /// `checkpoint_bytes` allows, or a compute buffer upload of 200 MiB.
    pub fn transfer_bytes(&self) -> u64 {
        self.memory_bytes
    }
}

/// Why the limiter refused to grow a memory or table; carried inside the
/// trap so the fault can name the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LimitHit {
    Memory { limit: u64, requested: u64 },
    Table { limit: u64, requested: u64 },
    OpenFiles { limit: u64 },
    Results { limit: u64 },
    Disk { limit: u64, requested: u64 },
    DiskFiles { limit: u64 },
}

impl fmt::Display for LimitHit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LimitHit::Memory { limit, requested } => write!(
                f,
                "memory limit {} exceeded (the guest asked for {})",
                human_bytes(*limit),
                human_bytes(*requested)
            ),
            LimitHit::Table { limit, requested } => write!(
                f,
                "table limit of {limit} elements exceeded (the guest asked for {requested})"
            ),
            LimitHit::OpenFiles { limit } => write!(
                f,
                "open-file limit of {limit} handles exceeded (limits.open_files: files, \
                 directories, streams and pollables held at once)"
            ),
            LimitHit::Results { limit } => write!(
                f,
                "result limit {} exceeded (limits.result_size: what one trial's reports may \
                 add to its result files)",
                human_bytes(*limit)
            ),
            LimitHit::Disk { limit, requested } => write!(
                f,
                "disk limit {} of the trial's directory exceeded (limits.disk; the write would \
                 make it {})",
                human_bytes(*limit),
                human_bytes(*requested)
            ),
            LimitHit::DiskFiles { limit } => write!(
                f,
                "limit of {limit} files and directories in the trial's directory exceeded \
                 (limits.disk_files)"
            ),
        }
    }
}

impl std::error::Error for LimitHit {}

/// The store's [`wasmtime::ResourceLimiter`]. It traps on the growth that
/// crosses a cap (rather than failing `memory.grow`), so the trial ends with
/// the limit named instead of a guest allocator's generic abort.
///
/// The caps are on the trial's memories and tables together, not on each:
/// a component may hold several (core instances, multi-memory), and a cap
/// per memory would let it hold that many times the limit. Memories and
/// tables live as long as the store, so what they hold only grows.
pub(crate) struct TrialLimiter {
    memory_bytes: u64,
    table_elements: u64,
    /// What the trial's memories hold together, in bytes.
    memory_held: u64,
    /// What the trial's tables hold together, in elements. Growth that
    /// wasmtime fails after this counted it (no room to map) stays
    /// counted: wasmtime also reports failures this never counted, so
    /// taking one back could undercount, which would let a trial past its
    /// cap.
    table_held: u64,
    /// The first limit hit, kept so the fault can be named even when the
    /// trap's error chain is wrapped by the guest's call path.
    pub(crate) hit: Option<LimitHit>,
}

impl TrialLimiter {
    pub(crate) fn new(limits: &Limits) -> Self {
        Self {
            memory_bytes: limits.memory_bytes,
            table_elements: limits.table_elements,
            memory_held: 0,
            table_held: 0,
            hit: None,
        }
    }

    /// The most bytes the trial's memories may hold together.
    pub(crate) fn memory_cap(&self) -> u64 {
        self.memory_bytes
    }
}

/// Most core instances, memories and tables one trial's store may hold: far
/// more than a component built by a toolchain has (a handful of instances,
/// one or two memories and tables), far fewer than wasmtime's 10,000 each,
/// whose address-space reservations alone would weigh on the host.
const MAX_INSTANCES: usize = 256;
const MAX_MEMORIES: usize = 16;
const MAX_TABLES: usize = 64;

impl wasmtime::ResourceLimiter for TrialLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        // Past its own declared maximum the growth fails anyway (the guest
        // gets -1): it holds nothing more.
        if maximum.is_some_and(|max| desired > max) {
            return Ok(false);
        }
        let grows = (desired as u64).saturating_sub(current as u64);
        let held = self.memory_held.saturating_add(grows);
        if held > self.memory_bytes {
            let hit = LimitHit::Memory {
                limit: self.memory_bytes,
                requested: held,
            };
            self.hit.get_or_insert(hit);
            return Err(wasmtime::Error::new(hit));
        }
        self.memory_held = held;
        Ok(true)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if maximum.is_some_and(|max| desired > max) {
            return Ok(false);
        }
        let grows = (desired as u64).saturating_sub(current as u64);
        let held = self.table_held.saturating_add(grows);
        if held > self.table_elements {
            let hit = LimitHit::Table {
                limit: self.table_elements,
                requested: held,
            };
            self.hit.get_or_insert(hit);
            return Err(wasmtime::Error::new(hit));
        }
        self.table_held = held;
        Ok(true)
    }

    fn instances(&self) -> usize {
        MAX_INSTANCES
    }

    fn memories(&self) -> usize {
        MAX_MEMORIES
    }

    fn tables(&self) -> usize {
        MAX_TABLES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_messages_name_the_limit() {
        let hit = LimitHit::Memory {
            limit: 256 << 20,
            requested: 300 << 20,
        };
        assert_eq!(
            hit.to_string(),
            "memory limit 256 MiB exceeded (the guest asked for 300 MiB)"
        );
    }
}
