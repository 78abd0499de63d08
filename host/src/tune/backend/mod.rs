//! The line between deciding and executing: the runner asks a backend to
//! launch trials and step them; the backend owns whatever runs the code.

use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::tune::resources::Resources;

pub(crate) mod closure;

/// Everything a backend needs to start one trial.
#[derive(Debug, Clone)]
pub struct TrialLaunch {
    /// The trial's id, e.g. `trial_0003`.
    pub trial_id: String,
    /// The trial's configuration (a JSON object).
    pub config: Value,
    /// The trial's own directory; the backend may create files under it.
    pub trial_dir: PathBuf,
    /// Start from this checkpoint (written by [`TrialSession::save`]) rather
    /// than from scratch. A checkpoint of another configuration (a PBT
    /// exploit) continues with `config` from then on.
    pub restore: Option<PathBuf>,
    /// What the trial holds from the experiment's resource pool; a backend
    /// enforces what it can (the sandbox caps memory at a non-zero
    /// `memory`).
    pub resources: Resources,
    /// The GPUs of the pool the trial is placed on, numbered from 0 (see
    /// `ResourcePool::gpus_of`); a backend runs the trial's GPU work on the
    /// first. Empty where the experiment has no GPUs. Fixed for the
    /// session: a resize granted in place keeps the first GPU (and of the
    /// others as many as the new amount allows), and GPUs it adds reach
    /// the trial at its next launch.
    pub gpus: Vec<usize>,
}

/// What the runner knows about a trial when it checkpoints it; the backend
/// stores it in the checkpoint so that a checkpoint describes itself.
#[derive(Debug, Clone)]
pub struct CheckpointInfo<'a> {
    /// The trial's id.
    pub trial_id: &'a str,
    /// The trial's configuration.
    pub config: &'a Value,
    /// Completed training iterations.
    pub iteration: u64,
    /// Seconds spent training.
    pub time_total_s: f64,
    /// The trial's latest result record (a JSON object), if any.
    pub result: Option<&'a serde_json::Map<String, Value>>,
}

/// What one training step produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// Metrics in the trainable's order; names are unique.
    pub metrics: Vec<(String, f64)>,
    /// The trainable says it has finished.
    pub done: bool,
    /// Fuel (metered work units) burned by this step.
    pub fuel: u64,
}

/// Why a trial failed, as shown in its ERROR status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrialFailure {
    /// One line naming the call and the cause.
    pub reason: String,
    /// Whether trying again (from a checkpoint, under `max_failures`) can
    /// succeed. A spent fuel budget or a checkpoint that cannot be restored
    /// fails the same way every time.
    pub retryable: bool,
}

impl TrialFailure {
    /// A failure with the given reason that a retry may get past (a trap,
    /// a limit hit in one call, a guest error).
    pub fn new(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            retryable: true,
        }
    }

    /// A failure no retry can get past.
    pub fn permanent(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            retryable: false,
        }
    }
}

impl fmt::Display for TrialFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl std::error::Error for TrialFailure {}

/// What a checkpoint file says about the trial it was taken from.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointMeta {
    /// Completed training iterations.
    pub iteration: u64,
    /// Seconds spent training.
    pub time_total_s: f64,
    /// Fuel burned.
    pub fuel_total: u64,
    /// The trial's last result when it was taken.
    pub result: Option<serde_json::Map<String, Value>>,
}

/// Why a checkpoint file could not be described.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckpointFault {
    /// The file itself is damaged (truncated, corrupted, not a checkpoint):
    /// resuming skips it for the trial's next older one.
    Damaged(String),
    /// The file may well be intact, but cannot be read as things stand (it
    /// was written with another snapshot key, for another component or
    /// format version, or reading it failed): resuming refuses rather than
    /// start the trial over and overwrite its history.
    Unreadable(String),
}

impl CheckpointFault {
    /// One line naming the file and the cause.
    pub fn reason(&self) -> &str {
        match self {
            CheckpointFault::Damaged(why) | CheckpointFault::Unreadable(why) => why,
        }
    }
}

impl fmt::Display for CheckpointFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.reason())
    }
}

/// Executes trials. Calls block (they run guest code), so the runner makes
/// them on blocking threads.
pub trait TrialBackend: Send + Sync + 'static {
    /// A live trial.
    type Session: TrialSession;

    /// File extension of this backend's checkpoints.
    const CHECKPOINT_EXTENSION: &'static str = "ckpt";

    /// Starts a trial: creates whatever runs it and configures it.
    fn launch(&self, launch: &TrialLaunch) -> Result<Self::Session, TrialFailure>;

    /// Reads and verifies a checkpoint file this backend wrote; `wtune
    /// resume` uses it to find each trial's newest intact checkpoint, and
    /// refuses to resume on a [`CheckpointFault::Unreadable`] one.
    fn describe_checkpoint(&self, path: &Path) -> Result<CheckpointMeta, CheckpointFault>;
}

/// A live trial that can be stepped until it is stopped.
pub trait TrialSession: Send + 'static {
    /// Runs one training iteration.
    fn train(&mut self) -> Result<Step, TrialFailure>;

    /// Fuel burned so far, start-up included (and, after a restore, what
    /// the checkpoint had burned).
    fn fuel_total(&self) -> u64;

    /// Completed training iterations: 0 for a fresh trial, the checkpoint's
    /// count for one launched from a checkpoint.
    fn iteration(&self) -> u64;

    /// Seconds of training the trial had behind it when launched: 0 for a
    /// fresh trial, the checkpoint's time for a restored one.
    fn time_restored_s(&self) -> f64 {
        0.0
    }

    /// Writes a checkpoint of the trial's current state to `path`
    /// atomically, and returns its size in bytes. A later
    /// [`TrialBackend::launch`] with `restore = path` continues from here.
    fn save(&mut self, path: &Path, info: &CheckpointInfo<'_>) -> Result<u64, TrialFailure>;

    /// Lets the trainable release its resources; the session is gone after.
    /// An `Err` (the trainable's cleanup failed or ran past a limit) is
    /// logged as a warning naming the trial; the trial keeps the status it
    /// ended with, since its results are complete.
    fn stop(self) -> Result<(), TrialFailure>;
}
