//! Per-trial stopping criteria, checked after every result.
//!
//! In the experiment file:
//! ```toml
//! [stop]
//! training_iteration = 20          # at most 20 iterations
//! time_total_s = 300               # at most 5 minutes of training
//! fuel_total = 5e10                # at most this much fuel
//! val_accuracy = 0.98              # a metric reaching 0.98 (>=), as in Ray Tune
//! train_loss = { at_most = 0.01 }  # a metric falling to 0.01 (<=)
//! ```

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A threshold on a reported metric.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Bound {
    /// Stop once the metric is `>=` this.
    AtLeast(f64),
    /// Stop once the metric is `<=` this.
    AtMost(f64),
}

/// A metric threshold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Threshold {
    /// The metric's name.
    pub metric: String,
    /// When it stops the trial.
    pub bound: Bound,
}

/// All of a trial's stopping criteria; any one reached stops it.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct StopCriteria {
    /// Stop after this many iterations.
    pub training_iteration: Option<u64>,
    /// Stop once this much training time has passed.
    pub time_total_s: Option<f64>,
    /// Stop once this much fuel is burned.
    pub fuel_total: Option<u64>,
    /// Stop when a metric crosses a threshold.
    pub thresholds: Vec<Threshold>,
}

impl StopCriteria {
    /// Parses a `[stop]` table given as JSON.
    pub fn from_json(table: &Map<String, Value>) -> Result<Self, String> {
        let mut criteria = StopCriteria::default();
        for (key, value) in table {
            let path = format!("stop.{key}");
            match key.as_str() {
                "training_iteration" => {
                    criteria.training_iteration = Some(positive_int(value, &path)?)
                }
                "fuel_total" => criteria.fuel_total = Some(positive_int(value, &path)?),
                "time_total_s" => criteria.time_total_s = Some(positive_number(value, &path)?),
                metric => criteria.thresholds.push(Threshold {
                    metric: metric.to_string(),
                    bound: bound(value, &path)?,
                }),
            }
        }
        Ok(criteria)
    }

    /// These criteria with `newer`'s over them: each limit `newer` sets
    /// replaces this one's, and its thresholds replace those on the same
    /// metric.
    pub fn merged(&self, newer: &StopCriteria) -> StopCriteria {
        let mut thresholds: Vec<Threshold> = self
            .thresholds
            .iter()
            .filter(|t| !newer.thresholds.iter().any(|n| n.metric == t.metric))
            .cloned()
            .collect();
        thresholds.extend(newer.thresholds.iter().cloned());
        StopCriteria {
            training_iteration: newer.training_iteration.or(self.training_iteration),
            time_total_s: newer.time_total_s.or(self.time_total_s),
            fuel_total: newer.fuel_total.or(self.fuel_total),
            thresholds,
        }
    }

    /// Metrics the criteria need the trainable to report.
    pub fn metrics(&self) -> impl Iterator<Item = &str> {
        self.thresholds.iter().map(|t| t.metric.as_str())
    }

    /// Whether `result` holds every metric a threshold names: the error
    /// [`StopCriteria::reached`] gives for the first it lacks, whichever
    /// criteria `result` meets.
    pub fn check_metrics(&self, result: &Map<String, Value>) -> Result<(), String> {
        match self
            .thresholds
            .iter()
            .find(|t| !result.contains_key(&t.metric))
        {
            Some(t) => Err(unreported(&t.metric, result)),
            None => Ok(()),
        }
    }

    /// The first criterion `result` meets, as a reason like
    /// `"training_iteration reached 20"`, or `Ok(None)`. A threshold on a
    /// metric that the result lacks is an error: most likely a typo.
    pub fn reached(&self, result: &Map<String, Value>) -> Result<Option<String>, String> {
        let number = |name: &str| result.get(name).and_then(Value::as_f64);
        if let (Some(limit), Some(it)) = (self.training_iteration, number("training_iteration"))
            && it >= limit as f64
        {
            return Ok(Some(format!("training_iteration reached {limit}")));
        }
        if let (Some(limit), Some(t)) = (self.time_total_s, number("time_total_s"))
            && t >= limit
        {
            return Ok(Some(format!("time_total_s reached {limit}")));
        }
        if let (Some(limit), Some(f)) = (self.fuel_total, number("fuel_total"))
            && f >= limit as f64
        {
            return Ok(Some(format!("fuel_total reached {limit}")));
        }
        for t in &self.thresholds {
            let Some(entry) = result.get(&t.metric) else {
                return Err(unreported(&t.metric, result));
            };
            let Some(value) = entry.as_f64() else {
                continue;
            };
            match t.bound {
                Bound::AtLeast(x) if value >= x => {
                    return Ok(Some(format!("{} reached {x} (>=)", t.metric)));
                }
                Bound::AtMost(x) if value <= x => {
                    return Ok(Some(format!("{} reached {x} (<=)", t.metric)));
                }
                _ => {}
            }
        }
        Ok(None)
    }
}

