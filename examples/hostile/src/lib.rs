//! # hostile: a trainable that misbehaves on purpose
//!
//! One component whose behaviour is chosen by its config, used by the host's
//! test suite to check that every kind of misbehaving guest ends its trial
//! cleanly (as ERROR with a clear reason, or stopped by a limit) without
//! hurting the host or other trials.
//!
//! ## Config
//!
//! ```json
//! {"attack": "none", "at": 1, "iterations": 5}
//! ```
//!
//! - `attack` (default `"none"`): one of the names below. An unknown name
//!   makes `setup()` fail with an error that lists the valid ones.
//! - `at` (default 1): the `train()` call (counting from 1) at which the
//!   attack fires. Earlier calls behave like `"none"`. Must be at least 1.
//! - `iterations` (default 5): when the benign path sets `done`. Must be at
//!   least 1. If `at > iterations` the trial finishes before the attack fires.
//! - `port` (default 9): the loopback port `sockets` tries to reach.
//! - `pace_ms` (default 0): how long each benign `train()` call sleeps, so
//!   that tests can interrupt an experiment in the middle of its trials.
//!
//! Other keys are ignored, so a search space may add its own parameters.
//!
//! The `score` metric (= iteration) is in every report this crate produces
//! except `big_report`'s and `huge_metric_name`'s, so experiments can rank by
//! `score`.
//!
//! ## Attacks and their intended outcome
//!
//! | attack             | what the guest does                                             | intended outcome |
//! |--------------------|-----------------------------------------------------------------|------------------|
//! | `none`             | reports `score` = iteration, `done` at `iterations`             | TERMINATED after `iterations` reports |
//! | `error`            | returns `Err("deliberate failure at iteration N")`              | ERROR with that message, no trap |
//! | `panic`            | `panic!("hostile guest panicked on purpose")`                   | trap; ERROR quoting the panic message from stderr |
//! | `trap`             | executes wasm `unreachable` without panicking                   | trap; ERROR, no panic message |
//! | `loop_train`       | spins forever in `train()`                                      | never returns: ended by fuel or the wall-clock deadline |
//! | `loop_setup`       | spins forever in `setup()` (ignores `at`)                       | never returns: ended by fuel or the wall-clock deadline |
//! | `loop_save`        | `save()` spins forever once `at` iterations are done            | the checkpoint fails: ERROR `checkpoint at iteration N failed: save() exceeded ...` (fuel or deadline) |
//! | `loop_restore`     | `train()` fails at `at` (so the host recovers from the newest checkpoint); `restore()` spins forever | the recovery fails: ERROR `restore() exceeded ...` (fuel or deadline); needs guest checkpoints and `max_failures` >= 1 |
//! | `loop_reset`       | `reset()` spins forever (ignores `at`)                          | ERROR `reset() exceeded ...` (fuel or deadline) when the host switches a restored snapshot to this config |
//! | `loop_cleanup`     | `cleanup()` spins forever (ignores `at`)                        | cleanup ended by fuel or the deadline; the trial keeps the status it ended with (its results are complete) and the host logs a warning naming `cleanup()` |
//! | `memory_bomb`      | allocates and touches 16 MiB blocks forever, keeping them all   | stopped by the memory cap (trap) |
//! | `recursion`        | unbounded non-tail recursion                                    | trap when the wasm call stack hits the host's limit (wasmtime "call stack exhausted") |
//! | `stdout_flood`     | writes 64 KiB of 1 KiB lines to stdout forever (and stderr every 16th) | capture capped; ended by fuel or the deadline |
//! | `log_flood`        | sends 64 KiB `info!` lines to the host log forever              | log capped; ended by fuel or the deadline |
//! | `exit`             | calls `std::process::exit(3)` (WASI's `exit`, status 1 in WASI 0.2) | ERROR naming the exit and its status |
//! | `report_flood`     | from the `at`-th `train()` on, every report is the largest the host accepts: `score` and 255 metrics with 256-byte names; fails (`Err`) every 5th call so the host retries it | ERROR naming the result limit (`limits.result_size`); the trial's result files stay under it across retries |
//! | `big_report`       | returns a report with 100 000 metrics `m0`, `m1`, ... (no `score`) | host rejects the report: ERROR |
//! | `reserved_metric`  | returns `score` and a metric named `training_iteration`         | host rejects the report: ERROR |
//! | `metric_name_flood` | from the `at`-th `train()` on, reports `score` and 255 metric names it never used before, and never `done` | ERROR once its reports would use more than 1,024 names in all |
//! | `huge_error`       | returns an error message of 100 000 000 bytes                   | ERROR quoting only the message's first 4 KiB and naming its size |
//! | `huge_metric_name` | returns one metric whose name is 100 000 000 bytes              | host rejects the report: ERROR naming the length, not quoting the name |
//! | `huge_log`         | sends one 100 000 000-byte line to the host log, then behaves as `none` | the line is cut to 16 KiB in `guest.log` with a marker naming its size; TERMINATED |
//! | `big_save`         | `save()` returns 100 000 000 bytes once `at` iterations are done | the checkpoint fails: ERROR naming the size and the cap (the host's `Limits::checkpoint_bytes`, 64 MiB by default); nothing written |
//! | `escape`           | tries to read, list, link (hard and symbolic) and write outside its sandbox, and to plant three symlinks `planted-*` pointing outside in its directory (the host refuses symbolic links) | ERROR `"all escape attempts denied: ..."`; an `Ok` report (`done`) with `score` and `escaped` > 0 means the sandbox leaked |
//! | `sockets`          | TCP connect to `127.0.0.1:port`, TCP listen, UDP send to `127.0.0.1:port`, DNS lookup of `localhost` | ERROR `"all socket attempts denied: ..."`; an `Ok` report (`done`) with `score` and `escaped` > 0 means the network leaked |
//! | `sleep_train`      | `std::thread::sleep` for an hour, in a loop, in `train()` (a blocking WASI poll: no fuel burned, no epoch check reached) | ended by the wall-clock deadline: ERROR `train() at iteration N exceeded its ... deadline` |
//! | `sleep_setup`      | the same in `setup()` (ignores `at`)                            | ERROR `setup() exceeded its ... deadline` |
//! | `sleep_cleanup`    | the same in `cleanup()` (ignores `at`)                          | cleanup ended by the deadline; the trial keeps its status and the host logs a warning |
//! | `terminal`         | returns `Err` with terminal escapes (clear screen, retitle, colours), `\r` and a newline followed by a forged `Best trial:` line | ERROR whose reason is kept raw in the trial's files and shown escaped on the terminal |
//! | `open_files`       | opens files in its directory and keeps every one open, forever  | ERROR naming the open-handle limit (`limits.open_files`); other trials' files still open |
//! | `disk_fill`        | writes 1 MiB files (`fill-N`) into its directory forever, rewriting the first in place and removing an older one now and then | ERROR naming the disk limit (`limits.disk`); files rewritten or removed are not counted twice |
//! | `disk_unlinked`    | writes 1 MiB files (`held-N`) and removes each while it is open, forever: every other one stays open, the rest are truncated through their handle after the removal and a 1 MiB file (`kept-N`) is written in their place | ERROR naming the disk limit (`limits.disk`): a removed file still open keeps its bytes charged, and a truncation after the removal is not credited twice |
//! | `disk_stale_stream` | forever: gives a file (`stream-N`) 1 MiB with `set-size`, opens a `write-via-stream` at 0, truncates the file to 0, then writes 1 MiB through the stream; and writes 4 KiB (then 4 KiB of zeroes and a 4 KiB splice) through a stream 1 MiB past the end of a new file (`gap-N`), then removes that file | ERROR naming the disk limit (`limits.disk`): the stream's writes up to the old end are charged again, and a write past the end pays for the gap its removal is credited |
//! | `file_flood`       | creates empty files (`f-N`) in its directory forever            | ERROR naming the file limit (`limits.disk_files`) |
//! | `disk_churn`       | rewrites one 1 MiB file (`churn`) in place and syncs it, forever: no quota grows | ended by fuel: each byte written and each sync is host work charged to the call |
//! | `deep_tree`        | builds, through its own descriptors, a directory tree 40 levels deep with 200-byte names (8 KB of path, past the host's `PATH_MAX`) and a 4 KiB file at the bottom, then fails so the host starts it again; the next instance, finding the tree, behaves as `none` | with `max_failures` >= 1: TERMINATED after one failure (the host measures the tree for the quota without long paths); the tree is counted against `limits.disk` |
//! | `random_flood`     | draws 1 MiB from `wasi:random` per call, forever               | ended by fuel: the host charges the bytes its generator makes |
//! | `random_huge`      | asks `wasi:random` for 64 MiB in one call                       | ERROR: one call may draw at most 1 MiB |
//! | `unlinked_streams` | at `at`: creates 32 files (`gone-N`), opens a read stream on each, removes them, drops the descriptors and then the streams; then behaves as `none` | TERMINATED; no host handle of a removed file outlives the streams (the descriptor budget holds) |
//! | `probe`            | reports `score`, `env_count`, `args_count`, `cwd_entries`, `cwd_write_ok`, `wall_clock_ok`, `monotonic_ok`, `random_ok`; writes `./probe.txt` | TERMINATED with that report (`done`) |
//!
//! Every attack except those marked otherwise fires at the `at`-th `train()`
//! call (or, for `loop_save` and `big_save`, at the first `save()` after it).
//! The hostile exports besides `train()` (`save`, `restore`, `reset`,
//! `cleanup`) work normally for every other attack: `save()` returns the
//! iteration count, `restore()` takes it back and `reset()` switches to the
//! new config, keeping the count.
//!
//! ## What the sandbox is meant to allow
//!
//! `probe` documents the intent: no environment, no arguments, `.` writable;
//! the wall clock, the monotonic clock and random bytes *work*. The host
//! leaves WASI's clocks and random generator at their defaults (the host's
//! clocks and a cryptographic generator) on purpose: trainables seed their
//! initialisation and time their epochs, and neither can reach anything
//! outside the sandbox. Reproducibility comes from seeds in the config, not
//! from hiding the clock.
//!
//! Build with `cargo build --release --target wasm32-wasip2 -p hostile`.

