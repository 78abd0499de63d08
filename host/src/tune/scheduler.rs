//! Schedulers decide, after each result, whether a trial continues, and
//! which waiting trial runs next. They are pure: they see trials and results,
//! never sandboxes.

use serde_json::{Map, Value};

use super::trial::{Trial, TrialStatus};

/// What happens to a trial after a result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Train another iteration.
    Continue,
    /// End the trial as TERMINATED.
    Stop,
}

/// Trial scheduling policy.
pub trait Scheduler: Send {
    /// Called after each result of a RUNNING trial that no stopping
    /// criterion has ended.
    fn on_result(&mut self, trial: &Trial, result: &Map<String, Value>) -> Decision;

    /// Picks the PENDING trial to start next, or `None` to start nothing now.
    fn choose_next(&mut self, trials: &[Trial]) -> Option<usize>;

    /// The name shown to users.
    fn name(&self) -> &'static str;
}

/// First in, first out: trials start in order and run until a stopping
/// criterion or the trainable ends them.
#[derive(Debug, Default)]
pub struct Fifo {
    /// Trials before this index are known not to be PENDING.
    cursor: usize,
}

impl Scheduler for Fifo {
    fn on_result(&mut self, _trial: &Trial, _result: &Map<String, Value>) -> Decision {
        Decision::Continue
    }

    fn choose_next(&mut self, trials: &[Trial]) -> Option<usize> {
        while self.cursor < trials.len() {
            if trials[self.cursor].status == TrialStatus::Pending {
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
