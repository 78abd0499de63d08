//! Fuel for host compute, and the gate that stops a call that cannot pay.
//!
//! Guest code pays fuel per wasm instruction; work done by the host on the
//! guest's behalf is invisible to that meter, so it is charged here in
//! proportion to the work:
//!
//! | part of a call                         | fuel                  |
//! |----------------------------------------|-----------------------|
//! | each call that moves data or computes  | [`PER_CALL`]          |
//! | each floating-point operation          | 1 (a multiply-add: 2) |
//! | each byte read, written or copied      | 1 / [`BYTES_PER_FUEL`]|
//! | transcendental functions (exp, tanh)   | 20 per element        |
//!
//! A multiply-add written in wasm costs 5-8 fuel (two loads, the arithmetic,
//! the loop), so host kernels are cheaper in fuel as well as in time, but of
//! the same order: a budget that bounds a pure-wasm model bounds its
//! host-compute twin, and fuel-based schedules stay comparable across trials.
//!
//! The charge is taken before the work starts: a call the trial cannot pay
//! for does nothing and ends the trial as out of fuel, like any instruction
//! the guest cannot pay for.

use std::time::Instant;

/// Fuel every compute call costs, whatever it does.
pub const PER_CALL: u64 = 100;
/// Bytes moved per unit of fuel.
pub const BYTES_PER_FUEL: u64 = 16;

/// Fuel for a call that does `flops` operations and touches `bytes` bytes.
pub fn fuel(flops: u64, bytes: u64) -> u64 {
    PER_CALL
        .saturating_add(flops)
        .saturating_add(bytes / BYTES_PER_FUEL)
}

/// Why a compute call was stopped before it did any work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// The call needed more fuel than the trial had left.
    OutOfFuel,
    /// The guest call's deadline had passed.
    Deadline,
    /// The device lost the trial's state for good (its GPU worker was
    /// killed at a job's deadline, or died): the trial cannot go on.
    DeviceLost,
}

/// Settles host compute against the guest's fuel. The sandbox tells it how
/// much fuel is left when the guest calls into the host
/// ([`Meter::enter`]); kernels [`Meter::charge`] before working; when the
/// host returns to the guest the sandbox takes the debt off the store's fuel
/// ([`Meter::settle`]), or traps when the call was stopped.
///
/// Host calls nest: while the host writes a call's results into guest
/// memory, the guest's allocator may grow its memory, which is a host call
/// of its own. Only the outermost call is settled, so a nested one neither
/// clears the outer call's debt nor settles it early.
#[derive(Debug, Default)]
pub struct Meter {
    depth: u32,
    available: Option<u64>,
    debt: u64,
    deadline: Option<Instant>,
    stop: Option<Stop>,
}

impl Meter {
    /// The guest is calling into the host with `fuel` left (`None` when
    /// fuel is not metered).
    pub fn enter(&mut self, fuel: Option<u64>) {
        self.depth += 1;
        if self.depth == 1 {
            self.available = fuel;
            self.debt = 0;
            self.stop = None;
        }
    }

    /// A new call into the guest begins, with this wall-clock deadline.
    /// Also forgets any state a host call that never returned (a panic)
    /// left behind.
    pub fn begin_call(&mut self, deadline: Option<Instant>) {
        *self = Self {
            deadline,
            ..Self::default()
        };
    }

