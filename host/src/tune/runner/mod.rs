//! The runner: an event loop that starts trials up to the concurrency limit,
//! steps them, records results, applies stopping criteria and the
//! scheduler's decisions, and reports to callbacks (files, progress).
//!
//! Trials run on tokio's blocking threads. A result that only continues its
//! trial is settled on that trial's thread, under the lock the loop holds
//! while it handles events (see `Shared`), so the steady state of a run
//! costs no cross-thread handoff per result.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Map, Value};
use tokio::sync::mpsc;

use super::backend::{CheckpointInfo, Step, TrialBackend, TrialFailure, TrialLaunch, TrialSession};
use super::control::{ControlRequest, Requests};
use super::decisions::{AtMoment, Deciders, DecisionState, FuelMoment, PendingStep};
use super::experiment_stop::{ExperimentStopper, Totals};
use super::resources::{Acquire, ResourcePool, Resources};
use super::result;
use super::schedulers::{Decision, Scheduler};
use super::search::{Listed, Searcher, Suggestion};
use super::trial::{Checkpoint, Trial, TrialStatus};

mod admission;
mod callback;
mod checkpoints;
mod error;
mod event;
mod fuel_order;
mod handlers;
mod record;
mod requests;
mod retired;
mod run_loop;
mod shared;
mod spec;
mod summary;

use event::{Event, ParkedExploit, Requested, Then};
use fuel_order::FuelOrder;
use shared::{Tasks, lock, train, turn};

pub use callback::{Callback, TrialSetup};
pub use checkpoints::CHECKPOINT_DIR;
use checkpoints::save;
pub(crate) use checkpoints::{checkpoint_iteration, checkpoint_path};
pub use error::{RunError, STOPPED_BY_REQUEST};
pub use record::DecisionRecord;
use record::ExperimentDir;
pub(crate) use retired::DROPPED_DIR;
use retired::Retired;
pub use spec::{CheckpointPolicy, FailFast, FailurePolicy, ResultOrder, RunSpec};
pub use summary::ExperimentSummary;
pub(crate) use summary::best_trial;

/// The fuel order as state writers see it ([`AtMoment`]).
struct OrderView<'a> {
    order: &'a FuelOrder,
    trials: &'a [Trial],
    decisions: u64,
    at_moment: bool,
    /// Steps of a halted run resumed, not yet decided on.
    replays: &'a HashMap<usize, (u64, PendingStep)>,
}

impl AtMoment for OrderView<'_> {
    fn at_moment(&self) -> bool {
        self.at_moment && self.order.between_events()
    }

    fn moment(&self) -> Option<FuelMoment> {
        if !self.at_moment {
            return None;
        }
        // Taken before any halt: only a resumed halt's steps are pending.
        let pending = self.replays.iter().map(|(&i, (_, p))| (i, p.clone()));
        self.order
            .moment(self.trials, self.decisions, &pending.collect())
    }
}

/// What [`Runner::adopt_from_disk`] calls on each new trial.
type Adopter = Box<dyn FnMut(&mut Trial) + Send>;

/// Runs an experiment's trials on a backend.
pub struct Runner<B: TrialBackend> {
    backend: Arc<B>,
    spec: RunSpec,
    scheduler: Box<dyn Scheduler>,
    searcher: Box<dyn Searcher>,
    /// Whether [`Runner::searcher`] replaced the spec's `configs`.
    custom_searcher: bool,
    /// The searcher finished (or `max_trials` was reached): no more trials.
    search_over: bool,
    /// Looks at each new trial before it is added
    /// ([`Runner::adopt_from_disk`]).
    adopt: Option<Adopter>,
    /// Digits in new trial ids.
    id_width: usize,
    /// What the experiment's trials may hold in all.
    pool: ResourcePool,
    /// Trials chosen to run that wait for resources, first come first
    /// served: a trial that does not fit holds back the others, so that a
    /// large request is not starved by small ones.
    waiting: VecDeque<usize>,
    /// Trials being paused only to change their resources; the runner
    /// itself continues them.
    resizing: HashSet<usize>,
    /// Trials whose checkpoint is being written.
    saving: HashSet<usize>,
    /// PBT exploits waiting for their source's checkpoint in flight, as in
    /// Ray Tune: cloning the previous one would throw away the progress
    /// that made the scheduler pick the source. Each holds the exploiting
    /// trial's session until the source's save ends.
    parked: Vec<ParkedExploit<B::Session>>,
    /// Exploits decided on a trial thread that the loop has yet to carry
    /// out, by the exploiting trial's index: the iterations their source
    /// had completed then. The clone is the checkpoint the scheduler saw,
    /// not one the source took since: that may be where the source ended,
    /// and the clone would train past its stopping criteria. (A note left
    /// by an exploit the halt turned into a pause is replaced by the
    /// trial's next exploit's.)
    ranked_at: HashMap<usize, u64>,
    /// The experiment-level stopping criteria, if any.
    stopper: Option<ExperimentStopper>,
    /// A saved stopper state to continue from.
    stopper_state: Option<Value>,
    /// Fuel burned by every trial's steps, in this run and the runs it
    /// resumes. Unlike the sum of `fuel_total`s, it never goes back when a
    /// trial continues from a checkpoint (a recovery, a PBT exploit), so
    /// `max_fuel` bounds what was really spent.
    fuel_burned: u64,
    callbacks: Vec<Box<dyn Callback>>,
    trials: Option<Vec<Trial>>,
    interrupts: Option<mpsc::UnboundedReceiver<()>>,
    /// Control requests ([`Runner::control`]), taken between events.
    control: Option<Requests>,
    /// What control requests asked of RUNNING trials, carried out when
    /// their current step ends.
    requested: HashMap<usize, Requested>,
    /// PENDING and PAUSED trials a control request holds ([`Trial::held`]).
    /// The scheduler was told they ended (`on_trial_remove`) and sees them
    /// as ERROR until a request resumes them (`on_trial_retry`), so no
    /// scheduler needs to know about holds.
    held: BTreeSet<usize>,
    /// A trial's previous result, overwritten by the next one built (see
    /// `result::record`).
    spare_record: Option<Map<String, Value>>,
    /// Trials the scheduler was told ended because a request holds them
    /// (or held them until their stop): told once, and not again when they
    /// end.
    told: HashSet<usize>,
    /// A scheduler's resize changed what the pool holds since the loop last
    /// started trials: a waiting trial may fit now.
    pool_changed: bool,
    /// Results released in fuel-time order ([`ResultOrder::Fuel`]).
    order: Option<FuelOrder>,
    /// Some result has carried the experiment's metric.
    metric_seen: bool,
    /// Some result has carried the scheduler's `time_attr`.
    time_attr_seen: bool,
    /// Some result has carried `checkpoint_score_attr`: as a number, or as
    /// NaN or an infinity (a diverging trial's), which rank last but show
    /// that the name is right.
    score_seen: bool,
    /// Some trial's session has launched (its `setup` took its config).
    launched_once: bool,
    /// The first trial to launch failed and is retried without end
    /// (`max_failures = -1`): the other slots fill instead of waiting on its
    /// retries (`Runner::probing`).
    probe_retried: bool,
    /// Finished trials continued under new stopping criteria
    /// ([`Runner::extending`]): their checkpoint's result says `done`, which
    /// does not end them.
    extending: HashSet<String>,
    /// Why the run must halt, found while recording a result (the loop
    /// halts it: see `Shared::dispatch`).
    halt_for: Option<String>,
    /// Decisions recorded so far, in this run and the runs it resumes.
    decisions_made: u64,
    /// `spec.output_dir`, as decision records strip it from paths.
    experiment_dir: ExperimentDir,
    /// The saved moment a resumed run in fuel order continues from
    /// ([`Runner::continue_at`]), until the run starts.
    resume_moment: Option<FuelMoment>,
    /// Whether states may mark moments: not in a run that resumed saved
    /// trials without a moment, whose decision count is unknown (a moment
    /// would count from 0, and a later resume cut the record back to it).
    moments_ok: bool,
    /// Trials that held slots at that moment: they take them again before
    /// anything else starts.
    relaunch: VecDeque<usize>,
    /// Steps trials finished after the run halted in fuel order, booked
    /// but not decided on: the halted run's last moment saves them.
    halted_steps: HashMap<usize, PendingStep>,
    /// Trials the halt paused while they held their slot (not those the
    /// scheduler paused, nor ended): in fuel order they keep their clocks,
    /// and the halted run's last moment lists them.
    halt_kept: HashSet<usize>,
    /// Trials whose checkpoint in flight is taken only for the halt
    /// ([`Checkpoint::halt`]).
    halt_saves: HashSet<usize>,
    /// Such steps of a halted run this one resumes: each is decided on, in
    /// its turn, before its trial trains on (`iteration`: the trial's
    /// decided iteration before it).
    replays: HashMap<usize, (u64, PendingStep)>,
    /// Checkpoint files no longer listed, kept until no saved state lists
    /// them.
    retired: Retired,
}

