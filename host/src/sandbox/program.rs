//! Loading a trainable component and instantiating it for one trial.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use wasmtime::Store;
use wasmtime::component::{Component, ResourceTable};
use wasmtime_wasi::{FsPerms, WasiCtxBuilder};

use super::accessor::{AccessIndex, SnapshotError};
use super::bindings::TrainablePre;
use super::capture::CappedSink;
use super::compile::{self, CompileFailure};
use super::contract::{self, ComponentDescription, ContractError};
use super::disk::DiskQuota;
use super::engine::{EpochTicker, Sandbox};
use super::fault::{At, Call, TrialFault};
use super::instance::TrialInstance;
use super::limits::{Limits, TrialLimiter};
use super::store_data::TrialHost;
use crate::snapshot::{self, GuestImage, ImageSource, SnapshotRefusal, SnapshotSource};

/// Why a component file could not be loaded.
#[derive(Debug)]
pub enum LoadError {
    /// The file could not be read.
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The file is not a usable trainable.
    Contract { path: PathBuf, error: ContractError },
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Read { path, source } => {
                write!(f, "cannot read {}: {source}", path.display())
            }
            LoadError::Contract { path, error } => write!(f, "{}: {error}", path.display()),
        }
    }
}

impl std::error::Error for LoadError {}

/// A compiled trainable, checked against the world and ready to instantiate
/// cheaply, once per trial.
#[derive(Clone)]
pub struct Program {
    pre: TrainablePre<TrialHost>,
    /// The accessor of the instrumented component, or why there is none.
    access: Result<Arc<AccessIndex>, SnapshotRefusal>,
    digest: String,
    compute: crate::compute::Compute,
    uses_compute: bool,
    _ticker: Arc<EpochTicker>,
}

/// Whether an import named `name` runs work in the trial's compute
/// session: the `compute` interface, and `burn`, whose operations share
/// the session's quota and GPU. A component that imports only `burn` is
/// placed and capped as one that imports `compute`.
fn runs_host_compute(name: &str) -> bool {
    ["wtune:trainable/compute", "wtune:trainable/burn"]
        .iter()
        .any(|interface| name.starts_with(interface))
}

impl Program {
    /// The blake3 hex digest of the component's bytes (as loaded, before
    /// wtune's instrumentation).
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// Whether the component imports host compute ([`runs_host_compute`]):
    /// its trials then hold a share of the compute quota, and a GPU.
    pub fn uses_compute(&self) -> bool {
        self.uses_compute
    }

    /// The number of the GPU `choice` names among those the program's
    /// host compute runs on (see [`crate::compute::Compute::gpu_index`]).
    pub fn compute_gpu(&self, choice: &crate::compute::GpuChoice) -> Result<usize, String> {
        self.compute.gpu_index(choice)
    }

    /// How many GPUs the program's host compute can run on: the
    /// sandbox's adapters when it imports host compute and the
    /// backend is a GPU, else 0.
    pub fn compute_gpus(&self) -> usize {
        if self.uses_compute {
            self.compute.gpus()
        } else {
            0
        }
    }

    /// Whether the host can snapshot this program's instances, and if not,
    /// why.
    pub fn snapshots(&self) -> Result<(), SnapshotRefusal> {
        self.access.as_ref().map(drop).map_err(Clone::clone)
    }
}

/// The filesystem a trial's instance runs in.
#[derive(Debug, Clone)]
pub struct TrialEnv {
    /// Host directory the guest sees as `.`, read-write. The guest's only
    /// writable place.
    pub work_dir: PathBuf,
    /// Host directory for the captured `stdout.log`, `stderr.log` and
    /// `guest.log`. Not visible to the guest, so it cannot tamper with them.
    pub log_dir: PathBuf,
    /// Read-only grants: each `(name, host dir)` is mounted at `/data/<name>`.
    pub data: Vec<(String, PathBuf)>,
    /// The GPU host compute runs the trial's kernels on, numbered among the
    /// sandbox's adapters (see `Compute::gpus`): where the runner placed
    /// the trial. `None` is the first; the CPU backend ignores it.
    pub gpu: Option<usize>,
}

impl Sandbox {
    /// Reads, compiles (or fetches from the cache) and checks a trainable.
    pub fn load(&self, path: &Path) -> Result<Program, LoadError> {
        let bytes = std::fs::read(path).map_err(|source| LoadError::Read {
            path: path.to_owned(),
            source,
        })?;
        self.load_bytes(&bytes)
            .map_err(|error| LoadError::Contract {
                path: path.to_owned(),
                error,
            })
    }

