//! Tree-structured Parzen Estimator (Bergstra, Bardenet, Bengio and Kégl,
//! "Algorithms for Hyper-Parameter Optimization", NeurIPS 2011), as hyperopt
//! and Optuna's `TPESampler` implement it.
//!
//! After `n_initial_points` random configurations, the completed trials are
//! split by their metric: the best `gamma` fraction are "good", the rest
//! "bad". Two Parzen estimators are fitted, `l(x)` to the good trials and
//! `g(x)` to the bad ones; the next configuration is the one among
//! `n_candidates` draws from `l` that maximizes `l(x) / g(x)` (which
//! maximizes expected improvement under the TPE model). By default the
//! estimators are joint (`multivariate`, see `tpe/joint.rs`: a mixture of
//! product kernels, as Optuna's default); with `multivariate = false` each
//! parameter is modeled, drawn and scored on its own, as in hyperopt.
//!
//! The univariate estimators (the joint one's factors are alike):
//! - uniform: a mixture of Gaussians truncated to `[low, high)`, one per
//!   observation, plus a prior component (centered, as wide as the range)
//!   weighted `prior_weight`. Each observation's width is the larger gap to
//!   its neighbours, clipped to `[range / min(100, n + 2), range]`.
//! - loguniform: the same in `ln` space.
//! - randint and quniform: the same over the values' range, with the
//!   probability of a value being the mixture's mass over the interval that
//!   rounds to it.
//! - choice: each value's probability is the weight of the observations
//!   that took it, plus `prior_weight` spread evenly over the values.
//!
//! With more than 25 observations in a group, older ones weigh less
//! (linearly, from `1/n` up to 1 for the 25 newest), as in hyperopt, so the
//! model follows the search as it narrows. The good group's observations
//! also weigh by rank (`rank_weights`): the one ranked `r` of `n_good`
//! weighs `(1 - r / n_good)²`, the best fully. Candidates then come mostly
//! from kernels around the best few configurations, and, since the
//! group's weights now sum to about a third of its size while the prior
//! keeps its weight, more often from the prior than in Optuna. Hyperopt and
//! Optuna weigh the good group by recency only. In `wtune-bench search`
//! (30 seeds, then 30 others) the rank weights cut the joint estimator's
//! median regret at 100 trials by a quarter to two thirds on the five
//! continuous functions of 4 to 20 dimensions, left the other three (near
//! 0 either way) about as they were, and beat Optuna 5's default TPE on
//! every function; rescaled to keep the group's total weight they did
//! about as well (8 and 7 of 8 against Optuna), so the concentration, not
//! the prior's larger share, is most of it. With
//! `multivariate = false` they changed little either way. The idea is
//! CMA-ES's weighted recombination (Hansen, "The CMA Evolution Strategy:
//! A Tutorial"): better ranks pull harder.
//!
//! Observations are completed trials' final results. Intermediate results
//! are not used by default: mixing iterations would rank short trials
//! against long ones. A trial stopped early by a scheduler counts with its
//! last result, as in Ray Tune's TPE searchers. Trials that ended in error,
//! or whose last result lacks a finite metric, teach nothing. With
//! `multi_fidelity`, as BOHB (Falkner, Klein and Hutter, ICML 2018) inside
//! HyperBand, observations are instead every trial's metric at one
//! `training_iteration`: the highest that `n_initial_points` trials reached,
//! so that all are ranked at the same budget and the model starts from the
//! first rung, long before trials finish.
//! Trials still running count among the bad ones (`constant_liar`), so
//! trials started together explore different places.
//!
//! Suggestion `k` draws from a ChaCha8 generator seeded with the
//! experiment's seed on stream `k`, so the saved state is just the
//! observations, the suggestions not yet complete and the count: a resumed
//! search makes exactly the suggestions the uninterrupted one would have.

mod joint;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use self::joint::JointParzen;
use super::history::{History, ranked};
use super::normal::{LN_SQRT_2PI, Portable, normal_mass, standard_normal};
use super::param::Param;
use super::searcher::{Searcher, Suggestion};
use crate::tune::result::Mode;
use crate::tune::space::SearchSpace;

/// TPE's parameters, with the defaults of hyperopt and Optuna (which call
/// the first and third `n_startup_trials` and `n_ei_candidates`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TpeConfig {
    /// Completed trials drawn at random before the model is used.
    pub n_initial_points: u64,
    /// The fraction of completed trials that make up the "good" group: the
    /// best `ceil(gamma * n)` of `n`, the paper's quantile (Optuna takes
    /// `min(ceil(0.1 * n), 25)`). 0.15 measured best of 0.1, 0.15 and 0.25
    /// with the joint estimator on the functions of `wtune-bench search`
    /// (BENCHMARKS.md).
    pub gamma: f64,
    /// Draws from the good-group estimator compared per suggestion.
    pub n_candidates: usize,
    /// Weight of the prior (the whole range) against one observation;
    /// higher explores more.
    pub prior_weight: f64,
    /// Model the parameters jointly (a candidate is drawn and scored as a
    /// whole configuration, see `tpe/joint.rs`), as Optuna's default TPE
    /// does; `false`: one independent model per parameter, as hyperopt.
    pub multivariate: bool,
    /// Count trials suggested but not complete as bad ones (Optuna's
    /// "constant liar", its default), so that trials running at once are
    /// not suggested the same region; matters only with
    /// `max_concurrent_trials > 1`.
    pub constant_liar: bool,
    /// Weigh the good observations by rank, the best most: the one ranked
    /// `r` (0 the best) of `n_good` weighs `(1 - r / n_good)²`, on top of
    /// the recency weights. `false`: every good observation weighs the
    /// same, as in hyperopt and Optuna. The square measured better than
    /// the linear rank and about as well as the cube (BENCHMARKS.md).
    pub rank_weights: bool,
    /// Learn from intermediate results, as BOHB does inside HyperBand:
    /// the model is fitted to the metrics at the highest
    /// `training_iteration` that at least `n_initial_points` trials reached,
    /// so under ASHA or HyperBand it learns from the early rungs long
    /// before many trials finish. `false`: final results only.
    pub multi_fidelity: bool,
}

