//! What a finished experiment hands back.

use std::path::PathBuf;
use std::time::Duration;

use crate::tune::decisions::DecisionState;
use crate::tune::result::Mode;
use crate::tune::trial::{Trial, TrialStatus};

/// The outcome of a whole experiment.
#[derive(Debug, Clone)]
pub struct ExperimentSummary {
    /// The experiment's name.
    pub name: String,
    /// Where its files are.
    pub output_dir: PathBuf,
    /// The ranking metric, if any.
    pub metric: Option<String>,
    /// Its mode.
    pub mode: Mode,
    /// Every trial's final state.
    pub trials: Vec<Trial>,
    /// Index of the best trial by `metric`/`mode` on its last result.
    pub best: Option<usize>,
    /// Wall-clock time of the whole run.
    pub wall_time: Duration,
    /// Why the experiment stopped before every trial finished (a failed
    /// trial under `fail_fast`, an interrupt): it can be resumed.
    pub halted: Option<String>,
    /// Why an experiment-level stopping criterion (`stop_experiment`) ended
    /// the experiment; trials still running then were stopped.
    pub stopped: Option<String>,
    /// The final state of the scheduler and searcher, for saving.
    pub decisions: DecisionState,
    /// In fuel order, the run left while it carried out an event (a second
    /// interrupt, an internal error, `fail_fast = "raise"`), where no
    /// moment describes it: a state saver keeps the last state it saved at
    /// a moment, from which `wtune resume` continues the same run as after
    /// a kill, rather than save one that marks none.
    pub ended_mid_event: bool,
}

impl ExperimentSummary {
    /// The best trial, if a metric was set and any trial reported it.
    pub fn best_trial(&self) -> Option<&Trial> {
        self.best.map(|i| &self.trials[i])
    }

    /// `finished`, or `halted` when the run stopped early; the status
    /// wtune's files record.
    pub fn status(&self) -> &'static str {
        if self.halted.is_some() {
            "halted"
        } else {
            "finished"
        }
    }

    /// How many trials ended with `status`.
    pub fn count(&self, status: TrialStatus) -> usize {
        self.trials.iter().filter(|t| t.status == status).count()
    }
}

/// The index of the trial whose last `metric` is best (finite values only;
/// the first of equals), as the summary and the dashboard name it.
pub(crate) fn best_trial(trials: &[Trial], metric: &str, mode: Mode) -> Option<usize> {
    mode.best_index(trials.iter().map(|trial| trial.metric(metric)))
}
