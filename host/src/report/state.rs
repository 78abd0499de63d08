//! `experiment_state.json`: everything `wtune resume` needs to continue an
//! interrupted experiment: the run's setup (model, plan), every trial with
//! its status, config, counters, last result and checkpoints, and the
//! states of the scheduler and the searcher (which creates trials as the
//! run goes).
//!
//! The file is one header line, `wtune-experiment-state <version>
//! blake3=<hex>`, then the JSON body; the checksum covers the body, so a
//! damaged file is recognised as such instead of being half-read. An
//! experiment with a snapshot key seals its state instead (`mac=<hex>`, a
//! keyed blake3 of the body under a key derived from the snapshot key):
//! the state names the model, the data granted, the limits and the key
//! itself, so checkpoints that must be authenticated are worth little
//! unless the state that points at them is too ([`Sealed::open`]). Each write
//! is atomic (temporary file, fsync, rename) and first keeps the file it
//! replaces as `experiment_state.prev.json`, so a damaged newest state
//! leaves the previous one to resume from.
//!
//! Writes must not slow the run: the body is serialized on the runner's
//! thread (it must see one consistent moment) but written by a background
//! thread, and writes are spaced so that serializing costs at most
//! [`MAX_LOOP_SHARE`] of the runner's time, and never more often than
//! [`MIN_INTERVAL`]; after a trial starts or ends, as soon as
//! [`MIN_CHANGE_INTERVAL`] allows (within the same share), so that a process
//! killed just after rarely loses a trial's start or end. In fuel order a
//! mid-run state is written only at a moment between two events, and keeps
//! it ([`crate::tune::FuelMoment`]): `wtune resume` continues from there as
//! if the run had never stopped.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::persist;
use crate::snapshot::SnapshotKey;
use crate::tune::{Callback, Deciders, DecisionState, ExperimentSummary, RunSpec, Trial};

/// The state file's name inside the output directory.
pub const STATE_FILE: &str = "experiment_state.json";
/// The state it replaced, kept for when the newest is damaged.
pub const PREVIOUS_STATE_FILE: &str = "experiment_state.prev.json";
/// Format version this build writes and reads.
pub const STATE_VERSION: u32 = 1;
/// Shortest time between two mid-run writes.
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);
/// Shortest time between two mid-run writes when a trial started or ended
/// since the last one.
pub const MIN_CHANGE_INTERVAL: Duration = Duration::from_millis(50);
/// Largest share of the runner's time spent serializing state.
pub const MAX_LOOP_SHARE: f64 = 0.005;
const HEADER_PREFIX: &str = "wtune-experiment-state";
/// What the state's MAC key is derived for, so that it is never the key
/// of a snapshot's MAC.
const MAC_PURPOSE: &str = "wtune experiment state mac v1";

/// The saved experiment.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExperimentState {
    /// What the front end needs to rebuild the run (for `wtune`: the model
    /// and the validated plan); opaque here.
    pub setup: Value,
    /// `running` while the experiment runs, `finished` once it ended.
    pub status: String,
    /// When this state was written (RFC 3339).
    pub written: String,
    /// Every trial.
    pub trials: Vec<Trial>,
    /// The scheduler's and searcher's states.
    #[serde(flatten)]
    pub decisions: DecisionState,
}

#[derive(Serialize)]
struct Body<'a> {
    setup: &'a Value,
    status: &'a str,
    written: String,
    trials: &'a [Trial],
    #[serde(flatten)]
    decisions: &'a DecisionState,
}

/// Why a state file could not be used.
#[derive(Debug)]
pub enum StateError {
    /// No state file in the directory.
    Missing(PathBuf),
    /// It could not be read.
    Io(PathBuf, std::io::Error),
    /// Its content is damaged (checksum, truncation, bad JSON).
    Damaged(PathBuf, String),
    /// Written by another format version.
    Version(PathBuf, u32),
    /// Its MAC does not hold under the key given, or it has none where a
    /// key was given, or it has one and no key was given.
    Unauthenticated(PathBuf, String),
}

