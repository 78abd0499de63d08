//! The Gaussian process behind [`super::Gp`]: a zero-mean GP over the unit
//! cube with a Matérn 5/2 kernel, one length scale per dimension (ARD), a
//! signal scale and a noise variance, fitted by maximizing the marginal
//! likelihood plus a log prior, as Optuna's `GPSampler` and BoTorch do.
//!
//! A numeric dimension's distance is the difference of its unit
//! coordinates; a categorical one's is 0 for the same choice and 1 for
//! another, so every choice is equally far from every other.
//!
//! Arithmetic is plain loops in a fixed order (nalgebra's Cholesky and
//! triangular solves are such loops; its matrix products, which pick SIMD
//! kernels by CPU, are not used) and `exp`/`ln` come from the `libm` crate
//! (`normal::Portable`), so a fit gives the same bits on every machine and
//! a seeded search the same suggestions.

use argmin::core::{CostFunction, Executor, Gradient, State};
use argmin::solver::linesearch::MoreThuenteLineSearch;
use argmin::solver::quasinewton::LBFGS;
use nalgebra::{Cholesky, DMatrix, DVector, Dyn};

use super::memo::LastEvaluation;
use crate::tune::search::normal::Portable;

/// The noise variance never goes below this (in units of the standardized
/// metric): it keeps the kernel matrix well conditioned when trials repeat
/// a configuration. Optuna's default.
const MIN_NOISE: f64 = 1e-6;

/// Log hyperparameters are kept within this range while fitting, where
/// `exp` neither overflows nor loses the kernel to rounding.
const LOG_BOUND: f64 = 15.0;

/// L-BFGS iterations per fit; a warm start from the previous fit usually
/// converges in a few.
const FIT_ITERATIONS: u64 = 100;

/// The kernel's hyperparameters.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Hyper {
    /// Per dimension, the inverse squared length scale.
    pub(super) eta: Vec<f64>,
    /// The signal variance.
    pub(super) scale: f64,
    /// The noise variance.
    pub(super) noise: f64,
}

impl Hyper {
    /// Unit length scales, signal and noise: where a fit without a
    /// previous one starts (as Optuna's).
    pub(super) fn initial(dims: usize) -> Self {
        Self {
            eta: vec![1.0; dims],
            scale: 1.0,
            noise: 1.0,
        }
    }

    /// The unconstrained form L-BFGS works in: logs of the length scales'
    /// `eta` and of the scale, and the log of the noise above its floor.
    pub(super) fn to_log(&self) -> Vec<f64> {
        let noise = (self.noise - 0.99 * MIN_NOISE).max(MIN_NOISE * 0.01);
        self.eta
            .iter()
            .map(|e| e.pln())
            .chain([self.scale.pln(), noise.pln()])
            .map(|v| v.clamp(-LOG_BOUND, LOG_BOUND))
            .collect()
    }

    /// The hyperparameters of a point in [`Hyper::to_log`]'s form (which
    /// takes back `to_log` but for the noise, a hundredth of the floor
    /// above the original; only starting points go through `to_log`).
    pub(super) fn from_log(theta: &[f64]) -> Self {
        let d = theta.len() - 2;
        let at = |i: usize| theta[i].clamp(-LOG_BOUND, LOG_BOUND).pexp();
        Self {
            eta: (0..d).map(at).collect(),
            scale: at(d),
            noise: MIN_NOISE + at(d + 1),
        }
    }

    /// `ln` of the prior density (up to a constant) and its gradient with
    /// respect to [`Hyper::to_log`]'s coordinates. Length scales gather
    /// around the unit cube's size, the signal around the standardized
    /// metric's variance, the noise near zero: Optuna's priors.
    fn ln_prior(&self) -> (f64, Vec<f64>) {
        let mut value = 0.0;
        let mut grad = Vec::with_capacity(self.eta.len() + 2);
        for &e in &self.eta {
            value -= 0.1 / e + 0.1 * e;
            grad.push(0.1 / e - 0.1 * e);
        }
        // Gamma(2, 1) on the scale, Gamma(1.1, 30) on the noise.
        value += self.scale.pln() - self.scale;
        grad.push(1.0 - self.scale);
        let above = self.noise - MIN_NOISE;
        value += 0.1 * self.noise.pln() - 30.0 * self.noise;
        grad.push((0.1 / self.noise - 30.0) * above);
        (value, grad)
    }
}

