//! Per-trial result files, written as results arrive:
//! - `params.json`: the trial's configuration;
//! - `result.jsonl`: one JSON object per result (metrics, auto-filled
//!   fields, nested `config`), `pandas.read_json(path, lines=True)`;
//! - `progress.csv`: the same results flattened (`config/lr` columns),
//!   `pandas.read_csv(path)`. Columns come from the first result; metrics
//!   that first appear later are only in `result.jsonl`.
//!
//! A trial that continues after a recovered failure appends to its files, as
//! Ray Tune does: iterations redone after the restore appear again with
//! their new results. A trial that starts again (after a pause, or in
//! `wtune resume`) first has its files cut back to the iteration it
//! continues from (0 when it starts over), atomically, so that after a
//! process killed outright each iteration is in the files once and a
//! partly written last line is gone.
//!
//! A trial's directory and files are made by its [`TrialSetup`], on the
//! thread that launches it and outside the runner's lock, so that trials
//! starting together make theirs in parallel: on a disk, those five
//! creations are most of what a short trial costs.
//!
//! Results are formatted on the runner's thread into the trial's buffers
//! and written by a background thread (`wtune-results`) at most
//! [`FLUSH_AFTER`] after the first of them arrived, whole lines at a time,
//! so a reader of `result.jsonl` never sees a partial line and sees each
//! result within that delay. Writing every result with its own two system
//! calls on the runner's thread capped result throughput (BENCHMARKS.md).
//! A trial's last result (`done`), a checkpoint about to be written, a
//! recovery, a pause, the trial's end and the experiment's end write what is
//! buffered at once, on the runner's thread, so those writes' errors are
//! reported where they happen and every line up to a checkpoint is in the
//! file before the checkpoint's file exists (`wtune resume` continues from
//! the newest checkpoint on disk, whatever the saved state says). A process
//! killed outright loses at most the results of its last [`FLUSH_AFTER`]
//! from the files, all of them after the trial's newest checkpoint, which
//! `wtune resume` runs again.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::Write;
use std::mem;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::{Map, Value};

use super::scalars::Scalars;
use super::tfevents;
use crate::persist;
use crate::tune::{Callback, ExperimentSummary, Trial, TrialSetup, TrialStatus};

/// Longest a formatted result waits in memory before it is written.
pub const FLUSH_AFTER: Duration = Duration::from_millis(100);
/// Buffered bytes of one trial past which the runner writes them itself
/// (the background thread is behind).
const MAX_PENDING: usize = 1 << 20;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding a lock leaves whole lines behind: the buffers
    // only ever grow by complete records.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Formatted results not yet written: whole lines only.
#[derive(Default)]
struct Pending {
    jsonl: Vec<u8>,
    csv: Vec<u8>,
    /// TensorBoard event records.
    events: Vec<u8>,
    /// The trial is in the background thread's queue.
    queued: bool,
}

/// A trial's open files and the buffers they are written from.
struct Slot {
    dir: PathBuf,
    /// Whether the trial gets a TensorBoard event file.
    tensorboard: bool,
    pending: Mutex<Pending>,
    /// Held while writing: whoever writes takes the buffered bytes and
    /// writes them before anyone else takes more, so lines stay in order.
    /// `None` until the trial's setup has opened them.
    files: Mutex<Option<Files>>,
    /// A background write failed; the message is in `files.error`.
    failed: AtomicBool,
}

struct Files {
    jsonl: File,
    csv: File,
    /// The TensorBoard event file, when the trial has one.
    events: Option<File>,
    /// Emptied buffers, reused.
    spare: [Vec<u8>; 3],
    error: Option<String>,
    /// A continuing trial's CSV columns, read when the files were opened,
    /// until its first result takes them.
    header: Option<Vec<String>>,
    /// Bytes both files held when they were opened (after the cut-back),
    /// until the trial's first result takes them into its count.
    held: Option<u64>,
}

impl Slot {
    /// Writes everything buffered so far. `from_queue`: the background
    /// thread took the trial from its queue.
    fn write_pending(&self, from_queue: bool) -> Result<(), String> {
        let mut files = lock(&self.files);
        let Some(files) = files.as_mut() else {
            // Not open yet: the lines wait for the trial's setup. (A trial
            // reports only once launched, after its setup, so none do.)
            if from_queue {
                lock(&self.pending).queued = false;
            }
            return Ok(());
        };
        let [jsonl, csv, events] = {
            let mut pending = lock(&self.pending);
            if from_queue {
                pending.queued = false;
            }
            // Once lines are lost, later ones are not written after the gap,
            // and the runner hears of the loss at every write it asks for.
            if let Some(message) = &files.error {
                pending.jsonl.clear();
                pending.csv.clear();
                pending.events.clear();
                return Err(message.clone());
            }
            if pending.jsonl.is_empty() && pending.csv.is_empty() && pending.events.is_empty() {
                return Ok(());
            }
            let [a, b, c] = &mut files.spare;
            [
                mem::replace(&mut pending.jsonl, mem::take(a)),
                mem::replace(&mut pending.csv, mem::take(b)),
                mem::replace(&mut pending.events, mem::take(c)),
            ]
        };
        let written = files
            .jsonl
            .write_all(&jsonl)
            .and_then(|()| files.csv.write_all(&csv))
            .and_then(|()| match &mut files.events {
                Some(file) => file.write_all(&events),
                None => Ok(()),
            })
            .map_err(|e| format!("writing results in {}: {e}", self.dir.display()));
        files.spare = [jsonl, csv, events];
        for buffer in &mut files.spare {
            buffer.clear();
        }
        if let Err(message) = &written {
            files.error.get_or_insert_with(|| message.clone());
        }
        written
    }

    /// The first write error the background thread met, if any.
    fn background_error(&self) -> Option<String> {
        if !self.failed.load(Ordering::Relaxed) {
            return None;
        }
        lock(&self.files).as_ref().and_then(|f| f.error.clone())
    }

