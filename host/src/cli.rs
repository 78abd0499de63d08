//! The `wtune` command line: argument definitions and the two commands.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::compute::ComputeOptions;
use crate::config::{self, Overrides};
use crate::report::terminal::{TerminalWriter, inert};
use crate::report::{ExperimentFile, Progress, StateFile, TrialFiles, state, summary_text};
use crate::sandbox::{
    CompileOptions, Limits, Program, Sandbox, SandboxOptions, fuel_text, human_bytes,
};
use crate::serve;
use crate::snapshot::{Payload, SnapshotKey};
use crate::tune::resume::{self, ErroredTrials};
use crate::tune::{
    DecisionState, Listed, RunError, RunSpec, Runner, STOPPED_BY_REQUEST, Scheduler, SchedulerSpec,
    SearchSpec, Searcher, Trial, TrialStatus, control, fit_gpu,
};
use crate::wasm_backend::{CheckpointMode, WasmBackend};

/// Tune hyperparameters of WebAssembly trainables, each trial in its own sandbox.
#[derive(Debug, Parser)]
#[command(name = "wtune", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run an experiment: sample configurations, train each in a sandbox, report the best.
    Run(Box<RunArgs>),
    /// Continue an interrupted experiment from its output directory.
    Resume(ResumeArgs),
    /// Serve the dashboard and API for an experiment directory, finished or running in
    /// another process (to control a run, start it with `--serve` instead).
    Serve(ServeDirArgs),
    /// Show a component's imports and exports and whether it fits the wtune contract.
    Inspect {
        /// The component (.wasm) to inspect.
        model: PathBuf,
    },
    /// Serve GPU compute jobs over stdin and stdout (started by wtune itself).
    #[command(name = "gpu-worker", hide = true)]
    GpuWorker {
        /// Which of host compute's adapters to open (see `LocalGpu::open`).
        #[arg(long, default_value_t = 0)]
        adapter: usize,
    },
    /// Compile the component on stdin into an artifact on stdout (started by wtune itself).
    #[command(name = "compile-worker", hide = true)]
    CompileWorker {
        /// The engine's wasm stack limit, which the artifact must match.
        #[arg(long)]
        max_wasm_stack: usize,
    },
}

