//! # wtune-guest: write trainables for wtune
//!
//! A trainable is a model that wtune tunes: it is set up with one
//! configuration, then trained one iteration at a time, reporting metrics after
//! each. You write it as an ordinary Rust library crate, implement
//! [`Trainable`], call [`export!`] once, and build it as a WebAssembly
//! component:
//!
//! ```text
//! rustup target add wasm32-wasip2
//! cargo build --release --target wasm32-wasip2
//! wtune run target/wasm32-wasip2/release/my_model.wasm --config experiment.toml
//! ```
//!
//! with `crate-type = ["cdylib"]` in the crate's `[lib]` section.
//!
//! ## Example
//!
//! ```
//! use serde::{Deserialize, Serialize};
//! use wtune_guest::{Report, Result, Trainable};
//!
//! /// Hyperparameters, filled in by wtune from the experiment's search space.
//! #[derive(Deserialize)]
//! struct Config {
//!     lr: f64,
//!     #[serde(default = "default_target")]
//!     target: f64,
//! }
//! fn default_target() -> f64 { 3.0 }
//!
//! /// Gradient descent on (x - target)^2. Deriving Serialize/Deserialize and
//! /// exporting with `checkpoint = serde` gives save()/restore() for free.
//! #[derive(Serialize, Deserialize)]
//! struct Quadratic {
//!     x: f64,
//!     lr: f64,
//!     target: f64,
//! }
//!
//! impl Trainable for Quadratic {
//!     type Config = Config;
//!
//!     fn setup(config: Config) -> Result<Self> {
//!         if !(config.lr > 0.0) {
//!             return Err(wtune_guest::Error::msg("lr must be positive"));
//!         }
//!         wtune_guest::info!("starting with lr = {}", config.lr);
//!         Ok(Quadratic { x: 0.0, lr: config.lr, target: config.target })
//!     }
//!
//!     fn train(&mut self) -> Result<Report> {
//!         self.x -= self.lr * 2.0 * (self.x - self.target);
//!         let loss = (self.x - self.target).powi(2);
//!         Ok(Report::new().metric("loss", loss).done(loss < 1e-12))
//!     }
//! }
//!
//! wtune_guest::export!(Quadratic, checkpoint = serde);
//! # fn main() {}
//! ```
//!
//! ## Heavy math
//! Inside the sandbox every instruction is metered. For matrix products and
//! the other kernels a model spends its time in, use [`compute::Tensor`]: the
//! host runs them natively (charged in fuel by the work done) and keeps the
//! tensors across host snapshots.
//!
//! ## Models written with burn
//! burn 0.22 (its pure-Rust `flex` CPU backend, autodiff and optimizers)
//! builds for wasm32-wasip2 and runs inside the sandbox as it is, metered
//! like any guest code:
//!
//! ```toml
//! burn = { version = "=0.22.1", default-features = false,
//!          features = ["std", "flex", "autodiff", "optim", "simd"] }
//! ```
//!
//! with `-C target-feature=+simd128` for the wasm target (`simd` needs it).
//! Keep the module, the optimizer and the device in the trainable: host
//! snapshots checkpoint all of it with no code, so `export!(Model)` without
//! `checkpoint = serde` is enough. Seed burn's generator in `setup`
//! (`device.seed(..)`) and make the lazily initialised parameters draw
//! their values there, so that a trial's weights depend on its config
//! alone. `reset` can swap the learning rate (passed to each optimizer
//! step) and dropout in place for population based training.
//! `examples/digits-cnn` is a complete one: a CNN with Adam, tuned with
//! ASHA.
//!
//! The same model can have its tensor operations run natively by the host
//! instead: turn on burn's `remote` feature, patch wtune's `burn-remote` in
//! (`[patch.crates-io] burn-remote = { path = ".../guest-sdk/burn-remote" }`)
//! with its `guest` feature, and put the model on
//! `Device::new(burn_remote::host()).autodiff()`. The host checks and charges
//! every operation (see [`burn`]); digits-cnn's `backend = "host"` does this.
//!
//! ## What the host guarantees
//! Each trial runs in its own sandbox: its working directory (`.`) is the
//! trial's own directory, data the experiment grants is mounted read-only under
//! `/data/<name>`, the environment and arguments are empty, and there is no
//! network. `println!` and `eprintln!` go to the trial's `stdout.log` and
//! `stderr.log`. CPU is metered in fuel and memory is capped, so a runaway
//! trainable ends as ERROR with the reason instead of hurting anyone else.

#![warn(missing_docs)]

// The generated bindings name this crate by its public path so that the export
// macro works from trainable crates; this alias makes that path resolve here too.
extern crate self as wtune_guest;

#[doc(hidden)]
pub mod bindings;
pub mod burn;
pub mod compute;
mod error;
#[doc(hidden)]
pub mod glue;
pub mod log;
mod report;

pub use error::{Error, Result};
pub use report::Report;

