//! A trial: one configuration's run, and where it stands.

use std::fmt;
use std::path::PathBuf;

use super::resources::Resources;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Where a trial is in its life. Trials move PENDING -> RUNNING ->
/// TERMINATED (finished or stopped by a criterion) or ERROR; a RUNNING trial
/// may be PAUSED (checkpointed, its instance released) and later RUNNING
/// again from that checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TrialStatus {
    /// Waiting for a slot.
    Pending,
    /// Its trainable is live.
    Running,
    /// Checkpointed and released; waiting to continue.
    Paused,
    /// Finished normally.
    Terminated,
    /// Failed; `Trial::error` says why.
    Error,
}

impl TrialStatus {
    /// TERMINATED or ERROR.
    pub fn is_finished(self) -> bool {
        matches!(self, TrialStatus::Terminated | TrialStatus::Error)
    }
}

impl fmt::Display for TrialStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TrialStatus::Pending => "PENDING",
            TrialStatus::Running => "RUNNING",
            TrialStatus::Paused => "PAUSED",
            TrialStatus::Terminated => "TERMINATED",
            TrialStatus::Error => "ERROR",
        })
    }
}

/// A checkpoint the runner keeps for a trial.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The file, relative to the trial's directory.
    pub path: PathBuf,
    /// Completed iterations when it was taken.
    pub iteration: u64,
    /// Seconds of training behind it.
    pub time_total_s: f64,
    /// Fuel burned before it.
    pub fuel_total: u64,
    /// The value of the checkpoint score attribute at that iteration.
    pub score: Option<f64>,
    /// Size on disk.
    pub bytes: u64,
    /// Taken only because the run halted in fuel order, where an
    /// uninterrupted run takes none: the trial resumes from it, but PBT
    /// does not clone it, and the trial's next checkpoint replaces it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub halt: bool,
}

/// One trial's state as the runner keeps it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Trial {
    /// `trial_0000`, `trial_0001`, ...
    pub trial_id: String,
    /// Current status.
    pub status: TrialStatus,
    /// The configuration (a JSON object).
    pub config: Value,
    /// Completed training iterations.
    pub iterations: u64,
    /// Seconds spent in training calls.
    pub time_total_s: f64,
    /// Fuel burned, start-up included.
    pub fuel_total: u64,
    /// The latest result record (metrics plus auto-filled fields).
    pub last_result: Option<Map<String, Value>>,
    /// Why the trial ended in ERROR.
    pub error: Option<String>,
    /// Why a TERMINATED trial stopped (a criterion, or the trainable's `done`).
    pub stop_reason: Option<String>,
    /// The trial's directory.
    pub dir: PathBuf,
    /// Failures recovered from so far (see `max_failures`).
    #[serde(default)]
    pub num_failures: u32,
    /// Checkpoints kept, oldest first; the last is the newest.
    #[serde(default)]
    pub checkpoints: Vec<Checkpoint>,
    /// A checkpoint (from elsewhere) the trial starts from instead of from
    /// scratch: `restore_from`.
    #[serde(default)]
    pub restore_from: Option<PathBuf>,
    /// Iterations since the trial was last started or restored.
    #[serde(default)]
    pub iterations_since_restore: u64,
    /// Seconds of training since the trial was last started or restored.
    #[serde(default)]
    pub time_since_restore: f64,
    /// Fuel burned since the trial was last started or restored.
    #[serde(default)]
    pub fuel_since_restore: u64,
    /// What the trial asks of the experiment's resource pool, when a
    /// scheduler changed it from the experiment's `resources_per_trial`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,
    /// PAUSED (or PENDING) because a control request paused it: the runner
    /// does not run it again until a request resumes it. `wtune resume`
    /// clears it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub held: bool,
}

impl Trial {
    /// A PENDING trial.
    pub fn new(trial_id: String, config: Value, dir: PathBuf) -> Self {
        Self {
            trial_id,
            status: TrialStatus::Pending,
            config,
            iterations: 0,
            time_total_s: 0.0,
            fuel_total: 0,
            last_result: None,
            error: None,
            stop_reason: None,
            dir,
            num_failures: 0,
            checkpoints: Vec::new(),
            restore_from: None,
            iterations_since_restore: 0,
            time_since_restore: 0.0,
            fuel_since_restore: 0,
            resources: None,
            held: false,
        }
    }

    /// The newest checkpoint, if any.
    pub fn latest_checkpoint(&self) -> Option<&Checkpoint> {
        self.checkpoints.last()
    }

    /// The newest checkpoint an uninterrupted run would also have (not one
    /// taken only for a halt, see [`Checkpoint::halt`]): what PBT clones.
    pub fn cloneable_checkpoint(&self) -> Option<&Checkpoint> {
        self.clone_at(u64::MAX)
    }

    /// The newest cloneable checkpoint taken by iteration `iteration`: what
    /// an exploit decided when this trial had completed `iteration`
    /// iterations clones, whatever it has taken since.
    pub fn clone_at(&self, iteration: u64) -> Option<&Checkpoint> {
        (self.checkpoints.iter().rev()).find(|c| !c.halt && c.iteration <= iteration)
    }

    /// Whether `checkpoint` holds the state this trial ended in: training
    /// on from it would go past what ended the trial.
    pub fn ended_at(&self, checkpoint: &Checkpoint) -> bool {
        self.stop_reason.is_some() && checkpoint.iteration >= self.iterations
    }

    /// Where the trial continues from when launched: its newest checkpoint,
    /// else `restore_from`, else nothing (from scratch).
    pub fn restore_path(&self) -> Option<PathBuf> {
        self.latest_checkpoint()
            .map(|c| self.dir.join(&c.path))
            .or_else(|| self.restore_from.clone())
    }

    /// The latest value of a metric, when reported and a number.
    pub fn metric(&self, name: &str) -> Option<f64> {
        self.last_result.as_ref()?.get(name)?.as_f64()
    }
}