/// The Matérn 5/2 correlation at squared scaled distance `r2`, and its
/// derivative with respect to `r2` (finite at 0, unlike the one by `r`).
pub(super) fn matern(r2: f64) -> (f64, f64) {
    let r = r2.max(0.0).sqrt();
    let s5r = 5f64.sqrt() * r;
    let e = (-s5r).pexp();
    (
        (1.0 + s5r + 5.0 / 3.0 * r2) * e,
        -5.0 / 6.0 * (1.0 + s5r) * e,
    )
}

/// Which dimensions are categorical, and the scaled squared distance.
#[derive(Debug, Clone)]
pub(super) struct Metric {
    pub(super) categorical: Vec<bool>,
}

impl Metric {
    /// Per-dimension contribution to the squared distance before scaling.
    fn gap(&self, j: usize, a: f64, b: f64) -> f64 {
        if self.categorical[j] {
            if a == b { 0.0 } else { 1.0 }
        } else {
            (a - b) * (a - b)
        }
    }

    fn r2(&self, a: &[f64], b: &[f64], eta: &[f64]) -> f64 {
        (0..a.len()).map(|j| eta[j] * self.gap(j, a[j], b[j])).sum()
    }
}

/// The kernel matrix of `x` under `hyper`, noise on the diagonal.
fn kernel_matrix(metric: &Metric, x: &[Vec<f64>], hyper: &Hyper) -> DMatrix<f64> {
    let n = x.len();
    let mut k = DMatrix::zeros(n, n);
    for i in 0..n {
        for c in 0..i {
            let v = hyper.scale * matern(metric.r2(&x[i], &x[c], &hyper.eta)).0;
            k[(i, c)] = v;
            k[(c, i)] = v;
        }
        k[(i, i)] = hyper.scale + hyper.noise;
    }
    k
}

/// The Cholesky factor of `k`, adding jitter to the diagonal if rounding
/// left it not quite positive definite.
fn factor(k: DMatrix<f64>) -> Cholesky<f64, Dyn> {
    let mut jitter = 0.0;
    loop {
        let mut m = k.clone();
        for i in 0..m.nrows() {
            m[(i, i)] += jitter;
        }
        if let Some(c) = Cholesky::new(m) {
            return c;
        }
        jitter = if jitter == 0.0 { 1e-10 } else { jitter * 10.0 };
        assert!(jitter < 1.0, "the kernel matrix has a non-finite entry");
    }
}

/// `L^-1` for the Cholesky factor `L` in `chol`, column-major. Column `c`
/// is zero above the diagonal; below it, it solves the trailing block of
/// `L` against the unit vector, a sixth of `n^3` steps where a solve
/// against the whole identity takes half.
fn inverse_factor(chol: &Cholesky<f64, Dyn>) -> DMatrix<f64> {
    let l = chol.l_dirty();
    let n = l.nrows();
    let mut linv = DMatrix::zeros(n, n);
    for c in 0..n {
        let mut unit = DVector::zeros(n - c);
        unit[0] = 1.0;
        let solved = l.view_range(c.., c..).solve_lower_triangular_mut(&mut unit);
        assert!(solved, "a Cholesky factor has a positive diagonal");
        linv.view_range_mut(c.., c).copy_from(&unit);
    }
    linv
}

/// `K^-1 = L^-T L^-1` given `L^-1` row-major (`linv_t`, its transpose
/// column-major), summed as rank-one updates by the rows of `L^-1`: each
/// entry adds its terms in row order whatever the vector width.
fn inverse_from(linv_t: &DMatrix<f64>) -> DMatrix<f64> {
    let n = linv_t.nrows();
    let rows = linv_t.as_slice();
    let mut kinv = DMatrix::<f64>::zeros(n, n);
    let out = kinv.as_mut_slice();
    for m in 0..n {
        let row = &rows[m * n..m * n + m + 1];
        for (k, &a) in row.iter().enumerate() {
            let column = &mut out[k * n + k..k * n + m + 1];
            for (o, &b) in column.iter_mut().zip(&row[k..]) {
                *o += a * b;
            }
        }
    }
    for k in 0..n {
        for i in k + 1..n {
            out[i * n + k] = out[k * n + i];
        }
    }
    kinv
}