    /// Makes the trial's directory, writes its `params.json` and opens its
    /// result files for appending, first cutting them back to the results
    /// of iterations up to `continues_after`.
    fn open(&self, trial_id: &str, config: &Value, continues_after: u64) -> Result<(), String> {
        let dir = &self.dir;
        persist::create_dir(dir)?;
        let name = |file: &str| dir.join(file);
        cut_back(&name("result.jsonl"), continues_after, jsonl_kept)?;
        cut_back(&name("progress.csv"), continues_after, csv_kept)?;
        let events = if self.tensorboard {
            Some(open_events(dir, trial_id, config, continues_after)?)
        } else {
            None
        };
        // Written once into a fresh directory, so no fsync: two fsyncs per
        // trial would dominate the runner's bookkeeping (see BENCHMARKS.md).
        std::fs::write(name("params.json"), persist::json_bytes(config))
            .map_err(|e| format!("writing {}: {e}", name("params.json").display()))?;
        let append = |file: &str| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(name(file))
                .map_err(|e| format!("opening {}: {e}", name(file).display()))
        };
        let jsonl = append("result.jsonl")?;
        let csv = append("progress.csv")?;
        let size = |file: &File| file.metadata().map_or(0, |m| m.len());
        let held = size(&jsonl) + size(&csv) + events.as_ref().map_or(0, size);
        // A continuing trial keeps its CSV's columns. Only a file that
        // already has rows (its size from the handle just opened) is read
        // for them: a new trial's empty file costs no second open.
        let header = match csv.metadata() {
            Ok(meta) if meta.len() > 0 => {
                std::fs::read(name("progress.csv")).ok().and_then(|bytes| {
                    let mut reader = csv::Reader::from_reader(bytes.as_slice());
                    let header = reader.headers().ok()?;
                    (!header.is_empty()).then(|| header.iter().map(str::to_string).collect())
                })
            }
            _ => None,
        };
        *lock(&self.files) = Some(Files {
            jsonl,
            csv,
            events,
            spare: Default::default(),
            error: None,
            header,
            held: Some(held),
        });
        Ok(())
    }
}

/// Opens the trial's TensorBoard event file for appending: the one an
/// earlier launch made, cut back to iterations up to `continues_after`,
/// else a new one that starts with the file version and the trial's
/// configuration for the HParams tab.
fn open_events(
    dir: &Path,
    trial_id: &str,
    config: &Value,
    continues_after: u64,
) -> Result<File, String> {
    let now = super::unix_time();
    let path = match newest_events(dir)? {
        Some(path) => {
            cut_back(&path, continues_after, tfevents::kept)?;
            path
        }
        None => dir.join(tfevents::file_name(now.as_secs())),
    };
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|e| format!("opening {}: {e}", path.display()))?;
    // A new file (or one with no intact record left) starts with the file
    // version and the configuration the trial starts with: TensorBoard
    // keeps a session's first, so one PBT changes later is not restated
    // (its values are scalars instead, see `TrialFiles::config_scalars`).
    if file.metadata().map_or(0, |m| m.len()) == 0 {
        let mut head = Vec::new();
        tfevents::file_version(&mut head, now.as_secs_f64());
        tfevents::session_start(&mut head, now.as_secs_f64(), trial_id, config);
        file.write_all(&head)
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    Ok(file)
}

/// The trial's newest TensorBoard event file (names start with the time
/// they were made), if it has one.
fn newest_events(dir: &Path) -> Result<Option<PathBuf>, String> {
    let unreadable = |e: std::io::Error| format!("reading {}: {e}", dir.display());
    let mut ours: Vec<PathBuf> = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(unreadable)? {
        let name = entry.map_err(unreadable)?.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(tfevents::FILE_PREFIX) && name.ends_with(tfevents::FILE_SUFFIX) {
            ours.push(dir.join(&*name));
        }
    }
    ours.sort();
    Ok(ours.pop())
}

/// Appends the end of a trial's HParams session to its newest event file,
/// for a trial whose files are closed (it ended while paused). A trial that
/// never made one gets none.
fn end_closed_session(
    dir: &Path,
    iterations: u64,
    status: tfevents::SessionStatus,
) -> Result<(), String> {
    let Some(path) = newest_events(dir)? else {
        return Ok(());
    };
    let mut record = Vec::new();
    tfevents::session_end(
        &mut record,
        super::unix_time().as_secs_f64(),
        iterations,
        status,
    );
    std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .and_then(|mut file| file.write_all(&record))
        .map_err(|e| format!("writing {}: {e}", path.display()))
}

/// Rewrites `path` (atomically) with only what `kept` keeps of it for a
/// trial continuing after iteration `after`; leaves it alone when that is
/// all of it, when it does not exist, or when it is not a regular file
/// (a device or a link someone put there is not the host's to rewrite).
fn cut_back(path: &Path, after: u64, kept: fn(&[u8], u64) -> Vec<u8>) -> Result<(), String> {
    let unreadable = |e: std::io::Error| format!("reading {}: {e}", path.display());
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_file() && meta.len() > 0 => {}
        Ok(_) => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(unreadable(e)),
    }
    let bytes = std::fs::read(path).map_err(unreadable)?;
    let keep = kept(&bytes, after);
    if keep.len() == bytes.len() {
        return Ok(());
    }
    persist::write_atomic(path, &keep).map_err(|e| format!("rewriting {}: {e}", path.display()))
}

/// The whole lines of `bytes` (a write cut short leaves a partial last one).
fn whole_lines(bytes: &[u8]) -> impl Iterator<Item = &[u8]> {
    let end = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    bytes[..end].split_inclusive(|&b| b == b'\n')
}

/// The `result.jsonl` lines of iterations up to `after`.
fn jsonl_kept(bytes: &[u8], after: u64) -> Vec<u8> {
    #[derive(serde::Deserialize)]
    struct Line {
        training_iteration: u64,
    }
    whole_lines(bytes)
        .filter(|line| {
            serde_json::from_slice::<Line>(line).is_ok_and(|l| l.training_iteration <= after)
        })
        .flatten()
        .copied()
        .collect()
}

/// The `progress.csv` header and the rows of iterations up to `after`.
fn csv_kept(bytes: &[u8], after: u64) -> Vec<u8> {
    let mut lines = whole_lines(bytes);
    let Some(header) = lines.next() else {
        return Vec::new();
    };
    let column = csv::Reader::from_reader(header)
        .headers()
        .ok()
        .and_then(|h| h.iter().position(|name| name == "training_iteration"));
    let Some(column) = column else {
        // Not a file of ours: only partial lines are dropped.
        return whole_lines(bytes).flatten().copied().collect();
    };
    let mut kept = header.to_vec();
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .from_reader(&bytes[header.len()..]);
    let mut start = header.len();
    let mut record = csv::ByteRecord::new();
    while reader.read_byte_record(&mut record).unwrap_or(false) {
        let end = header.len() + reader.position().byte() as usize;
        let iteration = record
            .get(column)
            .and_then(|field| std::str::from_utf8(field).ok()?.parse::<u64>().ok());
        if iteration.is_some_and(|i| i <= after) && bytes[..end].ends_with(b"\n") {
            kept.extend_from_slice(&bytes[start..end]);
        }
        start = end;
    }
    kept
}

