//! Population based training (PBT, Jaderberg et al. 2017), as Ray Tune's
//! asynchronous `PopulationBasedTraining`.
//!
//! The experiment's trials are one population, meant to train side by side:
//! give the experiment room for all of them at once (`max_concurrent` and
//! the resource pool); trials that cannot start wait until others end, and
//! then start from scratch. Each time a trial's `time_attr` has advanced by
//! `perturbation_interval` since its last perturbation (and has reached
//! `burn_in_period`), its metric is recorded as its score and the trials
//! are ranked by their latest scores. With `n` trials ranked (those that
//! have a score and have not ended), the top and bottom
//! `ceil(n * quantile_fraction)` (at most `n / 2`) are the upper and lower
//! quantiles; ties rank the earlier trial lower. Then the trial:
//!
//! - in the upper quantile, is checkpointed ([`Decision::Checkpoint`]), so
//!   that its state is fresh when others clone it;
//! - in the lower quantile, *exploits*: it drops its state and continues
//!   from the newest checkpoint of a trial drawn from the upper quantile
//!   among those that have a checkpoint, and *explores*: it continues with
//!   that trial's config, mutated ([`Decision::Exploit`]). It takes the
//!   source's last perturbation time too, since it continues with the
//!   source's counters;
//! - otherwise, trains on.
//!
//! Explore changes the parameters named in `hyperparam_mutations`, each on
//! its own; the rest of the config is the source's. With probability
//! `resample_probability` the value is drawn afresh from the parameter's
//! list or domain; otherwise it is perturbed:
//!
//! - a list (`[1, 10, 100]`) is ordered: the value moves to the previous or
//!   next value, staying put at either end (a value not in the list is
//!   always resampled);
//! - a numeric domain (`{ uniform = [a, b] }`, `loguniform`, `randint`,
//!   `quniform`) multiplies the value by one of `perturbation_factors`,
//!   clamped to the domain (randint to `[a, b - 1]`, quniform rounded to a
//!   multiple of `q`), and an integer value stays an integer;
//! - `{ choice = [...] }` is unordered: perturbing it resamples it.
//!
//! Where this differs from Ray Tune: Ray pauses a trial at its perturbation
//! while others wait to start, to time-share the population; the runner
//! here creates trials only when a slot is free, so trials simply continue,
//! and [`Scheduler::choose_next`] starts waiting trials first in, first
//! out. Ray draws the trial to clone from the whole upper quantile, waits
//! for its checkpoint to be written, and skips the exploit when it has
//! none; here the draw is among those known to have a checkpoint written
//! (seen with one at a result), and the runner clones the newest it has,
//! so a trial checkpointed at its perturbation can be cloned from its next
//! result on. Ray multiplies `tune.choice` values and does not clamp
//! perturbed values to their domain. A mutated parameter missing from a
//! trial's config is an error here (Ray samples it): the trial is stopped
//! at its first result, with the error logged.
//!
//! Decisions depend only on the results and the order they arrive in:
//! draws come from a ChaCha8 generator seeded by the experiment's seed,
//! whose position is saved with the rest of the state, so `wtune resume`
//! continues with the same draws.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Number, Value, json};

use super::scheduler::{Decision, Scheduler};
use crate::tune::result::{Mode, metric_number};
use crate::tune::saved::read_saved;
use crate::tune::space::{Domain, SearchSpace};
use crate::tune::trial::{Trial, TrialStatus};

/// How one parameter may change when a trial explores.
#[derive(Debug, Clone, PartialEq)]
pub enum Mutation {
    /// Ordered values: a perturbation moves to a neighbouring value.
    Values(Vec<Value>),
    /// A domain in the `param_space` syntax (anything but `grid_search`).
    Domain(Domain),
}

/// The parameters PBT mutates, by dotted name (`optimizer.lr` is the `lr`
/// key of the config's `optimizer` table), in name order. Given as a table
/// of lists and domains; nested tables that are not domains name nested
/// keys, so `optimizer.lr = { uniform = [0.0, 1.0] }` in TOML (a nested
/// table) and `"optimizer.lr" = ...` (a quoted key) mean the same.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(try_from = "Map<String, Value>", into = "Map<String, Value>")]
pub struct Mutations(BTreeMap<String, Mutation>);

impl Mutations {
    /// The mutated parameters and how each changes, in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Mutation)> {
        self.0.iter().map(|(name, m)| (name.as_str(), m))
    }

    /// Number of mutated parameters.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no parameter is mutated (refused by [`PbtConfig::validate`]).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl TryFrom<Map<String, Value>> for Mutations {
    type Error = String;

    fn try_from(map: Map<String, Value>) -> Result<Self, String> {
        let mut out = BTreeMap::new();
        flatten(&map, "", &mut out)?;
        Ok(Mutations(out))
    }
}

impl From<Mutations> for Map<String, Value> {
    fn from(mutations: Mutations) -> Self {
        mutations
            .0
            .into_iter()
            .map(|(name, mutation)| {
                let value = match mutation {
                    Mutation::Values(values) => Value::Array(values),
                    Mutation::Domain(domain) => domain_json(&domain),
                };
                (name, value)
            })
            .collect()
    }
}

/// Collects the mutations of `map` (a table nested at `prefix`) by dotted
/// name.
fn flatten(
    map: &Map<String, Value>,
    prefix: &str,
    out: &mut BTreeMap<String, Mutation>,
) -> Result<(), String> {
    for (key, value) in map {
        let name = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        let at = format!("scheduler.hyperparam_mutations.{name}");
        let mutation = match value {
            Value::Array(values) if values.is_empty() => {
                return Err(format!("{at} must list at least one value"));
            }
            Value::Array(values) => Mutation::Values(values.clone()),
            Value::Object(table) if table.is_empty() => {
                return Err(format!(
                    "{at} is an empty table; give a list of values or a domain such as \
                     {{ uniform = [0.0, 1.0] }}"
                ));
            }
            Value::Object(table) => match domain_of(value, &at)? {
                Some(domain) => Mutation::Domain(domain),
                None => {
                    flatten(table, &name, out)?;
                    continue;
                }
            },
            other => {
                return Err(format!(
                    "{at} must be a list of values or a domain such as \
                     {{ uniform = [0.0, 1.0] }}, got {other}"
                ));
            }
        };
        if out.insert(name, mutation).is_some() {
            return Err(format!("{at} is given twice"));
        }
    }
    Ok(())
}

/// The domain `value` is, parsed as `param_space` parses it; `None` for a
/// table of other parameters.
fn domain_of(value: &Value, at: &str) -> Result<Option<Domain>, String> {
    const ROOT: &str = "param_space.m";
    let space = SearchSpace::from_json(&json!({ "m": value })).map_err(|e| {
        let below = e.path.strip_prefix(ROOT).unwrap_or_default();
        format!("{at}{below}: {}", e.message)
    })?;
    match space.domains().as_slice() {
        [(path, Domain::GridSearch(_))] if path == ROOT => Err(format!(
            "{at}: grid_search is not a mutation; give the values as a list"
        )),
        [(path, domain)] if path == ROOT => Ok(Some((*domain).clone())),
        _ => Ok(None),
    }
}

