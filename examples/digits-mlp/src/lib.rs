//! # digits-mlp: the wtune example trainable
//!
//! A one-hidden-layer MLP on the UCI optical digits (1797 8x8 images, see
//! `data/README.md`), tuned by `experiment.toml` next to this crate. Each
//! `train()` call is one epoch of minibatch SGD and reports `train_loss`,
//! `val_loss` and `val_accuracy` on a fixed, stratified 20% validation split.
//! It never reports `done`: the experiment's stop criteria end the trial.
//!
//! ## Config
//!
//! Every key is optional:
//!
//! ```json
//! {"lr": 0.05, "hidden": 32, "batch_size": 32, "momentum": 0.9,
//!  "weight_decay": 1e-4, "seed": 0, "split_seed": 1998, "data_dir": "/data/digits",
//!  "math": "wasm"}
//! ```
//!
//! `math = "host"` runs the network's products, activations and updates on
//! the host's compute interface ([`host`]): a GPU where the experiment has
//! one, else the host's native CPU kernels, charged in fuel by their work.
//!
//! `hidden`, `batch_size` and the seeds also accept whole numbers written as
//! floats (`32.0`), as quantised search spaces produce. Keys the trainable
//! does not use are ignored with a warning in the trial's log.
//!
//! ## Data
//!
//! `setup()` reads `{data_dir}/digits.csv`, so the experiment must grant the
//! data directory: `[data] digits = "data"` mounts it at `/data/digits`.
//!
//! Build with `cargo build --release --target wasm32-wasip2 -p digits-mlp`.
//! The model itself is the platform-independent [`model`] module.

pub mod host;
pub mod model;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::{self, IgnoredAny, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use wtune_guest::{Error, Report, Result, Trainable};

use host::{HostMlp, OnDevice};
use model::{Dataset, Mlp, Sgd};

/// The largest accepted `hidden` width.
pub const MAX_HIDDEN: usize = 4096;
/// The data file's name inside `data_dir`.
pub const DATA_FILE: &str = "digits.csv";

/// Where the network's math runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Math {
    /// Plain Rust in the guest, metered instruction by instruction.
    #[default]
    Wasm,
    /// Host kernels through the `compute` interface, metered by their work.
    Host,
}

/// A trial's hyperparameters (see the crate docs for the JSON form).
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct Config {
    /// SGD step size; positive and finite.
    pub lr: f64,
    /// Hidden ReLU units, `1..=4096`.
    #[serde(deserialize_with = "whole_number")]
    pub hidden: usize,
    /// Examples per update; at least 1.
    #[serde(deserialize_with = "whole_number")]
    pub batch_size: usize,
    /// Momentum coefficient, in `[0, 1)`.
    pub momentum: f64,
    /// L2 penalty on the weights; non-negative and finite.
    pub weight_decay: f64,
    /// Seeds the initial weights and the order of each epoch.
    #[serde(deserialize_with = "whole_number")]
    pub seed: u64,
    /// Seeds the train/validation split; leave it at its default so every
    /// trial is scored on the same validation set.
    #[serde(deserialize_with = "whole_number")]
    pub split_seed: u64,
    /// The directory holding `digits.csv`.
    pub data_dir: String,
    /// Where the math runs: `"wasm"` (in the guest, the default) or
    /// `"host"` (the host's compute interface: a GPU, or its CPU kernels).
    pub math: Math,
    /// Keys this trainable does not use, kept only to warn about them.
    #[serde(flatten)]
    pub unknown: BTreeMap<String, IgnoredAny>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            lr: 0.05,
            hidden: 32,
            batch_size: 32,
            momentum: 0.9,
            weight_decay: 1e-4,
            seed: 0,
            split_seed: model::DEFAULT_SPLIT_SEED,
            data_dir: "/data/digits".to_owned(),
            math: Math::Wasm,
            unknown: BTreeMap::new(),
        }
    }
}

