//! Where [`super::Gp`] looks next: the point of the unit cube with the
//! largest expected improvement over the best standardized result so far,
//! computed in log space (Ament et al., "Unexpected Improvements to
//! Expected Improvement", NeurIPS 2023) so that it still ranks points where
//! the improvement is astronomically unlikely, as after many trials; with a
//! cost model, per unit of predicted cost ([`Acquisition`]).
//!
//! The maximization follows Optuna's `GPSampler`: the best random points
//! and the best observation seed local searches; each alternates L-BFGS
//! over the numeric coordinates with a sweep over each categorical's
//! choices until neither improves, for at most four rounds. A numeric coordinate moves
//! as `x = (1 - cos u) / 2`, which keeps it inside `[0, 1]` without the
//! bounds an unconstrained L-BFGS lacks. Quantized coordinates are searched
//! as continuous and rounded at the end.

use argmin::core::{CostFunction, Executor, Gradient, State};
use argmin::solver::linesearch::MoreThuenteLineSearch;
use argmin::solver::quasinewton::LBFGS;

use super::memo::LastEvaluation;
use super::regressor::Posterior;
use crate::tune::search::normal::{LN_SQRT_2PI, Portable, normal_cdf};

/// `ln h(z)` and its derivative `Phi(z) / h(z)`, where `h(z) = z Phi(z) +
/// phi(z)` is the expected improvement of a standard normal over `-z`.
pub(super) fn ln_h(z: f64) -> (f64, f64) {
    let ln_phi = -0.5 * z * z - LN_SQRT_2PI;
    if z > -3.0 {
        let cdf = normal_cdf(z);
        let h = z * cdf + ln_phi.pexp();
        return (h.pln(), cdf / h);
    }
    // Here h = phi(z) (1 - t R(t)) with t = -z and Mills' ratio
    // R(t) = Phi(-t) / phi(t), which its continued fraction gives without
    // the cancellation of the direct form.
    let t = -z;
    let one_minus = if t > 1e3 {
        let t2 = t * t;
        (1.0 - 3.0 / t2 + 15.0 / (t2 * t2)) / t2
    } else {
        let mut f = t;
        for k in (1..=80).rev() {
            f = t + k as f64 / f;
        }
        1.0 - t / f
    };
    // Phi(z) / h(z) = R / (1 - t R), with R = 1 / f.
    let mills = (1.0 - one_minus) / t;
    (ln_phi + one_minus.pln(), mills / one_minus)
}

/// Log expected improvement over `best` (standardized, larger is better)
/// at `at`, with its gradient by `at`'s coordinates when `grad` is set.
pub(super) fn log_ei(gp: &Posterior, best: f64, at: &[f64], grad: bool) -> (f64, Vec<f64>) {
    let p = gp.predict(at, grad);
    let sigma = p.var.sqrt();
    let z = (p.mean - best) / sigma;
    let (value, slope) = ln_h(z);
    let value = value + sigma.pln();
    if !grad {
        return (value, Vec::new());
    }
    let gradient = p
        .d_mean
        .iter()
        .zip(&p.d_var)
        .map(|(&dm, &dv)| {
            let ds = dv / (2.0 * sigma);
            ds / sigma + slope * (dm - z * ds) / sigma
        })
        .collect();
    (value, gradient)
}

/// What a suggestion maximizes: log expected improvement over `best`
/// (standardized, larger is better), less `exponent` times the predicted
/// log cost where a cost model is given: the log of expected improvement
/// over cost raised to `exponent`. At 1 this is Snoek et al.'s expected
/// improvement per second ("Practical Bayesian Optimization of Machine
/// Learning Algorithms", NeurIPS 2012) with fuel for seconds; the exponent
/// is Lee et al.'s ("Cost-aware Bayesian Optimization", 2020), whose
/// cost-cooled EI lowers it over a run.
pub(super) struct Acquisition {
    pub(super) gp: Posterior,
    pub(super) best: f64,
    pub(super) cost: Option<CostModel>,
    /// For a joint model of configuration and iteration, the resource
    /// coordinate the improvement is predicted at, appended to every point.
    pub(super) resource: Option<f64>,
}

/// A GP of a configuration's standardized log cost, and the weight of its
/// mean in the acquisition: `exponent` times the log costs' spread, so the
/// penalty is `exponent` times the predicted log cost (plus a constant).
pub(super) struct CostModel {
    pub(super) gp: Posterior,
    pub(super) weight: f64,
}

impl Acquisition {
    /// The acquisition at `at`, with its gradient by `at`'s coordinates
    /// when `grad` is set.
    pub(super) fn value(&self, at: &[f64], grad: bool) -> (f64, Vec<f64>) {
        let (mut value, mut gradient) = match self.resource {
            None => log_ei(&self.gp, self.best, at, grad),
            Some(r) => {
                let mut extended = at.to_vec();
                extended.push(r);
                let (value, mut gradient) = log_ei(&self.gp, self.best, &extended, grad);
                gradient.truncate(at.len());
                (value, gradient)
            }
        };
        if let Some(cost) = &self.cost {
            let (mean, d_mean) = cost.gp.predict_mean(at, grad);
            value -= cost.weight * mean;
            for (g, dm) in gradient.iter_mut().zip(&d_mean) {
                *g -= cost.weight * dm;
            }
        }
        (value, gradient)
    }
}

