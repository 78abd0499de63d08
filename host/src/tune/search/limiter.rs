//! A cap on how many suggested trials are live at once (Ray Tune's
//! `ConcurrencyLimiter`).
//!
//! A model-based searcher learns only from completed trials; with many
//! trials running at once it suggests many configurations from the same
//! few observations. Limiting the live trials trades speed for better
//! suggestions, independently of how many trials the machine could run.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::searcher::{Searcher, Suggestion};
use crate::tune::saved::read_saved;

/// Wraps a searcher so that at most `max_concurrent` of the trials it
/// suggested are not yet complete; beyond that it answers
/// [`Suggestion::Wait`].
pub struct ConcurrencyLimiter {
    inner: Box<dyn Searcher>,
    max_concurrent: usize,
    /// Suggested and not yet complete; ordered so the saved state is stable.
    live: BTreeSet<String>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimiterState {
    live: BTreeSet<String>,
    inner: Value,
}

impl ConcurrencyLimiter {
    /// Limits `inner` to `max_concurrent` live trials (at least 1).
    pub fn new(inner: Box<dyn Searcher>, max_concurrent: usize) -> Result<Self, String> {
        if max_concurrent == 0 {
            return Err("search.max_concurrent must be at least 1".into());
        }
        Ok(Self {
            inner,
            max_concurrent,
            live: BTreeSet::new(),
        })
    }

    /// The trials suggested and not yet complete.
    pub fn live(&self) -> impl Iterator<Item = &str> {
        self.live.iter().map(String::as_str)
    }
}

impl Searcher for ConcurrencyLimiter {
    fn suggest(&mut self, trial_id: &str) -> Suggestion {
        if self.live.len() >= self.max_concurrent {
            return Suggestion::Wait;
        }
        let suggestion = self.inner.suggest(trial_id);
        if matches!(suggestion, Suggestion::Config(_)) {
            self.live.insert(trial_id.to_string());
        }
        suggestion
    }

    fn on_result(&mut self, trial_id: &str, result: &Map<String, Value>) {
        self.inner.on_result(trial_id, result);
    }

    fn on_trial_complete(
        &mut self,
        trial_id: &str,
        result: Option<&Map<String, Value>>,
        error: bool,
    ) {
        self.live.remove(trial_id);
        self.inner.on_trial_complete(trial_id, result, error);
    }

    fn on_trial_retry(&mut self, trial_id: &str) {
        // It counts against the limit again (a retry may exceed it for a
        // while: the trial already exists).
        self.live.insert(trial_id.to_string());
        self.inner.on_trial_retry(trial_id);
    }

    fn total(&self) -> Option<u64> {
        self.inner.total()
    }

    fn name(&self) -> &'static str {
        // The limit changes when trials start, not which configurations
        // they get: users know the search by the wrapped searcher's name.
        self.inner.name()
    }

    fn state(&self) -> Value {
        serde_json::json!(LimiterState {
            live: self.live.clone(),
            inner: self.inner.state(),
        })
    }

    fn restore_state(&mut self, state: &Value) -> Result<(), String> {
        let Some(saved) = read_saved::<LimiterState>(state, "concurrency-limiter")? else {
            return Ok(());
        };
        self.inner.restore_state(&saved.inner)?;
        self.live = saved.live;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tune::search::BasicVariant;
    use crate::tune::space::SearchSpace;
    use serde_json::json;

    fn limited(max: usize) -> ConcurrencyLimiter {
        let space = SearchSpace::from_json(&json!({"x": {"uniform": [0, 1]}})).unwrap();
        let inner = BasicVariant::random(&space, 5, 3).unwrap();
        ConcurrencyLimiter::new(Box::new(inner), max).unwrap()
    }

    fn is_config(s: &Suggestion) -> bool {
        matches!(s, Suggestion::Config(_))
    }

    #[test]
    fn waits_at_the_limit_and_releases_on_completion() {
        let mut s = limited(2);
        assert!(is_config(&s.suggest("a")));
        assert!(is_config(&s.suggest("b")));
        assert_eq!(s.suggest("c"), Suggestion::Wait);
        assert_eq!(s.suggest("c"), Suggestion::Wait, "waiting uses nothing up");
        s.on_trial_complete("a", None, true);
        assert!(is_config(&s.suggest("c")));
        assert_eq!(s.suggest("d"), Suggestion::Wait);
        assert_eq!(s.live().collect::<Vec<_>>(), ["b", "c"]);
        s.on_trial_complete("b", None, false);
        s.on_trial_complete("c", None, false);
        assert!(is_config(&s.suggest("d")));
        assert!(is_config(&s.suggest("e")));
        s.on_trial_complete("d", None, false);
        assert_eq!(s.suggest("f"), Suggestion::Finished, "5 samples in all");
        assert_eq!(s.live().collect::<Vec<_>>(), ["e"]);
    }

    /// A trial that failed and is retried counts against the limit again,
    /// so its real completion frees exactly one place.
    #[test]
    fn a_retried_trial_counts_until_it_completes_again() {
        let mut s = limited(1);
        assert!(is_config(&s.suggest("a")));
        s.on_trial_complete("a", None, true);
        s.on_trial_retry("a");
        assert_eq!(s.suggest("b"), Suggestion::Wait);
        s.on_trial_complete("a", None, false);
        assert!(is_config(&s.suggest("b")));
        assert_eq!(s.suggest("c"), Suggestion::Wait);
    }

    #[test]
    fn hands_out_the_wrapped_sequence_unchanged() {
        let space = SearchSpace::from_json(&json!({"x": {"uniform": [0, 1]}})).unwrap();
        let expected = space.generate(5, 3).unwrap();
        let mut s = limited(1);
        let mut got = Vec::new();
        for i in 0..5 {
            let id = format!("t{i}");
            match s.suggest(&id) {
                Suggestion::Config(config) => got.push(config),
                other => panic!("{other:?}"),
            }
            assert_eq!(s.suggest("next"), Suggestion::Wait);
            s.on_trial_complete(&id, None, false);
        }
        assert_eq!(got, expected);
        assert_eq!((s.total(), s.name()), (Some(5), "random"));
    }

    #[test]
    fn state_keeps_the_live_set_and_the_wrapped_state() {
        let mut s = limited(2);
        s.suggest("a");
        s.suggest("b");
        let state = s.state();
        assert_eq!(
            state,
            json!({"live": ["a", "b"], "inner": {"handed_out": 2}})
        );
        let mut resumed = limited(2);
        resumed.restore_state(&state).unwrap();
        assert_eq!(resumed.suggest("c"), Suggestion::Wait);
        resumed.on_trial_complete("b", None, false);
        s.on_trial_complete("b", None, false);
        assert_eq!(resumed.suggest("c"), s.suggest("c"));
        assert!(resumed.restore_state(&json!({"live": []})).is_err());
    }

    #[test]
    fn zero_is_not_a_limit() {
        let space = SearchSpace::default();
        let inner = BasicVariant::random(&space, 1, 0).unwrap();
        let message = ConcurrencyLimiter::new(Box::new(inner), 0).err().unwrap();
        assert_eq!(message, "search.max_concurrent must be at least 1");
    }
}
