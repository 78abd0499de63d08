//! A backend whose trainables are plain Rust closures: for testing and
//! benchmarking the runner without a sandbox, the way Syne Tune replays
//! learning curves.
//!
//! Checkpoints hold the iteration and fuel counts (a small JSON file): a
//! step function is a function of the config and the iteration number, so
//! restoring those counts restores the trial. Closures that keep other
//! state across calls restart it.

use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::backend::{
    CheckpointInfo, CheckpointMeta, Step, TrialBackend, TrialFailure, TrialLaunch, TrialSession,
};

type StepFn = Box<dyn FnMut(u64) -> Result<Step, TrialFailure> + Send>;
type Factory = dyn Fn(&Value) -> Result<StepFn, TrialFailure> + Send + Sync;

/// Builds each trial's step function from its config; the step function gets
/// the 1-based iteration number.
///
/// ```
/// use wtune::tune::{FnBackend, Step};
/// let backend = FnBackend::new(|config| {
///     let lr = config["lr"].as_f64().unwrap_or(0.1);
///     Ok(move |iteration: u64| Ok(Step {
///         metrics: vec![("loss".into(), 1.0 / (1.0 + lr * iteration as f64))],
///         done: false,
///         fuel: 1,
///     }))
/// });
/// # let _ = backend;
/// ```
#[derive(Clone)]
pub struct FnBackend {
    factory: Arc<Factory>,
}

impl FnBackend {
    /// A backend from a factory of step functions.
    pub fn new<F, S>(factory: F) -> Self
    where
        F: Fn(&Value) -> Result<S, TrialFailure> + Send + Sync + 'static,
        S: FnMut(u64) -> Result<Step, TrialFailure> + Send + 'static,
    {
        Self {
            factory: Arc::new(move |config| Ok(Box::new(factory(config)?) as StepFn)),
        }
    }
}

/// A live [`FnBackend`] trial.
pub struct FnSession {
    step: StepFn,
    iteration: u64,
    fuel_total: u64,
    time_restored_s: f64,
}

/// The content of an [`FnBackend`] checkpoint file.
#[derive(Debug, Serialize, Deserialize)]
struct FnCheckpoint {
    trial_id: String,
    iteration: u64,
    fuel_total: u64,
    time_total_s: f64,
    #[serde(default)]
    result: Option<serde_json::Map<String, Value>>,
}

fn read(path: &Path) -> Result<FnCheckpoint, TrialFailure> {
    let bytes = std::fs::read(path)
        .map_err(|e| TrialFailure::new(format!("reading checkpoint {}: {e}", path.display())))?;
    serde_json::from_slice::<FnCheckpoint>(&bytes)
        .map_err(|e| TrialFailure::new(format!("checkpoint {} is damaged: {e}", path.display())))
}

impl TrialBackend for FnBackend {
    type Session = FnSession;

    fn launch(&self, launch: &TrialLaunch) -> Result<FnSession, TrialFailure> {
        let restored = match &launch.restore {
            Some(path) => read(path)?,
            None => FnCheckpoint {
                trial_id: launch.trial_id.clone(),
                iteration: 0,
                fuel_total: 0,
                time_total_s: 0.0,
                result: None,
            },
        };
        Ok(FnSession {
            step: (self.factory)(&launch.config)?,
            iteration: restored.iteration,
            fuel_total: restored.fuel_total,
            time_restored_s: restored.time_total_s,
        })
    }

    fn describe_checkpoint(&self, path: &Path) -> Result<CheckpointMeta, TrialFailure> {
        let checkpoint = read(path)?;
        Ok(CheckpointMeta {
            iteration: checkpoint.iteration,
            time_total_s: checkpoint.time_total_s,
            fuel_total: checkpoint.fuel_total,
            result: checkpoint.result,
        })
    }
}

impl TrialSession for FnSession {
    fn train(&mut self) -> Result<Step, TrialFailure> {
        self.iteration += 1;
        let step = (self.step)(self.iteration)?;
        self.fuel_total += step.fuel;
        Ok(step)
    }

    fn fuel_total(&self) -> u64 {
        self.fuel_total
    }

    fn iteration(&self) -> u64 {
        self.iteration
    }

    fn time_restored_s(&self) -> f64 {
        self.time_restored_s
    }

    fn save(&mut self, path: &Path, info: &CheckpointInfo<'_>) -> Result<u64, TrialFailure> {
        let checkpoint = FnCheckpoint {
            trial_id: info.trial_id.to_string(),
            iteration: self.iteration,
            fuel_total: self.fuel_total,
            time_total_s: info.time_total_s,
            result: info.result.cloned(),
        };
        let bytes = serde_json::to_vec(&checkpoint).expect("checkpoints serialize");
        crate::persist::write_atomic(path, &bytes)
            .map_err(|e| TrialFailure::new(format!("writing {}: {e}", path.display())))?;
        Ok(bytes.len() as u64)
    }

    fn stop(self) -> Result<(), TrialFailure> {
        Ok(())
    }
}
