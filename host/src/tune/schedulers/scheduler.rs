//! Schedulers decide, after each result, whether a trial continues, and
//! which waiting trial runs next. They are pure: they see trials and results,
//! never sandboxes. This file is the interface; the algorithms live beside
//! it and [`super::SchedulerSpec`] names them all.

use serde_json::{Map, Value};

use crate::tune::resources::Resources;
use crate::tune::trial::Trial;

/// What happens to a trial after a result.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Train another iteration.
    Continue,
    /// End the trial as TERMINATED.
    Stop,
    /// Checkpoint the trial and release its instance; it stays PAUSED until
    /// [`Scheduler::choose_next`] picks it again, and then continues from
    /// that checkpoint, or until [`Scheduler::take_stops`] ends it.
    Pause,
    /// Checkpoint the trial now (whatever `checkpoint_freq` says), then
    /// train on: PBT keeps its best trials' states fresh for others to
    /// clone.
    Checkpoint,
    /// PBT's exploit and explore: drop this trial's state, continue from
    /// the newest checkpoint of the trial at index `source` (a copy becomes
    /// this trial's own), with `config` from then on. Counters
    /// (`training_iteration`, `fuel_total`, `time_total_s`) continue from
    /// the source's checkpoint. When the source has no checkpoint, the
    /// trial continues unchanged.
    Exploit {
        /// Index, into the trials, of the trial whose state is cloned.
        source: usize,
        /// The configuration the trial continues with.
        config: Value,
    },
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
    /// through [`Scheduler::on_trial_complete`]: it failed (ERROR), or a
    /// control request stopped or holds it (a held trial shows as ERROR to
    /// the scheduler until [`Scheduler::on_trial_retry`]). A scheduler that
    /// waits for groups of trials (synchronous HyperBand) must stop waiting
    /// for it.
    fn on_trial_remove(&mut self, trial: &Trial) {
        let _ = trial;
    }

    /// A trial that ended in ERROR runs again (`wtune resume
    /// --retry-errored` or `--restart-errored`), or a control request
    /// resumed a held trial: it is PAUSED at its newest checkpoint or
    /// PENDING, and live again after the scheduler was told it ended
    /// ([`Scheduler::on_trial_remove`]). By default it is treated as a new
    /// trial.
    fn on_trial_retry(&mut self, trial: &Trial) {
        self.on_trial_add(trial);
    }

    /// The [`Decision::Exploit`] given for `trial`'s last result was not
    /// carried out: its source had no checkpoint to clone (or one where it
    /// had ended), the copy failed, or the run halted first. The trial
    /// goes on from where it was, with its own config and counters.
    fn on_exploit_skipped(&mut self, trial: &Trial) {
        let _ = trial;
    }

    /// The searcher will create no more trials: a scheduler holding trials
    /// back until a group fills up must now decide with the trials it has.
    /// The runner calls it once, when `choose_next` has nothing and the
    /// searcher has nothing more, and then goes on as usual
    /// ([`Scheduler::take_stops`], then [`Scheduler::choose_next`]) before
    /// deciding whether the experiment is over.
    fn on_no_more_trials(&mut self) {}

    /// The searcher has more trials after all (`wtune resume --num-samples`
    /// raised the count of a run whose searcher was done): undoes
    /// [`Scheduler::on_no_more_trials`] for what is still to be decided.
    /// Groups already ranked stay as they were.
    fn on_more_trials(&mut self) {}

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

    /// The result field the scheduler measures progress by, which every
    /// result must report as a number: without it no result can move a
    /// trial to its next rung or end it, so the runner fails the trial
    /// (and, when no result has reported it, starts no more: a misspelt
    /// `time_attr`), as it does a result without the experiment's metric.
    /// `None` (the default) when the scheduler needs none.
    fn time_attr(&self) -> Option<&str> {
        None
    }

    /// Picks the PENDING or PAUSED trial to run next, or `None` to start
    /// nothing now.
    fn choose_next(&mut self, trials: &[Trial]) -> Option<usize>;

    /// Trials the scheduler has ended although they are not running: the
    /// indices, into `trials`, of PENDING or PAUSED trials that must end
    /// TERMINATED without training again. [`Decision`] only reaches the
    /// trial whose result is being handled, so this is how a scheduler
    /// ends the others: synchronous HyperBand stops the losers of a rung
    /// that were paused waiting for it, and ASHA's promotion variant stops
    /// the paused trials that nothing can promote any more once the
    /// experiment has nothing else to run.
    ///
    /// The runner calls this before every call to
    /// [`Scheduler::choose_next`] (so also right after
    /// [`Scheduler::on_no_more_trials`], which it follows with a
    /// `choose_next`), but not while it is halting, and ends each trial
    /// returned: TERMINATED, `stop_reason` "stopped by the NAME scheduler",
    /// callbacks told as for any other end, nothing else asked of the
    /// scheduler about it ([`Scheduler::on_trial_complete`] is not called:
    /// the scheduler already counts it as ended). Every index returned is
    /// returned once. A trial the scheduler wants ended while it is still
    /// RUNNING (its pause not yet complete) is kept back by the scheduler
    /// and returned by a later call, once `trials` shows it PAUSED, so the
    /// runner need not remember anything.
    fn take_stops(&mut self, trials: &[Trial]) -> Vec<usize> {
        let _ = trials;
        Vec::new()
    }

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