impl Config {
    /// Checks every value's range, naming the offending key.
    pub fn validate(&self) -> Result<()> {
        if !(self.lr > 0.0 && self.lr.is_finite()) {
            return Err(invalid("lr", "must be a positive, finite number", self.lr));
        }
        if !(1..=MAX_HIDDEN).contains(&self.hidden) {
            return Err(invalid("hidden", "must be between 1 and 4096", self.hidden));
        }
        if self.batch_size == 0 {
            return Err(invalid("batch_size", "must be at least 1", self.batch_size));
        }
        if !(0.0..1.0).contains(&self.momentum) {
            return Err(invalid("momentum", "must be in [0, 1)", self.momentum));
        }
        if !(self.weight_decay >= 0.0 && self.weight_decay.is_finite()) {
            return Err(invalid(
                "weight_decay",
                "must be a non-negative, finite number",
                self.weight_decay,
            ));
        }
        Ok(())
    }

    /// The optimiser settings (the model computes in `f32`).
    pub fn sgd(&self) -> Sgd {
        Sgd {
            lr: self.lr as f32,
            momentum: self.momentum as f32,
            weight_decay: self.weight_decay as f32,
            batch_size: self.batch_size,
        }
    }

    /// Where `setup()` reads the data.
    pub fn data_path(&self) -> PathBuf {
        Path::new(&self.data_dir).join(DATA_FILE)
    }
}

fn invalid(key: &str, rule: &str, value: impl fmt::Display) -> Error {
    Error::msg(format!("invalid config: {key} {rule}, got {value}"))
}

/// Deserializes a non-negative whole number given either as an integer or as
/// an integral float: search spaces such as `quniform` yield `32.0`.
fn whole_number<'de, D, T>(deserializer: D) -> std::result::Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<u64>,
{
    struct WholeNumber;

    impl Visitor<'_> for WholeNumber {
        type Value = u64;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a non-negative whole number")
        }

        fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<u64, E> {
            Ok(v)
        }

        fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<u64, E> {
            u64::try_from(v).map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &self))
        }

        fn visit_f64<E: de::Error>(self, v: f64) -> std::result::Result<u64, E> {
            // 2^53: beyond it not every whole number is representable.
            let exact = v.fract() == 0.0 && (0.0..=9_007_199_254_740_992.0).contains(&v);
            if exact {
                Ok(v as u64)
            } else {
                Err(E::invalid_value(de::Unexpected::Float(v), &self))
            }
        }
    }

    let value = deserializer.deserialize_any(WholeNumber)?;
    T::try_from(value).map_err(|_| de::Error::custom(format!("{value} is out of range")))
}

/// Reads and parses the data file, with errors that say what to fix.
pub fn load_dataset(path: &Path) -> Result<Dataset> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Error::msg(format!(
            "cannot read {}: {e} (the experiment must grant the data directory, \
             e.g. `[data] digits = \"data\"`, which mounts it at /data/digits)",
            path.display()
        ))
    })?;
    Dataset::parse_csv(&text).map_err(|e| Error::msg(format!("{}: {e}", path.display())))
}

/// The trainable: the data split, the network and its optimiser settings.
/// The whole value is the checkpoint (`checkpoint = serde`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DigitsMlp {
    train: Dataset,
    val: Dataset,
    model: Mlp,
    sgd: Sgd,
    math: Math,
    /// The network on the host's device with `math = "host"`; made from
    /// `model` at the first epoch (and again after a guest restore), which
    /// it keeps current.
    #[serde(skip)]
    host: OnDevice,
}

impl DigitsMlp {
    /// Validates `config`, loads the data and builds the model. Unlike
    /// [`Trainable::setup`] it logs nothing, so it also runs natively.
    pub fn from_config(config: &Config) -> Result<Self> {
        config.validate()?;
        let data = load_dataset(&config.data_path())?;
        Ok(Self::from_dataset(&data, config))
    }

    /// Splits `data` and builds the model; `config` must be valid.
    pub fn from_dataset(data: &Dataset, config: &Config) -> Self {
        let (train, val) = data.stratified_split(model::VALIDATION_FRACTION, config.split_seed);
        Self {
            train,
            val,
            model: Mlp::new(config.hidden, config.seed),
            sgd: config.sgd(),
            math: config.math,
            host: OnDevice::default(),
        }
    }

    /// The network being trained.
    pub fn model(&self) -> &Mlp {
        &self.model
    }
}

impl Trainable for DigitsMlp {
    type Config = Config;

