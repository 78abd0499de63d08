//! What the server shows, read from the experiment's directory: the state
//! file the runner keeps (`experiment_state.json`, rewritten about once a
//! second), each trial's `result.jsonl` and `guest.log`. Reading files
//! rather than the runner's memory serves a finished experiment, one run by
//! another process and a live one the same way, and keeps the runner's loop
//! free of the server's work.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use serde_json::{Map, Value, json};

use crate::report::state::{self, ExperimentState, STATE_FILE};
use crate::tune::{Mode, Trial, TrialStatus};

/// Most bytes of results or logs one answer carries.
pub const MAX_CHUNK: u64 = 1 << 20;

/// An experiment directory, with the last state read from it.
pub struct ExperimentDir {
    dir: PathBuf,
    /// The state file's [`Stamp`] when it was parsed,
    /// and what it held: polled every second by every open page, a state
    /// of 10,000 trials is parsed once per write, not once per request.
    cached: Mutex<Option<(Stamp, Arc<ExperimentState>)>>,
}

/// What the experiment is, from the state's setup.
#[derive(Debug, Clone, PartialEq)]
pub struct Header {
    /// The experiment's name.
    pub name: String,
    /// The metric trials are ranked by, if any.
    pub metric: Option<String>,
    /// Whether lower or higher is better.
    pub mode: Mode,
}

/// A run of records from a trial's `result.jsonl`.
#[derive(Debug, PartialEq)]
pub struct Results {
    /// Parsed records, oldest first.
    pub records: Vec<Value>,
    /// Where the next read starts.
    pub next_offset: u64,
    /// The file is shorter than the offset asked for, or is another file
    /// than the one the offset was in (the trial's results were cut back,
    /// which replaces the file): `records` start from the beginning.
    pub reset: bool,
    /// The file read (its inode; 0 when there is none), for the next
    /// read's `file`.
    pub file: u64,
}

/// A piece of a trial's log.
#[derive(Debug, PartialEq)]
pub struct LogText {
    /// The text (invalid UTF-8 replaced).
    pub text: String,
    /// Where it starts in the file.
    pub offset: u64,
    /// Where it ends.
    pub next_offset: u64,
}

/// Which part of a log to read.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LogRange {
    /// From this byte on.
    From(u64),
    /// The last this many bytes.
    Tail(u64),
}

/// What tells one state file from the next: modified, length, inode.
type Stamp = (SystemTime, u64, u64);

impl ExperimentDir {
    /// The experiment in `dir`; nothing is read yet.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            cached: Mutex::new(None),
        }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The newest state, from the cache when the file has not changed.
    /// A state that cannot be read falls back to the one it replaced.
    pub fn state(&self) -> Result<Arc<ExperimentState>, String> {
        let path = self.dir.join(STATE_FILE);
        let stamp = std::fs::metadata(&path)
            .and_then(|m| {
                use std::os::unix::fs::MetadataExt;
                // Each state is written to a new file renamed into place:
                // its inode tells two writes apart where the time (coarse
                // on some file systems) and the length (PENDING and
                // RUNNING are as long) do not.
                Ok((m.modified()?, m.len(), m.ino()))
            })
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => format!(
                    "{} has no {STATE_FILE} yet: is it an experiment directory?",
                    self.dir.display()
                ),
                _ => format!("reading {}: {e}", path.display()),
            })?;
        let mut cached = self.cached.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((seen, state)) = cached.as_ref()
            && *seen == stamp
        {
            return Ok(state.clone());
        }
        let state = state::load(&self.dir, false)
            .or_else(|newest| state::load(&self.dir, true).map_err(|_| newest.to_string()))?;
        // Shown, not acted on: the dashboard need not hold the key.
        let state = Arc::new(state.unchecked());
        *cached = Some((stamp, state.clone()));
        Ok(state)
    }

    /// A trial's directory: under this directory whatever the state says,
    /// since the experiment may have moved since it was written.
    fn trial_dir(&self, trial: &Trial) -> PathBuf {
        self.dir.join(&trial.trial_id)
    }

    /// Records from `trial`'s `result.jsonl`, from byte `offset` of the
    /// file `file` (as an earlier answer named it; `None`: whatever file is
    /// there), at most `limit` of them and [`MAX_CHUNK`] bytes; only
    /// complete lines.
    pub fn results(
        &self,
        trial: &Trial,
        offset: u64,
        file: Option<u64>,
        limit: usize,
    ) -> Result<Results, String> {
        let path = self.trial_dir(trial).join("result.jsonl");
        let same = |id: u64| file.is_none_or(|f| f == id);
        let (bytes, start, reset, file) = match read_from(&path, offset, MAX_CHUNK)? {
            Some((bytes, len, id)) if offset <= len && same(id) => (bytes, offset, false, id),
            Some(_) => match read_from(&path, 0, MAX_CHUNK)? {
                Some((bytes, _, id)) => (bytes, 0, true, id),
                None => (Vec::new(), 0, true, 0),
            },
            None => (Vec::new(), 0, offset > 0, 0),
        };
        let mut records = Vec::new();
        let mut consumed = 0;
        for line in bytes.split_inclusive(|&b| b == b'\n') {
            if records.len() >= limit || !line.ends_with(b"\n") {
                break;
            }
            consumed += line.len();
            match serde_json::from_slice::<Value>(line) {
                Ok(record) => records.push(record),
                Err(err) => tracing::debug!("{}: skipping a bad line: {err}", path.display()),
            }
        }
        let mut next_offset = start + consumed as u64;
        if consumed == 0 && bytes.len() as u64 == MAX_CHUNK {
            // One line longer than a whole answer: skip it, or every poll
            // would stall on it.
            if let Some(end) = next_newline(&path, start + MAX_CHUNK)? {
                tracing::debug!("{}: skipping a line over 1 MiB", path.display());
                next_offset = end + 1;
            }
        }
        Ok(Results {
            records,
            next_offset,
            reset,
            file,
        })
    }

    /// Part of `trial`'s `guest.log`, at most [`MAX_CHUNK`] bytes.
    pub fn log(&self, trial: &Trial, range: LogRange) -> Result<LogText, String> {
        let path = self.trial_dir(trial).join("guest.log");
        let len = match std::fs::metadata(&path) {
            Ok(meta) => meta.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(format!("reading {}: {e}", path.display())),
        };
        let (offset, most) = match range {
            LogRange::From(offset) => (offset.min(len), MAX_CHUNK),
            LogRange::Tail(bytes) => {
                let bytes = bytes.min(MAX_CHUNK);
                (len.saturating_sub(bytes), bytes)
            }
        };
        let bytes = match read_from(&path, offset, most)? {
            Some((bytes, ..)) => bytes,
            None => Vec::new(),
        };
        let (start, end) = whole_characters(&bytes, offset > 0);
        Ok(LogText {
            text: String::from_utf8_lossy(&bytes[start..end]).into_owned(),
            offset: offset + start as u64,
            next_offset: offset + end as u64,
        })
    }
}

