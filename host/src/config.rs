//! The experiment file (`experiment.toml`) and command-line overrides,
//! turned into a validated [`Plan`]. Every mistake gets a one-line error
//! naming the key and what is expected.
//!
//! Paths inside the file are relative to the file's directory; paths given
//! on the command line are relative to the current directory.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::compute::ComputeOptions;
use crate::sandbox::{CompileIsolation, CompileOptions, Limits};
use crate::tune::{
    CheckpointPolicy, ExperimentStop, ExperimentStopper, FailFast, FailurePolicy, Mode, PoolSpec,
    Resources, RunSpec, SchedulerSpec, SearchSpace, SearchSpec, Searcher, StopCriteria,
};
use crate::units::{self, human_bytes};
use crate::wasm_backend::CheckpointMode;

/// Stop criterion applied when none is given, so `wtune run model.wasm`
/// ends on its own.
pub const DEFAULT_ITERATIONS: u64 = 10;

/// A configuration mistake.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

fn bad(message: impl Into<String>) -> ConfigError {
    ConfigError(message.into())
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExperimentToml {
    name: Option<String>,
    metric: Option<String>,
    mode: Option<String>,
    num_samples: Option<u64>,
    seed: Option<u64>,
    max_concurrent_trials: Option<usize>,
    output_dir: Option<PathBuf>,
    scheduler: Option<toml::Value>,
    search: Option<toml::Value>,
    stop: Option<toml::Table>,
    limits: Option<LimitsToml>,
    data: Option<BTreeMap<String, PathBuf>>,
    param_space: Option<toml::Table>,
    checkpoint: Option<String>,
    checkpoint_freq: Option<u64>,
    checkpoint_at_end: Option<bool>,
    keep_checkpoints_num: Option<u64>,
    checkpoint_score_attr: Option<String>,
    max_failures: Option<i64>,
    fail_fast: Option<toml::Value>,
    restore_from: Option<PathBuf>,
    snapshot_key_file: Option<PathBuf>,
    resources_per_trial: Option<toml::Table>,
    resources: Option<toml::Table>,
    stop_experiment: Option<toml::Table>,
    compute: Option<String>,
    security: Option<SecurityToml>,
}

/// `[security]`: what a deployment that runs strangers' code pins down.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SecurityToml {
    allowed_components: Option<Vec<String>>,
    compile: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsToml {
    fuel_per_call: Option<toml::Value>,
    fuel_per_trial: Option<toml::Value>,
    memory: Option<toml::Value>,
    call_timeout: Option<toml::Value>,
    stack: Option<toml::Value>,
    log_size: Option<toml::Value>,
    table_elements: Option<u64>,
    compute_memory: Option<toml::Value>,
    compute_memory_total: Option<toml::Value>,
    compile_timeout: Option<toml::Value>,
    compile_memory: Option<toml::Value>,
    checkpoint_size: Option<toml::Value>,
    open_files: Option<u64>,
    result_size: Option<toml::Value>,
    disk: Option<toml::Value>,
    disk_files: Option<u64>,
}

/// Command-line values that override the experiment file.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--name`
    pub name: Option<String>,
    /// `--num-samples`
    pub num_samples: Option<u64>,
    /// `--max-concurrent`
    pub max_concurrent: Option<usize>,
    /// `--metric`
    pub metric: Option<String>,
    /// `--mode`
    pub mode: Option<String>,
    /// `--stop KEY=VALUE`, repeatable.
    pub stop: Vec<String>,
    /// `--fuel`: the per-trial fuel budget.
    pub fuel: Option<String>,
    /// `--fuel-per-call`
    pub fuel_per_call: Option<String>,
    /// `--memory`
    pub memory: Option<String>,
    /// `--timeout`: the per-call deadline.
    pub timeout: Option<String>,
    /// `--data NAME=DIR` or `--data DIR`, repeatable.
    pub data: Vec<String>,
    /// `--output-dir`
    pub output_dir: Option<PathBuf>,
    /// `--seed`
    pub seed: Option<u64>,
    /// `--checkpoint`: snapshot or guest.
    pub checkpoint: Option<String>,
    /// `--checkpoint-freq`
    pub checkpoint_freq: Option<u64>,
    /// `--checkpoint-at-end`
    pub checkpoint_at_end: bool,
    /// `--max-failures`
    pub max_failures: Option<i64>,
    /// `--restore-from`
    pub restore_from: Option<PathBuf>,
    /// `--scheduler NAME`
    pub scheduler: Option<String>,
    /// `--search NAME`
    pub search: Option<String>,
    /// `--compute auto|cpu|gpu`
    pub compute: Option<String>,
    /// `--allow-component HASH`, repeatable: replaces the file's
    /// `security.allowed_components`.
    pub allowed_components: Vec<String>,
}

/// Everything needed to run an experiment.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The runner's part.
    pub spec: RunSpec,
    /// Per-trial sandbox limits.
    pub limits: Limits,
    /// Wasm stack limit for the engine.
    pub max_wasm_stack: usize,
    /// Read-only data grants: `(name, absolute host dir)`.
    pub data: Vec<(String, PathBuf)>,
    /// The seed the configurations were drawn with.
    pub seed: u64,
    /// `num_samples` as used.
    pub num_samples: u64,
    /// Notes for the user about defaults that were applied.
    pub notes: Vec<String>,
    /// `checkpoint`, when set: how checkpoints are taken (else host
    /// snapshots where the component allows them).
    pub checkpoint_mode: Option<CheckpointMode>,
    /// A file whose bytes key the checkpoints' MAC.
    pub snapshot_key_file: Option<PathBuf>,
    /// The trial scheduler.
    pub scheduler: SchedulerSpec,
    /// Whether the search space was empty (trials started from a host
    /// snapshot then take its configuration).
    pub empty_space: bool,
    /// `param_space` as JSON (`{}` when absent), kept so that `wtune
    /// resume` can rebuild the search.
    pub param_space: Value,
    /// The search algorithm.
    pub search: SearchSpec,
    /// The host compute backend and its memory quotas.
    pub compute: ComputeOptions,
    /// Where components are compiled, and the compile limits.
    pub compile: CompileOptions,
    /// The blake3 digests of the only components allowed to run, if the
    /// experiment pins them.
    pub allowed_components: Option<BTreeSet<String>>,
}

