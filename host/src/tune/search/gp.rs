//! Gaussian-process Bayesian optimization, as Optuna's `GPSampler` does it.
//!
//! After `n_initial_points` random configurations, each suggestion:
//! 1. maps the observed configurations into the unit cube (a
//!    numeric parameter by its position in its range, `ln` space for
//!    loguniform; a choice by its index) and standardizes their metric so
//!    that larger is better;
//! 2. fits a GP with a Matérn 5/2 kernel, one length scale per parameter,
//!    by maximizing the marginal likelihood plus a prior (`gp/regressor.rs`),
//!    starting from the previous suggestion's fit;
//! 3. conditions it on the trials still running (with `multi_fidelity`,
//!    those not yet at the rung it learns from) as if each had reported
//!    the worst result so far ("constant liar"), so trials started
//!    together look in different places; with `multi_fidelity` and cost
//!    weighed, also on the trials stopped below the rung, so that a cheap
//!    configuration stopped there is not suggested again and again;
//! 4. maximizes log expected improvement over the best result so far
//!    (`gp/acquisition.rs`), less `cost_exponent` times the log fuel per
//!    iteration that a second GP predicts, and suggests the point found,
//!    rounded to the parameters' steps.
//!
//! Observations are completed trials' final results, as for TPE (see
//! `tpe.rs`), or with `multi_fidelity` the metrics at the highest
//! iteration enough trials reached. With `multi_fidelity = "joint"` the
//! iteration is one more coordinate (`ln i / ln top`, `top` the highest
//! iteration any trial reached), the observations are every trial's
//! metrics at the iterations where trials stopped (the rungs:
//! `History::levels`, at most 128: past that, the lowest level's points go
//! first, the earliest trials' first), and steps 3 and 4 ask about `top`:
//! MOBSTER's model (Klein et al., "Model-based Asynchronous Hyperparameter
//! and Neural Architecture Search", 2020), with the Matérn kernel over the
//! iteration too rather than its exponential decay. Suggestion `k` draws
//! from a ChaCha8 generator seeded with the experiment's seed on stream
//! `k`, and the fit is deterministic; with the previous fit saved beside
//! the history, a resumed search makes exactly the suggestions the
//! uninterrupted one would have.
//!
//! Why weigh cost: under a fuel budget (`stop_experiment.max_fuel`) with
//! ASHA, a search pays for every trial's first rung, and where the best
//! configurations are the dear ones (wider layers, smaller batches) a
//! searcher that ignores cost starts few trials. On the tabulated CNN
//! curves (`wtune-bench search-curves`, BENCHMARKS.md 2026-11-29) GP
//! started 26 trials and was level with random search; with
//! `cost_exponent = 1` it started 69 and its mean regret was a third below
//! random's. Where only the dearest configurations are good (the synthetic
//! set) it does worse than plain GP, so it is off by default.
//!
//! Suggestion time grows with the cube of the observations (a fit factors
//! their kernel matrix): about what `wtune-bench search` reports per
//! suggestion (BENCHMARKS.md); `cost_exponent` adds a second fit, over
//! every trial that reported. For hundreds of trials or more, TPE is the
//! cheaper model.

mod acquisition;
mod memo;
mod regressor;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use self::acquisition::{Acquisition, Coordinate, CostModel, climb};
use self::regressor::{Hyper, Metric, Posterior, fit};
use super::history::{History, Observation, in_start_order};
use super::param::Param;
use super::searcher::{Searcher, Suggestion};
use crate::tune::result::Mode;
use crate::tune::saved::read_saved;
use crate::tune::space::SearchSpace;