use std::collections::BTreeSet;
use std::fmt;
use std::fs;
use std::hint::black_box;
use std::io;
use std::path::Path;
use std::str::FromStr;

use serde::Deserialize;
use wtune_guest::{Error, Report, Result, Trainable};

/// The misbehaviours this trainable can perform, by config name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attack {
    /// Benign: reports `score` = iteration.
    None,
    /// Returns an error from `train()`.
    Error,
    /// Panics in `train()`.
    Panic,
    /// Executes wasm `unreachable` in `train()`.
    Trap,
    /// Infinite loop in `train()`.
    LoopTrain,
    /// Infinite loop in `setup()`.
    LoopSetup,
    /// Infinite loop in `save()`, once `at` iterations are done.
    LoopSave,
    /// Fails `train()` at `at` so the host restores; `restore()` loops.
    LoopRestore,
    /// Infinite loop in `reset()`.
    LoopReset,
    /// Infinite loop in `cleanup()`.
    LoopCleanup,
    /// Allocates memory until the host's cap stops it.
    MemoryBomb,
    /// Unbounded recursion until the stack overflows.
    Recursion,
    /// Floods stdout (and stderr) forever.
    StdoutFlood,
    /// Floods the host log forever.
    LogFlood,
    /// Calls `std::process::exit` instead of returning.
    Exit,
    /// Returns a report with 100 000 metrics.
    BigReport,
    /// From `at` on, the largest legal report at every call.
    ReportFlood,
    /// Returns a report with the reserved metric `training_iteration`.
    ReservedMetric,
    /// Returns a 100 MB error message.
    HugeError,
    /// Returns a metric whose name is 100 MB.
    HugeMetricName,
    /// Sends one 100 MB line to the host log.
    HugeLog,
    /// `save()` returns 100 MB, once `at` iterations are done.
    BigSave,
    /// Tries to break out of the filesystem sandbox.
    Escape,
    /// Tries to reach the network.
    Sockets,
    /// Reports what the sandbox looks like from inside.
    Probe,
    /// Sleeps in `train()`, blocked in WASI.
    SleepTrain,
    /// Sleeps in `setup()`.
    SleepSetup,
    /// Sleeps in `cleanup()`.
    SleepCleanup,
    /// Returns an error message full of terminal escapes.
    Terminal,
    /// Holds open files until the host stops it.
    OpenFiles,
    /// Fills its directory with data.
    DiskFill,
    /// Fills its disk with files removed while open.
    DiskUnlinked,
    /// Fills its directory through streams opened before a truncation.
    DiskStaleStream,
    /// Fills its directory with empty files.
    FileFlood,
    /// Rewrites one file in place and syncs it, forever.
    DiskChurn,
    /// Builds a directory tree nested past the host's path length limit.
    DeepTree,
    /// From `at` on, 255 metric names never used before at every call.
    MetricNameFlood,
    /// Draws a mebibyte from `wasi:random` at a time, forever.
    RandomFlood,
    /// Asks `wasi:random` for 64 MiB in one call.
    RandomHuge,
    /// Drops read streams of removed files after their descriptors.
    UnlinkedStreams,
}

