//! Compiling untrusted components in a separate process with time and
//! memory limits.
//!
//! wasmtime's security model leaves compile-time denial of service out of
//! scope: a small component can make Cranelift run for minutes or take
//! gigabytes. So wtune compiles in `wtune compile-worker`, a child process
//! under an address-space limit (`setrlimit`) that is killed at a
//! wall-clock deadline. The child returns wasmtime's serialized artifact,
//! which the host loads; a component that overruns a limit is refused with
//! the limit named, and the host is untouched.

use std::io::{Read, Write};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;

use wasmtime::Engine;

use super::engine::{CompileIsolation, CompileOptions};
use crate::process::{OutputTail, worker_program};
use crate::units::human_bytes;

/// The exit status of a compile worker whose input is not a valid
/// component; its stderr holds wasmtime's message.
const INVALID_EXIT: i32 = 3;

/// Bytes of the worker's stderr kept for messages.
const STDERR_TAIL: usize = 16 << 10;

/// Compile threads in the worker at most. Each thread's stack and malloc
/// arena count against the address-space limit, so on a many-core machine
/// an unbounded pool would exhaust a modest limit before compiling
/// anything, and make the limit mean something different on every machine.
const MAX_COMPILE_THREADS: usize = 8;

/// Why a component produced no artifact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CompileFailure {
    /// wasmtime rejected the component (the guest's fault).
    Invalid(String),
    /// The component overran a compile limit and is refused.
    Limit(String),
    /// The compile worker could not run or failed for another reason.
    Worker(String),
}

/// Compiles `bytes` into wasmtime's serialized form for `engine`, where
/// `options` says.
pub(crate) fn precompile(
    engine: &Engine,
    bytes: &[u8],
    options: &CompileOptions,
    max_wasm_stack: usize,
) -> Result<Vec<u8>, CompileFailure> {
    match options.isolation {
        CompileIsolation::InProcess => engine
            .precompile_component(bytes)
            .map_err(|e| CompileFailure::Invalid(format!("{e:#}"))),
        CompileIsolation::Process => in_worker(bytes, options, max_wasm_stack),
    }
}

fn in_worker(
    bytes: &[u8],
    options: &CompileOptions,
    max_wasm_stack: usize,
) -> Result<Vec<u8>, CompileFailure> {
    let executable = worker_program().map_err(|e| {
        CompileFailure::Worker(format!(
            "untrusted components are compiled in `wtune compile-worker`: {e} (or set \
             security.compile = \"in-process\" for trusted components)"
        ))
    })?;
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(MAX_COMPILE_THREADS);
    let mut command = executable.command();
    command
        .arg("compile-worker")
        .arg("--max-wasm-stack")
        .arg(max_wasm_stack.to_string())
        .env_clear()
        .env("RAYON_NUM_THREADS", threads.to_string())
        // glibc gives each compiling thread an arena with 64 MiB of address
        // space; two are plenty for a compiler.
        .env("MALLOC_ARENA_MAX", "2")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    confine(&mut command, options, threads);
    let mut child = command.spawn().map_err(|e| {
        CompileFailure::Worker(format!("starting the compile worker {executable}: {e}"))
    })?;

    let mut stdin = child.stdin.take().expect("piped");
    let input = bytes.to_vec();
    // A worker that dies early stops reading; its exit status says why, so
    // the broken pipe is not the story.
    thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let stderr = OutputTail::collect(child.stderr.take().expect("piped"), STDERR_TAIL);
    let stdout = child.stdout.take().expect("piped");
    // The artifact is machine code for the component plus metadata; one
    // larger than the compiler's whole address space cannot be honest, and
    // the cap keeps the host's copy of it bounded.
    let most = options.memory;
    let (done, finished) = mpsc::channel();
    thread::spawn(move || {
        let mut artifact = Vec::new();
        let read = stdout
            .take(most.saturating_add(1))
            .read_to_end(&mut artifact)
            .map(|_| artifact);
        let _ = done.send(read);
    });

    let artifact = match finished.recv_timeout(options.timeout) {
        Ok(read) => read,
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(CompileFailure::Limit(format!(
                "compiling it took longer than the {} compile time limit \
                 (limits.compile_timeout)",
                humantime::format_duration(options.timeout)
            )));
        }
    };
    let status = child
        .wait()
        .map_err(|e| CompileFailure::Worker(format!("waiting for the compile worker: {e}")))?;
    let stderr = stderr.finish();
    if !status.success() {
        return Err(explain(status, &stderr, options));
    }
    let artifact = artifact
        .map_err(|e| CompileFailure::Worker(format!("reading the compile worker's output: {e}")))?;
    if artifact.len() as u64 > most {
        return Err(CompileFailure::Limit(format!(
            "its compiled form is larger than the {} compile memory limit \
             (limits.compile_memory)",
            human_bytes(options.memory)
        )));
    }
    Ok(artifact)
}

