//! Helper processes that wtune starts: the GPU workers and the compiler of
//! untrusted components (from wtune's own executable), the burn workers
//! (their own executable), and `Supervised`, how wtune talks to one and
//! stops it.
//!
//! The first two run the `wtune` binary with a hidden subcommand, so a
//! deployment ships one executable for them. Programs that embed the library (tests, benches, a
//! marketplace backend) point `WTUNE_WORKER` at a `wtune` binary when theirs
//! is not beside it; an embedder that carries the workers itself (the
//! Python package, whose executable is Python) names its own command with
//! [`serve_workers_with`].

mod supervised;

pub(crate) use supervised::{Failure, Supervised, call_deadline_or, earlier};

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fmt;
use std::io::Read;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};
use std::thread;

/// How a worker process is started: a program and the arguments that go
/// before the worker's subcommand (`gpu-worker ...`, `compile-worker ...`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerProgram {
    /// The executable.
    pub program: PathBuf,
    /// Arguments before the subcommand; empty for a `wtune` binary.
    pub prefix: Vec<OsString>,
}

impl WorkerProgram {
    /// A `wtune` binary, which answers the subcommands itself.
    pub fn binary(program: impl Into<PathBuf>) -> Self {
        Self {
            program: program.into(),
            prefix: Vec::new(),
        }
    }

    /// A command that runs the worker, ready for its subcommand's arguments.
    pub fn command(&self) -> Command {
        let mut command = Command::new(&self.program);
        command.args(&self.prefix);
        command
    }
}

impl fmt::Display for WorkerProgram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.program.display())
    }
}

static EMBEDDER_WORKER: OnceLock<WorkerProgram> = OnceLock::new();

/// Serves this process's workers with `worker` (unless `$WTUNE_WORKER`
/// names a binary): for embedders whose executable is not `wtune` and who
/// answer the worker subcommands themselves. The first call wins; later
/// ones are ignored.
pub fn serve_workers_with(worker: WorkerProgram) {
    let _ = EMBEDDER_WORKER.set(worker);
}

/// What serves wtune's hidden worker subcommands: `$WTUNE_WORKER`, else
/// the embedder's command ([`serve_workers_with`]), else this executable if
/// it is `wtune`, else a `wtune` in this executable's directory or its
/// parent (where cargo puts the binary beside test and bench executables).
pub fn worker_program() -> Result<WorkerProgram, String> {
    let binary = WorkerProgram::binary;
    if let Some(path) = std::env::var_os("WTUNE_WORKER") {
        return Ok(binary(PathBuf::from(path)));
    }
    if let Some(worker) = EMBEDDER_WORKER.get() {
        return Ok(worker.clone());
    }
    let me = std::env::current_exe().map_err(|e| format!("finding this executable: {e}"))?;
    if me.file_stem().is_some_and(|s| s == "wtune") {
        return Ok(binary(me));
    }
    beside(&me, "wtune").map(binary).ok_or_else(|| {
        format!(
            "wtune's worker processes run the wtune executable, and none was found beside {}; \
             set WTUNE_WORKER to one",
            me.display()
        )
    })
}

/// The executable that runs a trial's burn operations: `$WTUNE_BURN_WORKER`,
/// else a `wtune-burn-worker` in this executable's directory or its parent.
/// It is built with burn, apart from wtune (see host/burn-worker), and
/// ships beside it.
pub fn burn_worker_program() -> Result<WorkerProgram, String> {
    if let Some(path) = std::env::var_os("WTUNE_BURN_WORKER") {
        return Ok(WorkerProgram::binary(PathBuf::from(path)));
    }
    let me = std::env::current_exe().map_err(|e| format!("finding this executable: {e}"))?;
    beside(&me, "wtune-burn-worker")
        .map(WorkerProgram::binary)
        .ok_or_else(|| {
            format!(
                "burn operations run by the host need the wtune-burn-worker executable, and none \
                 was found beside {}: build it with `cargo build --release --manifest-path \
                 guest-sdk/burn-remote/Cargo.toml -p wtune-burn-worker --target-dir target`, \
                 or set WTUNE_BURN_WORKER to one",
                me.display()
            )
        })
}

/// An executable called `name` in `me`'s directory or its parent (where
/// cargo puts binaries beside test and bench executables).
fn beside(me: &std::path::Path, name: &str) -> Option<PathBuf> {
    let name = format!("{name}{}", std::env::consts::EXE_SUFFIX);
    me.ancestors()
        .skip(1)
        .take(2)
        .map(|dir| dir.join(&name))
        .find(|candidate| candidate.is_file())
}

/// The last bytes a child process wrote to a pipe, collected by a thread of
/// its own so that a chatty child never blocks on a full pipe.
pub(crate) struct OutputTail {
    bytes: Arc<Mutex<VecDeque<u8>>>,
    reader: Option<thread::JoinHandle<()>>,
}

impl OutputTail {
    /// Reads `pipe` until it closes, keeping its last `keep` bytes.
    pub(crate) fn collect(mut pipe: impl Read + Send + 'static, keep: usize) -> Self {
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        let bytes = Arc::clone(&tail);
        let reader = thread::spawn(move || {
            let mut chunk = [0u8; 1024];
            while let Ok(n @ 1..) = pipe.read(&mut chunk) {
                let mut tail = bytes.lock().unwrap_or_else(|e| e.into_inner());
                tail.extend(&chunk[..n]);
                let excess = tail.len().saturating_sub(keep);
                tail.drain(..excess);
            }
        });
        Self {
            bytes: tail,
            reader: Some(reader),
        }
    }

    /// Everything kept, once the pipe has closed (the process has exited
    /// and its last words are in), as trimmed text.
    pub(crate) fn finish(mut self) -> String {
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        self.text()
    }

    /// What was kept so far, as trimmed text.
    pub(crate) fn text(&self) -> String {
        let tail = self.bytes.lock().unwrap_or_else(|e| e.into_inner());
        let (front, back) = tail.as_slices();
        let mut bytes = front.to_vec();
        bytes.extend_from_slice(back);
        String::from_utf8_lossy(&bytes).trim().to_string()
    }
}