/// The background thread's queue: trials with buffered results.
#[derive(Default)]
struct Queue {
    slots: Vec<Arc<Slot>>,
    stop: bool,
}

#[derive(Default)]
struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
}

fn flush_loop(shared: &Shared) {
    let mut queue = lock(&shared.queue);
    loop {
        while queue.slots.is_empty() && !queue.stop {
            queue = shared
                .wake
                .wait(queue)
                .unwrap_or_else(PoisonError::into_inner);
        }
        if queue.slots.is_empty() {
            return;
        }
        // Let the trials' results gather: one write per trial and file for
        // all of them.
        let (waited, _) = shared
            .wake
            .wait_timeout_while(queue, FLUSH_AFTER, |q| !q.stop)
            .unwrap_or_else(PoisonError::into_inner);
        queue = waited;
        let slots = mem::take(&mut queue.slots);
        drop(queue);
        for slot in slots {
            if slot.write_pending(true).is_err() {
                slot.failed.store(true, Ordering::Relaxed);
            }
        }
        queue = lock(&shared.queue);
    }
}

/// The background writer.
struct Flusher {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Flusher {
    fn spawn() -> std::io::Result<Self> {
        let shared = Arc::new(Shared::default());
        let inner = shared.clone();
        let thread = std::thread::Builder::new()
            .name("wtune-results".into())
            .spawn(move || flush_loop(&inner))?;
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }

    fn enqueue(&self, slot: Arc<Slot>) {
        let mut queue = lock(&self.shared.queue);
        queue.slots.push(slot);
        if queue.slots.len() == 1 {
            self.shared.wake.notify_one();
        }
    }

