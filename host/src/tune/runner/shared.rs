//! The trial-thread side of the runner: the state the loop and the trial
//! threads share behind one lock, and the blocking tasks that train, save
//! and stop sessions.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};
use tokio::task::JoinSet;

use super::Runner;
use super::event::Event;
use crate::tune::backend::{Step, TrialBackend, TrialSession};
use crate::tune::schedulers::Decision;
use crate::tune::trial::Trial;

/// What the loop and the trial threads share, behind one lock: the runner,
/// its trials and the run's state. Trial threads settle their own results
/// under it (see [`train`]), so that a result which changes nothing but the
/// files costs no handoff to the loop's thread and back: two cross-thread
/// wakes per result were most of the host's cost per result.
pub(super) struct Shared<B: TrialBackend> {
    pub(super) runner: Runner<B>,
    pub(super) trials: Vec<Trial>,
    /// Trials holding a slot: launching, training, saving or stopping.
    pub(super) live: usize,
    /// Why the run is ending early (an interrupt, a request, `fail_fast`):
    /// no new trials, and running ones are checkpointed and paused.
    pub(super) halted: Option<String>,
    /// Why the experiment-level stopper ended the experiment.
    pub(super) stopped: Option<String>,
    pub(super) started: Instant,
    /// `Runner::run` returned (an error, say, with trials still running):
    /// their threads drop their sessions at the next result instead of
    /// training on for nobody.
    pub(super) closed: bool,
    /// The loop just carried out a trial thread's event: in fuel order,
    /// trials start only then (or when nothing runs), not when a control
    /// request or the deadline wakes the loop between a release and its
    /// handling.
    pub(super) fill_due: bool,
}

impl<B: TrialBackend> Shared<B> {
    /// Books a step on its trial, records its result and decides what
    /// follows (stopping criteria, the scheduler, the experiment stopper, a
    /// resize). `Err` is a reason to fail the trial. `booked`: the step is
    /// one a halted run left pending, already on the trial's counters (its
    /// checkpoint was taken after it); only its fuel is counted now.
    pub(super) fn settle(
        &mut self,
        index: usize,
        step: &Step,
        elapsed: Duration,
        fuel_total: u64,
        booked: bool,
    ) -> Result<Decision, String> {
        let Shared {
            runner,
            trials,
            stopped,
            started,
            ..
        } = self;
        let trial = &mut trials[index];
        if booked {
            runner.replays.remove(&index);
            runner.fuel_burned = runner.fuel_burned.saturating_add(step.fuel);
        } else {
            book_step(trial, elapsed, fuel_total);
            runner.burn(trial, fuel_total);
        }
        let decision = runner.record(trials, index, step, elapsed)?;
        let decision = runner.after_result(trials, index, decision, *started, stopped);
        runner.decided_on(trials, index, &decision);
        if let Decision::Exploit { source, .. } = decision
            && let Some(source) = trials.get(source)
        {
            runner.ranked_at.insert(index, source.iterations);
        }
        if booked {
            runner.adopt_halt_checkpoint(trials, index, &decision);
        }
        Ok(decision)
    }

    /// Books a step redone after a resume and records its result, without
    /// a decision ([`Runner::continue_at`]). Its fuel is not counted again
    /// toward `max_fuel`: the run it continues counted it, and a resumed run
    /// stops where an uninterrupted one would. Returns why stopping
    /// criteria tightened on resume end the trial at this step, if they
    /// do: it is then booked but not recorded, for [`Shared::stop_redone`]
    /// in its turn.
    fn redo(
        &mut self,
        index: usize,
        step: &Step,
        elapsed: Duration,
        fuel_total: u64,
    ) -> Result<Option<String>, String> {
        let Shared { runner, trials, .. } = self;
        let trial = &mut trials[index];
        book_step(trial, elapsed, fuel_total);
        trial.fuel_total = fuel_total;
        runner.record_redone(trials, index, step, elapsed)
    }

