//! The trial backend that runs trainables in the sandbox: the one place
//! where the runner's world (trials, steps) meets the sandbox's (programs,
//! instances).

use std::path::PathBuf;

use crate::sandbox::{Limits, Program, TrialEnv, TrialFault, TrialInstance};
use crate::tune::{Step, TrialBackend, TrialFailure, TrialLaunch, TrialSession};

/// Runs each trial as a fresh instance of one compiled component.
#[derive(Clone)]
pub struct WasmBackend {
    program: Program,
    limits: Limits,
    data: Vec<(String, PathBuf)>,
}

impl WasmBackend {
    /// Every trial of `program` gets `limits` and the read-only `data`
    /// grants (`(name, host dir)`, mounted at `/data/<name>`).
    pub fn new(program: Program, limits: Limits, data: Vec<(String, PathBuf)>) -> Self {
        Self {
            program,
            limits,
            data,
        }
    }
}

/// A trial's live instance.
pub struct WasmSession {
    instance: TrialInstance,
}

fn failure(fault: TrialFault) -> TrialFailure {
    TrialFailure::new(fault.to_string())
}

impl TrialBackend for WasmBackend {
    type Session = WasmSession;

    fn launch(&self, launch: &TrialLaunch) -> Result<WasmSession, TrialFailure> {
        // The guest's directory is a child of the trial directory, so the
        // host's own files (results, logs) are out of the guest's reach.
        let work_dir = launch.trial_dir.join("work");
        std::fs::create_dir_all(&work_dir)
            .map_err(|e| TrialFailure::new(format!("cannot create {}: {e}", work_dir.display())))?;
        let env = TrialEnv {
            work_dir,
            log_dir: launch.trial_dir.clone(),
            data: self.data.clone(),
        };
        let mut instance = self
            .program
            .instantiate(&env, &self.limits)
            .map_err(failure)?;
        instance
            .setup(&launch.config.to_string())
            .map_err(failure)?;
        Ok(WasmSession { instance })
    }
}

impl TrialSession for WasmSession {
    fn train(&mut self) -> Result<Step, TrialFailure> {
        let (report, stats) = self.instance.train().map_err(failure)?;
        Ok(Step {
            metrics: report.metrics,
            done: report.done,
            fuel: stats.fuel,
        })
    }

    fn fuel_total(&self) -> u64 {
        self.instance.fuel_total()
    }

    fn stop(mut self) -> Result<(), TrialFailure> {
        self.instance.cleanup().map(drop).map_err(failure)
    }
}
