//! What several commands use: the sandbox from the cache flags, the
//! experiment directory's lock, the snapshot key, and stdout.

use std::path::Path;

use crate::sandbox::{Limits, Sandbox, SandboxOptions};
use crate::snapshot::SnapshotKey;
use crate::units::{fuel_text, human_bytes};

use super::Failure;
use super::args::CacheArgs;

/// The sandbox for `options`, with the cache the flags choose.
pub(super) fn sandbox(cache: CacheArgs, mut options: SandboxOptions) -> Result<Sandbox, Failure> {
    if cache.no_cache {
        options.cache_dir = None;
    } else if let Some(dir) = cache.cache_dir {
        options.cache_dir = Some(dir);
    }
    Sandbox::new(options)
        .map_err(|e| Failure::runtime(format!("cannot start the sandbox engine: {e:#}")))
}

/// Holds `<dir>/.wtune.lock` ([`crate::config::LOCK_FILE`]) for as long as the returned file lives, so
/// that two `wtune` processes never run the same experiment directory.
pub(super) fn lock(dir: &Path) -> Result<std::fs::File, Failure> {
    crate::persist::create_dir(dir).map_err(Failure::runtime)?;
    let path = dir.join(crate::config::LOCK_FILE);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| Failure::runtime(format!("cannot create {}: {e}", path.display())))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(Failure::user(format!(
            "another wtune process is running the experiment in {}; wait for it to end",
            dir.display()
        ))),
        Err(std::fs::TryLockError::Error(e)) => Err(Failure::runtime(format!(
            "cannot lock {}: {e}",
            path.display()
        ))),
    }
}

/// The key that authenticates checkpoints, derived from the bytes of
/// `file` when the experiment names one.
pub(super) fn snapshot_key(file: Option<&Path>) -> Result<Option<SnapshotKey>, Failure> {
    file.map(SnapshotKey::from_file)
        .transpose()
        .map_err(Failure::user)
}

/// Writes `text` to stdout. A reader that went away (`wtune inspect | head`)
/// is not an error: what it wanted it read; `println!` would panic there.
pub(super) fn print_out(text: &str) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            eprintln!("warning: writing to stdout: {e}");
        }
        _ => {}
    }
}

/// The limits a user sets most, in one line: memory, fuel, deadline.
pub(super) fn limits_line(limits: &Limits) -> String {
    format!(
        "limits per trial: memory {}, fuel {} per call{}, deadline {} per call",
        human_bytes(limits.memory_bytes),
        limits.fuel_per_call.map_or("unlimited".into(), fuel_text),
        limits
            .fuel_per_trial
            .map_or(String::new(), |f| format!(", {} per trial", fuel_text(f))),
        limits
            .call_timeout
            .map_or("none".into(), |d| humantime::format_duration(d).to_string()),
    )
}
