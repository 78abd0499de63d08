//! What the command line says over the experiment file.

use std::path::PathBuf;

/// Command-line values that override the experiment file.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--name`
    pub name: Option<String>,
    /// `--num-samples`
    pub num_samples: Option<u64>,
    /// `--max-concurrent`
    pub max_concurrent: Option<usize>,
    /// `--metric`
    pub metric: Option<String>,
    /// `--mode`
    pub mode: Option<String>,
    /// `--stop KEY=VALUE`, repeatable.
    pub stop: Vec<String>,
    /// `--fuel`: the per-trial fuel budget.
    pub fuel: Option<String>,
    /// `--fuel-per-call`
    pub fuel_per_call: Option<String>,
    /// `--memory`
    pub memory: Option<String>,
    /// `--timeout`: the per-call deadline.
    pub timeout: Option<String>,
    /// `--data NAME=DIR` or `--data DIR`, repeatable.
    pub data: Vec<String>,
    /// `--output-dir`
    pub output_dir: Option<PathBuf>,
    /// `--seed`
    pub seed: Option<u64>,
    /// `--checkpoint`: snapshot or guest.
    pub checkpoint: Option<String>,
    /// `--checkpoint-freq`
    pub checkpoint_freq: Option<u64>,
    /// `--checkpoint-at-end`
    pub checkpoint_at_end: bool,
    /// `--max-failures`
    pub max_failures: Option<i64>,
    /// `--restore-from`
    pub restore_from: Option<PathBuf>,
    /// `--scheduler NAME`
    pub scheduler: Option<String>,
    /// `--search NAME`
    pub search: Option<String>,
    /// `--compute auto|cpu|gpu`
    pub compute: Option<String>,
    /// `--allow-component HASH`, repeatable: replaces the file's
    /// `security.allowed_components`.
    pub allowed_components: Vec<String>,
    /// `--no-tensorboard`
    pub no_tensorboard: bool,
    /// `--mlflow URI`
    pub mlflow: Option<String>,
}
