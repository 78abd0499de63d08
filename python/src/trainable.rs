//! [`Trainable`]: one sandboxed trial driven from Python.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use serde_json::{Map, Value};
use wtune::compute::GpuChoice;
use wtune::config::{self, Overrides, Plan};
use wtune::snapshot::SnapshotKey;
use wtune::tune::{CheckpointInfo, Resources, TrialLaunch, TrialSession};
use wtune::wasm_backend::{WasmBackend, WasmSession};

use crate::errors;
use crate::sandboxes::{self, Failure, Source};

/// One trial of a WebAssembly trainable in wtune's sandbox: its own
/// instance, fuel, memory and deadlines, and a filesystem of its own
/// directory plus read-only data. `train()` runs one iteration.
///
/// Built by `wtune.Trainable`, which turns keyword arguments into the
/// `experiment` object (the experiment file's keys) this takes as JSON.
#[pyclass(module = "wtune._native", frozen)]
pub struct Trainable {
    backend: WasmBackend,
    /// The GPU of host compute's the trial runs on; the first when `None`.
    gpu: Option<usize>,
    /// Where the instance's files go: a reused Ray actor moves on to the
    /// next trial's directory ([`Trainable::restart`]). Apart from the
    /// state, whose lock a call holds throughout, so that reading it does
    /// not wait for a `train()`.
    placed: Mutex<Placed>,
    state: Mutex<State>,
}

/// The trial's [`Place`], and the directory made for it when it was given
/// none (held so that it goes with the trial).
struct Placed {
    place: Place,
    scratch: Option<tempfile::TempDir>,
}

struct State {
    instance: Instance,
    config: Value,
    time_total_s: f64,
    last_result: Option<Map<String, Value>>,
}

/// Where the trial's instance stands.
enum Instance {
    /// Not started: the guest's `setup()` runs with the state's config at
    /// the first call that needs an instance, unless a restore comes first
    /// (a Ray trial recovered on another node starts from its checkpoint
    /// and never pays for a setup it would throw away).
    Deferred,
    Live(Box<WasmSession>),
    /// After `close()`: only a restore brings an instance back.
    Closed,
}

impl Instance {
    fn session(&self) -> Option<&WasmSession> {
        match self {
            Instance::Live(session) => Some(session),
            Instance::Deferred | Instance::Closed => None,
        }
    }

    /// Moves on to `next`, letting a live instance it replaces clean up.
    fn set(&mut self, next: Instance) {
        if let Instance::Live(old) = std::mem::replace(self, next) {
            // A failing cleanup of the old instance changes nothing about
            // the new one.
            let _ = old.close();
        }
    }
}

/// The trial an instance belongs to: the id its checkpoints carry, and
/// the directory of its files (its guest's directory is `trial_dir/work`).
#[derive(Clone)]
struct Place {
    trial_id: String,
    trial_dir: PathBuf,
}

/// A checkpoint opened for a restore: its trial continues with `config`.
struct Resumed {
    session: WasmSession,
    config: Value,
    time_total_s: f64,
    last_result: Option<Map<String, Value>>,
}

/// What one `train()` produced, copied out of the lock before Python sees
/// it.
struct Report {
    metrics: Vec<(String, f64)>,
    done: bool,
    iteration: u64,
    fuel_this_iter: u64,
    fuel_total: u64,
    time_this_iter_s: f64,
    time_total_s: f64,
}

fn config_error(message: impl Into<String>) -> PyErr {
    errors::ConfigError::new_err(message.into())
}

fn parse_json(text: &str, what: &str) -> PyResult<Value> {
    serde_json::from_str(text).map_err(|e| config_error(format!("{what}: {e}")))
}

/// A trial's configuration: a JSON object.
fn parse_config(text: &str) -> PyResult<Value> {
    let config = parse_json(text, "config")?;
    if !config.is_object() {
        return Err(config_error(format!(
            "config must be a dict of hyperparameters, got {config}"
        )));
    }
    Ok(config)
}

