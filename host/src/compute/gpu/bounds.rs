//! What one dispatch may ask of a GPU: workgroup counts and loop lengths.

use crate::compute::ComputeError;
use crate::compute::device::Kernel;
use crate::compute::ops::{Axis, Matmul};

/// The built-in matmul kernels of `kernels.wgsl`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatmulKernel {
    /// `matmul`: a 16 x 16 output tile per workgroup, one output per
    /// invocation; for small outputs, where big tiles would leave most of
    /// the GPU idle.
    Simple,
    /// `matmul_tiled`: a 128 x 128 tile per workgroup, 8 x 8 outputs per
    /// invocation kept in registers.
    Tiled,
}

impl MatmulKernel {
    /// The kernel the worker runs for `spec` (on a software adapter only
    /// where its loops stay under [`SOFTWARE_LOOP_CAP`]).
    pub fn for_spec(spec: &Matmul, software: bool) -> Self {
        let big = spec.m >= 128 && spec.n >= 128;
        if big && (!software || MatmulKernel::Tiled.loop_iterations(spec.k) <= SOFTWARE_LOOP_CAP) {
            MatmulKernel::Tiled
        } else {
            MatmulKernel::Simple
        }
    }

    /// Its entry point in `kernels.wgsl`.
    pub fn entry_point(self) -> &'static str {
        match self {
            MatmulKernel::Simple => "matmul",
            MatmulKernel::Tiled => "matmul_tiled",
        }
    }

    /// Output rows and columns one workgroup computes.
    pub fn tile(self) -> u32 {
        match self {
            MatmulKernel::Simple => 16,
            MatmulKernel::Tiled => 128,
        }
    }

    /// Loop iterations of one invocation over a depth of `k` (see
    /// [`loop_iterations`]). `Simple`'s inner loop of 16 is unrolled; of
    /// `Tiled`'s constant loops it is not known which are, so all count.
    fn loop_iterations(self, k: u32) -> u64 {
        let steps = (k as u64).div_ceil(16);
        match self {
            MatmulKernel::Simple => steps,
            // Per step the step itself, 8 loads and 16 products; 8 rows of 8
            // stores at the end.
            MatmulKernel::Tiled => steps * (1 + 8 + 16) + 8 * 8,
        }
    }
}

/// Refuses a matmul whose output needs more than `limit` workgroups along
/// a dimension with the kernel the worker would run for it. The session
/// checks before it charges fuel, so the worker, which runs kernels
/// without answering, never meets one.
pub fn check_matmul_tiles(spec: &Matmul, limit: u32, software: bool) -> Result<(), ComputeError> {
    let most = limit as u64 * MatmulKernel::for_spec(spec, software).tile() as u64;
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
        Kernel::Matmul { spec, .. } => MatmulKernel::for_spec(&spec, true).loop_iterations(spec.k),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn square(n: u32, k: u32) -> Matmul {
        Matmul {
            m: n,
            n,
            k,
            transpose_a: false,
            transpose_b: false,
            alpha: 1.0,
            beta: 0.0,
        }
    }

    #[test]
    fn software_vulkan_runs_the_tiled_matmul_only_where_its_loops_fit() {
        for k in [29, 16_000, 38_400, 39_000, 40_000, 1_000_000] {
            let spec = square(256, k);
            let kernel = MatmulKernel::for_spec(&spec, true);
            let counted = loop_iterations(&Kernel::Matmul {
                a: 1,
                b: 2,
                out: 3,
                spec,
            });
            // Every loop of matmul_tiled, the step loop included.
            let steps = (k as u64).div_ceil(16);
            if kernel == MatmulKernel::Tiled {
                assert_eq!(counted, steps * 25 + 64);
            }
            assert!(counted <= SOFTWARE_LOOP_CAP || k == 1_000_000, "k = {k}");
        }
        assert_eq!(
            MatmulKernel::for_spec(&square(256, 29), true),
            MatmulKernel::Tiled
        );
        assert_eq!(
            MatmulKernel::for_spec(&square(256, 39_000), true),
            MatmulKernel::Simple
        );
        // Hardware GPUs have no loop cap; small outputs keep the small tiles.
        assert_eq!(
            MatmulKernel::for_spec(&square(256, 1_000_000), false),
            MatmulKernel::Tiled
        );
        assert_eq!(
            MatmulKernel::for_spec(&square(100, 29), false),
            MatmulKernel::Simple
        );
    }
}
