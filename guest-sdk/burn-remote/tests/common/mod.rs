//! An in-process host for the tests: burn-router's interpreter over burn's
//! CPU backend, fed the frames the client sends, as the wtune host is.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Mutex, MutexGuard, OnceLock};

use burn_flex::{Flex, FlexDevice};
use burn_ir::TensorIr;
use burn_remote::wire::{self, Command};
use burn_remote::{RemoteDevice, Transport};
use burn_router::TensorInterpreter;
use burn_std::reader::try_read_sync;
use burn_std::{ExecutionError, TensorData};

/// What the host saw, for the tests to check.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Traffic {
    /// Frames handed over without waiting.
    pub submits: usize,
    /// Calls that waited for the host: reads and syncs.
    pub waits: usize,
    /// Commands received.
    pub commands: usize,
    /// The most commands one frame held.
    pub largest_frame: usize,
}

struct State {
    interpreter: TensorInterpreter<Flex>,
    /// The first error, answered to every read and sync after it.
    error: Option<ExecutionError>,
    traffic: Traffic,
}

/// [`Transport`] into a [`TensorInterpreter`] in this process.
pub struct InProcessHost(Mutex<State>);

static HOST: OnceLock<&'static InProcessHost> = OnceLock::new();

/// Serialises the tests of one file: they share the client's queue and
/// burn's process-global CPU random generator.
static SERIAL: Mutex<()> = Mutex::new(());

/// Installs the host once per test process and holds the test lock.
pub fn host() -> (&'static InProcessHost, MutexGuard<'static, ()>) {
    let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let host = *HOST.get_or_init(|| {
        let host: &'static InProcessHost = Box::leak(Box::new(InProcessHost(Mutex::new(State {
            interpreter: TensorInterpreter::new(FlexDevice),
            error: None,
            traffic: Traffic::default(),
        }))));
        assert!(burn_remote::install(Forward(host)));
        host
    });
    (host, serial)
}

/// The device the client sends to, with burn's autodiff over it.
pub fn remote() -> burn::tensor::Device {
    burn::tensor::Device::new(RemoteDevice).autodiff()
}

/// The same computations, run by burn in this process.
pub fn local() -> burn::tensor::Device {
    burn::tensor::Device::flex().autodiff()
}

impl InProcessHost {
    pub fn traffic(&self) -> Traffic {
        self.0.lock().unwrap().traffic
    }

    fn run(&self, frame: &[u8]) -> MutexGuard<'_, State> {
        let mut state = self.0.lock().unwrap();
        let mut count = 0;
        for command in wire::commands(frame) {
            count += 1;
            if state.error.is_some() {
                continue;
            }
            let interpreter = &mut state.interpreter;
            let outcome = command.and_then(|command| {
                catch_unwind(AssertUnwindSafe(|| match command {
                    Command::Operation(op) => interpreter.register_op(op),
                    Command::Data { id, data } => interpreter.register_tensor_data_id(id, data),
                    Command::Seed(seed) => interpreter.seed(seed),
                }))
                .map_err(|_| "the operation panicked".to_owned())
            });
            if let Err(reason) = outcome {
                state.error = Some(ExecutionError::generic(reason));
            }
        }
        state.traffic.commands += count;
        state.traffic.largest_frame = state.traffic.largest_frame.max(count);
        state
    }
}

/// `install` takes the transport by value; the tests keep a reference.
struct Forward(&'static InProcessHost);

impl Transport for Forward {
    fn submit(&self, frame: &[u8]) {
        self.0.run(frame).traffic.submits += 1;
    }

    fn read(&self, frame: &[u8], tensor: TensorIr) -> Result<TensorData, ExecutionError> {
        let mut state = self.0.run(frame);
        state.traffic.waits += 1;
        if let Some(error) = &state.error {
            return Err(error.clone());
        }
        let read = state.interpreter.read_tensor_async(tensor);
        try_read_sync(read).expect("the CPU backend reads synchronously")
    }

    fn sync(&self, frame: &[u8]) -> Result<(), ExecutionError> {
        let mut state = self.0.run(frame);
        state.traffic.waits += 1;
        match &state.error {
            Some(error) => Err(error.clone()),
            None => state.interpreter.sync(),
        }
    }
}
