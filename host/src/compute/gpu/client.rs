//! The host side of the GPU backend: starting and supervising worker
//! processes, and [`GpuDevice`], which forwards one trial's jobs to its own
//! worker.
//!
//! Each trial holds a worker of its own while it computes, so killing a
//! worker whose job overran its deadline ends that trial's device state and
//! nobody else's. A worker opens one adapter: the GPU the runner placed the
//! trial on. Idle workers wait in a [`WorkerPool`] for the next trial on
//! their GPU, which saves opening the device again.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::protocol::{self, Adapter, Hello, Reply, Request};
use crate::compute::ComputeError;
use crate::compute::device::{Device, Fill, Kernel, PipelineInfo};
use crate::process::{Failure, Supervised, WorkerProgram, call_deadline_or, earlier};

/// How long a new worker may take to open its device.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The longest a wait for the worker may last when the guest call has no
/// deadline of its own (and the most a reset or snapshot read may take): a
/// job that gets a reply and the streamed jobs queued before it.
pub const JOB_TIMEOUT: Duration = Duration::from_secs(120);

/// Idle workers kept for later trials, per adapter.
const MAX_IDLE: usize = 8;

/// Streamed jobs the host gathers before it hands them to the writer
/// thread (a request that gets a reply sends the batch at once): each
/// hand-over wakes a thread, which costs more than a job.
const BATCH_FRAMES: usize = 64;
const BATCH_BYTES: usize = 256 << 10;

/// Jobs a trial may stream before it waits for the worker to catch up:
/// they bound what the host holds for a worker, and how long the GPU may
/// run on past the point the guest has reached.
const MAX_QUEUED: usize = 4096;

/// Payload bytes a trial may stream before it waits (one larger write
/// goes alone).
const MAX_QUEUED_BYTES: usize = 64 << 20;

/// What a GPU worker writes: its greeting, then replies.
enum Incoming {
    Hello(Hello),
    Reply(Reply, Vec<u8>),
}

/// One running worker process.
pub struct Worker {
    /// The adapter it opened: GPU `adapter` of the pool.
    adapter: usize,
    process: Supervised<Incoming>,
    /// Frames not yet handed to the writer, and how many.
    batch: Vec<u8>,
    batched: usize,
}

impl Worker {
    /// Starts a worker on adapter `adapter` and waits for its greeting
    /// until `deadline` (and at most [`START_TIMEOUT`]); past it the worker
    /// is killed.
    pub fn start(
        executable: &WorkerProgram,
        adapter: usize,
        deadline: Option<Instant>,
    ) -> Result<(Worker, Hello), String> {
        let (deadline, calls) = earlier(deadline, START_TIMEOUT);
        let why = if calls {
            "before the guest call's deadline".to_owned()
        } else {
            format!("within {}", humantime::format_duration(START_TIMEOUT))
        };
        let mut command = executable.command();
        command
            .arg("gpu-worker")
            .arg("--adapter")
            .arg(adapter.to_string())
            .env("RUST_LOG", "error");
        let mut greeted = false;
        let process = Supervised::spawn("the GPU worker", command, move |stdout| {
            if !std::mem::replace(&mut greeted, true) {
                return match protocol::read_frame::<Hello>(stdout) {
                    Ok(Some((hello, _))) => Ok(Some(Incoming::Hello(hello))),
                    Ok(None) => Err("it exited before greeting".into()),
                    Err(e) => Err(format!("its greeting was unreadable: {e}")),
                };
            }
            protocol::read_frame::<Reply>(stdout)
                .map(|frame| frame.map(|(reply, payload)| Incoming::Reply(reply, payload)))
                .map_err(|e| format!("its reply was unreadable: {e}"))
        })?;
        let mut worker = Worker {
            adapter,
            process,
            batch: Vec::new(),
            batched: 0,
        };
        match worker.process.wait(deadline) {
            Ok(Incoming::Hello(hello)) => Ok((worker, hello)),
            Ok(Incoming::Reply(..)) => Err(worker.process.died("it replied before greeting")),
            Err(Failure::Deadline) => Err(format!("the GPU worker did not open a device {why}")),
            Err(Failure::Died(why)) => Err(why),
        }
    }

