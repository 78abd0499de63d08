//! A searcher over a list of configurations fixed in advance.

use serde_json::{Map, Value};

use super::searcher::{Searcher, Suggestion};

/// Hands out the given configurations in order, then finishes. What a
/// [`RunSpec`](crate::tune::RunSpec)'s `configs` become when no other
/// searcher is given; also what a resumed experiment uses when its state
/// predates searchers.
#[derive(Debug, Clone, Default)]
pub struct Listed {
    configs: Vec<Value>,
    /// How many trials: `configs.len()`, or with one config repeated
    /// ([`Listed::repeated`]) the repeats, which are not held one by one.
    count: usize,
    next: usize,
}

impl Listed {
    /// A searcher that suggests `configs`, one trial each.
    pub fn new(configs: Vec<Value>) -> Self {
        let count = configs.len();
        Self {
            configs,
            count,
            next: 0,
        }
    }

    /// A searcher that suggests `config` for `count` trials, holding it
    /// once: what a run continuing a host snapshot (`restore_from`, whose
    /// configuration is the snapshot's) samples.
    pub fn repeated(config: Value, count: usize) -> Self {
        Self {
            configs: vec![config],
            count,
            next: 0,
        }
    }

    /// Passes over the next `count` configs (trials that already exist).
    pub fn skip(&mut self, count: usize) {
        self.next = self.next.saturating_add(count).min(self.count);
    }
}

impl Searcher for Listed {
    fn suggest(&mut self, _trial_id: &str) -> Suggestion {
        if self.next >= self.count {
            return Suggestion::Finished;
        }
        // Repeated, every trial takes the one config there is.
        let config = &self.configs[self.next.min(self.configs.len() - 1)];
        self.next += 1;
        Suggestion::Config(config.clone())
    }

    fn on_trial_complete(&mut self, _: &str, _: Option<&Map<String, Value>>, _: bool) {}

    fn total(&self) -> Option<u64> {
        Some(self.count as u64)
    }

    fn name(&self) -> &'static str {
        "listed"
    }

    fn state(&self) -> Value {
        Value::from(self.next)
    }

    fn restore_state(&mut self, state: &Value) -> Result<(), String> {
        let next = state
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .filter(|&n| n <= self.count)
            .ok_or_else(|| {
                format!(
                    "the listed searcher's state must be a count of at most {}; got {state}",
                    self.count
                )
            })?;
        self.next = next;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn hands_out_each_config_once_and_resumes_where_it_stopped() {
        let mut listed = Listed::new(vec![json!({"a": 1}), json!({"a": 2})]);
        assert_eq!(listed.total(), Some(2));
        assert_eq!(listed.suggest("t0"), Suggestion::Config(json!({"a": 1})));
        let mut resumed = Listed::new(vec![json!({"a": 1}), json!({"a": 2})]);
        resumed.restore_state(&listed.state()).unwrap();
        assert_eq!(resumed.suggest("t1"), Suggestion::Config(json!({"a": 2})));
        assert_eq!(resumed.suggest("t2"), Suggestion::Finished);
        let err = resumed.restore_state(&json!(3)).unwrap_err();
        assert!(err.contains("at most 2"), "{err}");
    }

    #[test]
    fn a_repeated_config_is_held_once_and_handed_out_count_times() {
        let mut listed = Listed::repeated(json!({"a": 1}), 3);
        assert_eq!(listed.total(), Some(3));
        listed.skip(1);
        assert_eq!(listed.suggest("t1"), Suggestion::Config(json!({"a": 1})));
        let mut resumed = Listed::repeated(json!({"a": 1}), 3);
        resumed.restore_state(&listed.state()).unwrap();
        assert_eq!(resumed.suggest("t2"), Suggestion::Config(json!({"a": 1})));
        assert_eq!(resumed.suggest("t3"), Suggestion::Finished);
        assert_eq!(
            Listed::repeated(json!({}), 0).suggest("t0"),
            Suggestion::Finished
        );
        // Ten billion trials cost no more memory than one.
        assert_eq!(
            Listed::repeated(json!({"a": 1}), 10_000_000_000).total(),
            Some(10_000_000_000)
        );
    }
}
