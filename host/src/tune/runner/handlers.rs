//! What the loop does with each event a trial thread hands back: one
//! handler per kind of event.

use super::STOPPED_BY_REQUEST;
use super::event::{Event, Requested, Then};
use super::shared::{Shared, Tasks, book_launch};
use crate::tune::backend::{TrialBackend, TrialFailure};
use crate::tune::decisions::PendingStep;
use crate::tune::schedulers::Decision;
use crate::tune::trial::{Checkpoint, TrialStatus};

impl<B: TrialBackend> Shared<B> {
    /// Handles `event` of trial `index`; returns the reason when the trial
    /// failed (for `fail_fast`).
    pub(super) fn on_event(
        &mut self,
        tasks: &mut Tasks<B>,
        index: usize,
        event: Event<B::Session>,
    ) -> Option<String> {
        let Shared {
            runner,
            trials,
            live,
            halted,
            stopped,
            ..
        } = self;
        match event {
            Event::Stopped { pausing, cleanup } => {
                self.on_stopped(index, pausing, cleanup);
                None
            }
            // As when `on_trial_start` fails: the trial never ran, so
            // this is no failure of its trainable for `fail_fast`.
            Event::SetupFailed(reason) => {
                *live -= 1;
                if let Some(order) = &mut runner.order {
                    order.stopped(index);
                }
                runner.pool.release(&trials[index].trial_id);
                runner.fail(trials, index, reason);
                None
            }
            Event::Launched(Err(failure)) => {
                runner.launch_failed(&failure.reason);
                runner.failure(tasks, trials, index, None, failure, halted.as_deref())
            }
            Event::Launched(Ok(session)) => {
                book_launch(&mut trials[index], &session);
                runner.launched(trials, index);
                if halted.is_some() {
                    runner.halt_kept.insert(index);
                }
                match halted.as_ref().or(stopped.as_ref()) {
                    Some(reason) => {
                        runner.halt_trial(trials, index, reason);
                        tasks.stop(index, session, false);
                    }
                    None => match runner.restored_past_stop(&trials[index]) {
                        // Its checkpoint was taken at its last result (a
                        // run killed before its end was saved): training
                        // on would go past its stopping criteria.
                        Some(reason) => {
                            runner.end_restored(trials, index, reason);
                            tasks.stop(index, session, false);
                        }
                        None => tasks.train(index, session),
                    },
                }
                None
            }
            Event::Failed {
                session,
                failure,
                fuel_total,
            } => {
                runner.burn(&mut trials[index], fuel_total);
                runner.failure(
                    tasks,
                    trials,
                    index,
                    Some(session),
                    failure,
                    halted.as_deref(),
                )
            }
            // The result is recorded (see `Shared::settle`): carry out
            // the decision.
            Event::Settled { session, decision } => match decision {
                Err(reason) => {
                    runner.fail(trials, index, reason.clone());
                    tasks.stop(index, session, false);
                    Some(reason)
                }
                // Halting: checkpoint the trial so that `wtune
                // resume` loses none of its work, then release it. Unless
                // the scheduler paused it, it held its slot at the moment
                // the run halted at.
                Ok(decision)
                    if halted.is_some()
                        && decision != Decision::Stop
                        && !(runner.order.is_some()
                            && matches!(decision, Decision::Exploit { .. })) =>
                {
                    if decision != Decision::Pause {
                        runner.halt_kept.insert(index);
                    }
                    if matches!(decision, Decision::Exploit { .. }) {
                        // Paused on its own trajectory: the clone is not made.
                        runner.scheduler.on_exploit_skipped(&trials[index]);
                    }
                    if runner.order.is_some() && !runner.checkpoint_due(&trials[index], &decision) {
                        runner.halt_saves.insert(index);
                    }
                    runner.after_step(tasks, trials, index, session, Decision::Pause);
                    None
                }
                Ok(Decision::Exploit { source, config }) => {
                    // Noted where it was decided (`Shared::settle`); none
                    // only for a source that is no trial, which `exploit`
                    // refuses.
                    let ranked_at = runner.ranked_at.remove(&index).unwrap_or_default();
                    runner.exploit(tasks, trials, index, session, (source, ranked_at), config);
                    None
                }
                Ok(decision) => {
                    runner.after_step(tasks, trials, index, session, decision);
                    None
                }
            },
            Event::HaltedStep {
                session,
                step,
                elapsed,
                booked,
            } => {
                let pending = PendingStep::new(step, elapsed);
                runner.halted_step(tasks, trials, index, session, (pending, booked));
                None
            }
            Event::Saved {
                session,
                saved,
                then,
            } => self.on_saved(tasks, index, session, saved, then),
        }
    }

