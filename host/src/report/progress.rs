//! Live progress: on a terminal, a trial table redrawn in place; otherwise
//! (CI logs, pipes) one plain line per finished trial plus a periodic status
//! line. Written to stderr so stdout carries only the final summary.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use serde_json::{Map, Value};

use super::summary::config_lines;
use super::terminal::inert;
use crate::tune::{Callback, ExperimentSummary, Mode, RunSpec, Trial, TrialStatus};

/// Most trial rows the terminal table shows; the rest are counted.
const MAX_ROWS: usize = 20;
const REDRAW_EVERY: Duration = Duration::from_millis(250);
const PLAIN_STATUS_EVERY: Duration = Duration::from_secs(10);

/// The progress callback.
pub struct Progress {
    terminal: bool,
    metric: Option<String>,
    mode: Mode,
    drawn_lines: usize,
    last_draw: Option<Instant>,
    started: Instant,
    max_failures: Option<u32>,
    /// How many trials the search will create, when known.
    total: Option<u64>,
}

impl Progress {
    /// Table on a terminal, plain lines otherwise.
    pub fn new() -> Self {
        Self::with_terminal(std::io::stderr().is_terminal())
    }

    /// Forces the terminal or plain style.
    pub fn with_terminal(terminal: bool) -> Self {
        Self {
            terminal,
            metric: None,
            mode: Mode::Max,
            drawn_lines: 0,
            last_draw: None,
            started: Instant::now(),
            max_failures: Some(0),
            total: None,
        }
    }

    /// How many trials the experiment will have in all (trials are created
    /// as the search goes, so the list seen so far may be shorter).
    pub fn total(mut self, total: Option<u64>) -> Self {
        self.total = total;
        self
    }

    /// `12 trials`, or `12/40 trials` while more are to come.
    fn trial_count(&self, created: usize) -> String {
        match self.total {
            Some(total) if total > created as u64 => format!("{created}/{total} trials"),
            _ => format!("{created} trials"),
        }
    }

    fn due(&self, every: Duration) -> bool {
        self.last_draw.is_none_or(|t| t.elapsed() >= every)
    }

    fn status_line(&self, trials: &[Trial]) -> String {
        let count = |s: TrialStatus| trials.iter().filter(|t| t.status == s).count();
        let mut line = format!(
            "[{:>6.1}s] {}: {} RUNNING, {} PENDING, {} TERMINATED, {} ERROR",
            self.started.elapsed().as_secs_f64(),
            self.trial_count(trials.len()),
            count(TrialStatus::Running),
            count(TrialStatus::Pending),
            count(TrialStatus::Terminated),
            count(TrialStatus::Error)
        );
        if count(TrialStatus::Paused) > 0 {
            line.push_str(&format!(", {} PAUSED", count(TrialStatus::Paused)));
        }
        if let Some(metric) = &self.metric {
            let best = trials
                .iter()
                .filter_map(|t| t.metric(metric))
                .filter(|v| v.is_finite())
                .reduce(|a, b| if self.mode.better(b, a) { b } else { a });
            if let Some(best) = best {
                line.push_str(&format!(
                    " | best {metric} so far {} ({})",
                    crate::units::metric_text(best),
                    self.mode
                ));
            }
        }
        line
    }

    fn draw(&mut self, trials: &[Trial], force: bool) {
        if !force && !self.due(REDRAW_EVERY) {
            return;
        }
        let mut text = String::new();
        if self.drawn_lines > 0 {
            text.push_str(&format!("\x1b[{}A\x1b[J", self.drawn_lines));
        }
        let table = self.table(trials);
        self.drawn_lines = table.lines().count();
        text.push_str(&table);
        let mut err = std::io::stderr().lock();
        let _ = err.write_all(text.as_bytes());
        let _ = err.flush();
        self.last_draw = Some(Instant::now());
    }

    fn table(&self, trials: &[Trial]) -> String {
        let metric = self.metric.as_deref();
        // Running trials first, then the most recently relevant others.
        let mut shown: Vec<&Trial> = trials
            .iter()
            .filter(|t| t.status == TrialStatus::Running)
            .collect();
        shown.extend(trials.iter().filter(|t| t.status != TrialStatus::Running));
        shown.truncate(MAX_ROWS);
        shown.sort_by(|a, b| a.trial_id.cmp(&b.trial_id));
        let mut rows = vec![vec![
            "trial".to_string(),
            "status".to_string(),
            "iter".to_string(),
            metric.unwrap_or("-").to_string(),
            "time (s)".to_string(),
            "fuel".to_string(),
            "config".to_string(),
        ]];
        for t in &shown {
            let mut config = Vec::new();
            config_lines("", &t.config, &mut config);
            let mut config = config.join(", ").replace(" = ", "=");
            if config.len() > 60 {
                config.truncate(config.floor_char_boundary(57));
                config.push_str("...");
            }
            let status = match t.num_failures {
                0 => t.status.to_string(),
                1 => format!("{} (1 failure)", t.status),
                n => format!("{} ({n} failures)", t.status),
            };
            rows.push(vec![
                t.trial_id.clone(),
                status,
                t.iterations.to_string(),
                metric
                    .and_then(|m| t.metric(m))
                    .map_or("-".into(), crate::units::metric_text),
                format!("{:.1}", t.time_total_s),
                crate::sandbox::fuel_text(t.fuel_total),
                config,
            ]);
        }
        let widths: Vec<usize> = (0..rows[0].len())
            .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
            .collect();
        let mut out = self.status_line(trials);
        out.push('\n');
        for row in rows {
            let cells: Vec<String> = row
                .iter()
                .zip(&widths)
                .map(|(cell, w)| format!("{cell:<w$}"))
                .collect();
            out.push_str(cells.join("  ").trim_end());
            out.push('\n');
        }
        if trials.len() > shown.len() {
            out.push_str(&format!(
                "... and {} more trials\n",
                trials.len() - shown.len()
            ));
        }
        out
    }