impl fmt::Display for StateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StateError::Missing(path) => write!(
                f,
                "{} not found: is this a wtune output directory? (experiments started by wtune \
                 before checkpoints existed cannot be resumed)",
                path.display()
            ),
            StateError::Io(path, e) => write!(f, "reading {}: {e}", path.display()),
            StateError::Damaged(path, why) => {
                write!(f, "{} is damaged: {why}", path.display())
            }
            StateError::Version(path, v) => write!(
                f,
                "{} has state format version {v}; this wtune reads version {STATE_VERSION}",
                path.display()
            ),
            StateError::Unauthenticated(path, why) => write!(f, "{}: {why}", path.display()),
        }
    }
}

impl std::error::Error for StateError {}

/// The MAC of a state's `body` under `key`.
fn mac(key: &SnapshotKey, body: &[u8]) -> blake3::Hash {
    key.purpose_mac(MAC_PURPOSE, body)
}

/// Encodes state as the file's bytes: checksummed, or sealed under `key`.
fn encode(body: &Body<'_>, key: Option<&SnapshotKey>) -> Vec<u8> {
    let json = serde_json::to_vec(body).expect("experiment state always serializes");
    let seal = match key {
        Some(key) => format!("mac={}", mac(key, &json).to_hex()),
        None => format!("blake3={}", blake3::hash(&json).to_hex()),
    };
    let mut out = format!("{HEADER_PREFIX} {STATE_VERSION} {seal}\n").into_bytes();
    out.extend_from_slice(&json);
    out.push(b'\n');
    out
}

/// A state as read: checksum verified, MAC (if it has one) not yet.
pub struct Sealed {
    path: PathBuf,
    state: ExperimentState,
    /// The MAC the file carries, and the body it covers.
    mac: Option<(blake3::Hash, Vec<u8>)>,
}

impl Sealed {
    /// The saved setup, before anything is authenticated: where to find
    /// the key, never what to act on.
    pub fn setup(&self) -> &Value {
        &self.state.setup
    }

    /// Whether the file carries a MAC.
    pub fn is_sealed(&self) -> bool {
        self.mac.is_some()
    }

    /// The state, once its MAC holds under `key`. Refused: a sealed state
    /// without a key, an unsealed one with a key (someone stripped the
    /// seal, or the experiment ran without a key), and a MAC that does not
    /// hold (the file was modified, or sealed with another key).
    pub fn open(self, key: Option<&SnapshotKey>) -> Result<ExperimentState, StateError> {
        let refused = |why: &str| Err(StateError::Unauthenticated(self.path.clone(), why.into()));
        match (&self.mac, key) {
            (None, None) => Ok(self.state),
            (Some(_), None) => refused(
                "the state is sealed with a snapshot key; give the experiment's key file to read it",
            ),
            (None, Some(_)) => refused(
                "the state carries no MAC, so it cannot be checked against the snapshot key given: \
                 it was written without a key, by a wtune older than sealed states, or someone \
                 removed its seal",
            ),
            (Some((expected, body)), Some(key)) if mac(key, body) == *expected => Ok(self.state),
            (Some(_), Some(_)) => refused(
                "the state's MAC does not match the snapshot key: it was modified, or sealed \
                 with another key",
            ),
        }
    }

    /// The state, its MAC unchecked: for showing it (the dashboard), never
    /// for resuming from it.
    pub fn unchecked(self) -> ExperimentState {
        self.state
    }
}

impl fmt::Debug for Sealed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sealed")
            .field("path", &self.path)
            .field("sealed", &self.mac.is_some())
            .finish_non_exhaustive()
    }
}

