//! The experiment file as written: its sections, read with every unknown
//! key refused, and the helpers that read a section into the types the
//! plan's steps check.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use super::error::{ConfigError, bad};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ExperimentToml {
    pub(super) name: Option<String>,
    pub(super) metric: Option<String>,
    pub(super) mode: Option<String>,
    pub(super) num_samples: Option<u64>,
    pub(super) seed: Option<u64>,
    pub(super) max_concurrent_trials: Option<usize>,
    pub(super) output_dir: Option<PathBuf>,
    pub(super) scheduler: Option<toml::Value>,
    pub(super) search: Option<toml::Value>,
    pub(super) stop: Option<toml::Table>,
    pub(super) limits: Option<LimitsToml>,
    pub(super) data: Option<BTreeMap<String, PathBuf>>,
    pub(super) param_space: Option<toml::Table>,
    pub(super) checkpoint: Option<String>,
    pub(super) checkpoint_freq: Option<u64>,
    pub(super) checkpoint_at_end: Option<bool>,
    pub(super) keep_checkpoints_num: Option<u64>,
    pub(super) checkpoint_score_attr: Option<String>,
    pub(super) max_failures: Option<i64>,
    pub(super) fail_fast: Option<toml::Value>,
    pub(super) restore_from: Option<PathBuf>,
    pub(super) snapshot_key_file: Option<PathBuf>,
    pub(super) resources_per_trial: Option<toml::Table>,
    pub(super) resources: Option<toml::Table>,
    pub(super) stop_experiment: Option<toml::Table>,
    pub(super) compute: Option<String>,
    pub(super) security: Option<SecurityToml>,
    pub(super) deterministic: Option<bool>,
    pub(super) tracking: Option<TrackingToml>,
}

/// `[tracking]`: TensorBoard files and an MLflow server.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TrackingToml {
    pub(super) tensorboard: Option<bool>,
    pub(super) mlflow: Option<String>,
    pub(super) mlflow_experiment: Option<String>,
}

/// `[security]`: what a deployment that runs strangers' code pins down.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SecurityToml {
    pub(super) allowed_components: Option<Vec<String>>,
    pub(super) compile: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct LimitsToml {
    pub(super) fuel_per_call: Option<toml::Value>,
    pub(super) fuel_per_trial: Option<toml::Value>,
    pub(super) memory: Option<toml::Value>,
    pub(super) call_timeout: Option<toml::Value>,
    pub(super) stack: Option<toml::Value>,
    pub(super) log_size: Option<toml::Value>,
    pub(super) table_elements: Option<u64>,
    pub(super) compute_memory: Option<toml::Value>,
    pub(super) compute_memory_total: Option<toml::Value>,
    pub(super) compile_timeout: Option<toml::Value>,
    pub(super) compile_memory: Option<toml::Value>,
    pub(super) checkpoint_size: Option<toml::Value>,
    pub(super) open_files: Option<u64>,
    pub(super) result_size: Option<toml::Value>,
    pub(super) disk: Option<toml::Value>,
    pub(super) disk_files: Option<u64>,
}

/// Reads the experiment file at `config`, if one is given, and the
/// directory its relative paths start from.
pub(super) fn read(config: Option<&Path>) -> Result<(ExperimentToml, PathBuf), ConfigError> {
    match config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| bad(format!("cannot read config {}: {e}", path.display())))?;
            let malformed = |e: toml::de::Error| {
                bad(format!("{}: {}", path.display(), one_line(&e.to_string())))
            };
            let table: toml::Table = toml::from_str(&text).map_err(malformed)?;
            if let Some((key, value)) = non_finite(&table, "") {
                return Err(bad(format!(
                    "{}: {key} = {value}: numbers must be finite (JSON, which trials get \
                     their configuration in, has no {value})",
                    path.display()
                )));
            }
            let file: ExperimentToml = toml::from_str(&text).map_err(malformed)?;
            let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
            Ok((file, base))
        }
        None => Ok((ExperimentToml::default(), PathBuf::new())),
    }
}

/// The first number in `table` that is not finite (`nan`, `inf`), with its
/// key's dotted path (under `prefix`). JSON has no such numbers: turned
/// into `null` they would reach trials as something else than written.
fn non_finite(table: &toml::Table, prefix: &str) -> Option<(String, f64)> {
    fn walk(value: &toml::Value, at: String) -> Option<(String, f64)> {
        match value {
            toml::Value::Float(f) if !f.is_finite() => Some((at, *f)),
            toml::Value::Table(table) => non_finite(table, &at),
            toml::Value::Array(items) => items
                .iter()
                .enumerate()
                .find_map(|(i, item)| walk(item, format!("{at}[{i}]"))),
            _ => None,
        }
    }
    table.iter().find_map(|(key, value)| {
        let at = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        walk(value, at)
    })
}

/// Reads an experiment given as a value (a TOML table already parsed, or
/// JSON from an embedder) whose relative paths start at `base`; `origin`
/// names it in errors.
pub(super) fn from_value(
    experiment: &Value,
    origin: &str,
    base: &Path,
) -> Result<(ExperimentToml, PathBuf), ConfigError> {
    let read = |value: Value| serde_json::from_value::<ExperimentToml>(value);
    match read(experiment.clone()) {
        Ok(file) => Ok((file, base.to_path_buf())),
        Err(whole) => {
            // serde names the field but not the table it is in: find the
            // first key that fails on its own, so the message can.
            let culprit = experiment.as_object().and_then(|keys| {
                keys.iter().find_map(|(key, value)| {
                    let alone = Value::Object([(key.clone(), value.clone())].into_iter().collect());
                    read(alone).err().map(|e| (key.clone(), e))
                })
            });
            Err(bad(match culprit {
                Some((key, e)) => format!("{origin}: {key}: {}", one_line(&e.to_string())),
                None => format!("{origin}: {}", one_line(&whole.to_string())),
            }))
        }
    }
}

/// A `--scheduler`/`--search` name over the file's value: the file's table
/// is kept when it names the same algorithm (its parameters apply), else
/// the name alone (default parameters).
pub(super) fn by_name(
    flag: &Option<String>,
    file: &Option<toml::Value>,
    default: &str,
) -> Option<toml::Value> {
    let Some(name) = flag else {
        return file.clone();
    };
    match file {
        Some(toml::Value::Table(table))
            if table
                .get("type")
                .and_then(toml::Value::as_str)
                .unwrap_or(default)
                == name =>
        {
            file.clone()
        }
        _ => Some(toml::Value::String(name.clone())),
    }
}

/// A `[key]` table read into `T` (its default when absent); serde's
/// message, which names the unknown or malformed field, is kept.
pub(super) fn table_as<T: serde::de::DeserializeOwned + Default>(
    key: &str,
    table: &Option<toml::Table>,
) -> Result<T, ConfigError> {
    match table {
        None => Ok(T::default()),
        Some(table) => {
            serde_json::from_value(to_json(table)).map_err(|e| bad(format!("[{key}]: {e}")))
        }
    }
}

pub(super) fn to_json(table: &toml::Table) -> Value {
    serde_json::to_value(table).unwrap_or(Value::Null)
}

pub(super) fn one_line(message: &str) -> String {
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}
