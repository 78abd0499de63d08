//! The commands' arguments, as clap reads them.

use std::path::PathBuf;

use clap::Args;

use crate::serve;

use super::Failure;

#[derive(Debug, Args)]
pub(super) struct RunArgs {
    /// The trainable component (.wasm), built with `cargo build --target wasm32-wasip2`.
    pub(super) model: PathBuf,
    /// Experiment file (TOML); flags below override it.
    #[arg(short, long)]
    pub(super) config: Option<PathBuf>,
    /// Experiment name (default: the file's `name`, else the model's file name).
    #[arg(long)]
    pub(super) name: Option<String>,
    /// Samples drawn from the search space (each repeats every grid).
    #[arg(long, value_name = "N")]
    pub(super) num_samples: Option<u64>,
    /// Most trials running at once (default: the number of cores).
    #[arg(long, value_name = "N")]
    pub(super) max_concurrent: Option<usize>,
    /// Metric that ranks trials.
    #[arg(long)]
    pub(super) metric: Option<String>,
    /// Whether the metric is minimized or maximized: min or max.
    #[arg(long)]
    pub(super) mode: Option<String>,
    /// Stopping criterion, repeatable: training_iteration=20, fuel_total=1e10, a metric's
    /// threshold val_accuracy>=0.98 or 'loss<=0.05' (METRIC=V keeps the direction of the
    /// file's criterion on METRIC, else >=).
    #[arg(long, value_name = "KEY=VALUE")]
    pub(super) stop: Vec<String>,
    #[command(flatten)]
    pub(super) limits: LimitArgs,
    /// Grant a directory read-only at /data/NAME, repeatable: NAME=DIR or DIR.
    #[arg(long, value_name = "NAME=DIR")]
    pub(super) data: Vec<String>,
    /// Where results go (default: wtune_results/<name>_<time>). Must not exist or be empty.
    #[arg(short, long, value_name = "DIR")]
    pub(super) output_dir: Option<PathBuf>,
    /// Seed for sampling configurations (default: random, printed).
    #[arg(long)]
    pub(super) seed: Option<u64>,
    /// How checkpoints are taken: snapshot (host memory snapshots) or guest (save/restore).
    #[arg(long, value_name = "MODE")]
    pub(super) checkpoint: Option<String>,
    /// Checkpoint every N iterations.
    #[arg(long, value_name = "N")]
    pub(super) checkpoint_freq: Option<u64>,
    /// Checkpoint each trial when it finishes.
    #[arg(long)]
    pub(super) checkpoint_at_end: bool,
    /// Failures each trial recovers from (from its newest checkpoint); -1 = forever.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub(super) max_failures: Option<i64>,
    /// Trial scheduler: fifo, asha, hyperband, median_stopping or pbt (parameters from the file's [scheduler] when it names the same one).
    #[arg(long, value_name = "NAME")]
    pub(super) scheduler: Option<String>,
    /// Search algorithm: random, grid, tpe or gp (parameters from the file's [search] when it names the same one).
    #[arg(long, value_name = "NAME")]
    pub(super) search: Option<String>,
    /// Where the guests' compute kernels run: auto, cpu or gpu.
    #[arg(long, value_name = "BACKEND")]
    pub(super) compute: Option<String>,
    /// Start every trial from this checkpoint file.
    #[arg(long, value_name = "FILE")]
    pub(super) restore_from: Option<PathBuf>,
    /// Run the model only if its blake3 digest (as `wtune inspect` prints it) is this one; repeatable, replaces the file's security.allowed_components.
    #[arg(long, value_name = "HASH")]
    pub(super) allow_component: Vec<String>,
    /// Write no TensorBoard event files (the file's `[tracking] tensorboard = false`).
    #[arg(long)]
    pub(super) no_tensorboard: bool,
    /// Log every trial as a run to this MLflow tracking server: http://HOST:PORT (the file's `[tracking] mlflow`).
    #[arg(long, value_name = "URI")]
    pub(super) mlflow: Option<String>,
    #[command(flatten)]
    pub(super) cache: CacheArgs,
    #[command(flatten)]
    pub(super) serve: ServeArgs,
}

#[derive(Debug, Args)]
pub(super) struct ServeArgs {
    /// Serve a dashboard and control API while the experiment runs: `--serve` on
    /// 127.0.0.1:8267 (loopback only), `--serve=ADDR` elsewhere (port 0 picks a free port).
    #[arg(
        long,
        value_name = "ADDR",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = serve::DEFAULT_ADDR
    )]
    pub(super) serve: Option<std::net::SocketAddr>,
    /// The bearer token API clients must send (required when ADDR is not loopback).
    #[arg(long, value_name = "TOKEN", env = serve::TOKEN_ENV, hide_env_values = true)]
    pub(super) serve_token: Option<String>,
}

