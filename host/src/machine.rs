//! What this machine offers: its GPUs and its memory, as the process can
//! use them. The ground floor: host compute and the resource pool both ask
//! here, and it uses no other part of wtune.

use std::path::Path;

/// Where Linux lists PCI devices.
const PCI_DEVICES: &str = "/sys/bus/pci/devices";

/// PCI vendor ids of the GPUs counted: NVIDIA's and AMD's. Virtual
/// machines show display controllers of their own (QEMU's, virtio's,
/// VMware's) that no one trains on, and an integrated Intel GPU shares the
/// CPU's memory and power; neither is offered unless the experiment
/// declares it (`[resources] gpu`).
const NVIDIA: &str = "0x10de";
const AMD: &str = "0x1002";

/// [`detect_gpus`] on this machine: its PCI bus, its `/dev` and this
/// process's environment.
pub fn machine_gpus() -> u64 {
    detect_gpus(Path::new(PCI_DEVICES), Path::new("/dev"), &|name| {
        std::env::var(name).ok()
    })
}

/// The GPUs this process can use: NVIDIA and AMD display controllers
/// (PCI class `0x03....`) on the PCI bus (`pci`, laid out as
/// `/sys/bus/pci/devices`), no more than the device nodes the process
/// sees (`dev`: `nvidiaN`; for AMD, `dri/renderD*` beside `kfd`), and no
/// more than the `*_VISIBLE_DEVICES` variables `var` gives allow
/// (`CUDA_VISIBLE_DEVICES` or `NVIDIA_VISIBLE_DEVICES`;
/// `ROCR_VISIBLE_DEVICES` or `HIP_VISIBLE_DEVICES`). A container sees the
/// host's whole PCI bus but only the device nodes it was given, so the
/// nodes and variables are what make the count right there. An AMD APU's
/// integrated GPU counts like a discrete one; declare `gpu` to override.
pub fn detect_gpus(pci: &Path, dev: &Path, var: &dyn Fn(&str) -> Option<String>) -> u64 {
    let read = |dir: &Path, file: &str| {
        std::fs::read_to_string(dir.join(file))
            .map(|s| s.trim().to_ascii_lowercase())
            .unwrap_or_default()
    };
    let (mut nvidia, mut amd) = (0u64, 0u64);
    for entry in std::fs::read_dir(pci).into_iter().flatten().flatten() {
        let dir = entry.path();
        if !read(&dir, "class").starts_with("0x03") {
            continue;
        }
        match read(&dir, "vendor").as_str() {
            NVIDIA => nvidia += 1,
            AMD => amd += 1,
            _ => {}
        }
    }
    let nodes = |dir: &Path, prefix: &str| -> u64 {
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|entry| {
                entry.file_name().to_str().is_some_and(|name| {
                    name.strip_prefix(prefix)
                        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                })
            })
            .count() as u64
    };
    let nvidia_nodes = nodes(dev, "nvidia");
    let amd_nodes = if dev.join("kfd").exists() {
        nodes(&dev.join("dri"), "renderD")
    } else {
        0
    };
    let visible = |names: [&str; 2], count: u64| match names.iter().find_map(|n| var(n)) {
        None => count,
        Some(value) => match value.trim() {
            "all" => count,
            "" | "none" | "void" | "-1" => 0,
            list => count.min(list.split(',').filter(|s| !s.trim().is_empty()).count() as u64),
        },
    };
    visible(
        ["CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"],
        nvidia.min(nvidia_nodes),
    ) + visible(
        ["ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"],
        amd.min(amd_nodes),
    )
}

/// This machine's memory: `MemTotal` in `/proc/meminfo`, lowered to the
/// cgroup v2 `memory.max` where a container sets one; `None` where neither
/// file says (systems other than Linux).
pub fn memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok();
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max").ok();
    machine_memory(meminfo.as_deref(), cgroup.as_deref())
}