    /// Ends trial `index` at the redone step that the stopping criteria end
    /// (see [`Shared::redo`]).
    fn stop_redone(
        &mut self,
        index: usize,
        step: (&Step, Duration),
        reason: String,
    ) -> Result<Decision, String> {
        let Shared { runner, trials, .. } = self;
        runner.stop_redone(trials, index, step, reason)
    }

    /// Whether a trial just launched starts training on its launching
    /// thread, as the loop would have had it (`Event::Launched`): unless the
    /// run is halting, stopped or over, when the loop releases it, the
    /// trial was restored at its last result, when the loop ends it, or it
    /// is the first launch (`Runner::probing`), after which the loop fills
    /// the other slots.
    pub(super) fn trains_here(&mut self, index: usize, session: &B::Session) -> bool {
        if self.closed
            || self.halted.is_some()
            || self.stopped.is_some()
            || !self.runner.launched_once
        {
            return false;
        }
        book_launch(&mut self.trials[index], session);
        self.runner.launched(&self.trials, index);
        self.runner
            .restored_past_stop(&self.trials[index])
            .is_none()
    }

    /// Whether the trial whose result was just settled ends here, on its
    /// own thread, as the loop would have ended it (`Runner::after_step`):
    /// it stops with no checkpoint due. Ends it if so; the caller then
    /// stops its session and hands the loop only the freed slot.
    pub(super) fn ends_here(&mut self, index: usize, decision: &Result<Decision, String>) -> bool {
        let Shared { runner, trials, .. } = self;
        if !matches!(decision, Ok(Decision::Stop))
            || runner.checkpoint_due(&trials[index], &Decision::Stop)
        {
            return false;
        }
        runner.end(trials, index);
        true
    }

    /// Whether the trial whose result was just settled trains on at once,
    /// on its own thread: it continues, needs no checkpoint, and the loop
    /// has nothing to do that this result could have started (a free slot
    /// to fill, freed resources, a stopped experiment, a halt). Does the
    /// chores the loop would have done before its next wait, but for the
    /// experiment stopper's time and fuel check: `settle` has just run it
    /// on this result (`after_result`).
    pub(super) fn continues_here(
        &mut self,
        index: usize,
        decision: &Result<Decision, String>,
    ) -> bool {
        let Shared {
            runner,
            trials,
            live,
            halted,
            stopped,
            ..
        } = self;
        if !matches!(decision, Ok(Decision::Continue))
            || halted.is_some()
            || stopped.is_some()
            || runner.pool_changed
            || runner.checkpoint_due(&trials[index], &Decision::Continue)
        {
            return false;
        }
        runner.take_stops(trials);
        runner.persist(trials, true);
        // With a slot free and nobody waiting for resources, the scheduler
        // or the searcher may have a trial to start after this result.
        *live >= runner.spec.max_concurrent.max(1) || !runner.waiting.is_empty()
    }

    /// Marks the checkpoint that the loop will write for a handed-off
    /// decision as in flight now, under the lock the decision was made in.
    /// Until the loop gets to it, a PBT exploit of this trial (decided on
    /// another thread, by a scheduler that has seen this result) must wait
    /// for that checkpoint, as it would have had the loop decided both (see
    /// `Runner::exploit`), rather than clone an older one or none.
    pub(super) fn mark_saving(&mut self, index: usize, decision: &Result<Decision, String>) {
        let Ok(decision) = decision else {
            return;
        };
        // As the loop carries decisions out (`Event::Settled`).
        let decision = match decision {
            Decision::Stop => decision,
            _ if self.halted.is_some() => &Decision::Pause,
            Decision::Exploit { .. } => return,
            _ => decision,
        };
        if self.runner.checkpoint_due(&self.trials[index], decision) {
            self.runner.saving.insert(index);
        }
    }
}