/// Decodes a state file's bytes and verifies its checksum; a sealed one's
/// MAC is left to [`Sealed::open`].
pub fn decode(path: &Path, bytes: &[u8]) -> Result<Sealed, StateError> {
    let damaged = |why: &str| StateError::Damaged(path.to_path_buf(), why.to_string());
    let newline = bytes
        .iter()
        .position(|&b| b == b'\n')
        .ok_or_else(|| damaged("no header line"))?;
    let header = std::str::from_utf8(&bytes[..newline]).map_err(|_| damaged("bad header"))?;
    let mut parts = header.split(' ');
    if parts.next() != Some(HEADER_PREFIX) {
        return Err(damaged("not a wtune experiment state file"));
    }
    let version: u32 = parts
        .next()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| damaged("bad header"))?;
    if version != STATE_VERSION {
        return Err(StateError::Version(path.to_path_buf(), version));
    }
    let seal = parts.next().ok_or_else(|| damaged("bad header"))?;
    let body = &bytes[newline + 1..];
    let body = body
        .strip_suffix(b"\n")
        .ok_or_else(|| damaged("truncated"))?;
    let mac = match (seal.strip_prefix("blake3="), seal.strip_prefix("mac=")) {
        (Some(checksum), _) => {
            if blake3::hash(body).to_hex().as_str() != checksum {
                return Err(damaged(
                    "checksum mismatch (the file was cut short or modified)",
                ));
            }
            None
        }
        (_, Some(mac)) => {
            let mac = blake3::Hash::from_hex(mac).map_err(|_| damaged("bad header"))?;
            Some((mac, body.to_vec()))
        }
        _ => return Err(damaged("bad header")),
    };
    let state = serde_json::from_slice(body).map_err(|e| damaged(&format!("content: {e}")))?;
    Ok(Sealed {
        path: path.to_path_buf(),
        state,
        mac,
    })
}

/// Reads the state in `dir`: the newest, or with `previous` the one it
/// replaced.
pub fn load(dir: &Path, previous: bool) -> Result<Sealed, StateError> {
    let path = dir.join(if previous {
        PREVIOUS_STATE_FILE
    } else {
        STATE_FILE
    });
    let bytes = std::fs::read(&path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => StateError::Missing(path.clone()),
        _ => StateError::Io(path.clone(), e),
    })?;
    decode(&path, &bytes)
}

/// Keeps the current state as the previous one, then replaces it.
fn write_file(dir: &Path, bytes: &[u8]) -> Result<(), String> {
    keep_previous(dir)?;
    let current = dir.join(STATE_FILE);
    persist::write_atomic(&current, bytes)
        .map_err(|e| format!("writing {}: {e}", current.display()))
}

/// Makes a copy of the current state file, if any, the previous one.
fn keep_previous(dir: &Path) -> Result<(), String> {
    let current = dir.join(STATE_FILE);
    if current.exists() {
        // A copy, not a rename, keeps the current file in place while the
        // previous one is replaced, so a crash never leaves the directory
        // without a state file; and not a hard link, which would share one
        // inode between the two, so that damage to one (an in-place write)
        // would be damage to both.
        let staging = dir.join(".wtune-prev-state");
        std::fs::copy(&current, &staging)
            .and_then(|_| std::fs::rename(&staging, dir.join(PREVIOUS_STATE_FILE)))
            .map_err(|e| format!("keeping the previous experiment state: {e}"))?;
    }
    Ok(())
}

/// The callback that keeps `<output_dir>/experiment_state.json` current.
pub struct StateFile {
    setup: Value,
    /// The key each state is sealed with, if any.
    key: Option<SnapshotKey>,
    dir: PathBuf,
    last_write: Instant,
    /// How far apart writes must be for serializing to stay within
    /// [`MAX_LOOP_SHARE`]; [`MIN_INTERVAL`] and [`MIN_CHANGE_INTERVAL`] apply
    /// on top.
    spacing: Duration,
    /// A trial started, ended or was checkpointed since the last write.
    changed: bool,
    /// Mid-run states, each with the `on_state` call it was taken at.
    background: Option<persist::LatestWriter<(Vec<u8>, u64)>>,
    stats: Arc<StateStats>,
    /// `on_state` calls so far.
    calls: u64,
    /// Which calls' states are on disk ([`Callback::saved_through`]).
    on_disk: Arc<OnDisk>,
}

