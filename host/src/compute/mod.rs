//! Host compute: the kernels trainables call through the WIT `compute`
//! interface, run natively by the host on buffers it keeps per trial.
//!
//! - [`Compute`] is the backend every trial of an experiment shares, with
//!   the device-memory pool they draw from.
//! - [`ComputeSession`] is one trial's side: its buffers, the checks every
//!   call passes before any work, its quota and the fuel its kernels cost
//!   (see [`cost`]).
//! - [`cpu`] holds the native kernels (`matrixmultiply`'s threaded SIMD
//!   `sgemm` and vectorized loops).
//!
//! Nothing here knows about wasm: the sandbox converts the WIT types into
//! [`ops`] and settles the fuel with the store.

pub mod cost;
pub mod cpu;
mod error;
pub mod ops;
mod session;

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

pub use error::ComputeError;
pub use session::{ComputeImage, ComputeSession};

use crate::sandbox::human_bytes;

/// Largest single buffer: WebGPU's default `max_buffer_size`, so a model
/// that fits one backend fits the other.
pub const MAX_BUFFER_BYTES: u64 = 256 << 20;

/// Which backend an experiment asks for (`compute = "..."`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ComputeMode {
    /// A GPU when one is present, else the CPU.
    #[default]
    Auto,
    /// The native CPU kernels.
    Cpu,
}

impl FromStr for ComputeMode {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "auto" => Ok(ComputeMode::Auto),
            "cpu" => Ok(ComputeMode::Cpu),
            "gpu" => Err(
                "compute = \"gpu\" needs the wgpu worker, which this build of wtune \
                          does not include yet; use \"auto\" or \"cpu\""
                    .into(),
            ),
            other => Err(format!(
                "compute = {other:?} is not a backend; use \"auto\" or \"cpu\""
            )),
        }
    }
}

impl fmt::Display for ComputeMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ComputeMode::Auto => "auto",
            ComputeMode::Cpu => "cpu",
        })
    }
}

/// The backend and how much device memory trials may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ComputeOptions {
    /// Which backend.
    pub mode: ComputeMode,
    /// Bytes one trial may hold.
    pub trial_quota: u64,
    /// Bytes all trials together may hold.
    pub total_quota: u64,
}

impl Default for ComputeOptions {
    fn default() -> Self {
        Self {
            mode: ComputeMode::Auto,
            trial_quota: 1 << 30,
            total_quota: 4 << 30,
        }
    }
}

/// Where kernels run, as the guest's `info()` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendInfo {
    /// `"gpu"` or `"cpu"`.
    pub kind: &'static str,
    /// The adapter or CPU.
    pub name: String,
    /// Largest single buffer, in bytes.
    pub max_buffer_bytes: u64,
    /// Bytes one trial may hold.
    pub quota_bytes: u64,
    /// Whether custom WGSL pipelines are available.
    pub shaders: bool,
}

/// The compute backend of an experiment: cheap to clone, shared by every
/// trial's [`ComputeSession`].
#[derive(Clone)]
pub struct Compute {
    shared: Arc<Shared>,
}

struct Shared {
    info: BackendInfo,
    total_quota: u64,
    used: AtomicU64,
}

impl Compute {
    /// Picks the backend `options.mode` asks for. Without a GPU backend in
    /// this build, `auto` is the CPU.
    pub fn new(options: ComputeOptions) -> Self {
        match options.mode {
            ComputeMode::Auto | ComputeMode::Cpu => Self::cpu(options),
        }
    }

    /// The native CPU backend.
    pub fn cpu(options: ComputeOptions) -> Self {
        let info = BackendInfo {
            kind: "cpu",
            name: cpu_name(),
            max_buffer_bytes: MAX_BUFFER_BYTES.min(options.trial_quota),
            quota_bytes: options.trial_quota,
            shaders: false,
        };
        Self {
            shared: Arc::new(Shared {
                info,
                total_quota: options.total_quota,
                used: AtomicU64::new(0),
            }),
        }
    }

    /// A session for one trial.
    pub fn session(&self) -> ComputeSession {
        ComputeSession::new(self.clone())
    }

    /// Where kernels run.
    pub fn info(&self) -> BackendInfo {
        self.shared.info.clone()
    }

    /// Bytes all trials hold now.
    pub fn used_bytes(&self) -> u64 {
        self.shared.used.load(Ordering::Acquire)
    }

    fn reserve(&self, bytes: u64) -> Result<(), ComputeError> {
        let total = self.shared.total_quota;
        self.shared
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&after| after <= total)
            })
            .map(drop)
            .map_err(|used| {
                ComputeError::Quota(format!(
                    "all trials together hold {} of compute memory; {} more would pass the \
                     experiment's total of {}",
                    human_bytes(used),
                    human_bytes(bytes),
                    human_bytes(total)
                ))
            })
    }

    fn release(&self, bytes: u64) {
        self.shared.used.fetch_sub(bytes, Ordering::AcqRel);
    }
}

impl fmt::Debug for Compute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Compute")
            .field("info", &self.shared.info)
            .field("used", &self.used_bytes())
            .finish()
    }
}

/// `"AMD EPYC 7B13 (2 threads)"`, from `/proc/cpuinfo` where it exists.
fn cpu_name() -> String {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, name)| name.trim().to_string())
        });
    format!(
        "{} ({threads} threads)",
        model.as_deref().unwrap_or("host CPU")
    )
}
