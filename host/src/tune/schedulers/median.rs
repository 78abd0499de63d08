//! The median stopping rule (Google Vizier; Ray Tune's `MedianStoppingRule`):
//! a trial stops at time `t` when its best result so far is worse than the
//! median, over the other trials that have reached `t`, of their mean
//! results between `grace_period` and `t`.
//!
//! As Ray's with `hard_stop = true`: a stopped trial ends. Where Ray may
//! pause a trial that lacks enough comparisons to let a waiting one run,
//! this one lets it continue.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::fifo::Fifo;
use super::scheduler::{Decision, Scheduler};
use crate::tune::result::Mode;
use crate::tune::saved::read_saved;
use crate::tune::trial::Trial;

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

/// One trial's results, with what makes its running mean cheap.
#[derive(Debug, Default)]
struct History {
    /// `(time, metric)` in arrival order: what the saved state holds.
    results: Vec<(f64, f64)>,
    /// `prefix[i]` is the sum of the first `i` metrics.
    prefix: Vec<f64>,
    /// Times never went down (false after a trial recovered to an earlier
    /// checkpoint and reported earlier times again).
    monotonic: bool,
    /// The best metric so far under the rule's mode.
    best: f64,
}

impl History {
    fn new(mode: Mode) -> Self {
        Self {
            results: Vec::new(),
            prefix: vec![0.0],
            monotonic: true,
            best: match mode {
                Mode::Max => f64::NEG_INFINITY,
                Mode::Min => f64::INFINITY,
            },
        }
    }

    /// Appends a result. The prefix sums leave out results before `grace`,
    /// which no window includes: in a monotonic history they all come
    /// first, so a window's sum is one prefix minus an exact zero, added in
    /// the order a walk adds them (no cancellation against early values).
    fn push(&mut self, time: f64, value: f64, mode: Mode, grace: f64) {
        if self.results.last().is_some_and(|&(last, _)| time < last) {
            self.monotonic = false;
        }
        self.results.push((time, value));
        let counted = if time >= grace { value } else { 0.0 };
        let sum = self.prefix[self.prefix.len() - 1] + counted;
        self.prefix.push(sum);
        self.best = match mode {
            Mode::Max => self.best.max(value),
            Mode::Min => self.best.min(value),
        };
    }

    /// Mean of the results with `grace <= time <= t` (NaN when none).
    fn running_mean(&self, grace: f64, t: f64) -> f64 {
        if self.monotonic {
            // The results in the window are contiguous: two binary searches
            // and a difference of prefix sums, instead of a walk.
            let lo = self.results.partition_point(|&(time, _)| time < grace);
            let hi = self.results.partition_point(|&(time, _)| time <= t);
            let count = hi.saturating_sub(lo);
            return (self.prefix[hi.max(lo)] - self.prefix[lo]) / count as f64;
        }
        let (sum, count) = self
            .results
            .iter()
            .filter(|(time, _)| grace <= *time && *time <= t)
            .fold((0.0, 0usize), |(sum, count), &(_, v)| (sum + v, count + 1));
        sum / count as f64
    }
}

