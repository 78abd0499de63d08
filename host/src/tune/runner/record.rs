//! What the runner decided, one record per decision, so that two runs can
//! be compared decision by decision (`wtune decisions A B`).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::tune::schedulers::Decision;
use crate::tune::trial::Trial;

/// One decision about one trial, as [`super::Callback::on_decision`] hears
/// it. Every field is a function of the seed and the results alone (no
/// wall time), so runs that decided the same have equal records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecisionRecord {
    /// The experiment's fuel time of the event, in fuel order
    /// ([`super::ResultOrder::Fuel`]); absent in arrival order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fuel_time: Option<u64>,
    /// The trial decided on.
    pub trial_id: String,
    /// Its `training_iteration` then.
    pub iteration: u64,
    /// Its `fuel_total` then.
    pub fuel_total: u64,
    /// `START` (the trial took a slot), `CONTINUE`, `CHECKPOINT`, `STOP`,
    /// `PAUSE`, `EXPLOIT` (after a result), `RECOVER` or `ERROR` (after a
    /// failure).
    pub decision: String,
    /// Why, where there is more to say: the stop reason, the trial an
    /// exploit clones, a failure's reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

impl DecisionRecord {
    /// A record of `decision` about `trial` at `fuel_time`.
    pub(super) fn new(trial: &Trial, fuel_time: Option<u64>, decision: &str) -> Self {
        Self {
            fuel_time,
            trial_id: trial.trial_id.clone(),
            iteration: trial.iterations,
            fuel_total: trial.fuel_total,
            decision: decision.to_string(),
            why: None,
        }
    }

    /// With `why` said.
    pub(super) fn why(mut self, why: Option<String>) -> Self {
        self.why = why;
        self
    }

    /// With the paths in `why` under the experiment directory (as given,
    /// or canonical) made relative to it: the same failure in two
    /// experiment directories is the same decision (`wtune decisions A B`).
    pub(super) fn relative_to(mut self, experiment_dir: &mut ExperimentDir) -> Self {
        // Most reasons name no path ("training_iteration >= 10"): they need
        // no canonical directory, whose lookup, until the directory exists,
        // is a system call per record.
        if let Some(why) = &mut self.why
            && why.contains(std::path::MAIN_SEPARATOR)
        {
            // The canonical form first: a relative directory as given could
            // also match inside it.
            for dir in experiment_dir.forms() {
                let prefix = format!("{}{}", dir.display(), std::path::MAIN_SEPARATOR);
                if prefix.len() > 1 && why.contains(&prefix) {
                    *why = strip_path_prefix(why, &prefix);
                }
            }
        }
        self
    }
}

/// The experiment directory, as the spec gives it and canonical: the
/// canonical form is worked out once, when the first record needs it, and
/// looked for again only while the directory does not exist yet.
#[derive(Debug)]
pub(super) struct ExperimentDir {
    given: PathBuf,
    canonical: Option<PathBuf>,
}

impl ExperimentDir {
    pub(super) fn new(given: &Path) -> Self {
        Self {
            given: given.to_path_buf(),
            canonical: None,
        }
    }

    /// The canonical form where there is one, then the given one.
    fn forms(&mut self) -> impl Iterator<Item = &Path> {
        if self.canonical.is_none() {
            self.canonical = std::fs::canonicalize(&self.given).ok();
        }
        self.canonical
            .as_deref()
            .into_iter()
            .chain([self.given.as_path()])
    }
}

/// `text` with `prefix` removed where a path starts with it: at the start,
/// or after a space, a quote, a bracket, `=` or `,`; not inside another
/// path (`/mnt/a/exp/x` keeps its `/a/exp/`).
fn strip_path_prefix(text: &str, prefix: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    for (at, _) in text.match_indices(prefix) {
        let starts_path = text[..at]
            .chars()
            .next_back()
            .is_none_or(|c| c.is_whitespace() || "\"'([{=,".contains(c));
        if starts_path && at >= copied {
            out.push_str(&text[copied..at]);
            copied = at + prefix.len();
        }
    }
    out.push_str(&text[copied..]);
    out
}

/// The name a record gives `decision`.
pub(super) fn decision_name(decision: &Decision) -> &'static str {
    match decision {
        Decision::Continue => "CONTINUE",
        Decision::Stop => "STOP",
        Decision::Pause => "PAUSE",
        Decision::Checkpoint => "CHECKPOINT",
        Decision::Exploit { .. } => "EXPLOIT",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_under_the_experiment_directory_are_made_relative_to_it() {
        let dir = tempfile::tempdir().unwrap();
        let trial = Trial::new(
            "trial_0001".into(),
            serde_json::json!({}),
            dir.path().join("trial_0001"),
        );
        let why = format!(
            "restoring {}: damaged; elsewhere /etc/passwd",
            dir.path()
                .join("trial_0001/checkpoint_000003/trial.wtsnap")
                .display()
        );
        let record = DecisionRecord::new(&trial, Some(5), "RECOVER")
            .why(Some(why))
            .relative_to(&mut ExperimentDir::new(dir.path()));
        assert_eq!(
            record.why.as_deref(),
            Some(
                "restoring trial_0001/checkpoint_000003/trial.wtsnap: damaged; elsewhere /etc/passwd"
            )
        );
        assert_eq!(
            strip_path_prefix("/a/exp/t: \"/a/exp/u\" /mnt/a/exp/v (/a/exp/w)", "/a/exp/"),
            "t: \"u\" /mnt/a/exp/v (w)"
        );
        let none = DecisionRecord::new(&trial, None, "START")
            .relative_to(&mut ExperimentDir::new(dir.path()));
        assert_eq!(none.why, None);
    }
}
