//! Random and grid search (Ray Tune's `BasicVariantGenerator`): a fixed
//! sequence of configurations that results do not change.
//!
//! Random search (`search = "random"`, the default) hands out exactly what
//! [`SearchSpace::generate`] returns, in the same order, so experiments keep
//! their configurations whichever way trials are created. Grid search
//! (`search = "grid"`) walks [`SearchSpace::enumerated`]: every `choice` is
//! tried, and continuous domains too when `points` is given.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::searcher::{Searcher, Suggestion};
use crate::tune::saved::read_saved;
use crate::tune::space::{Configs, SearchSpace, SpaceError};

/// Random or grid search: configurations drawn lazily, one per suggestion.
#[derive(Debug, Clone)]
pub struct BasicVariant {
    name: &'static str,
    /// The sequence before anything was handed out, kept so that a restore
    /// can regenerate it.
    start: Configs,
    configs: Configs,
}

/// What [`BasicVariant`] saves: the configurations are a function of the
/// space, `num_samples` and the seed, so only the position is needed.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct BasicState {
    handed_out: u64,
}

impl BasicVariant {
    /// Random search: `num_samples` x the full grid, random domains drawn
    /// afresh per trial from a generator seeded with `seed`.
    pub fn random(space: &SearchSpace, num_samples: u64, seed: u64) -> Result<Self, SpaceError> {
        Ok(Self::over(space.configs(num_samples, seed)?, "random"))
    }

    /// Grid search: the grid of [`SearchSpace::enumerated`] with `points`,
    /// repeated `num_samples` times. An error names the first parameter that
    /// cannot be enumerated.
    pub fn grid(
        space: &SearchSpace,
        num_samples: u64,
        points: Option<usize>,
    ) -> Result<Self, SpaceError> {
        // Nothing random is left in an enumerated space, so the seed does
        // not matter.
        let configs = space.enumerated(points)?.configs(num_samples, 0)?;
        Ok(Self::over(configs, "grid"))
    }

    fn over(configs: Configs, name: &'static str) -> Self {
        Self {
            name,
            start: configs.clone(),
            configs,
        }
    }
}

impl Searcher for BasicVariant {
    fn suggest(&mut self, _trial_id: &str) -> Suggestion {
        match self.configs.next() {
            Some(config) => Suggestion::Config(config),
            None => Suggestion::Finished,
        }
    }

    fn on_trial_complete(&mut self, _: &str, _: Option<&Map<String, Value>>, _: bool) {}

    fn total(&self) -> Option<u64> {
        Some(self.configs.total())
    }