/// `sum_k a[k] * b[k]` in index order.
fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The negative log marginal likelihood plus log prior of the observations,
/// as L-BFGS minimizes it.
struct Evidence<'a> {
    x: &'a [Vec<f64>],
    y: &'a [f64],
    /// Per pair `(i, k)` with `k < i`, in that order, the per-dimension
    /// gaps ([`Metric::gap`]): they do not change while fitting.
    gaps: Vec<f64>,
    last: LastEvaluation,
}

impl<'a> Evidence<'a> {
    fn new(metric: &Metric, x: &'a [Vec<f64>], y: &'a [f64]) -> Self {
        let d = metric.categorical.len();
        let mut gaps = Vec::with_capacity(x.len() * x.len().saturating_sub(1) / 2 * d);
        for i in 0..x.len() {
            for k in 0..i {
                gaps.extend((0..d).map(|j| metric.gap(j, x[i][j], x[k][j])));
            }
        }
        Self {
            x,
            y,
            gaps,
            last: LastEvaluation::default(),
        }
    }

    fn evaluate(&self, theta: &[f64]) -> (f64, Vec<f64>) {
        self.last.at(theta, || self.compute(theta))
    }

    fn compute(&self, theta: &[f64]) -> (f64, Vec<f64>) {
        let hyper = Hyper::from_log(theta);
        let n = self.x.len();
        let d = hyper.eta.len();
        // Off the diagonal, per pair as in `gaps`: the kernel and its
        // derivative by the squared distance.
        let pairs = n * n.saturating_sub(1) / 2;
        let (mut k_pair, mut dk_pair) = (Vec::with_capacity(pairs), Vec::with_capacity(pairs));
        let mut noisy = DMatrix::zeros(n, n);
        let mut p = 0;
        for i in 0..n {
            for k in 0..i {
                let r2 = dot(&hyper.eta, &self.gaps[p * d..(p + 1) * d]);
                let (m, dm) = matern(r2);
                noisy[(i, k)] = hyper.scale * m;
                noisy[(k, i)] = hyper.scale * m;
                k_pair.push(hyper.scale * m);
                dk_pair.push(hyper.scale * dm);
                p += 1;
            }
            noisy[(i, i)] = hyper.scale + hyper.noise;
        }
        let chol = factor(noisy);
        let alpha = chol.solve(&DVector::from_column_slice(self.y));
        let kinv = inverse_from(&inverse_factor(&chol).transpose());
        let ln_det: f64 = (0..n).map(|i| chol.l_dirty()[(i, i)].pln()).sum();
        let fit = -0.5 * dot(self.y, alpha.as_slice()) - ln_det;
        let (prior, prior_grad) = hyper.ln_prior();
        // d(fit)/d(theta) = 1/2 tr(W dK/dtheta) with W = alpha alpha^T - K^-1,
        // symmetric: each pair off the diagonal counts twice. On the
        // diagonal dK/d(eta) is zero and K is the scale.
        let mut grad = vec![0.0; d + 2];
        let mut trace_w = 0.0;
        let mut p = 0;
        for i in 0..n {
            for k in 0..i {
                let w = alpha[i] * alpha[k] - kinv[(i, k)];
                grad[d] += w * k_pair[p];
                let gaps = &self.gaps[p * d..(p + 1) * d];
                for (j, g) in grad[..d].iter_mut().enumerate() {
                    *g += w * dk_pair[p] * hyper.eta[j] * gaps[j];
                }
                p += 1;
            }
            let w = alpha[i] * alpha[i] - kinv[(i, i)];
            trace_w += w;
            grad[d] += 0.5 * w * hyper.scale;
        }
        grad[d + 1] = 0.5 * trace_w * (hyper.noise - MIN_NOISE);
        let value = fit + prior;
        let mut grad: Vec<f64> = grad
            .iter()
            .zip(&prior_grad)
            .map(|(g, p)| -(g + p))
            .collect();
        // A coordinate on a bound whose descent leads out of it cannot move
        // the cost (it is clamped there), so its gradient is zero: a search
        // that kept pulling at it would spend its line searches on a flat
        // cost and never see the others converge. This happens whenever the
        // objective is deterministic and the noise sinks to its floor.
        for (g, t) in grad.iter_mut().zip(theta) {
            if (*t >= LOG_BOUND && *g < 0.0) || (*t <= -LOG_BOUND && *g > 0.0) {
                *g = 0.0;
            }
        }
        (-value, grad)
    }
}

