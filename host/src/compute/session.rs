//! One trial's view of host compute: the buffers it holds, the checks every
//! call passes before any work, its share of the device memory and the fuel
//! its kernels cost.

use std::collections::HashMap;
use std::time::Instant;

use super::burn::lane::BurnLane;
use super::burn::{BurnBackend, BurnImage};
use super::cost::{self, Meter, Stop};
use super::device::{Device, Fill, Kernel, PipelineInfo};
use super::error::{ComputeError, invalid};
use super::gpu;
use super::ops::{Axis, Binary, Matmul, Reduce, Unary};
use super::{BackendInfo, Compute};
use crate::units::human_bytes;

/// A trial's buffers as plain data, carried in host snapshots so that a
/// restored trial finds its device state where it left it.
#[derive(Debug, Clone, Default)]
pub struct ComputeImage {
    /// The number the next new buffer gets (numbers are never reused).
    pub next_buffer: u32,
    /// The number the next new pipeline gets. Pipelines themselves are not
    /// carried (a trial holding one cannot be snapshotted), but the numbers
    /// of those it freed must stay unused after a restore too.
    pub next_pipeline: u32,
    /// `(number, contents)` of each live buffer, in ascending order.
    pub buffers: Vec<(u32, Vec<f32>)>,
    /// The trial's burn session, as its worker encoded it (its tensors and
    /// its random generator's state); `None` when it has none.
    pub burn: Option<BurnImage>,
}

/// Bit for bit, so that NaNs compare equal to themselves: an image equals
/// another when restoring either gives the same state.
impl PartialEq for ComputeImage {
    fn eq(&self, other: &Self) -> bool {
        self.next_buffer == other.next_buffer
            && self.next_pipeline == other.next_pipeline
            && self.burn == other.burn
            && self.buffers.len() == other.buffers.len()
            && self
                .buffers
                .iter()
                .zip(&other.buffers)
                .all(|((i, a), (j, b))| {
                    i == j
                        && bytemuck::cast_slice::<f32, u8>(a) == bytemuck::cast_slice::<f32, u8>(b)
                })
    }
}

impl Eq for ComputeImage {}

impl ComputeImage {
    /// Total size of the buffers and the burn session in bytes.
    pub fn byte_len(&self) -> u64 {
        let buffers: u64 = self.buffers.iter().map(|(_, b)| b.len() as u64 * 4).sum();
        buffers + self.burn.as_ref().map_or(0, |b| b.bytes.len() as u64)
    }

    /// Whether there is nothing to carry: no buffers, none ever made, and no
    /// burn session.
    pub fn is_empty(&self) -> bool {
        self.buffers.is_empty()
            && self.next_buffer <= 1
            && self.next_pipeline <= 1
            && self.burn.is_none()
    }
}

/// Most pipelines one trial may hold at once.
pub const MAX_PIPELINES: usize = 256;

/// Most buffers one trial holds at once.
pub const MAX_BUFFERS: usize = 65_536;

/// Largest WGSL source accepted.
pub const MAX_WGSL_BYTES: usize = 1 << 20;

/// Longest entry-point name accepted.
pub const MAX_ENTRY_POINT: usize = 256;

/// Most buffers one dispatch binds.
pub const MAX_BINDINGS: usize = 32;

/// Fuel per invocation of a custom shader: its work is unknown, so each
/// invocation is charged like a short loop body.
const FUEL_PER_INVOCATION: u64 = 16;

/// One trial's compute state. Every method checks its arguments and charges
/// its fuel before handing the work to the [`Device`], so a refused call
/// changes nothing.
pub struct ComputeSession {
    compute: Compute,
    device: Box<dyn Device>,
    /// The GPU it runs on ([`Compute::session_on`]).
    gpu: usize,
    /// Elements of each live buffer.
    sizes: HashMap<u32, u64>,
    next_buffer: u32,
    pipelines: HashMap<u32, PipelineInfo>,
    next_pipeline: u32,
    /// Bytes held by this trial, within its quota.
    held: u64,
    /// Whether this trial's whole quota is set aside in the shared pool:
    /// from its first buffer until the session ends, so that what other
    /// trials hold can never make one of its allocations fail.
    share_reserved: bool,
    /// The part of `held` set aside for the trial's burn tensors: the rest
    /// of its quota, from its first burn call on.
    burn_bytes: u64,
    burn: BurnLane,
    /// Why the device failed a sync, where it did not say it was lost.
    failed_sync: Option<String>,
    meter: Meter,
}

impl ComputeSession {
    pub(super) fn new(compute: Compute, device: Box<dyn Device>, gpu: usize) -> Self {
        Self {
            compute,
            device,
            gpu,
            sizes: HashMap::new(),
            next_buffer: 1,
            pipelines: HashMap::new(),
            next_pipeline: 1,
            held: 0,
            share_reserved: false,
            burn_bytes: 0,
            burn: BurnLane::default(),
            failed_sync: None,
            meter: Meter::default(),
        }
    }

    /// Where kernels run and this trial's quota.
    pub fn info(&self) -> BackendInfo {
        self.compute.info_on(self.gpu)
    }

    /// Bytes of device memory this trial holds.
    pub fn held_bytes(&self) -> u64 {
        self.held
    }

    /// Live buffers.
    pub fn buffer_count(&self) -> usize {
        self.sizes.len()
    }

    /// Live custom pipelines.
    pub fn pipeline_count(&self) -> usize {
        self.pipelines.len()
    }

    /// The guest is calling into the host with `fuel` left.
    pub fn enter(&mut self, fuel: Option<u64>) {
        self.meter.enter(fuel);
    }

