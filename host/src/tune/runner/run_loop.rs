//! `Runner::run` as named phases, the way Syne Tune's `Tuner.run` reads:
//! prepare; then, until nothing is left to run, fill the free slots, wait
//! for the next event (a trial thread's, a control request, the deadline,
//! an interrupt) and handle it; then finish.

use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use tokio::task::{JoinError, JoinSet};

use super::admission::Admission;
use super::event::Event;
use super::shared::{Shared, Tasks, lock};
use super::summary::best_trial;
use super::{
    ExperimentSummary, FailFast, RunError, Runner, next_interrupt, next_request, sleep_until,
    trial_id_width,
};
use crate::tune::backend::TrialBackend;
use crate::tune::control::ControlRequest;
use crate::tune::experiment_stop::ExperimentStopper;
use crate::tune::search::Listed;
use crate::tune::trial::{Trial, TrialStatus};

/// What the loop waits for after filling the slots.
struct Wait {
    /// When the experiment stopper's time runs out, if it has a deadline.
    deadline: Option<tokio::time::Instant>,
    /// Nothing runs, but held trials may be resumed by a request: wait for
    /// one instead of ending the run.
    hold_open: bool,
    /// Whether the deadline matters now.
    for_time: bool,
}

impl<B: TrialBackend> Runner<B> {
    /// Runs every trial to completion. Must be called inside a tokio runtime.
    pub async fn run(mut self) -> Result<ExperimentSummary, RunError> {
        let started = Instant::now();
        let trials = self.prepare()?;
        let max_concurrent = self.spec.max_concurrent.max(1);
        // The request and interrupt channels are awaited, so they stay out
        // of the lock (see `Shared`).
        let mut control = self.control.take();
        let mut interrupts = self.interrupts.take();
        let shared = Arc::new(Mutex::new(Shared {
            runner: self,
            trials,
            live: 0,
            halted: None,
            stopped: None,
            started,
            closed: false,
            fill_due: true,
        }));
        let mut tasks = Tasks {
            set: JoinSet::new(),
            shared: shared.clone(),
            turns: Arc::default(),
            handed: Vec::new(),
        };
        let mut interrupted = false;
        loop {
            let wait = lock(&shared).fill_slots(&mut tasks, max_concurrent, control.is_some())?;
            let joined = tokio::select! {
                joined = tasks.set.join_next(), if !wait.hold_open => joined,
                request = next_request(&mut control) => {
                    if let Some(request) = request {
                        lock(&shared).answer(request);
                    }
                    continue;
                }
                () = sleep_until(wait.deadline), if wait.for_time => continue,
                () = next_interrupt(&mut interrupts) => {
                    lock(&shared).interrupt(&mut tasks, &mut interrupted)?;
                    continue;
                }
            };
            let mut guard = lock(&shared);
            match joined {
                None => {
                    if guard.idle()? {
                        break;
                    }
                }
                Some(joined) => guard.dispatch(&mut tasks, joined)?,
            }
        }
        drop(tasks);
        lock(&shared).finish()
    }