/// Turns a failed worker's exit into the reason the user sees.
fn explain(status: ExitStatus, stderr: &str, options: &CompileOptions) -> CompileFailure {
    if status.code() == Some(INVALID_EXIT) {
        return CompileFailure::Invalid(stderr.to_string());
    }
    // Rust aborts on a failed allocation with the first message; an mmap
    // the limit refuses surfaces as ENOMEM, and a thread whose stack cannot
    // be mapped as EAGAIN.
    let out_of_memory = [
        "memory allocation of",
        "out of memory",
        "Cannot allocate memory",
        "Resource temporarily unavailable",
    ]
    .iter()
    .any(|sign| stderr.contains(sign));
    if out_of_memory {
        return CompileFailure::Limit(format!(
            "compiling it needed more than the {} compile memory limit (limits.compile_memory)",
            human_bytes(options.memory)
        ));
    }
    let said = match stderr
        .lines()
        .rev()
        .find(|line| !line.is_empty() && !line.starts_with("note:"))
    {
        Some(line) => format!("; it said: {line}"),
        None => String::new(),
    };
    CompileFailure::Worker(format!("the compile worker failed ({status}){said}"))
}

/// Limits the worker's address space, its CPU time (a backstop for the
/// wall-clock kill: `threads` busy for the whole deadline, plus a second),
/// and core dumps; on Linux it also dies with the host, so a host that is
/// killed mid-compile leaves no compiler running.
#[cfg(unix)]
fn confine(command: &mut Command, options: &CompileOptions, threads: usize) {
    use std::os::unix::process::CommandExt;

    let memory = options.memory as libc::rlim_t;
    let cpu_seconds =
        (options.timeout.as_secs() + 1).saturating_mul(threads as u64) as libc::rlim_t;
    // SAFETY: the closure runs in the forked child before exec and only
    // calls setrlimit and prctl, which are async-signal-safe, on values
    // computed before the fork.
    unsafe {
        command.pre_exec(move || {
            let limit = |resource, value: libc::rlim_t| {
                let limit = libc::rlimit {
                    rlim_cur: value,
                    rlim_max: value,
                };
                match libc::setrlimit(resource, &limit) {
                    0 => Ok(()),
                    _ => Err(std::io::Error::last_os_error()),
                }
            };
            limit(libc::RLIMIT_AS, memory)?;
            limit(libc::RLIMIT_CPU, cpu_seconds)?;
            limit(libc::RLIMIT_CORE, 0)?;
            #[cfg(target_os = "linux")]
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[cfg(not(unix))]
fn confine(_command: &mut Command, _options: &CompileOptions, _threads: usize) {
    tracing::warn!("compile limits need setrlimit; this platform compiles without them");
}

/// The compile worker's side: reads a component from stdin and writes its
/// serialized artifact to stdout. Exits with [`INVALID_EXIT`] when the
/// component does not compile.
pub fn worker_main(max_wasm_stack: usize) -> std::process::ExitCode {
    // One line per failure, so the host can quote it.
    std::panic::set_hook(Box::new(|info| {
        eprintln!("compile worker panicked: {info}")
    }));
    let mut bytes = Vec::new();
    if let Err(e) = std::io::stdin().lock().read_to_end(&mut bytes) {
        eprintln!("reading the component: {e}");
        return std::process::ExitCode::FAILURE;
    }
    let engine = match Engine::new(&super::engine::engine_config(max_wasm_stack)) {
        Ok(engine) => engine,
        Err(e) => {
            eprintln!("creating the engine: {e:#}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let artifact = match engine.precompile_component(&bytes) {
        Ok(artifact) => artifact,
        Err(e) => {
            eprintln!("{e:#}");
            return std::process::ExitCode::from(INVALID_EXIT as u8);
        }
    };
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(&artifact).and_then(|()| stdout.flush()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("writing the artifact: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
