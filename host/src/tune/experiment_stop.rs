//! Experiment-level stoppers: limits on the whole experiment rather than on
//! one trial (those are in [`StopCriteria`](super::StopCriteria)).
//!
//! In the experiment file:
//! ```toml
//! [stop_experiment]
//! max_trials = 50          # create no more than 50 trials; running ones finish
//! max_time = "2h"          # or seconds: 7200; wall time, summed over resumed runs
//! max_fuel = 1e12          # fuel burned by all trials together
//!
//! [stop_experiment.plateau]  # Ray Tune's ExperimentPlateauStopper
//! metric = "val_loss"      # default: the experiment's metric
//! mode = "min"             # default: the experiment's mode
//! std = 0.001              # plateaued: the top results' standard deviation <= std
//! top = 10                 # ... over the best `top` results so far
//! patience = 0             # ... for this many results in a row
//! grace = 0                # results seen before the plateau is checked
//! ```
//!
//! `max_time`, `max_fuel` and the plateau halt the experiment: no trial is
//! created or started afterwards and running ones are stopped. `max_trials`
//! only stops the creation of trials.

use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::result::Mode;
use crate::units;

/// The `[stop_experiment]` table. Every limit is optional.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExperimentStop {
    /// No more trials are created once this many exist (trials restored by
    /// `wtune resume` count); those created still run to their end.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_trials: Option<usize>,
    /// Seconds of wall time for the whole experiment, summed across resumed
    /// runs. In the file also a duration such as `"10m"` or `"1h 30m"`.
    #[serde(deserialize_with = "max_time", skip_serializing_if = "Option::is_none")]
    pub max_time: Option<f64>,
    /// The most fuel all trials together may burn (the sum of their
    /// `fuel_total`). In the file also `5e9`, `"5_000_000_000"`.
    #[serde(deserialize_with = "max_fuel", skip_serializing_if = "Option::is_none")]
    pub max_fuel: Option<u64>,
    /// Halt when the best results stop changing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plateau: Option<PlateauConfig>,
}

impl ExperimentStop {
    /// Checks the limits, naming the first bad key.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_trials == Some(0) {
            return Err("stop_experiment.max_trials must be at least 1".into());
        }
        if let Some(t) = self.max_time
            && !(t.is_finite() && t > 0.0)
        {
            return Err(format!(
                "stop_experiment.max_time must be a positive number of seconds, got {t}"
            ));
        }
        if self.max_fuel == Some(0) {
            return Err("stop_experiment.max_fuel must be at least 1".into());
        }
        if let Some(p) = &self.plateau {
            p.validate()?;
        }
        Ok(())
    }

    /// Whether any limit is set.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// Ray Tune's `ExperimentPlateauStopper`: the experiment halts once the
/// best `top` results so far, from all trials together, have a standard
/// deviation of at most `std` for `patience` results in a row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PlateauConfig {
    /// The metric watched; default: the experiment's `metric`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metric: Option<String>,
    /// Which results are best; default: the experiment's `mode`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
    /// Plateaued when the population standard deviation of the top results
    /// is at most this.
    pub std: f64,
    /// How many of the best results are compared (at least 2). Until that
    /// many have been seen there is no plateau.
    pub top: usize,
    /// Consecutive plateaued results needed to halt. As in Ray, the count
    /// includes the result that halts, so 0 and 1 both halt at the first
    /// plateaued result, and 3 at the third in a row.
    pub patience: usize,
    /// Results (from all trials, those carrying the metric) taken into the
    /// window before the plateau is checked: the first check comes with the
    /// `grace`-th result, like the grace period of Ray's
    /// `TrialPlateauStopper`. Ray's experiment stopper has none (0).
    pub grace: usize,
}

impl Default for PlateauConfig {
    /// Ray's defaults.
    fn default() -> Self {
        Self {
            metric: None,
            mode: None,
            std: 0.001,
            top: 10,
            patience: 0,
            grace: 0,
        }
    }
}

