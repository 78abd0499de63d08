//! Multivariate TPE's estimator: a mixture, over a group's observations
//! and the prior, of product kernels with one factor per parameter. A
//! candidate is drawn from one component as a whole configuration and
//! scored as one, so the model learns which values go together (a valley
//! along a diagonal, a learning rate that suits one batch size), which the
//! univariate estimator, one independent mixture per parameter, cannot.
//! It is the estimator of Optuna's `multivariate=True`, which Optuna's
//! default TPE uses. Each kernel's width in a dimension comes from the gaps
//! between the group's values there (without the prior's center among
//! them, which the univariate estimator counts; as in Optuna); Scott's rule (`0.2 n^(-1/(d+4))` of the range) measured worse on
//! Hartmann-6 (BENCHMARKS.md).

use rand_chacha::ChaCha8Rng;

use super::{
    LN_SQRT_2PI, Param, Portable, gap_widths, log_sum_exp, normal_mass, pick, standard_normal,
};

/// One parameter's factor of every component.
enum Factor {
    /// A normal per component truncated to `[lo, hi)`; `q`: a quantized
    /// parameter's step, whose value owns the bin `[x - q/2, x + q/2]`.
    Numeric {
        lo: f64,
        hi: f64,
        q: Option<f64>,
        mus: Vec<f64>,
        sigmas: Vec<f64>,
        /// `ln` of each width, kept so that scoring a candidate takes no
        /// logarithm per component.
        ln_sigmas: Vec<f64>,
        /// `ln` of each component's mass inside the bounds.
        ln_mass: Vec<f64>,
    },
    /// Per component, the `ln` probability of each choice.
    Choice(Vec<Vec<f64>>),
}

/// The joint density of one group (the good or the bad configurations).
pub(super) struct JointParzen<'a> {
    params: &'a [Param],
    /// Mixture weights, observations first, then the prior.
    weights: Vec<f64>,
    ln_weights: Vec<f64>,
    factors: Vec<Factor>,
}

impl<'a> JointParzen<'a> {
    /// Fits the group's `observed` model values (one vector per
    /// observation, in `params`' order) with their recency `weights`; the
    /// prior (the whole space) weighs `prior_weight`.
    pub(super) fn fit(
        params: &'a [Param],
        observed: &[&[f64]],
        weights: &[f64],
        prior_weight: f64,
    ) -> Self {
        let n = observed.len();
        let factors = params
            .iter()
            .enumerate()
            .map(|(j, param)| match *param {
                Param::Float { lo, hi, .. } | Param::Quantized { lo, hi, .. } => {
                    let values: Vec<f64> = observed.iter().map(|x| x[j]).collect();
                    let min_sigma = (hi - lo) / (100.0f64).min(n as f64 + 2.0);
                    let mut sigmas = gap_widths(&values, lo, hi, min_sigma);
                    sigmas.push(hi - lo);
                    let mus: Vec<f64> = values.into_iter().chain([0.5 * (lo + hi)]).collect();
                    let ln_mass = mus
                        .iter()
                        .zip(&sigmas)
                        .map(|(&mu, &s)| normal_mass((lo - mu) / s, (hi - mu) / s).pln())
                        .collect();
                    let q = match *param {
                        Param::Quantized { q, .. } => Some(q),
                        _ => None,
                    };
                    let ln_sigmas = sigmas.iter().map(|s| s.pln()).collect();
                    Factor::Numeric {
                        lo,
                        hi,
                        q,
                        mus,
                        sigmas,
                        ln_sigmas,
                        ln_mass,
                    }
                }
                Param::Categorical(ref values) => {
                    // Each observation's choice, smoothed by a share of
                    // the prior spread over every choice.
                    let c = values.len();
                    let base = prior_weight / (n + 1) as f64;
                    let total = base * c as f64 + 1.0;
                    let mut probs: Vec<Vec<f64>> = observed
                        .iter()
                        .map(|x| {
                            (0..c)
                                .map(|k| {
                                    let hit = if k == x[j] as usize { 1.0 } else { 0.0 };
                                    ((base + hit) / total).pln()
                                })
                                .collect()
                        })
                        .collect();
                    probs.push(vec![-(c as f64).pln(); c]);
                    Factor::Choice(probs)
                }
            })
            .collect();
        let mut mixture: Vec<f64> = weights.to_vec();
        mixture.push(prior_weight);
        let total: f64 = mixture.iter().sum();
        let ln_weights = mixture.iter().map(|w| (w / total).pln()).collect();
        Self {
            params,
            weights: mixture,
            ln_weights,
            factors,
        }
    }