    fn setup(config: Config) -> Result<Self> {
        let trainable = Self::from_config(&config)?;
        if !config.unknown.is_empty() {
            let keys: Vec<&str> = config.unknown.keys().map(String::as_str).collect();
            wtune_guest::warn!(
                "ignoring config keys digits-mlp does not use: {}",
                keys.join(", ")
            );
        }
        wtune_guest::info!(
            "digits: {} examples ({} train, {} validation); hidden width {} ({} parameters)",
            trainable.train.len() + trainable.val.len(),
            trainable.train.len(),
            trainable.val.len(),
            trainable.model.hidden(),
            trainable.model.parameter_count(),
        );
        Ok(trainable)
    }

    fn train(&mut self) -> Result<Report> {
        let (train_loss, val) = match self.math {
            Math::Wasm => {
                let loss = self.model.train_epoch(&self.train, &self.sgd);
                (loss, self.model.evaluate(&self.val))
            }
            Math::Host => {
                let host = match &mut self.host.0 {
                    Some(host) => host,
                    None => self
                        .host
                        .0
                        .insert(HostMlp::upload(&self.model, self.sgd.batch_size)?),
                };
                let loss = host.train_epoch(&mut self.model, &self.train, &self.sgd)?;
                (loss, host.evaluate(&self.val)?)
            }
        };
        // Weights that have overflowed stay NaN, so say so now rather than
        // report meaningless metrics until the stop criteria fire.
        if !train_loss.is_finite() {
            return Err(Error::msg(format!(
                "training diverged (train loss {train_loss}); lower lr or momentum"
            )));
        }
        Ok(Report::new()
            .metric("train_loss", train_loss)
            .metric("val_loss", val.loss)
            .metric("val_accuracy", val.accuracy))
    }

    /// Takes new optimiser settings (lr, momentum, weight decay, batch
    /// size) and keeps the weights and the data split: what population
    /// based training needs after cloning a better trial. A different
    /// width would be a different network, so it is refused (`Ok(false)`);
    /// `seed`, `split_seed` and `data_dir` only shape `setup` and change
    /// nothing here.
    fn reset(&mut self, config: Config) -> Result<bool> {
        config.validate()?;
        if config.hidden != self.model.hidden() {
            return Ok(false);
        }
        self.sgd = config.sgd();
        Ok(true)
    }
}

wtune_guest::export!(DigitsMlp, checkpoint = serde);

#[cfg(test)]
mod tests {
    use super::*;
    use serde::de::value::{
        Error as ValueError, F64Deserializer, I64Deserializer, MapDeserializer,
    };

    fn shipped() -> Config {
        Config {
            data_dir: concat!(env!("CARGO_MANIFEST_DIR"), "/data").to_owned(),
            ..Config::default()
        }
    }

