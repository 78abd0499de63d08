//! A trainable that replays tabulated learning curves instead of training,
//! so schedulers can be tested and compared through the real sandbox in
//! seconds, against a known optimum.
//!
//! It embeds `curves/synthetic.json`, the set that
//! `wtune::tune::replay::CurveSet::synthetic()` generates (a host test checks
//! the file is exactly its output; the formula and optimum are in the file's
//! `description` and `optimum`). `wtune::tune::replay_backend` is the same
//! replay as plain Rust; `tests/replay.rs` checks that both report the same
//! numbers.
//!
//! - **Config**: exactly the table's parameters, e.g.
//!   `{"lr": 0.03, "width": 128}`. Values match the table exactly (numbers by
//!   value, so `128` and `128.0` agree; other values by equality), as in
//!   `CurveSet::lookup`: a replay must be a tabulated configuration, so an
//!   untabulated value is an error listing the valid ones, never the nearest
//!   grid point. `experiment.toml` has a space over the table.
//! - **train()**: epoch `n`'s tabulated metrics (`val_loss`) and `epoch = n`;
//!   `done` after the last epoch. Each call burns fuel in proportion to the
//!   table's `fuel_per_epoch` (a loop of that many steps the optimizer cannot
//!   remove), so `fuel_total` tracks the table's cost, and the same on every
//!   machine: fuel counts WebAssembly operations, not time.
//! - **save()/restore()**: the epoch counter only (`{"epoch": n}`), so a
//!   checkpoint restored into an instance set up with another config
//!   continues *that* config's curve from the saved epoch.
//! - **reset(config)**: switches to `config`'s curve and keeps the epoch.
//!   This is what population based training relies on: an exploited trial
//!   keeps its training progress and continues with new hyperparameters.
//!   The `epoch` metric says where on the curve a trial is, since the host's
//!   `training_iteration` restarts after a reset.
//!
//! Build: `cargo build --release --target wasm32-wasip2 -p replay` gives
//! `target/wasm32-wasip2/release/replay.wasm`.

use std::fmt;
use std::hint::black_box;
use std::marker::PhantomData;
use std::sync::OnceLock;

use serde::de::{Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use wtune_guest::{Error, Report, Result, Trainable};

/// The curve set this component replays (JSON, the host's `CurveSet` format).
pub const CURVES_JSON: &str = include_str!("../curves/synthetic.json");

/// The metric added to every report: the tabulated epoch reported.
pub const EPOCH_METRIC: &str = "epoch";

/// The parts of the curve set the replay needs; the rest (description,
/// optimum) is for readers and the host.
#[derive(Deserialize)]
struct Table {
    name: String,
    epochs: u64,
    params: Ordered<Vec<Value>>,
    curves: Vec<TableCurve>,
}

#[derive(Deserialize)]
struct TableCurve {
    config: Map<String, Value>,
    fuel_per_epoch: u64,
    metrics: Ordered<Vec<f64>>,
}

/// A JSON object read in file order: metrics are reported, and parameters
/// listed in errors, in the table's order (guests build serde_json without
/// `preserve_order`, whose maps sort their keys).
struct Ordered<T>(Vec<(String, T)>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Ordered<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Entries<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for Entries<T> {
            type Value = Ordered<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Ordered<T>, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry()? {
                    entries.push(entry);
                }
                Ok(Ordered(entries))
            }
        }
        deserializer.deserialize_map(Entries(PhantomData))
    }
}

/// The embedded table, parsed once per instance (host snapshots carry it).
fn table() -> Result<&'static Table> {
    static TABLE: OnceLock<std::result::Result<Table, String>> = OnceLock::new();
    TABLE
        .get_or_init(|| {
            serde_json::from_str(CURVES_JSON)
                .map_err(|e| format!("the embedded curve set is damaged: {e}"))
        })
        .as_ref()
        .map_err(Error::msg)
}

/// Numbers are equal by value (an integer width matches a float one),
/// anything else only when identical: the host's rule.
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