    /// [`Sandbox::load`] for bytes already in memory.
    /// The component is instrumented for host snapshots first; one that
    /// cannot be is loaded as it is, and says why through
    /// [`Program::snapshots`].
    pub fn load_bytes(&self, bytes: &[u8]) -> Result<Program, ContractError> {
        let digest = self.admit(bytes)?;
        let (component, access) = match snapshot::instrument(bytes) {
            Ok(instrumented) => {
                let component = self.compile(&instrumented.bytes)?;
                let access = AccessIndex::resolve(&component, instrumented.layout)
                    .map_err(|e| ContractError::Invalid { detail: e })?;
                (component, Ok(access))
            }
            Err(refusal) => {
                let component = self.compile(bytes)?;
                contract::check_reserved(&self.engine, &component)?;
                (component, Err(refusal))
            }
        };
        let pre = self.check(&component)?;
        let uses_compute = component
            .component_type()
            .imports(&self.engine)
            .any(|(name, _)| runs_host_compute(name));
        Ok(Program {
            pre,
            access,
            digest,
            compute: self.compute.clone(),
            uses_compute,
            _ticker: self.ticker.clone(),
        })
    }

    /// Lists a component's imports and exports and whether it fits the
    /// world. Fails only when the bytes are not a component at all.
    pub fn describe(&self, bytes: &[u8]) -> Result<ComponentDescription, ContractError> {
        self.admit(bytes)?;
        let component = self.compile(bytes)?;
        let fits = self.check(&component).map(drop);
        Ok(ComponentDescription::of(&self.engine, &component, fits))
    }

    /// Compiles `bytes`, through the cache when there is one (keyed by the
    /// bytes actually compiled, so instrumented and plain builds differ).
    /// The checks before any work on `bytes`: that they look like a
    /// component, and that the allowlist (if any) names them. Returns their
    /// blake3 digest.
    fn admit(&self, bytes: &[u8]) -> Result<String, ContractError> {
        contract::check_header(bytes)?;
        let digest = blake3::hash(bytes).to_hex().to_string();
        match &self.allowed_components {
            Some(allowed) if !allowed.contains(&digest) => Err(ContractError::NotAllowed {
                digest,
                allowed: allowed.len(),
            }),
            _ => Ok(digest),
        }
    }

    /// Compilation itself runs where [`CompileOptions`](super::CompileOptions)
    /// say, normally a limited child process.
    fn compile(&self, bytes: &[u8]) -> Result<Component, ContractError> {
        let key = blake3::hash(bytes).to_hex().to_string();
        if let Some(component) = self.cache.as_ref().and_then(|c| c.load(&self.engine, &key)) {
            return Ok(component);
        }
        let artifact = compile::precompile(&self.engine, bytes, &self.compile, self.max_wasm_stack)
            .map_err(|failure| match failure {
                CompileFailure::Invalid(detail) => ContractError::Invalid { detail },
                CompileFailure::Limit(reason) => ContractError::CompileLimit { reason },
                CompileFailure::Worker(detail) => ContractError::Compiler { detail },
            })?;
        // SAFETY: `artifact` was just produced by wasmtime for an engine
        // built from the same `engine_config` (in this process or in our own
        // compile worker), and wasmtime checks its compatibility header.
        let component =
            unsafe { Component::deserialize(&self.engine, &artifact) }.map_err(|e| {
                ContractError::Compiler {
                    detail: format!("loading the compiled artifact: {e:#}"),
                }
            })?;
        if let Some(cache) = &self.cache {
            cache.store(&key, &artifact);
        }
        Ok(component)
    }

    fn check(&self, component: &Component) -> Result<TrainablePre<TrialHost>, ContractError> {
        contract::check_exports(&self.engine, component)?;
        let instance_pre =
            self.linker
                .instantiate_pre(component)
                .map_err(|e| ContractError::Imports {
                    detail: format!("{e:#}"),
                })?;
        TrainablePre::new(instance_pre).map_err(|e| ContractError::ExportType {
            detail: format!("{e:#}"),
        })
    }
}

