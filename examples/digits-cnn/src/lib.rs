//! # digits-cnn: a burn 0.22 CNN as a wtune trainable
//!
//! A small convolutional network ([`model::Cnn`]) on the UCI optical digits
//! (8x8 grayscale, 10 classes), written with the burn framework on its
//! pure-Rust `flex` CPU backend with autodiff, and trained with Adam. Each
//! `train()` is one epoch over the training split in shuffled minibatches and
//! reports `train_loss`, `val_loss` and `val_accuracy` on a fixed stratified
//! 20% validation split (the same examples digits-mlp validates on).
//!
//! Where burn computes is the `backend` key:
//! - `"wasm"` (the default): inside the sandbox, metered in fuel as it runs.
//!   Checkpointing is left to host snapshots (`export!(DigitsCnn)` without
//!   `checkpoint = serde`): burn's tensors, the Adam moments and the RNG
//!   states all live in guest memory, so a snapshot captures them with no
//!   code here.
//! - `"host"`: on the host, through `burn_remote::host()`: the model's code
//!   and the tape's bookkeeping stay in the guest, each tensor operation is
//!   sent to the host as data, checked, charged fuel by its work and run
//!   natively. Host snapshots carry the host's tensors too: checkpoints
//!   still need no code.
//!
//! ## Config
//!
//! ```json
//! {"lr": 0.003, "channels": 8, "hidden": 64, "dropout": 0.1, "batch_size": 64,
//!  "weight_decay": 0.0, "seed": 0, "data_dir": "/data/digits", "backend": "wasm"}
//! ```
//!
//! Only `lr` is required. Unknown keys are refused, so a misspelt search
//! space fails at the first trial instead of being silently ignored.
//!
//! Build with `cargo build --release --target wasm32-wasip2`.

pub mod data;
pub mod model;

use std::fmt;
use std::path::Path;

use burn::module::Module;
use burn::nn::loss::{CrossEntropyLoss, CrossEntropyLossConfig};
use burn::optim::decay::WeightDecayConfig;
use burn::optim::{AdamConfig, GradientsParams, ModuleOptimizer};
use burn::tensor::{Device, Tensor};
use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};
use wtune_guest::{Error, Report, Result, Trainable};

use data::{Dataset, SplitMix64};
use model::{Architecture, Cnn};

/// The data file's name inside `data_dir`.
pub const DATA_FILE: &str = "digits.csv";
/// Rows per forward pass when evaluating; bounds activation memory.
const EVAL_BATCH: usize = 512;
/// Largest accepted `channels` / `hidden`: far beyond what 8x8 inputs need,
/// but it keeps a typo from exhausting the sandbox's memory.
const MAX_WIDTH: usize = 1024;

/// A trial's hyperparameters.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Adam step size; positive and finite. Required.
    pub lr: f64,
    /// Channels of the first convolution; the second has twice as many.
    #[serde(default = "default_channels", deserialize_with = "whole_number")]
    pub channels: usize,
    /// Width of the hidden fully connected layer.
    #[serde(default = "default_hidden", deserialize_with = "whole_number")]
    pub hidden: usize,
    /// Dropout probability after the pool and after the hidden layer, `[0, 1)`.
    #[serde(default = "default_dropout")]
    pub dropout: f64,
    /// Examples per Adam step; the epoch's last batch may be smaller.
    #[serde(default = "default_batch_size", deserialize_with = "whole_number")]
    pub batch_size: usize,
    /// L2 penalty added to every gradient (burn's Adam applies it to all
    /// parameters, biases included); 0 turns it off.
    #[serde(default)]
    pub weight_decay: f64,
    /// Seeds the initial weights, the dropout masks and each epoch's order.
    #[serde(default, deserialize_with = "whole_number")]
    pub seed: u64,
    /// The directory holding `digits.csv`.
    #[serde(default = "default_data_dir")]
    pub data_dir: String,
    /// Where burn runs the tensor operations.
    #[serde(default)]
    pub backend: Backend,
}