impl Default for TpeConfig {
    fn default() -> Self {
        Self {
            n_initial_points: 10,
            gamma: 0.15,
            n_candidates: 24,
            prior_weight: 1.0,
            multivariate: true,
            constant_liar: true,
            rank_weights: true,
            multi_fidelity: false,
        }
    }
}

/// More candidates than this cost time without improving suggestions; a
/// larger number is most likely a typo.
const MAX_CANDIDATES: usize = 100_000;

/// Observations beyond the newest this many in a group weigh less.
const FULL_WEIGHT_NEWEST: usize = 25;

impl TpeConfig {
    /// The keys a `[search]` table with `type = "tpe"` takes.
    pub const FIELDS: [&'static str; 8] = [
        "n_initial_points",
        "gamma",
        "n_candidates",
        "prior_weight",
        "multivariate",
        "constant_liar",
        "rank_weights",
        "multi_fidelity",
    ];

    /// Checks the parameters, naming the first bad one.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.gamma > 0.0 && self.gamma < 1.0) {
            return Err(format!(
                "search.gamma must be in (0, 1), got {}",
                self.gamma
            ));
        }
        if !(1..=MAX_CANDIDATES).contains(&self.n_candidates) {
            return Err(format!(
                "search.n_candidates must be between 1 and {MAX_CANDIDATES}, got {}",
                self.n_candidates
            ));
        }
        if !(self.prior_weight > 0.0 && self.prior_weight.is_finite()) {
            return Err(format!(
                "search.prior_weight must be a positive number, got {}",
                self.prior_weight
            ));
        }
        Ok(())
    }
}

/// `param`'s value among `n_candidates` draws from the estimator fitted to
/// `good` that is likeliest under it relative to the one fitted to
/// `bad`: the univariate estimator's choice. Each group is in
/// chronological order, with its observations' weights.
fn univariate_choice(
    param: &Param,
    (good, w_good): (&[f64], &[f64]),
    (bad, w_bad): (&[f64], &[f64]),
    config: &TpeConfig,
    rng: &mut ChaCha8Rng,
) -> f64 {
    let mut best = (f64::NEG_INFINITY, f64::NAN);
    match *param {
        Param::Categorical(ref values) => {
            let l = categorical(values.len(), good, w_good, config.prior_weight);
            let g = categorical(values.len(), bad, w_bad, config.prior_weight);
            for _ in 0..config.n_candidates {
                let k = pick(&l, rng);
                let score = l[k].pln() - g[k].pln();
                if score > best.0 {
                    best = (score, k as f64);
                }
            }
        }
        Param::Float { lo, hi, .. } | Param::Quantized { lo, hi, .. } => {
            let l = Parzen::fit(good, w_good, lo, hi, config.prior_weight);
            let g = Parzen::fit(bad, w_bad, lo, hi, config.prior_weight);
            for _ in 0..config.n_candidates {
                let x = param.quantize(l.sample(rng));
                let score = match *param {
                    Param::Quantized { q, .. } => {
                        let (a, b) = ((x - q / 2.0).max(lo), (x + q / 2.0).min(hi));
                        l.log_mass(a, b) - g.log_mass(a, b)
                    }
                    _ => l.log_pdf(x) - g.log_pdf(x),
                };
                if score > best.0 {
                    best = (score, x);
                }
            }
        }
    }
    if best.1.is_nan() {
        // Scores are finite (the prior puts mass everywhere), so this
        // only guards against arithmetic surprises.
        return param.random(rng);
    }
    best.1
}

/// Hyperopt's linear forgetting: the newest observations weigh 1, older
/// ones ramp up from `1/n`.
fn recency_weights(n: usize) -> Vec<f64> {
    if n <= FULL_WEIGHT_NEWEST {
        return vec![1.0; n];
    }
    let old = n - FULL_WEIGHT_NEWEST;
    let first = 1.0 / n as f64;
    (0..old)
        .map(|i| {
            if old == 1 {
                first
            } else {
                first + (1.0 - first) * i as f64 / (old - 1) as f64
            }
        })
        .chain(std::iter::repeat_n(1.0, FULL_WEIGHT_NEWEST))
        .collect()
}

/// The good group's weights, in its chronological order: recency times,
/// with `by_rank`, `(1 - r / n)²` for the observation ranked `r` (0 the
/// best) of the group's `n`. `ranks[i]`: the rank of the group's `i`th
/// observation.
fn good_weights(ranks: &[usize], by_rank: bool) -> Vec<f64> {
    let mut weights = recency_weights(ranks.len());
    if by_rank {
        let n = ranks.len() as f64;
        for (w, &r) in weights.iter_mut().zip(ranks) {
            *w *= (1.0 - r as f64 / n).powi(2);
        }
    }
    weights
}

/// Probabilities of each of `n` choices given the observed indices.
fn categorical(n: usize, observed: &[f64], weights: &[f64], prior_weight: f64) -> Vec<f64> {
    let mut p = vec![prior_weight / n as f64; n];
    for (&k, &w) in observed.iter().zip(weights) {
        p[k as usize] += w;
    }
    let total: f64 = p.iter().sum();
    p.iter_mut().for_each(|x| *x /= total);
    p
}