/// Locks the runner's state.
///
/// `parking_lot`'s lock, not the standard one: trial threads that do
/// little work between results take it back to back, and the standard
/// lock's short spin sent them to sleep on the futex and into convoys
/// (sandboxed results/s 112–138k against 163–214k, `wtune-bench
/// throughput`). It has no poisoning: a panic under the lock is a bug in
/// wtune that the loop reports as such (the task's `JoinError`), and the
/// state is still the best record of the trials, so it is saved.
pub(super) fn lock<B: TrialBackend>(shared: &Mutex<Shared<B>>) -> MutexGuard<'_, Shared<B>> {
    shared.lock()
}

/// The loop's blocking tasks, and the state their trial threads settle
/// results in.
pub(super) struct Tasks<B: TrialBackend> {
    pub(super) set: JoinSet<(usize, Event<B::Session>)>,
    pub(super) shared: Arc<Mutex<Shared<B>>>,
    /// Trial threads waiting for their result's turn in fuel order
    /// ([`turn`]) wait on this.
    pub(super) turns: Arc<Condvar>,
    /// Trials the loop handed back to a training thread since it last
    /// told the fuel order (see `Runner::handed_back`).
    pub(super) handed: Vec<usize>,
}

/// However `Runner::run` returns, trial threads still training stop at
/// their next result (see `Shared::closed`).
impl<B: TrialBackend> Drop for Tasks<B> {
    fn drop(&mut self) {
        lock(&self.shared).closed = true;
        self.turns.notify_all();
    }
}

impl<B: TrialBackend> Tasks<B> {
    /// Trains `session` on a blocking thread until a result needs the loop
    /// (see [`train`]).
    pub(super) fn train(&mut self, index: usize, session: B::Session) {
        let (shared, turns) = (self.shared.clone(), self.turns.clone());
        self.handed.push(index);
        self.set
            .spawn_blocking(move || train(&shared, &turns, index, session));
    }

    /// Stops `session` on a blocking thread: for good, or `pausing`.
    pub(super) fn stop(&mut self, index: usize, session: B::Session, pausing: bool) {
        self.set
            .spawn_blocking(move || (index, stop(session, pausing)));
    }
}

