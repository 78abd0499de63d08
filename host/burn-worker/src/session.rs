//! One trial's burn tensors on the host: the frames its guest sends,
//! checked and run in order.
//!
//! Every command is checked before it runs: its tensors against the
//! [`Ledger`], its output shapes against [`shapes::expected`], its size
//! against the trial's memory quota and its [`cost`] against the fuel the
//! trial has left. The first command that fails a check, or whose kernel
//! panics, stops the session: it is kept as the session's error, every
//! later command is skipped, and every read and sync answers with it (the
//! guest's tensors after it may be half-computed). After each operation the
//! outputs burn made are compared with what was declared, so the ledger
//! stays the truth about what the backend holds.
//!
//! [`image`] turns a session into bytes for the host's snapshots and back.

mod image;

pub use image::{MAX_DRAW_RUNS, MAX_REPLAY_ELEMENTS};

use std::panic::{AssertUnwindSafe, catch_unwind};

use burn_backend::{DTypeUsage, TensorMetadata};
use burn_flex::{Flex, FlexDevice};
use burn_ir::{HandleKind, OperationIr, TensorId, TensorIr, TensorStatus};
use burn_remote::wire::{self, Command};
use burn_router::TensorInterpreter;
use burn_std::DType;
use burn_std::TensorData;
use burn_std::reader::read_sync;

use crate::cost;
use crate::ledger::{Entry, Id, Ledger, bytes_of, shown};
use crate::storage::{Buffer, Buffers};
use crate::{scratch, shapes};

/// What a session holds, for the host's accounts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Bytes the trial's tensors take.
    pub bytes: u64,
    /// How many tensors it holds.
    pub tensors: u64,
}

/// One trial's tensors and the burn backend that computes them: burn's
/// CPU backend (`Flex`, the default) or a GPU through burn's wgpu backend
/// ([`crate::gpu`]).
pub struct Session<B: Buffers = Flex> {
    interpreter: TensorInterpreter<B>,
    device: B::Device,
    ledger: Ledger,
    /// Fuel the trial may still spend, as the host last granted it.
    fuel_left: u64,
    /// Fuel spent since the host last took the count.
    fuel_spent: u64,
    /// Commands received, for errors to point at.
    commands: u64,
    /// The first failure; nothing runs after it.
    error: Option<String>,
    /// Whether that failure was a command the trial's fuel could not pay.
    out_of_fuel: bool,
    /// The random draws since the last seed, for snapshots ([`image`]).
    draws: image::Draws,
}

impl Session {
    /// A session on burn's CPU backend whose tensors may take
    /// `memory_bytes` together and which may spend `fuel` until
    /// [`Session::grant`] says otherwise.
    pub fn new(memory_bytes: u64, fuel: u64) -> Self {
        Session::on(FlexDevice, memory_bytes, fuel)
    }
}

impl<B: Buffers> Session<B> {
    /// A session like [`Session::new`] whose tensors live on `device`.
    pub fn on(device: B::Device, memory_bytes: u64, fuel: u64) -> Self {
        Self {
            interpreter: TensorInterpreter::new(device.clone()),
            device,
            ledger: Ledger::new(memory_bytes),
            fuel_left: fuel,
            fuel_spent: 0,
            commands: 0,
            error: None,
            out_of_fuel: false,
            draws: image::Draws::default(),
        }
    }

    /// Sets the fuel the trial has left, as the host counted it when it
    /// last took the count ([`Session::take_fuel_spent`]): what was spent
    /// since is still owed.
    pub fn grant(&mut self, fuel: u64) {
        self.fuel_left = fuel.saturating_sub(self.fuel_spent);
    }

    /// Fuel spent since the last call, for the host to take off the
    /// trial's budget.
    pub fn take_fuel_spent(&mut self) -> u64 {
        std::mem::take(&mut self.fuel_spent)
    }

    /// What the trial holds.
    pub fn usage(&self) -> Usage {
        Usage {
            bytes: self.ledger.bytes(),
            tensors: self.ledger.len() as u64,
        }
    }

    /// The session's first failure, if any.
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    /// Whether the session stopped at a command the trial could not pay
    /// for: the host then ends the trial as out of fuel, as it would a
    /// guest instruction it could not pay for.
    pub fn out_of_fuel(&self) -> bool {
        self.out_of_fuel
    }

    /// Fails the session for `why` (a request the host could not make
    /// sense of), unless it failed before; returns its error.
    pub fn refuse(&mut self, why: String) -> String {
        self.error.get_or_insert(why).clone()
    }