/// An index drawn with probability proportional to `weights`.
fn pick(weights: &[f64], rng: &mut ChaCha8Rng) -> usize {
    let total: f64 = weights.iter().sum();
    let mut u = rng.random::<f64>() * total;
    for (i, &w) in weights.iter().enumerate() {
        if u < w {
            return i;
        }
        u -= w;
    }
    weights.len() - 1
}

/// Each value's kernel width in one dimension: the larger gap to its
/// neighbours (the bounds count as neighbours), but the outermost values
/// use only their inner gap, so that empty space out to a bound does not
/// widen them (the prior covers it), as in Optuna; kept within
/// `[min_sigma, hi - lo]`. In the order of `values`.
fn gap_widths(values: &[f64], lo: f64, hi: f64, min_sigma: f64) -> Vec<f64> {
    let n = values.len();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| values[a].total_cmp(&values[b]).then(a.cmp(&b)));
    let at = |rank: usize| match rank {
        0 => lo,
        r if r > n => hi,
        r => values[order[r - 1]],
    };
    let mut sigmas = vec![0.0; n];
    for (rank, &i) in order.iter().enumerate() {
        let (left, right) = (at(rank + 1) - at(rank), at(rank + 2) - at(rank + 1));
        let sigma = if n >= 2 && rank == 0 {
            right
        } else if n >= 2 && rank == n - 1 {
            left
        } else {
            left.max(right)
        };
        sigmas[i] = sigma.clamp(min_sigma, hi - lo);
    }
    sigmas
}

/// A mixture of Gaussians truncated to `[lo, hi)`.
struct Parzen {
    lo: f64,
    hi: f64,
    weights: Vec<f64>,
    mus: Vec<f64>,
    sigmas: Vec<f64>,
    /// `ln` of each normalized weight divided by the component's mass
    /// inside the bounds: the truncated component's log scale.
    log_scale: Vec<f64>,
    /// `log_scale - ln(sigma) - ln(sqrt(2 pi))`, and `1 / sigma`: the parts
    /// of each component's log density that do not depend on `x`, computed
    /// once per fit instead of once per candidate and component.
    log_norm: Vec<f64>,
    inv_sigma: Vec<f64>,
}

impl Parzen {
    fn fit(observed: &[f64], weights: &[f64], lo: f64, hi: f64, prior_weight: f64) -> Self {
        let range = hi - lo;
        let prior_mu = 0.5 * (lo + hi);
        let n = observed.len();
        // The prior's center counts among the neighbours; its own width is
        // the range.
        let mus: Vec<f64> = observed.iter().copied().chain([prior_mu]).collect();
        let mut sigmas = gap_widths(&mus, lo, hi, range / (100.0f64).min(n as f64 + 2.0));
        sigmas[n] = range;
        let mut mixture_weights: Vec<f64> = weights.to_vec();
        mixture_weights.push(prior_weight);
        let total: f64 = mixture_weights.iter().sum();
        let log_scale: Vec<f64> = mus
            .iter()
            .zip(&sigmas)
            .zip(&mixture_weights)
            .map(|((&mu, &sigma), &w)| {
                (w / total).pln() - normal_mass((lo - mu) / sigma, (hi - mu) / sigma).pln()
            })
            .collect();
        let log_norm = log_scale
            .iter()
            .zip(&sigmas)
            .map(|(&s, &sigma)| s - sigma.pln() - LN_SQRT_2PI)
            .collect();
        let inv_sigma = sigmas.iter().map(|&sigma| 1.0 / sigma).collect();
        Self {
            lo,
            hi,
            weights: mixture_weights,
            mus,
            sigmas,
            log_scale,
            log_norm,
            inv_sigma,
        }
    }

    fn sample(&self, rng: &mut ChaCha8Rng) -> f64 {
        let k = pick(&self.weights, rng);
        let (mu, sigma) = (self.mus[k], self.sigmas[k]);
        // Every center lies within the bounds and no width exceeds the
        // range, so at least about a third of the draws land inside.
        for _ in 0..1000 {
            let x = mu + sigma * standard_normal(rng);
            if x >= self.lo && x < self.hi {
                return x;
            }
        }
        mu
    }

    fn log_pdf(&self, x: f64) -> f64 {
        // The hot loop of a suggestion: candidates × components, so no
        // division, logarithm or allocation per term.
        log_sum_exp(self.mus.len(), |k| {
            let z = (x - self.mus[k]) * self.inv_sigma[k];
            self.log_norm[k] - 0.5 * z * z
        })
    }

    /// `ln` of the mixture's mass over `[a, b]`.
    fn log_mass(&self, a: f64, b: f64) -> f64 {
        log_sum_exp(self.mus.len(), |k| {
            let (mu, sigma) = (self.mus[k], self.sigmas[k]);
            self.log_scale[k] + normal_mass((a - mu) / sigma, (b - mu) / sigma).pln()
        })
    }
}

/// `ln(sum_k exp(term(k)))` for `k < n`, stable for large terms: one pass
/// for the largest term, one for the sum. `term(k)` is called twice, so a
/// caller whose terms cost more than a store and a load (the joint
/// estimator's, one per parameter) passes terms computed once.
fn log_sum_exp(n: usize, term: impl Fn(usize) -> f64) -> f64 {
    let max = (0..n).map(&term).fold(f64::NEG_INFINITY, f64::max);
    if max == f64::NEG_INFINITY {
        return max;
    }
    max + (0..n).map(|k| (term(k) - max).pexp()).sum::<f64>().pln()
}

