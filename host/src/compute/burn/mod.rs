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
//! - [`BurnDevice`]: where the worker runs the trial's operations;
//!   [`BurnImage`]: its session in a host snapshot, with the kind of
//!   backend that held it.

pub mod lane;
pub mod protocol;
pub mod worker;

pub use lane::BurnLane;

pub use worker::BurnWorker;

use serde::{Deserialize, Serialize};

use super::ComputeMode;

/// Where a trial's burn worker keeps its tensors and runs its operations:
/// burn's CPU backend on the CPU backend of host compute, else burn's wgpu
/// backend on the GPU host compute placed the trial on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BurnDevice {
    Cpu,
    /// A Vulkan adapter, as host compute names it.
    Gpu {
        /// Its description (`compute::gpu::protocol::described`), which
        /// the worker matches when there is no PCI address.
        described: String,
        /// Its PCI address; empty where the driver reports none.
        pci_bus: String,
    },
}

impl BurnDevice {
    /// The kind of burn backend the worker runs here.
    pub fn backend(&self) -> BurnBackend {
        match self {
            BurnDevice::Cpu => BurnBackend::Cpu,
            BurnDevice::Gpu { .. } => BurnBackend::Gpu,
        }
    }

    /// The worker's arguments that choose this device.
    pub fn args(&self) -> Vec<String> {
        match self {
            BurnDevice::Cpu => Vec::new(),
            BurnDevice::Gpu { pci_bus, .. } if !pci_bus.is_empty() => {
                vec!["--gpu-pci".into(), pci_bus.clone()]
            }
            BurnDevice::Gpu { described, .. } => vec!["--gpu".into(), described.clone()],
        }
    }
}

/// The kind of burn backend that holds a trial's tensors. A snapshot's
/// burn session goes back only to the kind it came from: burn's CPU
/// backend stores bools as bytes and its wgpu backend as 32-bit words,
/// which the guest's burn client chose when it connected and keeps in the
/// guest memory the snapshot restores, and the two draw different random
/// numbers from the same seed. Any GPU restores a GPU's session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BurnBackend {
    Cpu,
    Gpu,
}

impl BurnBackend {
    /// As errors name it.
    pub fn described(self) -> &'static str {
        match self {
            BurnBackend::Cpu => "the CPU (burn's CPU backend)",
            BurnBackend::Gpu => "a GPU (burn's wgpu backend)",
        }
    }

    /// The `compute` setting that puts a resumed trial back on this kind.
    pub fn compute_mode(self) -> ComputeMode {
        match self {
            BurnBackend::Cpu => ComputeMode::Cpu,
            BurnBackend::Gpu => ComputeMode::Gpu,
        }
    }
}

/// A trial's burn session in a host snapshot: the worker's image of it
/// (opaque to wtune), the kind of backend that held it, and the part of
/// the trial's compute quota set aside for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BurnImage {
    pub backend: BurnBackend,
    pub bytes: Vec<u8>,
    /// Bytes of the quota the session held when the snapshot was taken
    /// (the rest was the compute buffers'), so that a restored trial
    /// splits its quota as the original did; `None` in files written
    /// before it was carried, whose restores give burn what the buffers
    /// leave.
    pub set_aside: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::BurnDevice;

    #[test]
    fn the_worker_is_told_its_gpu_by_pci_address_else_by_description() {
        assert!(BurnDevice::Cpu.args().is_empty());
        let gpu = |pci_bus: &str| BurnDevice::Gpu {
            described: "llvmpipe (Vulkan, llvmpipe Mesa 22.3.6)".into(),
            pci_bus: pci_bus.into(),
        };
        assert_eq!(gpu("0000:19:00.0").args(), ["--gpu-pci", "0000:19:00.0"]);
        assert_eq!(
            gpu("").args(),
            ["--gpu", "llvmpipe (Vulkan, llvmpipe Mesa 22.3.6)"]
        );
    }
}