/// GP-BO's parameters, with Optuna's defaults (which calls them
/// `n_startup_trials`, `n_preliminary_samples` and `n_local_search`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GpConfig {
    /// Observations (completed trials, or with `multi_fidelity` trials at
    /// one iteration; with `"joint"`, trials that reported any iteration)
    /// before the model is used; suggestions until then are random.
    pub n_initial_points: u64,
    /// Random points whose expected improvement is compared per
    /// suggestion before local search.
    pub n_candidates: usize,
    /// Local searches per suggestion, from the best observed configuration
    /// and the best random points (at least from the best of each).
    pub n_local_search: usize,
    /// Learn from intermediate results, so that under ASHA or HyperBand
    /// the model learns from the rungs long before many trials finish:
    /// - `false` (the default): final results only.
    /// - `true`: as TPE's `multi_fidelity` does (BOHB's rule), the GP is
    ///   fitted to the metrics at the highest `training_iteration` that at
    ///   least `n_initial_points` trials reached. Trials a scheduler stopped
    ///   below that iteration are left out, so a configuration stopped early
    ///   may be suggested again; once cost is weighed (`cost_exponent`) they
    ///   count as the worst result there (the latest 128 of them).
    /// - `"joint"`: one GP over configuration and iteration (MOBSTER-style,
    ///   Klein et al. 2020), fitted to every trial's metrics at the
    ///   iterations where trials stopped (the rungs), and asked about the
    ///   highest iteration any trial reached: a trial stopped early still
    ///   teaches, as far as the fit finds early rankings carry; once cost is
    ///   weighed, it also counts as the worst result at that iteration (the
    ///   latest 128 such trials do). Its fits cover up to 128 points, so it
    ///   costs more per suggestion than `true` (BENCHMARKS.md, 2026-11-29
    ///   22:37); past that, the points at the lowest level go first, and
    ///   with them what the trials stopped there taught.
    pub multi_fidelity: MultiFidelity,
    /// How much a configuration's cost counts against it, from 0 (not at
    /// all, the default) to 1: the acquisition is expected improvement over
    /// cost raised to this power, where cost is the fuel an iteration takes
    /// (the mean since the trial started), learned by a second GP from the
    /// latest 128 trials that reported one. Until `n_initial_points` trials
    /// have reported a cost, and for trainables whose iterations take no
    /// fuel, cost is not weighed. Worth it where costs differ a lot between
    /// configurations and the experiment's budget is fuel
    /// (`stop_experiment.max_fuel`): cheap configurations buy more trials.
    /// It costs a second fit per suggestion.
    pub cost_exponent: f64,
}

/// How GP-BO learns from intermediate results ([`GpConfig::multi_fidelity`]);
/// written `false`, `true` or `"joint"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MultiFidelity {
    /// Final results only.
    #[default]
    Off,
    /// The metrics at the highest iteration enough trials reached.
    Rung,
    /// One model of configuration and iteration.
    Joint,
}

impl Serialize for MultiFidelity {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Off => serializer.serialize_bool(false),
            Self::Rung => serializer.serialize_bool(true),
            Self::Joint => serializer.serialize_str("joint"),
        }
    }
}

