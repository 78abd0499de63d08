//! Asynchronous successive halving (ASHA, Li et al. 2020), in two variants.
//!
//! Each bracket has rungs at `grace_period * reduction_factor^k` (in units
//! of `time_attr`) up to `max_t`. Trials that reach `max_t` stop.
//!
//! - `variant = "stopping"` (the default; Ray Tune's
//!   `AsyncHyperBandScheduler`): when a trial first reaches a rung, its
//!   result is recorded there and compared with the `1 - 1/reduction_factor`
//!   quantile of the results recorded at that rung so far: below it, the
//!   trial stops, otherwise it goes on.
//! - `variant = "promotion"` (the ASHA paper's algorithm; Syne Tune's
//!   `type="promotion"`): a trial reaching a rung is recorded there and
//!   PAUSED. Whenever a slot is free, [`Scheduler::choose_next`] promotes
//!   (resumes, up to the next rung) a paused trial that is among the best
//!   `floor(n / reduction_factor)` of the `n` results recorded at its rung,
//!   looking at the highest rungs first; failing that it starts a new
//!   trial. A trial that is itself the one to promote when it reaches the
//!   rung goes on without the pause (the same decision, minus a checkpoint
//!   round trip). Ties go to the lower trial id; a missing or NaN metric is
//!   recorded (the rung is passed) but neither counts in `n` nor is ever
//!   promoted. Trials PAUSED for another reason (an interrupted run being
//!   resumed) go on before any promotion.
//!
//! The promotion variant with a finite number of trials: once the searcher
//! is done ([`Scheduler::on_no_more_trials`]) and nothing is running or
//! waiting to start, no rung will get more results, so each rung's share
//! rounds up (`ceil` instead of `floor`): the best trial of an under-filled
//! rung still goes on, one at a time. When even that promotes nothing, the
//! trials still paused can never run again, and [`Scheduler::take_stops`]
//! ends them (TERMINATED), so the experiment ends with no trial left
//! PAUSED.
//!
//! Decisions depend only on results and the order they arrive in: with
//! `time_attr = "fuel_total"`, a seed and one trial at a time, the same
//! experiment makes the same decisions on any machine (with more at once,
//! which trial reaches a rung first depends on speed, as in every
//! asynchronous scheduler).

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::fifo::Fifo;
use super::scheduler::{Decision, Scheduler};
use crate::tune::result::{Mode, metric_number};
use crate::tune::saved::read_saved;
use crate::tune::trial::{Trial, TrialStatus};

/// Which ASHA: early stopping at rungs, or pausing and promoting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum AshaVariant {
    /// Trials below a rung's cutoff stop; the rest go on (Ray Tune's).
    #[default]
    Stopping,
    /// Trials pause at each rung until promoted (the ASHA paper's).
    Promotion,
}

impl TryFrom<String> for AshaVariant {
    type Error = String;
    fn try_from(name: String) -> Result<Self, String> {
        match name.as_str() {
            "stopping" => Ok(AshaVariant::Stopping),
            "promotion" => Ok(AshaVariant::Promotion),
            other => Err(format!(
                "scheduler.variant must be \"stopping\" or \"promotion\", got {other:?}"
            )),
        }
    }
}

impl From<AshaVariant> for String {
    fn from(variant: AshaVariant) -> String {
        match variant {
            AshaVariant::Stopping => "stopping",
            AshaVariant::Promotion => "promotion",
        }
        .into()
    }
}

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
    /// `"stopping"` (the default) or `"promotion"`.
    pub variant: AshaVariant,
}

