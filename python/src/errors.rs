//! The exceptions Python sees: one class per family of failure, so that a
//! caller (Ray, a marketplace) can act on the cause, with `wtune run`'s
//! one-line reason as the message. The message is made inert (control
//! characters written as visible escapes, as `wtune run` shows them):
//! Ray, loggers and tracebacks print it to an operator's terminal, and a
//! guest chooses what its errors say. The guest's raw output stays in
//! the trial's log files.

use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use wtune::report::terminal::inert;
use wtune::sandbox::{FaultKind, TrialFault};
use wtune::wasm_backend::WasmError;

/// Declares each exception class (`Name(Base): "doc";`) and `register`,
/// which adds them all to the module: one list, so a class cannot be
/// declared and then forgotten.
macro_rules! exceptions {
    ($($name:ident($base:ident): $doc:literal;)*) => {
        $(pyo3::create_exception!(wtune, $name, $base, $doc);)*

        pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
            $(m.add(stringify!($name), m.py().get_type::<$name>())?;)*
            Ok(())
        }
    };
}

exceptions! {
    WtuneError(PyException):
        "Base class of every error wtune raises.";
    ConfigError(WtuneError):
        "A setting (limits, data, compute, checkpoint...) is malformed or not allowed.";
    ComponentError(WtuneError):
        "The component cannot be read, is not a trainable, or is not allowed to run.";
    TrialError(WtuneError):
        "The trainable failed; the subclass says how.";
    FuelExhausted(TrialError):
        "A call burned past the per-call fuel limit, or the trial's fuel budget ran out.";
    MemoryExceeded(TrialError):
        "Guest memory or tables grew past their cap.";
    DeadlineExceeded(TrialError):
        "A call ran past its wall-clock deadline.";
    QuotaExceeded(TrialError):
        "Files, disk, descriptors or result bytes went past their quota.";
    GuestTrap(TrialError):
        "The guest trapped, panicked or called exit; the message carries its panic text.";
    GuestError(TrialError):
        "The guest returned an error from a call, with its own message.";
    BadOutput(TrialError):
        "The guest returned or passed a value the host refuses.";
    DeviceLost(TrialError):
        "Host compute lost the trial's device.";
    CheckpointError(WtuneError):
        "A checkpoint cannot be written, read or restored.";
}

/// The exception for a fault, by its family.
pub(crate) fn fault(fault: &TrialFault) -> PyErr {
    let message = inert(&fault.to_string()).into_owned();
    match fault.kind() {
        FaultKind::Fuel => FuelExhausted::new_err(message),
        FaultKind::Memory => MemoryExceeded::new_err(message),
        FaultKind::Deadline => DeadlineExceeded::new_err(message),
        FaultKind::Resource => QuotaExceeded::new_err(message),
        FaultKind::Trap => GuestTrap::new_err(message),
        FaultKind::Guest => GuestError::new_err(message),
        FaultKind::Output => BadOutput::new_err(message),
        FaultKind::Device => DeviceLost::new_err(message),
        FaultKind::Host => WtuneError::new_err(message),
    }
}

pub(crate) fn wasm(error: &WasmError) -> PyErr {
    match error {
        WasmError::Fault(f) => fault(f),
        WasmError::Checkpoint(why) => CheckpointError::new_err(inert(why).into_owned()),
        WasmError::Io(why) => WtuneError::new_err(inert(why).into_owned()),
    }
}
