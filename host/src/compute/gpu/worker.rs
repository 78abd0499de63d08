//! The worker process: opens a Vulkan adapter with wgpu and serves one
//! trial's jobs at a time over stdin and stdout (see [`super::protocol`]).
//!
//! It runs in its own process because a shader cannot be stopped from
//! inside one: a timed-out wait leaves the work running, and dropping the
//! device blocks until it ends. The parent kills this process instead.
//!
//! Jobs the host streams (buffers and built-in kernels; see
//! [`Request::replies`]) are recorded, not waited for: built-in kernels go
//! into one command encoder, each with its parameters in its own slot of a
//! uniform ring and a bind group kept for its buffers, and the batch is
//! submitted once, when the input runs dry, when the ring is full, or
//! before anything that must see its results (a write, a read, a custom
//! dispatch, a sync). Custom dispatches still wait for their submission,
//! so the one that overruns its deadline is the one that caused it.

use std::collections::HashMap;
use std::io::{self, BufReader, BufWriter};
use std::num::NonZeroU64;
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::bounds::MatmulKernel;
use super::protocol::{self, Adapter, Hello, Reply, Request};
use crate::compute::ComputeError;
use crate::compute::device::{Kernel, PipelineInfo};
use crate::compute::ops::{Axis, Binary, Reduce, Unary};

/// Entry point of `wtune gpu-worker --adapter N`: opens adapter `adapter`
/// (see [`LocalGpu::open_nth`]) and serves jobs until stdin closes.
pub fn main(adapter: usize) -> ExitCode {
    let stdin = io::stdin().lock();
    let mut input = BufReader::with_capacity(1 << 20, stdin);
    let channel = match private_stdout() {
        Ok(file) => file,
        Err(err) => {
            eprintln!("wtune gpu-worker: cannot set up its channel: {err}");
            return ExitCode::FAILURE;
        }
    };
    let mut output = BufWriter::with_capacity(1 << 20, channel);
    let mut gpu = match LocalGpu::open_nth(adapter) {
        Ok(gpu) => gpu,
        Err(reason) => {
            let sent = protocol::write_frame(&mut output, &Hello::NoAdapter(reason), &[]);
            return if sent.is_ok() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            };
        }
    };
    if protocol::write_frame(&mut output, &Hello::Ready(gpu.adapter.clone()), &[]).is_err() {
        return ExitCode::FAILURE;
    }
    loop {
        // Nothing more has arrived: the GPU starts on what has.
        if input.buffer().is_empty() {
            gpu.flush();
        }
        let (header, payload) = match protocol::read_raw_frame(&mut input) {
            Ok(Some(frame)) => frame,
            Ok(None) => return ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("wtune gpu-worker: unreadable request: {err}");
                return ExitCode::FAILURE;
            }
        };
        let (reply, data) = match serde_json::from_slice::<Request>(&header) {
            Ok(request) if !request.replies() => {
                gpu.handle(request, &payload);
                continue;
            }
            Ok(request) => gpu.handle(request, &payload),
            Err(err) => {
                // A well-framed request this worker cannot decode: refused
                // if its kind gets a reply, so the stream stays in step;
                // else the worker stops as after a failed streamed job.
                let why = format!("the GPU worker could not decode the request: {err}");
                if !protocol::tag_replies(&header) {
                    gpu.fail(why);
                    continue;
                }
                (Reply::Failed(ComputeError::Device(why)), Vec::new())
            }
        };
        if protocol::write_frame(&mut output, &reply, protocol::f32_bytes(&data)).is_err() {
            return ExitCode::FAILURE;
        }
    }
}

/// The protocol's own copy of stdout; fd 1 itself then points at stderr,
/// so whatever a driver or loader prints cannot break the framing.
fn private_stdout() -> io::Result<std::fs::File> {
    use std::os::fd::FromRawFd;
    // SAFETY: dup and dup2 on the process's own standard descriptors; the
    // new descriptor is owned by the returned File alone.
    unsafe {
        let channel = libc::dup(1);
        if channel < 0 || libc::dup2(2, 1) < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(std::fs::File::from_raw_fd(channel))
    }
}

enum Served {
    Done,
    Data(Vec<f32>),
    Pipeline(PipelineInfo),
}

/// Built-in kernels: entry points of `kernels.wgsl`.
const ENTRY_POINTS: [&str; 9] = [
    "unary",
    "binary",
    "binary_rows",
    "affine",
    "axpy",
    "matmul",
    "matmul_tiled",
    "reduce",
    "softmax",
];

/// Invocations per workgroup of the element-wise and row kernels.
const GROUP: u32 = 256;

/// Parameter slots in the uniform ring: the most built-in kernels one
/// submission holds.
const RING: u32 = 1024;

/// Bind groups kept for built-in kernels before the cache starts over.
const MAX_BINDS: usize = 4096;

/// The largest read-back buffer kept between reads.
const KEPT_STAGING: u64 = 16 << 20;

/// How long a wait for a hardware GPU polls before it blocks.
const SPIN: Duration = Duration::from_millis(1);

/// The uniform block of `kernels.wgsl`, field for field.
#[repr(C)]
#[derive(Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    n: u32,
    op: u32,
    flags: u32,
    cols: u32,
    m: u32,
    nn: u32,
    k: u32,
    len: u32,
    outer: u32,
    inner: u32,
    s0: f32,
    s1: f32,
}