impl Plan {
    /// The searcher that creates the plan's trials.
    pub fn searcher(&self) -> Result<Box<dyn Searcher>, ConfigError> {
        searcher(
            &self.search,
            &self.param_space,
            self.num_samples,
            &self.spec,
            self.seed,
        )
        .map_err(bad)
    }
}

/// The searcher `search` builds over `param_space` (JSON) for `spec`'s
/// metric and mode: for a fresh plan and for `wtune resume` alike.
pub fn searcher(
    search: &SearchSpec,
    param_space: &Value,
    num_samples: u64,
    spec: &RunSpec,
    seed: u64,
) -> Result<Box<dyn Searcher>, String> {
    let space = SearchSpace::from_json(param_space).map_err(|e| e.to_string())?;
    search.build(&space, num_samples, spec.metric.as_deref(), spec.mode, seed)
}

/// Reads the experiment file (if any), applies overrides, validates.
pub fn plan(
    model: &Path,
    config: Option<&Path>,
    overrides: &Overrides,
) -> Result<Plan, ConfigError> {
    let (file, base) = match config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| bad(format!("cannot read config {}: {e}", path.display())))?;
            let file: ExperimentToml = toml::from_str(&text)
                .map_err(|e| bad(format!("{}: {}", path.display(), one_line(&e.to_string()))))?;
            let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
            (file, base)
        }
        None => (ExperimentToml::default(), PathBuf::new()),
    };
    let mut notes = Vec::new();

    let name = overrides
        .name
        .clone()
        .or(file.name)
        .or_else(|| model.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "experiment".into());
    if name.is_empty() || name.contains(['/', '\\']) || name.chars().any(char::is_control) {
        return Err(bad(format!(
            "name {name:?} must be non-empty and contain no slashes"
        )));
    }

    let metric = overrides.metric.clone().or(file.metric);
    let mode = match overrides.mode.clone().or(file.mode) {
        Some(mode) => {
            let mode: Mode = mode.parse().map_err(bad)?;
            if metric.is_none() {
                return Err(bad(
                    "mode is set but metric is not; set `metric` to the metric to rank by",
                ));
            }
            mode
        }
        None => Mode::default(),
    };
    if metric.as_deref() == Some("") {
        return Err(bad("metric must not be empty"));
    }

    let scheduler = scheduler(by_name(&overrides.scheduler, &file.scheduler, "fifo").as_ref())?;

    let num_samples = overrides.num_samples.or(file.num_samples).unwrap_or(1);
    if num_samples == 0 {
        return Err(bad("num_samples must be at least 1"));
    }
    let max_concurrent = overrides
        .max_concurrent
        .or(file.max_concurrent_trials)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if max_concurrent == 0 {
        return Err(bad("max_concurrent_trials must be at least 1"));
    }
    let seed = match overrides.seed.or(file.seed) {
        Some(seed) => seed,
        None => {
            let seed = rand::random::<u32>() as u64;
            notes.push(format!(
                "no seed given; using seed {seed} (pass --seed {seed} to repeat this run)"
            ));
            seed
        }
    };

    // Built once here so that its parameters are checked before anything runs.
    scheduler
        .build(metric.as_deref(), mode, seed)
        .map_err(bad)?;

    let param_space = file
        .param_space
        .as_ref()
        .map_or_else(|| Value::Object(Map::new()), to_json);
    let space = SearchSpace::from_json(&param_space).map_err(|e| bad(e.to_string()))?;
    let trial_count = space
        .trial_count(num_samples)
        .map_err(|e| bad(e.to_string()))?;
    // A [search] table without `type` is random search.
    let search = match &by_name(&overrides.search, &file.search, "random") {
        None => SearchSpec::default(),
        Some(value) => SearchSpec::from_json(&serde_json::to_value(value).unwrap_or(Value::Null))
            .map_err(bad)?,
    };
    // Built once here so that its parameters are checked before anything runs.
    search
        .build(&space, num_samples, metric.as_deref(), mode, seed)
        .map_err(bad)?;

    let mut stop_table = file
        .stop
        .as_ref()
        .map(to_json)
        .and_then(|v| v.as_object().cloned())
        .unwrap_or_default();
    for item in &overrides.stop {
        let (key, value) = item.split_once('=').ok_or_else(|| {
            bad(format!(
                "--stop {item:?}: expected KEY=VALUE, e.g. --stop training_iteration=20"
            ))
        })?;
        let value: Value = value
            .trim()
            .parse::<f64>()
            .map(Value::from)
            .map_err(|_| bad(format!("--stop {item:?}: {value:?} is not a number")))?;
        stop_table.insert(key.trim().to_string(), value);
    }
    let mut stop = StopCriteria::from_json(&stop_table).map_err(bad)?;
    if stop == StopCriteria::default() && !scheduler.ends_trials() {
        stop.training_iteration = Some(DEFAULT_ITERATIONS);
        notes.push(format!(
            "no stopping criteria given; each trial stops after {DEFAULT_ITERATIONS} iterations"
        ));
    }

    let limits_file = file.limits.unwrap_or_default();
    let compute = compute(
        overrides.compute.as_deref().or(file.compute.as_deref()),
        &limits_file,
    )?;
    let compile = compile(
        file.security.as_ref().and_then(|s| s.compile.as_deref()),
        &limits_file,
    )?;
    if compile.isolation == CompileIsolation::InProcess
        && (limits_file.compile_timeout.is_some() || limits_file.compile_memory.is_some())
    {
        notes.push(
            "security.compile = \"in-process\" compiles without limits; \
             limits.compile_timeout and limits.compile_memory apply to the compile worker only"
                .into(),
        );
    }
    let (limits, max_wasm_stack) = limits(limits_file, overrides)?;
    let max_concurrent = descriptors_fit(
        &limits,
        max_concurrent,
        crate::sandbox::descriptor_limit(),
        &mut notes,
    )?;
    let allowed_components = if overrides.allowed_components.is_empty() {
        match file.security.and_then(|s| s.allowed_components) {
            Some(list) => Some(allowlist(&list, "security.allowed_components")?),
            None => None,
        }
    } else {
        Some(allowlist(
            &overrides.allowed_components,
            "--allow-component",
        )?)
    };

    let resources_per_trial: Resources =
        table_as("resources_per_trial", &file.resources_per_trial)?;
    resources_per_trial.validate().map_err(bad)?;
    let resources: PoolSpec = table_as("resources", &file.resources)?;
    let pool = resources.build().map_err(bad)?;
    // Undeclared GPUs depend on where host compute runs, known once the
    // sandbox exists: `fit_gpu` settles them, and the run checks again.
    let mut known = resources_per_trial.clone();
    if resources.gpu.is_none() {
        known.gpu = 0.0;
    }
    pool.check(&known).map_err(bad)?;
    let stop_experiment: ExperimentStop = table_as("stop_experiment", &file.stop_experiment)?;
    ExperimentStopper::new(&stop_experiment, metric.as_deref(), mode).map_err(bad)?;
    if matches!(scheduler, SchedulerSpec::Pbt(_)) {
        // PBT compares a population training side by side; trials that
        // wait for a slot fall behind and are cloned over before they learn.
        let fit = if resources_per_trial.cpu > 0.0 {
            (pool.total().cpu / resources_per_trial.cpu).floor() as u64
        } else {
            u64::MAX
        };
        let at_once = fit.min(max_concurrent as u64);
        let population = trial_count;
        if at_once < population {
            notes.push(format!(
                "pbt: only {at_once} of the {population} trials can run at once \
                 (max_concurrent_trials and resources); the rest wait and fall behind. \
                 Lower resources_per_trial.cpu or raise resources.cpu to train the whole \
                 population together"
            ));
        }
    }

    let checkpoint_mode = match overrides.checkpoint.clone().or(file.checkpoint) {
        Some(mode) => Some(mode.parse::<CheckpointMode>().map_err(bad)?),
        None => None,
    };
    let checkpoint = CheckpointPolicy {
        freq: overrides
            .checkpoint_freq
            .or(file.checkpoint_freq)
            .unwrap_or(0),
        at_end: overrides.checkpoint_at_end || file.checkpoint_at_end.unwrap_or(false),
        keep_num: match file.keep_checkpoints_num {
            Some(0) => {
                return Err(bad(
                    "keep_checkpoints_num must be at least 1 (leave it out to keep every checkpoint)",
                ));
            }
            Some(n) => Some(usize::try_from(n).unwrap_or(usize::MAX)),
            None => None,
        },
        score_attr: match file.checkpoint_score_attr {
            Some(attr) if attr.is_empty() || attr == "min-" => {
                return Err(bad(
                    "checkpoint_score_attr must name a result field, e.g. \"val_accuracy\" or \"min-loss\"",
                ));
            }
            attr => attr,
        },
    };
    let failure = FailurePolicy {
        max_failures: match overrides.max_failures.or(file.max_failures) {
            None => Some(0),
            Some(-1) => None,
            Some(n) if n >= 0 => Some(u32::try_from(n).unwrap_or(u32::MAX)),
            Some(n) => {
                return Err(bad(format!(
                    "max_failures must be 0 or more, or -1 to retry forever; got {n}"
                )));
            }
        },
        fail_fast: match &file.fail_fast {
            None | Some(toml::Value::Boolean(false)) => FailFast::Off,
            Some(toml::Value::Boolean(true)) => FailFast::Stop,
            Some(toml::Value::String(s)) if s == "raise" => FailFast::Raise,
            Some(other) => {
                return Err(bad(format!(
                    "fail_fast must be true, false or \"raise\"; got {other}"
                )));
            }
        },
    };
    let restore_from = match overrides
        .restore_from
        .clone()
        .or_else(|| file.restore_from.map(|p| base.join(p)))
    {
        Some(path) if !path.is_file() => {
            return Err(bad(format!(
                "restore_from: {} is not a checkpoint file",
                path.display()
            )));
        }
        Some(path) => Some(
            path.canonicalize()
                .map_err(|e| bad(format!("restore_from: {}: {e}", path.display())))?,
        ),
        None => None,
    };
    let snapshot_key_file = file.snapshot_key_file.map(|p| base.join(p));
    if let Some(path) = &snapshot_key_file
        && !path.is_file()
    {
        return Err(bad(format!(
            "snapshot_key_file: {} is not a file",
            path.display()
        )));
    }

    let mut data = Vec::new();
    for (grant, dir) in file.data.unwrap_or_default() {
        data.push(data_grant(&grant, &base.join(dir))?);
    }
    for item in &overrides.data {
        let (grant, dir) = match item.split_once('=') {
            Some((grant, dir)) => (grant.to_string(), PathBuf::from(dir)),
            None => {
                let dir = PathBuf::from(item);
                let grant = dir
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .ok_or_else(|| bad(format!("--data {item:?}: give NAME=DIR")))?;
                (grant, dir)
            }
        };
        data.retain(|(existing, _)| *existing != grant);
        data.push(data_grant(&grant, &dir)?);
    }

    let output_dir = match overrides
        .output_dir
        .clone()
        .or_else(|| file.output_dir.map(|d| base.join(d)))
    {
        Some(dir) => {
            if dir
                .read_dir()
                .is_ok_and(|mut entries| entries.next().is_some())
            {
                return Err(bad(format!(
                    "output directory {} already exists and is not empty; choose another with --output-dir",
                    dir.display()
                )));
            }
            dir
        }
        None => fresh_output_dir(&name),
    };

    Ok(Plan {
        spec: RunSpec {
            name,
            output_dir,
            metric,
            mode,
            stop,
            max_concurrent,
            configs: Vec::new(),
            checkpoint,
            failure,
            restore_from,
            resources_per_trial,
            resources,
            stop_experiment,
        },
        limits,
        max_wasm_stack,
        data,
        seed,
        num_samples,
        notes,
        checkpoint_mode,
        snapshot_key_file,
        scheduler,
        empty_space: file.param_space.as_ref().is_none_or(|t| t.is_empty()),
        param_space,
        search,
        compute,
        compile,
        allowed_components,
    })
}