/// The `on_state` calls whose states are the two files on disk: the
/// current one and the previous one kept beside it.
#[derive(Debug, Default)]
struct OnDisk {
    current: AtomicU64,
    previous: AtomicU64,
}

impl OnDisk {
    /// The state taken at call `call` is now the current file.
    fn written(&self, call: u64) {
        let before = self.current.swap(call, Ordering::AcqRel);
        self.previous.store(before, Ordering::Release);
    }
}

/// What state persistence has cost so far (for benchmarks and logs).
#[derive(Debug, Default)]
pub struct StateStats {
    /// Nanoseconds spent serializing on the runner's thread, mid-run.
    pub serialize_ns: AtomicU64,
    /// Mid-run states handed to the writer thread.
    pub writes: AtomicU64,
    /// Size of the newest state, in bytes.
    pub last_bytes: AtomicU64,
    /// Nanoseconds the writer thread spent writing mid-run states (keeping
    /// the previous one, writing, fsync, rename).
    pub write_ns: AtomicU64,
}

impl StateFile {
    /// `setup` is stored as is and handed back by [`load`].
    pub fn new(setup: Value) -> Self {
        Self {
            setup,
            key: None,
            dir: PathBuf::new(),
            last_write: Instant::now(),
            spacing: Duration::ZERO,
            changed: false,
            background: None,
            stats: Arc::default(),
            calls: 0,
            on_disk: Arc::default(),
        }
    }

    /// Seals every state with `key` (the experiment's snapshot key), so
    /// that [`Sealed::open`] reads it only under the same key.
    pub fn sealed(mut self, key: Option<SnapshotKey>) -> Self {
        self.key = key;
        self
    }

    /// A live view of what persisting state has cost.
    pub fn stats(&self) -> Arc<StateStats> {
        self.stats.clone()
    }

    fn bytes(&self, status: &str, trials: &[Trial], decisions: &DecisionState) -> Vec<u8> {
        let body = Body {
            setup: &self.setup,
            status,
            written: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            trials,
            decisions,
        };
        encode(&body, self.key.as_ref())
    }
}

impl Callback for StateFile {
    fn on_experiment_start(&mut self, spec: &RunSpec, _trials: &[Trial]) -> Result<(), String> {
        persist::create_dir(&spec.output_dir)?;
        self.dir = spec.output_dir.clone();
        Ok(())
    }

    fn on_state(&mut self, trials: &[Trial], deciders: &Deciders<'_>) -> Result<(), String> {
        self.calls += 1;
        if self.background.is_none() {
            // The runner's first call, before any trial starts: written
            // synchronously, so that an unwritable directory stops the run
            // at once.
            let bytes = self.bytes("running", trials, &deciders.state());
            write_file(&self.dir, &bytes)?;
            self.on_disk.written(self.calls);
            self.last_write = Instant::now();
            let target = self.dir.clone();
            let stats = self.stats.clone();
            let on_disk = self.on_disk.clone();
            let writer = persist::LatestWriter::spawn(
                "wtune-state",
                move |(bytes, call): &(Vec<u8>, u64)| {
                    let started = Instant::now();
                    let written = write_file(&target, bytes);
                    if written.is_ok() {
                        on_disk.written(*call);
                    }
                    stats
                        .write_ns
                        .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
                    written
                },
            )
            .map_err(|e| format!("starting the wtune-state writer: {e}"))?;
            self.background = Some(writer);
            return Ok(());
        }
        let since = self.last_write.elapsed();
        let shortest = if self.changed {
            MIN_CHANGE_INTERVAL
        } else {
            MIN_INTERVAL
        };
        if since < shortest.max(self.spacing) {
            return Ok(());
        }
        let started = Instant::now();
        let moment = match deciders.fuel_order {
            // Mid-event in fuel order: a resume could not continue from
            // here exactly. The loop is done with the event soon.
            Some(order) if !order.at_moment() => return Ok(()),
            Some(order) => order.moment(),
            None => None,
        };
        let bytes = self.bytes("running", trials, &deciders.state_at(moment));
        let cost = started.elapsed();
        let stats = &self.stats;
        stats
            .serialize_ns
            .fetch_add(cost.as_nanos() as u64, Ordering::Relaxed);
        stats.writes.fetch_add(1, Ordering::Relaxed);
        stats
            .last_bytes
            .store(bytes.len() as u64, Ordering::Relaxed);
        // Space writes so serializing stays a small share of the run.
        self.spacing = cost.div_f64(MAX_LOOP_SHARE);
        self.changed = false;
        if let Some(writer) = &self.background {
            writer.send((bytes, self.calls));
        }
        self.last_write = Instant::now();
        Ok(())
    }