#[derive(Debug, Args)]
struct RunArgs {
    /// The trainable component (.wasm), built with `cargo build --target wasm32-wasip2`.
    model: PathBuf,
    /// Experiment file (TOML); flags below override it.
    #[arg(short, long)]
    config: Option<PathBuf>,
    /// Experiment name (default: the file's `name`, else the model's file name).
    #[arg(long)]
    name: Option<String>,
    /// Samples drawn from the search space (each repeats every grid).
    #[arg(long, value_name = "N")]
    num_samples: Option<u64>,
    /// Most trials running at once (default: the number of cores).
    #[arg(long, value_name = "N")]
    max_concurrent: Option<usize>,
    /// Metric that ranks trials.
    #[arg(long)]
    metric: Option<String>,
    /// Whether the metric is minimized or maximized: min or max.
    #[arg(long)]
    mode: Option<String>,
    /// Stopping criterion, repeatable: training_iteration=20, val_accuracy=0.98, fuel_total=1e10.
    #[arg(long, value_name = "KEY=VALUE")]
    stop: Vec<String>,
    /// Fuel budget per trial, e.g. 5e10 (exceeding it ends the trial as ERROR).
    #[arg(long, value_name = "FUEL")]
    fuel: Option<String>,
    /// Fuel limit for one call into the trainable, e.g. 5e9, or "unlimited".
    #[arg(long, value_name = "FUEL")]
    fuel_per_call: Option<String>,
    /// Memory cap per trial, e.g. 256MiB.
    #[arg(long, value_name = "SIZE")]
    memory: Option<String>,
    /// Wall-clock deadline per call, e.g. 30s, or "none".
    #[arg(long, value_name = "DURATION")]
    timeout: Option<String>,
    /// Grant a directory read-only at /data/NAME, repeatable: NAME=DIR or DIR.
    #[arg(long, value_name = "NAME=DIR")]
    data: Vec<String>,
    /// Where results go (default: wtune_results/<name>_<time>). Must not exist or be empty.
    #[arg(short, long, value_name = "DIR")]
    output_dir: Option<PathBuf>,
    /// Seed for sampling configurations (default: random, printed).
    #[arg(long)]
    seed: Option<u64>,
    /// How checkpoints are taken: snapshot (host memory snapshots) or guest (save/restore).
    #[arg(long, value_name = "MODE")]
    checkpoint: Option<String>,
    /// Checkpoint every N iterations.
    #[arg(long, value_name = "N")]
    checkpoint_freq: Option<u64>,
    /// Checkpoint each trial when it finishes.
    #[arg(long)]
    checkpoint_at_end: bool,
    /// Failures each trial recovers from (from its newest checkpoint); -1 = forever.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    max_failures: Option<i64>,
    /// Trial scheduler: fifo, asha, hyperband, median_stopping or pbt (parameters from the file's [scheduler] when it names the same one).
    #[arg(long, value_name = "NAME")]
    scheduler: Option<String>,
    /// Search algorithm: random, grid or tpe (parameters from the file's [search] when it names the same one).
    #[arg(long, value_name = "NAME")]
    search: Option<String>,
    /// Where the guests' compute kernels run: auto, cpu or gpu.
    #[arg(long, value_name = "BACKEND")]
    compute: Option<String>,
    /// Start every trial from this checkpoint file.
    #[arg(long, value_name = "FILE")]
    restore_from: Option<PathBuf>,
    /// Run the model only if its blake3 digest (as `wtune inspect` prints it) is this one; repeatable, replaces the file's security.allowed_components.
    #[arg(long, value_name = "HASH")]
    allow_component: Vec<String>,
    #[command(flatten)]
    cache: CacheArgs,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// Serve a dashboard and control API while the experiment runs: `--serve` on
    /// 127.0.0.1:8267 (loopback only), `--serve=ADDR` elsewhere (port 0 picks a free port).
    #[arg(
        long,
        value_name = "ADDR",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = serve::DEFAULT_ADDR
    )]
    serve: Option<std::net::SocketAddr>,
    /// The bearer token API clients must send (required when ADDR is not loopback).
    #[arg(long, value_name = "TOKEN", env = serve::TOKEN_ENV, hide_env_values = true)]
    serve_token: Option<String>,
}

impl ServeArgs {
    fn options(self) -> Result<Option<serve::ServeOptions>, Failure> {
        let Some(addr) = self.serve else {
            if self.serve_token.is_some() && std::env::var_os(serve::TOKEN_ENV).is_none() {
                return Err(Failure::user("--serve-token needs --serve"));
            }
            return Ok(None);
        };
        let options = serve::ServeOptions {
            addr,
            token: self.serve_token,
        };
        options.check().map_err(Failure::user)?;
        Ok(Some(options))
    }
}

#[derive(Debug, Args)]
struct ServeDirArgs {
    /// The experiment's output directory.
    dir: PathBuf,
    /// Where to listen (loopback only unless a token is given).
    #[arg(long, value_name = "ADDR", default_value = serve::DEFAULT_ADDR)]
    addr: std::net::SocketAddr,
    /// The bearer token API clients must send (required when ADDR is not loopback).
    #[arg(long, value_name = "TOKEN", env = serve::TOKEN_ENV, hide_env_values = true)]
    token: Option<String>,
}

#[derive(Debug, Args)]
struct CacheArgs {
    /// Directory for compiled components (default: $WTUNE_CACHE_DIR or ~/.cache/wtune).
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
    /// Compile without reading or writing the on-disk cache.
    #[arg(long)]
    no_cache: bool,
}

#[derive(Debug, Args)]
struct ResumeArgs {
    /// The interrupted experiment's output directory.
    dir: PathBuf,
    /// Also continue trials that ended in ERROR, from their newest checkpoint.
    #[arg(long, conflicts_with = "restart_errored")]
    retry_errored: bool,
    /// Also run trials that ended in ERROR again, from scratch.
    #[arg(long)]
    restart_errored: bool,
    /// Use experiment_state.prev.json, the state before the newest (when the newest is damaged).
    #[arg(long)]
    previous_state: bool,
    /// The component, when it moved since the experiment started (it must be the same file).
    #[arg(long, value_name = "FILE")]
    model: Option<PathBuf>,
    #[command(flatten)]
    cache: CacheArgs,
    #[command(flatten)]
    serve: ServeArgs,
}

