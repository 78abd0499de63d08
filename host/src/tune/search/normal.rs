//! The standard normal distribution, as the model-based searchers need it:
//! draws, the distribution function, and interval masses accurate far into
//! the tails.

use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// `ln(sqrt(2 pi))`.
pub(super) const LN_SQRT_2PI: f64 = 0.918_938_533_204_672_8;

/// Box–Muller; one normal per call keeps the draw count per value fixed.
pub(super) fn standard_normal(rng: &mut ChaCha8Rng) -> f64 {
    let u1 = 1.0 - rng.random::<f64>();
    let u2 = rng.random::<f64>();
    (-2.0 * u1.pln()).sqrt() * (std::f64::consts::TAU * u2).pcos()
}

/// P(a <= Z <= b) for a standard normal Z and `a <= b`.
pub(super) fn normal_mass(a: f64, b: f64) -> f64 {
    let width = b - a;
    if width < 1e-2 {
        // The CDF difference would cancel to noise; the midpoint rule is
        // accurate to about width² here.
        let mid = 0.5 * (a + b);
        return width * (-0.5 * mid * mid - LN_SQRT_2PI).pexp();
    }
    let s = std::f64::consts::FRAC_1_SQRT_2;
    // Work in the tail the interval is in, where erfc keeps its precision.
    if a >= 0.0 {
        0.5 * (erfc(a * s) - erfc(b * s))
    } else if b <= 0.0 {
        0.5 * (erfc(-b * s) - erfc(-a * s))
    } else {
        1.0 - 0.5 * (erfc(b * s) + erfc(-a * s))
    }
}

/// P(Z <= x) for a standard normal Z.
pub(super) fn normal_cdf(x: f64) -> f64 {
    0.5 * erfc(-x * std::f64::consts::FRAC_1_SQRT_2)
}

/// Complementary error function, from the `libm` crate (within an ulp
/// or two, and the same bits on every machine).
fn erfc(x: f64) -> f64 {
    libm::erfc(x)
}

/// Elementary functions computed by the `libm` crate instead of the
/// platform's maths library, whose results are not correctly rounded and
/// may differ in the last bit between CPUs (glibc picks FMA variants where
/// the CPU has FMA). A model-based searcher turns such a bit into a
/// different suggestion, and suggestions must be the same on every machine
/// for a given seed.
pub(super) trait Portable {
    fn pexp(self) -> f64;
    fn pln(self) -> f64;
    fn pcos(self) -> f64;
    fn psin(self) -> f64;
    fn pacos(self) -> f64;
}

impl Portable for f64 {
    fn pexp(self) -> f64 {
        libm::exp(self)
    }
    fn pln(self) -> f64 {
        libm::log(self)
    }
    fn pcos(self) -> f64 {
        libm::cos(self)
    }
    fn psin(self) -> f64 {
        libm::sin(self)
    }
    fn pacos(self) -> f64 {
        libm::acos(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normal_masses_are_accurate() {
        // Reference values of the standard normal CDF.
        let phi = [
            (-3.0, 0.001_349_898),
            (-1.0, 0.158_655_254),
            (0.5, 0.691_462_461),
            (2.0, 0.977_249_868),
        ];
        for (x, p) in phi {
            assert!((normal_mass(-40.0, x) - p).abs() < 1e-7, "{x}");
        }
        assert!((normal_mass(-1.0, 1.0) - 0.682_689_492).abs() < 1e-7);
        // Far in a tail, and in a narrow interval, the mass stays positive
        // and close to density x width.
        let tail = normal_mass(6.0, 7.0);
        assert!((tail / 9.853_078_3e-10 - 1.0).abs() < 1e-6, "{tail}");
        let narrow = normal_mass(1.0, 1.0 + 1e-9);
        assert!(
            (narrow / (1e-9 * 0.241_970_725) - 1.0).abs() < 1e-6,
            "{narrow}"
        );
    }
}