/// Where a trial's tensor operations run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// burn-flex inside the sandbox.
    #[default]
    Wasm,
    /// The wtune host's burn worker (`burn_remote::host()`).
    Host,
}

impl Backend {
    /// The autodiff device this backend computes on.
    fn device(self) -> Device {
        match self {
            Backend::Wasm => Device::flex().autodiff(),
            Backend::Host => Device::new(burn_remote::host()).autodiff(),
        }
    }
}

fn default_channels() -> usize {
    8
}
fn default_hidden() -> usize {
    64
}
fn default_dropout() -> f64 {
    0.1
}
fn default_batch_size() -> usize {
    64
}
fn default_data_dir() -> String {
    "/data/digits".to_owned()
}

impl Config {
    /// Checks every value's range, naming the offending key. burn panics on
    /// some bad values (a dropout outside `[0, 1)`), so they are caught here.
    pub fn validate(&self) -> Result<()> {
        if !(self.lr > 0.0 && self.lr.is_finite()) {
            return Err(invalid("lr", "must be a positive, finite number", self.lr));
        }
        if !(1..=MAX_WIDTH).contains(&self.channels) {
            return Err(invalid(
                "channels",
                "must be between 1 and 1024",
                self.channels,
            ));
        }
        if !(1..=MAX_WIDTH).contains(&self.hidden) {
            return Err(invalid("hidden", "must be between 1 and 1024", self.hidden));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(invalid("dropout", "must be in [0, 1)", self.dropout));
        }
        if self.batch_size == 0 {
            return Err(invalid("batch_size", "must be at least 1", self.batch_size));
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

    /// The part of the config that shapes the weights.
    pub fn architecture(&self) -> Architecture {
        Architecture {
            channels: self.channels,
            hidden: self.hidden,
        }
    }

    /// Adam with this config's weight decay. The learning rate is not part
    /// of it: burn 0.22 passes it to every `step`.
    fn adam(&self) -> ModuleOptimizer {
        let decay =
            (self.weight_decay > 0.0).then(|| WeightDecayConfig::new(self.weight_decay as f32));
        AdamConfig::new().with_weight_decay(decay).init()
    }
}

fn invalid(key: &str, rule: &str, value: impl fmt::Display) -> Error {
    Error::msg(format!("invalid config: {key} {rule}, got {value}"))
}

/// Accepts a non-negative whole number written as an integer or as an
/// integral float (`64.0`), which quantised search spaces produce.
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
            if v.fract() == 0.0 && (0.0..=9_007_199_254_740_992.0).contains(&v) {
                Ok(v as u64)
            } else {
                Err(E::invalid_value(de::Unexpected::Float(v), &self))
            }
        }
    }

    let value = deserializer.deserialize_any(WholeNumber)?;
    T::try_from(value).map_err(|_| de::Error::custom(format!("{value} is out of range")))
}

/// Reads and parses `{data_dir}/digits.csv`, with errors that say what to fix.
pub fn load_dataset(data_dir: &str) -> Result<Dataset> {
    let path = Path::new(data_dir).join(DATA_FILE);
    let text = std::fs::read_to_string(&path).map_err(|e| {
        Error::msg(format!(
            "cannot read {}: {e} (the experiment must grant the data directory, \
             e.g. `[data] digits = \"data\"`, which mounts it at /data/digits)",
            path.display()
        ))
    })?;
    Dataset::parse_csv(&text).map_err(|e| Error::msg(format!("{}: {e}", path.display())))
}

/// Logs a debug line to the trial's `guest.log`. The SDK's log macros call a
/// host import that exists only inside wtune (natively the binding panics),
/// so native builds (tests, `examples/native_step.rs`) skip the line.
fn log_debug(message: impl FnOnce() -> String) {
    #[cfg(target_family = "wasm")]
    wtune_guest::debug!("{}", message());
    #[cfg(not(target_family = "wasm"))]
    let _ = message;
}