impl<B: TrialBackend> Runner<B> {
    /// A runner for `spec` on `backend`, deciding with `scheduler`.
    pub fn new(backend: B, spec: RunSpec, scheduler: Box<dyn Scheduler>) -> Self {
        let order = (spec.result_order == ResultOrder::Fuel).then(FuelOrder::default);
        let experiment_dir = ExperimentDir::new(&spec.output_dir);
        Self {
            backend: Arc::new(backend),
            spec,
            scheduler,
            searcher: Box::new(Listed::default()),
            custom_searcher: false,
            search_over: false,
            adopt: None,
            id_width: 4,
            pool: ResourcePool::detect(),
            waiting: VecDeque::new(),
            resizing: HashSet::new(),
            saving: HashSet::new(),
            parked: Vec::new(),
            ranked_at: HashMap::new(),
            stopper: None,
            stopper_state: None,
            fuel_burned: 0,
            callbacks: Vec::new(),
            trials: None,
            interrupts: None,
            control: None,
            requested: HashMap::new(),
            held: BTreeSet::new(),
            spare_record: None,
            told: HashSet::new(),
            pool_changed: false,
            order,
            metric_seen: false,
            time_attr_seen: false,
            score_seen: false,
            launched_once: false,
            probe_retried: false,
            extending: HashSet::new(),
            halt_for: None,
            decisions_made: 0,
            experiment_dir,
            resume_moment: None,
            relaunch: VecDeque::new(),
            moments_ok: true,
            halted_steps: HashMap::new(),
            halt_kept: HashSet::new(),
            halt_saves: HashSet::new(),
            replays: HashMap::new(),
            retired: Retired::default(),
        }
    }

    /// Continues a run in fuel order from the saved `moment`
    /// ([`DecisionState::moment`](super::DecisionState::moment)), as if it
    /// had never stopped: the trials that held slots then take them again
    /// first, on their own clocks, and redo the steps already decided on
    /// without deciding again; the decision count goes on from the
    /// moment's. Give the trials and decision makers saved with it, the
    /// trials prepared by [`super::resume::prepare`] with the same moment.
    /// Ignored in arrival order.
    pub fn continue_at(mut self, moment: FuelMoment) -> Self {
        self.resume_moment = Some(moment);
        self
    }

    /// Takes requests from a [`Controller`](super::control::Controller)
    /// between events (see [`Command`]). While a request holds trials and
    /// nothing else runs, the run waits for the next request instead of
    /// ending, until the controller is dropped.
    pub fn control(mut self, requests: Requests) -> Self {
        self.control = Some(requests);
        self
    }

    /// Each message on `interrupts` is one interrupt (Ctrl-C, say). The
    /// first stops new trials, checkpoints the running ones after their
    /// current step and releases them PAUSED, and ends the run (`halted` in
    /// the summary); a second ends it at once with
    /// [`RunError::Interrupted`], the state saved.
    pub fn interrupts(mut self, interrupts: mpsc::UnboundedReceiver<()>) -> Self {
        self.interrupts = Some(interrupts);
        self
    }

    /// Continues an earlier experiment: its saved trials (see
    /// `report::state`) come first, and new ones are numbered after them.
    /// PENDING and PAUSED trials run; the rest are kept as they are. Give
    /// the searcher its saved state too, or one that is finished.
    pub fn with_trials(mut self, trials: Vec<Trial>) -> Self {
        self.note_reported(&trials);
        self.trials = Some(trials);
        self
    }

    /// Counts the names the saved trials' last results carry as seen: a
    /// result without the metric (or the scheduler's `time_attr`, or
    /// `checkpoint_score_attr`) halts a run only while no result has shown
    /// the name to be right, and a resumed run's first result is not its
    /// experiment's first.
    fn note_reported(&mut self, trials: &[Trial]) {
        let time_attr = self.scheduler.time_attr();
        let score = self.spec.checkpoint.score_field().map(|(field, _)| field);
        for record in trials.iter().filter_map(|t| t.last_result.as_ref()) {
            if let Some(metric) = &self.spec.metric {
                self.metric_seen |= record.contains_key(metric);
            }
            if let Some(attr) = time_attr {
                self.time_attr_seen |= record.get(attr).and_then(Value::as_f64).is_some();
            }
            if let Some(field) = score {
                self.score_seen |= record.contains_key(field);
            }
        }
    }

    /// Calls `adopt` on each new trial before it is added, so that it can
    /// pick up what an earlier run of this experiment left in its directory
    /// (`wtune resume` passes [`super::resume::adopt_reported`]: the saved
    /// state may be older than the trials on disk).
    pub fn adopt_from_disk(mut self, adopt: impl FnMut(&mut Trial) + Send + 'static) -> Self {
        self.adopt = Some(Box::new(adopt));
        self
    }

    /// Creates trials lazily from `searcher`'s suggestions instead of the
    /// spec's `configs`, one whenever a trial can start and the scheduler
    /// has no waiting trial to run.
    pub fn searcher(mut self, searcher: Box<dyn Searcher>) -> Self {
        self.searcher = searcher;
        self.custom_searcher = true;
        self
    }

    /// Continues the experiment-level stopper from its saved state
    /// ([`DecisionState::stopper`]), so that time spent in earlier runs
    /// counts toward `max_time`.
    pub fn stopper_state(mut self, state: Value) -> Self {
        self.stopper_state = Some(state);
        self
    }

    /// Trials (by id) that ended under the saved stopping criteria and go
    /// on under new ones (`wtune resume --stop`): restored from a
    /// checkpoint taken at their last result, they train on unless the
    /// spec's criteria end them.
    pub fn extending(mut self, trial_ids: impl IntoIterator<Item = String>) -> Self {
        self.extending.extend(trial_ids);
        self
    }

    /// Continues the count of fuel burned in earlier runs
    /// ([`DecisionState::fuel_burned`]), which `max_fuel` bounds.
    pub fn fuel_burned(mut self, burned: u64) -> Self {
        self.fuel_burned = burned;
        self
    }

    /// Adds an observer; callbacks run in the order added.
    pub fn callback(mut self, callback: impl Callback + 'static) -> Self {
        self.callbacks.push(Box::new(callback));
        self
    }

