//! The text printed when an experiment ends.

use std::fmt::Write;
use std::path::PathBuf;

use serde::Deserialize;
use serde_json::Value;

use super::terminal::inert;
use crate::tune::{ExperimentSummary, Mode, TrialStatus};

/// An ended experiment as its closing text tells it: what `wtune run`
/// prints, and what `python -m wtune.ray run` prints for a Ray result grid
/// (which it hands over as JSON in this shape).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Outcome {
    /// The experiment's name.
    pub name: String,
    /// Where its results are.
    pub output_dir: PathBuf,
    /// Wall-clock seconds the run took.
    pub wall_time_s: f64,
    /// The ranking metric; trials are not ranked without one.
    #[serde(default)]
    pub metric: Option<String>,
    /// Its mode.
    #[serde(default)]
    pub mode: Mode,
    /// Why `stop_experiment` ended the run early, if it did.
    #[serde(default)]
    pub stopped: Option<String>,
    /// Every trial, in order.
    pub trials: Vec<TrialOutcome>,
}

/// One trial of an [`Outcome`].
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrialOutcome {
    /// Its id.
    pub trial_id: String,
    /// How it ended (or where it stands, in a run that halted).
    pub status: TrialStatus,
    /// Its configuration.
    pub config: Value,
    /// Iterations it completed.
    pub iterations: u64,
    /// The last value of the ranking metric it reported.
    #[serde(default)]
    pub value: Option<f64>,
    /// Its newest checkpoint.
    #[serde(default)]
    pub checkpoint: Option<PathBuf>,
    /// Why it ended in ERROR.
    #[serde(default)]
    pub error: Option<String>,
    /// Failures it recovered from (`max_failures`).
    #[serde(default)]
    pub failures: u64,
}

impl Outcome {
    /// The outcome of a run of wtune's own runner.
    pub fn of(summary: &ExperimentSummary) -> Self {
        let trials = summary
            .trials
            .iter()
            .map(|trial| TrialOutcome {
                trial_id: trial.trial_id.clone(),
                status: trial.status,
                config: trial.config.clone(),
                iterations: trial.iterations,
                value: summary.metric.as_deref().and_then(|m| trial.metric(m)),
                checkpoint: trial
                    .latest_checkpoint()
                    .map(|checkpoint| trial.dir.join(&checkpoint.path)),
                error: trial.error.clone(),
                failures: u64::from(trial.num_failures),
            })
            .collect();
        Outcome {
            name: summary.name.clone(),
            output_dir: summary.output_dir.clone(),
            wall_time_s: summary.wall_time.as_secs_f64(),
            metric: summary.metric.clone(),
            mode: summary.mode,
            stopped: summary.stopped.clone(),
            trials,
        }
    }
}

/// Outcome, best trial and its config, and every error with its reason.
pub fn summary_text(summary: &ExperimentSummary) -> String {
    outcome_text(&Outcome::of(summary))
}

