//! `wtune-burn-worker --memory-bytes N [--gpu-pci BUS | --gpu NAME]`:
//! serves one trial's burn session on stdin and stdout (see
//! `wtune_burn_worker::protocol`), on burn's CPU backend or on the GPU
//! named (see `wtune_burn_worker::gpu`). wtune starts it; it is not meant
//! to be run by hand.

use std::io::{self, BufReader, BufWriter};
use std::process::ExitCode;

use wtune_burn_worker::gpu::{self, Adapter};
use wtune_burn_worker::storage::Buffers;
use wtune_burn_worker::{Session, confine, protocol};

const USAGE: &str = "usage: wtune-burn-worker --memory-bytes N [--gpu-pci BUS | --gpu NAME]\n       \
     wtune-burn-worker --check-confinement [--gpu-pci BUS | --gpu NAME]";

/// What the command line asks for.
struct Args {
    /// Serve a session whose tensors may take this many bytes; `None`:
    /// confine this process, then try what its filter forbids
    /// ([`check_confinement`]).
    memory: Option<u64>,
    /// The GPU to run on; else burn's CPU backend.
    gpu: Option<Adapter>,
}

fn args() -> Result<Args, String> {
    let mut args = Args {
        memory: None,
        gpu: None,
    };
    let mut check = false;
    let mut words = std::env::args().skip(1);
    while let Some(flag) = words.next() {
        let mut value = || {
            words
                .next()
                .ok_or_else(|| format!("{flag} takes a value\n{USAGE}"))
        };
        match flag.as_str() {
            "--memory-bytes" => {
                let n = value()?;
                let bytes = n.parse().map_err(|_| {
                    format!("--memory-bytes takes a number of bytes, not {n:?}\n{USAGE}")
                })?;
                args.memory = Some(bytes);
            }
            "--gpu-pci" => args.gpu = Some(Adapter::Pci(value()?)),
            "--gpu" => args.gpu = Some(Adapter::Described(value()?)),
            "--check-confinement" => check = true,
            _ => return Err(USAGE.into()),
        }
    }
    if check == args.memory.is_some() {
        return Err(USAGE.into());
    }
    Ok(args)
}

fn main() -> ExitCode {
    let args = match args() {
        Ok(args) => args,
        Err(why) => {
            eprintln!("{why}");
            return ExitCode::from(2);
        }
    };
    match &args.gpu {
        None => {
            let confined = args
                .memory
                .map_or(Ok(()), confine::limit_data)
                .and_then(|()| confine::warm_up())
                .and_then(|()| confine::confine());
            run(confined, &args, |memory| Session::new(memory, 0))
        }
        Some(adapter) => match gpu::open(adapter) {
            Ok(device) => {
                let confined =
                    confine::warm_up_gpu(device.clone()).and_then(|()| confine::confine_gpu());
                run(confined, &args, |memory| {
                    Session::<gpu::Gpu>::on(device, memory, 0)
                })
            }
            Err(why) => {
                eprintln!("wtune-burn-worker: {why}");
                ExitCode::FAILURE
            }
        },
    }
}

/// Serves a session made by `session`, once the worker is `confined`.
fn run<B: Buffers>(
    confined: Result<(), String>,
    args: &Args,
    session: impl FnOnce(u64) -> Session<B>,
) -> ExitCode {
    if let Err(why) = confined {
        eprintln!("wtune-burn-worker: could not confine itself: {why}");
        return ExitCode::FAILURE;
    }
    let Some(memory) = args.memory else {
        return check_confinement(args.gpu.is_some());
    };
    // A kernel's panic is the trial's error, reported in its reply; the
    // default hook would also print it to wtune's log of this worker.
    // Installed only now: a panic while the worker starts is its last word.
    std::panic::set_hook(Box::new(|_| {}));
    let mut session = session(memory);
    let mut input = BufReader::new(io::stdin().lock());
    let mut output = BufWriter::new(io::stdout().lock());
    match protocol::serve(&mut session, &mut input, &mut output) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("wtune-burn-worker: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `--check-confinement`, once confined: on the CPU, opening a file gets
/// the worker killed by `SIGSYS`; on a GPU, where files stay open, it
/// succeeds only if starting a program, opening a socket and signalling
/// another process are refused as not permitted.
fn check_confinement(gpu: bool) -> ExitCode {
    if !gpu {
        let opened = std::fs::File::open("/dev/null");
        eprintln!("wtune-burn-worker: not confined: opening a file gave {opened:?}");
        return ExitCode::FAILURE;
    }
    gpu_refusals()
}

/// What a GPU worker's filter must refuse ([`check_confinement`]).
#[cfg(target_os = "linux")]
fn gpu_refusals() -> ExitCode {
    use std::io::ErrorKind::PermissionDenied;
    let started = std::process::Command::new("/bin/true").status().map(drop);
    let listened = std::net::TcpListener::bind("127.0.0.1:0").map(drop);
    // The parent: wtune, or whoever checks.
    let parent = std::os::unix::process::parent_id() as libc::pid_t;
    // SAFETY: signal 0 sends nothing; it only asks whether one may.
    let signalled = match unsafe { libc::kill(parent, 0) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    };
    let said = format!(
        "starting a program gave {started:?}; opening a socket gave {listened:?}; \
         signalling the parent gave {signalled:?}"
    );
    let refused = [started, listened, signalled]
        .iter()
        .all(|r| r.as_ref().is_err_and(|e| e.kind() == PermissionDenied));
    if refused {
        eprintln!("wtune-burn-worker: confined: {said}");
        ExitCode::SUCCESS
    } else {
        eprintln!("wtune-burn-worker: not confined: {said}");
        ExitCode::FAILURE
    }
}

#[cfg(not(target_os = "linux"))]
fn gpu_refusals() -> ExitCode {
    eprintln!("wtune-burn-worker: not confined: no system call filter here");
    ExitCode::FAILURE
}