/// Bytes of one parameter block.
const PARAMS_BYTES: u64 = std::mem::size_of::<Params>() as u64;

const A_IS_OUT: u32 = 1;
const B_IS_OUT: u32 = 2;
const TRANSPOSE_A: u32 = 4;
const TRANSPOSE_B: u32 = 8;

struct Custom {
    pipeline: wgpu::ComputePipeline,
}

/// Work recorded for the next submission.
enum Op {
    /// A built-in kernel whose parameters are at byte `params` of the ring.
    Kernel {
        pipeline: wgpu::ComputePipeline,
        bind: wgpu::BindGroup,
        params: u32,
        groups: [u32; 3],
    },
    Copy {
        from: wgpu::Buffer,
        from_offset: u64,
        to: wgpu::Buffer,
        to_offset: u64,
        bytes: u64,
    },
}

/// A wgpu device serving jobs in this process: what the worker runs, and
/// what benchmarks call to measure wgpu without the process boundary.
pub struct LocalGpu {
    adapter: Adapter,
    device: wgpu::Device,
    queue: wgpu::Queue,
    layout: wgpu::BindGroupLayout,
    builtin: HashMap<&'static str, wgpu::ComputePipeline>,
    /// [`RING`] parameter blocks, `stride` bytes apart (the adapter's
    /// uniform offset alignment), bound with a dynamic offset.
    params: wgpu::Buffer,
    stride: u64,
    /// The ring's contents for the batch being recorded.
    staged_params: Vec<u8>,
    /// Bound in place of an input the kernel reads from `out`.
    spare: wgpu::Buffer,
    buffers: HashMap<u32, wgpu::Buffer>,
    pipelines: HashMap<u32, Custom>,
    /// Recorded and not yet submitted, and the ring slots it uses.
    pending: Vec<Op>,
    slots: u32,
    /// Built-in kernels' bind groups by their buffers (`[a, b, out]`, 0 for
    /// `spare`).
    binds: HashMap<[u32; 3], wgpu::BindGroup>,
    /// The first streamed job that failed; nothing runs after it.
    failed: Option<String>,
    /// Kept for the next read (see [`LocalGpu::staging`]).
    staging: Option<wgpu::Buffer>,
}

impl LocalGpu {
    /// Serves one job: the reply, and for reads the elements. A job that
    /// gets no reply ([`Request::replies`]) may only be recorded; one that
    /// does runs after all of them, and is answered [`Reply::Lost`] if one
    /// of them failed.
    pub fn handle(&mut self, request: Request, payload: &[u8]) -> (Reply, Vec<f32>) {
        if !request.replies() {
            if self.failed.is_none() {
                let job = request.describe();
                if let Err(err) = self.serve(request, payload) {
                    self.fail(format!("{job} failed: {err}"));
                }
            }
            return (Reply::Done, Vec::new());
        }
        if matches!(request, Request::Reset) {
            self.discard_recorded();
            self.failed = None;
        }
        self.flush();
        if let Some(why) = &self.failed {
            return (Reply::Lost(why.clone()), Vec::new());
        }
        let served = self.serve(request, payload);
        // The job's own submission can fail too; then nothing runs after it.
        if let Some(why) = &self.failed {
            return (Reply::Lost(why.clone()), Vec::new());
        }
        match served {
            Ok(Served::Done) => (Reply::Done, Vec::new()),
            Ok(Served::Data(data)) => (Reply::Done, data),
            Ok(Served::Pipeline(info)) => (Reply::Pipeline(info), Vec::new()),
            Err(err) => (Reply::Failed(err), Vec::new()),
        }
    }

    /// The adapter this device runs on.
    pub fn adapter(&self) -> &Adapter {
        &self.adapter
    }

    /// The first adapter host compute uses: [`LocalGpu::open_nth`]`(0)`.
    pub fn open() -> Result<LocalGpu, String> {
        Self::open_nth(0)
    }

