//! The code behind [`crate::export!`]: it keeps the one live trainable of this
//! instance in a slot and turns trait calls into the WIT's `result<_, string>`.
//! Public only so the macro's expansion can reach it.

use std::cell::RefCell;
use std::thread::LocalKey;

use crate::Trainable;
use crate::bindings::wtune::trainable::types::Report as WitReport;

/// Where the export macro keeps the instance's trainable.
pub type Slot<T> = LocalKey<RefCell<Option<T>>>;

fn parse_config<T: Trainable>(config: &str) -> Result<T::Config, String> {
    serde_json::from_str(config).map_err(|e| format!("invalid config for this trainable: {e}"))
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
