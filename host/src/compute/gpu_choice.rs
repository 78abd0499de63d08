//! [`GpuChoice`]: which of host compute's GPUs a trial runs on, named by
//! whoever places the trial: wtune's own pool numbers it, a scheduler
//! outside (Ray) knows it only by the device it handed the process.

use std::fmt;
use std::str::FromStr;

use super::gpu::PciAddress;

/// A GPU of host compute's, by number or by PCI address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuChoice {
    /// The number host compute gives it (from 0, in the order of
    /// [`super::Compute::gpus`]), as `resources.gpu` places trials.
    Index(usize),
    /// Its PCI address, as `nvidia-smi --query-gpu=pci.bus_id` prints it
    /// for the CUDA device a scheduler gave the process.
    Pci(PciAddress),
}

impl FromStr for GpuChoice {
    type Err = String;

    /// A decimal number is an index; anything else must be a PCI address.
    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
            return text
                .parse()
                .map(GpuChoice::Index)
                .map_err(|e| format!("GPU {text}: {e}"));
        }
        text.parse().map(GpuChoice::Pci).map_err(|why: String| {
            format!("{why}; or give the GPU's number among host compute's, from 0")
        })
    }
}

impl fmt::Display for GpuChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuChoice::Index(index) => write!(f, "GPU {index}"),
            GpuChoice::Pci(address) => write!(f, "the GPU at PCI address {address}"),
        }
    }
}

impl GpuChoice {
    /// The number of the GPU this names among `adapters` (each one's
    /// description and PCI address, as the driver reports it; empty where
    /// it reports none). The error lists what there is.
    pub fn resolve(&self, adapters: &[(String, String)]) -> Result<usize, String> {
        let found = match self {
            GpuChoice::Index(index) => (*index < adapters.len()).then_some(*index),
            GpuChoice::Pci(address) => adapters
                .iter()
                .position(|(_, bus)| bus.parse::<PciAddress>().is_ok_and(|bus| bus == *address)),
        };
        found.ok_or_else(|| {
            let listed: Vec<String> = adapters
                .iter()
                .enumerate()
                .map(|(i, (name, bus))| {
                    let bus = if bus.is_empty() {
                        "no PCI address"
                    } else {
                        bus
                    };
                    format!("GPU {i}: {name} at {bus}")
                })
                .collect();
            match listed.len() {
                0 => format!("{self} is not there: host compute runs on no GPU here"),
                _ => format!(
                    "{self} is not one host compute runs on; it has {}",
                    listed.join("; ")
                ),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn adapters() -> Vec<(String, String)> {
        vec![
            (
                "NVIDIA H100 (Vulkan, NVIDIA 580)".into(),
                "0000:19:00.0".into(),
            ),
            (
                "NVIDIA H100 (Vulkan, NVIDIA 580)".into(),
                "0000:3b:00.0".into(),
            ),
        ]
    }

    #[test]
    fn a_gpu_is_found_by_number_or_by_any_spelling_of_its_address() {
        let choose = |text: &str| text.parse::<GpuChoice>().unwrap().resolve(&adapters());
        assert_eq!(choose("1"), Ok(1));
        assert_eq!(choose("00000000:3B:00.0"), Ok(1));
        assert_eq!(choose("0000:19:00.0"), Ok(0));
    }

    #[test]
    fn a_gpu_that_is_not_there_is_refused_with_what_is() {
        let missing = GpuChoice::Pci("0000:5e:00.0".parse().unwrap());
        let refused = missing.resolve(&adapters()).unwrap_err();
        assert!(
            refused.contains("the GPU at PCI address 0000:5e:00.0 is not one host compute")
                && refused.contains("GPU 1: NVIDIA H100 (Vulkan, NVIDIA 580) at 0000:3b:00.0"),
            "{refused}"
        );
        let software = vec![("llvmpipe (Vulkan, Mesa)".to_string(), String::new())];
        let refused = GpuChoice::Index(1).resolve(&software).unwrap_err();
        assert!(
            refused.contains("GPU 0: llvmpipe (Vulkan, Mesa) at no PCI address"),
            "{refused}"
        );
        let refused = GpuChoice::Index(0).resolve(&[]).unwrap_err();
        assert!(refused.contains("runs on no GPU here"), "{refused}");
        let refused = "gpu0".parse::<GpuChoice>().unwrap_err();
        assert!(
            refused.contains("not a PCI address") && refused.contains("number"),
            "{refused}"
        );
    }
}
