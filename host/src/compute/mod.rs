//! Host compute: the kernels trainables call through the WIT `compute`
//! interface, run natively by the host on buffers it keeps per trial.
//!
//! - [`Compute`] is the backend every trial of an experiment shares, with
//!   the device-memory pool they draw from.
//! - [`ComputeSession`] is one trial's side: its buffers, the checks every
//!   call passes before any work, its quota and the fuel its kernels cost
//!   (see [`cost`]).
//! - [`device`] is where buffers live and checked jobs run: host memory and
//!   [`cpu`]'s native kernels (`matrixmultiply`'s threaded SIMD `sgemm` and
//!   vectorized loops), or a GPU through [`gpu`]'s supervised wgpu worker
//!   processes.
//!
//! Nothing here knows about wasm: the sandbox converts the WIT types into
//! [`ops`] and settles the fuel with the store.

pub mod burn;
pub mod cost;
pub mod cpu;
pub mod device;
mod error;
pub mod gpu;
mod gpu_choice;
pub mod ops;
mod session;

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

pub use error::ComputeError;
pub use gpu_choice::GpuChoice;
pub use session::{ComputeImage, ComputeSession, MAX_BUFFERS, MAX_PIPELINES, MAX_WGSL_BYTES};

use crate::units::human_bytes;
use device::CpuDevice;
pub use device::MAX_BUFFER_BYTES;
use gpu::{GpuDevice, WorkerPool};

/// Which backend an experiment asks for (`compute = "..."`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ComputeMode {
    /// A hardware GPU when one is present, else the CPU. Software Vulkan
    /// (lavapipe) is slower than the CPU kernels, so `auto` never picks it.
    #[default]
    Auto,
    /// The native CPU kernels.
    Cpu,
    /// A Vulkan adapter through the wgpu worker, software ones included;
    /// the experiment fails to start without one.
    Gpu,
}

impl FromStr for ComputeMode {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "auto" => Ok(ComputeMode::Auto),
            "cpu" => Ok(ComputeMode::Cpu),
            "gpu" => Ok(ComputeMode::Gpu),
            other => Err(format!(
                "compute = {other:?} is not a backend; use \"auto\", \"cpu\" or \"gpu\""
            )),
        }
    }
}

impl fmt::Display for ComputeMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ComputeMode::Auto => "auto",
            ComputeMode::Cpu => "cpu",
            ComputeMode::Gpu => "gpu",
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

impl ComputeOptions {
    /// How many trials' quotas the total holds: the most trials that use
    /// host compute which may run at once, each sure of its whole quota.
    pub fn shares(&self) -> u64 {
        self.total_quota / self.trial_quota.max(1)
    }
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
    /// The GPU workers, when kernels run there.
    gpu: Option<Arc<WorkerPool>>,
}