impl ServeArgs {
    pub(super) fn options(self) -> Result<Option<serve::ServeOptions>, Failure> {
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
pub(super) struct ServeDirArgs {
    /// The experiment's output directory.
    pub(super) dir: PathBuf,
    /// Where to listen (loopback only unless a token is given).
    #[arg(long, value_name = "ADDR", default_value = serve::DEFAULT_ADDR)]
    pub(super) addr: std::net::SocketAddr,
    /// The bearer token API clients must send (required when ADDR is not loopback).
    #[arg(long, visible_alias = "serve-token", value_name = "TOKEN", env = serve::TOKEN_ENV, hide_env_values = true)]
    pub(super) token: Option<String>,
}

#[derive(Debug, Args)]
pub(super) struct CacheArgs {
    /// Directory for compiled components (default: $WTUNE_CACHE_DIR or ~/.cache/wtune).
    #[arg(long, value_name = "DIR")]
    pub(super) cache_dir: Option<PathBuf>,
    /// Compile without reading or writing the on-disk cache.
    #[arg(long)]
    pub(super) no_cache: bool,
}

#[derive(Debug, Args)]
pub(super) struct ResumeArgs {
    /// The interrupted experiment's output directory.
    pub(super) dir: PathBuf,
    /// Also continue trials that ended in ERROR, from their newest checkpoint.
    #[arg(long, conflicts_with = "restart_errored")]
    pub(super) retry_errored: bool,
    /// Also run trials that ended in ERROR again, from scratch.
    #[arg(long)]
    pub(super) restart_errored: bool,
    /// Use experiment_state.prev.json, the state before the newest (when the newest is damaged).
    #[arg(long)]
    pub(super) previous_state: bool,
    /// The component, when it moved since the experiment started (it must be the same file).
    #[arg(long, value_name = "FILE")]
    pub(super) model: Option<PathBuf>,
    /// The experiment's snapshot key file, given here rather than taken from the saved state:
    /// the state must then be sealed with that key, so that whoever can write the directory
    /// cannot change what the experiment runs, or which key its checkpoints need.
    #[arg(long, value_name = "FILE")]
    pub(super) snapshot_key_file: Option<PathBuf>,
    #[command(flatten)]
    pub(super) changes: ChangeArgs,
    #[command(flatten)]
    pub(super) fixed: FixedOnResume,
    #[command(flatten)]
    pub(super) cache: CacheArgs,
    #[command(flatten)]
    pub(super) serve: ServeArgs,
}

/// What `wtune resume` may change of the experiment.
#[derive(Debug, Args)]
pub(super) struct ChangeArgs {
    /// New stopping criteria over the saved ones, as `run`'s (repeatable): trials that ended only
    /// because a criterion was met continue from their newest checkpoint when the new ones let
    /// them go on, which extends a finished run.
    #[arg(long = "stop", value_name = "KEY=VALUE")]
    pub(super) stop: Vec<String>,
    /// A new sample count: more trials after those the experiment made (or
    /// fewer, down to the trials already created).
    #[arg(long, value_name = "N")]
    pub(super) num_samples: Option<u64>,
    /// Most trials running at once from now on.
    #[arg(long, value_name = "N")]
    pub(super) max_concurrent: Option<usize>,
    /// Where the guests' compute kernels run from now on: auto, cpu or gpu. A trial whose
    /// snapshot holds burn tensors continues only on the kind of backend that held them.
    #[arg(long, value_name = "BACKEND")]
    pub(super) compute: Option<String>,
    // --fuel, --memory, ... apply from now on; with --retry-errored,
    // trials that ran out of fuel go on under the new budget.
    #[command(flatten)]
    pub(super) limits: LimitArgs,
}

/// The trial limits a flag sets, for `run` and `resume` alike.
#[derive(Debug, Args)]
pub(super) struct LimitArgs {
    /// Fuel budget per trial, e.g. 5e10 (exceeding it ends the trial as ERROR).
    #[arg(long, value_name = "FUEL")]
    pub(super) fuel: Option<String>,
    /// Fuel limit for one call into the trainable, e.g. 5e9, or "unlimited".
    #[arg(long, value_name = "FUEL")]
    pub(super) fuel_per_call: Option<String>,
    /// Memory cap per trial, e.g. 256MiB.
    #[arg(long, value_name = "SIZE")]
    pub(super) memory: Option<String>,
    /// Wall-clock deadline per call, e.g. 30s, or "none".
    #[arg(long, value_name = "DURATION")]
    pub(super) timeout: Option<String>,
}

/// `wtune run` flags that name what a resumed experiment keeps: taken
/// (hidden) only to refuse them with the reason, instead of clap's
/// "unexpected argument".
#[derive(Debug, Args)]
pub(super) struct FixedOnResume {
    #[arg(short, long, hide = true)]
    pub(super) config: Option<PathBuf>,
    #[arg(long, hide = true)]
    pub(super) name: Option<String>,
    #[arg(short, long, hide = true)]
    pub(super) output_dir: Option<PathBuf>,
    #[arg(long, hide = true)]
    pub(super) metric: Option<String>,
    #[arg(long, hide = true)]
    pub(super) mode: Option<String>,
    #[arg(long, hide = true)]
    pub(super) seed: Option<String>,
    #[arg(long, hide = true)]
    pub(super) scheduler: Option<String>,
    #[arg(long, hide = true)]
    pub(super) search: Option<String>,
    #[arg(long, hide = true)]
    pub(super) checkpoint: Option<String>,
    #[arg(long, hide = true)]
    pub(super) data: Vec<String>,
    #[arg(long, hide = true)]
    pub(super) restore_from: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub(super) struct NewArgs {
    /// The crate's name (letters, digits, `-` and `_`, starting with a letter).
    pub(super) name: String,
    /// Where to create it (default: ./NAME); must not exist or be empty.
    #[arg(long, value_name = "DIR")]
    pub(super) dir: Option<PathBuf>,
    /// The wtune-guest SDK's directory (default: the one this wtune was built with).
    #[arg(long, value_name = "DIR")]
    pub(super) sdk: Option<PathBuf>,
}
