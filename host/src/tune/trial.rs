//! A trial: one configuration's run, and where it stands.

use std::fmt;
use std::path::PathBuf;

use serde::Serialize;
use serde_json::{Map, Value};

/// Where a trial is in its life. Trials move PENDING -> RUNNING ->
/// TERMINATED (finished or stopped by a criterion) or ERROR.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TrialStatus {
    /// Waiting for a slot.
    Pending,
    /// Its trainable is live.
    Running,
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
            TrialStatus::Terminated => "TERMINATED",
            TrialStatus::Error => "ERROR",
        })
    }
}

/// One trial's state as the runner keeps it.
#[derive(Debug, Clone, Serialize)]
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
        }
    }

    /// The latest value of a metric, when reported and a number.
    pub fn metric(&self, name: &str) -> Option<f64> {
        self.last_result.as_ref()?.get(name)?.as_f64()
    }
}
