//! The runner: an event loop that starts trials up to the concurrency limit,
//! steps them, records results, applies stopping criteria and the
//! scheduler's decisions, and reports to callbacks (files, progress).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Map, Value};
use tokio::task::JoinSet;

use super::backend::{Step, TrialBackend, TrialFailure, TrialLaunch, TrialSession};
use super::result::{self, Mode};
use super::scheduler::{Decision, Scheduler};
use super::stop::StopCriteria;
use super::trial::{Trial, TrialStatus};

/// What to run.
#[derive(Debug, Clone)]
pub struct RunSpec {
    /// The experiment's name.
    pub name: String,
    /// Where trial directories go (`<output_dir>/trial_0000`, ...).
    pub output_dir: PathBuf,
    /// The metric that ranks trials; every result must report it.
    pub metric: Option<String>,
    /// Whether the metric is minimized or maximized.
    pub mode: Mode,
    /// Per-trial stopping criteria.
    pub stop: StopCriteria,
    /// Most trials live at once (at least 1).
    pub max_concurrent: usize,
    /// One configuration per trial, in trial order.
    pub configs: Vec<Value>,
}

/// Observes the experiment. File loggers and progress displays are
/// callbacks. An `Err` from a trial-level hook ends that trial as ERROR with
/// the message (a full disk fails the trial whose file could not be
/// written, not the experiment).
#[allow(unused_variables)]
pub trait Callback: Send {
    /// Before any trial starts.
    fn on_experiment_start(&mut self, spec: &RunSpec, trials: &[Trial]) -> Result<(), String> {
        Ok(())
    }
    /// A trial is about to be launched (its status is RUNNING).
    fn on_trial_start(&mut self, trials: &[Trial], index: usize) -> Result<(), String> {
        Ok(())
    }
    /// A trial reported a result (already stored as its `last_result`).
    fn on_result(
        &mut self,
        trials: &[Trial],
        index: usize,
        result: &Map<String, Value>,
    ) -> Result<(), String> {
        Ok(())
    }
    /// A trial ended (TERMINATED or ERROR).
    fn on_trial_end(&mut self, trials: &[Trial], index: usize) -> Result<(), String> {
        Ok(())
    }
    /// Every trial has ended.
    fn on_experiment_end(&mut self, summary: &ExperimentSummary) -> Result<(), String> {
        Ok(())
    }
}

/// The outcome of a whole experiment.
#[derive(Debug, Clone)]
pub struct ExperimentSummary {
    /// The experiment's name.
    pub name: String,
    /// Where its files are.
    pub output_dir: PathBuf,
    /// The ranking metric, if any.
    pub metric: Option<String>,
    /// Its mode.
    pub mode: Mode,
    /// Every trial's final state.
    pub trials: Vec<Trial>,
    /// Index of the best trial by `metric`/`mode` on its last result.
    pub best: Option<usize>,
    /// Wall-clock time of the whole run.
    pub wall_time: Duration,
}

impl ExperimentSummary {
    /// The best trial, if a metric was set and any trial reported it.
    pub fn best_trial(&self) -> Option<&Trial> {
        self.best.map(|i| &self.trials[i])
    }

    /// How many trials ended with `status`.
    pub fn count(&self, status: TrialStatus) -> usize {
        self.trials.iter().filter(|t| t.status == status).count()
    }
}

/// Why a run could not complete at all (trial failures never cause this).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A callback failed at the experiment level (e.g. the output directory
    /// cannot be written).
    #[error("{0}")]
    Callback(String),
    /// A runner task panicked: a bug in wtune.
    #[error("internal error: {0}")]
    Internal(String),
}

/// Runs an experiment's trials on a backend.
pub struct Runner<B: TrialBackend> {
    backend: Arc<B>,
    spec: RunSpec,
    scheduler: Box<dyn Scheduler>,
    callbacks: Vec<Box<dyn Callback>>,
}

enum Outcome<S> {
    Stepped {
        session: S,
        step: Result<Step, TrialFailure>,
        elapsed: Duration,
        fuel_total: u64,
    },
    LaunchFailed(TrialFailure),
    Stopped,
}

impl<B: TrialBackend> Runner<B> {
    /// A runner for `spec` on `backend`, deciding with `scheduler`.
    pub fn new(backend: B, spec: RunSpec, scheduler: Box<dyn Scheduler>) -> Self {
        Self {
            backend: Arc::new(backend),
            spec,
            scheduler,
            callbacks: Vec::new(),
        }
    }

    /// Adds an observer; callbacks run in the order added.
    pub fn callback(mut self, callback: impl Callback + 'static) -> Self {
        self.callbacks.push(Box::new(callback));
        self
    }

