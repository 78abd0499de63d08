//! The line between deciding and executing: the runner asks a backend to
//! launch trials and step them; the backend owns whatever runs the code.

use std::fmt;
use std::path::PathBuf;

use serde_json::Value;

/// Everything a backend needs to start one trial.
#[derive(Debug, Clone)]
pub struct TrialLaunch {
    /// The trial's id, e.g. `trial_0003`.
    pub trial_id: String,
    /// The trial's configuration (a JSON object).
    pub config: Value,
    /// The trial's own directory; the backend may create files under it.
    pub trial_dir: PathBuf,
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
}

impl TrialFailure {
    /// A failure with the given reason.
    pub fn new(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
        }
    }
}

impl fmt::Display for TrialFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl std::error::Error for TrialFailure {}

/// Executes trials. Calls block (they run guest code), so the runner makes
/// them on blocking threads.
pub trait TrialBackend: Send + Sync + 'static {
    /// A live trial.
    type Session: TrialSession;

    /// Starts a trial: creates whatever runs it and configures it.
    fn launch(&self, launch: &TrialLaunch) -> Result<Self::Session, TrialFailure>;
}

/// A live trial that can be stepped until it is stopped.
pub trait TrialSession: Send + 'static {
    /// Runs one training iteration.
    fn train(&mut self) -> Result<Step, TrialFailure>;

    /// Fuel burned so far, start-up included.
    fn fuel_total(&self) -> u64;

    /// Lets the trainable release its resources; the session is gone after.
    fn stop(self) -> Result<(), TrialFailure>;
}