    fn saved_through(&self) -> Option<u64> {
        Some(self.on_disk.previous.load(Ordering::Acquire))
    }

    fn on_trial_start(&mut self, _trials: &[Trial], _index: usize) -> Result<(), String> {
        self.changed = true;
        Ok(())
    }

    fn on_trial_end(&mut self, _trials: &[Trial], _index: usize) -> Result<(), String> {
        self.changed = true;
        Ok(())
    }

    /// A state listing the new checkpoint lets a resume continue from it
    /// rather than from an older one.
    fn on_checkpoint(&mut self, _trials: &[Trial], _index: usize) -> Result<(), String> {
        self.changed = true;
        Ok(())
    }

    fn on_experiment_end(&mut self, summary: &ExperimentSummary) -> Result<(), String> {
        if let Some(mut writer) = self.background.take() {
            writer.finish();
        }
        if summary.ended_mid_event {
            tracing::info!(
                "the run left while it carried out an event, which no moment describes: {} \
                 keeps the last moment saved, which `wtune resume` continues from as after a kill",
                STATE_FILE
            );
            return Ok(());
        }
        let status = summary.status();
        let bytes = self.bytes(status, &summary.trials, &summary.decisions);
        write_file(&self.dir, &bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tune::SavedState;
    use serde_json::json;

    fn sample(dir: &Path) -> Vec<u8> {
        let trials = vec![Trial::new(
            "trial_0000".into(),
            json!({"lr": 0.1}),
            dir.join("t"),
        )];
        let decisions = DecisionState {
            scheduler: SavedState {
                name: "fifo".into(),
                state: Value::Null,
            },
            searcher: None,
            stopper: None,
            fuel_burned: 0,
            moment: None,
        };
        StateFile::new(json!({"model": "m.wasm"})).bytes("running", &trials, &decisions)
    }

    #[test]
    fn round_trips_and_rejects_every_damage() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = sample(dir.path());
        let path = dir.path().join(STATE_FILE);
        let state = decode(&path, &bytes).unwrap().open(None).unwrap();
        assert_eq!(state.trials[0].config, json!({"lr": 0.1}));
        assert_eq!(state.setup, json!({"model": "m.wasm"}));
        assert_eq!(state.decisions.scheduler.name, "fifo");
        assert_eq!(state.decisions.searcher, None);
        for cut in [0, 10, bytes.len() / 2, bytes.len() - 1] {
            let err = decode(&path, &bytes[..cut]).unwrap_err();
            assert!(matches!(err, StateError::Damaged(..)), "cut {cut}: {err}");
        }
        for i in (0..bytes.len()).step_by(11) {
            let mut damaged = bytes.clone();
            damaged[i] ^= 0x01;
            assert!(decode(&path, &damaged).is_err(), "byte {i}");
        }
        let message = decode(&path, &bytes[..bytes.len() / 2])
            .unwrap_err()
            .to_string();
        assert!(
            message.contains("experiment_state.json is damaged"),
            "{message}"
        );
    }

    #[test]
    fn a_sealed_state_opens_only_under_its_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(STATE_FILE);
        let (key, other) = (
            SnapshotKey::derive(b"one key"),
            SnapshotKey::derive(b"another"),
        );
        let plain = sample(dir.path());
        let body = decode(&path, &plain).unwrap().unchecked();
        let sealed = encode(
            &Body {
                setup: &body.setup,
                status: &body.status,
                written: body.written.clone(),
                trials: &body.trials,
                decisions: &body.decisions,
            },
            Some(&key),
        );
        assert!(sealed.starts_with(b"wtune-experiment-state 1 mac="));
        let open = |bytes: &[u8], key: Option<&SnapshotKey>| {
            decode(&path, bytes).and_then(|sealed| sealed.open(key))
        };
        assert_eq!(open(&sealed, Some(&key)).unwrap().trials.len(), 1);
        for (bytes, key, why) in [
            (&sealed, None, "sealed with a snapshot key"),
            (&sealed, Some(&other), "does not match the snapshot key"),
            (&plain, Some(&key), "carries no MAC"),
        ] {
            let err = open(bytes, key).unwrap_err();
            assert!(matches!(err, StateError::Unauthenticated(..)), "{err}");
            assert!(err.to_string().contains(why), "{err}");
        }
        // A sealed body changed by one byte (still JSON) fails its MAC; the
        // dashboard may still show it.
        let at = sealed.windows(6).position(|w| w == b"m.wasm").unwrap();
        let mut edited = sealed.clone();
        edited[at] = b'n';
        let err = open(&edited, Some(&key)).unwrap_err();
        assert!(err.to_string().contains("does not match"), "{err}");
        let shown = decode(&path, &edited).unwrap().unchecked();
        assert_eq!(shown.setup, json!({"model": "n.wasm"}));
    }

