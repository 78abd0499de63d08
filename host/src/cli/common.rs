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

/// The directory a new run writes to, made and locked by [`claim`].
pub(super) struct Claimed {
    pub(super) dir: std::path::PathBuf,
    pub(super) lock: std::fs::File,
    /// This process made the directory.
    made: bool,
}

impl Claimed {
    /// Gives the directory up, for a run refused before writing anything:
    /// removed again when this process made it and it holds only the lock.
    pub(super) fn abandon(self) {
        if self.made {
            // Unlinked while still locked: a process that opens the lock
            // file now makes a new one, and waits for no one.
            let _ = std::fs::remove_file(self.dir.join(crate::config::LOCK_FILE));
            let _ = std::fs::remove_dir(&self.dir);
        }
        drop(self.lock);
    }
}

/// Takes the directory a new run writes to, and its lock. A directory
/// wtune named (`named`: `wtune_results/<name>_<time>`) is the first of
/// `dir`, `dir-2`, `dir-3`, ... that this process makes itself, so that
/// runs started in the same second each get their own. A directory the
/// user chose is made if missing, and refused if another process wrote
/// into it after the plan found it empty.
pub(super) fn claim(dir: &Path, named: bool) -> Result<Claimed, Failure> {
    let made = |path: &Path| match std::fs::create_dir(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(Failure::runtime(format!(
            "cannot create directory {}: {e}",
            path.display()
        ))),
    };
    if named {
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            crate::persist::create_dir(parent).map_err(Failure::runtime)?;
        }
        let mut candidate = dir.to_path_buf();
        let mut n = 1;
        while !made(&candidate)? {
            n += 1;
            candidate = std::path::PathBuf::from(format!("{}-{n}", dir.display()));
        }
        return match lock(&candidate) {
            Ok(lock) => Ok(Claimed {
                dir: candidate,
                lock,
                made: true,
            }),
            Err(failure) => {
                let _ = std::fs::remove_file(candidate.join(crate::config::LOCK_FILE));
                let _ = std::fs::remove_dir(&candidate);
                Err(failure)
            }
        };
    }
    let made = !dir.exists() && {
        crate::persist::create_dir(dir).map_err(Failure::runtime)?;
        true
    };
    let lock = lock(dir)?;
    let used = std::fs::read_dir(dir)
        .map_err(|e| Failure::runtime(format!("cannot read {}: {e}", dir.display())))?
        .flatten()
        .any(|entry| entry.file_name() != crate::config::LOCK_FILE);
    if used {
        return Err(Failure::user(format!(
            "output directory {} was written to by another process after this run found it \
             empty; choose another with --output-dir",
            dir.display()
        )));
    }
    Ok(Claimed {
        dir: dir.to_path_buf(),
        lock,
        made,
    })
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
