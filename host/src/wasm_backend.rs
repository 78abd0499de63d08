//! The trial backend that runs trainables in the sandbox: the one place
//! where the runner's world (trials, steps, checkpoints) meets the sandbox's
//! (programs, instances, snapshots).

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::compute::ComputeOptions;
use crate::sandbox::{Limits, Program, TrialEnv, TrialFault, TrialInstance};
use crate::snapshot::{self, Payload, SnapshotFile, SnapshotKey, SnapshotMeta};
use crate::tune::{
    CheckpointFault, CheckpointInfo, CheckpointMeta, RunSpec, Step, TrialBackend, TrialFailure,
    TrialLaunch, TrialSession, fit_gpu,
};
use crate::units::human_bytes;

/// How trials are checkpointed (`checkpoint = "snapshot" | "guest"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckpointMode {
    /// The host snapshots the guest's memory and globals: no guest code.
    Snapshot,
    /// The guest's own `save()` and `restore()`.
    Guest,
}

impl FromStr for CheckpointMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "snapshot" => Ok(CheckpointMode::Snapshot),
            "guest" => Ok(CheckpointMode::Guest),
            other => Err(format!(
                "checkpoint must be \"snapshot\" (host-taken memory snapshots) or \"guest\" \
                 (the trainable's own save/restore), got {other:?}"
            )),
        }
    }
}

impl fmt::Display for CheckpointMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CheckpointMode::Snapshot => "snapshot",
            CheckpointMode::Guest => "guest",
        })
    }
}

/// Runs each trial as a fresh instance of one compiled component.
#[derive(Clone)]
pub struct WasmBackend {
    program: Program,
    limits: Limits,
    data: Vec<(String, PathBuf)>,
    mode: CheckpointMode,
    key: Option<SnapshotKey>,
}

impl WasmBackend {
    /// Every trial of `program` gets `limits` and the read-only `data`
    /// grants (`(name, host dir)`, mounted at `/data/<name>`). Checkpoints
    /// are host snapshots when the component allows them, else the guest's
    /// own `save()`; see [`WasmBackend::checkpoint_mode`].
    pub fn new(program: Program, limits: Limits, data: Vec<(String, PathBuf)>) -> Self {
        let mode = match program.snapshots() {
            Ok(()) => CheckpointMode::Snapshot,
            Err(_) => CheckpointMode::Guest,
        };
        Self {
            program,
            limits,
            data,
            mode,
            key: None,
        }
    }

    /// Fits `spec` to this machine and what the program uses: GPU shares
    /// to the adapters host compute runs on ([`fit_gpu`]), and, when the
    /// program imports host compute, the trials at once to the number of
    /// `compute` quotas its total holds, so that each is sure of its own.
    /// Then checks that one trial's resources fit the pool. What it changed
    /// goes to `note`, as it is changed (a later error does not hide it);
    /// an error names what does not fit.
    pub fn fit_spec(
        &self,
        spec: &mut RunSpec,
        compute: &ComputeOptions,
        mut note: impl FnMut(&str),
    ) -> Result<(), String> {
        if let Some(said) = fit_gpu(
            &mut spec.resources,
            &mut spec.resources_per_trial,
            self.program.compute_gpus(),
        )? {
            note(&said);
        }
        if self.program.uses_compute() {
            let shares = compute.shares().max(1);
            if spec.max_concurrent as u64 > shares {
                note(&format!(
                    "running at most {shares} trials at once (not {}), so that each is sure \
                     of its limits.compute_memory ({}) within limits.compute_memory_total ({})",
                    spec.max_concurrent,
                    human_bytes(compute.trial_quota),
                    human_bytes(compute.total_quota)
                ));
                spec.max_concurrent = shares as usize;
            }
        }
        let pool = spec.pool_spec().build()?;
        pool.check(&spec.resources_per_trial)
            .map_err(|e| format!("resources_per_trial: {e}"))
    }

    /// The program every trial instantiates.
    pub fn program(&self) -> &Program {
        &self.program
    }