    /// A new call into the guest begins, with this deadline.
    pub fn begin_call(&mut self, deadline: Option<Instant>) {
        self.meter.begin_call(deadline);
        self.device.begin_call(deadline);
    }

    /// Fuel the returning host call owes, or why it was stopped. Once the
    /// device (or the burn worker) has lost the trial's buffers every host
    /// call stops with [`Stop::DeviceLost`], so the trial ends with
    /// [`Self::lost`] as its reason instead of running on with handles to
    /// nothing.
    pub fn settle(&mut self) -> Result<u64, Stop> {
        if self.lost().is_some() {
            self.meter.stop(Stop::DeviceLost);
        }
        self.meter.settle()
    }

    /// The guest call has returned with `fuel` left: waits for the device
    /// and the burn worker to finish the work the call queued, so that its
    /// time and fuel are the call's, and a failure only they could see is
    /// the call's too (after which the session is [`Self::lost`]). Settles
    /// like a host call: what the queued work owes, or why it stopped.
    pub fn end_call(&mut self, fuel: Option<u64>) -> Result<u64, Stop> {
        self.meter.enter(fuel);
        if let Err(err) = self.device.sync() {
            // A device that failed a job is lost, and says why; in case it
            // did not, the failure is the reason.
            self.failed_sync.get_or_insert(err.to_string());
        }
        self.burn.finish(&mut self.meter);
        self.settle()
    }

    /// Why the device or the burn worker lost this trial's state, once one
    /// has.
    pub fn lost(&self) -> Option<&str> {
        self.device
            .lost()
            .or_else(|| self.burn.lost())
            .or(self.failed_sync.as_deref())
    }

    /// Charges `fuel` for work the host did for the guest outside this
    /// interface (copying a `log` line), so that repeating an expensive
    /// host call is not free. A call that cannot pay traps as it returns,
    /// through [`ComputeSession::settle`].
    pub fn charge_host_work(&mut self, fuel: u64) {
        let _ = self.meter.charge(fuel);
    }

    fn charge(&mut self, flops: u64, bytes: u64) -> Result<(), ComputeError> {
        self.meter.charge(cost::fuel(flops, bytes)).map_err(|stop| {
            // The guest never sees this: the sandbox traps when the host
            // call returns.
            ComputeError::Quota(match stop {
                Stop::OutOfFuel => "out of fuel".into(),
                Stop::Deadline => "the call's deadline has passed".into(),
                Stop::DeviceLost => "the device lost this trial's buffers".into(),
            })
        })
    }

    // ----- buffers -------------------------------------------------------

    /// A new zero-filled buffer of `bytes` bytes.
    pub fn create(&mut self, bytes: u64) -> Result<u32, ComputeError> {
        let elements = self.check_new(bytes)?;
        self.admit(bytes, bytes)?;
        self.insert(Fill::Zeros(elements))
    }

    /// A new buffer holding `data`.
    pub fn upload_bytes(&mut self, data: &[u8]) -> Result<u32, ComputeError> {
        self.check_new(data.len() as u64)?;
        self.admit(data.len() as u64, data.len() as u64)?;
        self.insert(Fill::Data(bytemuck::pod_collect_to_vec(data)))
    }

    /// A new buffer holding `data` (taken over without a copy).
    pub fn upload_f32(&mut self, data: Vec<f32>) -> Result<u32, ComputeError> {
        let bytes = data.len() as u64 * 4;
        self.check_new(bytes)?;
        self.admit(bytes, bytes)?;
        self.insert(Fill::Data(data))
    }

    /// Overwrites bytes from byte `offset` on.
    pub fn write_bytes(&mut self, id: u32, offset: u64, data: &[u8]) -> Result<(), ComputeError> {
        aligned("offset", offset)?;
        aligned("data length", data.len() as u64)?;
        let (start, _) = self.range(id, offset / 4, data.len() as u64 / 4)?;
        self.charge(0, data.len() as u64)?;
        let values: Vec<f32> = bytemuck::pod_collect_to_vec(data);
        self.device.write(id, start, &values)
    }

    /// Overwrites elements from element `offset` on.
    pub fn write_f32(&mut self, id: u32, offset: u64, data: &[f32]) -> Result<(), ComputeError> {
        let (start, _) = self.range(id, offset, data.len() as u64)?;
        self.charge(0, data.len() as u64 * 4)?;
        self.device.write(id, start, data)
    }

    /// `len` bytes from byte `offset`.
    pub fn read_bytes(&mut self, id: u32, offset: u64, len: u64) -> Result<Vec<u8>, ComputeError> {
        aligned("offset", offset)?;
        aligned("length", len)?;
        let values = self.read_f32(id, offset / 4, len / 4)?;
        Ok(bytemuck::cast_slice(&values).to_vec())
    }

    /// `len` elements from element `offset`.
    pub fn read_f32(&mut self, id: u32, offset: u64, len: u64) -> Result<Vec<f32>, ComputeError> {
        let (start, end) = self.range(id, offset, len)?;
        self.charge(0, len * 4)?;
        self.device.read(id, start, end - start)
    }

    /// Size of a buffer in bytes.
    pub fn size(&self, id: u32) -> Result<u64, ComputeError> {
        Ok(self.elements(id)? * 4)
    }

    /// Releases a buffer and its share of the quota.
    pub fn free(&mut self, id: u32) -> Result<(), ComputeError> {
        let elements = self.elements(id)?;
        self.charge(0, 0)?;
        self.sizes.remove(&id);
        self.release(elements * 4);
        self.device.free(id)
    }

