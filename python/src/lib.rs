//! `wtune._native`: wtune's sandbox for Python. One [`Trainable`] is one
//! sandboxed trial (a component instance with wtune's limits), driven from
//! Python the way `wtune run` drives it; the `wtune` package wraps it with
//! keyword arguments, and `wtune.ray` makes a Ray Tune trainable of it.
//!
//! Nothing here re-implements the sandbox: loading, limits, checkpoints and
//! faults are the `wtune` crate's, and every failure becomes one of the
//! exception classes of [`errors`], whose message is the one `wtune run`
//! would show for the trial's ERROR status.

use pyo3::prelude::*;

mod errors;
mod experiment;
mod sandboxes;
mod trainable;
mod workers;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<trainable::Trainable>()?;
    m.add_function(wrap_pyfunction!(experiment::plan_experiment, m)?)?;
    m.add_function(wrap_pyfunction!(experiment::check_trial_settings, m)?)?;
    m.add_function(wrap_pyfunction!(experiment::check_experiment_keys, m)?)?;
    m.add_function(wrap_pyfunction!(experiment::summary_text, m)?)?;
    m.add_function(wrap_pyfunction!(workers::serve_workers_with, m)?)?;
    m.add_function(wrap_pyfunction!(workers::serve_worker, m)?)?;
    errors::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
