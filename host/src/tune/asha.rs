//! Asynchronous successive halving (ASHA), the stopping variant Ray Tune
//! calls `AsyncHyperBandScheduler`.
//!
//! Each bracket has rungs at `grace_period * reduction_factor^k` (in units
//! of `time_attr`) below `max_t`. When a trial first reaches a rung, its
//! result is recorded there and compared with the `1 - 1/reduction_factor`
//! quantile of the results recorded at that rung so far: below it, the trial
//! stops. Trials that reach `max_t` stop. Decisions depend only on results
//! and the order they arrive in: with `time_attr = "fuel_total"`, a seed and
//! one trial at a time, the same experiment makes the same decisions on any
//! machine (with more at once, which trial reaches a rung first depends on
//! speed, as in every asynchronous scheduler).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::result::Mode;
use super::scheduler::{Decision, Fifo, Scheduler};
use super::trial::Trial;

/// ASHA's parameters, with Ray Tune's names and defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AshaConfig {
    /// The result field that measures progress: `training_iteration`,
    /// `time_total_s` or `fuel_total` (any increasing number works).
    pub time_attr: String,
    /// Trials stop once `time_attr` reaches this.
    pub max_t: f64,
    /// No trial stops before `time_attr` reaches this.
    pub grace_period: f64,
    /// Each rung keeps the best `1 / reduction_factor` of trials.
    pub reduction_factor: f64,
    /// Number of brackets (each with a later first rung).
    pub brackets: usize,
}

impl Default for AshaConfig {
    fn default() -> Self {
        Self {
            time_attr: "training_iteration".into(),
            max_t: 100.0,
            grace_period: 1.0,
            reduction_factor: 4.0,
            brackets: 1,
        }
    }
}

impl AshaConfig {
    /// Checks the parameters, naming the first bad one.
    pub fn validate(&self) -> Result<(), String> {
        if self.time_attr.is_empty() {
            return Err("scheduler.time_attr must name a result field".into());
        }
        if !(self.grace_period > 0.0 && self.grace_period.is_finite()) {
            return Err("scheduler.grace_period must be a positive number".into());
        }
        if !(self.max_t >= self.grace_period && self.max_t.is_finite()) {
            return Err(format!(
                "scheduler.max_t ({}) must be at least grace_period ({})",
                self.max_t, self.grace_period
            ));
        }
        if !(self.reduction_factor > 1.0 && self.reduction_factor.is_finite()) {
            return Err("scheduler.reduction_factor must be greater than 1".into());
        }
        if self.brackets == 0 {
            return Err("scheduler.brackets must be at least 1".into());
        }
        let rungs = self.rungs(0);
        if rungs > MAX_RUNGS {
            return Err(format!(
                "scheduler: max_t / grace_period = {} with reduction_factor {} gives {rungs} \
                 rungs; at most {MAX_RUNGS} are useful (raise reduction_factor)",
                self.max_t / self.grace_period,
                self.reduction_factor
            ));
        }
        if self.brackets > rungs.max(1) {
            return Err(format!(
                "scheduler.brackets is {}, but these parameters give only {} rungs, so at \
                 most {} brackets",
                self.brackets,
                rungs,
                rungs.max(1)
            ));
        }
        Ok(())
    }

    /// Ray's count of rungs in bracket `s`: int(log(max_t / grace) /
    /// log(rf) - s + 1), the lowest at grace * rf^s.
    fn rungs(&self, s: usize) -> usize {
        let count =
            (self.max_t / self.grace_period).ln() / self.reduction_factor.ln() - s as f64 + 1.0;
        if count.is_finite() && count > 0.0 {
            count.floor().min(u32::MAX as f64) as usize
        } else {
            0
        }
    }
}

/// More rungs than this means a reduction factor too close to 1 to be
/// meant (and a state that grows with every rung).
const MAX_RUNGS: usize = 64;

/// One rung: a milestone and the rewards recorded there, by trial id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Rung {
    milestone: f64,
    recorded: BTreeMap<String, f64>,
}