/// The median stopping rule. Starts trials in FIFO order.
///
/// Each result costs one pass over the trials (as Ray's rule), with each
/// trial's running mean taken from prefix sums in `O(log T)` rather than by
/// walking its `T` results, and the pass over a flat array of latest times.
#[derive(Debug)]
pub struct MedianStopping {
    config: MedianStoppingConfig,
    metric: String,
    mode: Mode,
    /// Each trial's position in the arrays below, by trial id.
    index: HashMap<String, usize>,
    /// Trial ids, in order of first result.
    ids: Vec<String>,
    histories: Vec<History>,
    /// Each trial's latest time, for the pass that finds the trials that
    /// have reached `t` without touching their histories.
    latest: Vec<f64>,
    /// The running means of one decision, kept to save an allocation.
    means: Vec<f64>,
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
            index: HashMap::new(),
            ids: Vec::new(),
            histories: Vec::new(),
            latest: Vec::new(),
            means: Vec::new(),
            fifo: Fifo::default(),
        })
    }

    /// The trial's position, added on first sight.
    fn position(&mut self, trial_id: &str) -> usize {
        if let Some(&i) = self.index.get(trial_id) {
            return i;
        }
        let i = self.ids.len();
        self.index.insert(trial_id.to_string(), i);
        self.ids.push(trial_id.to_string());
        self.histories.push(History::new(self.mode));
        self.latest.push(f64::NEG_INFINITY);
        i
    }

    fn push(&mut self, trial_id: &str, time: f64, value: f64) -> usize {
        let i = self.position(trial_id);
        self.histories[i].push(time, value, self.mode, self.config.grace_period);
        self.latest[i] = time;
        i
    }

    /// Appends a result; the trial's position and the result's time, or
    /// `None` when it lacks the time or the metric. A non-finite metric
    /// (`"Infinity"`) is left out as unreported: the running means are
    /// differences of prefix sums, which one infinity would make NaN for
    /// every window after it.
    fn add(&mut self, trial: &Trial, result: &Map<String, Value>) -> Option<(usize, f64)> {
        let time = result.get(&self.config.time_attr)?.as_f64()?;
        let value = result.get(&self.metric)?.as_f64()?;
        Some((self.push(&trial.trial_id, time, value), time))
    }
}

/// The median of `values` (reordered).
fn median(values: &mut [f64]) -> f64 {
    let n = values.len();
    let (below, &mut mid, _) = values.select_nth_unstable_by(n / 2, |a, b| a.total_cmp(b));
    if n % 2 == 1 {
        mid
    } else {
        // The largest of the lower half in the same total order.
        let lower = below
            .iter()
            .copied()
            .max_by(f64::total_cmp)
            .expect("an even count leaves the lower half non-empty");
        (lower + mid) / 2.0
    }
}

impl Scheduler for MedianStopping {
    fn time_attr(&self) -> Option<&str> {
        Some(self.config.time_attr.as_str())
    }

    fn on_result(&mut self, trial: &Trial, result: &Map<String, Value>) -> Decision {
        let Some((own, t)) = self.add(trial, result) else {
            return Decision::Continue;
        };
        let grace = self.config.grace_period;
        if t < grace {
            return Decision::Continue;
        }
        // The other trials whose latest result has reached t.
        let mut means = std::mem::take(&mut self.means);
        means.clear();
        means.extend(
            self.latest
                .iter()
                .enumerate()
                .filter(|&(j, &latest)| j != own && latest >= t)
                .map(|(j, _)| self.histories[j].running_mean(grace, t))
                // A trial with no result in the window has no mean (NaN):
                // it is no sample, rather than a value whose sign, and so
                // its place in the order, depends on the CPU.
                .filter(|mean| !mean.is_nan()),
        );
        let enough = means.len() >= self.config.min_samples_required.max(1);
        let median = if enough { median(&mut means) } else { 0.0 };
        self.means = means;
        if !enough {
            return Decision::Continue;
        }
        let best = self.histories[own].best;
        if self.mode.better(median, best) {
            Decision::Stop
        } else {
            Decision::Continue
        }
    }

    fn on_trial_complete(&mut self, trial: &Trial, result: &Map<String, Value>) {
        self.add(trial, result);
    }

    fn on_trial_retry(&mut self, trial: &Trial) {
        self.fifo.on_trial_retry(trial);
    }

    fn choose_next(&mut self, trials: &[Trial]) -> Option<usize> {
        self.fifo.choose_next(trials)
    }