    /// Adds one request to the batch, and sends the batch once it is full.
    fn send(&mut self, request: &Request, payload: &[u8]) -> Result<(), Failure> {
        protocol::append_frame(&mut self.batch, request, payload)
            .map_err(|e| Failure::Died(format!("{} could not be sent: {e}", request.describe())))?;
        self.batched += 1;
        if self.batched >= BATCH_FRAMES || self.batch.len() >= BATCH_BYTES {
            self.push()?;
        }
        Ok(())
    }

    /// Hands the batch to the writer thread.
    fn push(&mut self) -> Result<(), Failure> {
        self.batched = 0;
        self.process.send(std::mem::take(&mut self.batch))
    }

    /// Sends one request that gets a reply ([`Request::replies`]) and waits
    /// for it until `deadline`; past it the worker is killed.
    fn call(
        &mut self,
        request: &Request,
        payload: &[u8],
        deadline: Instant,
    ) -> Result<(Reply, Vec<u8>), Failure> {
        debug_assert!(request.replies());
        self.send(request, payload)?;
        self.push()?;
        match self.process.wait(deadline)? {
            Incoming::Reply(reply, payload) => Ok((reply, payload)),
            Incoming::Hello(_) => Err(Failure::Died(self.process.died("it greeted again"))),
        }
    }

    /// Whether the process is still there to take jobs.
    fn alive(&mut self) -> bool {
        self.process.alive()
    }
}

/// Workers waiting for a trial, and how to start more.
pub struct WorkerPool {
    executable: WorkerProgram,
    /// The first adapter; the others are of the same kind.
    adapter: Adapter,
    idle: Mutex<Vec<Worker>>,
}

impl WorkerPool {
    /// Starts one worker on the first adapter, to learn it and how many
    /// there are. `Ok(Err(reason))` when the worker runs but finds no
    /// adapter.
    pub fn open() -> Result<Result<Arc<WorkerPool>, String>, String> {
        let executable = crate::process::worker_program()?;
        let (worker, hello) = Worker::start(&executable, 0, None)?;
        Ok(match hello {
            Hello::Ready(adapter) => Ok(Arc::new(WorkerPool {
                executable,
                adapter,
                idle: Mutex::new(vec![worker]),
            })),
            Hello::NoAdapter(reason) => Err(reason),
        })
    }

    /// The first adapter. Its limits are the ones sessions check before
    /// sending a job; a worker on another adapter checks its own as well.
    pub fn adapter(&self) -> &Adapter {
        &self.adapter
    }

    /// How many adapters (GPUs) workers can open.
    pub fn adapters(&self) -> usize {
        self.adapter.all.len()
    }

    /// An idle worker on adapter `adapter`, or a new one started by
    /// `deadline`.
    fn take(&self, adapter: usize, deadline: Option<Instant>) -> Result<Worker, String> {
        loop {
            let idle = {
                let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
                let on = idle.iter().rposition(|w| w.adapter == adapter);
                on.map(|at| idle.remove(at))
            };
            match idle {
                Some(mut worker) => {
                    if worker.alive() {
                        return Ok(worker);
                    }
                    // It died while idle: it held nothing, so start another.
                }
                None => break,
            }
        }
        match Worker::start(&self.executable, adapter, deadline)? {
            (worker, Hello::Ready(_)) => Ok(worker),
            (_, Hello::NoAdapter(reason)) => Err(format!(
                "a new GPU worker could not open GPU {adapter}: {reason}"
            )),
        }
    }

    /// Takes back a worker after clearing it; a worker that cannot be
    /// cleared promptly is dropped (killed).
    fn give_back(&self, mut worker: Worker) {
        let deadline = Instant::now() + Duration::from_secs(10);
        if let Ok((Reply::Done, _)) = worker.call(&Request::Reset, &[], deadline) {
            let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
            if idle.iter().filter(|w| w.adapter == worker.adapter).count() < MAX_IDLE {
                idle.push(worker);
            }
        }
    }
}

/// One trial's buffers and pipelines in a worker process of its own.
///
/// Jobs that return nothing to the guest are streamed: sent without
/// waiting, up to [`MAX_QUEUED`] of them (or [`MAX_QUEUED_BYTES`] of
/// payload), then the trial waits for the worker to catch up. The session
/// has checked them, so only the device can still fail one (out of memory,
/// lost); that failure comes back at the next job that waits, or at
/// [`Device::sync`] at the latest, and ends the trial.
pub struct GpuDevice {
    pool: Arc<WorkerPool>,
    /// The adapter its worker opens.
    adapter: usize,
    worker: Option<Worker>,
    /// Set once the worker died or was killed: the device state is gone.
    lost: Option<String>,
    deadline: Option<Instant>,
    /// Jobs and payload bytes sent since the worker last replied.
    queued: usize,
    queued_bytes: usize,
}

