//! `wtune-burn-worker --memory-bytes N`: serves one trial's burn session
//! on stdin and stdout (see `wtune_burn_worker::protocol`). wtune starts
//! it; it is not meant to be run by hand.

use std::io::{self, BufReader, BufWriter};
use std::process::ExitCode;

use wtune_burn_worker::{Session, protocol};

const USAGE: &str = "usage: wtune-burn-worker --memory-bytes N";

fn memory_bytes() -> Result<u64, String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [flag, n] if flag == "--memory-bytes" => n
            .parse()
            .map_err(|_| format!("--memory-bytes takes a number of bytes, not {n:?}\n{USAGE}")),
        _ => Err(USAGE.into()),
    }
}

fn main() -> ExitCode {
    let memory = match memory_bytes() {
        Ok(bytes) => bytes,
        Err(why) => {
            eprintln!("{why}");
            return ExitCode::from(2);
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
