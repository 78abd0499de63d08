//! `compute`: the host compute interface. Squares an `n x n` f32 matrix
//! with the CPU backend called directly, through the interface from a wasm
//! guest, and in plain wasm with fuel metering; and the interface's cost per
//! call. Then the same on the GPU backend where a Vulkan adapter exists:
//! wgpu called in this process (no worker, no wasm) against the interface
//! from wasm (the guest's jobs cross to the worker process), with the CPU
//! backend beside them.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use std::path::Path;

use wtune::compute::device::Kernel;
use wtune::compute::gpu::LocalGpu;
use wtune::compute::gpu::protocol::{Reply, Request, f32_bytes};
use wtune::compute::{Compute, ComputeMode, ComputeOptions, ops::Matmul};
use wtune::sandbox::{Limits, Program, Sandbox, SandboxOptions, TrialInstance};

use crate::report::Summary;

const ROUNDS: usize = 3;

fn options() -> ComputeOptions {
    ComputeOptions {
        mode: ComputeMode::Cpu,
        trial_quota: 1 << 30,
        total_quota: 1 << 30,
    }
}

/// The median of `times`, with the spread for [`cell`].
fn median(times: Vec<Duration>) -> Timed {
    let mut sorted = times.clone();
    sorted.sort();
    Timed {
        median: sorted[sorted.len() / 2],
        times,
    }
}

/// Repeated timings of one product.
struct Timed {
    median: Duration,
    times: Vec<Duration>,
}

fn gflops(n: u64, d: Duration) -> String {
    format!("{:.1}", 2.0 * (n * n * n) as f64 / d.as_secs_f64() / 1e9)
}

/// `2.8 ms (2.7–3.0), 96.2 GFLOP/s`: median (p10–p90) and the median's
/// rate.
fn cell(n: u64, timed: &Timed) -> String {
    format!(
        "{} ms, {} GFLOP/s",
        Summary::ms(&timed.times).cell(1),
        gflops(n, timed.median)
    )
}

fn square(n: u32) -> Matmul {
    Matmul {
        m: n,
        n,
        k: n,
        transpose_a: false,
        transpose_b: false,
        alpha: 1.0,
        beta: 0.0,
    }
}

/// One matmul on the backend, no wasm involved.
fn direct(n: u32) -> Timed {
    let compute = Compute::cpu(options());
    let mut session = compute.session();
    let data: Vec<f32> = (0..n * n).map(|i| (i % 17) as f32 / 17.0).collect();
    let a = session.upload_f32(data).unwrap();
    let out = session.create(n as u64 * n as u64 * 4).unwrap();
    let spec = square(n);
    session.matmul(a, a, out, spec).unwrap(); // warm the thread pool
    median(
        (0..ROUNDS)
            .map(|_| {
                let start = Instant::now();
                session.matmul(a, a, out, spec).unwrap();
                start.elapsed()
            })
            .collect(),
    )
}

fn instance(program: &Program, config: Value) -> (TrialInstance, tempfile::TempDir) {
    let dir = super::scratch();
    let env = super::trial_env(dir.path(), vec![]);
    let limits = Limits {
        fuel_per_call: None,
        call_timeout: None,
        memory_bytes: 1 << 30,
        ..Limits::default()
    };
    let mut instance = program.instantiate(&env, &limits).unwrap();
    instance.setup(&config.to_string()).unwrap();
    (instance, dir)
}

/// Median time of one `train()` call with `config`, divided by `per`.
fn per_call(program: &Program, config: Value, rounds: usize, per: u32) -> (Timed, u64) {
    let (mut trial, _dir) = instance(program, config);
    trial.train().unwrap(); // warm-up
    let mut fuel = 0;
    let times = (0..rounds)
        .map(|_| {
            let start = Instant::now();
            let (_, stats) = trial.train().unwrap();
            fuel = stats.fuel;
            start.elapsed() / per
        })
        .collect();
    (median(times), fuel / per as u64)
}

/// What one one-element kernel call from wasm costs: a call making `tiny`
/// of them against one making none, per kernel; with `read`, each kernel
/// is followed by reading its one element back.
fn per_kernel_call(program: &Program, tiny: u32, read: bool) -> Duration {
    let (base, _) = per_call(program, json!({"width": 8}), 5, 1);
    let config = json!({"width": 8, "tiny": tiny, "tiny_read": read});
    let (with_tiny, _) = per_call(program, config, 5, 1);
    with_tiny.median.saturating_sub(base.median) / tiny
}

