//! Why a trial's sandbox failed, in words a user can act on.

use std::fmt;
use std::time::Duration;

use super::limits::LimitHit;
use crate::units::fuel_text;

/// A call the host makes into a trainable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// Instantiation, including the component's start functions.
    Instantiate,
    /// `setup(config)`.
    Setup,
    /// `train()`.
    Train,
    /// `save()`.
    Save,
    /// `restore(state)`.
    Restore,
    /// `reset(config)`.
    Reset,
    /// `cleanup()`.
    Cleanup,
    /// A host snapshot or restore of the guest's state.
    Snapshot,
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Call::Instantiate => "instantiation",
            Call::Setup => "setup()",
            Call::Train => "train()",
            Call::Save => "save()",
            Call::Restore => "restore()",
            Call::Snapshot => "host snapshot",
            Call::Reset => "reset()",
            Call::Cleanup => "cleanup()",
        })
    }
}

/// Where in the trial a fault happened: the call and, for `train()`, the
/// iteration it was computing (1-based).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct At {
    /// The call that failed.
    pub call: Call,
    /// The iteration being computed, when the call was `train()`.
    pub iteration: Option<u64>,
}

impl fmt::Display for At {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.iteration {
            Some(i) => write!(f, "{} at iteration {i}", self.call),
            None => write!(f, "{}", self.call),
        }
    }
}

/// Why a trial's instance failed. The `Display` text is the reason shown for
/// the trial's ERROR status.
#[derive(Debug, Clone, PartialEq)]
pub enum TrialFault {
    /// The guest returned `err(message)` from a call: a clean failure.
    /// Messages over 4 KiB are cut (ending in ` [...]`); `full_length` is
    /// then the length the guest sent, in bytes, so the reason can say so
    /// without repeating it.
    GuestError {
        at: At,
        message: String,
        full_length: Option<usize>,
    },
    /// The trial's total fuel budget ran out.
    FuelBudget { at: At, budget: u64 },
    /// One call burned more than the per-call fuel limit.
    FuelPerCall { at: At, limit: u64 },
    /// A call ran past its wall-clock deadline.
    Timeout { at: At, limit: Duration },
    /// A memory, table, file or disk quota was hit; `kind` says which
    /// family ([`FaultKind::Memory`] or [`FaultKind::Resource`]).
    Limit {
        at: At,
        what: String,
        kind: FaultKind,
    },
    /// The guest panicked; `message` is its panic message from stderr.
    Panic { at: At, message: String },
    /// The guest trapped (unreachable, out-of-bounds access, stack overflow...).
    Trap { at: At, trap: String },
    /// The guest returned something the host refuses (too large, reserved
    /// names, malformed values).
    BadOutput { at: At, reason: String },
    /// The guest handed the host a value it refuses to read: one it
    /// returned or passed to a host call was malformed (out of bounds,
    /// invalid UTF-8, a bad discriminant or handle) or larger than
    /// [`super::Limits::transfer_bytes`].
    BadValue { at: At, reason: String },
    /// The trial's compute device lost its buffers (a GPU job ran past its
    /// deadline and its worker was killed, or the worker died).
    DeviceLost { at: At, reason: String },
    /// The guest called WASI's `exit` instead of returning from the call.
    Exit { at: At, code: i32 },
    /// The host could not prepare the trial's environment (log files,
    /// directories) or a host-side error surfaced during a call.
    Host { at: At, message: String },
    /// The instance trapped earlier and cannot be entered again.
    Poisoned,
}

/// The family a [`TrialFault`] belongs to, for callers that act on the
/// cause rather than show it (the Python package raises one exception class
/// per family).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultKind {
    /// The per-call fuel limit or the trial's fuel budget.
    Fuel,
    /// Guest memory or tables past their cap.
    Memory,
    /// A call ran past its wall-clock deadline.
    Deadline,
    /// Files, disk, descriptors or result bytes past their quota.
    Resource,
    /// A trap, a panic, a call to `exit`, or an instance that trapped before.
    Trap,
    /// The guest returned `err(message)`.
    Guest,
    /// The guest returned or passed a value the host refuses.
    Output,
    /// Host compute lost the trial's device.
    Device,
    /// The host itself failed.
    Host,
}

