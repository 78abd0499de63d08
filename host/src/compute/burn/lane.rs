//! [`BurnLane`]: a trial's burn operations as its compute session sees
//! them: a worker started at the first call, fuel settled through the
//! session's [`Meter`], waits bounded by the guest call's deadline.

use super::protocol::Reply;
use super::{BurnDevice, BurnWorker};
use crate::compute::ComputeError;
use crate::compute::cost::{self, Meter, Stop};

/// Frames a trial may stream before it waits for the worker to catch up.
const MAX_QUEUED: usize = 4096;

/// Frame bytes a trial may stream before it waits (one larger frame goes
/// alone): what waits in the pipe and the writer's queue is host memory
/// the trial's quota does not count.
const MAX_QUEUED_BYTES: usize = 64 << 20;

/// One trial's burn operations. Three ways a call can fail:
/// - the worker's session refused a command (or the host refused to start
///   one): the guest gets the reason at its next read or sync, and every
///   one after;
/// - the trial could not pay: the meter stops the host call, and the
///   sandbox ends the trial as out of fuel;
/// - the worker is lost (it could not start, died, or a wait ran past the
///   call's deadline): [`BurnLane::lost`] says why, and the sandbox ends the
///   trial with that reason.
#[derive(Default)]
pub struct BurnLane {
    worker: Option<BurnWorker>,
    /// Why the host refused the trial's burn operations before the worker
    /// saw them.
    refused: Option<String>,
    /// Why the worker could not be started.
    failed: Option<String>,
    /// Frames, and their bytes, streamed since the worker last replied.
    queued: usize,
    queued_bytes: usize,
}

impl BurnLane {
    /// Whether [`BurnLane::start`] ran.
    pub fn started(&self) -> bool {
        self.worker.is_some() || self.refused.is_some() || self.failed.is_some()
    }

    /// Starts the worker on `device`, with `memory` the bytes its tensors
    /// may take, or why the trial may have none.
    pub fn start(&mut self, memory: Result<u64, String>, device: &BurnDevice) {
        let memory = match memory {
            Ok(memory) => memory,
            Err(why) => {
                self.refused = Some(why);
                return;
            }
        };
        let started = crate::process::burn_worker_program()
            .and_then(|program| BurnWorker::start(&program, memory, device));
        match started {
            Ok(worker) => self.worker = Some(worker),
            Err(why) => self.failed = Some(why),
        }
    }

    /// Why the trial's burn worker is gone, if it is.
    pub fn lost(&self) -> Option<&str> {
        self.failed
            .as_deref()
            .or_else(|| self.worker.as_ref().and_then(BurnWorker::lost))
    }

    /// Streams `frame` to the worker. What goes wrong surfaces at the next
    /// read or sync, or (a lost worker) when the host call returns. Past
    /// [`MAX_QUEUED`] frames or [`MAX_QUEUED_BYTES`] since the worker's
    /// last reply, the frame goes as a sync: the trial waits for the
    /// worker, and pays what it spent, before streaming more.
    pub fn submit(&mut self, meter: &mut Meter, frame: &[u8]) {
        if self.queued >= MAX_QUEUED || self.queued_bytes + frame.len() > MAX_QUEUED_BYTES {
            // A refusal stays the session's, for the guest's next read or
            // sync to return.
            let _ = self.sync(meter, frame);
            return;
        }
        if let Ok(worker) = self.usable(meter, frame.len()) {
            let fuel = grant(meter);
            // A failure is kept as the worker's `lost`, which ends the
            // trial when the host call returns.
            let _ = worker.submit(fuel, frame);
            self.queued += 1;
            self.queued_bytes += frame.len();
        }
    }

    /// Runs `frame`, then reads back `tensor`.
    pub fn read(
        &mut self,
        meter: &mut Meter,
        frame: &[u8],
        tensor: &[u8],
    ) -> Result<Vec<u8>, String> {
        let worker = self.usable(meter, frame.len() + tensor.len())?;
        let fuel = grant(meter);
        let reply = worker.read(fuel, frame, tensor, meter.deadline())?;
        self.settle(meter, reply)
    }

    /// Runs `frame` and waits until everything sent so far has run.
    pub fn sync(&mut self, meter: &mut Meter, frame: &[u8]) -> Result<(), String> {
        let worker = self.usable(meter, frame.len())?;
        let fuel = grant(meter);
        let reply = worker.sync(fuel, frame, meter.deadline())?;
        self.settle(meter, reply).map(drop)
    }

    /// The guest call has returned: waits for everything it streamed and
    /// charges what that cost, with no fee of its own (the guest asked for
    /// nothing). A deadline already past kills the worker at once: nothing
    /// the trial queued may run on after its call.
    pub fn finish(&mut self, meter: &mut Meter) {
        let Some(worker) = self.worker.as_mut() else {
            return;
        };
        if worker.lost().is_some() {
            return;
        }
        let fuel = grant(meter);
        if let Ok(reply) = worker.sync(fuel, &[], meter.deadline()) {
            // Refusals were the guest's to read; only the fuel matters.
            let _ = self.settle(meter, reply);
        }
    }

