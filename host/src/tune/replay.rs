//! Replayed learning curves: trainables that report a tabulated benchmark
//! instead of training, so schedulers can be tested and compared in
//! milliseconds against a known optimum (the surrogate-free "tabulated
//! benchmark" of Syne Tune and HPOBench).
//!
//! A [`CurveSet`] is a full grid of configurations (every combination of
//! every parameter's values appears exactly once), each with one curve per
//! metric over the same number of epochs and a fixed fuel cost per epoch.
//! [`replay_backend`] turns it into an [`FnBackend`] whose trial for a config
//! reports, at iteration `n`, the tabulated metrics of epoch `n` plus
//! `epoch = n`, burns the tabulated fuel, and is `done` after the last epoch.
//! `examples/replay` is the same replay as a WebAssembly component.
//!
//! ## Matching configs
//!
//! [`CurveSet::lookup`] matches a trial's config to the grid *exactly*:
//! numbers compare by value as parsed (so `64`, `64.0` and TOML's `64` are
//! the same width, and `0.001` is the `0.001` written in the table, since
//! decimal text parses to the same `f64` everywhere), other values by
//! equality; a missing or unknown key, or a value the grid lacks, is an
//! error that lists the valid values. Exact rather than nearest-point
//! matching because a replayed trial must be the tabulated configuration:
//! snapping a sampled `lr = 0.0042` to `0.003` would credit the scheduler
//! with a result no such config produced, and hide that the experiment's
//! space does not fit the table. [`CurveSet::param_space`] writes a space
//! that fits.
//!
//! ## The shipped set
//!
//! [`CurveSet::synthetic`] computes `examples/replay/curves/synthetic.json`
//! (a test checks that the file is its output, byte for byte). Its curves
//! cross: large learning rates lead for the first epochs and plateau high,
//! wide networks start slower and win late, so an early stopping rule that
//! trusts the first epochs stops the optimum. The formula is in
//! [`CurveSet::synthetic`]'s documentation and in the file's description.
//!
//! `examples/replay/curves/digits-cnn.json` is tabulated from real
//! training instead: the burn CNN example over 648 configurations (learning
//! rate, channels, hidden width, dropout, batch size) for 27 epochs, each
//! costed by what wtune's burn executor charges for its epoch
//! (`examples/digits-cnn/examples/tabulate.rs` writes it). Its early epochs
//! rank the configurations much as the last does (Spearman 0.75 at epoch 1,
//! 0.92 at epoch 9), as in published tabulated benchmarks.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Map, Value};

use super::backend::closure::FnBackend;
use super::backend::{Step, TrialFailure};
use super::result::{AUTO_FIELDS, Mode};

/// The metric every replayed step adds: the tabulated epoch it reports. It
/// differs from `training_iteration` once a trial continues from another
/// trial's checkpoint (population based training), which keeps the epoch.
pub const EPOCH_METRIC: &str = "epoch";

/// One tabulated configuration: its curves and its cost.
#[derive(Debug, Clone, PartialEq)]
pub struct Curve {
    /// The configuration, one value per parameter of the set.
    pub config: Map<String, Value>,
    /// Fuel one epoch of this configuration burns.
    pub fuel_per_epoch: u64,
    /// Each metric's value after epochs 1, 2, ..., in the order reported.
    pub metrics: Vec<(String, Vec<f64>)>,
}

impl Curve {
    /// The values of metric `name`, epoch 1 first.
    pub fn metric(&self, name: &str) -> Option<&[f64]> {
        self.metrics
            .iter()
            .find(|(metric, _)| metric == name)
            .map(|(_, values)| values.as_slice())
    }

    /// Number of tabulated epochs.
    pub fn epochs(&self) -> u64 {
        self.metrics
            .first()
            .map_or(0, |(_, values)| values.len() as u64)
    }

    /// What a replayed trial reports at `epoch` (from 1): every metric's
    /// value, then [`EPOCH_METRIC`]; `done` at the last epoch.
    pub fn step(&self, epoch: u64) -> Result<Step, String> {
        let last = self.epochs();
        if epoch == 0 || epoch > last {
            return Err(format!(
                "epoch {epoch} is outside the table (epochs 1 to {last}) for {}",
                describe(&self.config)
            ));
        }
        let mut metrics: Vec<(String, f64)> = self
            .metrics
            .iter()
            .map(|(name, values)| (name.clone(), values[epoch as usize - 1]))
            .collect();
        metrics.push((EPOCH_METRIC.into(), epoch as f64));
        Ok(Step {
            metrics,
            done: epoch == last,
            fuel: self.fuel_per_epoch,
        })
    }
}

/// The best configuration by some criterion, and where its curve gets there.
#[derive(Debug, Clone, PartialEq)]
pub struct Optimum {
    /// The configuration.
    pub config: Map<String, Value>,
    /// The epoch (from 1) of `value`.
    pub epoch: u64,
    /// The set's metric at that epoch.
    pub value: f64,
}

/// How [`CurveSet::param_space`] draws the table's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sampling {
    /// `grid_search` over every parameter: one sample runs the whole table.
    Grid,
    /// `choice` over every parameter: each sample is one random table entry.
    Choice,
}

