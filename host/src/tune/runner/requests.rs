//! Control requests (from the dashboard's server or an embedder), carried
//! out between events, or refused changing nothing.

use serde_json::Value;

use super::event::Requested;
use super::{Runner, STOPPED_BY_REQUEST};
use crate::tune::backend::TrialBackend;
use crate::tune::control::{Command, ControlError, Reply};
use crate::tune::trial::{Trial, TrialStatus};

/// The index of trial `id`.
fn find(trials: &[Trial], id: &str) -> Result<usize, ControlError> {
    trials
        .iter()
        .position(|t| t.trial_id == id)
        .ok_or_else(|| ControlError::UnknownTrial(id.to_string()))
}

/// An answer about `trial`.
fn reply(trial: &Trial, message: String) -> Reply {
    Reply {
        trial: Some(trial.clone()),
        message,
    }
}

impl<B: TrialBackend> Runner<B> {
    /// Carries out a control request, or refuses it changing nothing.
    pub(super) fn handle(
        &mut self,
        trials: &mut Vec<Trial>,
        command: Command,
        halted: &mut Option<String>,
        stopped: bool,
    ) -> Result<Reply, ControlError> {
        match command {
            Command::GetTrial(id) => {
                let index = find(trials, &id)?;
                Ok(reply(
                    &trials[index],
                    format!("{id} is {}", trials[index].status),
                ))
            }
            Command::StopExperiment => {
                let message = match halted {
                    Some(reason) => format!("the experiment is already stopping ({reason})"),
                    None => {
                        *halted = Some(STOPPED_BY_REQUEST.into());
                        "the experiment stops: no new trials; running trials are checkpointed \
                         after their current step and left PAUSED"
                            .into()
                    }
                };
                Ok(Reply {
                    trial: None,
                    message,
                })
            }
            Command::AddTrial(config) => {
                self.add_trial(trials, config, halted.is_some() || stopped)
            }
            Command::StopTrial(id) => self.stop_trial(trials, &id),
            Command::PauseTrial(id) => self.pause_trial(trials, &id),
            Command::ResumeTrial(id) => self.resume_trial(trials, &id),
        }
    }

    /// A new trial with `config`, after the others; refused while the
    /// experiment is `stopping`.
    fn add_trial(
        &mut self,
        trials: &mut Vec<Trial>,
        config: Value,
        stopping: bool,
    ) -> Result<Reply, ControlError> {
        if !config.is_object() {
            return Err(ControlError::Invalid(format!(
                "a trial's config must be a JSON object, not {config}"
            )));
        }
        if stopping {
            return Err(ControlError::Conflict(
                "the experiment is stopping; it takes no new trials".into(),
            ));
        }
        let trial_id = format!("trial_{:0width$}", trials.len(), width = self.id_width);
        let dir = self.spec.output_dir.join(&trial_id);
        let mut trial = Trial::new(trial_id, config, dir);
        trial.restore_from = self.spec.restore_from.clone();
        self.scheduler.on_trial_add(&trial);
        let message = format!(
            "{} added; it starts when the scheduler gives it a slot",
            trial.trial_id
        );
        trials.push(trial);
        Ok(reply(&trials[trials.len() - 1], message))
    }

    /// A running trial stops after its current step; a waiting one at once.
    fn stop_trial(&mut self, trials: &mut [Trial], id: &str) -> Result<Reply, ControlError> {
        let index = find(trials, id)?;
        match trials[index].status {
            TrialStatus::Running => {
                self.requested.insert(index, Requested::Stop);
                Ok(reply(
                    &trials[index],
                    format!("{id} stops after its current step"),
                ))
            }
            TrialStatus::Pending | TrialStatus::Paused => {
                self.waiting.retain(|&i| i != index);
                self.resizing.remove(&index);
                trials[index].stop_reason = Some(STOPPED_BY_REQUEST.into());
                self.tell_ended(trials, index);
                self.end(trials, index);
                Ok(reply(&trials[index], format!("{id} stopped")))
            }
            status => Err(ControlError::Conflict(format!(
                "{id} has already ended ({status})"
            ))),
        }
    }

    /// A trial is held PAUSED until resumed: a running one after a
    /// checkpoint at the end of its current step.
    fn pause_trial(&mut self, trials: &mut [Trial], id: &str) -> Result<Reply, ControlError> {
        let index = find(trials, id)?;
        let trial = &mut trials[index];
        match trial.status {
            _ if trial.held => Ok(reply(trial, format!("{id} is already held"))),
            TrialStatus::Running => {
                if self.requested.get(&index) == Some(&Requested::Stop) {
                    return Err(ControlError::Conflict(format!("{id} is stopping")));
                }
                self.requested.insert(index, Requested::Pause);
                trial.held = true;
                Ok(reply(
                    trial,
                    format!(
                        "{id} is checkpointed after its current step and held PAUSED \
                                 until resumed"
                    ),
                ))
            }
            TrialStatus::Pending | TrialStatus::Paused => {
                trial.held = true;
                self.held.insert(index);
                self.waiting.retain(|&i| i != index);
                self.resizing.remove(&index);
                self.tell_ended(trials, index);
                let trial = &trials[index];
                Ok(reply(
                    trial,
                    format!("{id} is held {} until resumed", trial.status),
                ))
            }
            status => Err(ControlError::Conflict(format!(
                "{id} has already ended ({status})"
            ))),
        }
    }

    /// A held trial waits for a slot again (or a pause not yet carried out
    /// is cancelled).
    fn resume_trial(&mut self, trials: &mut [Trial], id: &str) -> Result<Reply, ControlError> {
        let index = find(trials, id)?;
        let trial = &mut trials[index];
        match trial.status {
            TrialStatus::Running if self.requested.get(&index) == Some(&Requested::Pause) => {
                self.requested.remove(&index);
                trial.held = false;
                Ok(reply(trial, format!("{id}'s pause is cancelled")))
            }
            TrialStatus::Running if trial.held => Err(ControlError::Conflict(format!(
                "{id} is being checkpointed to pause; resume it once it is PAUSED"
            ))),
            TrialStatus::Pending | TrialStatus::Paused if trial.held => {
                trial.held = false;
                self.held.remove(&index);
                if self.told.remove(&index) {
                    self.scheduler.on_trial_retry(trial);
                }
                Ok(reply(
                    trial,
                    format!("{id} runs again when the scheduler gives it a slot"),
                ))
            }
            status => Err(ControlError::Conflict(format!(
                "{id} is {status}, not held by a pause request"
            ))),
        }
    }
}