impl PlateauConfig {
    fn validate(&self) -> Result<(), String> {
        if self.metric.as_deref().is_some_and(|m| m.trim().is_empty()) {
            return Err("stop_experiment.plateau.metric must name a metric".into());
        }
        if !(self.std.is_finite() && self.std > 0.0) {
            return Err(format!(
                "stop_experiment.plateau.std must be a positive number, got {}",
                self.std
            ));
        }
        if self.top < 2 {
            // One value always has a standard deviation of 0.
            return Err(format!(
                "stop_experiment.plateau.top must be at least 2, got {}",
                self.top
            ));
        }
        Ok(())
    }
}

/// Where the experiment stands, as the runner counts it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Totals {
    /// Seconds since *this run* of the experiment started (the stopper
    /// adds the time of earlier runs, restored with its state).
    pub elapsed_s: f64,
    /// The sum of every trial's `fuel_total`.
    pub fuel_total: u64,
    /// Trials created so far, restored ones included.
    pub trials_created: usize,
}

/// The experiment-level stoppers of an [`ExperimentStop`], with their
/// state. Pure: the runner passes in time and totals.
#[derive(Debug, Clone)]
pub struct ExperimentStopper {
    config: ExperimentStop,
    plateau: Option<Plateau>,
    /// Seconds spent in earlier runs of this experiment.
    elapsed_before: f64,
    /// The latest `elapsed_s` seen in this run.
    elapsed_now: f64,
}

impl ExperimentStopper {
    /// The stoppers of `config`; the plateau watches `metric` under `mode`
    /// (the experiment's) unless it names its own.
    pub fn new(config: &ExperimentStop, metric: Option<&str>, mode: Mode) -> Result<Self, String> {
        config.validate()?;
        let plateau = match &config.plateau {
            None => None,
            Some(p) => {
                let metric = p.metric.as_deref().or(metric).ok_or(
                    "stop_experiment.plateau needs a metric: set stop_experiment.plateau.metric \
                     or the experiment's metric",
                )?;
                Some(Plateau {
                    metric: metric.to_string(),
                    mode: p.mode.unwrap_or(mode),
                    std: p.std,
                    top: p.top,
                    patience: p.patience,
                    grace: p.grace,
                    best: Vec::new(),
                    plateaued_for: 0,
                    results: 0,
                })
            }
        };
        Ok(Self {
            config: config.clone(),
            plateau,
            elapsed_before: 0.0,
            elapsed_now: 0.0,
        })
    }

    /// Whether the experiment may create another trial when `created`
    /// exist: `false` from `max_trials` on.
    pub fn may_create_trial(&self, created: usize) -> bool {
        self.config.max_trials.is_none_or(|max| created < max)
    }

    /// Metrics the stoppers read. A result lacking one (or carrying `null`,
    /// which is what NaN becomes) is left out of the plateau window, so the
    /// runner should check that results report it, as it does for the
    /// experiment's metric.
    pub fn metrics(&self) -> impl Iterator<Item = &str> {
        self.plateau.iter().map(|p| p.metric.as_str())
    }

    /// Takes `trial_id`'s `result` into the plateau window, then checks every
    /// limit. `Some(reason)` halts the whole experiment.
    pub fn on_result(
        &mut self,
        trial_id: &str,
        result: &Map<String, Value>,
        totals: Totals,
    ) -> Option<String> {
        let plateaued = self.plateau.as_mut().and_then(|p| {
            let value = result.get(&p.metric)?.as_f64()?;
            p.add(value).then(|| {
                format!(
                    "the top {} `{}` results plateaued (standard deviation {:.3e} <= std = {}{}) \
                     at a result of {trial_id}",
                    p.top,
                    p.metric,
                    p.deviation(),
                    p.std,
                    match p.patience {
                        0 | 1 => String::new(),
                        n => format!(", {n} results in a row"),
                    }
                )
            })
        });
        self.check(totals).or(plateaued)
    }