/// How each unit coordinate may move.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Coordinate {
    /// Anywhere in `[0, 1]`.
    Continuous,
    /// One of `n` choices, stored as `0..n`.
    Choice(usize),
}

/// The local search's objective: minus the acquisition over the numeric
/// coordinates `free`, moved through `x = (1 - cos u) / 2`, the rest held
/// at `base`.
struct Climb<'a> {
    acquisition: &'a Acquisition,
    base: &'a [f64],
    free: &'a [usize],
    last: LastEvaluation,
}

impl Climb<'_> {
    fn point(&self, u: &[f64]) -> Vec<f64> {
        let mut x = self.base.to_vec();
        for (&j, &u) in self.free.iter().zip(u) {
            x[j] = 0.5 * (1.0 - u.pcos());
        }
        x
    }

    /// The objective and its gradient by `u`, from one prediction.
    fn evaluate(&self, u: &[f64]) -> (f64, Vec<f64>) {
        self.last.at(u, || {
            let (value, g) = self.acquisition.value(&self.point(u), true);
            let grad = self
                .free
                .iter()
                .zip(u)
                .map(|(&j, &u)| -g[j] * 0.5 * u.psin())
                .collect();
            (-value, grad)
        })
    }
}

impl CostFunction for Climb<'_> {
    type Param = Vec<f64>;
    type Output = f64;

    fn cost(&self, u: &Self::Param) -> Result<f64, argmin::core::Error> {
        Ok(self.evaluate(u).0)
    }
}

impl Gradient for Climb<'_> {
    type Param = Vec<f64>;
    type Gradient = Vec<f64>;

    fn gradient(&self, u: &Self::Param) -> Result<Vec<f64>, argmin::core::Error> {
        Ok(self.evaluate(u).1)
    }
}

/// Local search iterations per L-BFGS run and rounds of alternation.
const CLIMB_ITERATIONS: u64 = 50;
const ROUNDS: usize = 4;

/// Improves `start` (value `value`) by local search; returns the point and
/// its acquisition value.
pub(super) fn climb(
    acquisition: &Acquisition,
    coordinates: &[Coordinate],
    start: Vec<f64>,
    value: f64,
) -> (Vec<f64>, f64) {
    let free: Vec<usize> = (0..coordinates.len())
        .filter(|&j| coordinates[j] == Coordinate::Continuous)
        .collect();
    let (mut x, mut value) = (start, value);
    for _ in 0..ROUNDS {
        let before = value;
        if !free.is_empty() {
            // Off the bounds a little: the map's slope vanishes on them.
            let u0: Vec<f64> = free
                .iter()
                .map(|&j| (1.0 - 2.0 * x[j].clamp(1e-6, 1.0 - 1e-6)).pacos())
                .collect();
            let climb = Climb {
                acquisition,
                base: &x,
                free: &free,
                last: LastEvaluation::default(),
            };
            let found = LBFGS::new(MoreThuenteLineSearch::new(), 10)
                .with_tolerance_grad(1e-6)
                .ok()
                .and_then(|solver| {
                    Executor::new(climb, solver)
                        .configure(|s| s.param(u0).max_iters(CLIMB_ITERATIONS))
                        .run()
                        .ok()
                })
                .and_then(|result| {
                    let state = result.state();
                    let u = state.get_best_param()?.clone();
                    Some((u, -state.get_best_cost()))
                });
            if let Some((u, v)) = found
                && v > value
            {
                for (&j, &u) in free.iter().zip(&u) {
                    x[j] = 0.5 * (1.0 - u.pcos());
                }
                value = v;
            }
        }
        for (j, c) in coordinates.iter().enumerate() {
            let Coordinate::Choice(n) = *c else { continue };
            for k in 0..n {
                if k as f64 == x[j] {
                    continue;
                }
                let mut y = x.clone();
                y[j] = k as f64;
                let v = acquisition.value(&y, false).0;
                if v > value {
                    (x, value) = (y, v);
                }
            }
        }
        if value <= before + 1e-9 * before.abs().max(1.0) {
            break;
        }
    }
    (x, value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_expected_improvement_is_accurate_far_into_the_tail() {
        // ln h(z), h(z) = z Phi(z) + phi(z), from mpmath at 50 digits.
        let cases = [
            (2.0, 0.697_383_545_788_228_3),
            (0.0, -0.918_938_533_204_672_7),
            (-1.0, -2.485_121_025_712_641),
            (-2.9, -7.520_846_492_887_873),
            (-3.1, -8.227_329_393_572_749),
            (-5.0, -16.744_301_162_660_99),
            (-10.0, -55.553_122_036_122_36),
            // Where h itself underflows.
            (-40.0, -808.298_568_356_62),
            (-2000.0, -2_000_016.120_744_202),
        ];
        for (z, expected) in cases {
            let (ln, _) = ln_h(z);
            assert!(
                (ln - expected).abs() < 1e-6 * expected.abs().max(1.0),
                "z = {z}: {ln} vs {expected}"
            );
        }
        for z in [1.5, -0.5, -2.99, -3.01, -8.0, -30.0] {
            let e = 1e-6;
            let numeric = (ln_h(z + e).0 - ln_h(z - e).0) / (2.0 * e);
            let slope = ln_h(z).1;
            assert!(
                (numeric - slope).abs() < 1e-4 * slope.abs().max(1.0),
                "z = {z}: {numeric} vs {slope}"
            );
        }
    }
}