    /// Runs every trial to completion. Must be called inside a tokio runtime.
    pub async fn run(mut self) -> Result<ExperimentSummary, RunError> {
        let started = Instant::now();
        let width = self
            .spec
            .configs
            .len()
            .saturating_sub(1)
            .to_string()
            .len()
            .max(4);
        let mut trials: Vec<Trial> = std::mem::take(&mut self.spec.configs)
            .into_iter()
            .enumerate()
            .map(|(i, config)| {
                let id = format!("trial_{i:0width$}");
                let dir = self.spec.output_dir.join(&id);
                Trial::new(id, config, dir)
            })
            .collect();
        for cb in &mut self.callbacks {
            cb.on_experiment_start(&self.spec, &trials)
                .map_err(RunError::Callback)?;
        }

        let max_concurrent = self.spec.max_concurrent.max(1);
        let mut tasks: JoinSet<(usize, Outcome<B::Session>)> = JoinSet::new();
        let mut live = 0;
        loop {
            while live < max_concurrent {
                let Some(index) = self.scheduler.choose_next(&trials) else {
                    break;
                };
                trials[index].status = TrialStatus::Running;
                if let Err(reason) = self.each(|cb, t| cb.on_trial_start(t, index), &trials) {
                    self.fail(&mut trials, index, reason);
                    continue;
                }
                live += 1;
                let launch = TrialLaunch {
                    trial_id: trials[index].trial_id.clone(),
                    config: trials[index].config.clone(),
                    trial_dir: trials[index].dir.clone(),
                };
                let backend = self.backend.clone();
                tasks.spawn_blocking(move || match backend.launch(&launch) {
                    Ok(session) => (index, step(session)),
                    Err(failure) => (index, Outcome::LaunchFailed(failure)),
                });
            }

            let Some(joined) = tasks.join_next().await else {
                break;
            };
            let (index, outcome) = joined.map_err(|e| RunError::Internal(e.to_string()))?;
            match outcome {
                Outcome::Stopped => live -= 1,
                Outcome::LaunchFailed(failure) => {
                    live -= 1;
                    self.fail(&mut trials, index, failure.reason);
                }
                Outcome::Stepped {
                    session,
                    step: Err(failure),
                    fuel_total,
                    ..
                } => {
                    trials[index].fuel_total = fuel_total;
                    self.fail(&mut trials, index, failure.reason);
                    tasks.spawn_blocking(move || (index, stop(session)));
                }
                Outcome::Stepped {
                    session,
                    step: Ok(step),
                    elapsed,
                    fuel_total,
                } => {
                    let trial = &mut trials[index];
                    trial.iterations += 1;
                    trial.time_total_s += elapsed.as_secs_f64();
                    trial.fuel_total = fuel_total;
                    match self.record(&mut trials, index, &step, elapsed) {
                        Ok(Decision::Continue) => {
                            tasks.spawn_blocking(move || (index, self::step(session)));
                        }
                        Ok(Decision::Stop) => {
                            trials[index].status = TrialStatus::Terminated;
                            if let Err(reason) =
                                self.each(|cb, t| cb.on_trial_end(t, index), &trials)
                            {
                                tracing::warn!(trial = %trials[index].trial_id, "{reason}");
                            }
                            tasks.spawn_blocking(move || (index, stop(session)));
                        }
                        Err(reason) => {
                            self.fail(&mut trials, index, reason);
                            tasks.spawn_blocking(move || (index, stop(session)));
                        }
                    }
                }
            }
        }

        let best = self
            .spec
            .metric
            .as_deref()
            .and_then(|m| best_trial(&trials, m, self.spec.mode));
        let summary = ExperimentSummary {
            name: self.spec.name.clone(),
            output_dir: self.spec.output_dir.clone(),
            metric: self.spec.metric.clone(),
            mode: self.spec.mode,
            trials,
            best,
            wall_time: started.elapsed(),
        };
        for cb in &mut self.callbacks {
            cb.on_experiment_end(&summary).map_err(RunError::Callback)?;
        }
        Ok(summary)
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
        let mut record = result::record(trial, step, elapsed, false)?;
        if let Some(metric) = &self.spec.metric
            && !record.contains_key(metric)
        {
            return Err(format!(
                "the experiment's metric `{metric}` is not in the trainable's report (it reports: {})",
                step.metrics
                    .iter()
                    .map(|(n, _)| n.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        let stop_reason = if step.done {
            Some("the trainable reported done".to_string())
        } else {
            self.spec.stop.reached(&record)?
        };
        let decision = match stop_reason {
            Some(_) => Decision::Stop,
            None => self.scheduler.on_result(trial, &record),
        };
        if decision == Decision::Stop {
            record.insert("done".into(), true.into());
        }
        let trial = &mut trials[index];
        trial.stop_reason = match (decision, stop_reason) {
            (Decision::Stop, Some(reason)) => Some(reason),
            (Decision::Stop, None) => Some(format!(
                "stopped by the {} scheduler",
                self.scheduler.name()
            )),
            (Decision::Continue, _) => None,
        };
        trial.last_result = Some(record.clone());
        self.each(|cb, t| cb.on_result(t, index, &record), trials)?;
        Ok(decision)
    }

    fn fail(&mut self, trials: &mut [Trial], index: usize, reason: String) {
        tracing::debug!(trial = %trials[index].trial_id, "ERROR: {reason}");
        let trial = &mut trials[index];
        trial.status = TrialStatus::Error;
        trial.error = Some(reason);
        trial.stop_reason = None;
        if let Err(reason) = self.each(|cb, t| cb.on_trial_end(t, index), trials) {
            tracing::warn!(trial = %trials[index].trial_id, "{reason}");
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

fn step<S: TrialSession>(mut session: S) -> Outcome<S> {
    let started = Instant::now();
    let step = session.train();
    let elapsed = started.elapsed();
    let fuel_total = session.fuel_total();
    Outcome::Stepped {
        session,
        step,
        elapsed,
        fuel_total,
    }
}

fn stop<S: TrialSession>(session: S) -> Outcome<S> {
    if let Err(failure) = session.stop() {
        tracing::debug!("cleanup failed: {failure}");
    }
    Outcome::Stopped
}

fn best_trial(trials: &[Trial], metric: &str, mode: Mode) -> Option<usize> {
    let mut best: Option<(usize, f64)> = None;
    for (i, trial) in trials.iter().enumerate() {
        let Some(value) = trial.metric(metric).filter(|v| v.is_finite()) else {
            continue;
        };
        if best.is_none_or(|(_, b)| mode.better(value, b)) {
            best = Some((i, value));
        }
    }
    best.map(|(i, _)| i)
}
