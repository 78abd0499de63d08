//! `experiment.json`: the whole experiment at a glance, rewritten atomically
//! as trials end (at most once a second) and when the run finishes.

use std::path::PathBuf;
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
        }
    }

    fn write(
        &mut self,
        status: &str,
        trials: &[Trial],
        best: Option<usize>,
        wall: Option<Duration>,
    ) -> Result<(), String> {
        let count = |s: TrialStatus| trials.iter().filter(|t| t.status == s).count();
        let best = best.map(|i| {
            let t = &trials[i];
            json!({
                "trial_id": t.trial_id,
                "metric_value": self.metric.as_deref().and_then(|m| t.metric(m)),
                "config": t.config,
            })
        });
        let doc = json!({
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
                "terminated": count(TrialStatus::Terminated),
                "error": count(TrialStatus::Error),
            },
            "best_trial": best,
            "trials": trials,
        });
        persist::write_json_atomic(&self.path, &doc)
            .map_err(|e| format!("writing {}: {e}", self.path.display()))?;
        self.last_write = Some(Instant::now());
        Ok(())
    }
}

impl Callback for ExperimentFile {
    fn on_experiment_start(&mut self, spec: &RunSpec, trials: &[Trial]) -> Result<(), String> {
        persist::create_dir(&spec.output_dir)?;
        self.path = spec.output_dir.join("experiment.json");
        self.name = spec.name.clone();
        self.metric = spec.metric.clone();
        self.mode = spec.mode;
        self.write("running", trials, None, None)
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
        if let Err(message) = self.write("running", trials, None, None) {
            // Not the trial's fault; the final write will report it.
            tracing::warn!("{message}");
        }
        Ok(())
    }

    fn on_experiment_end(&mut self, summary: &ExperimentSummary) -> Result<(), String> {
        self.write(
            "finished",
            &summary.trials,
            summary.best,
            Some(summary.wall_time),
        )
    }
}