    fn name(&self) -> &'static str {
        self.name
    }

    fn state(&self) -> Value {
        serde_json::json!(BasicState {
            handed_out: self.configs.position(),
        })
    }

    fn restore_state(&mut self, state: &Value) -> Result<(), String> {
        let what = format!("{} search", self.name);
        let Some(saved) = read_saved::<BasicState>(state, &what)? else {
            return Ok(());
        };
        let total = self.start.total();
        if saved.handed_out > total {
            return Err(format!(
                "the saved {} search state handed out {} configurations, but this search has \
                 only {total}; was the search space or num_samples changed?",
                self.name, saved.handed_out
            ));
        }
        let mut configs = self.start.clone();
        configs.skip_configs(saved.handed_out);
        self.configs = configs;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn space(value: Value) -> SearchSpace {
        SearchSpace::from_json(&value).unwrap()
    }

    fn drain(searcher: &mut dyn Searcher) -> Vec<Value> {
        let mut out = Vec::new();
        loop {
            match searcher.suggest(&format!("trial_{}", out.len())) {
                Suggestion::Config(config) => out.push(config),
                Suggestion::Finished => return out,
                Suggestion::Wait => panic!("basic searchers never wait"),
            }
        }
    }

    fn mixed() -> SearchSpace {
        space(json!({
            "lr": {"loguniform": [1e-4, 1e-1]},
            "layers": {"grid_search": [1, 2, 3]},
            "act": {"choice": ["relu", "tanh"]},
        }))
    }

    #[test]
    fn random_search_hands_out_what_generate_returns() {
        let s = mixed();
        let mut searcher = BasicVariant::random(&s, 4, 21).unwrap();
        assert_eq!(searcher.total(), Some(12));
        assert_eq!(searcher.name(), "random");
        assert_eq!(drain(&mut searcher), s.generate(4, 21).unwrap());
        assert_eq!(searcher.suggest("again"), Suggestion::Finished);
    }

    #[test]
    fn random_search_resumes_where_it_stopped() {
        let s = mixed();
        let all = s.generate(4, 21).unwrap();
        let mut first = BasicVariant::random(&s, 4, 21).unwrap();
        for _ in 0..5 {
            first.suggest("t");
        }
        let state = serde_json::from_str(&first.state().to_string()).unwrap();
        assert_eq!(state, json!({"handed_out": 5}));
        let mut resumed = BasicVariant::random(&s, 4, 21).unwrap();
        resumed.restore_state(&state).unwrap();
        assert_eq!(drain(&mut resumed), all[5..]);
        assert_eq!(drain(&mut first), all[5..]);
    }

    #[test]
    fn restoring_thousands_of_handed_out_configs_is_quick() {
        let s = mixed();
        let mut searcher = BasicVariant::random(&s, 5000, 2).unwrap();
        let started = std::time::Instant::now();
        searcher
            .restore_state(&json!({"handed_out": 14_999}))
            .unwrap();
        assert!(started.elapsed().as_secs_f64() < 1.0);
        let last = s.configs(5000, 2).unwrap().last().unwrap();
        assert_eq!(searcher.suggest("t"), Suggestion::Config(last));
        assert_eq!(searcher.suggest("t"), Suggestion::Finished);
    }

    #[test]
    fn bad_saved_states_are_refused() {
        let mut searcher = BasicVariant::random(&mixed(), 1, 0).unwrap();
        let message = searcher
            .restore_state(&json!({"handed_out": 7}))
            .unwrap_err();
        assert!(message.contains("only 3"), "{message}");
        assert!(searcher.restore_state(&json!({"count": 1})).is_err());
        searcher.restore_state(&Value::Null).unwrap();
        assert_eq!(drain(&mut searcher).len(), 3);
    }

    #[test]
    fn grid_search_enumerates_choices_and_points() {
        let s = space(json!({
            "act": {"choice": ["relu", "tanh"]},
            "layers": {"grid_search": [1, 2, 3]},
            "lr": {"loguniform": [1e-3, 1e-1]},
            "n": {"randint": [0, 2]},
        }));
        let mut searcher = BasicVariant::grid(&s, 2, Some(3)).unwrap();
        // 2 choices x 3 grid values x 3 points x 2 integers, twice.
        assert_eq!(searcher.total(), Some(72));
        assert_eq!(searcher.name(), "grid");
        let configs = drain(&mut searcher);
        assert_eq!(configs.len(), 72);
        assert_eq!(configs[..36], configs[36..], "num_samples repeats the grid");
        let distinct: std::collections::BTreeSet<String> =
            configs.iter().map(Value::to_string).collect();
        assert_eq!(distinct.len(), 36);
        assert_eq!(configs[0]["act"], json!("relu"));
        assert_eq!(configs[35]["act"], json!("tanh"));
    }

    #[test]
    fn grid_search_resumes_and_ignores_the_seed() {
        let s = space(json!({"a": {"choice": [1, 2, 3]}, "b": {"uniform": [0, 1]}}));
        let mut first = BasicVariant::grid(&s, 1, Some(4)).unwrap();
        first.suggest("t");
        first.suggest("t");
        let mut resumed = BasicVariant::grid(&s, 1, Some(4)).unwrap();
        resumed.restore_state(&first.state()).unwrap();
        assert_eq!(drain(&mut resumed), drain(&mut first));
        assert_eq!(
            drain(&mut BasicVariant::grid(&s, 1, Some(4)).unwrap()).len(),
            12
        );
    }

    #[test]
    fn grid_search_refuses_continuous_domains_without_points() {
        let s = space(json!({"lr": {"uniform": [0, 1]}}));
        let message = BasicVariant::grid(&s, 1, None).unwrap_err().to_string();
        assert_eq!(
            message,
            "param_space.lr: grid search cannot enumerate a uniform domain; give `points` in \
             [search] or use grid_search/choice"
        );
    }
}