impl CostFunction for Evidence<'_> {
    type Param = Vec<f64>;
    type Output = f64;

    fn cost(&self, theta: &Self::Param) -> Result<f64, argmin::core::Error> {
        Ok(self.evaluate(theta).0)
    }
}

impl Gradient for Evidence<'_> {
    type Param = Vec<f64>;
    type Gradient = Vec<f64>;

    fn gradient(&self, theta: &Self::Param) -> Result<Vec<f64>, argmin::core::Error> {
        Ok(self.evaluate(theta).1)
    }
}

/// The hyperparameters that best explain `y` at `x`, in
/// [`Hyper::to_log`]'s form, searched from `start` (in that form); `start`
/// itself when the search fails or finds nothing better. The form is what
/// is kept between fits, so that a saved fit restores to the same bits.
pub(super) fn fit(metric: &Metric, x: &[Vec<f64>], y: &[f64], start: &[f64]) -> Vec<f64> {
    let evidence = Evidence::new(metric, x, y);
    let theta0 = start.to_vec();
    let cost0 = evidence.evaluate(&theta0).0;
    // Optuna's tolerance (`fit_kernel_params(gtol=1e-2)`): a fit starts
    // from the last one, which the observation just added moves little.
    let solver = match LBFGS::new(MoreThuenteLineSearch::new(), 10).with_tolerance_grad(1e-2) {
        Ok(solver) => solver,
        Err(_) => return start.to_vec(),
    };
    let run = Executor::new(evidence, solver)
        .configure(|state| state.param(theta0).max_iters(FIT_ITERATIONS))
        .run();
    match run {
        Ok(result) => {
            let state = result.state();
            match state.get_best_param() {
                // Kept within the bounds: outside them the cost is flat, and
                // the next fit, which starts here, could not come back.
                Some(best) if state.get_best_cost() <= cost0 => best
                    .iter()
                    .map(|t| t.clamp(-LOG_BOUND, LOG_BOUND))
                    .collect(),
                _ => start.to_vec(),
            }
        }
        Err(_) => start.to_vec(),
    }
}

/// A GP conditioned on observations, ready to predict.
#[derive(Debug, Clone)]
pub(super) struct Posterior {
    metric: Metric,
    hyper: Hyper,
    x: Vec<Vec<f64>>,
    /// `K^-1 y`.
    alpha: Vec<f64>,
    /// `L^-1` for the Cholesky factor `L` of `K`, column-major, and its
    /// transpose (`L^-1` row-major). Variances go through `L^-1 k*`, half
    /// the work of `K^-1 k*` (which only gradients need), and a sum of
    /// squares cannot come out below zero as a difference of products can.
    linv: Vec<f64>,
    linv_t: Vec<f64>,
}

/// A prediction at one point, with its gradients by the point's
/// coordinates where asked for.
#[derive(Debug, Clone)]
pub(super) struct Prediction {
    pub(super) mean: f64,
    /// The latent function's variance (without the noise).
    pub(super) var: f64,
    pub(super) d_mean: Vec<f64>,
    pub(super) d_var: Vec<f64>,
}

