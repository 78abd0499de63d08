//! Resources: what each trial asks for (CPU, GPU, memory and custom
//! resources), what the experiment has, and the accounting that keeps the
//! requests of live trials within it. A trial that does not fit now stays
//! PENDING; one that could never fit is an error, not an endless wait.
//!
//! In the experiment file:
//! ```toml
//! # What each trial asks for. Left out: 1 CPU and nothing else.
//! resources_per_trial = { cpu = 0.5, gpu = 0.5, memory = "2GiB", custom = { licence = 1 } }
//!
//! # What exists. CPU and memory left out are this machine's; GPUs left
//! # out are the adapters host compute runs on, if any (see `fit_gpu`).
//! [resources]
//! gpu = 1
//! custom = { licence = 4 }
//! ```
//!
//! CPU, GPU and custom amounts are counted in fixed point, in units of
//! 1/10 000 (Ray's precision), and memory in bytes. Float sums drift
//! (`0.1 + 0.2 > 0.3`), which would refuse a trial that fits or, the other
//! way round, admit one that does not; integer sums cannot.

use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};

use crate::machine::{self, machine_gpus};
use crate::units::parse_size;

/// Units per whole CPU, GPU or custom resource.
const SCALE: u64 = 10_000;

/// Most GPUs a pool places trials on, one by one ([`ResourcePool::gpus_of`]).
const MAX_GPUS: u64 = 4096;

/// Largest CPU, GPU or custom amount accepted: far below where `amount *
/// SCALE`, or a sum of many such, could overflow a `u64`.
const MAX_AMOUNT: f64 = 1e12;

/// Memory total meaning "not counted": used where the machine's memory is
/// unknown (see [`ResourcePool::detect`]).
pub const UNLIMITED_MEMORY: u64 = u64::MAX;

/// What one trial asks for (`resources_per_trial`), or what an experiment
/// has (see [`ResourcePool::new`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Resources {
    /// CPUs; fractions share a core.
    pub cpu: f64,
    /// GPUs; a fraction (at most 1) shares one GPU, more than one must be
    /// a whole number, as in Ray.
    pub gpu: f64,
    /// Bytes of memory: a number of bytes or a size such as `"2GiB"`.
    #[serde(deserialize_with = "size")]
    pub memory: u64,
    /// Named resources the experiment declares (licences, devices, ...).
    pub custom: BTreeMap<String, f64>,
}

impl Default for Resources {
    /// Ray Tune's default request: one CPU.
    fn default() -> Self {
        Self {
            cpu: 1.0,
            gpu: 0.0,
            memory: 0,
            custom: BTreeMap::new(),
        }
    }
}

impl Resources {
    /// Nothing at all: the starting point for totals and for trials that
    /// should not count against the pool.
    pub fn none() -> Self {
        Self {
            cpu: 0.0,
            ..Self::default()
        }
    }

    /// Checks a trial's request on its own (not against any total), naming
    /// the first bad field as `resources_per_trial.<field>`.
    pub fn validate(&self) -> Result<(), String> {
        Units::request(self).map(|_| ())
    }
}

impl fmt::Display for Resources {
    /// `1 CPU, 0.5 GPU, 2 GiB memory, 1 licence`; zero amounts are left out.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if self.cpu > 0.0 {
            parts.push(counted(self.cpu, "CPU"));
        }
        if self.gpu > 0.0 {
            parts.push(counted(self.gpu, "GPU"));
        }
        if self.memory > 0 {
            parts.push(format!("{} memory", bytes(self.memory)));
        }
        for (name, amount) in &self.custom {
            if *amount > 0.0 {
                parts.push(format!("{} {name}", decimal(*amount)));
            }
        }
        if parts.is_empty() {
            f.write_str("no resources")
        } else {
            f.write_str(&parts.join(", "))
        }
    }
}

/// The experiment's `[resources]` table: what exists. A field left out is
/// detected ([`ResourcePool::detect`]); custom resources are only what is
/// declared.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PoolSpec {
    /// CPUs; default: this machine's cores.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<f64>,
    /// GPUs; default: the adapters host compute runs on, when it runs on
    /// GPUs, else none (see [`fit_gpu`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu: Option<f64>,
    /// Bytes of memory; default: this machine's.
    #[serde(
        deserialize_with = "optional_size",
        skip_serializing_if = "Option::is_none"
    )]
    pub memory: Option<u64>,
    /// Named resources and how much of each exists.
    pub custom: BTreeMap<String, f64>,
}

impl PoolSpec {
    /// With `cpu` undeclared, declares enough CPUs for `trials` trials
    /// asking `per_trial` each where this machine's cores hold fewer, so
    /// that they all run at once, sharing the cores; returns the cores when
    /// it did. In fuel order, decisions depend on how many trials run at
    /// once, which must then be `max_concurrent_trials` on every machine,
    /// not the number of its cores.
    pub fn share_cores(&mut self, per_trial: f64, trials: usize) -> Option<u64> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
        let needed = per_trial * trials as f64;
        if self.cpu.is_some() || needed <= cores as f64 {
            return None;
        }
        self.cpu = Some(needed);
        Some(cores)
    }

    /// The pool: declared amounts, the rest detected.
    pub fn build(&self) -> Result<ResourcePool, String> {
        let detected = ResourcePool::detect();
        let total = Resources {
            cpu: self.cpu.unwrap_or(detected.total.cpu as f64 / SCALE as f64),
            gpu: self.gpu.unwrap_or(0.0),
            memory: self.memory.unwrap_or(detected.total.memory),
            custom: self.custom.clone(),
        };
        ResourcePool::new(&total)
    }
}

/// Fits the experiment's GPU accounting to where its host compute runs,
/// `gpus` being how many GPUs that is (0 off the GPU: see
/// `Program::compute_gpus`). Trials reach a GPU only through host compute,
/// and the runner places each on one of the pool's GPUs (see
/// [`ResourcePool::gpus_of`]), so:
/// - on GPUs, the pool holds those adapters unless `[resources] gpu`
///   declares fewer (trials then use the first ones); declaring more is an
///   error, as trials placed on the missing ones could not compute. Each
///   trial's `gpu` share counts against the GPU it is placed on: with
///   `gpu = 0.25` four trials compute on each at once while others wait;
/// - off them (no adapter, `compute = "cpu"`, or a trainable that does not
///   import `compute`), declared GPUs are taken as they stand; without
///   them a trial's `gpu` share has nothing to count against and is
///   dropped, so one experiment file runs on machines with and without a
///   GPU.
///
/// Returns a note for the user when a share was dropped, or when trials
/// compute on GPUs without asking for a share of one.
pub fn fit_gpu(
    pool: &mut PoolSpec,
    request: &mut Resources,
    gpus: usize,
) -> Result<Option<String>, String> {
    if gpus > 0 {
        let found = counted(gpus as f64, "GPU");
        if let Some(declared) = pool.gpu {
            if declared > gpus as f64 {
                return Err(format!(
                    "resources.gpu = {} but host compute has {found} to place trials on (the \
                     Vulkan adapters it found); lower resources.gpu to {gpus} or leave it out",
                    decimal(declared)
                ));
            }
            return Ok(None);
        }
        pool.gpu = Some(gpus as f64);
        return Ok((request.gpu == 0.0).then(|| {
            format!(
                "host compute runs on {found} and resources_per_trial.gpu is 0, so running \
                 trials share {} with no bound on how many; set resources_per_trial.gpu \
                 (e.g. 0.25) to bound how many share one",
                if gpus == 1 { "it" } else { "them" }
            )
        }));
    }
    if pool.gpu.is_some() {
        return Ok(None);
    }
    if request.gpu > 0.0 {
        let asked = request.gpu;
        request.gpu = 0.0;
        return Ok(Some(format!(
            "host compute does not run on a GPU here, so resources_per_trial.gpu = {} is not \
             counted",
            decimal(asked)
        )));
    }
    Ok(None)
}

