//! [`BurnWorker`]: one trial's `wtune-burn-worker` process, which checks,
//! charges and runs the trial's burn operations.

use std::time::{Duration, Instant};

use super::BurnDevice;
use super::protocol::{self, Kind, Reply};
use crate::process::{Failure, Supervised, WorkerProgram, call_deadline_or};

/// The longest a wait for the worker may last when the guest call has no
/// deadline of its own.
pub const WAIT_TIMEOUT: Duration = Duration::from_secs(120);

/// One trial's burn worker. Frames are streamed to it without waiting
/// ([`BurnWorker::submit`]); [`BurnWorker::read`] and [`BurnWorker::sync`]
/// wait for its reply, which comes after everything sent before has run.
///
/// Two kinds of failure: the trial's burn session refusing a command (the
/// reply's `outcome`, which the guest gets) and the worker itself lost (it
/// died, or a wait ran past its deadline and it was killed): then the
/// trial's host tensors are gone and every later call says why.
pub struct BurnWorker {
    process: Supervised<Reply>,
    lost: Option<String>,
}

impl BurnWorker {
    /// Starts `program` for a trial whose tensors may take `memory_bytes`
    /// on `device`.
    pub fn start(
        program: &WorkerProgram,
        memory_bytes: u64,
        device: &BurnDevice,
    ) -> Result<Self, String> {
        let mut command = program.command();
        command.arg("--memory-bytes").arg(memory_bytes.to_string());
        command.args(device.args());
        let max_payload = memory_bytes.saturating_add(protocol::PAYLOAD_OVERHEAD);
        let process = Supervised::spawn("the burn worker", command, move |stdout| {
            protocol::read_reply(stdout, max_payload)
                .map_err(|e| format!("its reply was unreadable: {e}"))
        })?;
        Ok(Self {
            process,
            lost: None,
        })
    }

    /// Why the worker is gone, if it is.
    pub fn lost(&self) -> Option<&str> {
        self.lost.as_deref()
    }

    /// Streams `frame` to the worker; the trial has `fuel` left.
    pub fn submit(&mut self, fuel: u64, frame: &[u8]) -> Result<(), String> {
        self.usable()?;
        let sent = self
            .process
            .send(protocol::request(Kind::Submit, fuel, frame, &[]));
        sent.map_err(|failure| self.lose(failure, "a burn frame", false))
    }

    /// Runs `frame`, then reads back `tensor` (a guest-encoded `TensorIr`).
    pub fn read(
        &mut self,
        fuel: u64,
        frame: &[u8],
        tensor: &[u8],
        deadline: Option<Instant>,
    ) -> Result<Reply, String> {
        self.call(Kind::Read, fuel, frame, tensor, deadline)
    }

    /// Runs `frame` and waits until everything sent so far has run.
    pub fn sync(
        &mut self,
        fuel: u64,
        frame: &[u8],
        deadline: Option<Instant>,
    ) -> Result<Reply, String> {
        self.call(Kind::Sync, fuel, frame, &[], deadline)
    }

    /// The trial's burn session as bytes (its tensors and its random
    /// generator's state), for a host snapshot. Waits at most
    /// [`WAIT_TIMEOUT`]: the snapshot is the host's, not a guest call's.
    pub fn snapshot(&mut self) -> Result<Reply, String> {
        self.call(Kind::Snapshot, 0, &[], &[], None)
    }

    /// Takes over `image`, from a [`BurnWorker::snapshot`]; the worker must
    /// not have run anything yet.
    pub fn restore(&mut self, image: &[u8]) -> Result<Reply, String> {
        self.call(Kind::Restore, 0, image, &[], None)
    }

    fn usable(&self) -> Result<(), String> {
        match &self.lost {
            Some(lost) => Err(lost.clone()),
            None => Ok(()),
        }
    }

    fn call(
        &mut self,
        kind: Kind,
        fuel: u64,
        frame: &[u8],
        tensor: &[u8],
        deadline: Option<Instant>,
    ) -> Result<Reply, String> {
        self.usable()?;
        let (deadline, calls) = call_deadline_or(deadline, WAIT_TIMEOUT);
        let job = match kind {
            Kind::Submit => "a burn frame",
            Kind::Read => "a burn read",
            Kind::Sync => "a burn sync",
            Kind::Snapshot => "a snapshot of the burn tensors",
            Kind::Restore => "restoring the burn tensors",
        };
        let request = protocol::request(kind, fuel, frame, tensor);
        let reply = self
            .process
            .send(request)
            .and_then(|()| self.process.wait(deadline));
        reply.map_err(|failure| self.lose(failure, job, calls))
    }

