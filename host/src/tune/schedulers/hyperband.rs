//! Synchronous HyperBand (Li et al., 2018), run as Ray Tune's
//! `HyperBandScheduler` runs it.
//!
//! Trials are grouped into brackets. A band holds `s_max + 1` brackets,
//! where `s_max + 1 = round(log(max_t) / log(reduction_factor)) + 1`;
//! bracket `s` of a band takes `ceil((s_max + 1) / (s + 1) *
//! reduction_factor^s)` trials and has the milestones `max_t /
//! reduction_factor^(s - k)` for `k = 0..=s` (so `s` rounds of halving,
//! the last milestone `max_t`). New trials fill the newest bracket; once it
//! is full the next one of the band opens (`s = 0` first, as in Ray), and
//! once the band is complete a new band starts.
//!
//! A trial whose `time_attr` reaches its bracket's current milestone is
//! PAUSED until every live trial of the bracket has reached it. Then the
//! best `ceil(m / reduction_factor)` of the `m` live trials go on to the
//! next milestone and the rest stop: the one whose result completed the
//! rung through [`Decision::Stop`], the paused ones through
//! [`Scheduler::take_stops`]. Trials reaching `max_t` stop (unless
//! `stop_last_trials = false`: then they go on until a stopping criterion
//! ends them). Ranking uses each trial's latest result; a missing or NaN
//! metric ranks last, and ties go to the trial that joined the bracket
//! first. Decisions depend only on results and the order of events, never
//! on timing or randomness.
//!
//! A bracket that is still filling when the searcher runs out
//! ([`Scheduler::on_no_more_trials`]) is ranked with the trials it has.
//! Trials that fail or end on their own leave their bracket, which then
//! ranks without them; while the bracket is still filling, a new trial takes
//! the place.
//!
//! Where this differs from Ray: milestones are exact (`max_t /
//! reduction_factor^j`, not truncated to integers), so every bracket ends
//! at `max_t` even when `max_t` is not a power of `reduction_factor`, and
//! no bracket is skipped for a first milestone below 1 (with
//! `training_iteration` it is reached at the first result). The number
//! kept is computed from the trials still live rather than from the
//! bracket's nominal size; the two agree when no trial fails.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::scheduler::{Decision, Scheduler};
use crate::tune::result::{Mode, metric_number};
use crate::tune::saved::read_saved;
use crate::tune::trial::{Trial, TrialStatus};

/// HyperBand's parameters, with Ray Tune's names and defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HyperBandConfig {
    /// The result field that measures progress: `training_iteration`,
    /// `time_total_s` or `fuel_total` (any increasing number works).
    pub time_attr: String,
    /// The last milestone of every bracket, in units of `time_attr`.
    pub max_t: f64,
    /// Each rung keeps the best `1 / reduction_factor` of its trials (η).
    pub reduction_factor: f64,
    /// Whether trials stop at `max_t`; when false they go on until a
    /// stopping criterion (or the trainable) ends them.
    pub stop_last_trials: bool,
}

impl Default for HyperBandConfig {
    fn default() -> Self {
        Self {
            time_attr: "training_iteration".into(),
            max_t: 81.0,
            reduction_factor: 3.0,
            stop_last_trials: true,
        }
    }
}

/// More brackets per band than this means a reduction factor too close to
/// 1 to be meant: bracket sizes grow like `reduction_factor^s`.
const MAX_BRACKETS: usize = 64;

impl HyperBandConfig {
    /// Checks the parameters, naming the first bad one.
    pub fn validate(&self) -> Result<(), String> {
        if self.time_attr.is_empty() {
            return Err(
                "scheduler.time_attr must name a result field, such as \"training_iteration\", \
                 \"time_total_s\" or \"fuel_total\""
                    .into(),
            );
        }
        if !(self.reduction_factor > 1.0 && self.reduction_factor.is_finite()) {
            return Err(format!(
                "scheduler.reduction_factor must be a number greater than 1, got {}",
                self.reduction_factor
            ));
        }
        if !(self.max_t >= 1.0 && self.max_t.is_finite()) {
            return Err(format!(
                "scheduler.max_t must be a number of at least 1 (in units of time_attr), got {}",
                self.max_t
            ));
        }
        let brackets = self.brackets_per_band();
        if brackets > MAX_BRACKETS {
            return Err(format!(
                "scheduler: max_t = {} with reduction_factor = {} gives {brackets} brackets per \
                 band; at most {MAX_BRACKETS} are useful (raise reduction_factor or lower max_t)",
                self.max_t, self.reduction_factor
            ));
        }
        Ok(())
    }

    /// Ray's `s_max + 1`: `round(log(max_t) / log(η)) + 1`, rounding half
    /// to even as numpy does.
    fn brackets_per_band(&self) -> usize {
        let rounds = (self.max_t.ln() / self.reduction_factor.ln()).round_ties_even();
        if rounds.is_finite() && rounds > 0.0 {
            rounds.min(u32::MAX as f64) as usize + 1
        } else {
            1
        }
    }