/// A domain as the `param_space` syntax writes it.
fn domain_json(domain: &Domain) -> Value {
    match domain {
        Domain::GridSearch(values) => json!({ "grid_search": values }),
        Domain::Choice(values) => json!({ "choice": values }),
        Domain::Uniform { low, high } => json!({ "uniform": [low, high] }),
        Domain::LogUniform { low, high } => json!({ "loguniform": [low, high] }),
        Domain::RandInt { low, high } => json!({ "randint": [low, high] }),
        Domain::QUniform { low, high, q } => json!({ "quniform": [low, high, q] }),
    }
}

/// PBT's parameters, with Ray Tune's names and defaults except
/// `perturbation_interval`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PbtConfig {
    /// The result field that measures progress: `training_iteration` (the
    /// default), `time_total_s` or `fuel_total` (any increasing number
    /// works).
    pub time_attr: String,
    /// A trial is ranked, and may exploit, each time `time_attr` has grown
    /// by this much since its last perturbation. Ray's default, 60, is
    /// meant for `time_total_s`; with `training_iteration` it would mean 60
    /// iterations between perturbations, so the default here is 5, to
    /// perturb several times in the tens of iterations a trial typically
    /// trains. Each perturbation checkpoints the best trials.
    pub perturbation_interval: f64,
    /// No trial is ranked before `time_attr` reaches this.
    pub burn_in_period: f64,
    /// The parameters explore changes, with their lists or domains; at
    /// least one.
    pub hyperparam_mutations: Mutations,
    /// The share of ranked trials in each of the upper and lower quantiles:
    /// in (0, 0.5].
    pub quantile_fraction: f64,
    /// The chance that explore draws a parameter afresh instead of
    /// perturbing it.
    pub resample_probability: f64,
    /// What perturbing multiplies a numeric parameter by, one drawn at
    /// random each time.
    pub perturbation_factors: Vec<f64>,
    /// A result without `time_attr` or the metric stops its trial with an
    /// error logged (Ray raises one); `false` lets it continue unranked,
    /// with a warning.
    pub require_attrs: bool,
}

impl Default for PbtConfig {
    fn default() -> Self {
        Self {
            time_attr: "training_iteration".into(),
            perturbation_interval: 5.0,
            burn_in_period: 0.0,
            hyperparam_mutations: Mutations::default(),
            quantile_fraction: 0.25,
            resample_probability: 0.25,
            perturbation_factors: vec![1.2, 0.8],
            require_attrs: true,
        }
    }
}

impl PbtConfig {
    /// Checks the parameters, naming the first bad one.
    pub fn validate(&self) -> Result<(), String> {
        if self.time_attr.is_empty() {
            return Err("scheduler.time_attr must name a result field".into());
        }
        if !(self.perturbation_interval > 0.0 && self.perturbation_interval.is_finite()) {
            return Err(format!(
                "scheduler.perturbation_interval must be a positive number, got {}",
                self.perturbation_interval
            ));
        }
        if !(self.burn_in_period >= 0.0 && self.burn_in_period.is_finite()) {
            return Err(format!(
                "scheduler.burn_in_period must be 0 or a positive number, got {}",
                self.burn_in_period
            ));
        }
        if self.hyperparam_mutations.is_empty() {
            return Err(
                "scheduler.hyperparam_mutations must name at least one parameter \
                        to mutate, e.g. lr = { loguniform = [1e-4, 1e-1] }"
                    .into(),
            );
        }
        if !(self.quantile_fraction > 0.0 && self.quantile_fraction <= 0.5) {
            return Err(format!(
                "scheduler.quantile_fraction must be in (0, 0.5], got {}",
                self.quantile_fraction
            ));
        }
        if !(0.0..=1.0).contains(&self.resample_probability) {
            return Err(format!(
                "scheduler.resample_probability must be in [0, 1], got {}",
                self.resample_probability
            ));
        }
        if self.perturbation_factors.is_empty()
            || !self
                .perturbation_factors
                .iter()
                .all(|f| *f > 0.0 && f.is_finite())
        {
            return Err(format!(
                "scheduler.perturbation_factors must be a non-empty list of positive numbers, \
                 got {:?}",
                self.perturbation_factors
            ));
        }
        Ok(())
    }

    /// Checks that `config` (a trial's configuration) has every mutated
    /// parameter, naming the first it lacks. The scheduler checks each
    /// trial's config at its results; an experiment can check its first
    /// config up front.
    pub fn check_config(&self, config: &Value) -> Result<(), String> {
        for (name, _) in self.hyperparam_mutations.iter() {
            if lookup(config, name).is_none() {
                return Err(format!(
                    "scheduler.hyperparam_mutations mutates `{name}`, which the trial's config \
                     does not have (it has {config}); add it to param_space"
                ));
            }
        }
        Ok(())
    }
}

/// The value at a dotted name in a config.
fn lookup<'a>(config: &'a Value, name: &str) -> Option<&'a Value> {
    name.split('.')
        .try_fold(config, |at, key| at.as_object()?.get(key))
}

/// Sets the value at a dotted name, creating tables on the way.
fn assign(config: &mut Value, name: &str, value: Value) {
    let mut at = config;
    let mut keys = name.split('.').peekable();
    while let Some(key) = keys.next() {
        let Some(table) = at.as_object_mut() else {
            return;
        };
        if keys.peek().is_none() {
            table.insert(key.to_string(), value);
            return;
        }
        at = table
            .entry(key)
            .or_insert_with(|| Value::Object(Map::new()));
    }
}

/// What PBT knows about one trial.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Member {
    /// The trial's position in the experiment's trials: what
    /// [`Decision::Exploit`] names as the source.
    index: usize,
    /// The trial's config as last seen, or as an exploit set it: what
    /// explore starts from when another trial clones this one.
    config: Value,
    /// `time_attr` at its last perturbation (0 before the first).
    last_perturbation_time: f64,
    /// Its own `time_attr` at an exploit just decided, which gave it the
    /// source's perturbation time: put back if the exploit is skipped
    /// ([`Scheduler::on_exploit_skipped`]); cleared at its next result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    before_exploit: Option<f64>,
    /// The score recorded at its last perturbation: the metric, negated
    /// under `min` so that higher is better; a null (NaN) metric is saved
    /// as the lowest finite number, so it ranks last. `None`: not ranked
    /// yet.
    score: Option<f64>,
    /// A result showed it with a checkpoint, so there is one to clone
    /// (the runner keeps a trial's newest). Being told to checkpoint is not
    /// enough: the checkpoint may still be on its way to disk when another
    /// trial wants to clone it.
    has_checkpoint: bool,
    /// It ended, so it no longer ranks.
    finished: bool,
}

/// The saved state.
#[derive(Serialize, Deserialize)]
struct PbtState {
    /// Trials by id.
    trials: BTreeMap<String, Member>,
    /// Where the random stream continues: the generator's word position.
    rng_word_pos: u64,
    /// Checkpoints asked for so far.
    #[serde(default)]
    checkpoints: u64,
    /// Exploits decided so far.
    #[serde(default)]
    perturbations: u64,
}