impl GpuDevice {
    /// A device on adapter `adapter` (GPU `adapter` of the experiment's
    /// pool) that starts (or takes) its worker at the first job.
    pub fn new(pool: Arc<WorkerPool>, adapter: usize) -> Self {
        Self {
            pool,
            adapter,
            worker: None,
            lost: None,
            deadline: None,
            queued: 0,
            queued_bytes: 0,
        }
    }

    /// The trial's worker, started (or taken from the pool) at first use.
    fn worker(&mut self) -> Result<&mut Worker, ComputeError> {
        if let Some(lost) = &self.lost {
            return Err(ComputeError::Device(lost.clone()));
        }
        if self.worker.is_none() {
            let worker = self
                .pool
                .take(self.adapter, self.deadline)
                .map_err(ComputeError::Device)?;
            self.worker = Some(worker);
        }
        Ok(self.worker.as_mut().expect("just set"))
    }

    /// Streams a job that gets no reply, first waiting for the worker to
    /// catch up when the queue is full.
    fn queue(&mut self, request: &Request, payload: &[u8]) -> Result<(), ComputeError> {
        debug_assert!(!request.replies());
        if self.queued >= MAX_QUEUED || self.queued_bytes + payload.len() > MAX_QUEUED_BYTES {
            self.sync()?;
        }
        let sent = self.worker()?.send(request, payload);
        if let Err(failure) = sent {
            return Err(self.lose(failure, &request.describe(), false));
        }
        self.queued += 1;
        self.queued_bytes += payload.len();
        Ok(())
    }

    /// Sends a job that gets a reply and waits for it: the reply comes
    /// after every job queued before it has run.
    fn call(
        &mut self,
        request: &Request,
        payload: &[u8],
    ) -> Result<(Reply, Vec<u8>), ComputeError> {
        let (deadline, calls) = call_deadline_or(self.deadline, JOB_TIMEOUT);
        let result = self.worker()?.call(request, payload, deadline);
        let job = match self.queued {
            0 => request.describe(),
            1 => format!("{}, after 1 queued GPU job,", request.describe()),
            n => format!("{}, after {n} queued GPU jobs,", request.describe()),
        };
        self.queued = 0;
        self.queued_bytes = 0;
        match result {
            Ok((Reply::Failed(err), _)) => Err(err),
            Ok((Reply::Lost(why), _)) => {
                self.worker = None;
                let lost = format!("{why}; this trial's device buffers are gone");
                self.lost = Some(lost.clone());
                Err(ComputeError::Device(lost))
            }
            Ok(reply) => Ok(reply),
            Err(failure) => Err(self.lose(failure, &job, calls)),
        }
    }

    /// Ends the worker after `failure` in `job`, which waited until the
    /// guest call's deadline (`calls`) or [`JOB_TIMEOUT`]: the trial's
    /// device state is gone, and every later call says why.
    fn lose(&mut self, failure: Failure, job: &str, calls: bool) -> ComputeError {
        self.worker = None;
        let lost = match failure {
            Failure::Deadline => {
                let why = if calls {
                    "the guest call's deadline (limits.call_timeout)".to_owned()
                } else {
                    format!(
                        "the {} limit on one wait for the GPU",
                        humantime::format_duration(JOB_TIMEOUT)
                    )
                };
                format!(
                    "{job} ran past {why}; its GPU worker process was killed, taking this \
                     trial's device buffers with it"
                )
            }
            Failure::Died(why) => format!("{why}; this trial's device buffers are gone"),
        };
        self.lost = Some(lost.clone());
        ComputeError::Device(lost)
    }

    fn done(&mut self, request: &Request, payload: &[u8]) -> Result<(), ComputeError> {
        self.call(request, payload).map(drop)
    }
}

impl Drop for GpuDevice {
    fn drop(&mut self) {
        if let Some(worker) = self.worker.take() {
            self.pool.give_back(worker);
        }
    }
}

impl Device for GpuDevice {
    fn begin_call(&mut self, deadline: Option<Instant>) {
        self.deadline = deadline;
    }

