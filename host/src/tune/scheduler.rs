//! Schedulers decide, after each result, whether a trial continues, and
//! which waiting trial runs next. They are pure: they see trials and results,
//! never sandboxes.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::asha::{Asha, AshaConfig};
use super::hyperband::{HyperBand, HyperBandConfig};
use super::median::{MedianStopping, MedianStoppingConfig};
use super::pbt::{PbtConfig, PopulationBasedTraining};
use super::resources::Resources;
use super::result::Mode;
use super::trial::{Trial, TrialStatus};

/// A scheduler by name and parameters, as an experiment file gives it:
/// `scheduler = "asha"`, or a `[scheduler]` table with `type = "asha"` and
/// the parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
pub enum SchedulerSpec {
    /// [`Fifo`].
    #[default]
    Fifo,
    /// [`Asha`].
    Asha(AshaConfig),
    /// [`MedianStopping`].
    #[serde(rename = "median_stopping")]
    MedianStopping(MedianStoppingConfig),
    /// [`HyperBand`] (synchronous).
    #[serde(rename = "hyperband")]
    HyperBand(HyperBandConfig),
    /// [`PopulationBasedTraining`].
    Pbt(PbtConfig),
}

impl SchedulerSpec {
    /// The names known, for error messages.
    pub const NAMES: [&'static str; 5] = ["fifo", "asha", "median_stopping", "hyperband", "pbt"];

    /// Whether the scheduler ends every trial by itself (ASHA at `max_t`,
    /// HyperBand at `max_t` unless `stop_last_trials = false`), so that no
    /// default stopping criterion is needed.
    pub fn ends_trials(&self) -> bool {
        match self {
            SchedulerSpec::Asha(_) => true,
            SchedulerSpec::HyperBand(config) => config.stop_last_trials,
            SchedulerSpec::Fifo | SchedulerSpec::MedianStopping(_) | SchedulerSpec::Pbt(_) => false,
        }
    }

    /// Builds the scheduler for an experiment ranking by `metric`/`mode`.
    pub fn build(
        &self,
        metric: Option<&str>,
        mode: Mode,
        seed: u64,
    ) -> Result<Box<dyn Scheduler>, String> {
        Ok(match self {
            SchedulerSpec::Fifo => Box::new(Fifo::default()),
            SchedulerSpec::Asha(config) => {
                let metric = metric.ok_or(
                    "the asha scheduler ranks trials by the experiment's metric; set `metric`",
                )?;
                Box::new(Asha::new(config.clone(), metric, mode, seed)?)
            }
            SchedulerSpec::MedianStopping(config) => {
                let metric = metric.ok_or(
                    "the median_stopping scheduler ranks trials by the experiment's metric; \
                     set `metric`",
                )?;
                Box::new(MedianStopping::new(config.clone(), metric, mode)?)
            }
            SchedulerSpec::HyperBand(config) => {
                let metric = metric.ok_or(
                    "the hyperband scheduler ranks trials by the experiment's metric; set `metric`",
                )?;
                Box::new(HyperBand::new(config.clone(), metric, mode)?)
            }
            SchedulerSpec::Pbt(config) => {
                let metric = metric.ok_or(
                    "the pbt scheduler ranks trials by the experiment's metric; set `metric`",
                )?;
                Box::new(PopulationBasedTraining::new(
                    config.clone(),
                    metric,
                    mode,
                    seed,
                )?)
            }
        })
    }
}

/// What happens to a trial after a result.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Train another iteration.
    Continue,
    /// End the trial as TERMINATED.
    Stop,
    /// Checkpoint the trial and release its instance; it stays PAUSED until
    /// [`Scheduler::choose_next`] picks it again, and then continues from
    /// that checkpoint, or until [`Scheduler::take_stops`] ends it.
    Pause,
    /// Checkpoint the trial now (whatever `checkpoint_freq` says), then
    /// train on: PBT keeps its best trials' states fresh for others to
    /// clone.
    Checkpoint,
    /// PBT's exploit and explore: drop this trial's state, continue from
    /// the newest checkpoint of the trial at index `source` (a copy becomes
    /// this trial's own), with `config` from then on. Counters
    /// (`training_iteration`, `fuel_total`, `time_total_s`) continue from
    /// the source's checkpoint. When the source has no checkpoint, the
    /// trial continues unchanged.
    Exploit {
        /// Index, into the trials, of the trial whose state is cloned.
        source: usize,
        /// The configuration the trial continues with.
        config: Value,
    },
}

/// Trial scheduling policy.
pub trait Scheduler: Send {
    /// Called after each result of a RUNNING trial that no stopping
    /// criterion has ended.
    fn on_result(&mut self, trial: &Trial, result: &Map<String, Value>) -> Decision;