/// How many trials of one request a pool holds at once
/// ([`ResourcePool::capacity`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capacity {
    /// Trials that fit together.
    pub trials: usize,
    /// The key of the dimension that bounds them: `cpu`, `gpu`, `memory`
    /// or `custom.NAME`.
    pub key: String,
    /// What one trial asks of it, as a user would write it.
    pub asked: String,
    /// What the experiment has of it.
    pub total: String,
}

/// Whether [`ResourcePool::acquire`] granted the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquire {
    /// The trial now holds the resources it asked for.
    Granted,
    /// Not enough is free now; the trial should stay PENDING (or PAUSED)
    /// and ask again once another trial releases its resources.
    Wait,
}

/// The experiment's resources and the trials holding some, keyed by trial
/// id. Keying by id (rather than handing out lease tokens) makes misuse
/// harmless: releasing twice, or releasing a trial that holds nothing,
/// changes nothing.
///
/// GPUs are also counted one by one: a trial's share of a GPU must fit on
/// one GPU (two trials asking 0.6 of two GPUs run on one each, and a third
/// waits though 0.8 is free in all), and the pool says which GPUs each
/// trial holds, so its host compute runs there.
#[derive(Debug, Clone)]
pub struct ResourcePool {
    total: Units,
    /// Always the sum of `leases`, and within `total` in every dimension.
    used: Units,
    leases: BTreeMap<String, Lease>,
    /// What the leases hold of each GPU.
    gpus: Gpus,
}

/// What one trial holds.
#[derive(Debug, Clone)]
struct Lease {
    units: Units,
    /// The GPUs it is placed on (none where the pool has none).
    gpus: Vec<usize>,
}

impl ResourcePool {
    /// A pool with `total` resources, checked (`resources.<field>` names a
    /// bad one). Its memory may be [`UNLIMITED_MEMORY`].
    pub fn new(total: &Resources) -> Result<Self, String> {
        let units = Units::parse(total, "resources")?;
        if units.gpu > MAX_GPUS * SCALE {
            return Err(format!(
                "resources.gpu = {} is more GPUs than wtune places trials on (at most \
                 {MAX_GPUS}); count other things as custom resources",
                total.gpu
            ));
        }
        Ok(Self::with_total(units))
    }

    /// This machine: its cores (`available_parallelism`, which honours CPU
    /// affinity and cgroup quotas), its memory (`MemTotal` in
    /// `/proc/meminfo`, lowered to the cgroup v2 `memory.max` where a
    /// container sets one) and its GPUs (see [`crate::machine::detect_gpus`]). Where
    /// neither memory file can be read (systems other than Linux), memory
    /// is [`UNLIMITED_MEMORY`]: requests for memory are then never refused.
    pub fn detect() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
        let gpus = machine_gpus().min(MAX_GPUS);
        Self::with_total(Units {
            cpu: cores.saturating_mul(SCALE),
            gpu: gpus.saturating_mul(SCALE),
            memory: machine::memory().unwrap_or(UNLIMITED_MEMORY),
            custom: BTreeMap::new(),
        })
    }

    fn with_total(total: Units) -> Self {
        Self {
            gpus: Gpus::new(total.gpu),
            total,
            used: Units::default(),
            leases: BTreeMap::new(),
        }
    }

    /// What exists.
    pub fn total(&self) -> Resources {
        self.total.resources()
    }

    /// The sum of what live trials hold.
    pub fn used(&self) -> Resources {
        self.used.resources()
    }

    /// What is free now.
    pub fn available(&self) -> Resources {
        self.total.minus(&self.used).resources()
    }

    /// What `trial_id` holds, if anything.
    pub fn held(&self, trial_id: &str) -> Option<Resources> {
        self.leases
            .get(trial_id)
            .map(|lease| lease.units.resources())
    }

    /// The GPUs `trial_id` is placed on, numbered from 0; its host compute
    /// runs on the first. Empty when it holds nothing or the pool has no
    /// GPUs. A trial asking no GPU is placed on the GPU fewest trials share
    /// (as trials computing on GPUs still use one), a fraction on the GPU
    /// with the most free (spreading trials out while there is room), and
    /// whole GPUs on the first ones nobody uses.
    pub fn gpus_of(&self, trial_id: &str) -> &[usize] {
        self.leases
            .get(trial_id)
            .map_or(&[], |lease| lease.gpus.as_slice())
    }

    /// How many trials hold resources.
    pub fn holders(&self) -> usize {
        self.leases.len()
    }

    /// Whether `request` is valid and could ever be granted: within the
    /// total in every dimension. The error says which dimension, what was
    /// asked, what exists, and which key to change.
    pub fn check(&self, request: &Resources) -> Result<(), String> {
        self.exceeds(&Units::request(request)?)
    }

    fn exceeds(&self, request: &Units) -> Result<(), String> {
        let total = &self.total;
        let fix = |key: &str| format!("lower resources_per_trial.{key} or raise resources.{key}");
        if request.cpu > total.cpu {
            return Err(format!(
                "trial asks for {} but the experiment has {}; {}",
                counted_units(request.cpu, "CPU"),
                amount(total.cpu),
                fix("cpu")
            ));
        }
        if request.gpu > total.gpu {
            let hint = if total.gpu == 0 {
                " (none was found on this machine; declare GPUs in [resources])"
            } else {
                ""
            };
            return Err(format!(
                "trial asks for {} but the experiment has {}; {}{hint}",
                counted_units(request.gpu, "GPU"),
                amount(total.gpu),
                fix("gpu")
            ));
        }
        if request.memory > total.memory {
            let (asked, has) = match (bytes(request.memory), bytes(total.memory)) {
                // Rounded alike, they would read as if the request fits.
                (a, b) if a == b => (
                    format!("{} bytes", request.memory),
                    format!("{} bytes", total.memory),
                ),
                pair => pair,
            };
            return Err(format!(
                "trial asks for {asked} of memory but the experiment has {has}; {}",
                fix("memory")
            ));
        }
        for (name, &asked) in &request.custom {
            let has = total.custom.get(name).copied().unwrap_or(0);
            if asked > has {
                return Err(if has == 0 {
                    format!(
                        "trial asks for {} of custom resource `{name}` but the experiment \
                         declares none; declare resources.custom.{name} or remove \
                         resources_per_trial.custom.{name}",
                        amount(asked)
                    )
                } else {
                    format!(
                        "trial asks for {} of custom resource `{name}` but the experiment has {}; {}",
                        amount(asked),
                        amount(has),
                        fix(&format!("custom.{name}"))
                    )
                });
            }
        }
        Ok(())
    }

    /// How many trials asking `request` the whole pool holds at once, and
    /// which dimension bounds them; `None` for a request of nothing, which
    /// never waits, or an invalid one.
    pub fn capacity(&self, request: &Resources) -> Option<Capacity> {
        let request = Units::request(request).ok()?;
        let total = &self.total;
        let dims = [
            (
                "cpu".to_string(),
                request.cpu,
                total.cpu,
                amount as fn(u64) -> String,
            ),
            ("gpu".to_string(), request.gpu, total.gpu, amount),
            ("memory".to_string(), request.memory, total.memory, bytes),
        ]
        .into_iter()
        .chain(request.custom.iter().map(|(name, &asked)| {
            let has = total.custom.get(name).copied().unwrap_or(0);
            (
                format!("custom.{name}"),
                asked,
                has,
                amount as fn(u64) -> String,
            )
        }));
        dims.filter(|(_, asked, _, _)| *asked > 0)
            .map(|(key, asked, has, show)| Capacity {
                trials: if key == "gpu" {
                    self.gpus.trials(asked)
                } else {
                    (has / asked).try_into().unwrap_or(usize::MAX)
                },
                asked: show(asked),
                total: show(has),
                key,
            })
            .min_by_key(|c| c.trials)
    }

    /// Whether `request` fits in what is free now; `false` for an invalid
    /// request.
    pub fn fits(&self, request: &Resources) -> bool {
        Units::request(request).is_ok_and(|r| {
            self.total.minus(&self.used).covers(&r) && self.gpus.place(r.gpu, &[]).is_some()
        })
    }

    /// Gives `trial_id` its `request` when it fits now ([`Acquire::Wait`]
    /// when not). An `Err` means the trial can never run as asked (an
    /// invalid request, or more than exists: see [`ResourcePool::check`]),
    /// or that it already holds resources, which is a caller's mistake
    /// that [`ResourcePool::resize`] or [`ResourcePool::release`] avoids.
    pub fn acquire(&mut self, trial_id: &str, request: &Resources) -> Result<Acquire, String> {
        if self.leases.contains_key(trial_id) {
            return Err(format!(
                "{trial_id} already holds resources; release or resize them instead"
            ));
        }
        let request = Units::request(request)?;
        self.exceeds(&request)?;
        if !self.total.minus(&self.used).covers(&request) {
            return Ok(Acquire::Wait);
        }
        let Some(gpus) = self.gpus.place(request.gpu, &[]) else {
            return Ok(Acquire::Wait);
        };
        self.gpus.add(request.gpu, &gpus);
        self.used = self.used.plus(&request);
        let lease = Lease {
            units: request,
            gpus,
        };
        self.leases.insert(trial_id.to_string(), lease);
        Ok(Acquire::Granted)
    }

    /// Changes what `trial_id` holds to `request`, all at once: on
    /// [`Acquire::Wait`] (the new amount does not fit beside the other
    /// trials) it keeps what it held, so the caller may pause the trial,
    /// release, and acquire again later. A trial holding nothing is simply
    /// [`ResourcePool::acquire`]d. For a scheduler that changes a trial's
    /// resources between steps. The trial keeps the GPU its compute runs
    /// on (the first of [`ResourcePool::gpus_of`]) and, as far as the new
    /// amount allows, its other GPUs: a new amount that does not fit on its
    /// first GPU waits too, to be placed afresh once the trial is paused,
    /// released and acquired again.
    pub fn resize(&mut self, trial_id: &str, request: &Resources) -> Result<Acquire, String> {
        let Some(old) = self.leases.get(trial_id) else {
            return self.acquire(trial_id, request);
        };
        let request = Units::request(request)?;
        self.exceeds(&request)?;
        // `old` is part of `used`, so this cannot underflow.
        let others = self.used.minus(&old.units);
        if !self.total.minus(&others).covers(&request) {
            return Ok(Acquire::Wait);
        }
        let mut all_gpus = self.gpus.clone();
        all_gpus.remove(old.units.gpu, &old.gpus);
        let Some(gpus) = all_gpus.place(request.gpu, &old.gpus) else {
            return Ok(Acquire::Wait);
        };
        all_gpus.add(request.gpu, &gpus);
        self.gpus = all_gpus;
        self.used = others.plus(&request);
        let lease = Lease {
            units: request,
            gpus,
        };
        self.leases.insert(trial_id.to_string(), lease);
        Ok(Acquire::Granted)
    }

    /// Frees what `trial_id` holds and returns it; `None`, changing
    /// nothing, when it holds nothing (never acquired, or released already).
    pub fn release(&mut self, trial_id: &str) -> Option<Resources> {
        let lease = self.leases.remove(trial_id)?;
        self.gpus.remove(lease.units.gpu, &lease.gpus);
        self.used = self.used.minus(&lease.units);
        Some(lease.units.resources())
    }
}