    /// Copies `len` elements between (or within) buffers; overlapping ranges
    /// in one buffer copy as if through a temporary.
    pub fn copy(
        &mut self,
        src: u32,
        src_offset: u64,
        dst: u32,
        dst_offset: u64,
        len: u64,
    ) -> Result<(), ComputeError> {
        self.range(src, src_offset, len)?;
        self.range(dst, dst_offset, len)?;
        self.charge(0, len * 8)?;
        self.device.run(&Kernel::Copy {
            src,
            src_offset,
            dst,
            dst_offset,
            len,
        })
    }

    // ----- kernels -------------------------------------------------------

    /// `out = alpha * op(a) * op(b) + beta * out`.
    pub fn matmul(&mut self, a: u32, b: u32, out: u32, spec: Matmul) -> Result<(), ComputeError> {
        let (m, n, k) = (spec.m as u64, spec.n as u64, spec.k as u64);
        self.need(a, "a", m * k, "m * k")?;
        self.need(b, "b", k * n, "k * n")?;
        self.need(out, "out", m * n, "m * n")?;
        if out == a || out == b {
            let which = if out == a { "a" } else { "b" };
            return Err(invalid!(
                "matmul's out must be a buffer other than a and b (buffer {out} is also {which})"
            ));
        }
        if let Some(limit) = self.compute.max_workgroups() {
            let software = self.compute.loop_cap().is_some();
            gpu::check_matmul_tiles(&spec, limit, software)?;
        }
        let kernel = Kernel::Matmul { a, b, out, spec };
        self.fits_loops(&kernel)?;
        self.charge(spec.flops(), 4 * (m * k + k * n + 2 * m * n))?;
        self.device.run(&kernel)
    }

    /// `out[i] = op(x[i])` for `len` elements.
    pub fn unary(&mut self, op: Unary, x: u32, out: u32, len: u64) -> Result<(), ComputeError> {
        self.need(x, "x", len, "len")?;
        self.need(out, "out", len, "len")?;
        self.charge(op.flops() * len, 8 * len)?;
        self.device.run(&Kernel::Unary { op, x, out, n: len })
    }

    /// `out[i] = op(a[i], b[i])` for `len` elements.
    pub fn binary(
        &mut self,
        op: Binary,
        a: u32,
        b: u32,
        out: u32,
        len: u64,
    ) -> Result<(), ComputeError> {
        self.need(a, "a", len, "len")?;
        self.need(b, "b", len, "len")?;
        self.need(out, "out", len, "len")?;
        self.charge(len, 12 * len)?;
        self.device.run(&Kernel::Binary {
            op,
            a,
            b,
            out,
            n: len,
        })
    }

    /// `out[r, c] = op(x[r, c], row[c])` over a `rows x cols` matrix.
    pub fn binary_rows(
        &mut self,
        op: Binary,
        x: u32,
        row: u32,
        out: u32,
        rows: u32,
        cols: u32,
    ) -> Result<(), ComputeError> {
        let cells = rows as u64 * cols as u64;
        self.need(x, "x", cells, "rows * cols")?;
        self.need(row, "row", cols as u64, "cols")?;
        self.need(out, "out", cells, "rows * cols")?;
        if row == out {
            return Err(invalid!(
                "binary-rows' out must not be its row buffer ({row})"
            ));
        }
        self.charge(cells, 8 * cells + 4 * cols as u64)?;
        self.device.run(&Kernel::BinaryRows {
            op,
            x,
            row,
            out,
            rows,
            cols,
        })
    }

    /// `out[i] = x[i] * scale + shift` for `len` elements.
    pub fn affine(
        &mut self,
        x: u32,
        out: u32,
        len: u64,
        scale: f32,
        shift: f32,
    ) -> Result<(), ComputeError> {
        self.need(x, "x", len, "len")?;
        self.need(out, "out", len, "len")?;
        self.charge(2 * len, 8 * len)?;
        self.device.run(&Kernel::Affine {
            x,
            out,
            n: len,
            scale,
            shift,
        })
    }

    /// `y[i] += alpha * x[i]` for `len` elements.
    pub fn axpy(&mut self, alpha: f32, x: u32, y: u32, len: u64) -> Result<(), ComputeError> {
        self.need(x, "x", len, "len")?;
        self.need(y, "y", len, "len")?;
        self.charge(2 * len, 12 * len)?;
        self.device.run(&Kernel::Axpy {
            alpha,
            x,
            y,
            n: len,
        })
    }

    /// Reduces a `rows x cols` matrix along `along` into `out`.
    pub fn reduce(
        &mut self,
        op: Reduce,
        along: Axis,
        x: u32,
        out: u32,
        rows: u32,
        cols: u32,
    ) -> Result<(), ComputeError> {
        let cells = rows as u64 * cols as u64;
        self.need(x, "x", cells, "rows * cols")?;
        let (results, what) = match along {
            Axis::Rows => (rows as u64, "rows"),
            Axis::Cols => (cols as u64, "cols"),
        };
        self.need(out, "out", results, what)?;
        if out == x {
            return Err(invalid!("reduce's out must be a buffer other than x ({x})"));
        }
        let kernel = Kernel::Reduce {
            op,
            along,
            x,
            out,
            rows,
            cols,
        };
        self.fits_loops(&kernel)?;
        self.charge(cells, 4 * (cells + results))?;
        self.device.run(&kernel)
    }