    /// Runs a frame's commands in order, up to the first failure.
    pub fn run(&mut self, frame: &[u8]) {
        for command in wire::commands(frame) {
            if self.error.is_some() {
                return;
            }
            self.commands += 1;
            let outcome = command.and_then(|command| self.command(command));
            if let Err(why) = outcome {
                self.error = Some(format!("burn command {}: {why}", self.commands));
            }
        }
    }

    /// Runs `frame`, then reads `tensor` back.
    pub fn read(&mut self, frame: &[u8], tensor: TensorIr) -> Result<TensorData, String> {
        self.run(frame);
        self.spoiled()?;
        let entry = match self.ledger.check_input(&tensor) {
            Ok(entry) => entry.clone(),
            Err(why) => return Err(self.refuse(format!("reading: {why}"))),
        };
        if let Err(why) = self.pay(cost::data_fuel(entry.bytes)) {
            return Err(self.refuse(format!("reading {}: {why}", Id(tensor.id))));
        }
        let id = tensor.id;
        let frees = matches!(tensor.status, TensorStatus::ReadWrite);
        let interpreter = &mut self.interpreter;
        let read = guarded(|| read_sync(interpreter.read_tensor_async(tensor)))
            .and_then(|read| read.map_err(|e| format!("reading {}: {e}", Id(id))));
        if frees {
            self.ledger.free(id);
        }
        read.inspect_err(|why| self.error = Some(why.clone()))
    }

    /// Runs `frame` and waits for everything sent so far.
    pub fn sync(&mut self, frame: &[u8]) -> Result<(), String> {
        self.run(frame);
        self.spoiled()?;
        self.interpreter.sync().map_err(|e| {
            let why = format!("the backend failed: {e}");
            self.error = Some(why.clone());
            why
        })
    }

    fn spoiled(&self) -> Result<(), String> {
        match &self.error {
            Some(why) => Err(why.clone()),
            None => Ok(()),
        }
    }

    /// Takes `fuel` from what is left, or refuses.
    fn pay(&mut self, fuel: u64) -> Result<(), String> {
        if fuel > self.fuel_left {
            self.out_of_fuel = self.error.is_none();
            return Err(format!(
                "out of fuel: it costs {fuel} and the trial has {} left",
                self.fuel_left
            ));
        }
        self.fuel_left -= fuel;
        self.fuel_spent += fuel;
        Ok(())
    }

    fn command(&mut self, command: Command) -> Result<(), String> {
        match command {
            Command::Operation(op) => self
                .operation(op.clone())
                .map_err(|why| format!("{} was refused: {why}", shapes::name(&op))),
            Command::Data { id, data } => self
                .data(id, data)
                .map_err(|why| format!("tensor data for {} was refused: {why}", Id(id))),
            Command::Seed(seed) => {
                self.pay(cost::PER_OPERATION)?;
                self.interpreter.seed(seed);
                self.draws.seeded(seed);
                Ok(())
            }
        }
    }

    fn data(&mut self, id: TensorId, data: TensorData) -> Result<(), String> {
        let bytes = self.check_data(id, &data)?;
        self.pay(cost::data_fuel(bytes))?;
        self.admit(id, data, bytes)
    }

    /// Refuses a type the backend cannot store (bools as native bytes on a
    /// GPU, as 32-bit words on the CPU: the guest's SDK asks the host
    /// which), rather than letting a kernel fail on it.
    fn check_dtype(&self, dtype: DType) -> Result<(), String> {
        if B::dtype_usage(&self.device, dtype).contains(DTypeUsage::Storage) {
            return Ok(());
        }
        Err(format!(
            "this backend ({}) has no {dtype:?} tensors",
            B::name(&self.device)
        ))
    }

    /// The bytes `data` would take as tensor `id`, if it may be made.
    fn check_data(&self, id: TensorId, data: &TensorData) -> Result<u64, String> {
        self.check_dtype(data.dtype())?;
        self.ledger.check_fresh(id)?;
        self.ledger.check_count(1)?;
        let bytes = bytes_of(data.shape(), data.dtype())?;
        self.ledger.check_room(bytes)?;
        Ok(bytes)
    }

    /// Makes tensor `id` of `data`, which [`Session::check_data`] passed.
    fn admit(&mut self, id: TensorId, data: TensorData, bytes: u64) -> Result<(), String> {
        let entry = Entry {
            shape: data.shape().clone(),
            dtype: data.dtype(),
            bytes,
        };
        let look = TensorIr {
            id,
            shape: entry.shape.clone(),
            status: TensorStatus::ReadOnly,
            dtype: entry.dtype,
        };
        let interpreter = &mut self.interpreter;
        guarded(|| interpreter.register_tensor_data_id(id, data))?;
        let buffer = self.made_as_declared(&look)?;
        self.ledger.insert(id, entry, buffer);
        self.ledger.check_room(0)
    }