    /// Bracket `s` of a band: how many trials it takes, and its milestones
    /// in increasing order.
    fn bracket_shape(&self, s: usize) -> (usize, Vec<f64>) {
        let eta = self.reduction_factor;
        // Ray's expression, in Ray's order, so that the float rounding (and
        // hence the ceiling) comes out the same.
        let size = (self.brackets_per_band() as f64 / (s as f64 + 1.0) * eta.powf(s as f64))
            .ceil()
            .max(1.0) as usize;
        let milestones = (0..=s)
            .map(|k| self.max_t / eta.powf((s - k) as f64))
            .collect();
        (size, milestones)
    }
}

/// Where a live trial stands in its bracket's current rung.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Standing {
    /// Not yet at the current milestone (or not started).
    Active,
    /// At or past the current milestone, held until the rung is ranked.
    Waiting,
}

/// A live trial of a bracket.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Member {
    trial_id: String,
    /// `time_attr` of its latest result that had one.
    time: Option<f64>,
    /// The metric of its latest result, negated under `min` so that higher
    /// is better; `None` when missing or NaN (ranks last).
    reward: Option<f64>,
    standing: Standing,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Bracket {
    /// How many trials the bracket takes.
    size: usize,
    /// Increasing; the last is `max_t`.
    milestones: Vec<f64>,
    /// Index of the milestone the live trials are heading for.
    rung: usize,
    /// Still taking new trials.
    open: bool,
    /// Trials that have taken a place: those that joined, less those that
    /// failed or ended on their own while it was open (their places are
    /// taken again).
    joined: usize,
    /// Live trials, in the order they joined (which breaks ties).
    members: Vec<Member>,
}

/// Better first: higher reward, then present before missing.
fn by_reward(a: Option<f64>, b: Option<f64>) -> Ordering {
    match (a, b) {
        (Some(a), Some(b)) => b.total_cmp(&a),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => Ordering::Equal,
    }
}

/// The synchronous HyperBand scheduler. Starts trials in the order they
/// were created, and released (promoted) trials in the same order.
#[derive(Debug)]
pub struct HyperBand {
    config: HyperBandConfig,
    metric: String,
    mode: Mode,
    /// Every bracket opened so far; bracket `b` is bracket `b % per band`
    /// of its band.
    brackets: Vec<Bracket>,
    /// The bracket of every trial ever added, ended ones included: a known
    /// trial that is no bracket's member has ended here.
    assigned: BTreeMap<String, usize>,
    /// Trials ended here that the runner has not yet ended
    /// ([`Scheduler::take_stops`]).
    stopping: BTreeSet<String>,
    /// The searcher is done: no bracket waits for more trials.
    no_more_trials: bool,
    /// Trials before this index are finished (never chosen again); a cache,
    /// not state.
    cursor: usize,
}

#[derive(Serialize, Deserialize)]
struct HyperBandState {
    brackets: Vec<Bracket>,
    assigned: BTreeMap<String, usize>,
    stopping: BTreeSet<String>,
    no_more_trials: bool,
}

impl HyperBand {
    /// HyperBand ranking trials by `metric` under `mode`.
    pub fn new(config: HyperBandConfig, metric: &str, mode: Mode) -> Result<Self, String> {
        config.validate()?;
        Ok(Self {
            config,
            metric: metric.to_string(),
            mode,
            brackets: Vec::new(),
            assigned: BTreeMap::new(),
            stopping: BTreeSet::new(),
            no_more_trials: false,
            cursor: 0,
        })
    }

    /// The brackets of one band, in the order trials fill them: how many
    /// trials each takes, and its milestones in increasing order.
    pub fn band(&self) -> Vec<(usize, Vec<f64>)> {
        (0..self.config.brackets_per_band())
            .map(|s| self.config.bracket_shape(s))
            .collect()
    }

    /// The bracket a trial belongs to, adding it to the newest bracket (or
    /// a new one) when it has none yet.
    fn join(&mut self, trial_id: &str) -> usize {
        if let Some(&b) = self.assigned.get(trial_id) {
            return b;
        }
        let b = match self.brackets.last() {
            Some(last) if last.open => self.brackets.len() - 1,
            _ => {
                let s = self.brackets.len() % self.config.brackets_per_band();
                let (size, milestones) = self.config.bracket_shape(s);
                self.brackets.push(Bracket {
                    size,
                    milestones,
                    rung: 0,
                    open: !self.no_more_trials,
                    joined: 0,
                    members: Vec::new(),
                });
                self.brackets.len() - 1
            }
        };
        let bracket = &mut self.brackets[b];
        bracket.members.push(Member {
            trial_id: trial_id.to_string(),
            time: None,
            reward: None,
            standing: Standing::Active,
        });
        bracket.joined += 1;
        if bracket.joined >= bracket.size {
            bracket.open = false;
        }
        self.assigned.insert(trial_id.to_string(), b);
        b
    }

