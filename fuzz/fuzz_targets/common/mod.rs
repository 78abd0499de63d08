//! Helpers shared by the targets that run whole experiments (not a target:
//! Cargo.toml lists the targets).

use std::path::Path;
use std::sync::OnceLock;

/// One current-thread tokio runtime for the whole fuzzing session.
pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime")
    })
}

/// A fresh temporary directory for one input's experiment, in memory
/// (`/dev/shm`) where there is one.
pub fn scratch() -> tempfile::TempDir {
    let root = Path::new("/dev/shm");
    if root.is_dir() {
        tempfile::tempdir_in(root)
    } else {
        tempfile::tempdir()
    }
    .expect("a temporary directory")
}
