//! The experiment file, checked as `wtune run` checks it, for `wtune.ray`'s
//! mapping onto a Ray Tune `Tuner`.

use std::path::PathBuf;

use pyo3::prelude::*;
use serde_json::json;
use wtune::config::{self, Overrides};
use wtune::report::{self, Outcome};

use crate::errors;

/// Plans `model` with the experiment file `config` exactly as `wtune run
/// MODEL --config CONFIG` would (every key checked, defaults applied,
/// relative paths resolved) and returns the plan as JSON: `spec` (the
/// runner's spec: name, output_dir, metric, mode, stop, max_concurrent,
/// checkpoint, failure, resources_per_trial, ...), `scheduler`, `search`,
/// `param_space`, `seed`, `num_samples` and `notes`.
#[pyfunction]
#[pyo3(signature = (model, config=None))]
pub(crate) fn plan_experiment(model: PathBuf, config: Option<PathBuf>) -> PyResult<String> {
    let plan = config::plan(&model, config.as_deref(), &Overrides::default())
        .map_err(|e| errors::ConfigError::new_err(e.to_string()))?;
    Ok(json!({
        "spec": plan.spec,
        "scheduler": plan.scheduler,
        "search": plan.search,
        "param_space": plan.param_space,
        "seed": plan.seed,
        "num_samples": plan.num_samples,
        "notes": plan.notes,
    })
    .to_string())
}

/// Checks one trial's settings (`settings_json`: the experiment file's
/// keys that apply to one trial) for the keys and value shapes a
/// `wtune.Trainable` made of them accepts, so that `wtune.ray.trainable`
/// refuses a misspelt key on the driver rather than in every trial's
/// `setup` on the workers. Paths are not checked: the driver need not be
/// one of the nodes that hold the data. Raises `ConfigError` naming the
/// key.
#[pyfunction]
pub(crate) fn check_trial_settings(settings_json: &str) -> PyResult<()> {
    let settings: serde_json::Value = serde_json::from_str(settings_json)
        .map_err(|e| errors::ConfigError::new_err(format!("trial settings: {e}")))?;
    config::check_value_keys(&settings, "experiment")
        .map_err(|e| errors::ConfigError::new_err(e.to_string()))
}

/// Checks that the experiment file at `path` holds only keys an
/// experiment file may have, with values of the right shapes, planning
/// nothing else: `wtune.Trainable(experiment=...)` uses only its trial
/// keys, and must not drop a misspelt table (`[limts]`) in silence. Raises
/// `ConfigError` naming the key.
#[pyfunction]
pub(crate) fn check_experiment_keys(path: PathBuf) -> PyResult<()> {
    config::check_keys(&path).map_err(|e| errors::ConfigError::new_err(e.to_string()))
}

/// What `wtune run` prints when an experiment ends, for `outcome_json`: a
/// `wtune::report::Outcome` (name, output_dir, wall_time_s, metric, mode,
/// stopped, trials: trial_id, status, config, iterations, value,
/// checkpoint, error, failures). Ranks the trials as `wtune run` does and
/// makes the guests' text (errors) inert.
#[pyfunction]
pub(crate) fn summary_text(outcome_json: &str) -> PyResult<String> {
    let outcome: Outcome = serde_json::from_str(outcome_json)
        .map_err(|e| errors::WtuneError::new_err(format!("experiment outcome: {e}")))?;
    Ok(report::outcome_text(&outcome))
}