    /// Ends the worker after `failure` in `job`: the trial's host tensors
    /// are gone, and every later call says why.
    fn lose(&mut self, failure: Failure, job: &str, calls: bool) -> String {
        self.process.kill();
        let lost = match failure {
            Failure::Deadline => {
                let limit = if calls {
                    "the guest call's deadline (limits.call_timeout)".to_owned()
                } else {
                    format!(
                        "the {} limit on one wait for the host",
                        humantime::format_duration(WAIT_TIMEOUT)
                    )
                };
                format!(
                    "{job} ran past {limit}; the burn worker was killed, taking this trial's \
                     host tensors with it"
                )
            }
            Failure::Died(why) => format!("{why}; this trial's host tensors are gone"),
        };
        self.lost = Some(lost.clone());
        lost
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The real worker, built by the burn workspace's tests (`scripts/test.sh`
    /// runs them first).
    fn worker() -> BurnWorker {
        let program = crate::process::burn_worker_program().expect("wtune-burn-worker is built");
        BurnWorker::start(&program, 1 << 20, &BurnDevice::Cpu).expect("the worker starts")
    }

    fn deadline() -> Option<Instant> {
        Some(Instant::now() + Duration::from_secs(30))
    }

    #[test]
    fn a_sync_of_nothing_reports_an_empty_session() {
        let mut worker = worker();
        let reply = worker.sync(1_000, &[], deadline()).unwrap();
        assert_eq!(
            reply,
            Reply {
                outcome: Ok(Vec::new()),
                out_of_fuel: false,
                fuel_spent: 0,
                bytes: 0,
                tensors: 0,
            }
        );
    }

    #[test]
    fn a_refused_frame_is_the_guests_error_and_the_worker_goes_on() {
        let mut worker = worker();
        worker.submit(1_000, &[0xff, 0xff]).unwrap();
        let reply = worker.sync(1_000, &[], deadline()).unwrap();
        let error = reply.outcome.unwrap_err();
        assert!(
            error.starts_with("burn command 1: command 0 of the frame (byte 0) does not decode"),
            "{error}"
        );
        // The session keeps its first error; the worker still answers.
        let again = worker.read(1_000, &[], &[1, 2, 3], deadline()).unwrap();
        assert_eq!(again.outcome, Err(error));
        assert_eq!(worker.lost(), None);
        let mut fresh = self::worker();
        let read = fresh.read(1_000, &[], &[0xff], deadline()).unwrap();
        let error = read.outcome.unwrap_err();
        assert!(
            error.starts_with("the tensor to read does not decode"),
            "{error}"
        );
    }

    #[cfg(unix)]
    #[test]
    fn a_worker_that_does_not_answer_is_killed_at_the_deadline_and_stays_lost() {
        let mute = WorkerProgram {
            program: "/bin/sh".into(),
            prefix: ["-c", "exec sleep 30", "mute"].map(Into::into).to_vec(),
        };
        let mut worker = BurnWorker::start(&mute, 1 << 20, &BurnDevice::Cpu).unwrap();
        let began = Instant::now();
        let soon = Some(began + Duration::from_millis(200));
        let error = worker.sync(1_000, &[], soon).unwrap_err();
        assert_eq!(
            error,
            "a burn sync ran past the guest call's deadline (limits.call_timeout); the burn \
             worker was killed, taking this trial's host tensors with it"
        );
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "{:?}",
            began.elapsed()
        );
        assert_eq!(worker.submit(1_000, &[1]), Err(error.clone()));
        assert_eq!(worker.lost(), Some(error.as_str()));
    }

    #[test]
    fn a_worker_that_exits_is_named_with_what_it_said() {
        // The worker refuses an argument it does not know and exits.
        let program = crate::process::burn_worker_program().unwrap();
        let confused = WorkerProgram {
            prefix: vec!["--frobnicate".into()],
            ..program
        };
        let mut worker = BurnWorker::start(&confused, 1 << 20, &BurnDevice::Cpu).unwrap();
        let error = worker.sync(1_000, &[], deadline()).unwrap_err();
        assert!(
            error.starts_with("the burn worker failed: it exited"),
            "{error}"
        );
        assert!(error.contains("usage: wtune-burn-worker"), "{error}");
        assert!(
            error.ends_with("this trial's host tensors are gone"),
            "{error}"
        );
    }
}
