//! `decisions.jsonl`: every decision the runner made, one JSON object per
//! line ([`DecisionRecord`]), so that two runs of an experiment can be
//! compared decision by decision ([`compare`], `wtune decisions A B`).
//!
//! Lines are buffered and written at most [`FLUSH_AFTER`] apart, and at the
//! experiment's end: a process killed outright loses at most that much of
//! the record. In fuel order they are also written at every moment a state
//! may be saved at, so that a state's moment never counts decisions the
//! record lacks. `wtune resume` appends to the record it continues, first
//! cutting it back to the moment it continues from
//! ([`DecisionLog::resumed_at`]): the decisions after it are made again.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::tune::{Callback, Deciders, DecisionRecord, ExperimentSummary, RunSpec, Trial};

/// The record's file name in the experiment directory.
pub const DECISIONS_FILE: &str = "decisions.jsonl";
/// Longest a decision waits in memory before it is written.
const FLUSH_AFTER: Duration = Duration::from_millis(200);
/// Buffered bytes past which they are written at once.
const MAX_BUFFERED: usize = 256 << 10;

/// The callback that keeps `decisions.jsonl`.
#[derive(Default)]
pub struct DecisionLog {
    path: PathBuf,
    file: Option<File>,
    buffer: Vec<u8>,
    written: Option<Instant>,
    /// The first write error, reported once; the run goes on without the
    /// record.
    failed: bool,
    /// Decisions to keep of the record a resumed run continues.
    keep: Option<u64>,
}

impl DecisionLog {
    /// A log that opens its file when the experiment starts.
    pub fn new() -> Self {
        Self::default()
    }

    /// A log continuing a record at a resumed moment that had made
    /// `decisions`: the lines after them are cut off when the run starts.
    pub fn resumed_at(mut self, decisions: u64) -> Self {
        self.keep = Some(decisions);
        self
    }

    fn flush(&mut self) -> Result<(), String> {
        if self.buffer.is_empty() || self.failed {
            self.buffer.clear();
            return Ok(());
        }
        self.written = Some(Instant::now());
        let result = match &mut self.file {
            Some(file) => file.write_all(&self.buffer),
            None => return Ok(()),
        };
        self.buffer.clear();
        result.map_err(|e| {
            self.failed = true;
            format!(
                "writing {}: {e}; decisions are no longer recorded",
                self.path.display()
            )
        })
    }
}