/// The guest's linear memory in MiB (its high-water mark: wasm memory only
/// grows), to size `[limits] memory`; `None` off wasm.
fn linear_memory_mib() -> Option<usize> {
    #[cfg(target_arch = "wasm32")]
    return Some(core::arch::wasm32::memory_size(0) * 65536 / (1 << 20));
    #[cfg(not(target_arch = "wasm32"))]
    None
}

/// Loss and accuracy on a data set.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Evaluation {
    /// Mean softmax cross-entropy (natural log).
    pub loss: f64,
    /// Share of examples whose highest logit is the label.
    pub accuracy: f64,
}

/// The trainable: the data split, the network on the autodiff device, and
/// Adam with its per-parameter moments.
pub struct DigitsCnn {
    train: Dataset,
    val: Dataset,
    model: Cnn,
    optim: ModuleOptimizer,
    loss: CrossEntropyLoss,
    /// The backend's autodiff device: tensors created here record a tape.
    device: Device,
    /// Draws each epoch's order (dropout masks come from burn's own RNG,
    /// seeded from the same `seed` in [`DigitsCnn::from_dataset`]).
    rng: SplitMix64,
    config: Config,
}

impl DigitsCnn {
    /// Validates `config`, loads the data and builds the model. Logs nothing,
    /// so it also runs natively (tests, `examples/native_step.rs`).
    pub fn from_config(config: Config) -> Result<Self> {
        config.validate()?;
        let data = load_dataset(&config.data_dir)?;
        Ok(Self::from_dataset(&data, config))
    }

    /// Splits `data` and builds the model; `config` must be valid.
    pub fn from_dataset(data: &Dataset, config: Config) -> Self {
        let (train, val) = data.stratified_split(data::VALIDATION_FRACTION, data::SPLIT_SEED);
        let device = config.backend.device();
        // burn's flex RNG is process-global (the host's is the trial's);
        // seeding it here makes the initial weights and every later dropout
        // mask a function of `seed`.
        device.seed(config.seed);
        let model = Cnn::new(config.architecture(), config.dropout, &device);
        Self {
            train,
            val,
            model,
            optim: config.adam(),
            loss: CrossEntropyLossConfig::new().init(&device),
            device,
            // A different stream from burn's, so order and masks are independent.
            rng: SplitMix64::new(config.seed ^ 0x5EED_0F0D_E7A1_1CE5),
            config,
        }
    }

    /// The number of trainable parameters.
    pub fn parameter_count(&self) -> usize {
        self.model.num_params()
    }

    /// One epoch of Adam over the training split in a fresh random order.
    /// Returns the mean cross-entropy of the examples, each measured (with
    /// dropout) just before the step its batch contributed to. Fails when
    /// the host refused an operation (`backend = "host"`).
    pub fn train_epoch(&mut self) -> Result<f64> {
        let mut order: Vec<usize> = (0..self.train.len()).collect();
        self.rng.shuffle(&mut order);
        // The losses are summed where they are computed and read once: a
        // read per batch would make the guest wait for the host at every
        // step (`backend = "host"`) instead of recording the next batch
        // while the host runs this one.
        let mut total: Option<Tensor<1>> = None;
        for batch in order.chunks(self.config.batch_size) {
            let (images, labels) = self.train.batch(batch, &self.device);
            let loss = self.loss.forward(self.model.forward(images), labels);
            let weighted = loss.clone().detach().mul_scalar(batch.len() as f32);
            total = Some(match total {
                Some(total) => total + weighted,
                None => weighted,
            });
            let grads = GradientsParams::from_grads(loss.backward(), &self.model);
            // `step` takes the module by value; cloning it only clones
            // reference-counted tensor handles.
            self.model = self.optim.step(self.config.lr, self.model.clone(), grads);
        }
        let total: f32 = match total {
            Some(total) => total.try_into_scalar().map_err(read_error)?,
            None => 0.0,
        };
        Ok(f64::from(total) / self.train.len() as f64)
    }

