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
    next: usize,
}

impl Listed {
    /// A searcher that suggests `configs`, one trial each.
    pub fn new(configs: Vec<Value>) -> Self {
        Self { configs, next: 0 }
    }

    /// Passes over the next `count` configs (trials that already exist).
    pub fn skip(&mut self, count: usize) {
        self.next = self.next.saturating_add(count).min(self.configs.len());
    }
}

impl Searcher for Listed {
    fn suggest(&mut self, _trial_id: &str) -> Suggestion {
        match self.configs.get(self.next) {
            Some(config) => {
                self.next += 1;
                Suggestion::Config(config.clone())
            }
            None => Suggestion::Finished,
        }
    }

    fn on_trial_complete(&mut self, _: &str, _: Option<&Map<String, Value>>, _: bool) {}

    fn total(&self) -> Option<u64> {
        Some(self.configs.len() as u64)
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
            .filter(|&n| n <= self.configs.len())
            .ok_or_else(|| {
                format!(
                    "the listed searcher's state must be a count of at most {}; got {state}",
                    self.configs.len()
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
}
