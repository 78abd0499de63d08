//! One trial's live instance and the metered, classified calls into it.

use std::time::{Duration, Instant};

use std::sync::Arc;

use wasmtime::component::{Instance, ResourceTableError};
use wasmtime::{Store, Trap};

use super::accessor::{Access, AccessIndex, SnapshotError};
use super::bindings::{Trainable, TrainablePre};
use super::engine::EPOCH_TICK;
use super::fault::{At, Call, TrialFault};
use super::limits::{LimitHit, Limits};
use super::store_data::TrialHost;
use super::waits::WaitedPastDeadline;
use crate::snapshot::{GuestImage, SnapshotRefusal, SnapshotSource, Spool};

/// Most metrics one report may carry, and most distinct metric names an
/// instance's reports may use in all: every name is a column, a series on
/// the dashboard and a key on the tracking server, which a guest must not
/// multiply by reporting new names at every step.
pub const MAX_METRICS: usize = 1024;
/// Longest metric name accepted.
pub const MAX_METRIC_NAME: usize = 256;
/// Most bytes of metric names in one report: what one result may add to
/// the result files is bounded, whatever the count and lengths.
pub const MAX_REPORT_NAMES: usize = 64 << 10;
/// Longest guest error message kept; the rest is cut.
const MAX_GUEST_MESSAGE: usize = 4096;

/// What `train()` reported, after the host's size checks.
#[derive(Debug, Clone, PartialEq)]
pub struct GuestReport {
    /// `(name, value)` pairs, in the guest's order, names unique.
    pub metrics: Vec<(String, f64)>,
    /// The guest's `done` flag.
    pub done: bool,
}

/// What one call cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CallStats {
    /// Fuel burned by the call.
    pub fuel: u64,
    /// Wall-clock time of the call.
    pub elapsed: Duration,
}

/// A trial's instance: its store and the guest's exports. Calls are metered
/// with fuel and bounded by the deadline; after a trap the instance refuses
/// further calls.
pub struct TrialInstance {
    store: Store<TrialHost>,
    instance: Instance,
    guest: Trainable,
    access: Result<Arc<AccessIndex>, SnapshotRefusal>,
    limits: Limits,
    fuel_total: u64,
    iterations: u64,
    /// What this instance's reports have added to the result files (see
    /// [`Limits::result_bytes`]).
    result_bytes: u64,
    /// Every metric name its reports used, at most [`MAX_METRICS`].
    metric_names: std::collections::HashSet<String>,
    poisoned: bool,
}

impl TrialInstance {
    pub(crate) fn start(
        mut store: Store<TrialHost>,
        pre: &TrainablePre<TrialHost>,
        access: Result<Arc<AccessIndex>, SnapshotRefusal>,
        limits: Limits,
    ) -> Result<Self, TrialFault> {
        let at = At {
            call: Call::Instantiate,
            iteration: None,
        };
        let allotted = fuel_allotment(&limits, 0, at)?;
        arm(&mut store, &limits, allotted, at)?;
        let result = pre
            .instance_pre()
            .instantiate(&mut store)
            .and_then(|instance| Ok((instance, Trainable::new(&mut store, &instance)?)));
        let fuel_total = allotted - store.get_fuel().unwrap_or(0);
        match result {
            Ok((instance, guest)) => Ok(Self {
                store,
                instance,
                guest,
                access,
                limits,
                fuel_total,
                iterations: 0,
                result_bytes: 0,
                metric_names: std::collections::HashSet::new(),
                poisoned: false,
            }),
            Err(err) => Err(classify(&store, &limits, at, allotted, fuel_total, err)),
        }
    }

    /// Fuel burned so far by every call, instantiation included.
    pub fn fuel_total(&self) -> u64 {
        self.fuel_total
    }

    /// Completed `train()` calls.
    pub fn iterations(&self) -> u64 {
        self.iterations
    }

    /// Takes over a checkpoint's counts after the guest restored its own
    /// state: `iterations` completed, and `fuel_before` burned before this
    /// instance existed (added to what this instance burned so far).
    pub fn continue_counts(&mut self, iterations: u64, fuel_before: u64) {
        self.iterations = iterations;
        self.fuel_total = self.fuel_total.saturating_add(fuel_before);
    }