/// The pool's GPUs one by one, in units.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Gpus {
    /// What each GPU has: whole GPUs, then the fraction a total such as
    /// `gpu = 1.5` leaves over.
    capacity: Vec<u64>,
    /// What is placed on each.
    used: Vec<u64>,
    /// How many trials are placed on each, those asking no GPU included.
    holders: Vec<usize>,
}

impl Gpus {
    fn new(total: u64) -> Self {
        let mut capacity = vec![SCALE; (total / SCALE) as usize];
        if !total.is_multiple_of(SCALE) {
            capacity.push(total % SCALE);
        }
        let n = capacity.len();
        Self {
            capacity,
            used: vec![0; n],
            holders: vec![0; n],
        }
    }

    fn free(&self, gpu: usize) -> u64 {
        self.capacity[gpu] - self.used[gpu]
    }

    /// Where a request of `units` goes now (see [`ResourcePool::gpus_of`]
    /// for the choice), `None` if it fits nowhere. A resized trial's
    /// current GPUs are `keep` (taken off first): its first GPU, where its
    /// compute runs, must stay first, and the others are kept as far as
    /// the new amount allows. Without GPUs, only nothing fits, nowhere.
    fn place(&self, units: u64, keep: &[usize]) -> Option<Vec<usize>> {
        if self.capacity.is_empty() {
            return (units == 0).then(Vec::new);
        }
        let all = 0..self.capacity.len();
        if units > SCALE {
            // Whole GPUs, which a multi-GPU request always is (see
            // `Units::request`), on GPUs nobody uses.
            let wanted = (units / SCALE) as usize;
            let unused = |i: &usize| self.capacity[*i] == SCALE && self.used[*i] == 0;
            if keep.first().is_some_and(|first| !unused(first)) {
                return None;
            }
            let kept = keep.iter().copied().filter(unused);
            let placed: Vec<usize> = kept
                .chain(all.filter(|i| !keep.contains(i) && unused(i)))
                .take(wanted)
                .collect();
            return (placed.len() == wanted).then_some(placed);
        }
        let candidates = match keep.first() {
            Some(&gpu) => gpu..gpu + 1,
            None => all,
        };
        let best = candidates.filter(|&i| self.free(i) >= units);
        let chosen = if units == 0 {
            best.min_by_key(|&i| (self.holders[i], Reverse(self.free(i)), i))
        } else {
            best.min_by_key(|&i| (Reverse(self.free(i)), self.holders[i], i))
        };
        chosen.map(|i| vec![i])
    }

    /// What a request of `units` placed on `gpus` holds on each of them.
    fn share(units: u64, gpus: &[usize]) -> u64 {
        if gpus.len() > 1 { SCALE } else { units }
    }

    fn add(&mut self, units: u64, gpus: &[usize]) {
        let share = Self::share(units, gpus);
        for &i in gpus {
            self.used[i] += share;
            self.holders[i] += 1;
        }
    }

    fn remove(&mut self, units: u64, gpus: &[usize]) {
        let share = Self::share(units, gpus);
        for &i in gpus {
            self.used[i] -= share;
            self.holders[i] -= 1;
        }
    }

    /// How many trials asking `units` (more than 0) all the GPUs hold at
    /// once.
    fn trials(&self, units: u64) -> usize {
        if units > SCALE {
            let whole = self.capacity.iter().filter(|&&c| c == SCALE).count();
            whole / (units / SCALE) as usize
        } else {
            self.capacity.iter().map(|&c| (c / units) as usize).sum()
        }
    }
}

