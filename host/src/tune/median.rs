//! The median stopping rule (Google Vizier; Ray Tune's `MedianStoppingRule`):
//! a trial stops at time `t` when its best result so far is worse than the
//! median, over the other trials that have reached `t`, of their mean
//! results between `grace_period` and `t`.
//!
//! As Ray's with `hard_stop = true`: a stopped trial ends. Where Ray may
//! pause a trial that lacks enough comparisons to let a waiting one run,
//! this one lets it continue.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::result::Mode;
use super::scheduler::{Decision, Fifo, Scheduler};
use super::trial::Trial;

/// The rule's parameters, with Ray Tune's names and defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MedianStoppingConfig {
    /// The result field that measures progress (`time_total_s`,
    /// `training_iteration`, `fuel_total`, ...).
    pub time_attr: String,
    /// No trial stops before `time_attr` reaches this; results before it
    /// are left out of the means.
    pub grace_period: f64,
    /// Other trials that must have reached `t` before a trial is judged.
    pub min_samples_required: usize,
}

impl Default for MedianStoppingConfig {
    fn default() -> Self {
        Self {
            time_attr: "time_total_s".into(),
            grace_period: 60.0,
            min_samples_required: 3,
        }
    }
}

/// The median stopping rule. Starts trials in FIFO order.
#[derive(Debug)]
pub struct MedianStopping {
    config: MedianStoppingConfig,
    metric: String,
    mode: Mode,
    /// Each trial's `(time, metric)` results, in order.
    results: BTreeMap<String, Vec<(f64, f64)>>,
    fifo: Fifo,
}

impl MedianStopping {
    /// The rule ranking trials by `metric` under `mode`.
    pub fn new(config: MedianStoppingConfig, metric: &str, mode: Mode) -> Result<Self, String> {
        if config.time_attr.is_empty() {
            return Err("scheduler.time_attr must name a result field".into());
        }
        if !(config.grace_period >= 0.0 && config.grace_period.is_finite()) {
            return Err("scheduler.grace_period must be 0 or a positive number".into());
        }
        Ok(Self {
            config,
            metric: metric.to_string(),
            mode,
            results: BTreeMap::new(),
            fifo: Fifo::default(),
        })
    }

    /// Appends a result; `None` when it lacks the time or the metric.
    fn add(&mut self, trial: &Trial, result: &Map<String, Value>) -> Option<f64> {
        let time = result.get(&self.config.time_attr)?.as_f64()?;
        let value = result.get(&self.metric)?.as_f64()?;
        self.results
            .entry(trial.trial_id.clone())
            .or_default()
            .push((time, value));
        Some(time)
    }

    /// Mean of a trial's results with `grace_period <= time <= t`.
    fn running_mean(&self, results: &[(f64, f64)], t: f64) -> f64 {
        let scoped: Vec<f64> = results
            .iter()
            .filter(|(time, _)| self.config.grace_period <= *time && *time <= t)
            .map(|&(_, v)| v)
            .collect();
        scoped.iter().sum::<f64>() / scoped.len() as f64
    }
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

impl Scheduler for MedianStopping {
    fn on_result(&mut self, trial: &Trial, result: &Map<String, Value>) -> Decision {
        let Some(t) = self.add(trial, result) else {
            return Decision::Continue;
        };
        if t < self.config.grace_period {
            return Decision::Continue;
        }
        // The other trials whose latest result has reached t.
        let mut means: Vec<f64> = self
            .results
            .iter()
            .filter(|(id, results)| {
                **id != trial.trial_id && results.last().is_some_and(|&(time, _)| time >= t)
            })
            .map(|(_, results)| self.running_mean(results, t))
            .collect();
        if means.len() < self.config.min_samples_required.max(1) {
            return Decision::Continue;
        }
        let median = median(&mut means);
        let own = self.results[&trial.trial_id].iter().map(|&(_, v)| v);
        let best = match self.mode {
            Mode::Max => own.fold(f64::NEG_INFINITY, f64::max),
            Mode::Min => own.fold(f64::INFINITY, f64::min),
        };
        if self.mode.better(median, best) {
            Decision::Stop
        } else {
            Decision::Continue
        }
    }

    fn on_trial_complete(&mut self, trial: &Trial, result: &Map<String, Value>) {
        self.add(trial, result);
    }