/// The ASHA scheduler (stopping variant). Starts trials in FIFO order.
#[derive(Debug)]
pub struct Asha {
    config: AshaConfig,
    metric: String,
    mode: Mode,
    /// Per bracket, rungs from the highest milestone down.
    brackets: Vec<Vec<Rung>>,
    /// Which bracket each trial belongs to.
    assigned: BTreeMap<String, usize>,
    seed: u64,
    fifo: Fifo,
}

#[derive(Serialize, Deserialize)]
struct AshaState {
    brackets: Vec<Vec<Rung>>,
    assigned: BTreeMap<String, usize>,
}

impl Asha {
    /// ASHA ranking trials by `metric` under `mode`; `seed` spreads trials
    /// over brackets.
    pub fn new(config: AshaConfig, metric: &str, mode: Mode, seed: u64) -> Result<Self, String> {
        config.validate()?;
        let rf = config.reduction_factor;
        let brackets = (0..config.brackets)
            .map(|s| {
                (0..config.rungs(s) as i32)
                    .rev()
                    .map(|k| Rung {
                        milestone: config.grace_period * rf.powi(k + s as i32),
                        recorded: BTreeMap::new(),
                    })
                    .collect()
            })
            .collect();
        Ok(Self {
            config,
            metric: metric.to_string(),
            mode,
            brackets,
            assigned: BTreeMap::new(),
            seed,
            fifo: Fifo::default(),
        })
    }

    /// The milestones of each bracket, highest first.
    pub fn milestones(&self) -> Vec<Vec<f64>> {
        self.brackets
            .iter()
            .map(|rungs| rungs.iter().map(|r| r.milestone).collect())
            .collect()
    }

    /// Brackets with more rungs are likelier (Ray weighs them by
    /// e^(rungs - most rungs)); the draw hashes the trial id with the seed,
    /// so it needs no random state to be saved.
    fn bracket_for(&mut self, trial_id: &str) -> usize {
        if let Some(&b) = self.assigned.get(trial_id) {
            return b;
        }
        let most = self.brackets.iter().map(Vec::len).max().unwrap_or(0) as f64;
        let weights: Vec<f64> = self
            .brackets
            .iter()
            .map(|r| (r.len() as f64 - most).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        let hash = blake3::hash(format!("{}:{trial_id}", self.seed).as_bytes());
        let draw = u64::from_le_bytes(hash.as_bytes()[..8].try_into().expect("8 bytes")) as f64
            / u64::MAX as f64
            * total;
        let mut acc = 0.0;
        let mut chosen = weights.len() - 1;
        for (i, w) in weights.iter().enumerate() {
            acc += w;
            if draw < acc {
                chosen = i;
                break;
            }
        }
        self.assigned.insert(trial_id.to_string(), chosen);
        chosen
    }
}

/// numpy's default (linear) percentile of non-empty `values`.
fn percentile(values: &mut [f64], q: f64) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    let pos = q / 100.0 * (values.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    values[lo] + (values[hi] - values[lo]) * (pos - lo as f64)
}

impl Asha {
    /// Records `result` at the first rung it reaches that has no result of
    /// this trial yet, and says whether it falls below that rung's cutoff.
    fn record(&mut self, trial: &Trial, t: f64, result: &Map<String, Value>) -> Decision {
        // A missing or NaN metric (JSON null) is recorded as NaN, marking
        // the rung as passed; cutoffs ignore NaN (numpy's nanpercentile).
        let reward = match result.get(&self.metric).and_then(Value::as_f64) {
            Some(v) if self.mode == Mode::Min => -v,
            Some(v) => v,
            None => f64::NAN,
        };
        let bracket = self.bracket_for(&trial.trial_id);
        let keep = 1.0 - 1.0 / self.config.reduction_factor;
        for rung in &mut self.brackets[bracket] {
            if t < rung.milestone || rung.recorded.contains_key(&trial.trial_id) {
                continue;
            }
            let mut seen: Vec<f64> = rung
                .recorded
                .values()
                .copied()
                .filter(|v| !v.is_nan())
                .collect();
            let stop = !seen.is_empty() && reward < percentile(&mut seen, keep * 100.0);
            rung.recorded.insert(trial.trial_id.clone(), reward);
            return if stop {
                Decision::Stop
            } else {
                Decision::Continue
            };
        }
        Decision::Continue
    }
}

impl Scheduler for Asha {
    fn on_result(&mut self, trial: &Trial, result: &Map<String, Value>) -> Decision {
        let Some(t) = result.get(&self.config.time_attr).and_then(Value::as_f64) else {
            return Decision::Continue;
        };
        if t >= self.config.max_t {
            return Decision::Stop;
        }
        self.record(trial, t, result)
    }