impl Table {
    fn param_names(&self) -> String {
        let names: Vec<&str> = self.params.0.iter().map(|(n, _)| n.as_str()).collect();
        names.join(", ")
    }

    /// The index of `config`'s curve, or why there is none.
    fn lookup(&self, config: &Map<String, Value>) -> Result<usize> {
        if let Some(key) = config
            .keys()
            .find(|key| !self.params.0.iter().any(|(name, _)| name == *key))
        {
            return Err(Error::msg(format!(
                "config key `{key}` is not a parameter of the curve set `{}` (its parameters: {})",
                self.name,
                self.param_names()
            )));
        }
        for (name, values) in &self.params.0 {
            let value = config.get(name).ok_or_else(|| {
                Error::msg(format!(
                    "config has no `{name}`; the curve set `{}` is indexed by {}",
                    self.name,
                    self.param_names()
                ))
            })?;
            if !values.iter().any(|v| same(v, value)) {
                let valid: Vec<String> = values.iter().map(Value::to_string).collect();
                return Err(Error::msg(format!(
                    "{name} = {value} is not tabulated in the curve set `{}`; valid values: {} \
                     (matched exactly: the table holds no other configurations)",
                    self.name,
                    valid.join(", ")
                )));
            }
        }
        self.curves
            .iter()
            .position(|curve| {
                self.params.0.iter().all(|(name, _)| {
                    curve
                        .config
                        .get(name)
                        .is_some_and(|v| same(v, &config[name]))
                })
            })
            .ok_or_else(|| {
                Error::msg(format!(
                    "the curve set `{}` has no curve for this config (the table is incomplete)",
                    self.name
                ))
            })
    }
}

/// Work proportional to `units` that the optimizer can neither remove nor
/// shorten: `black_box` hides every intermediate value, so the loop has no
/// closed form and cannot be vectorized.
fn burn(units: u64) -> u64 {
    let mut acc: u64 = 0;
    for i in 0..units {
        acc = black_box(acc.wrapping_add(i)).rotate_left(1);
    }
    acc
}

/// A guest checkpoint: where on the curve the trial is, nothing about which
/// curve (see the crate docs).
#[derive(Serialize, Deserialize)]
struct Saved {
    epoch: u64,
}

/// One replayed trial: which curve, and how many epochs it has reported.
#[derive(Debug)]
pub struct Replay {
    curve: usize,
    epoch: u64,
}

impl Replay {
    /// The tabulated epoch last reported (0 before the first `train()`).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }
}

impl Trainable for Replay {
    type Config = Map<String, Value>;

    fn setup(config: Self::Config) -> Result<Self> {
        let table = table()?;
        let curve = table.lookup(&config)?;
        // The log is a host import: native unit tests have no host.
        #[cfg(target_arch = "wasm32")]
        wtune_guest::info!(
            "replaying curve {curve} of the curve set `{}` ({} epochs)",
            table.name,
            table.epochs
        );
        Ok(Replay { curve, epoch: 0 })
    }

    fn train(&mut self) -> Result<Report> {
        let table = table()?;
        let epoch = self.epoch + 1;
        if epoch > table.epochs {
            return Err(Error::msg(format!(
                "epoch {epoch} is outside the table (epochs 1 to {}): the trial reported done \
                 at the last epoch",
                table.epochs
            )));
        }
        let curve = &table.curves[self.curve];
        black_box(burn(curve.fuel_per_epoch));
        let mut report = Report::new();
        for (name, values) in &curve.metrics.0 {
            let value = values.get(epoch as usize - 1).ok_or_else(|| {
                Error::msg(format!(
                    "the embedded table has no {name} for epoch {epoch} (it is ragged)"
                ))
            })?;
            report = report.metric(name.clone(), *value);
        }
        self.epoch = epoch;
        Ok(report
            .metric(EPOCH_METRIC, epoch as f64)
            .done(epoch == table.epochs))
    }

    fn save(&self) -> Result<Vec<u8>> {
        Ok(serde_json::to_vec(&Saved { epoch: self.epoch })?)
    }

