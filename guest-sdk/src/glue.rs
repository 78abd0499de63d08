//! The code behind [`crate::export!`]: it keeps the one live trainable of this
//! instance in a slot and turns trait calls into the WIT's `result<_, string>`.
//! Public only so the macro's expansion can reach it.

use std::cell::RefCell;
use std::thread::LocalKey;

use crate::Trainable;
use crate::bindings::wtune::trainable::types::Report as WitReport;

/// Where the export macro keeps the instance's trainable.
pub type Slot<T> = LocalKey<RefCell<Option<T>>>;

/// The config, or an error naming the parameter at fault (the JSON is the
/// host's, so its line and column would mean nothing to the user).
fn parse_config<T: Trainable>(config: &str) -> Result<T::Config, String> {
    let value: serde_json::Value = serde_json::from_str(config)
        .map_err(|e| format!("the host sent a config that is not JSON: {e}"))?;
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." {
            format!("invalid config for this trainable: {inner}")
        } else {
            format!("invalid config for this trainable: parameter `{path}`: {inner}")
        }
    })
}

fn with_live<T: Trainable, R>(
    slot: &'static Slot<T>,
    f: impl FnOnce(&mut T) -> Result<R, String>,
) -> Result<R, String> {
    slot.with_borrow_mut(|live| match live.as_mut() {
        Some(trainable) => f(trainable),
        None => Err("setup() has not been called on this instance".to_owned()),
    })
}

pub fn setup<T: Trainable>(slot: &'static Slot<T>, config: String) -> Result<(), String> {
    let config = parse_config::<T>(&config)?;
    let trainable = T::setup(config).map_err(|e| e.to_string())?;
    slot.with_borrow_mut(|live| *live = Some(trainable));
    Ok(())
}

pub fn train<T: Trainable>(slot: &'static Slot<T>) -> Result<WitReport, String> {
    with_live(slot, |t| {
        t.train().map(|r| r.into_wit()).map_err(|e| e.to_string())
    })
}

pub fn save<T: Trainable>(slot: &'static Slot<T>) -> Result<Vec<u8>, String> {
    with_live(slot, |t| t.save().map_err(|e| e.to_string()))
}

pub fn restore<T: Trainable>(slot: &'static Slot<T>, state: Vec<u8>) -> Result<(), String> {
    with_live(slot, |t| t.restore(&state).map_err(|e| e.to_string()))
}

pub fn reset<T: Trainable>(slot: &'static Slot<T>, config: String) -> Result<bool, String> {
    let config = parse_config::<T>(&config)?;
    with_live(slot, |t| t.reset(config).map_err(|e| e.to_string()))
}

pub fn cleanup<T: Trainable>(slot: &'static Slot<T>) {
    if let Some(mut trainable) = slot.with_borrow_mut(Option::take) {
        trainable.cleanup();
    }
}

/// `checkpoint = serde`: the whole trainable is the checkpoint, encoded with
/// postcard (compact, exact for floats including NaN).
pub fn save_serde<T: Trainable + serde::Serialize>(
    slot: &'static Slot<T>,
) -> Result<Vec<u8>, String> {
    with_live(slot, |t| {
        postcard::to_stdvec(t).map_err(|e| format!("save(): serializing state: {e}"))
    })
}

/// The inverse of [`save_serde`].
pub fn restore_serde<T: Trainable + serde::de::DeserializeOwned>(
    slot: &'static Slot<T>,
    state: Vec<u8>,
) -> Result<(), String> {
    with_live(slot, |t| {
        *t = postcard::from_bytes(&state)
            .map_err(|e| format!("restore(): state does not decode: {e}"))?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Report, Result};

    #[derive(serde::Deserialize)]
    #[allow(dead_code)]
    struct Optimizer {
        lr: f64,
        momentum: f64,
    }

    #[derive(serde::Deserialize)]
    #[allow(dead_code)]
    struct Config {
        optimizer: Optimizer,
        layers: Vec<u32>,
    }

    struct Model;

    impl Trainable for Model {
        type Config = Config;
        fn setup(_: Config) -> Result<Self> {
            Ok(Model)
        }
        fn train(&mut self) -> Result<Report> {
            Ok(Report::new())
        }
    }

    fn error(config: &str) -> String {
        parse_config::<Model>(config).err().unwrap()
    }

    #[test]
    fn config_errors_name_the_parameter_not_a_line_and_column() {
        assert_eq!(
            error(r#"{"optimizer": {"lr": 0.1, "momentum": "high"}, "layers": [1]}"#),
            "invalid config for this trainable: parameter `optimizer.momentum`: invalid type: \
             string \"high\", expected f64"
        );
        assert_eq!(
            error(r#"{"optimizer": {"lr": 0.1, "momentum": 0.9}}"#),
            "invalid config for this trainable: missing field `layers`"
        );
        assert_eq!(
            error(r#"{"optimizer": {"lr": 0.1}, "layers": [1]}"#),
            "invalid config for this trainable: parameter `optimizer`: missing field `momentum`"
        );
        assert_eq!(
            error(r#"{"optimizer": {"lr": 0.1, "momentum": 0.9}, "layers": [1, -2]}"#),
            "invalid config for this trainable: parameter `layers[1]`: invalid value: integer \
             `-2`, expected u32"
        );
        assert!(
            parse_config::<Model>(r#"{"optimizer": {"lr": 1, "momentum": 0}, "layers": []}"#)
                .is_ok()
        );
    }
}