    /// A configuration drawn from one component, chosen by weight.
    pub(super) fn sample(&self, rng: &mut ChaCha8Rng) -> Vec<f64> {
        let k = pick(&self.weights, rng);
        self.factors
            .iter()
            .zip(self.params)
            .map(|(factor, param)| match factor {
                Factor::Numeric {
                    lo,
                    hi,
                    mus,
                    sigmas,
                    ..
                } => {
                    let (mu, sigma) = (mus[k], sigmas[k]);
                    // Centers lie within the bounds and no width exceeds
                    // the range: about a third of the draws land inside.
                    let x = (0..1000)
                        .map(|_| mu + sigma * standard_normal(rng))
                        .find(|x| x >= lo && x < hi)
                        .unwrap_or(mu);
                    param.quantize(x)
                }
                Factor::Choice(probs) => {
                    let p: Vec<f64> = probs[k].iter().map(|l| l.pexp()).collect();
                    pick(&p, rng) as f64
                }
            })
            .collect()
    }

    /// `ln` of the density (of the mass, for quantized parameters) at the
    /// model values `x`.
    pub(super) fn ln_density(&self, x: &[f64]) -> f64 {
        // Each component's term once: the log-sum-exp reads it twice.
        let terms: Vec<f64> = (0..self.weights.len())
            .map(|k| self.ln_component(k, x))
            .collect();
        log_sum_exp(terms.len(), |k| terms[k])
    }

    /// `ln` of component `k`'s weight times its density at `x`.
    fn ln_component(&self, k: usize, x: &[f64]) -> f64 {
        let factors: f64 = self
            .factors
            .iter()
            .zip(x)
            .map(|(factor, &x)| match factor {
                Factor::Numeric {
                    q: None,
                    mus,
                    sigmas,
                    ln_sigmas,
                    ln_mass,
                    ..
                } => {
                    let z = (x - mus[k]) / sigmas[k];
                    -0.5 * z * z - ln_sigmas[k] - LN_SQRT_2PI - ln_mass[k]
                }
                Factor::Numeric {
                    lo,
                    hi,
                    q: Some(q),
                    mus,
                    sigmas,
                    ln_mass,
                    ..
                } => {
                    let (a, b) = ((x - q / 2.0).max(*lo), (x + q / 2.0).min(*hi));
                    let (mu, s) = (mus[k], sigmas[k]);
                    normal_mass((a - mu) / s, (b - mu) / s).pln() - ln_mass[k]
                }
                Factor::Choice(probs) => probs[k][x as usize],
            })
            .sum();
        self.ln_weights[k] + factors
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn float(lo: f64, hi: f64) -> Param {
        Param::Float {
            lo,
            hi,
            log: false,
            low: lo,
            high: hi,
        }
    }

    #[test]
    fn the_joint_density_integrates_to_one() {
        let params = [float(0.0, 1.0), float(-2.0, 2.0)];
        let observed: Vec<Vec<f64>> = vec![vec![0.2, 1.5], vec![0.9, -1.0], vec![0.5, 0.0]];
        let refs: Vec<&[f64]> = observed.iter().map(Vec::as_slice).collect();
        let parzen = JointParzen::fit(&params, &refs, &[1.0, 1.0, 1.0], 1.0);
        let steps = 400;
        let (dx, dy) = (1.0 / steps as f64, 4.0 / steps as f64);
        let mut total = 0.0;
        for i in 0..steps {
            for j in 0..steps {
                let x = [(i as f64 + 0.5) * dx, -2.0 + (j as f64 + 0.5) * dy];
                total += parzen.ln_density(&x).exp() * dx * dy;
            }
        }
        assert!((total - 1.0).abs() < 1e-3, "{total}");
    }

    #[test]
    fn draws_keep_the_values_of_one_observation_together() {
        // Good configurations in two clusters on a diagonal: a draw near
        // one cluster in one parameter is near it in the other too.
        let params = [float(0.0, 1.0), float(0.0, 1.0)];
        let observed: Vec<Vec<f64>> = [0.1, 0.12, 0.9, 0.88, 0.11, 0.89, 0.1, 0.9]
            .iter()
            .map(|&x| vec![x, x])
            .collect();
        let refs: Vec<&[f64]> = observed.iter().map(Vec::as_slice).collect();
        let parzen = JointParzen::fit(&params, &refs, &[1.0; 8], 0.01);
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let together = (0..1000)
            .map(|_| parzen.sample(&mut rng))
            .filter(|x| (x[0] < 0.5) == (x[1] < 0.5))
            .count();
        // Drawn value by value (the univariate model), half would be.
        assert!(together > 800, "{together} of 1000");
        assert!(parzen.ln_density(&[0.1, 0.1]) > parzen.ln_density(&[0.1, 0.9]) + 2.0);
    }
}