/// A tunable model. One value of the implementing type lives in each trial's
/// sandbox, from [`Trainable::setup`] to [`Trainable::cleanup`].
pub trait Trainable: Sized + 'static {
    /// The hyperparameters, deserialized from the trial's JSON config. Use
    /// `#[serde(default)]` for parameters the search space may leave out.
    type Config: serde::de::DeserializeOwned;

    /// Builds the model for one configuration. An `Err` ends the trial as
    /// ERROR with its message.
    fn setup(config: Self::Config) -> Result<Self>;

    /// Runs one training iteration (an epoch, a batch, whatever unit the
    /// model reports at) and returns its metrics.
    fn train(&mut self) -> Result<Report>;

    /// Serializes the model's state for a guest-written checkpoint. The
    /// default says it is not supported; export with `checkpoint = serde`
    /// instead of writing this when the type derives `Serialize`.
    fn save(&self) -> Result<Vec<u8>> {
        Err(Error::unsupported("save"))
    }

    /// Replaces the model's state with bytes from [`Trainable::save`]. Called
    /// on an instance already set up with the trial's config.
    fn restore(&mut self, state: &[u8]) -> Result<()> {
        let _ = state;
        Err(Error::unsupported("restore"))
    }

    /// Switches this live instance to new hyperparameters, keeping what it
    /// has learned (weights, optimizer state): population based training
    /// calls it on a restored snapshot of a better trial. Return `Ok(false)`
    /// (the default) when the model cannot switch; then only guest
    /// checkpoints (`save`/`restore`) can start a trial from another
    /// trial's state.
    fn reset(&mut self, config: Self::Config) -> Result<bool> {
        let _ = config;
        Ok(false)
    }

    /// Releases resources before the instance is dropped.
    fn cleanup(&mut self) {}
}

/// Exports a [`Trainable`] as this component's implementation of the
/// `wtune:trainable` world. Call it once, at the crate root.
///
/// - `export!(Model)` uses `Model`'s own `save`/`restore`.
/// - `export!(Model, checkpoint = serde)` saves and restores the whole value
///   through serde; `Model` must derive `Serialize` and `Deserialize`.
///
/// With `checkpoint = serde` every checkpoint holds the whole value, data
/// included. Keep what `setup` loads and never changes (a dataset) out of
/// it, so that checkpoints carry only what training changes. `#[serde(skip)]`
/// is not enough: `restore` replaces the whole value, so a skipped field
/// comes back as its `Default`. Hold such data beside the trainable
/// instead, filled once per instance:
///
/// ```ignore
/// static DATA: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
///
/// fn setup(config: Config) -> Result<Self> {
///     DATA.get_or_init(|| load("/data/digits/digits.csv"));
///     Ok(Model { weights: init(&config), step: 0 }) // only this is saved
/// }
/// ```
///
/// Host snapshots (`checkpoint = "snapshot"` in the experiment, no code in
/// the trainable) hold the guest's whole memory, data included, whatever
/// the trainable does.
#[macro_export]
macro_rules! export {
    ($ty:ty) => {
        $crate::export!(@impl $ty,
            save = $crate::glue::save::<$ty>,
            restore = $crate::glue::restore::<$ty>);
    };
    ($ty:ty, checkpoint = serde) => {
        $crate::export!(@impl $ty,
            save = $crate::glue::save_serde::<$ty>,
            restore = $crate::glue::restore_serde::<$ty>);
    };
    (@impl $ty:ty, save = $save:path, restore = $restore:path) => {
        const _: () = {
            ::std::thread_local! {
                static __WTUNE_SLOT: ::std::cell::RefCell<::std::option::Option<$ty>> =
                    const { ::std::cell::RefCell::new(::std::option::Option::None) };
            }

            struct __WtuneExport;

            impl $crate::bindings::Guest for __WtuneExport {
                fn setup(config: ::std::string::String) -> ::std::result::Result<(), ::std::string::String> {
                    $crate::glue::setup::<$ty>(&__WTUNE_SLOT, config)
                }
                fn train() -> ::std::result::Result<$crate::bindings::Report, ::std::string::String> {
                    $crate::glue::train::<$ty>(&__WTUNE_SLOT)
                }
                fn save() -> ::std::result::Result<::std::vec::Vec<u8>, ::std::string::String> {
                    $save(&__WTUNE_SLOT)
                }
                fn restore(state: ::std::vec::Vec<u8>) -> ::std::result::Result<(), ::std::string::String> {
                    $restore(&__WTUNE_SLOT, state)
                }
                fn reset(config: ::std::string::String) -> ::std::result::Result<bool, ::std::string::String> {
                    $crate::glue::reset::<$ty>(&__WTUNE_SLOT, config)
                }
                fn cleanup() {
                    $crate::glue::cleanup::<$ty>(&__WTUNE_SLOT)
                }
            }

            $crate::bindings::__export_trainable!(__WtuneExport with_types_in $crate::bindings);
        };
    };
}

#[doc(hidden)]
pub mod __private {
    pub use wit_bindgen;
}
