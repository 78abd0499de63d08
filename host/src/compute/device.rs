//! Where a trial's buffers live and its kernels run. [`ComputeSession`]
//! checks every call (handles, shapes, ranges, quotas, fuel) and only then
//! hands a [`Device`] a job it knows is well formed; the device only does
//! the work. [`CpuDevice`] keeps buffers in host memory and runs the native
//! kernels; [`super::gpu::GpuDevice`] forwards jobs to a supervised wgpu
//! worker process.
//!
//! [`ComputeSession`]: super::ComputeSession

use std::collections::HashMap;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::cpu::{self, Operands};
use super::error::ComputeError;
use super::ops::{Axis, Binary, Matmul, Reduce, Unary, f32_bits};

/// Largest single buffer: WebGPU's default `max_buffer_size`, so a model
/// that fits one backend fits the other.
pub const MAX_BUFFER_BYTES: u64 = 256 << 20;

/// A kernel whose handles and shapes the session has checked. Element
/// counts are exact: inputs may be longer, only the first elements count.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Kernel {
    /// `out = alpha * op(a) * op(b) + beta * out`; `out` is neither input.
    Matmul {
        a: u32,
        b: u32,
        out: u32,
        spec: Matmul,
    },
    /// `out[i] = op(x[i])`.
    Unary { op: Unary, x: u32, out: u32, n: u64 },
    /// `out[i] = op(a[i], b[i])`.
    Binary {
        op: Binary,
        a: u32,
        b: u32,
        out: u32,
        n: u64,
    },
    /// `out[r, c] = op(x[r, c], row[c])`; `row` is not `out`.
    BinaryRows {
        op: Binary,
        x: u32,
        row: u32,
        out: u32,
        rows: u32,
        cols: u32,
    },
    /// `out[i] = x[i] * scale + shift`.
    Affine {
        x: u32,
        out: u32,
        n: u64,
        #[serde(with = "f32_bits")]
        scale: f32,
        #[serde(with = "f32_bits")]
        shift: f32,
    },
    /// `y[i] += alpha * x[i]`.
    Axpy {
        #[serde(with = "f32_bits")]
        alpha: f32,
        x: u32,
        y: u32,
        n: u64,
    },
    /// One result per row or column into `out`, which is not `x`.
    Reduce {
        op: Reduce,
        along: Axis,
        x: u32,
        out: u32,
        rows: u32,
        cols: u32,
    },
    /// Row-wise softmax.
    Softmax {
        x: u32,
        out: u32,
        rows: u32,
        cols: u32,
    },
    /// `len` elements from `src[src_offset..]` to `dst[dst_offset..]`, as
    /// if through a temporary when the ranges overlap.
    Copy {
        src: u32,
        src_offset: u64,
        dst: u32,
        dst_offset: u64,
        len: u64,
    },
}

impl Kernel {
    /// The kernel's name, as the WIT function that asks for it.
    pub fn name(&self) -> &'static str {
        match self {
            Kernel::Matmul { .. } => "matmul",
            Kernel::Unary { .. } => "unary",
            Kernel::Binary { .. } => "binary",
            Kernel::BinaryRows { .. } => "binary-rows",
            Kernel::Affine { .. } => "affine",
            Kernel::Axpy { .. } => "axpy",
            Kernel::Reduce { .. } => "reduce",
            Kernel::Softmax { .. } => "softmax",
            Kernel::Copy { .. } => "copy",
        }
    }

    /// The buffer the kernel writes.
    pub fn output(&self) -> u32 {
        match *self {
            Kernel::Matmul { out, .. }
            | Kernel::Unary { out, .. }
            | Kernel::Binary { out, .. }
            | Kernel::BinaryRows { out, .. }
            | Kernel::Affine { out, .. }
            | Kernel::Reduce { out, .. }
            | Kernel::Softmax { out, .. } => out,
            Kernel::Axpy { y, .. } => y,
            Kernel::Copy { dst, .. } => dst,
        }
    }
}

/// What a new buffer starts with.
pub enum Fill {
    /// This many zeros.
    Zeros(usize),
    /// These values (taken over).
    Data(Vec<f32>),
}

