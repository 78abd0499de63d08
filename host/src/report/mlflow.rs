//! Logging to an MLflow tracking server: each trial is a run, with its
//! configuration as params, every numeric metric per step (as TensorBoard
//! gets them), tags that lead back to its trial directory, its status when
//! it ends, and the best trial tagged `wtune.best_trial`.
//!
//! The server is never in the experiment's way: the callback only queues
//! (its hooks never wait on the network) and the `wtune-mlflow` thread
//! sends, batching a trial's metrics (MLflow's `log-batch`, up to 1000
//! values a request). While the server cannot be reached or fails, what
//! waits is kept (up to [`worker::MAX_WAITING_VALUES`] metric values, the
//! oldest dropped past that) and sent again with backoff; the problem is
//! said once, and its end once. A request the server refuses (4xx) is
//! dropped and the first refusal said. At the end of the experiment the
//! thread gets a few seconds to send what is left when the server answers,
//! none when it does not, and what was never sent is counted in one
//! warning: all of it is in the trial directories' files.
//!
//! A trial's run id is kept in its directory (`mlflow_run.json`), so
//! `wtune resume` and a paused trial's next launch log to the same run and
//! steps the server already has are not sent again (the first values sent
//! for a step stay, where TensorBoard shows a redone step's newer ones).
//! Steps a killed process never sent (still queued, or the server away)
//! and that the restored checkpoint covers, so that no launch reports them
//! again, are sent from the trial's `result.jsonl` when it launches again;
//! a trial that had ended is not launched again, so `wtune resume` sends
//! what its run lacks (steps, its end) at its start, unless the trial's
//! file says the server has all of it.
//!
//! Plain `http://` only: this build has no TLS. Credentials, if any, come
//! from MLflow's own environment variables (`client::authorization`).

mod client;
mod worker;

use std::sync::mpsc::{Sender, channel};
use std::thread::JoinHandle;

use serde_json::{Map, Value};

use super::scalars::Scalars;
use crate::tune::{Callback, ExperimentSummary, RunSpec, Trial, TrialStatus};
use worker::{Op, Outcome, Worker, now_ms, result_ms};

/// Longest key MLflow takes for a metric, param or tag.
const MAX_KEY: usize = 250;
/// Longest param value MLflow takes.
const MAX_PARAM_VALUE: usize = 6000;

/// The callback that logs trials to an MLflow server.
pub struct MlflowLogger {
    uri: String,
    ops: Option<Sender<Op>>,
    thread: Option<JoinHandle<Outcome>>,
    scalars: Scalars,
    config_metrics: bool,
}

impl MlflowLogger {
    /// Logs to the server at `uri` (`http://host:port`), into the MLflow
    /// experiment called `experiment` (made when there is none), from a
    /// background thread started now. Nothing is sent before the
    /// experiment starts: then what `wtune resume` finds unsent of trials
    /// that had ended, then each trial as it starts.
    pub fn start(uri: &str, experiment: &str) -> std::io::Result<Self> {
        let (ops, receiver) = channel();
        let worker = Worker::new(uri, experiment);
        let thread = std::thread::Builder::new()
            .name("wtune-mlflow".into())
            .spawn(move || worker.run(receiver))?;
        Ok(MlflowLogger {
            uri: uri.to_string(),
            ops: Some(ops),
            thread: Some(thread),
            scalars: Scalars::default(),
            config_metrics: false,
        })
    }

    /// Also logs each result's numeric configuration values as metrics
    /// (`config/lr`), for schedulers that change them during a trial (PBT):
    /// MLflow's params cannot change once logged.
    pub fn config_metrics(mut self, on: bool) -> Self {
        self.config_metrics = on;
        self
    }

    fn send(&self, op: Op) {
        if let Some(ops) = &self.ops {
            // The thread only stops after `Finish`: a send cannot fail
            // before, and nothing is lost after.
            let _ = ops.send(op);
        }
    }

    /// Sends `Finish`, waits for the thread and says what never reached the
    /// server.
    fn finish(&mut self) {
        self.send(Op::Finish);
        self.ops = None;
        let Some(thread) = self.thread.take() else {
            return;
        };
        let Ok(outcome) = thread.join() else {
            tracing::warn!(
                "MLflow logging stopped unexpectedly; the trial files hold every result"
            );
            return;
        };
        let lost = outcome.dropped + outcome.unsent_values;
        if lost > 0 || outcome.unsent_updates > 0 {
            tracing::warn!(
                "MLflow at {}: {lost} metric values ({} dropped while the server was away, {} \
                 still waiting at the end) and {} run updates were not sent; every result is in \
                 the trial directories' result.jsonl",
                self.uri,
                outcome.dropped,
                outcome.unsent_values,
                outcome.unsent_updates
            );
        }
        if outcome.refused > 1 {
            tracing::warn!(
                "MLflow at {}: {} requests were refused in all",
                self.uri,
                outcome.refused
            );
        }
    }
}