    /// `setup(config)`, with the config as JSON text.
    pub fn setup(&mut self, config_json: &str) -> Result<CallStats, TrialFault> {
        let at = At {
            call: Call::Setup,
            iteration: None,
        };
        self.call(at, |guest, store| guest.call_setup(store, config_json))
            .map(|((), stats)| stats)
    }

    /// One `train()` call, with the report checked against the host's limits.
    pub fn train(&mut self) -> Result<(GuestReport, CallStats), TrialFault> {
        let at = At {
            call: Call::Train,
            iteration: Some(self.iterations + 1),
        };
        let (report, stats) = self.call(at, |guest, store| guest.call_train(store))?;
        self.iterations += 1;
        let report = check_report(report)
            .and_then(|report| self.count_names(&report).map(|()| report))
            .map_err(|reason| {
                self.poisoned = true;
                TrialFault::BadOutput { at, reason }
            })?;
        self.result_bytes = self.result_bytes.saturating_add(result_bytes(&report));
        if self.result_bytes > self.limits.result_bytes {
            self.poisoned = true;
            let limit = self.limits.result_bytes;
            return Err(TrialFault::limit(at, LimitHit::Results { limit }));
        }
        Ok((report, stats))
    }

    /// Adds `report`'s new metric names to those the instance has used,
    /// refusing the report that would take them past [`MAX_METRICS`].
    fn count_names(&mut self, report: &GuestReport) -> Result<(), String> {
        let new = report
            .metrics
            .iter()
            .filter(|(name, _)| !self.metric_names.contains(name))
            .count();
        if self.metric_names.len() + new > MAX_METRICS {
            return Err(format!(
                "the trial's reports use more than {MAX_METRICS} metric names in all ({} so far, \
                 {new} new in this one); report the same names at every step",
                self.metric_names.len()
            ));
        }
        for (name, _) in &report.metrics {
            if !self.metric_names.contains(name) {
                self.metric_names.insert(name.clone());
            }
        }
        Ok(())
    }

    /// `save()`: the guest's own checkpoint bytes, refused when larger than
    /// [`Limits::checkpoint_bytes`]. The bytes have been copied out of the
    /// guest by then (bounded by its memory cap); they are dropped at once
    /// and never reach the disk.
    pub fn save(&mut self) -> Result<(Vec<u8>, CallStats), TrialFault> {
        let at = At {
            call: Call::Save,
            iteration: None,
        };
        let (state, stats) = self.call(at, |guest, store| guest.call_save(store))?;
        let cap = self.limits.checkpoint_bytes;
        if state.len() as u64 > cap {
            return Err(TrialFault::BadOutput {
                at,
                reason: format!(
                    "{} bytes of state; guest checkpoints may hold at most {} \
                     (limits.checkpoint_size)",
                    state.len(),
                    crate::units::human_bytes(cap)
                ),
            });
        }
        Ok((state, stats))
    }

    /// `restore(state)` with bytes from an earlier `save()`.
    pub fn restore(&mut self, state: &[u8]) -> Result<CallStats, TrialFault> {
        let at = At {
            call: Call::Restore,
            iteration: None,
        };
        self.call(at, |guest, store| guest.call_restore(store, state))
            .map(|((), stats)| stats)
    }

    /// `reset(config)`: `true` when the guest switched to the new
    /// configuration. The counts go on: the guest keeps what it learned, so
    /// its next `train()` continues the same trajectory (population based
    /// training's explore step).
    pub fn reset(&mut self, config_json: &str) -> Result<(bool, CallStats), TrialFault> {
        let at = At {
            call: Call::Reset,
            iteration: None,
        };
        self.call(at, |guest, store| guest.call_reset(store, config_json))
    }

    /// `cleanup()`, then flushes the trial's log files.
    pub fn cleanup(&mut self) -> Result<CallStats, TrialFault> {
        let at = At {
            call: Call::Cleanup,
            iteration: None,
        };
        let result = self
            .call(at, |guest, store| {
                guest.call_cleanup(store).map(Ok::<(), String>)
            })
            .map(|((), stats)| stats);
        self.flush_logs();
        result
    }