    /// Row-wise softmax of a `rows x cols` matrix.
    pub fn softmax(&mut self, x: u32, out: u32, rows: u32, cols: u32) -> Result<(), ComputeError> {
        // Rows of nothing would need no buffer and cost nothing, yet a GPU
        // runs a workgroup for each. (No rows at all is nothing to do.)
        if cols == 0 && rows > 0 {
            return Err(invalid!(
                "softmax needs at least one column for its {rows} rows"
            ));
        }
        let cells = rows as u64 * cols as u64;
        self.need(x, "x", cells, "rows * cols")?;
        self.need(out, "out", cells, "rows * cols")?;
        let kernel = Kernel::Softmax { x, out, rows, cols };
        self.fits_loops(&kernel)?;
        self.charge(Unary::Exp.flops() * cells + 3 * cells, 8 * cells)?;
        self.device.run(&kernel)
    }

    // ----- shaders -------------------------------------------------------

    /// Compiles a WGSL pipeline; a backend without shaders refuses.
    pub fn create_pipeline(&mut self, wgsl: &str, entry_point: &str) -> Result<u32, ComputeError> {
        if wgsl.len() > MAX_WGSL_BYTES {
            return Err(invalid!(
                "the shader is {}; at most {} of WGSL is accepted",
                human_bytes(wgsl.len() as u64),
                human_bytes(MAX_WGSL_BYTES as u64)
            ));
        }
        if entry_point.len() > MAX_ENTRY_POINT {
            return Err(invalid!(
                "an entry point name of {} bytes is longer than the {MAX_ENTRY_POINT} allowed",
                entry_point.len()
            ));
        }
        if self.pipelines.len() >= MAX_PIPELINES {
            return Err(ComputeError::Quota(format!(
                "this trial holds {MAX_PIPELINES} pipelines, the most allowed; free some first"
            )));
        }
        if self.next_pipeline == u32::MAX {
            return Err(invalid!("this trial has used up all pipeline numbers"));
        }
        self.charge(0, wgsl.len() as u64)?;
        let id = self.next_pipeline;
        let info = self.device.create_pipeline(id, wgsl, entry_point)?;
        self.next_pipeline += 1;
        self.pipelines.insert(id, info);
        Ok(id)
    }

    /// Runs a pipeline with `bindings[i]` at `@group(0) @binding(i)`.
    pub fn dispatch(
        &mut self,
        pipeline: u32,
        bindings: &[u32],
        groups: [u32; 3],
    ) -> Result<(), ComputeError> {
        let info = *self
            .pipelines
            .get(&pipeline)
            .ok_or_else(|| missing("pipeline", pipeline, self.next_pipeline))?;
        if bindings.len() > MAX_BINDINGS {
            return Err(invalid!(
                "a dispatch binds at most {MAX_BINDINGS} buffers; {} were given",
                bindings.len()
            ));
        }
        let mut bound = 0;
        for &buffer in bindings {
            bound += self.elements(buffer)? * 4;
        }
        // Checked here, not only by the device, so that a refused dispatch
        // is not charged.
        if let Some(limit) = self.compute.max_workgroups() {
            gpu::check_workgroups(groups, limit)?;
        }
        let invocations = groups
            .iter()
            .chain(&info.workgroup_size)
            .fold(1u64, |total, &n| total.saturating_mul(n as u64));
        self.charge(invocations.saturating_mul(FUEL_PER_INVOCATION), bound)?;
        self.device.dispatch(pipeline, bindings, groups)
    }

    /// Releases a pipeline.
    pub fn free_pipeline(&mut self, pipeline: u32) -> Result<(), ComputeError> {
        self.pipelines
            .remove(&pipeline)
            .ok_or_else(|| missing("pipeline", pipeline, self.next_pipeline))?;
        self.device.free_pipeline(pipeline)
    }

    // ----- burn ----------------------------------------------------------

    /// Streams a frame of the guest's burn commands to its worker (see
    /// [`BurnLane`]); the worker is started at the trial's first burn call.
    pub fn burn_submit(&mut self, frame: &[u8]) {
        self.start_burn();
        self.burn.submit(&mut self.meter, frame);
    }

    /// Runs a frame of burn commands, then reads back a tensor.
    pub fn burn_read(&mut self, frame: &[u8], tensor: &[u8]) -> Result<Vec<u8>, String> {
        self.start_burn();
        self.burn.read(&mut self.meter, frame, tensor)
    }

    /// Runs a frame of burn commands and waits for everything sent so far.
    pub fn burn_sync(&mut self, frame: &[u8]) -> Result<(), String> {
        self.start_burn();
        self.burn.sync(&mut self.meter, frame)
    }

    /// Starts the burn worker with what is left of the trial's quota, which
    /// is then set aside for it: the compute buffers the trial holds keep
    /// their room, and new ones have none.
    fn start_burn(&mut self) {
        if self.burn.started() {
            return;
        }
        let memory = self.set_aside_for_burn(None);
        self.burn.start(memory, &self.compute.burn_device(self.gpu));
    }

    /// Sets the rest of the trial's quota aside for its burn tensors, or
    /// at most `as_before` (what a snapshot's session held: a restored
    /// trial splits its quota as the original did, so a buffer the
    /// original had room for has room again).
    fn set_aside_for_burn(&mut self, as_before: Option<u64>) -> Result<u64, String> {
        let quota = self.compute.info().quota_bytes;
        let rest = as_before.map_or(quota - self.held, |bytes| bytes.min(quota - self.held));
        if rest == 0 {
            return Err(format!(
                "this trial's compute buffers hold its whole compute memory quota of {}, \
                 leaving none for burn tensors (limits.compute_memory)",
                human_bytes(quota)
            ));
        }
        self.reserve(rest).map_err(|err| err.to_string())?;
        self.burn_bytes = rest;
        Ok(rest)
    }