impl Attack {
    /// Every attack, with its config name.
    pub const ALL: [(&'static str, Attack); 40] = [
        ("none", Attack::None),
        ("error", Attack::Error),
        ("panic", Attack::Panic),
        ("trap", Attack::Trap),
        ("loop_train", Attack::LoopTrain),
        ("loop_setup", Attack::LoopSetup),
        ("loop_save", Attack::LoopSave),
        ("loop_restore", Attack::LoopRestore),
        ("loop_reset", Attack::LoopReset),
        ("loop_cleanup", Attack::LoopCleanup),
        ("memory_bomb", Attack::MemoryBomb),
        ("recursion", Attack::Recursion),
        ("stdout_flood", Attack::StdoutFlood),
        ("log_flood", Attack::LogFlood),
        ("exit", Attack::Exit),
        ("big_report", Attack::BigReport),
        ("report_flood", Attack::ReportFlood),
        ("reserved_metric", Attack::ReservedMetric),
        ("huge_error", Attack::HugeError),
        ("huge_metric_name", Attack::HugeMetricName),
        ("huge_log", Attack::HugeLog),
        ("big_save", Attack::BigSave),
        ("escape", Attack::Escape),
        ("sockets", Attack::Sockets),
        ("probe", Attack::Probe),
        ("sleep_train", Attack::SleepTrain),
        ("sleep_setup", Attack::SleepSetup),
        ("sleep_cleanup", Attack::SleepCleanup),
        ("terminal", Attack::Terminal),
        ("open_files", Attack::OpenFiles),
        ("disk_fill", Attack::DiskFill),
        ("disk_unlinked", Attack::DiskUnlinked),
        ("disk_stale_stream", Attack::DiskStaleStream),
        ("file_flood", Attack::FileFlood),
        ("disk_churn", Attack::DiskChurn),
        ("deep_tree", Attack::DeepTree),
        ("metric_name_flood", Attack::MetricNameFlood),
        ("random_flood", Attack::RandomFlood),
        ("random_huge", Attack::RandomHuge),
        ("unlinked_streams", Attack::UnlinkedStreams),
    ];

    /// The attack's config name.
    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, attack)| *attack == self)
            .map(|(name, _)| *name)
            .unwrap_or("?")
    }
}

impl fmt::Display for Attack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Attack {
    type Err = Error;

    fn from_str(name: &str) -> Result<Self> {
        Self::ALL
            .iter()
            .find(|(known, _)| *known == name)
            .map(|(_, attack)| *attack)
            .ok_or_else(|| {
                let valid: Vec<&str> = Self::ALL.iter().map(|(known, _)| *known).collect();
                Error::msg(format!(
                    "unknown attack `{name}`; valid attacks: {}",
                    valid.join(", ")
                ))
            })
    }
}

/// The trial's config (see the crate docs).
#[derive(Debug, Deserialize)]
pub struct Config {
    /// Which attack to perform, by name.
    #[serde(default = "default_attack")]
    pub attack: String,
    /// The `train()` call (from 1) at which the attack fires.
    #[serde(default = "default_at")]
    pub at: u64,
    /// The iteration at which the benign path reports `done`.
    #[serde(default = "default_iterations")]
    pub iterations: u64,
    /// The loopback port `sockets` tries to reach.
    #[serde(default = "default_port")]
    pub port: u16,
    /// Milliseconds each benign `train()` call sleeps.
    #[serde(default)]
    pub pace_ms: u64,
}

fn default_attack() -> String {
    "none".to_owned()
}

fn default_at() -> u64 {
    1
}

fn default_iterations() -> u64 {
    5
}

fn default_port() -> u16 {
    9
}

/// The size of every "enormous" value: 100 MB.
pub const HUGE: usize = 100_000_000;

/// The trainable: counts iterations and misbehaves at the configured one.
#[derive(Debug)]
pub struct Hostile {
    attack: Attack,
    at: u64,
    iterations: u64,
    iteration: u64,
    port: u16,
    pace_ms: u64,
}

impl Hostile {
    /// Checks `config` and builds the trainable at iteration 0.
    fn configured(config: Config) -> Result<Self> {
        let attack: Attack = config.attack.parse()?;
        if config.at == 0 {
            return Err(Error::msg(
                "`at` counts train() calls from 1; 0 never fires",
            ));
        }
        if config.iterations == 0 {
            return Err(Error::msg("`iterations` must be at least 1"));
        }
        Ok(Hostile {
            attack,
            at: config.at,
            iterations: config.iterations,
            iteration: 0,
            port: config.port,
            pace_ms: config.pace_ms,
        })
    }

    /// Whether an attack on `save()` is due: the `at`-th iteration is done.
    fn save_attack_due(&self, attack: Attack) -> bool {
        self.attack == attack && self.iteration >= self.at
    }
}

impl Trainable for Hostile {
    type Config = Config;

    fn setup(config: Config) -> Result<Self> {
        let hostile = Self::configured(config)?;
        if hostile.attack == Attack::LoopSetup {
            spin_forever();
        }
        if hostile.attack == Attack::SleepSetup {
            sleep_forever();
        }
        Ok(hostile)
    }

    fn train(&mut self) -> Result<Report> {
        self.iteration += 1;
        let n = self.iteration;
        if self.pace_ms > 0 {
            std::thread::sleep(std::time::Duration::from_millis(self.pace_ms));
        }
        if self.attack == Attack::ReportFlood && n >= self.at {
            return report_flood(n);
        }
        if self.attack == Attack::MetricNameFlood && n >= self.at {
            return Ok(metric_name_flood(n));
        }
        if n != self.at {
            return Ok(benign(n, self.iterations));
        }
        match self.attack {
            Attack::None
            | Attack::LoopSetup
            | Attack::LoopSave
            | Attack::LoopReset
            | Attack::LoopCleanup
            | Attack::SleepSetup
            | Attack::SleepCleanup
            | Attack::BigSave => Ok(benign(n, self.iterations)),
            Attack::LoopRestore => Err(Error::msg(format!(
                "failing at iteration {n} so the host restores the newest checkpoint"
            ))),
            Attack::Error => deliberate_error(n),
            Attack::Panic => deliberate_panic(),
            Attack::Trap => deliberate_trap(),
            Attack::LoopTrain => spin_forever(),
            Attack::MemoryBomb => memory_bomb(),
            Attack::Recursion => stack_overflow(),
            Attack::StdoutFlood => stdout_flood(),
            Attack::LogFlood => log_flood(),
            Attack::Exit => std::process::exit(3),
            Attack::BigReport => Ok(big_report()),
            Attack::ReportFlood => report_flood(n),
            Attack::ReservedMetric => Ok(reserved_metric(n)),
            Attack::HugeError => Err(Error::msg("e".repeat(HUGE))),
            Attack::HugeMetricName => Ok(Report::new().metric("m".repeat(HUGE), 1.0)),
            Attack::HugeLog => {
                wtune_guest::log::log(wtune_guest::log::Level::Info, &"l".repeat(HUGE));
                Ok(benign(n, self.iterations))
            }
            Attack::Escape => escape(n),
            Attack::Sockets => sockets(n, self.port),
            Attack::Probe => probe(n),
            Attack::SleepTrain => sleep_forever(),
            Attack::Terminal => Err(Error::msg(TERMINAL_ATTACK)),
            Attack::OpenFiles => hoard_files(),
            Attack::DiskFill => fill_disk(),
            Attack::DiskUnlinked => fill_disk_with_removed_files(),
            Attack::DiskStaleStream => fill_disk_through_stale_streams(),
            Attack::FileFlood => flood_files(),
            Attack::DiskChurn => churn_disk(),
            Attack::DeepTree => deep_tree(n, self.iterations),
            Attack::MetricNameFlood => Ok(metric_name_flood(n)),
            Attack::RandomFlood => random_flood(),
            Attack::RandomHuge => {
                let bytes = wasip2::random::random::get_random_bytes(64 << 20);
                Err(Error::msg(format!(
                    "drew {} random bytes at once",
                    bytes.len()
                )))
            }
            Attack::UnlinkedStreams => {
                unlinked_streams().map_err(|e| Error::msg(format!("unlinked_streams: {e}")))?;
                Ok(benign(n, self.iterations))
            }
        }
    }