impl Callback for DecisionLog {
    fn on_experiment_start(&mut self, spec: &RunSpec, _trials: &[Trial]) -> Result<(), String> {
        self.path = spec.output_dir.join(DECISIONS_FILE);
        if let Some(keep) = self.keep {
            cut_back(&self.path, keep)?;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .map_err(|e| format!("opening {}: {e}", self.path.display()))?;
        self.file = Some(file);
        self.written = Some(Instant::now());
        Ok(())
    }

    fn on_decision(&mut self, record: &DecisionRecord) -> Result<(), String> {
        if self.failed {
            return Ok(());
        }
        serde_json::to_writer(&mut self.buffer, record).expect("records serialize");
        self.buffer.push(b'\n');
        let due = self.written.is_none_or(|at| at.elapsed() >= FLUSH_AFTER);
        if due || self.buffer.len() >= MAX_BUFFERED {
            self.flush()?;
        }
        Ok(())
    }

    fn on_state(&mut self, _trials: &[Trial], deciders: &Deciders<'_>) -> Result<(), String> {
        if !self.buffer.is_empty() && deciders.fuel_order.is_some_and(|o| o.at_moment()) {
            self.flush()?;
        }
        Ok(())
    }

    fn on_experiment_end(&mut self, _summary: &ExperimentSummary) -> Result<(), String> {
        self.flush()
    }
}

/// Cuts the record at `path` back to its first `keep` decisions. A record
/// with fewer (a run killed before its last lines were written) is kept
/// whole, with a warning: comparing it with another run will find those
/// decisions missing.
fn cut_back(path: &Path, keep: u64) -> Result<(), String> {
    let text = match std::fs::read(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(format!("reading {}: {e}", path.display())),
    };
    let mut lines = 0;
    let mut end = 0;
    for (at, _) in text.iter().enumerate().filter(|(_, b)| **b == b'\n') {
        if lines == keep {
            break;
        }
        lines += 1;
        end = at + 1;
    }
    if lines < keep {
        tracing::warn!(
            "{} holds {lines} of the {keep} decisions made before the run stopped (the last \
             were not written yet when it was killed): `wtune decisions` will find them missing",
            path.display()
        );
    }
    if end < text.len() {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(|e| format!("opening {}: {e}", path.display()))?;
        file.set_len(end as u64)
            .map_err(|e| format!("cutting back {}: {e}", path.display()))?;
    }
    Ok(())
}

impl Drop for DecisionLog {
    fn drop(&mut self) {
        let _ = self.flush();
    }
}

/// The decision record of the experiment directory `dir`, or why it cannot
/// be read: missing, unreadable, or a line that is not a decision (a run
/// killed while writing leaves a torn last line, which `wtune resume` cuts).
pub fn read(dir: &Path) -> Result<Vec<DecisionRecord>, String> {
    let path = dir.join(DECISIONS_FILE);
    let text =
        std::fs::read_to_string(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    text.lines()
        .enumerate()
        .map(|(i, line)| {
            serde_json::from_str(line).map_err(|e| {
                format!(
                    "{} line {} is not a decision ({e}); a run killed while writing leaves a \
                     torn last line, which `wtune resume` cuts",
                    path.display(),
                    i + 1
                )
            })
        })
        .collect()
}

/// Whether the decision records `first` (of directory `a`) and `second`
/// (of `b`) are the same: `Ok` with how many, or `Err` saying where they
/// part.
pub fn compare(
    (a, first): (&Path, &[DecisionRecord]),
    (b, second): (&Path, &[DecisionRecord]),
) -> Result<usize, String> {
    let show = |r: Option<&DecisionRecord>| {
        r.map_or("(no more decisions)".to_string(), |r| {
            serde_json::to_string(r).expect("records serialize")
        })
    };
    for i in 0..first.len().max(second.len()) {
        let (x, y) = (first.get(i), second.get(i));
        if x != y {
            return Err(format!(
                "the decisions differ from decision {} on:\n  {}: {}\n  {}: {}",
                i + 1,
                a.display(),
                show(x),
                b.display(),
                show(y)
            ));
        }
    }
    Ok(first.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compare_dirs(a: &Path, b: &Path) -> Result<usize, String> {
        compare((a, &read(a)?), (b, &read(b)?))
    }

    fn record(trial: &str, decision: &str) -> DecisionRecord {
        DecisionRecord {
            fuel_time: Some(100),
            trial_id: trial.into(),
            iteration: 1,
            fuel_total: 100,
            decision: decision.into(),
            why: None,
        }
    }

    fn write(dir: &Path, records: &[DecisionRecord]) {
        let mut log = DecisionLog::new();
        log.on_experiment_start(&RunSpec::new("x", dir), &[])
            .unwrap();
        for r in records {
            log.on_decision(r).unwrap();
        }
        drop(log);
    }

    #[test]
    fn equal_records_compare_equal_and_the_first_difference_is_named() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let same = [
            record("trial_0000", "START"),
            record("trial_0000", "CONTINUE"),
        ];
        write(a.path(), &same);
        write(b.path(), &same);
        assert_eq!(compare_dirs(a.path(), b.path()), Ok(2));
        let c = tempfile::tempdir().unwrap();
        write(
            c.path(),
            &[record("trial_0000", "START"), record("trial_0000", "STOP")],
        );
        let err = compare_dirs(a.path(), c.path()).unwrap_err();
        assert!(err.contains("from decision 2 on"), "{err}");
        assert!(err.contains("\"STOP\""), "{err}");
        let d = tempfile::tempdir().unwrap();
        write(d.path(), &same[..1]);
        let err = compare_dirs(a.path(), d.path()).unwrap_err();
        assert!(err.contains("(no more decisions)"), "{err}");
        let missing = compare_dirs(a.path(), &a.path().join("nowhere")).unwrap_err();
        assert!(missing.contains("decisions.jsonl"), "{missing}");
    }

    #[test]
    fn a_resumed_record_is_cut_back_to_its_moment_and_kept_whole_when_short() {
        let dir = tempfile::tempdir().unwrap();
        let records: Vec<_> = ["START", "CONTINUE", "CHECKPOINT", "STOP"]
            .into_iter()
            .map(|d| record("trial_0000", d))
            .collect();
        write(dir.path(), &records);
        // The killed run's last two decisions are made again.
        let mut log = DecisionLog::new().resumed_at(2);
        log.on_experiment_start(&RunSpec::new("x", dir.path()), &[])
            .unwrap();
        log.on_decision(&records[2]).unwrap();
        drop(log);
        let again = tempfile::tempdir().unwrap();
        write(again.path(), &records[..3]);
        assert_eq!(compare_dirs(dir.path(), again.path()), Ok(3));
        // A moment past the record's end (its last lines lost in a kill)
        // keeps what there is.
        let mut log = DecisionLog::new().resumed_at(10);
        log.on_experiment_start(&RunSpec::new("x", dir.path()), &[])
            .unwrap();
        drop(log);
        assert_eq!(compare_dirs(dir.path(), again.path()), Ok(3));
    }
}