/// The TPE searcher.
#[derive(Debug, Clone)]
pub struct Tpe {
    config: TpeConfig,
    space: SearchSpace,
    params: Vec<Param>,
    metric: String,
    mode: Mode,
    seed: u64,
    num_samples: u64,
    history: History,
}

impl Tpe {
    /// A search of `num_samples` trials over `space`, learning from
    /// `metric` (lower is better under [`Mode::Min`]).
    pub fn new(
        config: TpeConfig,
        space: &SearchSpace,
        num_samples: u64,
        metric: &str,
        mode: Mode,
        seed: u64,
    ) -> Result<Self, String> {
        config.validate()?;
        let params = space
            .domains()
            .into_iter()
            .map(|(path, domain)| Param::new(&path, domain, "tpe"))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            config,
            space: space.clone(),
            params,
            metric: metric.to_string(),
            mode,
            seed,
            num_samples,
            history: History::default(),
        })
    }

    /// The model values of the next configuration.
    fn next_values(&self) -> Vec<f64> {
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        rng.set_stream(self.history.suggested);
        let min_count = self.config.n_initial_points.max(1) as usize;
        let (observations, iteration) = self
            .history
            .learning_set(self.config.multi_fidelity, min_count);
        let observations = &observations[..];
        let n = observations.len();
        if n < min_count {
            return self.params.iter().map(|p| p.random(&mut rng)).collect();
        }
        let ranked = ranked(observations, self.mode);
        let n_good = ((self.config.gamma * n as f64).ceil() as usize).clamp(1, n);
        // Each observation's rank among the good ones; `None`: a bad one.
        let mut good_rank = vec![None; n];
        ranked[..n_good]
            .iter()
            .enumerate()
            .for_each(|(r, &i)| good_rank[i] = Some(r));
        let (mut good, mut bad): (Vec<&[f64]>, Vec<&[f64]>) = (Vec::new(), Vec::new());
        let mut ranks = Vec::with_capacity(n_good);
        for (obs, rank) in observations.iter().zip(&good_rank) {
            match *rank {
                Some(r) => {
                    good.push(&obs.values);
                    ranks.push(r);
                }
                None => bad.push(&obs.values),
            }
        }
        if self.config.constant_liar {
            // Trials suggested but not complete count as bad, the newest
            // (trial ids sort in suggestion order): the next suggestion
            // steers away from where they already look. With multi-fidelity
            // a running trial that reached the rung is an observation
            // there, not a lie.
            bad.extend(self.history.lies(iteration).map(Vec::as_slice));
        }
        let w_good = good_weights(&ranks, self.config.rank_weights);
        let w_bad = recency_weights(bad.len());
        if self.config.multivariate {
            return self.joint_choice((&good, &w_good), (&bad, &w_bad), &mut rng);
        }
        let column = |group: &[&[f64]], j: usize| group.iter().map(|x| x[j]).collect::<Vec<_>>();
        self.params
            .iter()
            .enumerate()
            .map(|(j, param)| {
                univariate_choice(
                    param,
                    (&column(&good, j), &w_good),
                    (&column(&bad, j), &w_bad),
                    &self.config,
                    &mut rng,
                )
            })
            .collect()
    }

    /// The candidate, among `n_candidates` configurations drawn from the
    /// joint estimator of the `good` configurations, likeliest under it
    /// relative to the joint estimator of the `bad` ones; each group with
    /// its observations' weights.
    fn joint_choice(
        &self,
        (good, w_good): (&[&[f64]], &[f64]),
        (bad, w_bad): (&[&[f64]], &[f64]),
        rng: &mut ChaCha8Rng,
    ) -> Vec<f64> {
        let prior = self.config.prior_weight;
        let l = JointParzen::fit(&self.params, good, w_good, prior);
        let g = JointParzen::fit(&self.params, bad, w_bad, prior);
        let mut best: Option<(f64, Vec<f64>)> = None;
        for _ in 0..self.config.n_candidates {
            let x = l.sample(rng);
            let score = l.ln_density(&x) - g.ln_density(&x);
            if best.as_ref().is_none_or(|(b, _)| score > *b) {
                best = Some((score, x));
            }
        }
        match best {
            Some((score, x)) if score.is_finite() => x,
            // Scores are finite (the prior puts mass everywhere), so this
            // only guards against arithmetic surprises.
            _ => self.params.iter().map(|p| p.random(rng)).collect(),
        }
    }
}

impl Searcher for Tpe {
    fn on_result(&mut self, trial_id: &str, result: &Map<String, Value>) {
        if self.config.multi_fidelity {
            self.history.record(trial_id, result, &self.metric);
        }
    }

    fn suggest(&mut self, trial_id: &str) -> Suggestion {
        if self.history.suggested >= self.num_samples {
            return Suggestion::Finished;
        }
        let values = self.next_values();
        let config = self.space.build(|i, _| self.params[i].to_value(values[i]));
        self.history.suggest(trial_id, values);
        Suggestion::Config(config)
    }

    fn on_trial_complete(
        &mut self,
        trial_id: &str,
        result: Option<&Map<String, Value>>,
        error: bool,
    ) {
        self.history.complete(trial_id, result, error, &self.metric);
    }

    fn on_trial_retry(&mut self, trial_id: &str) {
        self.history.retry(trial_id);
    }

    fn total(&self) -> Option<u64> {
        Some(self.num_samples)
    }

