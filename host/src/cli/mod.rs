//! The `wtune` command line: it parses the arguments, dispatches to one
//! file per command (`run`, `resume`, `inspect`, `new`; `execute` runs trials for
//! the first two) and maps failures to exit statuses.

mod args;
mod common;
mod decisions;
mod execute;
mod inspect;
mod new;
mod resume;
mod run;
mod setup;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::OnceLock;
use std::time::Instant;

use clap::{Parser, Subcommand};

use crate::report::terminal::{TerminalWriter, inert};

use args::{NewArgs, ResumeArgs, RunArgs, ServeDirArgs};

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
    Resume(Box<ResumeArgs>),
    /// Serve the dashboard and API for an experiment directory, finished or running in
    /// another process (to control a run, start it with `--serve` instead).
    Serve(ServeDirArgs),
    /// Say whether two experiment directories made the same decisions (their
    /// decisions.jsonl), or where they part.
    Decisions {
        /// An experiment directory.
        a: PathBuf,
        /// Another one.
        b: PathBuf,
    },
    /// Create a trainable crate to start from: a small real model, its experiment
    /// file and the commands to build and tune it.
    New(NewArgs),
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

/// A failure of the command, with the exit status it maps to.
struct Failure {
    pub(super) message: String,
    /// 2 for a user's mistake (bad input), 1 for everything else.
    pub(super) status: u8,
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

/// When the command started.
fn started() -> Instant {
    static STARTED: OnceLock<Instant> = OnceLock::new();
    *STARTED.get_or_init(Instant::now)
}

/// Parses arguments, runs the command, prints a one-line cause on failure.
pub fn main() -> ExitCode {
    started();
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
        Command::Run(args) => run::run(*args),
        Command::Resume(args) => resume::resume_experiment(*args),
        Command::Serve(args) => inspect::serve_dir(args),
        Command::Inspect { model } => inspect::inspect(&model),
        Command::Decisions { a, b } => decisions::compare(&a, &b),
        Command::New(args) => new::new_trainable(args),
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