impl Default for AshaConfig {
    fn default() -> Self {
        Self {
            time_attr: "training_iteration".into(),
            max_t: 100.0,
            grace_period: 1.0,
            reduction_factor: 4.0,
            brackets: 1,
            variant: AshaVariant::Stopping,
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
    #[serde(with = "nan_as_null")]
    recorded: BTreeMap<String, f64>,
}

/// Recorded rewards as saved: NaN (a missing metric) becomes JSON null and
/// comes back as NaN, which a plain `f64` field would refuse; an infinity
/// (a diverged trial's) is written as `metric_value` writes it.
mod nan_as_null {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serializer};
    use serde_json::Value;

    use crate::tune::result::{metric_number, metric_value};

    pub fn serialize<S: Serializer>(
        map: &BTreeMap<String, f64>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        let saved = |v: f64| (!v.is_nan()).then(|| metric_value(v));
        serializer.collect_map(map.iter().map(|(k, v)| (k, saved(*v))))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<BTreeMap<String, f64>, D::Error> {
        let raw = BTreeMap::<String, Value>::deserialize(deserializer)?;
        Ok(raw
            .into_iter()
            .map(|(k, v)| (k, metric_number(&v).unwrap_or(f64::NAN)))
            .collect())
    }
}

/// Where a paused trial of the promotion variant waits: a bracket and a
/// rung (counted from the highest).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Held {
    bracket: usize,
    rung: usize,
}

/// A result that is a number, in promotion order: the best first, ties by
/// trial id.
#[derive(Debug, Clone)]
struct Ranked {
    reward: f64,
    id: String,
}

impl Ord for Ranked {
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .reward
            .total_cmp(&self.reward)
            .then_with(|| self.id.cmp(&other.id))
    }
}

impl PartialOrd for Ranked {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Ranked {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Ranked {}

/// The ASHA scheduler. The stopping variant starts trials in FIFO order;
/// the promotion variant prefers promotions to new trials.
#[derive(Debug)]
pub struct Asha {
    config: AshaConfig,
    metric: String,
    mode: Mode,
    /// Per bracket, rungs from the highest milestone down.
    brackets: Vec<Vec<Rung>>,
    /// Which bracket each trial belongs to.
    assigned: BTreeMap<String, usize>,
    /// Promotion variant: trials paused at a rung and not promoted yet.
    held: BTreeMap<String, Held>,
    /// The searcher is done (promotion variant: the end game may start).
    no_more_trials: bool,
    seed: u64,
    fifo: Fifo,
    /// Caches rebuilt from the state (not saved). Per bracket and rung,
    /// the results that are numbers in promotion order (both variants: the
    /// stopping variant reads its cutoff from it).
    ranked: Vec<Vec<Vec<Ranked>>>,
    /// Per bracket and rung, the held trials whose result there is a
    /// number, in promotion order.
    held_ranked: Vec<Vec<BTreeSet<Ranked>>>,
    /// Held trials last seen PAUSED, by id, with their index: they stay
    /// so until this scheduler lets them go (promotes or ends them, or is
    /// told they ended), so the survey need not look at them again.
    settled: HashMap<String, usize>,
    /// Indices of the trials the survey still looks at: all those seen
    /// that are neither finished nor settled.
    unsettled: BTreeSet<usize>,
    /// How many trials the survey has seen.
    seen: usize,
}

#[derive(Serialize, Deserialize)]
struct AshaState {
    brackets: Vec<Vec<Rung>>,
    assigned: BTreeMap<String, usize>,
    #[serde(default)]
    held: BTreeMap<String, Held>,
    #[serde(default)]
    no_more_trials: bool,
}

/// What the promotion variant needs to know about the trials.
#[derive(Default)]
struct Survey {
    /// The first PAUSED trial not held at a rung (paused by an interrupted
    /// run): it goes on first.
    free_paused: Option<usize>,
    /// The first PENDING trial.
    pending: Option<usize>,
    /// Something is RUNNING or PENDING, so rungs may still get results.
    busy: bool,
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
        let mut asha = Self {
            config,
            metric: metric.to_string(),
            mode,
            brackets,
            assigned: BTreeMap::new(),
            held: BTreeMap::new(),
            no_more_trials: false,
            seed,
            fifo: Fifo::default(),
            ranked: Vec::new(),
            held_ranked: Vec::new(),
            settled: HashMap::new(),
            unsettled: BTreeSet::new(),
            seen: 0,
        };
        asha.rebuild_caches();
        Ok(asha)
    }