    /// The state is the iteration count (8 bytes, little-endian).
    fn save(&self) -> Result<Vec<u8>> {
        if self.save_attack_due(Attack::LoopSave) {
            spin_forever();
        }
        if self.save_attack_due(Attack::BigSave) {
            return Ok(vec![0xAB; HUGE]);
        }
        Ok(self.iteration.to_le_bytes().to_vec())
    }

    fn restore(&mut self, state: &[u8]) -> Result<()> {
        if self.attack == Attack::LoopRestore {
            spin_forever();
        }
        let bytes: [u8; 8] = state.try_into().map_err(|_| {
            Error::msg(format!(
                "restore(): expected 8 bytes of state, got {}",
                state.len()
            ))
        })?;
        self.iteration = u64::from_le_bytes(bytes);
        Ok(())
    }

    /// Takes the new config and keeps the iteration count.
    fn reset(&mut self, config: Config) -> Result<bool> {
        let iteration = self.iteration;
        *self = Self::configured(config)?;
        self.iteration = iteration;
        if self.attack == Attack::LoopReset {
            spin_forever();
        }
        Ok(true)
    }

    fn cleanup(&mut self) {
        if self.attack == Attack::LoopCleanup {
            spin_forever();
        }
        if self.attack == Attack::SleepCleanup {
            sleep_forever();
        }
    }
}

wtune_guest::export!(Hostile);

/// `none`: `score` = iteration, done at the last one.
fn benign(iteration: u64, iterations: u64) -> Report {
    Report::new()
        .metric("score", iteration as f64)
        .done(iteration >= iterations)
}

/// `error`: a clean, non-trapping failure.
fn deliberate_error(iteration: u64) -> Result<Report> {
    Err(Error::msg(format!(
        "deliberate failure at iteration {iteration}"
    )))
}

/// `panic`: a Rust panic, which becomes a trap after printing to stderr.
fn deliberate_panic() -> ! {
    panic!("hostile guest panicked on purpose")
}

/// `trap`: wasm `unreachable`, with no panic message.
fn deliberate_trap() -> ! {
    #[cfg(target_arch = "wasm32")]
    {
        core::arch::wasm32::unreachable()
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        std::process::abort()
    }
}

/// `loop_*`: spins forever; `black_box` keeps the optimiser
/// from removing the loop.
fn spin_forever() -> ! {
    let mut counter: u64 = 0;
    loop {
        counter = black_box(counter.wrapping_add(1));
    }
}

/// `sleep_*`: blocks in WASI's monotonic-clock poll, an hour at a time:
/// no fuel is burned and no wasm runs while it waits.
fn sleep_forever() -> ! {
    loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}

/// `terminal`: clears the screen, retitles the terminal (OSC 0), hides
/// what follows (SGR 8), returns the cursor and forges a summary line.
pub const TERMINAL_ATTACK: &str =
    "\x1b[2J\x1b]0;pwned\x07\x1b[8mhidden\x1b[0m\r\nBest trial: trial_9999 (forged)";

/// `open_files`: opens file after file and keeps them all; returns the
/// error that stopped it, if the host lets the guest see one.
fn hoard_files() -> Result<Report> {
    let mut held = Vec::new();
    loop {
        let path = format!("hoard-{}", held.len() % 16);
        match fs::OpenOptions::new().create(true).append(true).open(&path) {
            Ok(file) => held.push(file),
            Err(err) => {
                return Err(Error::msg(format!(
                    "opened {} files, then: {err}",
                    held.len()
                )));
            }
        }
    }
}

/// `disk_fill`: 1 MiB files, forever. The first file is rewritten in place
/// and every fourth file removes the one before it, so the quota must
/// credit what is replaced or freed.
fn fill_disk() -> Result<Report> {
    let block = vec![0x5Au8; 1 << 20];
    let mut n = 0u64;
    loop {
        let written = fs::write(format!("fill-{n}"), &block)
            .and_then(|()| fs::write("fill-0", &block))
            .and_then(|()| match n % 4 {
                3 => fs::remove_file(format!("fill-{}", n - 1)),
                _ => Ok(()),
            });
        if let Err(err) = written {
            return Err(Error::msg(format!("wrote {n} MiB, then: {err}")));
        }
        n += 1;
    }
}

/// `disk_churn`: 1 MiB written over the same bytes of one file, and synced,
/// forever. The file never grows, so no quota stops it: only the fuel its
/// host work costs does.
fn churn_disk() -> Result<Report> {
    use std::io::{Seek, Write};
    let block = vec![0x5Au8; 1 << 20];
    let churn = || -> io::Result<std::convert::Infallible> {
        let mut file = fs::File::create("churn")?;
        loop {
            file.seek(io::SeekFrom::Start(0))?;
            file.write_all(&block)?;
            file.sync_data()?;
            black_box(&file);
        }
    };
    let Err(err) = churn();
    Err(Error::msg(format!("rewriting `churn`: {err}")))
}

/// How deep `deep_tree` nests, and how long its directories' names are:
/// 40 levels of 200 bytes, 8 KB of path, twice Linux's `PATH_MAX`.
const DEEP_LEVELS: usize = 40;
const DEEP_NAME_BYTES: usize = 200;