    /// Checks the limits that need no result (time, fuel): for the runner
    /// to call while trials are running but none has reported lately.
    pub fn check(&mut self, totals: Totals) -> Option<String> {
        if totals.elapsed_s.is_finite() {
            self.elapsed_now = self.elapsed_now.max(totals.elapsed_s);
        }
        // Formatted only when a limit is reached: this runs on every result.
        let after = || match totals.trials_created {
            1 => " after 1 trial".to_string(),
            n => format!(" after {n} trials"),
        };
        if let Some(max) = self.config.max_time {
            let elapsed = self.elapsed_s();
            if elapsed >= max {
                return Some(format!(
                    "total time reached {} (max_time = {}){}",
                    seconds(elapsed),
                    seconds(max),
                    after()
                ));
            }
        }
        if let Some(max) = self.config.max_fuel
            && totals.fuel_total >= max
        {
            return Some(format!(
                "total fuel reached {} (max_fuel = {}){}",
                fuel(totals.fuel_total),
                fuel(max),
                after()
            ));
        }
        None
    }

    /// Seconds of wall time so far: earlier runs plus the latest
    /// `elapsed_s` passed in this run.
    pub fn elapsed_s(&self) -> f64 {
        self.elapsed_before + self.elapsed_now
    }

    /// The state to save with the experiment:
    /// `{"elapsed_s": 123.4, "plateau": {"best": [..], "plateaued_for": 0, "results": 17}}`
    /// (`plateau` is `null` without a plateau stopper). Elapsed time is as
    /// of the latest [`on_result`](Self::on_result) or
    /// [`check`](Self::check), so call `check` just before saving. Fuel and
    /// the trial count are not kept: they come from the trials, which the
    /// experiment saves anyway.
    pub fn state(&self) -> Value {
        json!({
            "elapsed_s": self.elapsed_s(),
            "plateau": self.plateau.as_ref().map(|p| json!({
                "best": p.best,
                "plateaued_for": p.plateaued_for,
                "results": p.results,
            })),
        })
    }

    /// Takes back what [`state`](Self::state) returned, so a resumed
    /// experiment keeps counting time from where it stopped and keeps its
    /// plateau window. `null` (no saved state) leaves everything fresh; a
    /// saved window is ignored when the plateau stopper is no longer
    /// configured. Call before the first result of the resumed run.
    pub fn restore_state(&mut self, state: &Value) -> Result<(), String> {
        if state.is_null() {
            return Ok(());
        }
        let bad = |what: &str| format!("experiment stopper state: {what} (got {state})");
        let elapsed = state
            .get("elapsed_s")
            .and_then(Value::as_f64)
            .filter(|x| x.is_finite() && *x >= 0.0)
            .ok_or_else(|| bad("`elapsed_s` must be a number of seconds"))?;
        let saved = state.get("plateau").filter(|p| !p.is_null());
        if let (Some(p), Some(saved)) = (self.plateau.as_mut(), saved) {
            let count = |key: &str| {
                saved
                    .get(key)
                    .and_then(Value::as_u64)
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| bad(&format!("`plateau.{key}` must be a count")))
            };
            let best = saved
                .get("best")
                .and_then(Value::as_array)
                .and_then(|values| values.iter().map(Value::as_f64).collect::<Option<Vec<_>>>())
                .ok_or_else(|| bad("`plateau.best` must be a list of numbers"))?;
            let (plateaued_for, results) = (count("plateaued_for")?, count("results")?);
            p.best = best;
            // `top` or `mode` may have changed since the state was saved.
            p.keep_top();
            p.plateaued_for = plateaued_for;
            p.results = results;
        }
        self.elapsed_before = elapsed;
        self.elapsed_now = 0.0;
        Ok(())
    }
}

/// The plateau stopper's configuration and window.
#[derive(Debug, Clone)]
struct Plateau {
    metric: String,
    mode: Mode,
    std: f64,
    top: usize,
    patience: usize,
    grace: usize,
    /// The best `top` values so far, ascending.
    best: Vec<f64>,
    /// Consecutive checked results that found a plateau.
    plateaued_for: usize,
    /// Results taken in, for `grace`.
    results: usize,
}

