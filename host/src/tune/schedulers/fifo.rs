//! The default scheduler: first in, first out.

use std::collections::VecDeque;

use serde_json::{Map, Value};

use super::scheduler::{Decision, Scheduler};
use crate::tune::trial::{Trial, TrialStatus};

/// First in, first out: trials start in order and run until a stopping
/// criterion or the trainable ends them. PAUSED trials (an experiment
/// resumed after an interruption) continue in the same order.
#[derive(Debug, Default)]
pub struct Fifo {
    /// Trials before this index are known to be neither PENDING nor PAUSED,
    /// except the `retried` ones: FIFO never pauses a trial itself.
    cursor: usize,
    /// Trials live again ([`Scheduler::on_trial_retry`]), perhaps behind
    /// the cursor, first in first out; each leaves the queue once seen
    /// neither PENDING nor PAUSED.
    retried: VecDeque<String>,
}

impl Scheduler for Fifo {
    fn on_result(&mut self, _trial: &Trial, _result: &Map<String, Value>) -> Decision {
        Decision::Continue
    }

    fn on_trial_retry(&mut self, trial: &Trial) {
        self.retried.push_back(trial.trial_id.clone());
    }

    fn choose_next(&mut self, trials: &[Trial]) -> Option<usize> {
        while let Some(id) = self.retried.front() {
            // Retries are rare; finding one by its id costs a scan.
            match trials.iter().position(|t| &t.trial_id == id) {
                Some(index)
                    if matches!(
                        trials[index].status,
                        TrialStatus::Pending | TrialStatus::Paused
                    ) =>
                {
                    return Some(index);
                }
                _ => {
                    self.retried.pop_front();
                }
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tune::schedulers::sim;

    #[test]
    fn fifo_runs_trials_in_order_and_ends_none_itself() {
        let mut fifo = Fifo::default();
        let mut sim = sim::Sim::new(4, 2);
        sim.stop_at = Some(3);
        assert!(sim.run(&mut fifo, &|i, t| (i as u64 * t) as f64, None));
        assert_eq!(sim.iterations(), [3, 3, 3, 3]);
        assert!(sim.unfinished().is_empty());
        assert!(sim.resumed.is_empty() && sim.taken.is_empty());
    }
}
