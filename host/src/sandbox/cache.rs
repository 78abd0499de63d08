//! On-disk cache of compiled components, so each `.wasm` is compiled once.
//!
//! Entries are keyed by the blake3 hash of the component's bytes together with
//! the engine's compatibility hash (wasmtime version and every setting that
//! changes generated code), so a changed component, a wasmtime upgrade or a
//! different fuel setting never reuses a stale artifact. Entries are written
//! atomically (temp file, fsync, rename) with a trailing blake3 checksum,
//! because an entry is machine code that wasmtime loads without further
//! checks; an entry that fails its checksum or fails to load is recompiled
//! and replaced.

use std::fs;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};

use wasmtime::Engine;
use wasmtime::component::Component;

/// A directory of serialized, compiled components.
#[derive(Debug, Clone)]
pub struct ArtifactCache {
    dir: PathBuf,
    engine_key: String,
}

impl ArtifactCache {
    pub(crate) fn new(dir: PathBuf, engine: &Engine) -> Self {
        let mut hasher = DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        Self {
            dir,
            engine_key: format!("{:016x}", hasher.finish()),
        }
    }

    /// `$WTUNE_CACHE_DIR`, else `$XDG_CACHE_HOME/wtune`, else `~/.cache/wtune`.
    pub fn default_dir() -> Option<PathBuf> {
        if let Some(dir) = std::env::var_os("WTUNE_CACHE_DIR") {
            return Some(PathBuf::from(dir));
        }
        if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
            return Some(PathBuf::from(dir).join("wtune"));
        }
        std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache").join("wtune"))
    }

    /// The directory entries live in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn entry(&self, digest: &str) -> PathBuf {
        // `v2`: entries carry a checksum; older ones are simply not found.
        self.dir
            .join(format!("{digest}-{}-v2.cwasm", self.engine_key))
    }

    /// The cached component for the bytes whose blake3 hex digest is
    /// `digest`, if there is a sound entry. An entry whose checksum fails
    /// (a torn write, a bad disk, a hand edit) is ignored and will be
    /// replaced: it holds machine code, so it is never loaded unverified.
    pub(crate) fn load(&self, engine: &Engine, digest: &str) -> Option<Component> {
        let path = self.entry(digest);
        if !path.is_file() {
            return None;
        }
        if let Err(why) = private(&self.dir).and_then(|()| private(&path)) {
            tracing::warn!("not loading compiled code from the compile cache: {why}");
            return None;
        }
        let entry = fs::read(&path).ok()?;
        let Some(artifact) = verified(&entry) else {
            tracing::warn!(path = %path.display(), "ignoring a cache entry whose checksum fails");
            return None;
        };
        // SAFETY: the directory and the entry belong to the user running
        // wtune and nobody else can write them (`private`); guests only see
        // their trial directories. Within it, entries are only written by
        // `store`, from artifacts wasmtime produced for this engine's
        // configuration (the file name carries its compatibility hash, and
        // wasmtime checks it again), and the checksum shows the bytes are
        // whole. It guards against damage, not against this same user.
        match unsafe { Component::deserialize(engine, artifact) } {
            Ok(component) => Some(component),
            Err(err) => {
                tracing::warn!(path = %path.display(), "ignoring unusable cache entry: {err:#}");
                None
            }
        }
    }

    /// Stores `artifact` (wasmtime's serialized component) for `digest`,
    /// atomically, followed by its checksum. A cache that cannot be written
    /// only costs a recompile next time, so failures are logged, not
    /// returned.
    pub(crate) fn store(&self, digest: &str, artifact: &[u8]) {
        let write = || -> std::io::Result<()> {
            create_private_dir(&self.dir)?;
            private(&self.dir).map_err(std::io::Error::other)?;
            let mut tmp = tempfile::NamedTempFile::new_in(&self.dir)?;
            tmp.write_all(artifact)?;
            tmp.write_all(blake3::hash(artifact).as_bytes())?;
            tmp.as_file().sync_all()?;
            tmp.persist(self.entry(digest)).map_err(|e| e.error)?;
            Ok(())
        };
        if let Err(err) = write() {
            tracing::warn!(dir = %self.dir.display(), "could not write the compile cache: {err}");
        }
    }
}

/// Whether `path` is owned by this user and writable by nobody else: the
/// cache holds machine code the host runs, so a directory another user can
/// write is not a cache wtune can trust.
#[cfg(unix)]
fn private(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;

    let meta = fs::symlink_metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        return Err(format!(
            "{} belongs to uid {}, not to this user (uid {me})",
            path.display(),
            meta.uid()
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(format!(
            "{} is writable by other users (mode {:o})",
            path.display(),
            meta.mode() & 0o7777
        ));
    }
    Ok(())
}

#[cfg(not(unix))]
fn private(_path: &Path) -> Result<(), String> {
    Ok(())
}

/// Creates the cache directory (and its parents) readable and writable by
/// this user only.
fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

/// The artifact in a cache entry, if its trailing checksum matches.
fn verified(entry: &[u8]) -> Option<&[u8]> {
    let split = entry.len().checked_sub(blake3::OUT_LEN)?;
    let (artifact, checksum) = entry.split_at(split);
    (blake3::hash(artifact).as_bytes() == checksum).then_some(artifact)
}

#[cfg(test)]
mod tests {
    use super::{private, verified};

    #[cfg(unix)]
    #[test]
    fn a_cache_directory_others_can_write_is_not_trusted() {
        use std::os::unix::fs::PermissionsExt;

        let dir = tempfile::tempdir().unwrap();
        assert_eq!(private(dir.path()), Ok(()));
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let why = private(dir.path()).unwrap_err();
        assert!(
            why.ends_with("is writable by other users (mode 777)"),
            "{why}"
        );
    }

    #[test]
    fn entries_are_accepted_only_with_their_checksum() {
        let artifact = b"compiled code".to_vec();
        let mut entry = artifact.clone();
        entry.extend_from_slice(blake3::hash(&artifact).as_bytes());
        assert_eq!(verified(&entry), Some(&artifact[..]));

        let mut flipped = entry.clone();
        flipped[3] ^= 1;
        assert_eq!(verified(&flipped), None);
        assert_eq!(verified(&entry[..entry.len() - 1]), None);
        assert_eq!(verified(&entry[..10]), None);
        assert_eq!(verified(b""), None);
    }
}