/// What `experiment_state.json` keeps for `wtune resume`: the validated
/// plan as it was run.
#[derive(Debug, Serialize, Deserialize)]
struct Setup {
    model: PathBuf,
    model_blake3: String,
    spec: RunSpec,
    limits: Limits,
    max_wasm_stack: usize,
    data: Vec<(String, PathBuf)>,
    checkpoint: CheckpointMode,
    snapshot_key_file: Option<PathBuf>,
    scheduler: SchedulerSpec,
    seed: u64,
    num_samples: u64,
    /// The search space, as JSON; `null` in setups saved before trials
    /// were created lazily, whose every trial is in the saved state.
    #[serde(default)]
    param_space: Value,
    /// The search algorithm.
    #[serde(default)]
    search: SearchSpec,
    /// Every trial's configuration when they all continue from one host
    /// snapshot (`restore_from`), which holds its own.
    #[serde(default)]
    fixed_config: Option<Value>,
    /// The host compute backend and quotas.
    #[serde(default)]
    compute: ComputeOptions,
    /// Where the component is compiled, and the compile limits.
    #[serde(default)]
    compile: CompileOptions,
    /// The experiment's component allowlist, applied again on resume.
    #[serde(default)]
    allowed_components: Option<BTreeSet<String>>,
}

impl Setup {
    /// How the results were produced, for `experiment.json`'s `run`.
    fn run_info(&self) -> Value {
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
            "data": self.data.iter().map(|(n, d)| (n.clone(), d.display().to_string())).collect::<std::collections::BTreeMap<_, _>>(),
            "wtune_version": env!("CARGO_PKG_VERSION"),
        })
    }

    fn scheduler(&self) -> Result<Box<dyn Scheduler>, Failure> {
        self.scheduler
            .build(self.spec.metric.as_deref(), self.spec.mode, self.seed)
            .map_err(Failure::user)
    }

    /// The searcher that creates the experiment's trials.
    fn searcher(&self) -> Result<Box<dyn Searcher>, Failure> {
        if let Some(config) = &self.fixed_config {
            let count = usize::try_from(self.num_samples).unwrap_or(usize::MAX);
            return Ok(Box::new(Listed::new(vec![config.clone(); count])));
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

/// A failure of the command, with the exit status it maps to.
struct Failure {
    message: String,
    /// 2 for a user's mistake (bad input), 1 for everything else.
    status: u8,
}

impl Failure {
    fn user(message: impl ToString) -> Self {
        Self {
            message: message.to_string(),
            status: 2,
        }
    }
    fn runtime(message: impl ToString) -> Self {
        Self {
            message: message.to_string(),
            status: 1,
        }
    }
}

/// Parses arguments, runs the command, prints a one-line cause on failure.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::GpuWorker { adapter } => return crate::compute::gpu::worker_main(adapter),
        Command::CompileWorker { max_wasm_stack } => {
            return crate::sandbox::compile_worker_main(max_wasm_stack);
        }
        _ => {}
    }
    init_tracing();
    let outcome = match cli.command {
        Command::Run(args) => run(*args),
        Command::Resume(args) => resume_experiment(args),
        Command::Serve(args) => serve_dir(args),
        Command::Inspect { model } => inspect(&model),
        Command::GpuWorker { .. } | Command::CompileWorker { .. } => {
            unreachable!("served above")
        }
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            // Each line escaped on its own: the host's message may span
            // lines, and any guest text in it was escaped where it was put.
            for (i, line) in failure.message.lines().enumerate() {
                let prefix = if i == 0 { "error: " } else { "" };
                eprintln!("{prefix}{}", inert(line));
            }
            ExitCode::from(failure.status)
        }
    }
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("WTUNE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    // Warnings quote trials' reasons, which are the guests' text: lines go
    // out escaped, so colours (which would be escaped too) are off.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(TerminalWriter)
        .with_ansi(false)
        .try_init();
}