    /// Takes a host snapshot of the guest's state (memories, globals and the
    /// handles it holds). Only valid between calls, which `&mut self`
    /// guarantees; fails on a poisoned instance, on components that cannot
    /// be snapshotted and on states that could not be restored exactly.
    pub fn snapshot(&mut self) -> Result<GuestImage, SnapshotError> {
        if self.poisoned {
            return Err(SnapshotError::Poisoned);
        }
        self.with_access(|access| access.take())
    }

    /// Takes a host snapshot as [`TrialInstance::snapshot`] does, but
    /// compresses the memories' bytes straight into `spool` (one frame per
    /// memory) instead of copying them: the returned image lists each
    /// memory's runs and holds no data. For [`crate::snapshot::write_spooled`],
    /// which keeps the host's memory near the guest's own.
    pub fn snapshot_into(&mut self, spool: Spool) -> Result<(GuestImage, Spool), SnapshotError> {
        if self.poisoned {
            return Err(SnapshotError::Poisoned);
        }
        self.with_access(|access| access.take_into(spool))
    }

    /// Writes a snapshot into this instance, which must be fresh (no call
    /// made yet), and takes over the snapshot's iteration and fuel counts.
    /// On failure the instance is poisoned.
    pub(crate) fn restore_image(
        &mut self,
        source: &mut dyn SnapshotSource,
        iterations: u64,
        fuel_total: u64,
    ) -> Result<(), SnapshotError> {
        match self.with_access(|access| access.restore(source)) {
            Ok(()) => {
                self.iterations = iterations;
                self.fuel_total = fuel_total;
                Ok(())
            }
            Err(err) => {
                self.poisoned = true;
                Err(err)
            }
        }
    }

