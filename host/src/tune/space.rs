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
//!
//! That is what the default searcher (`search = "random"`) hands out; other
//! searchers (see [`super::search`]) walk an [`SearchSpace::enumerated`]
//! grid or choose values themselves through [`SearchSpace::build`].

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
    /// Uniform float rounded to a multiple of `q`, kept within `[low, high]`
    /// among the multiples ([`quantized_bounds`]).
    QUniform { low: f64, high: f64, q: f64 },
}

/// The least and greatest multiples of `q` within `[low, high]` (a bound
/// that is a multiple, to a rounding, is kept as written): where quniform's
/// values are clamped, so that a bound that is not a multiple never becomes
/// a value. The parser refuses a domain that holds no multiple.
pub fn quantized_bounds(low: f64, high: f64, q: f64) -> (f64, f64) {
    let snap = |x: f64, outward: fn(f64) -> f64| {
        let k = (x / q).round();
        if (k * q - x).abs() <= 1e-9 * q.max(x.abs()) {
            x
        } else {
            outward(x / q) * q
        }
    };
    (snap(low, f64::ceil), snap(high, f64::floor))
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
    /// Collects [`SearchSpace::configs`]; searchers use that instead, so
    /// large experiments never hold every configuration at once.
    pub fn generate(&self, num_samples: u64, seed: u64) -> Result<Vec<Value>, SpaceError> {
        Ok(self.configs(num_samples, seed)?.collect())
    }

    /// The configurations [`SearchSpace::generate`] returns, one at a time.
    pub fn configs(&self, num_samples: u64, seed: u64) -> Result<Configs, SpaceError> {
        let total = self.trial_count(num_samples)?;
        let mut random = Vec::new();
        self.visit_domains(|_, domain| {
            if !matches!(domain, Domain::GridSearch(_)) {
                random.push(domain.clone());
            }
        });
        Ok(Configs {
            grids: self.grids(),
            grid_size: self.grid_size(),
            space: self.clone(),
            random,
            rng: ChaCha8Rng::seed_from_u64(seed),
            next: 0,
            total,
        })
    }

    /// Whether configurations of this space can hold a value at the dotted
    /// `name` (`optimizer.lr`): it names a parameter or a table of them, or
    /// a key inside a fixed table, or inside a table that one of a
    /// `choice`'s or grid's values is.
    pub fn may_hold(&self, name: &str) -> bool {
        fn within<'a>(value: &Value, mut keys: impl Iterator<Item = &'a str>) -> bool {
            keys.try_fold(value, |at, key| at.as_object()?.get(key))
                .is_some()
        }
        let mut keys = name.split('.');
        let mut table = &self.root;
        while let Some(key) = keys.next() {
            match table.get(key) {
                None => return false,
                Some(Node::Table(children)) => table = children,
                Some(Node::Fixed(value)) => return within(value, keys),
                Some(Node::Domain(Domain::Choice(values) | Domain::GridSearch(values))) => {
                    let rest: Vec<&str> = keys.collect();
                    return rest.is_empty()
                        || values.iter().any(|v| within(v, rest.iter().copied()));
                }
                Some(Node::Domain(_)) => return keys.next().is_none(),
            }
        }
        true
    }

    /// Every domain with its dotted path (`param_space.optimizer.lr`), in
    /// the order configurations are built: the order [`SearchSpace::build`]
    /// asks for values in.
    pub fn domains(&self) -> Vec<(String, &Domain)> {
        let mut out = Vec::new();
        self.visit_domains(|path, domain| out.push((path.to_string(), domain)));
        out
    }

    /// A configuration with the fixed values and nested tables of this
    /// space, and `value(i, domain)` for the `i`-th domain of
    /// [`SearchSpace::domains`]; for searchers that choose values
    /// themselves.
    pub fn build(&self, mut value: impl FnMut(usize, &Domain) -> Value) -> Value {
        fn walk(
            table: &BTreeMap<String, Node>,
            next: &mut usize,
            value: &mut dyn FnMut(usize, &Domain) -> Value,
        ) -> Map<String, Value> {
            let mut out = Map::new();
            for (name, node) in table {
                let v = match node {
                    Node::Fixed(v) => v.clone(),
                    Node::Table(children) => Value::Object(walk(children, next, value)),
                    Node::Domain(domain) => {
                        *next += 1;
                        value(*next - 1, domain)
                    }
                };
                out.insert(name.clone(), v);
            }
            out
        }
        Value::Object(walk(&self.root, &mut 0, &mut value))
    }

    /// The space a grid search walks: every `choice` becomes a grid, and
    /// continuous domains become grids of `points` values (an error naming
    /// the parameter when `points` is not given). Grids stay as they are.
    ///
    /// `points` values are evenly spaced with both ends included (log-spaced
    /// for loguniform); randint keeps the distinct integers among them, and
    /// quniform rounds them to multiples of `q` within its bounds, keeping
    /// distinct values. One point is the domain's middle.
    pub fn enumerated(&self, points: Option<usize>) -> Result<SearchSpace, SpaceError> {
        fn walk(
            table: &BTreeMap<String, Node>,
            path: &str,
            points: Option<usize>,
        ) -> Result<BTreeMap<String, Node>, SpaceError> {
            let mut out = BTreeMap::new();
            for (name, node) in table {
                let child = format!("{path}.{name}");
                let node = match node {
                    Node::Fixed(_) => node.clone(),
                    Node::Table(children) => Node::Table(walk(children, &child, points)?),
                    Node::Domain(domain) => {
                        Node::Domain(Domain::GridSearch(enumerate(domain, &child, points)?))
                    }
                };
                out.insert(name.clone(), node);
            }
            Ok(out)
        }
        if points == Some(0) {
            return Err(err("search.points", "must be at least 1".into()));
        }
        // Checked before any grid is built: the trial count is checked only
        // after, and a slip of a few zeros would allocate first.
        if points.is_some_and(|p| p as u64 > MAX_TRIALS) {
            return Err(err(
                "search.points",
                format!("must be at most {MAX_TRIALS}, the most trials one space may generate"),
            ));
        }
        Ok(SearchSpace {
            root: walk(&self.root, "param_space", points)?,
        })
    }

    /// Calls `f` with each domain's dotted path, in visiting order.
    fn visit_domains<'a>(&'a self, mut f: impl FnMut(&str, &'a Domain)) {
        fn walk<'a>(
            table: &'a BTreeMap<String, Node>,
            path: &str,
            f: &mut dyn FnMut(&str, &'a Domain),
        ) {
            for (name, node) in table {
                let child = format!("{path}.{name}");
                match node {
                    Node::Fixed(_) => {}
                    Node::Table(children) => walk(children, &child, f),
                    Node::Domain(domain) => f(&child, domain),
                }
            }
        }
        walk(&self.root, "param_space", &mut f);
    }

    /// Grid lengths in visiting order.
    fn grids(&self) -> Vec<usize> {
        let mut out = Vec::new();
        self.visit_domains(|_, domain| {
            if let Domain::GridSearch(values) = domain {
                out.push(values.len());
            }
        });
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

/// The configurations of one experiment, drawn lazily: the iterator
/// [`SearchSpace::configs`] returns.
#[derive(Debug, Clone)]
pub struct Configs {
    space: SearchSpace,
    grids: Vec<usize>,
    grid_size: u64,
    /// The non-grid domains in visiting order, so that skipping can draw
    /// without walking the tree or building values.
    random: Vec<Domain>,
    rng: ChaCha8Rng,
    next: u64,
    total: u64,
}

impl Configs {
    /// How many configurations were produced (or skipped) so far.
    pub fn position(&self) -> u64 {
        self.next
    }

    /// How many configurations there are in all.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Moves past `n` configurations (fewer if fewer are left) without
    /// building them. The generator must still make every draw those
    /// configurations would have made, since each draw moves it on by an
    /// amount that depends on the value drawn; but drawing alone is cheap
    /// (microseconds for thousands of configurations).
    pub fn skip_configs(&mut self, n: u64) {
        let n = n.min(self.total - self.next);
        for _ in 0..n {
            for domain in &self.random {
                draw(domain, &mut self.rng);
            }
        }
        self.next += n;
    }
}

impl Iterator for Configs {
    type Item = Value;

    fn next(&mut self) -> Option<Value> {
        if self.next >= self.total {
            return None;
        }
        let picks = grid_picks(&self.grids, self.next % self.grid_size);
        self.next += 1;
        let (mut next_grid, rng) = (0, &mut self.rng);
        Some(self.space.build(|_, domain| match domain {
            Domain::GridSearch(values) => {
                next_grid += 1;
                values[picks[next_grid - 1]].clone()
            }
            _ => value_of(domain, draw(domain, rng)),
        }))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = (self.total - self.next) as usize;
        (left, Some(left))
    }
}

impl ExactSizeIterator for Configs {}

/// One random draw, before it becomes a JSON value: [`Configs::skip_configs`]
/// makes exactly the draws that building configurations makes, without
/// cloning choice values.
enum Drawn {
    Index(usize),
    Float(f64),
    Int(i64),
}

fn draw(domain: &Domain, rng: &mut ChaCha8Rng) -> Drawn {
    // The argument types and the order of calls fix the configurations of
    // every experiment ever run with a seed; keep them as they are.
    match *domain {
        Domain::GridSearch(_) => unreachable!("grid values are picked, not drawn"),
        Domain::Choice(ref values) => Drawn::Index(rng.random_range(0..values.len())),
        Domain::Uniform { low, high } => Drawn::Float(rng.random_range(low..high)),
        Domain::LogUniform { low, high } => {
            Drawn::Float(rng.random_range(low.ln()..high.ln()).exp().clamp(low, high))
        }
        Domain::RandInt { low, high } => Drawn::Int(rng.random_range(low..high)),
        Domain::QUniform { low, high, q } => {
            let x = (rng.random_range(low..high) / q).round() * q;
            let (min, max) = quantized_bounds(low, high, q);
            Drawn::Float(x.clamp(min, max))
        }
    }
}

fn value_of(domain: &Domain, drawn: Drawn) -> Value {
    match (domain, drawn) {
        (Domain::Choice(values), Drawn::Index(i)) => values[i].clone(),
        (_, Drawn::Float(x)) => float(x),
        (_, Drawn::Int(n)) => Value::from(n),
        (_, Drawn::Index(_)) => unreachable!("only choices draw indices"),
    }
}

/// The values a grid search tries for `domain` (see
/// [`SearchSpace::enumerated`]).
fn enumerate(domain: &Domain, path: &str, points: Option<usize>) -> Result<Vec<Value>, SpaceError> {
    let name = match domain {
        Domain::GridSearch(values) | Domain::Choice(values) => return Ok(values.clone()),
        Domain::Uniform { .. } => "uniform",
        Domain::LogUniform { .. } => "loguniform",
        Domain::RandInt { .. } => "randint",
        Domain::QUniform { .. } => "quniform",
    };
    let Some(n) = points else {
        return Err(err(
            path,
            format!(
                "grid search cannot enumerate a {name} domain; give `points` in [search] \
                 or use grid_search/choice"
            ),
        ));
    };
    // Position of point i of n in [0, 1], both ends included.
    let at = |i: usize| {
        if n == 1 {
            0.5
        } else {
            i as f64 / (n - 1) as f64
        }
    };
    let mut values: Vec<Value> = Vec::with_capacity(n);
    let mut push = |v: Value| {
        // Consecutive points can round to the same integer or multiple.
        if values.last() != Some(&v) {
            values.push(v);
        }
    };
    for i in 0..n {
        let t = at(i);
        match *domain {
            Domain::Uniform { low, high } => push(float(low + (high - low) * t)),
            Domain::LogUniform { low, high } => {
                let x = (low.ln() + (high.ln() - low.ln()) * t).exp();
                push(float(x.clamp(low, high)))
            }
            Domain::RandInt { low, high } => {
                // In i128: `high - 1 - low` overflows i64 for wide ranges.
                let (low, top) = (i128::from(low), i128::from(high) - 1);
                let x = low + ((top - low) as f64 * t).round() as i128;
                push(Value::from(x.clamp(low, top) as i64))
            }
            Domain::QUniform { low, high, q } => {
                let x = ((low + (high - low) * t) / q).round() * q;
                let (min, max) = quantized_bounds(low, high, q);
                push(float(x.clamp(min, max)))
            }
            Domain::GridSearch(_) | Domain::Choice(_) => unreachable!("returned above"),
        }
    }
    Ok(values)
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
        if let Value::Array(items) = value {
            refuse_domains_in(items, path)?;
        }
        return Ok(Node::Fixed(value.clone()));
    };
    let domain_keys: Vec<&String> = map
        .keys()
        .filter(|k| DOMAIN_NAMES.contains(&k.as_str()))
        .collect();
    match domain_keys.as_slice() {
        [] => {
            // A one-key table whose key is close to a domain's name is a
            // misspelt domain, not a nested value: passed on, it would
            // reach the trainable as a table and fail there, naming
            // neither the parameter nor the typo.
            if let Some((key, _)) = map.iter().next().filter(|_| map.len() == 1)
                && let Some(meant) = near_domain(key)
            {
                return Err(err(
                    path,
                    format!(
                        "`{key}` is not a domain; did you mean `{meant}`? (domains: {}; a \
                         table with other keys is passed to the trainable as it is)",
                        DOMAIN_NAMES.join(", ")
                    ),
                ));
            }
            Ok(Node::Table(parse_table(map, path)?))
        }
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

/// Refuses a domain inside a list (`hidden = [{ choice = [32, 64] }]`),
/// at any depth: a list is a fixed value, so the trainable would get the
/// domain's table itself, where Ray Tune samples it.
fn refuse_domains_in(items: &[Value], path: &str) -> Result<(), SpaceError> {
    fn domain_at(value: &Value, at: String) -> Option<String> {
        match value {
            Value::Object(map)
                if map.len() == 1 && map.keys().all(|k| DOMAIN_NAMES.contains(&k.as_str())) =>
            {
                Some(at)
            }
            Value::Object(map) => map
                .iter()
                .find_map(|(key, inner)| domain_at(inner, format!("{at}.{key}"))),
            Value::Array(items) => items
                .iter()
                .enumerate()
                .find_map(|(i, inner)| domain_at(inner, format!("{at}[{i}]"))),
            _ => None,
        }
    }
    let found = items
        .iter()
        .enumerate()
        .find_map(|(i, item)| domain_at(item, format!("{path}[{i}]")));
    match found {
        Some(at) => Err(err(
            &at,
            "a domain inside a list is not searched: give each searched value a key of its own \
             (`layer_0`, `layer_1`, ...) and build the list in the trainable"
                .to_string(),
        )),
        None => Ok(()),
    }
}

/// The domain name `key` looks like a misspelling of: within two edits,
/// or a prefix of it at least four letters long (`grid`, `log`...).
fn near_domain(key: &str) -> Option<&'static str> {
    let key = key.to_ascii_lowercase();
    DOMAIN_NAMES
        .iter()
        .map(|name| (strsim::levenshtein(&key, name), *name))
        .filter(|&(distance, name)| {
            distance <= 2 || (key.len() >= 4 && name.starts_with(key.as_str()))
        })
        .min()
        .map(|(_, name)| name)
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
    // Sampling draws from `high - low`, which must be finite.
    let finite_width = |low: f64, high: f64, shape: &str| {
        if (high - low).is_finite() {
            Ok(())
        } else {
            Err(err(
                path,
                format!("{name} needs {shape} with a finite width high - low, got {args}"),
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
            finite_width(v[0], v[1], shape)?;
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
            // Draws are uniform in log space.
            if v[0].ln() >= v[1].ln() {
                return Err(err(
                    path,
                    format!(
                        "loguniform needs {shape} far enough apart that ln(low) < ln(high), \
                         got {args}"
                    ),
                ));
            }
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
            finite_width(v[0], v[1], shape)?;
            if v[2] <= 0.0 {
                return Err(err(path, format!("quniform needs {shape}, got {args}")));
            }
            let (min, max) = quantized_bounds(v[0], v[1], v[2]);
            if min > max {
                return Err(err(
                    path,
                    format!(
                        "quniform {args} holds no multiple of {} between {} and {}: \
                         widen the range or make q smaller",
                        v[2], v[0], v[1]
                    ),
                ));
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

    /// A list is a fixed value; a domain in it would reach the trainable
    /// as its table, where Ray Tune samples it: refused, at any depth.
    #[test]
    fn a_domain_inside_a_list_is_refused_with_its_place() {
        for (value, at) in [
            (json!({"hidden": [{"choice": [32, 64]}, 16]}), "hidden[0]"),
            (
                json!({"net": {"layers": [{"width": {"uniform": [0, 1]}}]}}),
                "net.layers[0].width",
            ),
            (json!({"grid": [[1, {"randint": [1, 4]}]]}), "grid[0][1]"),
        ] {
            let error = SearchSpace::from_json(&value).unwrap_err().to_string();
            assert!(
                error.contains(at) && error.contains("a domain inside a list is not searched"),
                "{value}: {error}"
            );
        }
        // Lists of plain values, and lists as a choice's options, are fine.
        let s = space(json!({"sizes": [1, 2, {"a": 3}], "c": {"choice": [[1, 2], [3]]}}));
        let config = &s.generate(1, 0).unwrap()[0];
        assert_eq!(config["sizes"], json!([1, 2, {"a": 3}]));
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

    /// Bounds that are not multiples of q are never values: draws and grid
    /// points clamp to the multiples inside them, and a range with none is
    /// refused.
    #[test]
    fn quniform_values_are_multiples_of_q_whatever_the_bounds() {
        let s = space(json!({"q": {"quniform": [0.04, 1.0, 0.1]}}));
        let on_grid = |q: f64| ((q / 0.1).round() * 0.1 - q).abs() < 1e-12;
        for config in s.generate(2000, 3).unwrap() {
            let q = config["q"].as_f64().unwrap();
            assert!((0.1 - 1e-12..=1.0).contains(&q) && on_grid(q), "{q}");
        }
        assert_eq!(quantized_bounds(0.04, 1.0, 0.1), (0.1, 1.0));
        assert_eq!(
            quantized_bounds(0.3, 0.95, 0.1).0,
            0.3,
            "a multiple is kept"
        );
        let message = SearchSpace::from_json(&json!({"q": {"quniform": [0.11, 0.19, 0.1]}}))
            .unwrap_err()
            .to_string();
        assert!(message.contains("holds no multiple of 0.1"), "{message}");
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
            (
                json!({"l2": {"choise": [0.0, 0.1]}}),
                "param_space.l2: `choise` is not a domain; did you mean `choice`?",
            ),
            (
                json!({"opt": {"lr": {"log_uniform": [0.01, 0.1]}}}),
                "param_space.opt.lr: `log_uniform` is not a domain; did you mean `loguniform`?",
            ),
            (
                json!({"b": {"Grid": [16, 32]}}),
                "param_space.b: `Grid` is not a domain; did you mean `grid_search`?",
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
        // Nested values whose keys are not near a domain's name pass as
        // they are.
        let nested = json!({"opt": {"name": "adam"}, "layers": {"units": 64}, "m": {"range": 5}});
        assert!(SearchSpace::from_json(&nested).is_ok());
    }

    #[test]
    fn bounds_that_cannot_be_sampled_are_refused() {
        // Found with the `config` fuzz target (fuzz/): these spaces parsed,
        // then panicked on the first draw (rand refuses an infinite width or
        // an empty range).
        let cases = [
            (
                json!({"u": {"uniform": [-1e308, 1e308]}}),
                "param_space.u: uniform needs [low, high] (two numbers) with a finite width",
            ),
            (
                json!({"q": {"quniform": [-1e308, 1e308, 1.0]}}),
                "param_space.q: quniform needs [low, high, q] (three numbers, q > 0) with a \
                 finite width",
            ),
            (
                json!({"l": {"loguniform": [1e300, 1.000_000_000_000_000_2e300]}}),
                "param_space.l: loguniform needs [low, high] (two positive numbers) far enough \
                 apart that ln(low) < ln(high)",
            ),
        ];
        for (value, expected) in cases {
            let message = SearchSpace::from_json(&value).unwrap_err().to_string();
            assert!(
                message.starts_with(expected),
                "{message}\n expected: {expected}"
            );
        }
        let wide = space(json!({"u": {"uniform": [-1e307, 1e307]}}));
        for config in wide.generate(100, 1).unwrap() {
            assert!(config["u"].as_f64().unwrap().abs() <= 1e307);
        }
    }

    #[test]
    fn the_widest_randint_enumerates_within_its_range() {
        // Found with the `config` fuzz target: `high - 1 - low` overflowed.
        let s = space(json!({"n": {"randint": [i64::MIN, i64::MAX]}}));
        let values: Vec<i64> = s
            .enumerated(Some(3))
            .unwrap()
            .generate(1, 0)
            .unwrap()
            .iter()
            .map(|c| c["n"].as_i64().unwrap())
            .collect();
        assert_eq!(values, [i64::MIN, 0, i64::MAX - 1]);
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

    fn rich_space() -> SearchSpace {
        space(json!({
            "u": {"uniform": [-1.0, 2.0]},
            "l": {"loguniform": [1e-4, 1e-1]},
            "g": {"grid_search": [1, 2]},
            "r": {"randint": [3, 7]},
            "q": {"quniform": [0.0, 1.0, 0.25]},
            "c": {"choice": [16, 32, "big"]},
            "nested": {
                "deep": {"x": {"uniform": [0, 1]}, "h": {"grid_search": ["a", "b", "c"]}},
                "fixed": true
            },
        }))
    }

    #[test]
    fn configurations_match_those_drawn_before_generation_became_lazy() {
        // Recorded with the eager generator this crate shipped first:
        // experiments started then must get the same configurations now.
        let configs = rich_space().generate(3, 7).unwrap();
        assert_eq!(configs.len(), 18);
        assert_eq!(
            configs[0],
            json!({"c":16,"g":1,"l":0.00035169420222122777,
                   "nested":{"deep":{"h":"a","x":0.270089458946136},"fixed":true},
                   "q":0.0,"r":3,"u":1.432830479881674})
        );
        assert_eq!(
            configs[5],
            json!({"c":16,"g":2,"l":0.000272837886352264,
                   "nested":{"deep":{"h":"c","x":0.9771053247537282},"fixed":true},
                   "q":0.75,"r":4,"u":0.7199582480628335})
        );
        assert_eq!(
            configs[17],
            json!({"c":"big","g":2,"l":0.004525495656839182,
                   "nested":{"deep":{"h":"c","x":0.4171363013124645},"fixed":true},
                   "q":0.75,"r":4,"u":0.927445823160413})
        );
    }

    #[test]
    fn skipping_lands_where_iterating_would() {
        let s = rich_space();
        let all = s.generate(40, 11).unwrap();
        for k in [0, 1, 5, 6, 59, 240] {
            let mut configs = s.configs(40, 11).unwrap();
            configs.skip_configs(k);
            assert_eq!(configs.position(), k);
            assert_eq!(configs.len(), 240 - k as usize);
            assert_eq!(configs.collect::<Vec<_>>(), all[k as usize..], "skip {k}");
        }
        let mut configs = s.configs(1, 0).unwrap();
        configs.skip_configs(1000);
        assert_eq!((configs.position(), configs.next()), (6, None));
    }

    #[test]
    fn huge_experiments_are_not_materialized() {
        let s = space(json!({"u": {"uniform": [0, 1]}}));
        let mut configs = s.configs(MAX_TRIALS, 3).unwrap();
        assert_eq!(configs.total(), MAX_TRIALS);
        let first: Vec<Value> = configs.by_ref().take(3).collect();
        assert_eq!(first, s.generate(3, 3).unwrap());
        let started = std::time::Instant::now();
        configs.skip_configs(10_000);
        assert_eq!(configs.position(), 10_003);
        assert!(started.elapsed().as_secs_f64() < 1.0, "skipping is cheap");
    }

    #[test]
    fn domains_and_build_follow_the_visiting_order() {
        let s = rich_space();
        let paths: Vec<String> = s.domains().into_iter().map(|(p, _)| p).collect();
        assert_eq!(
            paths,
            [
                "param_space.c",
                "param_space.g",
                "param_space.l",
                "param_space.nested.deep.h",
                "param_space.nested.deep.x",
                "param_space.q",
                "param_space.r",
                "param_space.u",
            ]
        );
        let config = s.build(|i, _| Value::from(i));
        assert_eq!(
            config["nested"],
            json!({"deep": {"h": 3, "x": 4}, "fixed": true})
        );
        assert_eq!((&config["c"], &config["u"]), (&json!(0), &json!(7)));
    }

    #[test]
    fn enumerated_spaces_turn_choices_and_points_into_grids() {
        let s = space(json!({
            "c": {"choice": ["a", "b"]},
            "g": {"grid_search": [1, 2, 3]},
            "fixed": 5,
        }));
        let grid = s.enumerated(None).unwrap();
        assert_eq!(grid.grid_size(), 6);
        assert_eq!(
            grid.generate(1, 0).unwrap()[1],
            json!({"c": "a", "fixed": 5, "g": 2})
        );

        let values = |domain: Value, points: usize| -> Vec<Value> {
            space(json!({ "x": domain }))
                .enumerated(Some(points))
                .unwrap()
                .generate(1, 0)
                .unwrap()
                .into_iter()
                .map(|c| c["x"].clone())
                .collect()
        };
        assert_eq!(
            values(json!({"uniform": [0, 1]}), 5),
            json!([0.0, 0.25, 0.5, 0.75, 1.0])
                .as_array()
                .unwrap()
                .clone()
        );
        assert_eq!(values(json!({"uniform": [2, 4]}), 1), [json!(3.0)]);
        let logs: Vec<f64> = values(json!({"loguniform": [1e-4, 1.0]}), 5)
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        for (x, expected) in logs.iter().zip([1e-4, 1e-3, 1e-2, 1e-1, 1.0]) {
            assert!((x / expected - 1.0).abs() < 1e-9, "{logs:?}");
        }
        assert_eq!(
            values(json!({"randint": [0, 3]}), 10),
            [json!(0), json!(1), json!(2)]
        );
        assert_eq!(
            values(json!({"randint": [0, 10]}), 3),
            [json!(0), json!(5), json!(9)]
        );
        assert_eq!(
            values(json!({"quniform": [0, 1, 0.5]}), 5),
            [json!(0.0), json!(0.5), json!(1.0)]
        );
    }

    #[test]
    fn enumerating_a_continuous_domain_needs_points() {
        let s = space(json!({"opt": {"lr": {"loguniform": [1e-4, 1e-1]}}, "c": {"choice": [1]}}));
        assert_eq!(
            s.enumerated(None).unwrap_err().to_string(),
            "param_space.opt.lr: grid search cannot enumerate a loguniform domain; \
             give `points` in [search] or use grid_search/choice"
        );
        assert!(s.enumerated(Some(0)).is_err());
        let big: Vec<i64> = (0..10_000).collect();
        let s = space(json!({"a": {"choice": big}, "b": {"uniform": [0, 1]}}));
        let grid = s.enumerated(Some(10_000)).unwrap();
        assert!(
            grid.configs(1, 0)
                .unwrap_err()
                .message
                .contains("more than")
        );
    }
}