/// [`summary_text`] for any [`Outcome`]. The best trial is the one whose
/// last value is best (finite values only; the first of equals). Text the
/// guest wrote (errors, `stop_experiment` reasons) is made inert.
pub fn outcome_text(outcome: &Outcome) -> String {
    let mut out = String::new();
    let total = outcome.trials.len();
    let count = |status| outcome.trials.iter().filter(|t| t.status == status).count();
    let errors: Vec<_> = outcome
        .trials
        .iter()
        .filter(|t| t.status == TrialStatus::Error)
        .collect();
    let secs = outcome.wall_time_s;
    // Two decimals below 10 s, so a short run does not read "0.0 s".
    let places = if secs < 10.0 { 2 } else { 1 };
    let _ = writeln!(
        out,
        "Experiment {} finished in {secs:.places$} s: {total} trial{} ({} TERMINATED, {} ERROR)",
        outcome.name,
        if total == 1 { "" } else { "s" },
        count(TrialStatus::Terminated),
        errors.len(),
    );
    let _ = writeln!(out, "Results: {}", outcome.output_dir.display());
    if let Some(reason) = &outcome.stopped {
        let _ = writeln!(out, "Stopped early: {} (stop_experiment)", inert(reason));
    }
    let recovered: u64 = outcome.trials.iter().map(|t| t.failures).sum();
    if recovered > 0 {
        let _ = writeln!(
            out,
            "Recovered from {recovered} trial failure{} (max_failures)",
            if recovered == 1 { "" } else { "s" }
        );
    }
    let best = outcome
        .mode
        .best_index(outcome.trials.iter().map(|t| t.value));
    match (best.map(|i| &outcome.trials[i]), &outcome.metric) {
        (Some(best), Some(metric)) => {
            let value = best.value.unwrap_or(f64::NAN);
            let _ = writeln!(
                out,
                "Best trial: {} ({metric} = {}, mode {}, after {} iterations)",
                best.trial_id,
                crate::units::metric_text(value),
                outcome.mode,
                best.iterations
            );
            if let Some(checkpoint) = &best.checkpoint {
                let _ = writeln!(
                    out,
                    "Best trial's newest checkpoint: {}",
                    checkpoint.display()
                );
            }
            let _ = writeln!(out, "Best config:");
            let mut lines = Vec::new();
            config_lines("", &best.config, &mut lines);
            for line in lines {
                let _ = writeln!(out, "  {line}");
            }
        }
        (None, Some(metric)) => {
            let _ = writeln!(out, "Best trial: none (no trial reported `{metric}`)");
        }
        (_, None) => {
            let _ = writeln!(
                out,
                "Best trial: not ranked (set `metric` and `mode` to rank trials)"
            );
        }
    }
    if !errors.is_empty() {
        let _ = writeln!(out, "Errors:");
        for trial in errors {
            let reason = trial.error.as_deref().unwrap_or("unknown");
            let _ = writeln!(out, "  {}: {}", trial.trial_id, inert(reason));
        }
    }
    out
}

/// `lr = 0.05`, `optimizer.beta = 0.9`, one per leaf.
pub(crate) fn config_lines(prefix: &str, value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (key, v) in map {
                let name = if prefix.is_empty() {
                    key.clone()
                } else {
                    format!("{prefix}.{key}")
                };
                config_lines(&name, v, out);
            }
        }
        Value::Object(_) if prefix.is_empty() => {}
        other => out.push(format!("{prefix} = {other}")),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn an_outcome_from_elsewhere_is_ranked_and_its_guest_text_made_inert() {
        // As `python -m wtune.ray run` hands over a Ray result grid.
        let outcome: Outcome = serde_json::from_value(json!({
            "name": "grid",
            "output_dir": "/runs/grid",
            "wall_time_s": 12.345,
            "metric": "loss",
            "mode": "min",
            "trials": [
                {"trial_id": "a", "status": "TERMINATED", "config": {"lr": 0.1},
                 "iterations": 3, "value": 0.5},
                {"trial_id": "b", "status": "TERMINATED",
                 "config": {"lr": 0.2, "opt": {"beta": 0.9}}, "iterations": 3, "value": 0.25,
                 "checkpoint": "/runs/grid/b/checkpoint_000003"},
                {"trial_id": "c", "status": "TERMINATED", "config": {"lr": 0.3},
                 "iterations": 1, "value": null},
                {"trial_id": "d", "status": "ERROR", "config": {"lr": 0.4}, "iterations": 1,
                 "error": "boom\u{1b}[2J\r\nBest trial: forged", "failures": 1},
            ],
        }))
        .unwrap();
        assert_eq!(
            outcome_text(&outcome),
            "Experiment grid finished in 12.3 s: 4 trials (3 TERMINATED, 1 ERROR)\n\
             Results: /runs/grid\n\
             Recovered from 1 trial failure (max_failures)\n\
             Best trial: b (loss = 0.2500, mode min, after 3 iterations)\n\
             Best trial's newest checkpoint: /runs/grid/b/checkpoint_000003\n\
             Best config:\n  lr = 0.2\n  opt.beta = 0.9\n\
             Errors:\n  d: boom\\u{1b}[2J\\r\\nBest trial: forged\n"
        );
        let misspelt = json!({"name": "x", "output_dir": "/x", "wall_time_s": 1.0, "trails": []});
        let refused = serde_json::from_value::<Outcome>(misspelt).unwrap_err();
        assert!(
            refused.to_string().contains("unknown field `trails`"),
            "{refused}"
        );
    }
}
