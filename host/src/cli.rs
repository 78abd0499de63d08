//! The `wtune` command line: argument definitions and the two commands.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use serde_json::json;

use crate::config::{self, Overrides};
use crate::exec::WasmBackend;
use crate::report::{ExperimentFile, Progress, TrialFiles, summary_text};
use crate::sandbox::{Sandbox, SandboxOptions, fuel_text, human_bytes};
use crate::tune::{Fifo, Runner, TrialStatus};

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
    /// Show a component's imports and exports and whether it fits the wtune contract.
    Inspect {
        /// The component (.wasm) to inspect.
        model: PathBuf,
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
    /// Directory for compiled components (default: $WTUNE_CACHE_DIR or ~/.cache/wtune).
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
    /// Compile without reading or writing the on-disk cache.
    #[arg(long)]
    no_cache: bool,
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
    init_tracing();
    let outcome = match cli.command {
        Command::Run(args) => run(*args),
        Command::Inspect { model } => inspect(&model),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("error: {}", failure.message);
            ExitCode::from(failure.status)
        }
    }
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("WTUNE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

fn sandbox(
    cache_dir: Option<PathBuf>,
    no_cache: bool,
    max_wasm_stack: usize,
) -> Result<Sandbox, Failure> {
    let mut options = SandboxOptions {
        max_wasm_stack,
        ..SandboxOptions::default()
    };
    if no_cache {
        options.cache_dir = None;
    } else if let Some(dir) = cache_dir {
        options.cache_dir = Some(dir);
    }
    Sandbox::new(options)
        .map_err(|e| Failure::runtime(format!("cannot start the sandbox engine: {e:#}")))
}

fn run(args: RunArgs) -> Result<(), Failure> {
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
    };
    let plan =
        config::plan(&args.model, args.config.as_deref(), &overrides).map_err(Failure::user)?;
    let sandbox = sandbox(args.cache_dir, args.no_cache, plan.max_wasm_stack)?;
    let program = sandbox.load(&args.model).map_err(Failure::user)?;
    for note in &plan.notes {
        eprintln!("note: {note}");
    }

    let limits = &plan.limits;
    let run_info = json!({
        "model": args.model.display().to_string(),
        "model_blake3": program.digest(),
        "seed": plan.seed,
        "num_samples": plan.num_samples,
        "limits": {
            "fuel_per_call": limits.fuel_per_call,
            "fuel_per_trial": limits.fuel_per_trial,
            "memory_bytes": limits.memory_bytes,
            "call_timeout_s": limits.call_timeout.map(|d| d.as_secs_f64()),
            "max_wasm_stack": plan.max_wasm_stack,
        },
        "data": plan.data.iter().map(|(n, d)| (n.clone(), d.display().to_string())).collect::<std::collections::BTreeMap<_, _>>(),
        "wtune_version": env!("CARGO_PKG_VERSION"),
    });
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

    let backend = WasmBackend::new(program, plan.limits.clone(), plan.data.clone());
    let runner = Runner::new(backend, plan.spec, Box::new(Fifo::default()))
        .callback(TrialFiles::new())
        .callback(ExperimentFile::new(run_info))
        .callback(Progress::new());
    let runtime = tokio::runtime::Runtime::new()
        .map_err(|e| Failure::runtime(format!("cannot start the runtime: {e}")))?;
    let summary = runtime.block_on(runner.run()).map_err(Failure::runtime)?;

    print!("{}", summary_text(&summary));
    let errors = summary.count(TrialStatus::Error);
    if errors > 0 && errors == summary.trials.len() {
        return Err(Failure::runtime(format!(
            "all {errors} trials failed; see the reasons above and the logs in {}",
            summary.output_dir.display()
        )));
    }
    Ok(())
}

fn inspect(model: &Path) -> Result<(), Failure> {
    let bytes = std::fs::read(model)
        .map_err(|e| Failure::user(format!("cannot read {}: {e}", model.display())))?;
    let sandbox = sandbox(None, false, 1 << 20)?;
    let description = sandbox
        .describe(&bytes)
        .map_err(|e| Failure::user(format!("{}: {e}", model.display())))?;
    println!("component: {}", model.display());
    println!("size: {}", human_bytes(bytes.len() as u64));
    println!("blake3: {}", blake3::hash(&bytes).to_hex());
    println!("imports:");
    for (name, ty) in &description.imports {
        println!("  {name}: {ty}");
    }
    println!("exports:");
    for (name, ty) in &description.exports {
        println!("  {name}: {ty}");
    }
    match description.fits {
        Ok(()) => {
            println!("contract: fits {}", crate::sandbox::WORLD);
            match crate::snapshot::instrument(&bytes) {
                Ok(_) => println!("host snapshots: supported"),
                Err(refusal) => println!("host snapshots: no ({})", refusal.reason()),
            }
            Ok(())
        }
        Err(e) => Err(Failure::user(format!("{}: {e}", model.display()))),
    }
}
