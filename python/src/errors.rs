//! The exceptions Python sees: one class per family of failure, so that a
//! caller (Ray, a marketplace) can act on the cause, with `wtune run`'s
//! one-line reason as the message.

use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use wtune::sandbox::{FaultKind, TrialFault};
use wtune::wasm_backend::WasmError;

pyo3::create_exception!(
    wtune,
    WtuneError,
    PyException,
    "Base class of every error wtune raises."
);
pyo3::create_exception!(
    wtune,
    ConfigError,
    WtuneError,
    "A setting (limits, data, compute, checkpoint...) is malformed or not allowed."
);
pyo3::create_exception!(
    wtune,
    ComponentError,
    WtuneError,
    "The component cannot be read, is not a trainable, or is not allowed to run."
);
pyo3::create_exception!(
    wtune,
    TrialError,
    WtuneError,
    "The trainable failed; the subclass says how."
);
pyo3::create_exception!(
    wtune,
    FuelExhausted,
    TrialError,
    "A call burned past the per-call fuel limit, or the trial's fuel budget ran out."
);
pyo3::create_exception!(
    wtune,
    MemoryExceeded,
    TrialError,
    "Guest memory or tables grew past their cap."
);
pyo3::create_exception!(
    wtune,
    DeadlineExceeded,
    TrialError,
    "A call ran past its wall-clock deadline."
);
pyo3::create_exception!(
    wtune,
    QuotaExceeded,
    TrialError,
    "Files, disk, descriptors or result bytes went past their quota."
);
pyo3::create_exception!(
    wtune,
    GuestTrap,
    TrialError,
    "The guest trapped, panicked or called exit; the message carries its panic text."
);
pyo3::create_exception!(
    wtune,
    GuestError,
    TrialError,
    "The guest returned an error from a call, with its own message."
);
pyo3::create_exception!(
    wtune,
    BadOutput,
    TrialError,
    "The guest returned or passed a value the host refuses."
);
pyo3::create_exception!(
    wtune,
    DeviceLost,
    TrialError,
    "Host compute lost the trial's device."
);
pyo3::create_exception!(
    wtune,
    CheckpointError,
    WtuneError,
    "A checkpoint cannot be written, read or restored."
);

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("WtuneError", py.get_type::<WtuneError>())?;
    m.add("ConfigError", py.get_type::<ConfigError>())?;
    m.add("ComponentError", py.get_type::<ComponentError>())?;
    m.add("TrialError", py.get_type::<TrialError>())?;
    m.add("FuelExhausted", py.get_type::<FuelExhausted>())?;
    m.add("MemoryExceeded", py.get_type::<MemoryExceeded>())?;
    m.add("DeadlineExceeded", py.get_type::<DeadlineExceeded>())?;
    m.add("QuotaExceeded", py.get_type::<QuotaExceeded>())?;
    m.add("GuestTrap", py.get_type::<GuestTrap>())?;
    m.add("GuestError", py.get_type::<GuestError>())?;
    m.add("BadOutput", py.get_type::<BadOutput>())?;
    m.add("DeviceLost", py.get_type::<DeviceLost>())?;
    m.add("CheckpointError", py.get_type::<CheckpointError>())?;
    Ok(())
}

/// The exception for a fault, by its family.
pub(crate) fn fault(fault: &TrialFault) -> PyErr {
    let message = fault.to_string();
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
        WasmError::Checkpoint(why) => CheckpointError::new_err(why.clone()),
        WasmError::Io(why) => WtuneError::new_err(why.clone()),
    }
}
