//! The files and directories an experiment reads and writes: the
//! checkpoint it starts from, the snapshot key, the data grants and the
//! output directory. Paths in the file are relative to the file's
//! directory (`base`); paths on the command line to the current one.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::error::{ConfigError, bad};
use super::file::ExperimentToml;
use super::overrides::Overrides;

/// `restore_from`: a checkpoint file every trial starts from.
pub(super) fn restore_from(
    file: &ExperimentToml,
    overrides: &Overrides,
    base: &Path,
) -> Result<Option<PathBuf>, ConfigError> {
    match overrides
        .restore_from
        .clone()
        .or_else(|| file.restore_from.as_ref().map(|p| base.join(p)))
    {
        Some(path) if !path.is_file() => Err(bad(format!(
            "restore_from: {} is not a checkpoint file",
            path.display()
        ))),
        Some(path) => {
            Ok(Some(path.canonicalize().map_err(|e| {
                bad(format!("restore_from: {}: {e}", path.display()))
            })?))
        }
        None => Ok(None),
    }
}

/// `snapshot_key_file`: the file whose bytes key the checkpoints' MAC.
pub(super) fn snapshot_key_file(
    file: &ExperimentToml,
    base: &Path,
) -> Result<Option<PathBuf>, ConfigError> {
    let path = file.snapshot_key_file.as_ref().map(|p| base.join(p));
    if let Some(path) = &path
        && !path.is_file()
    {
        return Err(bad(format!(
            "snapshot_key_file: {} is not a file",
            path.display()
        )));
    }
    Ok(path)
}

/// `[data]` and `--data NAME=DIR` (or `--data DIR`, named after the
/// directory): read-only directories, by name, canonical.
pub(super) fn data_grants(
    file: &ExperimentToml,
    overrides: &Overrides,
    base: &Path,
) -> Result<Vec<(String, PathBuf)>, ConfigError> {
    let mut data = Vec::new();
    for (grant, dir) in file.data.iter().flatten() {
        data.push(data_grant(grant, &base.join(dir))?);
    }
    for item in &overrides.data {
        let (grant, dir) = match item.split_once('=') {
            Some((grant, dir)) => (grant.to_string(), PathBuf::from(dir)),
            None => {
                let dir = PathBuf::from(item);
                let grant = dir
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .ok_or_else(|| bad(format!("--data {item:?}: give NAME=DIR")))?;
                (grant, dir)
            }
        };
        data.retain(|(existing, _)| *existing != grant);
        data.push(data_grant(&grant, &dir)?);
    }
    Ok(data)
}

/// `--output-dir` or `output_dir`, which must be empty or new; else a
/// fresh directory under `wtune_results/`.
/// The file a `wtune` process holds locked in the experiment directory it
/// runs, so that no second one runs it too.
pub const LOCK_FILE: &str = ".wtune.lock";

pub(super) fn output_dir(
    file: &ExperimentToml,
    overrides: &Overrides,
    base: &Path,
    name: &str,
) -> Result<PathBuf, ConfigError> {
    match overrides
        .output_dir
        .clone()
        .or_else(|| file.output_dir.as_ref().map(|d| base.join(d)))
    {
        Some(dir) => {
            // The lock file alone is what a run that failed before writing
            // anything leaves (or a `wtune resume` of an empty directory).
            let used = |entries: std::fs::ReadDir| {
                entries
                    .flatten()
                    .any(|entry| entry.file_name() != LOCK_FILE)
            };
            if dir.read_dir().is_ok_and(used) {
                return Err(bad(format!(
                    "output directory {} already exists and is not empty; choose another with --output-dir",
                    dir.display()
                )));
            }
            if std::fs::symlink_metadata(&dir).is_ok() && !dir.is_dir() {
                return Err(bad(format!(
                    "output directory {} exists and is not a directory; choose another with --output-dir",
                    dir.display()
                )));
            }
            Ok(dir)
        }
        None => Ok(fresh_output_dir(name)),
    }
}

fn data_grant(name: &str, dir: &Path) -> Result<(String, PathBuf), ConfigError> {
    let valid = !name.is_empty()
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if !valid {
        return Err(bad(format!(
            "data grant name {name:?} must be letters, digits, '_', '-' or '.' (it becomes /data/{name})"
        )));
    }
    let canonical = dir
        .canonicalize()
        .map_err(|e| bad(format!("data directory `{name}` ({}): {e}", dir.display())))?;
    if !canonical.is_dir() {
        return Err(bad(format!(
            "data directory `{name}` ({}) is not a directory",
            dir.display()
        )));
    }
    Ok((name.to_string(), canonical))
}

/// `wtune_results/<name>_<UTC time>`, with a suffix if that exists already.
fn fresh_output_dir(name: &str) -> PathBuf {
    let stamp = humantime::format_rfc3339_seconds(SystemTime::now())
        .to_string()
        .replace(':', "-");
    let base =
        PathBuf::from("wtune_results").join(format!("{name}_{}", stamp.trim_end_matches('Z')));
    let mut dir = base.clone();
    let mut n = 2;
    while dir.exists() {
        dir = PathBuf::from(format!("{}-{n}", base.display()));
        n += 1;
    }
    dir
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chosen(dir: &Path) -> Result<PathBuf, ConfigError> {
        let overrides = Overrides {
            output_dir: Some(dir.to_path_buf()),
            ..Overrides::default()
        };
        output_dir(&ExperimentToml::default(), &overrides, Path::new("."), "m")
    }

    #[test]
    fn an_output_dir_must_be_a_new_or_empty_directory() {
        let base = tempfile::tempdir().unwrap();
        let fresh = base.path().join("fresh");
        assert_eq!(chosen(&fresh).unwrap(), fresh);
        // What a run refused after taking the lock leaves: still empty.
        std::fs::create_dir(&fresh).unwrap();
        std::fs::write(fresh.join(LOCK_FILE), b"").unwrap();
        assert_eq!(chosen(&fresh).unwrap(), fresh);
        std::fs::write(fresh.join("results.csv"), b"").unwrap();
        let used = chosen(&fresh).unwrap_err().to_string();
        assert!(used.contains("already exists and is not empty"), "{used}");
        let file = base.path().join("file");
        std::fs::write(&file, b"").unwrap();
        let not_dir = chosen(&file).unwrap_err().to_string();
        assert!(
            not_dir.contains("exists and is not a directory"),
            "{not_dir}"
        );
    }
}