    /// A new trial was created (PENDING). Called once per trial, before
    /// [`Scheduler::choose_next`] can see it; trials restored by `wtune
    /// resume` are already known through [`Scheduler::restore_state`].
    fn on_trial_add(&mut self, trial: &Trial) {
        let _ = trial;
    }

    /// A trial ended without a final result the scheduler was told about
    /// through [`Scheduler::on_trial_complete`]: it failed (ERROR), or a
    /// control request stopped or holds it (a held trial shows as ERROR to
    /// the scheduler until [`Scheduler::on_trial_retry`]). A scheduler that
    /// waits for groups of trials (synchronous HyperBand) must stop waiting
    /// for it.
    fn on_trial_remove(&mut self, trial: &Trial) {
        let _ = trial;
    }

    /// A trial that ended in ERROR runs again (`wtune resume
    /// --retry-errored` or `--restart-errored`), or a control request
    /// resumed a held trial: it is PAUSED at its newest checkpoint or
    /// PENDING, and live again after the scheduler was told it ended
    /// ([`Scheduler::on_trial_remove`]). By default it is treated as a new
    /// trial.
    fn on_trial_retry(&mut self, trial: &Trial) {
        self.on_trial_add(trial);
    }

    /// The searcher will create no more trials: a scheduler holding trials
    /// back until a group fills up must now decide with the trials it has.
    /// The runner calls it once, when `choose_next` has nothing and the
    /// searcher has nothing more, and then goes on as usual
    /// ([`Scheduler::take_stops`], then [`Scheduler::choose_next`]) before
    /// deciding whether the experiment is over.
    fn on_no_more_trials(&mut self) {}

    /// Called instead of [`Scheduler::on_result`] with the last result of a
    /// trial that a stopping criterion or the trainable itself ended, so
    /// the scheduler can still count it (ASHA records it at its rung).
    fn on_trial_complete(&mut self, trial: &Trial, result: &Map<String, Value>) {
        let _ = (trial, result);
    }

    /// The resources `trial` should hold from now on, when they should
    /// differ from what it holds (`trial.resources`, else the experiment's
    /// `resources_per_trial`). Asked before each launch and after each
    /// result that lets the trial continue: a change takes effect at once
    /// when the pool has room, else the trial is checkpointed, PAUSED, and
    /// continues once it fits (Ray Tune's resource-changing scheduling).
    fn resources(&mut self, trial: &Trial) -> Option<Resources> {
        let _ = trial;
        None
    }

    /// Picks the PENDING or PAUSED trial to run next, or `None` to start
    /// nothing now.
    fn choose_next(&mut self, trials: &[Trial]) -> Option<usize>;

    /// Trials the scheduler has ended although they are not running: the
    /// indices, into `trials`, of PENDING or PAUSED trials that must end
    /// TERMINATED without training again. [`Decision`] only reaches the
    /// trial whose result is being handled, so this is how a scheduler
    /// ends the others: synchronous HyperBand stops the losers of a rung
    /// that were paused waiting for it, and ASHA's promotion variant stops
    /// the paused trials that nothing can promote any more once the
    /// experiment has nothing else to run.
    ///
    /// The runner calls this before every call to
    /// [`Scheduler::choose_next`] (so also right after
    /// [`Scheduler::on_no_more_trials`], which it follows with a
    /// `choose_next`), but not while it is halting, and ends each trial
    /// returned: TERMINATED, `stop_reason` "stopped by the NAME scheduler",
    /// callbacks told as for any other end, nothing else asked of the
    /// scheduler about it ([`Scheduler::on_trial_complete`] is not called:
    /// the scheduler already counts it as ended). Every index returned is
    /// returned once. A trial the scheduler wants ended while it is still
    /// RUNNING (its pause not yet complete) is kept back by the scheduler
    /// and returned by a later call, once `trials` shows it PAUSED, so the
    /// runner need not remember anything.
    fn take_stops(&mut self, trials: &[Trial]) -> Vec<usize> {
        let _ = trials;
        Vec::new()
    }

    /// The name shown to users.
    fn name(&self) -> &'static str;

    /// The scheduler's own state, saved with the experiment so that
    /// `wtune resume` continues with the same decisions. Stateless
    /// schedulers keep the default.
    fn state(&self) -> Value {
        Value::Null
    }

    /// Takes back what [`Scheduler::state`] returned.
    fn restore_state(&mut self, state: &Value) -> Result<(), String> {
        let _ = state;
        Ok(())
    }
}