impl<'de> Deserialize<'de> for MultiFidelity {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = MultiFidelity;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("true, false or \"joint\"")
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Self::Value, E> {
                Ok(if v {
                    MultiFidelity::Rung
                } else {
                    MultiFidelity::Off
                })
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                match v {
                    "joint" => Ok(MultiFidelity::Joint),
                    _ => Err(E::invalid_value(serde::de::Unexpected::Str(v), &self)),
                }
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

impl Default for GpConfig {
    fn default() -> Self {
        Self {
            n_initial_points: 10,
            n_candidates: 2048,
            n_local_search: 10,
            multi_fidelity: MultiFidelity::Off,
            cost_exponent: 0.0,
        }
    }
}

/// The most points the joint model fits.
const JOINT_POINTS: usize = 128;

/// The most trials stopped short of the level a model is asked about (the
/// rung, or the joint model's top) it counts as lies there, where cost is
/// weighed: a fit's time grows with the cube of its points, and these grow
/// with every trial a scheduler stops.
const STOPPED_LIES: usize = 128;

/// The most trials the cost model fits: the latest suggested. A fit's
/// time grows with the cube of its points, and weighing cost starts many
/// more trials than it needs to learn what a configuration costs (over 4 s
/// a suggestion uncapped, beside the joint model, on the CNN curves).
const COST_POINTS: usize = 128;

/// More candidates or local searches than these cost time without
/// improving suggestions; a larger number is most likely a typo.
const MAX_CANDIDATES: usize = 100_000;
const MAX_LOCAL_SEARCH: usize = 1_000;

impl GpConfig {
    /// The keys a `[search]` table with `type = "gp"` takes.
    pub const FIELDS: [&'static str; 5] = [
        "n_initial_points",
        "n_candidates",
        "n_local_search",
        "multi_fidelity",
        "cost_exponent",
    ];

    /// Checks the parameters, naming the first bad one.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=MAX_CANDIDATES).contains(&self.n_candidates) {
            return Err(format!(
                "search.n_candidates must be between 1 and {MAX_CANDIDATES}, got {}",
                self.n_candidates
            ));
        }
        if !(1..=MAX_LOCAL_SEARCH).contains(&self.n_local_search) {
            return Err(format!(
                "search.n_local_search must be between 1 and {MAX_LOCAL_SEARCH}, got {}",
                self.n_local_search
            ));
        }
        if !(0.0..=1.0).contains(&self.cost_exponent) {
            return Err(format!(
                "search.cost_exponent must be between 0 (cost ignored) and 1 (expected \
                 improvement per unit of fuel), got {}",
                self.cost_exponent
            ));
        }
        Ok(())
    }
}

/// What [`Gp`] saves: its history and the last fits, where the next ones
/// start.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct GpState {
    history: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    kernel: Option<Vec<f64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cost_kernel: Option<Vec<f64>>,
}

/// A suggestion's model values and the fits made for it, in
/// [`Hyper::to_log`]'s form (`None`: not fitted this time).
struct Next {
    values: Vec<f64>,
    kernel: Option<Vec<f64>>,
    cost_kernel: Option<Vec<f64>>,
}

/// The GP-BO searcher.
#[derive(Debug, Clone)]
pub struct Gp {
    config: GpConfig,
    space: SearchSpace,
    params: Vec<Param>,
    coordinates: Vec<Coordinate>,
    metric: String,
    mode: Mode,
    seed: u64,
    num_samples: u64,
    history: History,
    /// The previous suggestion's fit, in [`Hyper::to_log`]'s form.
    kernel: Option<Vec<f64>>,
    /// The previous fit of the cost model, likewise.
    cost_kernel: Option<Vec<f64>>,
}

impl Gp {
    /// A search of `num_samples` trials over `space`, learning from
    /// `metric` (lower is better under [`Mode::Min`]).
    pub fn new(
        config: GpConfig,
        space: &SearchSpace,
        num_samples: u64,
        metric: &str,
        mode: Mode,
        seed: u64,
    ) -> Result<Self, String> {
        config.validate()?;
        let params: Vec<Param> = space
            .domains()
            .into_iter()
            .map(|(path, domain)| Param::new(&path, domain, "gp"))
            .collect::<Result<_, _>>()?;
        let coordinates = params
            .iter()
            .map(|p| match p {
                Param::Categorical(values) => Coordinate::Choice(values.len()),
                _ => Coordinate::Continuous,
            })
            .collect();
        Ok(Self {
            config,
            space: space.clone(),
            params,
            coordinates,
            metric: metric.to_string(),
            mode,
            seed,
            num_samples,
            history: History::default(),
            kernel: None,
            cost_kernel: None,
        })
    }

    /// The model values of the next configuration, and the fits made for it.
    fn next_values(&self) -> Next {
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        rng.set_stream(self.history.suggested);
        let min_count = self.config.n_initial_points.max(1) as usize;
        let fitted = match self.config.multi_fidelity {
            MultiFidelity::Joint => self.joint_next(&mut rng, min_count),
            MultiFidelity::Off | MultiFidelity::Rung => self.one_level_next(&mut rng, min_count),
        };
        fitted.unwrap_or_else(|| Next {
            values: self.params.iter().map(|p| p.random(&mut rng)).collect(),
            kernel: None,
            cost_kernel: None,
        })
    }