    // ----- snapshots -----------------------------------------------------

    /// The buffers as plain data, for a host snapshot. Custom pipelines are
    /// not carried: a trial holding one cannot be snapshotted exactly.
    pub fn image(&mut self) -> Result<ComputeImage, ComputeError> {
        let burn = self.burn.image()?.map(|bytes| BurnImage {
            backend: self.compute.burn_device(self.gpu).backend(),
            bytes,
            set_aside: Some(self.burn_bytes),
        });
        if !self.pipelines.is_empty() {
            return Err(ComputeError::Unsupported(format!(
                "the trial holds {} custom WGSL pipeline(s), which snapshots do not carry; \
                 free them before the call returns (create them again after)",
                self.pipelines.len()
            )));
        }
        let mut ids: Vec<(u32, u64)> = self.sizes.iter().map(|(&id, &n)| (id, n)).collect();
        ids.sort_unstable();
        // The image is the host's, not the guest's: no deadline of a guest
        // call applies to reading it out.
        self.device.begin_call(None);
        let mut buffers = Vec::with_capacity(ids.len());
        for (id, elements) in ids {
            buffers.push((id, self.device.read(id, 0, elements as usize)?));
        }
        Ok(ComputeImage {
            next_buffer: self.next_buffer,
            next_pipeline: self.next_pipeline,
            buffers,
            burn,
        })
    }

    /// Takes over a snapshot's buffers. The session must hold none yet; the
    /// buffers count against this trial's quota as if newly created.
    pub fn restore(&mut self, image: &ComputeImage) -> Result<(), ComputeError> {
        if !self.sizes.is_empty() || !self.pipelines.is_empty() || self.burn.started() {
            return Err(invalid!(
                "compute state can only be restored into a fresh trial"
            ));
        }
        self.check_burn_backend(image.burn.as_ref().map(|b| b.backend))?;
        self.device.begin_call(None);
        for (id, buffer) in &image.buffers {
            if let Err(err) = self.restore_one(*id, buffer, image.next_buffer) {
                self.clear();
                return Err(err);
            }
        }
        if let Err(err) = self.device.sync() {
            self.clear();
            return Err(err);
        }
        if let Some(burn) = &image.burn {
            let memory = self.set_aside_for_burn(burn.set_aside);
            let device = self.compute.burn_device(self.gpu);
            self.burn
                .restore(memory, &device, &burn.bytes)
                .map_err(|why| {
                    ComputeError::Device(format!("restoring the trial's burn tensors: {why}"))
                })?;
        }
        self.next_buffer = image.next_buffer.max(1);
        self.next_pipeline = image.next_pipeline.max(1);
        Ok(())
    }

    /// Refuses a snapshot whose burn session (held on `backend`) this
    /// trial cannot take: one from the other kind of backend (see
    /// [`BurnBackend`]). Restores call it before they write anything.
    pub fn check_burn_backend(&self, backend: Option<BurnBackend>) -> Result<(), ComputeError> {
        let here = self.compute.burn_device(self.gpu).backend();
        let Some(there) = backend.filter(|&there| there != here) else {
            return Ok(());
        };
        Err(ComputeError::Unsupported(format!(
            "the snapshot holds burn tensors kept by {}, and here burn runs on {}; a trial \
             cannot move between the two (they store bools differently and draw other \
             random numbers). Continue it with compute = \"{mode}\" (`wtune resume DIR \
             --retry-errored --compute {mode}`)",
            there.described(),
            here.described(),
            mode = there.compute_mode(),
        )))
    }

    fn restore_one(&mut self, id: u32, buffer: &[f32], next: u32) -> Result<(), ComputeError> {
        let bytes = buffer.len() as u64 * 4;
        self.check_new(bytes)?;
        if id == 0 || id >= next || self.sizes.contains_key(&id) {
            return Err(invalid!(
                "the snapshot's compute state names buffer {id} twice or out of range"
            ));
        }
        self.reserve(bytes)?;
        if let Err(err) = self.device.create(id, Fill::Data(buffer.to_vec())) {
            self.release(bytes);
            return Err(err);
        }
        self.sizes.insert(id, buffer.len() as u64);
        Ok(())
    }

    fn clear(&mut self) {
        for id in std::mem::take(&mut self.sizes).into_keys() {
            let _ = self.device.free(id);
        }
        self.held = 0;
    }

    // ----- checks --------------------------------------------------------

    /// Elements of buffer `id`, or why it is not a handle.
    fn elements(&self, id: u32) -> Result<u64, ComputeError> {
        self.sizes
            .get(&id)
            .copied()
            .ok_or_else(|| missing("buffer", id, self.next_buffer))
    }

    /// Refuses a built-in kernel whose loops software Vulkan would cut
    /// short (see [`gpu::SOFTWARE_LOOP_CAP`]), rather than return its wrong
    /// numbers.
    fn fits_loops(&self, kernel: &Kernel) -> Result<(), ComputeError> {
        let Some(cap) = self.compute.loop_cap() else {
            return Ok(());
        };
        let needed = gpu::loop_iterations(kernel);
        if needed <= cap {
            return Ok(());
        }
        Err(ComputeError::Unsupported(format!(
            "this {} needs {needed} loop iterations per shader invocation, more than the \
             {cap} software Vulkan ({}) runs right (it stops loops after 65,535 without a \
             word, giving wrong results); use compute = \"cpu\" (faster than software \
             Vulkan) or a hardware GPU, or split the work",
            kernel.name(),
            self.info().name
        )))
    }