/// The sandbox for `options`, with the cache the flags choose.
fn sandbox(cache: CacheArgs, mut options: SandboxOptions) -> Result<Sandbox, Failure> {
    if cache.no_cache {
        options.cache_dir = None;
    } else if let Some(dir) = cache.cache_dir {
        options.cache_dir = Some(dir);
    }
    Sandbox::new(options)
        .map_err(|e| Failure::runtime(format!("cannot start the sandbox engine: {e:#}")))
}

fn run(args: RunArgs) -> Result<(), Failure> {
    let serve = args.serve.options()?;
    let overrides = Overrides {
        name: args.name,
        num_samples: args.num_samples,
        max_concurrent: args.max_concurrent,
        metric: args.metric,
        mode: args.mode,
        stop: args.stop,
        fuel: args.fuel,
        fuel_per_call: args.fuel_per_call,
        memory: args.memory,
        timeout: args.timeout,
        data: args.data,
        output_dir: args.output_dir,
        seed: args.seed,
        checkpoint: args.checkpoint,
        checkpoint_freq: args.checkpoint_freq,
        checkpoint_at_end: args.checkpoint_at_end,
        max_failures: args.max_failures,
        restore_from: args.restore_from,
        scheduler: args.scheduler,
        search: args.search,
        compute: args.compute,
        allowed_components: args.allow_component,
    };
    let plan =
        config::plan(&args.model, args.config.as_deref(), &overrides).map_err(Failure::user)?;
    let sandbox = sandbox(
        args.cache,
        SandboxOptions {
            max_wasm_stack: plan.max_wasm_stack,
            compute: plan.compute,
            compile: plan.compile,
            allowed_components: plan.allowed_components.clone(),
            ..SandboxOptions::default()
        },
    )?;
    let program = sandbox.load(&args.model).map_err(Failure::user)?;
    for note in &plan.notes {
        eprintln!("note: {note}");
    }
    let key = snapshot_key(plan.snapshot_key_file.as_deref())?;
    let mut backend =
        WasmBackend::new(program.clone(), plan.limits.clone(), plan.data.clone()).snapshot_key(key);
    match plan.checkpoint_mode {
        Some(mode) => backend = backend.checkpoint_mode(mode).map_err(Failure::user)?,
        None => {
            let checkpoints = &plan.spec.checkpoint;
            if let Err(refusal) = program.snapshots()
                && (checkpoints.freq > 0 || checkpoints.at_end)
            {
                eprintln!(
                    "note: host snapshots are not possible for this component ({}); \
                     checkpoints use its own save()/restore()",
                    refusal.reason()
                );
            }
        }
    }
    let mut fixed_config = None;
    if let Some(path) = &plan.spec.restore_from {
        let (meta, payload) = backend.read_checkpoint(path).map_err(Failure::user)?;
        if let Payload::Memory(_) = payload {
            // A host snapshot holds its trial's configuration in memory.
            if !plan.empty_space {
                return Err(Failure::user(format!(
                    "restore_from: {} is a host snapshot, which continues with its own \
                     configuration; remove param_space, or start from a guest checkpoint \
                     (checkpoint = \"guest\") to try new configurations",
                    path.display()
                )));
            }
            fixed_config = Some(meta.config);
        }
    }

    let limits = &plan.limits;
    let model = std::path::absolute(&args.model).unwrap_or_else(|_| args.model.clone());
    eprintln!(
        "limits per trial: memory {}, fuel {} per call{}, deadline {} per call",
        human_bytes(limits.memory_bytes),
        limits.fuel_per_call.map_or("unlimited".into(), fuel_text),
        limits
            .fuel_per_trial
            .map_or(String::new(), |f| format!(", {} per trial", fuel_text(f))),
        limits
            .call_timeout
            .map_or("none".into(), |d| humantime::format_duration(d).to_string()),
    );
    if program.uses_compute() {
        let compute = sandbox.compute();
        eprintln!(
            "compute: {} on {}, {} per trial, {} in all",
            compute.kind,
            compute.name,
            human_bytes(plan.compute.trial_quota),
            human_bytes(plan.compute.total_quota),
        );
    }

    let mut spec = plan.spec;
    spec.configs = Vec::new();
    let setup = Setup {
        model,
        model_blake3: program.digest().to_string(),
        spec: spec.clone(),
        limits: plan.limits,
        max_wasm_stack: plan.max_wasm_stack,
        data: plan.data,
        checkpoint: backend.mode(),
        snapshot_key_file: plan
            .snapshot_key_file
            .map(|p| std::path::absolute(&p).unwrap_or(p)),
        scheduler: plan.scheduler,
        seed: plan.seed,
        num_samples: plan.num_samples,
        param_space: plan.param_space,
        search: plan.search,
        fixed_config,
        compute: plan.compute,
        compile: plan.compile,
        allowed_components: plan.allowed_components,
    };
    let scheduler = setup.scheduler()?;
    let searcher = setup.searcher()?;
    let lock = lock(&spec.output_dir)?;
    execute(
        backend, spec, scheduler, searcher, None, &setup, lock, serve,
    )
}

