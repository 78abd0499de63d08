//! {{name}}: a trainable for wtune.
//!
//! Logistic regression on a synthetic two-class dataset, trained by
//! mini-batch SGD with an L2 penalty; each `train()` call is one epoch.
//! Replace the data and the model with your own: wtune needs only the
//! `Trainable` implementation and the `export!` line at the bottom.
//!
//! Checkpoints need no code: wtune snapshots the whole guest memory (weights,
//! data and random state together) whenever the experiment checkpoints.

use serde::Deserialize;
use wtune_guest::{Error, Report, Result, Trainable};

/// The hyperparameters, one trial's values from `[param_space]` in
/// experiment.toml. A key the space lacks and that has no `#[serde(default)]`,
/// or a key this type does not have, stops the experiment at its first trials
/// with the parameter's name.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// SGD's step size.
    pub lr: f64,
    /// L2 penalty on the weights.
    #[serde(default)]
    pub l2: f64,
    /// Examples per SGD step.
    #[serde(default = "default_batch_size")]
    pub batch_size: usize,
    /// Seeds the weights' initialization and the shuffling (not the data).
    #[serde(default)]
    pub seed: u64,
}

fn default_batch_size() -> usize {
    32
}

/// Inputs per example.
const FEATURES: usize = 8;
/// Training and validation examples.
const TRAIN: usize = 2000;
const VALID: usize = 500;
/// The data is the same in every trial, so trials differ only by their
/// hyperparameters.
const DATA_SEED: u64 = 0x5eed;

/// One trial's model, data and training state.
pub struct Model {
    config: Config,
    weights: [f64; FEATURES],
    bias: f64,
    train: Dataset,
    valid: Dataset,
    rng: Rng,
}

impl Trainable for Model {
    type Config = Config;

    fn setup(config: Config) -> Result<Self> {
        check(&config)?;
        let mut data_rng = Rng::new(DATA_SEED);
        let truth: [f64; FEATURES] = std::array::from_fn(|_| data_rng.normal());
        let train = Dataset::synthetic(TRAIN, &truth, &mut data_rng);
        let valid = Dataset::synthetic(VALID, &truth, &mut data_rng);
        let mut rng = Rng::new(config.seed);
        let weights = std::array::from_fn(|_| 0.01 * rng.normal());
        let Config {
            lr, l2, batch_size, ..
        } = config;
        wtune_guest::info!("lr {lr} l2 {l2} batch {batch_size}");
        Ok(Model {
            config,
            weights,
            bias: 0.0,
            train,
            valid,
            rng,
        })
    }

    fn train(&mut self) -> Result<Report> {
        let mut order: Vec<usize> = (0..self.train.len()).collect();
        self.rng.shuffle(&mut order);
        for batch in order.chunks(self.config.batch_size) {
            self.step(batch);
        }
        let (train_loss, _) = self.evaluate(&self.train);
        let (val_loss, val_accuracy) = self.evaluate(&self.valid);
        if !val_loss.is_finite() {
            return Err(Error::msg(format!(
                "the loss diverged (lr {} is too large)",
                self.config.lr
            )));
        }
        Ok(Report::new()
            .metric("train_loss", train_loss)
            .metric("val_loss", val_loss)
            .metric("val_accuracy", val_accuracy))
    }

    /// Population based training moves a trial to new hyperparameters on a
    /// copy of a better trial: keep the weights, take the new settings.
    fn reset(&mut self, config: Config) -> Result<bool> {
        check(&config)?;
        self.config = config;
        Ok(true)
    }
}

impl Model {
    /// One SGD step on the examples at `batch`.
    fn step(&mut self, batch: &[usize]) {
        let mut grad = [0.0; FEATURES];
        let mut grad_bias = 0.0;
        for &i in batch {
            let x = &self.train.x[i];
            let error = sigmoid(self.logit(x)) - self.train.y[i];
            for (g, xi) in grad.iter_mut().zip(x) {
                *g += error * xi;
            }
            grad_bias += error;
        }
        let scale = self.config.lr / batch.len() as f64;
        for (w, g) in self.weights.iter_mut().zip(grad) {
            *w -= scale * g + self.config.lr * self.config.l2 * *w;
        }
        self.bias -= scale * grad_bias;
    }

    fn logit(&self, x: &[f64; FEATURES]) -> f64 {
        self.bias + self.weights.iter().zip(x).map(|(w, x)| w * x).sum::<f64>()
    }

    /// Mean log loss and accuracy on `data`.
    fn evaluate(&self, data: &Dataset) -> (f64, f64) {
        let mut loss = 0.0;
        let mut correct = 0;
        for (x, &y) in data.x.iter().zip(&data.y) {
            let p = sigmoid(self.logit(x)).clamp(1e-12, 1.0 - 1e-12);
            loss -= y * p.ln() + (1.0 - y) * (1.0 - p).ln();
            if (p >= 0.5) == (y == 1.0) {
                correct += 1;
            }
        }
        let n = data.len() as f64;
        (loss / n, correct as f64 / n)
    }
}

/// Refuses settings no training can run with, with a reason the trial's
/// error shows.
fn check(config: &Config) -> Result<()> {
    if !(config.lr.is_finite() && config.lr > 0.0) {
        let lr = config.lr;
        return Err(Error::msg(format!("lr must be positive, not {lr}")));
    }
    if config.batch_size == 0 {
        return Err(Error::msg("batch_size must be at least 1"));
    }
    Ok(())
}

fn sigmoid(z: f64) -> f64 {
    1.0 / (1.0 + (-z).exp())
}

/// Labelled examples: Gaussian inputs whose label is drawn with probability
/// `sigmoid(2 * truth . x)`, so no model is right on every example.
struct Dataset {
    x: Vec<[f64; FEATURES]>,
    y: Vec<f64>,
}

impl Dataset {
    fn synthetic(n: usize, truth: &[f64; FEATURES], rng: &mut Rng) -> Self {
        let x: Vec<[f64; FEATURES]> = (0..n)
            .map(|_| std::array::from_fn(|_| rng.normal()))
            .collect();
        let y = x
            .iter()
            .map(|x| {
                let z: f64 = truth.iter().zip(x).map(|(t, x)| t * x).sum();
                f64::from(rng.uniform() < sigmoid(2.0 * z))
            })
            .collect();
        Dataset { x, y }
    }

    fn len(&self) -> usize {
        self.y.len()
    }
}

/// SplitMix64: small, seedable and the same on every machine.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn uniform(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box-Muller).
    fn normal(&mut self) -> f64 {
        let u = 1.0 - self.uniform();
        let v = self.uniform();
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }

    fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, (self.next() % (i as u64 + 1)) as usize);
        }
    }
}

wtune_guest::export!(Model);
