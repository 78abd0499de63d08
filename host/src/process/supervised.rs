//! A worker process that wtune talks to over its pipes and can always stop:
//! requests go through a writer thread and replies come from a reader
//! thread, so a worker that stops reading or answering holds up a thread,
//! never the trial, and a wait for a reply ends at its deadline with the
//! worker killed.

use std::io::{BufReader, BufWriter, Write};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use super::OutputTail;

/// Bytes of a worker's stderr kept for messages.
const STDERR_TAIL: usize = 4096;

/// Why a wait got no reply.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The deadline passed; the worker was killed.
    Deadline,
    /// The worker died or broke its protocol; the reason, with what it said.
    Died(String),
}

/// The earlier of the guest call's deadline and `limit` from now, and
/// whether it is the call's: for a wait that must end within `limit`
/// whatever the call allows (a worker opening its device).
pub(crate) fn earlier(call: Option<Instant>, limit: Duration) -> (Instant, bool) {
    let fallback = Instant::now() + limit;
    match call {
        Some(call) if call < fallback => (call, true),
        _ => (fallback, false),
    }
}

/// The guest call's deadline, or `limit` from now where the call has none
/// (a host snapshot, or `limits.call_timeout` switched off), and whether it
/// is the call's: for a wait on the trial's own work, which may take as
/// long as the operator lets a call take (a first call on software Vulkan
/// compiles every kernel, minutes on two cores).
pub(crate) fn call_deadline_or(call: Option<Instant>, limit: Duration) -> (Instant, bool) {
    match call {
        Some(call) => (call, true),
        None => (Instant::now() + limit, false),
    }
}

/// One running worker, whose replies are `R`.
pub(crate) struct Supervised<R> {
    /// What errors call it: "the GPU worker".
    name: &'static str,
    /// `None` once killed or reaped.
    child: Option<Child>,
    /// Bytes for the thread that writes the worker's stdin.
    requests: mpsc::Sender<Vec<u8>>,
    replies: Receiver<Result<R, String>>,
    stderr: OutputTail,
    /// How the process ended, once known.
    status: Option<ExitStatus>,
}

impl<R: Send + 'static> Supervised<R> {
    /// Starts `command` with piped stdio. `read` runs on a thread of its
    /// own, reading replies off the worker's stdout until it returns
    /// `Ok(None)` (the worker closed it: "it exited") or why the worker's
    /// output is not a reply.
    pub(crate) fn spawn(
        name: &'static str,
        mut command: Command,
        mut read: impl FnMut(&mut BufReader<ChildStdout>) -> Result<Option<R>, String> + Send + 'static,
    ) -> Result<Self, String> {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting {name} {}: {e}", command.get_program().display()))?;
        let requests = writer(child.stdin.take().expect("piped"));
        let mut stdout = BufReader::with_capacity(1 << 20, child.stdout.take().expect("piped"));
        let stderr = OutputTail::collect(child.stderr.take().expect("piped"), STDERR_TAIL);
        let (tx, replies) = mpsc::channel();
        thread::spawn(move || {
            loop {
                let reply = read(&mut stdout).and_then(|r| r.ok_or_else(|| "it exited".into()));
                let end = reply.is_err();
                if tx.send(reply).is_err() || end {
                    return;
                }
            }
        });
        Ok(Self {
            name,
            child: Some(child),
            requests,
            replies,
            stderr,
            status: None,
        })
    }
}

impl<R> Supervised<R> {
    /// Hands `bytes` to the writer thread, without waiting for the worker.
    pub(crate) fn send(&mut self, bytes: Vec<u8>) -> Result<(), Failure> {
        if bytes.is_empty() {
            return Ok(());
        }
        self.requests
            .send(bytes)
            .map_err(|_| Failure::Died(self.died("it stopped reading")))
    }

    /// Waits for the next reply until `deadline`; past it the worker is
    /// killed.
    pub(crate) fn wait(&mut self, deadline: Instant) -> Result<R, Failure> {
        let wait = deadline.saturating_duration_since(Instant::now());
        match self.replies.recv_timeout(wait) {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(why)) => Err(Failure::Died(self.died(&why))),
            Err(RecvTimeoutError::Timeout) => {
                self.kill();
                Err(Failure::Deadline)
            }
            Err(RecvTimeoutError::Disconnected) => Err(Failure::Died(self.died("it exited"))),
        }
    }

    /// Ends the process (if it still runs) and describes its death: `why`,
    /// how it exited and the last of what it wrote to stderr.
    pub(crate) fn died(&mut self, why: &str) -> String {
        // A worker that crashed is exiting: give it a moment to report how,
        // and the stderr thread to drain its last lines.
        for _ in 0..20 {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                self.status = Some(status);
                self.child = None;
                break;
            }
            thread::sleep(Duration::from_millis(5));
        }
        self.kill();
        thread::sleep(Duration::from_millis(10));
        let status = self
            .status
            .take()
            .map_or(String::new(), |s| format!(" ({})", exit(s)));
        let tail = self.stderr.text();
        let name = self.name;
        if tail.is_empty() {
            format!("{name} failed: {why}{status}")
        } else {
            format!("{name} failed: {why}{status}; it said: {tail}")
        }
    }

    /// Kills the process. A process stuck in a driver call may take long
    /// to go, so unless it has already exited, a thread of its own reaps it
    /// and nobody waits.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            match child.try_wait() {
                Ok(Some(status)) => self.status = Some(status),
                _ => {
                    thread::spawn(move || child.wait());
                }
            }
        }
    }

    /// Whether the process is still there to take requests.
    pub(crate) fn alive(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|child| matches!(child.try_wait(), Ok(None)))
    }
}

impl<R> Drop for Supervised<R> {
    fn drop(&mut self) {
        self.kill();
    }
}

/// An exit status in words; a worker killed by its system call filter
/// (`SIGSYS`) is named as such.
fn exit(status: ExitStatus) -> String {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if status.signal() == Some(libc::SIGSYS) {
            return format!("{status}: a system call its sandbox forbids");
        }
    }
    status.to_string()
}

/// A thread that writes requests to `stdin` as they come, flushing whenever
/// none is waiting; it ends when the worker stops reading or the sender is
/// dropped.
fn writer(stdin: std::process::ChildStdin) -> mpsc::Sender<Vec<u8>> {
    let (requests, queue) = mpsc::channel::<Vec<u8>>();
    thread::spawn(move || {
        let mut stdin = BufWriter::with_capacity(1 << 20, stdin);
        while let Ok(bytes) = queue.recv() {
            let mut next = Some(bytes);
            while let Some(bytes) = next {
                if stdin.write_all(&bytes).is_err() {
                    return;
                }
                next = queue.try_recv().ok();
            }
            if stdin.flush().is_err() {
                return;
            }
        }
    });
    requests
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_on_the_trials_work_lasts_as_long_as_its_call_allows() {
        let limit = Duration::from_secs(120);
        let far = Instant::now() + Duration::from_secs(600);
        assert_eq!(call_deadline_or(Some(far), limit), (far, true));
        let (fallback, calls) = call_deadline_or(None, limit);
        assert!(!calls);
        assert!(fallback <= Instant::now() + limit);
        // A device opening is held to its own limit all the same.
        let (capped, calls) = earlier(Some(far), limit);
        assert!(!calls);
        assert!(capped < far);
        let near = Instant::now() + Duration::from_secs(1);
        assert_eq!(earlier(Some(near), limit), (near, true));
    }
}
