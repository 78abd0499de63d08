//! Why a compute call was refused.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A refused compute call. The guest receives it as the WIT
/// `compute-error` of the same name; nothing was changed by the call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ComputeError {
    /// A buffer or pipeline number the trial does not hold.
    BadHandle(String),
    /// Sizes or shapes that do not fit, or an argument out of range.
    Invalid(String),
    /// A device-memory quota would be exceeded.
    Quota(String),
    /// WGSL that does not compile or validate.
    Shader(String),
    /// The backend cannot do this.
    Unsupported(String),
    /// The device failed.
    Device(String),
}

impl fmt::Display for ComputeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (kind, message) = match self {
            ComputeError::BadHandle(m) => ("bad handle", m),
            ComputeError::Invalid(m) => ("invalid", m),
            ComputeError::Quota(m) => ("quota", m),
            ComputeError::Shader(m) => ("shader", m),
            ComputeError::Unsupported(m) => ("unsupported", m),
            ComputeError::Device(m) => ("device", m),
        };
        write!(f, "{kind}: {message}")
    }
}

impl std::error::Error for ComputeError {}

/// Shorthand for [`ComputeError::Invalid`] with a formatted message.
macro_rules! invalid {
    ($($arg:tt)*) => {
        $crate::compute::ComputeError::Invalid(format!($($arg)*))
    };
}
pub(crate) use invalid;