impl Compute {
    /// Picks the backend `options.mode` asks for. `gpu` without a usable
    /// Vulkan adapter is an error naming why; `auto` then quietly uses the
    /// CPU, and looks for an adapter only where GPUs are detected.
    pub fn new(options: ComputeOptions) -> Result<Self, String> {
        match options.mode {
            ComputeMode::Cpu => Ok(Self::cpu(options)),
            ComputeMode::Gpu => match WorkerPool::open()? {
                Ok(pool) => Ok(Self::gpu(options, pool)),
                Err(reason) => Err(format!(
                    "compute = \"gpu\" found no GPU: {reason}. Install the GPU's Vulkan \
                     driver (or mesa-vulkan-drivers for software Vulkan), or use \
                     compute = \"auto\" or \"cpu\""
                )),
            },
            ComputeMode::Auto => {
                let gpus = crate::machine::machine_gpus();
                if gpus == 0 {
                    return Ok(Self::cpu(options));
                }
                match WorkerPool::open() {
                    Ok(Ok(pool)) if !pool.adapter().software => Ok(Self::gpu(options, pool)),
                    Ok(Ok(pool)) => {
                        tracing::info!(
                            adapter = %pool.adapter().name,
                            "compute: the only Vulkan adapter is software; using the CPU kernels"
                        );
                        Ok(Self::cpu(options))
                    }
                    Ok(Err(reason)) | Err(reason) => {
                        tracing::warn!(
                            "compute: {gpus} GPU(s) detected but not usable ({reason}); using \
                             the CPU kernels"
                        );
                        Ok(Self::cpu(options))
                    }
                }
            }
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
        Self::with(info, options, None)
    }

    fn gpu(options: ComputeOptions, pool: Arc<WorkerPool>) -> Self {
        let adapter = pool.adapter();
        let info = BackendInfo {
            kind: "gpu",
            name: gpu::protocol::described(&adapter.name, &adapter.driver),
            max_buffer_bytes: MAX_BUFFER_BYTES
                .min(adapter.max_buffer_bytes)
                .min(options.trial_quota),
            quota_bytes: options.trial_quota,
            shaders: true,
        };
        Self::with(info, options, Some(pool))
    }

    fn with(info: BackendInfo, options: ComputeOptions, gpu: Option<Arc<WorkerPool>>) -> Self {
        Self {
            shared: Arc::new(Shared {
                info,
                total_quota: options.total_quota,
                used: AtomicU64::new(0),
                gpu,
            }),
        }
    }

    /// A session for one trial on the first GPU ([`Compute::session_on`]).
    pub fn session(&self) -> ComputeSession {
        self.session_on(0)
    }

    /// A session for one trial on GPU `gpu` (numbered from 0 among the
    /// adapters host compute uses: [`Compute::gpus`]); the CPU backend
    /// ignores it. On a GPU it starts (or takes an idle) worker process
    /// at its first job; a `gpu` that does not exist fails that job.
    pub fn session_on(&self, gpu: usize) -> ComputeSession {
        let device: Box<dyn device::Device> = match &self.shared.gpu {
            Some(pool) => Box::new(GpuDevice::new(Arc::clone(pool), gpu)),
            None => Box::new(CpuDevice::new(self.shared.info.name.clone())),
        };
        ComputeSession::new(self.clone(), device, gpu)
    }

    /// How many GPUs kernels run on: the Vulkan adapters of the best kind
    /// present (every discrete GPU the driver shows, say), or 0 on the CPU
    /// backend.
    pub fn gpus(&self) -> usize {
        self.shared.gpu.as_ref().map_or(0, |pool| pool.adapters())
    }

    /// The number ([`Compute::session_on`]) of the GPU `choice` names;
    /// an error lists the GPUs there are (none on the CPU backend).
    pub fn gpu_index(&self, choice: &GpuChoice) -> Result<usize, String> {
        let adapters: Vec<(String, String)> = match &self.shared.gpu {
            Some(pool) => {
                let adapter = pool.adapter();
                let buses = adapter
                    .pci_buses
                    .iter()
                    .cloned()
                    .chain(std::iter::repeat(String::new()));
                adapter.all.iter().cloned().zip(buses).collect()
            }
            None => Vec::new(),
        };
        choice.resolve(&adapters)
    }

    /// Where a burn worker for a session on GPU `gpu` runs
    /// ([`Compute::session_on`]): on that GPU on the GPU backend, else on
    /// the CPU. A `gpu` that does not exist is named to the worker all the
    /// same, which then fails to start, with the reason.
    pub fn burn_device(&self, gpu: usize) -> burn::BurnDevice {
        let Some(pool) = &self.shared.gpu else {
            return burn::BurnDevice::Cpu;
        };
        let adapter = pool.adapter();
        burn::BurnDevice::Gpu {
            described: adapter.all.get(gpu).cloned().unwrap_or_default(),
            pci_bus: adapter.pci_buses.get(gpu).cloned().unwrap_or_default(),
        }
    }

    /// Where kernels run: on the GPU backend, the first GPU.
    pub fn info(&self) -> BackendInfo {
        self.shared.info.clone()
    }

    /// Where kernels run for a session on GPU `gpu` ([`Compute::session_on`]).
    pub fn info_on(&self, gpu: usize) -> BackendInfo {
        let mut info = self.info();
        if let Some(name) = self
            .shared
            .gpu
            .as_ref()
            .and_then(|p| p.adapter().all.get(gpu))
        {
            info.name.clone_from(name);
        }
        info
    }

    /// Most loop iterations a built-in kernel may run per invocation, where
    /// the adapter is software Vulkan ([`gpu::SOFTWARE_LOOP_CAP`]).
    pub fn loop_cap(&self) -> Option<u64> {
        let pool = self.shared.gpu.as_ref()?;
        pool.adapter().software.then_some(gpu::SOFTWARE_LOOP_CAP)
    }

    /// Most workgroups a custom dispatch may ask for along one dimension
    /// (`None` where there are no custom shaders).
    pub fn max_workgroups(&self) -> Option<u32> {
        self.shared
            .gpu
            .as_ref()
            .map(|pool| pool.adapter().max_workgroups)
    }

    /// Bytes set aside for trials now: a whole quota for every trial that
    /// holds a buffer (see [`ComputeSession`]).
    pub fn used_bytes(&self) -> u64 {
        self.shared.used.load(Ordering::Acquire)
    }

    /// Sets a trial's whole quota aside in the experiment's total, at its
    /// first buffer. Only this can fail on other trials' account, and not
    /// under a runner that starts at most [`ComputeOptions::shares`] trials
    /// of a compute-using program at once.
    fn reserve_share(&self) -> Result<(), ComputeError> {
        let total = self.shared.total_quota;
        let share = self.shared.info.quota_bytes;
        self.shared
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(share).filter(|&after| after <= total)
            })
            .map(drop)
            .map_err(|used| {
                ComputeError::Quota(format!(
                    "{} trials already hold their compute memory quota of {} each, and \
                     another would pass the experiment's total of {} \
                     (limits.compute_memory_total); run fewer trials at once",
                    used / share.max(1),
                    human_bytes(share),
                    human_bytes(total)
                ))
            })
    }

    fn release_share(&self) {
        let share = self.shared.info.quota_bytes;
        self.shared.used.fetch_sub(share, Ordering::AcqRel);
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