    /// Loss and accuracy on the validation split. `valid()` gives a copy of
    /// the network without the autodiff tape and with dropout off.
    pub fn evaluate(&self) -> Result<Evaluation> {
        let model = self.model.valid();
        let device = self.device.clone().inner();
        let indices: Vec<usize> = (0..self.val.len()).collect();
        let (mut total_loss, mut correct) = (0.0, 0usize);
        for batch in indices.chunks(EVAL_BATCH) {
            let (images, labels) = self.val.batch(batch, &device);
            let logits = model.forward(images);
            let loss: f32 = self
                .loss
                .forward(logits.clone(), labels)
                .try_into_scalar()
                .map_err(read_error)?;
            total_loss += f64::from(loss) * batch.len() as f64;
            let predicted = logits.argmax(1).try_into_data().map_err(read_error)?;
            let predicted = predicted.convert::<i64>();
            let predicted = predicted.as_slice::<i64>().expect("argmax gives integers");
            correct += batch
                .iter()
                .zip(predicted)
                .filter(|(i, p)| i64::from(self.val.label(**i)) == **p)
                .count();
        }
        Ok(Evaluation {
            loss: total_loss / self.val.len() as f64,
            accuracy: correct as f64 / self.val.len() as f64,
        })
    }
}

/// A tensor read that failed: on the host backend, the first operation the
/// host refused (its reason names the operation and the rule).
fn read_error(error: impl fmt::Display) -> Error {
    Error::msg(format!("burn: {error}"))
}

impl Trainable for DigitsCnn {
    type Config = Config;

    fn setup(config: Config) -> Result<Self> {
        let trainable = Self::from_config(config)?;
        wtune_guest::info!(
            "digits-cnn: {} train / {} validation examples; channels {}, hidden {}, {} parameters",
            trainable.train.len(),
            trainable.val.len(),
            trainable.config.channels,
            trainable.config.hidden,
            trainable.parameter_count(),
        );
        Ok(trainable)
    }

    fn train(&mut self) -> Result<Report> {
        let train_loss = self.train_epoch()?;
        // Diverged weights stay NaN; say so instead of reporting nonsense.
        if !train_loss.is_finite() {
            return Err(Error::msg(format!(
                "training diverged (train loss {train_loss}); lower lr"
            )));
        }
        let val = self.evaluate()?;
        if let Some(mib) = linear_memory_mib() {
            log_debug(|| format!("linear memory after this epoch: {mib} MiB"));
        }
        Ok(Report::new()
            .metric("train_loss", train_loss)
            .metric("val_loss", val.loss)
            .metric("val_accuracy", val.accuracy))
    }

    /// Switches lr, weight decay, dropout and batch size in place, keeping
    /// the weights and Adam's moments: what population based training needs.
    /// The lr is passed per step, so it needs nothing; a new weight decay
    /// needs a new Adam, which takes over the old one's state through its
    /// record. `channels`/`hidden` make a different network and `backend`
    /// puts it elsewhere: `Ok(false)`.
    /// `seed` and `data_dir` only shape `setup` and are kept as they were.
    fn reset(&mut self, config: Config) -> Result<bool> {
        config.validate()?;
        if config.architecture() != self.config.architecture()
            || config.backend != self.config.backend
        {
            return Ok(false);
        }
        if config.weight_decay != self.config.weight_decay {
            let state = self.optim.to_record();
            self.optim = config.adam().load_record(state);
        }
        self.model.set_dropout(config.dropout);
        log_debug(|| {
            format!(
                "reset: lr {}, weight_decay {}, dropout {}, batch_size {}; weights and Adam state kept",
                config.lr, config.weight_decay, config.dropout, config.batch_size
            )
        });
        self.config = Config {
            seed: self.config.seed,
            data_dir: std::mem::take(&mut self.config.data_dir),
            ..config
        };
        Ok(true)
    }
}