    /// A live trial's bracket and position in it.
    fn locate(&self, trial_id: &str) -> Option<(usize, usize)> {
        let b = *self.assigned.get(trial_id)?;
        let m = self.brackets[b]
            .members
            .iter()
            .position(|m| m.trial_id == trial_id)?;
        Some((b, m))
    }

    /// A trial's bracket stops counting it (it failed or ended on its
    /// own), and may then be ready to rank without it.
    fn leave(&mut self, trial_id: &str) {
        self.stopping.remove(trial_id);
        if let Some((b, m)) = self.locate(trial_id) {
            let bracket = &mut self.brackets[b];
            bracket.members.remove(m);
            if bracket.open {
                bracket.joined = bracket.joined.saturating_sub(1);
            }
            self.advance(b, None);
        }
    }

    /// Ranks bracket `b`'s current rung if it is complete, and the next
    /// ones while they are too (trials may have passed several milestones
    /// at once). Losers end: `current`, the trial whose result is being
    /// handled, through the return value (true when it ended), the others
    /// through `stopping`.
    fn advance(&mut self, b: usize, current: Option<&str>) -> bool {
        let eta = self.config.reduction_factor;
        let stop_last = self.config.stop_last_trials;
        let stopping = &mut self.stopping;
        let bracket = &mut self.brackets[b];
        let last = bracket.milestones.len() - 1;
        let mut current_ended = false;
        while !bracket.open
            && bracket.rung < last
            && !bracket.members.is_empty()
            && bracket
                .members
                .iter()
                .all(|m| m.standing == Standing::Waiting)
        {
            let mut order: Vec<usize> = (0..bracket.members.len()).collect();
            // Stable: equal rewards keep the order trials joined in.
            order.sort_by(|&x, &y| by_reward(bracket.members[x].reward, bracket.members[y].reward));
            let keep = ((bracket.members.len() as f64 / eta).ceil() as usize).max(1);
            let kept: BTreeSet<usize> = order[..keep].iter().copied().collect();
            bracket.rung += 1;
            let milestone = bracket.milestones[bracket.rung];
            let at_end = bracket.rung == last;
            let members = std::mem::take(&mut bracket.members);
            for (i, mut member) in members.into_iter().enumerate() {
                let reached = member.time.is_some_and(|t| t >= milestone);
                if !kept.contains(&i) || (at_end && stop_last && reached) {
                    if current == Some(member.trial_id.as_str()) {
                        current_ended = true;
                    } else {
                        stopping.insert(member.trial_id);
                    }
                    continue;
                }
                member.standing = if reached && !at_end {
                    Standing::Waiting
                } else {
                    Standing::Active
                };
                bracket.members.push(member);
            }
        }
        current_ended
    }

    /// Trials the runner ended without saying so (finished in `trials`
    /// but still live here) leave their brackets, so that no rung waits
    /// for them forever.
    fn reconcile(&mut self, trials: &[Trial]) {
        let start = self.cursor.min(trials.len());
        let gone: Vec<&str> = trials[start..]
            .iter()
            .filter(|t| t.status.is_finished() && self.locate(&t.trial_id).is_some())
            .map(|t| t.trial_id.as_str())
            .collect();
        for trial_id in gone {
            self.leave(trial_id);
        }
        // Finished trials stay finished: later calls need not look at them.
        while self.cursor < trials.len() && trials[self.cursor].status.is_finished() {
            self.cursor += 1;
        }
    }
}

impl Scheduler for HyperBand {
    fn time_attr(&self) -> Option<&str> {
        Some(self.config.time_attr.as_str())
    }

    fn on_result(&mut self, trial: &Trial, result: &Map<String, Value>) -> Decision {
        let id = trial.trial_id.as_str();
        if self.assigned.contains_key(id) && self.locate(id).is_none() {
            // Ended here while paused, yet run again: end it now.
            self.stopping.remove(id);
            return Decision::Stop;
        }
        let b = self.join(id);
        // An infinity (a diverged trial's) ranks as the extreme finite
        // value, which the saved state can hold.
        let metric = result.get(&self.metric).and_then(metric_number);
        let reward = match metric.map(|v| v.clamp(f64::MIN, f64::MAX)) {
            Some(v) if v.is_nan() => None,
            Some(v) if self.mode == Mode::Min => Some(-v),
            other => other,
        };
        let time = result.get(&self.config.time_attr).and_then(Value::as_f64);
        let stop_last = self.config.stop_last_trials;
        let bracket = &mut self.brackets[b];
        let Some(m) = bracket.members.iter().position(|m| m.trial_id == id) else {
            return Decision::Continue;
        };
        let member = &mut bracket.members[m];
        member.reward = reward;
        // Without its time_attr a result cannot move the trial on.
        let Some(t) = time else {
            return Decision::Continue;
        };
        member.time = Some(t);
        let milestone = bracket.milestones[bracket.rung];
        if bracket.rung + 1 == bracket.milestones.len() {
            // The last rung: nothing left to wait for.
            if stop_last && t >= milestone {
                bracket.members.remove(m);
                return Decision::Stop;
            }
            return Decision::Continue;
        }
        if t < milestone {
            member.standing = Standing::Active;
            return Decision::Continue;
        }
        member.standing = Standing::Waiting;
        if self.advance(b, Some(id)) {
            return Decision::Stop;
        }
        match self
            .locate(id)
            .map(|(b, m)| self.brackets[b].members[m].standing)
        {
            Some(Standing::Active) => Decision::Continue,
            _ => Decision::Pause,
        }
    }