    fn name(&self) -> &'static str {
        "median_stopping"
    }

    fn state(&self) -> Value {
        let results: BTreeMap<&String, &Vec<(f64, f64)>> = self
            .ids
            .iter()
            .zip(&self.histories)
            .map(|(id, history)| (id, &history.results))
            .collect();
        serde_json::to_value(results).unwrap_or(Value::Null)
    }

    fn restore_state(&mut self, state: &Value) -> Result<(), String> {
        let Some(saved) =
            read_saved::<BTreeMap<String, Vec<(f64, f64)>>>(state, "median stopping")?
        else {
            return Ok(());
        };
        self.index.clear();
        self.ids.clear();
        self.histories.clear();
        self.latest.clear();
        for (id, results) in saved {
            for (time, value) in results {
                self.push(&id, time, value);
            }
        }
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

    /// The prefix-sum means agree with the definition (a walk over every
    /// result), times that go back after a recovery included.
    #[test]
    fn running_means_match_the_definition() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        for case in 0..200 {
            let mut results = Vec::new();
            let mut time = 0.0;
            for _ in 0..rng.random_range(0..30) {
                // Mostly forward, sometimes back (a recovery) or repeated.
                time += match rng.random_range(0..10) {
                    0 => -3.0,
                    1 => 0.0,
                    _ => 1.0,
                };
                results.push((time, rng.random_range(-5.0..5.0)));
            }
            for (grace, t) in [(0.0, 5.0), (2.0, 2.0), (3.0, 40.0), (-1.0, 1.0), (6.0, 3.0)] {
                let mut history = History::new(Mode::Max);
                for &(time, value) in &results {
                    history.push(time, value, Mode::Max, grace);
                }
                let scoped: Vec<f64> = history
                    .results
                    .iter()
                    .filter(|(time, _)| grace <= *time && *time <= t)
                    .map(|&(_, v)| v)
                    .collect();
                let expected = scoped.iter().sum::<f64>() / scoped.len() as f64;
                let got = history.running_mean(grace, t);
                // Bit for bit where the history is monotonic.
                let exact = !history.monotonic || got.to_bits() == expected.to_bits();
                assert!(
                    (expected.is_nan() && got.is_nan()) || ((expected - got).abs() < 1e-9 && exact),
                    "case {case}, grace {grace}, t {t}: {got} != {expected}"
                );
            }
        }
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&mut [3.0]), 3.0);
        assert_eq!(median(&mut [5.0, 1.0, 3.0]), 3.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&mut [7.0, 7.0, 1.0, 9.0, 2.0, 8.0]), 7.0);
    }

    /// An empty window's NaN mean is no sample: with it among three, the
    /// median of an odd count was another trial's mean or the NaN,
    /// depending on the NaN's sign, which depends on the CPU.
    #[test]
    fn an_empty_window_is_no_sample() {
        let config = MedianStoppingConfig {
            grace_period: 0.0,
            min_samples_required: 2,
            ..Default::default()
        };
        let mut r = MedianStopping::new(config, "reward", Mode::Min).unwrap();
        // a's first result is at t = 5: its window at t = 1 is empty.
        r.on_result(&trial("a"), &result(5.0, 0.0));
        r.on_result(&trial("b"), &result(1.0, 0.5));
        r.on_result(&trial("c"), &result(1.0, 0.9));
        // The median of b and c is 0.7: d's 0.6 is better.
        assert_eq!(
            r.on_result(&trial("d"), &result(1.0, 0.6)),
            Decision::Continue
        );
        assert_eq!(r.on_result(&trial("e"), &result(1.0, 0.8)), Decision::Stop);
    }

    /// A Min-mode trial is not stopped because other trials' windows are
    /// empty (their NaN means once made the median -inf).
    #[test]
    fn empty_windows_stop_no_one() {
        let config = MedianStoppingConfig {
            grace_period: 0.0,
            min_samples_required: 2,
            ..Default::default()
        };
        let mut r = MedianStopping::new(config, "reward", Mode::Min).unwrap();
        // a's first result is at t = 5: its window at t = 1 is empty.
        r.on_result(&trial("a"), &result(5.0, 1.0));
        r.on_result(&trial("b"), &result(1.0, 1.0));
        r.on_result(&trial("b"), &result(5.0, 1.0));
        assert_eq!(
            r.on_result(&trial("c"), &result(1.0, -1000.0)),
            Decision::Continue
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
