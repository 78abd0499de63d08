//! A backend whose trainables are plain Rust closures: for testing and
//! benchmarking the runner without a sandbox, the way Syne Tune replays
//! learning curves.

use std::sync::Arc;

use serde_json::Value;

use super::backend::{Step, TrialBackend, TrialFailure, TrialLaunch, TrialSession};

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
}

impl TrialBackend for FnBackend {
    type Session = FnSession;

    fn launch(&self, launch: &TrialLaunch) -> Result<FnSession, TrialFailure> {
        Ok(FnSession {
            step: (self.factory)(&launch.config)?,
            iteration: 0,
            fuel_total: 0,
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

    fn stop(self) -> Result<(), TrialFailure> {
        Ok(())
    }
}
