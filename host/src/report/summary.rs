//! The text printed when an experiment ends.

use std::fmt::Write;

use serde_json::Value;

use super::terminal::inert;
use crate::tune::{ExperimentSummary, TrialStatus};

/// Outcome, best trial and its config, and every error with its reason.
pub fn summary_text(summary: &ExperimentSummary) -> String {
    let mut out = String::new();
    let total = summary.trials.len();
    let secs = summary.wall_time.as_secs_f64();
    // Two decimals below 10 s, so a short run does not read "0.0 s".
    let places = if secs < 10.0 { 2 } else { 1 };
    let _ = writeln!(
        out,
        "Experiment {} finished in {secs:.places$} s: {total} trial{} ({} TERMINATED, {} ERROR)",
        summary.name,
        if total == 1 { "" } else { "s" },
        summary.count(TrialStatus::Terminated),
        summary.count(TrialStatus::Error),
    );
    let _ = writeln!(out, "Results: {}", summary.output_dir.display());
    if let Some(reason) = &summary.stopped {
        let _ = writeln!(out, "Stopped early: {} (stop_experiment)", inert(reason));
    }
    let recovered: u64 = summary
        .trials
        .iter()
        .map(|t| u64::from(t.num_failures))
        .sum();
    if recovered > 0 {
        let _ = writeln!(
            out,
            "Recovered from {recovered} trial failure{} (max_failures)",
            if recovered == 1 { "" } else { "s" }
        );
    }
    match (summary.best_trial(), &summary.metric) {
        (Some(best), Some(metric)) => {
            let value = best.metric(metric).unwrap_or(f64::NAN);
            let _ = writeln!(
                out,
                "Best trial: {} ({metric} = {value:.4}, mode {}, after {} iterations)",
                best.trial_id, summary.mode, best.iterations
            );
            if let Some(checkpoint) = best.latest_checkpoint() {
                let _ = writeln!(
                    out,
                    "Best trial's newest checkpoint: {}",
                    best.dir.join(&checkpoint.path).display()
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
    let errors: Vec<_> = summary
        .trials
        .iter()
        .filter(|t| t.status == TrialStatus::Error)
        .collect();
    if !errors.is_empty() {
        let _ = writeln!(out, "Errors:");
        for trial in errors {
            let _ = writeln!(
                out,
                "  {}: {}",
                trial.trial_id,
                inert(trial.error.as_deref().unwrap_or("unknown"))
            );
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
