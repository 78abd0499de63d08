//! What the machine offers the experiment and each trial asks of it, and
//! the experiment-level stopper.

use super::error::{ConfigError, bad};
use super::file::{ExperimentToml, table_as};
use crate::tune::{ExperimentStop, ExperimentStopper, Mode, PoolSpec, Resources, SchedulerSpec};

/// The resources' part of the plan.
pub(super) struct ResourcePlan {
    pub(super) resources_per_trial: Resources,
    pub(super) resources: PoolSpec,
    pub(super) stop_experiment: ExperimentStop,
}

/// `[resources_per_trial]`, `[resources]` (checked against each other) and
/// `[stop_experiment]`; with PBT, a note when the population cannot train
/// side by side. In fuel order (`fuel_order`), CPUs left undeclared hold
/// all `max_concurrent` trials even where the cores are fewer
/// ([`PoolSpec::share_cores`]), with a note.
#[allow(clippy::too_many_arguments)]
pub(super) fn plan(
    file: &ExperimentToml,
    metric: Option<&str>,
    mode: Mode,
    scheduler: &SchedulerSpec,
    max_concurrent: usize,
    trial_count: u64,
    fuel_order: bool,
    notes: &mut Vec<String>,
) -> Result<ResourcePlan, ConfigError> {
    let resources_per_trial: Resources =
        table_as("resources_per_trial", &file.resources_per_trial)?;
    resources_per_trial.validate().map_err(bad)?;
    let resources: PoolSpec = table_as("resources", &file.resources)?;
    // The pool this machine's run will build (`RunSpec::pool_spec`); the
    // spec keeps what was declared, for a resume elsewhere.
    let mut fitted = resources.clone();
    if fuel_order && let Some(cores) = fitted.share_cores(resources_per_trial.cpu, max_concurrent) {
        notes.push(format!(
            "all max_concurrent_trials = {max_concurrent} trials run at once (as far as \
             memory and GPUs allow), sharing this machine's {cores} cores, so that decisions \
             in fuel order do not depend on its cores; declare resources.cpu to run fewer \
             (decisions then differ from a machine where all fit)"
        ));
    }
    let pool = fitted.build().map_err(bad)?;
    // Undeclared GPUs depend on where host compute runs, known once the
    // sandbox exists: `fit_gpu` settles them, and the run checks again.
    let mut known = resources_per_trial.clone();
    if resources.gpu.is_none() {
        known.gpu = 0.0;
    }
    pool.check(&known).map_err(bad)?;
    let stop_experiment: ExperimentStop = table_as("stop_experiment", &file.stop_experiment)?;
    ExperimentStopper::new(&stop_experiment, metric, mode).map_err(bad)?;
    if matches!(scheduler, SchedulerSpec::Pbt(_)) {
        // PBT compares a population training side by side; trials that
        // wait for a slot fall behind and are cloned over before they learn.
        let fit = if resources_per_trial.cpu > 0.0 {
            (pool.total().cpu / resources_per_trial.cpu).floor() as u64
        } else {
            u64::MAX
        };
        let at_once = fit.min(max_concurrent as u64);
        let population = trial_count;
        if at_once < population {
            notes.push(format!(
                "pbt: only {at_once} of the {population} trials can run at once \
                 (max_concurrent_trials and resources); the rest wait and fall behind. \
                 Lower resources_per_trial.cpu or raise resources.cpu to train the whole \
                 population together"
            ));
        }
    }
    Ok(ResourcePlan {
        resources_per_trial,
        resources,
        stop_experiment,
    })
}