/// Calls `train()` and settles each result on this thread, under the lock,
/// for as long as the trial simply continues
/// ([`Shared::continues_here`]). A trial that stops with no checkpoint due
/// is ended and its session stopped here too ([`Shared::ends_here`]), so
/// the loop only frees its slot; a failure, or any other result whose
/// decision needs the loop, goes to the loop as an event. In fuel order,
/// each result and failure first waits for its turn ([`turn`]), but for the
/// steps redone after a resume, which decide nothing.
pub(super) fn train<B: TrialBackend>(
    shared: &Mutex<Shared<B>>,
    turns: &Condvar,
    index: usize,
    mut session: B::Session,
) -> (usize, Event<B::Session>) {
    let (mut redo, mut replay) = {
        let mut guard = lock(shared);
        let iteration = guard.trials[index].iterations;
        let redo =
            (guard.runner.order.as_mut()).map_or(0, |order| order.redo_left(index, iteration));
        // A step a halted run left pending comes first, if the trial
        // restarted from the checkpoint taken right after it (otherwise it
        // trains that step again). It stays pending until decided on.
        let replays = &mut guard.runner.replays;
        let replay = match replays.get(&index) {
            Some((decided, pending)) if iteration == decided + 1 => Some(pending.clone()),
            Some(_) => {
                replays.remove(&index);
                None
            }
            None => None,
        };
        (redo, replay)
    };
    loop {
        let replayed = replay.is_some();
        let (step, elapsed) = match replay.take() {
            Some(pending) => (Ok(pending.step()), pending.elapsed()),
            None => {
                let begun = Instant::now();
                let step = session.train();
                (step, begun.elapsed())
            }
        };
        let fuel_total = session.fuel_total();
        if redo > 0
            && let Ok(done) = &step
        {
            let mut guard = lock(shared);
            if !guard.closed {
                match guard.redo(index, done, elapsed, fuel_total) {
                    // Criteria tightened on resume end it here: decided
                    // in its turn, as a fresh result would be.
                    Ok(Some(reason)) => {
                        drop(guard);
                        let mut shared = turn(shared, turns, index, Some(fuel_total));
                        if shared.closed {
                            let decision = Err("the run has ended".to_string());
                            return (index, Event::Settled { session, decision });
                        }
                        if shared.halted.is_some() {
                            // Not released: booked, and decided on by the
                            // next resume.
                            shared.hand_to_loop(index, turns);
                            let step = done.clone();
                            let booked = true;
                            return (
                                index,
                                Event::HaltedStep {
                                    session,
                                    step,
                                    elapsed,
                                    booked,
                                },
                            );
                        }
                        let decision = shared.stop_redone(index, (done, elapsed), reason);
                        return hand_on(shared, turns, index, session, decision);
                    }
                    // Halted: the steps left to redo are redone by the
                    // next resume; this one ends at the halt like any
                    // trial that continues, checkpointed and paused. Or
                    // the uninterrupted run checkpointed this step (the
                    // trial went on, so by frequency): it is written
                    // again, since a later exploit clones it and a later
                    // resume may start from it.
                    Ok(None)
                        if guard.halted.is_some()
                            || (guard.runner)
                                .checkpoint_due(&guard.trials[index], &Decision::Continue) =>
                    {
                        let decision = Ok(Decision::Continue);
                        guard.mark_saving(index, &decision);
                        guard.hand_to_loop(index, turns);
                        return (index, Event::Settled { session, decision });
                    }
                    Ok(None) => {
                        redo -= 1;
                        let iteration = guard.trials[index].iterations;
                        if redo == 0
                            && let Some(order) = &mut guard.runner.order
                        {
                            // Every decided step redone: the bound is spent.
                            order.redo_left(index, iteration);
                        }
                        continue;
                    }
                    Err(reason) => {
                        drop(guard);
                        let mut shared = turn(shared, turns, index, Some(fuel_total));
                        shared.hand_to_loop(index, turns);
                        let decision = Err(reason);
                        return (index, Event::Settled { session, decision });
                    }
                }
            }
        }
        let mut shared = turn(shared, turns, index, Some(fuel_total));
        let step = match step {
            Ok(step) => step,
            Err(failure) => {
                shared.hand_to_loop(index, turns);
                let failed = Event::Failed {
                    session,
                    failure,
                    fuel_total,
                };
                return (index, failed);
            }
        };
        if shared.closed {
            // Nobody reads this: the loop is gone.
            let decision = Err("the run has ended".to_string());
            return (index, Event::Settled { session, decision });
        }
        if shared.halted.is_some() && shared.runner.order.is_some() {
            // Not released (see `turn`): the step stays undecided.
            shared.hand_to_loop(index, turns);
            let halted = Event::HaltedStep {
                session,
                step,
                elapsed,
                booked: replayed,
            };
            return (index, halted);
        }
        let decision = shared.settle(index, &step, elapsed, fuel_total, replayed);
        if shared.continues_here(index, &decision) {
            drop(shared);
            turns.notify_all();
            continue;
        }
        return hand_on(shared, turns, index, session, decision);
    }
}

/// Hands on a result decided on this thread that does not simply continue:
/// a trial that ends here has its session stopped here
/// ([`Shared::ends_here`]); anything else goes to the loop.
fn hand_on<B: TrialBackend>(
    mut shared: MutexGuard<'_, Shared<B>>,
    turns: &Condvar,
    index: usize,
    session: B::Session,
    decision: Result<Decision, String>,
) -> (usize, Event<B::Session>) {
    if shared.ends_here(index, &decision) {
        shared.hand_to_loop(index, turns);
        drop(shared);
        return (index, stop(session, false));
    }
    shared.mark_saving(index, &decision);
    shared.hand_to_loop(index, turns);
    (index, Event::Settled { session, decision })
}