    /// Says so when the pool, not `max_concurrent`, bounds how many trials
    /// run at once (as Ray Tune, each trial asks one CPU by default), so a
    /// user who asked for more parallelism learns which key to change.
    fn warn_if_resources_cap_concurrency(&self) {
        let asked = self.spec.max_concurrent.max(1);
        if let Some(cap) = self.pool.capacity(&self.spec.resources_per_trial)
            && cap.trials < asked
        {
            // In fuel order, how many run at once shapes the decisions.
            let differ = match self.order {
                Some(_) => "; decisions in fuel order then differ from a machine where all fit",
                None => "",
            };
            tracing::warn!(
                "at most {} trial(s) can run at once, not max_concurrent_trials = {asked}: \
                 each asks resources_per_trial.{key} = {} of the experiment's {}; lower \
                 resources_per_trial.{key} or raise resources.{key}{differ}",
                cap.trials,
                cap.asked,
                cap.total,
                key = cap.key,
            );
        }
    }

    /// What `trial` asks of the pool.
    fn request<'t>(&'t self, trial: &'t Trial) -> &'t Resources {
        trial
            .resources
            .as_ref()
            .unwrap_or(&self.spec.resources_per_trial)
    }

    /// A step took `trial` to `fuel_total`: counts what it burned.
    fn burn(&mut self, trial: &mut Trial, fuel_total: u64) {
        self.fuel_burned = self
            .fuel_burned
            .saturating_add(fuel_total.saturating_sub(trial.fuel_total));
        trial.fuel_total = fuel_total;
    }

    /// The experiment's fuel time of the event being carried out, in fuel
    /// order.
    fn fuel_time(&self) -> Option<u64> {
        self.order.as_ref().map(FuelOrder::now)
    }

    /// Tells every callback of `record` (a callback's error is logged: a
    /// record that cannot be kept does not change the run).
    fn decided(&mut self, record: DecisionRecord) {
        let record = record.relative_to(&mut self.experiment_dir);
        self.decisions_made += 1;
        for cb in &mut self.callbacks {
            if let Err(reason) = cb.on_decision(&record) {
                tracing::warn!(trial = %record.trial_id, "{reason}");
            }
        }
    }

    /// A launch failed with `reason`. When no trial has launched yet and
    /// the trainable's SDK says the config does not fit its config type
    /// (a field the space lacks, a value of the wrong type), every trial
    /// would fail the same way: the run halts once, saying so.
    fn launch_failed(&mut self, reason: &str) {
        if !self.launched_once && reason.contains(SDK_CONFIG_ERROR) {
            self.halt_for = Some(format!(
                "{reason}; no trial has started with the configs this experiment makes, so no \
                 more start: check param_space (and --config) against the trainable's config"
            ));
        }
    }

    /// Records what was decided on trial `index`'s result.
    fn decided_on(&mut self, trials: &[Trial], index: usize, decision: &Decision) {
        let trial = &trials[index];
        let why = match decision {
            Decision::Stop => trial.stop_reason.clone(),
            Decision::Exploit { source, .. } => trials
                .get(*source)
                .map(|s| format!("clones {}", s.trial_id)),
            _ => None,
        };
        let name = record::decision_name(decision);
        self.decided(DecisionRecord::new(trial, self.fuel_time(), name).why(why));
    }

    /// Gives up the promise of a run resumed at a saved moment that the
    /// trials which held slots then take them back before anything else
    /// happens (`continue_at`): they start when the scheduler picks them,
    /// on new clocks. `why`, when said, is warned: from here, decisions may
    /// differ from an uninterrupted run's.
    fn give_up_carried(&mut self, why: Option<&str>) {
        self.relaunch.clear();
        if let Some(order) = &mut self.order
            && order.drop_carried()
            && let Some(why) = why
        {
            tracing::warn!(
                "{why}: from here, decisions may differ from those of an uninterrupted run"
            );
        }
    }

    /// Whether the first trial to launch is still the only one starting,
    /// with `live` trials running. Until one trial's `setup` has taken its
    /// config, one launches at a time: a space that does not fit the
    /// trainable's config type (or a component every setup refuses) then
    /// fails one trial, not a whole slot's worth, before the run halts
    /// (`launch_failed`). It costs one setup's wait at the start. A first
    /// trial retried under `max_failures = -1` ends the probe: its retries
    /// might never end.
    fn probing(&self, live: usize) -> bool {
        !self.launched_once && !self.probe_retried && live > 0
    }

    /// Trial `index`'s session was launched and booked: in fuel order, its
    /// clock counts from the fuel it starts with.
    fn launched(&mut self, trials: &[Trial], index: usize) {
        self.launched_once = true;
        if let Some(order) = &mut self.order {
            order.launched(index, trials[index].fuel_total);
        }
    }

    fn totals(&self, trials: &[Trial], started: Instant) -> Totals {
        Totals {
            elapsed_s: started.elapsed().as_secs_f64(),
            fuel_total: self.fuel_burned,
            trials_created: trials.len(),
        }
    }

    /// The experiment-level criteria that hold without a new result
    /// (time, fuel).
    fn check_stopper(&mut self, trials: &[Trial], started: Instant) -> Option<String> {
        let totals = self.totals(trials, started);
        self.stopper.as_mut()?.check(totals)
    }

    /// When `max_time` runs out, if it is set.
    fn deadline(&self, started: Instant) -> Option<tokio::time::Instant> {
        let max = self.spec.stop_experiment.max_time?;
        let stopper = self.stopper.as_ref()?;
        let now = started.elapsed().as_secs_f64();
        let before = (stopper.elapsed_s() - now).max(0.0);
        let left = Duration::try_from_secs_f64((max - before).max(0.0)).ok()?;
        // A deadline past what the clock can represent is no deadline.
        tokio::time::Instant::from_std(started).checked_add(left)
    }

    /// What follows a recorded result besides the scheduler's decision:
    /// the experiment-level stopper, and resource changes.
    fn after_result(
        &mut self,
        trials: &mut [Trial],
        index: usize,
        decision: Decision,
        started: Instant,
        stopped: &mut Option<String>,
    ) -> Decision {
        let totals = self.totals(trials, started);
        if stopped.is_none()
            && let Some(stopper) = self.stopper.as_mut()
            && let Some(record) = trials[index].last_result.as_ref()
            && let Some(reason) = stopper.on_result(&trials[index].trial_id, record, totals)
        {
            tracing::info!("experiment stopping: {reason}");
            *stopped = Some(reason);
        }
        if let Some(reason) = stopped.as_ref() {
            if decision != Decision::Stop {
                trials[index].stop_reason = Some(format!("the experiment stopped: {reason}"));
            }
            return Decision::Stop;
        }
        if decision != Decision::Continue {
            return decision;
        }
        let Some(resources) = self.scheduler.resources(&trials[index]) else {
            return decision;
        };
        if &resources == self.request(&trials[index]) {
            return decision;
        }
        let trial_id = trials[index].trial_id.clone();
        if resources.memory != self.request(&trials[index]).memory {
            // The sandbox's memory cap is set when it starts: a new
            // reservation takes a relaunch, from a checkpoint.
            trials[index].resources = Some(resources);
            self.resizing.insert(index);
            return Decision::Pause;
        }
        match self.pool.resize(&trial_id, &resources) {
            Ok(Acquire::Granted) => {
                trials[index].resources = Some(resources);
                self.pool_changed = true;
                decision
            }
            Ok(Acquire::Wait) => {
                // Continues, with the new resources, once they are free.
                trials[index].resources = Some(resources);
                self.resizing.insert(index);
                Decision::Pause
            }
            Err(reason) => {
                tracing::warn!(trial = %trial_id, "the {} scheduler's resource change is refused: {reason}", self.scheduler.name());
                decision
            }
        }
    }