pub fn run(program: &Program) {
    let info = Compute::cpu(options()).info();
    out!(
        "\n### Host compute: square an n x n f32 matrix ({} backend on {})\n",
        info.kind,
        info.name
    );
    out!(
        "| n | CPU backend, called directly | through the interface, from wasm | plain wasm with fuel | interface speed-up over plain wasm | fuel per product (interface) |\n| --- | --- | --- | --- | --- | --- |"
    );
    for n in [512u32, 1024, 2048] {
        let n64 = n as u64;
        let direct = direct(n);
        let repeat = if n >= 2048 { 1 } else { 4 };
        let (through, fuel) = per_call(
            program,
            json!({"width": 8, "matmul": n, "repeat": repeat}),
            ROUNDS,
            repeat,
        );
        let (plain, ratio) = if n <= 1024 {
            let rounds = if n == 512 { ROUNDS } else { 1 };
            let (plain, _) = per_call(
                program,
                json!({"width": 8, "matmul": n, "in_wasm": true}),
                rounds,
                1,
            );
            (
                cell(n64, &plain),
                format!(
                    "{:.0}x",
                    plain.median.as_secs_f64() / through.median.as_secs_f64()
                ),
            )
        } else {
            ("not run (minutes)".into(), "-".into())
        };
        out!(
            "| {n} | {} | {} | {plain} | {ratio} | {:.2e} |",
            cell(n64, &direct),
            cell(n64, &through),
            fuel as f64
        );
    }

    const TINY: u32 = 20_000;
    let each = per_kernel_call(program, TINY, false);
    out!(
        "\nPer-call cost of the interface (a one-element kernel, from wasm, {TINY} calls): {:.2} µs\n",
        each.as_secs_f64() * 1e6
    );
}

/// One matmul with wgpu in this process: the worker's code without the
/// process boundary or the guest.
fn wgpu_direct(gpu: &mut LocalGpu, n: u32, rounds: usize) -> Timed {
    let data: Vec<f32> = (0..n * n).map(|i| (i % 17) as f32 / 17.0).collect();
    let elements = n as u64 * n as u64;
    let create = |id, from_payload| Request::Create {
        id,
        elements,
        from_payload,
    };
    assert_eq!(gpu.handle(create(1, true), f32_bytes(&data)).0, Reply::Done);
    assert_eq!(gpu.handle(create(2, false), &[]).0, Reply::Done);
    let job = || {
        Request::Run(Kernel::Matmul {
            a: 1,
            b: 1,
            out: 2,
            spec: square(n),
        })
    };
    // Kernels are recorded, not waited for: each round ends with a sync.
    gpu.handle(job(), &[]);
    assert_eq!(gpu.handle(Request::Sync, &[]).0, Reply::Done); // compiles lazily
    let time = median(
        (0..rounds)
            .map(|_| {
                let start = Instant::now();
                gpu.handle(job(), &[]);
                assert_eq!(gpu.handle(Request::Sync, &[]).0, Reply::Done);
                start.elapsed()
            })
            .collect(),
    );
    gpu.handle(Request::Reset, &[]);
    time
}

/// The GPU backend, where a Vulkan adapter exists.
pub fn run_gpu(guest: &Path) {
    let mut gpu = match LocalGpu::open() {
        Ok(gpu) => gpu,
        Err(reason) => {
            out!("\n### Host compute on the GPU: not measured ({reason})\n");
            return;
        }
    };
    let adapter = gpu.adapter().clone();
    let sandbox = Sandbox::new(SandboxOptions {
        compute: ComputeOptions {
            mode: ComputeMode::Gpu,
            ..options()
        },
        ..SandboxOptions::default()
    })
    .expect("a GPU sandbox");
    let program = sandbox.load(guest).expect("the kernels guest");
    out!(
        "\n### Host compute on the GPU: square an n x n f32 matrix ({}, {}, {})\n",
        adapter.name,
        adapter.device_type,
        adapter.driver
    );
    out!(
        "| n | wgpu in process | through the interface, from wasm (worker process) | interface overhead | CPU backend, called directly |\n| --- | --- | --- | --- | --- |"
    );
    // Software Vulkan takes about a minute per 2048 product: that size is
    // timed once there, after one product to warm up.
    let sizes: &[u32] = if adapter.software {
        &[256, 512, 1024, 2048]
    } else {
        &[512, 1024, 2048, 4096]
    };
    for &n in sizes {
        let rounds = if adapter.software && n >= 2048 {
            1
        } else {
            ROUNDS
        };
        let local = wgpu_direct(&mut gpu, n, rounds);
        let repeat = if rounds == 1 { 1 } else { 2 };
        let (through, _) = per_call(
            &program,
            json!({"width": 8, "matmul": n, "repeat": repeat}),
            rounds,
            repeat,
        );
        out!(
            "| {n} | {} | {} | {:+.1} ms | {} |",
            cell(n as u64, &local),
            cell(n as u64, &through),
            (through.median.as_secs_f64() - local.median.as_secs_f64()) * 1e3,
            cell(n as u64, &direct(n))
        );
    }
    const TINY: u32 = 2_000;
    let streamed = per_kernel_call(&program, TINY, false);
    let read_back = per_kernel_call(&program, TINY, true);
    out!(
        "\nPer-call cost on the GPU backend, from wasm ({TINY} calls): a one-element kernel {:.1} µs (streamed to the worker; the guest call waits once, at its end); a one-element kernel and a read of its result {:.1} µs (to the worker and back, waiting for the GPU)\n",
        streamed.as_secs_f64() * 1e6,
        read_back.as_secs_f64() * 1e6
    );
}