impl TrialFault {
    pub(crate) fn limit(at: At, hit: LimitHit) -> Self {
        let kind = match hit {
            LimitHit::Memory { .. } | LimitHit::Table { .. } => FaultKind::Memory,
            LimitHit::OpenFiles { .. }
            | LimitHit::Results { .. }
            | LimitHit::Disk { .. }
            | LimitHit::DiskFiles { .. } => FaultKind::Resource,
        };
        TrialFault::Limit {
            at,
            what: hit.to_string(),
            kind,
        }
    }

    /// The fault's family.
    pub fn kind(&self) -> FaultKind {
        match self {
            TrialFault::GuestError { .. } => FaultKind::Guest,
            TrialFault::FuelBudget { .. } | TrialFault::FuelPerCall { .. } => FaultKind::Fuel,
            TrialFault::Timeout { .. } => FaultKind::Deadline,
            TrialFault::Limit { kind, .. } => *kind,
            TrialFault::Panic { .. }
            | TrialFault::Trap { .. }
            | TrialFault::Exit { .. }
            | TrialFault::Poisoned => FaultKind::Trap,
            TrialFault::BadOutput { .. } | TrialFault::BadValue { .. } => FaultKind::Output,
            TrialFault::DeviceLost { .. } => FaultKind::Device,
            TrialFault::Host { .. } => FaultKind::Host,
        }
    }
}

impl fmt::Display for TrialFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TrialFault::GuestError {
                at,
                message,
                full_length: None,
            } => write!(f, "{at} failed: {message}"),
            TrialFault::GuestError {
                at,
                message,
                full_length: Some(length),
            } => write!(
                f,
                "{at} failed with an error message of {length} bytes; its start: {message}"
            ),
            TrialFault::FuelBudget { at, budget } => {
                write!(
                    f,
                    "fuel budget {} exhausted during {at}",
                    fuel_text(*budget)
                )
            }
            TrialFault::FuelPerCall { at, limit } => write!(
                f,
                "{at} exceeded the per-call fuel limit of {}",
                fuel_text(*limit)
            ),
            TrialFault::Timeout { at, limit } => {
                write!(
                    f,
                    "{at} exceeded its {} deadline",
                    humantime::format_duration(*limit)
                )
            }
            TrialFault::Limit { at, what, .. } => write!(f, "{what} during {at}"),
            TrialFault::Panic { at, message } => write!(f, "{at} panicked: {message}"),
            TrialFault::Trap { at, trap } => write!(f, "{at} trapped: {trap}"),
            TrialFault::BadOutput { at, reason } => {
                write!(f, "{at} returned a bad result: {reason}")
            }
            TrialFault::BadValue { at, reason } => {
                write!(f, "{at} passed the host a value it refuses: {reason}")
            }
            TrialFault::DeviceLost { at, reason } => {
                write!(f, "{at} lost its compute device: {reason}")
            }
            TrialFault::Exit { at, code } => write!(
                f,
                "{at} called exit with status {code}; a trainable must return from every call"
            ),
            TrialFault::Host { at, message } => write!(f, "host error during {at}: {message}"),
            TrialFault::Poisoned => {
                f.write_str("the instance trapped earlier and can no longer be called")
            }
        }
    }
}

impl std::error::Error for TrialFault {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_guest_message_says_how_long_it_was() {
        let at = At {
            call: Call::Train,
            iteration: Some(2),
        };
        let whole = TrialFault::GuestError {
            at,
            message: "nan loss".into(),
            full_length: None,
        };
        assert_eq!(whole.to_string(), "train() at iteration 2 failed: nan loss");
        let cut = TrialFault::GuestError {
            at,
            message: "eee [...]".into(),
            full_length: Some(100_000_000),
        };
        assert_eq!(
            cut.to_string(),
            "train() at iteration 2 failed with an error message of 100000000 bytes; \
             its start: eee [...]"
        );
    }

    #[test]
    fn messages_name_call_iteration_and_limit() {
        let at = At {
            call: Call::Train,
            iteration: Some(12),
        };
        assert_eq!(
            TrialFault::FuelBudget {
                at,
                budget: 5_000_000_000
            }
            .to_string(),
            "fuel budget 5e9 exhausted during train() at iteration 12"
        );
        assert_eq!(
            TrialFault::Timeout {
                at,
                limit: Duration::from_secs(30)
            }
            .to_string(),
            "train() at iteration 12 exceeded its 30s deadline"
        );
    }
}
