//! What an experiment leaves behind and shows: per-trial result files, the
//! experiment summary file, the live progress display and the final summary.

mod experiment;
mod files;
mod progress;
mod summary;

pub use experiment::ExperimentFile;
pub use files::TrialFiles;
pub use progress::Progress;
pub use summary::summary_text;