/// `deep_tree`: a directory tree nested past `PATH_MAX`, built through
/// WASI's descriptors (each level opened from the one above, so no path is
/// long), with a 4 KiB file at the bottom; then a failure, so that the
/// host starts the trial again and measures its directory anew. An
/// instance that finds the tree behaves as `none`.
fn deep_tree(n: u64, iterations: u64) -> Result<Report> {
    use wasip2::filesystem::preopens::get_directories;
    use wasip2::filesystem::types::{DescriptorFlags, OpenFlags, PathFlags};
    let name = "d".repeat(DEEP_NAME_BYTES);
    if fs::metadata(&name).is_ok() {
        return Ok(benign(n, iterations));
    }
    let dirs = get_directories();
    let (root, _) = dirs
        .iter()
        .find(|(_, path)| path == ".")
        .ok_or_else(|| Error::msg("no preopened `.`"))?;
    let build = || -> std::result::Result<(), String> {
        let mut below = None;
        for _ in 0..DEEP_LEVELS {
            let parent = below.as_ref().unwrap_or(root);
            parent
                .create_directory_at(&name)
                .map_err(|e| e.to_string())?;
            let next = parent
                .open_at(
                    PathFlags::empty(),
                    &name,
                    OpenFlags::DIRECTORY,
                    DescriptorFlags::READ | DescriptorFlags::MUTATE_DIRECTORY,
                )
                .map_err(|e| e.to_string())?;
            below = Some(next);
        }
        let bottom = below.as_ref().unwrap_or(root);
        let file = bottom
            .open_at(
                PathFlags::empty(),
                "bottom",
                OpenFlags::CREATE,
                DescriptorFlags::WRITE,
            )
            .map_err(|e| e.to_string())?;
        file.write(&[0x5A; 4096], 0).map_err(|e| e.to_string())?;
        Ok(())
    };
    build().map_err(|err| Error::msg(format!("building the deep tree: {err}")))?;
    Err(Error::msg(format!(
        "built a tree {DEEP_LEVELS} levels deep; failing so the host starts the trial again"
    )))
}

/// `disk_unlinked`: 1 MiB files removed while open, forever. Removing a
/// file frees nothing while a handle holds it; truncating it through that
/// handle then frees its bytes once.
fn fill_disk_with_removed_files() -> Result<Report> {
    use std::io::Write;
    let block = vec![0x5Au8; 1 << 20];
    let mut held = Vec::new();
    let mut n = 0u64;
    loop {
        let name = format!("held-{n}");
        let mut step = || -> io::Result<()> {
            let mut file = fs::File::create(&name)?;
            file.write_all(&block)?;
            fs::remove_file(&name)?;
            if n.is_multiple_of(2) {
                held.push(file);
                return Ok(());
            }
            file.set_len(0)?;
            drop(file);
            fs::write(format!("kept-{n}"), &block)
        };
        if let Err(err) = step() {
            return Err(Error::msg(format!("wrote {n} MiB, then: {err}")));
        }
        n += 1;
    }
}

/// `disk_stale_stream`: through WASI's calls themselves, as std hides
/// streams: a stream opened on a 1 MiB file, the file truncated to 0, and
/// 1 MiB written through the stream; then 4 KiB written 1 MiB past the
/// end of a new file, which is removed. Forever.
fn fill_disk_through_stale_streams() -> Result<Report> {
    use wasip2::filesystem::preopens::get_directories;
    use wasip2::filesystem::types::{DescriptorFlags, OpenFlags, PathFlags};
    let dirs = get_directories();
    let (dir, _) = dirs
        .iter()
        .find(|(_, path)| path == ".")
        .ok_or_else(|| Error::msg("no preopened `.`"))?;
    let block = [0x5Au8; 4096];
    let mut n = 0u64;
    loop {
        let step = || -> std::result::Result<(), String> {
            let flags = DescriptorFlags::READ | DescriptorFlags::WRITE;
            let file = dir
                .open_at(
                    PathFlags::empty(),
                    &format!("stream-{n}"),
                    OpenFlags::CREATE,
                    flags,
                )
                .map_err(|e| e.to_string())?;
            file.set_size(1 << 20).map_err(|e| e.to_string())?;
            let stream = file.write_via_stream(0).map_err(|e| e.to_string())?;
            file.set_size(0).map_err(|e| e.to_string())?;
            for _ in 0..(1 << 20) / block.len() {
                stream
                    .blocking_write_and_flush(&block)
                    .map_err(|e| format!("{e:?}"))?;
            }
            let gap = format!("gap-{n}");
            let file = dir
                .open_at(PathFlags::empty(), &gap, OpenFlags::CREATE, flags)
                .map_err(|e| e.to_string())?;
            let stream = file.write_via_stream(1 << 20).map_err(|e| e.to_string())?;
            stream
                .blocking_write_and_flush(&block)
                .map_err(|e| format!("{e:?}"))?;
            // The other ways to write, which the host runs inside its own
            // blocking calls: zeroes, and a splice from the first file.
            stream
                .blocking_write_zeroes_and_flush(4096)
                .map_err(|e| format!("{e:?}"))?;
            let source = dir
                .open_at(
                    PathFlags::empty(),
                    &format!("stream-{n}"),
                    OpenFlags::empty(),
                    DescriptorFlags::READ,
                )
                .map_err(|e| e.to_string())?;
            let input = source.read_via_stream(0).map_err(|e| e.to_string())?;
            let spliced = stream
                .blocking_splice(&input, 4096)
                .map_err(|e| format!("{e:?}"))?;
            if spliced == 0 {
                return Err("a splice of a 1 MiB file moved nothing".into());
            }
            drop((input, source, stream, file));
            dir.unlink_file_at(&gap).map_err(|e| e.to_string())?;
            Ok(())
        };
        if let Err(err) = step() {
            return Err(Error::msg(format!("wrote {n} MiB, then: {err}")));
        }
        n += 1;
    }
}

/// `random_flood`: a mebibyte from `wasi:random` at a time, forever. Each
/// draw is host work; were it free, only the deadline would end the call.
fn random_flood() -> Result<Report> {
    let mut drawn = 0u64;
    loop {
        let bytes = wasip2::random::random::get_random_bytes(1 << 20);
        drawn = drawn.wrapping_add(bytes.len() as u64);
        if bytes.is_empty() {
            return Err(Error::msg(format!(
                "wasi:random gave nothing after {drawn} bytes"
            )));
        }
    }
}

/// How many files `unlinked_streams` removes under open read streams.
pub const UNLINKED_STREAMS: usize = 32;

/// `unlinked_streams`: [`UNLINKED_STREAMS`] files (`gone-N`), each with a
/// read stream, removed; then every descriptor is dropped, and only then
/// every stream. The removed files' host handles must go with the streams,
/// not wait for a later call.
fn unlinked_streams() -> std::result::Result<(), String> {
    use wasip2::filesystem::preopens::get_directories;
    use wasip2::filesystem::types::{DescriptorFlags, OpenFlags, PathFlags};
    let dirs = get_directories();
    let (dir, _) = dirs
        .iter()
        .find(|(_, path)| path == ".")
        .ok_or("no preopened `.`")?;
    let mut held = Vec::new();
    for n in 0..UNLINKED_STREAMS {
        let name = format!("gone-{n}");
        fs::write(&name, [7u8; 4096]).map_err(|e| e.to_string())?;
        let file = dir
            .open_at(
                PathFlags::empty(),
                &name,
                OpenFlags::empty(),
                DescriptorFlags::READ,
            )
            .map_err(|e| e.to_string())?;
        let stream = file.read_via_stream(0).map_err(|e| e.to_string())?;
        dir.unlink_file_at(&name).map_err(|e| e.to_string())?;
        held.push((file, stream));
    }
    let (files, streams): (Vec<_>, Vec<_>) = held.into_iter().unzip();
    drop(files);
    drop(streams);
    // The preopen handles are kept: dropping a descriptor makes the host
    // look for removed files it can let go, and this attack is about the
    // drops that are not of descriptors.
    std::mem::forget(dirs);
    Ok(())
}

