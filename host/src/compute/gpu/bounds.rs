//! What one dispatch may ask of a GPU: workgroup counts and loop lengths.

use crate::compute::ComputeError;
use crate::compute::device::Kernel;
use crate::compute::ops::{Axis, Matmul};

/// Output rows and columns one workgroup of the built-in matmul computes.
pub const MATMUL_TILE: u32 = 16;

/// Refuses a matmul whose output needs more than `limit` workgroups along
/// a dimension. The session checks before it charges fuel, so the worker,
/// which runs kernels without answering, never meets one.
pub fn check_matmul_tiles(spec: &Matmul, limit: u32) -> Result<(), ComputeError> {
    let most = limit as u64 * MATMUL_TILE as u64;
    if spec.m as u64 > most || spec.n as u64 > most {
        return Err(ComputeError::Invalid(format!(
            "a {} x {} matmul output is larger than this GPU can tile ({most} rows or columns \
             at most)",
            spec.m, spec.n
        )));
    }
    Ok(())
}

/// Refuses a dispatch of more than `limit` workgroups along any dimension:
/// the session checks before it charges fuel, the worker again before it
/// submits.
pub fn check_workgroups(groups: [u32; 3], limit: u32) -> Result<(), ComputeError> {
    match groups.iter().find(|&&g| g > limit) {
        Some(too_many) => Err(ComputeError::Invalid(format!(
            "a dispatch of {too_many} workgroups along one dimension is more than this GPU \
             allows ({limit})"
        ))),
        None => Ok(()),
    }
}

/// Most loop iterations (as [`loop_iterations`] counts them) a built-in
/// kernel may run per invocation on software Vulkan. llvmpipe (lavapipe)
/// ends loops after 65,535 iterations without a word, so a longer kernel
/// returns wrong numbers: a sum over 2^24 ones came back as 131,070, and a
/// softmax row of 5.6 million left its end unwritten. Exactly how its
/// count meets ours is not pinned down (a softmax row of 21,839 x 256, at
/// 65,533 here, still came out wrong; 20,000 x 256, at 60,016, right), so
/// the budget keeps a margin below 65,535.
pub const SOFTWARE_LOOP_CAP: u64 = 60_000;

/// Loop iterations one invocation of a built-in kernel runs, as
/// `kernels.wgsl` writes them: counted across all of its loops, as llvmpipe
/// counts them; loops with a constant bound (matmul's inner 16) are
/// unrolled and do not count, and the 8 steps of a workgroup fold do.
pub fn loop_iterations(kernel: &Kernel) -> u64 {
    /// Invocations per workgroup of the reductions, and a fold's steps.
    const LANES: u64 = 256;
    const FOLD: u64 = 8;
    match *kernel {
        Kernel::Matmul { spec, .. } => (spec.k as u64).div_ceil(MATMUL_TILE as u64),
        Kernel::Reduce {
            along, rows, cols, ..
        } => {
            let line = match along {
                Axis::Rows => cols,
                Axis::Cols => rows,
            };
            (line as u64).div_ceil(LANES) + FOLD
        }
        Kernel::Softmax { cols, .. } => 3 * (cols as u64).div_ceil(LANES) + 2 * FOLD,
        _ => 0,
    }
}