    fn stop(&mut self) {
        lock(&self.shared.queue).stop = true;
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A trial's files, as the runner's thread sees them.
struct Open {
    slot: Arc<Slot>,
    /// The CSV's columns, once known.
    columns: Option<Vec<String>>,
    keys: Keys,
    /// Bytes of the trial's files, written or buffered, once its first
    /// result came (those from earlier launches included).
    bytes: u64,
    /// What the trial's event file gets of each result, when it has one.
    tensorboard: Option<Logged>,
}

/// Which scalars an event file gets.
#[derive(Clone, Copy)]
enum Logged {
    Metrics,
    /// Numeric configuration values too.
    MetricsAndConfig,
}

/// Object keys as JSON text (`"lr":`), in the order the trial's previous
/// result had them: results mostly repeat the keys of the one before, so
/// each key is escaped once per trial.
#[derive(Default)]
struct Keys {
    cache: Vec<(String, Vec<u8>)>,
    /// Keys written so far in the current result.
    next: usize,
}

impl Keys {
    fn write(&mut self, key: &str, json: &mut Vec<u8>) -> serde_json::Result<()> {
        let i = self.next;
        self.next += 1;
        if let Some((cached, text)) = self.cache.get(i)
            && cached == key
        {
            json.extend_from_slice(text);
            return Ok(());
        }
        let mut text = Vec::with_capacity(key.len() + 3);
        serde_json::to_writer(&mut text, key)?;
        text.push(b':');
        json.extend_from_slice(&text);
        let entry = (key.to_string(), text);
        match self.cache.get_mut(i) {
            Some(slot) => *slot = entry,
            None => self.cache.push(entry),
        }
        Ok(())
    }
}

/// Flattened `(column, text)` pairs of one result, reusing their strings
/// from one result to the next.
#[derive(Default)]
struct Flat {
    entries: Vec<(String, Vec<u8>)>,
    len: usize,
}

impl Flat {
    fn clear(&mut self) {
        self.len = 0;
    }

    fn push(&mut self) -> &mut (String, Vec<u8>) {
        if self.len == self.entries.len() {
            self.entries.push(Default::default());
        }
        let entry = &mut self.entries[self.len];
        self.len += 1;
        entry.0.clear();
        entry.1.clear();
        entry
    }

    fn as_slice(&self) -> &[(String, Vec<u8>)] {
        &self.entries[..self.len]
    }
}

/// The callback that writes every trial's result files.
pub struct TrialFiles {
    open: BTreeMap<usize, Open>,
    flusher: Option<Flusher>,
    /// No background thread could be started: every result is written at
    /// once.
    write_through: bool,
    buffers: Buffers,
    /// Most bytes of one trial's `result.jsonl`, `progress.csv` and event
    /// file together.
    cap: Option<u64>,
    /// What trials' TensorBoard event files get, if they have them.
    tensorboard: Option<Logged>,
}

/// What formatting one result needs, reused from one to the next.
#[derive(Default)]
struct Buffers {
    flat: Flat,
    path: String,
    scalars: Scalars,
}

impl Default for TrialFiles {
    fn default() -> Self {
        Self::new()
    }
}

impl TrialFiles {
    /// A logger with no files open yet, writing TensorBoard event files.
    pub fn new() -> Self {
        Self {
            open: BTreeMap::new(),
            flusher: None,
            write_through: false,
            buffers: Buffers::default(),
            cap: None,
            tensorboard: Some(Logged::Metrics),
        }
    }

    /// Whether each trial's directory also gets a TensorBoard event file
    /// (`events.out.tfevents.*.wtune`): every numeric metric as a scalar at
    /// its `training_iteration`, and the trial's configuration and how it
    /// ended for the HParams tab. On by default.
    pub fn tensorboard(mut self, on: bool) -> Self {
        self.tensorboard = on.then_some(Logged::Metrics);
        self
    }

    /// Also writes each result's numeric configuration values as scalars
    /// (`config/lr`), for schedulers that change configurations during a
    /// trial (PBT): TensorBoard shows a session's first configuration only.
    /// Off by default; nothing without [`TrialFiles::tensorboard`].
    pub fn config_scalars(mut self, on: bool) -> Self {
        if self.tensorboard.is_some() {
            let which = if on {
                Logged::MetricsAndConfig
            } else {
                Logged::Metrics
            };
            self.tensorboard = Some(which);
        }
        self
    }

    /// Caps each trial's `result.jsonl`, `progress.csv` and event file together at
    /// `bytes`, counted over all of the trial's launches (recoveries,
    /// pauses, `wtune resume`) from what its files hold: the result that
    /// would cross it is not written and fails the trial, so a guest that
    /// fails and is retried cannot fill the disk one instance at a time.
    /// Uncapped by default.
    pub fn cap_per_trial(mut self, bytes: u64) -> Self {
        self.cap = Some(bytes);
        self
    }

    /// Writes what `index` has buffered and closes its files.
    fn close(&mut self, index: usize) -> Result<(), String> {
        let Some(open) = self.open.remove(&index) else {
            return Ok(());
        };
        let written = open.slot.write_pending(false);
        // The background thread's queue may still hold the slot: its files
        // are closed here, not when the last reference goes.
        lock(&open.slot.files).take();
        written
    }

    /// Writes what `index` has buffered.
    fn flush(&mut self, index: usize) -> Result<(), String> {
        match self.open.get(&index) {
            Some(open) => open.slot.write_pending(false),
            None => Ok(()),
        }
    }

    /// Writes everything buffered and stops the background thread.
    fn finish(&mut self) -> Result<(), String> {
        let mut first_error = None;
        for open in mem::take(&mut self.open).into_values() {
            if let Err(message) = open.slot.write_pending(false) {
                first_error.get_or_insert(message);
            }
        }
        if let Some(mut flusher) = self.flusher.take() {
            flusher.stop();
        }
        first_error.map_or(Ok(()), Err)
    }
}

impl Drop for TrialFiles {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

impl Open {
    /// A trial's slot, its files not open yet ([`Slot::open`]).
    fn new(dir: &Path, tensorboard: Option<Logged>) -> Self {
        Open {
            slot: Arc::new(Slot {
                dir: dir.to_path_buf(),
                tensorboard: tensorboard.is_some(),
                pending: Mutex::default(),
                files: Mutex::new(None),
                failed: AtomicBool::new(false),
            }),
            columns: None,
            keys: Keys::default(),
            bytes: 0,
            tensorboard,
        }
    }

    /// Formats `result` into the trial's buffers: its JSON line, and its
    /// CSV row (after the header, for the trial's first row). A result
    /// that would take the trial's files past `cap` bytes is not kept.
    fn append(
        &mut self,
        result: &Map<String, Value>,
        buffers: &mut Buffers,
        cap: Option<u64>,
    ) -> Result<Appended, String> {
        let Buffers {
            flat,
            path,
            scalars,
        } = buffers;
        if self.columns.is_none() {
            let mut files = lock(&self.slot.files);
            if let Some(files) = files.as_mut() {
                self.columns = files.header.take();
                self.bytes += files.held.take().unwrap_or(0);
            }
        }
        let mut pending = lock(&self.slot.pending);
        let pending = &mut *pending;
        let before = (pending.jsonl.len(), pending.csv.len(), pending.events.len());
        let writing =
            |e: serde_json::Error| format!("writing results in {}: {e}", self.slot.dir.display());
        let last = match write_result(result, &mut pending.jsonl, flat, path, &mut self.keys) {
            Ok(last) => last,
            Err(e) => {
                pending.jsonl.truncate(before.0);
                return Err(writing(e));
            }
        };
        let flat = flat.as_slice();
        let new_columns = self.columns.is_none();
        let columns = self.columns.get_or_insert_with(|| {
            let columns: Vec<String> = flat.iter().map(|(k, _)| k.clone()).collect();
            // The header goes with the first row, in the same write.
            csv_row(&mut pending.csv, columns.iter().map(String::as_bytes));
            columns
        });
        let in_order = flat.len() == columns.len()
            && flat.iter().zip(columns.iter()).all(|((k, _), c)| k == c);
        if in_order {
            csv_row(
                &mut pending.csv,
                flat.iter().map(|(_, text)| text.as_slice()),
            );
        } else {
            let row: HashMap<&str, &[u8]> = flat
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_slice()))
                .collect();
            csv_row(
                &mut pending.csv,
                columns
                    .iter()
                    .map(|c| row.get(c.as_str()).copied().unwrap_or_default()),
            );
        }
        if let Some(which) = self.tensorboard {
            let step = result
                .get("training_iteration")
                .and_then(Value::as_u64)
                .unwrap_or(0);
            let wall_time = super::unix_time().as_secs_f64();
            scalars.fill(result, matches!(which, Logged::MetricsAndConfig));
            tfevents::scalars(&mut pending.events, scalars.as_slice(), wall_time, step);
        }
        let added = (pending.jsonl.len() - before.0 + pending.csv.len() - before.1
            + pending.events.len()
            - before.2) as u64;
        if let Some(cap) = cap
            && self.bytes + added > cap
        {
            pending.jsonl.truncate(before.0);
            pending.csv.truncate(before.1);
            pending.events.truncate(before.2);
            if new_columns {
                self.columns = None;
            }
            let iteration = result.get("training_iteration").unwrap_or(&Value::Null);
            return Err(format!(
                "its results reached the limit of {} in result.jsonl, progress.csv and its \
                 TensorBoard event file (limits.result_size); the result of iteration \
                 {iteration} was not written",
                crate::units::human_bytes(cap)
            ));
        }
        self.bytes += added;
        let full = pending.jsonl.len() >= MAX_PENDING;
        let queue = !pending.queued && !full;
        if queue {
            pending.queued = true;
        }
        Ok(Appended { queue, full, last })
    }
}

/// What [`Open::append`] found.
struct Appended {
    /// The trial's buffers were empty: it must be queued for the
    /// background thread.
    queue: bool,
    /// The buffers have grown past [`MAX_PENDING`].
    full: bool,
    /// The trial's last result (`done`).
    last: bool,
}

/// Writes `result` as one line of compact JSON (as `serde_json::to_writer`
/// does, then `\n`) into `json` and its flattened columns into `flat`;
/// true when it is the trial's last (`done`).
fn write_result(
    result: &Map<String, Value>,
    json: &mut Vec<u8>,
    flat: &mut Flat,
    path: &mut String,
    keys: &mut Keys,
) -> serde_json::Result<bool> {
    flat.clear();
    path.clear();
    keys.next = 0;
    let mut last = false;
    json.push(b'{');
    for (i, (key, value)) in result.iter().enumerate() {
        if i > 0 {
            json.push(b',');
        }
        keys.write(key, json)?;
        path.push_str(key);
        write_value(path, value, json, flat, keys)?;
        path.clear();
        last |= key == "done" && *value == Value::Bool(true);
    }
    json.extend_from_slice(b"}\n");
    Ok(last)
}

/// Writes `value` as compact JSON (as `serde_json::to_writer` does) into
/// `json`, and its flattened `(column, text)` pairs, under the column name
/// `path`, into `out`: `{"config": {"lr": 0.1}}` -> `("config/lr", "0.1")`,
/// as Ray's CSV logger does. A value's text is its JSON, except that
/// strings are unquoted and null is empty.
fn write_value(
    path: &mut String,
    value: &Value,
    json: &mut Vec<u8>,
    out: &mut Flat,
    keys: &mut Keys,
) -> serde_json::Result<()> {
    match value {
        Value::Object(map) if path.is_empty() || !map.is_empty() => {
            json.push(b'{');
            for (i, (key, v)) in map.iter().enumerate() {
                if i > 0 {
                    json.push(b',');
                }
                keys.write(key, json)?;
                let len = path.len();
                if !path.is_empty() {
                    path.push('/');
                }
                path.push_str(key);
                write_value(path, v, json, out, keys)?;
                path.truncate(len);
            }
            json.push(b'}');
        }
        _ => {
            let start = json.len();
            serde_json::to_writer(&mut *json, value)?;
            let (column, text) = out.push();
            column.push_str(path);
            match value {
                Value::Null => {}
                Value::String(s) => text.extend_from_slice(s.as_bytes()),
                _ => text.extend_from_slice(&json[start..]),
            }
        }
    }
    Ok(())
}

/// Appends one CSV record as the `csv` crate writes it by default: fields
/// holding a comma, a quote or a line break quoted (quotes doubled), `\n`
/// at the end, and a record of one empty field as `""`.
fn csv_row<'a>(out: &mut Vec<u8>, fields: impl Iterator<Item = &'a [u8]>) {
    let start = out.len();
    for (i, field) in fields.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        if field
            .iter()
            .any(|&b| matches!(b, b',' | b'"' | b'\n' | b'\r'))
        {
            out.push(b'"');
            for &b in field {
                if b == b'"' {
                    out.push(b'"');
                }
                out.push(b);
            }
            out.push(b'"');
        } else {
            out.extend_from_slice(field);
        }
    }
    if out.len() == start {
        out.extend_from_slice(b"\"\"");
    }
    out.push(b'\n');
}

