//! How checkpoints are taken and kept, and what a failure costs.

use super::error::{ConfigError, bad};
use super::file::ExperimentToml;
use super::overrides::Overrides;
use crate::tune::{CheckpointPolicy, FailFast, FailurePolicy};
use crate::wasm_backend::CheckpointMode;

/// `checkpoint`: host snapshots or the guest's own save(), when set.
pub(super) fn checkpoint_mode(
    file: &ExperimentToml,
    overrides: &Overrides,
) -> Result<Option<CheckpointMode>, ConfigError> {
    match overrides
        .checkpoint
        .clone()
        .or_else(|| file.checkpoint.clone())
    {
        Some(mode) => Ok(Some(mode.parse::<CheckpointMode>().map_err(bad)?)),
        None => Ok(None),
    }
}

/// `checkpoint_freq`, `checkpoint_at_end`, `keep_checkpoints_num` and
/// `checkpoint_score_attr`.
pub(super) fn checkpoint(
    file: &ExperimentToml,
    overrides: &Overrides,
) -> Result<CheckpointPolicy, ConfigError> {
    Ok(CheckpointPolicy {
        freq: overrides
            .checkpoint_freq
            .or(file.checkpoint_freq)
            .unwrap_or(0),
        at_end: overrides.checkpoint_at_end || file.checkpoint_at_end.unwrap_or(false),
        keep_num: match file.keep_checkpoints_num {
            Some(0) => {
                return Err(bad(
                    "keep_checkpoints_num must be at least 1 (leave it out to keep every checkpoint)",
                ));
            }
            Some(n) => Some(usize::try_from(n).unwrap_or(usize::MAX)),
            None => None,
        },
        score_attr: match file.checkpoint_score_attr.clone() {
            Some(attr) if attr.is_empty() || attr == "min-" => {
                return Err(bad(
                    "checkpoint_score_attr must name a result field, e.g. \"val_accuracy\" or \"min-loss\"",
                ));
            }
            attr => attr,
        },
    })
}

/// `max_failures` (-1 retries forever) and `fail_fast` (true or "raise").
pub(super) fn failure(
    file: &ExperimentToml,
    overrides: &Overrides,
) -> Result<FailurePolicy, ConfigError> {
    Ok(FailurePolicy {
        max_failures: match overrides.max_failures.or(file.max_failures) {
            None => Some(0),
            Some(-1) => None,
            Some(n) if n >= 0 => Some(u32::try_from(n).unwrap_or(u32::MAX)),
            Some(n) => {
                return Err(bad(format!(
                    "max_failures must be 0 or more, or -1 to retry forever; got {n}"
                )));
            }
        },
        fail_fast: match &file.fail_fast {
            None | Some(toml::Value::Boolean(false)) => FailFast::Off,
            Some(toml::Value::Boolean(true)) => FailFast::Stop,
            Some(toml::Value::String(s)) if s == "raise" => FailFast::Raise,
            Some(other) => {
                return Err(bad(format!(
                    "fail_fast must be true, false or \"raise\"; got {other}"
                )));
            }
        },
    })
}
