//! What `experiment_state.json` keeps of a run for `wtune resume`.

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::compute::ComputeOptions;
use crate::config;
use crate::sandbox::{CompileOptions, Limits};
use crate::tune::{Listed, RunSpec, Scheduler, SchedulerSpec, SearchSpace, SearchSpec, Searcher};
use crate::wasm_backend::CheckpointMode;

use super::Failure;

/// What `experiment_state.json` keeps for `wtune resume`: the validated
/// plan as it was run.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Setup {
    pub(super) model: PathBuf,
    pub(super) model_blake3: String,
    pub(super) spec: RunSpec,
    pub(super) limits: Limits,
    pub(super) max_wasm_stack: usize,
    pub(super) data: Vec<(String, PathBuf)>,
    pub(super) checkpoint: CheckpointMode,
    pub(super) snapshot_key_file: Option<PathBuf>,
    pub(super) scheduler: SchedulerSpec,
    pub(super) seed: u64,
    pub(super) num_samples: u64,
    /// The search space, as JSON; `null` in setups saved before trials
    /// were created lazily, whose every trial is in the saved state.
    #[serde(default)]
    pub(super) param_space: Value,
    /// The search algorithm.
    #[serde(default)]
    pub(super) search: SearchSpec,
    /// Every trial's configuration when they all continue from one host
    /// snapshot (`restore_from`), which holds its own.
    #[serde(default)]
    pub(super) fixed_config: Option<Value>,
    /// The host compute backend and quotas.
    #[serde(default)]
    pub(super) compute: ComputeOptions,
    /// Where the component is compiled, and the compile limits.
    #[serde(default)]
    pub(super) compile: CompileOptions,
    /// The experiment's component allowlist, applied again on resume.
    #[serde(default)]
    pub(super) allowed_components: Option<BTreeSet<String>>,
    /// What results are also written as (TensorBoard files for setups
    /// saved before `[tracking]` existed, as for new ones by default).
    #[serde(default)]
    pub(super) tracking: config::Tracking,
}

impl Setup {
    /// The setup as `experiment_state.json` keeps it. JSON holds text, so
    /// a path that is not UTF-8 (a file name, or the directory the command
    /// runs in) is refused, named.
    pub(super) fn saved(&self) -> Result<Value, Failure> {
        serde_json::to_value(self).map_err(|e| {
            let spec = &self.spec;
            let paths = [Some(&self.model), Some(&spec.output_dir)]
                .into_iter()
                .chain([spec.restore_from.as_ref(), self.snapshot_key_file.as_ref()])
                .chain(self.data.iter().map(|(_, dir)| Some(dir)))
                .flatten();
            match paths.into_iter().find(|p| p.to_str().is_none()) {
                Some(path) => Failure::user(format!(
                    "{} is not valid UTF-8, and the experiment's state keeps its paths as \
                     text: rename it, or run from a directory whose path is UTF-8",
                    path.display()
                )),
                None => Failure::runtime(format!("the experiment's setup cannot be saved: {e}")),
            }
        })
    }

    /// How the results were produced, for `experiment.json`'s `run`.
    pub(super) fn run_info(&self) -> Value {
        let limits = &self.limits;
        json!({
            "model": self.model.display().to_string(),
            "model_blake3": self.model_blake3,
            "seed": self.seed,
            "num_samples": self.num_samples,
            "checkpoint": self.checkpoint,
            "limits": {
                "fuel_per_call": limits.fuel_per_call,
                "fuel_per_trial": limits.fuel_per_trial,
                "memory_bytes": limits.memory_bytes,
                "call_timeout_s": limits.call_timeout.map(|d| d.as_secs_f64()),
                "max_wasm_stack": self.max_wasm_stack,
                "compute_memory": self.compute.trial_quota,
                "compute_memory_total": self.compute.total_quota,
            },
            "compute": self.compute.mode,
            "compile": self.compile,
            "allowed_components": self.allowed_components,
            "tracking": self.tracking,
            "data": self.data.iter().map(|(n, d)| (n.clone(), d.display().to_string())).collect::<std::collections::BTreeMap<_, _>>(),
            "wtune_version": env!("CARGO_PKG_VERSION"),
        })
    }

    pub(super) fn scheduler(&self) -> Result<Box<dyn Scheduler>, Failure> {
        self.scheduler
            .build(self.spec.metric.as_deref(), self.spec.mode, self.seed)
            .map_err(Failure::user)
    }

    /// The searcher that creates the experiment's trials.
    pub(super) fn searcher(&self) -> Result<Box<dyn Searcher>, Failure> {
        if let Some(config) = &self.fixed_config {
            // `wtune run` bounds the count through the empty search space;
            // `wtune resume --num-samples` comes here, and is bounded alike.
            let count = SearchSpace::default()
                .trial_count(self.num_samples)
                .map_err(|e| Failure::user(e.to_string()))?;
            let count = usize::try_from(count).expect("at most MAX_TRIALS");
            return Ok(Box::new(Listed::repeated(config.clone(), count)));
        }
        config::searcher(
            &self.search,
            &self.param_space,
            self.num_samples,
            &self.spec,
            self.seed,
        )
        .map_err(Failure::user)
    }
}