    fn name(&self) -> &'static str {
        "tpe"
    }

    fn state(&self) -> Value {
        serde_json::json!(self.history)
    }

    fn restore_state(&mut self, state: &Value) -> Result<(), String> {
        if let Some(saved) = History::restore(state, &self.params, "TPE")? {
            self.history = saved;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tune::search::BasicVariant;
    use crate::tune::search::history;
    use crate::tune::search::testing::{at_iteration, first_rung_spread};
    use serde_json::json;

    fn space(value: Value) -> SearchSpace {
        SearchSpace::from_json(&value).unwrap()
    }

    fn tpe(space: &SearchSpace, n: u64, mode: Mode, seed: u64) -> Tpe {
        Tpe::new(TpeConfig::default(), space, n, "loss", mode, seed).unwrap()
    }

    fn result(loss: f64) -> Map<String, Value> {
        json!({"loss": loss}).as_object().unwrap().clone()
    }

    fn bowl() -> SearchSpace {
        space(json!({"x": {"uniform": [0, 1]}, "y": {"loguniform": [1e-4, 1.0]}}))
    }

    fn bowl_loss(config: &Value) -> f64 {
        let (x, y) = (config["x"].as_f64().unwrap(), config["y"].as_f64().unwrap());
        (x - 0.3).powi(2) + (y.log10() + 2.0).powi(2)
    }

    /// Runs trials one at a time, each completing before the next starts;
    /// returns the configurations and their losses.
    fn run(
        searcher: &mut dyn Searcher,
        trials: usize,
        loss: impl Fn(&Value) -> f64,
    ) -> Vec<(Value, f64)> {
        let mut out = Vec::new();
        for i in 0..trials {
            let id = format!("trial_{i:04}");
            let Suggestion::Config(config) = searcher.suggest(&id) else {
                panic!("expected a configuration");
            };
            let value = loss(&config);
            searcher.on_trial_complete(&id, Some(&result(value)), false);
            out.push((config, value));
        }
        out
    }

    fn best(history: &[(Value, f64)]) -> f64 {
        history.iter().map(|h| h.1).fold(f64::INFINITY, f64::min)
    }

    #[test]
    fn finds_a_better_optimum_than_random_search() {
        let seeds = 0..10u64;
        let (mut tpe_sum, mut random_sum, mut tpe_wins) = (0.0, 0.0, 0);
        for seed in seeds.clone() {
            let s = bowl();
            let t = best(&run(&mut tpe(&s, 60, Mode::Min, seed), 60, bowl_loss));
            let r = best(&run(
                &mut BasicVariant::random(&s, 60, seed).unwrap(),
                60,
                bowl_loss,
            ));
            tpe_sum += t;
            random_sum += r;
            tpe_wins += usize::from(t < r);
        }
        let n = seeds.count() as f64;
        let (tpe_mean, random_mean) = (tpe_sum / n, random_sum / n);
        assert!(
            tpe_mean < 0.5 * random_mean,
            "tpe {tpe_mean} vs random {random_mean}"
        );
        assert!(tpe_wins >= 7, "tpe won {tpe_wins} of 10");
    }

    #[test]
    fn the_joint_model_finds_a_diagonal_valley_sooner() {
        // Two valleys along diagonals, where the good values of one
        // parameter depend on another's: after 60 trials, over 10 seeds,
        // the joint model's median best is far below random search's.
        let s = space(json!({
            "a": {"uniform": [-5, 5]}, "b": {"uniform": [-5, 5]},
            "c": {"uniform": [-5, 5]}, "d": {"uniform": [-5, 5]},
        }));
        let loss = |c: &Value| {
            let x = |k: &str| c[k].as_f64().unwrap();
            10.0 * (x("a") + x("b") - 1.0).powi(2)
                + 0.5 * (x("a") - x("b")).powi(2)
                + 10.0 * (x("c") + x("d")).powi(2)
                + 0.5 * (x("c") - x("d") - 2.0).powi(2)
        };
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            0.5 * (v[4] + v[5])
        };
        let joint = median(
            (0..10)
                .map(|seed| best(&run(&mut tpe(&s, 60, Mode::Min, seed), 60, loss)))
                .collect(),
        );
        let random = median(
            (0..10)
                .map(|seed| {
                    let mut r = BasicVariant::random(&s, 60, seed).unwrap();
                    best(&run(&mut r, 60, loss))
                })
                .collect(),
        );
        assert!(joint < 0.5 * random, "joint {joint} vs random {random}");
    }

    #[test]
    fn trials_running_at_once_are_not_sent_to_the_same_place() {
        // After 20 trials, 8 suggestions in a row with none complete (8
        // trials running at once): with the constant liar each steers away
        // from those before it, so they spread; without, they crowd where
        // the model likes best.
        let spread = |constant_liar: bool| -> f64 {
            (0..5)
                .map(|seed| {
                    let config = TpeConfig {
                        constant_liar,
                        ..TpeConfig::default()
                    };
                    let s = bowl();
                    let mut searcher = Tpe::new(config, &s, 28, "loss", Mode::Min, seed).unwrap();
                    run(&mut searcher, 20, bowl_loss);
                    let points: Vec<(f64, f64)> = (0..8)
                        .map(|i| {
                            let Suggestion::Config(c) = searcher.suggest(&format!("p{i}")) else {
                                panic!("expected a configuration");
                            };
                            let y = c["y"].as_f64().unwrap().log10() / 4.0;
                            (c["x"].as_f64().unwrap(), y)
                        })
                        .collect();
                    let mut total = 0.0;
                    for (i, a) in points.iter().enumerate() {
                        for b in &points[i + 1..] {
                            total += ((a.0 - b.0).powi(2) + (a.1 - b.1).powi(2)).sqrt();
                        }
                    }
                    total / 28.0
                })
                .sum::<f64>()
                / 5.0
        };
        let (liar, crowd) = (spread(true), spread(false));
        assert!(
            liar > 1.5 * crowd,
            "mean distance {liar} with the liar, {crowd} without"
        );
    }

    #[test]
    fn learns_discrete_and_categorical_parameters_when_maximizing() {
        let s = space(json!({
            "act": {"choice": ["relu", "tanh", "gelu", "none"]},
            "layers": {"randint": [1, 9]},
            "drop": {"quniform": [0.0, 0.5, 0.1]},
            "fixed": {"width": 64},
        }));
        let score = |c: &Value| {
            let act = if c["act"] == json!("gelu") { 1.0 } else { 0.0 };
            let layers = c["layers"].as_i64().unwrap() as f64;
            let drop = c["drop"].as_f64().unwrap();
            act - 0.1 * (layers - 6.0).abs() - (drop - 0.2).abs()
        };
        // Over 5 seeds, the last 40 of 80 suggestions; random search would
        // pick gelu a quarter of the time and layers near 6 3/8 of it.
        for multivariate in [true, false] {
            let (mut gelu, mut near) = (0, 0);
            for seed in 0..5 {
                let config = TpeConfig {
                    multivariate,
                    ..TpeConfig::default()
                };
                let mut searcher = Tpe::new(config, &s, 80, "loss", Mode::Max, seed).unwrap();
                let history = run(&mut searcher, 80, score);
                for (config, _) in &history {
                    let layers = config["layers"].as_i64().unwrap();
                    assert!((1..9).contains(&layers));
                    let drop = config["drop"].as_f64().unwrap();
                    assert!((0.0..=0.5).contains(&drop));
                    assert!(((drop * 10.0).round() - drop * 10.0).abs() < 1e-9);
                    assert_eq!(config["fixed"], json!({"width": 64}));
                }
                let late = &history[40..];
                gelu += late
                    .iter()
                    .filter(|(c, _)| c["act"] == json!("gelu"))
                    .count();
                near += late
                    .iter()
                    .filter(|(c, _)| (c["layers"].as_i64().unwrap() - 6).abs() <= 1)
                    .count();
                assert_eq!(searcher.suggest("extra"), Suggestion::Finished);
            }
            assert!(
                gelu >= 90,
                "multivariate {multivariate}: gelu in {gelu} of 200"
            );
            assert!(
                near >= 120,
                "multivariate {multivariate}: near 6 in {near} of 200"
            );
        }
    }

    #[test]
    fn same_seed_same_suggestions() {
        let s = bowl();
        let a = run(&mut tpe(&s, 30, Mode::Min, 9), 30, bowl_loss);
        let b = run(&mut tpe(&s, 30, Mode::Min, 9), 30, bowl_loss);
        assert_eq!(a, b);
        let c = run(&mut tpe(&s, 30, Mode::Min, 10), 30, bowl_loss);
        assert_ne!(a, c);
    }

    #[test]
    fn a_resumed_search_continues_identically() {
        let s = space(json!({
            "x": {"uniform": [0, 1]},
            "y": {"loguniform": [1e-4, 1.0]},
            "c": {"choice": [1, 2, 3]},
            "n": {"randint": [0, 5]},
        }));
        let loss = |c: &Value| bowl_loss(c) + c["n"].as_f64().unwrap() * 0.01;
        let mut first = tpe(&s, 40, Mode::Min, 5);
        run(&mut first, 15, loss);
        // Two trials still running when the experiment is interrupted.
        let Suggestion::Config(a) = first.suggest("open_a") else {
            panic!()
        };
        let Suggestion::Config(b) = first.suggest("open_b") else {
            panic!()
        };
        let state: Value = serde_json::from_str(&first.state().to_string()).unwrap();
        let mut resumed = tpe(&s, 40, Mode::Min, 5);
        resumed.restore_state(&state).unwrap();
        for searcher in [&mut first as &mut dyn Searcher, &mut resumed] {
            searcher.on_trial_complete("open_b", Some(&result(loss(&b))), false);
            searcher.on_trial_complete("open_a", Some(&result(loss(&a))), false);
        }
        assert_eq!(run(&mut first, 23, loss), run(&mut resumed, 23, loss));
        assert_eq!(first.suggest("x"), Suggestion::Finished);
        assert_eq!(first.state(), resumed.state());
    }

    #[test]
    fn errors_and_missing_metrics_teach_nothing() {
        let s = bowl();
        let mut searcher = tpe(&s, 10, Mode::Min, 1);
        for id in ["a", "b", "c", "d"] {
            searcher.suggest(id);
        }
        searcher.on_trial_complete("a", Some(&result(1.0)), true);
        searcher.on_trial_complete("b", None, false);
        let nan = json!({"loss": null}).as_object().unwrap().clone();
        searcher.on_trial_complete("c", Some(&nan), false);
        searcher.on_trial_complete("unknown", Some(&result(1.0)), false);
        assert!(searcher.history.observations.is_empty());
        searcher.on_trial_complete("d", Some(&result(0.5)), false);
        assert_eq!(searcher.history.observations.len(), 1);
        assert!(searcher.history.pending.is_empty());
    }

    /// A trial retried after an error (`wtune resume --retry-errored`) is
    /// learned from when it completes, also across a save and restore.
    #[test]
    fn a_retried_trial_teaches_when_it_completes() {
        let s = bowl();
        let mut searcher = tpe(&s, 10, Mode::Min, 1);
        searcher.suggest("a");
        searcher.on_trial_complete("a", None, true);
        assert!(searcher.history.observations.is_empty());
        let mut resumed = tpe(&s, 10, Mode::Min, 1);
        resumed.restore_state(&searcher.state()).unwrap();
        resumed.on_trial_retry("a");
        resumed.on_trial_retry("never-suggested");
        resumed.on_trial_complete("a", Some(&result(0.25)), false);
        assert_eq!(resumed.history.observations.len(), 1);
        assert_eq!(resumed.history.observations[0].metric, 0.25);
        assert!(resumed.history.pending.is_empty() && resumed.history.failed.is_empty());
    }

    /// A completed trial extended under new stopping criteria (`wtune
    /// resume --stop`) gives back its final result, learns from what it
    /// reports next, and teaches its new end in completion order. A
    /// history saved before observations kept their trial has nothing to
    /// give back, and keeps its observation.
    #[test]
    fn an_extended_trial_trades_its_old_final_result_for_its_new_one() {
        let s = bowl();
        let mut searcher = tpe(&s, 10, Mode::Min, 1);
        for id in ["a", "b"] {
            searcher.suggest(id);
        }
        searcher.on_trial_complete("a", Some(&result(0.5)), false);
        searcher.on_trial_complete("b", Some(&result(0.75)), false);
        let values = searcher.history.observations[0].values.clone();
        let mut resumed = tpe(&s, 10, Mode::Min, 1);
        resumed.restore_state(&searcher.state()).unwrap();
        resumed.on_trial_retry("a");
        assert_eq!(resumed.history.observations.len(), 1);
        assert_eq!(resumed.history.pending["a"], values);
        resumed.on_trial_complete("a", Some(&result(0.25)), false);
        assert_eq!(
            resumed.history.ends(),
            [(Some("b"), 0.75), (Some("a"), 0.25)]
        );

        let mut legacy = searcher.state();
        for o in legacy["observations"].as_array_mut().unwrap() {
            o.as_object_mut().unwrap().remove("trial");
        }
        let mut old = tpe(&s, 10, Mode::Min, 1);
        old.restore_state(&legacy).unwrap();
        old.on_trial_retry("a");
        assert_eq!(old.history.observations.len(), 2);
        assert!(old.history.pending.is_empty());
    }

    #[test]
    fn refuses_grid_search_and_bad_parameters() {
        let s = space(json!({"opt": {"bs": {"grid_search": [16, 32]}}}));
        let message = Tpe::new(TpeConfig::default(), &s, 5, "loss", Mode::Min, 0).unwrap_err();
        assert!(
            message.starts_with("param_space.opt.bs: the tpe searcher cannot use grid_search"),
            "{message}"
        );
        let cases = [
            (
                TpeConfig {
                    gamma: 1.0,
                    ..Default::default()
                },
                "search.gamma must be in (0, 1)",
            ),
            (
                TpeConfig {
                    gamma: f64::NAN,
                    ..Default::default()
                },
                "search.gamma must be in (0, 1)",
            ),
            (
                TpeConfig {
                    n_candidates: 0,
                    ..Default::default()
                },
                "search.n_candidates must be between 1",
            ),
            (
                TpeConfig {
                    prior_weight: 0.0,
                    ..Default::default()
                },
                "search.prior_weight must be a positive number",
            ),
        ];
        for (config, expected) in cases {
            let message = Tpe::new(config, &bowl(), 5, "loss", Mode::Min, 0).unwrap_err();
            assert!(message.starts_with(expected), "{message}");
        }
    }

    #[test]
    fn states_from_another_space_are_refused() {
        let mut searcher = tpe(&bowl(), 10, Mode::Min, 1);
        run(&mut searcher, 3, bowl_loss);
        let state = searcher.state();
        let other = space(json!({"x": {"uniform": [0, 1]}}));
        let message = tpe(&other, 10, Mode::Min, 1)
            .restore_state(&state)
            .unwrap_err();
        assert!(
            message.contains("does not fit this search space"),
            "{message}"
        );
        let narrower =
            space(json!({"x": {"uniform": [0, 0.001]}, "y": {"loguniform": [1e-4, 1.0]}}));
        assert!(
            tpe(&narrower, 10, Mode::Min, 1)
                .restore_state(&state)
                .is_err()
        );
        assert!(
            tpe(&bowl(), 10, Mode::Min, 1)
                .restore_state(&json!({"suggested": 1}))
                .is_err()
        );
    }

    #[test]
    fn parzen_estimators_are_normalized_densities() {
        let observed = [0.1, 0.15, 0.8];
        let weights = recency_weights(observed.len());
        let p = Parzen::fit(&observed, &weights, 0.0, 1.0, 1.0);
        let steps = 20_000;
        let integral: f64 = (0..steps)
            .map(|i| p.log_pdf((i as f64 + 0.5) / steps as f64).exp() / steps as f64)
            .sum();
        assert!((integral - 1.0).abs() < 1e-4, "{integral}");
        assert!((p.log_mass(0.0, 1.0).exp() - 1.0).abs() < 1e-6);
        assert!(
            p.log_pdf(0.12) > p.log_pdf(0.5),
            "mass gathers at observations"
        );
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        let draws: Vec<f64> = (0..4000).map(|_| p.sample(&mut rng)).collect();
        assert!(draws.iter().all(|x| (0.0..1.0).contains(x)));
        let low = draws.iter().filter(|&&x| x < 0.3).count() as f64 / 4000.0;
        let expected = p.log_mass(0.0, 0.3).exp();
        assert!((low - expected).abs() < 0.03, "{low} vs {expected}");
    }

    #[test]
    fn older_observations_weigh_less_past_the_newest_25() {
        assert_eq!(recency_weights(3), [1.0; 3]);
        let w = recency_weights(30);
        assert_eq!(w.len(), 30);
        assert!((w[0] - 1.0 / 30.0).abs() < 1e-12);
        assert!(w[..5].windows(2).all(|p| p[0] < p[1]));
        assert!(w[5..].iter().all(|&x| x == 1.0));
    }

    #[test]
    fn the_best_good_observations_weigh_most() {
        // Ranks in chronological order: the newest is the best.
        let w = good_weights(&[2, 1, 0], true);
        let expected = [1.0 / 9.0, 4.0 / 9.0, 1.0];
        assert!(
            w.iter().zip(expected).all(|(a, b)| (a - b).abs() < 1e-12),
            "{w:?}"
        );
        assert_eq!(good_weights(&[2, 1, 0], false), [1.0; 3]);
        // Past 25 observations recency still applies: the oldest, ranked
        // best, weighs its recency weight.
        let ranks: Vec<usize> = (0..30).collect();
        let w = good_weights(&ranks, true);
        assert!((w[0] - 1.0 / 30.0).abs() < 1e-12);
        assert!((w[29] - (1.0f64 / 30.0).powi(2)).abs() < 1e-12);
    }

    #[test]
    fn rank_weights_find_a_lower_value_in_eight_dimensions() {
        // A shifted sphere in 8 dimensions, 80 trials, 30 seeds (fewer
        // seeds' medians swing either way): the rank weights' median best
        // is clearly below that of equal weights (Optuna's choice).
        let s = space(
            (0..8)
                .map(|i| (format!("x{i}"), json!({"uniform": [-5, 5]})))
                .collect::<Map<_, _>>()
                .into(),
        );
        let loss = |c: &Value| -> f64 {
            (0..8)
                .map(|i| {
                    (c[format!("x{i}")].as_f64().unwrap() - (i as f64 * 0.37).sin() * 3.0).powi(2)
                })
                .sum()
        };
        let median_best = |rank_weights: bool| {
            let mut bests: Vec<f64> = (0..30)
                .map(|seed| {
                    let config = TpeConfig {
                        rank_weights,
                        ..TpeConfig::default()
                    };
                    let mut t = Tpe::new(config, &s, 80, "loss", Mode::Min, seed).unwrap();
                    best(&run(&mut t, 80, loss))
                })
                .collect();
            bests.sort_by(f64::total_cmp);
            0.5 * (bests[14] + bests[15])
        };
        let (ranked, equal) = (median_best(true), median_best(false));
        assert!(ranked < 0.7 * equal, "ranked {ranked} vs equal {equal}");
    }

    #[test]
    fn multi_fidelity_learns_from_the_first_rung_before_any_trial_finishes() {
        let space = space(json!({"x": {"uniform": [0, 1]}}));
        let config = |multi_fidelity| TpeConfig {
            multi_fidelity,
            ..TpeConfig::default()
        };
        let spread = |multi_fidelity| {
            let mut searcher =
                Tpe::new(config(multi_fidelity), &space, 40, "loss", Mode::Min, 2).unwrap();
            first_rung_spread(&mut searcher, 40, 20)
        };
        let (learned, blind) = (spread(true), spread(false));
        assert!(learned * 2.0 < blind, "{learned} vs {blind}");
    }

    #[test]
    fn multi_fidelity_ranks_at_the_highest_iteration_enough_trials_reached() {
        let space = space(json!({"x": {"uniform": [0, 1]}}));
        let config = TpeConfig {
            multi_fidelity: true,
            n_initial_points: 3,
            ..TpeConfig::default()
        };
        let mut searcher = Tpe::new(config, &space, 10, "loss", Mode::Min, 0).unwrap();
        for i in 0..4 {
            let id = format!("trial_{i:04}");
            assert!(matches!(searcher.suggest(&id), Suggestion::Config(_)));
            searcher.on_result(&id, &at_iteration(1, i as f64));
            if i < 3 {
                // Iteration 2 is missing (no metric) for one of them.
                let loss = if i == 1 { f64::NAN } else { 10.0 - i as f64 };
                searcher.on_result(&id, &at_iteration(2, loss));
                searcher.on_result(&id, &at_iteration(3, 20.0 - i as f64));
            }
        }
        let (iteration, at) = searcher.history.rung(3).unwrap();
        assert_eq!(iteration, 3);
        assert_eq!(
            at.iter().map(|o| o.metric).collect::<Vec<_>>(),
            [20.0, 19.0, 18.0]
        );
        assert_eq!(searcher.history.rung(4).unwrap().0, 1);
        assert!(searcher.history.rung(5).is_none());
        // Curves survive the saved state, a missing metric included.
        let state: Value = serde_json::from_str(&searcher.state().to_string()).unwrap();
        assert!(
            state["curves"]["trial_0001"]["metrics"][1].is_null(),
            "{state}"
        );
        let mut resumed =
            Tpe::new(searcher.config.clone(), &space, 10, "loss", Mode::Min, 0).unwrap();
        resumed.restore_state(&state).unwrap();
        assert_eq!(resumed.history.curves, searcher.history.curves);
        assert_eq!(
            resumed.suggest("trial_0004"),
            searcher.suggest("trial_0004")
        );
        // Without multi_fidelity, intermediate results are not kept.
        let mut plain = tpe(&space, 10, Mode::Min, 0);
        let _ = plain.suggest("trial_0000");
        plain.on_result("trial_0000", &at_iteration(1, 1.0));
        assert!(plain.history.curves.is_empty());
    }

    #[test]
    fn long_curves_keep_a_geometric_grid_of_iterations() {
        let kept: Vec<u64> = (0..=100).filter(|&i| history::kept_iteration(i)).collect();
        assert_eq!(
            kept,
            [
                1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 20, 25, 31, 38, 47, 58, 72,
                90
            ]
        );
        let up_to_a_million = (1..=1_000_000u64)
            .filter(|&i| history::kept_iteration(i))
            .count();
        assert_eq!(up_to_a_million, 65);
    }
}