impl Program {
    /// Creates a fresh instance for one trial: its own store, limits, WASI
    /// view and log files. Fuel and time spent in the component's start
    /// functions count against the trial.
    pub fn instantiate(
        &self,
        env: &TrialEnv,
        limits: &Limits,
    ) -> Result<TrialInstance, TrialFault> {
        let at = At {
            call: Call::Instantiate,
            iteration: None,
        };
        let host_err = |what: &str, e: &dyn fmt::Display| TrialFault::Host {
            at,
            message: format!("{what}: {e}"),
        };
        let sink = |name: &str| CappedSink::new(&env.log_dir.join(name), limits.log_bytes);
        let (stdout, stderr, guest_log) =
            (sink("stdout.log"), sink("stderr.log"), sink("guest.log"));

        let mut wasi = WasiCtxBuilder::new();
        // Nothing is inherited: no environment, no arguments, no stdin, and
        // every socket address is refused.
        wasi.stdout(stdout.clone())
            .stderr(stderr.clone())
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false);
        let random = super::random::RandomMeter::default();
        random.install(&mut wasi);
        wasi.preopened_dir(&env.work_dir, ".", FsPerms::ReadWrite)
            .map_err(|e| {
                host_err(
                    &format!("opening trial directory {}", env.work_dir.display()),
                    &e,
                )
            })?;
        for (name, dir) in &env.data {
            wasi.preopened_dir(dir, format!("/data/{name}"), FsPerms::ReadOnly)
                .map_err(|e| host_err(&format!("opening data directory {}", dir.display()), &e))?;
        }

        let disk = DiskQuota::measure(&env.work_dir, limits).map_err(|e| {
            host_err(
                &format!("measuring trial directory {}", env.work_dir.display()),
                &e,
            )
        })?;
        let mut table = ResourceTable::new();
        table.set_max_capacity(usize::try_from(limits.open_files).unwrap_or(usize::MAX));
        let host = TrialHost {
            wasi: wasi.build(),
            table,
            limiter: TrialLimiter::new(limits),
            guest_log,
            stderr,
            stdout,
            sink: None,
            compute: self.compute.session_on(env.gpu.unwrap_or(0)),
            output_charged: 0,
            call_deadline: None,
            disk,
            random,
        };
        let mut store = Store::new(self.pre.engine(), host);
        store.limiter(|host| &mut host.limiter);
        store.set_hostcall_fuel(usize::try_from(limits.transfer_bytes()).unwrap_or(usize::MAX));
        store.call_hook(super::compute::settle);
        TrialInstance::start(store, &self.pre, self.access.clone(), limits.clone())
    }

    /// Creates a fresh instance for one trial (as [`Program::instantiate`])
    /// and writes the host snapshot `image` into it; the instance continues
    /// where the snapshot was taken, with its iteration and fuel counts.
    pub fn restore(
        &self,
        env: &TrialEnv,
        limits: &Limits,
        image: &GuestImage,
        iterations: u64,
        fuel_total: u64,
    ) -> Result<TrialInstance, SnapshotError> {
        let source = &mut ImageSource::new(image);
        self.restore_from(env, limits, source, iterations, fuel_total)
    }

    /// [`Program::restore`] from any [`SnapshotSource`]: from a
    /// [`crate::snapshot::SnapshotFile`], memory is read from the file a
    /// piece at a time, so the host holds about the guest's memory, not
    /// also the file or a decoded copy of it.
    pub fn restore_from(
        &self,
        env: &TrialEnv,
        limits: &Limits,
        source: &mut dyn SnapshotSource,
        iterations: u64,
        fuel_total: u64,
    ) -> Result<TrialInstance, SnapshotError> {
        self.snapshots().map_err(SnapshotError::Unsupported)?;
        let mut instance = self
            .instantiate(env, limits)
            .map_err(|fault| SnapshotError::Failed(fault.to_string()))?;
        instance.restore_image(source, iterations, fuel_total)?;
        Ok(instance)
    }
}

#[cfg(test)]
mod tests {
    use super::runs_host_compute;

    #[test]
    fn compute_and_burn_imports_run_host_compute() {
        assert!(runs_host_compute("wtune:trainable/compute@0.1.0"));
        assert!(runs_host_compute("wtune:trainable/burn@0.1.0"));
        assert!(!runs_host_compute("wtune:trainable/host@0.1.0"));
        assert!(!runs_host_compute("wasi:filesystem/types@0.2.6"));
    }
}
