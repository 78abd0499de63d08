//! Search spaces: which configurations an experiment tries.
//!
//! A space is a tree of parameters. Leaves are either fixed values or
//! domains written as one-key tables, as in Ray Tune:
//!
//! ```toml
//! [param_space]
//! lr = { loguniform = [1e-4, 1e-1] }     # log-uniform float in [low, high)
//! hidden = { choice = [16, 32, 64] }     # one value, uniformly at random
//! batch_size = { grid_search = [16, 64] } # every value (multiplies trials)
//! momentum = { uniform = [0.5, 0.99] }   # uniform float in [low, high)
//! layers = { randint = [1, 4] }          # integer in [low, high)
//! dropout = { quniform = [0.0, 0.5, 0.1] } # uniform, rounded to a multiple of q
//! weight_decay = 1e-4                    # fixed
//! [param_space.optimizer]                # nested tables nest in the config
//! beta = { uniform = [0.8, 0.99] }
//! ```
//!
//! An experiment runs `num_samples` x (product of all grid sizes) trials: each
//! sample repeats the full grid, with random domains drawn afresh per trial.
//! Draws come from a ChaCha8 generator seeded by the experiment's seed, so the
//! same seed gives the same configurations on every machine.

use std::collections::BTreeMap;
use std::fmt;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{Map, Number, Value};

/// Most trials one space may generate; a typo such as a huge grid should be
/// an error, not an out-of-memory.
pub const MAX_TRIALS: u64 = 10_000_000;

/// A parameter domain.
#[derive(Debug, Clone, PartialEq)]
pub enum Domain {
    /// Every value, one trial each.
    GridSearch(Vec<Value>),
    /// One of the values, uniformly.
    Choice(Vec<Value>),
    /// Float in `[low, high)`.
    Uniform { low: f64, high: f64 },
    /// Float in `[low, high)`, uniform in log space.
    LogUniform { low: f64, high: f64 },
    /// Integer in `[low, high)`.
    RandInt { low: i64, high: i64 },
    /// Uniform float rounded to a multiple of `q`, kept within `[low, high]`.
    QUniform { low: f64, high: f64, q: f64 },
}

const DOMAIN_NAMES: [&str; 6] = [
    "grid_search",
    "choice",
    "uniform",
    "loguniform",
    "randint",
    "quniform",
];

#[derive(Debug, Clone, PartialEq)]
enum Node {
    Fixed(Value),
    Table(BTreeMap<String, Node>),
    Domain(Domain),
}

/// A parsed search space.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SearchSpace {
    root: BTreeMap<String, Node>,
}

/// A search-space mistake, with the dotted path of the parameter at fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpaceError {
    /// e.g. `param_space.optimizer.lr`
    pub path: String,
    /// What is wrong and what is expected.
    pub message: String,
}

impl fmt::Display for SpaceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

impl std::error::Error for SpaceError {}

impl SearchSpace {
    /// Parses a space given as a JSON object (TOML tables convert to this).
    pub fn from_json(value: &Value) -> Result<Self, SpaceError> {
        let path = "param_space";
        match value {
            Value::Object(map) => Ok(Self {
                root: parse_table(map, path)?,
            }),
            other => Err(err(path, format!("must be a table, got {}", kind(other)))),
        }
    }

    /// Trials per sample: the product of every grid's length.
    pub fn grid_size(&self) -> u64 {
        fn walk(node: &Node) -> u64 {
            match node {
                Node::Domain(Domain::GridSearch(values)) => values.len() as u64,
                Node::Table(children) => children.values().map(walk).fold(1, u64::saturating_mul),
                _ => 1,
            }
        }
        self.root.values().map(walk).fold(1, u64::saturating_mul)
    }

    /// How many trials `generate(num_samples, _)` returns, or an error when
    /// that is more than [`MAX_TRIALS`].
    pub fn trial_count(&self, num_samples: u64) -> Result<u64, SpaceError> {
        let count = self.grid_size().saturating_mul(num_samples);
        if count > MAX_TRIALS {
            return Err(err(
                "param_space",
                format!(
                    "num_samples x grid size = {count} trials, more than the {MAX_TRIALS} allowed"
                ),
            ));
        }
        Ok(count)
    }