    /// Rebuilds the promotion caches from `brackets` and `held`, and makes
    /// the next survey look at every trial again.
    fn rebuild_caches(&mut self) {
        self.ranked = self
            .brackets
            .iter()
            .map(|rungs| {
                rungs
                    .iter()
                    .map(|rung| {
                        let mut ranked: Vec<Ranked> = rung
                            .recorded
                            .iter()
                            .filter(|(_, v)| !v.is_nan())
                            .map(|(id, &reward)| Ranked {
                                reward,
                                id: id.clone(),
                            })
                            .collect();
                        ranked.sort();
                        ranked
                    })
                    .collect()
            })
            .collect();
        self.held_ranked = self
            .brackets
            .iter()
            .map(|rungs| vec![BTreeSet::new(); rungs.len()])
            .collect();
        let held: Vec<(String, Held)> = self.held.iter().map(|(k, v)| (k.clone(), *v)).collect();
        for (id, at) in held {
            self.index_held(&id, at);
        }
        self.settled.clear();
        self.unsettled.clear();
        self.seen = 0;
    }

    /// The held trial's entry in `held_ranked`, when its result at its
    /// rung is a number.
    fn held_entry(&self, id: &str, at: Held) -> Option<Ranked> {
        let reward = *self
            .brackets
            .get(at.bracket)?
            .get(at.rung)?
            .recorded
            .get(id)?;
        (!reward.is_nan()).then(|| Ranked {
            reward,
            id: id.to_string(),
        })
    }

    fn index_held(&mut self, id: &str, at: Held) {
        if let Some(entry) = self.held_entry(id, at) {
            self.held_ranked[at.bracket][at.rung].insert(entry);
        }
    }

    /// Holds a trial at a rung.
    fn hold(&mut self, id: &str, at: Held) {
        self.unhold(id);
        self.held.insert(id.to_string(), at);
        self.index_held(id, at);
    }

