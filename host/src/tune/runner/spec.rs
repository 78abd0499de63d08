//! What an experiment is to run: the spec and its checkpoint and failure
//! policies.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::tune::experiment_stop::ExperimentStop;
use crate::tune::resources::{PoolSpec, Resources};
use crate::tune::result::Mode;
use crate::tune::trial_stop::StopCriteria;

/// When trials are checkpointed and which checkpoints are kept.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CheckpointPolicy {
    /// Checkpoint every `freq` iterations (0: never periodically).
    pub freq: u64,
    /// Checkpoint a trial when it ends TERMINATED.
    pub at_end: bool,
    /// Keep at most this many checkpoints per trial, ranked by
    /// `score_attr` (else the newest); the newest is always kept as well,
    /// because recovery continues from it.
    pub keep_num: Option<usize>,
    /// Result field that ranks checkpoints; a `min-` prefix means lower is
    /// better (Ray Tune's `checkpoint_score_attr`).
    pub score_attr: Option<String>,
}

impl CheckpointPolicy {
    /// The score attribute's field name and whether higher is better.
    pub(crate) fn score_field(&self) -> Option<(&str, bool)> {
        let attr = self.score_attr.as_deref()?;
        Some(match attr.strip_prefix("min-") {
            Some(field) => (field, false),
            None => (attr, true),
        })
    }

    /// The score `result` gives a checkpoint taken with it.
    pub(crate) fn score(&self, result: Option<&Map<String, Value>>) -> Option<f64> {
        let (field, _) = self.score_field()?;
        result?.get(field)?.as_f64()
    }
}

/// What the experiment does when a trial fails.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FailFast {
    /// The other trials carry on.
    #[default]
    Off,
    /// Stop the other trials and end the experiment.
    Stop,
    /// End the run at once with the trial's error ([`RunError::TrialFailed`]).
    Raise,
}

/// How trial failures are handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailurePolicy {
    /// Failures (traps, limit errors, guest errors) a trial recovers from by
    /// continuing from its newest checkpoint, or from scratch without one.
    /// `None` retries forever (`max_failures = -1`).
    pub max_failures: Option<u32>,
    /// What a trial's final failure does to the rest.
    pub fail_fast: FailFast,
}

impl Default for FailurePolicy {
    fn default() -> Self {
        Self {
            max_failures: Some(0),
            fail_fast: FailFast::Off,
        }
    }
}

/// What to run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunSpec {
    /// The experiment's name.
    pub name: String,
    /// Where trial directories go (`<output_dir>/trial_0000`, ...).
    pub output_dir: PathBuf,
    /// The metric that ranks trials; every result must report it.
    pub metric: Option<String>,
    /// Whether the metric is minimized or maximized.
    pub mode: Mode,
    /// Per-trial stopping criteria.
    pub stop: StopCriteria,
    /// Most trials live at once (at least 1).
    pub max_concurrent: usize,
    /// One configuration per trial, in trial order, when no
    /// [`Searcher`] is given ([`Runner::searcher`]).
    pub configs: Vec<Value>,
    /// When to checkpoint and what to keep.
    pub checkpoint: CheckpointPolicy,
    /// What failures do.
    pub failure: FailurePolicy,
    /// A checkpoint every new trial starts from (`restore_from`).
    pub restore_from: Option<PathBuf>,
    /// What each trial asks of the pool (a scheduler may change it per
    /// trial).
    #[serde(default)]
    pub resources_per_trial: Resources,
    /// What the experiment has; amounts left out are this machine's.
    #[serde(default)]
    pub resources: PoolSpec,
    /// When the whole experiment stops (trial count, time, fuel, plateau).
    #[serde(default)]
    pub stop_experiment: ExperimentStop,
    /// In which order results reach the scheduler and the searcher.
    #[serde(default)]
    pub result_order: ResultOrder,
}

/// In which order results reach the scheduler and the searcher.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ResultOrder {
    /// As trial threads finish their steps: decisions depend on which
    /// thread was faster.
    #[default]
    Arrival,
    /// By fuel time (ties by trial id), as a discrete-event simulation
    /// would hand them over: with the same seed and `max_concurrent`, the
    /// same decisions on every machine, whatever the threads' timing
    /// (unless something measured in wall time decides: a `time_total_s`
    /// criterion, `max_time`, control requests). Trials ahead in fuel time
    /// wait for their siblings at their next result. CPUs the resources
    /// leave undeclared hold all `max_concurrent` trials, sharing the cores
    /// where they are fewer ([`RunSpec::pool_spec`]).
    Fuel,
}

impl RunSpec {
    /// The resources the run's pool holds: `resources`, and in fuel order
    /// CPUs left undeclared raised to hold all `max_concurrent` trials
    /// ([`PoolSpec::share_cores`]). Worked out on each run, so a resumed
    /// run on another machine, or with another `max_concurrent`, fits its
    /// own cores.
    pub fn pool_spec(&self) -> PoolSpec {
        let mut pool = self.resources.clone();
        if self.result_order == ResultOrder::Fuel {
            pool.share_cores(self.resources_per_trial.cpu, self.max_concurrent);
        }
        pool
    }

    /// Most trials that can run at once: `max_concurrent`, or fewer when
    /// the experiment's resources hold fewer trials of
    /// `resources_per_trial` (a scheduler may change a trial's request
    /// later; this is for the requests the trials start with).
    pub fn concurrency(&self) -> usize {
        let asked = self.max_concurrent.max(1);
        self.pool_spec()
            .build()
            .ok()
            .and_then(|pool| pool.capacity(&self.resources_per_trial))
            .map_or(asked, |cap| asked.min(cap.trials.max(1)))
    }

    /// A spec with every option at its default: one trial at a time, no
    /// metric, no stopping criteria, no checkpoints, no retries, no configs
    /// (give a searcher, or `configs`), the machine's resources.
    pub fn new(name: impl Into<String>, output_dir: impl Into<PathBuf>) -> Self {
        Self {
            name: name.into(),
            output_dir: output_dir.into(),
            metric: None,
            mode: Mode::default(),
            stop: StopCriteria::default(),
            max_concurrent: 1,
            configs: Vec::new(),
            checkpoint: CheckpointPolicy::default(),
            failure: FailurePolicy::default(),
            restore_from: None,
            resources_per_trial: Resources::default(),
            resources: PoolSpec::default(),
            stop_experiment: ExperimentStop::default(),
            result_order: ResultOrder::default(),
        }
    }
}