impl Drop for MlflowLogger {
    fn drop(&mut self) {
        // Ended without `on_experiment_end` (the run failed): the thread
        // sees the channel close, tries once more and stops; nobody waits.
        self.ops = None;
    }
}

impl Callback for MlflowLogger {
    fn on_experiment_start(&mut self, _spec: &RunSpec, trials: &[Trial]) -> Result<(), String> {
        // Trials that ended before a `wtune resume` are not launched
        // again: what a killed process never sent of them goes now.
        for (index, trial) in trials.iter().enumerate() {
            let status = match trial.status {
                TrialStatus::Terminated => "FINISHED",
                TrialStatus::Error => "FAILED",
                _ => continue,
            };
            let end_ms = trial
                .last_result
                .as_ref()
                .and_then(result_ms)
                .unwrap_or_else(now_ms);
            self.send(Op::Settle {
                trial: index,
                trial_id: trial.trial_id.clone(),
                dir: std::path::absolute(&trial.dir).unwrap_or_else(|_| trial.dir.clone()),
                config: trial.config.clone(),
                iterations: trial.iterations,
                status,
                end_ms,
                config_metrics: self.config_metrics,
            });
        }
        Ok(())
    }

    fn on_trial_start(&mut self, trials: &[Trial], index: usize) -> Result<(), String> {
        let trial = &trials[index];
        self.send(Op::Start {
            trial: index,
            trial_id: trial.trial_id.clone(),
            dir: std::path::absolute(&trial.dir).unwrap_or_else(|_| trial.dir.clone()),
            config: trial.config.clone(),
            continues_after: trial.latest_checkpoint().map_or(0, |c| c.iteration),
            config_metrics: self.config_metrics,
        });
        Ok(())
    }

    fn on_result(
        &mut self,
        _trials: &[Trial],
        index: usize,
        result: &Map<String, Value>,
    ) -> Result<(), String> {
        let Some(step) = result.get("training_iteration").and_then(Value::as_u64) else {
            return Ok(());
        };
        self.scalars.fill(result, self.config_metrics);
        self.send(Op::Metrics {
            trial: index,
            step,
            timestamp_ms: now_ms(),
            values: metric_values(&self.scalars),
        });
        Ok(())
    }

    fn on_trial_end(&mut self, trials: &[Trial], index: usize) -> Result<(), String> {
        let status = match trials[index].status {
            TrialStatus::Error => "FAILED",
            _ => "FINISHED",
        };
        let trial = &trials[index];
        self.send(Op::End {
            trial: index,
            dir: std::path::absolute(&trial.dir).unwrap_or_else(|_| trial.dir.clone()),
            status,
            end_ms: now_ms(),
        });
        Ok(())
    }

    fn on_experiment_end(&mut self, summary: &ExperimentSummary) -> Result<(), String> {
        if let Some(best) = summary.best_trial()
            && let Some(index) = summary
                .trials
                .iter()
                .position(|t| t.trial_id == best.trial_id)
        {
            self.send(Op::Best {
                trial: index,
                dir: summary.trials[index].dir.clone(),
            });
        }
        self.finish();
        Ok(())
    }
}

/// A result's metrics under MLflow's keys.
fn metric_values(scalars: &Scalars) -> Vec<(String, f64)> {
    scalars
        .as_slice()
        .iter()
        .map(|(tag, value)| (key(tag), *value))
        .collect()
}

/// `name` as MLflow takes it for a key: letters and digits of any script,
/// `_ - . / space` (others become `_`), no empty, `.` or `..` path segment
/// (MLflow refuses names that would resolve to another as a path: then `/`
/// becomes `_` too), at most 250 characters. A name changed or cut to fit
/// ends in `_` and 8 hex digits of its blake3 digest, so two names never
/// share a key (`α-1` and `α+1` would both be `α_1`, and one run would get
/// one series of both, or a batch of params holding the key twice would be
/// refused whole).
fn key(name: &str) -> String {
    // Letters of any script (not marks, which Python's `\w`, what MLflow
    // checks with, does not take) and numbers.
    let allowed = |c: char| {
        c.is_ascii_alphanumeric()
            || matches!(c, '_' | '-' | '.' | '/' | ' ')
            || c.is_numeric()
            || (c.is_alphabetic() && unicode_ident::is_xid_start(c))
    };
    let mut key: String = name
        .chars()
        .map(|c| if allowed(c) { c } else { '_' })
        .collect();
    if key
        .split('/')
        .any(|segment| segment.is_empty() || segment == "." || segment == "..")
    {
        key = key.replace('/', "_");
        if key.chars().all(|c| c == '.') {
            key = key.replace('.', "_");
        }
    }
    if key != name || key.is_empty() || key.chars().count() > MAX_KEY {
        let digest = blake3::hash(name.as_bytes()).to_hex();
        let kept: String = key.chars().take(MAX_KEY - 9).collect();
        key = format!("{kept}_{}", &digest[..8]);
    }
    key
}

