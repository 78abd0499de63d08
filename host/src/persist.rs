//! Atomic file writes: write a temporary file beside the target, fsync it,
//! rename it over the target, fsync the directory. Readers see the old
//! content or the new, never a torn file.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;

/// How the temporary files of atomic writes are named.
const TEMPORARY: &str = ".wtune-tmp-";

/// Replaces `path` with `bytes` atomically.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_atomic_with(path, |file| file.write_all(bytes))
}

/// Replaces `path` atomically with what `write` writes into the new file,
/// so large contents can be streamed rather than held whole in memory.
pub fn write_atomic_with(
    path: &Path,
    write: impl FnOnce(&mut File) -> io::Result<()>,
) -> io::Result<()> {
    let dir = dir_of(path);
    let mut tmp = tempfile::Builder::new()
        .prefix(TEMPORARY)
        .tempfile_in(dir)?;
    write(tmp.as_file_mut())?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    // The rename is durable only once the directory entry is on disk.
    File::open(dir)?.sync_all()
}

/// The directory `path` is in: its parent, or `.` for a bare file name.
fn dir_of(path: &Path) -> &Path {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// A copy of a file made under a temporary name beside where it goes
/// ([`stage_copy`]), on disk but not yet in place: dropped, it is deleted.
#[derive(Debug)]
pub struct Staged {
    path: std::path::PathBuf,
}

/// Links `from` (or, across file systems, copies and fsyncs it) under a
/// temporary name beside `to`, so that whatever can fail in the copy fails
/// before anything is replaced. [`Staged::put`] moves it to `to`.
pub fn stage_copy(from: &Path, to: &Path) -> io::Result<Staged> {
    let dir = dir_of(to);
    fs::create_dir_all(dir)?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let staged = Staged {
        path: dir.join(format!("{TEMPORARY}copy-{}-{nanos}", std::process::id())),
    };
    if fs::hard_link(from, &staged.path).is_err() {
        fs::copy(from, &staged.path)?;
        File::open(&staged.path)?.sync_all()?;
    }
    Ok(staged)
}

impl Staged {
    /// Renames the copy to `to` (beside it), replacing what is there, and
    /// makes the rename durable.
    pub fn put(self, to: &Path) -> io::Result<()> {
        fs::rename(&self.path, to)?;
        File::open(dir_of(to))?.sync_all()
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        // Gone already once put in place.
        let _ = fs::remove_file(&self.path);
    }
}

/// Deletes the temporary files [`write_atomic_with`] left in `dir` when the
/// process was killed mid-write (they are named, so the kernel does not
/// remove them; a checkpoint's can be as large as the guest's memory).
/// Call it only while no write into `dir` can be under way: on resume,
/// with the experiment's lock held.
pub fn remove_stale_temporaries(dir: &Path) {
    for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
        let stale = entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(TEMPORARY));
        if stale && let Err(err) = fs::remove_file(entry.path()) {
            tracing::warn!("removing {}: {err}", entry.path().display());
        }
    }
}

/// A background thread that keeps one file current without making its
/// callers wait for the disk: an atomic write ends in fsync, which can stall
/// for hundreds of milliseconds. Each [`LatestWriter::send`] replaces the
/// whole file, so when writes queue up only the newest is written. `T` is
/// what a write takes: the file's bytes, or the bytes with what the writer
/// should note once they are on disk.
pub struct LatestWriter<T: Send + 'static = Vec<u8>> {
    sender: Option<std::sync::mpsc::Sender<T>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl<T: Send + 'static> LatestWriter<T> {
    /// Starts the thread `name`, which writes with `write`; failures are
    /// logged (the caller's final, synchronous write reports a broken disk).
    pub fn spawn(
        name: &str,
        write: impl Fn(&T) -> Result<(), String> + Send + 'static,
    ) -> io::Result<Self> {
        let (sender, receiver) = std::sync::mpsc::channel::<T>();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                while let Ok(mut newest) = receiver.recv() {
                    while let Ok(newer) = receiver.try_recv() {
                        newest = newer;
                    }
                    if let Err(message) = write(&newest) {
                        tracing::warn!("{message}");
                    }
                }
            })?;
        Ok(Self {
            sender: Some(sender),
            thread: Some(thread),
        })
    }

    /// Queues `content` as the file's next content.
    pub fn send(&self, content: T) {
        if let Some(sender) = &self.sender {
            // Fails only if the thread is gone; the final write reports.
            let _ = sender.send(content);
        }
    }

    /// Waits until every queued write has landed, so that a synchronous
    /// write after this one cannot be overwritten by an older state.
    pub fn finish(&mut self) {
        drop(self.sender.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl<T: Send + 'static> Drop for LatestWriter<T> {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Pretty JSON text ending in a newline, as wtune writes its JSON files.
pub fn json_bytes(value: &serde_json::Value) -> Vec<u8> {
    let mut bytes = serde_json::to_vec_pretty(value).expect("JSON values always serialize");
    bytes.push(b'\n');
    bytes
}

/// Creates `dir` and its parents, with a message naming it on failure.
pub fn create_dir(dir: &Path) -> Result<(), String> {
    fs::create_dir_all(dir).map_err(|e| format!("cannot create directory {}: {e}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_content_and_leaves_no_temporary_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        write_atomic(&path, b"one").unwrap();
        write_atomic(&path, b"two").unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "two");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn missing_directory_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let err = write_atomic(&dir.path().join("nope/x.json"), b"x").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn a_staged_copy_replaces_only_once_put_and_leaves_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let (from, to) = (dir.path().join("source"), dir.path().join("own/checkpoint"));
        fs::write(&from, b"clone").unwrap();
        fs::create_dir(dir.path().join("own")).unwrap();
        fs::write(&to, b"own").unwrap();
        // Missing source: an error, and the file in place is untouched.
        let err = stage_copy(&dir.path().join("missing"), &to).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert_eq!(fs::read_to_string(&to).unwrap(), "own");
        // Staged, then given up: no trace.
        drop(stage_copy(&from, &to).unwrap());
        assert_eq!(fs::read_dir(dir.path().join("own")).unwrap().count(), 1);
        assert_eq!(fs::read_to_string(&to).unwrap(), "own");
        // Put in place: it replaces the file, and nothing is left beside it.
        stage_copy(&from, &to).unwrap().put(&to).unwrap();
        assert_eq!(fs::read_to_string(&to).unwrap(), "clone");
        assert_eq!(fs::read_dir(dir.path().join("own")).unwrap().count(), 1);
        assert_eq!(fs::read_to_string(&from).unwrap(), "clone");
    }

    #[test]
    fn stale_temporaries_are_removed_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(".wtune-tmp-abc"), b"torn").unwrap();
        fs::write(dir.path().join("checkpoint_000001.wtsnap"), b"kept").unwrap();
        remove_stale_temporaries(dir.path());
        let left: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, ["checkpoint_000001.wtsnap"]);
    }
}
