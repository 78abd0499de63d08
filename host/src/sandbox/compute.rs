//! The host side of the `wtune:trainable/compute` interface: converts WIT
//! values into [`crate::compute`] calls on the trial's session, and the call
//! hook that settles host compute against the store's fuel.

use wasmtime::{AsContextMut, CallHook, StoreContextMut, Trap};

use super::bindings::wtune::trainable::compute as wit;
use super::store_data::TrialHost;
use crate::compute::cost::Stop;
use crate::compute::ops::{Axis, Binary, Matmul, Reduce, Unary};
use crate::compute::{BackendInfo, ComputeError};

type Result<T> = std::result::Result<T, wit::ComputeError>;
type ComputeResult<T> = std::result::Result<T, ComputeError>;

fn to_wit(err: ComputeError) -> wit::ComputeError {
    match err {
        ComputeError::BadHandle(m) => wit::ComputeError::BadHandle(m),
        ComputeError::Invalid(m) => wit::ComputeError::Invalid(m),
        ComputeError::Quota(m) => wit::ComputeError::Quota(m),
        ComputeError::Shader(m) => wit::ComputeError::Shader(m),
        ComputeError::Unsupported(m) => wit::ComputeError::Unsupported(m),
        ComputeError::Device(m) => wit::ComputeError::Device(m),
    }
}

fn unary(op: wit::UnaryOp) -> Unary {
    match op {
        wit::UnaryOp::Relu => Unary::Relu,
        wit::UnaryOp::Sigmoid => Unary::Sigmoid,
        wit::UnaryOp::Tanh => Unary::Tanh,
        wit::UnaryOp::Exp => Unary::Exp,
        wit::UnaryOp::Log => Unary::Log,
        wit::UnaryOp::Neg => Unary::Neg,
        wit::UnaryOp::Abs => Unary::Abs,
        wit::UnaryOp::Sqrt => Unary::Sqrt,
        wit::UnaryOp::Square => Unary::Square,
        wit::UnaryOp::Recip => Unary::Recip,
    }
}

fn binary(op: wit::BinaryOp) -> Binary {
    match op {
        wit::BinaryOp::Add => Binary::Add,
        wit::BinaryOp::Sub => Binary::Sub,
        wit::BinaryOp::Mul => Binary::Mul,
        wit::BinaryOp::Div => Binary::Div,
        wit::BinaryOp::Max => Binary::Max,
        wit::BinaryOp::Min => Binary::Min,
        wit::BinaryOp::ReluBackward => Binary::ReluBackward,
    }
}

impl TrialHost {
    /// `answer` to a call for which wasmtime copied `bytes` out of the
    /// guest (a list or a string) before the host saw them. A refusal
    /// charges the copy, as a log line is charged: it was made whatever the
    /// answer, and a refused call must not be free to repeat. A call that
    /// goes ahead pays for its bytes in its own charge. One the device
    /// failed (`Device`) is not charged: the trial is lost and says why,
    /// where a charge past its deadline would name the deadline instead.
    fn lifted<T>(&mut self, bytes: usize, answer: ComputeResult<T>) -> Result<T> {
        if matches!(&answer, Err(e) if !matches!(e, ComputeError::Device(_))) {
            let bytes = u64::try_from(bytes).unwrap_or(u64::MAX);
            self.compute
                .charge_host_work(crate::compute::cost::fuel(0, bytes));
        }
        answer.map_err(to_wit)
    }
}

impl TrialHost {
    /// Refuses a read of `bytes` that the guest's memory could not take
    /// whole, before the host reads (and copies) anything: the answer
    /// would only trap in the guest's allocator after the host had held
    /// it, twice.
    fn fits_guest(&self, bytes: u64) -> Result<()> {
        let cap = self.limiter.memory_cap();
        if bytes <= cap {
            return Ok(());
        }
        Err(wit::ComputeError::Invalid(format!(
            "a read of {} is more than the guest's memory ({}, limits.memory) can hold; \
             read the buffer in parts",
            crate::units::human_bytes(bytes),
            crate::units::human_bytes(cap)
        )))
    }
}

