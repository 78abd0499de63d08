//! Test helpers the model-based searchers' tests share.

use serde_json::{Map, Value, json};

use super::searcher::{Searcher, Suggestion};

/// A result at `training_iteration` `iteration` with metric `loss`.
pub(super) fn at_iteration(iteration: u64, loss: f64) -> Map<String, Value> {
    json!({"training_iteration": iteration, "loss": loss})
        .as_object()
        .unwrap()
        .clone()
}

/// Starts `trials` trials over a space `{"x": uniform [0, 1]}`; each
/// reports only its first iteration, loss `|x - 0.3|`, and none finishes,
/// as under ASHA before the first promotion. Returns the mean loss of the
/// trials after the first `skip`: small when the searcher learns from the
/// first rung, about 0.29 when it draws at random.
pub(super) fn first_rung_spread(searcher: &mut dyn Searcher, trials: usize, skip: usize) -> f64 {
    (0..trials)
        .map(|i| {
            let id = format!("trial_{i:04}");
            let Suggestion::Config(c) = searcher.suggest(&id) else {
                panic!("a configuration");
            };
            let loss = (c["x"].as_f64().unwrap() - 0.3).abs();
            searcher.on_result(&id, &at_iteration(1, loss));
            loss
        })
        .skip(skip)
        .sum::<f64>()
        / (trials - skip) as f64
}
