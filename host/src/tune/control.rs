//! Requests to a running experiment from outside the runner: a control
//! server, or a service embedding wtune. As in Ray Tune's TuneServer, the
//! runner takes them between steps, in its own loop, so a request never
//! races a decision: a [`Controller`] only queues a [`Command`] and waits
//! for the runner's answer.
//!
//! Everything a client sends is checked by the runner against the trials as
//! they are at that moment; a request that does not fit (an unknown trial,
//! stopping a trial that has ended) is refused with a [`ControlError`] and
//! changes nothing.

use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use super::trial::Trial;

/// Requests the runner queues before it refuses more with
/// [`ControlError::Busy`]: a client cannot grow the runner's memory.
pub const QUEUE: usize = 64;

/// What a client asks of the runner.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// The trial as the runner holds it now; changes nothing.
    GetTrial(String),
    /// End a trial TERMINATED: a RUNNING one after its current step, a
    /// PENDING or PAUSED one at once.
    StopTrial(String),
    /// Hold a trial: a RUNNING one is checkpointed after its current step
    /// and left PAUSED; a PENDING or PAUSED one is not started again. It
    /// runs again only after [`Command::ResumeTrial`].
    PauseTrial(String),
    /// Let a held trial run again when the scheduler gives it a slot (or
    /// cancel a pause not yet carried out).
    ResumeTrial(String),
    /// Add a PENDING trial with exactly this config (a JSON object).
    AddTrial(Value),
    /// End the experiment as an interrupt does: no new trials, running ones
    /// checkpointed after their current step and left PAUSED, so that
    /// `wtune resume` continues it.
    StopExperiment,
}

/// The runner's answer to a request it carried out (or scheduled).
#[derive(Debug, Clone)]
pub struct Reply {
    /// The trial the request was about, as it stands after the request.
    pub trial: Option<Trial>,
    /// What happened, or what will happen, in words.
    pub message: String,
}

/// Why a request was refused. Nothing changed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ControlError {
    /// No trial has this id.
    #[error("there is no trial {0}")]
    UnknownTrial(String),
    /// The request does not fit the trial's or the experiment's state.
    #[error("{0}")]
    Conflict(String),
    /// The request itself is malformed (a config that is not an object).
    #[error("{0}")]
    Invalid(String),
    /// The runner has [`QUEUE`] requests waiting already.
    #[error("the runner has {QUEUE} requests waiting; try again shortly")]
    Busy,
    /// The runner has ended: the experiment is over.
    #[error("the experiment is not running any more")]
    Ended,
}

/// One queued request and where its answer goes.
#[derive(Debug)]
pub struct ControlRequest {
    /// What is asked.
    pub command: Command,
    reply: oneshot::Sender<Result<Reply, ControlError>>,
}

impl ControlRequest {
    /// Answers the client; one that stopped waiting is not an error.
    pub(crate) fn answer(self, outcome: Result<Reply, ControlError>) {
        let _ = self.reply.send(outcome);
    }
}

/// The client's end: cheap to clone, one per connection if need be.
#[derive(Debug, Clone)]
pub struct Controller {
    sender: mpsc::Sender<ControlRequest>,
}

/// The runner's end; give it to [`Runner::control`](super::Runner::control).
#[derive(Debug)]
pub struct Requests {
    pub(crate) receiver: mpsc::Receiver<ControlRequest>,
}

/// A connected pair.
pub fn channel() -> (Controller, Requests) {
    let (sender, receiver) = mpsc::channel(QUEUE);
    (Controller { sender }, Requests { receiver })
}

impl Controller {
    /// Queues `command` and waits for the runner's answer, which comes
    /// after the runner's current event (a step ending, say).
    pub async fn send(&self, command: Command) -> Result<Reply, ControlError> {
        let (reply, answer) = oneshot::channel();
        self.sender
            .try_send(ControlRequest { command, reply })
            .map_err(|err| match err {
                mpsc::error::TrySendError::Full(_) => ControlError::Busy,
                mpsc::error::TrySendError::Closed(_) => ControlError::Ended,
            })?;
        answer.await.unwrap_or(Err(ControlError::Ended))
    }

    /// Whether the runner has ended (its [`Requests`] are gone).
    pub fn is_closed(&self) -> bool {
        self.sender.is_closed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_full_queue_is_refused_and_a_gone_runner_is_ended() {
        let (controller, mut requests) = channel();
        let mut waiting = Vec::new();
        for _ in 0..QUEUE {
            let c = controller.clone();
            waiting.push(tokio::spawn(async move {
                c.send(Command::StopExperiment).await
            }));
        }
        // Let every spawned request reach the queue.
        while requests.receiver.len() < QUEUE {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            controller.send(Command::StopExperiment).await.unwrap_err(),
            ControlError::Busy
        );
        let first = requests.receiver.recv().await.unwrap();
        first.answer(Ok(Reply {
            trial: None,
            message: "stopping".into(),
        }));
        drop(requests);
        let mut answers = Vec::new();
        for task in waiting {
            answers.push(task.await.unwrap());
        }
        assert_eq!(answers.iter().filter(|a| a.is_ok()).count(), 1);
        assert!(
            answers
                .iter()
                .filter_map(|a| a.as_ref().err())
                .all(|e| *e == ControlError::Ended)
        );
        assert!(controller.is_closed());
        assert_eq!(
            controller.send(Command::StopExperiment).await.unwrap_err(),
            ControlError::Ended
        );
    }
}
