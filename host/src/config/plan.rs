//! The plan: everything a run needs, read from the experiment file and the
//! command line as a list of named steps (the way ripgrep's
//! `HiArgs::from_low_args` reads), then one struct literal. The steps run
//! in this order so that the first mistake a user sees is always the same.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::error::{ConfigError, bad};
use super::overrides::Overrides;
use super::tracking::{self, Tracking};
use super::{decisions, file, objective, paths, policies, resources, sandbox};
use crate::compute::ComputeOptions;
use crate::sandbox::{CompileOptions, Limits};
use crate::tune::{RunSpec, SchedulerSpec, SearchSpace, SearchSpec, Searcher};
use crate::wasm_backend::CheckpointMode;

/// Everything needed to run an experiment.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The runner's part.
    pub spec: RunSpec,
    /// Per-trial sandbox limits.
    pub limits: Limits,
    /// Wasm stack limit for the engine.
    pub max_wasm_stack: usize,
    /// Read-only data grants: `(name, absolute host dir)`.
    pub data: Vec<(String, PathBuf)>,
    /// The seed the configurations were drawn with.
    pub seed: u64,
    /// `num_samples` as used.
    pub num_samples: u64,
    /// Notes for the user about defaults that were applied.
    pub notes: Vec<String>,
    /// `checkpoint`, when set: how checkpoints are taken (else host
    /// snapshots where the component allows them).
    pub checkpoint_mode: Option<CheckpointMode>,
    /// A file whose bytes key the checkpoints' MAC.
    pub snapshot_key_file: Option<PathBuf>,
    /// The trial scheduler.
    pub scheduler: SchedulerSpec,
    /// Whether the search space was empty (trials started from a host
    /// snapshot then take its configuration).
    pub empty_space: bool,
    /// wtune named the output directory (`wtune_results/<name>_<time>`):
    /// neither the flags nor the file chose it, so a run that finds it
    /// taken may take the next free name ([`crate::config::LOCK_FILE`]).
    pub output_dir_named: bool,
    /// `param_space` as JSON (`{}` when absent), kept so that `wtune
    /// resume` can rebuild the search.
    pub param_space: Value,
    /// The search algorithm.
    pub search: SearchSpec,
    /// The host compute backend and its memory quotas.
    pub compute: ComputeOptions,
    /// Where components are compiled, and the compile limits.
    pub compile: CompileOptions,
    /// The blake3 digests of the only components allowed to run, if the
    /// experiment pins them.
    pub allowed_components: Option<BTreeSet<String>>,
    /// What results are also written as.
    pub tracking: Tracking,
}

impl Plan {
    /// That every parameter PBT's `hyperparam_mutations` names is in
    /// `param_space`: wtune's PBT perturbs only values a trial started
    /// with, and would refuse each trial at its first result, after the
    /// run had started. Not part of [`plan`], as Ray's PBT (which the
    /// Python package maps the plan to) samples a missing one at a trial's
    /// start. Trials started from a host snapshot with no space of their
    /// own take the snapshot's configuration, which is not checked here.
    pub fn check_mutations(&self) -> Result<(), ConfigError> {
        if self.spec.restore_from.is_some() && self.empty_space {
            return Ok(());
        }
        super::decisions::check_mutations(&self.scheduler, &self.param_space)
    }

    /// The searcher that creates the plan's trials.
    pub fn searcher(&self) -> Result<Box<dyn Searcher>, ConfigError> {
        searcher(
            &self.search,
            &self.param_space,
            self.num_samples,
            &self.spec,
            self.seed,
        )
        .map_err(bad)
    }
}

/// The searcher `search` builds over `param_space` (JSON) for `spec`'s
/// metric and mode: for a fresh plan and for `wtune resume` alike.
pub fn searcher(
    search: &SearchSpec,
    param_space: &Value,
    num_samples: u64,
    spec: &RunSpec,
    seed: u64,
) -> Result<Box<dyn Searcher>, String> {
    let space = SearchSpace::from_json(param_space).map_err(|e| e.to_string())?;
    search.build(&space, num_samples, spec.metric.as_deref(), spec.mode, seed)
}

/// Reads the experiment file (if any), applies overrides, validates.
pub fn plan(
    model: &Path,
    config: Option<&Path>,
    overrides: &Overrides,
) -> Result<Plan, ConfigError> {
    let (file, base) = file::read(config)?;
    plan_file(model, file, base, overrides)
}