    /// The suggestion of a GP over the configurations alone, fitted to the
    /// final results or, with `multi_fidelity = true`, to one rung
    /// ([`History::learning_set`]). `None` until that has `min_count`
    /// observations.
    fn one_level_next(&self, rng: &mut ChaCha8Rng, min_count: usize) -> Option<Next> {
        let (observations, iteration) = self
            .history
            .learning_set(self.config.multi_fidelity == MultiFidelity::Rung, min_count);
        if observations.len() < min_count {
            return None;
        }
        let x: Vec<Vec<f64>> = observations
            .iter()
            .map(|o| self.unit_point(&o.values))
            .collect();
        let y = self.standardized(&observations);
        let metric = self.metric();
        let theta = self.fit_from(self.kernel.as_deref(), &metric, &x, &y);
        let hyper = Hyper::from_log(&theta);
        let best = y.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let best_seen = y
            .iter()
            .enumerate()
            .fold(0, |b, (i, &v)| if v > y[b] { i } else { b });
        let observed = x[best_seen].clone();
        let (cost, cost_kernel) = self.cost_model(&metric, min_count).unzip();
        let stopped = iteration.filter(|_| cost.is_some());
        let acquisition = Acquisition {
            gp: self.lying_about_pending(metric, hyper, x, y, iteration, stopped),
            best,
            cost,
            resource: None,
        };
        Some(Next {
            values: self.maximize(&acquisition, observed, rng),
            kernel: Some(theta),
            cost_kernel,
        })
    }

    /// The joint model's suggestion (MOBSTER-style): one GP over the unit
    /// cube and the iteration, fitted to the trials' metrics at the levels
    /// ([`History::levels`]), with expected improvement taken at the
    /// highest iteration any trial reached, over the best result there.
    /// `None` until `min_count` trials have reported.
    ///
    /// The iteration enters as `ln(i) / ln(top)`, one more coordinate with
    /// its own length scale, so the fit learns how far a configuration's
    /// early ranking carries: where curves cross, little, and a trial ASHA
    /// stopped early keeps a chance; where they do not, a lot. Trials still
    /// running short of the top are lies there, as in
    /// [`Gp::lying_about_pending`]; so, where cost is weighed, are the
    /// trials stopped short of it, for the reason given there: a cheap
    /// configuration ASHA stops at the first rung otherwise keeps its
    /// chance at the top, and on the synthetic curves took 1,996 of one
    /// run's 2,000 trials (BENCHMARKS.md 2026-11-30).
    fn joint_next(&self, rng: &mut ChaCha8Rng, min_count: usize) -> Option<Next> {
        if self.history.curves.len() < min_count {
            return None;
        }
        let points = capped(self.history.levels(), JOINT_POINTS);
        let top = points.iter().map(|p| p.1).max()?;
        let scale = (top.max(2) as f64).ln();
        let joint_point = |values: &[f64], iteration: u64| {
            let mut u = self.unit_point(values);
            u.push((iteration as f64).ln() / scale);
            u
        };
        let mut x: Vec<Vec<f64>> = points.iter().map(|&(v, i, _)| joint_point(v, i)).collect();
        let observations: Vec<Observation> = points
            .iter()
            .map(|&(values, _, metric)| Observation {
                values: values.to_vec(),
                metric,
                trial: None,
            })
            .collect();
        let mut y = self.standardized(&observations);
        let params = self.metric();
        let mut joint = params.clone();
        joint.categorical.push(false);
        let theta = self.fit_from(self.kernel.as_deref(), &joint, &x, &y);
        let best_seen = (0..points.len())
            .filter(|&k| points[k].1 == top)
            .reduce(|b, k| if y[k] > y[b] { k } else { b })?;
        let best = y[best_seen];
        let observed = self.unit_point(points[best_seen].0);
        let worst = y.iter().copied().fold(f64::INFINITY, f64::min);
        let (cost, cost_kernel) = self.cost_model(&params, min_count).unzip();
        let stopped = match cost {
            Some(_) => self.stopped_lies(top),
            None => Vec::new(),
        };
        for values in self.history.lies(Some(top)).chain(stopped) {
            x.push(joint_point(values, top));
            y.push(worst);
        }
        let acquisition = Acquisition {
            gp: Posterior::new(joint, Hyper::from_log(&theta), x, &y),
            best,
            cost,
            resource: Some((top as f64).ln() / scale),
        };
        Some(Next {
            values: self.maximize(&acquisition, observed, rng),
            kernel: Some(theta),
            cost_kernel,
        })
    }

