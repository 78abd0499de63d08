//! Which trial takes a free slot next, and whether it may: the steps
//! `fill_slots` repeats while slots are free (`run_loop.rs`).

use super::callback::TrialSetup;
use super::{RunError, Runner};
use crate::tune::backend::TrialBackend;
use crate::tune::resources::Acquire;
use crate::tune::trial::{Trial, TrialStatus};

/// What becomes of the trial picked for a free slot.
pub(super) enum Admission {
    /// It has its resources: start it.
    Start,
    /// Not this one; pick again.
    Skip,
    /// Nothing more starts now (a held trial was chosen, or the pool must
    /// free resources first).
    Wait,
}

impl<B: TrialBackend> Runner<B> {
    /// The trial for the next free slot, and whether it held a slot at the
    /// moment a resumed run continues from: first a trial waiting for
    /// resources, then those that held slots at the resumed moment (before
    /// the scheduler picks anything), then the scheduler's pick, else a new
    /// trial from the searcher. `None` when there is none.
    pub(super) fn pick_next(&mut self, trials: &mut Vec<Trial>) -> Option<(usize, bool)> {
        if let Some(&index) = self.waiting.front() {
            return Some((index, false));
        }
        if let Some(index) = self.relaunch.pop_front() {
            return Some((index, true));
        }
        match self.choose_next(trials) {
            Some(index) => Some((index, false)),
            None => self.create_trial(trials).map(|index| (index, false)),
        }
    }

    /// Checks the picked trial `index` and acquires its resources. A
    /// scheduler that picks a trial which cannot start is an internal
    /// error: the state is saved first, as for the other internal errors.
    pub(super) fn admit(
        &mut self,
        trials: &mut [Trial],
        index: usize,
        relaunched: bool,
    ) -> Result<Admission, RunError> {
        let startable = matches!(
            trials[index].status,
            TrialStatus::Pending | TrialStatus::Paused
        );
        if relaunched && (self.held.contains(&index) || !startable) {
            // Not for this run to start again: its carried clock must not
            // hold back the events of the trials that do.
            if let Some(order) = &mut self.order {
                order.forget_carried(index);
            }
            return Ok(Admission::Skip);
        }
        if self.held.contains(&index) {
            tracing::warn!(
                trial = %trials[index].trial_id,
                "the {} scheduler chose a trial a control request holds; starting nothing now",
                self.scheduler.name()
            );
            return Ok(Admission::Wait);
        }
        if !startable {
            // Trial threads still hold the state (and the callbacks'
            // buffers) until their next result: save now.
            self.persist_now(trials, "internal error");
            return Err(RunError::Internal(format!(
                "the {} scheduler chose {}, which is {}",
                self.scheduler.name(),
                trials[index].trial_id,
                trials[index].status
            )));
        }
        if self.waiting.front() != Some(&index)
            && let Some(resources) = self.scheduler.resources(&trials[index])
        {
            trials[index].resources = Some(resources);
        }
        let request = self.request(&trials[index]).clone();
        match self.pool.acquire(&trials[index].trial_id, &request) {
            Ok(Acquire::Granted) => {
                if self.waiting.front() == Some(&index) {
                    self.waiting.pop_front();
                }
                Ok(Admission::Start)
            }
            Ok(Acquire::Wait) => {
                if self.waiting.front() != Some(&index) {
                    self.waiting.push_back(index);
                }
                // A trial that held its slot at the resumed moment must
                // start before anything is decided; this machine's pool has
                // no room for it now, so the run goes on without that
                // promise rather than wait for a slot forever.
                self.give_up_carried(Some(
                    "the resources cannot hold every trial that ran at the moment this run \
                     resumes from (resources_per_trial against this machine's resources)",
                ));
                Ok(Admission::Wait)
            }
            Err(reason) => {
                if self.waiting.front() == Some(&index) {
                    self.waiting.pop_front();
                }
                self.fail(trials, index, reason);
                Ok(Admission::Skip)
            }
        }
    }

    /// Marks the admitted trial `index` running and tells the callbacks;
    /// returns their setups for its launch, or `None` when a callback
    /// refused it (the trial failed and its resources went back).
    pub(super) fn begin(&mut self, trials: &mut [Trial], index: usize) -> Option<Vec<TrialSetup>> {
        trials[index].status = TrialStatus::Running;
        if let Err(reason) = self.each(|cb, t| cb.on_trial_start(t, index), trials) {
            self.pool.release(&trials[index].trial_id);
            self.fail(trials, index, reason);
            return None;
        }
        Some(
            self.callbacks
                .iter_mut()
                .filter_map(|cb| cb.trial_setup(trials, index))
                .collect(),
        )
    }
}
