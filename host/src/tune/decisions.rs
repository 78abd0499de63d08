//! The saved state of the runner's decision makers (scheduler, searcher and
//! experiment stopper), so that `wtune resume` continues with the same
//! decisions.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::scheduler::Scheduler;
use super::search::Searcher;
use super::stopper::ExperimentStopper;

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

/// Reads the `state` a scheduler or searcher saved as its own type: `None`
/// for `null` (nothing was saved: the fresh state stands), an error naming
/// `what` when it does not fit. Reads from the borrowed value, so a large
/// state (PBT's members) is not copied first.
pub(crate) fn read_saved<T: DeserializeOwned>(
    state: &Value,
    what: &str,
) -> Result<Option<T>, String> {
    if state.is_null() {
        return Ok(None);
    }
    T::deserialize(state)
        .map(Some)
        .map_err(|e| format!("the saved {what} state cannot be read: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn saved_states_read_as_their_type_and_bad_ones_are_named() {
        assert_eq!(read_saved::<u64>(&Value::Null, "X"), Ok(None));
        assert_eq!(
            read_saved::<Vec<u64>>(&json!([1, 2]), "X"),
            Ok(Some(vec![1, 2]))
        );
        let message = read_saved::<Vec<u64>>(&json!({"a": 1}), "HyperBand").unwrap_err();
        assert!(
            message.starts_with("the saved HyperBand state cannot be read: "),
            "{message}"
        );
    }
}
