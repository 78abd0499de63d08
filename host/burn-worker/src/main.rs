//! `wtune-burn-worker --memory-bytes N`: serves one trial's burn session
//! on stdin and stdout (see `wtune_burn_worker::protocol`). wtune starts
//! it; it is not meant to be run by hand.

use std::io::{self, BufReader, BufWriter};
use std::process::ExitCode;

use wtune_burn_worker::{Session, confine, protocol};

const USAGE: &str = "usage: wtune-burn-worker --memory-bytes N\n       \
     wtune-burn-worker --check-confinement";

/// What the command line asks for.
enum Mode {
    /// Serve a session whose tensors may take this many bytes.
    Serve(u64),
    /// Confine this process, then try to open a file: a confined worker is
    /// killed by `SIGSYS` before the open returns.
    CheckConfinement,
}

fn mode() -> Result<Mode, String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [flag, n] if flag == "--memory-bytes" => n
            .parse()
            .map(Mode::Serve)
            .map_err(|_| format!("--memory-bytes takes a number of bytes, not {n:?}\n{USAGE}")),
        [flag] if flag == "--check-confinement" => Ok(Mode::CheckConfinement),
        _ => Err(USAGE.into()),
    }
}

fn main() -> ExitCode {
    let mode = match mode() {
        Ok(mode) => mode,
        Err(why) => {
            eprintln!("{why}");
            return ExitCode::from(2);
        }
    };
    if let Err(why) = confine::warm_up().and_then(|()| confine::confine()) {
        eprintln!("wtune-burn-worker: could not confine itself: {why}");
        return ExitCode::FAILURE;
    }
    let memory = match mode {
        Mode::Serve(memory) => memory,
        Mode::CheckConfinement => {
            let opened = std::fs::File::open("/dev/null");
            eprintln!("wtune-burn-worker: not confined: opening a file gave {opened:?}");
            return ExitCode::FAILURE;
        }
    };
    // A kernel's panic is the trial's error, reported in its reply; the
    // default hook would also print it to wtune's log of this worker.
    std::panic::set_hook(Box::new(|_| {}));
    let mut session = Session::new(memory, 0);
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