impl wit::Host for TrialHost {
    fn info(&mut self) -> wit::BackendInfo {
        let BackendInfo {
            kind,
            name,
            max_buffer_bytes,
            quota_bytes,
            shaders,
        } = self.compute.info();
        wit::BackendInfo {
            kind: kind.into(),
            name,
            max_buffer_bytes,
            quota_bytes,
            shaders,
        }
    }

    fn create_buffer(&mut self, bytes: u64) -> Result<wit::Buffer> {
        self.compute.create(bytes).map_err(to_wit)
    }

    fn upload(&mut self, data: Vec<u8>) -> Result<wit::Buffer> {
        let answer = self.compute.upload_bytes(&data);
        self.lifted(data.len(), answer)
    }

    fn upload_f32(&mut self, data: Vec<f32>) -> Result<wit::Buffer> {
        let lifted = data.len() * 4;
        let answer = self.compute.upload_f32(data);
        self.lifted(lifted, answer)
    }

    fn write(&mut self, buf: wit::Buffer, offset: u64, data: Vec<u8>) -> Result<()> {
        let answer = self.compute.write_bytes(buf, offset, &data);
        self.lifted(data.len(), answer)
    }

    fn write_f32(&mut self, buf: wit::Buffer, offset: u64, data: Vec<f32>) -> Result<()> {
        let answer = self.compute.write_f32(buf, offset, &data);
        self.lifted(data.len() * 4, answer)
    }

    fn read(&mut self, buf: wit::Buffer, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.fits_guest(len)?;
        self.compute.read_bytes(buf, offset, len).map_err(to_wit)
    }

    fn read_f32(&mut self, buf: wit::Buffer, offset: u64, len: u64) -> Result<Vec<f32>> {
        self.fits_guest(len.saturating_mul(4))?;
        self.compute.read_f32(buf, offset, len).map_err(to_wit)
    }

    fn buffer_size(&mut self, buf: wit::Buffer) -> Result<u64> {
        self.compute.size(buf).map_err(to_wit)
    }

    fn free(&mut self, buf: wit::Buffer) -> Result<()> {
        self.compute.free(buf).map_err(to_wit)
    }

    fn copy(
        &mut self,
        src: wit::Buffer,
        src_offset: u64,
        dst: wit::Buffer,
        dst_offset: u64,
        len: u64,
    ) -> Result<()> {
        self.compute
            .copy(src, src_offset, dst, dst_offset, len)
            .map_err(to_wit)
    }

    fn matmul(
        &mut self,
        a: wit::Buffer,
        b: wit::Buffer,
        out: wit::Buffer,
        spec: wit::MatmulSpec,
    ) -> Result<()> {
        let spec = Matmul {
            m: spec.m,
            n: spec.n,
            k: spec.k,
            transpose_a: spec.transpose_a,
            transpose_b: spec.transpose_b,
            alpha: spec.alpha,
            beta: spec.beta,
        };
        self.compute.matmul(a, b, out, spec).map_err(to_wit)
    }

    fn unary(
        &mut self,
        op: wit::UnaryOp,
        x: wit::Buffer,
        out: wit::Buffer,
        len: u64,
    ) -> Result<()> {
        self.compute.unary(unary(op), x, out, len).map_err(to_wit)
    }

    fn binary(
        &mut self,
        op: wit::BinaryOp,
        a: wit::Buffer,
        b: wit::Buffer,
        out: wit::Buffer,
        len: u64,
    ) -> Result<()> {
        self.compute
            .binary(binary(op), a, b, out, len)
            .map_err(to_wit)
    }

    fn binary_rows(
        &mut self,
        op: wit::BinaryOp,
        x: wit::Buffer,
        row: wit::Buffer,
        out: wit::Buffer,
        rows: u32,
        cols: u32,
    ) -> Result<()> {
        self.compute
            .binary_rows(binary(op), x, row, out, rows, cols)
            .map_err(to_wit)
    }

    fn affine(
        &mut self,
        x: wit::Buffer,
        out: wit::Buffer,
        len: u64,
        scale: f32,
        shift: f32,
    ) -> Result<()> {
        self.compute
            .affine(x, out, len, scale, shift)
            .map_err(to_wit)
    }

    fn axpy(&mut self, alpha: f32, x: wit::Buffer, y: wit::Buffer, len: u64) -> Result<()> {
        self.compute.axpy(alpha, x, y, len).map_err(to_wit)
    }