    /// All trial configurations, in order: sample by sample, each sample
    /// walking the grid with the last grid parameter varying fastest.
    pub fn generate(&self, num_samples: u64, seed: u64) -> Result<Vec<Value>, SpaceError> {
        let count = self.trial_count(num_samples)?;
        let grids = self.grids();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut configs = Vec::with_capacity(count as usize);
        for _ in 0..num_samples {
            for index in 0..self.grid_size() {
                let picks = grid_picks(&grids, index);
                let mut next_grid = 0;
                configs.push(Value::Object(sample_table(
                    &self.root,
                    &picks,
                    &mut next_grid,
                    &mut rng,
                )));
            }
        }
        Ok(configs)
    }

    /// Grid lengths in the order `sample_table` visits them.
    fn grids(&self) -> Vec<usize> {
        fn walk(table: &BTreeMap<String, Node>, out: &mut Vec<usize>) {
            for node in table.values() {
                match node {
                    Node::Domain(Domain::GridSearch(values)) => out.push(values.len()),
                    Node::Table(children) => walk(children, out),
                    _ => {}
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.root, &mut out);
        out
    }
}

/// Mixed-radix decoding of a grid index, last grid fastest.
fn grid_picks(grids: &[usize], mut index: u64) -> Vec<usize> {
    let mut picks = vec![0; grids.len()];
    for (slot, &len) in picks.iter_mut().zip(grids).rev() {
        *slot = (index % len as u64) as usize;
        index /= len as u64;
    }
    picks
}

fn sample_table(
    table: &BTreeMap<String, Node>,
    picks: &[usize],
    next_grid: &mut usize,
    rng: &mut ChaCha8Rng,
) -> Map<String, Value> {
    let mut out = Map::new();
    for (name, node) in table {
        let value = match node {
            Node::Fixed(value) => value.clone(),
            Node::Table(children) => Value::Object(sample_table(children, picks, next_grid, rng)),
            Node::Domain(Domain::GridSearch(values)) => {
                let value = values[picks[*next_grid]].clone();
                *next_grid += 1;
                value
            }
            Node::Domain(domain) => sample(domain, rng),
        };
        out.insert(name.clone(), value);
    }
    out
}

fn sample(domain: &Domain, rng: &mut ChaCha8Rng) -> Value {
    match *domain {
        Domain::GridSearch(_) => unreachable!("grid values are picked, not sampled"),
        Domain::Choice(ref values) => values[rng.random_range(0..values.len())].clone(),
        Domain::Uniform { low, high } => float(rng.random_range(low..high)),
        Domain::LogUniform { low, high } => {
            float(rng.random_range(low.ln()..high.ln()).exp().clamp(low, high))
        }
        Domain::RandInt { low, high } => Value::from(rng.random_range(low..high)),
        Domain::QUniform { low, high, q } => {
            let x = (rng.random_range(low..high) / q).round() * q;
            float(x.clamp(low, high))
        }
    }
}

fn float(x: f64) -> Value {
    Number::from_f64(x).map_or(Value::Null, Value::Number)
}

fn parse_table(map: &Map<String, Value>, path: &str) -> Result<BTreeMap<String, Node>, SpaceError> {
    map.iter()
        .map(|(name, value)| {
            let child = format!("{path}.{name}");
            Ok((name.clone(), parse_node(value, &child)?))
        })
        .collect()
}

fn parse_node(value: &Value, path: &str) -> Result<Node, SpaceError> {
    let Value::Object(map) = value else {
        return Ok(Node::Fixed(value.clone()));
    };
    let domain_keys: Vec<&String> = map
        .keys()
        .filter(|k| DOMAIN_NAMES.contains(&k.as_str()))
        .collect();
    match domain_keys.as_slice() {
        [] => Ok(Node::Table(parse_table(map, path)?)),
        [key] if map.len() == 1 => Ok(Node::Domain(parse_domain(key, &map[key.as_str()], path)?)),
        _ => Err(err(
            path,
            format!(
                "a domain is a table with exactly one key (one of {}), got keys {}",
                DOMAIN_NAMES.join(", "),
                map.keys()
                    .map(|k| format!("`{k}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
    }
}

fn parse_domain(name: &str, args: &Value, path: &str) -> Result<Domain, SpaceError> {
    let list = |what: &str| -> Result<Vec<Value>, SpaceError> {
        match args {
            Value::Array(values) if !values.is_empty() => Ok(values.clone()),
            _ => Err(err(
                path,
                format!("{name} needs a non-empty list of {what}, got {args}"),
            )),
        }
    };
    let numbers = |n: usize, shape: &str| -> Result<Vec<f64>, SpaceError> {
        let bad = || err(path, format!("{name} needs {shape}, got {args}"));
        let Value::Array(values) = args else {
            return Err(bad());
        };
        if values.len() != n {
            return Err(bad());
        }
        values
            .iter()
            .map(|v| v.as_f64().filter(|x| x.is_finite()).ok_or_else(bad))
            .collect()
    };
    let ordered = |low: f64, high: f64, shape: &str| {
        if low < high {
            Ok(())
        } else {
            Err(err(
                path,
                format!("{name} needs {shape} with low < high, got {args}"),
            ))
        }
    };
    match name {
        "grid_search" => Ok(Domain::GridSearch(list("values")?)),
        "choice" => Ok(Domain::Choice(list("values")?)),
        "uniform" => {
            let shape = "[low, high] (two numbers)";
            let v = numbers(2, shape)?;
            ordered(v[0], v[1], shape)?;
            Ok(Domain::Uniform {
                low: v[0],
                high: v[1],
            })
        }
        "loguniform" => {
            let shape = "[low, high] (two positive numbers)";
            let v = numbers(2, shape)?;
            if v[0] <= 0.0 {
                return Err(err(path, format!("loguniform needs {shape}, got {args}")));
            }
            ordered(v[0], v[1], shape)?;
            Ok(Domain::LogUniform {
                low: v[0],
                high: v[1],
            })
        }
        "randint" => {
            let shape = "[low, high] (two integers; high is excluded)";
            let ints: Option<Vec<i64>> = match args {
                Value::Array(values) if values.len() == 2 => {
                    values.iter().map(Value::as_i64).collect()
                }
                _ => None,
            };
            let v = ints.ok_or_else(|| err(path, format!("randint needs {shape}, got {args}")))?;
            ordered(v[0] as f64, v[1] as f64, shape)?;
            Ok(Domain::RandInt {
                low: v[0],
                high: v[1],
            })
        }
        "quniform" => {
            let shape = "[low, high, q] (three numbers, q > 0)";
            let v = numbers(3, shape)?;
            ordered(v[0], v[1], shape)?;
            if v[2] <= 0.0 {
                return Err(err(path, format!("quniform needs {shape}, got {args}")));
            }
            Ok(Domain::QUniform {
                low: v[0],
                high: v[1],
                q: v[2],
            })
        }
        _ => unreachable!("only names from DOMAIN_NAMES reach here"),
    }
}

fn err(path: &str, message: String) -> SpaceError {
    SpaceError {
        path: path.to_string(),
        message,
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a table",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn space(value: Value) -> SearchSpace {
        SearchSpace::from_json(&value).unwrap()
    }

    #[test]
    fn grid_times_samples_with_last_grid_fastest() {
        let s = space(json!({"a": {"grid_search": [1, 2]}, "b": {"grid_search": ["x", "y", "z"]}}));
        assert_eq!(s.grid_size(), 6);
        let configs = s.generate(2, 0).unwrap();
        assert_eq!(configs.len(), 12);
        let pairs: Vec<(i64, String)> = configs[..6]
            .iter()
            .map(|c| {
                (
                    c["a"].as_i64().unwrap(),
                    c["b"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        assert_eq!(pairs[0], (1, "x".into()));
        assert_eq!(pairs[1], (1, "y".into()));
        assert_eq!(pairs[3], (2, "x".into()));
        assert_eq!(configs[6], configs[0], "each sample repeats the grid");
    }

    #[test]
    fn every_draw_stays_in_its_domain() {
        let s = space(json!({
            "u": {"uniform": [-1.0, 2.0]},
            "l": {"loguniform": [1e-4, 1e-1]},
            "r": {"randint": [3, 7]},
            "q": {"quniform": [0.0, 1.0, 0.25]},
            "c": {"choice": [16, 32, "big"]},
            "nested": {"deep": {"x": {"uniform": [0, 1]}}, "fixed": true},
        }));
        for config in s.generate(2000, 9).unwrap() {
            let u = config["u"].as_f64().unwrap();
            assert!((-1.0..2.0).contains(&u));
            let l = config["l"].as_f64().unwrap();
            assert!((1e-4..=1e-1).contains(&l));
            let r = config["r"].as_i64().unwrap();
            assert!((3..7).contains(&r), "randint excludes high");
            let q = config["q"].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&q) && ((q / 0.25).round() * 0.25 - q).abs() < 1e-12);
            assert!([json!(16), json!(32), json!("big")].contains(&config["c"]));
            assert!((0.0..1.0).contains(&config["nested"]["deep"]["x"].as_f64().unwrap()));
            assert_eq!(config["nested"]["fixed"], json!(true));
        }
    }

    #[test]
    fn loguniform_is_uniform_in_log_space() {
        let s = space(json!({"l": {"loguniform": [1e-4, 1.0]}}));
        let draws: Vec<f64> = s
            .generate(4000, 1)
            .unwrap()
            .iter()
            .map(|c| c["l"].as_f64().unwrap())
            .collect();
        // Each decade should hold about a quarter of the draws.
        for decade in 0..4 {
            let (lo, hi) = (10f64.powi(-4 + decade), 10f64.powi(-3 + decade));
            let share =
                draws.iter().filter(|&&x| x >= lo && x < hi).count() as f64 / draws.len() as f64;
            assert!((share - 0.25).abs() < 0.04, "decade {decade}: {share}");
        }
    }

    #[test]
    fn randint_covers_its_range() {
        let s = space(json!({"r": {"randint": [0, 4]}}));
        let mut seen = [0usize; 4];
        for c in s.generate(400, 3).unwrap() {
            seen[c["r"].as_i64().unwrap() as usize] += 1;
        }
        assert!(seen.iter().all(|&n| n > 60), "{seen:?}");
    }

    #[test]
    fn same_seed_same_configs_other_seed_other_configs() {
        let s = space(json!({"u": {"uniform": [0, 1]}, "c": {"choice": [1, 2, 3, 4]}}));
        assert_eq!(s.generate(20, 5).unwrap(), s.generate(20, 5).unwrap());
        assert_ne!(s.generate(20, 5).unwrap(), s.generate(20, 6).unwrap());
    }

    #[test]
    fn bad_domains_name_the_parameter_and_the_shape() {
        let cases = [
            (
                json!({"lr": {"loguniform": [0, 1]}}),
                "param_space.lr: loguniform needs [low, high] (two positive numbers)",
            ),
            (
                json!({"lr": {"uniform": [2, 1]}}),
                "param_space.lr: uniform needs [low, high] (two numbers) with low < high",
            ),
            (
                json!({"a": {"b": {"choice": []}}}),
                "param_space.a.b: choice needs a non-empty list",
            ),
            (
                json!({"n": {"randint": [1.5, 3]}}),
                "param_space.n: randint needs [low, high] (two integers",
            ),
            (
                json!({"q": {"quniform": [0, 1, 0]}}),
                "param_space.q: quniform needs [low, high, q]",
            ),
            (
                json!({"x": {"uniform": [0, 1], "extra": 2}}),
                "param_space.x: a domain is a table with exactly one key",
            ),
            (
                json!({"x": {"grid_search": "abc"}}),
                "param_space.x: grid_search needs a non-empty list",
            ),
        ];
        for (value, expected) in cases {
            let message = SearchSpace::from_json(&value).unwrap_err().to_string();
            assert!(
                message.starts_with(expected),
                "{message}\n expected: {expected}"
            );
        }
        let message = SearchSpace::from_json(&json!([1])).unwrap_err().to_string();
        assert_eq!(message, "param_space: must be a table, got a list");
    }

    #[test]
    fn absurd_trial_counts_are_refused() {
        let big: Vec<i64> = (0..10_000).collect();
        let s = space(json!({"a": {"grid_search": big}, "b": {"grid_search": big}}));
        assert!(s.generate(1, 0).unwrap_err().message.contains("more than"));
    }

    #[test]
    fn empty_space_gives_empty_configs() {
        let configs = SearchSpace::default().generate(3, 0).unwrap();
        assert_eq!(configs, vec![json!({}), json!({}), json!({})]);
    }
}
