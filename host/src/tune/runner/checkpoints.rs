//! Where a trial's checkpoints live and how one is written.

use std::path::{Path, PathBuf};

use crate::tune::backend::{CheckpointInfo, TrialBackend, TrialFailure, TrialSession};

/// `checkpoints/checkpoint_000012.<ext>`, relative to the trial's directory.
pub(crate) fn checkpoint_path<B: TrialBackend>(iteration: u64) -> PathBuf {
    Path::new(CHECKPOINT_DIR).join(format!(
        "checkpoint_{iteration:06}.{}",
        B::CHECKPOINT_EXTENSION
    ))
}

/// The iteration in a file name [`checkpoint_path`] made, if it is one.
pub(crate) fn checkpoint_iteration<B: TrialBackend>(name: &str) -> Option<u64> {
    name.strip_prefix("checkpoint_")?
        .strip_suffix(B::CHECKPOINT_EXTENSION)?
        .strip_suffix('.')?
        .parse()
        .ok()
}

/// The directory, inside each trial's directory, that holds its checkpoints.
pub const CHECKPOINT_DIR: &str = "checkpoints";

pub(super) fn save<S: TrialSession>(
    session: &mut S,
    dir: &Path,
    path: &Path,
    info: &CheckpointInfo<'_>,
) -> Result<u64, TrialFailure> {
    let path = dir.join(path);
    if let Some(parent) = path.parent() {
        crate::persist::create_dir(parent).map_err(TrialFailure::new)?;
    }
    session.save(&path, info)
}