/// A configuration as MLflow params: nested tables flattened as
/// `outer/inner`, strings as they are, other values as their JSON.
fn params(config: &Value) -> Vec<(String, String)> {
    fn walk(path: &mut String, value: &Value, out: &mut Vec<(String, String)>) {
        match value {
            Value::Object(map) if !map.is_empty() => {
                for (name, inner) in map {
                    let len = path.len();
                    if !path.is_empty() {
                        path.push('/');
                    }
                    path.push_str(name);
                    walk(path, inner, out);
                    path.truncate(len);
                }
            }
            _ if path.is_empty() => {}
            other => {
                let mut text = match other {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                if text.len() > MAX_PARAM_VALUE {
                    let mut end = MAX_PARAM_VALUE;
                    while !text.is_char_boundary(end) {
                        end -= 1;
                    }
                    text.truncate(end);
                }
                out.push((key(path), text));
            }
        }
    }
    let mut out = Vec::new();
    walk(&mut String::new(), config, &mut out);
    // `{"a/b": 1, "a": {"b": 2}}` flattens to one path twice; a batch
    // holding a key twice is refused whole. A repeat takes `_2`, `_3`, ...
    // (made a key again, so still at most 250 characters) until unused.
    let mut seen = std::collections::HashSet::new();
    for (name, _) in &mut out {
        let base = name.clone();
        let mut n = 1;
        while !seen.insert(name.clone()) {
            n += 1;
            *name = key(&format!("{base}_{n}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keys_are_what_mlflow_takes() {
        assert_eq!(key("val_accuracy"), "val_accuracy");
        assert_eq!(key("nested/a b-c.d"), "nested/a b-c.d");
        assert_eq!(key("α_l2 東京 ③"), "α_l2 東京 ③");
        // Changed or cut, a key ends in its name's digest.
        let tagged = |name: &str, kept: &str| {
            let digest = blake3::hash(name.as_bytes()).to_hex();
            assert_eq!(key(name), format!("{kept}_{}", &digest[..8]), "{name:?}");
        };
        tagged("ünï\u{1b}[31m", "ünï__31m");
        tagged("e\u{301}", "e_");
        tagged("a/../b", "a_.._b");
        tagged("/lead", "_lead");
        tagged("..", "__");
        tagged("", "");
        let long = "x".repeat(300);
        tagged(&long, &"x".repeat(241));
        assert_eq!(key(&long).chars().count(), 250);
        assert_eq!(key(&"é".repeat(300)).chars().count(), 250);
        // Names that would have shared a key do not.
        assert_ne!(key("α+1"), key("α-1"));
        assert_ne!(key("acc@1"), key("acc#1"));
        assert_ne!(key(&"y".repeat(251)), key(&"y".repeat(252)));
    }

    #[test]
    fn params_flatten_the_configuration() {
        let config = json!({"lr": 0.1, "opt": {"name": "sgd", "m": [1, 2]}, "on": true,
                            "long": "y".repeat(7000), "empty": {}});
        let params = params(&config);
        let names: Vec<&str> = params.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["lr", "opt/name", "opt/m", "on", "long", "empty"]);
        assert_eq!(params[0].1, "0.1");
        assert_eq!(params[1].1, "sgd");
        assert_eq!(params[2].1, "[1,2]");
        assert_eq!(params[4].1.len(), 6000);
        assert_eq!(params[5].1, "{}");
        let twice = super::params(&json!({"a/b": 1, "a": {"b": 2}, "a/b_2": 3}));
        let keys: Vec<&str> = twice.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["a/b", "a/b_2", "a/b_2_2"]);
        // A repeat of a key at the length limit stays within it.
        let long = "z".repeat(MAX_KEY);
        let nested = json!({ long.clone(): {"k": 1}, format!("{long}/k"): 2 });
        let keys: Vec<String> = super::params(&nested).into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys.len(), 2);
        assert_ne!(keys[0], keys[1]);
        assert!(
            keys.iter().all(|k| k.chars().count() <= MAX_KEY),
            "{keys:?}"
        );
    }
}