    /// Charges `fuel` for work about to start, or refuses it, in which case
    /// the call must do nothing: the sandbox ends the trial when the host
    /// returns.
    pub fn charge(&mut self, fuel: u64) -> Result<(), Stop> {
        if let Some(stop) = self.stop {
            return Err(stop);
        }
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            self.stop = Some(Stop::Deadline);
            return Err(Stop::Deadline);
        }
        let debt = self.debt.saturating_add(fuel);
        if self.available.is_some_and(|left| debt > left) {
            self.stop = Some(Stop::OutOfFuel);
            return Err(Stop::OutOfFuel);
        }
        self.debt = debt;
        Ok(())
    }

    /// Fuel the current host call may still spend (`None` when fuel is
    /// not metered).
    pub fn left(&self) -> Option<u64> {
        self.available.map(|left| left.saturating_sub(self.debt))
    }

    /// When the current guest call must end.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Stops the current host call (unless it was stopped already): it
    /// settles with `stop`, and nothing more runs in it.
    pub fn stop(&mut self, stop: Stop) {
        self.stop.get_or_insert(stop);
    }

    /// The fuel owed by the call that is returning, or why it was stopped.
    pub fn settle(&mut self) -> Result<u64, Stop> {
        self.depth = self.depth.saturating_sub(1);
        if self.depth > 0 {
            return Ok(0);
        }
        self.available = None;
        match self.stop.take() {
            Some(stop) => {
                self.debt = 0;
                Err(stop)
            }
            None => Ok(std::mem::take(&mut self.debt)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn charges_add_up_and_are_settled_once() {
        let mut meter = Meter::default();
        meter.enter(Some(1000));
        assert_eq!(meter.charge(300), Ok(()));
        assert_eq!(meter.charge(700), Ok(()));
        assert_eq!(meter.settle(), Ok(1000));
        assert_eq!(meter.settle(), Ok(0));
    }

    #[test]
    fn a_charge_beyond_the_fuel_left_stops_the_call() {
        let mut meter = Meter::default();
        meter.enter(Some(1000));
        assert_eq!(meter.charge(600), Ok(()));
        assert_eq!(meter.charge(600), Err(Stop::OutOfFuel));
        // Once stopped, nothing more runs in this call.
        assert_eq!(meter.charge(1), Err(Stop::OutOfFuel));
        assert_eq!(meter.settle(), Err(Stop::OutOfFuel));
        // The next call starts clean.
        meter.enter(None);
        assert_eq!(meter.charge(u64::MAX), Ok(()));
        assert_eq!(meter.settle(), Ok(u64::MAX));
    }

    #[test]
    fn nested_host_calls_settle_with_the_outermost() {
        let mut meter = Meter::default();
        meter.enter(Some(1000));
        assert_eq!(meter.charge(600), Ok(()));
        // The result's lowering grows guest memory: a nested host call.
        meter.enter(Some(1000));
        assert_eq!(meter.settle(), Ok(0));
        assert_eq!(meter.settle(), Ok(600));

        meter.enter(Some(10));
        assert_eq!(meter.charge(20), Err(Stop::OutOfFuel));
        meter.enter(Some(10));
        assert_eq!(meter.settle(), Ok(0));
        assert_eq!(meter.settle(), Err(Stop::OutOfFuel));
    }

    #[test]
    fn a_stop_outlasts_nested_calls_and_keeps_the_first_reason() {
        let mut meter = Meter::default();
        meter.enter(Some(1000));
        meter.enter(Some(1000));
        meter.stop(Stop::DeviceLost);
        meter.stop(Stop::OutOfFuel);
        assert_eq!(meter.charge(1), Err(Stop::DeviceLost));
        assert_eq!(meter.settle(), Ok(0));
        assert_eq!(meter.settle(), Err(Stop::DeviceLost));
    }

    #[test]
    fn a_passed_deadline_stops_the_call() {
        let mut meter = Meter::default();
        meter.begin_call(Some(Instant::now() - Duration::from_millis(1)));
        meter.enter(Some(10));
        assert_eq!(meter.charge(1), Err(Stop::Deadline));
        assert_eq!(meter.settle(), Err(Stop::Deadline));
    }

    #[test]
    fn fuel_grows_with_work_and_saturates() {
        assert_eq!(fuel(0, 0), PER_CALL);
        assert_eq!(fuel(1000, 1600), PER_CALL + 1000 + 100);
        assert_eq!(fuel(u64::MAX, u64::MAX), u64::MAX);
    }
}