    /// Picks how checkpoints are taken. Host snapshots must be supported by
    /// the component; the error says why they are not.
    pub fn checkpoint_mode(mut self, mode: CheckpointMode) -> Result<Self, String> {
        if mode == CheckpointMode::Snapshot
            && let Err(refusal) = self.program.snapshots()
        {
            return Err(format!(
                "checkpoint = \"snapshot\" is not possible for this component: {}; \
                 use checkpoint = \"guest\" if it implements save/restore",
                refusal.reason()
            ));
        }
        self.mode = mode;
        Ok(self)
    }

    /// Authenticates checkpoints with `key` (written with a MAC; read only
    /// when the MAC matches).
    pub fn snapshot_key(mut self, key: Option<SnapshotKey>) -> Self {
        self.key = key;
        self
    }

    /// The key checkpoints are authenticated with, if any.
    pub fn key(&self) -> Option<&SnapshotKey> {
        self.key.as_ref()
    }

    /// How checkpoints are taken.
    pub fn mode(&self) -> CheckpointMode {
        self.mode
    }

    /// Opens and verifies a checkpoint file written for this component: its
    /// metadata is read, its payload stays on disk until asked for.
    pub fn open_checkpoint(&self, path: &Path) -> Result<SnapshotFile, String> {
        self.read_checkpoint(path).map_err(|e| e.to_string())
    }

    /// [`WasmBackend::open_checkpoint`], saying whether the file is damaged.
    fn read_checkpoint(&self, path: &Path) -> Result<SnapshotFile, CheckpointFault> {
        SnapshotFile::open(path, self.program.digest(), self.key.as_ref()).map_err(|e| {
            let why = format!("checkpoint {}: {e}", path.display());
            if e.is_damage() {
                CheckpointFault::Damaged(why)
            } else {
                CheckpointFault::Unreadable(why)
            }
        })
    }

    /// Starts a trial: a fresh instance set up with `launch.config`, or,
    /// with `launch.restore`, one continued from that checkpoint. The
    /// guest sees `trial_dir/work` as its directory, so the host's own
    /// files (results, logs, checkpoints) are out of its reach. What
    /// [`TrialBackend::launch`] does, with the fault's family kept for
    /// embedders that act on it (the Python package).
    pub fn start_trial(&self, launch: &TrialLaunch) -> Result<WasmSession, WasmError> {
        match &launch.restore {
            Some(path) => {
                // A checkpoint that cannot be read or restored fails the same
                // way on every retry.
                let file = self.open_checkpoint(path).map_err(WasmError::Checkpoint)?;
                self.resume_trial(launch, path, file)
            }
            None => {
                let env = self.trial_env(launch)?;
                Ok(self.session(self.start(&env, launch)?, 0.0))
            }
        }
    }

    /// Continues a trial from `file`, the checkpoint at `path` already
    /// opened (and so verified) with [`WasmBackend::open_checkpoint`], with
    /// `launch.config` (a checkpoint of another configuration is switched
    /// to it through the guest's `reset`). `launch.restore` is not read.
    /// For callers that read the checkpoint's metadata first: the file is
    /// verified once, not twice.
    pub fn resume_trial(
        &self,
        launch: &TrialLaunch,
        path: &Path,
        file: SnapshotFile,
    ) -> Result<WasmSession, WasmError> {
        let env = self.trial_env(launch)?;
        let time_restored_s = file.meta().time_total_s;
        let instance = self.restore(&env, launch, path, file)?;
        Ok(self.session(instance, time_restored_s))
    }

    /// The trial's view of the machine; creates its guest directory.
    fn trial_env(&self, launch: &TrialLaunch) -> Result<TrialEnv, WasmError> {
        let work_dir = launch.trial_dir.join("work");
        std::fs::create_dir_all(&work_dir)
            .map_err(|e| WasmError::Io(format!("cannot create {}: {e}", work_dir.display())))?;
        Ok(TrialEnv {
            work_dir,
            log_dir: launch.trial_dir.clone(),
            data: self.data.clone(),
            gpu: launch.gpus.first().copied(),
        })
    }

