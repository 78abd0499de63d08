//! What the runner's loop hears from trial threads, and what it remembers
//! between events.

use std::time::Duration;

use serde_json::Value;

use crate::tune::backend::{Step, TrialFailure};
use crate::tune::schedulers::Decision;
use crate::tune::trial::Checkpoint;

/// What a control request asked of a RUNNING trial.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Requested {
    Stop,
    Pause,
}

/// An exploit waiting for its source's checkpoint (see `Runner::parked`).
pub(super) struct ParkedExploit<S> {
    pub(super) index: usize,
    pub(super) session: S,
    pub(super) source: usize,
    /// The source's iterations when the exploit was decided.
    pub(super) ranked_at: u64,
    pub(super) config: Value,
}

/// What a blocking task hands back to the runner's loop.
pub(super) enum Event<S> {
    /// A launch (fresh, or from a checkpoint) finished.
    Launched(Result<S, TrialFailure>),
    /// A callback's [`TrialSetup`] failed, so the trial was not launched.
    SetupFailed(String),
    /// A `train()` failed.
    Failed {
        session: S,
        failure: TrialFailure,
        fuel_total: u64,
    },
    /// A `train()` result was recorded and decided on, and the decision
    /// needs the loop (see `Shared::continues_here`); `Err` is a reason to
    /// fail the trial.
    Settled {
        session: S,
        decision: Result<Decision, String>,
    },
    /// In fuel order, a `train()` step that finished after the run halted:
    /// not released, so not decided on. `booked`: it is a step a halted run
    /// left pending, replayed and already on the trial's counters.
    HaltedStep {
        session: S,
        step: Step,
        elapsed: Duration,
        booked: bool,
    },
    /// A checkpoint was written (or failed); `then` says what comes next.
    Saved {
        session: S,
        saved: Result<Checkpoint, TrialFailure>,
        then: Then,
    },
    /// The session is gone; its slot is free. `cleanup` says why the
    /// trainable's cleanup failed, if it did.
    Stopped {
        pausing: bool,
        cleanup: Option<TrialFailure>,
    },
}

/// What follows a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Then {
    Train,
    Stop,
    Pause,
}

impl Then {
    /// What follows a step the scheduler decided `decision` on (an exploit
    /// trains on, from its clone).
    pub(super) fn after(decision: &Decision) -> Self {
        match decision {
            Decision::Continue | Decision::Checkpoint | Decision::Exploit { .. } => Then::Train,
            Decision::Stop => Then::Stop,
            Decision::Pause => Then::Pause,
        }
    }
}