/// First in, first out: trials start in order and run until a stopping
/// criterion or the trainable ends them. PAUSED trials (an experiment
/// resumed after an interruption) continue in the same order.
#[derive(Debug, Default)]
pub struct Fifo {
    /// Trials before this index are known to be neither PENDING nor PAUSED,
    /// except the `retried` ones: FIFO never pauses a trial itself.
    cursor: usize,
    /// Trials live again ([`Scheduler::on_trial_retry`]), perhaps behind
    /// the cursor, first in first out; each leaves the queue once seen
    /// neither PENDING nor PAUSED.
    retried: VecDeque<String>,
}

impl Scheduler for Fifo {
    fn on_result(&mut self, _trial: &Trial, _result: &Map<String, Value>) -> Decision {
        Decision::Continue
    }

    fn on_trial_retry(&mut self, trial: &Trial) {
        self.retried.push_back(trial.trial_id.clone());
    }

    fn choose_next(&mut self, trials: &[Trial]) -> Option<usize> {
        while let Some(id) = self.retried.front() {
            // Retries are rare; finding one by its id costs a scan.
            match trials.iter().position(|t| &t.trial_id == id) {
                Some(index)
                    if matches!(
                        trials[index].status,
                        TrialStatus::Pending | TrialStatus::Paused
                    ) =>
                {
                    return Some(index);
                }
                _ => {
                    self.retried.pop_front();
                }
            }
        }
        while self.cursor < trials.len() {
            if matches!(
                trials[self.cursor].status,
                TrialStatus::Pending | TrialStatus::Paused
            ) {
                return Some(self.cursor);
            }
            self.cursor += 1;
        }
        None
    }

    fn name(&self) -> &'static str {
        "fifo"
    }
}

/// A runner in miniature for scheduler tests: creates trials lazily (one
/// at a time, when a slot is free and `choose_next` has nothing), steps the
/// running trials round robin, asks `take_stops` before every
/// `choose_next`, and applies decisions as the runner does.
#[cfg(test)]
pub(crate) mod sim {
    use std::collections::VecDeque;

    use serde_json::{Value, json};

    use super::{Decision, Scheduler};
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    use super::super::asha::AshaVariant;

    fn spec(value: Value) -> Result<SchedulerSpec, String> {
        serde_json::from_value(value).map_err(|e| e.to_string())
    }

    #[test]
    fn specs_name_hyperband_and_the_asha_variant() {
        assert!(SchedulerSpec::NAMES.contains(&"hyperband"));
        let hb = spec(json!({"type": "hyperband", "max_t": 9, "time_attr": "fuel_total"})).unwrap();
        let SchedulerSpec::HyperBand(config) = &hb else {
            panic!("hyperband expected, got {hb:?}")
        };
        assert_eq!(
            (
                config.max_t,
                config.reduction_factor,
                config.stop_last_trials
            ),
            (9.0, 3.0, true)
        );
        assert_eq!(config.time_attr, "fuel_total");
        assert!(hb.ends_trials(), "max_t ends every trial");
        let open_ended = spec(json!({"type": "hyperband", "stop_last_trials": false})).unwrap();
        assert!(!open_ended.ends_trials());
        assert_eq!(
            hb.build(Some("loss"), Mode::Min, 0).unwrap().name(),
            "hyperband"
        );
        let message = hb.build(None, Mode::Min, 0).err().unwrap();
        assert!(message.contains("`metric`"), "{message}");
        let message = spec(json!({"type": "hyperband", "max_t": 0}))
            .unwrap()
            .build(Some("loss"), Mode::Min, 0)
            .err()
            .unwrap();
        assert!(message.contains("max_t"), "{message}");
        let message = spec(json!({"type": "hyperband", "brackets": 2})).unwrap_err();
        assert!(message.contains("brackets"), "{message}");

        let asha = spec(json!({"type": "asha", "variant": "promotion"})).unwrap();
        let SchedulerSpec::Asha(config) = &asha else {
            panic!("asha expected, got {asha:?}")
        };
        assert_eq!(config.variant, AshaVariant::Promotion);
        assert!(asha.ends_trials());
        let SchedulerSpec::Asha(default) = spec(json!({"type": "asha"})).unwrap() else {
            panic!("asha expected")
        };
        assert_eq!(default.variant, AshaVariant::Stopping);
        let message = spec(json!({"type": "asha", "variant": "eager"})).unwrap_err();
        assert!(message.contains("scheduler.variant"), "{message}");
    }

    #[test]
    fn fifo_runs_trials_in_order_and_ends_none_itself() {
        let mut fifo = Fifo::default();
        let mut sim = sim::Sim::new(4, 2);
        sim.stop_at = Some(3);
        assert!(sim.run(&mut fifo, &|i, t| (i as u64 * t) as f64, None));
        assert_eq!(sim.iterations(), [3, 3, 3, 3]);
        assert!(sim.unfinished().is_empty());
        assert!(sim.resumed.is_empty() && sim.taken.is_empty());
    }
}