    fn choose_next(&mut self, trials: &[Trial]) -> Option<usize> {
        self.fifo.choose_next(trials)
    }

    fn name(&self) -> &'static str {
        "median_stopping"
    }

    fn state(&self) -> Value {
        serde_json::to_value(&self.results).unwrap_or(Value::Null)
    }

    fn restore_state(&mut self, state: &Value) -> Result<(), String> {
        if state.is_null() {
            return Ok(());
        }
        self.results = serde_json::from_value(state.clone())
            .map_err(|e| format!("the saved median stopping state cannot be read: {e}"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn trial(id: &str) -> Trial {
        Trial::new(id.into(), json!({}), "/tmp".into())
    }

    fn result(t: f64, reward: f64) -> Map<String, Value> {
        json!({"time_total_s": t, "reward": reward})
            .as_object()
            .unwrap()
            .clone()
    }

    fn rule(grace: f64, samples: usize) -> MedianStopping {
        let config = MedianStoppingConfig {
            grace_period: grace,
            min_samples_required: samples,
            ..Default::default()
        };
        MedianStopping::new(config, "reward", Mode::Max).unwrap()
    }

    /// Ray's own basic setup: t1 reports i * 100 for t = 0..9 (mean 450),
    /// t2 reports 450 for t = 0..4.
    fn basic(rule: &mut MedianStopping) -> (Trial, Trial) {
        let (t1, t2) = (trial("t1"), trial("t2"));
        for i in 0..10 {
            assert_eq!(
                rule.on_result(&t1, &result(i as f64, i as f64 * 100.0)),
                Decision::Continue
            );
        }
        for i in 0..5 {
            assert_eq!(
                rule.on_result(&t2, &result(i as f64, 450.0)),
                Decision::Continue
            );
        }
        rule.on_trial_complete(&t1, &result(10.0, 1000.0));
        (t1, t2)
    }

    #[test]
    fn stops_below_the_median_of_running_means_as_in_ray() {
        let mut r = rule(0.0, 1);
        basic(&mut r);
        let t3 = trial("t3");
        // At t = 1, t1's running mean is mean(0, 100) = 50 and t2's is 450:
        // median 250. A best of 10 is worse: stop.
        assert_eq!(r.on_result(&t3, &result(1.0, 10.0)), Decision::Stop);
        // t3 now counts too (its mean at t = 1 is 10): median of 50, 450, 10.
        let t4 = trial("t4");
        assert_eq!(r.on_result(&t4, &result(1.0, 260.0)), Decision::Continue);
        // At t = 9 only t1 has got there: mean 450. t4's best so far (260)
        // is what is compared.
        assert_eq!(r.on_result(&t4, &result(9.0, 0.0)), Decision::Stop);
        // Now t1 (450) and t4 (mean of 260 and 0: 130): median 290.
        let t5 = trial("t5");
        assert_eq!(r.on_result(&t5, &result(9.0, 460.0)), Decision::Continue);
    }

    #[test]
    fn grace_period_and_min_samples_hold_trials_back() {
        let mut r = rule(2.0, 1);
        basic(&mut r);
        assert_eq!(
            r.on_result(&trial("early"), &result(1.0, 0.0)),
            Decision::Continue
        );
        let mut needs_three = rule(0.0, 3);
        basic(&mut needs_three);
        assert_eq!(
            needs_three.on_result(&trial("t3"), &result(1.0, 0.0)),
            Decision::Continue,
            "only two others have reached t = 1"
        );
    }

    #[test]
    fn min_mode_and_state_round_trip() {
        let config = MedianStoppingConfig {
            grace_period: 0.0,
            min_samples_required: 1,
            ..Default::default()
        };
        let mut r = MedianStopping::new(config.clone(), "reward", Mode::Min).unwrap();
        r.on_result(&trial("a"), &result(1.0, 1.0));
        let mut restored = MedianStopping::new(config, "reward", Mode::Min).unwrap();
        restored.restore_state(&r.state()).unwrap();
        assert_eq!(
            restored.on_result(&trial("b"), &result(1.0, 2.0)),
            Decision::Stop
        );
        assert_eq!(
            restored.on_result(&trial("c"), &result(1.0, 0.5)),
            Decision::Continue
        );
    }
}
