//! Why a run could not complete at all.

/// Why a run could not complete at all (trial failures never cause this).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A callback failed at the experiment level (e.g. the output directory
    /// cannot be written).
    #[error("{0}")]
    Callback(String),
    /// A trial failed under `fail_fast = "raise"`.
    #[error("{trial_id} failed and fail_fast = \"raise\": {reason}")]
    TrialFailed {
        /// The trial.
        trial_id: String,
        /// Its error.
        reason: String,
    },
    /// Interrupted twice: the run ended without waiting for running trials.
    #[error("interrupted; the experiment's state is saved")]
    Interrupted,
    /// The spec cannot run (say, its resource pool or stopping criteria
    /// are invalid).
    #[error("{0}")]
    Spec(String),
    /// A runner task panicked: a bug in wtune.
    #[error("internal error: {0}")]
    Internal(String),
}

/// The stop reason of trials, and the halt reason of experiments, that a
/// control request ended.
pub const STOPPED_BY_REQUEST: &str = "stopped by a control request";