/// `{"config": {"lr": 0.1}}` -> `("config/lr", "0.1")`, as Ray's CSV logger does.
#[cfg(test)]
fn flatten(prefix: &str, value: &Value, out: &mut Vec<(String, String)>) {
    let mut flat = Flat::default();
    let mut keys = Keys::default();
    write_value(
        &mut prefix.to_string(),
        value,
        &mut Vec::new(),
        &mut flat,
        &mut keys,
    )
    .unwrap();
    out.extend(
        flat.as_slice()
            .iter()
            .map(|(k, v)| (k.clone(), String::from_utf8(v.clone()).unwrap())),
    );
}

impl Callback for TrialFiles {
    fn on_trial_start(&mut self, trials: &[Trial], index: usize) -> Result<(), String> {
        let trial = &trials[index];
        // A trial started again (after a pause) writes what it still had
        // before its files are opened again; that its earlier results could
        // not all be written was reported then.
        if let Err(message) = self.close(index) {
            tracing::warn!(trial = %trial.trial_id, "{message}");
        }
        if self.flusher.is_none() && !self.write_through {
            match Flusher::spawn() {
                Ok(flusher) => self.flusher = Some(flusher),
                Err(e) => {
                    tracing::warn!(
                        "starting the wtune-results writer: {e}; writing each result at once"
                    );
                    self.write_through = true;
                }
            }
        }
        self.open
            .insert(index, Open::new(&trial.dir, self.tensorboard));
        Ok(())
    }

    fn trial_setup(&mut self, trials: &[Trial], index: usize) -> Option<TrialSetup> {
        let slot = self.open.get(&index)?.slot.clone();
        let trial = &trials[index];
        let config = trial.config.clone();
        // What the launch restores: its newest checkpoint, else nothing of
        // its own (from scratch, or from a `restore_from` checkpoint).
        let continues_after = trial.latest_checkpoint().map_or(0, |c| c.iteration);
        let trial_id = trial.trial_id.clone();
        Some(Box::new(move || {
            slot.open(&trial_id, &config, continues_after)
        }))
    }

    fn on_result(
        &mut self,
        trials: &[Trial],
        index: usize,
        result: &Map<String, Value>,
    ) -> Result<(), String> {
        let open = self
            .open
            .get_mut(&index)
            .ok_or_else(|| format!("result files for {} are not open", trials[index].trial_id))?;
        if let Some(message) = open.slot.background_error() {
            return Err(message);
        }
        let Appended { queue, full, last } = open.append(result, &mut self.buffers, self.cap)?;
        match &self.flusher {
            Some(flusher) if !(full || last) => {
                if queue {
                    flusher.enqueue(open.slot.clone());
                }
                Ok(())
            }
            _ => open.slot.write_pending(false),
        }
    }

    fn before_checkpoint(&mut self, _trials: &[Trial], index: usize) -> Result<(), String> {
        self.flush(index)
    }

    fn on_trial_recover(
        &mut self,
        _trials: &[Trial],
        index: usize,
        _reason: &str,
    ) -> Result<(), String> {
        self.flush(index)
    }

    /// A paused trial's files are closed: an experiment pausing thousands
    /// of trials (HyperBand, PBT) would otherwise hold three descriptors
    /// for each until it ends. Its next start opens them again, as it would
    /// anyway to cut them back to its checkpoint.
    fn on_trial_pause(&mut self, _trials: &[Trial], index: usize) -> Result<(), String> {
        self.close(index)
    }

    fn on_trial_end(&mut self, trials: &[Trial], index: usize) -> Result<(), String> {
        let trial = &trials[index];
        let status = match trial.status {
            TrialStatus::Error => tfevents::SessionStatus::Failure,
            _ => tfevents::SessionStatus::Success,
        };
        match self.open.get(&index) {
            Some(open) if open.tensorboard.is_some() => {
                let wall_time = super::unix_time().as_secs_f64();
                let mut pending = lock(&open.slot.pending);
                tfevents::session_end(&mut pending.events, wall_time, trial.iterations, status);
            }
            // Closed at its pause, or never started in this process.
            None if self.tensorboard.is_some() && trial.dir.is_dir() => {
                end_closed_session(&trial.dir, trial.iterations, status)?;
            }
            _ => {}
        }
        self.close(index)
    }