    /// Whether `trial` is checkpointed before it goes on as `decision`
    /// says.
    fn checkpoint_due(&self, trial: &Trial, decision: &Decision) -> bool {
        let already = trial
            .latest_checkpoint()
            .is_some_and(|c| c.iteration == trial.iterations);
        self.wants_checkpoint(trial, decision) && !already
    }

    /// Whether `decision` on `trial`'s last result calls for a checkpoint
    /// there, whether or not it has one.
    fn wants_checkpoint(&self, trial: &Trial, decision: &Decision) -> bool {
        let policy = &self.spec.checkpoint;
        let periodic = policy.freq > 0 && trial.iterations.is_multiple_of(policy.freq);
        match Then::after(decision) {
            Then::Train => periodic || *decision == Decision::Checkpoint,
            Then::Stop => periodic || policy.at_end,
            // A pause must leave a checkpoint to continue from.
            Then::Pause => true,
        }
    }

    /// A step a halted run left pending was just decided on: if the
    /// decision calls for a checkpoint there, the one taken for the halt
    /// (of the same state) becomes that checkpoint, as an uninterrupted
    /// run would have written it.
    fn adopt_halt_checkpoint(&mut self, trials: &mut [Trial], index: usize, decision: &Decision) {
        let trial = &mut trials[index];
        let at_halt = trial
            .latest_checkpoint()
            .is_some_and(|c| c.halt && c.iteration == trial.iterations);
        if at_halt
            && self.wants_checkpoint(trial, decision)
            && let Some(mut checkpoint) = trial.checkpoints.pop()
        {
            checkpoint.halt = false;
            // Taken before the step's result was recorded, it was scored
            // with the result before; the step's own scores it now.
            checkpoint.score = self.spec.checkpoint.score(trial.last_result.as_ref());
            self.keep(trials, index, checkpoint);
        }
    }

    /// Asks the searcher for a new trial when the scheduler has nothing to
    /// run, and returns the trial the scheduler then picks. Creates nothing
    /// while the newest trial still waits to start, so that a scheduler
    /// holding trials back cannot make the list grow without end.
    fn create_trial(&mut self, trials: &mut Vec<Trial>) -> Option<usize> {
        if self.search_over
            || trials
                .last()
                .is_some_and(|t| t.status == TrialStatus::Pending && !t.held)
        {
            return None;
        }
        if self
            .stopper
            .as_ref()
            .is_some_and(|s| !s.may_create_trial(trials.len()))
        {
            self.search_over = true;
            self.scheduler.on_no_more_trials();
            return self.choose_next(trials);
        }
        let trial_id = format!("trial_{:0width$}", trials.len(), width = self.id_width);
        match self.searcher.suggest(&trial_id) {
            Suggestion::Config(config) => {
                let dir = self.spec.output_dir.join(&trial_id);
                let mut trial = Trial::new(trial_id, config, dir);
                trial.restore_from = self.spec.restore_from.clone();
                if let Some(adopt) = &mut self.adopt {
                    adopt(&mut trial);
                    // What it burned in the interrupted run, up to the
                    // checkpoint it continues from: the saved count, older
                    // than the trial, holds none of it.
                    self.fuel_burned = self.fuel_burned.saturating_add(trial.fuel_total);
                }
                trials.push(trial);
                self.scheduler.on_trial_add(&trials[trials.len() - 1]);
            }
            Suggestion::Wait => return None,
            Suggestion::Finished => {
                self.search_over = true;
                self.scheduler.on_no_more_trials();
            }
        }
        self.choose_next(trials)
    }

    /// The scheduler's pick, after ending the trials it stopped while
    /// they waited.
    fn choose_next(&mut self, trials: &mut [Trial]) -> Option<usize> {
        self.take_stops(trials);
        self.with_held_hidden(trials, |scheduler, trials| scheduler.choose_next(trials))
    }

    /// Runs `f` on the scheduler with the held trials shown as ERROR, which
    /// is what the scheduler was told of them (see `Runner::held`).
    fn with_held_hidden<R>(
        &mut self,
        trials: &mut [Trial],
        f: impl FnOnce(&mut dyn Scheduler, &[Trial]) -> R,
    ) -> R {
        let shown: Vec<(usize, TrialStatus)> =
            self.held.iter().map(|&i| (i, trials[i].status)).collect();
        for &(index, _) in &shown {
            trials[index].status = TrialStatus::Error;
        }
        let out = f(self.scheduler.as_mut(), trials);
        for (index, status) in shown {
            trials[index].status = status;
        }
        out
    }

    /// Forgets what control requests asked of a trial that ends.
    fn release_hold(&mut self, trials: &mut [Trial], index: usize) {
        self.requested.remove(&index);
        self.held.remove(&index);
        self.told.remove(&index);
        trials[index].held = false;
    }

    /// Tells the scheduler that a trial a request holds or stops has ended
    /// (see `Runner::held`), once.
    fn tell_ended(&mut self, trials: &[Trial], index: usize) {
        if self.told.insert(index) {
            self.scheduler.on_trial_remove(&trials[index]);
        }
    }

    /// Ends the PENDING and PAUSED trials the scheduler stopped
    /// ([`Scheduler::take_stops`]).
    fn take_stops(&mut self, trials: &mut [Trial]) {
        let stops = self.with_held_hidden(trials, |scheduler, trials| scheduler.take_stops(trials));
        for index in stops {
            let Some(trial) = trials.get_mut(index) else {
                tracing::warn!(
                    "the {} scheduler stopped trial index {index}, which does not exist",
                    self.scheduler.name()
                );
                continue;
            };
            if !matches!(trial.status, TrialStatus::Pending | TrialStatus::Paused) {
                tracing::warn!(trial = %trial.trial_id, "the {} scheduler stopped it while {}", self.scheduler.name(), trial.status);
                continue;
            }
            trial.stop_reason = Some(format!(
                "stopped by the {} scheduler",
                self.scheduler.name()
            ));
            self.waiting.retain(|&i| i != index);
            self.end(trials, index);
        }
    }

    /// Starts `trial` on a blocking thread (from its newest checkpoint when
    /// it has one), first stopping `previous`, the failed session it
    /// replaces, and running the callbacks' `setups` for a trial starting.
    fn spawn_launch(
        &mut self,
        tasks: &mut Tasks<B>,
        trial: &Trial,
        index: usize,
        previous: Option<B::Session>,
        setups: Vec<TrialSetup>,
    ) {
        let mut carried = false;
        if let Some(order) = &mut self.order {
            // The trial takes its slot at the moment being carried out.
            carried = order.start(index, &trial.trial_id);
            order.handed_back(index);
        }
        // A trial taking back the slot it held at a resumed moment was
        // started then, and recorded so.
        if !carried {
            let from = trial
                .latest_checkpoint()
                .map(|c| format!("from its checkpoint at iteration {}", c.iteration));
            self.decided(DecisionRecord::new(trial, self.fuel_time(), "START").why(from));
        }
        let launch = TrialLaunch {
            trial_id: trial.trial_id.clone(),
            config: trial.config.clone(),
            trial_dir: trial.dir.clone(),
            restore: trial.restore_path(),
            resources: self.request(trial).clone(),
            gpus: self.pool.gpus_of(&trial.trial_id).to_vec(),
        };
        let backend = self.backend.clone();
        let (shared, turns) = (tasks.shared.clone(), tasks.turns.clone());
        tasks.set.spawn_blocking(move || {
            if let Some(previous) = previous {
                // Lets the failed trainable flush its logs; it may refuse
                // (a trapped instance does).
                let _ = previous.stop();
            }
            // What the loop must carry out goes to it in its turn, at the
            // moment the trial started.
            let hand_over = |event| {
                turn(&shared, &turns, index, None).hand_to_loop(index, &turns);
                (index, event)
            };
            for setup in setups {
                if let Err(reason) = setup() {
                    return hand_over(Event::SetupFailed(reason));
                }
            }
            let session = match backend.launch(&launch) {
                Ok(session) => session,
                Err(failure) => return hand_over(Event::Launched(Err(failure))),
            };
            if !lock(&shared).trains_here(index, &session) {
                return hand_over(Event::Launched(Ok(session)));
            }
            train(&shared, &turns, index, session)
        });
    }

