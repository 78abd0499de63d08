//! The GPU backend: wgpu on Vulkan, in worker processes that `wtune`
//! starts and supervises.
//!
//! - [`protocol`]: the frames the two sides exchange over pipes.
//! - [`worker`]: the process side (`wtune gpu-worker`), which owns the
//!   device and runs the built-in kernels (`kernels.wgsl`) and the guests'
//!   own WGSL pipelines.
//! - [`client`]: the host side: [`WorkerPool`] starts workers and keeps
//!   idle ones; [`GpuDevice`] is one trial's worker, killed when a job
//!   runs past its deadline.
//! - [`pci`]: PCI addresses, by which a scheduler's CUDA device names
//!   its Vulkan adapter.
//!
//! Only Vulkan is used: untrusted shaders stay inside their buffers (with
//! robust buffer access 2 out-of-bounds reads give zero and writes are
//! dropped; without it wgpu clamps indices), where the GL backend has no
//! such checks. The worker runs the `wtune` executable (see
//! [`crate::process::worker_program`]); [`worker_main`] is what it calls
//! for `gpu-worker`.

mod bounds;
pub mod client;
mod pci;
pub mod protocol;
mod worker;

pub use bounds::{
    MatmulKernel, SOFTWARE_LOOP_CAP, check_matmul_tiles, check_workgroups, loop_iterations,
};
pub use client::{GpuDevice, JOB_TIMEOUT, WorkerPool};
pub use pci::PciAddress;
pub use worker::{LocalGpu, main as worker_main};
