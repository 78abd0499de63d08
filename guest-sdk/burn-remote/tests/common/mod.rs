//! An in-process host for the tests: wtune's burn executor (the session a
//! `wtune-burn-worker` serves), fed the frames the client sends. Every
//! operation the tests make is checked by it as the wtune host checks it.

// Each test file uses some of these helpers.
#![allow(dead_code)]

pub mod cases;
pub mod cnn;
pub mod worker;

use std::sync::{Mutex, MutexGuard, OnceLock};

use burn_ir::TensorIr;
use burn_remote::wire;
use burn_remote::{RemoteDevice, Transport};
use burn_std::{ExecutionError, TensorData};
use wtune_burn_worker::Session;

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
    session: Session,
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
            // Room and fuel the tests never run out of.
            session: Session::new(1 << 30, u64::MAX),
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

    /// Counts `frame`'s commands and hands the state on for them to run.
    fn received(&self, frame: &[u8]) -> MutexGuard<'_, State> {
        let mut state = self.0.lock().unwrap();
        let count = wire::commands(frame).count();
        state.traffic.commands += count;
        state.traffic.largest_frame = state.traffic.largest_frame.max(count);
        state
    }
}

/// `install` takes the transport by value; the tests keep a reference.
struct Forward(&'static InProcessHost);

impl Transport for Forward {
    fn submit(&self, frame: &[u8]) {
        let mut state = self.0.received(frame);
        state.traffic.submits += 1;
        state.session.run(frame);
    }

    fn read(&self, frame: &[u8], tensor: TensorIr) -> Result<TensorData, ExecutionError> {
        let mut state = self.0.received(frame);
        state.traffic.waits += 1;
        state
            .session
            .read(frame, tensor)
            .map_err(ExecutionError::generic)
    }

    fn sync(&self, frame: &[u8]) -> Result<(), ExecutionError> {
        let mut state = self.0.received(frame);
        state.traffic.waits += 1;
        state.session.sync(frame).map_err(ExecutionError::generic)
    }
}