    fn on_trial_add(&mut self, trial: &Trial) {
        self.join(&trial.trial_id);
    }

    fn on_trial_remove(&mut self, trial: &Trial) {
        self.leave(&trial.trial_id);
    }

    fn on_trial_retry(&mut self, trial: &Trial) {
        // Its old bracket has moved on without it: it joins the newest
        // open one (or a new one) as a new trial would.
        if self.locate(&trial.trial_id).is_none() {
            self.assigned.remove(&trial.trial_id);
        }
        self.join(&trial.trial_id);
        // The cursor may have passed it while it was finished.
        self.cursor = 0;
    }

    fn on_no_more_trials(&mut self) {
        self.no_more_trials = true;
        for b in 0..self.brackets.len() {
            self.brackets[b].open = false;
            self.advance(b, None);
        }
    }

    fn on_more_trials(&mut self) {
        // Closed brackets ranked with the trials they had; new trials form
        // new brackets.
        self.no_more_trials = false;
    }

    fn on_trial_complete(&mut self, trial: &Trial, _result: &Map<String, Value>) {
        // As in Ray: a trial that ended on its own cannot go on, so it
        // takes no place among those kept.
        self.leave(&trial.trial_id);
    }

    fn choose_next(&mut self, trials: &[Trial]) -> Option<usize> {
        self.reconcile(trials);
        for (i, trial) in trials.iter().enumerate().skip(self.cursor) {
            if !matches!(trial.status, TrialStatus::Pending | TrialStatus::Paused) {
                continue;
            }
            if !self.assigned.contains_key(&trial.trial_id) {
                // Never announced through on_trial_add: it joins now.
                self.join(&trial.trial_id);
                return Some(i);
            }
            match self.locate(&trial.trial_id) {
                Some((b, m)) if self.brackets[b].members[m].standing == Standing::Active => {
                    return Some(i);
                }
                // Waiting for its rung, or ended here (take_stops ends it).
                _ => {}
            }
        }
        None
    }

    fn take_stops(&mut self, trials: &[Trial]) -> Vec<usize> {
        self.reconcile(trials);
        if self.stopping.is_empty() {
            return Vec::new();
        }
        let mut ended = Vec::new();
        let mut still_running = BTreeSet::new();
        for (i, trial) in trials.iter().enumerate() {
            if !self.stopping.contains(&trial.trial_id) {
                continue;
            }
            match trial.status {
                TrialStatus::Pending | TrialStatus::Paused => ended.push(i),
                // Its pause is still being carried out.
                TrialStatus::Running => {
                    still_running.insert(trial.trial_id.clone());
                }
                TrialStatus::Terminated | TrialStatus::Error => {}
            }
        }
        // Ids no longer in `trials` (or finished) are dropped.
        self.stopping = still_running;
        ended
    }