/// Amounts in fixed point: CPU, GPU and custom in 1/[`SCALE`] units,
/// memory in bytes. Custom entries are never zero, so equal amounts
/// compare equal however they were written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Units {
    cpu: u64,
    gpu: u64,
    memory: u64,
    custom: BTreeMap<String, u64>,
}

impl Units {
    /// A trial's request: also applies Ray's rule on GPU amounts.
    fn request(r: &Resources) -> Result<Self, String> {
        let units = Self::parse(r, "resources_per_trial")?;
        if units.gpu > SCALE && !units.gpu.is_multiple_of(SCALE) {
            return Err(format!(
                "resources_per_trial.gpu = {} must be at most 1 or a whole number: trials share \
                 a GPU in fractions, but more than one GPU comes only in whole GPUs",
                r.gpu
            ));
        }
        Ok(units)
    }

    fn parse(r: &Resources, table: &str) -> Result<Self, String> {
        let cpu = to_units(r.cpu, &format!("{table}.cpu"))?;
        let gpu = to_units(r.gpu, &format!("{table}.gpu"))?;
        let mut custom = BTreeMap::new();
        for (name, &x) in &r.custom {
            let reserved = ["cpu", "gpu", "memory"].contains(&name.to_ascii_lowercase().as_str());
            if name.trim().is_empty() || reserved {
                return Err(format!(
                    "{table}.custom: {name:?} cannot name a custom resource{}",
                    if reserved {
                        format!("; use {table}.{}", name.to_ascii_lowercase())
                    } else {
                        String::new()
                    }
                ));
            }
            let units = to_units(x, &format!("{table}.custom.{name}"))?;
            if units > 0 {
                custom.insert(name.clone(), units);
            }
        }
        Ok(Self {
            cpu,
            gpu,
            memory: r.memory,
            custom,
        })
    }

    fn resources(&self) -> Resources {
        let float = |u: u64| u as f64 / SCALE as f64;
        Resources {
            cpu: float(self.cpu),
            gpu: float(self.gpu),
            memory: self.memory,
            custom: self
                .custom
                .iter()
                .map(|(name, &u)| (name.clone(), float(u)))
                .collect(),
        }
    }

    /// Whether `request` is within `self` in every dimension.
    fn covers(&self, request: &Units) -> bool {
        request.cpu <= self.cpu
            && request.gpu <= self.gpu
            && request.memory <= self.memory
            && request
                .custom
                .iter()
                .all(|(name, &u)| u <= self.custom.get(name).copied().unwrap_or(0))
    }

    /// Sum; callers add only what `covers` admitted, so the result stays
    /// within a total and cannot overflow, but saturate rather than wrap
    /// should that ever be broken.
    fn plus(&self, other: &Units) -> Units {
        let mut custom = self.custom.clone();
        for (name, &u) in &other.custom {
            let entry = custom.entry(name.clone()).or_insert(0);
            *entry = entry.saturating_add(u);
        }
        Units {
            cpu: self.cpu.saturating_add(other.cpu),
            gpu: self.gpu.saturating_add(other.gpu),
            memory: self.memory.saturating_add(other.memory),
            custom,
        }
    }

    /// Difference, floored at zero; zero custom entries are dropped.
    fn minus(&self, other: &Units) -> Units {
        let mut custom = self.custom.clone();
        for (name, &u) in &other.custom {
            if let Some(entry) = custom.get_mut(name) {
                *entry = entry.saturating_sub(u);
            }
        }
        custom.retain(|_, u| *u > 0);
        Units {
            cpu: self.cpu.saturating_sub(other.cpu),
            gpu: self.gpu.saturating_sub(other.gpu),
            memory: self.memory.saturating_sub(other.memory),
            custom,
        }
    }
}

/// `x` in fixed point, rounded to the nearest unit; `key` names it in
/// errors.
fn to_units(x: f64, key: &str) -> Result<u64, String> {
    if !(x.is_finite() && x >= 0.0) {
        return Err(format!("{key} must be a number, 0 or more; got {x}"));
    }
    if x > MAX_AMOUNT {
        return Err(format!("{key} = {x} is too large (at most {MAX_AMOUNT:e})"));
    }
    let units = (x * SCALE as f64).round() as u64;
    if units == 0 && x > 0.0 {
        // Rounding it to nothing would let any number of such trials run.
        return Err(format!(
            "{key} = {x} is below 0.0001, the smallest amount counted"
        ));
    }
    Ok(units)
}