    fn on_experiment_end(&mut self, _summary: &ExperimentSummary) -> Result<(), String> {
        self.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Starts a trial as the runner does: its start, then its setup.
    fn start(files: &mut TrialFiles, trials: &[Trial], index: usize) -> Result<(), String> {
        files.on_trial_start(trials, index)?;
        let setup = files.trial_setup(trials, index).expect("a setup");
        setup()
    }

    #[test]
    fn flattening_matches_ray_csv_columns() {
        let mut out = Vec::new();
        flatten(
            "",
            &json!({"loss": 0.5, "config": {"lr": 0.1, "opt": {"name": "sgd"}}, "x": null}),
            &mut out,
        );
        let keys: Vec<&str> = out.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["loss", "config/lr", "config/opt/name", "x"]);
        assert_eq!(out[2].1, "sgd");
        assert_eq!(out[3].1, "");
    }

    #[test]
    fn lines_and_rows_are_what_serde_json_and_the_csv_crate_write() {
        let results = [
            json!({"loss": 0.5, "n": 3, "neg": -7, "big": u64::MAX, "tiny": 1e-300,
                   "ok": true, "none": null, "list": [1, "a,b", {"x": []}],
                   "empty": {}, "config": {"lr": 0.1, "opt": {"name": "sgd", "m": {}}}}),
            json!({"text": "comma, \"quote\"\nnew line\r\t tab \u{1} ctl é ☃ \u{1F600}",
                   "": {"": 1, "a": {}}, "weird key \"/\\": "x"}),
            json!({"only": ""}),
            json!({"only": null}),
            json!({}),
            json!({"loss": 1.0, "done": false, "config": {"done": true}}),
        ];
        // One key cache for all, as if one trial reported them in turn.
        let mut keys = Keys::default();
        for result in results.iter().chain(&results) {
            let result = result.as_object().unwrap();
            let (mut flat, mut path, mut json) = (Flat::default(), String::new(), Vec::new());
            let last = write_result(result, &mut json, &mut flat, &mut path, &mut keys).unwrap();
            assert!(!last, "only a top-level `done: true` ends the trial");
            assert_eq!(
                String::from_utf8(json).unwrap(),
                serde_json::to_string(result).unwrap() + "\n"
            );
            let mut old = Vec::new();
            flatten_reference("", &Value::Object(result.clone()), &mut old);
            let flat = flat.as_slice();
            let texts: Vec<(String, String)> = flat
                .iter()
                .map(|(k, v)| (k.clone(), String::from_utf8(v.clone()).unwrap()))
                .collect();
            assert_eq!(texts, old);
            let mut ours = Vec::new();
            csv_row(&mut ours, flat.iter().map(|(k, _)| k.as_bytes()));
            csv_row(&mut ours, flat.iter().map(|(_, v)| v.as_slice()));
            let mut theirs = csv::Writer::from_writer(Vec::new());
            theirs.write_record(flat.iter().map(|(k, _)| k)).unwrap();
            theirs.write_record(flat.iter().map(|(_, v)| v)).unwrap();
            assert_eq!(
                String::from_utf8(ours).unwrap(),
                String::from_utf8(theirs.into_inner().unwrap()).unwrap()
            );
        }
    }