impl Trainable {
    /// Runs `f` on the trial's state, with wasmtime's trap handlers in
    /// place (see `wtune::sandbox::reinstate_trap_handlers`: Ray and
    /// `faulthandler` replace them in a shared process).
    fn locked<T>(&self, f: impl FnOnce(&mut State) -> Result<T, PyErr>) -> PyResult<T> {
        wtune::sandbox::reinstate_trap_handlers();
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut state)
    }

    /// Where the trial's files go now.
    fn place(&self) -> Place {
        let placed = self.placed.lock().unwrap_or_else(PoisonError::into_inner);
        placed.place.clone()
    }

    fn state_mut(&mut self) -> &mut State {
        self.state.get_mut().unwrap_or_else(PoisonError::into_inner)
    }

    fn trial_launch(&self, place: &Place, config: &Value) -> TrialLaunch {
        TrialLaunch {
            trial_id: place.trial_id.clone(),
            config: config.clone(),
            trial_dir: place.trial_dir.clone(),
            restore: None,
            resources: Resources::default(),
            gpus: self.gpu.into_iter().collect(),
        }
    }

    /// A fresh instance set up with `config`, its files in `place`.
    fn launch(&self, place: &Place, config: &Value) -> PyResult<WasmSession> {
        wtune::sandbox::reinstate_trap_handlers();
        self.backend
            .start_trial(&self.trial_launch(place, config))
            .map_err(|e| errors::wasm(&e))
    }

    /// An instance continued from the checkpoint at `path`, with
    /// `config` or, when `None`, the checkpoint's own configuration.
    /// The file is opened and verified once; the instance's files go in
    /// `place`.
    fn resume(&self, place: &Place, path: &Path, config: Option<Value>) -> PyResult<Resumed> {
        let file = self
            .backend
            .open_checkpoint(path)
            .map_err(errors::CheckpointError::new_err)?;
        let mut meta = file.meta().clone();
        let last_result = meta.take_result();
        let config = config.unwrap_or(meta.config);
        wtune::sandbox::reinstate_trap_handlers();
        let session = self
            .backend
            .resume_trial(&self.trial_launch(place, &config), path, file)
            .map_err(|e| errors::wasm(&e))?;
        Ok(Resumed {
            session,
            config,
            time_total_s: meta.time_total_s,
            last_result,
        })
    }

    /// The live instance, set up now if it was deferred. A setup that
    /// fails leaves it deferred: nothing changed.
    fn live<'s>(&self, state: &'s mut State) -> PyResult<&'s mut WasmSession> {
        if let Instance::Deferred = state.instance {
            let session = self.launch(&self.place(), &state.config)?;
            state.instance = Instance::Live(Box::new(session));
        }
        match &mut state.instance {
            Instance::Live(session) => Ok(session),
            Instance::Deferred | Instance::Closed => Err(errors::WtuneError::new_err(
                "this trainable was closed; restore a checkpoint to go on",
            )),
        }
    }
}

impl State {
    fn resumed(&mut self, resumed: Resumed) {
        self.instance.set(Instance::Live(Box::new(resumed.session)));
        self.config = resumed.config;
        self.time_total_s = resumed.time_total_s;
        self.last_result = resumed.last_result;
    }
}

/// The plan for one trial: the experiment's keys checked as `wtune run`
/// checks them.
fn plan(model: &Path, experiment: &Value, base: &Path) -> PyResult<Plan> {
    config::plan_value(model, experiment, "experiment", base, &Overrides::default())
        .map_err(|e| config_error(e.to_string()))
}