/// A fixed-point amount written exactly, without float noise: `0.5`, `2`.
fn amount(units: u64) -> String {
    let whole = units / SCALE;
    let frac = units % SCALE;
    if frac == 0 {
        return whole.to_string();
    }
    let digits = format!("{frac:04}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

/// `0.5 GPU`, `1 GPU`, `2 GPUs`.
fn counted_units(units: u64, what: &str) -> String {
    let plural = if units > SCALE { "s" } else { "" };
    format!("{} {what}{plural}", amount(units))
}

fn counted(x: f64, what: &str) -> String {
    let plural = if x > 1.0 { "s" } else { "" };
    format!("{} {what}{plural}", decimal(x))
}

/// `x` to the precision counted, so `3.0 * 0.1` shows as `0.3`.
fn decimal(x: f64) -> String {
    if x.is_finite() && (0.0..=MAX_AMOUNT).contains(&x) {
        amount((x * SCALE as f64).round() as u64)
    } else {
        x.to_string()
    }
}

/// Bytes in the largest binary unit, to two decimals: `2 GiB`, `7.75 GiB`.
fn bytes(n: u64) -> String {
    if n == UNLIMITED_MEMORY {
        return "unlimited".into();
    }
    const UNITS: [(&str, u64); 4] = [
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    for (name, size) in UNITS {
        if n >= size {
            let x = format!("{:.2}", n as f64 / size as f64);
            let x = x.trim_end_matches('0').trim_end_matches('.');
            return format!("{x} {name}");
        }
    }
    format!("{n} bytes")
}

/// Accepts a number of bytes or a size string (`"2GiB"`), for TOML and
/// JSON alike.
fn size<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    deserializer.deserialize_any(SizeVisitor)
}

fn optional_size<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<u64>, D::Error> {
    size(deserializer).map(Some)
}

struct SizeVisitor;

impl SizeVisitor {
    fn refuse<E: de::Error>(got: impl fmt::Display) -> E {
        E::custom(format!(
            "memory must be a size such as \"2GiB\" or \"512MiB\", or a number of bytes; got {got}"
        ))
    }
}

impl Visitor<'_> for SizeVisitor {
    type Value = u64;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a size such as \"2GiB\" or a number of bytes")
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
        Ok(v)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
        u64::try_from(v).map_err(|_| Self::refuse(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<u64, E> {
        // TOML writes 2e9 as a float; a whole one is a byte count.
        if v.is_finite() && v >= 0.0 && v.fract() == 0.0 && v < 1.8e19 {
            Ok(v as u64)
        } else {
            Err(Self::refuse(v))
        }
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<u64, E> {
        // parse_size refuses 0, which is a fine request.
        if v.trim()
            .trim_end_matches(|c: char| c.is_ascii_alphabetic())
            .trim()
            == "0"
        {
            return Ok(0);
        }
        parse_size(v).ok_or_else(|| Self::refuse(format!("{v:?}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn pool(cpu: f64, gpu: f64) -> ResourcePool {
        ResourcePool::new(&Resources {
            cpu,
            gpu,
            memory: 8 << 30,
            custom: BTreeMap::new(),
        })
        .unwrap()
    }

    fn ask(cpu: f64, gpu: f64) -> Resources {
        Resources {
            cpu,
            gpu,
            ..Resources::default()
        }
    }

    /// Acquires for `trial_0`, `trial_1`, ... and returns how many were
    /// granted before the first wait.
    fn granted(pool: &mut ResourcePool, request: &Resources, trials: usize) -> usize {
        (0..trials)
            .map(|i| pool.acquire(&format!("trial_{i}"), request).unwrap())
            .take_while(|a| *a == Acquire::Granted)
            .count()
    }

    #[test]
    fn gpu_shares_follow_where_host_compute_runs() {
        let half = Resources {
            gpu: 0.5,
            ..Resources::default()
        };
        let declared = |gpu| PoolSpec {
            gpu: Some(gpu),
            ..PoolSpec::default()
        };
        // On GPUs: the adapters are the pool's GPUs; shares count.
        for gpus in [1, 4] {
            let (mut pool, mut request) = (PoolSpec::default(), half.clone());
            assert_eq!(fit_gpu(&mut pool, &mut request, gpus), Ok(None));
            assert_eq!((pool.gpu, request.gpu), (Some(gpus as f64), 0.5));
        }
        // Trials without a share still compute there, unbounded: said once.
        let (mut pool, mut request) = (PoolSpec::default(), Resources::default());
        let note = fit_gpu(&mut pool, &mut request, 2).unwrap().unwrap();
        assert!(note.starts_with("host compute runs on 2 GPUs"), "{note}");
        assert!(note.contains("set resources_per_trial.gpu"), "{note}");
        // Fewer declared than found: the first ones are used.
        let (mut pool, mut request) = (declared(1.5), half.clone());
        assert_eq!(fit_gpu(&mut pool, &mut request, 2), Ok(None));
        assert_eq!((pool.gpu, request.gpu), (Some(1.5), 0.5));
        // More declared than found: trials could be placed on nothing.
        let (mut pool, mut request) = (declared(3.0), half.clone());
        assert_eq!(
            fit_gpu(&mut pool, &mut request, 2).unwrap_err(),
            "resources.gpu = 3 but host compute has 2 GPUs to place trials on (the Vulkan \
             adapters it found); lower resources.gpu to 2 or leave it out"
        );
        assert_eq!((pool.gpu, request.gpu), (Some(3.0), 0.5), "nothing changed");
        // Not on a GPU: the share is dropped, and said so.
        let (mut pool, mut request) = (PoolSpec::default(), half.clone());
        let note = fit_gpu(&mut pool, &mut request, 0).unwrap().unwrap();
        assert!(
            note.contains("resources_per_trial.gpu = 0.5 is not counted"),
            "{note}"
        );
        assert_eq!((pool.gpu, request.gpu), (None, 0.0));
        // ... unless GPUs are declared, which are then the user's word.
        let (mut pool, mut request) = (declared(4.0), half.clone());
        assert_eq!(fit_gpu(&mut pool, &mut request, 0), Ok(None));
        assert_eq!((pool.gpu, request.gpu), (Some(4.0), 0.5));
    }

    #[test]
    fn four_half_gpu_trials_on_one_gpu_run_two_at_a_time() {
        // Ray Tune: resources_per_trial={"gpu": 0.5} with one GPU.
        let mut p = pool(4.0, 1.0);
        let half = ask(1.0, 0.5);
        assert_eq!(granted(&mut p, &half, 4), 2);
        assert_eq!(p.holders(), 2);
        assert_eq!(p.used().gpu, 1.0);
        assert!(!p.fits(&half));
        // The waiting trials get in as running ones finish.
        assert!(p.release("trial_0").is_some());
        assert_eq!(p.acquire("trial_2", &half).unwrap(), Acquire::Granted);
        assert_eq!(p.acquire("trial_3", &half).unwrap(), Acquire::Wait);
        p.release("trial_1");
        assert_eq!(p.acquire("trial_3", &half).unwrap(), Acquire::Granted);
    }

    #[test]
    fn a_gpu_share_must_fit_on_one_gpu_and_shares_spread_out() {
        let mut p = pool(16.0, 2.0);
        let share = ask(1.0, 0.6);
        assert_eq!(p.acquire("t0", &share), Ok(Acquire::Granted));
        assert_eq!(p.acquire("t1", &share), Ok(Acquire::Granted));
        assert_eq!((p.gpus_of("t0"), p.gpus_of("t1")), (&[0][..], &[1][..]));
        // 0.8 of a GPU is free, but 0.4 on each: the third waits.
        assert_eq!(p.available().gpu, 0.8);
        assert!(!p.fits(&share));
        assert_eq!(p.acquire("t2", &share), Ok(Acquire::Wait));
        assert_eq!(p.gpus_of("t2"), &[] as &[usize]);
        assert!(p.fits(&ask(1.0, 0.4)));
        assert_eq!(p.capacity(&share).unwrap().trials, 2, "not 2 / 0.6 = 3");
        assert_eq!(p.release("t0"), Some(share.clone()));
        assert_eq!(p.gpus_of("t0"), &[] as &[usize]);
        assert_eq!(p.acquire("t2", &share), Ok(Acquire::Granted));
        assert_eq!(p.gpus_of("t2"), &[0]);
    }

    #[test]
    fn whole_gpus_go_to_gpus_nobody_uses() {
        let mut p = pool(16.0, 4.0);
        assert_eq!(p.acquire("half", &ask(1.0, 0.5)), Ok(Acquire::Granted));
        assert_eq!(p.acquire("two", &ask(1.0, 2.0)), Ok(Acquire::Granted));
        assert_eq!(p.gpus_of("half"), &[0]);
        assert_eq!(p.gpus_of("two"), &[1, 2]);
        // 2.5 GPUs are free in all, but only GPU 3 whole.
        assert_eq!(p.acquire("again", &ask(1.0, 2.0)), Ok(Acquire::Wait));
        assert_eq!(p.acquire("one", &ask(1.0, 1.0)), Ok(Acquire::Granted));
        assert_eq!(p.gpus_of("one"), &[3]);
        p.release("two");
        assert_eq!(p.acquire("again", &ask(1.0, 2.0)), Ok(Acquire::Granted));
        assert_eq!(p.gpus_of("again"), &[1, 2]);
        assert_eq!(p.capacity(&ask(0.0, 2.0)).unwrap().trials, 2);
    }

    #[test]
    fn trials_asking_no_gpu_are_spread_over_the_gpus_they_compute_on() {
        let mut p = pool(16.0, 2.0);
        let none = ask(1.0, 0.0);
        for (trial, gpu) in [("t0", 0), ("t1", 1), ("t2", 0)] {
            assert_eq!(p.acquire(trial, &none), Ok(Acquire::Granted));
            assert_eq!(p.gpus_of(trial), &[gpu], "{trial}");
        }
        // Both GPUs are wholly free; GPU 1 has fewer trials on it.
        assert_eq!(p.acquire("t3", &ask(1.0, 0.5)), Ok(Acquire::Granted));
        assert_eq!(p.gpus_of("t3"), &[1]);
        // Without GPUs, nothing is placed and nothing waits.
        let mut cpu_only = pool(16.0, 0.0);
        assert_eq!(cpu_only.acquire("t0", &none), Ok(Acquire::Granted));
        assert_eq!(cpu_only.gpus_of("t0"), &[] as &[usize]);
    }

    #[test]
    fn a_fractional_gpu_total_is_whole_gpus_and_a_part_of_one() {
        let mut p = pool(16.0, 1.5);
        assert_eq!(p.acquire("t0", &ask(1.0, 0.75)), Ok(Acquire::Granted));
        assert_eq!(p.gpus_of("t0"), &[0]);
        // GPU 0 has 0.25 left and GPU 1 (half a GPU) 0.5.
        assert_eq!(p.acquire("t1", &ask(1.0, 0.75)), Ok(Acquire::Wait));
        assert_eq!(p.acquire("t2", &ask(1.0, 0.5)), Ok(Acquire::Granted));
        assert_eq!(p.gpus_of("t2"), &[1]);
        assert_eq!(p.capacity(&ask(0.0, 0.5)).unwrap().trials, 3);
    }

    #[test]
    fn a_resized_trial_keeps_the_gpu_it_computes_on() {
        let mut p = pool(16.0, 2.0);
        for (trial, gpu) in [("t0", 0.5), ("t1", 0.5), ("t2", 0.25)] {
            assert_eq!(p.acquire(trial, &ask(1.0, gpu)), Ok(Acquire::Granted));
        }
        assert_eq!(p.gpus_of("t2"), &[0]);
        // GPU 0 holds 0.25 besides t0: t0 may grow to 0.75 there.
        assert_eq!(p.resize("t0", &ask(1.0, 0.75)), Ok(Acquire::Granted));
        assert_eq!(p.gpus_of("t0"), &[0]);
        // A whole GPU needs GPU 0 to itself, and t2 is there.
        assert_eq!(p.resize("t0", &ask(1.0, 1.0)), Ok(Acquire::Wait));
        assert_eq!(p.held("t0").unwrap().gpu, 0.75, "kept what it held");
        assert_eq!(p.gpus_of("t0"), &[0]);
        // Two whole GPUs from GPU 1: GPU 0 is in use.
        assert_eq!(p.resize("t1", &ask(1.0, 2.0)), Ok(Acquire::Wait));
        p.release("t0");
        p.release("t2");
        assert_eq!(p.resize("t1", &ask(1.0, 2.0)), Ok(Acquire::Granted));
        assert_eq!(p.gpus_of("t1"), &[1, 0]);
        // GPU 0 is free again, but a CPU-only change moves nothing.
        let mut other = pool(16.0, 4.0);
        other.acquire("first", &ask(1.0, 1.0)).unwrap();
        other.acquire("pair", &ask(1.0, 2.0)).unwrap();
        assert_eq!(other.gpus_of("pair"), &[1, 2]);
        other.release("first");
        assert_eq!(other.resize("pair", &ask(3.0, 2.0)), Ok(Acquire::Granted));
        assert_eq!(other.gpus_of("pair"), &[1, 2]);
        // Fewer GPUs keep the first ones held.
        assert_eq!(p.resize("t1", &ask(1.0, 0.5)), Ok(Acquire::Granted));
        assert_eq!(p.gpus_of("t1"), &[1]);
        assert_eq!(p.used().gpu, 0.5);
    }

    #[test]
    fn a_pool_of_more_gpus_than_are_placed_is_refused() {
        let err = ResourcePool::new(&ask(1.0, 5000.0)).unwrap_err();
        assert_eq!(
            err,
            "resources.gpu = 5000 is more GPUs than wtune places trials on (at most 4096); \
             count other things as custom resources"
        );
        assert!(ResourcePool::new(&ask(1.0, 4096.0)).is_ok());
    }

    #[test]
    fn three_one_cpu_trials_on_two_cores_run_two_at_a_time() {
        let mut p = pool(2.0, 0.0);
        assert_eq!(granted(&mut p, &Resources::default(), 3), 2);
        assert_eq!(p.available().cpu, 0.0);
    }

    #[test]
    fn capacity_names_the_dimension_that_bounds_concurrency() {
        let p = pool(4.0, 1.0);
        let cap = |r: &Resources| p.capacity(r).map(|c| (c.trials, c.key, c.asked, c.total));
        assert_eq!(
            cap(&Resources::default()),
            Some((4, "cpu".into(), "1".into(), "4".into()))
        );
        assert_eq!(
            cap(&ask(0.5, 0.25)),
            Some((4, "gpu".into(), "0.25".into(), "1".into()))
        );
        assert_eq!(
            cap(&Resources {
                memory: 3 << 30,
                ..ask(0.5, 0.0)
            }),
            Some((2, "memory".into(), "3 GiB".into(), "8 GiB".into()))
        );
        let licence = Resources {
            custom: BTreeMap::from([("licence".to_string(), 1.0)]),
            ..ask(0.5, 0.0)
        };
        assert_eq!(
            cap(&licence),
            Some((0, "custom.licence".into(), "1".into(), "0".into()))
        );
        // Asking nothing never waits; an invalid request has no capacity.
        assert_eq!(cap(&ask(0.0, 0.0)), None);
        assert_eq!(cap(&ask(-1.0, 0.0)), None);
    }

    #[test]
    fn oversized_requests_fail_with_what_to_change() {
        let p = pool(4.0, 1.0);
        assert_eq!(
            p.check(&ask(1.0, 2.0)).unwrap_err(),
            "trial asks for 2 GPUs but the experiment has 1; \
             lower resources_per_trial.gpu or raise resources.gpu"
        );
        assert_eq!(
            p.check(&ask(6.0, 0.0)).unwrap_err(),
            "trial asks for 6 CPUs but the experiment has 4; \
             lower resources_per_trial.cpu or raise resources.cpu"
        );
        let no_gpu = pool(4.0, 0.0).check(&ask(1.0, 0.5)).unwrap_err();
        assert!(
            no_gpu.starts_with("trial asks for 0.5 GPU but the experiment has 0;")
                && no_gpu.contains("none was found on this machine; declare GPUs in [resources]"),
            "{no_gpu}"
        );
        let memory = Resources {
            memory: 16 << 30,
            ..Resources::default()
        };
        assert_eq!(
            p.check(&memory).unwrap_err(),
            "trial asks for 16 GiB of memory but the experiment has 8 GiB; \
             lower resources_per_trial.memory or raise resources.memory"
        );
        let one_byte_over = Resources {
            memory: (8 << 30) + 1,
            ..Resources::default()
        };
        assert!(
            p.check(&one_byte_over)
                .unwrap_err()
                .contains("8589934593 bytes of memory but the experiment has 8589934592 bytes")
        );
        let licence = Resources {
            custom: BTreeMap::from([("licence".to_string(), 1.0)]),
            ..Resources::default()
        };
        let message = p.check(&licence).unwrap_err();
        assert!(
            message.contains("custom resource `licence`")
                && message.contains("declare resources.custom.licence"),
            "{message}"
        );
        // acquire refuses rather than leaving the trial waiting forever.
        let mut p = p;
        assert!(p.acquire("trial_0", &ask(1.0, 2.0)).is_err());
        assert_eq!(p.holders(), 0);
    }

    #[test]
    fn fixed_point_admits_exactly_what_fits() {
        // 0.1 + 0.1 + 0.1 > 0.3 in floats: a float sum would refuse the third.
        let mut p = pool(0.3, 0.0);
        assert_eq!(granted(&mut p, &ask(0.1, 0.0), 4), 3);
        // Ten tenths on one CPU, and not an eleventh.
        let mut p = pool(1.0, 0.0);
        assert_eq!(granted(&mut p, &ask(0.1, 0.0), 11), 10);
        assert_eq!(p.available().cpu, 0.0);
        // Thirds do not add up to one exactly; 0.3333 each leaves 0.0001.
        let mut p = pool(1.0, 0.0);
        assert_eq!(granted(&mut p, &ask(1.0 / 3.0, 0.0), 4), 3);
        assert_eq!(p.available().cpu, 0.0001);
    }

    #[test]
    fn release_twice_or_unknown_changes_nothing() {
        let mut p = pool(2.0, 1.0);
        assert_eq!(p.acquire("a", &ask(1.0, 0.5)).unwrap(), Acquire::Granted);
        assert_eq!(p.acquire("b", &ask(1.0, 0.5)).unwrap(), Acquire::Granted);
        assert_eq!(p.release("a"), Some(ask(1.0, 0.5)));
        assert_eq!(p.release("a"), None);
        assert_eq!(p.release("nobody"), None);
        assert_eq!(p.used(), ask(1.0, 0.5));
        assert_eq!(p.held("b"), Some(ask(1.0, 0.5)));
        assert!(
            p.acquire("b", &ask(0.5, 0.0))
                .unwrap_err()
                .contains("already holds")
        );
        assert_eq!(p.used(), ask(1.0, 0.5));
    }

    #[test]
    fn resize_is_all_or_nothing() {
        let mut p = pool(4.0, 1.0);
        p.acquire("a", &ask(1.0, 0.5)).unwrap();
        p.acquire("b", &ask(1.0, 0.25)).unwrap();
        // Growing within what is free.
        assert_eq!(p.resize("a", &ask(2.0, 0.75)).unwrap(), Acquire::Granted);
        assert_eq!(p.used(), ask(3.0, 1.0));
        // Beyond it: nothing changes.
        assert_eq!(p.resize("b", &ask(1.0, 0.5)).unwrap(), Acquire::Wait);
        assert_eq!(p.held("b"), Some(ask(1.0, 0.25)));
        assert_eq!(p.used(), ask(3.0, 1.0));
        // Shrinking always fits; more than exists is an error.
        assert_eq!(p.resize("a", &ask(0.5, 0.0)).unwrap(), Acquire::Granted);
        assert_eq!(p.used(), ask(1.5, 0.25));
        assert!(p.resize("a", &ask(5.0, 0.0)).is_err());
        assert_eq!(p.held("a"), Some(ask(0.5, 0.0)));
        // A trial holding nothing is acquired.
        assert_eq!(p.resize("c", &ask(1.0, 0.0)).unwrap(), Acquire::Granted);
        assert_eq!(p.holders(), 3);
    }

    #[test]
    fn invalid_requests_name_the_field() {
        let bad = |r: Resources| r.validate().unwrap_err();
        assert!(bad(ask(-1.0, 0.0)).starts_with("resources_per_trial.cpu must be"));
        assert!(bad(ask(f64::NAN, 0.0)).starts_with("resources_per_trial.cpu must be"));
        assert!(bad(ask(1.0, f64::INFINITY)).starts_with("resources_per_trial.gpu must be"));
        assert!(bad(ask(1.0, 1.5)).contains("at most 1 or a whole number"));
        assert!(bad(ask(0.00001, 0.0)).contains("below 0.0001"));
        assert!(bad(ask(1e13, 0.0)).contains("too large"));
        let reserved = Resources {
            custom: BTreeMap::from([("GPU".to_string(), 1.0)]),
            ..Resources::default()
        };
        assert!(bad(reserved).contains("use resources_per_trial.gpu"));
        for fine in [
            ask(1.0, 0.5),
            ask(0.0, 1.0),
            ask(2.0, 2.0),
            ask(0.0001, 0.0),
        ] {
            fine.validate().unwrap();
        }
        // Fractional GPUs above one are fine in a total.
        ResourcePool::new(&ask(1.0, 1.5)).unwrap();
        assert!(
            ResourcePool::new(&ask(-2.0, 0.0))
                .unwrap_err()
                .starts_with("resources.cpu must be")
        );
        // An invalid request never fits.
        assert!(!pool(4.0, 4.0).fits(&ask(1.0, 1.5)));
    }

    #[test]
    fn toml_tables_parse_with_sizes_and_defaults() {
        let r: Resources =
            toml::from_str("cpu = 0.5\ngpu = 1\nmemory = \"2GiB\"\ncustom = { licence = 1 }")
                .unwrap();
        assert_eq!(r.cpu, 0.5);
        assert_eq!(r.gpu, 1.0);
        assert_eq!(r.memory, 2 << 30);
        assert_eq!(r.custom["licence"], 1.0);
        assert_eq!(r.to_string(), "0.5 CPU, 1 GPU, 2 GiB memory, 1 licence");
        let r: Resources = toml::from_str("memory = 1048576").unwrap();
        assert_eq!((r.cpu, r.gpu, r.memory), (1.0, 0.0, 1 << 20));
        let r: Resources = toml::from_str("memory = 2e9").unwrap();
        assert_eq!(r.memory, 2_000_000_000);
        let r: Resources = serde_json::from_value(json!({"memory": "0"})).unwrap();
        assert_eq!(r.memory, 0);
        // Round trip through JSON (the experiment's saved state).
        let back: Resources = serde_json::from_value(serde_json::to_value(&r).unwrap()).unwrap();
        assert_eq!(back, r);
        let err = toml::from_str::<Resources>("memory = \"lots\"").unwrap_err();
        assert!(err.to_string().contains("memory must be a size"), "{err}");
        assert!(toml::from_str::<Resources>("memory = -1").is_err());
        assert!(toml::from_str::<Resources>("cpus = 2").is_err());

        let spec: PoolSpec = toml::from_str("gpu = 2\nmemory = \"16GiB\"").unwrap();
        let p = spec.build().unwrap();
        let total = p.total();
        assert_eq!(total.gpu, 2.0);
        assert_eq!(total.memory, 16 << 30);
        assert_eq!(total.cpu, ResourcePool::detect().total().cpu);
        assert!(toml::from_str::<PoolSpec>("gpus = 1").is_err());
        let spec: PoolSpec = toml::from_str("cpu = -1").unwrap();
        assert!(spec.build().unwrap_err().starts_with("resources.cpu"));
    }

    #[test]
    fn detection_counts_this_machine() {
        let here = ResourcePool::detect().total();
        assert!(here.cpu >= 1.0 && here.cpu.fract() == 0.0);
        let gpus = machine_gpus();
        assert_eq!(here.gpu, gpus as f64);
        assert!(here.memory > 0);
        assert_eq!(bytes(UNLIMITED_MEMORY), "unlimited");
        assert_eq!(bytes(7 << 29), "3.5 GiB");
        assert_eq!(bytes(512), "512 bytes");
        assert_eq!(amount(12_345), "1.2345");
        assert_eq!(amount(5_000), "0.5");
    }

    /// One step of the random walk the property test takes.
    #[derive(Debug, Clone)]
    enum Op {
        Acquire(usize, Ask),
        Resize(usize, Ask),
        Release(usize),
    }

    /// A request in whole model units: tenths of a CPU, quarters of a GPU,
    /// GiB, licences. The pool sees it as floats (`k * 0.1`, which drift).
    #[derive(Debug, Clone, Copy, PartialEq)]
    struct Ask([u64; 4]);

    impl Ask {
        fn resources(self) -> Resources {
            let [cpu, gpu, mem, licences] = self.0;
            let mut custom = BTreeMap::new();
            // Zero entries sometimes present, sometimes absent: both mean none.
            if licences > 0 || cpu % 2 == 0 {
                custom.insert("licence".to_string(), licences as f64);
            }
            Resources {
                cpu: cpu as f64 * 0.1,
                gpu: gpu as f64 * 0.25,
                memory: mem << 30,
                custom,
            }
        }

        fn units(self) -> Units {
            Units::parse(&self.resources(), "test").unwrap()
        }
    }

    fn ask_strategy() -> impl Strategy<Value = Ask> {
        // GPU quarters: up to one whole GPU, or two whole ones (Ray's rule).
        (
            0u64..=25,
            prop::sample::select(vec![0u64, 1, 2, 3, 4, 8]),
            0u64..=5,
            0u64..=3,
        )
            .prop_map(|(c, g, m, l)| Ask([c, g, m, l]))
    }

    fn op_strategy() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0usize..8, ask_strategy()).prop_map(|(t, a)| Op::Acquire(t, a)),
            1 => (0usize..8, ask_strategy()).prop_map(|(t, a)| Op::Resize(t, a)),
            2 => (0usize..8).prop_map(Op::Release),
        ]
    }

    /// The property test's GPUs, in quarters, and where each trial is.
    #[derive(Debug, Clone)]
    struct ModelGpus {
        capacity: Vec<u64>,
        used: Vec<u64>,
        placed: BTreeMap<usize, (u64, Vec<usize>)>,
    }

    impl ModelGpus {
        fn new(quarters: u64) -> Self {
            let mut capacity = vec![4; (quarters / 4) as usize];
            if !quarters.is_multiple_of(4) {
                capacity.push(quarters % 4);
            }
            let used = vec![0; capacity.len()];
            Self {
                capacity,
                used,
                placed: BTreeMap::new(),
            }
        }

        fn free(&self, i: usize) -> u64 {
            self.capacity[i] - self.used[i]
        }

        fn unused(&self, i: usize) -> bool {
            self.capacity[i] == 4 && self.used[i] == 0
        }

        /// Whether `q` quarters fit now: a part of one GPU on one GPU, whole
        /// GPUs on unused ones, with `keep` first.
        fn placeable(&self, q: u64, keep: Option<usize>) -> bool {
            let all = 0..self.capacity.len();
            match (q, keep) {
                (0, _) if self.capacity.is_empty() => true,
                (q, Some(d)) if q <= 4 => self.free(d) >= q,
                (q, None) if q <= 4 => all.into_iter().any(|i| self.free(i) >= q),
                (q, keep) => {
                    keep.is_none_or(|d| self.unused(d))
                        && all.filter(|&i| self.unused(i)).count() as u64 >= q / 4
                }
            }
        }

        /// That `placed` is a placement of `q` quarters the rules allow,
        /// for a trial that was on `keep`.
        fn check(&self, q: u64, keep: &[usize], placed: &[usize]) -> Result<(), TestCaseError> {
            if self.capacity.is_empty() {
                prop_assert!(placed.is_empty());
                return Ok(());
            }
            if let Some(d) = keep.first() {
                prop_assert_eq!(placed.first(), Some(d));
            }
            if q > 4 {
                let wanted = (q / 4) as usize;
                prop_assert_eq!(placed.len(), wanted);
                let mut distinct = placed.to_vec();
                distinct.sort();
                distinct.dedup();
                prop_assert_eq!(distinct.len(), placed.len());
                prop_assert!(placed.iter().all(|&i| self.unused(i)));
                // Its other GPUs are kept while the new amount allows.
                let keepable = keep.iter().filter(|&&i| self.unused(i)).count();
                let kept = placed.iter().filter(|i| keep.contains(i)).count();
                prop_assert_eq!(kept, keepable.min(wanted));
            } else {
                prop_assert_eq!(placed.len(), 1);
                prop_assert!(self.free(placed[0]) >= q);
                if q > 0 && keep.is_empty() {
                    let most = (0..self.capacity.len()).map(|i| self.free(i)).max();
                    prop_assert_eq!(Some(self.free(placed[0])), most, "spread out");
                }
            }
            Ok(())
        }

        fn add(&mut self, t: usize, q: u64, placed: Vec<usize>) {
            let share = if placed.len() > 1 { 4 } else { q };
            for &i in &placed {
                self.used[i] += share;
            }
            self.placed.insert(t, (q, placed));
        }

        /// Takes `t` off its GPUs; where it was.
        fn remove(&mut self, t: usize) -> Option<Vec<usize>> {
            let (q, placed) = self.placed.remove(&t)?;
            let share = if placed.len() > 1 { 4 } else { q };
            for &i in &placed {
                self.used[i] -= share;
            }
            Some(placed)
        }
    }

    fn fits(total: [u64; 4], used: [u64; 4]) -> bool {
        (0..4).all(|i| used[i] <= total[i])
    }

    fn add(a: [u64; 4], b: [u64; 4]) -> [u64; 4] {
        [a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3]]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Against a model counting in whole tenths and quarters, with
        /// GPUs one by one: every decision matches, every placement is one
        /// the rules allow, `used` equals the sum of the leases and never
        /// exceeds the total, on any GPU either.
        #[test]
        fn used_never_exceeds_total_and_equals_the_leases(
            total in (1u64..=40, 0u64..=8, 0u64..=12, 0u64..=4),
            ops in prop::collection::vec(op_strategy(), 1..80),
        ) {
            let total = [total.0, total.1, total.2, total.3];
            let mut p = ResourcePool::new(&Ask(total).resources()).unwrap();
            let mut model: BTreeMap<usize, [u64; 4]> = BTreeMap::new();
            let mut gpus = ModelGpus::new(total[1]);
            for op in ops {
                let used: [u64; 4] = model.values().fold([0; 4], |s, l| add(s, *l));
                match op {
                    Op::Acquire(t, ask) => {
                        let got = p.acquire(&format!("t{t}"), &ask.resources());
                        if model.contains_key(&t) || !fits(total, ask.0) {
                            prop_assert!(got.is_err());
                        } else if fits(total, add(used, ask.0)) && gpus.placeable(ask.0[1], None) {
                            prop_assert_eq!(got, Ok(Acquire::Granted));
                            let placed = p.gpus_of(&format!("t{t}")).to_vec();
                            gpus.check(ask.0[1], &[], &placed)?;
                            gpus.add(t, ask.0[1], placed);
                            model.insert(t, ask.0);
                        } else {
                            prop_assert_eq!(got, Ok(Acquire::Wait));
                        }
                    }
                    Op::Resize(t, ask) => {
                        let got = p.resize(&format!("t{t}"), &ask.resources());
                        let old = model.get(&t).copied().unwrap_or([0; 4]);
                        let others = [used[0] - old[0], used[1] - old[1], used[2] - old[2], used[3] - old[3]];
                        let mut without = gpus.clone();
                        let was = without.remove(t).unwrap_or_default();
                        if !fits(total, ask.0) {
                            prop_assert!(got.is_err());
                        } else if fits(total, add(others, ask.0)) && without.placeable(ask.0[1], was.first().copied()) {
                            prop_assert_eq!(got, Ok(Acquire::Granted));
                            let placed = p.gpus_of(&format!("t{t}")).to_vec();
                            without.check(ask.0[1], &was, &placed)?;
                            without.add(t, ask.0[1], placed);
                            gpus = without;
                            model.insert(t, ask.0);
                        } else {
                            prop_assert_eq!(got, Ok(Acquire::Wait));
                        }
                    }
                    Op::Release(t) => {
                        let got = p.release(&format!("t{t}"));
                        prop_assert_eq!(got.is_some(), model.remove(&t).is_some());
                        gpus.remove(t);
                    }
                }
                let on_each: Vec<u64> = gpus.used.iter().map(|q| q * SCALE / 4).collect();
                prop_assert_eq!(&p.gpus.used, &on_each);
                prop_assert!(gpus.used.iter().zip(&gpus.capacity).all(|(u, c)| u <= c));
                let leases = p.leases.values().fold(Units::default(), |s, l| s.plus(&l.units));
                prop_assert_eq!(&p.used, &leases);
                prop_assert!(p.total.covers(&p.used));
                let expected = model.values().fold(Units::default(), |s, l| s.plus(&Ask(*l).units()));
                prop_assert_eq!(&p.used, &expected);
                prop_assert_eq!(p.holders(), model.len());
            }
        }
    }
}
