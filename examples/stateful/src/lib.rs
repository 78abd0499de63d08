//! A deterministic trainable whose whole state lives in guest memory, for
//! checking that host snapshots, restores and recoveries are exact.
//!
//! Each `train()` call advances a pseudo-random walk over a heap buffer
//! (`buffer_kib` KiB, every word rewritten), so any byte the host fails to
//! carry across a restore changes the reported `digest`. Optional I/O keeps
//! WASI handles in play:
//!
//! ```json
//! {"seed": 7, "buffer_kib": 256, "iterations": 10, "print": true,
//!  "read_data": true, "hold_file": false, "trap_at": 0}
//! ```
//!
//! - `print`: `println!` one line per call (the guest's libc then holds a
//!   stdout stream handle across calls);
//! - `read_data`: setup writes `seed.txt` in the trial's directory and every
//!   call reads it back (preopened directories stay open in libc);
//! - `hold_file`: keeps `held.txt` open across calls, a state no host
//!   snapshot can restore exactly (it must be refused);
//! - `reserve_mib`: keep that many MiB of zeroed heap that is never touched;
//! - `trap_at`: trap in that call (from 1) unless `recovered.txt` exists in the
//!   trial's directory; the trap writes it first, so a retry succeeds.
//!   `0` never traps.
//!
//! Reports `digest` (the buffer's hash, below 2^52), `counter` and, when
//! reading data, `data_bytes`.

use std::fs::File;
use std::io::Write;

use serde::{Deserialize, Serialize};
use wtune_guest::{Error, Report, Result, Trainable};

/// The trial's config (see the crate docs).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Seeds the walk.
    #[serde(default)]
    pub seed: u64,
    /// Size of the mutated heap buffer in KiB.
    #[serde(default = "default_buffer")]
    pub buffer_kib: usize,
    /// `done` at this call.
    #[serde(default = "default_iterations")]
    pub iterations: u64,
    /// Print a line per call.
    #[serde(default)]
    pub print: bool,
    /// Read `seed.txt` back each call.
    #[serde(default)]
    pub read_data: bool,
    /// Keep a file open across calls.
    #[serde(default)]
    pub hold_file: bool,
    /// Trap once in this call.
    #[serde(default)]
    pub trap_at: u64,
    /// MiB of zeroed heap reserved and never touched (a mostly idle heap).
    #[serde(default)]
    pub reserve_mib: usize,
}

fn default_buffer() -> usize {
    256
}

fn default_iterations() -> u64 {
    10
}

/// The trainable's state.
#[derive(Serialize, Deserialize)]
pub struct Stateful {
    config: Config,
    counter: u64,
    rng: u64,
    buffer: Vec<u64>,
    #[serde(skip)]
    reserve: Vec<u8>,
    #[serde(skip)]
    held: Option<File>,
}

fn next(rng: &mut u64) -> u64 {
    // xorshift64*: fixed, so native and wasm runs agree.
    *rng ^= *rng >> 12;
    *rng ^= *rng << 25;
    *rng ^= *rng >> 27;
    rng.wrapping_mul(0x2545_F491_4F6C_DD1D)
}

impl Stateful {
    fn digest(&self) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for word in &self.buffer {
            h ^= *word;
            h = h.wrapping_mul(0x100_0000_01b3);
        }
        h ^= self.counter;
        h & ((1 << 52) - 1)
    }
}

impl Trainable for Stateful {
    type Config = Config;

    fn setup(config: Config) -> Result<Self> {
        if config.buffer_kib == 0 {
            return Err(Error::msg("`buffer_kib` must be at least 1"));
        }
        let mut rng = config.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let buffer = (0..config.buffer_kib * 128)
            .map(|_| next(&mut rng))
            .collect();
        if config.read_data {
            std::fs::write("seed.txt", config.seed.to_string())?;
        }
        let held = if config.hold_file {
            let mut file = File::create("held.txt")?;
            file.write_all(b"held open across calls\n")?;
            Some(file)
        } else {
            None
        };
        wtune_guest::info!("stateful trainable set up with seed {}", config.seed);
        let reserve = vec![0; config.reserve_mib << 20];
        Ok(Stateful {
            config,
            counter: 0,
            rng,
            buffer,
            reserve,
            held,
        })
    }

    fn train(&mut self) -> Result<Report> {
        self.counter += 1;
        if self.counter == self.config.trap_at && !std::path::Path::new("recovered.txt").exists() {
            std::fs::write("recovered.txt", b"trapped once\n")?;
            std::process::abort();
        }
        let len = self.buffer.len();
        let mut carry = next(&mut self.rng);
        for i in 0..len {
            let j = (carry as usize) % len;
            carry = carry.rotate_left(7) ^ self.buffer[j];
            self.buffer[i] = self.buffer[i].wrapping_add(carry);
        }
        if let Some(file) = &mut self.held {
            writeln!(file, "call {}", self.counter)?;
        }
        let mut report = Report::new()
            .metric("digest", self.digest() as f64)
            .metric("counter", self.counter as f64);
        if !self.reserve.is_empty() {
            report = report.metric("reserved_bytes", self.reserve.len() as f64);
        }
        if self.config.read_data {
            let text = std::fs::read_to_string("seed.txt")?;
            report = report.metric("data_bytes", text.len() as f64);
        }
        if self.config.print {
            println!("call {} digest {}", self.counter, self.digest());
        }
        Ok(report.done(self.counter >= self.config.iterations))
    }
}

wtune_guest::export!(Stateful, checkpoint = serde);
