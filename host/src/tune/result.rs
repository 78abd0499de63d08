//! Result records: a step's metrics plus the fields wtune fills in, named as
//! Ray Tune users know them.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Number, Value};

use super::backend::Step;
use super::trial::Trial;

/// Fields wtune adds to every result; trainables may not report these names.
pub const AUTO_FIELDS: [&str; 13] = [
    "trial_id",
    "training_iteration",
    "time_this_iter_s",
    "time_total_s",
    "fuel_this_iter",
    "fuel_total",
    "iterations_since_restore",
    "time_since_restore",
    "fuel_since_restore",
    "timestamp",
    "date",
    "done",
    "config",
];

/// Whether the experiment's metric is minimized or maximized.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Lower is better (losses).
    Min,
    /// Higher is better (accuracies). The default.
    #[default]
    Max,
}

impl Mode {
    /// True when `a` is strictly better than `b` under this mode.
    pub fn better(self, a: f64, b: f64) -> bool {
        match self {
            Mode::Min => a < b,
            Mode::Max => a > b,
        }
    }
}

impl FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "min" => Ok(Mode::Min),
            "max" => Ok(Mode::Max),
            other => Err(format!("mode must be \"min\" or \"max\", got {other:?}")),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Min => "min",
            Mode::Max => "max",
        })
    }
}

/// Builds the record for `trial`'s next result (the trial's counters are
/// those *after* the step) and checks the metric names.
pub(crate) fn record(
    trial: &Trial,
    step: &Step,
    time_this_iter: Duration,
    done: bool,
) -> Result<Map<String, Value>, String> {
    let mut out = Map::with_capacity(step.metrics.len() + AUTO_FIELDS.len());
    for (name, value) in &step.metrics {
        if AUTO_FIELDS.contains(&name.as_str()) {
            return Err(format!(
                "the trainable reported a metric named `{name}`, which wtune fills in itself; rename it"
            ));
        }
        // JSON has no NaN or infinity; they become null (pandas reads NaN).
        out.insert(
            name.clone(),
            Number::from_f64(*value).map_or(Value::Null, Value::Number),
        );
    }
    let now = SystemTime::now();
    out.insert("trial_id".into(), trial.trial_id.clone().into());
    out.insert("training_iteration".into(), trial.iterations.into());
    out.insert("time_this_iter_s".into(), seconds(time_this_iter));
    out.insert("time_total_s".into(), float(trial.time_total_s));
    out.insert("fuel_this_iter".into(), step.fuel.into());
    out.insert("fuel_total".into(), trial.fuel_total.into());
    out.insert(
        "iterations_since_restore".into(),
        trial.iterations_since_restore.into(),
    );
    out.insert("time_since_restore".into(), float(trial.time_since_restore));
    out.insert("fuel_since_restore".into(), trial.fuel_since_restore.into());
    out.insert(
        "timestamp".into(),
        now.duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
            .into(),
    );
    out.insert(
        "date".into(),
        humantime::format_rfc3339_seconds(now).to_string().into(),
    );
    out.insert("done".into(), done.into());
    out.insert("config".into(), trial.config.clone());
    Ok(out)
}

fn seconds(d: Duration) -> Value {
    float(d.as_secs_f64())
}

fn float(x: f64) -> Value {
    Number::from_f64(x).map_or(Value::Null, Value::Number)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn trial() -> Trial {
        let mut t = Trial::new("trial_0001".into(), json!({"lr": 0.1}), "/tmp/x".into());
        t.iterations = 3;
        t.fuel_total = 1000;
        t
    }

    #[test]
    fn records_carry_metrics_then_auto_fields() {
        let step = Step {
            metrics: vec![("loss".into(), 0.5), ("weird".into(), f64::NAN)],
            done: false,
            fuel: 10,
        };
        let r = record(&trial(), &step, Duration::from_millis(1500), true).unwrap();
        assert_eq!(r["loss"], json!(0.5));
        assert_eq!(r["weird"], Value::Null);
        assert_eq!(r["training_iteration"], json!(3));
        assert_eq!(r["time_this_iter_s"], json!(1.5));
        assert_eq!(r["fuel_this_iter"], json!(10));
        assert_eq!(r["fuel_total"], json!(1000));
        assert_eq!(r["done"], json!(true));
        assert_eq!(r["config"], json!({"lr": 0.1}));
        for field in AUTO_FIELDS {
            assert!(r.contains_key(field), "{field}");
        }
        assert_eq!(r.keys().next().unwrap(), "loss", "metrics come first");
    }

    #[test]
    fn reserved_metric_names_are_refused() {
        let step = Step {
            metrics: vec![("training_iteration".into(), 1.0)],
            done: false,
            fuel: 0,
        };
        let message = record(&trial(), &step, Duration::ZERO, false).unwrap_err();
        assert!(message.contains("`training_iteration`"), "{message}");
    }
}