    fn plain(&mut self, line: &str) {
        let mut err = std::io::stderr().lock();
        let _ = writeln!(err, "{line}");
    }

    /// A line that must be seen even under the terminal table: the table is
    /// cleared, the line printed, the table drawn again below it.
    fn event(&mut self, line: &str, trials: &[Trial]) {
        if self.terminal && self.drawn_lines > 0 {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\x1b[{}A\x1b[J", self.drawn_lines);
            self.drawn_lines = 0;
        }
        self.plain(line);
        if self.terminal {
            self.draw(trials, true);
        }
    }
}

impl Default for Progress {
    fn default() -> Self {
        Self::new()
    }
}

impl Callback for Progress {
    fn on_experiment_start(&mut self, spec: &RunSpec, trials: &[Trial]) -> Result<(), String> {
        self.metric = spec.metric.clone();
        self.mode = spec.mode;
        self.max_failures = spec.failure.max_failures;
        self.started = Instant::now();
        let trials = match self.total {
            Some(total) => format!("{} trials", total.max(trials.len() as u64)),
            None => "trials created as the search goes".to_string(),
        };
        let line = format!(
            "Experiment {}: {trials}, up to {} at a time, results in {}",
            spec.name,
            spec.concurrency(),
            spec.output_dir.display()
        );
        self.plain(&line);
        Ok(())
    }

    fn on_result(
        &mut self,
        trials: &[Trial],
        _index: usize,
        _result: &Map<String, Value>,
    ) -> Result<(), String> {
        if self.terminal {
            self.draw(trials, false);
        } else if self.due(PLAIN_STATUS_EVERY) {
            let line = self.status_line(trials);
            self.plain(&line);
            self.last_draw = Some(Instant::now());
        }
        Ok(())
    }

    fn on_trial_end(&mut self, trials: &[Trial], index: usize) -> Result<(), String> {
        if self.terminal {
            self.draw(trials, false);
            return Ok(());
        }
        let t = &trials[index];
        let detail = match t.status {
            TrialStatus::Error => inert(t.error.as_deref().unwrap_or_default()).into_owned(),
            _ => {
                let metric = self.metric.as_deref().and_then(|m| {
                    Some(format!("{m}={}, ", crate::units::metric_text(t.metric(m)?)))
                });
                format!(
                    "{}{}",
                    metric.unwrap_or_default(),
                    inert(t.stop_reason.as_deref().unwrap_or(""))
                )
            }
        };
        let line = format!(
            "{} {} after {} iterations: {detail}",
            t.trial_id, t.status, t.iterations
        );
        self.plain(&line);
        Ok(())
    }

    fn on_trial_recover(
        &mut self,
        trials: &[Trial],
        index: usize,
        reason: &str,
    ) -> Result<(), String> {
        let t = &trials[index];
        let from = match t.latest_checkpoint() {
            Some(c) => format!("its checkpoint at iteration {}", c.iteration),
            None if t.restore_from.is_some() => "the restore_from checkpoint".to_string(),
            None => "scratch".to_string(),
        };
        let of = self
            .max_failures
            .map_or("unlimited".to_string(), |m| m.to_string());
        // The reason names the call and the iteration.
        let line = format!(
            "{} failed: {}; continuing from {from} (failure {} of {of})",
            t.trial_id,
            inert(reason),
            t.num_failures
        );
        self.event(&line, trials);
        Ok(())
    }

    fn on_experiment_end(&mut self, summary: &ExperimentSummary) -> Result<(), String> {
        if self.terminal {
            self.draw(&summary.trials, true);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn trial(id: &str, loss: f64) -> Trial {
        let mut t = Trial::new(id.into(), json!({}), "/nowhere".into());
        t.status = TrialStatus::Running;
        t.last_result = json!({"loss": loss}).as_object().cloned();
        t
    }

    #[test]
    fn the_status_line_shows_the_best_value_under_the_experiment_mode() {
        let trials = [trial("a", 0.5), trial("b", 0.2), trial("c", f64::NAN)];
        let mut progress = Progress::with_terminal(false);
        progress.metric = Some("loss".into());
        progress.mode = Mode::Min;
        let line = progress.status_line(&trials);
        assert!(line.contains("3 trials: 3 RUNNING"), "{line}");
        assert!(line.ends_with("| best loss so far 0.2000 (min)"), "{line}");
        progress.mode = Mode::Max;
        assert!(
            progress
                .status_line(&trials)
                .ends_with("| best loss so far 0.5000 (max)")
        );
    }
}