/// `scheduler = "asha"` or `[scheduler]` with `type = "asha"` and parameters.
fn scheduler(value: Option<&toml::Value>) -> Result<SchedulerSpec, ConfigError> {
    let table = match value {
        None => return Ok(SchedulerSpec::Fifo),
        Some(toml::Value::String(name)) => {
            let mut table = toml::Table::new();
            table.insert("type".into(), toml::Value::String(name.clone()));
            table
        }
        Some(toml::Value::Table(table)) => table.clone(),
        Some(other) => {
            return Err(bad(format!(
                "scheduler must be a name such as \"asha\" or a [scheduler] table; got {other}"
            )));
        }
    };
    let name = match table.get("type") {
        Some(toml::Value::String(name)) => name.clone(),
        _ => return Err(bad("[scheduler] needs `type`, e.g. type = \"asha\"")),
    };
    if !SchedulerSpec::NAMES.contains(&name.as_str()) {
        return Err(bad(format!(
            "scheduler {name:?} is not known; available: {}",
            SchedulerSpec::NAMES.map(|n| format!("{n:?}")).join(", ")
        )));
    }
    serde_json::from_value(to_json(&table))
        .map_err(|e| bad(format!("scheduler: {}", one_line(&e.to_string()))))
}

/// `security.compile` and the `limits.compile_*` limits.
fn compile(isolation: Option<&str>, limits: &LimitsToml) -> Result<CompileOptions, ConfigError> {
    let mut options = CompileOptions::default();
    if let Some(isolation) = isolation {
        options.isolation = isolation
            .parse()
            .map_err(|e| bad(format!("security.compile: {e}")))?;
    }
    if let Some(v) = &limits.compile_timeout {
        options.timeout = match duration(v, "limits.compile_timeout") {
            Ok(Some(timeout)) => timeout,
            _ => {
                return Err(bad(format!(
                    "limits.compile_timeout must be a duration such as \"2m\" or a number of \
                     seconds; got {v}"
                )));
            }
        };
    }
    if let Some(v) = &limits.compile_memory {
        options.memory = size(v, "limits.compile_memory")?;
        if options.memory < MIN_COMPILE_MEMORY {
            return Err(bad(format!(
                "limits.compile_memory must be at least {}: the compile worker's own code, \
                 threads and engine take about half of that",
                human_bytes(MIN_COMPILE_MEMORY)
            )));
        }
    }
    Ok(options)
}