/// `file_flood`: empty files, forever.
fn flood_files() -> Result<Report> {
    let mut n = 0u64;
    loop {
        if let Err(err) = fs::File::create(format!("f-{n}")) {
            return Err(Error::msg(format!("created {n} files, then: {err}")));
        }
        n += 1;
    }
}

/// `memory_bomb`: 16 MiB blocks, every page touched, all kept alive.
fn memory_bomb() -> ! {
    const BLOCK: usize = 16 << 20;
    const PAGE: usize = 4096;
    let mut held: Vec<Vec<u8>> = Vec::new();
    loop {
        let mut block = vec![0u8; BLOCK];
        for offset in (0..BLOCK).step_by(PAGE) {
            block[offset] = 1;
        }
        held.push(black_box(block));
        black_box(&held);
    }
}

/// `recursion`: recurses until the stack overflows (never returns in
/// practice).
fn stack_overflow() -> Result<Report> {
    let depth = recurse(0);
    Err(Error::msg(format!("recursion returned ({depth})?!")))
}

/// The body of `recursion`: uses the result of the recursive call, so it is not a tail
/// call, and `black_box` keeps it from being folded into a loop. Frames are
/// small so the host's wasm call-stack limit is what stops it.
#[allow(
    unconditional_recursion,
    reason = "the `recursion` attack overflows the stack on purpose"
)]
fn recurse(depth: u64) -> u64 {
    let below = recurse(black_box(depth.wrapping_add(1)));
    below.wrapping_add(black_box(depth))
}

/// `stdout_flood`: 64 KiB blocks of 1 KiB lines to stdout forever, every
/// 16th block also to stderr. Whole blocks ending in a newline go straight
/// through std's line buffering to the host, so the guest spends almost no
/// fuel per byte: only the host's charge for output bounds what a call
/// can print.
fn stdout_flood() -> ! {
    use std::io::Write;
    let line = format!("{}\n", "o".repeat(1023));
    let block = line.repeat(64);
    let mut count: u64 = 0;
    loop {
        // Errors (a closed stream) are ignored: the attack is to keep going.
        let _ = std::io::stdout().lock().write_all(block.as_bytes());
        if count.is_multiple_of(16) {
            let _ = std::io::stderr().lock().write_all(block.as_bytes());
        }
        count = black_box(count.wrapping_add(1));
    }
}

/// `log_flood`: 64 KiB messages to the host log forever.
fn log_flood() -> ! {
    let message = "l".repeat(64 << 10);
    loop {
        wtune_guest::info!("{message}");
        black_box(&message);
    }
}

/// `big_report`: 100 000 metrics `m0` .. `m99999`.
fn big_report() -> Report {
    (0..100_000).fold(Report::new(), |report, i| {
        report.metric(format!("m{i}"), i as f64)
    })
}

/// `report_flood`: the largest report the host accepts (64 KiB of metric
/// names in all, each at most 256 bytes), and an error every 5th call, so
/// that a host retrying failed trials starts a new instance again and
/// again.
fn report_flood(iteration: u64) -> Result<Report> {
    if iteration.is_multiple_of(5) {
        return Err(Error::msg(format!(
            "failing at iteration {iteration} to be retried"
        )));
    }
    Ok(
        (0..255).fold(Report::new().metric("score", 1.0), |report, i| {
            report.metric(format!("{i:0>256}"), i as f64)
        }),
    )
}

/// `metric_name_flood`: `score` and 255 names of this iteration's own, and
/// never `done`: each is a new column, series and tracking key.
fn metric_name_flood(iteration: u64) -> Report {
    (0..255).fold(
        Report::new().metric("score", iteration as f64),
        |report, i| report.metric(format!("m{iteration}_{i}"), i as f64),
    )
}

/// `reserved_metric`: a report that uses a name the host fills in itself.
fn reserved_metric(iteration: u64) -> Report {
    Report::new()
        .metric("score", iteration as f64)
        .metric("training_iteration", 999.0)
}

/// The outcome of one escape attempt.
struct Attempt {
    what: String,
    outcome: std::result::Result<(), String>,
}

impl Attempt {
    fn run(what: impl Into<String>, attempt: impl FnOnce() -> io::Result<()>) -> Self {
        Attempt {
            what: what.into(),
            outcome: attempt().map_err(|e| short_error(&e)),
        }
    }
}

/// An I/O error without the trailing `(os error N)`.
fn short_error(err: &io::Error) -> String {
    let text = err.to_string();
    match text.find(" (os error") {
        Some(end) => text[..end].to_owned(),
        None => text,
    }
}

fn read(path: &str) -> io::Result<()> {
    fs::read(path).map(drop)
}

fn write(path: &Path) -> io::Result<()> {
    fs::write(path, b"pwned by the hostile guest\n")
}

/// `std::os::wasi::fs::symlink_path` is still unstable, so call wasi-libc's
/// `symlink` (which std already links) directly.
#[cfg(target_os = "wasi")]
fn symlink(target: &str, link: &str) -> io::Result<()> {
    use std::ffi::{CString, c_char, c_int};

    unsafe extern "C" {
        fn symlink(target: *const c_char, link: *const c_char) -> c_int;
    }

    let target = CString::new(target)?;
    let link = CString::new(link)?;
    // SAFETY: both arguments are valid NUL-terminated strings that outlive
    // the call; wasi-libc reports failure through errno.
    match unsafe { symlink(target.as_ptr(), link.as_ptr()) } {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

#[cfg(all(unix, not(target_os = "wasi")))]
fn symlink(target: &str, link: &str) -> io::Result<()> {
    std::os::unix::fs::symlink(target, link)
}

#[cfg(not(any(unix, target_os = "wasi")))]
fn symlink(_target: &str, _link: &str) -> io::Result<()> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "symlinks unsupported here",
    ))
}

/// Creates `./<link>` pointing at `target`, reads through it, then removes
/// the link (best effort) so the trial directory is left clean.
fn read_through_symlink(target: &str, link: &str) -> io::Result<()> {
    let _ = fs::remove_file(link);
    let result = symlink(target, link).and_then(|()| read(link));
    let _ = fs::remove_file(link);
    result
}