    fn operation(&mut self, op: OperationIr) -> Result<(), String> {
        if let OperationIr::Init(init) = &op {
            // Marks tensor data the guest sent as its tensor: the tensor
            // must be there, as described, and nothing runs.
            let held = TensorIr {
                status: TensorStatus::ReadOnly,
                ..init.out.clone()
            };
            self.ledger.check_input(&held)?;
            return self.pay(cost::PER_OPERATION);
        }
        let mut plan = self.ledger.plan(op.inputs(), op.outputs())?;
        if let OperationIr::Drop(tensor) = &op {
            // burn-router forgets a dropped tensor whatever its status says.
            plan.frees = vec![tensor.id];
        }
        let expected = guarded(|| shapes::expected(&op))??;
        let declared: Vec<TensorIr> = op.outputs().cloned().collect();
        if expected.len() != declared.len() {
            return Err(format!(
                "it makes {} tensors, and {} were declared",
                expected.len(),
                declared.len()
            ));
        }
        for (tensor, shape) in declared.iter().zip(&expected) {
            self.check_dtype(tensor.dtype)?;
            if tensor.shape != *shape {
                return Err(format!(
                    "{} must be {}, and was declared {}",
                    Id(tensor.id),
                    shown(shape),
                    shown(&tensor.shape)
                ));
            }
        }
        // Declared types are checked only once burn has made the outputs,
        // so the room is checked with each output element as wide as the
        // widest of its declared type and the inputs' types: a type lie
        // cannot let burn allocate past the quota first.
        let width = op
            .inputs()
            .chain(&declared)
            .map(|t| t.dtype.size() as u64)
            .max()
            .unwrap_or(0);
        let widest: u64 = declared
            .iter()
            .map(|t| (t.shape.num_elements() as u64).saturating_mul(width))
            .fold(0, u64::saturating_add);
        // A convolution's im2col tiles and a weight gradient's unsliced
        // result, as wide as the outputs' elements.
        let scratch = scratch::elements_of(&op).saturating_mul(width);
        self.ledger
            .check_room(widest.max(plan.bytes()).saturating_add(scratch))?;
        self.pay(cost::fuel(&op))?;
        let draw = image::Draw::of(&op);
        if let Some(draw) = &draw {
            self.draws.before::<B>(draw, &self.device);
        }
        let interpreter = &mut self.interpreter;
        guarded(|| interpreter.register_op(op))?;
        if let Some(draw) = draw {
            self.draws.push(draw);
        }
        let buffers = declared
            .iter()
            .map(|tensor| self.made_as_declared(tensor))
            .collect::<Result<Vec<_>, _>>()?;
        self.ledger.commit(plan, &buffers);
        // The room was checked with each output as a new buffer of its own
        // size, and the backend made them: this holds unless it made one
        // larger than its elements.
        self.ledger.check_room(0)
    }

    /// Checks that the backend made `tensor` with the declared shape and
    /// type, and says which buffer it holds.
    fn made_as_declared(&mut self, tensor: &TensorIr) -> Result<Buffer, String> {
        let look = TensorIr {
            status: TensorStatus::ReadOnly,
            ..tensor.clone()
        };
        let interpreter = &mut self.interpreter;
        let (made, buffer) = guarded(|| {
            let handle = interpreter.get_tensor(&look);
            let made = match &handle {
                HandleKind::Float(t) => (t.shape(), t.dtype()),
                HandleKind::Int(t) => (t.shape(), t.dtype()),
                HandleKind::Bool(t) => (t.shape(), t.dtype()),
                HandleKind::Quantized(t) => (t.shape(), t.dtype()),
            };
            (made, B::buffer(&handle))
        })?;
        if made != (tensor.shape.clone(), tensor.dtype) {
            return Err(format!(
                "{} came out {} {:?}, and was declared {} {:?}",
                Id(tensor.id),
                shown(&made.0),
                made.1,
                shown(&tensor.shape),
                tensor.dtype
            ));
        }
        buffer.ok_or_else(|| format!("the backend does not say where {} is kept", Id(tensor.id)))
    }
}

/// Runs `f`, turning a panic in burn into an error that says what it was.
fn guarded<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic with no message".into());
        format!("the backend stopped: {what}")
    })
}