    /// Before any trial starts: the searcher over the spec's configs, the
    /// resource pool, the experiment stopper, the callbacks' start and the
    /// first saved state. Returns the trials given with `with_trials`.
    fn prepare(&mut self) -> Result<Vec<Trial>, RunError> {
        let trials = self.trials.take().unwrap_or_default();
        if !self.custom_searcher {
            // The spec's configs, one trial each; saved trials given with
            // `with_trials` are the first of them.
            let mut listed = Listed::new(std::mem::take(&mut self.spec.configs));
            listed.skip(trials.len());
            self.searcher = Box::new(listed);
        }
        let saved_width = trials
            .first()
            .map(|t| t.trial_id.trim_start_matches("trial_").len());
        self.id_width = trial_id_width(self.searcher.total(), saved_width);
        self.pool = self.spec.pool_spec().build().map_err(RunError::Spec)?;
        self.spec
            .resources_per_trial
            .validate()
            .map_err(RunError::Spec)?;
        self.pool
            .check(&self.spec.resources_per_trial)
            .map_err(RunError::Spec)?;
        self.warn_if_resources_cap_concurrency();
        if !self.spec.stop_experiment.is_empty() {
            let mut stopper = ExperimentStopper::new(
                &self.spec.stop_experiment,
                self.spec.metric.as_deref(),
                self.spec.mode,
            )
            .map_err(RunError::Spec)?;
            if let Some(state) = &self.stopper_state {
                stopper.restore_state(state).map_err(RunError::Spec)?;
            }
            self.stopper = Some(stopper);
        }
        // Trials that trained before were set up with this experiment's
        // configs: nothing to probe.
        self.launched_once = trials.iter().any(|t| t.iterations > 0);
        // States written before the count was kept (none given, or 0): what
        // the trials hold, but for the steps a halt left pending, which are
        // on their trials' counters and counted when decided on
        // (`Shared::settle`). A count kept is kept as it is: trials may
        // hold more than was burned (a PBT clone carries its source's).
        if self.fuel_burned == 0 {
            let pending: u64 = (self.resume_moment.iter())
                .flat_map(|moment| &moment.clocks)
                .filter_map(|clock| clock.pending.as_ref().map(|p| p.fuel))
                .sum();
            let held: u64 = trials.iter().map(|t| t.fuel_total).sum();
            self.fuel_burned = held.saturating_sub(pending);
        }
        self.moments_ok = self.resume_moment.is_some() || trials.is_empty();
        if let Some(moment) = self.resume_moment.take()
            && let Some(order) = &mut self.order
        {
            // Only a trial that may start again takes its slot back
            // (`resume::prepare_at` left them PAUSED or PENDING; a state
            // given by other means may not have).
            let index_of = |id: &str| {
                trials.iter().position(|t| {
                    t.trial_id == id
                        && matches!(t.status, TrialStatus::Pending | TrialStatus::Paused)
                })
            };
            order.carry(&moment, index_of);
            self.relaunch = moment
                .clocks
                .iter()
                .filter_map(|clock| index_of(&clock.trial_id))
                .collect();
            self.replays = moment
                .clocks
                .iter()
                .filter_map(|clock| {
                    let pending = clock.pending.clone()?;
                    Some((index_of(&clock.trial_id)?, (clock.iteration, pending)))
                })
                .collect();
            self.decisions_made = moment.decisions;
        }
        for cb in &mut self.callbacks {
            cb.on_experiment_start(&self.spec, &trials)
                .map_err(RunError::Callback)?;
        }
        // The first state, before any trial starts: a callback that cannot
        // save it stops the run now rather than after hours of training.
        if let Some(reason) = self.states(&trials, true).into_iter().next() {
            return Err(RunError::Callback(reason));
        }
        Ok(trials)
    }
}

