//! The saved state of the runner's decision makers (scheduler, searcher and
//! experiment stopper), so that `wtune resume` continues with the same
//! decisions.

use serde::{Deserialize, Serialize};
use serde_json::Value;

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
}

impl Deciders<'_> {
    /// Their states, now.
    pub fn state(&self) -> DecisionState {
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
        }
    }
}