/// Where in `bytes` the first and past the last whole UTF-8 character are:
/// the continuation bytes of a character begun before them (`mid_file`:
/// they start past the file's first byte) and a last character not all
/// there yet (cut by the chunk's size, or still being written) are left
/// out, so chunks read one after another join without replacement
/// characters where they meet. Bytes that are not UTF-8 at all are kept,
/// for the caller to replace.
fn whole_characters(bytes: &[u8], mid_file: bool) -> (usize, usize) {
    let continuation = |b: &u8| b & 0xC0 == 0x80;
    let start = if mid_file {
        bytes.iter().take(3).take_while(|b| continuation(b)).count()
    } else {
        0
    };
    let tail = &bytes[start..];
    // The last byte that can begin a character, among the last four.
    let end = match tail.iter().rev().take(4).position(|b| !continuation(b)) {
        Some(back) => {
            let lead_at = tail.len() - 1 - back;
            let needs = match tail[lead_at] {
                0xC2..=0xDF => 2,
                0xE0..=0xEF => 3,
                0xF0..=0xF4 => 4,
                _ => 1,
            };
            if lead_at + needs > tail.len() {
                lead_at
            } else {
                tail.len()
            }
        }
        None => tail.len(),
    };
    (start, start + end)
}

/// Up to `most` bytes of `path` from `offset`, the file's length and its
/// inode; `None` when there is no such file.
fn read_from(path: &Path, offset: u64, most: u64) -> Result<Option<(Vec<u8>, u64, u64)>, String> {
    use std::os::unix::fs::MetadataExt;
    let fail = |e: std::io::Error| format!("reading {}: {e}", path.display());
    let mut file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(fail(e)),
    };
    let meta = file.metadata().map_err(fail)?;
    let (len, id) = (meta.len(), meta.ino());
    if offset > len {
        return Ok(Some((Vec::new(), len, id)));
    }
    file.seek(SeekFrom::Start(offset)).map_err(fail)?;
    let mut bytes = Vec::new();
    file.take(most).read_to_end(&mut bytes).map_err(fail)?;
    Ok(Some((bytes, len, id)))
}

/// Where the first `\n` at or after `from` is in `path`.
fn next_newline(path: &Path, mut from: u64) -> Result<Option<u64>, String> {
    while let Some((bytes, ..)) = read_from(path, from, MAX_CHUNK)? {
        if bytes.is_empty() {
            return Ok(None);
        }
        if let Some(at) = bytes.iter().position(|&b| b == b'\n') {
            return Ok(Some(from + at as u64));
        }
        from += bytes.len() as u64;
    }
    Ok(None)
}