    fn on_trial_complete(&mut self, trial: &Trial, result: &Map<String, Value>) {
        // As Ray does: a trial that ended on its own still counts at the
        // rung its last result reached.
        if let Some(t) = result.get(&self.config.time_attr).and_then(Value::as_f64) {
            self.record(trial, t, result);
        }
    }

    fn choose_next(&mut self, trials: &[Trial]) -> Option<usize> {
        self.fifo.choose_next(trials)
    }

    fn name(&self) -> &'static str {
        "asha"
    }

    fn state(&self) -> Value {
        serde_json::to_value(AshaState {
            brackets: self.brackets.clone(),
            assigned: self.assigned.clone(),
        })
        .unwrap_or(Value::Null)
    }

    fn restore_state(&mut self, state: &Value) -> Result<(), String> {
        if state.is_null() {
            return Ok(());
        }
        let saved: AshaState = serde_json::from_value(state.clone())
            .map_err(|e| format!("the saved ASHA state cannot be read: {e}"))?;
        let shape = |b: &Vec<Vec<Rung>>| -> Vec<Vec<f64>> {
            b.iter()
                .map(|r| r.iter().map(|x| x.milestone).collect())
                .collect()
        };
        if shape(&saved.brackets) != shape(&self.brackets) {
            return Err("the saved ASHA state has other rungs than this configuration".into());
        }
        self.brackets = saved.brackets;
        self.assigned = saved.assigned;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn trial(id: usize) -> Trial {
        Trial::new(format!("trial_{id:04}"), json!({}), "/tmp".into())
    }

    fn result(t: u64, score: f64) -> Map<String, Value> {
        json!({"training_iteration": t, "score": score})
            .as_object()
            .unwrap()
            .clone()
    }

    fn asha(max_t: f64, grace: f64, rf: f64, brackets: usize) -> Asha {
        let config = AshaConfig {
            max_t,
            grace_period: grace,
            reduction_factor: rf,
            brackets,
            ..AshaConfig::default()
        };
        Asha::new(config, "score", Mode::Max, 0).unwrap()
    }

    #[test]
    fn rungs_match_ray_tune() {
        // Ray: max_t=100, grace=1, rf=4 -> rungs 64, 16, 4, 1.
        assert_eq!(
            asha(100.0, 1.0, 4.0, 1).milestones(),
            [vec![64.0, 16.0, 4.0, 1.0]]
        );
        // Bracket s starts at grace * rf^s and has one rung fewer.
        assert_eq!(
            asha(81.0, 1.0, 3.0, 3).milestones(),
            [
                vec![81.0, 27.0, 9.0, 3.0, 1.0],
                vec![81.0, 27.0, 9.0, 3.0],
                vec![81.0, 27.0, 9.0]
            ]
        );
    }

    #[test]
    fn stops_trials_below_the_rung_quantile_by_hand() {
        // rf = 2: a trial arriving at a rung stops when below the median of
        // those recorded there before it.
        let mut s = asha(8.0, 1.0, 2.0, 1);
        let t: Vec<Trial> = (0..5).collect::<Vec<_>>().into_iter().map(trial).collect();
        // Rung 1: 5.0 (first: continues), 3.0 (< 5: stop), 7.0 (> median(5,3)=4: continue),
        // 4.5 (>= median(5,3,7)=5? no, 4.5 < 5: stop), 6.0 (> median(3,4.5,5,7)=4.75: continue).
        let decisions: Vec<Decision> = [5.0, 3.0, 7.0, 4.5, 6.0]
            .iter()
            .zip(&t)
            .map(|(score, tr)| s.on_result(tr, &result(1, *score)))
            .collect();
        use Decision::*;
        assert_eq!(decisions, [Continue, Stop, Continue, Stop, Continue]);
        // Between rungs nothing is decided; at rung 2 the rule applies again.
        assert_eq!(s.on_result(&t[0], &result(1, 0.0)), Continue);
        assert_eq!(s.on_result(&t[0], &result(2, 1.0)), Continue);
        assert_eq!(s.on_result(&t[2], &result(2, 0.5)), Stop);
        assert_eq!(
            s.on_result(&t[4], &result(3, 2.0)),
            Continue,
            "3 >= 2: rung 2"
        );
        // max_t stops everyone.
        assert_eq!(s.on_result(&t[4], &result(8, 100.0)), Stop);
    }

    #[test]
    fn min_mode_flips_the_ranking_and_state_round_trips() {
        let config = AshaConfig {
            max_t: 4.0,
            reduction_factor: 2.0,
            ..AshaConfig::default()
        };
        let mut s = Asha::new(config.clone(), "score", Mode::Min, 0).unwrap();
        assert_eq!(s.on_result(&trial(0), &result(1, 1.0)), Decision::Continue);
        assert_eq!(s.on_result(&trial(1), &result(1, 2.0)), Decision::Stop);
        let mut restored = Asha::new(config, "score", Mode::Min, 0).unwrap();
        restored.restore_state(&s.state()).unwrap();
        assert_eq!(
            // Rewards -1 and -2 are recorded: the median is -1.5, and 1.8
            // (reward -1.8) is below it.
            restored.on_result(&trial(2), &result(1, 1.8)),
            Decision::Stop
        );
        let other = Asha::new(AshaConfig::default(), "score", Mode::Min, 0).unwrap();
        let mut other = other;
        assert!(other.restore_state(&s.state()).is_err());
    }

    #[test]
    fn completed_trials_and_nan_results_count_as_in_ray() {
        let mut s = asha(8.0, 1.0, 2.0, 1);
        // Ended by a stopping criterion at t = 1: still recorded at rung 1.
        s.on_trial_complete(&trial(0), &result(1, 5.0));
        assert_eq!(s.on_result(&trial(1), &result(1, 3.0)), Decision::Stop);
        // A NaN (null) result passes its rung without moving the cutoff.
        let nan = json!({"training_iteration": 1, "score": null});
        assert_eq!(
            s.on_result(&trial(2), nan.as_object().unwrap()),
            Decision::Continue
        );
        // Cutoff over {5, 3}, NaN ignored: 4.
        assert_eq!(s.on_result(&trial(3), &result(1, 3.9)), Decision::Stop);
        assert_eq!(s.on_result(&trial(4), &result(1, 4.1)), Decision::Continue);
    }

    #[test]
    fn bad_parameters_are_named() {
        for (config, expected) in [
            (
                AshaConfig {
                    max_t: 0.5,
                    ..AshaConfig::default()
                },
                "max_t",
            ),
            (
                AshaConfig {
                    reduction_factor: 1.0,
                    ..AshaConfig::default()
                },
                "reduction_factor",
            ),
            (
                AshaConfig {
                    grace_period: -1.0,
                    ..AshaConfig::default()
                },
                "grace_period",
            ),
            (
                AshaConfig {
                    brackets: 0,
                    ..AshaConfig::default()
                },
                "brackets",
            ),
        ] {
            let message = Asha::new(config, "m", Mode::Max, 0).unwrap_err();
            assert!(message.contains(expected), "{message}");
        }
    }
}