    /// After a successful step: checkpoint if due, then continue, stop or
    /// pause.
    fn after_step(
        &mut self,
        tasks: &mut Tasks<B>,
        trials: &mut [Trial],
        index: usize,
        session: B::Session,
        decision: Decision,
    ) {
        let then = Then::after(&decision);
        if self.checkpoint_due(&trials[index], &decision) {
            if let Err(reason) = self.each(|cb, t| cb.before_checkpoint(t, index), trials) {
                // Marked when the decision was made (`Shared::mark_saving`).
                self.saving.remove(&index);
                self.fail(trials, index, reason);
                tasks.stop(index, session, false);
                return;
            }
            let trial = &trials[index];
            self.saving.insert(index);
            let path = checkpoint_path::<B>(trial.iterations);
            let score = self.spec.checkpoint.score(trial.last_result.as_ref());
            let trial_id = trial.trial_id.clone();
            let config = trial.config.clone();
            let result = trial.last_result.clone();
            let dir = trial.dir.clone();
            let (iteration, time_total_s) = (trial.iterations, trial.time_total_s);
            tasks.set.spawn_blocking(move || {
                let mut session = session;
                let info = CheckpointInfo {
                    trial_id: &trial_id,
                    config: &config,
                    iteration,
                    time_total_s,
                    result: result.as_ref(),
                };
                let saved = save(&mut session, &dir, &path, &info).map(|bytes| Checkpoint {
                    path,
                    iteration,
                    time_total_s,
                    fuel_total: session.fuel_total(),
                    score,
                    bytes,
                    halt: false,
                });
                (
                    index,
                    Event::Saved {
                        session,
                        saved,
                        then,
                    },
                )
            });
            return;
        }
        match then {
            Then::Train => {
                tasks.train(index, session);
            }
            Then::Stop => {
                self.end(trials, index);
                tasks.stop(index, session, false);
            }
            Then::Pause => {
                tasks.stop(index, session, true);
            }
        }
    }

    /// PBT's exploit: `index` takes a copy of `source`'s newest checkpoint
    /// by iteration `ranked_at` (where the source was when the exploit was
    /// decided) as its own and relaunches from it with `config`; never one
    /// the source ended at, from which the trial would train past that end.
    /// The copy is a hard link where the file system allows (checkpoint
    /// files are never changed once written, and deleting one name keeps
    /// the other).
    fn exploit(
        &mut self,
        tasks: &mut Tasks<B>,
        trials: &mut [Trial],
        index: usize,
        session: B::Session,
        (source, ranked_at): (usize, u64),
        config: Value,
    ) {
        if self.saving.contains(&source) {
            tracing::debug!(trial = %trials[index].trial_id, source = %trials[source].trial_id, "exploit waits for the source's checkpoint");
            self.parked.push(ParkedExploit {
                index,
                session,
                source,
                ranked_at,
                config,
            });
            return;
        }
        let cloned = trials
            .get(source)
            .filter(|_| source != index)
            .and_then(|t| Some((t, t.clone_at(ranked_at)?.clone())));
        let Some((source_trial, checkpoint)) = cloned else {
            tracing::warn!(trial = %trials[index].trial_id, "the {} scheduler asked to clone trial index {source}, which has no checkpoint; continuing", self.scheduler.name());
            self.scheduler.on_exploit_skipped(&trials[index]);
            tasks.train(index, session);
            return;
        };
        if source_trial.ended_at(&checkpoint) {
            tracing::warn!(
                trial = %trials[index].trial_id,
                "the {} scheduler asked to clone {}'s checkpoint at iteration {}, where it ended ({}); \
                 training on from there would go past that, so the trial continues on its own",
                self.scheduler.name(),
                source_trial.trial_id,
                checkpoint.iteration,
                source_trial.stop_reason.as_deref().unwrap_or_default()
            );
            self.scheduler.on_exploit_skipped(&trials[index]);
            tasks.train(index, session);
            return;
        }
        let (source_id, source_dir) = (source_trial.trial_id.clone(), source_trial.dir.clone());
        if let Err(reason) = self.each(|cb, t| cb.before_checkpoint(t, index), trials) {
            self.fail(trials, index, reason);
            tasks.stop(index, session, false);
            return;
        }
        let wait = self.listing_trusted();
        let trial = &mut trials[index];
        let path = checkpoint_path::<B>(checkpoint.iteration);
        let (from, to) = (source_dir.join(&checkpoint.path), trial.dir.join(&path));
        // The clone is made beside its place first: when it cannot be, the
        // trial goes on, its own checkpoints untouched.
        let staged = match crate::persist::stage_copy(&from, &to) {
            Ok(staged) => staged,
            Err(e) => {
                tracing::warn!(trial = %trial.trial_id, "cannot clone {source_id}'s checkpoint, continuing: copying {} to {}: {e}", from.display(), to.display());
                self.scheduler.on_exploit_skipped(&trials[index]);
                tasks.train(index, session);
                return;
            }
        };
        // The trial's own checkpoints from this iteration on belong to the
        // trajectory it leaves: recovery and `wtune resume` continue from
        // the newest checkpoint on disk, which must be the clone.
        self.retired
            .unlist(trial, wait, |_, own| own.iteration >= checkpoint.iteration);
        if let Err(e) = staged.put(&to) {
            // A rename within one directory, which should not fail: the
            // trial fails as on any checkpoint it cannot write.
            let reason = format!(
                "putting {}'s checkpoint in place at {}: {e}",
                source_id,
                to.display()
            );
            self.fail(trials, index, reason);
            tasks.stop(index, session, false);
            return;
        }
        tracing::debug!(trial = %trial.trial_id, from = %source_id, iteration = checkpoint.iteration, "exploit");
        trial.config = config;
        self.keep(trials, index, Checkpoint { path, ..checkpoint });
        self.notify(trials, index, |cb, t| cb.on_checkpoint(t, index));
        self.spawn_launch(tasks, &trials[index], index, Some(session), Vec::new());
    }

    /// Carries out the exploits that waited for `source`'s checkpoint, now
    /// written (or failed: they clone the newest one it had when they were
    /// decided, as `exploit` does). When the run is halting, the waiting
    /// trials are checkpointed and paused instead, on their own trajectory;
    /// when the experiment stopper fired, they end TERMINATED there.
    fn release_parked(
        &mut self,
        tasks: &mut Tasks<B>,
        trials: &mut [Trial],
        source: usize,
        halting: bool,
        stopped: Option<&str>,
    ) {
        let (ready, waiting) = std::mem::take(&mut self.parked)
            .into_iter()
            .partition(|p| p.source == source);
        self.parked = waiting;
        for parked in ready {
            // In fuel order the exploit was decided before the moment the
            // run halted at, so it is carried out (the clone then pauses
            // as it launches), as a resume expects.
            if halting && self.order.is_none() {
                self.scheduler.on_exploit_skipped(&trials[parked.index]);
                self.after_step(tasks, trials, parked.index, parked.session, Decision::Pause);
            } else if let Some(reason) = stopped {
                // The experiment stopped while the exploit waited: the trial
                // ends where it is, as its next result would have ended it
                // (`after_result`), rather than being relaunched from the
                // clone only to be stopped.
                trials[parked.index].stop_reason =
                    Some(format!("the experiment stopped: {reason}"));
                self.after_step(tasks, trials, parked.index, parked.session, Decision::Stop);
            } else {
                self.exploit(
                    tasks,
                    trials,
                    parked.index,
                    parked.session,
                    (parked.source, parked.ranked_at),
                    parked.config,
                );
            }
        }
    }