    /// The trial's burn session as bytes, for a host snapshot: `None` when
    /// it has no worker (it never made a burn call, or the host refused its
    /// first). Fails when the worker is lost or its session failed: its
    /// tensors have no exact state then.
    pub fn image(&mut self) -> Result<Option<Vec<u8>>, ComputeError> {
        let lost = |why: &str| ComputeError::Device(format!("the trial's burn worker: {why}"));
        if let Some(why) = self.lost() {
            return Err(lost(why));
        }
        let Some(worker) = self.worker.as_mut() else {
            return Ok(None);
        };
        let reply = worker.snapshot().map_err(|why| lost(&why))?;
        self.caught_up();
        reply.outcome.map(Some).map_err(|why| {
            ComputeError::Invalid(format!(
                "the trial's burn session failed, so its tensors have no exact state: {why}"
            ))
        })
    }

    /// Starts the worker as [`BurnLane::start`] does and has it take over
    /// `image`, from a [`BurnLane::image`].
    pub fn restore(
        &mut self,
        memory: Result<u64, String>,
        device: &BurnDevice,
        image: &[u8],
    ) -> Result<(), String> {
        self.start(memory, device);
        if let Some(why) = self.refused.as_ref().or(self.failed.as_ref()) {
            return Err(why.clone());
        }
        let worker = self.worker.as_mut().expect("started");
        let reply = worker.restore(image)?;
        self.caught_up();
        reply.outcome.map(drop)
    }

    /// The worker replied: everything streamed before has run.
    fn caught_up(&mut self) {
        self.queued = 0;
        self.queued_bytes = 0;
    }

    /// The worker, once the call's fee for moving `bytes` is paid.
    fn usable(&mut self, meter: &mut Meter, bytes: usize) -> Result<&mut BurnWorker, String> {
        // Charged first: the host copied the bytes out of the guest
        // whatever becomes of them. A refusal is never seen by the guest:
        // the sandbox traps when the call returns.
        meter
            .charge(cost::fuel(0, bytes as u64))
            .map_err(|stop| format!("stopped: {stop:?}"))?;
        if let Some(why) = self.refused.as_ref().or(self.failed.as_ref()) {
            return Err(why.clone());
        }
        self.worker
            .as_mut()
            .ok_or_else(|| "the burn worker was not started".to_owned())
    }

    /// Takes a reply's account: what the worker spent is the call's debt,
    /// and a command the trial could not pay for stops the call as any
    /// instruction it could not pay for would.
    fn settle(&mut self, meter: &mut Meter, reply: Reply) -> Result<Vec<u8>, String> {
        self.caught_up();
        let _ = meter.charge(reply.fuel_spent);
        if reply.out_of_fuel {
            meter.stop(Stop::OutOfFuel);
        }
        reply.outcome
    }
}

/// The fuel a request carries: what the trial has left in this call, or
/// no bound where fuel is not metered.
fn grant(meter: &Meter) -> u64 {
    meter.left().unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lane with the real worker (built by the burn workspace's tests,
    /// which `scripts/test.sh` runs first) and a call in progress.
    fn lane(meter: &mut Meter) -> BurnLane {
        let mut lane = BurnLane::default();
        lane.start(Ok(1 << 20), &BurnDevice::Cpu);
        meter.begin_call(None);
        meter.enter(Some(1 << 40));
        lane
    }

    #[test]
    fn a_trial_that_never_waits_is_made_to_wait_for_its_worker() {
        let mut meter = Meter::default();
        let mut lane = lane(&mut meter);
        for _ in 0..MAX_QUEUED {
            lane.submit(&mut meter, &[]);
        }
        assert_eq!(lane.queued, MAX_QUEUED);
        // The next frame waits for the worker to run everything before it.
        lane.submit(&mut meter, &[]);
        assert_eq!((lane.queued, lane.queued_bytes), (0, 0));
        // So does a frame that would take the stream past its bytes.
        lane.submit(&mut meter, &vec![0; 1 << 10]);
        lane.submit(&mut meter, &vec![0; MAX_QUEUED_BYTES]);
        assert_eq!(lane.queued, 0);
        assert_eq!(lane.lost(), None);
        // Each frame paid its fee as it went.
        let fees = (MAX_QUEUED as u64 + 3) * cost::PER_CALL;
        assert!(meter.settle().unwrap() >= fees);
    }

    #[test]
    fn a_refused_lane_still_charges_for_the_bytes_it_was_handed() {
        let mut meter = Meter::default();
        meter.begin_call(None);
        meter.enter(Some(1 << 40));
        let mut lane = BurnLane::default();
        lane.start(Err("no room".into()), &BurnDevice::Cpu);
        assert_eq!(lane.sync(&mut meter, &[0; 1600]), Err("no room".into()));
        lane.submit(&mut meter, &[0; 1600]);
        assert_eq!(meter.settle(), Ok(2 * cost::fuel(0, 1600)));
    }
}
