//! The runner's observers: what file loggers, progress displays and state
//! writers are told, and when.

use serde_json::{Map, Value};

use super::record::DecisionRecord;
use super::spec::RunSpec;
use super::summary::ExperimentSummary;
use crate::tune::decisions::Deciders;
use crate::tune::trial::Trial;

/// Observes the experiment. File loggers and progress displays are
/// callbacks. An `Err` from a trial-level hook ends that trial as ERROR with
/// the message (a full disk fails the trial whose file could not be
/// written, not the experiment).
#[allow(unused_variables)]
pub trait Callback: Send {
    /// Before any trial starts.
    fn on_experiment_start(&mut self, spec: &RunSpec, trials: &[Trial]) -> Result<(), String> {
        Ok(())
    }
    /// A trial is about to be launched (its status is RUNNING).
    fn on_trial_start(&mut self, trials: &[Trial], index: usize) -> Result<(), String> {
        Ok(())
    }
    /// Work for the start of the trial [`Callback::on_trial_start`] was just
    /// told of that can run without the runner: creating its files, say.
    /// The runner runs it on the thread that launches the trial, before the
    /// launch and outside the lock every other hook runs under, so trials
    /// starting together do it in parallel rather than one after another
    /// (on a disk, creating a short trial's files is most of its cost). Its
    /// `Err` fails the trial, as `on_trial_start`'s does.
    fn trial_setup(&mut self, trials: &[Trial], index: usize) -> Option<TrialSetup> {
        None
    }
    /// A trial reported a result (already stored as its `last_result`).
    fn on_result(
        &mut self,
        trials: &[Trial],
        index: usize,
        result: &Map<String, Value>,
    ) -> Result<(), String> {
        Ok(())
    }
    /// A trial ended (TERMINATED or ERROR).
    fn on_trial_end(&mut self, trials: &[Trial], index: usize) -> Result<(), String> {
        Ok(())
    }
    /// A checkpoint of the trial is about to be written. `wtune resume`
    /// trusts checkpoint files on disk (the saved state may be older), so
    /// whatever a callback keeps of the trial's results up to here must be
    /// on disk before the file can appear. An `Err` fails the trial and no
    /// checkpoint is written.
    fn before_checkpoint(&mut self, trials: &[Trial], index: usize) -> Result<(), String> {
        Ok(())
    }
    /// A checkpoint was written and recorded (the trial's newest).
    fn on_checkpoint(&mut self, trials: &[Trial], index: usize) -> Result<(), String> {
        Ok(())
    }
    /// A trial failed and will continue from its newest checkpoint (or from
    /// scratch); `trials[index].num_failures` counts the failures so far.
    fn on_trial_recover(
        &mut self,
        trials: &[Trial],
        index: usize,
        reason: &str,
    ) -> Result<(), String> {
        Ok(())
    }
    /// A trial was checkpointed and released (PAUSED).
    fn on_trial_pause(&mut self, trials: &[Trial], index: usize) -> Result<(), String> {
        Ok(())
    }
    /// Called once before any trial starts (an `Err` then stops the run),
    /// and after every event the runner handles, with the decision makers
    /// for their states: the hook that persists experiment state (it
    /// decides itself how often to write).
    fn on_state(&mut self, trials: &[Trial], deciders: &Deciders<'_>) -> Result<(), String> {
        Ok(())
    }
    /// For a callback that saves the experiment's state: how many
    /// [`Callback::on_state`] calls had been made when the oldest state it
    /// keeps on disk was taken (`Some(0)` while it keeps none of this run's).
    /// The runner keeps a checkpoint file it stops listing until every such
    /// callback's states on disk were taken after that, so that a kill
    /// never leaves a saved state listing a file that is gone (see
    /// `tune/runner/retired.rs`). `None`, the default: it saves no state.
    fn saved_through(&self) -> Option<u64> {
        None
    }
    /// The runner decided something about a trial (see [`DecisionRecord`]):
    /// started it, decided on a result, or on a failure. In fuel order,
    /// records come in fuel-time order.
    fn on_decision(&mut self, record: &DecisionRecord) -> Result<(), String> {
        Ok(())
    }
    /// Every trial has ended.
    fn on_experiment_end(&mut self, summary: &ExperimentSummary) -> Result<(), String> {
        Ok(())
    }
}

/// A callback's work for a trial's start, run off the runner's lock
/// ([`Callback::trial_setup`]).
pub type TrialSetup = Box<dyn FnOnce() -> Result<(), String> + Send>;