    /// Lets a held trial go (no-op when it is not held).
    fn unhold(&mut self, id: &str) {
        let Some(at) = self.held.remove(id) else {
            return;
        };
        if let Some(entry) = self.held_entry(id, at) {
            self.held_ranked[at.bracket][at.rung].remove(&entry);
        }
        if let Some(index) = self.settled.remove(id) {
            self.unsettled.insert(index);
        }
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

/// numpy's `percentile` (linear interpolation) of the numbers in `ranked`,
/// which holds them best (highest) first.
fn percentile(ranked: &[Ranked], q: f64) -> f64 {
    let n = ranked.len();
    let ascending = |k: usize| ranked[n - 1 - k].reward;
    let pos = q / 100.0 * (n - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    let (a, b, f) = (ascending(lo), ascending(hi), pos - lo as f64);
    // Between an infinite reward (a diverged trial's) and another, the
    // line is that infinity: the arithmetic would make it NaN, which no
    // reward falls below.
    if f == 0.0 || a == b || a.is_infinite() {
        a
    } else if b.is_infinite() {
        b
    } else {
        a + (b - a) * f
    }
}

impl Asha {
    /// Records `result` at the first rung it reaches that has no result of
    /// this trial yet, and says whether it falls below that rung's cutoff.
    fn record(&mut self, trial: &Trial, t: f64, result: &Map<String, Value>) -> Decision {
        // A missing or NaN metric (JSON null) is recorded as NaN, marking
        // the rung as passed; cutoffs ignore NaN (numpy's nanpercentile).
        let reward = match result.get(&self.metric).and_then(metric_number) {
            Some(v) if self.mode == Mode::Min => -v,
            Some(v) => v,
            None => f64::NAN,
        };
        let bracket = self.bracket_for(&trial.trial_id);
        let keep = 1.0 - 1.0 / self.config.reduction_factor;
        let Some(rung) = self.brackets[bracket]
            .iter()
            .position(|r| t >= r.milestone && !r.recorded.contains_key(&trial.trial_id))
        else {
            return Decision::Continue;
        };
        self.brackets[bracket][rung]
            .recorded
            .insert(trial.trial_id.clone(), reward);
        // The rung's numbers stay sorted as they arrive, so the cutoff is
        // an index away instead of a sort of every result per call.
        let ranked = &mut self.ranked[bracket][rung];
        let stop = !ranked.is_empty() && reward < percentile(ranked, keep * 100.0);
        if !reward.is_nan() {
            let entry = Ranked {
                reward,
                id: trial.trial_id.clone(),
            };
            if let Err(pos) = ranked.binary_search(&entry) {
                ranked.insert(pos, entry);
            }
        }
        if stop {
            Decision::Stop
        } else {
            Decision::Continue
        }
    }
}

/// Promotion variant.
impl Asha {
    /// The reward of a result: the metric, negated under `min` so that
    /// higher is better; NaN when missing.
    fn reward(&self, result: &Map<String, Value>) -> f64 {
        match result.get(&self.metric).and_then(metric_number) {
            Some(v) if self.mode == Mode::Min => -v,
            Some(v) => v,
            None => f64::NAN,
        }
    }

    /// Records a result at the highest rung `t` has reached among those
    /// above the highest the trial is already recorded at (a promoted trial
    /// must not fall back to a rung it skipped), and says which rung.
    fn record_above(&mut self, trial_id: &str, t: f64, reward: f64) -> Option<Held> {
        let bracket = self.bracket_for(trial_id);
        let rungs = &mut self.brackets[bracket];
        let limit = rungs
            .iter()
            .position(|r| r.recorded.contains_key(trial_id))
            .unwrap_or(rungs.len());
        let rung = (0..limit).find(|&r| t >= rungs[r].milestone)?;
        rungs[rung].recorded.insert(trial_id.to_string(), reward);
        if !reward.is_nan() {
            let entry = Ranked {
                reward,
                id: trial_id.to_string(),
            };
            let ranked = &mut self.ranked[bracket][rung];
            if let Err(pos) = ranked.binary_search(&entry) {
                ranked.insert(pos, entry);
            }
        }
        Some(Held { bracket, rung })
    }

    /// The trial to promote next: rungs by milestone from the highest (ties
    /// by bracket), and in each the best held trial that `available` allows,
    /// if it is among the best `n / reduction_factor` (rounded down, or up
    /// in the end game) of the rung's `n` results that are numbers (best
    /// first, ties by trial id).
    fn promotable(&self, round_up: bool, available: impl Fn(&str) -> bool) -> Option<String> {
        let mut rungs: Vec<Held> = (0..self.brackets.len())
            .flat_map(|bracket| {
                (0..self.brackets[bracket].len()).map(move |rung| Held { bracket, rung })
            })
            .collect();
        rungs.sort_by(|a, b| {
            let milestone = |h: &Held| self.brackets[h.bracket][h.rung].milestone;
            milestone(b)
                .total_cmp(&milestone(a))
                .then(a.bracket.cmp(&b.bracket))
        });
        rungs.into_iter().find_map(|at| {
            let ranked = &self.ranked[at.bracket][at.rung];
            let share = ranked.len() as f64 / self.config.reduction_factor;
            let quota = if round_up {
                share.ceil()
            } else {
                share.floor()
            } as usize;
            let last = ranked.get(quota.min(ranked.len()).checked_sub(1)?)?;
            self.held_ranked[at.bracket][at.rung]
                .iter()
                .find(|entry| available(&entry.id))
                .filter(|entry| *entry <= last)
                .map(|entry| entry.id.clone())
        })
    }

    /// Makes the next survey look at every trial again.
    fn resync(&mut self, len: usize) {
        self.settled.clear();
        self.unsettled = (0..len).collect();
        self.seen = len;
    }

    /// Whether the settled trial `id` is still PAUSED where it was seen.
    fn still_settled(&self, trials: &[Trial], id: &str) -> bool {
        self.settled.get(id).is_some_and(|&i| {
            trials
                .get(i)
                .is_some_and(|t| t.status == TrialStatus::Paused && t.trial_id == id)
        })
    }

    /// Looks at the trials not settled, forgetting held trials that have
    /// finished and settling held trials now PAUSED.
    fn survey(&mut self, trials: &[Trial]) -> Survey {
        if trials.len() < self.seen {
            self.resync(trials.len());
        }
        self.unsettled.extend(self.seen..trials.len());
        self.seen = trials.len();
        let mut survey = Survey::default();
        let mut gone = Vec::new();
        let mut settle = Vec::new();
        for &i in &self.unsettled {
            let trial = &trials[i];
            match trial.status {
                TrialStatus::Paused => {
                    if self.held.contains_key(&trial.trial_id) {
                        settle.push(i);
                    } else if survey.free_paused.is_none() {
                        survey.free_paused = Some(i);
                    }
                }
                TrialStatus::Pending => {
                    survey.pending = survey.pending.or(Some(i));
                    survey.busy = true;
                }
                TrialStatus::Running => survey.busy = true,
                TrialStatus::Terminated | TrialStatus::Error => gone.push(i),
            }
        }
        for i in gone {
            self.unsettled.remove(&i);
            self.unhold(&trials[i].trial_id);
        }
        for i in settle {
            self.unsettled.remove(&i);
            if let Some(old) = self.settled.insert(trials[i].trial_id.clone(), i)
                && old != i
            {
                self.unsettled.insert(old);
            }
        }
        survey
    }

    /// Whether no rung can get another result: the searcher is done and
    /// nothing is running, waiting to start, or paused outside a rung.
    fn end_game(&self, survey: &Survey) -> bool {
        self.no_more_trials && !survey.busy && survey.free_paused.is_none()
    }

    fn on_result_promotion(&mut self, trial: &Trial, result: &Map<String, Value>) -> Decision {
        let id = trial.trial_id.as_str();
        let Some(t) = result.get(&self.config.time_attr).and_then(Value::as_f64) else {
            return Decision::Continue;
        };
        if t >= self.config.max_t {
            self.unhold(id);
            return Decision::Stop;
        }
        let reward = self.reward(result);
        let Some(at) = self.record_above(id, t, reward) else {
            return Decision::Continue;
        };
        self.hold(id, at);
        // The slot this trial frees would go to the best promotable trial;
        // when that is this one, it simply goes on.
        if self.promotable(false, |_| true).as_deref() == Some(id) {
            self.unhold(id);
            Decision::Continue
        } else {
            Decision::Pause
        }
    }
}

impl Scheduler for Asha {
    fn time_attr(&self) -> Option<&str> {
        Some(self.config.time_attr.as_str())
    }

    fn on_result(&mut self, trial: &Trial, result: &Map<String, Value>) -> Decision {
        if self.config.variant == AshaVariant::Promotion {
            return self.on_result_promotion(trial, result);
        }
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
        let Some(t) = result.get(&self.config.time_attr).and_then(Value::as_f64) else {
            return;
        };
        match self.config.variant {
            AshaVariant::Stopping => {
                self.record(trial, t, result);
            }
            AshaVariant::Promotion => {
                self.unhold(&trial.trial_id);
                let reward = self.reward(result);
                self.record_above(&trial.trial_id, t, reward);
            }
        }
    }

    fn on_trial_remove(&mut self, trial: &Trial) {
        // Its results stay recorded (they were real); it just cannot be
        // promoted.
        self.unhold(&trial.trial_id);
    }

    fn on_trial_retry(&mut self, trial: &Trial) {
        // Seen finished, it was dropped from the trials looked at: look at
        // all again (once per retry).
        self.fifo.on_trial_retry(trial);
        self.resync(self.seen);
    }

    fn on_no_more_trials(&mut self) {
        self.no_more_trials = true;
    }

    fn on_more_trials(&mut self) {
        self.no_more_trials = false;
    }

    fn choose_next(&mut self, trials: &[Trial]) -> Option<usize> {
        if self.config.variant == AshaVariant::Stopping {
            return self.fifo.choose_next(trials);
        }
        let survey = self.survey(trials);
        if survey.free_paused.is_some() {
            return survey.free_paused;
        }
        let round_up = self.end_game(&survey);
        let settled = &self.settled;
        if let Some(id) = self.promotable(round_up, |id| settled.contains_key(id)) {
            if !self.still_settled(trials, &id) {
                // Changed behind this scheduler's back: look at all again.
                self.resync(trials.len());
                return self.choose_next(trials);
            }
            let index = self.settled[&id];
            self.unhold(&id);
            return Some(index);
        }
        survey.pending
    }

    fn take_stops(&mut self, trials: &[Trial]) -> Vec<usize> {
        if self.config.variant == AshaVariant::Stopping || !self.no_more_trials {
            return Vec::new();
        }
        let survey = self.survey(trials);
        if self.held.is_empty() || !self.end_game(&survey) {
            return Vec::new();
        }
        let settled = &self.settled;
        if let Some(id) = self.promotable(true, |id| settled.contains_key(id)) {
            if !self.still_settled(trials, &id) {
                self.resync(trials.len());
                return self.take_stops(trials);
            }
            return Vec::new();
        }
        if self
            .settled
            .keys()
            .any(|id| !self.still_settled(trials, id))
        {
            self.resync(trials.len());
            return self.take_stops(trials);
        }
        // Nothing can promote them any more.
        let ids: Vec<String> = self.settled.keys().cloned().collect();
        let mut ended: Vec<usize> = self.settled.values().copied().collect();
        for id in ids {
            self.unhold(&id);
        }
        ended.sort_unstable();
        ended
    }

    fn name(&self) -> &'static str {
        "asha"
    }

    fn state(&self) -> Value {
        serde_json::to_value(AshaState {
            brackets: self.brackets.clone(),
            assigned: self.assigned.clone(),
            held: self.held.clone(),
            no_more_trials: self.no_more_trials,
        })
        .unwrap_or(Value::Null)
    }

    fn restore_state(&mut self, state: &Value) -> Result<(), String> {
        let Some(saved) = read_saved::<AshaState>(state, "ASHA")? else {
            return Ok(());
        };
        let same_shape = saved.brackets.len() == self.brackets.len()
            && saved.brackets.iter().zip(&self.brackets).all(|(a, b)| {
                a.len() == b.len()
                    && a.iter().zip(b).all(|(x, y)| {
                        (x.milestone - y.milestone).abs() <= 1e-9 * y.milestone.abs().max(1.0)
                    })
            });
        if !same_shape {
            return Err("the saved ASHA state has other rungs than this configuration".into());
        }
        if let Some((id, at)) = saved.held.iter().find(|(_, at)| {
            at.bracket >= self.brackets.len() || at.rung >= self.brackets[at.bracket].len()
        }) {
            return Err(format!(
                "the saved ASHA state holds {id} at bracket {} rung {}, which this \
                 configuration does not have",
                at.bracket, at.rung
            ));
        }
        if let Some((id, b)) = saved
            .assigned
            .iter()
            .find(|&(_, &b)| b >= self.brackets.len())
        {
            return Err(format!(
                "the saved ASHA state puts {id} in bracket {b}, which this configuration \
                 does not have"
            ));
        }
        // Keep this configuration's milestones: the saved ones went through
        // JSON text.
        for (rungs, saved_rungs) in self.brackets.iter_mut().zip(saved.brackets) {
            for (rung, saved_rung) in rungs.iter_mut().zip(saved_rungs) {
                rung.recorded = saved_rung.recorded;
            }
        }
        self.assigned = saved.assigned;
        self.held = saved.held;
        self.no_more_trials = saved.no_more_trials;
        self.rebuild_caches();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tune::schedulers::sim::Sim;
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

    /// A loss that diverged, reported as `"Infinity"`, ranks worst under
    /// `min` and is stopped at its rung, as Ray's `-inf < cutoff` does;
    /// cutoffs stay numbers with it among the rewards, and a saved state
    /// keeps it.
    #[test]
    fn a_diverged_trial_is_stopped_and_its_reward_is_kept() {
        let config = AshaConfig {
            max_t: 10.0,
            grace_period: 1.0,
            reduction_factor: 2.0,
            ..AshaConfig::default()
        };
        let mut asha = Asha::new(config.clone(), "score", Mode::Min, 0).unwrap();
        let loss = |t: u64, loss: Value| {
            json!({"training_iteration": t, "score": loss})
                .as_object()
                .unwrap()
                .clone()
        };
        assert_eq!(
            asha.on_result(&trial(0), &loss(1, json!(1.0))),
            Decision::Continue
        );
        assert_eq!(
            asha.on_result(&trial(1), &loss(1, json!(2.0))),
            Decision::Stop
        );
        assert_eq!(
            asha.on_result(&trial(2), &loss(1, json!("Infinity"))),
            Decision::Stop
        );
        // The cutoff, the median of -1, -2 and -inf, is -2: 1.5 passes.
        assert_eq!(
            asha.on_result(&trial(3), &loss(1, json!(1.5))),
            Decision::Continue
        );
        let state = asha.state();
        assert!(state.to_string().contains("\"-Infinity\""), "{state}");
        let mut restored = Asha::new(config, "score", Mode::Min, 0).unwrap();
        restored.restore_state(&state).unwrap();
        assert_eq!(restored.state(), state);
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

    /// The promotion variant's hand-worked experiment: max_t = 9, grace 1,
    /// rf = 3, so rungs at 1 and 3 (9 is max_t: trials stop there). Each
    /// trial reports the same score at every iteration.
    const SCORES: [f64; 9] = [0.5, 0.2, 0.3, 0.9, 0.1, 0.6, 0.4, 0.8, 0.7];

    fn promotion(time_attr: &str, scale: f64) -> Asha {
        let config = AshaConfig {
            time_attr: time_attr.into(),
            max_t: 9.0 * scale,
            grace_period: scale,
            reduction_factor: 3.0,
            variant: AshaVariant::Promotion,
            ..AshaConfig::default()
        };
        Asha::new(config, "score", Mode::Max, 0).unwrap()
    }

    #[test]
    fn promotion_variant_pauses_and_promotes_as_worked_out_by_hand() {
        // One slot, trials created only when nothing can be promoted.
        // "q" is the share floor(n / 3) of the n results at a rung.
        //  0 (0.5) at 1: n=1, q=0: pause.      1 (0.2) at 1: n=2, q=0: pause.
        //  2 (0.3) at 1: n=3, q=1 -> 0: pause 2; 0 is promoted (resumed at 1).
        //  0 at 3: rung 3 n=1, q=0: pause.
        //  3 (0.9) at 1: n=4, q=1 -> 3 itself: goes on. At 3: n=2, q=0: pause.
        //  4 (0.1) at 1: n=5, q=1 -> 3, promoted already: pause.
        //  5 (0.6) at 1: n=6, q=2 -> 3, 5: 5 goes on. At 3: n=3, q=1 -> 3,
        //    paused there: pause 5; 3 is promoted (resumed at 3), stops at 9.
        //  6 (0.4) at 1: n=7, q=2 -> 3, 5: pause.
        //  7 (0.8) at 1: n=8, q=2 -> 3, 7: 7 goes on. At 3: n=4, q=1 -> 3: pause.
        //  8 (0.7) at 1: n=9, q=3 -> 3, 7, 8: goes on. At 3: n=5, q=1: pause.
        // The searcher is done and nothing runs: shares round up. Rung 3:
        // ceil(5/3) = 2 -> 3, 7: 7 is promoted (resumed at 3), stops at 9.
        // Then rung 3 has no one left in its share (3, 7), nor rung 1
        // (ceil(9/3) = 3 -> 3, 7, 8; 8 waits at rung 3, not 1): the paused
        // 0, 1, 2, 4, 5, 6, 8 are ended.
        for (time_attr, scale) in [("training_iteration", 1.0), ("fuel_total", 1000.0)] {
            let mut s = promotion(time_attr, scale);
            assert_eq!(
                s.milestones(),
                [vec![9.0 * scale, 3.0 * scale, scale]],
                "{time_attr}"
            );
            let mut sim = Sim::new(9, 1);
            assert!(sim.run(&mut s, &|i, _| SCORES[i], None));
            assert_eq!(sim.iterations(), [3, 1, 1, 9, 1, 3, 1, 9, 3], "{time_attr}");
            assert_eq!(sim.resumed, [(0, 1), (3, 3), (7, 3)], "{time_attr}");
            assert_eq!(sim.taken, [0, 1, 2, 4, 5, 6, 8], "{time_attr}");
            assert!(sim.unfinished().is_empty());
        }
    }

    #[test]
    fn promotion_state_round_trip_resumes_with_the_same_decisions() {
        for cut in [3, 12, 20] {
            let mut first = promotion("training_iteration", 1.0);
            let mut sim = Sim::new(9, 1);
            assert!(!sim.run(&mut first, &|i, _| SCORES[i], Some(cut)));
            let text = serde_json::to_string(&first.state()).unwrap();
            let mut second = promotion("training_iteration", 1.0);
            second
                .restore_state(&serde_json::from_str(&text).unwrap())
                .unwrap();
            assert_eq!(second.state(), first.state());
            assert!(sim.run(&mut second, &|i, _| SCORES[i], None));
            assert_eq!(
                sim.iterations(),
                [3, 1, 1, 9, 1, 3, 1, 9, 3],
                "cut at {cut}"
            );
            assert!(sim.unfinished().is_empty());
        }
    }

    #[test]
    fn promotion_ends_cleanly_with_many_slots_and_missing_metrics() {
        // Asynchronous: who reaches a rung first depends on the slots, so
        // only what must hold whatever the order is checked. Trial 9
        // never reports its metric: recorded, never promoted.
        let score = |i: usize, t: u64| match i {
            9 => f64::NAN,
            _ => ((i * 7) % 11) as f64 + t as f64 / 10.0,
        };
        for slots in [2, 3, 5, 16] {
            let mut s = promotion("training_iteration", 1.0);
            let mut sim = Sim::new(20, slots);
            assert!(sim.run(&mut s, &score, None));
            assert!(sim.unfinished().is_empty(), "{slots} slots");
            let iterations = sim.iterations();
            assert!(
                iterations.iter().all(|t| [1, 3, 9].contains(t)),
                "trials pause only at rungs and stop at max_t: {iterations:?}"
            );
            assert_eq!(iterations[9], 1, "a missing metric is never promoted");
            // (i * 7) % 11 is 10 for i = 3 and 14, the best two (3 wins the
            // tie on id). All 20 record at rung 1, so its share, 3 and 14
            // among them, reaches rung 3, whose share of those 6 or more
            // holds the best two: both reach max_t in any order of events.
            assert_eq!((iterations[3], iterations[14]), (9, 9), "{slots} slots");
            assert!(s.held.is_empty());
        }
    }

    #[test]
    fn nan_results_survive_a_state_round_trip() {
        let mut s = asha(8.0, 1.0, 2.0, 1);
        let nan = json!({"training_iteration": 1, "score": null});
        assert_eq!(
            s.on_result(&trial(0), nan.as_object().unwrap()),
            Decision::Continue
        );
        s.on_result(&trial(1), &result(1, 5.0));
        let text = serde_json::to_string(&s.state()).unwrap();
        let mut restored = asha(8.0, 1.0, 2.0, 1);
        restored
            .restore_state(&serde_json::from_str(&text).unwrap())
            .unwrap();
        // Still ignored by the cutoff: only 5 counts.
        assert_eq!(
            restored.on_result(&trial(2), &result(1, 4.9)),
            Decision::Stop
        );
        assert_eq!(
            restored.on_result(&trial(3), &result(1, 5.1)),
            Decision::Continue
        );
    }

    #[test]
    fn variant_defaults_to_stopping_and_bad_names_are_refused() {
        let config: AshaConfig = serde_json::from_value(json!({})).unwrap();
        assert_eq!(config.variant, AshaVariant::Stopping);
        assert_eq!(
            serde_json::to_value(&config).unwrap()["variant"],
            "stopping"
        );
        let config: AshaConfig = serde_json::from_value(json!({"variant": "promotion"})).unwrap();
        assert_eq!(config.variant, AshaVariant::Promotion);
        let message = serde_json::from_value::<AshaConfig>(json!({"variant": "Promotion"}))
            .unwrap_err()
            .to_string();
        assert!(message.contains("scheduler.variant"), "{message}");
    }
}
