//! The saved state of the runner's decision makers (scheduler, searcher and
//! experiment stopper), so that `wtune resume` continues with the same
//! decisions.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::backend::Step;
use super::experiment_stop::ExperimentStopper;
use super::schedulers::Scheduler;
use super::search::Searcher;

/// A decision maker's name and its own state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SavedState {
    /// Its name, checked on resume: a state only fits the algorithm that
    /// wrote it.
    pub name: String,
    /// What it returned from its `state()`.
    #[serde(default)]
    pub state: Value,
}

/// Everything that decides what the runner does next, saved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecisionState {
    /// The scheduler's.
    pub scheduler: SavedState,
    /// The searcher's. States written before searchers existed have none:
    /// every trial was created before the first one started, so their
    /// search is over.
    #[serde(default)]
    pub searcher: Option<SavedState>,
    /// The experiment-level stopper's, when the experiment has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopper: Option<Value>,
    /// Fuel burned by all trials' steps so far (what `max_fuel` bounds).
    #[serde(default)]
    pub fuel_burned: u64,
    /// In fuel order, the moment of the run this state was taken at, from
    /// which `wtune resume` continues as if the run had never stopped.
    /// Absent in arrival order, at the end of a run, after a halt, and in
    /// states written before it existed: a resume from those may decide
    /// differently from an uninterrupted run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moment: Option<FuelMoment>,
}

/// A moment of a run in fuel order between two events: every event before
/// it carried out, none after it begun. Enough, with the trials and the
/// decision makers' states, to continue the run exactly.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FuelMoment {
    /// Experiment fuel time of the last event released.
    pub now: u64,
    /// Decisions recorded up to it (`decisions.jsonl`'s lines).
    pub decisions: u64,
    /// The trials holding a slot then, with their clocks.
    pub clocks: Vec<SavedClock>,
}

/// A trial's clock in fuel order, saved (see [`FuelMoment`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SavedClock {
    /// The trial.
    pub trial_id: String,
    /// Experiment fuel time when its session started.
    pub start: u64,
    /// Its own fuel count then, once its session launched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fuel_at_start: Option<u64>,
    /// Fuel time of its last event released (or its start).
    pub floor: u64,
    /// Its results decided so far: a resumed trial redoes the steps up to
    /// here without deciding on them again.
    pub iteration: u64,
    /// The step it finished after the run halted, not decided on: its
    /// checkpoint is taken after it, and the resumed run decides on it
    /// first, in its turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<PendingStep>,
    /// Recovered after a failure, it waits for the next event of another
    /// trial to learn its start (`start` and `floor` are not yet its own).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deferred: bool,
}

/// A step a trial finished after its run halted in fuel order, kept
/// undecided for the run that resumes it (see [`SavedClock::pending`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingStep {
    /// Its metrics, in the trainable's order.
    pub metrics: Vec<(String, f64)>,
    /// Whether the trainable said it had finished.
    pub done: bool,
    /// Fuel the step burned.
    pub fuel: u64,
    /// Wall time it took, in seconds.
    pub elapsed_s: f64,
}

impl PendingStep {
    /// `step`, which took `elapsed`, kept undecided.
    pub fn new(step: Step, elapsed: Duration) -> Self {
        Self {
            metrics: step.metrics,
            done: step.done,
            fuel: step.fuel,
            elapsed_s: elapsed.as_secs_f64(),
        }
    }

    /// The step again, to decide on.
    pub fn step(&self) -> Step {
        Step {
            metrics: self.metrics.clone(),
            done: self.done,
            fuel: self.fuel,
        }
    }

    /// The wall time it took.
    pub fn elapsed(&self) -> Duration {
        Duration::try_from_secs_f64(self.elapsed_s).unwrap_or_default()
    }
}

/// The decision makers of a live run, lent to callbacks that save state.
/// Their states are only computed when asked for: most calls to
/// [`Callback::on_state`](super::Callback::on_state) write nothing.
pub struct Deciders<'a> {
    /// The scheduler.
    pub scheduler: &'a dyn Scheduler,
    /// The searcher.
    pub searcher: &'a dyn Searcher,
    /// The experiment-level stopper, if any.
    pub stopper: Option<&'a ExperimentStopper>,
    /// Fuel burned by all trials' steps so far.
    pub fuel_burned: u64,
    /// In fuel order, where the run is ([`FuelMoment`]); `None` in arrival
    /// order and where no state may mark a moment (the end of a run, a
    /// halt).
    pub fuel_order: Option<&'a dyn AtMoment>,
}

/// A run in fuel order as a state writer sees it.
pub trait AtMoment {
    /// Whether the run is at a moment: `false` while it is carrying out an
    /// event, when a state written could not be continued exactly, so a
    /// state writer waits for the next call (it comes soon).
    fn at_moment(&self) -> bool;
    /// The moment the run is at, when [`AtMoment::at_moment`].
    fn moment(&self) -> Option<FuelMoment>;
}

impl Deciders<'_> {
    /// Their states, now.
    pub fn state(&self) -> DecisionState {
        self.state_at(self.fuel_order.and_then(AtMoment::moment))
    }

    /// Their states, now, at `moment` (see [`AtMoment::moment`]).
    pub fn state_at(&self, moment: Option<FuelMoment>) -> DecisionState {
        DecisionState {
            scheduler: SavedState {
                name: self.scheduler.name().to_string(),
                state: self.scheduler.state(),
            },
            searcher: Some(SavedState {
                name: self.searcher.name().to_string(),
                state: self.searcher.state(),
            }),
            stopper: self.stopper.map(ExperimentStopper::state),
            fuel_burned: self.fuel_burned,
            moment,
        }
    }
}