/// Longest a thread waiting for its turn sleeps before looking again, in
/// case a wake-up was missed (the run halting, say).
const TURN_RECHECK: Duration = Duration::from_millis(100);

/// Locks the runner's state for an event of trial `index` at its own fuel
/// count `fuel_total` (`None`: where its session started, for a launch
/// that failed or needs the loop). In fuel order, first waits until the
/// event is next ([`FuelOrder`](super::fuel_order::FuelOrder)) and releases
/// it; a closed run (nobody reads its results) releases at once, and a
/// halted one releases nothing (the caller sees `halted`). A trial whose
/// clock is deferred ([`FuelOrder::defer`](super::fuel_order::FuelOrder::defer))
/// first waits for it to start.
pub(super) fn turn<'a, B: TrialBackend>(
    shared: &'a Mutex<Shared<B>>,
    turns: &Condvar,
    index: usize,
    fuel_total: Option<u64>,
) -> MutexGuard<'a, Shared<B>> {
    let mut guard = lock(shared);
    // A trial recovered after a failure learns where its clock starts from
    // another trial's next event; a halted or closed run does not wait.
    let deferred = |guard: &Shared<B>| {
        (guard.runner.order.as_ref()).is_some_and(|order| order.is_deferred(index))
    };
    while deferred(&guard) && guard.halted.is_none() && !guard.closed {
        turns.wait_for(&mut guard, TURN_RECHECK);
    }
    if deferred(&guard) {
        return guard;
    }
    let Some(key) = guard
        .runner
        .order
        .as_ref()
        .and_then(|order| order.key(index, fuel_total.unwrap_or(0)))
    else {
        return guard;
    };
    let order = guard.runner.order.as_mut().expect("checked above");
    order.arrive(index, key.clone());
    // A trial that waited for this one's next event may go now.
    turns.notify_all();
    loop {
        // Nothing is released once the run halts: the halt happened between
        // two events (the last one released), and a resume continues from
        // there, deciding on the steps trials finished since in their turn.
        if guard.halted.is_some() {
            let order = guard.runner.order.as_mut().expect("checked above");
            order.withdraw(index, &key);
            return guard;
        }
        let free = guard.closed;
        let order = guard.runner.order.as_mut().expect("checked above");
        if free || order.is_turn(index, &key) {
            order.release(index, &key);
            return guard;
        }
        turns.wait_for(&mut guard, TURN_RECHECK);
    }
}

impl<B: TrialBackend> Shared<B> {
    /// The event of trial `index` just released goes to the loop: in fuel
    /// order, nothing else is released until the loop is done with it.
    pub(super) fn hand_to_loop(&mut self, index: usize, turns: &Condvar) {
        if let Some(order) = &mut self.runner.order {
            order.hold(index);
            turns.notify_all();
        }
    }
}

/// Books a step that took `elapsed` and brought the trial's session to
/// `fuel_total` on its counters, all but `fuel_total` itself.
pub(super) fn book_step(trial: &mut Trial, elapsed: Duration, fuel_total: u64) {
    let secs = elapsed.as_secs_f64();
    trial.iterations += 1;
    trial.iterations_since_restore += 1;
    trial.time_total_s += secs;
    trial.time_since_restore += secs;
    trial.fuel_since_restore += fuel_total.saturating_sub(trial.fuel_total);
}

/// Books a launched session on its trial: where it starts (a restored
/// checkpoint's iteration, time and fuel), with nothing yet since.
pub(super) fn book_launch<S: TrialSession>(trial: &mut Trial, session: &S) {
    trial.fuel_total = session.fuel_total();
    trial.iterations = session.iteration();
    trial.time_total_s = session.time_restored_s();
    trial.iterations_since_restore = 0;
    trial.time_since_restore = 0.0;
    trial.fuel_since_restore = 0;
}

pub(super) fn stop<S: TrialSession>(session: S, pausing: bool) -> Event<S> {
    Event::Stopped {
        pausing,
        cleanup: session.stop().err(),
    }
}