#[pymethods]
impl Trainable {
    /// `wasm_path` or `wasm_bytes`: the component. `config_json`: the
    /// trial's configuration (a JSON object; `{}` when `None`, or the
    /// checkpoint's own with `restore`). `experiment_json`: the experiment
    /// file's keys that apply to one trial (`limits`, `data`, `compute`,
    /// `checkpoint`, `security`, `snapshot_key_file`), relative paths from
    /// `base_dir`. `trial_dir`: where the trial's files go (its guest
    /// directory is `trial_dir/work`); a temporary directory when `None`.
    /// `restore`: a checkpoint file to start from. `deferred`: compile
    /// now, but run the guest's `setup()` only when an instance is first
    /// needed, so that a restore that comes first skips it. `gpu`: the GPU
    /// host compute runs the trial's kernels on, by number (`"1"`) or PCI
    /// address (`"0000:19:00.0"`); the first when `None`, and unused by a
    /// component that does not import host compute.
    #[new]
    #[pyo3(signature = (wasm_path, wasm_bytes, config_json, experiment_json, base_dir, trial_dir=None, trial_id=None, restore=None, deferred=false, gpu=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        wasm_path: Option<PathBuf>,
        wasm_bytes: Option<Bound<'_, PyBytes>>,
        config_json: Option<&str>,
        experiment_json: &str,
        base_dir: PathBuf,
        trial_dir: Option<PathBuf>,
        trial_id: Option<String>,
        restore: Option<PathBuf>,
        deferred: bool,
        gpu: Option<&str>,
    ) -> PyResult<Self> {
        let gpu = gpu
            .map(|text| {
                text.parse::<GpuChoice>()
                    .map_err(|e| config_error(format!("gpu: {e}")))
            })
            .transpose()?;
        let config = match config_json {
            Some(text) => Some(parse_config(text)?),
            None => None,
        };
        let experiment = parse_json(experiment_json, "experiment")?;
        let model = wasm_path.clone().unwrap_or_else(|| "component.wasm".into());
        let plan = plan(&model, &experiment, &base_dir)?;
        let key = plan
            .snapshot_key_file
            .as_deref()
            .map(SnapshotKey::from_file)
            .transpose()
            .map_err(config_error)?;
        let bytes = wasm_bytes.map(|b| b.as_bytes().to_vec());
        let program = py
            .detach(|| match (&wasm_path, &bytes) {
                (_, Some(bytes)) => sandboxes::load(&plan, Source::Bytes(bytes)),
                (Some(path), None) => sandboxes::load(&plan, Source::Path(path)),
                (None, None) => Err(Failure::Component(
                    "give the component as a path or as bytes".into(),
                )),
            })
            .map_err(|failure| match failure {
                Failure::Component(why) => errors::ComponentError::new_err(why),
                Failure::Host(why) => errors::WtuneError::new_err(why),
            })?;
        let gpu = match gpu {
            Some(choice) if program.uses_compute() => Some(
                program
                    .compute_gpu(&choice)
                    .map_err(|e| config_error(format!("gpu: {e}")))?,
            ),
            _ => None,
        };
        let mut backend =
            WasmBackend::new(program, plan.limits.clone(), plan.data.clone()).snapshot_key(key);
        if let Some(mode) = plan.checkpoint_mode {
            backend = backend.checkpoint_mode(mode).map_err(config_error)?;
        }
        let (trial_dir, scratch) = match trial_dir {
            Some(dir) => (dir, None),
            None => {
                let scratch = tempfile::Builder::new()
                    .prefix("wtune-trial-")
                    .tempdir()
                    .map_err(|e| errors::WtuneError::new_err(format!("trial directory: {e}")))?;
                (scratch.path().to_path_buf(), Some(scratch))
            }
        };
        let place = Place {
            trial_id: trial_id.unwrap_or_else(|| "trial".into()),
            trial_dir,
        };
        let mut trainable = Self {
            backend,
            gpu,
            placed: Mutex::new(Placed {
                place: place.clone(),
                scratch,
            }),
            state: Mutex::new(State {
                instance: Instance::Deferred,
                config: Value::Object(Map::new()),
                time_total_s: 0.0,
                last_result: None,
            }),
        };
        match restore {
            Some(path) => {
                let resumed = py.detach(|| trainable.resume(&place, &path, config))?;
                trainable.state_mut().resumed(resumed);
            }
            None => {
                let config = config.unwrap_or_else(|| Value::Object(Map::new()));
                if !deferred {
                    let session = py.detach(|| trainable.launch(&place, &config))?;
                    trainable.state_mut().instance = Instance::Live(Box::new(session));
                }
                trainable.state_mut().config = config;
            }
        }
        Ok(trainable)
    }

    /// Runs one training iteration and returns its report: the guest's
    /// metrics plus `training_iteration`, `done`, `fuel_this_iter`,
    /// `fuel_total`, `time_this_iter_s` and `time_total_s`.
    fn train<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let report = py.detach(|| {
            self.locked(|state| {
                let session = self.live(state)?;
                let started = Instant::now();
                let step = session.step().map_err(|e| errors::wasm(&e))?;
                wtune::tune::check_metric_names(&step.metrics).map_err(|why| {
                    errors::BadOutput::new_err(format!(
                        "train() at iteration {} returned a bad result: {why}",
                        session.iteration()
                    ))
                })?;
                let time_this_iter_s = started.elapsed().as_secs_f64();
                let report = Report {
                    metrics: step.metrics,
                    done: step.done,
                    iteration: session.iteration(),
                    fuel_this_iter: step.fuel,
                    fuel_total: session.fuel_total(),
                    time_this_iter_s,
                    time_total_s: state.time_total_s + time_this_iter_s,
                };
                state.time_total_s = report.time_total_s;
                let mut result: Map<String, Value> = report
                    .metrics
                    .iter()
                    .map(|(k, v)| (k.clone(), Value::from(*v)))
                    .collect();
                result.insert("training_iteration".into(), report.iteration.into());
                state.last_result = Some(result);
                Ok(report)
            })
        })?;
        let dict = PyDict::new(py);
        for (name, value) in &report.metrics {
            dict.set_item(name, value)?;
        }
        dict.set_item("training_iteration", report.iteration)?;
        dict.set_item("done", report.done)?;
        dict.set_item("fuel_this_iter", report.fuel_this_iter)?;
        dict.set_item("fuel_total", report.fuel_total)?;
        dict.set_item("time_this_iter_s", report.time_this_iter_s)?;
        dict.set_item("time_total_s", report.time_total_s)?;
        Ok(dict)
    }

    /// Writes a checkpoint (a host snapshot of the guest's memory, or the
    /// guest's own `save()` with `checkpoint = "guest"`) to `path`
    /// atomically; returns its size in bytes.
    fn save_to(&self, py: Python<'_>, path: PathBuf) -> PyResult<u64> {
        py.detach(|| {
            self.locked(|state| {
                let config = state.config.clone();
                let time_total_s = state.time_total_s;
                let result = state.last_result.clone();
                let trial_id = self.place().trial_id;
                let session = self.live(state)?;
                let info = CheckpointInfo {
                    trial_id: &trial_id,
                    config: &config,
                    iteration: session.iteration(),
                    time_total_s,
                    result: result.as_ref(),
                };
                session
                    .checkpoint(&path, &info)
                    .map_err(|e| errors::wasm(&e))
            })
        })
    }

    /// Continues from the checkpoint at `path` (written by `save_to` for
    /// this component). A checkpoint of another configuration (a PBT
    /// exploit) continues with `config_json` when given, else with the
    /// checkpoint's own. The current instance is replaced only once the
    /// restored one is running.
    #[pyo3(signature = (path, config_json=None))]
    fn restore_from(
        &self,
        py: Python<'_>,
        path: PathBuf,
        config_json: Option<&str>,
    ) -> PyResult<()> {
        let config = config_json.map(parse_config).transpose()?;
        py.detach(|| {
            let resumed = self.resume(&self.place(), &path, config)?;
            self.locked(|state| {
                state.resumed(resumed);
                Ok(())
            })
        })
    }

    /// Starts over: a fresh instance of the same compiled component, set
    /// up with `config_json` (a new trial on a reused Ray actor). The
    /// current instance is replaced only once the new one is set up; with
    /// `deferred`, it is closed now and the new one is set up when first
    /// needed (a restore that comes first skips the setup). `trial_dir` and
    /// `trial_id`, when given, are the new trial's: its files go there,
    /// not among the old trial's (whose guest files the new guest must not
    /// see, nor count against its disk quota); by default they stay.
    #[pyo3(signature = (config_json, deferred=false, trial_dir=None, trial_id=None))]
    fn restart(
        &self,
        py: Python<'_>,
        config_json: &str,
        deferred: bool,
        trial_dir: Option<PathBuf>,
        trial_id: Option<String>,
    ) -> PyResult<()> {
        let config = parse_config(config_json)?;
        py.detach(|| {
            let mut place = self.place();
            let moved = trial_dir.is_some();
            if let Some(dir) = trial_dir {
                place.trial_dir = dir;
            }
            if let Some(id) = trial_id {
                place.trial_id = id;
            }
            let next = if deferred {
                Instance::Deferred
            } else {
                Instance::Live(Box::new(self.launch(&place, &config)?))
            };
            self.locked(|state| {
                state.instance.set(next);
                let mut placed = self.placed.lock().unwrap_or_else(PoisonError::into_inner);
                // The old trial's scratch directory goes with it, unless the
                // new trial's files go inside it.
                let inside =
                    |scratch: &tempfile::TempDir| place.trial_dir.starts_with(scratch.path());
                if moved && !placed.scratch.as_ref().is_some_and(inside) {
                    placed.scratch = None;
                }
                placed.place = place;
                state.config = config;
                state.time_total_s = 0.0;
                state.last_result = None;
                Ok(())
            })
        })
    }

    /// Switches the live trial to `config_json` in place with the guest's
    /// `reset()`, keeping what it learned. Returns `False` when the
    /// trainable does not implement reset (nothing changed then).
    fn reset(&self, py: Python<'_>, config_json: &str) -> PyResult<bool> {
        let config = parse_config(config_json)?;
        py.detach(|| {
            self.locked(|state| {
                let session = self.live(state)?;
                let done = session.reset(&config).map_err(|e| errors::wasm(&e))?;
                if done {
                    state.config = config;
                }
                Ok(done)
            })
        })
    }

    /// Lets the trainable release its resources (`cleanup()`); the
    /// trainable can only be restored after. Closing twice is harmless.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| {
            self.locked(
                |state| match std::mem::replace(&mut state.instance, Instance::Closed) {
                    Instance::Live(session) => session.close().map_err(|e| errors::wasm(&e)),
                    Instance::Deferred | Instance::Closed => Ok(()),
                },
            )
        })
    }

    /// Completed training iterations (a restored trial counts the
    /// checkpoint's). Like every read of the trial's state, it waits for a
    /// call in progress on another thread, without the GIL.
    #[getter]
    fn iteration(&self, py: Python<'_>) -> PyResult<u64> {
        py.detach(|| self.locked(|state| Ok(state.instance.session().map_or(0, |s| s.iteration()))))
    }

    /// Fuel burned so far, start-up and restored checkpoint included.
    #[getter]
    fn fuel_total(&self, py: Python<'_>) -> PyResult<u64> {
        py.detach(|| {
            self.locked(|state| Ok(state.instance.session().map_or(0, |s| s.fuel_total())))
        })
    }

    /// The configuration the trial runs with, as JSON.
    #[getter]
    fn config_json(&self, py: Python<'_>) -> PyResult<String> {
        py.detach(|| self.locked(|state| Ok(state.config.to_string())))
    }

    /// The blake3 digest of the component (as `security.allowed_components`
    /// names it).
    #[getter]
    fn digest(&self) -> String {
        self.backend.program().digest().to_string()
    }

    /// How checkpoints are taken: `"snapshot"` or `"guest"`.
    #[getter]
    fn checkpoint_mode(&self) -> String {
        self.backend.mode().to_string()
    }

    /// The number of the GPU host compute runs the trial's kernels on, among
    /// its GPUs; `None` for the first, or where the component does not use
    /// host compute.
    #[getter]
    fn gpu(&self) -> Option<usize> {
        self.gpu
    }

    /// The trial's directory: `stdout.log`, `stderr.log` and `guest.log`
    /// here, the guest's own files under `work/`.
    #[getter]
    fn trial_dir(&self) -> PathBuf {
        self.place().trial_dir
    }
}
