//! Structured logging to the host. Lines land in the trial's `guest.log` with
//! a timestamp and level; use the [`trace!`](crate::trace),
//! [`debug!`](crate::debug), [`info!`](crate::info), [`warn!`](crate::warn)
//! and [`error!`](crate::error) macros, which take `format!` arguments.

use crate::bindings::wtune::trainable::host;
use crate::bindings::wtune::trainable::types::Level as WitLevel;

/// Severity of a log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Very detailed tracing.
    Trace,
    /// Debugging detail.
    Debug,
    /// Normal progress.
    Info,
    /// Something unexpected that the trainable survived.
    Warn,
    /// A failure.
    Error,
}

/// Sends one line to the host's log for this trial.
pub fn log(level: Level, message: &str) {
    let level = match level {
        Level::Trace => WitLevel::Trace,
        Level::Debug => WitLevel::Debug,
        Level::Info => WitLevel::Info,
        Level::Warn => WitLevel::Warn,
        Level::Error => WitLevel::Error,
    };
    host::log(level, message);
}

/// Logs at [`Level::Trace`] with `format!` arguments.
#[macro_export]
macro_rules! trace { ($($arg:tt)*) => { $crate::log::log($crate::log::Level::Trace, &::std::format!($($arg)*)) }; }
/// Logs at [`Level::Debug`] with `format!` arguments.
#[macro_export]
macro_rules! debug { ($($arg:tt)*) => { $crate::log::log($crate::log::Level::Debug, &::std::format!($($arg)*)) }; }
/// Logs at [`Level::Info`] with `format!` arguments.
#[macro_export]
macro_rules! info { ($($arg:tt)*) => { $crate::log::log($crate::log::Level::Info, &::std::format!($($arg)*)) }; }
/// Logs at [`Level::Warn`] with `format!` arguments.
#[macro_export]
macro_rules! warn { ($($arg:tt)*) => { $crate::log::log($crate::log::Level::Warn, &::std::format!($($arg)*)) }; }
/// Logs at [`Level::Error`] with `format!` arguments.
#[macro_export]
macro_rules! error { ($($arg:tt)*) => { $crate::log::log($crate::log::Level::Error, &::std::format!($($arg)*)) }; }