/// A tabulated benchmark: a full grid of configurations and their curves.
#[derive(Debug, Clone, PartialEq)]
pub struct CurveSet {
    name: String,
    description: String,
    metric: String,
    mode: Mode,
    epochs: u64,
    params: Vec<(String, Vec<Value>)>,
    curves: Vec<Curve>,
    /// Curve index by grid position (mixed radix, last parameter fastest),
    /// so a lookup costs one scan of each parameter's values.
    grid: Vec<usize>,
}

/// The file format, as written by [`CurveSet::to_json`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSet {
    name: String,
    #[serde(default)]
    description: String,
    metric: String,
    mode: Mode,
    epochs: u64,
    params: Map<String, Value>,
    #[serde(default)]
    optimum: Option<RawOptima>,
    curves: Vec<RawCurve>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCurve {
    config: Map<String, Value>,
    fuel_per_epoch: u64,
    metrics: Map<String, Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOptima {
    #[serde(rename = "final")]
    last: RawOptimum,
    anytime: RawOptimum,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOptimum {
    config: Map<String, Value>,
    epoch: u64,
    value: f64,
}

impl CurveSet {
    /// A set from its parts, validated: `params` are the grid's axes (name,
    /// distinct scalar values), `curves` cover every combination exactly
    /// once, each with the same metrics (`metric` among them) over `epochs`
    /// finite values.
    pub fn new(
        name: impl Into<String>,
        metric: impl Into<String>,
        mode: Mode,
        epochs: u64,
        params: Vec<(String, Vec<Value>)>,
        curves: Vec<Curve>,
    ) -> Result<Self, String> {
        let mut set = Self {
            name: name.into(),
            description: String::new(),
            metric: metric.into(),
            mode,
            epochs,
            params,
            curves,
            grid: Vec::new(),
        };
        set.grid = set.validate()?;
        Ok(set)
    }

    /// The same set with a description (what it is, how it was made).
    pub fn with_description(mut self, description: impl Into<String>) -> Self {
        self.description = description.into();
        self
    }

    /// Parses and validates a set in the format [`CurveSet::to_json`] writes.
    /// An `optimum` section, when present, must agree with the curves.
    pub fn from_json(text: &str) -> Result<Self, String> {
        let raw: RawSet = serde_json::from_str(text).map_err(|e| {
            let hint = if text.contains("NaN") || text.contains("Infinity") {
                " (JSON has no NaN or Infinity: every tabulated value must be a finite number)"
            } else {
                ""
            };
            format!("not a curve set: {e}{hint}")
        })?;
        let params = raw
            .params
            .into_iter()
            .map(|(name, values)| match values {
                Value::Array(values) => Ok((name, values)),
                other => Err(format!(
                    "params.{name} must be an array of the values the grid takes, got {other}"
                )),
            })
            .collect::<Result<Vec<_>, String>>()?;
        let curves = raw
            .curves
            .into_iter()
            .enumerate()
            .map(|(index, curve)| raw_curve(index, curve))
            .collect::<Result<Vec<_>, String>>()?;
        let set = Self::new(raw.name, raw.metric, raw.mode, raw.epochs, params, curves)?
            .with_description(raw.description);
        if let Some(optima) = raw.optimum {
            check_optimum("optimum.final", &optima.last, &set.best_final())?;
            check_optimum("optimum.anytime", &optima.anytime, &set.best_anytime())?;
        }
        Ok(set)
    }

    /// [`CurveSet::from_json`] on bytes, which must be UTF-8.
    pub fn from_slice(bytes: &[u8]) -> Result<Self, String> {
        let text = std::str::from_utf8(bytes)
            .map_err(|e| format!("not a curve set: the bytes are not UTF-8 ({e})"))?;
        Self::from_json(text)
    }

    /// [`CurveSet::from_json`] on a file's contents.
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read curve set {}: {e}", path.display()))?;
        Self::from_json(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// The set's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What the set is and how it was made.
    pub fn description(&self) -> &str {
        &self.description
    }

    /// The metric the optimum is defined by.
    pub fn metric(&self) -> &str {
        &self.metric
    }

    /// Whether [`CurveSet::metric`] is minimized or maximized.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Epochs every curve has.
    pub fn epochs(&self) -> u64 {
        self.epochs
    }

    /// The grid's axes: each parameter's name and values, in table order.
    pub fn params(&self) -> &[(String, Vec<Value>)] {
        &self.params
    }

    /// Every tabulated configuration, in table order.
    pub fn curves(&self) -> &[Curve] {
        &self.curves
    }

    /// The tabulated curve of a trial's config (a JSON object with exactly
    /// the set's parameters; see the module docs for how values match).
    pub fn lookup(&self, config: &Value) -> Result<&Curve, String> {
        let Value::Object(config) = config else {
            return Err(format!(
                "a config for the curve set `{}` must be a JSON object with {}, got {config}",
                self.name,
                self.param_names()
            ));
        };
        self.grid_index(config, "config")
            .map(|i| &self.curves[self.grid[i]])
    }

    /// A search space over exactly the tabulated values, for an experiment's
    /// `param_space` (see [`crate::tune::space`]).
    pub fn param_space(&self, sampling: Sampling) -> Value {
        let domain = match sampling {
            Sampling::Grid => "grid_search",
            Sampling::Choice => "choice",
        };
        Value::Object(
            self.params
                .iter()
                .map(|(name, values)| {
                    let mut leaf = Map::new();
                    leaf.insert(domain.into(), Value::Array(values.clone()));
                    (name.clone(), Value::Object(leaf))
                })
                .collect(),
        )
    }

    /// The configuration whose metric is best at the last epoch (the first
    /// in table order on a tie): what a scheduler that trains its pick to
    /// the end can at best find.
    pub fn best_final(&self) -> Optimum {
        self.best_by(|values| (values.len(), values[values.len() - 1]))
    }

    /// The configuration and epoch with the best metric anywhere on any
    /// curve (the earliest on a tie): what keeping the best checkpoint can
    /// at best find.
    pub fn best_anytime(&self) -> Optimum {
        let mode = self.mode;
        self.best_by(|values| {
            let mut best = 0;
            for (i, &v) in values.iter().enumerate() {
                if mode.better(v, values[best]) {
                    best = i;
                }
            }
            (best + 1, values[best])
        })
    }

    /// How much worse a config's final metric is than [`CurveSet::best_final`]'s
    /// (0 for the optimum, never negative): the usual score of a scheduler's
    /// pick.
    pub fn regret(&self, config: &Value) -> Result<f64, String> {
        let values = self.objective(self.lookup(config)?);
        let best = self.best_final().value;
        Ok((values[values.len() - 1] - best).abs())
    }

    /// Fuel that training every configuration to the last epoch burns: the
    /// cost of an exhaustive grid search, to compare schedulers' fuel with.
    pub fn grid_fuel(&self) -> u64 {
        self.curves
            .iter()
            .map(|curve| curve.fuel_per_epoch.saturating_mul(self.epochs))
            .fold(0, u64::saturating_add)
    }

    /// The set as JSON text, in the layout of the shipped files: one line per
    /// curve, the optimum spelled out for readers. [`CurveSet::from_json`]
    /// reads it back to an equal set (floats are written in their shortest
    /// exact form).
    pub fn to_json(&self) -> String {
        let mut out = String::from("{\n");
        let field = |out: &mut String, key: &str, value: &str| {
            let _ = writeln!(out, "  {}: {value},", json(&key));
        };
        field(&mut out, "name", &json(&self.name));
        field(&mut out, "description", &json(&self.description));
        field(&mut out, "metric", &json(&self.metric));
        field(&mut out, "mode", &json(&self.mode));
        field(&mut out, "epochs", &self.epochs.to_string());
        out.push_str("  \"params\": {\n");
        for (i, (name, values)) in self.params.iter().enumerate() {
            let comma = if i + 1 < self.params.len() { "," } else { "" };
            let _ = writeln!(out, "    {}: {}{comma}", json(name), json(values));
        }
        out.push_str("  },\n  \"optimum\": {\n");
        let optimum = |o: &Optimum| {
            format!(
                "{{\"config\": {}, \"epoch\": {}, \"value\": {}}}",
                inline(&o.config),
                o.epoch,
                json(&o.value)
            )
        };
        let _ = writeln!(out, "    \"final\": {},", optimum(&self.best_final()));
        let _ = writeln!(out, "    \"anytime\": {}", optimum(&self.best_anytime()));
        out.push_str("  },\n  \"curves\": [\n");
        for (i, curve) in self.curves.iter().enumerate() {
            let metrics: Vec<String> = curve
                .metrics
                .iter()
                .map(|(name, values)| format!("{}: {}", json(name), json(values)))
                .collect();
            let comma = if i + 1 < self.curves.len() { "," } else { "" };
            let _ = writeln!(
                out,
                "    {{\"config\": {}, \"fuel_per_epoch\": {}, \"metrics\": {{{}}}}}{comma}",
                inline(&curve.config),
                curve.fuel_per_epoch,
                metrics.join(", ")
            );
        }
        out.push_str("  ]\n}\n");
        out
    }

    /// The shipped synthetic benchmark (`examples/replay/curves/synthetic.json`):
    /// `lr` in {1e-4, 3e-4, ..., 0.3} (8 values) x `width` in {16, 32, 64,
    /// 128}, 81 epochs of `val_loss` (minimized). With `s = width / 16`:
    ///
    /// ```text
    /// floor    = 0.1 + 0.24 / sqrt(s) + 0.9 * lr     large lr plateaus high, width lowers it
    /// rate     = 40 * lr / sqrt(s)                    large lr learns fast, width slows it
    /// left(t)  = exp(-sqrt(rate * t))
    /// val_loss = floor + (2.3 - floor) * left(t) + (0.003 + 0.02 * left(t)) * z
    /// fuel_per_epoch = 10 * (64 * width + width^2)
    /// ```
    ///
    /// `z` is standard-normal-like noise (a scaled sum of four uniforms from
    /// splitmix64, seeded per curve); values are rounded to 6 decimals. The
    /// noise-free optimum is lr = 0.03, width = 128 (0.218 at epoch 81,
    /// ahead of width 64 at 0.249 for a third of the fuel); at epoch 1 it
    /// ranks only 12th of 32, behind lr = 0.3. Only IEEE-exact operations
    /// are used (`exp` is computed here, not by the platform's libm), so the
    /// table is the same bit for bit on every machine.
    pub fn synthetic() -> Self {
        const LRS: [f64; 8] = [1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1];
        const WIDTHS: [u64; 4] = [16, 32, 64, 128];
        const EPOCHS: u64 = 81;
        const SEED: u64 = 0x5EED_CAFE;
        let mut curves = Vec::new();
        for &lr in &LRS {
            for &width in &WIDTHS {
                let mut rng = SEED.wrapping_add(curves.len() as u64);
                let s = width as f64 / 16.0;
                let floor = 0.1 + 0.24 / s.sqrt() + 0.9 * lr;
                let rate = 40.0 * lr / s.sqrt();
                let values = (1..=EPOCHS)
                    .map(|t| {
                        let left = exp(-(rate * t as f64).sqrt());
                        let z = (0..4).map(|_| unit(&mut rng)).sum::<f64>() - 2.0;
                        let noise = (0.003 + 0.02 * left) * z * 3f64.sqrt();
                        let value = floor + (2.3 - floor) * left + noise;
                        (value * 1e6).round() / 1e6
                    })
                    .collect();
                let mut config = Map::new();
                config.insert("lr".into(), lr.into());
                config.insert("width".into(), width.into());
                curves.push(Curve {
                    config,
                    fuel_per_epoch: 10 * (64 * width + width * width),
                    metrics: vec![("val_loss".into(), values)],
                });
            }
        }
        let params = vec![
            ("lr".to_string(), LRS.iter().map(|&v| v.into()).collect()),
            (
                "width".to_string(),
                WIDTHS.iter().map(|&v| v.into()).collect(),
            ),
        ];
        Self::new("synthetic", "val_loss", Mode::Min, EPOCHS, params, curves)
            .expect("the synthetic set is a valid grid")
            .with_description(SYNTHETIC_DESCRIPTION)
    }

    fn param_names(&self) -> String {
        let names: Vec<&str> = self.params.iter().map(|(n, _)| n.as_str()).collect();
        names.join(", ")
    }

    fn objective<'a>(&self, curve: &'a Curve) -> &'a [f64] {
        curve
            .metric(&self.metric)
            .expect("validation checked every curve has the set's metric")
    }

    /// The best curve by `pick(values) -> (epoch, value)`.
    fn best_by(&self, pick: impl Fn(&[f64]) -> (usize, f64)) -> Optimum {
        let mut best: Option<(usize, usize, f64)> = None;
        for (index, curve) in self.curves.iter().enumerate() {
            let (epoch, value) = pick(self.objective(curve));
            if best.is_none_or(|(_, _, b)| self.mode.better(value, b)) {
                best = Some((index, epoch, value));
            }
        }
        let (index, epoch, value) = best.expect("validation checked the set has curves");
        Optimum {
            config: self.curves[index].config.clone(),
            epoch: epoch as u64,
            value,
        }
    }

    /// The grid position of `config`; `what` names it in errors.
    fn grid_index(&self, config: &Map<String, Value>, what: &str) -> Result<usize, String> {
        if let Some(key) = config
            .keys()
            .find(|key| !self.params.iter().any(|(name, _)| name == *key))
        {
            return Err(format!(
                "{what} key `{key}` is not a parameter of the curve set `{}` (its parameters: {})",
                self.name,
                self.param_names()
            ));
        }
        let mut index = 0;
        for (name, values) in &self.params {
            let value = config.get(name).ok_or_else(|| {
                format!(
                    "{what} has no `{name}`; the curve set `{}` is indexed by {}",
                    self.name,
                    self.param_names()
                )
            })?;
            let position = values.iter().position(|v| same(v, value)).ok_or_else(|| {
                let valid: Vec<String> = values.iter().map(Value::to_string).collect();
                format!(
                    "{name} = {value} is not tabulated in the curve set `{}`; valid values: {} \
                     (matched exactly: the table holds no other configurations)",
                    self.name,
                    valid.join(", ")
                )
            })?;
            index = index * values.len() + position;
        }
        Ok(index)
    }

    /// Checks the set and returns the grid's curve indices.
    fn validate(&self) -> Result<Vec<usize>, String> {
        if self.metric.is_empty() {
            return Err("the curve set's metric must not be empty".into());
        }
        if self.epochs == 0 {
            return Err("epochs must be at least 1".into());
        }
        if self.params.is_empty() {
            return Err("params must name at least one parameter".into());
        }
        let mut size: usize = 1;
        for (i, (name, values)) in self.params.iter().enumerate() {
            if name.is_empty() {
                return Err("params: a parameter name is empty".into());
            }
            if self.params[..i].iter().any(|(other, _)| other == name) {
                return Err(format!("params: `{name}` appears twice"));
            }
            if values.is_empty() {
                return Err(format!("params.{name} has no values"));
            }
            for (j, value) in values.iter().enumerate() {
                if !matches!(value, Value::Number(_) | Value::String(_) | Value::Bool(_)) {
                    return Err(format!(
                        "params.{name}[{j}] is {value}; values must be numbers, strings or booleans"
                    ));
                }
                if values[..j].iter().any(|other| same(other, value)) {
                    return Err(format!("params.{name} lists {value} twice"));
                }
            }
            size = size
                .checked_mul(values.len())
                .ok_or("params: the grid is too large")?;
        }
        if self.curves.len() != size {
            let sizes: Vec<String> = self
                .params
                .iter()
                .map(|(_, v)| v.len().to_string())
                .collect();
            return Err(format!(
                "the grid {} has {size} configurations but the set has {} curves; every \
                 combination of the params' values needs exactly one curve",
                sizes.join(" x "),
                self.curves.len()
            ));
        }
        let names: Vec<&str> = self.curves[0]
            .metrics
            .iter()
            .map(|(n, _)| n.as_str())
            .collect();
        let mut grid = vec![usize::MAX; size];
        for (index, curve) in self.curves.iter().enumerate() {
            let at = format!("curve {index} ({})", describe(&curve.config));
            let position = self
                .grid_index(&curve.config, "config")
                .map_err(|e| format!("{at}: {e}"))?;
            if grid[position] != usize::MAX {
                return Err(format!(
                    "{at} repeats the config of curve {}; each configuration needs exactly one",
                    grid[position]
                ));
            }
            grid[position] = index;
            let these: Vec<&str> = curve.metrics.iter().map(|(n, _)| n.as_str()).collect();
            if curve.metric(&self.metric).is_none() {
                return Err(format!(
                    "{at} has no `{}` values, the set's metric (it has: {})",
                    self.metric,
                    these.join(", ")
                ));
            }
            if these != names {
                return Err(format!(
                    "{at} has the metrics [{}] but curve 0 has [{}]; every curve needs the same",
                    these.join(", "),
                    names.join(", ")
                ));
            }
            for (name, values) in &curve.metrics {
                if name == EPOCH_METRIC || AUTO_FIELDS.contains(&name.as_str()) {
                    return Err(format!(
                        "{at}: the metric name `{name}` is reserved (replays report `{EPOCH_METRIC}` \
                         and wtune fills in {})",
                        AUTO_FIELDS.join(", ")
                    ));
                }
                if values.len() as u64 != self.epochs {
                    return Err(format!(
                        "{at} has {} values of {name}, expected {} (epochs): tables must not be \
                         ragged",
                        values.len(),
                        self.epochs
                    ));
                }
                if let Some(epoch) = values.iter().position(|v| !v.is_finite()) {
                    return Err(format!(
                        "{at}: {name} at epoch {} is {}; every tabulated value must be finite",
                        epoch + 1,
                        values[epoch]
                    ));
                }
            }
        }
        Ok(grid)
    }
}

const SYNTHETIC_DESCRIPTION: &str = "Synthetic learning curves with a known optimum, computed by \
    wtune::tune::replay::CurveSet::synthetic() (host/src/tune/replay.rs). With s = width / 16: \
    floor = 0.1 + 0.24 / sqrt(s) + 0.9 * lr; rate = 40 * lr / sqrt(s); \
    left(t) = exp(-sqrt(rate * t)); \
    val_loss(t) = floor + (2.3 - floor) * left(t) + (0.003 + 0.02 * left(t)) * z, \
    z seeded noise of unit variance; rounded to 6 decimals. \
    fuel_per_epoch = 10 * (64 * width + width^2). \
    Large learning rates lead early and plateau high; wide networks start slow and win late. \
    Noise-free optimum: lr = 0.03, width = 128 (0.218 at epoch 81).";

/// Builds the native replay of `curves`: each trial looks its config up
/// (an unknown config fails the trial with the valid values, permanently),
/// then step `n` reports epoch `n`'s metrics and `epoch`, burns the
/// tabulated fuel and is `done` at the last epoch.
///
/// Checkpoints hold the iteration, so a trial launched from another trial's
/// checkpoint with a new config (population based training) replays the new
/// config's curve from the checkpoint's epoch, as the guest's `reset` does.
pub fn replay_backend(curves: impl Into<Arc<CurveSet>>) -> FnBackend {
    let curves: Arc<CurveSet> = curves.into();
    FnBackend::new(move |config: &Value| {
        let curve = curves
            .lookup(config)
            .map_err(TrialFailure::permanent)?
            .clone();
        Ok(move |epoch: u64| curve.step(epoch).map_err(TrialFailure::permanent))
    })
}

fn raw_curve(index: usize, curve: RawCurve) -> Result<Curve, String> {
    let metrics = curve
        .metrics
        .into_iter()
        .map(|(name, values)| {
            let at = || format!("curve {index} ({})", describe(&curve.config));
            let Value::Array(values) = values else {
                return Err(format!("{}: {name} must be an array of numbers", at()));
            };
            let values = values
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    v.as_f64().ok_or_else(|| {
                        format!(
                            "{}: {name} at epoch {} is {v}, not a number; every tabulated value \
                             must be a finite number",
                            at(),
                            i + 1
                        )
                    })
                })
                .collect::<Result<Vec<f64>, String>>()?;
            Ok((name, values))
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(Curve {
        config: curve.config,
        fuel_per_epoch: curve.fuel_per_epoch,
        metrics,
    })
}

fn check_optimum(what: &str, stated: &RawOptimum, actual: &Optimum) -> Result<(), String> {
    if stated.config != actual.config
        || stated.epoch != actual.epoch
        || stated.value != actual.value
    {
        return Err(format!(
            "{what} says {} at epoch {} = {}, but the curves give {} at epoch {} = {}",
            describe(&stated.config),
            stated.epoch,
            stated.value,
            describe(&actual.config),
            actual.epoch,
            actual.value
        ));
    }
    Ok(())
}

/// Grid values are equal when both are numbers of the same value (so an
/// integer width matches a float one), or otherwise identical.
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

/// `lr=0.001, width=16`, for messages.
fn describe(config: &Map<String, Value>) -> String {
    let parts: Vec<String> = config.iter().map(|(k, v)| format!("{k}={v}")).collect();
    parts.join(", ")
}

fn json<T: serde::Serialize + ?Sized>(value: &T) -> String {
    serde_json::to_string(value).expect("plain data serializes")
}

/// A config as `{"lr": 0.001, "width": 16}`: with spaces, unlike
/// `serde_json::to_string`, to match the rest of the file.
fn inline(config: &Map<String, Value>) -> String {
    let parts: Vec<String> = config
        .iter()
        .map(|(k, v)| format!("{}: {}", json(k), json(v)))
        .collect();
    format!("{{{}}}", parts.join(", "))
}

/// e^x from IEEE-exact operations only. The platform's `exp` comes from the
/// C library and may differ in the last bit between systems, which would
/// change rounded table values; halving until |x| <= 1/16, a 12-term Taylor
/// series and repeated squaring are the same everywhere (and accurate to
/// about 1e-13 relative over the range used, far below the 1e-6 rounding).
fn exp(x: f64) -> f64 {
    let mut r = x;
    let mut halvings = 0;
    while r.abs() > 0.0625 {
        r /= 2.0;
        halvings += 1;
    }
    let mut term = 1.0;
    let mut sum = 1.0;
    for k in 1..=12 {
        term = term * r / k as f64;
        sum += term;
    }
    for _ in 0..halvings {
        sum *= sum;
    }
    sum
}

/// A uniform draw in [0, 1) from splitmix64: specified bit for bit, unlike
/// `rand`'s distributions, which may change between versions.
fn unit(state: &mut u64) -> f64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::tune::space::SearchSpace;
    use crate::tune::{CheckpointInfo, TrialBackend, TrialLaunch, TrialSession};

    const SHIPPED: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/replay/curves/synthetic.json"
    );

    fn small() -> Result<CurveSet, String> {
        small_with(|_| {})
    }

    /// A 2 x 2 set, with `edit` applied to its curves before validation.
    fn small_with(edit: impl FnOnce(&mut Vec<Curve>)) -> Result<CurveSet, String> {
        let mut curves = Vec::new();
        for (i, opt) in ["sgd", "adam"].into_iter().enumerate() {
            for (j, depth) in [1, 2].into_iter().enumerate() {
                let base = (i * 2 + j) as f64;
                let mut config = Map::new();
                config.insert("opt".into(), opt.into());
                config.insert("depth".into(), depth.into());
                curves.push(Curve {
                    config,
                    fuel_per_epoch: 100 * (i * 2 + j + 1) as u64,
                    metrics: vec![
                        ("loss".into(), vec![1.0 + base, 0.5 + base, 0.25 + base]),
                        ("acc".into(), vec![0.1, 0.2, 0.3]),
                    ],
                });
            }
        }
        edit(&mut curves);
        CurveSet::new(
            "small",
            "loss",
            Mode::Min,
            3,
            vec![
                ("opt".into(), vec![json!("sgd"), json!("adam")]),
                ("depth".into(), vec![json!(1), json!(2)]),
            ],
            curves,
        )
    }

    #[test]
    fn shipped_file_is_the_generators_output() {
        let generated = CurveSet::synthetic().to_json();
        if std::env::var_os("WTUNE_WRITE_CURVES").is_some() {
            std::fs::write(SHIPPED, &generated).unwrap();
        }
        let shipped = std::fs::read_to_string(SHIPPED).unwrap();
        assert!(
            shipped == generated,
            "{SHIPPED} differs from CurveSet::synthetic(); regenerate it with \
             WTUNE_WRITE_CURVES=1 cargo test -p wtune --lib replay"
        );
        assert!(shipped.len() < 200_000, "{} bytes", shipped.len());
        assert_eq!(
            CurveSet::from_json(&shipped).unwrap(),
            CurveSet::synthetic()
        );
        assert_eq!(
            CurveSet::load(Path::new(SHIPPED)).unwrap(),
            CurveSet::synthetic()
        );
    }

    #[test]
    fn synthetic_optimum_is_the_documented_one_and_the_curves_cross() {
        let set = CurveSet::synthetic();
        assert_eq!((set.curves().len(), set.epochs()), (32, 81));
        let best = set.best_final();
        assert_eq!(
            best.config,
            json!({"lr": 0.03, "width": 128})
                .as_object()
                .unwrap()
                .clone()
        );
        assert_eq!(best.epoch, 81);
        assert!((best.value - 0.218).abs() < 0.01, "{}", best.value);
        let anytime = set.best_anytime();
        assert!(set.mode().better(anytime.value, best.value) || anytime.value == best.value);
        assert!(best.value - anytime.value < 0.01);
        // Epoch 1 ranks the optimum far from the top: a rule that trusts the
        // first epoch stops it.
        let at = |curve: &Curve, epoch: usize| set.objective(curve)[epoch - 1];
        let optimum = set.lookup(&json!({"lr": 0.03, "width": 128})).unwrap();
        let ahead_at_1 = set
            .curves()
            .iter()
            .filter(|c| at(c, 1) < at(optimum, 1))
            .count();
        assert!(ahead_at_1 >= 8, "{ahead_at_1} configs lead at epoch 1");
        let leader_at_1 = set
            .curves()
            .iter()
            .min_by(|a, b| at(a, 1).total_cmp(&at(b, 1)))
            .unwrap();
        assert_eq!(leader_at_1.config["lr"], json!(0.3));
        assert!(at(leader_at_1, 81) > best.value + 0.2);
        // Width costs fuel: the optimum's epoch costs 3x its runner-up's.
        let runner_up = set.lookup(&json!({"lr": 0.03, "width": 64})).unwrap();
        assert_eq!(
            (optimum.fuel_per_epoch, runner_up.fuel_per_epoch),
            (245_760, 81_920)
        );
        assert!(set.regret(&json!({"lr": 0.03, "width": 64})).unwrap() > 0.02);
        assert_eq!(set.regret(&json!({"lr": 0.03, "width": 128})).unwrap(), 0.0);
        assert_eq!(
            set.grid_fuel(),
            8 * 81 * (12_800 + 30_720 + 81_920 + 245_760)
        );
    }

    #[test]
    fn lookup_matches_exactly_and_names_the_valid_values() {
        let set = CurveSet::synthetic();
        let curve = set.lookup(&json!({"width": 64, "lr": 0.001})).unwrap();
        assert_eq!(curve.config["lr"], json!(0.001));
        assert_eq!(curve.config["width"], json!(64));
        // A float width is the same number.
        assert_eq!(
            set.lookup(&json!({"lr": 0.001, "width": 64.0})).unwrap(),
            curve
        );

        let err = set.lookup(&json!({"lr": 0.002, "width": 64})).unwrap_err();
        assert!(err.contains("lr = 0.002 is not tabulated"), "{err}");
        assert!(
            err.contains("valid values: 0.0001, 0.0003, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3"),
            "{err}"
        );
        let err = set.lookup(&json!({"lr": 0.001})).unwrap_err();
        assert!(err.contains("has no `width`"), "{err}");
        assert!(err.contains("indexed by lr, width"), "{err}");
        let err = set
            .lookup(&json!({"lr": 0.001, "width": 64, "depth": 2}))
            .unwrap_err();
        assert!(err.contains("`depth` is not a parameter"), "{err}");
        let err = set.lookup(&json!([0.001, 64])).unwrap_err();
        assert!(
            err.contains("must be a JSON object with lr, width"),
            "{err}"
        );
        let err = set
            .lookup(&json!({"lr": "0.001", "width": 64}))
            .unwrap_err();
        assert!(err.contains("lr = \"0.001\" is not tabulated"), "{err}");
    }

    #[test]
    fn validation_errors_say_what_is_wrong() {
        let ok = small().unwrap();
        assert_eq!(
            ok.lookup(&json!({"opt": "adam", "depth": 1}))
                .unwrap()
                .fuel_per_epoch,
            300
        );

        let err = small_with(|c| c[2].metrics.retain(|(n, _)| n != "loss")).unwrap_err();
        assert!(
            err.contains("curve 2 (opt=\"adam\", depth=1) has no `loss` values"),
            "{err}"
        );
        let err = small_with(|c| {
            c[1].metrics[1].1.pop();
        })
        .unwrap_err();
        assert!(err.contains("curve 1 (opt=\"sgd\", depth=2) has 2 values of acc, expected 3"));
        assert!(err.contains("ragged"), "{err}");
        let err = small_with(|c| c[3].metrics[0].1[1] = f64::NAN).unwrap_err();
        assert!(
            err.contains("curve 3 (opt=\"adam\", depth=2): loss at epoch 2 is NaN"),
            "{err}"
        );
        let err = small_with(|c| c[3].metrics[0].1[0] = f64::INFINITY).unwrap_err();
        assert!(err.contains("is inf"), "{err}");
        let err = small_with(|c| {
            c.pop();
        })
        .unwrap_err();
        assert!(
            err.contains("the grid 2 x 2 has 4 configurations but the set has 3"),
            "{err}"
        );
        let err = small_with(|c| c[3].config = c[0].config.clone()).unwrap_err();
        assert!(err.contains("curve 3 (opt=\"sgd\", depth=1) repeats the config of curve 0"));
        let err = small_with(|c| {
            c[1].config.insert("depth".into(), json!(3));
        })
        .unwrap_err();
        assert!(err.contains("depth = 3 is not tabulated"), "{err}");
        let err = small_with(|c| c[0].metrics[1].0 = "epoch".into()).unwrap_err();
        assert!(err.contains("`epoch` is reserved"), "{err}");
        let err = small_with(|c| c[0].metrics.swap(0, 1)).unwrap_err();
        assert!(err.contains("curve 1 (opt=\"sgd\", depth=2) has the metrics [loss, acc]"));

        let text = small().unwrap().to_json();
        let err = CurveSet::from_json(&text.replace("[1.0,", "[null,")).unwrap_err();
        assert!(
            err.contains("loss at epoch 1 is null, not a number"),
            "{err}"
        );
        let err = CurveSet::from_json(&text.replace("[1.0,", "[NaN,")).unwrap_err();
        assert!(err.contains("JSON has no NaN"), "{err}");
        let err = CurveSet::from_json(&text.replace("\"epochs\": 3", "\"epochs\": 4")).unwrap_err();
        assert!(err.contains("expected 4 (epochs)"), "{err}");
        let stated = "\"anytime\": {\"config\": {\"opt\": \"sgd\", \"depth\": 1}, \"epoch\": 3";
        assert!(text.contains(stated), "{text}");
        let err =
            CurveSet::from_json(&text.replace(stated, &stated.replace('3', "2"))).unwrap_err();
        assert!(err.contains("optimum.anytime says"), "{err}");
        let err = CurveSet::from_json(&text.replace("\"metric\": \"loss\"", "\"metric\": \"f1\""))
            .unwrap_err();
        assert!(err.contains("has no `f1` values, the set's metric (it has: loss, acc)"));
        let err = CurveSet::from_slice(b"{\"name\": 3}").unwrap_err();
        assert!(err.starts_with("not a curve set: "), "{err}");
    }

    #[test]
    fn json_round_trips_and_param_space_generates_table_configs() {
        let set = small().unwrap().with_description("four configs");
        assert_eq!(CurveSet::from_json(&set.to_json()).unwrap(), set);
        let synthetic = CurveSet::synthetic();

        let grid = SearchSpace::from_json(&synthetic.param_space(Sampling::Grid)).unwrap();
        let configs = grid.generate(1, 0).unwrap();
        assert_eq!(configs.len(), 32);
        let mut seen: Vec<&Curve> = configs
            .iter()
            .map(|c| synthetic.lookup(c).unwrap())
            .collect();
        seen.dedup();
        assert_eq!(seen.len(), 32, "the grid runs every configuration once");

        let choice = SearchSpace::from_json(&synthetic.param_space(Sampling::Choice)).unwrap();
        let configs = choice.generate(50, 3).unwrap();
        assert_eq!(configs.len(), 50);
        for config in &configs {
            synthetic.lookup(config).unwrap();
        }
    }

    #[test]
    fn native_backend_reports_the_table_and_finishes_at_the_last_epoch() {
        let set = Arc::new(small().unwrap());
        let backend = replay_backend(set.clone());
        let dir = tempfile::tempdir().unwrap();
        let launch = |config: Value, restore| TrialLaunch {
            trial_id: "trial_0000".into(),
            config,
            trial_dir: dir.path().to_path_buf(),
            restore,
            resources: Default::default(),
            gpus: Vec::new(),
        };
        let config = json!({"opt": "adam", "depth": 2});
        let mut session = backend.launch(&launch(config.clone(), None)).unwrap();
        let mut steps = Vec::new();
        for _ in 0..3 {
            steps.push(session.train().unwrap());
        }
        assert_eq!(
            steps[1],
            Step {
                metrics: vec![
                    ("loss".into(), 3.5),
                    ("acc".into(), 0.2),
                    ("epoch".into(), 2.0)
                ],
                done: false,
                fuel: 400,
            }
        );
        assert_eq!(
            steps.iter().map(|s| s.done).collect::<Vec<_>>(),
            [false, false, true]
        );
        assert_eq!(session.fuel_total(), 1200);
        let err = session.train().unwrap_err();
        assert!(
            err.reason
                .contains("epoch 4 is outside the table (epochs 1 to 3)"),
            "{err}"
        );
        assert!(!err.retryable);

        // A checkpoint carries the epoch to another config's curve.
        let mut first = backend.launch(&launch(config.clone(), None)).unwrap();
        first.train().unwrap();
        let path = dir.path().join("checkpoint.ckpt");
        let info = CheckpointInfo {
            trial_id: "trial_0000",
            config: &config,
            iteration: 1,
            time_total_s: 0.0,
            result: None,
        };
        first.save(&path, &info).unwrap();
        let mut moved = backend
            .launch(&launch(json!({"opt": "sgd", "depth": 1}), Some(path)))
            .unwrap();
        assert_eq!(moved.train().unwrap().metrics[0], ("loss".into(), 0.5));

        let err = match backend.launch(&launch(json!({"opt": "rmsprop", "depth": 1}), None)) {
            Err(err) => err,
            Ok(_) => panic!("an unknown config launched"),
        };
        assert!(
            err.reason.contains("valid values: \"sgd\", \"adam\""),
            "{err}"
        );
        assert!(!err.retryable);
    }

    #[test]
    fn optima_follow_the_mode() {
        let min = small().unwrap();
        assert_eq!(min.best_final().value, 0.25);
        assert_eq!(min.best_final().config["opt"], json!("sgd"));
        assert_eq!(min.best_anytime().epoch, 3);
        let curves = min.curves().to_vec();
        let max =
            CurveSet::new("max", "loss", Mode::Max, 3, min.params().to_vec(), curves).unwrap();
        let best = max.best_final();
        assert_eq!((best.epoch, best.value), (3, 3.25));
        let anytime = max.best_anytime();
        assert_eq!((anytime.epoch, anytime.value), (1, 4.0));
        assert_eq!(max.regret(&json!({"opt": "sgd", "depth": 1})).unwrap(), 3.0);
    }

    #[test]
    fn deterministic_exp_is_accurate() {
        for x in [-31.0, -5.5, -1.0, -0.01, 0.0, 0.5, 3.0] {
            let (ours, libm) = (exp(x), f64::exp(x));
            assert!(
                ((ours - libm) / libm).abs() < 1e-12,
                "exp({x}): {ours} vs {libm}"
            );
        }
    }
}