    #[test]
    fn a_top_level_done_marks_the_last_result() {
        let (mut flat, mut path, mut json) = (Flat::default(), String::new(), Vec::new());
        let result = json!({"loss": 1.0, "done": true});
        let last = write_result(
            result.as_object().unwrap(),
            &mut json,
            &mut flat,
            &mut path,
            &mut Keys::default(),
        )
        .unwrap();
        assert!(last);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_failed_background_write_fails_the_trial_at_its_next_result() {
        let dir = tempfile::tempdir().unwrap();
        let tdir = dir.path().join("trial_0000");
        std::fs::create_dir_all(&tdir).unwrap();
        // Every write to the results file fails with "no space left".
        std::os::unix::fs::symlink("/dev/full", tdir.join("result.jsonl")).unwrap();
        let trials = vec![Trial::new("trial_0000".into(), json!({}), tdir)];
        let mut files = TrialFiles::new();
        start(&mut files, &trials, 0).unwrap();
        let r = json!({"loss": 1.0, "training_iteration": 1});
        // Buffered: the failure comes from the background thread.
        files.on_result(&trials, 0, r.as_object().unwrap()).unwrap();
        let started = std::time::Instant::now();
        let message = loop {
            assert!(started.elapsed() < Duration::from_secs(10), "never failed");
            std::thread::sleep(FLUSH_AFTER);
            if let Err(message) = files.on_result(&trials, 0, r.as_object().unwrap()) {
                break message;
            }
        };
        assert!(
            message.contains("writing results in") && message.contains("trial_0000"),
            "{message}"
        );
        // Its end still reports the lost lines rather than calling the
        // files whole.
        assert_eq!(files.on_trial_end(&trials, 0), Err(message));
        // The last result is written at once, and fails at once.
        let done = json!({"loss": 1.0, "done": true});
        let mut files = TrialFiles::new();
        start(&mut files, &trials, 0).unwrap();
        assert!(
            files
                .on_result(&trials, 0, done.as_object().unwrap())
                .is_err()
        );
    }

    /// The flattening this module did before it formatted JSON and CSV in
    /// one pass.
    fn flatten_reference(prefix: &str, value: &Value, out: &mut Vec<(String, String)>) {
        match value {
            Value::Object(map) if prefix.is_empty() || !map.is_empty() => {
                for (key, v) in map {
                    let name = if prefix.is_empty() {
                        key.clone()
                    } else {
                        format!("{prefix}/{key}")
                    };
                    flatten_reference(&name, v, out);
                }
            }
            Value::Null => out.push((prefix.to_string(), String::new())),
            Value::String(s) => out.push((prefix.to_string(), s.clone())),
            other => out.push((prefix.to_string(), other.to_string())),
        }
    }

    #[test]
    fn lines_reach_the_file_while_the_trial_runs_and_all_at_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let trials = vec![Trial::new(
            "trial_0000".into(),
            json!({"lr": 0.1}),
            dir.path().join("trial_0000"),
        )];
        let mut files = TrialFiles::new();
        start(&mut files, &trials, 0).unwrap();
        let r = |i: u64, done: bool| json!({"loss": 1.0 / i as f64, "training_iteration": i, "done": done});
        for i in 1..=1000 {
            files
                .on_result(&trials, 0, r(i, false).as_object().unwrap())
                .unwrap();
        }
        let jsonl = dir.path().join("trial_0000/result.jsonl");
        let csv = dir.path().join("trial_0000/progress.csv");
        let lines = |path: &Path| std::fs::read_to_string(path).unwrap().lines().count();
        // Written by the background thread within FLUSH_AFTER, whole lines
        // only, without another event.
        let started = std::time::Instant::now();
        while lines(&jsonl) < 1000 {
            let text = std::fs::read_to_string(&jsonl).unwrap();
            assert!(text.is_empty() || text.ends_with('\n'), "a partial line");
            assert!(started.elapsed() < Duration::from_secs(10), "never written");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(lines(&csv), 1001);
        // The last result is written at once.
        files
            .on_result(&trials, 0, r(1001, true).as_object().unwrap())
            .unwrap();
        assert_eq!(lines(&jsonl), 1001);
        assert_eq!(lines(&csv), 1002);
        files.on_trial_end(&trials, 0).unwrap();
        let text = std::fs::read_to_string(&jsonl).unwrap();
        for (i, line) in text.lines().enumerate() {
            let value: Value = serde_json::from_str(line).unwrap();
            assert_eq!(value["training_iteration"], json!(i + 1));
        }
    }

    #[test]
    fn writes_params_jsonl_and_csv_with_stable_columns() {
        let dir = tempfile::tempdir().unwrap();
        let trial = Trial::new(
            "trial_0000".into(),
            json!({"lr": 0.1}),
            dir.path().join("trial_0000"),
        );
        let trials = vec![trial];
        let mut files = TrialFiles::new();
        start(&mut files, &trials, 0).unwrap();
        let r1 = json!({"loss": 1.0, "training_iteration": 1, "config": {"lr": 0.1}});
        let r2 = json!({"loss": 0.5, "late": 3.0, "training_iteration": 2, "config": {"lr": 0.1}});
        files
            .on_result(&trials, 0, r1.as_object().unwrap())
            .unwrap();
        files
            .on_result(&trials, 0, r2.as_object().unwrap())
            .unwrap();
        files.on_trial_end(&trials, 0).unwrap();
        let tdir = dir.path().join("trial_0000");
        let params: Value =
            serde_json::from_str(&std::fs::read_to_string(tdir.join("params.json")).unwrap())
                .unwrap();
        assert_eq!(params, json!({"lr": 0.1}));
        let jsonl = std::fs::read_to_string(tdir.join("result.jsonl")).unwrap();
        assert_eq!(jsonl.lines().count(), 2);
        assert_eq!(
            serde_json::from_str::<Value>(jsonl.lines().nth(1).unwrap()).unwrap()["late"],
            json!(3.0)
        );
        let csv = std::fs::read_to_string(tdir.join("progress.csv")).unwrap();
        assert_eq!(
            csv,
            "loss,training_iteration,config/lr\n1.0,1,0.1\n0.5,2,0.1\n"
        );
    }

    #[test]
    fn a_continuing_trial_appends_under_the_same_columns() {
        let dir = tempfile::tempdir().unwrap();
        let mut trials = vec![Trial::new(
            "trial_0000".into(),
            json!({}),
            dir.path().join("trial_0000"),
        )];
        let r = |i: u64| json!({"loss": 1.0 / i as f64, "training_iteration": i});
        for i in 1..=2 {
            let mut files = TrialFiles::new();
            start(&mut files, &trials, 0).unwrap();
            files
                .on_result(&trials, 0, r(i).as_object().unwrap())
                .unwrap();
            files.on_trial_end(&trials, 0).unwrap();
            trials[0].checkpoints.push(checkpoint_at(i));
        }
        let tdir = dir.path().join("trial_0000");
        let csv = std::fs::read_to_string(tdir.join("progress.csv")).unwrap();
        assert_eq!(csv, "loss,training_iteration\n1.0,1\n0.5,2\n");
        let jsonl = std::fs::read_to_string(tdir.join("result.jsonl")).unwrap();
        assert_eq!(jsonl.lines().count(), 2);
    }

    fn checkpoint_at(iteration: u64) -> crate::tune::Checkpoint {
        crate::tune::Checkpoint {
            path: format!("checkpoints/checkpoint_{iteration:06}.wtsnap").into(),
            iteration,
            time_total_s: 0.0,
            fuel_total: 0,
            score: None,
            bytes: 0,
            halt: false,
        }
    }

    mod cut_back {
        use super::super::{csv_kept, jsonl_kept};
        use proptest::prelude::*;

        /// `(iteration, damaged)` rows as a killed run may leave them: any
        /// order, repeated, some lines garbage, the last one cut short.
        fn rows() -> impl Strategy<Value = (Vec<(u64, bool)>, String, u64)> {
            (
                prop::collection::vec((1u64..20, prop::bool::weighted(0.2)), 0..30),
                "[^\n]{0,40}",
                0u64..20,
            )
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            /// The cut-back keeps exactly the whole, readable rows of
            /// iterations up to `after`, in their order, and keeping again
            /// changes nothing.
            #[test]
            fn jsonl_keeps_whole_rows_up_to_the_iteration((rows, tail, after) in rows()) {
                let line = |(i, damaged): &(u64, bool)| if *damaged {
                    format!("{{\"loss\":{i},\"training_it\n")
                } else {
                    format!("{{\"loss\":{i},\"training_iteration\":{i}}}\n")
                };
                let bytes = format!("{}{tail}", rows.iter().map(line).collect::<String>());
                let expected: String = rows
                    .iter()
                    .filter(|(i, damaged)| !damaged && *i <= after)
                    .map(line)
                    .collect();
                let kept = jsonl_kept(bytes.as_bytes(), after);
                prop_assert_eq!(String::from_utf8(kept.clone()).unwrap(), expected);
                prop_assert_eq!(jsonl_kept(&kept, after), kept);
            }

            #[test]
            fn csv_keeps_the_header_and_whole_rows_up_to_the_iteration((rows, tail, after) in rows()) {
                let header = "loss,training_iteration,config/name\n";
                let line = |(i, damaged): &(u64, bool)| if *damaged {
                    format!("{i},x{i},\"a\nb\"\n")
                } else {
                    format!("{i},{i},\"a,\"\"b\"\"\"\n")
                };
                let bytes = format!("{header}{}{tail}", rows.iter().map(line).collect::<String>());
                let expected: String = std::iter::once(header.to_string())
                    .chain(rows.iter().filter(|(i, damaged)| !damaged && *i <= after).map(line))
                    .collect();
                let kept = csv_kept(bytes.as_bytes(), after);
                prop_assert_eq!(String::from_utf8(kept.clone()).unwrap(), expected);
                prop_assert_eq!(csv_kept(&kept, after), kept);
            }
        }
    }

    #[test]
    fn a_trial_started_again_keeps_each_iteration_once() {
        // A run killed after iteration 3 had written, the third line half:
        // the trial continues from its checkpoint at iteration 1.
        let dir = tempfile::tempdir().unwrap();
        let tdir = dir.path().join("trial_0000");
        std::fs::create_dir_all(&tdir).unwrap();
        let line = |i: u64| format!("{{\"loss\":{i},\"training_iteration\":{i}}}\n");
        std::fs::write(
            tdir.join("result.jsonl"),
            format!("{}{}{{\"loss\":3,\"train", line(1), line(2)),
        )
        .unwrap();
        std::fs::write(
            tdir.join("progress.csv"),
            "loss,training_iteration\n1,1\n\"2\",2\n3,",
        )
        .unwrap();
        let mut trials = vec![Trial::new("trial_0000".into(), json!({}), tdir.clone())];
        trials[0].checkpoints.push(checkpoint_at(1));
        let mut files = TrialFiles::new();
        start(&mut files, &trials, 0).unwrap();
        files
            .on_result(
                &trials,
                0,
                json!({"loss": 2, "training_iteration": 2})
                    .as_object()
                    .unwrap(),
            )
            .unwrap();
        files.on_trial_end(&trials, 0).unwrap();
        let jsonl = std::fs::read_to_string(tdir.join("result.jsonl")).unwrap();
        assert_eq!(jsonl, format!("{}{}", line(1), line(2)));
        let csv = std::fs::read_to_string(tdir.join("progress.csv")).unwrap();
        assert_eq!(csv, "loss,training_iteration\n1,1\n2,2\n");

        // Starting over (no checkpoint) keeps no row at all.
        trials[0].checkpoints.clear();
        let mut files = TrialFiles::new();
        start(&mut files, &trials, 0).unwrap();
        files.on_trial_end(&trials, 0).unwrap();
        assert_eq!(
            std::fs::read_to_string(tdir.join("result.jsonl")).unwrap(),
            ""
        );
        assert_eq!(
            std::fs::read_to_string(tdir.join("progress.csv")).unwrap(),
            "loss,training_iteration\n"
        );
    }

    /// Files of this process's open descriptors that lie under `dir`.
    #[cfg(target_os = "linux")]
    fn open_under(dir: &Path) -> Vec<PathBuf> {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
            .filter(|target| target.starts_with(dir))
            .collect()
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_paused_trial_holds_no_descriptors_and_its_session_still_ends() {
        let dir = tempfile::tempdir().unwrap();
        let tdir = dir.path().join("trial_0000");
        let mut trials = vec![Trial::new(
            "trial_0000".into(),
            json!({"x": 1}),
            tdir.clone(),
        )];
        let mut files = TrialFiles::new().tensorboard(true);
        start(&mut files, &trials, 0).unwrap();
        assert_eq!(
            open_under(&tdir).len(),
            3,
            "result.jsonl, progress.csv, events"
        );
        let result = json!({"loss": 0.5, "training_iteration": 1});
        files
            .on_result(&trials, 0, result.as_object().unwrap())
            .unwrap();
        trials[0].iterations = 1;
        trials[0].status = TrialStatus::Paused;
        files.on_trial_pause(&trials, 0).unwrap();
        assert_eq!(open_under(&tdir), Vec::<PathBuf>::new());
        let lines = std::fs::read_to_string(tdir.join("result.jsonl")).unwrap();
        assert_eq!(lines.lines().count(), 1, "written at the pause");

        // Ended while paused (a scheduler stops it): its session ends as
        // it would have with its files open.
        trials[0].status = TrialStatus::Terminated;
        files.on_trial_end(&trials, 0).unwrap();
        let events = newest_events(&tdir).unwrap().expect("an event file");
        let (records, rest) = tfevents::records(&std::fs::read(events).unwrap());
        assert_eq!(rest, 0);
        assert_eq!(records.last(), Some(&(1, true)), "{records:?}");
        assert_eq!(records.iter().filter(|(_, end)| *end).count(), 1);

        // A trial that never made files gets none at its end.
        let never = dir.path().join("trial_0001");
        let trials = vec![Trial::new("trial_0001".into(), json!({}), never.clone())];
        files.on_trial_end(&trials, 0).unwrap();
        assert!(!never.exists());
    }

    #[test]
    fn a_trials_files_stop_at_the_cap_over_all_its_launches() {
        let dir = tempfile::tempdir().unwrap();
        let tdir = dir.path().join("trial_0000");
        let mut trials = vec![Trial::new(
            "trial_0000".into(),
            json!({"x": 1}),
            tdir.clone(),
        )];
        // Launches continue from a checkpoint past every iteration here, so
        // nothing is cut back between them.
        trials[0].checkpoints.push(checkpoint_at(1000));
        let cap = 2000;
        let size = || {
            ["result.jsonl", "progress.csv"]
                .iter()
                .map(|f| std::fs::metadata(tdir.join(f)).unwrap().len())
                .sum::<u64>()
        };
        let result = |i: u64| json!({"loss": 1.0 / i as f64, "training_iteration": i});
        let mut files = TrialFiles::new().cap_per_trial(cap);
        start(&mut files, &trials, 0).unwrap();
        let mut i = 0;
        let refused = loop {
            i += 1;
            assert!(i < 1000, "never capped");
            if let Err(message) = files.on_result(&trials, 0, result(i).as_object().unwrap()) {
                break message;
            }
        };
        assert!(refused.contains("limits.result_size"), "{refused}");
        assert!(
            refused.contains(&format!("iteration {i} was not written")),
            "{refused}"
        );
        files.on_trial_end(&trials, 0).unwrap();
        let written = size();
        assert!(written <= cap, "{written} bytes");
        let lines = std::fs::read_to_string(tdir.join("result.jsonl")).unwrap();
        assert_eq!(lines.lines().count() as u64, i - 1);

        // Launched again (a recovery, a resume with new files): the cap
        // counts what is on disk, so the next result is refused at once.
        for mut files in [files, TrialFiles::new().cap_per_trial(cap)] {
            start(&mut files, &trials, 0).unwrap();
            let again = files.on_result(&trials, 0, result(i).as_object().unwrap());
            assert!(again.is_err());
            files.on_trial_end(&trials, 0).unwrap();
            assert_eq!(size(), written);
        }
    }

    #[test]
    fn unwritable_directory_fails_the_trial_with_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let blocker = dir.path().join("file");
        std::fs::write(&blocker, "x").unwrap();
        let trials = vec![Trial::new(
            "trial_0000".into(),
            json!({}),
            blocker.join("trial_0000"),
        )];
        let message = start(&mut TrialFiles::new(), &trials, 0).unwrap_err();
        assert!(
            message.contains("cannot create directory") && message.contains("trial_0000"),
            "{message}"
        );
    }
}