impl Posterior {
    /// Conditions the GP with `hyper` on `y` at `x`.
    pub(super) fn new(metric: Metric, hyper: Hyper, x: Vec<Vec<f64>>, y: &[f64]) -> Self {
        let chol = factor(kernel_matrix(&metric, &x, &hyper));
        let alpha = chol.solve(&DVector::from_column_slice(y));
        let linv = inverse_factor(&chol);
        Self {
            metric,
            hyper,
            alpha: alpha.as_slice().to_vec(),
            linv_t: linv.transpose().as_slice().to_vec(),
            linv: linv.as_slice().to_vec(),
            x,
        }
    }

    /// The posterior mean at `at`, with its gradient by the numeric
    /// coordinates when `grad` is set (empty otherwise): what
    /// [`Posterior::predict`] gives, without the variance's O(n^2) work.
    pub(super) fn predict_mean(&self, at: &[f64], grad: bool) -> (f64, Vec<f64>) {
        let mut mean = 0.0;
        let mut d_mean = if grad {
            vec![0.0; at.len()]
        } else {
            Vec::new()
        };
        for (xi, &alpha) in self.x.iter().zip(&self.alpha) {
            let (k, dk_dr2) = matern(self.metric.r2(at, xi, &self.hyper.eta));
            mean += self.hyper.scale * k * alpha;
            for (j, d) in d_mean.iter_mut().enumerate() {
                if !self.metric.categorical[j] {
                    *d += self.hyper.scale
                        * dk_dr2
                        * 2.0
                        * self.hyper.eta[j]
                        * (at[j] - xi[j])
                        * alpha;
                }
            }
        }
        (mean, d_mean)
    }

