//! The engine every trial shares: configuration, the epoch ticker behind
//! wall-clock deadlines, and the linker with the host's imports.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use wasmtime::component::{HasSelf, Linker};
use wasmtime::{Config, Engine};

use super::bindings;
use super::cache::ArtifactCache;
use super::store_data::TrialHost;
use crate::compute::{Compute, ComputeOptions};

/// Where and under which limits components are compiled.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CompileOptions {
    /// Whether compilation runs in a separate, limited process.
    pub isolation: CompileIsolation,
    /// Wall-clock limit for compiling one component.
    pub timeout: Duration,
    /// Address-space limit of the compile process, in bytes.
    pub memory: u64,
}

impl Default for CompileOptions {
    fn default() -> Self {
        Self {
            isolation: CompileIsolation::Process,
            timeout: Duration::from_secs(120),
            memory: 4 << 30,
        }
    }
}

/// Where components are compiled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CompileIsolation {
    /// In `wtune compile-worker`, under the time and memory limits.
    #[default]
    Process,
    /// In the host process, without limits: only for components that are
    /// trusted (a compile bomb then stalls or exhausts the host).
    InProcess,
}

impl std::str::FromStr for CompileIsolation {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "process" => Ok(Self::Process),
            "in-process" => Ok(Self::InProcess),
            other => Err(format!(
                "compile isolation must be \"process\" or \"in-process\"; got {other:?}"
            )),
        }
    }
}

/// How often the engine's epoch advances; deadlines are counted in these.
pub(crate) const EPOCH_TICK: Duration = Duration::from_millis(10);

/// How a [`Sandbox`] is built.
#[derive(Debug, Clone)]
pub struct SandboxOptions {
    /// Where compiled components are cached; `None` disables the disk cache.
    pub cache_dir: Option<PathBuf>,
    /// Maximum wasm call-stack size in bytes for every trial.
    pub max_wasm_stack: usize,
    /// The host compute backend and its device-memory quotas.
    pub compute: ComputeOptions,
    /// Where components are compiled, and the limits on compiling one.
    pub compile: CompileOptions,
    /// When set, only components whose blake3 digest (lowercase hex) is in
    /// the set are loaded; any other is refused before it is compiled.
    pub allowed_components: Option<BTreeSet<String>>,
}

impl Default for SandboxOptions {
    fn default() -> Self {
        Self {
            cache_dir: ArtifactCache::default_dir(),
            max_wasm_stack: 1 << 20,
            compute: ComputeOptions::default(),
            compile: CompileOptions::default(),
            allowed_components: None,
        }
    }
}

/// Owns the wasmtime engine, the linker and the compiled-artifact cache.
/// Create one per process (or per experiment) and load programs from it.
pub struct Sandbox {
    pub(crate) engine: Engine,
    pub(crate) linker: Linker<TrialHost>,
    pub(crate) cache: Option<ArtifactCache>,
    /// Shared with every [`Program`](super::Program): deadlines must keep
    /// firing for as long as any instance can run, even if the sandbox that
    /// loaded it is gone.
    pub(crate) ticker: Arc<EpochTicker>,
    /// Shared by every trial of every program this sandbox loads.
    pub(crate) compute: Compute,
    pub(crate) compile: CompileOptions,
    pub(crate) max_wasm_stack: usize,
    pub(crate) allowed_components: Option<BTreeSet<String>>,
}

/// The engine configuration every trial runs under. The compile worker
/// builds its engine from the same function, so the artifacts it returns
/// load in the host's engine.
pub(crate) fn engine_config(max_wasm_stack: usize) -> Config {
    let mut config = Config::new();
    config.wasm_component_model(true);
    config.consume_fuel(true);
    config.epoch_interruption(true);
    config.max_wasm_stack(max_wasm_stack);
    // Guest memories are ours so that restores can ask for huge pages (see
    // `memory`); wasmtime's copy-on-write data segments need its own
    // mappings, so they go together. The flag is part of the artifact's
    // compatibility hash, which the compile worker must match.
    config.with_host_memory(Arc::new(super::memory::GuestMemories));
    config.memory_init_cow(false);
    config
}

impl Sandbox {
    /// Builds the engine (fuel metering and epoch interruption on) and the
    /// linker with WASI preview 2 and the `wtune:trainable/host` imports.
    pub fn new(options: SandboxOptions) -> wasmtime::Result<Self> {
        let engine = Engine::new(&engine_config(options.max_wasm_stack))?;
        super::signals::record_trap_handlers();
        // Trials' open files are host descriptors: make the whole hard limit
        // available before any trial opens one (`Limits::open_files`).
        super::limits::descriptor_limit();

        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker)?;
        super::waits::add_to_linker(&mut linker, TrialHost::waits)?;
        super::disk::add_to_linker(&mut linker, TrialHost::guarded_fs)?;
        bindings::Trainable::add_to_linker::<TrialHost, HasSelf<TrialHost>>(&mut linker, |host| {
            host
        })?;
        super::accessor::add_sink_to_linker(&mut linker)?;

        let cache = options
            .cache_dir
            .map(|dir| ArtifactCache::new(dir, &engine));
        let ticker = Arc::new(EpochTicker::start(engine.clone()));
        Ok(Self {
            engine,
            linker,
            cache,
            ticker,
            compute: Compute::new(options.compute).map_err(wasmtime::Error::msg)?,
            compile: options.compile,
            max_wasm_stack: options.max_wasm_stack,
            allowed_components: options.allowed_components,
        })
    }
}

impl Sandbox {
    /// Where the guests' host compute runs.
    pub fn compute(&self) -> crate::compute::BackendInfo {
        self.compute.info()
    }
}

/// A thread that advances the engine's epoch every [`EPOCH_TICK`], stopped
/// when the sandbox is dropped.
pub(crate) struct EpochTicker {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl EpochTicker {
    fn start(engine: Engine) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("wtune-epoch".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(EPOCH_TICK);
                    engine.increment_epoch();
                }
            })
            .expect("spawning the epoch thread");
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