    /// The kernel metric of the parameters: categorical where a parameter
    /// is a choice.
    fn metric(&self) -> Metric {
        Metric {
            categorical: self
                .coordinates
                .iter()
                .map(|c| *c != Coordinate::Continuous)
                .collect(),
        }
    }

    /// The model values of the point where `acquisition` is largest, from
    /// local searches seeded at `observed` and the best random points.
    fn maximize(
        &self,
        acquisition: &Acquisition,
        observed: Vec<f64>,
        rng: &mut ChaCha8Rng,
    ) -> Vec<f64> {
        // The best random points and the best observation seed local
        // searches; ties keep the earlier point.
        let mut seeds: Vec<(f64, Vec<f64>)> = (0..self.config.n_candidates)
            .map(|_| {
                let point = self.unit_point(
                    &self
                        .params
                        .iter()
                        .map(|p| p.random(rng))
                        .collect::<Vec<_>>(),
                );
                (acquisition.value(&point, false).0, point)
            })
            .collect();
        let ordered = {
            let mut order: Vec<usize> = (0..seeds.len()).collect();
            order.sort_by(|&a, &b| seeds[b].0.total_cmp(&seeds[a].0).then(a.cmp(&b)));
            order
        };
        let mut starts = vec![(acquisition.value(&observed, false).0, observed)];
        starts.extend(
            ordered
                .into_iter()
                // The best random point always, so that n_local_search = 1
                // still weighs the candidates.
                .take(self.config.n_local_search.max(2) - 1)
                .map(|i| std::mem::take(&mut seeds[i])),
        );
        let mut winner: Option<(f64, Vec<f64>)> = None;
        for (value, start) in starts {
            let (point, value) = climb(acquisition, &self.coordinates, start, value);
            if value.is_finite() && winner.as_ref().is_none_or(|(v, _)| value > *v) {
                winner = Some((value, point));
            }
        }
        match winner {
            Some((_, point)) => self.model_values(&point),
            // Log EI is finite wherever the GP is; this guards against
            // arithmetic surprises.
            None => self.params.iter().map(|p| p.random(rng)).collect(),
        }
    }

    /// The kernel that best explains `y` at `x`, searched from `previous`
    /// (the last fit of the same model, which the new observations move
    /// little) where it has `metric`'s coordinates, or from the initial
    /// guess.
    fn fit_from(
        &self,
        previous: Option<&[f64]>,
        metric: &Metric,
        x: &[Vec<f64>],
        y: &[f64],
    ) -> Vec<f64> {
        let dims = metric.categorical.len();
        match previous {
            Some(start) if start.len() == dims + 2 => fit(metric, x, y, start),
            _ => fit(metric, x, y, &Hyper::initial(dims).to_log()),
        }
    }

    /// The observations' metrics, centered and scaled, larger better.
    fn standardized(&self, observations: &[Observation]) -> Vec<f64> {
        let sign = match self.mode {
            Mode::Min => -1.0,
            Mode::Max => 1.0,
        };
        let (m, _) = standardize(observations);
        m.into_iter().map(|v| sign * v).collect()
    }

