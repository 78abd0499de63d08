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

    /// The index of the best of `values` (finite ones only; the first of
    /// equals), `None` when none is finite: how trials are ranked.
    pub fn best_index(self, values: impl IntoIterator<Item = Option<f64>>) -> Option<usize> {
        let mut best: Option<(usize, f64)> = None;
        for (i, value) in values.into_iter().enumerate() {
            let Some(value) = value.filter(|v| v.is_finite()) else {
                continue;
            };
            if best.is_none_or(|(_, b)| self.better(value, b)) {
                best = Some((i, value));
            }
        }
        best.map(|(i, _)| i)
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

/// Names under which wtune writes something of its own: the flattened
/// configuration (`progress.csv`, TensorBoard, MLflow), and TensorBoard's
/// hparams records (a metric there would take the tag of the trial's
/// session end).
const RESERVED_PREFIXES: &[&str] = &["config/", "_hparams_/"];

/// First characters that make a spreadsheet read a cell as a formula
/// (OWASP's list for CSV injection, less the control characters a name
/// may not hold anyway).
const FORMULA_STARTS: [char; 4] = ['=', '+', '-', '@'];

/// Refuses a step whose metrics use one of the [`AUTO_FIELDS`] names, or
/// a name under one of the reserved prefixes, where it would share a
/// column, tag or key with what wtune writes itself; and a name starting
/// like a formula: `progress.csv`'s header holds the names, and a
/// spreadsheet opening it would run what an untrusted trainable wrote.
pub fn check_metric_names(metrics: &[(String, f64)]) -> Result<(), String> {
    for (name, _) in metrics {
        if AUTO_FIELDS.contains(&name.as_str())
            || RESERVED_PREFIXES.iter().any(|p| name.starts_with(p))
        {
            return Err(format!(
                "the trainable reported a metric named `{name}`, which wtune fills in itself; \
                 rename it"
            ));
        }
        if name.starts_with(FORMULA_STARTS) {
            return Err(format!(
                "the trainable reported a metric named `{name}`; names may not start with \
                 `=`, `+`, `-` or `@`, which make spreadsheets opening progress.csv run the \
                 name as a formula"
            ));
        }
    }
    Ok(())
}

/// Builds the record for `trial`'s next result (the trial's counters are
/// those *after* the step) and checks the metric names.
///
/// `reuse` is an earlier record to overwrite: when it has the same fields
/// in the same order (the usual case: a trainable reports the same metrics
/// every step), its keys and unchanged values are kept, which spares the
/// runner's thread most of a record's allocations at high result rates.
pub(crate) fn record(
    trial: &Trial,
    step: &Step,
    time_this_iter: Duration,
    done: bool,
    reuse: Option<Map<String, Value>>,
) -> Result<Map<String, Value>, String> {
    check_metric_names(&step.metrics)?;
    let now = SystemTime::now();
    let timestamp = now
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let date = || Value::from(humantime::format_rfc3339_seconds(now).to_string());
    let auto = |field: &str| -> Value {
        match field {
            "trial_id" => trial.trial_id.clone().into(),
            "training_iteration" => trial.iterations.into(),
            "time_this_iter_s" => seconds(time_this_iter),
            "time_total_s" => float(trial.time_total_s),
            "fuel_this_iter" => step.fuel.into(),
            "fuel_total" => trial.fuel_total.into(),
            "iterations_since_restore" => trial.iterations_since_restore.into(),
            "time_since_restore" => float(trial.time_since_restore),
            "fuel_since_restore" => trial.fuel_since_restore.into(),
            "timestamp" => timestamp.into(),
            "date" => date(),
            "done" => done.into(),
            "config" => trial.config.clone(),
            other => unreachable!("`{other}` is not an auto field"),
        }
    };
    if let Some(mut out) = reuse
        && same_fields(&out, step)
    {
        let mut values = out.values_mut();
        for ((_, value), slot) in step.metrics.iter().zip(&mut values) {
            *slot = metric_value(*value);
        }
        let mut previous_timestamp = None;
        for (field, slot) in AUTO_FIELDS.iter().zip(values) {
            match *field {
                // Kept when equal: they are strings and trees, rarely new.
                "trial_id" if slot.as_str() == Some(&trial.trial_id) => {}
                "config" if *slot == trial.config => {}
                "timestamp" => {
                    previous_timestamp = slot.as_u64();
                    *slot = timestamp.into();
                }
                // The date has whole seconds: the same second, the same text.
                "date" if previous_timestamp == Some(timestamp) && slot.is_string() => {}
                _ => *slot = auto(field),
            }
        }
        return Ok(out);
    }
    let mut out = Map::with_capacity(step.metrics.len() + AUTO_FIELDS.len());
    for (name, value) in &step.metrics {
        out.insert(name.clone(), metric_value(*value));
    }
    for field in AUTO_FIELDS {
        out.insert(field.to_string(), auto(field));
    }
    Ok(out)
}

/// Whether `record` has `step`'s metrics and then the auto fields, in
/// that order and no others.
fn same_fields(record: &Map<String, Value>, step: &Step) -> bool {
    record.len() == step.metrics.len() + AUTO_FIELDS.len()
        && record.keys().map(String::as_str).eq(step
            .metrics
            .iter()
            .map(|(name, _)| name.as_str())
            .chain(AUTO_FIELDS))
}

fn seconds(d: Duration) -> Value {
    float(d.as_secs_f64())
}

/// A metric as a JSON value. JSON has no NaN or infinities, so they are
/// written as the strings `"NaN"`, `"Infinity"` and `"-Infinity"` (as
/// JavaScript and Python print them; pandas' `read_csv` parses them back),
/// keeping the three apart. [`Trial::metric`] reads them as unreported
/// (such a value is never the best trial); the schedulers that rank
/// trials (ASHA, HyperBand, PBT) read the infinities back
/// ([`metric_number`]), so that a diverged trial ranks worst. The median
/// rule, which averages results, leaves them out as unreported.
pub fn metric_value(x: f64) -> Value {
    match Number::from_f64(x) {
        Some(number) => Value::Number(number),
        None if x.is_nan() => Value::from("NaN"),
        None if x > 0.0 => Value::from("Infinity"),
        None => Value::from("-Infinity"),
    }
}

/// A metric as a number, [`metric_value`] undone for the infinities: a
/// loss that diverged to `"Infinity"` ranks worst under `min` (and a trial
/// reporting it is stopped as any bad one is), as it would in Ray Tune.
/// `None` for NaN, a missing value or one that is not a number.
pub fn metric_number(value: &Value) -> Option<f64> {
    match value {
        Value::String(s) if s == "Infinity" => Some(f64::INFINITY),
        Value::String(s) if s == "-Infinity" => Some(f64::NEG_INFINITY),
        other => other.as_f64(),
    }
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
    fn names_wtune_writes_itself_are_refused() {
        let named = |name: &str| check_metric_names(&[("loss".into(), 1.0), (name.into(), 2.0)]);
        for taken in [
            "training_iteration",
            "config",
            "config/lr",
            "config/net/width",
        ] {
            let error = named(taken).unwrap_err();
            assert!(error.contains(&format!("`{taken}`")), "{error}");
        }
        for formula in ["=HYPERLINK(\"http://x\")", "+1", "-loss", "@SUM(A1)"] {
            let error = named(formula).unwrap_err();
            assert!(error.contains("as a formula"), "{error}");
        }
        for free in ["configured", "val/config/lr", "accuracy", "loss-1", "a=b"] {
            assert_eq!(named(free), Ok(()), "{free}");
        }
    }

    #[test]
    fn records_carry_metrics_then_auto_fields() {
        let step = Step {
            metrics: vec![
                ("loss".into(), 0.5),
                ("nan".into(), f64::NAN),
                ("up".into(), f64::INFINITY),
                ("down".into(), f64::NEG_INFINITY),
            ],
            done: false,
            fuel: 10,
        };
        let r = record(&trial(), &step, Duration::from_millis(1500), true, None).unwrap();
        assert_eq!(r["loss"], json!(0.5));
        assert_eq!(
            (&r["nan"], &r["up"], &r["down"]),
            (&json!("NaN"), &json!("Infinity"), &json!("-Infinity")),
            "NaN and the infinities stay apart"
        );
        // Reused records write them the same way.
        let again = record(&trial(), &step, Duration::ZERO, true, Some(r.clone())).unwrap();
        assert_eq!(again["up"], json!("Infinity"));
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
    fn a_reused_record_equals_a_fresh_one() {
        let step = |metrics: &[(&str, f64)], fuel| Step {
            metrics: metrics.iter().map(|(n, v)| (n.to_string(), *v)).collect(),
            done: false,
            fuel,
        };
        let mut other = Trial::new("trial_0002".into(), json!({"lr": 0.5}), "/tmp/y".into());
        other.iterations = 9;
        other.time_total_s = 2.5;
        let cases = [
            (trial(), step(&[("loss", 0.5), ("acc", 0.9)], 10), false),
            (
                trial(),
                step(&[("loss", 0.4), ("acc", f64::INFINITY)], 11),
                true,
            ),
            // Another trial: its id and config replace the kept ones.
            (
                other.clone(),
                step(&[("loss", 0.3), ("acc", 0.8)], 12),
                false,
            ),
            // Other metrics, or the same in another order: built afresh.
            (
                other.clone(),
                step(&[("acc", 0.8), ("loss", 0.3)], 13),
                false,
            ),
            (other.clone(), step(&[("loss", 0.3)], 14), false),
            (other, step(&[("loss", 0.3), ("loss", 0.2)], 15), false),
        ];
        let mut previous: Option<Map<String, Value>> = None;
        for (trial, step, done) in &cases {
            let elapsed = Duration::from_millis(step.fuel);
            let mut fresh = record(trial, step, elapsed, *done, None).unwrap();
            let mut reused = record(trial, step, elapsed, *done, previous.take()).unwrap();
            // The clock moved between the two calls.
            for field in ["timestamp", "date"] {
                fresh.remove(field);
                assert!(reused.remove(field).is_some(), "{field}");
            }
            assert_eq!(
                serde_json::to_string(&reused).unwrap(),
                serde_json::to_string(&fresh).unwrap()
            );
            previous = Some(record(trial, step, elapsed, *done, None).unwrap());
        }
    }

    #[test]
    fn reserved_metric_names_are_refused() {
        let step = Step {
            metrics: vec![("training_iteration".into(), 1.0)],
            done: false,
            fuel: 0,
        };
        let message = record(&trial(), &step, Duration::ZERO, false, None).unwrap_err();
        assert!(message.contains("`training_iteration`"), "{message}");
    }
}
