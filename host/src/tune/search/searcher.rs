//! The searcher interface: what every search algorithm answers to. The
//! algorithms live beside it and [`super::SearchSpec`] names them all.

use serde_json::{Map, Value};

/// What a searcher answers when asked for a new trial's configuration.
#[derive(Debug, Clone, PartialEq)]
pub enum Suggestion {
    /// Start a trial with this configuration (a JSON object).
    Config(Value),
    /// Nothing now (say, a concurrency limit is reached); ask again after
    /// a trial completes.
    Wait,
    /// The search is over: no more trials.
    Finished,
}

/// A search algorithm.
pub trait Searcher: Send {
    /// The configuration for a new trial named `trial_id`. The runner calls
    /// this only when it can start the trial at once.
    fn suggest(&mut self, trial_id: &str) -> Suggestion;

    /// An intermediate result of a trial this searcher suggested.
    fn on_result(&mut self, trial_id: &str, result: &Map<String, Value>) {
        let _ = (trial_id, result);
    }

    /// A trial this searcher suggested ended: TERMINATED with its last
    /// result (`error` false), or ERROR (`error` true, with its last result
    /// if it reported any). Called once per trial; PAUSED trials are not
    /// complete.
    fn on_trial_complete(
        &mut self,
        trial_id: &str,
        result: Option<&Map<String, Value>>,
        error: bool,
    );

    /// A trial that ended runs again: one that ended in ERROR (`wtune
    /// resume --retry-errored` or `--restart-errored`), or one that
    /// completed and is extended under new stopping criteria (`wtune resume
    /// --stop`). It is live again, its next [`Searcher::on_trial_complete`]
    /// is its real end, and a model forgets the end it had.
    fn on_trial_retry(&mut self, trial_id: &str) {
        let _ = trial_id;
    }

    /// How many trials the search creates in all, when known in advance
    /// (for progress displays and trial-id widths).
    fn total(&self) -> Option<u64> {
        None
    }

    /// The name shown to users.
    fn name(&self) -> &'static str;

    /// The searcher's own state, saved with the experiment so that `wtune
    /// resume` continues the same search.
    fn state(&self) -> Value {
        Value::Null
    }

    /// Takes back what [`Searcher::state`] returned.
    fn restore_state(&mut self, state: &Value) -> Result<(), String> {
        let _ = state;
        Ok(())
    }
}
