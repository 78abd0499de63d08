//! The GPU a trial's burn session runs on: burn's wgpu backend on the
//! Vulkan adapter wtune placed the trial on.
//!
//! wtune names the adapter as host compute does (`compute::gpu` in the
//! wtune crate): by its PCI address where the driver reports one, else by
//! its description, `"{name} (Vulkan, {driver} {driver info})"`. The worker
//! opens that adapter itself, with the features cubecl's WGSL compiler
//! may use, and registers it with cubecl, so the kernels that run are
//! cubecl's, chosen by the host: a guest sends operations and data, never
//! shaders.

use burn_std::future::block_on;
use cubecl::config::autotune::AutotuneLevel;
use cubecl::config::compilation::BoundsCheckMode;
use cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};
use cubecl::wgpu::{self as cubecl_wgpu, RuntimeOptions, WgpuSetup, wgpu};

/// burn's GPU backend, as the worker runs it: no fusion, one operation at
/// a time, as burn-router's interpreter hands them over.
pub type Gpu = burn_wgpu::CubeBackend;

/// A GPU as burn's GPU backend names it.
pub type Device = cubecl::Device;

/// Which adapter a trial's session runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Adapter {
    /// The adapter at this PCI address (`0000:19:00.0`).
    Pci(String),
    /// The adapter with this description (one the driver gives no PCI
    /// address, as lavapipe).
    Described(String),
}

impl std::fmt::Display for Adapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Adapter::Pci(bus) => write!(f, "the GPU at PCI address {bus}"),
            Adapter::Described(name) => write!(f, "the GPU {name:?}"),
        }
    }
}

impl Adapter {
    /// The worker's arguments that name this adapter.
    pub fn args(&self) -> Vec<String> {
        match self {
            Adapter::Pci(bus) => vec!["--gpu-pci".into(), bus.clone()],
            Adapter::Described(name) => vec!["--gpu".into(), name.clone()],
        }
    }
}

/// The Vulkan adapters here, in the driver's order, each named by its PCI
/// address where the driver reports one, else by its description.
pub fn adapters() -> Vec<Adapter> {
    let (_, all) = enumerate();
    all.iter()
        .map(wgpu::Adapter::get_info)
        .map(|info| match info.device_pci_bus_id.as_str() {
            "" => Adapter::Described(described(&info)),
            bus => Adapter::Pci(bus.to_owned()),
        })
        .collect()
}

/// The Vulkan adapters, and what each says of itself.
fn enumerate() -> (wgpu::Instance, Vec<wgpu::Adapter>) {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
        backends: wgpu::Backends::VULKAN,
        ..wgpu::InstanceDescriptor::new_without_display_handle()
    });
    let all = block_on(instance.enumerate_adapters(wgpu::Backends::VULKAN));
    (instance, all)
}

/// Sets cubecl's settings for the worker rather than letting cubecl read
/// them from a `cubecl.toml` in the worker's directory or its parents, or
/// from the environment: bounds checks in every kernel, no autotune
/// results kept on disk, and on software Vulkan the least autotuning,
/// timed once (LLVM compiles every candidate kernel there, and their
/// timings say little). Settings read before (a second device in a test's
/// process) stay.
fn configure(software: bool) {
    let mut config = CubeClRuntimeConfig::default();
    // cubecl compiles its WGSL without wgpu's bounds checks and skips its
    // own for the launches it marks unchecked: on, for every launch. On
    // software Vulkan the kernels run as code in this process.
    config.compilation.check_mode = BoundsCheckMode::Enforce;
    config.autotune.disable_cache = true;
    if software {
        config.autotune.level = AutotuneLevel::Minimal;
        config.autotune.bench.min_samples = 1;
        config.autotune.bench.max_samples = 1;
    }
    CubeClRuntimeConfig::try_set(config);
}

/// An adapter as host compute describes it (`compute::gpu::protocol::
/// described` in wtune, with its driver's two fields trimmed as one).
fn described(info: &wgpu::AdapterInfo) -> String {
    let driver = format!("{} {}", info.driver, info.driver_info);
    format!("{} (Vulkan, {})", info.name, driver.trim())
}

/// Opens `adapter` for burn (the device burn's tensors are made on), or
/// says why it cannot.
pub fn open(adapter: &Adapter) -> Result<Device, String> {
    let (instance, all) = enumerate();
    let infos: Vec<wgpu::AdapterInfo> = all.iter().map(wgpu::Adapter::get_info).collect();
    let chosen = infos.iter().position(|info| match adapter {
        Adapter::Pci(bus) => info.device_pci_bus_id.eq_ignore_ascii_case(bus),
        Adapter::Described(name) => described(info) == *name,
    });
    let Some(chosen) = chosen else {
        let there: Vec<String> = infos.iter().map(described).collect();
        return Err(match there.len() {
            0 => format!("{adapter} is not there: Vulkan lists no adapter"),
            _ => format!("{adapter} is not there: Vulkan lists {}", there.join("; ")),
        });
    };
    let info = &infos[chosen];
    let name = described(info);
    configure(info.device_type == wgpu::DeviceType::Cpu);
    let adapter = all.into_iter().nth(chosen).expect("chosen among them");
    // What cubecl asks for when it opens a device itself: it reads the
    // adapter's features to choose its kernels, so the device must have
    // them all.
    let (device, queue) = block_on(
        adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("wtune burn"),
            required_features: adapter
                .features()
                .difference(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS),
            required_limits: adapter.limits(),
            memory_hints: wgpu::MemoryHints::MemoryUsage,
            trace: wgpu::Trace::Off,
            // SAFETY: the experimental features an adapter offers (cooperative
            // matrices, say) are enabled for cubecl's own kernels only; guests
            // send no shaders.
            experimental_features: unsafe { wgpu::ExperimentalFeatures::enabled() },
        }),
    )
    .map_err(|e| format!("{name} refused a device: {e}"))?;
    let setup = WgpuSetup {
        instance,
        adapter,
        device,
        queue,
        backend: wgpu::Backend::Vulkan,
    };
    let device = RuntimeOptions::try_default()
        .and_then(|options| cubecl_wgpu::try_init_device(setup, options))
        .map_err(|e| format!("burn could not use {name}: {e}"))?;
    Ok(Device::from(device))
}