impl<B: TrialBackend> Shared<B> {
    /// Starts trials while slots and resources are free and the run goes
    /// on (the scheduler's pick, else a new trial from the searcher), and
    /// saves the state; says what the loop waits for next. `listening`: a
    /// controller may still send requests.
    fn fill_slots(
        &mut self,
        tasks: &mut Tasks<B>,
        max_concurrent: usize,
        listening: bool,
    ) -> Result<Wait, RunError> {
        let Shared {
            runner,
            trials,
            live,
            halted,
            stopped,
            started,
            fill_due,
            ..
        } = self;
        if stopped.is_none()
            && let Some(reason) = runner.check_stopper(trials, *started)
        {
            *stopped = Some(reason);
        }
        runner.pool_changed = false;
        // In fuel order a trial starts at the moment of the event just
        // carried out; woken for anything else while a released event waits
        // for the loop, it would start at a moment no other run has.
        let may_start = runner.order.is_none() || *fill_due || *live == 0;
        *fill_due = false;
        while may_start
            && *live < max_concurrent
            && halted.is_none()
            && stopped.is_none()
            // The trials that held slots at a resumed moment were started
            // before (not all had finished launching): the probe, which
            // guards the first starts of a run, does not hold them back.
            && (!runner.relaunch.is_empty() || !runner.probing(*live))
        {
            let Some((index, relaunched)) = runner.pick_next(trials) else {
                break;
            };
            match runner.admit(trials, index, relaunched)? {
                Admission::Start => {}
                Admission::Skip => continue,
                Admission::Wait => break,
            }
            if let Some(setups) = runner.begin(trials, index) {
                *live += 1;
                runner.spawn_launch(tasks, &trials[index], index, None, setups);
            }
        }
        if halted.is_none() {
            // Stops the scheduler decided while no slot was free.
            runner.take_stops(trials);
            // Trials that held slots at the resumed moment and found none
            // now (fewer slots than then) would hold back every later
            // event until they start, which only a later event can let
            // them do: they start when the scheduler picks them, on new
            // clocks. A halted run keeps them for its saved moment.
            if !runner.relaunch.is_empty() {
                let why = format!(
                    "max_concurrent_trials ({max_concurrent}) leaves no slot for {} of the \
                     trials that ran at the moment this run resumes from",
                    runner.relaunch.len()
                );
                runner.give_up_carried(stopped.is_none().then_some(why.as_str()));
            }
        }
        if let Some(order) = &mut runner.order {
            // Trials the loop handed back to threads (after every task it
            // started, parked exploits included); then the moment the loop
            // carried out is over and the next event may be released.
            for index in tasks.handed.drain(..) {
                order.handed_back(index);
            }
            order.loop_done();
        } else {
            tasks.handed.clear();
        }
        tasks.turns.notify_all();
        runner.persist(trials, halted.is_none());
        // Held trials may be resumed: with nothing running, wait for
        // the request rather than end the run.
        let hold_open = tasks.set.is_empty()
            && !runner.held.is_empty()
            && listening
            && halted.is_none()
            && stopped.is_none();
        Ok(Wait {
            deadline: runner.deadline(*started),
            hold_open,
            for_time: (*live > 0 || hold_open) && stopped.is_none(),
        })
    }

    /// Carries out a control request and answers it.
    fn answer(&mut self, request: ControlRequest) {
        let Shared {
            runner,
            trials,
            halted,
            stopped,
            ..
        } = self;
        let command = request.command.clone();
        let outcome = runner.handle(trials, command, halted, stopped.is_some());
        request.answer(outcome);
    }

    /// An interrupt (Ctrl-C): the first halts the run (running trials are
    /// checkpointed and paused); a second while halting leaves at once.
    fn interrupt(&mut self, tasks: &mut Tasks<B>, interrupted: &mut bool) -> Result<(), RunError> {
        let Shared {
            runner,
            trials,
            halted,
            ..
        } = self;
        if halted.is_some() && *interrupted {
            // A second interrupt: leave now. The state on disk lists every
            // trial; running ones resume from their newest checkpoints.
            runner.persist_now(trials, "interrupted twice");
            tasks.set.detach_all();
            return Err(RunError::Interrupted);
        }
        *interrupted = true;
        *halted = Some("interrupted".into());
        Ok(())
    }

    /// No trial thread is left: whether the run ends (`true`) or goes on
    /// (the searcher was told no more trials come).
    fn idle(&mut self) -> Result<bool, RunError> {
        let Shared {
            runner,
            trials,
            halted,
            stopped,
            ..
        } = self;
        if halted.is_some() || stopped.is_some() {
            // Trials still waiting for resources stay PENDING or
            // PAUSED, for `wtune resume`.
            runner.waiting.clear();
            return Ok(true);
        }
        if let Some(&index) = runner.waiting.front() {
            runner.persist_now(trials, "internal error");
            return Err(RunError::Internal(format!(
                "{} waits for resources while no trial holds any",
                trials[index].trial_id
            )));
        }
        let searcher_waits = !runner.search_over
            && trials
                .last()
                .is_none_or(|t| t.status != TrialStatus::Pending);
        if searcher_waits && trials.iter().any(|t| t.status == TrialStatus::Paused) {
            // A concurrency limit counts the trials the scheduler
            // holds paused (synchronous HyperBand waiting for its
            // bracket to fill), so neither side would move again:
            // the scheduler decides with the trials it has.
            tracing::warn!(
                "the {} searcher waits for trials the {} scheduler holds paused; \
                         no more trials are created",
                runner.searcher.name(),
                runner.scheduler.name()
            );
            runner.search_over = true;
            runner.scheduler.on_no_more_trials();
            return Ok(false);
        }
        if searcher_waits {
            // Nothing runs, so nothing will ever change the
            // searcher's mind.
            runner.persist_now(trials, "internal error");
            return Err(RunError::Internal(format!(
                "the {} searcher suggests nothing while no trial runs",
                runner.searcher.name()
            )));
        }
        Ok(true)
    }

