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
//!    together look in different places;
//! 4. maximizes log expected improvement over the best result so far
//!    (`gp/acquisition.rs`) and suggests the point found, rounded to the
//!    parameters' steps.
//!
//! Observations are completed trials' final results, as for TPE (see
//! `tpe.rs`), or with `multi_fidelity` the metrics at the highest
//! iteration enough trials reached. Suggestion `k` draws from a ChaCha8
//! generator seeded with the experiment's seed on stream `k`, and the fit
//! is deterministic; with the previous fit saved beside the history, a
//! resumed search makes exactly the suggestions the uninterrupted one
//! would have.
//!
//! Cost grows with the cube of the observations (a fit factors their
//! kernel matrix): about what `wtune-bench search` reports per suggestion
//! (BENCHMARKS.md). For hundreds of trials or more, TPE is the cheaper
//! model.

mod acquisition;
mod memo;
mod regressor;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use self::acquisition::{Coordinate, climb, log_ei};
use self::regressor::{Hyper, Metric, Posterior, fit};
use super::history::{History, Observation};
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
    /// one iteration) before the model is used; suggestions until then are
    /// random.
    pub n_initial_points: u64,
    /// Random points whose expected improvement is compared per
    /// suggestion before local search.
    pub n_candidates: usize,
    /// Local searches per suggestion, from the best observed configuration
    /// and the best random points (at least from the best of each).
    pub n_local_search: usize,
    /// Learn from intermediate results, as TPE's `multi_fidelity` does
    /// (BOHB's rule): the GP is fitted to the metrics at the highest
    /// `training_iteration` that at least `n_initial_points` trials
    /// reached, so under ASHA or HyperBand it learns from the rungs long
    /// before many trials finish. `false`: final results only.
    pub multi_fidelity: bool,
}

impl Default for GpConfig {
    fn default() -> Self {
        Self {
            n_initial_points: 10,
            n_candidates: 2048,
            n_local_search: 10,
            multi_fidelity: false,
        }
    }
}

/// More candidates or local searches than these cost time without
/// improving suggestions; a larger number is most likely a typo.
const MAX_CANDIDATES: usize = 100_000;
const MAX_LOCAL_SEARCH: usize = 1_000;

impl GpConfig {
    /// The keys a `[search]` table with `type = "gp"` takes.
    pub const FIELDS: [&'static str; 4] = [
        "n_initial_points",
        "n_candidates",
        "n_local_search",
        "multi_fidelity",
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
        Ok(())
    }
}