/// A custom pipeline's entry point, as the backend compiled it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PipelineInfo {
    /// Invocations per workgroup along x, y and z.
    pub workgroup_size: [u32; 3],
}

/// The storage and execution side of a trial's compute. Arguments have
/// been checked; an error here means the device could not do the work.
pub trait Device: Send {
    /// The guest call now beginning must end by `deadline`.
    fn begin_call(&mut self, deadline: Option<Instant>) {
        let _ = deadline;
    }
    /// Why this device has lost the trial's buffers for good, once it has
    /// (a GPU worker killed at a job's deadline, or dead). Every later call
    /// fails, so the trial must end rather than carry on without its state.
    fn lost(&self) -> Option<&str> {
        None
    }
    /// Waits until every job handed over so far has run: a device may
    /// queue those that return nothing. An error means one of them failed
    /// where only the device could tell, and the device is then lost.
    fn sync(&mut self) -> Result<(), ComputeError> {
        Ok(())
    }
    /// Makes buffer `id` (a number not in use).
    fn create(&mut self, id: u32, fill: Fill) -> Result<(), ComputeError>;
    /// Overwrites elements from `offset` on.
    fn write(&mut self, id: u32, offset: usize, data: &[f32]) -> Result<(), ComputeError>;
    /// `len` elements from `offset`.
    fn read(&mut self, id: u32, offset: usize, len: usize) -> Result<Vec<f32>, ComputeError>;
    /// Releases buffer `id`.
    fn free(&mut self, id: u32) -> Result<(), ComputeError>;
    /// Runs a checked kernel.
    fn run(&mut self, kernel: &Kernel) -> Result<(), ComputeError>;
    /// Compiles WGSL into pipeline `id`.
    fn create_pipeline(
        &mut self,
        id: u32,
        wgsl: &str,
        entry_point: &str,
    ) -> Result<PipelineInfo, ComputeError>;
    /// Runs pipeline `id` with `bindings[i]` at `@group(0) @binding(i)`.
    fn dispatch(&mut self, id: u32, bindings: &[u32], groups: [u32; 3])
    -> Result<(), ComputeError>;
    /// Releases pipeline `id`.
    fn free_pipeline(&mut self, id: u32) -> Result<(), ComputeError>;
}

/// Buffers in host memory, kernels on the host's cores.
#[derive(Default)]
pub struct CpuDevice {
    buffers: Buffers,
    /// Names the backend in the "no shaders here" message.
    name: String,
}

/// The buffers of a trial by number.
type Buffers = HashMap<u32, Vec<f32>>;

impl CpuDevice {
    /// An empty device; `name` is the CPU's, for messages.
    pub fn new(name: String) -> Self {
        Self {
            buffers: HashMap::new(),
            name,
        }
    }

    /// Runs `f` on buffer `out` while the other buffers stay readable beside
    /// it. `out` is out of the table meanwhile, so looking up an input that
    /// is `out` itself finds nothing: kernels read that as "work in place"
    /// (see [`source`]).
    fn with_output(&mut self, out: u32, f: impl FnOnce(&Buffers, &mut [f32])) {
        let mut target = self
            .buffers
            .remove(&out)
            .expect("the session checked the handle");
        f(&self.buffers, &mut target);
        self.buffers.insert(out, target);
    }

    fn buffer(&self, id: u32) -> &[f32] {
        self.buffers
            .get(&id)
            .expect("the session checked the handle")
    }
}

impl Device for CpuDevice {
    fn create(&mut self, id: u32, fill: Fill) -> Result<(), ComputeError> {
        let data = match fill {
            Fill::Zeros(n) => vec![0.0; n],
            Fill::Data(data) => data,
        };
        self.buffers.insert(id, data);
        Ok(())
    }

    fn write(&mut self, id: u32, offset: usize, data: &[f32]) -> Result<(), ComputeError> {
        let buffer = self
            .buffers
            .get_mut(&id)
            .expect("the session checked the handle");
        buffer[offset..offset + data.len()].copy_from_slice(data);
        Ok(())
    }

    fn read(&mut self, id: u32, offset: usize, len: usize) -> Result<Vec<f32>, ComputeError> {
        Ok(self.buffer(id)[offset..offset + len].to_vec())
    }