fn positive_int(value: &Value, path: &str) -> Result<u64, String> {
    let n = value
        .as_f64()
        .filter(|x| *x >= 1.0 && x.fract() == 0.0 && *x < 1.8e19);
    n.map(|x| x as u64)
        .ok_or_else(|| format!("{path} must be a positive whole number, got {value}"))
}

fn positive_number(value: &Value, path: &str) -> Result<f64, String> {
    value
        .as_f64()
        .filter(|x| x.is_finite() && *x > 0.0)
        .ok_or_else(|| format!("{path} must be a positive number, got {value}"))
}

fn bound(value: &Value, path: &str) -> Result<Bound, String> {
    let finite = |v: &Value| v.as_f64().filter(|x| x.is_finite());
    if let Some(x) = finite(value) {
        return Ok(Bound::AtLeast(x));
    }
    if let Value::Object(map) = value
        && map.len() == 1
    {
        if let Some(x) = map.get("at_least").and_then(finite) {
            return Ok(Bound::AtLeast(x));
        }
        if let Some(x) = map.get("at_most").and_then(finite) {
            return Ok(Bound::AtMost(x));
        }
    }
    Err(format!(
        "{path} must be a number (stop when the metric is >= it), {{ at_least = x }} or {{ at_most = x }}, got {value}"
    ))
}

/// The error for a threshold on `metric`, which `result` lacks.
fn unreported(metric: &str, result: &Map<String, Value>) -> String {
    let reported: Vec<&str> = result
        .keys()
        .map(String::as_str)
        .filter(|k| !super::AUTO_FIELDS.contains(k))
        .collect();
    format!(
        "stop criterion `{metric}` names a metric the trainable does not report (it reports: {})",
        reported.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn criteria(v: Value) -> Result<StopCriteria, String> {
        StopCriteria::from_json(v.as_object().unwrap())
    }

    fn result(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn iteration_fuel_time_and_thresholds() {
        let c = criteria(json!({
            "training_iteration": 5, "fuel_total": 1e6, "time_total_s": 2.5,
            "acc": 0.9, "loss": {"at_most": 0.1}
        }))
        .unwrap();
        let base = json!({"training_iteration": 1, "fuel_total": 10, "time_total_s": 0.1, "acc": 0.5, "loss": 1.0});
        assert_eq!(c.reached(&result(base.clone())).unwrap(), None);
        let mut r = result(base);
        r.insert("training_iteration".into(), json!(5));
        assert_eq!(
            c.reached(&r).unwrap().unwrap(),
            "training_iteration reached 5"
        );
        let r = result(
            json!({"training_iteration": 1, "fuel_total": 10, "time_total_s": 0.1, "acc": 0.95, "loss": 1.0}),
        );
        assert_eq!(c.reached(&r).unwrap().unwrap(), "acc reached 0.9 (>=)");
        let r = result(
            json!({"training_iteration": 1, "fuel_total": 10, "time_total_s": 0.1, "acc": 0.5, "loss": 0.05}),
        );
        assert_eq!(c.reached(&r).unwrap().unwrap(), "loss reached 0.1 (<=)");
        let r = result(
            json!({"training_iteration": 1, "fuel_total": 2000000, "time_total_s": 0.1, "acc": 0.5, "loss": 1.0}),
        );
        assert_eq!(
            c.reached(&r).unwrap().unwrap(),
            "fuel_total reached 1000000"
        );
    }

    #[test]
    fn missing_metric_is_an_error_naming_what_is_reported() {
        let c = criteria(json!({"accuracy": 0.9})).unwrap();
        let message = c
            .reached(&result(json!({"acc": 0.5, "training_iteration": 1})))
            .unwrap_err();
        assert!(
            message.contains("`accuracy`") && message.contains("reports: acc"),
            "{message}"
        );
    }

    #[test]
    fn bad_values_are_refused() {
        assert!(
            criteria(json!({"training_iteration": 0}))
                .unwrap_err()
                .contains("positive whole number")
        );
        assert!(criteria(json!({"training_iteration": 2.5})).is_err());
        assert!(
            criteria(json!({"time_total_s": -1}))
                .unwrap_err()
                .contains("positive number")
        );
        assert!(
            criteria(json!({"acc": "high"}))
                .unwrap_err()
                .contains("at_least")
        );
        assert!(criteria(json!({"acc": {"above": 1}})).is_err());
    }
}
