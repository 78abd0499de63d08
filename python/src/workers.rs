//! wtune's helper processes (the compile worker, GPU workers) when the
//! executable is Python: the package names a Python command that imports
//! this module and answers the worker subcommands here.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use pyo3::prelude::*;
use wtune::process::{WorkerProgram, serve_workers_with as serve_with};

/// Starts this process's workers as `program *prefix SUBCOMMAND ARGS...`
/// unless `$WTUNE_WORKER` names a `wtune` binary. The first call wins.
#[pyfunction]
pub(crate) fn serve_workers_with(program: PathBuf, prefix: Vec<String>) {
    serve_with(WorkerProgram {
        program,
        prefix: prefix.into_iter().map(OsString::from).collect(),
    });
}

/// Runs the worker that `args` (`["gpu-worker", "--adapter", N]` or
/// `["compile-worker", "--max-wasm-stack", N]`) names, until its host
/// closes the pipe; returns the process's exit status.
#[pyfunction]
pub(crate) fn serve_worker(py: Python<'_>, args: Vec<String>) -> PyResult<i32> {
    let number = |flag: &str| -> PyResult<usize> {
        match args.as_slice() {
            [_, f, n] if f == flag => n.parse().map_err(|_| {
                pyo3::exceptions::PyValueError::new_err(format!("{flag} takes a number, got {n}"))
            }),
            _ => Err(pyo3::exceptions::PyValueError::new_err(format!(
                "expected {} {flag} N, got {args:?}",
                args.first().map_or("", String::as_str)
            ))),
        }
    };
    let code = match args.first().map(String::as_str) {
        Some("gpu-worker") => {
            let adapter = number("--adapter")?;
            py.detach(|| wtune::compute::gpu::worker_main(adapter))
        }
        Some("compile-worker") => {
            let stack = number("--max-wasm-stack")?;
            py.detach(|| wtune::sandbox::compile_worker_main(stack))
        }
        _ => {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "not a wtune worker: {args:?}"
            )));
        }
    };
    Ok(if code == ExitCode::SUCCESS { 0 } else { 1 })
}
