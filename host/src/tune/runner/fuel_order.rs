//! Handing results to the decision makers in fuel-time order, as a
//! discrete-event simulation would, so that a seeded experiment decides the
//! same on every machine whatever the threads' timing.
//!
//! Each running trial has a clock: the experiment's fuel time when its
//! session started (when a slot was freed for it, or, restored after a
//! failure, the next event of another trial: see below) plus the fuel it
//! has burned since. Fuel is deterministic, so a
//! trial's results land at the same fuel times on every machine; only the
//! order in which threads finish differs. A trial thread with a result (or a
//! failure) waits here until its fuel time is the smallest that any running
//! trial could still produce (ties broken by trial id); only then is the
//! result recorded and decided on. While the loop carries out a released
//! event (a checkpoint, a pause, an exploit, a failure, a slot to refill),
//! nothing else is released: the loop's work belongs to the same logical
//! moment, and a trial it starts then starts at that moment's fuel time.
//!
//! The cost is waiting: a trial ahead of its siblings in fuel time waits for
//! them at its next result. `BENCHMARKS.md` measures it.
//!
//! A trial recovered after a failure starts again at the fuel time of the
//! next event another trial's clock releases ([`FuelOrder::defer`]), not
//! at its failure's: a trial that fails again without burning fuel (in its
//! setup, say) would otherwise have the earliest event forever, and under
//! `max_failures = -1` hold every other trial back for good.
//!
//! Between two events the order is at a moment ([`FuelOrder::moment`]) that
//! the saved state keeps, so that `wtune resume` after a kill continues the
//! same run: the trials that held slots get their clocks back
//! ([`FuelOrder::carry`]) and redo, without deciding again, the steps the
//! killed run had already decided on.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::tune::decisions::{FuelMoment, PendingStep, SavedClock};
use crate::tune::trial::Trial;

/// Where an event sits in fuel-time order: fuel time, then trial id.
pub(super) type Key = (u64, String);

/// A running trial's clock.
#[derive(Debug, Clone)]
struct Clock {
    trial_id: String,
    /// Experiment fuel time when its session started (for a deferred
    /// clock, not yet known).
    start: u64,
    /// The trial's own fuel count when its session started (after a
    /// restore, the checkpoint's), once launched.
    fuel_at_start: Option<u64>,
    /// Fuel time of its last released event (or its start): its next one
    /// comes later.
    floor: u64,
    /// Carried from a saved moment and not started again yet: the trial's
    /// next start continues this clock instead of making a new one.
    carried: bool,
    /// Results up to this iteration were decided before the run was
    /// resumed: the trial redoes those steps without a turn or a decision.
    redo_until: u64,
    /// Recovered after a failure, it has no start yet: it gets the fuel
    /// time of the next event released for another trial, and until then
    /// holds nothing back and has no event of its own.
    deferred: bool,
}

/// The fuel-time order of one experiment's events.
#[derive(Debug, Default)]
pub(super) struct FuelOrder {
    clocks: BTreeMap<usize, Clock>,
    /// Events waiting for their turn, by key, with their trial's index.
    waiting: BTreeSet<(Key, usize)>,
    /// Trials whose released event the loop is carrying out.
    in_loop: BTreeSet<usize>,
    /// Trials the loop has finished with, cleared from `in_loop` once it
    /// has also refilled free slots (`FuelOrder::loop_done`).
    leaving: BTreeSet<usize>,
    /// Fuel time of the last released event.
    now: u64,
    /// For trials whose carried clocks were given up: the iteration up to
    /// which their steps were decided before the resume. They redo those
    /// steps on the new clock they start on, without deciding again.
    decided_until: BTreeMap<usize, u64>,
}

impl FuelOrder {
    /// Experiment fuel time of the last released event: when a trial
    /// started now starts.
    pub(super) fn now(&self) -> u64 {
        self.now
    }