/// The PBT scheduler.
#[derive(Debug)]
pub struct PopulationBasedTraining {
    config: PbtConfig,
    metric: String,
    mode: Mode,
    seed: u64,
    rng: ChaCha8Rng,
    members: BTreeMap<String, Member>,
    checkpoints: u64,
    perturbations: u64,
    /// A missing attribute was reported once (`require_attrs = false`);
    /// not state.
    warned: bool,
    /// Caches rebuilt from the state (not saved): the ids of the members
    /// not finished, in id order.
    live: BTreeSet<String>,
    /// How many of the runner's trials [`Scheduler::choose_next`] has seen.
    synced: usize,
    /// Their indices by id.
    positions: HashMap<String, usize>,
    /// Members created since the last `choose_next`, to place.
    unplaced: Vec<String>,
    /// Indices of the trials seen that were not finished when last looked
    /// at (a finished trial stays finished).
    unfinished: BTreeSet<usize>,
}

impl PopulationBasedTraining {
    /// PBT ranking trials by `metric` under `mode`, drawing from a generator
    /// seeded by `seed`.
    pub fn new(config: PbtConfig, metric: &str, mode: Mode, seed: u64) -> Result<Self, String> {
        config.validate()?;
        Ok(Self {
            config,
            metric: metric.to_string(),
            mode,
            seed,
            rng: ChaCha8Rng::seed_from_u64(seed),
            members: BTreeMap::new(),
            checkpoints: 0,
            perturbations: 0,
            warned: false,
            live: BTreeSet::new(),
            synced: 0,
            positions: HashMap::new(),
            unplaced: Vec::new(),
            unfinished: BTreeSet::new(),
        })
    }

    /// Rebuilds the caches from the members, and makes the next
    /// `choose_next` look at every trial again.
    fn rebuild_caches(&mut self) {
        self.live = self
            .members
            .iter()
            .filter(|(_, m)| !m.finished)
            .map(|(id, _)| id.clone())
            .collect();
        self.synced = 0;
        self.positions.clear();
        self.unplaced.clear();
        self.unfinished.clear();
    }

    /// Marks the trial's member finished (creating it if need be).
    fn finish(&mut self, trial: &Trial) {
        self.observe(trial).finished = true;
        self.live.remove(&trial.trial_id);
    }

    /// Checkpoints asked for of upper-quantile trials so far.
    pub fn checkpoints(&self) -> u64 {
        self.checkpoints
    }

    /// Exploits (clone and explore) decided so far.
    pub fn perturbations(&self) -> u64 {
        self.perturbations
    }

    /// The trial's member, created on first sight, with what the trial
    /// shows now.
    fn observe(&mut self, trial: &Trial) -> &mut Member {
        if !self.members.contains_key(&trial.trial_id) {
            self.live.insert(trial.trial_id.clone());
            self.unplaced.push(trial.trial_id.clone());
        }
        let guess = self.members.len();
        let member = self
            .members
            .entry(trial.trial_id.clone())
            .or_insert_with(|| Member {
                index: guess,
                config: Value::Null,
                last_perturbation_time: 0.0,
                before_exploit: None,
                score: None,
                has_checkpoint: false,
                finished: false,
            });
        member.config = trial.config.clone();
        member.has_checkpoint |= trial.cloneable_checkpoint().is_some();
        member
    }

    /// Ends a trial on this scheduler's word, with the reason logged, since
    /// a scheduler cannot fail a trial.
    fn refuse(&mut self, trial: &Trial, reason: &str) -> Decision {
        tracing::error!(trial = %trial.trial_id, "the pbt scheduler stops the trial: {reason}");
        if let Some(member) = self.members.get_mut(&trial.trial_id) {
            member.finished = true;
            self.live.remove(&trial.trial_id);
        }
        Decision::Stop
    }

    /// The ids of the lower and upper quantiles, each worst first.
    fn quantiles(&self) -> (Vec<String>, Vec<String>) {
        // Only members not finished rank: `live`, in id order as `members`.
        let mut ranked: Vec<(&String, f64, usize)> = self
            .live
            .iter()
            .filter_map(|id| {
                let m = &self.members[id];
                Some((id, m.score?, m.index))
            })
            .collect();
        let n = ranked.len();
        if n <= 1 {
            return (Vec::new(), Vec::new());
        }
        ranked.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.2.cmp(&b.2)));
        let mut q = (n as f64 * self.config.quantile_fraction).ceil() as usize;
        if 2 * q > n {
            q = n / 2;
        }
        let ids = |part: &[(&String, f64, usize)]| part.iter().map(|r| r.0.clone()).collect();
        (ids(&ranked[..q]), ids(&ranked[n - q..]))
    }

    /// A new config from `config`: each mutated parameter resampled or
    /// perturbed (see the module's documentation).
    fn explore(&mut self, config: &Value) -> Value {
        let mut out = config.clone();
        let p = self.config.resample_probability;
        for (name, mutation) in &self.config.hyperparam_mutations.0 {
            let current = lookup(config, name);
            let resample = self.rng.random::<f64>() < p;
            let value = match mutation {
                Mutation::Values(values) => {
                    let at = current.and_then(|c| values.iter().position(|v| same(v, c)));
                    match at {
                        Some(i) if !resample => {
                            let shifted = if self.rng.random_bool(0.5) {
                                i.saturating_sub(1)
                            } else {
                                (i + 1).min(values.len() - 1)
                            };
                            values[shifted].clone()
                        }
                        _ => values[self.rng.random_range(0..values.len())].clone(),
                    }
                }
                Mutation::Domain(domain) => {
                    let integer = current.is_some_and(|v| v.is_i64() || v.is_u64());
                    match current.and_then(Value::as_f64) {
                        Some(x) if !resample && !matches!(domain, Domain::Choice(_)) => {
                            let factors = &self.config.perturbation_factors;
                            let factor = factors[self.rng.random_range(0..factors.len())];
                            fit(domain, x * factor, integer)
                        }
                        _ => sample(domain, &mut self.rng, integer),
                    }
                }
            };
            assign(&mut out, name, value);
        }
        out
    }

    /// The mutated parameters of a config, for logs.
    fn mutated(&self, config: &Value) -> Value {
        self.config
            .hyperparam_mutations
            .iter()
            .map(|(name, _)| {
                let value = lookup(config, name).cloned().unwrap_or(Value::Null);
                (name.to_string(), value)
            })
            .collect::<Map<String, Value>>()
            .into()
    }
}