    #[test]
    fn a_trial_starting_or_ending_is_written_within_the_change_interval() {
        use crate::tune::{Fifo, Listed};
        let dir = tempfile::tempdir().unwrap();
        let mut file = StateFile::new(json!({"model": "m.wasm"}));
        let spec = RunSpec::new("state", dir.path().to_path_buf());
        let mut trials = Vec::new();
        file.on_experiment_start(&spec, &trials).unwrap();
        let (scheduler, searcher) = (Fifo::default(), Listed::default());
        let deciders = Deciders {
            scheduler: &scheduler,
            searcher: &searcher,
            stopper: None,
            fuel_burned: 0,
            fuel_order: None,
        };
        // The first state is written at once, listing no trial.
        file.on_state(&trials, &deciders).unwrap();
        let stats = file.stats();
        // Without a change, the next write waits for MIN_INTERVAL...
        std::thread::sleep(MIN_CHANGE_INTERVAL);
        file.on_state(&trials, &deciders).unwrap();
        assert_eq!(stats.writes.load(Ordering::Relaxed), 0);
        // ... but a trial that starts is written at the next chance after
        // MIN_CHANGE_INTERVAL, and so is its end.
        trials.push(Trial::new(
            "trial_0000".into(),
            json!({"lr": 0.1}),
            dir.path().join("t"),
        ));
        file.on_trial_start(&trials, 0).unwrap();
        file.on_state(&trials, &deciders).unwrap();
        assert_eq!(stats.writes.load(Ordering::Relaxed), 1);
        file.on_trial_end(&trials, 0).unwrap();
        file.on_state(&trials, &deciders).unwrap();
        assert_eq!(
            stats.writes.load(Ordering::Relaxed),
            1,
            "not sooner than the change interval"
        );
        // Writes are also spaced by what the last one cost to serialize,
        // which a loaded machine can stretch past the change interval.
        std::thread::sleep(MIN_CHANGE_INTERVAL.max(file.spacing));
        file.on_state(&trials, &deciders).unwrap();
        assert_eq!(stats.writes.load(Ordering::Relaxed), 2);
        // The writer thread has the newest state on disk by the end.
        file.background.take().unwrap().finish();
        assert_eq!(
            load(dir.path(), false)
                .unwrap()
                .open(None)
                .unwrap()
                .trials
                .len(),
            1
        );
    }