    /// Handles what a trial thread handed back, then what a failure means
    /// for the experiment (`fail_fast`).
    fn dispatch(
        &mut self,
        tasks: &mut Tasks<B>,
        joined: Result<(usize, Event<B::Session>), JoinError>,
    ) -> Result<(), RunError> {
        let Shared { runner, trials, .. } = self;
        let (index, event) = match joined {
            Ok(joined) => joined,
            Err(err) => {
                // A panic in wtune's own code on a blocking thread: save
                // what is known before giving up.
                runner.persist_now(trials, "internal error");
                tasks.set.detach_all();
                return Err(RunError::Internal(err.to_string()));
            }
        };
        let was_save = matches!(event, Event::Saved { .. });
        if was_save {
            runner.saving.remove(&index);
        }
        let failed = self.on_event(tasks, index, event);
        if let Some(reason) = self.runner.halt_for.take()
            && self.halted.is_none()
        {
            self.halted = Some(reason);
        }
        self.fill_due = true;
        let Shared {
            runner,
            trials,
            halted,
            stopped,
            ..
        } = self;
        if was_save {
            runner.release_parked(tasks, trials, index, halted.is_some(), stopped.as_deref());
        }
        if let Some(reason) = failed
            && halted.is_none()
        {
            let trial_id = trials[index].trial_id.clone();
            match runner.spec.failure.fail_fast {
                FailFast::Off => {}
                FailFast::Stop => {
                    *halted = Some(format!(
                        "stopped because {trial_id} failed and fail_fast is set"
                    ));
                }
                FailFast::Raise => {
                    runner.persist_now(trials, "a trial failed and fail_fast = \"raise\"");
                    // Sessions still running finish their current call
                    // on their blocking threads and are dropped.
                    tasks.set.detach_all();
                    return Err(RunError::TrialFailed { trial_id, reason });
                }
            }
        }
        Ok(())
    }

    /// The summary, after every callback heard the end (the first error is
    /// reported).
    fn finish(&mut self) -> Result<ExperimentSummary, RunError> {
        let Shared {
            runner,
            trials,
            halted,
            stopped,
            started,
            ..
        } = self;
        let decisions = runner.final_decisions(trials, halted.is_some());
        let ended_mid_event = runner.ends_mid_event(&decisions, halted.is_some());
        let trials = std::mem::take(trials);
        let best = runner
            .spec
            .metric
            .as_deref()
            .and_then(|m| best_trial(&trials, m, runner.spec.mode));
        let summary = ExperimentSummary {
            name: runner.spec.name.clone(),
            output_dir: runner.spec.output_dir.clone(),
            metric: runner.spec.metric.clone(),
            mode: runner.spec.mode,
            trials,
            best,
            wall_time: started.elapsed(),
            halted: halted.take(),
            stopped: stopped.take(),
            ended_mid_event,
            decisions,
        };
        // Every callback gets the end, so one that cannot write (say,
        // experiment.json on a full disk) does not keep the final state
        // from being saved; the first error is reported.
        let mut first_error = None;
        for cb in &mut runner.callbacks {
            if let Err(reason) = cb.on_experiment_end(&summary) {
                first_error.get_or_insert(reason);
            }
        }
        runner.ended(&summary, first_error.is_none());
        match first_error {
            Some(reason) => Err(RunError::Callback(reason)),
            None => Ok(summary),
        }
    }
}