/// Whether two config values are the same, numbers by value (`1` is `1.0`).
fn same(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

fn float(x: f64) -> Value {
    Number::from_f64(x).map_or(Value::Null, Value::Number)
}

/// A fresh draw from `domain`, an integer when the value it replaces was
/// one.
fn sample(domain: &Domain, rng: &mut ChaCha8Rng, integer: bool) -> Value {
    let x = match *domain {
        Domain::GridSearch(ref values) | Domain::Choice(ref values) => {
            return values[rng.random_range(0..values.len())].clone();
        }
        Domain::Uniform { low, high } => rng.random_range(low..high),
        Domain::LogUniform { low, high } => rng.random_range(low.ln()..high.ln()).exp(),
        Domain::RandInt { low, high } => rng.random_range(low..high) as f64,
        Domain::QUniform { low, high, .. } => rng.random_range(low..high),
    };
    fit(domain, x, integer)
}

/// `x` brought into a numeric domain: clamped to its bounds, rounded where
/// the domain or the value it replaces is integral.
fn fit(domain: &Domain, x: f64, integer: bool) -> Value {
    let (low, high, x) = match *domain {
        Domain::Uniform { low, high } | Domain::LogUniform { low, high } => (low, high, x),
        Domain::QUniform { low, high, q } => {
            let (min, max) = crate::tune::space::quantized_bounds(low, high, q);
            (min, max, (x / q).round() * q)
        }
        Domain::RandInt { low, high } => {
            let n = (x.round() as i64).clamp(low, high - 1);
            return Value::from(n);
        }
        Domain::GridSearch(_) | Domain::Choice(_) => unreachable!("not a numeric domain"),
    };
    let x = x.clamp(low, high);
    if !integer {
        return float(x);
    }
    let (lowest, highest) = (low.ceil(), high.floor());
    let n = if lowest <= highest {
        x.round().clamp(lowest, highest)
    } else {
        x.round()
    };
    Value::from(n as i64)
}

impl Scheduler for PopulationBasedTraining {
    fn time_attr(&self) -> Option<&str> {
        // Unrequired, a result without it goes on unranked.
        self.config
            .require_attrs
            .then_some(self.config.time_attr.as_str())
    }

    fn on_result(&mut self, trial: &Trial, result: &Map<String, Value>) -> Decision {
        self.observe(trial);
        if let Err(reason) = self.config.check_config(&trial.config) {
            return self.refuse(trial, &reason);
        }
        let time = result.get(&self.config.time_attr).and_then(Value::as_f64);
        let (Some(time), Some(metric)) = (time, result.get(&self.metric)) else {
            let missing = if time.is_none() {
                format!("time_attr `{}`", self.config.time_attr)
            } else {
                format!("metric `{}`", self.metric)
            };
            let reason = format!("the result has no {missing}");
            if self.config.require_attrs {
                return self.refuse(
                    trial,
                    &format!("{reason} (set scheduler.require_attrs = false to go on)"),
                );
            }
            if !std::mem::replace(&mut self.warned, true) {
                tracing::warn!(trial = %trial.trial_id, "{reason}; the pbt scheduler leaves such results unranked");
            }
            return Decision::Continue;
        };
        // An infinity (a diverged trial's) ranks as the extreme finite
        // value, which the saved state can hold.
        let score = match metric_number(metric).map(|v| v.clamp(f64::MIN, f64::MAX)) {
            Some(v) if self.mode == Mode::Min => -v,
            Some(v) => v,
            None => f64::MIN,
        };
        let id = trial.trial_id.as_str();
        let member = self.members.get_mut(id).expect("observed above");
        if time < self.config.burn_in_period
            || time - member.last_perturbation_time < self.config.perturbation_interval
        {
            return Decision::Continue;
        }
        member.score = Some(score);
        member.last_perturbation_time = time;
        member.before_exploit = None;

        let (lower, upper) = self.quantiles();
        if upper.iter().any(|u| u == id) {
            self.checkpoints += 1;
            return Decision::Checkpoint;
        }
        if !lower.iter().any(|l| l == id) {
            return Decision::Continue;
        }
        let candidates: Vec<&String> = upper
            .iter()
            .filter(|u| self.members[*u].has_checkpoint)
            .collect();
        if candidates.is_empty() {
            tracing::info!(trial = %id, "pbt: no trial in the upper quantile has a checkpoint yet; no exploit");
            return Decision::Continue;
        }
        let source_id = candidates[self.rng.random_range(0..candidates.len())].clone();
        let source = self.members[&source_id].clone();
        let config = self.explore(&source.config);
        tracing::info!(
            trial = %id,
            "pbt: exploit {source_id} (score {:?}) into {id} (score {score}); explore {} -> {}",
            source.score,
            self.mutated(&source.config),
            self.mutated(&config)
        );
        let member = self.members.get_mut(id).expect("observed");
        member.config = config.clone();
        member.last_perturbation_time = source.last_perturbation_time;
        member.before_exploit = Some(time);
        self.perturbations += 1;
        Decision::Exploit {
            source: source.index,
            config,
        }
    }

    fn on_trial_add(&mut self, trial: &Trial) {
        self.observe(trial);
    }

    fn on_exploit_skipped(&mut self, trial: &Trial) {
        // It trains on with its own config (which `observe` takes) and its
        // own counters, so its clock is its own perturbation's again.
        let member = self.observe(trial);
        if let Some(time) = member.before_exploit.take() {
            member.last_perturbation_time = time;
        }
    }

    fn on_trial_remove(&mut self, trial: &Trial) {
        self.finish(trial);
    }

    fn on_trial_retry(&mut self, trial: &Trial) {
        let member = self.observe(trial);
        member.finished = false;
        // What it has now, not what its failed run had: its checkpoints
        // may be gone (`--restart-errored`), and a trial starting over has
        // no standing until it reports again.
        member.has_checkpoint = trial.cloneable_checkpoint().is_some();
        if !member.has_checkpoint {
            member.score = None;
            member.last_perturbation_time = 0.0;
        }
        self.live.insert(trial.trial_id.clone());
        if let Some(&i) = self.positions.get(&trial.trial_id) {
            self.unfinished.insert(i);
        }
    }

    fn on_trial_complete(&mut self, trial: &Trial, _result: &Map<String, Value>) {
        self.finish(trial);
    }

    fn choose_next(&mut self, trials: &[Trial]) -> Option<usize> {
        // The runner's list is the truth about indices; members created
        // before it was seen (or restored) take their place from it. The
        // list only grows, so only trials new since the last call, and
        // members new since then, need placing.
        if trials.len() < self.synced {
            self.synced = 0;
            self.positions.clear();
            self.unfinished.clear();
        }
        for (i, trial) in trials.iter().enumerate().skip(self.synced) {
            self.positions.insert(trial.trial_id.clone(), i);
            self.unfinished.insert(i);
        }
        for trial in &trials[self.synced..] {
            if let Some(member) = self.members.get_mut(&trial.trial_id) {
                member.index = self.positions[&trial.trial_id];
            }
        }
        self.synced = trials.len();
        for id in std::mem::take(&mut self.unplaced) {
            if let (Some(member), Some(&i)) = (self.members.get_mut(&id), self.positions.get(&id)) {
                member.index = i;
            }
        }
        // The first PENDING or PAUSED trial; finished ones are dropped for
        // good.
        let mut chosen = None;
        let mut gone = Vec::new();
        for &i in &self.unfinished {
            match trials[i].status {
                TrialStatus::Pending | TrialStatus::Paused => {
                    chosen = Some(i);
                    break;
                }
                TrialStatus::Running => {}
                TrialStatus::Terminated | TrialStatus::Error => gone.push(i),
            }
        }
        for i in gone {
            self.unfinished.remove(&i);
        }
        chosen
    }

    fn name(&self) -> &'static str {
        "pbt"
    }

    fn state(&self) -> Value {
        serde_json::to_value(PbtState {
            trials: self.members.clone(),
            rng_word_pos: u64::try_from(self.rng.get_word_pos()).unwrap_or(u64::MAX),
            checkpoints: self.checkpoints,
            perturbations: self.perturbations,
        })
        .unwrap_or(Value::Null)
    }

    fn restore_state(&mut self, state: &Value) -> Result<(), String> {
        let Some(saved) = read_saved::<PbtState>(state, "PBT")? else {
            return Ok(());
        };
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        rng.set_word_pos(u128::from(saved.rng_word_pos));
        self.rng = rng;
        self.members = saved.trials;
        self.checkpoints = saved.checkpoints;
        self.perturbations = saved.perturbations;
        self.rebuild_caches();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::tune::trial::Checkpoint;

    fn config(value: Value) -> PbtConfig {
        serde_json::from_value(value).unwrap()
    }

    fn pbt(value: Value, mode: Mode) -> PopulationBasedTraining {
        PopulationBasedTraining::new(config(value), "score", mode, 7).unwrap()
    }

    /// Interval 2, `lr` mutated among 1, 2, 3 (never resampled), mode max,
    /// and four trials added, `lr` 2 and `seed` their number.
    fn four_at_interval_2() -> (PopulationBasedTraining, Vec<Trial>) {
        let mut s = pbt(
            json!({
                "perturbation_interval": 2,
                "hyperparam_mutations": {"lr": [1, 2, 3]},
                "resample_probability": 0.0,
            }),
            Mode::Max,
        );
        let t: Vec<Trial> = (0..4)
            .map(|i| trial(i, json!({"lr": 2, "seed": i})))
            .collect();
        for tr in &t {
            s.on_trial_add(tr);
        }
        (s, t)
    }

    fn trial(i: usize, config: Value) -> Trial {
        Trial::new(format!("trial_{i:04}"), config, "/tmp".into())
    }

    fn result(t: u64, score: f64) -> Map<String, Value> {
        json!({"training_iteration": t, "score": score})
            .as_object()
            .unwrap()
            .clone()
    }

    /// A checkpoint as the runner records one: what makes a trial cloneable.
    fn checkpointed(trial: &mut Trial, iteration: u64) {
        trial.checkpoints.push(Checkpoint {
            path: format!("checkpoints/checkpoint_{iteration:06}.ckpt").into(),
            iteration,
            time_total_s: 0.0,
            fuel_total: 0,
            score: None,
            bytes: 1,
            halt: false,
        });
    }

    #[test]
    fn defaults_are_ray_tunes_and_bad_parameters_are_named() {
        let defaults = PbtConfig::default();
        assert_eq!(defaults.time_attr, "training_iteration");
        assert_eq!(
            (
                defaults.perturbation_interval,
                defaults.burn_in_period,
                defaults.quantile_fraction,
                defaults.resample_probability,
            ),
            (5.0, 0.0, 0.25, 0.25)
        );
        assert_eq!(defaults.perturbation_factors, [1.2, 0.8]);
        assert!(defaults.require_attrs);
        let message = defaults.validate().unwrap_err();
        assert!(
            message.contains("scheduler.hyperparam_mutations"),
            "{message}"
        );

        let lr = json!({"lr": [0.1, 0.01]});
        for (bad, expected) in [
            (
                json!({"quantile_fraction": 0.6}),
                "scheduler.quantile_fraction must be in (0, 0.5]",
            ),
            (
                json!({"quantile_fraction": 0.0}),
                "scheduler.quantile_fraction must be in (0, 0.5]",
            ),
            (
                json!({"perturbation_interval": 0}),
                "scheduler.perturbation_interval",
            ),
            (json!({"burn_in_period": -1}), "scheduler.burn_in_period"),
            (
                json!({"resample_probability": 1.5}),
                "scheduler.resample_probability",
            ),
            (
                json!({"perturbation_factors": []}),
                "scheduler.perturbation_factors",
            ),
            (
                json!({"perturbation_factors": [1.2, -1]}),
                "scheduler.perturbation_factors",
            ),
            (json!({"time_attr": ""}), "scheduler.time_attr"),
        ] {
            let mut value = bad.clone();
            value["hyperparam_mutations"] = lr.clone();
            let message = config(value).validate().unwrap_err();
            assert!(message.contains(expected), "{bad}: {message}");
        }
        let message = serde_json::from_value::<PbtConfig>(json!({"quantile": 0.2}))
            .unwrap_err()
            .to_string();
        assert!(message.contains("quantile"), "{message}");
    }

    /// A failed trial run again by `wtune resume --retry-errored` is a
    /// live member again: it ranks and runs.
    #[test]
    fn a_retried_trial_is_a_member_again() {
        let mut s = pbt(
            json!({"hyperparam_mutations": {"lr": [0.1, 0.01]}}),
            Mode::Max,
        );
        let mut trials = vec![trial(0, json!({"lr": 0.1})), trial(1, json!({"lr": 0.01}))];
        trials.iter().for_each(|t| s.on_trial_add(t));
        trials[1].status = TrialStatus::Error;
        s.on_trial_remove(&trials[1]);
        assert_eq!(s.choose_next(&trials), Some(0));
        trials[0].status = TrialStatus::Running;
        assert_eq!(s.choose_next(&trials), None, "trial 1 is gone for good");
        s.members.get_mut("trial_0001").unwrap().score = Some(0.9);
        s.members.get_mut("trial_0001").unwrap().has_checkpoint = true;
        trials[1].status = TrialStatus::Pending;
        s.on_trial_retry(&trials[1]);
        assert!(!s.members["trial_0001"].finished);
        // It starts over: no checkpoint, no rank from its failed run.
        assert!(!s.members["trial_0001"].has_checkpoint);
        assert_eq!(s.members["trial_0001"].score, None);
        assert!(s.live.contains("trial_0001"));
        assert_eq!(s.choose_next(&trials), Some(1));
    }

    #[test]
    fn experiments_name_it_pbt() {
        use crate::tune::SchedulerSpec;
        assert!(SchedulerSpec::NAMES.contains(&"pbt"));
        let spec: SchedulerSpec = serde_json::from_value(json!({
            "type": "pbt",
            "perturbation_interval": 3,
            "hyperparam_mutations": {"lr": {"loguniform": [1e-4, 1e-1]}},
        }))
        .unwrap();
        let SchedulerSpec::Pbt(config) = &spec else {
            panic!("pbt expected, got {spec:?}")
        };
        assert_eq!(config.perturbation_interval, 3.0);
        assert!(!spec.ends_trials(), "pbt ends no trial by itself");
        assert_eq!(
            spec.build(Some("loss"), Mode::Min, 1).unwrap().name(),
            "pbt"
        );
        let message = spec.build(None, Mode::Min, 1).err().unwrap();
        assert!(message.contains("`metric`"), "{message}");
        // As an experiment file writes it: TOML's dotted keys nest tables.
        let table: toml::Table = toml::from_str(
            r#"
            type = "pbt"
            [hyperparam_mutations]
            optimizer.lr = { loguniform = [1e-4, 1e-1] }
            batch = [16, 32, 64]
            "#,
        )
        .unwrap();
        let spec: SchedulerSpec =
            serde_json::from_value(serde_json::to_value(table).unwrap()).unwrap();
        let SchedulerSpec::Pbt(config) = &spec else {
            panic!("pbt expected, got {spec:?}")
        };
        let names: Vec<&str> = config.hyperparam_mutations.iter().map(|m| m.0).collect();
        assert_eq!(names, ["batch", "optimizer.lr"]);
        let bare: SchedulerSpec = serde_json::from_value(json!({"type": "pbt"})).unwrap();
        let message = bare.build(Some("loss"), Mode::Min, 1).err().unwrap();
        assert!(
            message.contains("scheduler.hyperparam_mutations"),
            "{message}"
        );
    }

    #[test]
    fn mutations_parse_lists_domains_and_nested_names() {
        let parsed = config(json!({"hyperparam_mutations": {
            "lr": {"loguniform": [1e-4, 1e-1]},
            "batch": [16, 32, 64],
            "optimizer": {"momentum": {"uniform": [0.5, 0.99]}, "kind": {"choice": ["a", "b"]}},
            "model.layers": {"randint": [1, 5]},
        }}));
        let names: Vec<&str> = parsed.hyperparam_mutations.iter().map(|m| m.0).collect();
        assert_eq!(
            names,
            [
                "batch",
                "lr",
                "model.layers",
                "optimizer.kind",
                "optimizer.momentum"
            ]
        );
        assert_eq!(
            parsed.hyperparam_mutations.iter().nth(1).unwrap().1,
            &Mutation::Domain(Domain::LogUniform {
                low: 1e-4,
                high: 1e-1
            })
        );
        // Saved with dotted names, read back the same.
        let text = serde_json::to_string(&parsed).unwrap();
        assert!(
            text.contains(r#""optimizer.momentum":{"uniform":[0.5,0.99]}"#),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<PbtConfig>(&text).unwrap(), parsed);

        for (bad, expected) in [
            (
                json!({"lr": {"grid_search": [1, 2]}}),
                "scheduler.hyperparam_mutations.lr: grid_search",
            ),
            (
                json!({"lr": 0.1}),
                "scheduler.hyperparam_mutations.lr must be",
            ),
            (
                json!({"lr": []}),
                "scheduler.hyperparam_mutations.lr must list",
            ),
            (
                json!({"opt": {}}),
                "scheduler.hyperparam_mutations.opt is an empty",
            ),
            (
                json!({"opt": {"lr": {"uniform": [1, 0]}}}),
                "scheduler.hyperparam_mutations.opt.lr: uniform needs",
            ),
            (
                json!({"a.b": [1], "a": {"b": [2]}}),
                "scheduler.hyperparam_mutations.a.b is given twice",
            ),
        ] {
            let message =
                serde_json::from_value::<PbtConfig>(json!({ "hyperparam_mutations": bad }))
                    .unwrap_err()
                    .to_string();
            assert!(message.contains(expected), "{bad}: {message}");
        }
    }

    /// An exploit the runner could not carry out (no clone made) leaves
    /// the trial on its own trajectory: its next perturbation comes an
    /// interval after its own, not after the source's it was to take.
    #[test]
    fn a_skipped_exploit_leaves_the_trial_its_own_clock() {
        use Decision::*;
        let (mut s, mut t) = four_at_interval_2();
        assert_eq!(s.on_result(&t[0], &result(2, 5.0)), Continue);
        assert_eq!(s.on_result(&t[1], &result(2, 3.0)), Continue);
        assert_eq!(s.on_result(&t[2], &result(2, 7.0)), Checkpoint);
        checkpointed(&mut t[2], 2);
        assert_eq!(s.on_result(&t[2], &result(3, 7.0)), Continue);
        assert_eq!(s.on_result(&t[3], &result(2, 6.0)), Continue);
        // 0 at 4 ranks last and is to clone 2, whose clock says 2.
        assert!(matches!(
            s.on_result(&t[0], &result(4, 0.0)),
            Exploit { source: 2, .. }
        ));
        s.on_exploit_skipped(&t[0]);
        // Its own clock (4): not due at 5, as it would be from 2's.
        assert_eq!(s.on_result(&t[0], &result(5, 0.0)), Continue);
        let Exploit { source: 2, config } = s.on_result(&t[0], &result(6, 0.0)) else {
            panic!("an exploit expected at 6")
        };
        // Explored from the source's config, as before.
        assert_eq!(config["seed"], 2);
        // The skip is no rank of its own: the exploit decided counts.
        assert_eq!(s.perturbations(), 2);
    }

    /// Interval 2, quantile 0.25: with `n` trials ranked, `ceil(n / 4)` at
    /// each end.
    #[test]
    fn decisions_follow_the_quantiles_as_worked_out_by_hand() {
        use Decision::*;
        let (mut s, mut t) = four_at_interval_2();
        assert_eq!(s.choose_next(&t), Some(0));
        // Before the interval: nothing is ranked.
        assert_eq!(s.on_result(&t[0], &result(1, 5.0)), Continue);
        // 0 (5.0) alone is ranked: no quantiles.
        assert_eq!(s.on_result(&t[0], &result(2, 5.0)), Continue);
        // 1 (3.0): n = 2, q = 1: 1 is the lower quantile, but 0, the upper,
        // has no checkpoint.
        assert_eq!(s.on_result(&t[1], &result(2, 3.0)), Continue);
        // 2 (7.0): n = 3, q = 1: the upper quantile.
        assert_eq!(s.on_result(&t[2], &result(2, 7.0)), Checkpoint);
        checkpointed(&mut t[2], 2);
        // Its next result shows the checkpoint written.
        assert_eq!(s.on_result(&t[2], &result(3, 7.0)), Continue);
        // 3 (1.0): n = 4, q = 1: the lower quantile; 2 is cloned, its lr
        // (2) moves to a neighbour, and the rest of its config comes along.
        let Exploit { source, config } = s.on_result(&t[3], &result(2, 1.0)) else {
            panic!("an exploit expected")
        };
        assert_eq!(source, 2);
        assert!(
            config == json!({"lr": 1, "seed": 2}) || config == json!({"lr": 3, "seed": 2}),
            "{config}"
        );
        assert_eq!(s.perturbations(), 1);
        t[3].config = config;
        // 0 at 3: one iteration since its perturbation at 2.
        assert_eq!(s.on_result(&t[0], &result(3, 0.0)), Continue);
        // 0 at 4 (0.0) ranks below 3's old 1.0: 0 clones 2.
        assert!(matches!(
            s.on_result(&t[0], &result(4, 0.0)),
            Exploit { source: 2, .. }
        ));
        // 3 continues from 2's checkpoint, at 2 like its perturbation time:
        // it is next ranked at 4, now on top.
        assert_eq!(s.on_result(&t[3], &result(3, 8.0)), Continue);
        assert_eq!(s.on_result(&t[3], &result(4, 9.0)), Checkpoint);
        assert_eq!(s.checkpoints(), 2);
        // A trial that ended ranks no more: with 3 gone, 1 (3.0) at 4 is
        // ranked among 0 (0.0, still its old score), 1 and 2 (7.0).
        s.on_trial_complete(&t[3], &result(4, 9.0));
        assert_eq!(s.on_result(&t[1], &result(4, 3.0)), Continue);
        assert_eq!(s.on_result(&t[2], &result(4, 7.5)), Checkpoint);
    }

    #[test]
    fn min_mode_burn_in_and_missing_metrics() {
        use Decision::*;
        let mut s = pbt(
            json!({
                "perturbation_interval": 1,
                "burn_in_period": 2,
                "hyperparam_mutations": {"lr": {"uniform": [0, 1]}},
            }),
            Mode::Min,
        );
        let mut t: Vec<Trial> = (0..2).map(|i| trial(i, json!({"lr": 0.5}))).collect();
        for tr in &t {
            s.on_trial_add(tr);
        }
        // Burn-in: nothing is ranked before time 2.
        assert_eq!(s.on_result(&t[0], &result(1, 1.0)), Continue);
        assert_eq!(s.on_result(&t[1], &result(1, 9.0)), Continue);
        assert_eq!(s.on_result(&t[0], &result(2, 1.0)), Continue);
        // Lower is better: 0 (1.0) is on top.
        assert_eq!(s.on_result(&t[1], &result(2, 9.0)), Continue);
        assert_eq!(s.on_result(&t[0], &result(3, 1.0)), Checkpoint);
        checkpointed(&mut t[0], 3);
        // Not cloned before a result shows its checkpoint written.
        assert_eq!(s.on_result(&t[1], &result(3, 9.0)), Continue);
        assert_eq!(s.on_result(&t[0], &result(4, 1.0)), Checkpoint);
        // A null metric (NaN) ranks below every number.
        let nan = json!({"training_iteration": 4, "score": null});
        assert!(matches!(
            s.on_result(&t[1], nan.as_object().unwrap()),
            Exploit { source: 0, .. }
        ));

        // A result without the metric stops the trial under require_attrs,
        // and is left unranked without it.
        let bare = json!({"training_iteration": 9});
        let mut strict = pbt(json!({"hyperparam_mutations": {"lr": [1]}}), Mode::Max);
        assert_eq!(strict.on_result(&t[0], bare.as_object().unwrap()), Stop);
        let mut lenient = pbt(
            json!({"hyperparam_mutations": {"lr": [1]}, "require_attrs": false}),
            Mode::Max,
        );
        assert_eq!(
            lenient.on_result(&t[0], bare.as_object().unwrap()),
            Continue
        );
        let wrong_time = pbt(
            json!({"hyperparam_mutations": {"lr": [1]}, "time_attr": "epoch"}),
            Mode::Max,
        );
        let mut wrong_time = wrong_time;
        assert_eq!(wrong_time.on_result(&t[0], &result(9, 1.0)), Stop);
    }

    #[test]
    fn a_mutated_parameter_missing_from_the_config_stops_the_trial() {
        let c = config(json!({"hyperparam_mutations": {"optimizer.lr": [1, 2]}}));
        assert!(c.check_config(&json!({"optimizer": {"lr": 1}})).is_ok());
        let message = c.check_config(&json!({"lr": 1})).unwrap_err();
        assert!(message.contains("`optimizer.lr`"), "{message}");
        let mut s = PopulationBasedTraining::new(c, "score", Mode::Max, 0).unwrap();
        let t = trial(0, json!({"lr": 1}));
        s.on_trial_add(&t);
        assert_eq!(s.on_result(&t, &result(1, 1.0)), Decision::Stop);
        assert!(s.members["trial_0000"].finished);
    }

    #[test]
    fn explore_perturbs_within_the_domains_and_keeps_the_rest() {
        let mut s = pbt(
            json!({
                "hyperparam_mutations": {
                    "list": ["a", "b", "c"],
                    "u": {"uniform": [0.0, 10.0]},
                    "i": {"randint": [1, 10]},
                    "q": {"quniform": [0.0, 1.0, 0.25]},
                    "whole": {"uniform": [0.0, 100.0]},
                    "nested.c": {"choice": ["x", "y", "z"]},
                },
                "resample_probability": 0.0,
                "perturbation_factors": [2.0, 0.5],
            }),
            Mode::Max,
        );
        let base = json!({
            "list": "a", "u": 6.0, "i": 3, "q": 0.5, "whole": 40,
            "nested": {"c": "x", "kept": true}, "other": [1, 2],
        });
        let mut seen_list = BTreeSet::new();
        let mut seen_u = BTreeSet::new();
        let mut seen_c = BTreeSet::new();
        for _ in 0..200 {
            let c = s.explore(&base);
            // An end of a list: stays or moves to its one neighbour.
            seen_list.insert(c["list"].as_str().unwrap().to_string());
            // 6 x 2 = 12 is clamped to 10; 6 x 0.5 = 3.
            seen_u.insert(c["u"].to_string());
            // 3 x 2 = 6, 3 x 0.5 = 1.5 rounds to 2.
            assert!(c["i"] == json!(6) || c["i"] == json!(2), "{}", c["i"]);
            // 0.5 x 2 = 1.0, 0.5 x 0.5 = 0.25: multiples of 0.25.
            assert!(c["q"] == json!(1.0) || c["q"] == json!(0.25), "{}", c["q"]);
            // An integer stays an integer.
            assert!(
                c["whole"] == json!(80) || c["whole"] == json!(20),
                "{}",
                c["whole"]
            );
            // A choice is resampled even when perturbed.
            seen_c.insert(c["nested"]["c"].as_str().unwrap().to_string());
            assert_eq!(c["nested"]["kept"], json!(true));
            assert_eq!(c["other"], json!([1, 2]));
        }
        assert_eq!(seen_list, BTreeSet::from(["a", "b"].map(String::from)));
        assert_eq!(seen_u, BTreeSet::from(["10.0", "3.0"].map(String::from)));
        assert_eq!(seen_c.len(), 3);
        // A value not in its list is always resampled.
        let c = s.explore(
            &json!({"list": "zz", "u": 1.0, "i": 1, "q": 0.0, "whole": 1, "nested": {"c": "x"}}),
        );
        assert!(["a", "b", "c"].contains(&c["list"].as_str().unwrap()));

        // Resampling draws from the domain.
        let mut s = pbt(
            json!({
                "hyperparam_mutations": {
                    "l": {"loguniform": [1e-3, 1e-1]},
                    "i": {"randint": [1, 3]},
                    "list": [10, 20],
                },
                "resample_probability": 1.0,
            }),
            Mode::Max,
        );
        for _ in 0..200 {
            let c = s.explore(&json!({"l": 0.5, "i": 1, "list": 20.0}));
            let l = c["l"].as_f64().unwrap();
            assert!((1e-3..=1e-1).contains(&l), "{l}");
            assert!(c["i"] == json!(1) || c["i"] == json!(2), "{}", c["i"]);
            assert!(c["list"] == json!(10) || c["list"] == json!(20));
        }
    }

    /// A population trained round robin, applying decisions the way the
    /// runner does: `Checkpoint` saves the trial's model, `Exploit` copies
    /// the source's newest saved model and takes the new config.
    struct Population {
        trials: Vec<Trial>,
        models: Vec<[f64; 2]>,
        saved: Vec<Option<([f64; 2], u64)>>,
        /// Each decision, as (trial, iteration, what).
        log: Vec<(usize, u64, String)>,
        round: u64,
    }

    impl Population {
        fn new(configs: Vec<Value>, scheduler: &mut dyn Scheduler) -> Self {
            let trials: Vec<Trial> = configs
                .into_iter()
                .enumerate()
                .map(|(i, c)| trial(i, c))
                .collect();
            for t in &trials {
                scheduler.on_trial_add(t);
            }
            scheduler.choose_next(&trials);
            let n = trials.len();
            Self {
                trials,
                models: vec![[0.9, 0.9]; n],
                saved: vec![None; n],
                log: Vec::new(),
                round: 0,
            }
        }

        /// The toy of the PBT paper (Figure 2): maximize
        /// Q = 1.2 - |theta|^2 by gradient steps on a surrogate that weighs
        /// the coordinates by `h`, one-hot here, so that no fixed `h` can
        /// bring both down.
        fn step(&mut self, i: usize) -> f64 {
            let c = &self.trials[i].config;
            let lr = c["lr"].as_f64().unwrap();
            let h = [c["h"][0].as_f64().unwrap(), c["h"][1].as_f64().unwrap()];
            let theta = &mut self.models[i];
            for k in 0..2 {
                theta[k] -= lr * 2.0 * h[k] * theta[k];
            }
            1.2 - theta[0] * theta[0] - theta[1] * theta[1]
        }

        /// `rounds` more iterations of every trial, in an order that moves
        /// with the round.
        fn run(&mut self, scheduler: &mut dyn Scheduler, rounds: u64) {
            let n = self.trials.len();
            for _ in 0..rounds {
                self.round += 1;
                for k in 0..n {
                    let i = (k * 3 + self.round as usize) % n;
                    let q = self.step(i);
                    let trial = &mut self.trials[i];
                    trial.iterations += 1;
                    let t = trial.iterations;
                    let record = result(t, q);
                    trial.last_result = Some(record.clone());
                    match scheduler.on_result(&self.trials[i], &record) {
                        Decision::Continue => {}
                        Decision::Checkpoint => {
                            self.saved[i] = Some((self.models[i], t));
                            checkpointed(&mut self.trials[i], t);
                            self.log.push((i, t, "checkpoint".into()));
                        }
                        Decision::Exploit { source, config } => {
                            let (model, at) = self.saved[source].expect("a checkpoint");
                            self.models[i] = model;
                            self.saved[i] = Some((model, at));
                            let trial = &mut self.trials[i];
                            trial.iterations = at;
                            checkpointed(trial, at);
                            self.log.push((i, t, format!("from {source}: {config}")));
                            trial.config = config;
                        }
                        other => panic!("pbt decided {other:?}"),
                    }
                }
            }
        }

        fn best(&self) -> f64 {
            self.models
                .iter()
                .map(|m| 1.2 - m[0] * m[0] - m[1] * m[1])
                .fold(f64::MIN, f64::max)
        }
    }

    fn toy() -> PbtConfig {
        config(json!({
            "perturbation_interval": 4,
            "hyperparam_mutations": {
                "h": [[1.0, 0.0], [0.0, 1.0]],
                "lr": {"loguniform": [0.001, 0.1]},
            },
        }))
    }

    fn toy_configs(seed: u64) -> Vec<Value> {
        let space = SearchSpace::from_json(&json!({
            "h": {"choice": [[1.0, 0.0], [0.0, 1.0]]},
            "lr": {"loguniform": [0.001, 0.1]},
        }))
        .unwrap();
        space.generate(8, seed).unwrap()
    }

    #[test]
    fn the_population_escapes_what_no_fixed_config_can() {
        // A fixed one-hot h leaves one coordinate at 0.9: Q <= 1.2 - 0.81.
        // The harness is deterministic, so these are exact outcomes: 1.168,
        // 1.199, 0.663, 1.196, 0.948.
        let mut total = 0.0;
        for seed in 0..5 {
            let mut s = PopulationBasedTraining::new(toy(), "score", Mode::Max, seed).unwrap();
            let mut population = Population::new(toy_configs(seed), &mut s);
            population.run(&mut s, 40);
            assert!(
                population.best() > 0.6,
                "seed {seed}: {} after {:?}",
                population.best(),
                population.log
            );
            assert!(s.perturbations() > 0 && s.checkpoints() > 0);
            total += population.best();
        }
        assert!(total / 5.0 > 1.0, "mean {}", total / 5.0);
    }

    #[test]
    fn state_round_trip_resumes_with_the_same_decisions() {
        let mut whole = PopulationBasedTraining::new(toy(), "score", Mode::Max, 3).unwrap();
        let mut expected = Population::new(toy_configs(3), &mut whole);
        expected.run(&mut whole, 30);
        assert!(whole.perturbations() > 2, "{:?}", expected.log);

        for cut in [5, 13] {
            let mut first = PopulationBasedTraining::new(toy(), "score", Mode::Max, 3).unwrap();
            let mut population = Population::new(toy_configs(3), &mut first);
            population.run(&mut first, cut);
            let text = serde_json::to_string(&first.state()).unwrap();
            let mut second = PopulationBasedTraining::new(toy(), "score", Mode::Max, 3).unwrap();
            second
                .restore_state(&serde_json::from_str(&text).unwrap())
                .unwrap();
            assert_eq!(second.state(), first.state());
            population.run(&mut second, 30 - cut);
            assert_eq!(population.log, expected.log, "cut at {cut}");
            assert_eq!(second.state(), whole.state(), "cut at {cut}");
        }
        let message = whole.restore_state(&json!({"trials": 3})).unwrap_err();
        assert!(message.contains("PBT state"), "{message}");
    }

    #[test]
    fn waiting_trials_start_in_order_and_indices_follow_the_runner() {
        let mut s = pbt(json!({"hyperparam_mutations": {"lr": [1, 2]}}), Mode::Max);
        let mut t: Vec<Trial> = (0..3).map(|i| trial(i, json!({"lr": 1}))).collect();
        // Known from a saved state in another order than the runner's list.
        s.on_trial_add(&t[2]);
        s.on_trial_add(&t[0]);
        assert_eq!(s.members["trial_0002"].index, 0);
        t[0].status = TrialStatus::Running;
        t[1].status = TrialStatus::Paused;
        assert_eq!(s.choose_next(&t), Some(1));
        assert_eq!(s.members["trial_0002"].index, 2);
        assert_eq!(s.members["trial_0000"].index, 0);
        t[1].status = TrialStatus::Terminated;
        assert_eq!(s.choose_next(&t), Some(2));
        t[2].status = TrialStatus::Running;
        assert_eq!(s.choose_next(&t), None);
    }
}