    fn free(&mut self, id: u32) -> Result<(), ComputeError> {
        self.buffers.remove(&id);
        Ok(())
    }

    fn run(&mut self, kernel: &Kernel) -> Result<(), ComputeError> {
        match *kernel {
            Kernel::Matmul { a, b, out, spec } => self.with_output(out, |inputs, target| {
                cpu::matmul(&inputs[&a], &inputs[&b], target, &spec)
            }),
            Kernel::Unary { op, x, out, n } => {
                let n = n as usize;
                self.with_output(out, |inputs, target| {
                    cpu::unary(op, source(inputs, x, n), &mut target[..n])
                })
            }
            Kernel::Binary { op, a, b, out, n } => {
                let n = n as usize;
                self.with_output(out, |inputs, target| {
                    let operands = match (source(inputs, a, n), source(inputs, b, n)) {
                        (Some(a), Some(b)) => Operands::Both(a, b),
                        (None, Some(b)) => Operands::OutIsA(b),
                        (Some(a), None) => Operands::OutIsB(a),
                        (None, None) => Operands::OutIsBoth,
                    };
                    cpu::binary(op, operands, &mut target[..n])
                })
            }
            Kernel::BinaryRows {
                op,
                x,
                row,
                out,
                rows,
                cols,
            } => {
                let n = rows as usize * cols as usize;
                self.with_output(out, |inputs, target| {
                    let x = source(inputs, x, n);
                    cpu::binary_rows(op, x, &inputs[&row], &mut target[..n], cols as usize)
                })
            }
            Kernel::Affine {
                x,
                out,
                n,
                scale,
                shift,
            } => {
                let n = n as usize;
                self.with_output(out, |inputs, target| {
                    cpu::affine(source(inputs, x, n), &mut target[..n], scale, shift)
                })
            }
            Kernel::Axpy { alpha, x, y, n } => {
                let n = n as usize;
                self.with_output(y, |inputs, target| {
                    cpu::axpy(alpha, source(inputs, x, n), &mut target[..n])
                })
            }
            Kernel::Reduce {
                op,
                along,
                x,
                out,
                rows,
                cols,
            } => self.with_output(out, |inputs, target| {
                cpu::reduce(op, along, &inputs[&x], target, rows as usize, cols as usize)
            }),
            Kernel::Softmax { x, out, rows, cols } => {
                let n = rows as usize * cols as usize;
                self.with_output(out, |inputs, target| {
                    if let Some(x) = source(inputs, x, n) {
                        target[..n].copy_from_slice(x);
                    }
                    cpu::softmax_in_place(&mut target[..n], cols as usize)
                })
            }
            Kernel::Copy {
                src,
                src_offset,
                dst,
                dst_offset,
                len,
            } => {
                let (s0, d0, n) = (src_offset as usize, dst_offset as usize, len as usize);
                self.with_output(dst, |inputs, to| match inputs.get(&src) {
                    Some(from) => to[d0..d0 + n].copy_from_slice(&from[s0..s0 + n]),
                    None => to.copy_within(s0..s0 + n, d0),
                })
            }
        }
        Ok(())
    }

    fn create_pipeline(&mut self, _: u32, _: &str, _: &str) -> Result<PipelineInfo, ComputeError> {
        Err(ComputeError::Unsupported(format!(
            "custom WGSL shaders need a GPU backend; this trial computes on {} (the \
             built-in kernels work everywhere)",
            self.name
        )))
    }

    fn dispatch(&mut self, id: u32, _: &[u32], _: [u32; 3]) -> Result<(), ComputeError> {
        unreachable!("the session holds no pipeline {id} on a backend without shaders")
    }

    fn free_pipeline(&mut self, id: u32) -> Result<(), ComputeError> {
        unreachable!("the session holds no pipeline {id} on a backend without shaders")
    }
}

/// The first `n` elements of input `id` inside [`CpuDevice::with_output`],
/// or `None` when `id` is the output being written.
fn source(inputs: &Buffers, id: u32, n: usize) -> Option<&[f32]> {
    inputs.get(&id).map(|b| &b[..n])
}