impl Plateau {
    /// Takes a value in; `true` when the experiment should halt.
    fn add(&mut self, value: f64) -> bool {
        if !value.is_finite() {
            // A diverged trial's infinity would make the deviation
            // infinite, or NaN, until it drops out of the top, if ever.
            return false;
        }
        self.best.push(value);
        self.keep_top();
        self.results += 1;
        if self.results < self.grace {
            return false;
        }
        let plateaued = self.best.len() == self.top && self.deviation() <= self.std;
        self.plateaued_for = if plateaued { self.plateaued_for + 1 } else { 0 };
        plateaued && self.plateaued_for >= self.patience
    }

    fn keep_top(&mut self) {
        self.best.sort_by(f64::total_cmp);
        let excess = self.best.len().saturating_sub(self.top);
        match self.mode {
            // The lowest values are best: drop from the top end.
            Mode::Min => self.best.truncate(self.top),
            Mode::Max => {
                self.best.drain(..excess);
            }
        }
    }

    /// Population standard deviation of the window (numpy's `std`).
    fn deviation(&self) -> f64 {
        let n = self.best.len() as f64;
        let mean = self.best.iter().sum::<f64>() / n;
        (self.best.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n).sqrt()
    }
}

/// `42.5s` under a minute, else `1h 30m` (whole seconds).
fn seconds(s: f64) -> String {
    if s < 60.0 {
        format!("{}s", (s * 10.0).round() / 10.0)
    } else {
        humantime::format_duration(Duration::from_secs(s.round() as u64)).to_string()
    }
}

/// `1.2e9` from a million on, where digits stop being readable.
fn fuel(n: u64) -> String {
    if n >= 1_000_000 {
        format!("{n:e}")
    } else {
        n.to_string()
    }
}

/// The value as written, as a TOML value, so the file's parsers (which
/// take TOML) read it whether it came from TOML or JSON.
struct Written;