    /// Adapter `index` of those host compute uses (see [`usable`]): GPU
    /// `index` of the experiment's resource pool. Vulkan only: the GL
    /// backend inserts no bounds checks, which untrusted shaders need.
    pub fn open_nth(index: usize) -> Result<LocalGpu, String> {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
            backends: wgpu::Backends::VULKAN,
            ..wgpu::InstanceDescriptor::new_without_display_handle()
        });
        let all = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::VULKAN));
        let infos: Vec<wgpu::AdapterInfo> = all.iter().map(wgpu::Adapter::get_info).collect();
        let found: Vec<(wgpu::DeviceType, String)> = infos
            .iter()
            .map(|info| (info.device_type, info.device_pci_bus_id.clone()))
            .collect();
        let usable = usable(&found);
        let Some(&chosen) = usable.get(index) else {
            return Err(match usable.len() {
                0 => "no Vulkan adapter".to_owned(),
                n => format!(
                    "GPU {index} does not exist: host compute uses {n} Vulkan adapter{} here \
                     (numbered from 0)",
                    if n == 1 { "" } else { "s" }
                ),
            });
        };
        let (adapter, info) = (&all[chosen], &infos[chosen]);
        let limits = adapter.limits();
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("wtune"),
            required_limits: limits.clone(),
            ..Default::default()
        }))
        .map_err(|e| format!("{} refused a device: {e}", info.name))?;
        // Every job runs inside error scopes; anything that escapes them is
        // logged rather than left to wgpu's default, which panics.
        device.on_uncaptured_error(std::sync::Arc::new(|err| {
            eprintln!("wtune gpu-worker: uncaptured GPU error: {err}");
        }));
        // The least of every usable adapter's limits (this device has its
        // adapter's), so that whichever GPU a trial is placed on takes the
        // same jobs.
        let mut max_buffer_bytes = u64::MAX;
        let mut max_workgroups = u32::MAX;
        for limits in usable.iter().map(|&i| all[i].limits()) {
            max_buffer_bytes = max_buffer_bytes
                .min(limits.max_buffer_size)
                .min(limits.max_storage_buffer_binding_size);
            max_workgroups = max_workgroups.min(limits.max_compute_workgroups_per_dimension);
        }
        let adapter = Adapter {
            name: info.name.clone(),
            device_type: format!("{:?}", info.device_type),
            driver: driver(info),
            software: info.device_type == wgpu::DeviceType::Cpu,
            max_buffer_bytes,
            max_workgroups,
            all: usable
                .iter()
                .map(|&i| protocol::described(&infos[i].name, &driver(&infos[i])))
                .collect(),
            pci_buses: usable
                .iter()
                .map(|&i| infos[i].device_pci_bus_id.clone())
                .collect(),
        };

        let storage = |binding, read_only| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Storage { read_only },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        };
        let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("kernels"),
            entries: &[
                wgpu::BindGroupLayoutEntry {
                    binding: 0,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Uniform,
                        has_dynamic_offset: true,
                        min_binding_size: NonZeroU64::new(PARAMS_BYTES),
                    },
                    count: None,
                },
                storage(1, true),
                storage(2, true),
                storage(3, false),
            ],
        });
        let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("kernels"),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("kernels.wgsl"),
            source: wgpu::ShaderSource::Wgsl(include_str!("kernels.wgsl").into()),
        });
        let builtin = ENTRY_POINTS
            .iter()
            .map(|&entry| {
                let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some(entry),
                    layout: Some(&pipeline_layout),
                    module: &module,
                    entry_point: Some(entry),
                    compilation_options: Default::default(),
                    cache: None,
                });
                (entry, pipeline)
            })
            .collect();
        let stride =
            PARAMS_BYTES.next_multiple_of(limits.min_uniform_buffer_offset_alignment as u64);
        let params = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("params"),
            size: stride * RING as u64,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let spare = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("spare"),
            size: 16,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        Ok(LocalGpu {
            adapter,
            device,
            queue,
            layout,
            builtin,
            params,
            stride,
            staged_params: vec![0; (stride * RING as u64) as usize],
            spare,
            buffers: HashMap::new(),
            pipelines: HashMap::new(),
            pending: Vec::new(),
            slots: 0,
            binds: HashMap::new(),
            failed: None,
            staging: None,
        })
    }

    fn serve(&mut self, request: Request, payload: &[u8]) -> Result<Served, ComputeError> {
        match request {
            Request::Create {
                id,
                elements,
                from_payload,
            } => {
                let data = if from_payload {
                    Some(protocol::bytes_f32(payload)?)
                } else {
                    None
                };
                self.create(id, elements, data.as_deref())?;
                Ok(Served::Done)
            }
            Request::Write { id, offset } => {
                // A queue write lands before the commands recorded so far.
                self.flush();
                let buffer = self.buffer(id)?;
                self.checked(|gpu| gpu.queue.write_buffer(buffer, offset * 4, payload))?;
                Ok(Served::Done)
            }
            Request::Read { id, offset, len } => Ok(Served::Data(self.read(id, offset, len)?)),
            Request::Free { id } => {
                self.buffers.remove(&id);
                self.binds.retain(|key, _| !key.contains(&id));
                Ok(Served::Done)
            }
            Request::Run(kernel) => {
                self.run(&kernel)?;
                Ok(Served::Done)
            }
            Request::CreatePipeline {
                id,
                wgsl,
                entry_point,
            } => Ok(Served::Pipeline(self.create_pipeline(
                id,
                &wgsl,
                &entry_point,
            )?)),
            Request::Dispatch {
                id,
                bindings,
                groups,
            } => {
                self.dispatch(id, &bindings, groups)?;
                Ok(Served::Done)
            }
            Request::FreePipeline { id } => {
                self.pipelines.remove(&id);
                Ok(Served::Done)
            }
            Request::Reset => {
                self.buffers.clear();
                self.pipelines.clear();
                self.binds.clear();
                // The next trial's first wait must not inherit this one's work.
                self.settle()?;
                Ok(Served::Done)
            }
            Request::Sync => {
                self.settle()?;
                Ok(Served::Done)
            }
        }
    }

    /// Records that a streamed job failed: what was recorded is dropped,
    /// and nothing runs until the host has heard ([`Reply::Lost`]).
    fn fail(&mut self, why: String) {
        self.failed.get_or_insert(why);
        self.discard_recorded();
    }

    /// Drops what was recorded and not submitted, with its ring slots.
    fn discard_recorded(&mut self) {
        self.pending.clear();
        self.slots = 0;
    }

    /// Submits what was recorded, in one command buffer; nothing once a
    /// streamed job has failed.
    fn flush(&mut self) {
        if self.failed.is_some() {
            self.discard_recorded();
        }
        let slots = std::mem::take(&mut self.slots) as usize;
        if self.pending.is_empty() {
            return;
        }
        let ops = std::mem::take(&mut self.pending);
        let submitted = self.checked(|gpu| {
            // The batch's parameters in one write, which lands before the
            // batch's commands.
            let used = slots * gpu.stride as usize;
            if used > 0 {
                gpu.queue
                    .write_buffer(&gpu.params, 0, &gpu.staged_params[..used]);
            }
            let mut encoder = gpu.device.create_command_encoder(&Default::default());
            let mut ops = ops.iter().peekable();
            while let Some(op) = ops.next() {
                match op {
                    Op::Copy {
                        from,
                        from_offset,
                        to,
                        to_offset,
                        bytes,
                    } => encoder.copy_buffer_to_buffer(from, *from_offset, to, *to_offset, *bytes),
                    Op::Kernel { .. } => {
                        // Consecutive kernels share a pass; wgpu orders
                        // their reads after the writes before them.
                        let mut pass = encoder.begin_compute_pass(&Default::default());
                        let mut next = Some(op);
                        while let Some(Op::Kernel {
                            pipeline,
                            bind,
                            params,
                            groups,
                        }) = next
                        {
                            pass.set_pipeline(pipeline);
                            pass.set_bind_group(0, bind, &[*params]);
                            pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
                            next = ops.next_if(|op| matches!(op, Op::Kernel { .. }));
                        }
                    }
                }
            }
            gpu.queue.submit([encoder.finish()]);
        });
        if let Err(err) = submitted {
            self.fail(format!("the queued GPU work failed: {err}"));
        }
        // Frees what finished submissions held, without waiting.
        let _ = self.device.poll(wgpu::PollType::Poll);
    }

    fn buffer(&self, id: u32) -> Result<&wgpu::Buffer, ComputeError> {
        self.buffers
            .get(&id)
            .ok_or_else(|| ComputeError::BadHandle(format!("the GPU worker holds no buffer {id}")))
    }

    /// Runs `work` inside error scopes and reports what the device refused.
    fn checked<T>(&self, work: impl FnOnce(&Self) -> T) -> Result<T, ComputeError> {
        let memory = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let internal = self.device.push_error_scope(wgpu::ErrorFilter::Internal);
        let value = work(self);
        let internal = pollster::block_on(internal.pop());
        let validation = pollster::block_on(validation.pop());
        let memory = pollster::block_on(memory.pop());
        if let Some(err) = memory {
            return Err(ComputeError::Quota(format!(
                "the GPU is out of memory: {err}"
            )));
        }
        if let Some(err) = validation {
            return Err(ComputeError::Invalid(format!(
                "the GPU refused the job: {err}"
            )));
        }
        if let Some(err) = internal {
            return Err(ComputeError::Device(format!("the GPU failed: {err}")));
        }
        Ok(value)
    }

    /// Submits what was recorded and waits for everything submitted.
    fn settle(&mut self) -> Result<(), ComputeError> {
        self.flush();
        if let Some(why) = &self.failed {
            return Err(ComputeError::Device(why.clone()));
        }
        self.queue.submit([]);
        let (sender, done) = mpsc::channel();
        self.queue.on_submitted_work_done(move || {
            let _ = sender.send(());
        });
        self.wait_for(&done)
    }

    fn create(&mut self, id: u32, elements: u64, data: Option<&[f32]>) -> Result<(), ComputeError> {
        // Zero-length buffers cannot be bound; a 4-byte one stands in.
        let size = (elements * 4).max(4);
        let usage = wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_SRC
            | wgpu::BufferUsages::COPY_DST;
        // Created plainly and then written, both inside the error scopes:
        // wgpu's create_buffer_init panics when the memory is not there.
        let buffer = self.checked(|gpu| {
            let buffer = gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size,
                usage,
                mapped_at_creation: false,
            });
            if let Some(data) = data.filter(|d| !d.is_empty()) {
                gpu.queue
                    .write_buffer(&buffer, 0, protocol::f32_bytes(data));
            }
            buffer
        })?;
        self.buffers.insert(id, buffer);
        Ok(())
    }

    fn read(&mut self, id: u32, offset: u64, len: u64) -> Result<Vec<f32>, ComputeError> {
        if len == 0 {
            return Ok(Vec::new());
        }
        let from = self.buffer(id)?.clone();
        let bytes = len * 4;
        let staging = self.staging(bytes)?;
        // The copy goes in the same submission as the kernels before it.
        self.pending.push(Op::Copy {
            from,
            from_offset: offset * 4,
            to: staging.clone(),
            to_offset: 0,
            bytes,
        });
        self.flush();
        if let Some(why) = &self.failed {
            return Err(ComputeError::Device(why.clone()));
        }
        let slice = staging.slice(..bytes);
        let (sender, mapped) = mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |result| {
            let _ = sender.send(result);
        });
        self.wait_for(&mapped)?
            .map_err(|e| ComputeError::Device(format!("mapping the read buffer: {e}")))?;
        let data = {
            let view = slice
                .get_mapped_range()
                .map_err(|e| ComputeError::Device(format!("reading the mapped buffer: {e}")))?;
            bytemuck::pod_collect_to_vec(&view)
        };
        staging.unmap();
        Ok(data)
    }

    /// A buffer to read `bytes` back through: the one kept from the last
    /// read where it is large enough, as making one costs more than a small
    /// read; reads past [`KEPT_STAGING`] get one of their own.
    fn staging(&mut self, bytes: u64) -> Result<wgpu::Buffer, ComputeError> {
        if let Some(kept) = self.staging.as_ref().filter(|kept| kept.size() >= bytes) {
            return Ok(kept.clone());
        }
        let size = if bytes <= KEPT_STAGING {
            bytes.next_power_of_two().clamp(1 << 16, KEPT_STAGING)
        } else {
            bytes
        };
        let staging = self.checked(|gpu| {
            gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("read"),
                size,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        })?;
        if size <= KEPT_STAGING {
            self.staging = Some(staging.clone());
        }
        Ok(staging)
    }

    /// Waits until the device signals on `done`. On a hardware GPU it
    /// polls without sleeping for a while first: a small job finishes in
    /// microseconds, sooner than a blocked thread wakes up.
    fn wait_for<T>(&self, done: &mpsc::Receiver<T>) -> Result<T, ComputeError> {
        let failed = |e| ComputeError::Device(format!("waiting for the GPU: {e}"));
        if !self.adapter.software {
            let spin_until = Instant::now() + SPIN;
            while Instant::now() < spin_until {
                if let Ok(value) = done.try_recv() {
                    return Ok(value);
                }
                self.device.poll(wgpu::PollType::Poll).map_err(failed)?;
            }
        }
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(failed)?;
        done.recv()
            .map_err(|_| ComputeError::Device("the GPU never signalled the end of a job".into()))
    }

    /// Records a built-in kernel.
    fn run(&mut self, kernel: &Kernel) -> Result<(), ComputeError> {
        let mut params = Params::default();
        let (entry, a, b, out, groups) = match *kernel {
            Kernel::Copy {
                src,
                src_offset,
                dst,
                dst_offset,
                len,
            } => return self.copy(src, src_offset, dst, dst_offset, len),
            Kernel::Matmul { a, b, out, spec } => {
                params.m = spec.m;
                params.nn = spec.n;
                params.k = spec.k;
                params.s0 = spec.alpha;
                params.s1 = spec.beta;
                params.flags = if spec.transpose_a { TRANSPOSE_A } else { 0 }
                    | if spec.transpose_b { TRANSPOSE_B } else { 0 };
                let software = self.adapter.software;
                super::bounds::check_matmul_tiles(&spec, self.adapter.max_workgroups, software)?;
                let kernel = MatmulKernel::for_spec(&spec, software);
                let tile = kernel.tile();
                let groups = [spec.n.div_ceil(tile), spec.m.div_ceil(tile), 1];
                (kernel.entry_point(), Some(a), Some(b), out, groups)
            }
            Kernel::Unary { op, x, out, n } => {
                params.op = unary_code(op);
                let groups = self.elementwise(&mut params, n)?;
                ("unary", Some(x), None, out, groups)
            }
            Kernel::Binary { op, a, b, out, n } => {
                params.op = binary_code(op);
                let groups = self.elementwise(&mut params, n)?;
                ("binary", Some(a), Some(b), out, groups)
            }
            Kernel::BinaryRows {
                op,
                x,
                row,
                out,
                rows,
                cols,
            } => {
                let n = rows as u64 * cols as u64;
                params.op = binary_code(op);
                params.cols = cols;
                let groups = self.elementwise(&mut params, n)?;
                ("binary_rows", Some(x), Some(row), out, groups)
            }
            Kernel::Affine {
                x,
                out,
                n,
                scale,
                shift,
            } => {
                params.s0 = scale;
                params.s1 = shift;
                let groups = self.elementwise(&mut params, n)?;
                ("affine", Some(x), None, out, groups)
            }
            Kernel::Axpy { alpha, x, y, n } => {
                params.s0 = alpha;
                let groups = self.elementwise(&mut params, n)?;
                ("axpy", Some(x), None, y, groups)
            }
            Kernel::Reduce {
                op,
                along,
                x,
                out,
                rows,
                cols,
            } => {
                params.op = match op {
                    Reduce::Sum => 0,
                    Reduce::Mean => 1,
                    Reduce::Max => 2,
                    Reduce::Min => 3,
                };
                let (outputs, len, outer, inner) = match along {
                    Axis::Rows => (rows, cols, cols, 1),
                    Axis::Cols => (cols, rows, 1, cols),
                };
                params.n = outputs;
                params.len = len;
                params.outer = outer;
                params.inner = inner;
                ("reduce", Some(x), None, out, self.grid(outputs as u64)?)
            }
            Kernel::Softmax { x, out, rows, cols } => {
                self.count(rows as u64 * cols as u64)?;
                params.n = rows;
                params.cols = cols;
                ("softmax", Some(x), None, out, self.grid(rows as u64)?)
            }
        };
        if groups.contains(&0) {
            return Ok(());
        }
        // An input that is the output is read through `out` (see
        // kernels.wgsl); `spare` is bound in its place.
        let mut input = |id: Option<u32>, flag: u32| match id {
            Some(id) if id == out => {
                params.flags |= flag;
                0
            }
            Some(id) => id,
            None => 0,
        };
        let key = [input(a, A_IS_OUT), input(b, B_IS_OUT), out];
        let bind = self.bind_group(key)?;
        if self.slots == RING {
            self.flush();
        }
        let offset = self.slots as u64 * self.stride;
        let at = offset as usize;
        self.staged_params[at..at + PARAMS_BYTES as usize]
            .copy_from_slice(bytemuck::bytes_of(&params));
        self.slots += 1;
        self.pending.push(Op::Kernel {
            pipeline: self.builtin[entry].clone(),
            bind,
            params: offset as u32,
            groups,
        });
        Ok(())
    }

    /// The bind group of a built-in kernel over buffers `key` (`[a, b,
    /// out]`, 0 for `spare`), made once and kept until one is freed.
    fn bind_group(&mut self, key: [u32; 3]) -> Result<wgpu::BindGroup, ComputeError> {
        if let Some(bind) = self.binds.get(&key) {
            return Ok(bind.clone());
        }
        let buffer = |id| match id {
            0 => Ok(&self.spare),
            id => self.buffer(id),
        };
        let (a, b, out) = (buffer(key[0])?, buffer(key[1])?, buffer(key[2])?);
        let bind = self.checked(|gpu| {
            gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: None,
                layout: &gpu.layout,
                entries: &[
                    wgpu::BindGroupEntry {
                        binding: 0,
                        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                            buffer: &gpu.params,
                            offset: 0,
                            size: NonZeroU64::new(PARAMS_BYTES),
                        }),
                    },
                    entry_of(1, a),
                    entry_of(2, b),
                    entry_of(3, out),
                ],
            })
        })?;
        if self.binds.len() >= MAX_BINDS {
            self.binds.clear();
        }
        self.binds.insert(key, bind.clone());
        Ok(bind)
    }

    fn submit(&self, pipeline: &wgpu::ComputePipeline, bind: &wgpu::BindGroup, groups: [u32; 3]) {
        let mut encoder = self.device.create_command_encoder(&Default::default());
        {
            let mut pass = encoder.begin_compute_pass(&Default::default());
            pass.set_pipeline(pipeline);
            pass.set_bind_group(0, bind, &[]);
            pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
        }
        self.queue.submit([encoder.finish()]);
    }

    /// Records a copy; through a temporary buffer within one buffer, as
    /// WebGPU copies between distinct buffers only.
    fn copy(&mut self, src: u32, s0: u64, dst: u32, d0: u64, len: u64) -> Result<(), ComputeError> {
        if len == 0 {
            return Ok(());
        }
        let (from, to) = (self.buffer(src)?.clone(), self.buffer(dst)?.clone());
        let bytes = len * 4;
        let temp = (src == dst)
            .then(|| {
                self.checked(|gpu| {
                    gpu.device.create_buffer(&wgpu::BufferDescriptor {
                        label: Some("copy"),
                        size: bytes,
                        usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
                        mapped_at_creation: false,
                    })
                })
            })
            .transpose()?;
        let mut copy = |from, from_offset, to, to_offset| {
            self.pending.push(Op::Copy {
                from,
                from_offset,
                to,
                to_offset,
                bytes,
            })
        };
        let Some(temp) = temp else {
            copy(from, s0 * 4, to, d0 * 4);
            if self.pending.len() >= RING as usize {
                self.flush();
            }
            return Ok(());
        };
        copy(from, s0 * 4, temp.clone(), 0);
        copy(temp, 0, to, d0 * 4);
        // The temporary is not in the trial's quota: sent and waited for at
        // once, so that one lives at a time, not one per queued copy.
        self.flush();
        let _ = self.device.poll(wgpu::PollType::wait_indefinitely());
        Ok(())
    }

    /// Sets `params.n` for an element-wise kernel over `n` elements and
    /// returns its grid of [`GROUP`]-invocation workgroups.
    fn elementwise(&self, params: &mut Params, n: u64) -> Result<[u32; 3], ComputeError> {
        params.n = self.count(n)?;
        self.grid(n.div_ceil(GROUP as u64))
    }

    /// Element counts the kernels index with `u32`.
    fn count(&self, n: u64) -> Result<u32, ComputeError> {
        u32::try_from(n).map_err(|_| {
            ComputeError::Invalid(format!("{n} elements are more than a GPU kernel indexes"))
        })
    }

    /// `groups` workgroups as a 2-D grid within the per-dimension limit.
    fn grid(&self, groups: u64) -> Result<[u32; 3], ComputeError> {
        let max = self.adapter.max_workgroups.max(1) as u64;
        let x = groups.min(max);
        let y = if x == 0 { 0 } else { groups.div_ceil(x) };
        if y > max {
            return Err(ComputeError::Invalid(format!(
                "{groups} workgroups are more than this GPU dispatches at once"
            )));
        }
        Ok([x as u32, y as u32, 1])
    }

    fn create_pipeline(
        &mut self,
        id: u32,
        wgsl: &str,
        entry_point: &str,
    ) -> Result<PipelineInfo, ComputeError> {
        let parsed = naga::front::wgsl::parse_str(wgsl)
            .map_err(|e| ComputeError::Shader(e.emit_to_string_with_path(wgsl, "shader.wgsl")))?;
        let entry = parsed
            .entry_points
            .iter()
            .find(|e| e.name == entry_point)
            .ok_or_else(|| {
                let names: Vec<&str> = parsed
                    .entry_points
                    .iter()
                    .map(|e| e.name.as_str())
                    .collect();
                ComputeError::Shader(format!(
                    "the shader has no entry point {entry_point:?} (it has {names:?})"
                ))
            })?;
        if entry.stage != naga::ShaderStage::Compute {
            return Err(ComputeError::Shader(format!(
                "entry point {entry_point:?} is not a @compute function"
            )));
        }
        // Fuel is charged per invocation, so the workgroup size must be
        // known here; one set by an override is not.
        if entry.workgroup_size_overrides.is_some() {
            return Err(ComputeError::Shader(format!(
                "entry point {entry_point:?} sets its @workgroup_size with an override; \
                 use constants"
            )));
        }
        let info = PipelineInfo {
            workgroup_size: entry.workgroup_size,
        };
        // Module and pipeline in one set of error scopes: the first error,
        // whichever step made it, is the shader's.
        let pipeline = self
            .checked(|gpu| {
                let module = gpu
                    .device
                    .create_shader_module(wgpu::ShaderModuleDescriptor {
                        label: Some("shader.wgsl"),
                        source: wgpu::ShaderSource::Wgsl(wgsl.into()),
                    });
                gpu.device
                    .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                        label: Some(entry_point),
                        layout: None,
                        module: &module,
                        entry_point: Some(entry_point),
                        compilation_options: Default::default(),
                        cache: None,
                    })
            })
            .map_err(|err| match err {
                ComputeError::Invalid(message) => ComputeError::Shader(message),
                other => other,
            })?;
        self.pipelines.insert(id, Custom { pipeline });
        Ok(info)
    }

    fn dispatch(
        &mut self,
        id: u32,
        bindings: &[u32],
        groups: [u32; 3],
    ) -> Result<(), ComputeError> {
        let custom = self.pipelines.get(&id).ok_or_else(|| {
            ComputeError::BadHandle(format!("the GPU worker holds no pipeline {id}"))
        })?;
        super::bounds::check_workgroups(groups, self.adapter.max_workgroups)?;
        let buffers = bindings
            .iter()
            .map(|&b| self.buffer(b))
            .collect::<Result<Vec<_>, _>>()?;
        if groups.contains(&0) {
            return Ok(());
        }
        self.checked(|gpu| {
            let layout = custom.pipeline.get_bind_group_layout(0);
            let entries: Vec<_> = buffers
                .iter()
                .enumerate()
                .map(|(i, buffer)| entry_of(i as u32, buffer))
                .collect();
            let bind = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: None,
                layout: &layout,
                entries: &entries,
            });
            gpu.submit(&custom.pipeline, &bind, groups);
        })?;
        self.settle()
    }
}