/// The experiment's name, metric and mode, from the setup `wtune` saves
/// (`spec.name`, `spec.metric`, `spec.mode`); an embedder's own setup may
/// lack them, so the directory's name stands in.
pub fn header(state: &ExperimentState, dir: &Path) -> Header {
    let spec = state.setup.get("spec");
    let field = |key: &str| spec.and_then(|s| s.get(key)).and_then(Value::as_str);
    Header {
        name: field("name").map(str::to_string).unwrap_or_else(|| {
            dir.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        }),
        metric: field("metric").map(str::to_string),
        mode: match field("mode") {
            Some("max") => Mode::Max,
            _ => Mode::Min,
        },
    }
}

/// The best trial by `metric`'s last reported value, as the run's summary
/// names it.
pub fn best<'t>(trials: &'t [Trial], metric: &str, mode: Mode) -> Option<&'t Trial> {
    crate::tune::best_trial(trials, metric, mode).map(|i| &trials[i])
}

/// How many trials have each status, every status named.
pub fn counts(trials: &[Trial]) -> Map<String, Value> {
    let mut counts = Map::new();
    for status in [
        TrialStatus::Pending,
        TrialStatus::Running,
        TrialStatus::Paused,
        TrialStatus::Terminated,
        TrialStatus::Error,
    ] {
        let n = trials.iter().filter(|t| t.status == status).count();
        counts.insert(status.to_string(), n.into());
    }
    counts
}

/// A trial as the API shows it (`TrialSummary` in the OpenAPI document).
pub fn summary(trial: &Trial) -> Value {
    json!({
        "trial_id": trial.trial_id,
        "status": trial.status,
        "held": trial.held,
        "config": trial.config,
        "iterations": trial.iterations,
        "time_total_s": trial.time_total_s,
        "fuel_total": trial.fuel_total,
        "last_result": trial.last_result,
        "error": trial.error,
        "stop_reason": trial.stop_reason,
        "num_failures": trial.num_failures,
    })
}