    /// Trial `index` takes a slot now (launched fresh, from a checkpoint,
    /// or relaunched after a failure or an exploit). Returns `true` when it
    /// continues a clock carried from a saved moment instead: it held its
    /// slot at that moment, and takes it again, not a new one.
    pub(super) fn start(&mut self, index: usize, trial_id: &str) -> bool {
        if let Some(clock) = self.clocks.get_mut(&index)
            && clock.carried
        {
            clock.carried = false;
            return true;
        }
        // Relaunched (after a failure) before it had redone every step
        // decided before the resume: it still does not decide on them.
        let unfinished = self.clocks.get(&index).map_or(0, |clock| clock.redo_until);
        let decided = self.decided_until.remove(&index).unwrap_or(0);
        self.clocks.insert(
            index,
            Clock {
                trial_id: trial_id.to_string(),
                start: self.now,
                fuel_at_start: None,
                floor: self.now,
                carried: false,
                redo_until: unfinished.max(decided),
                deferred: false,
            },
        );
        false
    }

    /// Trial `index`, just started again after a failure, starts at the
    /// fuel time of the next event released for another trial instead of
    /// now. With no other clock to wait for once the loop has refilled the
    /// free slots ([`FuelOrder::loop_done`]), it starts now.
    pub(super) fn defer(&mut self, index: usize) {
        if let Some(clock) = self.clocks.get_mut(&index) {
            clock.deferred = true;
        }
    }

    /// Whether trial `index` waits for another trial's event to learn its
    /// start ([`FuelOrder::defer`]): until then its events have no key.
    pub(super) fn is_deferred(&self, index: usize) -> bool {
        self.clocks.get(&index).is_some_and(|clock| clock.deferred)
    }

    /// Deferred clocks start at `time`.
    fn start_deferred(&mut self, time: u64) {
        for clock in self.clocks.values_mut().filter(|c| c.deferred) {
            clock.deferred = false;
            clock.start = time;
            clock.floor = time;
        }
    }

    /// Deferred clocks start now when no other clock is left to release
    /// an event.
    fn start_deferred_if_alone(&mut self) {
        if self.clocks.values().all(|c| c.deferred) {
            self.start_deferred(self.now);
        }
    }

    /// The launched session of trial `index` starts with `fuel_total`. A
    /// clock carried from a moment where the trial had launched keeps its
    /// fuel count then: the trial may restart from an older checkpoint,
    /// and its results must fall at the same fuel times as before.
    pub(super) fn launched(&mut self, index: usize, fuel_total: u64) {
        if let Some(clock) = self.clocks.get_mut(&index)
            && clock.fuel_at_start.is_none()
        {
            clock.fuel_at_start = Some(fuel_total);
        }
    }

    /// How many of trial `index`'s next steps, now at `iteration`, were
    /// decided on before the run was resumed (see [`FuelOrder::carry`]).
    /// Once none, none are again: a trial relaunched from an older
    /// checkpoint after that (a failure) decides on its steps again, as an
    /// uninterrupted run's would.
    pub(super) fn redo_left(&mut self, index: usize, iteration: u64) -> u64 {
        let Some(clock) = self.clocks.get_mut(&index) else {
            return 0;
        };
        let left = clock.redo_until.saturating_sub(iteration);
        if left == 0 {
            clock.redo_until = 0;
        }
        left
    }

    /// Forgets the clocks carried from a saved moment whose trials have
    /// not started again (they will start on new clocks); returns whether
    /// there were any. For a resumed run that cannot start them all.
    pub(super) fn drop_carried(&mut self) -> bool {
        let carried: Vec<usize> = (self.clocks.iter())
            .filter(|(_, clock)| clock.carried)
            .map(|(&index, _)| index)
            .collect();
        for &index in &carried {
            self.forget_carried(index);
        }
        !carried.is_empty()
    }

    /// Forgets trial `index`'s clock if it is carried from a saved moment
    /// and not started again: the trial will not take its slot back. The
    /// steps it had decided on stay decided: when it starts (on a new
    /// clock), it redoes them without deciding again.
    pub(super) fn forget_carried(&mut self, index: usize) {
        if self.clocks.get(&index).is_some_and(|clock| clock.carried)
            && let Some(clock) = self.clocks.remove(&index)
        {
            self.decided_until.insert(index, clock.redo_until);
        }
    }

    /// Whether no released event is being carried out.
    pub(super) fn between_events(&self) -> bool {
        self.in_loop.is_empty() && self.leaving.is_empty()
    }

