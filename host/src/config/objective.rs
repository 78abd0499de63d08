//! What the experiment is called, what it optimises, and how many trials
//! it runs how widely, with which seed.

use std::path::Path;

use super::error::{ConfigError, bad};
use super::file::ExperimentToml;
use super::overrides::Overrides;
use crate::tune::Mode;

/// The experiment's name: `--name`, the file's, or the model's file stem.
pub(super) fn name(
    model: &Path,
    file: &ExperimentToml,
    overrides: &Overrides,
) -> Result<String, ConfigError> {
    let name = overrides
        .name
        .clone()
        .or_else(|| file.name.clone())
        .or_else(|| model.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "experiment".into());
    if name.is_empty() || name.contains(['/', '\\']) || name.chars().any(char::is_control) {
        return Err(bad(format!(
            "name {name:?} must be non-empty and contain no slashes"
        )));
    }
    Ok(name)
}

/// The metric trials are ranked by, and in which direction: maximised
/// when no mode is given, with a note saying so (a loss ranked that way
/// would pick the worst trial).
pub(super) fn objective(
    file: &ExperimentToml,
    overrides: &Overrides,
    notes: &mut Vec<String>,
) -> Result<(Option<String>, Mode), ConfigError> {
    let metric = overrides.metric.clone().or_else(|| file.metric.clone());
    if metric.as_deref() == Some("") {
        return Err(bad("metric must not be empty"));
    }
    let mode = match (&overrides.mode, &file.mode) {
        (Some(flag), _) => Some(
            flag.parse::<Mode>()
                .map_err(|_| bad(format!("--mode {flag:?}: use min or max")))?,
        ),
        (None, Some(key)) => Some(key.parse::<Mode>().map_err(bad)?),
        (None, None) => None,
    };
    match (&metric, mode) {
        (None, Some(_)) => Err(bad(
            "mode is set but metric is not; set `metric` to the metric to rank by",
        )),
        (Some(metric), None) => {
            notes.push(format!(
                "no mode given; maximising {metric} (set mode = \"min\" or pass --mode min \
                 if it is a loss)"
            ));
            Ok((Some(metric.clone()), Mode::Max))
        }
        (metric, mode) => Ok((metric.clone(), mode.unwrap_or_default())),
    }
}

/// `num_samples`, `max_concurrent_trials` (the machine's cores by default)
/// and the seed (a random one, with a note saying which, when none is
/// given).
pub(super) fn sampling(
    file: &ExperimentToml,
    overrides: &Overrides,
    notes: &mut Vec<String>,
) -> Result<(u64, usize, u64), ConfigError> {
    let num_samples = overrides.num_samples.or(file.num_samples).unwrap_or(1);
    if num_samples == 0 {
        return Err(bad("num_samples must be at least 1"));
    }
    let max_concurrent = overrides
        .max_concurrent
        .or(file.max_concurrent_trials)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if max_concurrent == 0 {
        return Err(bad("max_concurrent_trials must be at least 1"));
    }
    let seed = match overrides.seed.or(file.seed) {
        Some(seed) => seed,
        None => {
            let seed = rand::random::<u32>() as u64;
            notes.push(format!(
                "no seed given; using seed {seed} (pass --seed {seed} to repeat this run)"
            ));
            seed
        }
    };
    Ok((num_samples, max_concurrent, seed))
}