/// [`summary`] with the trial's checkpoints.
pub fn detail(trial: &Trial) -> Value {
    let mut value = summary(trial);
    value["checkpoints"] = trial
        .checkpoints
        .iter()
        .map(|c| json!({"iteration": c.iteration, "path": c.path, "bytes": c.bytes}))
        .collect();
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trial(dir: &Path, id: &str) -> Trial {
        Trial::new(id.into(), json!({}), dir.join(id))
    }

    #[test]
    fn results_come_in_complete_lines_from_an_offset() {
        let dir = tempfile::tempdir().unwrap();
        let view = ExperimentDir::new(dir.path());
        let t = trial(dir.path(), "trial_0000");
        // No file yet: nothing, from the start.
        let none = view.results(&t, 0, None, 10).unwrap();
        assert_eq!(
            (none.records.len(), none.next_offset, none.reset),
            (0, 0, false)
        );

        std::fs::create_dir_all(&t.dir).unwrap();
        let file = t.dir.join("result.jsonl");
        std::fs::write(&file, "{\"a\":1}\n{\"a\":2}\n{\"a\":").unwrap();
        let first = view.results(&t, 0, None, 10).unwrap();
        assert_eq!(first.records, vec![json!({"a": 1}), json!({"a": 2})]);
        assert_eq!(first.next_offset, 16, "the partial line is left for later");
        let limited = view.results(&t, 0, None, 1).unwrap();
        assert_eq!(limited.records, vec![json!({"a": 1})]);
        assert_eq!(limited.next_offset, 8);

        std::fs::write(&file, "{\"a\":1}\n{\"a\":2}\n{\"a\":3}\n").unwrap();
        let rest = view.results(&t, first.next_offset, None, 10).unwrap();
        assert_eq!(rest.records, vec![json!({"a": 3})]);
        assert!(!rest.reset);

        // A line longer than an answer is skipped, not stalled on.
        let long = format!(
            "{{\"x\":\"{}\"}}\n{{\"a\":4}}\n",
            "x".repeat(MAX_CHUNK as usize)
        );
        std::fs::write(&file, &long).unwrap();
        let skipped = view.results(&t, 0, None, 10).unwrap();
        assert!(skipped.records.is_empty());
        let after = view.results(&t, skipped.next_offset, None, 10).unwrap();
        assert_eq!(after.records, vec![json!({"a": 4})]);

        // Started over: shorter than the offset.
        std::fs::write(&file, "{\"b\":1}\n").unwrap();
        let over = view.results(&t, rest.next_offset, None, 10).unwrap();
        assert_eq!(over.records, vec![json!({"b": 1})]);
        assert!(over.reset);

        // Cut back and grown past the old offset before the next read: the
        // cut replaced the file (as `cut_back` does, by a rename), so the
        // offset into the old one means nothing in it.
        let read = view.results(&t, 0, None, 10).unwrap();
        let replaced = t.dir.join("result.jsonl.new");
        std::fs::write(&replaced, "{\"c\":1}\n{\"c\":2}\n{\"c\":3}\n").unwrap();
        std::fs::rename(&replaced, &file).unwrap();
        let again = view
            .results(&t, read.next_offset, Some(read.file), 10)
            .unwrap();
        assert!(again.reset);
        assert_eq!(again.records.len(), 3);
        // The same file, named: read on from the offset.
        let on = view.results(&t, 8, Some(again.file), 10).unwrap();
        assert!(!on.reset);
        assert_eq!(on.records, vec![json!({"c": 2}), json!({"c": 3})]);
    }

    #[test]
    fn logs_are_read_from_an_offset_or_as_a_tail() {
        let dir = tempfile::tempdir().unwrap();
        let view = ExperimentDir::new(dir.path());
        let t = trial(dir.path(), "trial_0000");
        let empty = view.log(&t, LogRange::Tail(100)).unwrap();
        assert_eq!((empty.text.as_str(), empty.next_offset), ("", 0));
        std::fs::create_dir_all(&t.dir).unwrap();
        std::fs::write(t.dir.join("guest.log"), "one\ntwo\nthree\n").unwrap();
        let tail = view.log(&t, LogRange::Tail(6)).unwrap();
        assert_eq!(
            (tail.text.as_str(), tail.offset, tail.next_offset),
            ("three\n", 8, 14)
        );
        let from = view.log(&t, LogRange::From(4)).unwrap();
        assert_eq!(from.text, "two\nthree\n");
        let past = view.log(&t, LogRange::From(1000)).unwrap();
        assert_eq!((past.text.as_str(), past.offset), ("", 14));
    }

    #[test]
    fn log_chunks_never_split_a_character() {
        let dir = tempfile::tempdir().unwrap();
        let view = ExperimentDir::new(dir.path());
        let t = trial(dir.path(), "trial_0000");
        std::fs::create_dir_all(&t.dir).unwrap();
        let log = t.dir.join("guest.log");
        // A chunk's size falls inside a 4-byte character.
        let mut text = "a".repeat(MAX_CHUNK as usize - 2);
        text.push_str("😀 λ 損失\n");
        std::fs::write(&log, &text).unwrap();
        let mut joined = String::new();
        let mut next = 0;
        loop {
            let chunk = view.log(&t, LogRange::From(next)).unwrap();
            assert_eq!(chunk.offset, next);
            assert!(
                !chunk.text.contains('\u{FFFD}'),
                "{:?}",
                &chunk.text[..8.min(chunk.text.len())]
            );
            if chunk.next_offset == next {
                break;
            }
            joined.push_str(&chunk.text);
            next = chunk.next_offset;
        }
        assert_eq!(joined, text);
        // A tail starting inside a character starts after it.
        let tail = view.log(&t, LogRange::Tail(9)).unwrap();
        assert_eq!(
            (tail.text.as_str(), tail.offset),
            (" 損失\n", text.len() as u64 - 8)
        );
        // A character still being written waits for its last byte.
        let mut file = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
        std::io::Write::write_all(&mut file, &"λ".as_bytes()[..1]).unwrap();
        let waiting = view.log(&t, LogRange::From(next)).unwrap();
        assert_eq!((waiting.text.as_str(), waiting.next_offset), ("", next));
        std::io::Write::write_all(&mut file, &"λ".as_bytes()[1..]).unwrap();
        assert_eq!(view.log(&t, LogRange::From(next)).unwrap().text, "λ");
        // Bytes that are no UTF-8 at all are replaced, not held back.
        assert_eq!(whole_characters(b"ab\xff", true), (0, 3));
        assert_eq!(whole_characters(b"\x80\x80\x80\x80", true), (3, 4));
    }

    #[test]
    fn the_best_trial_follows_the_mode_and_skips_missing_values() {
        let dir = tempfile::tempdir().unwrap();
        let mut trials: Vec<Trial> = (0..3)
            .map(|i| trial(dir.path(), &format!("trial_{i}")))
            .collect();
        for (t, loss) in trials.iter_mut().zip([Some(0.5), None, Some(0.2)]) {
            if let Some(loss) = loss {
                let mut record = Map::new();
                record.insert("loss".into(), json!(loss));
                t.last_result = Some(record);
            }
        }
        assert_eq!(
            best(&trials, "loss", Mode::Min).unwrap().trial_id,
            "trial_2"
        );
        assert_eq!(
            best(&trials, "loss", Mode::Max).unwrap().trial_id,
            "trial_0"
        );
        assert!(best(&trials, "acc", Mode::Max).is_none());
        let counts = counts(&trials);
        assert_eq!(counts["PENDING"], 3);
        assert_eq!(counts["ERROR"], 0);
    }
}