    /// The moment the order is at, when it is between two events: every
    /// released event carried out, none begun. `decisions` counts the
    /// decisions recorded so far; `trials` gives each clock's progress.
    /// `pending`: the steps trials finished after a halt, booked on their
    /// counters but not decided on.
    pub(super) fn moment(
        &self,
        trials: &[Trial],
        decisions: u64,
        pending: &HashMap<usize, PendingStep>,
    ) -> Option<FuelMoment> {
        if !self.between_events() {
            return None;
        }
        let clocks = self
            .clocks
            .iter()
            .map(|(&index, clock)| {
                let pending = pending.get(&index).cloned();
                let iteration = trials
                    .get(index)
                    .map_or(0, |trial| match clock.fuel_at_start {
                        // Launching: it starts from its newest checkpoint,
                        // whatever its counters still say (an exploit's or a
                        // failure's relaunch goes back).
                        // A relaunch after failing among the steps it
                        // redoes still has them to redo without deciding.
                        None => (trial.latest_checkpoint())
                            .map_or(0, |c| c.iteration)
                            .max(clock.redo_until),
                        Some(_) => {
                            let booked = trial
                                .iterations
                                .saturating_sub(u64::from(pending.is_some()));
                            booked.max(clock.redo_until)
                        }
                    });
                SavedClock {
                    trial_id: clock.trial_id.clone(),
                    start: clock.start,
                    fuel_at_start: clock.fuel_at_start,
                    floor: clock.floor,
                    iteration,
                    pending,
                    deferred: clock.deferred,
                }
            })
            .collect();
        Some(FuelMoment {
            now: self.now,
            decisions,
            clocks,
        })
    }

    /// Continues from a saved `moment`: its clocks, for the trials
    /// `index_of` finds, are carried until those trials start again, and
    /// (but for deferred ones, which wait for another trial's event) hold
    /// back every later event until they get there.
    pub(super) fn carry(&mut self, moment: &FuelMoment, index_of: impl Fn(&str) -> Option<usize>) {
        self.now = moment.now;
        for saved in &moment.clocks {
            let Some(index) = index_of(&saved.trial_id) else {
                continue;
            };
            self.clocks.insert(
                index,
                Clock {
                    trial_id: saved.trial_id.clone(),
                    start: saved.start,
                    fuel_at_start: saved.fuel_at_start,
                    floor: saved.floor,
                    carried: true,
                    redo_until: saved.iteration,
                    deferred: saved.deferred,
                },
            );
        }
    }

    /// The key of an event of trial `index` at its own fuel count
    /// `fuel_total`; `None` for a trial this order does not know. A
    /// deferred clock ([`FuelOrder::is_deferred`]) has no keys yet.
    pub(super) fn key(&self, index: usize, fuel_total: u64) -> Option<Key> {
        let clock = self.clocks.get(&index)?;
        debug_assert!(!clock.deferred, "a deferred clock has no keys");
        let burned = fuel_total.saturating_sub(clock.fuel_at_start.unwrap_or(fuel_total));
        Some((clock.start.saturating_add(burned), clock.trial_id.clone()))
    }

    /// Trial `index` has an event at `key` and waits for its turn.
    pub(super) fn arrive(&mut self, index: usize, key: Key) {
        self.waiting.insert((key, index));
    }

    /// Whether the event of trial `index` at `key` may be released now:
    /// the loop is not carrying out an earlier one, it is the earliest
    /// waiting, and no running trial could still produce an earlier one.
    pub(super) fn is_turn(&self, index: usize, key: &Key) -> bool {
        if !self.in_loop.is_empty() {
            return false;
        }
        if self
            .waiting
            .first()
            .is_none_or(|(k, i)| k != key || *i != index)
        {
            return false;
        }
        self.clocks.iter().all(|(&other, clock)| {
            other == index
                || clock.deferred
                || self.waiting.iter().any(|(_, i)| *i == other)
                || (clock.floor, &clock.trial_id) > (key.0, &key.1)
        })
    }

    /// Releases the event of trial `index` at `key`.
    pub(super) fn release(&mut self, index: usize, key: &Key) {
        self.waiting.remove(&(key.clone(), index));
        self.now = self.now.max(key.0);
        if let Some(clock) = self.clocks.get_mut(&index) {
            clock.floor = key.0;
        }
        self.start_deferred(key.0);
    }