    /// A session is gone and its slot free: the trial ends, pauses, or
    /// waits to be resized, as its request or pause said.
    fn on_stopped(&mut self, index: usize, pausing: bool, cleanup: Option<TrialFailure>) {
        let Shared {
            runner,
            trials,
            live,
            halted,
            stopped,
            ..
        } = self;
        *live -= 1;
        // The trial keeps the status it ended with: its results
        // are complete. A cleanup that failed (ran out of fuel,
        // past its deadline) is still the trainable's fault, so
        // it is said where the user looks.
        if let Some(failure) = cleanup {
            tracing::warn!(
                trial = %trials[index].trial_id,
                "cleanup failed: {}",
                failure.reason
            );
        }
        runner.pool.release(&trials[index].trial_id);
        // A request that came while a pause was already under
        // way (no result came to carry it) is carried out here.
        let request = if pausing {
            runner.requested.remove(&index)
        } else {
            None
        };
        if request == Some(Requested::Stop) {
            trials[index].stop_reason = Some(STOPPED_BY_REQUEST.into());
            runner.tell_ended(trials, index);
            runner.end(trials, index);
        } else if pausing {
            trials[index].status = TrialStatus::Paused;
            let held = trials[index].held;
            if held {
                runner.tell_ended(trials, index);
                runner.held.insert(index);
            }
            runner.notify(trials, index, |cb, t| cb.on_trial_pause(t, index));
            if runner.resizing.remove(&index) && !held && halted.is_none() && stopped.is_none() {
                runner.waiting.push_back(index);
            }
        }
        if let Some(order) = &mut runner.order {
            // A trial the halt paused in its slot keeps its clock for the
            // halted run's last moment; one that ended (a stop request
            // carried out as it paused) does not come back.
            if halted.is_some()
                && runner.halt_kept.contains(&index)
                && trials[index].status == TrialStatus::Paused
            {
                order.set_aside(index);
            } else {
                order.stopped(index);
            }
        }
    }

    /// A checkpoint was written, or failed: keep it and go on as `then`
    /// says, or fail the trial (not while halting: that is not the trial's
    /// fault). Returns the reason when the trial failed.
    fn on_saved(
        &mut self,
        tasks: &mut Tasks<B>,
        index: usize,
        session: B::Session,
        saved: Result<Checkpoint, TrialFailure>,
        then: Then,
    ) -> Option<String> {
        let Shared {
            runner,
            trials,
            halted,
            ..
        } = self;
        // A trial that was to train on after this checkpoint held its slot
        // at the moment the run halted at.
        if halted.is_some() && then == Then::Train {
            runner.halt_kept.insert(index);
        }
        match saved {
            Err(failure) if halted.is_some() => {
                // Not the trial's fault that the run is ending: it is
                // released without the checkpoint (and resumes from its
                // previous one), or, having finished, ends as it would
                // have.
                tracing::warn!(trial = %trials[index].trial_id, "checkpoint while halting failed: {}", failure.reason);
                if then == Then::Stop {
                    runner.end(trials, index);
                } else {
                    let reason = halted.clone().unwrap_or_default();
                    runner.halt_trial(trials, index, &reason);
                }
                tasks.stop(index, session, false);
                None
            }
            Err(failure) => {
                // A checkpoint that cannot be written fails the same way
                // every time, so it is not retried.
                let reason = format!(
                    "checkpoint at iteration {} failed: {}",
                    trials[index].iterations, failure.reason
                );
                runner.fail(trials, index, reason.clone());
                tasks.stop(index, session, false);
                Some(reason)
            }
            Ok(mut checkpoint) => {
                checkpoint.halt = runner.halt_saves.remove(&index);
                runner.keep(trials, index, checkpoint);
                runner.notify(trials, index, |cb, t| cb.on_checkpoint(t, index));
                match then {
                    _ if halted.is_some() && then != Then::Stop => {
                        let reason = halted.clone().unwrap_or_default();
                        runner.halt_trial(trials, index, &reason);
                        tasks.stop(index, session, false);
                    }
                    Then::Train => {
                        tasks.train(index, session);
                    }
                    Then::Stop => {
                        runner.end(trials, index);
                        tasks.stop(index, session, false);
                    }
                    Then::Pause => {
                        tasks.stop(index, session, true);
                    }
                }
                None
            }
        }
    }
}
