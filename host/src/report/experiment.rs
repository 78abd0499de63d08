//! `experiment.json`: the whole experiment at a glance, rewritten atomically
//! as trials end (at most once a second) and when the run finishes.
//!
//! Mid-run rewrites go to a writer thread: an atomic write ends in fsync,
//! which can stall for hundreds of milliseconds on a busy disk, and the
//! runner's loop must not wait for it. The first and last writes are
//! synchronous so their failures are reported.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};

use crate::persist;
use crate::tune::{Callback, ExperimentSummary, Mode, RunSpec, Trial, TrialStatus};

/// Format version of `experiment.json`; bumped on incompatible changes.
pub const FORMAT_VERSION: u32 = 1;

/// The callback that maintains `<output_dir>/experiment.json`.
pub struct ExperimentFile {
    path: PathBuf,
    name: String,
    metric: Option<String>,
    mode: Mode,
    started: SystemTime,
    last_write: Option<Instant>,
    extra: Value,
    background: Option<persist::LatestWriter>,
}

impl ExperimentFile {
    /// `extra` is stored under `"run"` (e.g. the component's path and hash,
    /// the limits), so the file says how its results were produced.
    pub fn new(extra: Value) -> Self {
        Self {
            path: PathBuf::new(),
            name: String::new(),
            metric: None,
            mode: Mode::Max,
            started: SystemTime::now(),
            last_write: None,
            extra,
            background: None,
        }
    }

    fn document(
        &self,
        status: &str,
        trials: &[Trial],
        best: Option<usize>,
        wall: Option<Duration>,
        summary: Option<&ExperimentSummary>,
    ) -> Vec<u8> {
        let count = |s: TrialStatus| trials.iter().filter(|t| t.status == s).count();
        let best = best.map(|i| {
            let t = &trials[i];
            json!({
                "trial_id": t.trial_id,
                "metric_value": self.metric.as_deref().and_then(|m| t.metric(m)),
                "config": t.config,
            })
        });
        let mut doc = json!({
            "format_version": FORMAT_VERSION,
            "name": self.name,
            "status": status,
            "started": humantime::format_rfc3339_seconds(self.started).to_string(),
            "wall_time_s": wall.map(|d| d.as_secs_f64()),
            "metric": self.metric,
            "mode": self.mode,
            "run": self.extra,
            "counts": {
                "total": trials.len(),
                "pending": count(TrialStatus::Pending),
                "running": count(TrialStatus::Running),
                "paused": count(TrialStatus::Paused),
                "terminated": count(TrialStatus::Terminated),
                "error": count(TrialStatus::Error),
            },
            "best_trial": best,
            "trials": trials,
        });
        // Why the run ended early: `halted` can be resumed, `stopped` met
        // an experiment-level criterion.
        if let Some(summary) = summary {
            if let Some(why) = &summary.halted {
                doc["halted"] = why.as_str().into();
            }
            if let Some(why) = &summary.stopped {
                doc["stopped"] = why.as_str().into();
            }
        }
        persist::json_bytes(&doc)
    }
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), String> {
    persist::write_atomic(path, bytes).map_err(|e| format!("writing {}: {e}", path.display()))
}

impl Callback for ExperimentFile {
    fn on_experiment_start(&mut self, spec: &RunSpec, trials: &[Trial]) -> Result<(), String> {
        persist::create_dir(&spec.output_dir)?;
        self.path = spec.output_dir.join("experiment.json");
        self.name = spec.name.clone();
        self.metric = spec.metric.clone();
        self.mode = spec.mode;
        // Synchronous, so an unwritable output directory stops the run
        // before any trial starts.
        write_file(
            &self.path,
            &self.document("running", trials, None, None, None),
        )?;
        self.last_write = Some(Instant::now());
        let target = self.path.clone();
        let writer =
            persist::LatestWriter::spawn("wtune-experiment-json", move |bytes: &Vec<u8>| {
                write_file(&target, bytes)
            })
            .map_err(|e| format!("starting the wtune-experiment-json writer: {e}"))?;
        self.background = Some(writer);
        Ok(())
    }

    fn on_trial_end(&mut self, trials: &[Trial], _index: usize) -> Result<(), String> {
        // Rewriting a large file on every trial end would make bookkeeping
        // quadratic; once a second keeps it current enough to watch.
        if self
            .last_write
            .is_some_and(|t| t.elapsed() < Duration::from_secs(1))
        {
            return Ok(());
        }
        let bytes = self.document("running", trials, None, None, None);
        if let Some(writer) = &self.background {
            writer.send(bytes);
        }
        self.last_write = Some(Instant::now());
        Ok(())
    }

    fn on_experiment_end(&mut self, summary: &ExperimentSummary) -> Result<(), String> {
        // Queued snapshots land first so none can overwrite the final one.
        if let Some(mut writer) = self.background.take() {
            writer.finish();
        }
        let status = summary.status();
        let bytes = self.document(
            status,
            &summary.trials,
            summary.best,
            Some(summary.wall_time),
            Some(summary),
        );
        write_file(&self.path, &bytes)
    }
}