fn names_in(dir: &str) -> io::Result<BTreeSet<String>> {
    fs::read_dir(dir)?
        .map(|entry| entry.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect()
}

/// Lists `/`. wasi-libc resolves absolute paths through the `.` preopen, so
/// `/` normally shows the trial's own directory (plus the `data` mount point):
/// that is the sandbox's virtual root, not an escape. Any other name means
/// the listing reached host files.
fn list_root() -> io::Result<()> {
    let root = names_in("/")?;
    let own = names_in(".")?;
    let foreign = root
        .iter()
        .filter(|name| !own.contains(*name) && *name != "data")
        .count();
    if foreign == 0 {
        return Err(io::Error::other(format!(
            "shows only the sandbox ({} entries)",
            root.len()
        )));
    }
    Ok(())
}

/// Symlinks `escape` tries to plant in the trial's own directory and leave
/// there, each pointing outside it: `(link, target)`. Following one out of
/// the sandbox would be an escape; leaving one behind would lead a later
/// copy of the directory outside it, so the host refuses to make them.
pub const PLANTED: [(&str, &str); 3] = [
    ("planted-params", "../params.json"),
    ("planted-up", ".."),
    ("planted-outside", "../../outside.txt"),
];

/// Creates the [`PLANTED`] links (replacing stale ones) and says for each
/// whether it could be created.
fn plant_links() -> Vec<(&'static str, std::result::Result<(), String>)> {
    PLANTED
        .iter()
        .map(|(link, target)| {
            let _ = fs::remove_file(link);
            (*link, symlink(target, link).map_err(|e| short_error(&e)))
        })
        .collect()
}

/// Runs `attempt` through a planted `link`, if the sandbox let it be made;
/// without the link, writing its name would only make an ordinary file.
fn via(
    planted: &[(&str, std::result::Result<(), String>)],
    link: &str,
    attempt: impl FnOnce() -> io::Result<()>,
) -> io::Result<()> {
    match planted.iter().find(|(name, _)| *name == link) {
        Some((_, Ok(()))) => attempt(),
        _ => Err(io::Error::new(io::ErrorKind::NotFound, "link not planted")),
    }
}

/// `escape`: every way out of the sandbox we could think of. Succeeds (with
/// metric `escaped`) only if some attempt worked.
fn escape(iteration: u64) -> Result<Report> {
    let planted = plant_links();
    let mut attempts = vec![
        Attempt::run("read ../params.json", || read("../params.json")),
        Attempt::run("read ../../etc/passwd", || read("../../etc/passwd")),
        Attempt::run("read /etc/passwd", || read("/etc/passwd")),
        Attempt::run("read /proc/self/environ", || read("/proc/self/environ")),
        Attempt::run("read /proc/self/mem", || read("/proc/self/mem")),
        Attempt::run("list /", list_root),
        Attempt::run("symlink to /etc/passwd", || {
            read_through_symlink("/etc/passwd", "hostile-link-passwd")
        }),
        Attempt::run("symlink to ../params.json", || {
            read_through_symlink("../params.json", "hostile-link-params")
        }),
        Attempt::run("hard link ../params.json", || {
            fs::hard_link("../params.json", "hostile-hardlink-params")
        }),
        Attempt::run("hard link /etc/passwd", || {
            fs::hard_link("/etc/passwd", "hostile-hardlink-passwd")
        }),
        Attempt::run("hard link /data/digits/train.csv", || {
            fs::hard_link("/data/digits/train.csv", "hostile-hardlink-data")
        }),
        Attempt::run("read via planted-params", || {
            via(&planted, "planted-params", || read("planted-params"))
        }),
        Attempt::run("write via planted-params", || {
            via(&planted, "planted-params", || {
                write(Path::new("planted-params"))
            })
        }),
        Attempt::run("list via planted-up", || {
            via(&planted, "planted-up", || names_in("planted-up").map(drop))
        }),
        Attempt::run("write via planted-up/pwned", || {
            via(&planted, "planted-up", || {
                write(Path::new("planted-up/pwned"))
            })
        }),
        Attempt::run("read via planted-outside", || {
            via(&planted, "planted-outside", || read("planted-outside"))
        }),
        Attempt::run("write via planted-outside", || {
            via(&planted, "planted-outside", || {
                write(Path::new("planted-outside"))
            })
        }),
        Attempt::run("write /data/digits/pwned", || {
            write(Path::new("/data/digits/pwned"))
        }),
    ];
    if let Ok(entries) = fs::read_dir("/data") {
        for entry in entries.flatten() {
            let path = entry.path().join("pwned");
            if path != Path::new("/data/digits/pwned") {
                let what = format!("write {}", path.display());
                attempts.push(Attempt::run(what, || write(&path)));
            }
        }
    }
    attempts.push(Attempt::run("write ../pwned", || {
        write(Path::new("../pwned"))
    }));
    let planted: Vec<String> = planted
        .iter()
        .map(|(link, made)| match made {
            Ok(()) => format!("{link} created"),
            Err(e) => format!("{link} not created ({e})"),
        })
        .collect();
    verdict(
        "escape",
        attempts,
        &format!(" (planted links: {})", planted.join(", ")),
        iteration,
    )
}

/// Ends an attack made of several attempts: `Err("all <kind> attempts
/// denied: what: why; ...")` when every one failed, else an `Ok` report
/// (`done`) with `score` and `escaped` = how many worked, each also logged
/// as an error.
fn verdict(kind: &str, attempts: Vec<Attempt>, note: &str, iteration: u64) -> Result<Report> {
    let escaped: Vec<&str> = attempts
        .iter()
        .filter(|a| a.outcome.is_ok())
        .map(|a| a.what.as_str())
        .collect();
    if escaped.is_empty() {
        let denied: Vec<String> = attempts
            .iter()
            .filter_map(|a| a.outcome.as_ref().err().map(|e| format!("{}: {e}", a.what)))
            .collect();
        return Err(Error::msg(format!(
            "all {kind} attempts denied: {}{note}",
            denied.join("; ")
        )));
    }
    for what in &escaped {
        wtune_guest::error!("sandbox {kind} succeeded: {what}");
    }
    Ok(Report::new()
        .metric("score", iteration as f64)
        .metric("escaped", escaped.len() as f64)
        .done(true))
}

/// `sockets`: every kind of network use WASI 0.2 offers. Succeeds (with
/// metric `escaped`) only if some attempt worked.
fn sockets(iteration: u64, port: u16) -> Result<Report> {
    use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs, UdpSocket};

    let target = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let attempts = vec![
        Attempt::run(format!("tcp connect {target}"), || {
            TcpStream::connect(target).map(drop)
        }),
        Attempt::run("tcp listen 127.0.0.1:0", || {
            TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map(drop)
        }),
        Attempt::run(format!("udp send {target}"), || {
            let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
            socket.send_to(b"hostile guest", target).map(drop)
        }),
        Attempt::run("dns lookup localhost", || {
            match ("localhost", 80).to_socket_addrs()?.count() {
                0 => Err(io::Error::other("resolved to no address")),
                _ => Ok(()),
            }
        }),
    ];
    verdict("socket", attempts, "", iteration)
}

