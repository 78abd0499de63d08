//! The experiment file (`experiment.toml`) and command-line overrides,
//! turned into a validated [`Plan`]. Every mistake gets a one-line error
//! naming the key and what is expected.
//!
//! Paths inside the file are relative to the file's directory; paths given
//! on the command line are relative to the current directory.
//!
//! [`plan`] reads as a list of steps, one file each: `file` (the file as
//! written), `objective`, `decisions`, `sandbox`, `resources`, `policies`
//! and `paths`; [`Overrides`] is what the command line says over the file.

mod decisions;
mod error;
mod file;
mod objective;
mod overrides;
mod paths;
mod plan;
mod policies;
mod resources;
mod sandbox;
#[cfg(test)]
mod tests;
mod tracking;

pub use decisions::{DEFAULT_ITERATIONS, stop_flags};
pub use error::ConfigError;
pub use overrides::Overrides;
pub use paths::LOCK_FILE;
pub use plan::{Plan, check_keys, check_value_keys, plan, plan_value, searcher};
pub use sandbox::{allowlist, resumed_limits};
pub use tracking::{MlflowTarget, Tracking};