/// Below this the compile worker cannot even start its engine.
const MIN_COMPILE_MEMORY: u64 = 256 << 20;

/// Component digests as `wtune inspect` prints them: 64 hex digits, with or
/// without a `blake3:` prefix.
pub fn allowlist(entries: &[String], key: &str) -> Result<BTreeSet<String>, ConfigError> {
    if entries.is_empty() {
        return Err(bad(format!(
            "{key} is empty, so no component could run; list the blake3 digests `wtune \
             inspect` prints, or leave it out to allow any component"
        )));
    }
    entries
        .iter()
        .map(|entry| {
            let digest = entry.trim();
            let digest = digest.strip_prefix("blake3:").unwrap_or(digest);
            if digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit()) {
                Ok(digest.to_ascii_lowercase())
            } else {
                Err(bad(format!(
                    "{key}: {entry:?} is not a blake3 digest (64 hex digits, as `wtune inspect` \
                     prints)"
                )))
            }
        })
        .collect()
}

/// `compute = "auto"` and the `limits.compute_memory*` quotas.
fn compute(mode: Option<&str>, limits: &LimitsToml) -> Result<ComputeOptions, ConfigError> {
    let mut options = ComputeOptions::default();
    if let Some(mode) = mode {
        options.mode = mode.parse().map_err(bad)?;
    }
    if let Some(v) = &limits.compute_memory {
        options.trial_quota = size(v, "limits.compute_memory")?;
    }
    if let Some(v) = &limits.compute_memory_total {
        options.total_quota = size(v, "limits.compute_memory_total")?;
    } else {
        options.total_quota = options.total_quota.max(options.trial_quota);
    }
    if options.trial_quota > options.total_quota {
        return Err(bad(format!(
            "limits.compute_memory ({}) is more than limits.compute_memory_total ({}): no \
             trial could use its quota",
            human_bytes(options.trial_quota),
            human_bytes(options.total_quota)
        )));
    }
    Ok(options)
}

