//! The error type trainables return; the host shows its message as the
//! reason the trial ended in ERROR.

use std::fmt;

/// A trainable's failure, carried to the host as text.
///
/// Any `std::error::Error` converts into it, so `?` works on I/O, parsing and
/// serde errors; use [`Error::msg`] for your own messages.
pub struct Error {
    message: String,
}

impl Error {
    /// An error with the given message.
    pub fn msg(message: impl fmt::Display) -> Self {
        Self {
            message: message.to_string(),
        }
    }

    /// Prefixes the message with what was being done, as in
    /// `"reading /data/digits.csv: No such file or directory"`.
    pub fn context(self, context: impl fmt::Display) -> Self {
        Self {
            message: format!("{context}: {}", self.message),
        }
    }

    /// The error's message.
    pub fn message(&self) -> &str {
        &self.message
    }

    pub(crate) fn unsupported(what: &str) -> Self {
        Self::msg(format!(
            "this trainable does not implement {what}() (implement it, or export with \
             `checkpoint = serde` if its state derives Serialize and Deserialize)"
        ))
    }
}

impl<E: std::error::Error> From<E> for Error {
    fn from(err: E) -> Self {
        let mut message = err.to_string();
        let mut source = err.source();
        while let Some(cause) = source {
            message.push_str(": ");
            message.push_str(&cause.to_string());
            source = cause.source();
        }
        Self { message }
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// `Result` with [`Error`] as its error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