/// The driver and its version, from wgpu's two fields.
fn driver(info: &wgpu::AdapterInfo) -> String {
    format!("{} {}", info.driver, info.driver_info)
        .trim()
        .to_string()
}

/// Which of the Vulkan adapters `found` (type and PCI bus id, in the
/// driver's order) host compute uses, in the order trials are placed on
/// them: those of the best kind present only (discrete GPUs; else
/// integrated; else virtual or other; else software), so trials that
/// share out GPUs get alike ones, never an integrated GPU or lavapipe
/// beside a discrete GPU. An adapter listed twice (two drivers for one
/// device) counts once, by its PCI bus id.
fn usable(found: &[(wgpu::DeviceType, String)]) -> Vec<usize> {
    use wgpu::DeviceType::*;
    let rank = |kind: &wgpu::DeviceType| match kind {
        DiscreteGpu => 0,
        IntegratedGpu => 1,
        VirtualGpu | Other => 2,
        Cpu => 3,
    };
    let Some(best) = found.iter().map(|(kind, _)| rank(kind)).min() else {
        return Vec::new();
    };
    let mut buses = std::collections::HashSet::new();
    found
        .iter()
        .enumerate()
        .filter(|(_, (kind, bus))| rank(kind) == best && (bus.is_empty() || buses.insert(bus)))
        .map(|(i, _)| i)
        .collect()
}