/// What `wtune resume` carries on from: the saved trials and decisions.
struct Resumed {
    trials: Vec<Trial>,
    decisions: DecisionState,
}

/// Runs trials to the end and reports, for `run` and `resume` alike, while
/// holding the experiment directory's `lock`; with `serve`, beside a
/// control server.
#[allow(clippy::too_many_arguments)]
fn execute(
    backend: WasmBackend,
    spec: RunSpec,
    scheduler: Box<dyn Scheduler>,
    searcher: Box<dyn Searcher>,
    resumed: Option<Resumed>,
    setup: &Setup,
    lock: std::fs::File,
    serve: Option<serve::ServeOptions>,
) -> Result<(), Failure> {
    let _lock = lock;
    let mut spec = spec;
    if let Some(note) = fit_gpu(
        &mut spec.resources,
        &mut spec.resources_per_trial,
        backend.program().compute_gpus(),
    )
    .map_err(Failure::user)?
    {
        eprintln!("note: {note}");
    }
    if backend.program().uses_compute() {
        let shares = setup.compute.shares().max(1);
        if spec.max_concurrent as u64 > shares {
            eprintln!(
                "note: running at most {shares} trials at once (not {}), so that each is sure \
                 of its limits.compute_memory ({}) within limits.compute_memory_total ({})",
                spec.max_concurrent,
                human_bytes(setup.compute.trial_quota),
                human_bytes(setup.compute.total_quota)
            );
            spec.max_concurrent = shares as usize;
        }
    }
    let pool = spec.resources.build().map_err(Failure::user)?;
    pool.check(&spec.resources_per_trial)
        .map_err(|e| Failure::user(format!("resources_per_trial: {e}")))?;
    let (trials, resumed) = match resumed {
        Some(Resumed { trials, decisions }) => (trials, Some(decisions)),
        None => (Vec::new(), None),
    };
    let total = searcher.total().map(|n| n.max(trials.len() as u64));
    let setup_json = serde_json::to_value(setup).expect("the setup serializes");
    let state = StateFile::new(setup_json);
    // Resuming, a trial the saved state does not list yet may have left
    // its directory, results and checkpoints behind: its work is picked up.
    let adopt = {
        let (backend, policy) = (backend.clone(), spec.checkpoint.clone());
        move |trial: &mut Trial| resume::adopt_reported(&backend, trial, &policy)
    };
    // The state first: it must be saved even if another callback fails at
    // the end.
    let mut runner = Runner::new(backend, spec, scheduler).searcher(searcher);
    if let Some(resumed) = resumed {
        runner = runner.adopt_from_disk(adopt);
        runner = runner.fuel_burned(resumed.fuel_burned);
        if let Some(state) = resumed.stopper {
            runner = runner.stopper_state(state);
        }
    }
    let runner = runner
        .with_trials(trials)
        .callback(state)
        .callback(TrialFiles::new())
        .callback(ExperimentFile::new(setup.run_info()))
        .callback(Progress::new().total(total));
    let runtime = tokio::runtime::Runtime::new()
        .map_err(|e| Failure::runtime(format!("cannot start the runtime: {e}")))?;
    let (interrupt, interrupts) = tokio::sync::mpsc::unbounded_channel();
    let mut runner = runner.interrupts(interrupts);
    let dir = setup.spec.output_dir.clone();
    // Dropped after the run: the page keeps answering until then.
    let _server = match serve {
        Some(options) => {
            let (controller, requests) = control::channel();
            runner = runner.control(requests);
            let server = runtime
                .block_on(serve::Server::start(
                    dir.clone(),
                    Some(controller),
                    &options,
                ))
                .map_err(Failure::user)?;
            eprintln!("serving the dashboard at {}", server.url());
            if options.token.is_some() {
                eprintln!(
                    "(API requests need the token; open the page as {}#token=TOKEN)",
                    server.url()
                );
            }
            Some(server)
        }
        None => None,
    };
    runtime.spawn(async move {
        let mut count = 0;
        while tokio::signal::ctrl_c().await.is_ok() {
            count += 1;
            if count == 1 {
                eprintln!(
                    "\ninterrupted: checkpointing running trials after their current step and \
                     saving state (Ctrl-C again to exit at once)"
                );
            }
            if interrupt.send(()).is_err() {
                break;
            }
        }
    });
    let outcome = runtime.block_on(runner.run());
    if outcome.is_err() {
        // Blocking threads may still be inside other trials' calls; the
        // state is saved, so do not wait for them.
        runtime.shutdown_background();
    }
    let summary = match outcome {
        Ok(summary) => summary,
        Err(RunError::Interrupted) => {
            return Err(Failure {
                message: format!(
                    "interrupted; continue the experiment with `wtune resume {}`",
                    dir.display()
                ),
                status: 130,
            });
        }
        Err(err @ RunError::TrialFailed { .. }) => {
            return Err(Failure::runtime(format!(
                "{}\nthe experiment stopped; continue it with `wtune resume {}`",
                inert(&err.to_string()),
                dir.display()
            )));
        }
        Err(err) => return Err(Failure::runtime(err)),
    };

    print_out(&summary_text(&summary));
    if summary.halted.as_deref() == Some(STOPPED_BY_REQUEST) {
        eprintln!(
            "the experiment was stopped by a control request; continue it with `wtune resume {}`",
            summary.output_dir.display()
        );
        return Ok(());
    }
    if let Some(reason) = &summary.halted {
        let mut failure = Failure::runtime(format!(
            "the experiment stopped early: {}; continue it with `wtune resume {}`",
            inert(reason),
            summary.output_dir.display()
        ));
        if reason == "interrupted" {
            // The shell's convention for a run ended by SIGINT.
            failure.status = 130;
        }
        return Err(failure);
    }
    let errors = summary.count(TrialStatus::Error);
    if errors > 0 && errors == summary.trials.len() {
        return Err(Failure::runtime(format!(
            "all {errors} trials failed; see the reasons above and the logs in {}",
            summary.output_dir.display()
        )));
    }
    Ok(())
}

