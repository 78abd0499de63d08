//! A runner in miniature for scheduler tests: creates trials lazily (one
//! at a time, when a slot is free and `choose_next` has nothing), steps the
//! running trials round robin, asks `take_stops` before every
//! `choose_next`, and applies decisions as the runner does.

use std::collections::VecDeque;

use serde_json::{Value, json};

use super::scheduler::{Decision, Scheduler};
use crate::tune::trial::{Trial, TrialStatus};

/// An experiment in progress.
pub(crate) struct Sim {
    /// Every trial created so far, `trial_0000` first.
    pub trials: Vec<Trial>,
    num_samples: usize,
    slots: usize,
    /// A stopping criterion: trials end after this many iterations,
    /// reported through `on_trial_complete`.
    pub stop_at: Option<u64>,
    /// PAUSED trials chosen again: (index, iterations done), in order.
    pub resumed: Vec<(usize, u64)>,
    /// Trials ended through `take_stops`, in order.
    pub taken: Vec<usize>,
    running: VecDeque<usize>,
    told: bool,
    steps: usize,
}

impl Sim {
    /// An experiment of `num_samples` trials, `slots` at a time.
    pub(crate) fn new(num_samples: usize, slots: usize) -> Self {
        Self {
            trials: Vec::new(),
            num_samples,
            slots,
            stop_at: None,
            resumed: Vec::new(),
            taken: Vec::new(),
            running: VecDeque::new(),
            told: false,
            steps: 0,
        }
    }

    /// Runs until the experiment is over (true) or `steps` more
    /// iterations have been trained (false). Trial `i` reports `score`
    /// = `curve(i, t)` at iteration `t` (NaN as null), with
    /// `fuel_total` = 1000 t and `time_total_s` = t / 2.
    pub(crate) fn run(
        &mut self,
        scheduler: &mut dyn Scheduler,
        curve: &dyn Fn(usize, u64) -> f64,
        steps: Option<usize>,
    ) -> bool {
        let mut budget = steps.unwrap_or(usize::MAX);
        loop {
            while self.running.len() < self.slots {
                self.take_stops(scheduler);
                match scheduler.choose_next(&self.trials) {
                    Some(i) => {
                        let trial = &mut self.trials[i];
                        assert!(
                            matches!(trial.status, TrialStatus::Pending | TrialStatus::Paused),
                            "chose {} which is {}",
                            trial.trial_id,
                            trial.status
                        );
                        if trial.status == TrialStatus::Paused {
                            self.resumed.push((i, trial.iterations));
                        }
                        trial.status = TrialStatus::Running;
                        self.running.push_back(i);
                    }
                    None if self.trials.len() < self.num_samples => {
                        let id = format!("trial_{:04}", self.trials.len());
                        let trial = Trial::new(id, json!({}), "/tmp".into());
                        scheduler.on_trial_add(&trial);
                        self.trials.push(trial);
                    }
                    None if !self.told => {
                        self.told = true;
                        scheduler.on_no_more_trials();
                    }
                    None => break,
                }
            }
            let Some(i) = self.running.pop_front() else {
                return true;
            };
            if budget == 0 {
                self.running.push_front(i);
                return false;
            }
            budget -= 1;
            self.steps += 1;
            assert!(self.steps < 100_000, "the experiment does not end");
            let trial = &mut self.trials[i];
            trial.iterations += 1;
            let t = trial.iterations;
            trial.fuel_total = 1000 * t;
            trial.time_total_s = t as f64 / 2.0;
            let score = curve(i, t);
            let result = json!({
                "score": if score.is_nan() { Value::Null } else { json!(score) },
                "training_iteration": t,
                "fuel_total": trial.fuel_total,
                "time_total_s": trial.time_total_s,
            });
            let result = result.as_object().expect("an object").clone();
            trial.last_result = Some(result.clone());
            if self.stop_at.is_some_and(|n| t >= n) {
                scheduler.on_trial_complete(&self.trials[i], &result);
                self.trials[i].status = TrialStatus::Terminated;
                continue;
            }
            match scheduler.on_result(&self.trials[i], &result) {
                Decision::Continue => self.running.push_back(i),
                Decision::Stop => self.trials[i].status = TrialStatus::Terminated,
                Decision::Pause => self.trials[i].status = TrialStatus::Paused,
                // Checkpoints are the runner's business; exploits are
                // tested against the real runner (tests/pbt.rs).
                Decision::Checkpoint => self.running.push_back(i),
                other => panic!("the simulated runner does not do {other:?}"),
            }
        }
    }

    fn take_stops(&mut self, scheduler: &mut dyn Scheduler) {
        for i in scheduler.take_stops(&self.trials) {
            let trial = &mut self.trials[i];
            assert!(
                matches!(trial.status, TrialStatus::Pending | TrialStatus::Paused),
                "take_stops returned {} which is {}",
                trial.trial_id,
                trial.status
            );
            trial.status = TrialStatus::Terminated;
            self.taken.push(i);
        }
    }

    /// Each trial's completed iterations.
    pub(crate) fn iterations(&self) -> Vec<u64> {
        self.trials.iter().map(|t| t.iterations).collect()
    }

    /// The ids of trials that did not end TERMINATED.
    pub(crate) fn unfinished(&self) -> Vec<&str> {
        self.trials
            .iter()
            .filter(|t| t.status != TrialStatus::Terminated)
            .map(|t| t.trial_id.as_str())
            .collect()
    }
}