    fn session(&self, instance: TrialInstance, time_restored_s: f64) -> WasmSession {
        WasmSession {
            instance,
            digest: self.program.digest().to_string(),
            mode: self.mode,
            key: self.key.clone(),
            time_restored_s,
        }
    }

    fn restore(
        &self,
        env: &TrialEnv,
        launch: &TrialLaunch,
        path: &Path,
        mut file: SnapshotFile,
    ) -> Result<TrialInstance, WasmError> {
        let meta = file.meta().clone();
        let restoring = |e: &dyn std::fmt::Display| {
            WasmError::Checkpoint(format!("restoring {}: {e}", path.display()))
        };
        let most = self.limits_for(launch).memory_bytes;
        let instance = match file.guest_state(most).map_err(|e| restoring(&e))? {
            Some(state) => {
                let mut instance = self.start(env, launch)?;
                instance
                    .restore(&state)
                    .map_err(|fault| restoring(&fault))?;
                instance.continue_counts(meta.iteration, meta.fuel_total);
                instance
            }
            None => {
                // Memory is read from the file as it is written into the
                // instance: the host holds no second copy of it.
                let mut instance = self
                    .program
                    .restore_from(
                        env,
                        &self.limits_for(launch),
                        &mut file,
                        meta.iteration,
                        meta.fuel_total,
                    )
                    .map_err(|e| restoring(&e))?;
                drop(file);
                if meta.config != launch.config {
                    // The snapshot's memory holds its own trial's
                    // configuration; only the trainable can switch it (a
                    // PBT exploit), keeping what it learned.
                    let (reconfigured, _) =
                        instance
                            .reset(&launch.config.to_string())
                            .map_err(|fault| {
                                WasmError::Checkpoint(format!(
                                    "switching {} to this trial's config: {fault}",
                                    path.display()
                                ))
                            })?;
                    if !reconfigured {
                        return Err(WasmError::Checkpoint(format!(
                            "checkpoint {} is a host snapshot of a trial with config {}, and \
                             this component's reset() does not take config {}; implement \
                             reset (keeping learned state), or use guest checkpoints \
                             (checkpoint = \"guest\"), which start new configurations",
                            path.display(),
                            meta.config,
                            launch.config
                        )));
                    }
                }
                instance
            }
        };
        Ok(instance)
    }

    fn start(&self, env: &TrialEnv, launch: &TrialLaunch) -> Result<TrialInstance, WasmError> {
        let mut instance = self.program.instantiate(env, &self.limits_for(launch))?;
        instance.setup(&launch.config.to_string())?;
        Ok(instance)
    }

    /// The experiment's limits, with memory capped at what the trial holds
    /// from the resource pool: a trial cannot use more than it reserved.
    fn limits_for(&self, launch: &TrialLaunch) -> Limits {
        let mut limits = self.limits.clone();
        let reserved = launch.resources.memory;
        if reserved > 0 {
            limits.memory_bytes = limits.memory_bytes.min(reserved);
        }
        limits
    }
}

/// A trial's live instance.
pub struct WasmSession {
    instance: TrialInstance,
    digest: String,
    mode: CheckpointMode,
    key: Option<SnapshotKey>,
    time_restored_s: f64,
}

/// Why a sandboxed trial could not go on, keeping the fault itself where
/// the guest caused it.
#[derive(Debug, Clone, PartialEq)]
pub enum WasmError {
    /// The trainable failed or hit a limit.
    Fault(TrialFault),
    /// A checkpoint could not be read or restored; it fails the same way on
    /// every try.
    Checkpoint(String),
    /// The host could not write what it had to (a checkpoint file, the
    /// trial's directory).
    Io(String),
}

impl From<TrialFault> for WasmError {
    fn from(fault: TrialFault) -> Self {
        WasmError::Fault(fault)
    }
}