    /// Runs `f` against the accessor. Accessor calls run guest code only
    /// where a restore re-acquires directories (the guest's allocator); they
    /// get a per-call allotment and deadline that do not count against the
    /// trial.
    fn with_access<R>(
        &mut self,
        f: impl FnOnce(&mut Access<'_>) -> Result<R, SnapshotError>,
    ) -> Result<R, SnapshotError> {
        let index = self.access.clone().map_err(SnapshotError::Unsupported)?;
        let at = At {
            call: Call::Snapshot,
            iteration: None,
        };
        let fuel = self.limits.fuel_per_call.unwrap_or(u64::MAX / 2);
        arm(&mut self.store, &self.limits, fuel, at)
            .map_err(|fault| SnapshotError::Failed(fault.to_string()))?;
        f(&mut Access {
            store: &mut self.store,
            instance: self.instance,
            index: &index,
        })
    }

    /// Flushes the captured streams to disk.
    pub fn flush_logs(&self) {
        let host = self.store.data();
        for sink in [&host.stdout, &host.stderr, &host.guest_log] {
            if let Err(err) = sink.flush() {
                tracing::debug!("flushing a trial log: {err}");
            }
        }
    }

    fn call<R>(
        &mut self,
        at: At,
        f: impl FnOnce(&Trainable, &mut Store<TrialHost>) -> wasmtime::Result<Result<R, String>>,
    ) -> Result<(R, CallStats), TrialFault> {
        if self.poisoned {
            return Err(TrialFault::Poisoned);
        }
        let allotted = fuel_allotment(&self.limits, self.fuel_total, at)?;
        arm(&mut self.store, &self.limits, allotted, at)?;
        let started = Instant::now();
        let outcome = f(&self.guest, &mut self.store);
        let finished = super::compute::finish_call(&mut self.store);
        // Resource drops may end without a host-call return to sweep at.
        self.store.data().disk.sweep();
        let fuel = allotted - self.store.get_fuel().unwrap_or(0);
        self.fuel_total += fuel;
        let stats = CallStats {
            fuel,
            elapsed: started.elapsed(),
        };
        // What the host finished for the call (its queued work, and what
        // that cost) counts as the call's, after any trap of its own: a
        // guest that returned an error but could not pay for its queued
        // work, or lost its device, ends for that reason.
        let outcome = match (outcome, finished) {
            (Err(err), _) | (Ok(_), Err(err)) => Err(err),
            (Ok(returned), Ok(())) => Ok(returned),
        };
        match outcome {
            Ok(Ok(value)) => Ok((value, stats)),
            Ok(Err(message)) => Err(guest_error(at, message)),
            Err(err) => {
                self.poisoned = true;
                Err(classify(
                    &self.store,
                    &self.limits,
                    at,
                    allotted,
                    self.fuel_total,
                    err,
                ))
            }
        }
    }
}

/// Fuel for the next call: the per-call limit, or what is left of the
/// trial's budget when that is smaller.
fn fuel_allotment(limits: &Limits, used: u64, at: At) -> Result<u64, TrialFault> {
    let per_call = limits.fuel_per_call.unwrap_or(u64::MAX);
    match limits.fuel_per_trial {
        Some(budget) if used >= budget => Err(TrialFault::FuelBudget { at, budget }),
        Some(budget) => Ok(per_call.min(budget - used)),
        None => Ok(per_call),
    }
}

fn arm(store: &mut Store<TrialHost>, limits: &Limits, fuel: u64, at: At) -> Result<(), TrialFault> {
    store.set_fuel(fuel).map_err(|e| TrialFault::Host {
        at,
        message: format!("setting fuel: {e}"),
    })?;
    let ticks = match limits.call_timeout {
        Some(limit) => (limit.as_nanos() / EPOCH_TICK.as_nanos()).max(1) as u64 + 1,
        // Effectively never; kept far from u64::MAX so adding the current
        // epoch cannot overflow.
        None => 1 << 62,
    };
    store.set_epoch_deadline(ticks);
    let deadline = limits.call_timeout.map(|limit| Instant::now() + limit);
    store.data_mut().call_deadline = deadline;
    store.data_mut().compute.begin_call(deadline);
    Ok(())
}

/// Names the cause of a failed call: a limit, a deadline, a panic, a trap.
fn classify(
    store: &Store<TrialHost>,
    limits: &Limits,
    at: At,
    allotted: u64,
    fuel_total: u64,
    err: wasmtime::Error,
) -> TrialFault {
    let host = store.data();
    // A lost device is named whatever else the call met: a memory limit
    // the guest survived earlier in it is not why the trial ended.
    if let Some(lost) = err.downcast_ref::<super::compute::DeviceLost>() {
        return TrialFault::DeviceLost {
            at,
            reason: lost.0.clone(),
        };
    }
    if let Some(hit) = host.limiter.hit {
        return TrialFault::limit(at, hit);
    }
    if let Some(hit) = err
        .chain()
        .find_map(|cause| cause.downcast_ref::<LimitHit>())
    {
        return TrialFault::limit(at, *hit);
    }
    if err
        .chain()
        .any(|cause| matches!(cause.downcast_ref(), Some(ResourceTableError::Full)))
    {
        let limit = limits.open_files;
        return TrialFault::limit(at, LimitHit::OpenFiles { limit });
    }
    match err.downcast_ref::<Trap>() {
        Some(Trap::OutOfFuel) => match limits.fuel_per_trial {
            Some(budget) if fuel_total >= budget => TrialFault::FuelBudget { at, budget },
            _ => TrialFault::FuelPerCall {
                at,
                limit: allotted,
            },
        },
        Some(Trap::Interrupt) => TrialFault::Timeout {
            at,
            limit: limits.call_timeout.unwrap_or_default(),
        },
        Some(Trap::StackOverflow) => TrialFault::Trap {
            at,
            trap: "stack overflow (raise the stack limit if the model needs deep recursion)".into(),
        },
        Some(trap) => match panic_message(&host.stderr.tail()) {
            Some(message) => TrialFault::Panic { at, message },
            None => TrialFault::Trap {
                at,
                trap: trap.to_string(),
            },
        },
        None if err.downcast_ref::<WaitedPastDeadline>().is_some() => TrialFault::Timeout {
            at,
            limit: limits.call_timeout.unwrap_or_default(),
        },
        None => not_a_trap(at, limits, err),
    }
}

/// The end of wasmtime's message when a value exceeds the store's hostcall
/// fuel ([`Limits::transfer_bytes`]). Its error type is private, so the
/// message is matched; `tests/hostile.rs` pins it.
const TRANSFER_CAP_HIT: &str = "fuel allocated for hostcalls has been exhausted";

/// Names a failure that is not a trap. Instantiating, or a host snapshot,
/// can fail on the host's side (memory it could not map). Within a call the
/// host's own imports only ever trap or report a lost compute device, so
/// what is left is the guest's doing: an `exit`, or a value wasmtime could
/// not lift out of it.
fn not_a_trap(at: At, limits: &Limits, err: wasmtime::Error) -> TrialFault {
    if let Some(exit) = err.downcast_ref::<wasmtime_wasi::I32Exit>() {
        return TrialFault::Exit { at, code: exit.0 };
    }
    // The reason, without the wasm backtrace wasmtime adds as a context:
    // it names the guest's own functions, and the trap path leaves it out.
    let backtrace = err
        .downcast_ref::<wasmtime::WasmBacktrace>()
        .map(ToString::to_string);
    let text = err
        .chain()
        .map(|cause| cause.to_string())
        .filter(|cause| Some(cause) != backtrace.as_ref())
        .collect::<Vec<_>>()
        .join(": ");
    if matches!(at.call, Call::Instantiate | Call::Snapshot) {
        return TrialFault::Host {
            at,
            message: cut(text),
        };
    }
    let reason = if text.contains(TRANSFER_CAP_HIT) {
        format!(
            "more than {} in one value, the guest's memory limit (limits.memory); \
             strings and lists count once for every reference to them",
            crate::units::human_bytes(limits.transfer_bytes())
        )
    } else {
        cut(text)
    };
    TrialFault::BadValue { at, reason }
}

/// Extracts Rust's panic message from the end of the guest's stderr:
/// `thread '<unnamed>' panicked at src/lib.rs:9:5:\nboom` -> `boom (at src/lib.rs:9:5)`.
fn panic_message(stderr_tail: &str) -> Option<String> {
    let start = stderr_tail.rfind("panicked at ")?;
    let rest = &stderr_tail[start + "panicked at ".len()..];
    let mut lines = rest.lines();
    let location = lines.next()?.trim_end_matches(':').trim();
    let message: Vec<&str> = lines.take_while(|l| !l.starts_with("note: ")).collect();
    let message = message.join("\n");
    let message = message.trim();
    Some(if message.is_empty() {
        format!("(no message) at {location}")
    } else {
        format!("{message} (at {location})")
    })
}

/// What [`TrialInstance::train`] makes of the value a guest's `train()`
/// returned: `Ok((metrics, done))` is checked like a report, `Err(message)`
/// becomes the trial's error with the message cut to size. Public only for
/// the cargo-fuzz target `guest_values` (`fuzz/`), which feeds it arbitrary
/// values; it runs the same checks as the sandbox.
#[doc(hidden)]
pub fn check_train_return(
    returned: Result<(Vec<(String, f64)>, bool), String>,
    iteration: u64,
) -> Result<GuestReport, TrialFault> {
    use super::bindings::wtune::trainable::types::{Metric, Report};
    let at = At {
        call: Call::Train,
        iteration: Some(iteration),
    };
    match returned {
        Ok((metrics, done)) => {
            let metrics = metrics
                .into_iter()
                .map(|(name, value)| Metric { name, value })
                .collect();
            check_report(Report { metrics, done })
                .map_err(|reason| TrialFault::BadOutput { at, reason })
        }
        Err(message) => Err(guest_error(at, message)),
    }
}

/// What `report` adds to the trial's result files, as
/// [`Limits::result_bytes`] counts it.
fn result_bytes(report: &GuestReport) -> u64 {
    use super::limits::{RESULT_BYTES_PER_METRIC, RESULT_BYTES_PER_REPORT};
    report
        .metrics
        .iter()
        .map(|(name, _)| name.len() as u64 + RESULT_BYTES_PER_METRIC)
        .sum::<u64>()
        + RESULT_BYTES_PER_REPORT
}

fn check_report(
    report: super::bindings::wtune::trainable::types::Report,
) -> Result<GuestReport, String> {
    if report.metrics.len() > MAX_METRICS {
        return Err(format!(
            "{} metrics in one report; at most {MAX_METRICS} are accepted",
            report.metrics.len()
        ));
    }
    let mut seen = std::collections::HashSet::with_capacity(report.metrics.len());
    let mut metrics = Vec::with_capacity(report.metrics.len());
    for metric in report.metrics {
        if metric.name.is_empty() || metric.name.len() > MAX_METRIC_NAME {
            return Err(format!(
                "metric names must be 1 to {MAX_METRIC_NAME} bytes long (got one of {} bytes)",
                metric.name.len()
            ));
        }
        if metric.name.chars().any(crate::text::hides_text) {
            return Err(format!(
                "metric name {:?} contains control characters or characters that hide or \
                 reorder text",
                metric.name
            ));
        }
        if !seen.insert(metric.name.clone()) {
            return Err(format!(
                "metric `{}` appears twice in one report",
                metric.name
            ));
        }
        metrics.push((metric.name, metric.value));
    }
    let names: usize = metrics.iter().map(|(name, _)| name.len()).sum();
    if names > MAX_REPORT_NAMES {
        return Err(format!(
            "the metric names of one report add up to {names} bytes; at most \
             {MAX_REPORT_NAMES} are accepted"
        ));
    }
    Ok(GuestReport {
        metrics,
        done: report.done,
    })
}

/// The fault for a guest's `err(message)`: the message is kept whole up to
/// 4 KiB; a longer one is cut (see [`cut`]) and its full length is kept so
/// the reason can say how much the guest sent.
fn guest_error(at: At, message: String) -> TrialFault {
    let length = message.len();
    TrialFault::GuestError {
        at,
        full_length: (length > MAX_GUEST_MESSAGE).then_some(length),
        message: cut(message),
    }
}

fn cut(mut message: String) -> String {
    if message.len() > MAX_GUEST_MESSAGE {
        let end = message.floor_char_boundary(MAX_GUEST_MESSAGE);
        message.truncate(end);
        message.push_str(" [...]");
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panic_messages_are_extracted_from_stderr() {
        let tail = "some output\nthread '<unnamed>' panicked at src/lib.rs:9:5:\nboom\nnote: run with `RUST_BACKTRACE=1`\n";
        assert_eq!(
            panic_message(tail).as_deref(),
            Some("boom (at src/lib.rs:9:5)")
        );
        assert_eq!(panic_message("no panic here"), None);
    }

    #[test]
    fn names_that_hide_or_reorder_text_are_refused() {
        let report = |name: &str| check_train_return(Ok((vec![(name.into(), 1.0)], false)), 1);
        for name in ["loss\u{200B}", "\u{202E}ssol", "lo\u{2066}ss", "loss\n"] {
            let Err(TrialFault::BadOutput { reason, .. }) = report(name) else {
                panic!("{name:?} was accepted")
            };
            assert!(reason.contains("hide or reorder text"), "{reason}");
        }
        for name in ["loss", "val/accuracy", "λ", "損失", "😀 score"] {
            assert!(report(name).is_ok(), "{name:?}");
        }
    }

    #[test]
    fn budget_caps_the_allotment_and_is_reported_when_spent() {
        let at = At {
            call: Call::Train,
            iteration: Some(3),
        };
        let limits = Limits {
            fuel_per_call: Some(100),
            fuel_per_trial: Some(250),
            ..Limits::default()
        };
        assert_eq!(fuel_allotment(&limits, 0, at), Ok(100));
        assert_eq!(fuel_allotment(&limits, 200, at), Ok(50));
        assert_eq!(
            fuel_allotment(&limits, 250, at),
            Err(TrialFault::FuelBudget { at, budget: 250 })
        );
    }
}
