//! The one error type of the configuration: a message for the user.

/// A configuration mistake.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

pub(super) fn bad(message: impl Into<String>) -> ConfigError {
    ConfigError(message.into())
}