    /// A trial failed: recover it from its newest checkpoint if
    /// `max_failures` allows, else end it as ERROR. Returns the reason when
    /// the trial ended.
    fn failure(
        &mut self,
        tasks: &mut Tasks<B>,
        trials: &mut [Trial],
        index: usize,
        session: Option<B::Session>,
        failure: TrialFailure,
        halted: Option<&str>,
    ) -> Option<String> {
        let trial = &mut trials[index];
        let allowed = failure.retryable
            && match self.spec.failure.max_failures {
                None => true,
                Some(max) => trial.num_failures < max,
            };
        let reason = failure.reason;
        let release = |tasks: &mut Tasks<B>, session| match session {
            Some(session) => {
                tasks.stop(index, session, false);
            }
            // Nothing to stop: free the slot through the same event.
            None => {
                tasks.set.spawn(async move {
                    (
                        index,
                        Event::Stopped {
                            pausing: false,
                            cleanup: None,
                        },
                    )
                });
            }
        };
        if allowed && let Some(halted) = halted {
            // The run is ending: count the failure and leave the trial to
            // be continued by `wtune resume`, as a retry would have. In fuel
            // order the failure came after the moment the run halted at:
            // the resume meets it again in its turn, if it recurs, and the
            // trial held its slot then.
            if self.order.is_some() {
                self.halt_kept.insert(index);
            } else {
                trial.num_failures += 1;
            }
            tracing::debug!(trial = %trial.trial_id, "failed while halting: {reason}");
            self.halt_trial(trials, index, halted);
            release(tasks, session);
            return None;
        }
        if allowed {
            trial.num_failures += 1;
            tracing::debug!(trial = %trial.trial_id, failures = trial.num_failures, "recovering: {reason}");
            let record = DecisionRecord::new(trial, self.fuel_time(), "RECOVER");
            self.decided(record.why(Some(reason.clone())));
            self.notify(trials, index, |cb, t| {
                cb.on_trial_recover(t, index, &reason)
            });
            self.spawn_launch(tasks, &trials[index], index, session, Vec::new());
            if let Some(order) = &mut self.order {
                order.defer(index);
            }
            self.probe_retried |= self.spec.failure.max_failures.is_none();
            return None;
        }
        let record = DecisionRecord::new(&trials[index], self.fuel_time(), "ERROR");
        self.decided(record.why(Some(reason.clone())));
        self.fail(trials, index, reason.clone());
        release(tasks, session);
        Some(reason)
    }

    /// Whether dropped checkpoint files wait for the saved states to move
    /// past them ([`Retired`]): only where a resume trusts the listing.
    fn listing_trusted(&self) -> bool {
        self.order.is_some() && self.moments_ok
    }

    /// Records trial `index`'s checkpoint and drops those `keep_num` no
    /// longer keeps.
    fn keep(&mut self, trials: &mut [Trial], index: usize, checkpoint: Checkpoint) {
        let wait = self.listing_trusted();
        let trial = &mut trials[index];
        // A trial that recovered may checkpoint the same iteration again.
        trial.checkpoints.retain(|c| c.path != checkpoint.path);
        if checkpoint.halt {
            // Outside the policy: it only carries the trial over the halt.
            trial.checkpoints.push(checkpoint);
            return;
        }
        // The trial is past the halt it carried the trial over.
        self.retired.unlist(trial, wait, |_, c| c.halt);
        trial.checkpoints.push(checkpoint);
        let policy = &self.spec.checkpoint;
        let Some(keep) = policy.keep_num else {
            return;
        };
        if trial.checkpoints.len() <= keep {
            return;
        }
        if let Some((field, _)) = policy.score_field()
            && !self.score_seen
        {
            // Nothing to rank by: a misspelt `checkpoint_score_attr`, most
            // likely, under which the newest would be kept and the best
            // deleted. Nothing is deleted; the run halts, resumable.
            let reported: Vec<&str> = trial
                .last_result
                .iter()
                .flat_map(|r| r.keys().map(String::as_str))
                .filter(|k| !result::AUTO_FIELDS.contains(k) && *k != "config")
                .collect();
            self.halt_for = Some(format!(
                "checkpoint_score_attr `{field}` is in no result so far (the \
                 trainable reports: {}), so checkpoints cannot be ranked and none is deleted; \
                 no more trials start: check `checkpoint_score_attr` in the experiment file",
                reported.join(", ")
            ));
            return;
        }
        let newest = trial.checkpoints.len() - 1;
        let mut ranked: Vec<usize> = (0..trial.checkpoints.len()).collect();
        if let Some((_, higher_is_better)) = policy.score_field() {
            let key = |i: &usize| {
                let score = trial.checkpoints[*i].score.filter(|s| s.is_finite());
                score.map(|s| if higher_is_better { s } else { -s })
            };
            // Best first; checkpoints without a score rank last, newest
            // first among equals.
            ranked.sort_by(|a, b| {
                key(b)
                    .partial_cmp(&key(a))
                    .unwrap_or(std::cmp::Ordering::Equal)
                    .then(b.cmp(a))
            });
        } else {
            ranked.reverse();
        }
        let kept: Vec<usize> = ranked.into_iter().take(keep).collect();
        self.retired
            .unlist(trial, wait, |at, _| !kept.contains(&at) && at != newest);
    }

    /// Turns a step into a result record, applies stopping criteria and the
    /// scheduler, and reports it. `Err` is a reason to fail the trial.
    fn record(
        &mut self,
        trials: &mut [Trial],
        index: usize,
        step: &Step,
        elapsed: Duration,
    ) -> Result<Decision, String> {
        let trial = &trials[index];
        let reuse = self.spare_record.take();
        let mut record = result::record(trial, step, elapsed, false, reuse)?;
        if let Some(metric) = &self.spec.metric {
            if !record.contains_key(metric) {
                let reason = format!(
                    "the experiment's metric `{metric}` is not in the trainable's report (it \
                     reports: {})",
                    reported(step)
                );
                if !self.metric_seen {
                    // No result has ever carried it: a misspelt `metric`,
                    // most likely, that every trial would fail on.
                    self.halt_for = Some(format!(
                        "{reason}; no result has reported it, so no more trials start: check \
                         `metric` in the experiment file"
                    ));
                }
                return Err(reason);
            }
            self.metric_seen = true;
        }
        if let Some(attr) = self.scheduler.time_attr() {
            if record.get(attr).and_then(Value::as_f64).is_none() {
                let reason = format!(
                    "the scheduler's time_attr `{attr}` is not a number in the trainable's \
                     report (it reports: {})",
                    reported(step)
                );
                if !self.time_attr_seen {
                    // Without it no trial would ever reach a rung or end.
                    self.halt_for = Some(format!(
                        "{reason}; no result has reported it, so no more trials start: check \
                         `scheduler.time_attr` in the experiment file"
                    ));
                }
                return Err(reason);
            }
            self.time_attr_seen = true;
        }
        if let Some((field, _)) = self.spec.checkpoint.score_field()
            && record.contains_key(field)
        {
            self.score_seen = true;
        }
        if let Some(stopper) = &self.stopper
            && let Some(missing) = stopper.metrics().find(|m| !record.contains_key(*m))
        {
            return Err(format!(
                "stop_experiment's plateau metric `{missing}` is not in the trainable's report \
                 (it reports: {})",
                reported(step)
            ));
        }
        let stop_reason = if step.done {
            Some("the trainable reported done".to_string())
        } else {
            self.spec.stop.reached(&record)?
        };
        let requested = self.requested.remove(&index);
        let stop_reason = stop_reason.or_else(|| {
            (requested == Some(Requested::Stop)).then(|| STOPPED_BY_REQUEST.to_string())
        });
        let decision = match stop_reason {
            Some(_) => {
                self.scheduler.on_trial_complete(trial, &record);
                Decision::Stop
            }
            // Held from now on: to the scheduler it ended (see `held`).
            None if requested == Some(Requested::Pause) => {
                if self.told.insert(index) {
                    self.scheduler.on_trial_remove(trial);
                }
                Decision::Pause
            }
            None => self.scheduler.on_result(trial, &record),
        };
        self.searcher.on_result(&trial.trial_id, &record);
        if decision == Decision::Stop {
            record.insert("done".into(), true.into());
        }
        let trial = &mut trials[index];
        trial.stop_reason = match (&decision, stop_reason) {
            (Decision::Stop, Some(reason)) => Some(reason),
            (Decision::Stop, None) => Some(format!(
                "stopped by the {} scheduler",
                self.scheduler.name()
            )),
            _ => None,
        };
        self.store_result(trials, index, record)?;
        Ok(decision)
    }