/// Holds `<dir>/.wtune.lock` for as long as the returned file lives, so
/// that two `wtune` processes never run the same experiment directory.
fn lock(dir: &Path) -> Result<std::fs::File, Failure> {
    crate::persist::create_dir(dir).map_err(Failure::runtime)?;
    let path = dir.join(".wtune.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| Failure::runtime(format!("cannot create {}: {e}", path.display())))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(Failure::user(format!(
            "another wtune process is running the experiment in {}; wait for it to end",
            dir.display()
        ))),
        Err(std::fs::TryLockError::Error(e)) => Err(Failure::runtime(format!(
            "cannot lock {}: {e}",
            path.display()
        ))),
    }
}

fn snapshot_key(file: Option<&Path>) -> Result<Option<SnapshotKey>, Failure> {
    let Some(file) = file else {
        return Ok(None);
    };
    let secret = std::fs::read(file)
        .map_err(|e| Failure::user(format!("snapshot_key_file {}: {e}", file.display())))?;
    if secret.len() < 16 {
        return Err(Failure::user(format!(
            "snapshot_key_file {} holds {} bytes; use at least 16 bytes of secret",
            file.display(),
            secret.len()
        )));
    }
    Ok(Some(SnapshotKey::derive(&secret)))
}

fn resume_experiment(args: ResumeArgs) -> Result<(), Failure> {
    let serve = args.serve.options()?;
    // Locked before the state is read, not only before anything changes
    // (resuming moves a damaged state aside and deletes the checkpoints of
    // restarted trials): a wtune finishing beside this one may still write
    // a newer state. A missing directory is left to the state's error.
    let lock = args.dir.is_dir().then(|| lock(&args.dir)).transpose()?;
    let state = state::load(&args.dir, args.previous_state).map_err(|e| {
        let hint = match e {
            state::StateError::Damaged(..) if !args.previous_state => format!(
                "; the state before it is kept: run `wtune resume {} --previous-state`",
                args.dir.display()
            ),
            _ => String::new(),
        };
        Failure::user(format!("{e}{hint}"))
    })?;
    let lock =
        lock.ok_or_else(|| Failure::user(format!("{} is not a directory", args.dir.display())))?;
    let mut setup: Setup = serde_json::from_value(state.setup).map_err(|e| {
        Failure::user(format!(
            "{}: the saved setup cannot be read by this wtune: {e}",
            args.dir.display()
        ))
    })?;
    let model = args
        .model
        .map(|m| std::path::absolute(&m).unwrap_or(m))
        .unwrap_or_else(|| setup.model.clone());
    let sandbox = sandbox(
        args.cache,
        SandboxOptions {
            max_wasm_stack: setup.max_wasm_stack,
            compute: setup.compute,
            compile: setup.compile,
            allowed_components: setup.allowed_components.clone(),
            ..SandboxOptions::default()
        },
    )?;
    // The digest is checked before the file is compiled: resuming must not
    // compile (or run) anything but the component the experiment admitted.
    let bytes = std::fs::read(&model)
        .map_err(|e| Failure::user(format!("cannot read {}: {e}", model.display())))?;
    let digest = blake3::hash(&bytes).to_hex().to_string();
    if digest != setup.model_blake3 {
        return Err(Failure::user(format!(
            "{} is not the component the experiment ran (its blake3 {}, expected {}); pass \
             the original with --model",
            model.display(),
            &digest[..12],
            &setup.model_blake3[..12.min(setup.model_blake3.len())]
        )));
    }
    let program: Program = sandbox
        .load_bytes(&bytes)
        .map_err(|e| Failure::user(format!("{}: {e}", model.display())))?;
    setup.model = model;
    let key = snapshot_key(setup.snapshot_key_file.as_deref())?;
    let backend = WasmBackend::new(program, setup.limits.clone(), setup.data.clone())
        .snapshot_key(key)
        .checkpoint_mode(setup.checkpoint)
        .map_err(Failure::user)?;

    // Everything that can refuse the resume comes before anything changes
    // in the directory.
    let decisions = &state.decisions;
    let mut scheduler = setup.scheduler()?;
    let saved = &decisions.scheduler;
    // The first state early versions wrote had no scheduler yet (no name):
    // nothing to take back.
    if !saved.name.is_empty() {
        if saved.name != scheduler.name() {
            return Err(Failure::user(format!(
                "the saved state is of the {} scheduler, but the experiment's setup names {}",
                saved.name,
                scheduler.name()
            )));
        }
        scheduler
            .restore_state(&saved.state)
            .map_err(|e| Failure::user(format!("the saved {} scheduler state: {e}", saved.name)))?;
    }
    let mut searcher = match &decisions.searcher {
        Some(saved) if !setup.param_space.is_null() => {
            let mut searcher = setup.searcher()?;
            if saved.name != searcher.name() {
                return Err(Failure::user(format!(
                    "the saved state is of the {} searcher, but the experiment's setup names {}",
                    saved.name,
                    searcher.name()
                )));
            }
            searcher.restore_state(&saved.state).map_err(|e| {
                Failure::user(format!("the saved {} searcher state: {e}", saved.name))
            })?;
            searcher
        }
        // Set up before searchers existed: every trial was created up
        // front and is in the saved list.
        _ => Box::new(Listed::default()),
    };
    if args.previous_state {
        // Keep the damaged newest state out of the way: the first write of
        // this run would otherwise make it the "previous" one, replacing
        // the good state being resumed from.
        let current = args.dir.join(state::STATE_FILE);
        if current.exists() {
            let aside = args.dir.join("experiment_state.damaged.json");
            std::fs::rename(&current, &aside).map_err(|e| {
                Failure::runtime(format!("moving {} aside: {e}", current.display()))
            })?;
            eprintln!("note: the damaged state is kept as {}", aside.display());
        }
    }
    let errored = if args.retry_errored {
        ErroredTrials::Retry
    } else if args.restart_errored {
        ErroredTrials::Restart
    } else {
        ErroredTrials::Keep
    };
    let mut trials = state.trials;
    let output_dir = std::path::absolute(&args.dir).unwrap_or(args.dir);
    let plan = resume::prepare(
        &backend,
        &mut trials,
        &output_dir,
        &setup.spec.checkpoint,
        errored,
    );
    for (path, why) in &plan.damaged {
        eprintln!(
            "note: skipping damaged checkpoint {}: {why}",
            path.display()
        );
    }
    eprintln!(
        "resuming {}: {} trials continue from checkpoints, {} start over, {} not started yet, {} finished",
        output_dir.display(),
        plan.continued.len(),
        plan.restarted.len(),
        plan.pending,
        plan.finished
    );
    resume::retry_errored(&plan, &trials, scheduler.as_mut(), searcher.as_mut());
    setup.spec.output_dir = output_dir;
    let spec = setup.spec.clone();
    let decisions = decisions.clone();
    execute(
        backend,
        spec,
        scheduler,
        searcher,
        Some(Resumed { trials, decisions }),
        &setup,
        lock,
        serve,
    )
}