fn limits(file: LimitsToml, overrides: &Overrides) -> Result<(Limits, usize), ConfigError> {
    let mut limits = Limits::default();
    let from_cli = |s: &Option<String>| s.as_ref().map(|s| toml::Value::String(s.clone()));
    if let Some(v) = from_cli(&overrides.fuel_per_call).or(file.fuel_per_call) {
        limits.fuel_per_call = fuel(&v, "limits.fuel_per_call")?;
    }
    if let Some(v) = from_cli(&overrides.fuel).or(file.fuel_per_trial) {
        limits.fuel_per_trial = fuel(&v, "limits.fuel_per_trial")?;
    }
    if let Some(v) = from_cli(&overrides.memory).or(file.memory) {
        limits.memory_bytes = size(&v, "limits.memory")?;
    }
    if let Some(v) = from_cli(&overrides.timeout).or(file.call_timeout) {
        limits.call_timeout = duration(&v, "limits.call_timeout")?;
    }
    if let Some(v) = file.log_size {
        limits.log_bytes = size(&v, "limits.log_size")?;
    }
    if let Some(v) = file.checkpoint_size {
        limits.checkpoint_bytes = size(&v, "limits.checkpoint_size")?;
    }
    if let Some(v) = file.result_size {
        limits.result_bytes = size(&v, "limits.result_size")?;
    }
    if let Some(v) = file.disk {
        limits.disk_bytes = size(&v, "limits.disk")?;
    }
    if let Some(n) = file.disk_files {
        limits.disk_files = n;
    }
    if let Some(n) = file.table_elements {
        limits.table_elements = n;
    }
    if let Some(n) = file.open_files {
        if n < MIN_OPEN_FILES {
            return Err(bad(format!(
                "limits.open_files must be at least {MIN_OPEN_FILES} (a trainable needs a few \
                 handles for its directories and output streams); got {n}"
            )));
        }
        limits.open_files = n;
    }
    let stack = match file.stack {
        Some(v) => size(&v, "limits.stack")?,
        None => 1 << 20,
    };
    if !(64 << 10..=256 << 20).contains(&stack) {
        return Err(bad("limits.stack must be between 64KiB and 256MiB"));
    }
    Ok((limits, stack as usize))
}

/// The fewest handles a trial may be limited to: its preopened directories,
/// stdout and stderr streams and a few files.
const MIN_OPEN_FILES: u64 = 16;

/// How many trials may run at once without their open files taking the
/// host's file descriptors: `max_concurrent`, or fewer (with a note) when
/// the process's descriptor limit (`available`) cannot hold every trial's
/// `limits.open_files` plus the host's reserve.
fn descriptors_fit(
    limits: &Limits,
    max_concurrent: usize,
    available: u64,
    notes: &mut Vec<String>,
) -> Result<usize, ConfigError> {
    use crate::sandbox::{DESCRIPTORS_PER_TRIAL, HOST_DESCRIPTORS};
    let per_trial = limits.open_files.saturating_add(DESCRIPTORS_PER_TRIAL);
    let fit = available.saturating_sub(HOST_DESCRIPTORS) / per_trial;
    if fit == 0 {
        return Err(bad(format!(
            "this process may open {available} files (ulimit -n), too few for one trial's \
             limits.open_files ({}) plus the host's own {HOST_DESCRIPTORS}: lower \
             limits.open_files or raise the limit",
            limits.open_files
        )));
    }
    if fit < max_concurrent as u64 {
        notes.push(format!(
            "running at most {fit} trials at once (not {max_concurrent}): each may hold \
             limits.open_files = {} files and this process may open {available} (ulimit -n), \
             {HOST_DESCRIPTORS} of them kept for the host",
            limits.open_files
        ));
        return Ok(fit as usize);
    }
    Ok(max_concurrent)
}

/// [`units::fuel`], as a configuration error.
pub(crate) fn fuel(value: &toml::Value, key: &str) -> Result<Option<u64>, ConfigError> {
    units::fuel(value, key).map_err(bad)
}

/// [`units::size`], as a configuration error.
fn size(value: &toml::Value, key: &str) -> Result<u64, ConfigError> {
    units::size(value, key).map_err(bad)
}

/// [`units::duration`], as a configuration error.
pub(crate) fn duration(value: &toml::Value, key: &str) -> Result<Option<Duration>, ConfigError> {
    units::duration(value, key).map_err(bad)
}

fn data_grant(name: &str, dir: &Path) -> Result<(String, PathBuf), ConfigError> {
    let valid = !name.is_empty()
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if !valid {
        return Err(bad(format!(
            "data grant name {name:?} must be letters, digits, '_', '-' or '.' (it becomes /data/{name})"
        )));
    }
    let canonical = dir
        .canonicalize()
        .map_err(|e| bad(format!("data directory `{name}` ({}): {e}", dir.display())))?;
    if !canonical.is_dir() {
        return Err(bad(format!(
            "data directory `{name}` ({}) is not a directory",
            dir.display()
        )));
    }
    Ok((name.to_string(), canonical))
}

/// `wtune_results/<name>_<UTC time>`, with a suffix if that exists already.
fn fresh_output_dir(name: &str) -> PathBuf {
    let stamp = humantime::format_rfc3339_seconds(SystemTime::now())
        .to_string()
        .replace(':', "-");
    let base =
        PathBuf::from("wtune_results").join(format!("{name}_{}", stamp.trim_end_matches('Z')));
    let mut dir = base.clone();
    let mut n = 2;
    while dir.exists() {
        dir = PathBuf::from(format!("{}-{n}", base.display()));
        n += 1;
    }
    dir
}

/// A `--scheduler`/`--search` name over the file's value: the file's table
/// is kept when it names the same algorithm (its parameters apply), else
/// the name alone (default parameters).
fn by_name(
    flag: &Option<String>,
    file: &Option<toml::Value>,
    default: &str,
) -> Option<toml::Value> {
    let Some(name) = flag else {
        return file.clone();
    };
    match file {
        Some(toml::Value::Table(table))
            if table
                .get("type")
                .and_then(toml::Value::as_str)
                .unwrap_or(default)
                == name =>
        {
            file.clone()
        }
        _ => Some(toml::Value::String(name.clone())),
    }
}