    /// `id` must hold at least `elements` (`formula` says where the number
    /// comes from, for the message).
    fn need(&self, id: u32, name: &str, elements: u64, formula: &str) -> Result<(), ComputeError> {
        let have = self.elements(id)?;
        if have < elements {
            return Err(invalid!(
                "{name} (buffer {id}) has {have} elements; {formula} = {elements} are needed"
            ));
        }
        Ok(())
    }

    /// Element range `[offset, offset + len)` of `id`, checked.
    fn range(&self, id: u32, offset: u64, len: u64) -> Result<(usize, usize), ComputeError> {
        let have = self.elements(id)?;
        match offset.checked_add(len) {
            Some(end) if end <= have => Ok((offset as usize, end as usize)),
            _ => Err(invalid!(
                "elements {offset}..{} are outside buffer {id}, which has {have}",
                offset.saturating_add(len)
            )),
        }
    }

    /// Checks a new buffer's size; returns its elements.
    fn check_new(&mut self, bytes: u64) -> Result<usize, ComputeError> {
        aligned("buffer size", bytes)?;
        let info = self.info();
        if bytes > info.max_buffer_bytes {
            return Err(invalid!(
                "a buffer of {} is larger than the largest this backend allows ({})",
                human_bytes(bytes),
                human_bytes(info.max_buffer_bytes)
            ));
        }
        if self.next_buffer == u32::MAX {
            return Err(invalid!("this trial has used up all buffer numbers"));
        }
        // An empty buffer takes no quota, yet a backend's bookkeeping and a
        // GPU's stand-in allocation for it are not free.
        if self.sizes.len() >= MAX_BUFFERS {
            return Err(invalid!(
                "this trial holds {MAX_BUFFERS} buffers, the most at once; free some first"
            ));
        }
        Ok((bytes / 4) as usize)
    }

    /// Reserves `bytes` of quota and charges for moving `moved` bytes; on
    /// failure neither happened.
    fn admit(&mut self, bytes: u64, moved: u64) -> Result<(), ComputeError> {
        self.reserve(bytes)?;
        self.charge(0, moved).inspect_err(|_| self.release(bytes))
    }

    /// Makes a buffer whose bytes [`Self::admit`] reserved; if the device
    /// cannot, the reservation is returned and the number is not used.
    fn insert(&mut self, fill: Fill) -> Result<u32, ComputeError> {
        let elements = match &fill {
            Fill::Zeros(n) => *n as u64,
            Fill::Data(data) => data.len() as u64,
        };
        let id = self.next_buffer;
        if let Err(err) = self.device.create(id, fill) {
            self.release(elements * 4);
            return Err(err);
        }
        self.next_buffer += 1;
        self.sizes.insert(id, elements);
        Ok(id)
    }

    fn reserve(&mut self, bytes: u64) -> Result<(), ComputeError> {
        let quota = self.compute.info().quota_bytes;
        if self.burn_bytes > 0 && self.held.saturating_add(bytes) > quota {
            return Err(ComputeError::Quota(format!(
                "this trial's burn tensors have the {} of its compute memory quota of {} that \
                 its compute buffers did not hold at its first burn call; {} more would pass \
                 it (limits.compute_memory)",
                human_bytes(self.burn_bytes),
                human_bytes(quota),
                human_bytes(bytes)
            )));
        }
        if self.held.saturating_add(bytes) > quota {
            return Err(ComputeError::Quota(format!(
                "this trial holds {} of compute memory; {} more would pass its quota of {} \
                 (limits.compute_memory)",
                human_bytes(self.held),
                human_bytes(bytes),
                human_bytes(quota)
            )));
        }
        if !self.share_reserved {
            self.compute.reserve_share()?;
            self.share_reserved = true;
        }
        self.held += bytes;
        Ok(())
    }

    fn release(&mut self, bytes: u64) {
        self.held -= bytes;
        // A refused first buffer (none numbered, none restored) gives the
        // share back; once the trial has had a buffer it keeps its share.
        let first = self.next_buffer == 1 && self.sizes.is_empty();
        if self.share_reserved && first && self.held == 0 {
            self.compute.release_share();
            self.share_reserved = false;
        }
    }
}

impl Drop for ComputeSession {
    fn drop(&mut self) {
        if self.share_reserved {
            self.compute.release_share();
        }
    }
}

/// Why `id` is not a live `what`: numbers are handed out from 1 up and never
/// reused, so one below `next` was freed.
fn missing(what: &str, id: u32, next: u32) -> ComputeError {
    ComputeError::BadHandle(if id != 0 && id < next {
        format!("{what} {id} was freed")
    } else {
        format!("{what} {id} does not exist")
    })
}