    /// The loop carries out the event of trial `index` just released:
    /// nothing else is released until it is done.
    pub(super) fn hold(&mut self, index: usize) {
        self.in_loop.insert(index);
    }

    /// The loop handed trial `index` back to a thread (training, launching)
    /// or freed its slot: once it has also refilled free slots, the next
    /// event may be released.
    pub(super) fn handed_back(&mut self, index: usize) {
        if self.in_loop.contains(&index) {
            self.leaving.insert(index);
        }
    }

    /// Trial `index`'s event at `key` is not released: the run halted.
    pub(super) fn withdraw(&mut self, index: usize, key: &Key) {
        self.waiting.remove(&(key.clone(), index));
    }

    /// Trial `index` was paused because the run halted: its slot is free,
    /// but it keeps its clock, which the halted run's last moment saves
    /// (nothing is released after a halt, so it holds nothing back).
    pub(super) fn set_aside(&mut self, index: usize) {
        self.handed_back(index);
    }

    /// Trial `index` no longer holds a slot.
    pub(super) fn stopped(&mut self, index: usize) {
        self.clocks.remove(&index);
        self.handed_back(index);
    }

    /// The loop refilled the free slots: trials it was done with stop
    /// holding the next release back. Returns whether any did.
    /// Deferred clocks left with no other clock to wait for start now.
    pub(super) fn loop_done(&mut self) -> bool {
        let any = !self.leaving.is_empty();
        for index in std::mem::take(&mut self.leaving) {
            self.in_loop.remove(&index);
        }
        self.start_deferred_if_alone();
        any
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(t: u64, id: &str) -> Key {
        (t, id.to_string())
    }

    #[test]
    fn the_earliest_fuel_time_goes_first_whoever_arrives_first() {
        let mut order = FuelOrder::default();
        order.start(0, "trial_0000");
        order.start(1, "trial_0001");
        order.launched(0, 0);
        order.launched(1, 0);
        // Trial 1 finishes its step first in wall time, at fuel 150; trial
        // 0 is still training, its next result no earlier than 0.
        let late = order.key(1, 150).unwrap();
        order.arrive(1, late.clone());
        assert!(!order.is_turn(1, &late));
        let early = order.key(0, 100).unwrap();
        order.arrive(0, early.clone());
        assert!(order.is_turn(0, &early));
        assert!(!order.is_turn(1, &late));
        order.release(0, &early);
        // Trial 0 trains on from 100, so 150 still waits for its next.
        assert!(!order.is_turn(1, &late));
        let next = order.key(0, 200).unwrap();
        order.arrive(0, next.clone());
        assert!(order.is_turn(1, &late));
        order.release(1, &late);
        // Trial 1 trains on from 150: 200 waits for its next result too.
        assert!(!order.is_turn(0, &next));
        let after = order.key(1, 300).unwrap();
        order.arrive(1, after);
        assert!(order.is_turn(0, &next));
    }

    #[test]
    fn ties_go_to_the_smaller_trial_id_and_the_loop_holds_everything() {
        let mut order = FuelOrder::default();
        for (i, id) in ["trial_0000", "trial_0001"].into_iter().enumerate() {
            order.start(i, id);
            order.launched(i, 10);
        }
        let (a, b) = (order.key(0, 60).unwrap(), order.key(1, 60).unwrap());
        assert_eq!(a, key(50, "trial_0000"));
        order.arrive(1, b.clone());
        order.arrive(0, a.clone());
        assert!(!order.is_turn(1, &b));
        assert!(order.is_turn(0, &a));
        // Trial 0's result needs the loop (a checkpoint, a slot to fill).
        order.release(0, &a);
        order.hold(0);
        assert!(!order.is_turn(1, &b));
        order.handed_back(0);
        assert!(!order.is_turn(1, &b), "not until the loop refilled slots");
        assert!(order.loop_done());
        // Trial 0 trains on from the same fuel time: a step that burned
        // nothing would come before trial 1's, so trial 1 waits for it.
        assert!(!order.is_turn(1, &b));
        let next = order.key(0, 90).unwrap();
        order.arrive(0, next);
        assert!(order.is_turn(1, &b));
    }

    #[test]
    fn a_saved_moment_carries_clocks_that_hold_later_events_back() {
        let dir = std::path::Path::new("/nonexistent");
        let mut trials: Vec<Trial> = ["trial_0000", "trial_0001"]
            .into_iter()
            .map(|id| Trial::new(id.into(), serde_json::json!({}), dir.join(id)))
            .collect();
        let mut order = FuelOrder::default();
        for (i, trial) in trials.iter().enumerate() {
            order.start(i, &trial.trial_id);
            order.launched(i, 10);
        }
        let (late, early) = (order.key(1, 160).unwrap(), order.key(0, 110).unwrap());
        order.arrive(1, late.clone());
        order.arrive(0, early.clone());
        order.release(0, &early);
        trials[0].iterations = 3;
        // Carrying out the release (a checkpoint, say) is no moment.
        order.hold(0);
        assert_eq!(order.moment(&trials, 7, &HashMap::new()), None);
        order.handed_back(0);
        order.loop_done();
        let moment = order.moment(&trials, 7, &HashMap::new()).unwrap();
        assert_eq!((moment.now, moment.decisions), (100, 7));
        let clock = |id: &str| moment.clocks.iter().find(|c| c.trial_id == id).unwrap();
        assert_eq!(
            (clock("trial_0000").floor, clock("trial_0000").iteration),
            (100, 3)
        );
        // Trial 1's event waiting at 150 is not decided: it is redone.
        assert_eq!(
            (clock("trial_0001").floor, clock("trial_0001").iteration),
            (0, 0)
        );

        // Resumed: trial 0 restarts from a checkpoint at its iteration 1
        // (its own fuel 40), trial 2 is new.
        let mut resumed = FuelOrder::default();
        resumed.carry(&moment, |id| trials.iter().position(|t| t.trial_id == id));
        assert!(resumed.start(0, "trial_0000"), "takes its slot back");
        resumed.launched(0, 40);
        assert_eq!(resumed.redo_left(0, 1), 2);
        assert_eq!(resumed.key(0, 210), order.key(0, 210), "the same clock");
        assert!(!resumed.start(2, "trial_0002"));
        resumed.launched(2, 0);
        let new = resumed.key(2, 10).unwrap();
        assert_eq!(new, key(110, "trial_0002"));
        resumed.arrive(2, new.clone());
        // Trial 1, not back yet, could still produce an event at 150.
        assert!(!resumed.is_turn(2, &new));
        assert!(resumed.start(1, "trial_0001"));
        resumed.launched(1, 10);
        let back = resumed.key(1, 160).unwrap();
        assert_eq!(back, late);
        let after = resumed.key(0, 210).unwrap();
        resumed.arrive(0, after);
        resumed.arrive(1, back.clone());
        assert!(resumed.is_turn(2, &new));
    }

    #[test]
    fn a_carried_clock_given_up_holds_nothing_back() {
        let mut order = FuelOrder::default();
        for (i, id) in ["trial_0000", "trial_0001"].into_iter().enumerate() {
            order.start(i, id);
            order.launched(i, 0);
        }
        let mut trials: Vec<Trial> = ["trial_0000", "trial_0001"]
            .into_iter()
            .map(|id| Trial::new(id.into(), serde_json::json!({}), id.into()))
            .collect();
        trials[0].iterations = 3;
        let moment = order.moment(&trials, 0, &HashMap::new()).unwrap();
        let mut resumed = FuelOrder::default();
        resumed.carry(&moment, |id| trials.iter().position(|t| t.trial_id == id));
        assert!(resumed.start(1, "trial_0001"));
        resumed.launched(1, 0);
        let result = resumed.key(1, 100).unwrap();
        resumed.arrive(1, result.clone());
        assert!(!resumed.is_turn(1, &result), "trial_0000 may come back");
        resumed.forget_carried(1);
        assert!(!resumed.is_turn(1, &result), "a started clock stays");
        resumed.forget_carried(0);
        assert!(resumed.is_turn(1, &result));
        // Started later on a new clock, it still does not decide again on
        // the 3 steps decided before the resume.
        assert!(!resumed.start(0, "trial_0000"));
        assert_eq!(resumed.redo_left(0, 1), 2);
        let mut dropped = FuelOrder::default();
        dropped.carry(&moment, |id| trials.iter().position(|t| t.trial_id == id));
        assert!(dropped.start(1, "trial_0001"));
        assert!(dropped.drop_carried());
        assert!(!dropped.drop_carried());
    }

    #[test]
    fn a_recovered_trial_starts_at_the_next_event_of_another() {
        let mut order = FuelOrder::default();
        for (i, id) in ["trial_0000", "trial_0001"].into_iter().enumerate() {
            order.start(i, id);
            order.launched(i, 0);
        }
        // Trial 0 fails at its start, burning nothing, and is retried.
        let failed = order.key(0, 0).unwrap();
        order.arrive(0, failed.clone());
        assert!(order.is_turn(0, &failed));
        order.release(0, &failed);
        order.hold(0);
        assert!(!order.start(0, "trial_0000"));
        order.defer(0);
        order.handed_back(0);
        order.loop_done();
        assert!(order.is_deferred(0));
        // Deferred, it holds nothing back: trial 1's result goes first.
        let result = order.key(1, 100).unwrap();
        order.arrive(1, result.clone());
        assert!(order.is_turn(1, &result));
        order.release(1, &result);
        assert!(!order.is_deferred(0));
        order.launched(0, 0);
        assert_eq!(order.key(0, 0), Some(key(100, "trial_0000")));
        // Deferred with no other clock left, it starts once the loop is done.
        let again = order.key(0, 0).unwrap();
        order.release(0, &again);
        order.hold(0);
        order.stopped(1);
        order.start(0, "trial_0000");
        order.defer(0);
        order.handed_back(0);
        order.loop_done();
        assert!(!order.is_deferred(0));
        order.launched(0, 0);
        assert_eq!(order.key(0, 0), Some(key(100, "trial_0000")));
    }

    #[test]
    fn a_relaunch_after_failing_among_redone_steps_keeps_them_undecided() {
        let dir = std::path::Path::new("/nonexistent");
        let trials = vec![Trial::new(
            "trial_0000".into(),
            serde_json::json!({}),
            dir.into(),
        )];
        let saved = FuelMoment {
            now: 80,
            decisions: 0,
            clocks: vec![SavedClock {
                trial_id: "trial_0000".into(),
                start: 0,
                fuel_at_start: Some(0),
                floor: 80,
                iteration: 8,
                pending: None,
                deferred: false,
            }],
        };
        let mut order = FuelOrder::default();
        order.carry(&saved, |_| Some(0));
        assert!(order.start(0, "trial_0000"));
        order.launched(0, 20);
        assert_eq!(order.redo_left(0, 2), 6);
        // It fails at step 5 and is relaunched: still to redo up to 8, and
        // a moment taken while it launches says so.
        assert!(!order.start(0, "trial_0000"));
        let moment = order.moment(&trials, 0, &HashMap::new()).unwrap();
        assert_eq!(moment.clocks[0].iteration, 8);
        order.launched(0, 20);
        assert_eq!(order.redo_left(0, 2), 6);
        // Once redone, the bound is spent: a later relaunch decides again.
        assert_eq!(order.redo_left(0, 8), 0);
        assert!(!order.start(0, "trial_0000"));
        order.launched(0, 20);
        assert_eq!(order.redo_left(0, 2), 0);
    }

    #[test]
    fn a_trial_started_later_runs_on_the_experiments_clock() {
        let mut order = FuelOrder::default();
        order.start(0, "trial_0000");
        order.launched(0, 0);
        let end = order.key(0, 500).unwrap();
        order.arrive(0, end.clone());
        order.release(0, &end);
        order.hold(0);
        order.stopped(0);
        // The slot is refilled at fuel time 500 by a trial restored from a
        // checkpoint taken at its own fuel 300.
        order.start(1, "trial_0001");
        assert!(order.loop_done());
        order.launched(1, 300);
        assert_eq!(order.key(1, 350), Some(key(550, "trial_0001")));
    }
}