impl fmt::Display for WasmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WasmError::Fault(fault) => fault.fmt(f),
            WasmError::Checkpoint(why) | WasmError::Io(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for WasmError {}

impl From<WasmError> for TrialFailure {
    fn from(error: WasmError) -> Self {
        match error {
            // Continuing from a checkpoint does not refill the budget.
            WasmError::Fault(fault @ TrialFault::FuelBudget { .. }) => {
                TrialFailure::permanent(fault.to_string())
            }
            WasmError::Checkpoint(why) => TrialFailure::permanent(why),
            other => TrialFailure::new(other.to_string()),
        }
    }
}

impl TrialBackend for WasmBackend {
    type Session = WasmSession;

    const CHECKPOINT_EXTENSION: &'static str = "wtsnap";

    fn describe_checkpoint(&self, path: &Path) -> Result<CheckpointMeta, CheckpointFault> {
        let file = self.read_checkpoint(path)?;
        let mut meta = file.meta().clone();
        Ok(CheckpointMeta {
            iteration: meta.iteration,
            time_total_s: meta.time_total_s,
            fuel_total: meta.fuel_total,
            result: meta.take_result(),
        })
    }

    fn launch(&self, launch: &TrialLaunch) -> Result<WasmSession, TrialFailure> {
        Ok(self.start_trial(launch)?)
    }
}

impl WasmSession {
    /// Runs one training iteration.
    pub fn step(&mut self) -> Result<Step, WasmError> {
        let (report, stats) = self.instance.train()?;
        Ok(Step {
            metrics: report.metrics,
            done: report.done,
            fuel: stats.fuel,
        })
    }

    /// Writes a checkpoint of the trial to `path` atomically (see
    /// [`TrialSession::save`]) and returns its size in bytes.
    pub fn checkpoint(&mut self, path: &Path, info: &CheckpointInfo<'_>) -> Result<u64, WasmError> {
        let meta = SnapshotMeta {
            component: self.digest.clone(),
            trial_id: info.trial_id.to_string(),
            config: info.config.clone(),
            iteration: self.instance.iterations(),
            fuel_total: self.instance.fuel_total(),
            time_total_s: info.time_total_s,
            result: info
                .result
                .map_or(Value::Null, |r| Value::Object(r.clone())),
        };
        let writing = |e: std::io::Error| WasmError::Io(format!("writing {}: {e}", path.display()));
        match self.mode {
            CheckpointMode::Snapshot => {
                // Straight from the guest's memory into a spool beside the
                // file: the host never holds a copy of the guest's memory.
                let spool = snapshot::Spool::beside(path).map_err(writing)?;
                let (image, spool) = self
                    .instance
                    .snapshot_into(spool)
                    .map_err(|e| WasmError::Io(format!("host snapshot: {e}")))?;
                snapshot::write_spooled(path, &meta, &image, spool, self.key.as_ref())
                    .map_err(writing)
            }
            CheckpointMode::Guest => {
                let payload = Payload::Guest(self.instance.save()?.0);
                snapshot::write(path, &meta, &payload, self.key.as_ref()).map_err(writing)
            }
        }
    }

    /// Asks the trainable to switch to `config` in place (`reset()`),
    /// keeping what it learned; `false` when it does not implement reset.
    pub fn reset(&mut self, config: &Value) -> Result<bool, WasmError> {
        Ok(self.instance.reset(&config.to_string())?.0)
    }

    /// Lets the trainable release its resources (`cleanup()`).
    pub fn close(mut self) -> Result<(), WasmError> {
        match self.instance.cleanup() {
            // A trapped instance cannot be entered again: there is nothing
            // left to clean up, and nothing new to report.
            Ok(_) | Err(TrialFault::Poisoned) => Ok(()),
            Err(fault) => Err(fault.into()),
        }
    }
}

impl TrialSession for WasmSession {
    fn train(&mut self) -> Result<Step, TrialFailure> {
        Ok(self.step()?)
    }

    fn fuel_total(&self) -> u64 {
        self.instance.fuel_total()
    }

    fn iteration(&self) -> u64 {
        self.instance.iterations()
    }

    fn time_restored_s(&self) -> f64 {
        self.time_restored_s
    }

    fn save(&mut self, path: &Path, info: &CheckpointInfo<'_>) -> Result<u64, TrialFailure> {
        Ok(self.checkpoint(path, info)?)
    }

    fn stop(self) -> Result<(), TrialFailure> {
        Ok(self.close()?)
    }
}
