//! Which of a result's values are metrics to plot, and under what names:
//! what the TensorBoard event files and MLflow both log.

use serde_json::{Map, Value};

/// A result's numeric metrics, named as TensorBoard's tags and MLflow's
/// metric keys, reused from one result to the next.
#[derive(Default)]
pub struct Scalars {
    values: Vec<(String, f64)>,
    len: usize,
}

/// Result fields that are not metrics (or are one already elsewhere: the
/// step is `training_iteration`), and counters that start again at every
/// restore and would draw a saw-tooth.
const NOT_SCALARS: &[&str] = &[
    "trial_id",
    "training_iteration",
    "timestamp",
    "date",
    "done",
    "config",
    "iterations_since_restore",
    "time_since_restore",
    "fuel_since_restore",
];

impl Scalars {
    /// Takes `result`'s numbers: top-level ones by their key, nested ones
    /// as `outer/inner` (TensorBoard groups tags by what precedes the
    /// first `/`), and with `config` those of its configuration as
    /// `config/name`. Booleans, strings, lists and non-finite values (which
    /// the result holds as strings or null) are left out.
    pub fn fill(&mut self, result: &Map<String, Value>, config: bool) {
        self.len = 0;
        let mut path = String::new();
        for (key, value) in result {
            if NOT_SCALARS.contains(&key.as_str()) && !(config && key == "config") {
                continue;
            }
            path.clear();
            path.push_str(key);
            self.take(&mut path, value);
        }
    }

    fn take(&mut self, path: &mut String, value: &Value) {
        match value {
            Value::Number(n) => {
                let Some(x) = n.as_f64() else { return };
                if self.len == self.values.len() {
                    self.values.push(Default::default());
                }
                let slot = &mut self.values[self.len];
                self.len += 1;
                slot.0.clear();
                slot.0.push_str(path);
                slot.1 = x;
            }
            Value::Object(map) => {
                for (key, inner) in map {
                    let len = path.len();
                    path.push('/');
                    path.push_str(key);
                    self.take(path, inner);
                    path.truncate(len);
                }
            }
            _ => {}
        }
    }

    /// The tags and values taken by the last [`Scalars::fill`].
    pub fn as_slice(&self) -> &[(String, f64)] {
        &self.values[..self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn scalars_are_the_numeric_metrics() {
        let result = json!({"loss": 0.5, "acc": 1, "ok": true, "name": "x", "nan": null,
            "nested": {"a": 2.0, "b": {"c": 3}}, "training_iteration": 4, "done": false,
            "config": {"lr": 0.1}, "fuel_total": 123, "time_since_restore": 1.0});
        let mut scalars = Scalars::default();
        scalars.fill(result.as_object().unwrap(), false);
        let tags: Vec<(&str, f64)> = scalars
            .as_slice()
            .iter()
            .map(|(t, x)| (t.as_str(), *x))
            .collect();
        assert_eq!(
            tags,
            [
                ("loss", 0.5),
                ("acc", 1.0),
                ("nested/a", 2.0),
                ("nested/b/c", 3.0),
                ("fuel_total", 123.0)
            ]
        );
        scalars.fill(result.as_object().unwrap(), true);
        assert_eq!(scalars.as_slice()[4], ("config/lr".to_string(), 0.1));
    }
}
