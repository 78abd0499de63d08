//! On-disk cache of compiled components, so each `.wasm` is compiled once.
//!
//! Entries are keyed by the blake3 hash of the component's bytes together with
//! the engine's compatibility hash (wasmtime version and every setting that
//! changes generated code), so a changed component, a wasmtime upgrade or a
//! different fuel setting never reuses a stale artifact. Entries are written
//! atomically (temp file, fsync, rename); an entry that fails to load is
//! recompiled and replaced.

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
        self.dir.join(format!("{digest}-{}.cwasm", self.engine_key))
    }

    /// Returns the compiled component for `bytes` (whose blake3 hex digest is
    /// `digest`), from the cache when possible, compiling and storing it
    /// otherwise. A cache that cannot be written only costs a recompile next
    /// time; it never fails the load.
    pub(crate) fn load_or_compile(
        &self,
        engine: &Engine,
        digest: &str,
        bytes: &[u8],
    ) -> wasmtime::Result<Component> {
        let path = self.entry(digest);
        if path.is_file() {
            // SAFETY: entries are only ever written by `store` below from
            // `Component::serialize` output of this engine configuration (the
            // file name carries the engine's compatibility hash), in a
            // directory owned by the user running wtune. Guests cannot reach
            // it: their filesystem view is their trial directory only.
            match unsafe { Component::deserialize_file(engine, &path) } {
                Ok(component) => return Ok(component),
                Err(err) => tracing::warn!(
                    path = %path.display(),
                    "ignoring unusable cache entry, recompiling: {err:#}"
                ),
            }
        }
        let component = Component::new(engine, bytes)?;
        if let Err(err) = self.store(&path, &component) {
            tracing::warn!(dir = %self.dir.display(), "could not write the compile cache: {err:#}");
        }
        Ok(component)
    }

    fn store(&self, path: &Path, component: &Component) -> wasmtime::Result<()> {
        fs::create_dir_all(&self.dir)?;
        let bytes = component.serialize()?;
        let mut tmp = tempfile::NamedTempFile::new_in(&self.dir)?;
        tmp.write_all(&bytes)?;
        tmp.as_file().sync_all()?;
        tmp.persist(path).map_err(|e| e.error)?;
        Ok(())
    }
}
