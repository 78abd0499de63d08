//! Schedulers decide, after each result, whether a trial continues, and
//! which waiting trial runs next. They are pure: they see trials and results,
//! never sandboxes.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::asha::{Asha, AshaConfig};
use super::median::{MedianStopping, MedianStoppingConfig};
use super::resources::Resources;
use super::result::Mode;
use super::trial::{Trial, TrialStatus};

/// A scheduler by name and parameters, as an experiment file gives it:
/// `scheduler = "asha"`, or a `[scheduler]` table with `type = "asha"` and
/// the parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
pub enum SchedulerSpec {
    /// [`Fifo`].
    #[default]
    Fifo,
    /// [`Asha`].
    Asha(AshaConfig),
    /// [`MedianStopping`].
    #[serde(rename = "median_stopping")]
    MedianStopping(MedianStoppingConfig),
}

impl SchedulerSpec {
    /// The names known, for error messages.
    pub const NAMES: [&'static str; 3] = ["fifo", "asha", "median_stopping"];

    /// Whether the scheduler ends every trial by itself (ASHA at `max_t`),
    /// so that no default stopping criterion is needed.
    pub fn ends_trials(&self) -> bool {
        matches!(self, SchedulerSpec::Asha(_))
    }

    /// Builds the scheduler for an experiment ranking by `metric`/`mode`.
    pub fn build(
        &self,
        metric: Option<&str>,
        mode: Mode,
        seed: u64,
    ) -> Result<Box<dyn Scheduler>, String> {
        Ok(match self {
            SchedulerSpec::Fifo => Box::new(Fifo::default()),
            SchedulerSpec::Asha(config) => {
                let metric = metric.ok_or(
                    "the asha scheduler ranks trials by the experiment's metric; set `metric`",
                )?;
                Box::new(Asha::new(config.clone(), metric, mode, seed)?)
            }
            SchedulerSpec::MedianStopping(config) => {
                let metric = metric.ok_or(
                    "the median_stopping scheduler ranks trials by the experiment's metric; \
                     set `metric`",
                )?;
                Box::new(MedianStopping::new(config.clone(), metric, mode)?)
            }
        })
    }
}

/// What happens to a trial after a result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Train another iteration.
    Continue,
    /// End the trial as TERMINATED.
    Stop,
    /// Checkpoint the trial and release its instance; it stays PAUSED until
    /// [`Scheduler::choose_next`] picks it again, and then continues from
    /// that checkpoint.
    Pause,
}

/// Trial scheduling policy.
pub trait Scheduler: Send {
    /// Called after each result of a RUNNING trial that no stopping
    /// criterion has ended.
    fn on_result(&mut self, trial: &Trial, result: &Map<String, Value>) -> Decision;

    /// A new trial was created (PENDING). Called once per trial, before
    /// [`Scheduler::choose_next`] can see it; trials restored by `wtune
    /// resume` are already known through [`Scheduler::restore_state`].
    fn on_trial_add(&mut self, trial: &Trial) {
        let _ = trial;
    }

    /// A trial ended without a final result the scheduler was told about
    /// through [`Scheduler::on_trial_complete`]: it failed (ERROR). A
    /// scheduler that waits for groups of trials (synchronous HyperBand)
    /// must stop waiting for it.
    fn on_trial_remove(&mut self, trial: &Trial) {
        let _ = trial;
    }

    /// The searcher will create no more trials: a scheduler holding trials
    /// back until a group fills up must now decide with the trials it has.
    fn on_no_more_trials(&mut self) {}

    /// Called instead of [`Scheduler::on_result`] with the last result of a
    /// trial that a stopping criterion or the trainable itself ended, so
    /// the scheduler can still count it (ASHA records it at its rung).
    fn on_trial_complete(&mut self, trial: &Trial, result: &Map<String, Value>) {
        let _ = (trial, result);
    }

    /// The resources `trial` should hold from now on, when they should
    /// differ from what it holds (`trial.resources`, else the experiment's
    /// `resources_per_trial`). Asked before each launch and after each
    /// result that lets the trial continue: a change takes effect at once
    /// when the pool has room, else the trial is checkpointed, PAUSED, and
    /// continues once it fits (Ray Tune's resource-changing scheduling).
    fn resources(&mut self, trial: &Trial) -> Option<Resources> {
        let _ = trial;
        None
    }

    /// Picks the PENDING or PAUSED trial to run next, or `None` to start
    /// nothing now.
    fn choose_next(&mut self, trials: &[Trial]) -> Option<usize>;

    /// The name shown to users.
    fn name(&self) -> &'static str;

    /// The scheduler's own state, saved with the experiment so that
    /// `wtune resume` continues with the same decisions. Stateless
    /// schedulers keep the default.
    fn state(&self) -> Value {
        Value::Null
    }

    /// Takes back what [`Scheduler::state`] returned.
    fn restore_state(&mut self, state: &Value) -> Result<(), String> {
        let _ = state;
        Ok(())
    }
}

/// First in, first out: trials start in order and run until a stopping
/// criterion or the trainable ends them. PAUSED trials (an experiment
/// resumed after an interruption) continue in the same order.
#[derive(Debug, Default)]
pub struct Fifo {
    /// Trials before this index are known to be neither PENDING nor PAUSED;
    /// FIFO never pauses a trial, so none can become so again.
    cursor: usize,
}

impl Scheduler for Fifo {
    fn on_result(&mut self, _trial: &Trial, _result: &Map<String, Value>) -> Decision {
        Decision::Continue
    }

    fn choose_next(&mut self, trials: &[Trial]) -> Option<usize> {
        while self.cursor < trials.len() {
            if matches!(
                trials[self.cursor].status,
                TrialStatus::Pending | TrialStatus::Paused
            ) {
                return Some(self.cursor);
            }
            self.cursor += 1;
        }
        None
    }

    fn name(&self) -> &'static str {
        "fifo"
    }
}
