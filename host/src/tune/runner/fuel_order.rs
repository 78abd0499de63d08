//! Handing results to the decision makers in fuel-time order, as a
//! discrete-event simulation would, so that a seeded experiment decides the
//! same on every machine whatever the threads' timing.
//!
//! Each running trial has a clock: the experiment's fuel time when its
//! session started (when a slot was freed for it, or when it failed and was
//! restored) plus the fuel it has burned since. Fuel is deterministic, so a
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

use std::collections::{BTreeMap, BTreeSet};

/// Where an event sits in fuel-time order: fuel time, then trial id.
pub(super) type Key = (u64, String);

/// A running trial's clock.
#[derive(Debug, Clone)]
struct Clock {
    trial_id: String,
    /// Experiment fuel time when its session started.
    start: u64,
    /// The trial's own fuel count when its session started (after a
    /// restore, the checkpoint's), once launched.
    fuel_at_start: Option<u64>,
    /// Fuel time of its last released event (or its start): its next one
    /// comes later.
    floor: u64,
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
}

impl FuelOrder {
    /// Experiment fuel time of the last released event: when a trial
    /// started now starts.
    pub(super) fn now(&self) -> u64 {
        self.now
    }

    /// Trial `index` takes a slot now (launched fresh, from a checkpoint,
    /// or relaunched after a failure or an exploit).
    pub(super) fn start(&mut self, index: usize, trial_id: &str) {
        self.clocks.insert(
            index,
            Clock {
                trial_id: trial_id.to_string(),
                start: self.now,
                fuel_at_start: None,
                floor: self.now,
            },
        );
    }

    /// The launched session of trial `index` starts with `fuel_total`.
    pub(super) fn launched(&mut self, index: usize, fuel_total: u64) {
        if let Some(clock) = self.clocks.get_mut(&index) {
            clock.fuel_at_start = Some(fuel_total);
        }
    }

    /// The key of an event of trial `index` at its own fuel count
    /// `fuel_total`; `None` for a trial this order does not know.
    pub(super) fn key(&self, index: usize, fuel_total: u64) -> Option<Key> {
        let clock = self.clocks.get(&index)?;
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

    /// Trial `index` no longer holds a slot.
    pub(super) fn stopped(&mut self, index: usize) {
        self.clocks.remove(&index);
        self.handed_back(index);
    }

    /// The loop refilled the free slots: trials it was done with stop
    /// holding the next release back. Returns whether any did.
    pub(super) fn loop_done(&mut self) -> bool {
        let any = !self.leaving.is_empty();
        for index in std::mem::take(&mut self.leaving) {
            self.in_loop.remove(&index);
        }
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