    fn name(&self) -> &'static str {
        "hyperband"
    }

    fn state(&self) -> Value {
        serde_json::to_value(HyperBandState {
            brackets: self.brackets.clone(),
            assigned: self.assigned.clone(),
            stopping: self.stopping.clone(),
            no_more_trials: self.no_more_trials,
        })
        .unwrap_or(Value::Null)
    }

    fn restore_state(&mut self, state: &Value) -> Result<(), String> {
        let Some(saved) = read_saved::<HyperBandState>(state, "HyperBand")? else {
            return Ok(());
        };
        let per_band = self.config.brackets_per_band();
        let mut brackets = saved.brackets;
        for (b, bracket) in brackets.iter_mut().enumerate() {
            let (size, milestones) = self.config.bracket_shape(b % per_band);
            // Saved floats may come back an ulp off through JSON text.
            let same = |a: &f64, b: &f64| (a - b).abs() <= 1e-9 * a.abs().max(1.0);
            if bracket.size != size
                || bracket.milestones.len() != milestones.len()
                || !bracket
                    .milestones
                    .iter()
                    .zip(&milestones)
                    .all(|(a, b)| same(a, b))
                || bracket.rung >= milestones.len()
                || bracket.joined > size
            {
                return Err(format!(
                    "the saved HyperBand state has bracket {b} with {} trials and milestones \
                     {:?}, but this configuration gives {size} trials and {milestones:?}",
                    bracket.size, bracket.milestones
                ));
            }
            bracket.milestones = milestones;
        }
        if let Some((id, b)) = saved.assigned.iter().find(|&(_, &b)| b >= brackets.len()) {
            return Err(format!(
                "the saved HyperBand state puts {id} in bracket {b}, which it does not have"
            ));
        }
        self.brackets = brackets;
        self.assigned = saved.assigned;
        self.stopping = saved.stopping;
        self.no_more_trials = saved.no_more_trials;
        self.cursor = 0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tune::schedulers::sim::Sim;
    use serde_json::json;

    fn hyperband(max_t: f64, eta: f64) -> HyperBand {
        let config = HyperBandConfig {
            max_t,
            reduction_factor: eta,
            ..HyperBandConfig::default()
        };
        HyperBand::new(config, "score", Mode::Max).unwrap()
    }

    fn trial(i: usize) -> Trial {
        Trial::new(format!("trial_{i:04}"), json!({}), "/tmp".into())
    }

    fn result(time_attr: &str, t: f64, score: Option<f64>) -> Map<String, Value> {
        json!({ time_attr: t, "score": score })
            .as_object()
            .unwrap()
            .clone()
    }

    fn mark(trials: &mut [Trial], status: TrialStatus) {
        for t in trials {
            t.status = status;
        }
    }

    /// `n` trials announced to `s`, all PENDING.
    fn added(s: &mut HyperBand, n: usize) -> Vec<Trial> {
        let trials: Vec<Trial> = (0..n).map(trial).collect();
        for t in &trials {
            s.on_trial_add(t);
        }
        trials
    }

    #[test]
    fn trials_added_after_more_trials_fill_a_bracket_together() {
        // The searcher was done after 2 trials (their bracket closed short);
        // `wtune resume --num-samples` then adds 3: they share a new
        // bracket, as trials of a fresh band would, instead of each closing
        // one of their own.
        let mut s = hyperband(9.0, 3.0);
        let first = added(&mut s, 2);
        s.on_no_more_trials();
        assert_eq!(s.brackets.len(), 1);
        assert!(!s.brackets[0].open);
        s.on_more_trials();
        for t in (2..5).map(trial) {
            s.on_trial_add(&t);
        }
        assert_eq!(s.brackets.len(), 2);
        assert_eq!(s.brackets[1].members.len(), 3);
        assert!(s.brackets[1].open);
        // The restored scheduler does the same.
        let mut restored = hyperband(9.0, 3.0);
        let mut saved = hyperband(9.0, 3.0);
        for t in &first {
            saved.on_trial_add(t);
        }
        saved.on_no_more_trials();
        restored.restore_state(&saved.state()).unwrap();
        restored.on_more_trials();
        for t in (2..5).map(trial) {
            restored.on_trial_add(&t);
        }
        assert_eq!(restored.brackets[1].members.len(), 3);
    }

    #[test]
    fn band_matches_ray_for_the_defaults() {
        // Ray: s_max + 1 = round(log3(81)) + 1 = 5; bracket s takes
        // ceil(5 / (s + 1) * 3^s) trials: 5, ceil(7.5) = 8, 15,
        // ceil(33.75) = 34, 81; its first milestone is 81 / 3^s.
        let s = HyperBand::new(HyperBandConfig::default(), "m", Mode::Max).unwrap();
        assert_eq!(
            s.band(),
            [
                (5, vec![81.0]),
                (8, vec![27.0, 81.0]),
                (15, vec![9.0, 27.0, 81.0]),
                (34, vec![3.0, 9.0, 27.0, 81.0]),
                (81, vec![1.0, 3.0, 9.0, 27.0, 81.0]),
            ]
        );
        // max_t = 100: round(log3(100) = 4.19) + 1 = 5 brackets of the same
        // sizes, but milestones 100 / 3^j, so every bracket ends at 100.
        let band = hyperband(100.0, 3.0).band();
        assert_eq!(
            band.iter().map(|b| b.0).collect::<Vec<_>>(),
            [5, 8, 15, 34, 81]
        );
        for (_, milestones) in &band {
            assert_eq!(milestones.last(), Some(&100.0));
        }
        let first = &band[4].1;
        assert!((first[0] - 100.0 / 81.0).abs() < 1e-12, "{first:?}");
        assert!((first[3] - 100.0 / 3.0).abs() < 1e-12, "{first:?}");
    }

    /// The hand-worked experiment. max_t = 9, η = 3: s_max + 1 =
    /// round(log3 9) + 1 = 3, so a band is three brackets, filled in
    /// order: A (s = 0) takes ceil(3/1 * 1) = 3 trials, milestone 9;
    /// B (s = 1) ceil(3/2 * 3) = ceil(4.5) = 5 trials, milestones 3, 9;
    /// C (s = 2) ceil(3/3 * 9) = 9 trials, milestones 1, 3, 9. With 22
    /// trials: A = 0-2, B = 3-7, C = 8-16, then the second band's
    /// D (s = 0) = 17-19 and E (s = 1) = 20-21, which never fills.
    fn score(i: usize, t: u64) -> f64 {
        let t = t as f64;
        match i {
            // B at t = 3, keep ceil(5/3) = 2: 4 (0.9), then 5 and 6 tie at
            // 0.7 and 5 joined first. 3, 6 and 7 stop at 3.
            3 => 0.5,
            4 => 0.9,
            5 | 6 => 0.7,
            7 => 0.4,
            // C at t = 1, keep ceil(9/3) = 3: 10 (0.8 - 0.1 = 0.7), 13
            // (0.6), 12 (0.35 + 0.1 = 0.45); 8 (0.4), 16 (0.3), 11 (0.2),
            // 9 (0.1), 14 (0.1), 15 (0.05) stop at 1. At t = 3, keep
            // ceil(3/3) = 1: 12 (0.35 + 0.3 = 0.65) beats 13 (0.6) and
            // 10 (0.8 - 0.3 = 0.5): the latest result counts. 10 and 13
            // stop at 3.
            8 => 0.4,
            9 => 0.1 * t,
            10 => 0.8 - 0.1 * t,
            11 => 0.2,
            12 => 0.35 + 0.1 * t,
            13 => 0.6,
            14 => 0.1,
            15 => 0.05,
            16 => 0.3,
            // E is ranked with the two trials it has once the searcher is
            // done, keep ceil(2/3) = 1: 21.
            20 => 0.3,
            21 => 0.8,
            // A and D have one milestone: everyone runs to 9.
            _ => 1.0,
        }
    }

    const BY_HAND: [u64; 22] = [
        9, 9, 9, // A
        3, 9, 9, 3, 3, // B
        1, 1, 3, 1, 9, 3, 1, 1, 1, // C
        9, 9, 9, // D
        3, 9, // E
    ];

    #[test]
    fn whole_experiment_stops_exactly_the_trials_worked_out_by_hand() {
        for slots in [1, 2, 4, 7] {
            let mut s = hyperband(9.0, 3.0);
            let mut sim = Sim::new(22, slots);
            assert!(sim.run(&mut s, &score, None));
            assert_eq!(sim.iterations(), BY_HAND, "{slots} slots");
            assert!(sim.unfinished().is_empty(), "{slots} slots");
            if slots == 1 {
                // One slot: B's last trial (7) completes rung 3 and stops
                // itself; 3 and 6, paused there, are ended by take_stops;
                // 4 and 5 resume from 3. C's last (16) completes rung 1;
                // 10, 12, 13 resume from 1, and 13 completes rung 3 (10
                // ended); 12 resumes from 3. E is ranked at the end: 20
                // ended, 21 resumes.
                assert_eq!(
                    sim.resumed,
                    [(4, 3), (5, 3), (10, 1), (12, 1), (13, 1), (12, 3), (21, 3)]
                );
                assert_eq!(sim.taken, [3, 6, 8, 9, 11, 14, 15, 10, 20]);
            }
        }
    }

    #[test]
    fn state_round_trip_resumes_with_the_same_decisions() {
        for cut in [5, 30, 61] {
            let mut first = hyperband(9.0, 3.0);
            let mut sim = Sim::new(22, 2);
            assert!(!sim.run(&mut first, &score, Some(cut)));
            let saved = first.state();
            let mut second = hyperband(9.0, 3.0);
            second.restore_state(&saved).unwrap();
            assert_eq!(second.state(), saved);
            // Through JSON text, as `wtune resume` reads it.
            let text = serde_json::to_string(&saved).unwrap();
            let mut third = hyperband(9.0, 3.0);
            third
                .restore_state(&serde_json::from_str(&text).unwrap())
                .unwrap();
            assert!(sim.run(&mut third, &score, None));
            assert_eq!(sim.iterations(), BY_HAND, "cut after {cut} steps");
            assert!(sim.unfinished().is_empty());
        }
        let mut s = hyperband(9.0, 3.0);
        added(&mut s, 4);
        let message = hyperband(27.0, 3.0).restore_state(&s.state()).unwrap_err();
        assert!(message.contains("bracket 0"), "{message}");
        let message = hyperband(9.0, 3.0)
            .restore_state(&json!({"brackets": 1}))
            .unwrap_err();
        assert!(message.contains("cannot be read"), "{message}");
    }

    #[test]
    fn stop_last_trials_false_lets_the_survivors_run_on() {
        let config = HyperBandConfig {
            max_t: 9.0,
            stop_last_trials: false,
            ..HyperBandConfig::default()
        };
        let mut s = HyperBand::new(config, "score", Mode::Max).unwrap();
        let mut sim = Sim::new(22, 3);
        // A stopping criterion at 12 ends those that reach the last rung;
        // the halving before it is unchanged.
        sim.stop_at = Some(12);
        assert!(sim.run(&mut s, &score, None));
        let expected: Vec<u64> = BY_HAND
            .iter()
            .map(|&t| if t == 9 { 12 } else { t })
            .collect();
        assert_eq!(sim.iterations(), expected);
        assert!(sim.unfinished().is_empty());
    }

    #[test]
    fn fuel_total_and_results_past_several_milestones() {
        // max_t = 90,000 fuel, η = 300: round(log300(90,000)) + 1 = 3
        // brackets: 3 trials to 90,000; ceil(3/2 * 300) = 450 trials with
        // milestones 300 and 90,000; 90,000 trials from 1.
        let config = HyperBandConfig {
            time_attr: "fuel_total".into(),
            max_t: 90_000.0,
            reduction_factor: 300.0,
            stop_last_trials: true,
        };
        let mut s = HyperBand::new(config, "score", Mode::Max).unwrap();
        assert_eq!(s.band()[1], (450, vec![300.0, 90_000.0]));
        let mut trials = added(&mut s, 7);
        let fuel = |t: f64, score: Option<f64>| result("fuel_total", t, score);
        // Trial 0 (first bracket) stops at max_t whatever the others do.
        assert_eq!(
            s.on_result(&trials[0], &fuel(50_000.0, Some(1.0))),
            Decision::Continue
        );
        assert_eq!(
            s.on_result(&trials[0], &fuel(90_000.0, Some(1.0))),
            Decision::Stop
        );
        // Trials 3-6 are the second bracket, which has room for 450.
        assert_eq!(
            s.on_result(&trials[3], &fuel(120.0, Some(0.1))),
            Decision::Continue
        );
        assert_eq!(
            s.on_result(&trials[3], &fuel(310.0, Some(0.5))),
            Decision::Pause
        );
        // Past both milestones at once: still ranked at 300 first.
        assert_eq!(
            s.on_result(&trials[4], &fuel(95_000.0, Some(0.9))),
            Decision::Pause
        );
        // No metric: ranks last.
        assert_eq!(s.on_result(&trials[5], &fuel(300.0, None)), Decision::Pause);
        assert_eq!(
            s.on_result(&trials[6], &fuel(299.0, Some(0.95))),
            Decision::Continue
        );
        mark(&mut trials[3..=5], TrialStatus::Paused);
        trials[0].status = TrialStatus::Terminated;
        trials[6].status = TrialStatus::Running;
        // The searcher is done: the bracket ranks the four it has once 6
        // gets to 300.
        s.on_no_more_trials();
        assert!(s.take_stops(&trials).is_empty(), "6 has not reached 300");
        // Ranking at 300: 4 (0.9), 3 (0.5), 6 (0.2), 5 (none); keep
        // ceil(4/300) = 1: trial 4, which is past max_t, so it ends too.
        assert_eq!(
            s.on_result(&trials[6], &fuel(600.0, Some(0.2))),
            Decision::Stop
        );
        assert_eq!(s.take_stops(&trials), [3, 4, 5]);
        assert!(s.take_stops(&trials).is_empty(), "each is returned once");
        mark(&mut trials[3..=6], TrialStatus::Terminated);
        assert_eq!(s.choose_next(&trials), Some(1));
    }

    #[test]
    fn failed_and_finished_trials_leave_their_bracket() {
        let mut s = hyperband(9.0, 3.0);
        let mut trials = added(&mut s, 6);
        // Bracket B (room for 5) has 3, 4, 5; 4 fails, so the next trials
        // fill B up again: 6, 7 and 8. Trial 9 opens bracket C.
        s.on_trial_remove(&trials[4]);
        trials[4].status = TrialStatus::Error;
        for i in 6..10 {
            trials.push(trial(i));
            s.on_trial_add(&trials[i]);
        }
        let b = s.assigned["trial_0003"];
        assert_eq!(s.assigned["trial_0008"], b);
        assert_eq!(s.assigned["trial_0009"], b + 1);
        let at = |score: f64| result("training_iteration", 3.0, Some(score));
        assert_eq!(s.on_result(&trials[3], &at(0.1)), Decision::Pause);
        assert_eq!(s.on_result(&trials[5], &at(0.4)), Decision::Pause);
        assert_eq!(s.on_result(&trials[6], &at(0.3)), Decision::Pause);
        // 7 is ended by a stopping criterion at 2: it leaves B.
        s.on_trial_complete(&trials[7], &result("training_iteration", 2.0, Some(9.0)));
        trials[7].status = TrialStatus::Terminated;
        // 8 completes the rung: 3, 5, 6, 8 ranked, keep ceil(4/3) = 2:
        // 5 (0.4) and 6 (0.3); 8 (0.2) stops, and so does 3 (0.1).
        assert_eq!(s.on_result(&trials[8], &at(0.2)), Decision::Stop);
        trials[8].status = TrialStatus::Terminated;
        mark(&mut trials[..3], TrialStatus::Terminated);
        // 3 is still being paused: it is kept back until it is PAUSED.
        trials[3].status = TrialStatus::Running;
        assert!(s.take_stops(&trials).is_empty());
        trials[3].status = TrialStatus::Paused;
        trials[5].status = TrialStatus::Paused;
        trials[6].status = TrialStatus::Paused;
        assert_eq!(s.take_stops(&trials), [3]);
        trials[3].status = TrialStatus::Terminated;
        // 5 and 6 resume, then the new trial 9.
        assert_eq!(s.choose_next(&trials), Some(5));
        trials[5].status = TrialStatus::Running;
        assert_eq!(s.choose_next(&trials), Some(6));
        trials[6].status = TrialStatus::Running;
        assert_eq!(s.choose_next(&trials), Some(9));
        let at9 = result("training_iteration", 9.0, Some(0.0));
        assert_eq!(s.on_result(&trials[5], &at9), Decision::Stop);
    }

    /// A failed trial run again by `wtune resume --retry-errored` joins
    /// the newest open bracket, as a new trial would.
    #[test]
    fn a_retried_trial_joins_the_open_bracket() {
        let mut s = hyperband(9.0, 3.0);
        let mut trials = added(&mut s, 6);
        let b = s.assigned["trial_0004"];
        s.on_trial_remove(&trials[4]);
        assert!(s.locate("trial_0004").is_none());
        for i in 6..10 {
            trials.push(trial(i));
            s.on_trial_add(&trials[i]);
        }
        s.on_trial_retry(&trials[4]);
        assert_eq!(s.assigned["trial_0004"], b + 1);
        assert_eq!(
            s.locate("trial_0004").map(|(bracket, _)| bracket),
            Some(b + 1)
        );
    }

    #[test]
    fn trials_ended_without_notice_leave_their_bracket() {
        let mut s = hyperband(9.0, 3.0);
        let mut trials = added(&mut s, 8);
        let at = |score: f64| result("training_iteration", 3.0, Some(score));
        for (i, t) in trials.iter_mut().enumerate().take(7).skip(3) {
            assert_eq!(s.on_result(t, &at(i as f64)), Decision::Pause);
            t.status = TrialStatus::Paused;
        }
        mark(&mut trials[..3], TrialStatus::Terminated);
        // Trial 7 failed without on_trial_remove: choose_next notices, and
        // B ranks 3-6: keep ceil(4/3) = 2, 6 and 5.
        trials[7].status = TrialStatus::Error;
        assert_eq!(s.choose_next(&trials), Some(5));
        assert_eq!(s.take_stops(&trials), [3, 4]);
    }

    #[test]
    fn min_mode_keeps_the_lowest() {
        // max_t = 3: brackets of 2 (milestone 3) and 3 (1, 3).
        let config = HyperBandConfig {
            max_t: 3.0,
            ..HyperBandConfig::default()
        };
        let mut s = HyperBand::new(config, "loss", Mode::Min).unwrap();
        assert_eq!(s.band(), [(2, vec![3.0]), (3, vec![1.0, 3.0])]);
        let mut trials = added(&mut s, 5);
        let loss = |v: f64| {
            json!({"training_iteration": 1, "loss": v})
                .as_object()
                .unwrap()
                .clone()
        };
        assert_eq!(s.on_result(&trials[2], &loss(0.5)), Decision::Pause);
        assert_eq!(s.on_result(&trials[3], &loss(0.2)), Decision::Pause);
        // keep ceil(3/3) = 1: the lowest loss, 3.
        assert_eq!(s.on_result(&trials[4], &loss(0.9)), Decision::Stop);
        trials[2].status = TrialStatus::Paused;
        trials[3].status = TrialStatus::Paused;
        trials[0].status = TrialStatus::Terminated;
        trials[1].status = TrialStatus::Terminated;
        trials[4].status = TrialStatus::Terminated;
        assert_eq!(s.take_stops(&trials), [2]);
        assert_eq!(s.choose_next(&trials), Some(3));
    }

    #[test]
    fn bad_parameters_are_named() {
        for (config, expected) in [
            (
                HyperBandConfig {
                    max_t: 0.5,
                    ..HyperBandConfig::default()
                },
                "scheduler.max_t",
            ),
            (
                HyperBandConfig {
                    max_t: f64::INFINITY,
                    ..HyperBandConfig::default()
                },
                "scheduler.max_t",
            ),
            (
                HyperBandConfig {
                    reduction_factor: 1.0,
                    ..HyperBandConfig::default()
                },
                "scheduler.reduction_factor",
            ),
            (
                HyperBandConfig {
                    time_attr: String::new(),
                    ..HyperBandConfig::default()
                },
                "scheduler.time_attr",
            ),
            (
                HyperBandConfig {
                    max_t: 1e9,
                    reduction_factor: 1.01,
                    ..HyperBandConfig::default()
                },
                "reduction_factor",
            ),
        ] {
            let message = HyperBand::new(config, "m", Mode::Max).unwrap_err();
            assert!(message.contains(expected), "{message}");
        }
    }
}