/// A `[key]` table read into `T` (its default when absent); serde's
/// message, which names the unknown or malformed field, is kept.
fn table_as<T: serde::de::DeserializeOwned + Default>(
    key: &str,
    table: &Option<toml::Table>,
) -> Result<T, ConfigError> {
    match table {
        None => Ok(T::default()),
        Some(table) => {
            serde_json::from_value(to_json(table)).map_err(|e| bad(format!("[{key}]: {e}")))
        }
    }
}

fn to_json(table: &toml::Table) -> Value {
    serde_json::to_value(table).unwrap_or(Value::Null)
}

fn one_line(message: &str) -> String {
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, text: &str) -> PathBuf {
        let path = dir.join("experiment.toml");
        std::fs::write(&path, text).unwrap();
        path
    }

    fn plan_of(text: &str) -> Result<Plan, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("data")).unwrap();
        let path = write(dir.path(), text);
        let overrides = Overrides {
            output_dir: Some(dir.path().join("out")),
            ..Default::default()
        };
        plan(Path::new("model.wasm"), Some(&path), &overrides)
    }

    #[test]
    fn compute_backend_and_quotas_are_read_and_checked() {
        let plan = plan_of("").unwrap();
        assert_eq!(plan.compute, ComputeOptions::default());
        let plan = plan_of(
            r#"
            compute = "cpu"
            [limits]
            compute_memory = "8GiB"
            "#,
        )
        .unwrap();
        assert_eq!(plan.compute.mode, crate::compute::ComputeMode::Cpu);
        assert_eq!(plan.compute.trial_quota, 8 << 30);
        assert_eq!(
            plan.compute.total_quota,
            8 << 30,
            "the total grows to one trial's"
        );

        let err = plan_of("compute = \"tpu\"").unwrap_err().to_string();
        assert!(err.contains("compute = \"tpu\" is not a backend"), "{err}");
        let gpu = plan_of("compute = \"gpu\"").unwrap();
        assert_eq!(gpu.compute.mode, crate::compute::ComputeMode::Gpu);
        let err = plan_of("[limits]\ncompute_memory = \"2GiB\"\ncompute_memory_total = \"1GiB\"")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("is more than limits.compute_memory_total"),
            "{err}"
        );
        let err = plan_of("[limits]\ncompute_memory = \"lots\"")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("limits.compute_memory must be a size"),
            "{err}"
        );
    }

    #[test]
    fn full_file_is_read() {
        let plan = plan_of(
            r#"
            name = "x"
            metric = "acc"
            mode = "max"
            num_samples = 3
            seed = 1
            max_concurrent_trials = 2
            [stop]
            training_iteration = 4
            [limits]
            fuel_per_call = 5e9
            fuel_per_trial = "1e11"
            memory = "128MiB"
            call_timeout = "30s"
            [data]
            d = "data"
            [param_space]
            lr = { grid_search = [0.1, 0.2] }
            "#,
        )
        .unwrap();
        assert_eq!(plan.searcher().unwrap().total(), Some(6));
        assert_eq!(plan.spec.max_concurrent, 2);
        assert_eq!(plan.limits.fuel_per_call, Some(5_000_000_000));
        assert_eq!(plan.limits.fuel_per_trial, Some(100_000_000_000));
        assert_eq!(plan.limits.memory_bytes, 128 << 20);
        assert_eq!(plan.limits.call_timeout, Some(Duration::from_secs(30)));
        assert_eq!(plan.data[0].0, "d");
        assert!(plan.data[0].1.is_absolute());
        assert!(plan.notes.is_empty());
        assert_eq!(plan.spec.checkpoint, CheckpointPolicy::default());
        assert_eq!(plan.spec.failure, FailurePolicy::default());
    }

    #[test]
    fn checkpoint_and_failure_keys_are_read() {
        let plan = plan_of(
            r#"
            seed = 1
            checkpoint = "guest"
            checkpoint_freq = 5
            checkpoint_at_end = true
            keep_checkpoints_num = 2
            checkpoint_score_attr = "min-loss"
            max_failures = -1
            fail_fast = "raise"
            "#,
        )
        .unwrap();
        assert_eq!(plan.checkpoint_mode, Some(CheckpointMode::Guest));
        assert_eq!(
            plan.spec.checkpoint,
            CheckpointPolicy {
                freq: 5,
                at_end: true,
                keep_num: Some(2),
                score_attr: Some("min-loss".into()),
            }
        );
        assert_eq!(plan.spec.failure.max_failures, None);
        assert_eq!(plan.spec.failure.fail_fast, FailFast::Raise);
        let stop = plan_of("seed = 1\nfail_fast = true\nmax_failures = 3").unwrap();
        assert_eq!(stop.spec.failure.fail_fast, FailFast::Stop);
        assert_eq!(stop.spec.failure.max_failures, Some(3));
    }

    #[test]
    fn search_resources_and_experiment_stoppers_are_read_and_checked() {
        let plan = plan_of(
            r#"
            seed = 1
            metric = "a"
            num_samples = 20
            search = { type = "tpe", n_initial_points = 5, max_concurrent = 2 }
            scheduler = { type = "hyperband", max_t = 27 }
            resources_per_trial = { cpu = 0.5, gpu = 0.25, memory = "64MiB" }
            resources = { cpu = 2, gpu = 1 }
            stop_experiment = { max_trials = 10, max_time = "5m", max_fuel = 1e12 }
            [param_space]
            lr = { loguniform = [1e-4, 1e-1] }
            "#,
        )
        .unwrap();
        assert_eq!(plan.searcher().unwrap().name(), "tpe");
        assert_eq!(plan.searcher().unwrap().total(), Some(20));
        assert!(matches!(plan.scheduler, SchedulerSpec::HyperBand(_)));
        assert_eq!(plan.spec.resources_per_trial.gpu, 0.25);
        assert_eq!(plan.spec.resources_per_trial.memory, 64 << 20);
        assert_eq!(plan.spec.resources.gpu, Some(1.0));
        let stop = &plan.spec.stop_experiment;
        assert_eq!(
            (stop.max_trials, stop.max_time, stop.max_fuel),
            (Some(10), Some(300.0), Some(1_000_000_000_000))
        );

        let err = |text: &str| {
            plan_of(&format!("seed = 1\nmetric = \"a\"\n{text}"))
                .unwrap_err()
                .to_string()
        };
        let message = err("search = \"bayes\"");
        assert!(
            message.contains("random") && message.contains("tpe"),
            "{message}"
        );
        let message = err("search = { type = \"tpe\", gama = 0.3 }");
        assert!(message.contains("unknown key `gama`"), "{message}");
        let message = err("search = \"grid\"\n[param_space]\nlr = { uniform = [0, 1] }");
        assert!(message.contains("param_space.lr"), "{message}");
        let message = err("resources_per_trial = { gpus = 1 }");
        assert!(
            message.contains("[resources_per_trial]") && message.contains("gpus"),
            "{message}"
        );
        let message = err("resources_per_trial = { gpu = 2 }\nresources = { gpu = 1 }");
        assert!(
            message.contains("asks for 2 GPUs but the experiment has 1"),
            "{message}"
        );
        let message = err("stop_experiment = { max_trials = 0 }");
        assert!(message.contains("stop_experiment.max_trials"), "{message}");
        let message = err("stop_experiment = { max_trails = 3 }");
        assert!(
            message.contains("[stop_experiment]") && message.contains("max_trails"),
            "{message}"
        );
    }

    #[test]
    fn scheduler_and_search_flags_override_the_file_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(
            dir.path(),
            "seed = 1\nmetric = \"a\"\n[scheduler]\ntype = \"asha\"\nmax_t = 27\n\
             [search]\ntype = \"tpe\"\nn_initial_points = 3",
        );
        let with = |scheduler: &str, search: &str| {
            let overrides = Overrides {
                output_dir: Some(dir.path().join("out")),
                scheduler: Some(scheduler.into()),
                search: Some(search.into()),
                ..Default::default()
            };
            plan(Path::new("m.wasm"), Some(&path), &overrides)
        };
        // Same names: the file's parameters apply.
        let plan = with("asha", "tpe").unwrap();
        let SchedulerSpec::Asha(asha) = &plan.scheduler else {
            panic!("asha expected")
        };
        assert_eq!(asha.max_t, 27.0);
        assert_eq!(
            plan.search,
            SearchSpec::from_json(&serde_json::json!({"type": "tpe", "n_initial_points": 3}))
                .unwrap()
        );
        // Other names: their defaults.
        let plan = with("hyperband", "random").unwrap();
        assert!(matches!(plan.scheduler, SchedulerSpec::HyperBand(_)));
        assert_eq!(plan.search, SearchSpec::default());
        let message = with("bohb", "random").unwrap_err().to_string();
        assert!(
            message.contains("bohb") && message.contains("hyperband"),
            "{message}"
        );
    }

    #[test]
    fn pbt_notes_a_population_that_cannot_train_side_by_side() {
        let text = |concurrent: u32| {
            format!(
                "seed = 1\nmetric = \"a\"\nnum_samples = 8\nmax_concurrent_trials = {concurrent}\n\
                 resources = {{ cpu = 8 }}\n[scheduler]\ntype = \"pbt\"\n\
                 hyperparam_mutations = {{ lr = [0.1, 0.2] }}\n[param_space]\nlr = 0.1"
            )
        };
        let plan = plan_of(&text(2)).unwrap();
        assert!(
            plan.notes
                .iter()
                .any(|n| n.starts_with("pbt: only 2 of the 8 trials")),
            "{:?}",
            plan.notes
        );
        let plan = plan_of(&text(8)).unwrap();
        assert!(
            !plan.notes.iter().any(|n| n.starts_with("pbt:")),
            "{:?}",
            plan.notes
        );
    }

    #[test]
    fn schedulers_by_name_or_table() {
        let plan = plan_of("seed = 1\nmetric = \"a\"\nscheduler = \"asha\"").unwrap();
        assert_eq!(plan.scheduler, SchedulerSpec::Asha(Default::default()));
        assert_eq!(
            plan.spec.stop,
            StopCriteria::default(),
            "max_t bounds trials, not the default stop"
        );
        let plan = plan_of(
            "seed = 1\nmetric = \"a\"\n[scheduler]\ntype = \"asha\"\nmax_t = 27\n\
             reduction_factor = 3\ntime_attr = \"fuel_total\"\nbrackets = 2",
        )
        .unwrap();
        let SchedulerSpec::Asha(asha) = plan.scheduler else {
            panic!("asha expected")
        };
        assert_eq!(
            (asha.max_t, asha.reduction_factor, asha.brackets),
            (27.0, 3.0, 2)
        );
        assert_eq!(asha.time_attr, "fuel_total");
        assert_eq!(plan_of("seed = 1").unwrap().scheduler, SchedulerSpec::Fifo);
        let plan = plan_of(
            "seed = 1\nmetric = \"a\"\n[scheduler]\ntype = \"median_stopping\"\n\
             grace_period = 5\ntime_attr = \"training_iteration\"",
        )
        .unwrap();
        let SchedulerSpec::MedianStopping(median) = plan.scheduler else {
            panic!("median_stopping expected")
        };
        assert_eq!((median.grace_period, median.min_samples_required), (5.0, 3));
    }

    #[test]
    fn defaults_make_a_bare_run_useful() {
        let plan = plan(
            Path::new("dir/model.wasm"),
            None,
            &Overrides {
                seed: Some(3),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(plan.spec.name, "model");
        assert_eq!(plan.searcher().unwrap().total(), Some(1));
        assert_eq!(plan.spec.stop.training_iteration, Some(DEFAULT_ITERATIONS));
        assert!(plan.spec.output_dir.starts_with("wtune_results"));
        assert_eq!(plan.notes.len(), 1, "{:?}", plan.notes);
    }

    #[test]
    fn every_bad_value_gets_a_message_naming_its_key() {
        let cases = [
            ("num_sample = 3", "unknown field `num_sample`"),
            ("num_samples = 0", "num_samples must be at least 1"),
            (
                "max_concurrent_trials = 0",
                "max_concurrent_trials must be at least 1",
            ),
            (
                "metric = \"a\"\nmode = \"best\"",
                "mode must be \"min\" or \"max\"",
            ),
            ("mode = \"min\"", "mode is set but metric is not"),
            ("scheduler = \"magic\"", "scheduler \"magic\" is not known"),
            (
                "metric = \"a\"\n[scheduler]\ntype = \"asha\"\nreduction_factor = 1",
                "scheduler.reduction_factor must be greater than 1",
            ),
            (
                "metric = \"a\"\n[scheduler]\ntype = \"asha\"\nmax_tt = 1",
                "unknown field `max_tt`",
            ),
            ("scheduler = \"asha\"", "set `metric`"),
            ("[scheduler]\nmax_t = 3", "[scheduler] needs `type`"),
            (
                "[limits]\nmemory = \"lots\"",
                "limits.memory must be a size",
            ),
            (
                "[limits]\nfuel_per_call = -5",
                "limits.fuel_per_call must be a positive amount",
            ),
            (
                "[limits]\ncall_timeout = \"soon\"",
                "limits.call_timeout must be a duration",
            ),
            ("[limits]\nstack = 10", "limits.stack must be between"),
            ("[limits]\nmemroy = 1", "unknown field `memroy`"),
            ("[data]\nd = \"missing\"", "data directory `d`"),
            ("[data]\n\"../x\" = \"data\"", "data grant name \"../x\""),
            (
                "[stop]\ntraining_iteration = 0",
                "stop.training_iteration must be a positive whole number",
            ),
            (
                "[param_space]\nlr = { loguniform = [0, 1] }",
                "param_space.lr: loguniform",
            ),
            ("num_samples = ", "experiment.toml"),
            ("checkpoint = \"memory\"", "checkpoint must be \"snapshot\""),
            (
                "keep_checkpoints_num = 0",
                "keep_checkpoints_num must be at least 1",
            ),
            ("max_failures = -2", "max_failures must be 0 or more, or -1"),
            (
                "fail_fast = \"yes\"",
                "fail_fast must be true, false or \"raise\"",
            ),
            ("restore_from = \"nope.wtsnap\"", "restore_from: "),
            (
                "checkpoint_score_attr = \"min-\"",
                "checkpoint_score_attr must name a result field",
            ),
            ("snapshot_key_file = \"nokey\"", "snapshot_key_file: "),
            ("checkpoint_freq = -1", "checkpoint_freq"),
        ];
        for (text, expected) in cases {
            let message = plan_of(text).unwrap_err().to_string();
            assert!(
                message.contains(expected),
                "{text:?} gave {message:?}, expected {expected:?}"
            );
            assert!(!message.contains('\n'), "one line: {message:?}");
        }
    }

    #[test]
    fn overrides_win_over_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(
            dir.path(),
            "num_samples = 5\nmetric = \"a\"\n[stop]\ntraining_iteration = 3\n",
        );
        let overrides = Overrides {
            num_samples: Some(2),
            metric: Some("b".into()),
            mode: Some("min".into()),
            stop: vec!["training_iteration=7".into(), "b=0.5".into()],
            fuel: Some("2e9".into()),
            memory: Some("64MiB".into()),
            timeout: Some("5s".into()),
            seed: Some(1),
            output_dir: Some(dir.path().join("out")),
            ..Default::default()
        };
        let plan = plan(Path::new("m.wasm"), Some(&path), &overrides).unwrap();
        assert_eq!(plan.searcher().unwrap().total(), Some(2));
        assert_eq!(plan.spec.metric.as_deref(), Some("b"));
        assert_eq!(plan.spec.mode, Mode::Min);
        assert_eq!(plan.spec.stop.training_iteration, Some(7));
        assert_eq!(plan.spec.stop.thresholds.len(), 1);
        assert_eq!(plan.limits.fuel_per_trial, Some(2_000_000_000));
        assert_eq!(plan.limits.memory_bytes, 64 << 20);
        assert_eq!(plan.limits.call_timeout, Some(Duration::from_secs(5)));
        let bad_stop = Overrides {
            stop: vec!["nonsense".into()],
            seed: Some(1),
            ..Default::default()
        };
        assert!(plan_of_overrides(&bad_stop).contains("expected KEY=VALUE"));
    }

    fn plan_of_overrides(overrides: &Overrides) -> String {
        plan(Path::new("m.wasm"), None, overrides)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn a_non_empty_output_dir_is_never_reused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("experiment.json"), "{}").unwrap();
        let overrides = Overrides {
            output_dir: Some(dir.path().to_path_buf()),
            seed: Some(1),
            ..Default::default()
        };
        assert!(plan_of_overrides(&overrides).contains("already exists and is not empty"));
    }
}