    #[test]
    fn in_fuel_order_a_state_is_written_only_at_a_moment_and_keeps_it() {
        use crate::tune::{AtMoment, Fifo, FuelMoment, Listed};
        use std::cell::Cell;
        struct Order(Cell<bool>);
        impl AtMoment for Order {
            fn at_moment(&self) -> bool {
                self.0.get()
            }
            fn moment(&self) -> Option<FuelMoment> {
                self.0.get().then(|| FuelMoment {
                    now: 42,
                    decisions: 3,
                    clocks: Vec::new(),
                })
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let mut file = StateFile::new(json!({"model": "m.wasm"}));
        let spec = RunSpec::new("state", dir.path().to_path_buf());
        let trials = Vec::new();
        file.on_experiment_start(&spec, &trials).unwrap();
        let (scheduler, searcher) = (Fifo::default(), Listed::default());
        let order = Order(Cell::new(true));
        let deciders = Deciders {
            scheduler: &scheduler,
            searcher: &searcher,
            stopper: None,
            fuel_burned: 0,
            fuel_order: Some(&order),
        };
        file.on_state(&trials, &deciders).unwrap();
        let stats = file.stats();
        // The first state, taken at call 1, is the only one on disk.
        assert_eq!(file.saved_through(), Some(0));
        // Mid-event: a change is due, but nothing is written...
        order.0.set(false);
        file.on_trial_end(&trials, 0).unwrap();
        std::thread::sleep(MIN_CHANGE_INTERVAL);
        file.on_state(&trials, &deciders).unwrap();
        assert_eq!(stats.writes.load(Ordering::Relaxed), 0);
        // ... until the next moment.
        order.0.set(true);
        file.on_state(&trials, &deciders).unwrap();
        assert_eq!(stats.writes.load(Ordering::Relaxed), 1);
        file.background.as_mut().unwrap().finish();
        let saved = load(dir.path(), false)
            .unwrap()
            .open(None)
            .unwrap()
            .decisions
            .moment
            .unwrap();
        assert_eq!((saved.now, saved.decisions), (42, 3));
        // The states of calls 3 and 1 are on disk: the older was taken
        // after one call.
        assert_eq!(file.saved_through(), Some(1));

        // A run that leaves mid-event keeps the last moment saved...
        let mut summary = ExperimentSummary {
            name: "state".into(),
            output_dir: dir.path().to_path_buf(),
            metric: None,
            mode: crate::tune::Mode::Max,
            trials: Vec::new(),
            best: None,
            wall_time: Duration::ZERO,
            halted: Some("interrupted twice".into()),
            stopped: None,
            decisions: deciders.state_at(None),
            ended_mid_event: true,
        };
        file.on_experiment_end(&summary).unwrap();
        let kept = load(dir.path(), false).unwrap().open(None).unwrap();
        assert_eq!(kept.status, "running");
        assert_eq!(kept.decisions.moment.unwrap().now, 42);
        // ... where any other end is saved as it is.
        summary.ended_mid_event = false;
        file.on_experiment_end(&summary).unwrap();
        let ended = load(dir.path(), false).unwrap().open(None).unwrap();
        assert_eq!(ended.status, "halted");
        assert_eq!(ended.decisions.moment, None);
    }

    #[test]
    fn each_write_keeps_the_previous_state() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            load(dir.path(), false),
            Err(StateError::Missing(_))
        ));
        let first = sample(dir.path());
        write_file(dir.path(), &first).unwrap();
        let mut second = first.clone();
        second.truncate(first.len() - 20);
        write_file(dir.path(), &second).unwrap();
        assert!(matches!(
            load(dir.path(), false),
            Err(StateError::Damaged(..))
        ));
        let previous = load(dir.path(), true).unwrap().open(None).unwrap();
        assert_eq!(previous.trials.len(), 1);
        // Damage written in place into the newest file leaves the previous
        // one intact: they are separate files.
        // (Here the process dies after keeping the previous state and
        // before writing the new one.)
        write_file(dir.path(), &first).unwrap();
        keep_previous(dir.path()).unwrap();
        std::fs::write(dir.path().join(STATE_FILE), b"garbage").unwrap();
        assert!(load(dir.path(), true).is_ok());
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names.len(), 2, "no temporary files left: {names:?}");
    }
}