wtune_guest::export!(DigitsCnn);

#[cfg(test)]
mod tests {
    use super::*;

    use serde::de::value::{Error as ValueError, MapDeserializer};

    /// burn's flex RNG is process-global and tests run on parallel
    /// threads: one test at a time keeps each one's draws its own.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn shipped(lr: f64) -> Config {
        Config {
            lr,
            channels: 4,
            hidden: 32,
            dropout: 0.1,
            batch_size: 64,
            weight_decay: 0.0,
            seed: 3,
            data_dir: concat!(env!("CARGO_MANIFEST_DIR"), "/../digits-mlp/data").to_owned(),
            backend: Backend::Wasm,
        }
    }

    #[test]
    fn trains_and_resets() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let mut t = DigitsCnn::from_config(shipped(3e-3)).unwrap();
        let first = t.train_epoch().unwrap();
        let second = t.train_epoch().unwrap();
        assert!(second < first, "loss should fall: {first} -> {second}");
        let before = t.evaluate().unwrap();
        assert!(before.accuracy > 0.5, "{before:?}");

        let adam_state = t.optim.to_record().len();
        assert!(adam_state > 0);
        let changed = Config {
            lr: 1e-3,
            weight_decay: 1e-4,
            dropout: 0.2,
            batch_size: 32,
            ..shipped(1e-3)
        };
        assert!(t.reset(changed).unwrap());
        assert_eq!(t.optim.to_record().len(), adam_state, "Adam state kept");
        assert_eq!(t.evaluate().unwrap(), before, "weights kept");
        assert!(t.train_epoch().unwrap().is_finite());

        let wider = Config {
            channels: 8,
            ..shipped(1e-3)
        };
        assert!(!t.reset(wider).unwrap());
        let broken = Config {
            dropout: 1.0,
            ..shipped(1e-3)
        };
        assert!(t.reset(broken).is_err());
    }

    /// Rebuilding Adam for a new weight decay must carry its moments over:
    /// going to another decay and back, then training, has to match a twin
    /// that was never reset. (Dropout 0 draws nothing from burn's RNG, so
    /// the twins see identical updates.)
    #[test]
    fn adam_moments_survive_a_weight_decay_change() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let config = Config {
            dropout: 0.0,
            ..shipped(3e-3)
        };
        let mut plain = DigitsCnn::from_config(config.clone()).unwrap();
        let mut reset = DigitsCnn::from_config(config.clone()).unwrap();
        plain.train_epoch().unwrap();
        reset.train_epoch().unwrap();
        assert_eq!(plain.evaluate().unwrap(), reset.evaluate().unwrap());
        let decayed = Config {
            weight_decay: 1e-2,
            ..config.clone()
        };
        assert!(reset.reset(decayed).unwrap());
        assert!(reset.reset(config).unwrap());
        plain.train_epoch().unwrap();
        reset.train_epoch().unwrap();
        assert_eq!(plain.evaluate().unwrap(), reset.evaluate().unwrap());
    }

    #[test]
    fn only_lr_is_required_and_unknown_keys_are_refused() {
        let parse = |entries: Vec<(&'static str, f64)>| {
            Config::deserialize(MapDeserializer::<_, ValueError>::new(entries.into_iter()))
        };
        let c = parse(vec![("lr", 0.01), ("channels", 4.0)]).unwrap();
        assert_eq!((c.channels, c.hidden, c.batch_size, c.seed), (4, 64, 64, 0));
        assert_eq!((c.dropout, c.weight_decay), (0.1, 0.0));
        assert_eq!(c.data_dir, "/data/digits");
        assert!(parse(vec![("channels", 4.0)]).is_err());
        assert!(parse(vec![("lr", 0.01), ("momentum", 0.9)]).is_err());
        assert!(parse(vec![("lr", 0.01), ("hidden", 1.5)]).is_err());
    }
}