    fn metric(report: &Report, name: &str) -> f64 {
        report
            .metrics()
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| *v)
            .unwrap_or_else(|| panic!("no metric {name}"))
    }

    #[test]
    fn reset_switches_optimiser_settings_and_keeps_the_weights() {
        let mut trainable = DigitsMlp::from_config(&shipped()).unwrap();
        trainable.train().unwrap();
        let before = trainable.model().evaluate(&trainable.val);
        let faster = Config {
            lr: 0.2,
            momentum: 0.5,
            ..shipped()
        };
        assert!(trainable.reset(faster).unwrap());
        assert_eq!((trainable.sgd.lr, trainable.sgd.momentum), (0.2, 0.5));
        assert_eq!(trainable.model().evaluate(&trainable.val), before);
        let wider = Config {
            hidden: 64,
            ..shipped()
        };
        assert!(!trainable.reset(wider).unwrap());
        let broken = Config {
            lr: -1.0,
            ..shipped()
        };
        assert!(trainable.reset(broken).is_err());
    }

    #[test]
    fn an_empty_config_gets_the_documented_defaults() {
        let empty = MapDeserializer::<_, ValueError>::new(std::iter::empty::<(&str, u64)>());
        let c = Config::deserialize(empty).unwrap();
        assert_eq!((c.lr, c.hidden, c.batch_size), (0.05, 32, 32));
        assert_eq!((c.momentum, c.weight_decay, c.seed), (0.9, 1e-4, 0));
        assert_eq!(c.data_path(), Path::new("/data/digits/digits.csv"));
        assert!(c.validate().is_ok());
    }

    #[test]
    fn float_counts_and_unknown_keys_are_accepted() {
        let entries = [("lr", 0.1), ("hidden", 64.0), ("dropout", 0.5)];
        let c = Config::deserialize(MapDeserializer::<_, ValueError>::new(entries.into_iter()))
            .unwrap();
        assert_eq!((c.lr, c.hidden, c.batch_size), (0.1, 64, 32));
        assert_eq!(c.unknown.keys().collect::<Vec<_>>(), ["dropout"]);
    }

    #[test]
    fn whole_numbers_may_be_written_as_floats() {
        let parse = |v: f64| whole_number::<_, usize>(F64Deserializer::<ValueError>::new(v));
        assert_eq!(parse(64.0).unwrap(), 64);
        assert!(
            parse(64.5)
                .unwrap_err()
                .to_string()
                .contains("whole number")
        );
        assert!(parse(-1.0).is_err());
        let negative = whole_number::<_, u64>(I64Deserializer::<ValueError>::new(-3));
        assert!(negative.is_err());
    }

    #[test]
    fn out_of_range_values_are_rejected_by_name() {
        /// Puts one value out of range.
        type Breaker = fn(&mut Config);
        let cases: [(Breaker, &str); 9] = [
            (|c| c.lr = 0.0, "lr must be"),
            (|c| c.lr = f64::NAN, "lr must be"),
            (|c| c.lr = f64::INFINITY, "lr must be"),
            (|c| c.hidden = 0, "hidden must be between 1 and 4096, got 0"),
            (|c| c.hidden = 4097, "hidden must be"),
            (|c| c.batch_size = 0, "batch_size must be at least 1"),
            (|c| c.momentum = 1.0, "momentum must be in [0, 1)"),
            (|c| c.momentum = -0.1, "momentum must be"),
            (|c| c.weight_decay = -1e-4, "weight_decay must be"),
        ];
        for (break_it, expected) in cases {
            let mut config = Config::default();
            break_it(&mut config);
            let err = config.validate().unwrap_err().to_string();
            assert!(err.contains(expected), "{err:?} lacks {expected:?}");
        }
    }

    #[test]
    fn a_missing_data_directory_names_the_path_and_the_grant() {
        let config = Config {
            data_dir: "/definitely/not/granted".to_owned(),
            ..Config::default()
        };
        let err = DigitsMlp::from_config(&config).unwrap_err().to_string();
        assert!(err.contains("/definitely/not/granted/digits.csv"), "{err}");
        assert!(err.contains("must grant the data directory"), "{err}");
    }

    #[test]
    fn the_same_seed_trains_identically() {
        let run = |seed| {
            let mut t = DigitsMlp::from_config(&Config { seed, ..shipped() }).unwrap();
            let report = t.train().unwrap();
            (t.model, report)
        };
        let (a, report_a) = run(4);
        let (b, report_b) = run(4);
        assert_eq!(a, b);
        assert_eq!(report_a, report_b);
        let (c, _) = run(5);
        assert_ne!(a, c);
    }

    #[test]
    fn a_copy_of_the_state_resumes_exactly() {
        let mut original = DigitsMlp::from_config(&shipped()).unwrap();
        original.train().unwrap();
        let mut copy = original.clone();
        assert_eq!(original.train().unwrap(), copy.train().unwrap());
    }

    #[test]
    fn divergence_ends_the_trial_with_advice() {
        let config = Config {
            lr: 1e4,
            ..shipped()
        };
        let mut t = DigitsMlp::from_config(&config).unwrap();
        let err = (0..3)
            .find_map(|_| t.train().err())
            .expect("lr = 1e4 diverges");
        assert!(err.to_string().contains("training diverged"), "{err}");
    }

    #[test]
    fn sensible_settings_learn_the_digits() {
        let mut t = DigitsMlp::from_config(&shipped()).unwrap();
        let reports: Vec<Report> = (0..15).map(|_| t.train().unwrap()).collect();
        let first = &reports[0];
        let last = &reports[14];
        assert!(metric(last, "train_loss") < metric(first, "train_loss"));
        let accuracy = metric(last, "val_accuracy");
        assert!(accuracy >= 0.93, "validation accuracy {accuracy}");
        assert_eq!(
            last.metrics()
                .iter()
                .map(|(n, _)| n.as_str())
                .collect::<Vec<_>>(),
            ["train_loss", "val_loss", "val_accuracy"]
        );
        assert!(!last.is_done());
    }
}