    /// The posterior mean and variance at `at`; with `grad`, also their
    /// gradients by the numeric coordinates (zero for categorical ones).
    pub(super) fn predict(&self, at: &[f64], grad: bool) -> Prediction {
        let n = self.x.len();
        let d = at.len();
        let mut kstar = vec![0.0; n];
        let mut dk = vec![0.0; n];
        for (i, xi) in self.x.iter().enumerate() {
            let (k, dk_dr2) = matern(self.metric.r2(at, xi, &self.hyper.eta));
            kstar[i] = self.hyper.scale * k;
            dk[i] = self.hyper.scale * dk_dr2;
        }
        // v = L^-1 k*, accumulated column by column: each v[r] sums in the
        // same order whatever the vector width.
        let mut v = vec![0.0; n];
        for (c, &kc) in kstar.iter().enumerate() {
            let column = &self.linv[c * n + c..(c + 1) * n];
            for (vr, &l) in v[c..].iter_mut().zip(column) {
                *vr += l * kc;
            }
        }
        let mean = dot(&kstar, &self.alpha);
        let var = (self.hyper.scale - dot(&v, &v)).max(1e-12);
        let (mut d_mean, mut d_var) = (vec![0.0; d], vec![0.0; d]);
        if grad {
            // beta = K^-1 k* = L^-T v, row of L^-1 by row.
            let mut beta = vec![0.0; n];
            for (r, &vr) in v.iter().enumerate() {
                let row = &self.linv_t[r * n..r * n + r + 1];
                for (b, &l) in beta.iter_mut().zip(row) {
                    *b += l * vr;
                }
            }
            for (i, xi) in self.x.iter().enumerate() {
                for j in 0..d {
                    if self.metric.categorical[j] {
                        continue;
                    }
                    let dkij = dk[i] * 2.0 * self.hyper.eta[j] * (at[j] - xi[j]);
                    d_mean[j] += dkij * self.alpha[i];
                    d_var[j] -= 2.0 * beta[i] * dkij;
                }
            }
        }
        Prediction {
            mean,
            var,
            d_mean,
            d_var,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metric(d: usize) -> Metric {
        Metric {
            categorical: vec![false; d],
        }
    }

    #[test]
    fn the_evidence_gradient_matches_finite_differences() {
        let x: Vec<Vec<f64>> = (0..12)
            .map(|i| vec![(i as f64 * 0.37) % 1.0, (i as f64 * 0.61) % 1.0])
            .collect();
        let y: Vec<f64> = x.iter().map(|p| (6.0 * p[0]).sin() + p[1] * p[1]).collect();
        let m = Metric {
            categorical: vec![false, false],
        };
        let evidence = Evidence::new(&m, &x, &y);
        let theta = vec![0.3, -0.4, 0.2, -3.0];
        let (_, grad) = evidence.compute(&theta);
        for j in 0..theta.len() {
            let h = 1e-6;
            let (mut up, mut down) = (theta.clone(), theta.clone());
            up[j] += h;
            down[j] -= h;
            let numeric = (evidence.compute(&up).0 - evidence.compute(&down).0) / (2.0 * h);
            assert!(
                (numeric - grad[j]).abs() < 1e-4 * (1.0 + numeric.abs()),
                "theta[{j}]: {numeric} vs {}",
                grad[j]
            );
        }
    }

    #[test]
    fn the_prediction_gradient_matches_finite_differences() {
        let x: Vec<Vec<f64>> = (0..9)
            .map(|i| vec![(i as f64 * 0.29) % 1.0, (i % 3) as f64])
            .collect();
        let y: Vec<f64> = x.iter().map(|p| p[0] * 2.0 - p[1]).collect();
        let m = Metric {
            categorical: vec![false, true],
        };
        let hyper = Hyper {
            eta: vec![4.0, 0.7],
            scale: 1.3,
            noise: 1e-4,
        };
        let gp = Posterior::new(m, hyper, x, &y);
        let at = [0.42, 1.0];
        let p = gp.predict(&at, true);
        let h = 1e-6;
        let up = gp.predict(&[at[0] + h, at[1]], false);
        let down = gp.predict(&[at[0] - h, at[1]], false);
        let (dm, dv) = (
            (up.mean - down.mean) / (2.0 * h),
            (up.var - down.var) / (2.0 * h),
        );
        assert!((dm - p.d_mean[0]).abs() < 1e-5, "{dm} vs {}", p.d_mean[0]);
        assert!((dv - p.d_var[0]).abs() < 1e-5, "{dv} vs {}", p.d_var[0]);
        assert_eq!((p.d_mean[1], p.d_var[1]), (0.0, 0.0));
        // The mean alone is the same mean, by the same sums.
        for at in [[0.42, 1.0], [0.05, 2.0], [0.97, 0.0]] {
            let p = gp.predict(&at, true);
            let (mean, d_mean) = gp.predict_mean(&at, true);
            assert!((mean - p.mean).abs() <= 1e-12 * p.mean.abs().max(1.0));
            for (a, b) in d_mean.iter().zip(&p.d_mean) {
                assert!((a - b).abs() <= 1e-12 * b.abs().max(1.0), "{a} vs {b}");
            }
            assert_eq!(gp.predict_mean(&at, false), (mean, Vec::new()));
        }
    }

    #[test]
    fn a_fit_interpolates_a_smooth_function_and_is_unsure_away_from_data() {
        let x: Vec<Vec<f64>> = (0..15).map(|i| vec![i as f64 / 14.0 * 0.6]).collect();
        let f = |t: f64| (5.0 * t).sin();
        let y: Vec<f64> = x.iter().map(|p| f(p[0])).collect();
        let hyper = Hyper::from_log(&fit(&metric(1), &x, &y, &Hyper::initial(1).to_log()));
        assert!(hyper.noise < 1e-2, "{hyper:?}");
        let gp = Posterior::new(metric(1), hyper, x, &y);
        let near = gp.predict(&[0.33], false);
        assert!((near.mean - f(0.33)).abs() < 1e-2, "{near:?}");
        let far = gp.predict(&[1.0], false);
        assert!(far.var > 100.0 * near.var, "{far:?} vs {near:?}");
    }

    #[test]
    fn fits_are_deterministic() {
        let x: Vec<Vec<f64>> = (0..20)
            .map(|i| vec![(i as f64 * 0.137) % 1.0, (i as f64 * 0.731) % 1.0])
            .collect();
        let y: Vec<f64> = x.iter().map(|p| p[0] - 3.0 * p[1] * p[0]).collect();
        let start = Hyper::initial(2).to_log();
        let a = fit(&metric(2), &x, &y, &start);
        let b = fit(&metric(2), &x, &y, &start);
        assert_eq!(a, b);
        assert_ne!(a, start, "the fit moved");
    }
}
