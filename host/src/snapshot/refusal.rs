//! Why a component, or one of its states, cannot be snapshotted by the host.

use std::fmt;

/// Why a component (or one of its states) cannot be snapshotted by the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotRefusal {
    reason: String,
}

impl SnapshotRefusal {
    /// A refusal with a reason that completes "cannot snapshot: the component ...".
    pub fn new(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
        }
    }

    /// The reason, as given.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for SnapshotRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "host snapshots are not possible: the component {}",
            self.reason
        )
    }
}

impl std::error::Error for SnapshotRefusal {}