impl Visitor<'_> for Written {
    type Value = toml::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a number or a string")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<toml::Value, E> {
        Ok(toml::Value::Boolean(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<toml::Value, E> {
        Ok(toml::Value::Integer(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<toml::Value, E> {
        Ok(i64::try_from(v).map_or(toml::Value::Float(v as f64), toml::Value::Integer))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<toml::Value, E> {
        Ok(toml::Value::Float(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<toml::Value, E> {
        Ok(toml::Value::String(v.to_string()))
    }
}

/// Seconds or a duration string, parsed as `limits.call_timeout` is.
fn max_time<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<f64>, D::Error> {
    let value = deserializer.deserialize_any(Written)?;
    units::duration(&value, "stop_experiment.max_time")
        .map(|d| d.map(|d| d.as_secs_f64()))
        .map_err(de::Error::custom)
}

/// An amount of fuel, parsed as `limits.fuel_per_trial` is.
fn max_fuel<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<u64>, D::Error> {
    let value = deserializer.deserialize_any(Written)?;
    units::fuel(&value, "stop_experiment.max_fuel").map_err(de::Error::custom)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ExperimentStop, String> {
        toml::from_str::<ExperimentStop>(text).map_err(|e| e.to_string())
    }

    fn stopper(text: &str) -> ExperimentStopper {
        ExperimentStopper::new(&parse(text).unwrap(), Some("acc"), Mode::Max).unwrap()
    }

    fn result(metric: &str, value: f64) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert(metric.into(), json!(value));
        m
    }

    fn at(elapsed_s: f64, fuel_total: u64, trials_created: usize) -> Totals {
        Totals {
            elapsed_s,
            fuel_total,
            trials_created,
        }
    }

    /// Feeds `values` of `acc` and returns the index of the one that halts.
    fn halts_at(s: &mut ExperimentStopper, values: &[f64]) -> Option<usize> {
        values.iter().position(|&v| {
            s.on_result("trial_0000", &result("acc", v), at(1.0, 0, 1))
                .is_some()
        })
    }

    #[test]
    fn max_trials_stops_creation_only() {
        let s = stopper("max_trials = 3");
        assert!(s.may_create_trial(0) && s.may_create_trial(2));
        assert!(!s.may_create_trial(3) && !s.may_create_trial(4));
        let mut s = s;
        // Reaching it halts nothing: created trials run to their end.
        assert_eq!(s.check(at(1e6, u64::MAX, 3)), None);
        assert!(stopper("").may_create_trial(usize::MAX - 1));
    }

    #[test]
    fn max_time_takes_seconds_or_durations_and_halts() {
        assert_eq!(parse("max_time = 90").unwrap().max_time, Some(90.0));
        assert_eq!(parse("max_time = 1.5").unwrap().max_time, Some(1.5));
        assert_eq!(parse("max_time = \"10m\"").unwrap().max_time, Some(600.0));
        assert_eq!(
            parse("max_time = \"1h 30m\"").unwrap().max_time,
            Some(5400.0)
        );
        let err = parse("max_time = \"soon\"").unwrap_err();
        assert!(
            err.contains("stop_experiment.max_time must be a duration"),
            "{err}"
        );
        assert!(parse("max_time = -5").is_err());
        let mut s = stopper("max_time = \"10m\"");
        assert_eq!(s.check(at(599.9, 0, 4)), None);
        assert_eq!(
            s.check(at(600.2, 0, 4)).unwrap(),
            "total time reached 10m (max_time = 10m) after 4 trials"
        );
        let mut s = stopper("max_time = 30");
        assert_eq!(
            s.on_result("trial_0000", &result("acc", 0.5), at(31.25, 0, 1))
                .unwrap(),
            "total time reached 31.3s (max_time = 30s) after 1 trial"
        );
    }

    #[test]
    fn max_fuel_sums_all_trials() {
        assert_eq!(
            parse("max_fuel = 1e9").unwrap().max_fuel,
            Some(1_000_000_000)
        );
        assert_eq!(
            parse("max_fuel = \"2_000_000\"").unwrap().max_fuel,
            Some(2_000_000)
        );
        assert!(
            parse("max_fuel = \"lots\"")
                .unwrap_err()
                .contains("stop_experiment.max_fuel must be a positive amount of fuel")
        );
        let mut s = stopper("max_fuel = 1e9");
        assert_eq!(s.check(at(1.0, 999_999_999, 2)), None);
        assert_eq!(
            s.check(at(1.0, 1_200_000_000, 3)).unwrap(),
            "total fuel reached 1.2e9 (max_fuel = 1e9) after 3 trials"
        );
        let mut s = stopper("max_fuel = 500");
        assert_eq!(
            s.check(at(1.0, 500, 1)).unwrap(),
            "total fuel reached 500 (max_fuel = 500) after 1 trial"
        );
    }

    #[test]
    fn plateau_by_hand_max_mode() {
        // top 3, std 0.01. The top three after each result:
        //   0.5                -> not full
        //   0.5 0.9            -> not full
        //   0.5 0.9 0.91       -> std 0.1908: no
        //   0.9 0.905 0.91     -> mean 0.905, deviations -0.005 0 0.005,
        //                         std sqrt(0.00005 / 3) = 0.00408: halt
        let mut s = stopper("[plateau]\ntop = 3\nstd = 0.01");
        assert_eq!(halts_at(&mut s, &[0.5, 0.9, 0.91, 0.905]), Some(3));
        let reason = s
            .on_result("trial_0007", &result("acc", 0.1), at(1.0, 0, 8))
            .unwrap();
        assert_eq!(
            reason,
            "the top 3 `acc` results plateaued (standard deviation 4.082e-3 <= std = 0.01) \
             at a result of trial_0007"
        );
    }

    #[test]
    fn plateau_by_hand_min_mode_keeps_the_lowest() {
        // Lowest three: after 1 2 3 -> std 0.816; 10 changes nothing (still
        // 1 2 3); 1.01 -> 1 1.01 2: std 0.469; 1.02 -> 1 1.01 1.02: std
        // 0.00816 <= 0.01: halt at index 5.
        let config =
            parse("[plateau]\ntop = 3\nstd = 0.01\nmode = \"min\"\nmetric = \"loss\"").unwrap();
        let mut s = ExperimentStopper::new(&config, Some("acc"), Mode::Max).unwrap();
        assert_eq!(s.metrics().collect::<Vec<_>>(), ["loss"]);
        let halted: Vec<bool> = [1.0, 2.0, 3.0, 10.0, 1.01, 1.02]
            .iter()
            .map(|&v| {
                s.on_result("t", &result("loss", v), at(0.0, 0, 1))
                    .is_some()
            })
            .collect();
        assert_eq!(halted, [false, false, false, false, false, true]);
    }

    #[test]
    fn plateau_patience_counts_consecutive_plateaued_results() {
        // top 2, std 0.1; the window is plateaued from the second 1.0 on.
        let values = [1.0, 1.0, 1.0, 1.0, 1.0];
        for (patience, expected) in [(0, 1), (1, 1), (2, 2), (4, 4)] {
            let mut s = stopper(&format!(
                "[plateau]\ntop = 2\nstd = 0.1\npatience = {patience}"
            ));
            assert_eq!(
                halts_at(&mut s, &values),
                Some(expected),
                "patience {patience}"
            );
        }
        // A better result that breaks the plateau resets the count:
        // [1 1] plateau (1), [1 5] no (0), [5 5.05] plateau (1), [5.05 5.1] (2).
        let mut s = stopper("[plateau]\ntop = 2\nstd = 0.1\npatience = 2");
        assert_eq!(halts_at(&mut s, &[1.0, 1.0, 5.0, 5.05, 5.1]), Some(4));
    }

    #[test]
    fn plateau_grace_delays_the_first_check() {
        // Plateaued from the second result; grace 4 checks first at the 4th.
        let mut s = stopper("[plateau]\ntop = 2\nstd = 0.1\ngrace = 4");
        assert_eq!(halts_at(&mut s, &[1.0; 6]), Some(3));
        // The window fills during grace: a better value then is remembered.
        let mut s = stopper("[plateau]\ntop = 2\nstd = 0.1\ngrace = 3");
        assert_eq!(halts_at(&mut s, &[9.0, 1.0, 1.0, 9.0]), Some(3));
    }

    #[test]
    fn plateau_skips_results_without_a_finite_metric() {
        let mut s = stopper("[plateau]\ntop = 2\nstd = 0.1");
        let totals = at(0.0, 0, 1);
        assert_eq!(s.on_result("t", &result("acc", 1.0), totals), None);
        assert_eq!(s.on_result("t", &result("other", 1.0), totals), None);
        let mut null = Map::new();
        null.insert("acc".into(), Value::Null);
        assert_eq!(s.on_result("t", &null, totals), None);
        assert_eq!(
            s.on_result("t", &result("acc", f64::INFINITY), totals),
            None
        );
        assert!(s.on_result("t", &result("acc", 1.0), totals).is_some());
    }

    #[test]
    fn validation_names_the_key() {
        let new = |text: &str| {
            ExperimentStopper::new(&parse(text).unwrap(), Some("acc"), Mode::Max).unwrap_err()
        };
        assert_eq!(
            new("max_trials = 0"),
            "stop_experiment.max_trials must be at least 1"
        );
        assert!(
            new("[plateau]\ntop = 1").starts_with("stop_experiment.plateau.top must be at least 2")
        );
        assert!(new("[plateau]\nstd = 0.0").starts_with("stop_experiment.plateau.std"));
        assert!(new("[plateau]\nmetric = \"\"").starts_with("stop_experiment.plateau.metric"));
        let no_metric =
            ExperimentStopper::new(&parse("[plateau]").unwrap(), None, Mode::Max).unwrap_err();
        assert!(no_metric.contains("needs a metric"), "{no_metric}");
        assert!(parse("max_trails = 3").is_err());
        assert!(parse("[plateau]\npatient = 3").is_err());
        let direct = ExperimentStop {
            max_time: Some(f64::NAN),
            ..ExperimentStop::default()
        };
        assert!(
            direct
                .validate()
                .unwrap_err()
                .starts_with("stop_experiment.max_time")
        );
        assert!(ExperimentStop::default().is_empty());
    }

    #[test]
    fn state_carries_elapsed_time_and_the_window_across_runs() {
        let text = "max_time = 100\n[plateau]\ntop = 3\nstd = 0.01";
        let mut first = stopper(text);
        assert_eq!(halts_at(&mut first, &[0.5, 0.9]), None);
        assert_eq!(first.check(at(60.0, 0, 2)), None);
        let state = first.state();
        assert_eq!(state["elapsed_s"], json!(60.0));
        assert_eq!(state["plateau"]["best"], json!([0.5, 0.9]));
        // Through JSON, as the experiment saves it.
        let state: Value = serde_json::from_str(&state.to_string()).unwrap();

        let mut second = stopper(text);
        second.restore_state(&state).unwrap();
        assert_eq!(second.elapsed_s(), 60.0);
        // 60 s before plus 39 s now is still under 100.
        assert_eq!(second.check(at(39.0, 0, 2)), None);
        // The window continues: 0.91 then 0.905 halt as in the by-hand case.
        let totals = at(39.5, 0, 2);
        assert_eq!(second.on_result("t", &result("acc", 0.91), totals), None);
        assert!(
            second
                .on_result("t", &result("acc", 0.905), totals)
                .unwrap()
                .contains("plateaued")
        );
        assert!(
            second
                .check(at(40.0, 0, 2))
                .unwrap()
                .starts_with("total time reached 1m 40s (max_time = 1m 40s)")
        );
        // Saving again sums both runs.
        assert_eq!(second.state()["elapsed_s"], json!(100.0));

        // Fresh state, and a changed config narrowing the window.
        let mut fresh = stopper(text);
        fresh.restore_state(&Value::Null).unwrap();
        assert_eq!(fresh.elapsed_s(), 0.0);
        let mut narrower = stopper("[plateau]\ntop = 2\nstd = 0.01");
        narrower
            .restore_state(&json!({"elapsed_s": 1, "plateau": {"best": [0.1, 0.5, 0.9], "plateaued_for": 0, "results": 3}}))
            .unwrap();
        assert_eq!(narrower.state()["plateau"]["best"], json!([0.5, 0.9]));
        // Without a plateau stopper the saved window is ignored.
        stopper("").restore_state(&state).unwrap();
        assert_eq!(stopper("").state()["plateau"], Value::Null);

        for broken in [
            json!({"plateau": null}),
            json!({"elapsed_s": -1}),
            json!({"elapsed_s": 1, "plateau": {"best": ["x"], "plateaued_for": 0, "results": 1}}),
            json!({"elapsed_s": 1, "plateau": {"best": [], "results": 1}}),
        ] {
            let mut s = stopper(text);
            assert!(s.restore_state(&broken).is_err(), "{broken}");
            assert_eq!(s.elapsed_s(), 0.0, "a refused state changes nothing");
        }
    }

    #[test]
    fn config_round_trips_through_json() {
        let config = parse(
            "max_trials = 5\nmax_time = \"2m\"\nmax_fuel = 1e9\n[plateau]\nmode = \"min\"\ntop = 4",
        )
        .unwrap();
        let json = serde_json::to_value(&config).unwrap();
        assert_eq!(json["max_time"], json!(120.0));
        let back: ExperimentStop = serde_json::from_value(json).unwrap();
        assert_eq!(back, config);
        assert_eq!(back.plateau.unwrap().std, 0.001);
    }
}