    /// Records a result of a step redone after a resume (see
    /// [`Runner::continue_at`]): the files get it again (they were cut back
    /// to the checkpoint the trial restarted from), the decision makers do
    /// not: they decided on it before the run stopped. Unless the stopping
    /// criteria end the trial at it: criteria tightened on resume (`wtune
    /// resume --stop`) may end it at a step the run it continues went past.
    /// Then nothing is recorded, and the reason is returned: the step is
    /// decided on in its turn ([`Self::stop_redone`]).
    fn record_redone(
        &mut self,
        trials: &mut [Trial],
        index: usize,
        step: &Step,
        elapsed: Duration,
    ) -> Result<Option<String>, String> {
        let reuse = self.spare_record.take();
        let record = result::record(&trials[index], step, elapsed, false, reuse)?;
        if let Some(reason) = self.spec.stop.reached(&record)? {
            self.spare_record = Some(record);
            return Ok(Some(reason));
        }
        self.store_result(trials, index, record)?;
        Ok(None)
    }

    /// Ends trial `index` at the redone step the stopping criteria end
    /// (`reason`, from [`Self::record_redone`]), as a fresh result that met
    /// them would have: recorded as done, the scheduler told, STOP decided.
    fn stop_redone(
        &mut self,
        trials: &mut [Trial],
        index: usize,
        (step, elapsed): (&Step, Duration),
        reason: String,
    ) -> Result<Decision, String> {
        let reuse = self.spare_record.take();
        let record = result::record(&trials[index], step, elapsed, true, reuse)?;
        let trial = &mut trials[index];
        self.scheduler.on_trial_complete(trial, &record);
        trial.stop_reason = Some(reason);
        self.store_result(trials, index, record)?;
        self.decided_on(trials, index, &Decision::Stop);
        Ok(Decision::Stop)
    }

    /// Makes `record` trial `index`'s `last_result` and tells every callback
    /// of it. A result a callback refuses (the trial's files reached
    /// `limits.result_size`, say) is not kept: the trial's last result stays
    /// the last one its files hold, for the summary, the state and the
    /// searcher told of the failure that follows.
    fn store_result(
        &mut self,
        trials: &mut [Trial],
        index: usize,
        record: Map<String, Value>,
    ) -> Result<(), String> {
        let previous = trials[index].last_result.replace(record);
        let told = self.each(
            |cb, t| {
                let record = t[index].last_result.as_ref().expect("a result was stored");
                cb.on_result(t, index, record)
            },
            trials,
        );
        self.spare_record = match told {
            Ok(()) => previous,
            Err(_) => std::mem::replace(&mut trials[index].last_result, previous),
        };
        told
    }

    /// Why a trial that was just restored from a checkpoint must not train
    /// on: its last result (the checkpoint's) already ended it, by the
    /// trainable's `done` or the stopping criteria.
    fn restored_past_stop(&self, trial: &Trial) -> Option<String> {
        if trial.iterations == 0 || trial.iterations_since_restore != 0 {
            return None;
        }
        let result = trial.last_result.as_ref()?;
        if let Ok(Some(reason)) = self.spec.stop.reached(result) {
            return Some(reason);
        }
        if self.extending.contains(&trial.trial_id) {
            return None;
        }
        // Ended otherwise (the trainable's `done`, the scheduler, a stop
        // request): the record says so, not which.
        (result.get("done") == Some(&Value::Bool(true)))
            .then(|| "its checkpoint holds the result it ended with".into())
    }

    /// Ends a trial restored at its last result ([`Self::restored_past_stop`])
    /// as if that result had just come.
    fn end_restored(&mut self, trials: &mut [Trial], index: usize, reason: String) {
        let trial = &mut trials[index];
        trial.stop_reason = Some(reason);
        if let Some(record) = trial.last_result.clone() {
            self.scheduler.on_trial_complete(trial, &record);
        }
        self.end(trials, index);
    }

    /// Ends a trial as TERMINATED (its stop reason is already set).
    fn end(&mut self, trials: &mut [Trial], index: usize) {
        self.release_hold(trials, index);
        trials[index].status = TrialStatus::Terminated;
        let trial = &trials[index];
        self.searcher
            .on_trial_complete(&trial.trial_id, trial.last_result.as_ref(), false);
        self.notify(trials, index, |cb, t| cb.on_trial_end(t, index));
    }

    /// A step trial `index` finished after the run halted in fuel order:
    /// booked on its counters (unless `booked` already), not decided on,
    /// and kept `pending` for a resume; the trial is checkpointed after it
    /// and paused in its slot.
    fn halted_step(
        &mut self,
        tasks: &mut Tasks<B>,
        trials: &mut [Trial],
        index: usize,
        session: B::Session,
        (pending, booked): (PendingStep, bool),
    ) {
        let trial = &mut trials[index];
        if !booked {
            shared::book_step(trial, pending.elapsed(), session.fuel_total());
            trial.fuel_total = session.fuel_total();
        }
        self.replays.remove(&index);
        self.halted_steps.insert(index, pending);
        self.halt_kept.insert(index);
        self.halt_saves.insert(index);
        self.after_step(tasks, trials, index, session, Decision::Pause);
    }

    /// Releases a live trial because the experiment is halting. It is left
    /// PAUSED, not TERMINATED: it did not finish, and `wtune resume`
    /// continues it from its newest checkpoint.
    fn halt_trial(&mut self, trials: &mut [Trial], index: usize, reason: &str) {
        trials[index].stop_reason = Some(reason.to_string());
        trials[index].status = TrialStatus::Paused;
        self.notify(trials, index, |cb, t| cb.on_trial_pause(t, index));
    }

    fn fail(&mut self, trials: &mut [Trial], index: usize, reason: String) {
        tracing::debug!(trial = %trials[index].trial_id, "ERROR: {reason}");
        let told = self.told.contains(&index);
        // Failing before it took back the slot it held at a resumed moment
        // (its resources, a callback), it will not: its clock must not
        // hold back the events of the trials that did.
        if let Some(order) = &mut self.order {
            order.forget_carried(index);
        }
        self.release_hold(trials, index);
        let trial = &mut trials[index];
        trial.status = TrialStatus::Error;
        trial.error = Some(reason);
        trial.stop_reason = None;
        if !told {
            self.scheduler.on_trial_remove(trial);
        }
        self.searcher
            .on_trial_complete(&trial.trial_id, trial.last_result.as_ref(), true);
        self.notify(trials, index, |cb, t| cb.on_trial_end(t, index));
    }

