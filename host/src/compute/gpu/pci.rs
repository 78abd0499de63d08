//! PCI addresses, which name one GPU the same way to every API on the
//! machine: Vulkan (`VK_EXT_pci_bus_info`, as wgpu reports it:
//! `0000:19:00.0`), NVML and `nvidia-smi` (`00000000:19:00.0`) and the
//! kernel (`/sys/bus/pci/devices/0000:19:00.0`). A scheduler that hands a
//! process a CUDA device (Ray's `CUDA_VISIBLE_DEVICES`) can so name the
//! Vulkan adapter host compute must use, which Vulkan's own device order
//! does not promise to match.

use std::fmt;
use std::str::FromStr;

/// `domain:bus:device.function`, each part hexadecimal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PciAddress {
    domain: u32,
    bus: u8,
    device: u8,
    function: u8,
}

impl FromStr for PciAddress {
    type Err = String;

    /// Reads `[domain:]bus:device.function` in any of the widths the
    /// tools print (the domain is 0 when left out).
    fn from_str(text: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "{text:?} is not a PCI address: give domain:bus:device.function in hexadecimal, \
                 e.g. 0000:19:00.0 (as nvidia-smi --query-gpu=pci.bus_id prints it)"
            )
        };
        let parts: Vec<&str> = text.trim().split(':').collect();
        let (domain, bus, slot) = match parts[..] {
            [domain, bus, slot] => (domain, bus, slot),
            [bus, slot] => ("0", bus, slot),
            _ => return Err(bad()),
        };
        let (device, function) = slot.split_once('.').ok_or_else(bad)?;
        let hex = |part: &str| {
            if part.is_empty() || part.len() > 8 {
                return Err(bad());
            }
            u32::from_str_radix(part, 16).map_err(|_| bad())
        };
        let narrow = |value: u32, max: u32| {
            if value <= max {
                Ok(value as u8)
            } else {
                Err(bad())
            }
        };
        Ok(PciAddress {
            domain: hex(domain)?,
            bus: narrow(hex(bus)?, 0xff)?,
            device: narrow(hex(device)?, 0x1f)?,
            function: narrow(hex(function)?, 0x7)?,
        })
    }
}

impl fmt::Display for PciAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tools_spelling_names_the_same_device() {
        let vulkan: PciAddress = "0000:19:00.0".parse().unwrap();
        for spelling in ["00000000:19:00.0", "19:00.0", " 0000:19:00.0\n", "0:19:0.0"] {
            assert_eq!(spelling.parse::<PciAddress>(), Ok(vulkan), "{spelling:?}");
        }
        assert_eq!(vulkan.to_string(), "0000:19:00.0");
        let other: PciAddress = "0001:9a:1f.7".parse().unwrap();
        assert_ne!(other, vulkan);
        assert_eq!(other.to_string(), "0001:9a:1f.7");
    }

    #[test]
    fn anything_else_is_refused_with_the_expected_form() {
        for bad in [
            "",
            "19",
            "19:00",
            "gpu0",
            "0000:19:00.8",
            "0000:100:00.0",
            "0000:19:20.0",
        ] {
            let refused = bad.parse::<PciAddress>().unwrap_err();
            assert!(
                refused.contains("is not a PCI address"),
                "{bad:?}: {refused}"
            );
            assert!(refused.contains("0000:19:00.0"), "{refused}");
        }
    }
}