/// `wtune serve DIR`: the dashboard and API for an experiment directory,
/// read-only, until Ctrl-C.
fn serve_dir(args: ServeDirArgs) -> Result<(), Failure> {
    let options = serve::ServeOptions {
        addr: args.addr,
        token: args.token,
    };
    options.check().map_err(Failure::user)?;
    // Refuse a directory that is not an experiment now, not on the first
    // page load.
    serve::view::ExperimentDir::new(&args.dir)
        .state()
        .map_err(Failure::user)?;
    let runtime = tokio::runtime::Runtime::new()
        .map_err(|e| Failure::runtime(format!("cannot start the runtime: {e}")))?;
    runtime.block_on(async {
        let server = serve::Server::start(args.dir.clone(), None, &options)
            .await
            .map_err(Failure::user)?;
        eprintln!(
            "serving the dashboard at {} for {} (read-only; Ctrl-C to stop)",
            server.url(),
            args.dir.display()
        );
        tokio::signal::ctrl_c()
            .await
            .map_err(|e| Failure::runtime(format!("waiting for Ctrl-C: {e}")))
    })
}

fn inspect(model: &Path) -> Result<(), Failure> {
    let bytes = std::fs::read(model)
        .map_err(|e| Failure::user(format!("cannot read {}: {e}", model.display())))?;
    let sandbox = sandbox(
        CacheArgs {
            cache_dir: None,
            no_cache: false,
        },
        SandboxOptions::default(),
    )?;
    let description = sandbox
        .describe(&bytes)
        .map_err(|e| Failure::user(format!("{}: {e}", model.display())))?;
    use std::fmt::Write as _;
    let mut text = String::new();
    // Writing into a String cannot fail.
    let _ = writeln!(text, "component: {}", model.display());
    let _ = writeln!(text, "size: {}", human_bytes(bytes.len() as u64));
    let _ = writeln!(text, "blake3: {}", blake3::hash(&bytes).to_hex());
    let _ = writeln!(text, "imports:");
    for (name, ty) in &description.imports {
        let _ = writeln!(text, "  {name}: {ty}");
    }
    let _ = writeln!(text, "exports:");
    for (name, ty) in &description.exports {
        let _ = writeln!(text, "  {name}: {ty}");
    }
    let fits = description.fits.map(|()| {
        let _ = writeln!(text, "contract: fits {}", crate::sandbox::WORLD);
        match crate::snapshot::instrument(&bytes) {
            Ok(_) => {
                let _ = writeln!(text, "host snapshots: supported");
            }
            Err(refusal) => {
                let _ = writeln!(text, "host snapshots: no ({})", refusal.reason());
            }
        }
    });
    print_out(&text);
    fits.map_err(|e| Failure::user(format!("{}: {e}", model.display())))
}

/// Writes `text` to stdout. A reader that went away (`wtune inspect | head`)
/// is not an error: what it wanted it read; `println!` would panic there.
fn print_out(text: &str) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            eprintln!("warning: writing to stdout: {e}");
        }
        _ => {}
    }
}