    /// Runs a trial-level hook whose failure cannot change the trial's fate
    /// any more, on every callback: one that fails (its files could not be
    /// written) must not keep the trial's end from the others (its tracking
    /// run would stay RUNNING). Each failure is logged.
    fn notify(
        &mut self,
        trials: &[Trial],
        index: usize,
        mut f: impl FnMut(&mut dyn Callback, &[Trial]) -> Result<(), String>,
    ) {
        for cb in &mut self.callbacks {
            if let Err(reason) = f(cb.as_mut(), trials) {
                tracing::warn!(trial = %trials[index].trial_id, "{reason}");
            }
        }
    }

    /// The decision makers for a state that marks no moment (the end of a
    /// run).
    fn deciders(&self) -> Deciders<'_> {
        Deciders {
            scheduler: self.scheduler.as_ref(),
            searcher: self.searcher.as_ref(),
            stopper: self.stopper.as_ref(),
            fuel_burned: self.fuel_burned,
            fuel_order: None,
        }
    }

    /// The decision makers' states for the end of a run: in fuel order, a
    /// run that ends `at_moment` (halted: at the moment it halted at,
    /// nothing was decided after it and the steps trials finished since
    /// are pending) marks it, so that `wtune resume` continues it exactly.
    fn final_decisions(&self, trials: &[Trial], at_moment: bool) -> DecisionState {
        let moment = self
            .order
            .as_ref()
            .filter(|_| at_moment && self.moments_ok)
            .and_then(|order| order.moment(trials, self.decisions_made, &self.pending_steps()));
        self.deciders().state_at(moment)
    }

    /// The steps booked on trials' counters but not decided on: those they
    /// finished after this run halted, and those of a halted run this one
    /// resumes that are not yet decided.
    fn pending_steps(&self) -> HashMap<usize, PendingStep> {
        let replays = self.replays.iter().map(|(&i, (_, p))| (i, p.clone()));
        let halted = self.halted_steps.iter().map(|(&i, p)| (i, p.clone()));
        replays.chain(halted).collect()
    }

    /// Offers every callback the state ([`Callback::on_state`]); returns
    /// their errors. `at_moment`: in fuel order, the run may be at a moment
    /// a resume can continue from (not once it halts: trials then pause
    /// wherever their step ends, which no uninterrupted run does).
    fn states(&mut self, trials: &[Trial], at_moment: bool) -> Vec<String> {
        // The callbacks are borrowed mutably, the decision makers shared.
        let Self {
            scheduler,
            searcher,
            stopper,
            fuel_burned,
            callbacks,
            order,
            decisions_made,
            replays,
            moments_ok,
            retired,
            ..
        } = self;
        let view = order
            .as_ref()
            .filter(|_| *moments_ok)
            .map(|order| OrderView {
                order,
                trials,
                decisions: *decisions_made,
                at_moment,
                replays,
            });
        let deciders = Deciders {
            scheduler: scheduler.as_ref(),
            searcher: searcher.as_ref(),
            stopper: stopper.as_ref(),
            fuel_burned: *fuel_burned,
            fuel_order: view.as_ref().map(|v| v as &dyn AtMoment),
        };
        retired.offered();
        let errors = callbacks
            .iter_mut()
            .filter_map(|cb| cb.on_state(trials, &deciders).err())
            .collect();
        retired.sweep(callbacks.iter().filter_map(|cb| cb.saved_through()).min());
        errors
    }

    fn persist(&mut self, trials: &[Trial], at_moment: bool) {
        for reason in self.states(trials, at_moment) {
            tracing::warn!("{reason}");
        }
    }

    /// Persists state before the run ends abnormally: the state hook is
    /// throttled, so end-of-experiment hooks get the final word. In fuel
    /// order the state marks the moment the run is at, if it is between
    /// two events, as a kill there would find it.
    fn persist_now(&mut self, trials: &[Trial], why: &str) {
        let decisions = self.final_decisions(trials, true);
        let summary = ExperimentSummary {
            name: self.spec.name.clone(),
            output_dir: self.spec.output_dir.clone(),
            metric: self.spec.metric.clone(),
            mode: self.spec.mode,
            trials: trials.to_vec(),
            best: None,
            wall_time: Duration::ZERO,
            halted: Some(why.to_string()),
            stopped: None,
            ended_mid_event: self.ends_mid_event(&decisions, true),
            decisions,
        };
        let mut saved = true;
        for cb in &mut self.callbacks {
            if let Err(reason) = cb.on_experiment_end(&summary) {
                tracing::warn!("{reason}");
                saved = false;
            }
        }
        self.ended(&summary, saved);
    }

    /// Whether a run that ends with `decisions`, `halted` or not, leaves
    /// while it carries out an event ([`ExperimentSummary::ended_mid_event`]).
    fn ends_mid_event(&self, decisions: &DecisionState, halted: bool) -> bool {
        // A run that finished marks no moment: it is not to be continued.
        halted && self.listing_trusted() && decisions.moment.is_none()
    }

    /// After the callbacks heard the end (`saved`: without an error): the
    /// dropped checkpoint files go, but where the state on disk may still
    /// list them (a run that left mid-event keeps its last moment's).
    fn ended(&mut self, summary: &ExperimentSummary, saved: bool) {
        if saved && !summary.ended_mid_event {
            self.retired.delete_all();
        }
    }

    fn each(
        &mut self,
        mut f: impl FnMut(&mut dyn Callback, &[Trial]) -> Result<(), String>,
        trials: &[Trial],
    ) -> Result<(), String> {
        for cb in &mut self.callbacks {
            f(cb.as_mut(), trials)?;
        }
        Ok(())
    }
}

/// Sleeps until `deadline`; never without one.
async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending::<()>().await,
    }
}

/// The next control request; `None` once, when the controller is dropped,
/// and then never again.
async fn next_request(control: &mut Option<Requests>) -> Option<ControlRequest> {
    match control {
        Some(requests) => {
            let request = requests.receiver.recv().await;
            if request.is_none() {
                *control = None;
            }
            request
        }
        None => std::future::pending().await,
    }
}

/// The next interrupt; never, without a channel or once it is closed.
async fn next_interrupt(interrupts: &mut Option<mpsc::UnboundedReceiver<()>>) {
    match interrupts {
        Some(rx) => {
            if rx.recv().await.is_none() {
                *interrupts = None;
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending::<()>().await,
    }
}

/// What the guest SDK (`wtune-guest`, `glue.rs`) says when a config does
/// not deserialize into the trainable's config type.
const SDK_CONFIG_ERROR: &str = "invalid config for this trainable";

/// Digits in trial ids: enough for every trial the search will create
/// (`trial_0000` ... `trial_9999` unless there are more), or in a resumed
/// experiment the width its ids already have (`saved`), so that a resume
/// that adds trials numbers them as the others are (ids past the width
/// grow a digit, as `format!` pads).
fn trial_id_width(total: Option<u64>, saved: Option<usize>) -> usize {
    match saved {
        Some(width) => width,
        None => total
            .unwrap_or(0)
            .saturating_sub(1)
            .to_string()
            .len()
            .max(4),
    }
}

/// The metrics `step` reports, for an error about one it lacks.
fn reported(step: &Step) -> String {
    let names: Vec<&str> = step.metrics.iter().map(|(n, _)| n.as_str()).collect();
    names.join(", ")
}