    fn reduce(
        &mut self,
        op: wit::ReduceOp,
        along: wit::Axis,
        x: wit::Buffer,
        out: wit::Buffer,
        rows: u32,
        cols: u32,
    ) -> Result<()> {
        let op = match op {
            wit::ReduceOp::Sum => Reduce::Sum,
            wit::ReduceOp::Mean => Reduce::Mean,
            wit::ReduceOp::Max => Reduce::Max,
            wit::ReduceOp::Min => Reduce::Min,
        };
        let along = match along {
            wit::Axis::Rows => Axis::Rows,
            wit::Axis::Cols => Axis::Cols,
        };
        self.compute
            .reduce(op, along, x, out, rows, cols)
            .map_err(to_wit)
    }

    fn softmax(&mut self, x: wit::Buffer, out: wit::Buffer, rows: u32, cols: u32) -> Result<()> {
        self.compute.softmax(x, out, rows, cols).map_err(to_wit)
    }

    fn create_pipeline(&mut self, wgsl: String, entry_point: String) -> Result<wit::Pipeline> {
        let answer = self.compute.create_pipeline(&wgsl, &entry_point);
        self.lifted(wgsl.len() + entry_point.len(), answer)
    }

    fn dispatch(
        &mut self,
        p: wit::Pipeline,
        bindings: Vec<wit::Buffer>,
        groups: (u32, u32, u32),
    ) -> Result<()> {
        let answer = self
            .compute
            .dispatch(p, &bindings, [groups.0, groups.1, groups.2]);
        self.lifted(bindings.len() * 4, answer)
    }

    fn free_pipeline(&mut self, p: wit::Pipeline) -> Result<()> {
        self.compute.free_pipeline(p).map_err(to_wit)
    }
}

/// The store's call hook: tells the trial's compute session how much fuel
/// is left when the guest calls into the host, and takes what host compute
/// (and output the guest wrote) cost off the store's fuel when the host
/// returns. A call that could not pay, or ran past its deadline, traps as
/// the guest would have.
pub(crate) fn settle(
    mut store: StoreContextMut<'_, TrialHost>,
    hook: CallHook,
) -> wasmtime::Result<()> {
    match hook {
        CallHook::CallingHost => {
            let fuel = store.get_fuel().ok();
            store.data_mut().compute.enter(fuel);
            Ok(())
        }
        CallHook::ReturningFromHost => {
            let host = store.data_mut();
            host.charge_output();
            let owed = host.compute.settle();
            pay(store, owed)
        }
        _ => Ok(()),
    }
}

/// Ends a guest call: waits for the host work it queued (see
/// [`crate::compute::ComputeSession::end_call`]) and takes what that work
/// owes off the store's fuel, or fails as a host call that could not pay,
/// ran past the deadline or lost its device would.
pub(crate) fn finish_call(store: &mut wasmtime::Store<TrialHost>) -> wasmtime::Result<()> {
    let fuel = store.get_fuel().ok();
    let owed = store.data_mut().compute.end_call(fuel);
    pay(store.as_context_mut(), owed)
}

/// The error a host call returns when the trial's compute device lost its
/// buffers: the sandbox names the trial's failure after it.
#[derive(Debug)]
pub(crate) struct DeviceLost(pub(crate) String);

impl std::fmt::Display for DeviceLost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DeviceLost {}

/// Takes what a returning host call owes off the store's fuel, or traps.
fn pay(
    mut store: StoreContextMut<'_, TrialHost>,
    owed: std::result::Result<u64, Stop>,
) -> wasmtime::Result<()> {
    match owed {
        Ok(0) => Ok(()),
        Ok(debt) => {
            let left = store.get_fuel()?;
            if debt > left {
                store.set_fuel(0)?;
                return Err(Trap::OutOfFuel.into());
            }
            store.set_fuel(left - debt)
        }
        Err(Stop::OutOfFuel) => {
            store.set_fuel(0)?;
            Err(Trap::OutOfFuel.into())
        }
        Err(Stop::Deadline) => Err(Trap::Interrupt.into()),
        Err(Stop::DeviceLost) => {
            let why = store.data().compute.lost().unwrap_or("the device failed");
            Err(wasmtime::Error::new(DeviceLost(why.to_owned())))
        }
    }
}
