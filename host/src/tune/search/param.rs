//! A search-space parameter as model-based searchers (TPE, GP) see it: a
//! number in "model space" (the value itself, its `ln` for loguniform, its
//! index for choice), drawn, rounded, checked and turned back into the
//! configuration's value the same way for every model.

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde_json::{Number, Value};

use super::normal::Portable;
use crate::tune::space::Domain;

/// One parameter as the model sees it. Values live in "model space": the
/// value itself, its `ln` for loguniform, its index for choice.
#[derive(Debug, Clone)]
pub(super) enum Param {
    /// uniform (`log` false) or loguniform (`log` true, `lo`/`hi` are the
    /// logs of the bounds, `low`/`high` the bounds).
    Float {
        lo: f64,
        hi: f64,
        log: bool,
        low: f64,
        high: f64,
    },
    /// randint and quniform: model values in `[lo, hi)` round to multiples
    /// of `q` kept within `[min, max]`.
    Quantized {
        lo: f64,
        hi: f64,
        q: f64,
        min: f64,
        max: f64,
        int: bool,
    },
    Categorical(Vec<Value>),
}

impl Param {
    /// The parameter at `path` for the searcher named `searcher`, which
    /// cannot use grid_search domains (it chooses every value itself).
    pub(super) fn new(path: &str, domain: &Domain, searcher: &str) -> Result<Self, String> {
        Ok(match *domain {
            Domain::GridSearch(_) => {
                return Err(format!(
                    "{path}: the {searcher} searcher cannot use grid_search domains (it chooses \
                     every value itself); use choice, or search = \"random\" or \"grid\""
                ));
            }
            Domain::Choice(ref values) => Param::Categorical(values.clone()),
            Domain::Uniform { low, high } => Param::Float {
                lo: low,
                hi: high,
                log: false,
                low,
                high,
            },
            Domain::LogUniform { low, high } => Param::Float {
                lo: low.pln(),
                hi: high.pln(),
                log: true,
                low,
                high,
            },
            // Integer k owns [k - 1/2, k + 1/2), so every integer in
            // [low, high) is equally likely under the prior.
            Domain::RandInt { low, high } => Param::Quantized {
                lo: low as f64 - 0.5,
                hi: high as f64 - 0.5,
                q: 1.0,
                min: low as f64,
                max: (high - 1) as f64,
                int: true,
            },
            // As random search draws it: uniform in [low, high), rounded.
            Domain::QUniform { low, high, q } => {
                let (min, max) = crate::tune::space::quantized_bounds(low, high, q);
                Param::Quantized {
                    lo: low,
                    hi: high,
                    q,
                    min,
                    max,
                    int: false,
                }
            }
        })
    }

    /// A model value drawn as random search would draw it.
    pub(super) fn random(&self, rng: &mut ChaCha8Rng) -> f64 {
        match *self {
            Param::Float { lo, hi, .. } => rng.random_range(lo..hi),
            Param::Quantized { lo, hi, .. } => self.quantize(rng.random_range(lo..hi)),
            Param::Categorical(ref values) => rng.random_range(0..values.len()) as f64,
        }
    }

    pub(super) fn quantize(&self, x: f64) -> f64 {
        match *self {
            Param::Quantized { q, min, max, .. } => ((x / q).round() * q).clamp(min, max),
            _ => x,
        }
    }

    pub(super) fn to_value(&self, x: f64) -> Value {
        match *self {
            Param::Float {
                log: true,
                low,
                high,
                ..
            } => float(x.pexp().clamp(low, high)),
            Param::Float { .. } => float(x),
            Param::Quantized { int: true, .. } => Value::from(x as i64),
            Param::Quantized { .. } => float(x),
            Param::Categorical(ref values) => values[x as usize].clone(),
        }
    }

    /// Whether a saved model value could have come from this parameter.
    pub(super) fn admits(&self, x: f64) -> bool {
        match *self {
            Param::Float { lo, hi, .. } => (lo..=hi).contains(&x),
            Param::Quantized { min, max, .. } => (min..=max).contains(&x),
            Param::Categorical(ref values) => {
                x.fract() == 0.0 && (0.0..values.len() as f64).contains(&x)
            }
        }
    }
}

/// A JSON number, or null for a value JSON cannot hold (NaN, infinity).
pub(super) fn float(x: f64) -> Value {
    Number::from_f64(x).map_or(Value::Null, Value::Number)
}