    fn lost(&self) -> Option<&str> {
        self.lost.as_deref()
    }

    fn sync(&mut self) -> Result<(), ComputeError> {
        if self.queued == 0 {
            return match &self.lost {
                Some(lost) => Err(ComputeError::Device(lost.clone())),
                None => Ok(()),
            };
        }
        self.done(&Request::Sync, &[])
    }

    fn create(&mut self, id: u32, fill: Fill) -> Result<(), ComputeError> {
        let (elements, data) = match &fill {
            Fill::Zeros(n) => (*n, None),
            Fill::Data(data) => (data.len(), Some(data.as_slice())),
        };
        let request = Request::Create {
            id,
            elements: elements as u64,
            from_payload: data.is_some(),
        };
        self.queue(&request, protocol::f32_bytes(data.unwrap_or_default()))
    }

    fn write(&mut self, id: u32, offset: usize, data: &[f32]) -> Result<(), ComputeError> {
        let request = Request::Write {
            id,
            offset: offset as u64,
        };
        self.queue(&request, protocol::f32_bytes(data))
    }

    fn read(&mut self, id: u32, offset: usize, len: usize) -> Result<Vec<f32>, ComputeError> {
        let request = Request::Read {
            id,
            offset: offset as u64,
            len: len as u64,
        };
        let (_, payload) = self.call(&request, &[])?;
        let data = protocol::bytes_f32(&payload)?;
        if data.len() != len {
            return Err(ComputeError::Device(format!(
                "the GPU worker returned {} elements for a read of {len}",
                data.len()
            )));
        }
        Ok(data)
    }

    fn free(&mut self, id: u32) -> Result<(), ComputeError> {
        self.queue(&Request::Free { id }, &[])
    }

    fn run(&mut self, kernel: &Kernel) -> Result<(), ComputeError> {
        self.queue(&Request::Run(kernel.clone()), &[])
    }

    fn create_pipeline(
        &mut self,
        id: u32,
        wgsl: &str,
        entry_point: &str,
    ) -> Result<PipelineInfo, ComputeError> {
        let request = Request::CreatePipeline {
            id,
            wgsl: wgsl.to_string(),
            entry_point: entry_point.to_string(),
        };
        match self.call(&request, &[])? {
            (Reply::Pipeline(info), _) => Ok(info),
            (other, _) => Err(ComputeError::Device(format!(
                "the GPU worker answered {other:?} to a pipeline request"
            ))),
        }
    }

    fn dispatch(
        &mut self,
        id: u32,
        bindings: &[u32],
        groups: [u32; 3],
    ) -> Result<(), ComputeError> {
        let request = Request::Dispatch {
            id,
            bindings: bindings.to_vec(),
            groups,
        };
        self.done(&request, &[])
    }

    fn free_pipeline(&mut self, id: u32) -> Result<(), ComputeError> {
        self.done(&Request::FreePipeline { id }, &[])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_that_cannot_start_or_greet_is_named() {
        let missing = Worker::start(&WorkerProgram::binary("/nonexistent/wtune"), 0, None)
            .err()
            .unwrap();
        assert!(
            missing.starts_with("starting the GPU worker /nonexistent/wtune"),
            "{missing}"
        );
        // `true` ignores its argument and exits without a word.
        let silent = Worker::start(&WorkerProgram::binary("/bin/true"), 0, None)
            .err()
            .unwrap();
        assert!(silent.contains("it exited before greeting"), "{silent}");
    }

    #[cfg(unix)]
    #[test]
    fn a_worker_slow_to_greet_is_given_up_at_the_calls_deadline() {
        // A worker that never greets. Not a script written here: executing
        // a file just written fails with ETXTBSY when another test thread
        // forks while the file is still open for writing.
        let mute = WorkerProgram {
            program: "/bin/sh".into(),
            prefix: ["-c", "exec sleep 30", "mute"].map(Into::into).to_vec(),
        };
        let began = Instant::now();
        let deadline = began + Duration::from_millis(200);
        let err = Worker::start(&mute, 0, Some(deadline)).err().unwrap();
        assert_eq!(
            err,
            "the GPU worker did not open a device before the guest call's deadline"
        );
        // Given up at the deadline, not after the 60 s start limit.
        assert!(began.elapsed() < START_TIMEOUT / 2, "{:?}", began.elapsed());
    }
}