/// The memory `/proc/meminfo`'s text and the cgroup v2 limit's give,
/// whichever is lower.
fn machine_memory(meminfo: Option<&str>, cgroup_max: Option<&str>) -> Option<u64> {
    let total = meminfo.and_then(|text| {
        let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
        let mut words = line["MemTotal:".len()..].split_whitespace();
        let number: u64 = words.next()?.parse().ok()?;
        // The kernel writes "kB" and means KiB.
        match words.next() {
            Some("kB") => number.checked_mul(1024),
            None => Some(number),
            Some(_) => None,
        }
    });
    // "max" (no limit) does not parse, as intended.
    let limit = cgroup_max.and_then(|text| text.trim().parse::<u64>().ok());
    match (total, limit) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_is_the_lower_of_meminfo_and_the_cgroup_limit() {
        let meminfo = "MemTotal:       16303412 kB\nMemFree:         1000 kB\n";
        assert_eq!(machine_memory(Some(meminfo), None), Some(16303412 * 1024));
        assert_eq!(
            machine_memory(Some(meminfo), Some("max\n")),
            Some(16303412 * 1024)
        );
        assert_eq!(
            machine_memory(Some(meminfo), Some("1073741824\n")),
            Some(1 << 30)
        );
        assert_eq!(machine_memory(None, None), None);
        assert_eq!(machine_memory(Some("garbage"), None), None);
    }

    /// NVIDIA and AMD display controllers count, as far as the process has
    /// their device nodes and the visibility variables allow; a virtual
    /// machine's display, integrated Intel graphics, other functions of a
    /// GPU (its audio) and unreadable entries do not.
    #[test]
    fn gpus_are_display_controllers_the_process_can_reach() {
        let root = tempfile::tempdir().unwrap();
        let (pci, dev) = (root.path().join("pci"), root.path().join("dev"));
        std::fs::create_dir_all(dev.join("dri")).unwrap();
        let device = |name: &str, vendor: &str, class: &str| {
            let dir = pci.join(name);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("vendor"), format!("{vendor}\n")).unwrap();
            std::fs::write(dir.join("class"), format!("{class}\n")).unwrap();
        };
        let node = |path: &str| std::fs::write(dev.join(path), b"").unwrap();
        let none = |_: &str| None;
        assert_eq!(detect_gpus(&pci, &dev, &none), 0);
        device("0000:17:00.0", "0x10de", "0x030200"); // 3D controller
        device("0000:17:00.1", "0x10de", "0x040300"); // its audio function
        device("0000:18:00.0", "0x10de", "0x030200");
        device("0000:65:00.0", "0x1002", "0x030000"); // AMD VGA
        device("0000:00:02.0", "0x1234", "0x030000"); // QEMU's display
        device("0000:00:03.0", "0x8086", "0x030000"); // integrated Intel
        std::fs::create_dir(pci.join("0000:00:04.0")).unwrap();
        assert_eq!(detect_gpus(&pci, &dev, &none), 0, "no device nodes");
        node("nvidia0");
        node("nvidiactl");
        node("nvidia-uvm");
        assert_eq!(detect_gpus(&pci, &dev, &none), 1, "a container given one");
        node("nvidia1");
        node("dri/renderD128");
        assert_eq!(detect_gpus(&pci, &dev, &none), 2, "AMD needs kfd");
        node("kfd");
        assert_eq!(detect_gpus(&pci, &dev, &none), 3);
        let cuda = |value: &'static str| {
            move |name: &str| (name == "CUDA_VISIBLE_DEVICES").then(|| value.to_string())
        };
        assert_eq!(detect_gpus(&pci, &dev, &cuda("1")), 2);
        assert_eq!(detect_gpus(&pci, &dev, &cuda("0,1,2,3")), 3);
        assert_eq!(detect_gpus(&pci, &dev, &cuda("")), 1);
        assert_eq!(detect_gpus(&pci, &dev, &cuda("all")), 3);
        let rocr = |name: &str| (name == "ROCR_VISIBLE_DEVICES").then(|| "none".to_string());
        assert_eq!(detect_gpus(&pci, &dev, &rocr), 2);
        assert_eq!(detect_gpus(&root.path().join("missing"), &dev, &none), 0);
    }
}