fn aligned(what: &str, value: u64) -> Result<(), ComputeError> {
    if !value.is_multiple_of(4) {
        return Err(invalid!(
            "{what} {value} is not a multiple of 4 (buffers hold 4-byte elements)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compute::{ComputeMode, ComputeOptions};

    fn compute(trial_quota: u64, total_quota: u64) -> Compute {
        Compute::cpu(ComputeOptions {
            mode: ComputeMode::Cpu,
            trial_quota,
            total_quota,
        })
    }

    fn session() -> ComputeSession {
        compute(1 << 20, 1 << 21).session()
    }

    #[test]
    fn buffers_round_trip_and_freed_handles_are_named() {
        let mut s = session();
        let a = s.upload_f32(vec![1.0, 2.0, 3.0, 4.0]).unwrap();
        let b = s.upload_bytes(&1.5f32.to_le_bytes().repeat(2)).unwrap();
        assert_ne!(a, b);
        assert_eq!(s.read_f32(b, 0, 2).unwrap(), [1.5, 1.5]);
        s.write_f32(a, 2, &[30.0, 40.0]).unwrap();
        assert_eq!(s.read_bytes(a, 8, 4).unwrap(), 30.0f32.to_le_bytes());
        s.copy(a, 2, b, 0, 2).unwrap();
        assert_eq!(s.read_f32(b, 0, 2).unwrap(), [30.0, 40.0]);
        s.copy(a, 0, a, 1, 3).unwrap();
        assert_eq!(s.read_f32(a, 0, 4).unwrap(), [1.0, 1.0, 2.0, 30.0]);
        assert_eq!(s.size(a).unwrap(), 16);
        s.free(a).unwrap();
        assert_eq!(
            s.free(a),
            Err(ComputeError::BadHandle(format!("buffer {a} was freed")))
        );
        assert_eq!(
            s.read_f32(a, 0, 1),
            Err(ComputeError::BadHandle(format!("buffer {a} was freed")))
        );
        assert_eq!(
            s.size(99),
            Err(ComputeError::BadHandle("buffer 99 does not exist".into()))
        );
        // A new buffer never takes a freed number.
        assert!(s.create(4).unwrap() > b);
    }

    #[test]
    fn empty_buffers_and_empty_rows_are_bounded() {
        let mut s = session();
        // An empty buffer takes no quota: the count bounds them.
        for _ in 0..MAX_BUFFERS {
            s.create(0).unwrap();
        }
        let refused = s.create(0).unwrap_err();
        assert_eq!(
            refused,
            ComputeError::Invalid(format!(
                "this trial holds {MAX_BUFFERS} buffers, the most at once; free some first"
            ))
        );
        assert!(s.upload_f32(Vec::new()).is_err());
        assert_eq!(s.buffer_count(), MAX_BUFFERS);
        s.free(1).unwrap();
        let x = s.create(4).unwrap();
        // A softmax over rows of nothing needs no buffer yet costs a GPU a
        // workgroup a row.
        assert_eq!(
            s.softmax(x, x, u32::MAX, 0),
            Err(ComputeError::Invalid(format!(
                "softmax needs at least one column for its {} rows",
                u32::MAX
            )))
        );
        // An empty batch is nothing to do.
        s.softmax(x, x, 0, 4).unwrap();
    }

    #[test]
    fn bad_sizes_and_ranges_are_refused_and_change_nothing() {
        let mut s = session();
        let a = s.upload_f32(vec![1.0; 4]).unwrap();
        let refused = [
            s.create(6).unwrap_err(),
            s.upload_bytes(&[0; 3]).unwrap_err(),
            s.write_f32(a, 3, &[9.0, 9.0]).unwrap_err(),
            s.write_bytes(a, 2, &[0; 4]).unwrap_err(),
            s.read_f32(a, u64::MAX, 2).unwrap_err(),
            s.copy(a, 0, a, 2, 3).unwrap_err(),
            s.create(MAX_BUFFER_BYTES_TEST).unwrap_err(),
        ];
        assert!(
            refused
                .iter()
                .all(|e| matches!(e, ComputeError::Invalid(_))),
            "{refused:?}"
        );
        assert_eq!(s.read_f32(a, 0, 4).unwrap(), [1.0; 4]);
        assert_eq!(s.buffer_count(), 1);
    }

    const MAX_BUFFER_BYTES_TEST: u64 = (1 << 20) + 4;

    #[test]
    fn shapes_are_checked_before_any_work() {
        let mut s = session();
        let a = s.upload_f32(vec![1.0; 6]).unwrap(); // 2 x 3
        let b = s.upload_f32(vec![1.0; 6]).unwrap(); // 3 x 2
        let out = s.upload_f32(vec![7.0; 3]).unwrap(); // too small for 2 x 2
        let spec = Matmul {
            m: 2,
            n: 2,
            k: 3,
            transpose_a: false,
            transpose_b: false,
            alpha: 1.0,
            beta: 0.0,
        };
        let err = s.matmul(a, b, out, spec).unwrap_err();
        assert_eq!(
            err,
            ComputeError::Invalid(format!(
                "out (buffer {out}) has 3 elements; m * n = 4 are needed"
            ))
        );
        assert_eq!(s.read_f32(out, 0, 3).unwrap(), [7.0; 3]);
        assert!(matches!(
            s.matmul(a, b, a, spec),
            Err(ComputeError::Invalid(_))
        ));
        assert!(matches!(
            s.unary(Unary::Exp, a, out, 4),
            Err(ComputeError::Invalid(_))
        ));
        assert!(matches!(
            s.binary(Binary::Add, a, 77, a, 1),
            Err(ComputeError::BadHandle(_))
        ));
        assert!(matches!(
            s.reduce(Reduce::Sum, Axis::Rows, a, a, 2, 3),
            Err(ComputeError::Invalid(_))
        ));
        let good = s.create(16).unwrap();
        s.matmul(a, b, good, spec).unwrap();
        assert_eq!(s.read_f32(good, 0, 4).unwrap(), [3.0; 4]);
    }

    #[test]
    fn in_place_kernels_work() {
        let mut s = session();
        let x = s.upload_f32(vec![-1.0, 2.0, -3.0, 4.0]).unwrap();
        s.unary(Unary::Relu, x, x, 4).unwrap();
        assert_eq!(s.read_f32(x, 0, 4).unwrap(), [0.0, 2.0, 0.0, 4.0]);
        s.binary(Binary::Add, x, x, x, 4).unwrap();
        assert_eq!(s.read_f32(x, 0, 4).unwrap(), [0.0, 4.0, 0.0, 8.0]);
        let bias = s.upload_f32(vec![1.0, 10.0]).unwrap();
        s.binary_rows(Binary::Add, x, bias, x, 2, 2).unwrap();
        assert_eq!(s.read_f32(x, 0, 4).unwrap(), [1.0, 14.0, 1.0, 18.0]);
        s.axpy(-1.0, x, x, 4).unwrap();
        assert_eq!(s.read_f32(x, 0, 4).unwrap(), [0.0; 4]);
        s.affine(x, x, 4, 3.0, 0.5).unwrap();
        s.softmax(x, x, 2, 2).unwrap();
        assert_eq!(s.read_f32(x, 0, 4).unwrap(), [0.5; 4]);
    }

    #[test]
    fn quotas_bound_each_trial_and_no_trial_starves_another() {
        let shared = compute(1024, 2048);
        let mut one = shared.session();
        let mut two = shared.session();
        let mut three = shared.session();
        let a = one.create(1024).unwrap();
        let err = one.create(4).unwrap_err();
        assert!(
            matches!(&err, ComputeError::Quota(m) if m.contains("its quota of 1 KiB")),
            "{err}"
        );
        // The first buffer sets the trial's whole quota aside: a third
        // trial is refused at its first buffer...
        two.create(4).unwrap();
        let err = three.create(4).unwrap_err();
        assert!(
            matches!(&err, ComputeError::Quota(m) if m.contains("2 trials already hold") && m.contains("experiment's total of 2 KiB")),
            "{err}"
        );
        assert_eq!(shared.used_bytes(), 2048);
        // ... while one that holds buffers can always use all of its quota,
        // whatever the others hold.
        two.create(1020).unwrap();
        one.free(a).unwrap();
        assert_eq!(
            shared.used_bytes(),
            2048,
            "a share is kept until its trial ends"
        );
        drop(one);
        three.create(1024).unwrap();
        drop(two);
        drop(three);
        assert_eq!(shared.used_bytes(), 0);
    }

    #[test]
    fn work_the_trial_cannot_pay_for_is_not_done() {
        let mut s = session();
        let x = s.upload_f32(vec![1.0; 1024]).unwrap();
        s.enter(Some(cost::fuel(1024, 8 * 1024) - 1));
        assert!(s.unary(Unary::Neg, x, x, 1024).is_err());
        assert_eq!(s.settle(), Err(Stop::OutOfFuel));
        assert_eq!(s.read_f32(x, 0, 1).unwrap(), [1.0]);
        s.enter(Some(cost::fuel(1024, 8 * 1024)));
        s.unary(Unary::Neg, x, x, 1024).unwrap();
        assert_eq!(s.settle(), Ok(cost::fuel(1024, 8 * 1024)));
        assert_eq!(s.read_f32(x, 0, 1).unwrap(), [-1.0]);
    }

    #[test]
    fn images_restore_buffers_numbers_and_quota() {
        let shared = compute(1 << 20, 1 << 21);
        let mut s = shared.session();
        let a = s.upload_f32(vec![f32::NAN, 2.0]).unwrap();
        let b = s.create(8).unwrap();
        s.free(b).unwrap();
        let image = s.image().unwrap();
        assert_eq!(image.buffers.len(), 1);
        let mut t = shared.session();
        t.restore(&image).unwrap();
        assert_eq!(t.image().unwrap(), image);
        assert_eq!(t.read_f32(a, 1, 1).unwrap(), [2.0]);
        assert!(t.create(4).unwrap() > b);
        assert_eq!(shared.used_bytes(), 2 << 20, "two trials' whole quotas");

        let small = compute(8, 4);
        let mut u = small.session();
        assert!(matches!(u.restore(&image), Err(ComputeError::Quota(_))));
        assert_eq!((u.buffer_count(), small.used_bytes()), (0, 0));
    }

    /// The original trial set half its quota aside for burn while a buffer
    /// held the other half, then freed the buffer: it has room for such a
    /// buffer again, and a trial restored from its snapshot too. (Burn was
    /// given everything the restored buffers left: the whole quota.)
    #[test]
    fn a_restored_trial_splits_its_quota_between_buffers_and_burn_as_before() {
        let shared = compute(1 << 20, 1 << 22);
        let mut s = shared.session();
        s.enter(Some(1 << 30));
        let half = s.create(512 << 10).unwrap();
        s.burn_sync(&[]).unwrap();
        s.free(half).unwrap();
        let image = s.image().unwrap();
        assert_eq!(image.burn.as_ref().unwrap().set_aside, Some(512 << 10));
        let mut t = shared.session();
        t.restore(&image).unwrap();
        t.enter(Some(1 << 30));
        assert!(s.create(512 << 10).is_ok());
        assert!(t.create(512 << 10).is_ok());
        assert!(matches!(t.create(4), Err(ComputeError::Quota(_))));
    }

    #[test]
    fn shaders_are_unsupported_on_the_cpu() {
        let mut s = session();
        assert!(matches!(
            s.create_pipeline("@compute @workgroup_size(1) fn main() {}", "main"),
            Err(ComputeError::Unsupported(_))
        ));
        assert!(matches!(
            s.dispatch(1, &[], [1, 1, 1]),
            Err(ComputeError::BadHandle(_))
        ));
        assert!(matches!(
            s.free_pipeline(1),
            Err(ComputeError::BadHandle(_))
        ));
    }
}
