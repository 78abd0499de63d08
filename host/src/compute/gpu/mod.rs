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
//!
//! Only Vulkan is used: it checks buffer bounds for untrusted shaders
//! (out-of-bounds reads give zero, writes are dropped), where the GL
//! backend does not. The worker runs the `wtune` executable (see
//! [`crate::process::worker_executable`]); [`worker_main`] is what it calls
//! for `gpu-worker`.

pub mod client;
pub mod protocol;
mod worker;

pub use client::{GpuDevice, JOB_TIMEOUT, WorkerPool};
pub use worker::{LocalGpu, main as worker_main};