/// What [`Gp`] saves: its history and the last fit, where the next one
/// starts.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct GpState {
    history: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    kernel: Option<Vec<f64>>,
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
        })
    }

    /// The model values of the next configuration, and the fit made for it.
    fn next_values(&self) -> (Vec<f64>, Option<Vec<f64>>) {
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        rng.set_stream(self.history.suggested);
        let min_count = self.config.n_initial_points.max(1) as usize;
        let (observations, iteration) = self
            .history
            .learning_set(self.config.multi_fidelity, min_count);
        if observations.len() < min_count {
            return (
                self.params.iter().map(|p| p.random(&mut rng)).collect(),
                None,
            );
        }
        let x: Vec<Vec<f64>> = observations
            .iter()
            .map(|o| self.unit_point(&o.values))
            .collect();
        let y = self.standardized(&observations);
        let metric = Metric {
            categorical: self
                .coordinates
                .iter()
                .map(|c| *c != Coordinate::Continuous)
                .collect(),
        };
        let start = self
            .kernel
            .clone()
            .unwrap_or_else(|| Hyper::initial(self.params.len()).to_log());
        let theta = fit(&metric, &x, &y, &start);
        let hyper = Hyper::from_log(&theta);
        let best = y.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let best_seen = y
            .iter()
            .enumerate()
            .fold(0, |b, (i, &v)| if v > y[b] { i } else { b });
        let observed = x[best_seen].clone();
        let gp = self.lying_about_pending(metric, hyper, x, y, iteration);

        // The best random points and the best observation seed local
        // searches; ties keep the earlier point.
        let mut seeds: Vec<(f64, Vec<f64>)> = (0..self.config.n_candidates)
            .map(|_| {
                let point = self.unit_point(
                    &self
                        .params
                        .iter()
                        .map(|p| p.random(&mut rng))
                        .collect::<Vec<_>>(),
                );
                (log_ei(&gp, best, &point, false).0, point)
            })
            .collect();
        let ordered = {
            let mut order: Vec<usize> = (0..seeds.len()).collect();
            order.sort_by(|&a, &b| seeds[b].0.total_cmp(&seeds[a].0).then(a.cmp(&b)));
            order
        };
        let mut starts = vec![(log_ei(&gp, best, &observed, false).0, observed)];
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
            let (point, value) = climb(&gp, best, &self.coordinates, start, value);
            if value.is_finite() && winner.as_ref().is_none_or(|(v, _)| value > *v) {
                winner = Some((value, point));
            }
        }
        let values = match winner {
            Some((_, point)) => self.model_values(&point),
            // Log EI is finite wherever the GP is; this guards against
            // arithmetic surprises.
            None => self.params.iter().map(|p| p.random(&mut rng)).collect(),
        };
        (values, Some(theta))
    }

    /// The observations' metrics, centered and scaled, larger better.
    fn standardized(&self, observations: &[Observation]) -> Vec<f64> {
        let m: Vec<f64> = observations.iter().map(|o| o.metric).collect();
        let n = m.len() as f64;
        let mean = m.iter().sum::<f64>() / n;
        let std = (m.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n)
            .sqrt()
            .max(1e-10);
        let sign = match self.mode {
            Mode::Min => -1.0,
            Mode::Max => 1.0,
        };
        m.iter().map(|v| sign * (v - mean) / std).collect()
    }

    /// The GP conditioned on the observations and on the trials still
    /// running, as if each had reported the worst result so far (a
    /// pessimistic "constant liar", as TPE's): the model expects nothing
    /// good near them, so the next suggestion looks elsewhere. Believing
    /// the GP's own mean there instead ("kriging believer") measured too
    /// weak: on a smooth function it sent four trials started together
    /// within 1e-3 of each other. With multi-fidelity, a running trial that
    /// reached the rung (`iteration`) is an observation there, not a lie.
    fn lying_about_pending(
        &self,
        metric: Metric,
        hyper: Hyper,
        mut x: Vec<Vec<f64>>,
        mut y: Vec<f64>,
        iteration: Option<u64>,
    ) -> Posterior {
        let worst = y.iter().copied().fold(f64::INFINITY, f64::min);
        for values in self.history.lies(iteration) {
            x.push(self.unit_point(values));
            y.push(worst);
        }
        Posterior::new(metric, hyper, x, &y)
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

impl Searcher for Gp {
    fn on_result(&mut self, trial_id: &str, result: &Map<String, Value>) {
        if self.config.multi_fidelity {
            self.history.record(trial_id, result, &self.metric);
        }
    }

    fn suggest(&mut self, trial_id: &str) -> Suggestion {
        if self.history.suggested >= self.num_samples {
            return Suggestion::Finished;
        }
        let (values, hyper) = self.next_values();
        if hyper.is_some() {
            self.kernel = hyper;
        }
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
        })
    }

    fn restore_state(&mut self, state: &Value) -> Result<(), String> {
        let Some(saved) = read_saved::<GpState>(state, "GP")? else {
            return Ok(());
        };
        let kernel = match saved.kernel {
            Some(theta)
                if theta.len() == self.params.len() + 2 && theta.iter().all(|t| t.is_finite()) =>
            {
                Some(theta)
            }
            Some(_) => {
                return Err(
                    "the saved GP state does not fit this search space; was param_space changed?"
                        .into(),
                );
            }
            None => None,
        };
        if let Some(history) = History::restore(&saved.history, &self.params, "GP")? {
            self.history = history;
        }
        self.kernel = kernel;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
