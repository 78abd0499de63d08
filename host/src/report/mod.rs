//! What an experiment leaves behind and shows: per-trial result files, the
//! experiment summary file, the record of decisions, the state `wtune
//! resume` continues from, the
//! live progress display and the final summary, and how a guest's text is
//! made inert before a terminal shows it.

pub mod decisions;
mod experiment;
mod files;
mod mlflow;
mod progress;
mod scalars;
pub mod state;
mod summary;
pub mod terminal;
mod tfevents;

pub use decisions::DecisionLog;
pub use experiment::ExperimentFile;
pub use files::TrialFiles;
pub use mlflow::MlflowLogger;
pub use progress::Progress;
pub use state::StateFile;
pub use summary::{Outcome, TrialOutcome, outcome_text, summary_text};
pub use tfevents::tensorboard_line;

/// Time since the Unix epoch now (zero on a clock set before it): what
/// TensorBoard's events and MLflow's timestamps count from.
fn unix_time() -> std::time::Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
}
