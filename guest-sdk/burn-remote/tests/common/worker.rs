//! A host for the tests that is the real thing: a `wtune-burn-worker`
//! process, confined by its system call filter, driven over its pipes as
//! wtune drives it.

use std::io::{BufReader, Write};
use std::path::PathBuf;
use std::process::{ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Mutex, OnceLock};

use burn_ir::TensorIr;
use burn_remote::Transport;
use burn_std::{BoolStore, ExecutionError, TensorData};
use wtune_burn_worker::protocol::{Kind, Reply, Request};

/// The worker executable cargo built beside this test (`--workspace`
/// builds it for the worker's own tests).
fn executable() -> PathBuf {
    let me = std::env::current_exe().expect("this test's path");
    let worker = me
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/release/deps")
        .join("wtune-burn-worker");
    assert!(
        worker.is_file(),
        "{} is missing: build it with `cargo build --release -p wtune-burn-worker \
         --manifest-path guest-sdk/burn-remote/Cargo.toml --target-dir target`",
        worker.display()
    );
    worker
}

/// The pipes of a running worker, and how its backend stores bools.
pub struct WorkerProcess(Mutex<(ChildStdin, BufReader<ChildStdout>)>, BoolStore);

impl WorkerProcess {
    fn request(&self, kind: Kind, frame: &[u8], tensor: Vec<u8>) -> Option<Reply> {
        let mut pipes = self.0.lock().unwrap();
        let request = Request {
            kind,
            fuel: u64::MAX,
            frame: frame.to_vec(),
            tensor,
        };
        request.write(&mut pipes.0).expect("the worker reads");
        if kind == Kind::Submit {
            return None;
        }
        pipes.0.flush().expect("the worker reads");
        Some(Reply::read(&mut pipes.1).expect("the worker replies"))
    }
}

/// Starts the worker with a quota of 256 MiB and makes it this process's
/// transport, once.
pub fn install() {
    install_with(&[], BoolStore::Native);
}

/// [`install`] on the first GPU Vulkan lists (lavapipe, where there is no
/// other), which the worker opens and confines itself around.
pub fn install_on_gpu() {
    let adapter = wtune_burn_worker::gpu::adapters()
        .into_iter()
        .next()
        .expect("a Vulkan adapter: install mesa-vulkan-drivers for software Vulkan");
    install_with(&adapter.args(), BoolStore::U32);
}

/// [`install`], the worker started with `args` as well, once per process;
/// its backend stores bools as `bools`.
fn install_with(args: &[String], bools: BoolStore) {
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        let mut child = Command::new(executable())
            .args(["--memory-bytes", &(256u64 << 20).to_string()])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the worker starts");
        let pipes = (
            child.stdin.take().unwrap(),
            BufReader::new(child.stdout.take().unwrap()),
        );
        // The worker ends when this process does and its input closes.
        std::thread::spawn(move || child.wait());
        assert!(burn_remote::install(WorkerProcess(
            Mutex::new(pipes),
            bools
        )));
    });
}

impl Transport for WorkerProcess {
    fn submit(&self, frame: &[u8]) {
        self.request(Kind::Submit, frame, Vec::new());
    }

    fn read(&self, frame: &[u8], tensor: TensorIr) -> Result<TensorData, ExecutionError> {
        let tensor = postcard::to_allocvec(&tensor).expect("encoding into a Vec");
        let reply = self.request(Kind::Read, frame, tensor).expect("a reply");
        let bytes = reply.outcome.map_err(ExecutionError::generic)?;
        postcard::from_bytes(&bytes).map_err(|e| ExecutionError::generic(e.to_string()))
    }

    fn sync(&self, frame: &[u8]) -> Result<(), ExecutionError> {
        let reply = self
            .request(Kind::Sync, frame, Vec::new())
            .expect("a reply");
        reply.outcome.map(drop).map_err(ExecutionError::generic)
    }

    fn bools(&self) -> BoolStore {
        self.1
    }
}