/// `probe`: what the sandbox looks like from inside.
fn probe(iteration: u64) -> Result<Report> {
    let env_count = std::env::vars().count();
    let args_count = std::env::args().count();
    let cwd_entries = fs::read_dir(".")
        .map_err(|e| Error::from(e).context("listing ."))?
        .count();
    let cwd_write_ok = match fs::write("probe.txt", "hello").and_then(|()| fs::read("probe.txt")) {
        Ok(bytes) => bytes == b"hello",
        Err(e) => {
            wtune_guest::warn!("probe.txt round trip failed: {e}");
            false
        }
    };
    let flag = |ok: bool| if ok { 1.0 } else { 0.0 };
    Ok(Report::new()
        .metric("score", iteration as f64)
        .metric("env_count", env_count as f64)
        .metric("args_count", args_count as f64)
        .metric("cwd_entries", cwd_entries as f64)
        .metric("cwd_write_ok", flag(cwd_write_ok))
        .metric("wall_clock_ok", flag(wall_clock_ok()))
        .metric("monotonic_ok", flag(monotonic_ok()))
        .metric("random_ok", flag(random_ok()))
        .done(true))
}

/// The wall clock reads a plausible date (after 2020-01-01, before 2200).
fn wall_clock_ok() -> bool {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .is_ok_and(|since| (1_577_836_800..7_258_118_400).contains(&since.as_secs()))
}

/// The monotonic clock moves forward across a million loop iterations.
fn monotonic_ok() -> bool {
    let start = std::time::Instant::now();
    let mut counter: u64 = 0;
    for _ in 0..1_000_000 {
        counter = black_box(counter.wrapping_add(1));
    }
    std::time::Instant::now() > start
}

/// Two 32-byte draws from the random source succeed and differ.
fn random_ok() -> bool {
    match (random_bytes(), random_bytes()) {
        (Ok(a), Ok(b)) => a != b,
        (Err(e), _) | (_, Err(e)) => {
            wtune_guest::warn!("random bytes failed: {e}");
            false
        }
    }
}

/// 32 bytes from libc's `getentropy` (wasi-libc: WASI's secure random).
#[cfg(any(unix, target_os = "wasi"))]
fn random_bytes() -> io::Result<[u8; 32]> {
    use std::ffi::{c_int, c_void};

    unsafe extern "C" {
        fn getentropy(buffer: *mut c_void, length: usize) -> c_int;
    }

    let mut bytes = [0u8; 32];
    // SAFETY: the buffer is valid for writes of its length (at most 256
    // bytes, getentropy's limit); failure is reported through errno.
    match unsafe { getentropy(bytes.as_mut_ptr().cast(), bytes.len()) } {
        0 => Ok(bytes),
        _ => Err(io::Error::last_os_error()),
    }
}

#[cfg(not(any(unix, target_os = "wasi")))]
fn random_bytes() -> io::Result<[u8; 32]> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "no random source here",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(json: &str) -> Config {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn config_defaults() {
        let c = config("{}");
        assert_eq!((c.attack.as_str(), c.at, c.iterations), ("none", 1, 5));
        let c = config(r#"{"attack": "panic", "at": 3, "iterations": 7, "lr": 0.1}"#);
        assert_eq!((c.attack.as_str(), c.at, c.iterations), ("panic", 3, 7));
    }

    fn setup(attack: &str, at: u64, iterations: u64) -> Result<Hostile> {
        Hostile::setup(Config {
            attack: attack.to_owned(),
            at,
            iterations,
            port: default_port(),
            pace_ms: 0,
        })
    }

    #[test]
    fn every_attack_round_trips_through_its_name() {
        for (name, attack) in Attack::ALL {
            assert_eq!(name.parse::<Attack>().unwrap(), attack);
            assert_eq!(attack.name(), name);
        }
    }

    #[test]
    fn unknown_attack_lists_the_valid_ones() {
        let err = setup("rm -rf", 1, 5).unwrap_err().to_string();
        assert!(err.contains("unknown attack `rm -rf`"), "{err}");
        for (name, _) in Attack::ALL {
            assert!(err.contains(name), "{err} lacks {name}");
        }
    }

    #[test]
    fn zero_at_or_iterations_is_rejected() {
        assert!(setup("none", 0, 5).is_err());
        assert!(setup("none", 1, 0).is_err());
    }

    #[test]
    fn none_counts_up_and_finishes() {
        let mut t = setup("none", 1, 3).unwrap();
        for i in 1..=3 {
            let report = t.train().unwrap();
            assert_eq!(report.metrics(), &[("score".to_owned(), i as f64)]);
            assert_eq!(report.is_done(), i == 3);
        }
    }

    #[test]
    fn error_fires_at_the_configured_iteration() {
        let mut t = setup("error", 3, 5).unwrap();
        assert!(t.train().is_ok());
        assert!(t.train().is_ok());
        let err = t.train().unwrap_err().to_string();
        assert_eq!(err, "deliberate failure at iteration 3");
    }

    #[test]
    fn state_round_trips_and_reset_keeps_the_count() {
        let mut t = setup("none", 1, 5).unwrap();
        t.train().unwrap();
        t.train().unwrap();
        let state = t.save().unwrap();
        assert_eq!(state, 2u64.to_le_bytes());

        let mut other = setup("none", 1, 3).unwrap();
        other.restore(&state).unwrap();
        let report = other.train().unwrap();
        assert_eq!(report.metrics(), &[("score".to_owned(), 3.0)]);
        assert!(report.is_done(), "done at its own `iterations`");
        assert!(other.restore(b"short").is_err());

        let switched = t.reset(config(r#"{"attack": "error", "at": 3}"#)).unwrap();
        assert!(switched);
        let err = t.train().unwrap_err().to_string();
        assert_eq!(err, "deliberate failure at iteration 3");
    }

    #[test]
    fn loop_restore_fails_train_to_provoke_a_restore() {
        let mut t = setup("loop_restore", 2, 5).unwrap();
        assert!(t.train().is_ok());
        let err = t.train().unwrap_err().to_string();
        assert!(err.contains("so the host restores"), "{err}");
    }

    #[test]
    fn big_and_reserved_reports() {
        let report = setup("big_report", 1, 5).unwrap().train().unwrap();
        assert_eq!(report.metrics().len(), 100_000);
        assert_eq!(report.metrics()[99_999].0, "m99999");

        let report = setup("reserved_metric", 1, 5).unwrap().train().unwrap();
        assert!(
            report
                .metrics()
                .iter()
                .any(|(name, _)| name == "training_iteration")
        );
    }
}
