//! wtune's burn executor (the session a `wtune-burn-worker` serves) as this
//! process's burn transport: the examples' `backend = "host"` without the
//! sandbox, the worker process or the pipe. Every operation is checked and
//! charged as the wtune host does it.

use std::sync::{Mutex, MutexGuard};

use burn::tensor::TensorData;
use burn_backend::ExecutionError;
use burn_ir::TensorIr;
use burn_remote::Transport;
use wtune_burn_worker::Session;

/// One burn session, fed each frame the client sends.
pub struct InProcessWorker(Mutex<Session>);

impl InProcessWorker {
    /// Makes a worker this process's burn transport (before any
    /// `burn_remote::host()`, which then keeps it) and returns it.
    pub fn install() -> &'static Self {
        // Room and fuel the examples never run out of.
        let worker = Box::leak(Box::new(Self(Mutex::new(Session::new(
            1 << 30,
            u64::MAX / 4,
        )))));
        let worker: &'static Self = worker;
        assert!(
            burn_remote::install(worker),
            "a burn transport was installed before"
        );
        worker
    }

    /// Fuel the session charged since the last call: its work, on the host
    /// compute scale (`wtune_burn_worker::cost`).
    #[allow(dead_code)] // tabulate's; native_step only times.
    pub fn take_fuel_spent(&self) -> u64 {
        self.session().take_fuel_spent()
    }

    fn session(&self) -> MutexGuard<'_, Session> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Transport for &'static InProcessWorker {
    fn submit(&self, frame: &[u8]) {
        self.session().run(frame);
    }

    fn read(&self, frame: &[u8], tensor: TensorIr) -> Result<TensorData, ExecutionError> {
        let result = self.session().read(frame, tensor);
        result.map_err(ExecutionError::generic)
    }

    fn sync(&self, frame: &[u8]) -> Result<(), ExecutionError> {
        let result = self.session().sync(frame);
        result.map_err(ExecutionError::generic)
    }
}