    /// With a `cost_exponent`, a GP of log cost fitted to the latest
    /// [`COST_POINTS`] trials that reported one (in suggestion order), once
    /// at least `min_count` have, starting from the previous fit; and that
    /// fit.
    fn cost_model(&self, metric: &Metric, min_count: usize) -> Option<(CostModel, Vec<f64>)> {
        if self.config.cost_exponent == 0.0 || self.history.costs.len() < min_count {
            return None;
        }
        let costs: Vec<Observation> = self.cost_points().cloned().collect();
        let x: Vec<Vec<f64>> = costs.iter().map(|o| self.unit_point(&o.values)).collect();
        let (y, spread) = standardize(&costs);
        let theta = self.fit_from(self.cost_kernel.as_deref(), metric, &x, &y);
        let model = CostModel {
            gp: Posterior::new(metric.clone(), Hyper::from_log(&theta), x, &y),
            weight: self.config.cost_exponent * spread,
        };
        Some((model, theta))
    }

    /// The costs the cost model fits: the latest [`COST_POINTS`] trials'
    /// to report one, in start order ([`in_start_order`]).
    fn cost_points(&self) -> impl Iterator<Item = &Observation> {
        let costs = in_start_order(&self.history.costs);
        let skip = costs.len().saturating_sub(COST_POINTS);
        costs.into_iter().skip(skip).map(|(_, o)| o)
    }

    /// The GP conditioned on the observations and on the trials still
    /// running, as if each had reported the worst result so far (a
    /// pessimistic "constant liar", as TPE's): the model expects nothing
    /// good near them, so the next suggestion looks elsewhere. Believing
    /// the GP's own mean there instead ("kriging believer") measured too
    /// weak: on a smooth function it sent four trials started together
    /// within 1e-3 of each other. With multi-fidelity, a running trial that
    /// reached the rung (`iteration`) is an observation there, not a lie.
    ///
    /// With `stopped_below` (the rung, where cost is weighed), so are the
    /// trials stopped below that rung ([`History::stopped_below`]). Left
    /// out, a stopped configuration's expected improvement never falls,
    /// and weighed by cost the cheapest one is suggested again and again:
    /// on the CNN curves, 1,148 trials a run (4 seeds) before, 45 after
    /// (BENCHMARKS.md 2026-11-29 08:37). Without cost, leaving them out
    /// gives a configuration judged early a second chance, which measured
    /// better on the synthetic curves, whose slow starters end best: GP
    /// multi-fidelity's mean regret 0.042 against 0.065 with them counted.
    fn lying_about_pending(
        &self,
        metric: Metric,
        hyper: Hyper,
        mut x: Vec<Vec<f64>>,
        mut y: Vec<f64>,
        iteration: Option<u64>,
        stopped_below: Option<u64>,
    ) -> Posterior {
        let worst = y.iter().copied().fold(f64::INFINITY, f64::min);
        let stopped = stopped_below
            .map(|rung| self.stopped_lies(rung))
            .unwrap_or_default();
        for values in self.history.lies(iteration).chain(stopped) {
            x.push(self.unit_point(values));
            y.push(worst);
        }
        Posterior::new(metric, hyper, x, &y)
    }

    /// Model values of the latest [`STOPPED_LIES`] trials a scheduler
    /// stopped short of `level` ([`History::stopped_below`]), in start
    /// order.
    fn stopped_lies(&self, level: u64) -> Vec<&Vec<f64>> {
        let mut stopped = self.history.stopped_below(level, self.mode);
        stopped.drain(..stopped.len().saturating_sub(STOPPED_LIES));
        stopped
    }

    /// Model values to unit-cube coordinates.
    fn unit_point(&self, values: &[f64]) -> Vec<f64> {
        self.params
            .iter()
            .zip(values)
            .map(|(p, &v)| match *p {
                Param::Float { lo, hi, .. } | Param::Quantized { lo, hi, .. } => {
                    (v - lo) / (hi - lo)
                }
                Param::Categorical(_) => v,
            })
            .collect()
    }