/// [`plan`] for an experiment given as a value with the experiment file's
/// keys (a JSON object; the Python package passes one built from keyword
/// arguments), relative paths starting at `base`. Every key is checked as
/// in a file; `origin` names the value in errors.
/// Reads the experiment file at `path` and checks that its keys are all
/// ones an experiment file may have, with values of the right shapes,
/// without planning anything else (paths, the component, the search): for
/// embedders that use only some keys of the file and must not drop a
/// misspelt one in silence.
pub fn check_keys(path: &Path) -> Result<(), ConfigError> {
    file::read(Some(path)).map(drop)
}

/// [`check_keys`] for an experiment given as a value (`origin` names it in
/// errors): its keys and the shapes of their values, with nothing planned,
/// so nothing on this machine (data directories, key files) need exist.
pub fn check_value_keys(experiment: &Value, origin: &str) -> Result<(), ConfigError> {
    file::from_value(experiment, origin, Path::new("")).map(drop)
}

pub fn plan_value(
    model: &Path,
    experiment: &Value,
    origin: &str,
    base: &Path,
    overrides: &Overrides,
) -> Result<Plan, ConfigError> {
    let (file, base) = file::from_value(experiment, origin, base)?;
    plan_file(model, file, base, overrides)
}

fn plan_file(
    model: &Path,
    mut file: file::ExperimentToml,
    base: PathBuf,
    overrides: &Overrides,
) -> Result<Plan, ConfigError> {
    let mut notes = Vec::new();
    let name = objective::name(model, &file, overrides)?;
    let (metric, mode) = objective::objective(&file, overrides, &mut notes)?;
    let scheduler = decisions::scheduler_spec(&file, overrides)?;
    let (num_samples, max_concurrent, seed) = objective::sampling(&file, overrides, &mut notes)?;
    // Built once here so that its parameters are checked before anything runs.
    scheduler
        .build(metric.as_deref(), mode, seed)
        .map_err(bad)?;
    let search =
        decisions::search_plan(&file, overrides, num_samples, metric.as_deref(), mode, seed)?;
    let stop = decisions::stop_criteria(
        &file,
        overrides,
        &scheduler,
        (metric.as_deref(), mode),
        &mut notes,
    )?;
    let sandbox = sandbox::settings(&mut file, overrides, max_concurrent, &mut notes)?;
    let resources = resources::plan(
        &file,
        metric.as_deref(),
        mode,
        &scheduler,
        sandbox.max_concurrent,
        search.trial_count,
        decisions::fuel_order_chosen(&file, &scheduler),
        &mut notes,
    )?;
    let result_order = decisions::result_order(
        &file,
        &scheduler,
        &stop,
        &resources.stop_experiment,
        &mut notes,
    );
    let counts = (max_concurrent, search.trial_count);
    decisions::note_default_concurrency(&file, overrides, result_order, counts, &mut notes);
    let checkpoint_mode = policies::checkpoint_mode(&file, overrides)?;
    let checkpoint = policies::checkpoint(&file, overrides)?;
    let failure = policies::failure(&file, overrides)?;
    let restore_from = paths::restore_from(&file, overrides, &base)?;
    let snapshot_key_file = paths::snapshot_key_file(&file, &base)?;
    let data = paths::data_grants(&file, overrides, &base)?;
    let output_dir = paths::output_dir(&file, overrides, &base, &name)?;
    let tracking = tracking::tracking(&file, overrides, &name)?;

    Ok(Plan {
        spec: RunSpec {
            name,
            output_dir,
            metric,
            mode,
            stop,
            max_concurrent: sandbox.max_concurrent,
            configs: Vec::new(),
            checkpoint,
            failure,
            restore_from,
            resources_per_trial: resources.resources_per_trial,
            resources: resources.resources,
            stop_experiment: resources.stop_experiment,
            result_order,
        },
        limits: sandbox.limits,
        max_wasm_stack: sandbox.max_wasm_stack,
        data,
        seed,
        num_samples,
        notes,
        checkpoint_mode,
        snapshot_key_file,
        scheduler,
        empty_space: file.param_space.as_ref().is_none_or(|t| t.is_empty()),
        output_dir_named: overrides.output_dir.is_none() && file.output_dir.is_none(),
        param_space: search.param_space,
        search: search.search,
        compute: sandbox.compute,
        compile: sandbox.compile,
        allowed_components: sandbox.allowed_components,
        tracking,
    })
}