fn entry_of(binding: u32, buffer: &wgpu::Buffer) -> wgpu::BindGroupEntry<'_> {
    wgpu::BindGroupEntry {
        binding,
        resource: buffer.as_entire_binding(),
    }
}

fn unary_code(op: Unary) -> u32 {
    match op {
        Unary::Relu => 0,
        Unary::Sigmoid => 1,
        Unary::Tanh => 2,
        Unary::Exp => 3,
        Unary::Log => 4,
        Unary::Neg => 5,
        Unary::Abs => 6,
        Unary::Sqrt => 7,
        Unary::Square => 8,
        Unary::Recip => 9,
    }
}

fn binary_code(op: Binary) -> u32 {
    match op {
        Binary::Add => 0,
        Binary::Sub => 1,
        Binary::Mul => 2,
        Binary::Div => 3,
        Binary::Max => 4,
        Binary::Min => 5,
        Binary::ReluBackward => 6,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wgpu::DeviceType::{Cpu, DiscreteGpu, IntegratedGpu, VirtualGpu};

    fn gpu() -> LocalGpu {
        LocalGpu::open().expect("a Vulkan adapter (scripts/setup.sh installs software Vulkan)")
    }

    fn create(gpu: &mut LocalGpu, id: u32, data: &[f32]) {
        let request = Request::Create {
            id,
            elements: data.len() as u64,
            from_payload: true,
        };
        assert_eq!(
            gpu.handle(request, protocol::f32_bytes(data)).0,
            Reply::Done
        );
    }

    fn read(gpu: &mut LocalGpu, id: u32, len: u64) -> (Reply, Vec<f32>) {
        let offset = 0;
        gpu.handle(Request::Read { id, offset, len }, &[])
    }

    #[test]
    fn recorded_kernels_see_writes_and_parameters_in_the_order_they_came() {
        let mut gpu = gpu();
        create(&mut gpu, 1, &[1.0, 2.0, 3.0, 4.0]);
        create(&mut gpu, 2, &[0.0; 4]);
        create(&mut gpu, 3, &[0.0; 4]);
        let affine = |out, scale| {
            Request::Run(Kernel::Affine {
                x: 1,
                out,
                n: 4,
                scale,
                shift: 0.0,
            })
        };
        gpu.handle(affine(2, 2.0), &[]);
        // Lands after the kernel before it, not before the batch.
        let write = Request::Write { id: 1, offset: 0 };
        gpu.handle(write, protocol::f32_bytes(&[10.0; 4]));
        gpu.handle(affine(3, 3.0), &[]);
        // More kernels than the ring has parameter slots, each its own alpha.
        let n = RING + 100;
        for i in 0..n {
            let alpha = if i % 2 == 0 { 1.0 } else { 2.0 };
            let axpy = Kernel::Axpy {
                alpha,
                x: 1,
                y: 3,
                n: 4,
            };
            assert_eq!(gpu.handle(Request::Run(axpy), &[]).0, Reply::Done);
        }
        assert_eq!(
            read(&mut gpu, 2, 4),
            (Reply::Done, vec![2.0, 4.0, 6.0, 8.0])
        );
        let expected = 30.0 + 10.0 * (n / 2 * 3) as f32;
        assert_eq!(read(&mut gpu, 3, 4), (Reply::Done, vec![expected; 4]));
    }

    #[test]
    fn a_streamed_job_that_fails_is_reported_to_the_next_answered_request() {
        let mut gpu = gpu();
        create(&mut gpu, 1, &[1.0; 4]);
        // The host checks handles before it streams a kernel, so one naming
        // a buffer the worker lacks means the two disagree: the worker
        // stops rather than run on.
        let bad = Kernel::Unary {
            op: Unary::Neg,
            x: 9,
            out: 1,
            n: 4,
        };
        assert_eq!(gpu.handle(Request::Run(bad), &[]).0, Reply::Done);
        let skipped = Kernel::Unary {
            op: Unary::Neg,
            x: 1,
            out: 1,
            n: 4,
        };
        gpu.handle(Request::Run(skipped), &[]);
        match read(&mut gpu, 1, 4).0 {
            Reply::Lost(why) => assert_eq!(
                why,
                "a unary kernel failed: bad handle: the GPU worker holds no buffer 9"
            ),
            other => panic!("{other:?}"),
        }
        assert!(matches!(gpu.handle(Request::Sync, &[]).0, Reply::Lost(_)));
        // Cleared, the worker serves the next trial.
        assert_eq!(gpu.handle(Request::Reset, &[]).0, Reply::Done);
        create(&mut gpu, 1, &[1.0; 4]);
        assert_eq!(read(&mut gpu, 1, 4), (Reply::Done, vec![1.0; 4]));
    }

    fn found(list: &[(wgpu::DeviceType, &str)]) -> Vec<(wgpu::DeviceType, String)> {
        list.iter().map(|(k, b)| (*k, b.to_string())).collect()
    }

    #[test]
    fn only_the_best_kind_of_adapter_is_used_in_the_drivers_order() {
        let machine = found(&[
            (IntegratedGpu, "0000:00:02.0"),
            (DiscreteGpu, "0000:41:00.0"),
            (Cpu, ""),
            (DiscreteGpu, "0000:01:00.0"),
        ]);
        assert_eq!(usable(&machine), [1, 3]);
        let laptop = found(&[(Cpu, ""), (IntegratedGpu, "0000:00:02.0")]);
        assert_eq!(usable(&laptop), [1]);
        let ci = found(&[(Cpu, "")]);
        assert_eq!(usable(&ci), [0]);
        let cloud = found(&[(Cpu, ""), (VirtualGpu, "")]);
        assert_eq!(usable(&cloud), [1]);
        assert!(usable(&[]).is_empty());
    }

    #[test]
    fn a_device_listed_by_two_drivers_counts_once() {
        let machine = found(&[
            (DiscreteGpu, "0000:01:00.0"),
            (DiscreteGpu, "0000:01:00.0"),
            (DiscreteGpu, "0000:02:00.0"),
        ]);
        assert_eq!(usable(&machine), [0, 2]);
        // Without bus ids nothing can be told apart, so all are kept.
        let unknown = found(&[(DiscreteGpu, ""), (DiscreteGpu, "")]);
        assert_eq!(usable(&unknown), [0, 1]);
    }
}