    fn restore(&mut self, state: &[u8]) -> Result<()> {
        let saved: Saved = serde_json::from_slice(state)
            .map_err(|e| Error::from(e).context("not a replay checkpoint"))?;
        let epochs = table()?.epochs;
        if saved.epoch > epochs {
            return Err(Error::msg(format!(
                "the checkpoint is at epoch {}, past the table's last epoch {epochs}",
                saved.epoch
            )));
        }
        self.epoch = saved.epoch;
        Ok(())
    }

    fn reset(&mut self, config: Self::Config) -> Result<bool> {
        self.curve = table()?.lookup(&config)?;
        Ok(true)
    }
}

wtune_guest::export!(Replay);

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn config(value: Value) -> Map<String, Value> {
        value.as_object().unwrap().clone()
    }

    fn val_loss(report: &Report) -> f64 {
        report.metrics()[0].1
    }

    fn tabulated(lr: f64, width: u64, epoch: usize) -> f64 {
        let table = table().unwrap();
        let index = table
            .lookup(&config(json!({"lr": lr, "width": width})))
            .unwrap();
        table.curves[index].metrics.0[0].1[epoch - 1]
    }

    #[test]
    fn reports_the_table_in_order_and_finishes_at_the_last_epoch() {
        let mut replay = Replay::setup(config(json!({"lr": 0.03, "width": 128.0}))).unwrap();
        let reports: Vec<Report> = (0..81).map(|_| replay.train().unwrap()).collect();
        let names: Vec<&str> = reports[0]
            .metrics()
            .iter()
            .map(|(n, _)| n.as_str())
            .collect();
        assert_eq!(names, ["val_loss", "epoch"]);
        assert_eq!(val_loss(&reports[9]), tabulated(0.03, 128, 10));
        assert_eq!(reports[9].metrics()[1].1, 10.0);
        assert!(reports[..80].iter().all(|r| !r.is_done()));
        assert!(reports[80].is_done());
        let err = replay.train().unwrap_err();
        assert!(
            err.message().contains("epoch 82 is outside the table"),
            "{err}"
        );
    }

    #[test]
    fn untabulated_configs_name_the_valid_values() {
        let err = Replay::setup(config(json!({"lr": 0.02, "width": 64}))).unwrap_err();
        assert!(
            err.message().contains("lr = 0.02 is not tabulated"),
            "{err}"
        );
        assert!(
            err.message().contains("valid values: 0.0001, 0.0003"),
            "{err}"
        );
        let err = Replay::setup(config(json!({"lr": 0.01}))).unwrap_err();
        assert!(err.message().contains("indexed by lr, width"), "{err}");
        let err = Replay::setup(config(json!({"lr": 0.01, "width": 64, "x": 1}))).unwrap_err();
        assert!(err.message().contains("`x` is not a parameter"), "{err}");
    }

    #[test]
    fn checkpoints_keep_the_epoch_and_reset_switches_the_curve() {
        let mut a = Replay::setup(config(json!({"lr": 0.1, "width": 16}))).unwrap();
        for _ in 0..5 {
            a.train().unwrap();
        }
        let state = a.save().unwrap();
        let mut b = Replay::setup(config(json!({"lr": 0.001, "width": 32}))).unwrap();
        b.restore(&state).unwrap();
        assert_eq!(b.epoch(), 5);
        assert_eq!(val_loss(&b.train().unwrap()), tabulated(0.001, 32, 6));

        assert!(a.reset(config(json!({"lr": 0.3, "width": 64}))).unwrap());
        assert_eq!(val_loss(&a.train().unwrap()), tabulated(0.3, 64, 6));

        let err = a.restore(br#"{"epoch": 90}"#).unwrap_err();
        assert!(
            err.message().contains("past the table's last epoch 81"),
            "{err}"
        );
        assert!(a.restore(b"garbage").is_err());
    }

    #[test]
    fn burning_depends_on_every_step() {
        assert_eq!(burn(0), 0);
        assert_eq!(burn(3), 8);
        assert_ne!(burn(1000), burn(1001));
    }
}