    /// Unit-cube coordinates to model values, rounded to each parameter's
    /// steps and kept within its bounds.
    fn model_values(&self, point: &[f64]) -> Vec<f64> {
        self.params
            .iter()
            .zip(point)
            .map(|(p, &u)| match *p {
                Param::Float { lo, hi, .. } => (lo + u.clamp(0.0, 1.0) * (hi - lo)).clamp(lo, hi),
                Param::Quantized { lo, hi, .. } => p.quantize(lo + u.clamp(0.0, 1.0) * (hi - lo)),
                Param::Categorical(_) => u,
            })
            .collect()
    }
}

/// The observations' metrics centered and divided by their spread, and
/// that spread (1e-10 at least, so equal metrics stay finite).
fn standardize(observations: &[Observation]) -> (Vec<f64>, f64) {
    let m: Vec<f64> = observations.iter().map(|o| o.metric).collect();
    let n = m.len() as f64;
    let mean = m.iter().sum::<f64>() / n;
    let std = (m.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n)
        .sqrt()
        .max(1e-10);
    (m.iter().map(|v| (v - mean) / std).collect(), std)
}

/// `points` ([`History::levels`]) less, past `limit`, those at the lowest
/// levels, the earliest trials' first within a level: the fit's cost grows
/// with the cube of the points, and a low level says least about the top.
fn capped(mut points: Vec<(&[f64], u64, f64)>, limit: usize) -> Vec<(&[f64], u64, f64)> {
    if points.len() > limit {
        let mut order: Vec<usize> = (0..points.len()).collect();
        order.sort_by_key(|&k| (points[k].1, k));
        let mut keep = vec![true; points.len()];
        for &k in &order[..points.len() - limit] {
            keep[k] = false;
        }
        let mut k = 0;
        points.retain(|_| {
            k += 1;
            keep[k - 1]
        });
    }
    points
}

impl Searcher for Gp {
    fn on_result(&mut self, trial_id: &str, result: &Map<String, Value>) {
        if self.config.multi_fidelity != MultiFidelity::Off {
            self.history.record(trial_id, result, &self.metric);
        }
        if self.config.cost_exponent > 0.0 {
            self.history.record_cost(trial_id, result);
        }
    }

    fn suggest(&mut self, trial_id: &str) -> Suggestion {
        if self.history.suggested >= self.num_samples {
            return Suggestion::Finished;
        }
        let Next {
            values,
            kernel,
            cost_kernel,
        } = self.next_values();
        self.kernel = kernel.or(self.kernel.take());
        self.cost_kernel = cost_kernel.or(self.cost_kernel.take());
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
        "gp"
    }

    fn state(&self) -> Value {
        serde_json::json!(GpState {
            history: serde_json::json!(self.history),
            kernel: self.kernel.clone(),
            cost_kernel: self.cost_kernel.clone(),
        })
    }

    fn restore_state(&mut self, state: &Value) -> Result<(), String> {
        let Some(saved) = read_saved::<GpState>(state, "GP")? else {
            return Ok(());
        };
        // The joint model has one length scale more: the iteration's.
        let joint = usize::from(self.config.multi_fidelity == MultiFidelity::Joint);
        let fits = |theta: &Vec<f64>, dims: usize| {
            theta.len() == dims + 2 && theta.iter().all(|t| t.is_finite())
        };
        let n = self.params.len();
        if !(saved.kernel.iter().all(|t| fits(t, n + joint))
            && saved.cost_kernel.iter().all(|t| fits(t, n)))
        {
            return Err(
                "the saved GP state does not fit this search space; was param_space or \
                     multi_fidelity changed?"
                    .into(),
            );
        }
        if let Some(history) = History::restore(&saved.history, &self.params, "GP")? {
            self.history = history;
        }
        self.kernel = saved.kernel;
        self.cost_kernel = saved.cost_kernel;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
