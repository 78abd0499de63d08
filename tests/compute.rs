//! The host `compute` interface seen from a real guest: kernels match a
//! plain reference, misuse comes back to the guest as an error naming the
//! cause, host work is charged in fuel, and tensors survive host snapshots.

mod common;

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use wtune::compute::{ComputeMode, ComputeOptions};
use wtune::exec::WasmBackend;
use wtune::sandbox::{
    GuestReport, Limits, Program, Sandbox, SandboxOptions, TrialEnv, TrialFault, TrialInstance,
};
use wtune::tune::{Fifo, PoolSpec, Resources, RunSpec, Runner, StopCriteria, TrialStatus};

fn env(dir: &Path) -> TrialEnv {
    common::trial_env(dir, vec![])
}

fn load_with(name: &str, compute: ComputeOptions) -> Program {
    let sandbox = Sandbox::new(SandboxOptions {
        compute,
        ..SandboxOptions::default()
    })
    .unwrap();
    sandbox.load(&common::guest(name)).unwrap()
}

fn program_with(compute: ComputeOptions) -> Program {
    load_with("kernels", compute)
}

/// `name` on the CPU backend, which `auto` would pass over for a hardware GPU.
fn cpu_program(name: &str) -> Program {
    let cpu = ComputeOptions {
        mode: ComputeMode::Cpu,
        ..ComputeOptions::default()
    };
    load_with(name, cpu)
}

fn started(program: &Program, dir: &Path, limits: &Limits, config: Value) -> TrialInstance {
    let mut instance = program.instantiate(&env(dir), limits).unwrap();
    instance.setup(&config.to_string()).unwrap();
    instance
}

fn metric(report: &GuestReport, name: &str) -> f64 {
    report
        .metrics
        .iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no metric {name} in {:?}", report.metrics))
        .1
}

/// The kernels guest's `check` call: its report and the `err_*` metrics.
fn kernel_check(program: &Program) -> (GuestReport, Vec<(String, f64)>) {
    let dir = tempfile::tempdir().unwrap();
    let config = json!({"check": true});
    let mut trial = started(program, dir.path(), &Limits::default(), config);
    let (report, _) = trial.train().unwrap();
    let errors = report
        .metrics
        .iter()
        .filter(|(name, _)| name.starts_with("err_"))
        .cloned()
        .collect();
    (report, errors)
}

#[test]
fn every_kernel_matches_the_reference_through_the_interface() {
    // The CPU backend's check; `auto` would pick a hardware GPU where there
    // is one, whose check (with a custom shader) is the GPU test's.
    let (report, errors) = kernel_check(&cpu_program("kernels"));
    // 4 small and 4 big matmuls, 10 unary, 7 binary twice, row, axpy,
    // affine, 8 reductions, softmax, non-finite scalars.
    assert_eq!(errors.len(), 8 + 10 + 14 + 3 + 8 + 1 + 1, "{errors:?}");
    for (name, err) in errors {
        assert!(err <= 1e-5, "{name}: {err}");
    }
    assert_eq!(metric(&report, "backend_is_cpu"), 1.0);
}

#[test]
fn misuse_is_an_error_the_guest_receives_and_the_host_survives() {
    let dir = tempfile::tempdir().unwrap();
    let compute = ComputeOptions {
        mode: ComputeMode::Cpu,
        trial_quota: 128 << 20,
        total_quota: 1 << 30,
    };
    let program = program_with(compute);
    let cases = [
        ("freed", "BadHandle(\"buffer 4 was freed\")"),
        ("quota", "would pass its quota of 128 MiB"),
        ("huge", "larger than the largest this backend allows"),
        ("outside", "elements 2..6 are outside buffer"),
        ("shader", "custom WGSL shaders need a GPU backend"),
        (
            "shape",
            "out (buffer 5) has 1 elements; m * n = 16 are needed",
        ),
    ];
    // Fuel enough for every case, but not for the 2^24 workgroups of
    // `dispatch` (about 1.7e10 at 64 invocations each): a refused dispatch
    // must be refused before it is charged.
    let limits = Limits {
        fuel_per_call: Some(5_000_000_000),
        ..Limits::default()
    };
    for (misuse, expected) in cases {
        let mut trial = started(&program, dir.path(), &limits, json!({"misuse": misuse}));
        match trial.train() {
            Err(TrialFault::GuestError { message, .. }) => {
                assert!(
                    message.starts_with(&format!("misuse {misuse}: ")),
                    "{message}"
                );
                assert!(message.contains(expected), "{misuse}: {message}");
            }
            other => panic!("{misuse}: {other:?}"),
        }
    }
    // A read the guest's memory could not hold is refused before the host
    // reads anything, not answered into a trap in the guest's allocator.
    let small = Limits {
        memory_bytes: 48 << 20,
        ..limits.clone()
    };
    let mut trial = started(&program, dir.path(), &small, json!({"misuse": "big_read"}));
    match trial.train() {
        Err(TrialFault::GuestError { message, .. }) => assert!(
            message.contains(
                "a read of 64 MiB is more than the guest's memory (48 MiB, limits.memory) can hold"
            ),
            "{message}"
        ),
        other => panic!("big_read: {other:?}"),
    }
    // The host is undisturbed: a trial after them computes correctly.
    let (_, errors) = kernel_check(&program);
    assert!(!errors.is_empty() && errors.iter().all(|(_, e)| *e <= 1e-5));

    // A refused call still pays for the bytes the host copied out of the
    // guest to refuse it: 1 GiB of refused writes costs 2^26 fuel, past
    // this limit; without the charge they cost the guest next to nothing.
    let limits = Limits {
        fuel_per_call: Some(40_000_000),
        ..Limits::default()
    };
    let mut trial = started(
        &program,
        dir.path(),
        &limits,
        json!({"misuse": "refused_writes"}),
    );
    match trial.train() {
        Err(fault @ TrialFault::FuelPerCall { .. }) => {
            assert!(fault.to_string().contains("train()"), "{fault}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn host_compute_is_charged_in_fuel_and_cannot_overspend() {
    let dir = tempfile::tempdir().unwrap();
    let program = common::load("kernels");
    let small = json!({"width": 8});
    let heavy = json!({"width": 8, "matmul": 256});
    let mut a = started(&program, dir.path(), &Limits::default(), small);
    let mut b = started(&program, dir.path(), &Limits::default(), heavy.clone());
    let (_, light) = a.train().unwrap();
    let (_, loaded) = b.train().unwrap();
    // 2 * 256^3 flops are charged on top of the wasm work.
    let flops = 2 * 256u64.pow(3);
    assert!(
        loaded.fuel > light.fuel + flops,
        "{} vs {}",
        loaded.fuel,
        light.fuel
    );

    // A per-call limit the matmul cannot fit in ends the call out of fuel,
    // as any instruction the guest cannot pay for does.
    let limits = Limits {
        fuel_per_call: Some(flops / 2),
        ..Limits::default()
    };
    let mut c = started(&program, dir.path(), &limits, heavy);
    match c.train() {
        Err(fault @ TrialFault::FuelPerCall { .. }) => {
            assert!(fault.to_string().contains("fuel"), "{fault}");
        }
        other => panic!("{other:?}"),
    }
}

/// Trains 3 calls, snapshots, and checks that a restored instance's next 3
/// calls equal the original's; returns the snapshot.
fn continues_after_restore(
    program: &Program,
    dir: &Path,
    config: &Value,
) -> wtune::snapshot::GuestImage {
    let mut original = started(program, dir, &Limits::default(), config.clone());
    for _ in 0..3 {
        original.train().unwrap();
    }
    let image = original.snapshot().unwrap();
    assert_eq!(image.compute.buffers.len(), 3, "state, weights, bias");
    let expected: Vec<GuestReport> = (0..3).map(|_| original.train().unwrap().0).collect();
    let restored_dir = dir.join("restored");
    std::fs::create_dir_all(&restored_dir).unwrap();
    let mut restored = program
        .restore(&env(&restored_dir), &Limits::default(), &image, 3, 0)
        .unwrap();
    let continued: Vec<GuestReport> = (0..3).map(|_| restored.train().unwrap().0).collect();
    assert_eq!(continued, expected);
    image
}

#[test]
fn tensors_survive_a_host_snapshot_and_restore() {
    let dir = tempfile::tempdir().unwrap();
    let program = common::load("kernels");
    let config = json!({"width": 64, "iterations": 100});
    let image = continues_after_restore(&program, dir.path(), &config);

    // Through the file format too.
    let meta = wtune::snapshot::SnapshotMeta {
        component: program.digest().into(),
        trial_id: "t".into(),
        config,
        iteration: 3,
        fuel_total: 0,
        time_total_s: 0.0,
        result: Value::Null,
    };
    let bytes = wtune::snapshot::encode(
        &meta,
        &wtune::snapshot::Payload::Memory(image.clone()),
        None,
    );
    let (_, payload) = wtune::snapshot::decode(&bytes, program.digest(), None).unwrap();
    assert_eq!(payload, wtune::snapshot::Payload::Memory(image));
}

#[test]
fn a_restore_that_does_not_fit_the_quota_fails_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let program = common::load("kernels");
    let mut original = started(
        &program,
        dir.path(),
        &Limits::default(),
        json!({"width": 512}),
    );
    original.train().unwrap();
    let image = original.snapshot().unwrap();
    let small = program_with(ComputeOptions {
        mode: ComputeMode::Cpu,
        // Room for the 1 MiB weights, not for the state and bias beside them.
        trial_quota: (1 << 20) + 2048,
        total_quota: 1 << 30,
    });
    let err = small
        .restore(&env(dir.path()), &Limits::default(), &image, 1, 0)
        .err()
        .unwrap();
    assert!(
        err.to_string().contains("restoring compute buffers: quota"),
        "{err}"
    );
}

#[test]
fn a_call_spending_its_time_in_host_compute_ends_at_its_deadline() {
    // Whichever notices first ends the call: the epoch check in the guest's
    // own code between kernels, or the compute meter's deadline check
    // before the next kernel (unit-tested in compute::cost). A single
    // kernel is not interrupted; fuel bounds its size.
    // On the CPU backend, where kernels run as they are called; queued GPU
    // work past a deadline is the next test's.
    let dir = tempfile::tempdir().unwrap();
    let program = cpu_program("kernels");
    // Fuel is lifted so that the deadline is what ends the call.
    let limits = Limits {
        call_timeout: Some(Duration::from_millis(100)),
        fuel_per_call: None,
        ..Limits::default()
    };
    // Setup is quick; the 1,000 products of 512 x 512 matrices in the next
    // call take far longer than the deadline (50 took 73-99 ms here, too
    // close to it).
    let config = json!({"width": 8, "matmul": 512, "repeat": 1000});
    let mut slow = started(&program, dir.path(), &limits, config);
    match slow.train() {
        Err(fault @ TrialFault::Timeout { .. }) => {
            assert!(fault.to_string().contains("deadline"), "{fault}")
        }
        other => panic!("{other:?}"),
    }
}

// ----- the wgpu backend, on whatever Vulkan adapter exists (lavapipe in CI;
// scripts/setup.sh installs it) ------------------------------------------

/// The GPU backend on its own, for tests of sessions without a guest.
fn gpu_compute() -> wtune::compute::Compute {
    wtune::compute::Compute::new(ComputeOptions {
        mode: ComputeMode::Gpu,
        ..ComputeOptions::default()
    })
    .unwrap_or_else(|e| panic!("{e}"))
}

/// Guest `name` on the wgpu backend, with room for four trials' quotas
/// (the tests run up to two trials at once).
fn gpu_program(name: &str, trial_quota: u64) -> Program {
    let sandbox = Sandbox::new(SandboxOptions {
        compute: ComputeOptions {
            mode: ComputeMode::Gpu,
            trial_quota,
            total_quota: 4 * trial_quota,
        },
        ..SandboxOptions::default()
    })
    .unwrap_or_else(|e| {
        panic!("compute = \"gpu\" needs a Vulkan adapter (scripts/setup.sh installs one): {e}")
    });
    assert!(sandbox.compute().shaders);
    sandbox.load(&common::guest(name)).unwrap()
}

#[test]
fn a_session_on_a_gpu_that_does_not_exist_fails_its_first_job_naming_it() {
    let compute = gpu_compute();
    assert_eq!(compute.gpus(), 1, "lavapipe alone here");
    assert_eq!(compute.session_on(0).info(), compute.info());
    let mut missing = compute.session_on(1);
    // Its description stays the backend's: there is no GPU 1 to name.
    assert_eq!(missing.info(), compute.info());
    let err = missing.create(64).unwrap_err().to_string();
    assert!(
        err.contains(
            "a new GPU worker could not open GPU 1: GPU 1 does not exist: host compute uses 1 \
             Vulkan adapter here (numbered from 0)"
        ),
        "{err}"
    );
    assert_eq!(compute.used_bytes(), 0, "the refused buffer is not counted");
}

#[test]
fn each_trial_computes_on_the_gpu_the_runner_placed_it_on() {
    // Two half-GPU trials on a pool of two GPUs run on one each. This
    // machine has one Vulkan adapter and the pool is declared as a library
    // user may (`wtune run` refuses it: see `fit_gpu`), so the trial placed
    // on GPU 1 finds nothing there: it alone fails, naming that GPU.
    let out = tempfile::tempdir().unwrap();
    let spec = RunSpec {
        configs: vec![json!({"width": 8, "matmul": 64}); 2],
        max_concurrent: 2,
        stop: StopCriteria {
            training_iteration: Some(1),
            ..Default::default()
        },
        resources_per_trial: Resources {
            cpu: 0.5,
            gpu: 0.5,
            ..Resources::default()
        },
        resources: PoolSpec {
            gpu: Some(2.0),
            ..PoolSpec::default()
        },
        ..RunSpec::new("placement", out.path())
    };
    let backend = WasmBackend::new(gpu_program("kernels", 1 << 30), Limits::default(), vec![]);
    let summary = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(Runner::new(backend, spec, Box::new(Fifo::default())).run())
        .unwrap();
    let [first, second] = &summary.trials[..] else {
        panic!("{:?}", summary.trials)
    };
    assert_eq!(first.status, TrialStatus::Terminated, "{:?}", first.error);
    assert_eq!(second.status, TrialStatus::Error);
    let error = second.error.as_deref().unwrap();
    assert!(
        error.contains(
            "a new GPU worker could not open GPU 1: GPU 1 does not exist: host compute uses 1 \
             Vulkan adapter here (numbered from 0)"
        ),
        "{error}"
    );
}

#[test]
fn every_kernel_and_a_custom_shader_match_the_reference_on_the_gpu() {
    let (report, errors) = kernel_check(&gpu_program("kernels", 1 << 30));
    // The CPU's cases and the custom shader.
    assert_eq!(errors.len(), 8 + 10 + 14 + 3 + 8 + 1 + 1 + 1, "{errors:?}");
    for (name, err) in errors {
        // GPU exp, tanh and sums round differently from the CPU's.
        assert!(err <= 1e-4, "{name}: {err}");
    }
    assert_eq!(metric(&report, "backend_is_cpu"), 0.0);
    // The walk runs on the GPU too and agrees with the CPU's.
    let (cpu_report, _) = kernel_check(&cpu_program("kernels"));
    let (walk_gpu, walk_cpu) = (metric(&report, "walk"), metric(&cpu_report, "walk"));
    assert!(
        (walk_gpu - walk_cpu).abs() < 1e-3,
        "{walk_gpu} vs {walk_cpu}"
    );
}

#[test]
fn gpu_misuse_is_an_error_the_guest_receives() {
    let dir = tempfile::tempdir().unwrap();
    let program = gpu_program("kernels", 128 << 20);
    let cases = [
        ("freed", "BadHandle(\"buffer 4 was freed\")"),
        ("quota", "would pass its quota of 128 MiB"),
        ("huge", "larger than the largest this backend allows"),
        ("outside", "elements 2..6 are outside buffer"),
        (
            "shape",
            "out (buffer 5) has 1 elements; m * n = 16 are needed",
        ),
        ("tile", "matmul output is larger than this GPU can tile"),
        // The WGSL error is located: the file, line 4 and the column.
        ("bad_wgsl", "shader.wgsl:4:"),
        ("dispatch", "workgroups along one dimension is more than"),
        ("binding", "the GPU refused the job"),
        (
            "bindings",
            "a dispatch binds at most 32 buffers; 33 were given",
        ),
        (
            "entry",
            "an entry point name of 300 bytes is longer than the 256 allowed",
        ),
        ("override", "sets its @workgroup_size with an override"),
    ];
    // Fuel enough for every case, but not for the 2^24 workgroups of
    // `dispatch` (about 1.7e10 at 64 invocations each): a refused dispatch
    // must be refused before it is charged.
    let limits = Limits {
        fuel_per_call: Some(5_000_000_000),
        ..Limits::default()
    };
    for (misuse, expected) in cases {
        let mut trial = started(&program, dir.path(), &limits, json!({"misuse": misuse}));
        match trial.train() {
            Err(TrialFault::GuestError { message, .. }) => {
                assert!(message.contains(expected), "{misuse}: {message}");
            }
            other => panic!("{misuse}: {other:?}"),
        }
    }
}

/// The bystander's config: a walk that runs long.
fn bystander_config() -> Value {
    json!({"width": 32, "iterations": 100})
}

/// Held by the tests whose GPU work runs until a deadline kills it: on
/// software Vulkan that work takes every core, so two at once could starve
/// the other's setup past its own short deadline.
static DEADLINE_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A trial on `program` that has computed once, to check afterwards that
/// it was not touched; and limits that leave a call only `deadline` (no
/// fuel limit), for the trial whose GPU work the deadline must stop.
fn bystander_and_deadline(
    program: &Program,
    dir: &Path,
    deadline: Duration,
) -> (TrialInstance, Limits) {
    let mut bystander = started(program, dir, &Limits::default(), bystander_config());
    bystander.train().unwrap();
    let limits = Limits {
        fuel_per_call: None,
        fuel_per_trial: None,
        call_timeout: Some(deadline),
        ..Limits::default()
    };
    (bystander, limits)
}

#[test]
fn a_runaway_shader_is_killed_at_its_deadline_and_only_its_trial_fails() {
    let _alone = DEADLINE_TESTS.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let program = gpu_program("kernels", 1 << 30);
    // Fuel would refuse a dispatch this size up front; it is lifted so that
    // the deadline is what stops it.
    let (mut benign, limits) = bystander_and_deadline(&program, dir.path(), Duration::from_secs(2));
    let mut runaway = started(&program, dir.path(), &limits, json!({"misuse": "runaway"}));
    let began = std::time::Instant::now();
    // The trial ends at once, named after the job, even though the guest
    // would have received the error and could have carried on.
    match runaway.train() {
        Err(fault @ TrialFault::DeviceLost { .. }) => assert_eq!(
            fault.to_string(),
            "train() at iteration 1 lost its compute device: a dispatch of pipeline 1 over \
             65535x65535x1 workgroups, after 1 queued GPU job, ran past the guest call's deadline \
             (limits.call_timeout); its GPU worker process was killed, taking this trial's \
             device buffers with it"
        ),
        other => panic!("{other:?}"),
    }
    assert!(
        began.elapsed() < Duration::from_secs(60),
        "the worker was not killed promptly: {:?}",
        began.elapsed()
    );

    // The other trial's device state is intact: it continues exactly as a
    // trial that never saw the runaway.
    let continued: Vec<GuestReport> = (0..3).map(|_| benign.train().unwrap().0).collect();
    let mut fresh = started(&program, dir.path(), &Limits::default(), bystander_config());
    fresh.train().unwrap();
    let expected: Vec<GuestReport> = (0..3).map(|_| fresh.train().unwrap().0).collect();
    assert_eq!(continued, expected);
}

#[test]
fn queued_kernels_still_running_at_the_deadline_end_only_their_trial() {
    let _alone = DEADLINE_TESTS.lock().unwrap_or_else(|e| e.into_inner());
    // Kernels are streamed to the worker without waiting; the call waits
    // for them where it reads or its queue is full, and a worker still busy
    // at the call's deadline is killed. Fifty thousand products of 1024 x
    // 1024 matrices (107 TFLOP) outlast five seconds on any GPU (software
    // Vulkan does not finish the first few thousand queued).
    let dir = tempfile::tempdir().unwrap();
    let program = gpu_program("kernels", 1 << 30);
    // The deadline leaves the setup (a 1024 x 1024 matrix made in wasm, a
    // worker started) room on a loaded machine.
    let deadline = Duration::from_secs(5);
    let (mut benign, limits) = bystander_and_deadline(&program, dir.path(), deadline);
    let config = json!({"width": 8, "matmul": 1024, "repeat": 50_000});
    let mut heavy = started(&program, dir.path(), &limits, config);
    let began = std::time::Instant::now();
    match heavy.train() {
        Err(fault @ TrialFault::DeviceLost { .. }) => {
            let text = fault.to_string();
            assert!(
                text.contains("queued GPU jobs, ran past the guest call's deadline"),
                "{text}"
            );
        }
        // A GPU that keeps up with the guest leaves the deadline to the
        // check before each kernel.
        Err(fault @ TrialFault::Timeout { .. }) => {
            assert!(fault.to_string().contains("deadline"), "{fault}")
        }
        other => panic!("{other:?}"),
    }
    assert!(
        began.elapsed() < Duration::from_secs(15),
        "the call ended {:?} after it began, long past its deadline",
        began.elapsed()
    );
    // The other trial's buffers live in a worker of its own.
    benign.train().unwrap();
}

#[test]
fn streamed_kernels_cost_the_same_fuel_and_compute_the_same_as_the_cpu_backend() {
    let dir = tempfile::tempdir().unwrap();
    let config = json!({"width": 64, "tiny": 50, "iterations": 100});
    let calls = |program: &Program| -> Vec<(f64, u64)> {
        let mut trial = started(program, dir.path(), &Limits::default(), config.clone());
        (0..3)
            .map(|_| {
                let (report, stats) = trial.train().unwrap();
                (metric(&report, "walk"), stats.fuel)
            })
            .collect()
    };
    let (gpu, cpu) = (
        calls(&gpu_program("kernels", 1 << 30)),
        calls(&cpu_program("kernels")),
    );
    for ((walk_gpu, fuel_gpu), (walk_cpu, fuel_cpu)) in gpu.into_iter().zip(cpu) {
        assert_eq!(
            fuel_gpu, fuel_cpu,
            "fuel is charged on the host, by the same rule"
        );
        assert!(
            (walk_gpu - walk_cpu).abs() < 1e-3,
            "{walk_gpu} vs {walk_cpu}"
        );
    }
}

#[test]
fn pipeline_numbers_freed_before_a_snapshot_stay_unused_after_its_restore() {
    let compute = gpu_compute();
    let wgsl = "@compute @workgroup_size(1) fn main() {}";
    let mut before = compute.session();
    let freed = before.create_pipeline(wgsl, "main").unwrap();
    before.free_pipeline(freed).unwrap();
    let image = before.image().unwrap();
    let mut after = compute.session();
    after.restore(&image).unwrap();
    // A stale handle the guest kept must not come to name a new pipeline.
    assert!(after.create_pipeline(wgsl, "main").unwrap() > freed);
}

/// Software Vulkan ends loops after 65,535 iterations without a word:
/// kernels that would loop near that long are refused there, not answered
/// wrongly, and those within the budget are answered right.
#[test]
fn kernels_software_vulkan_would_cut_short_are_refused_there() {
    use wtune::compute::ComputeError;
    use wtune::compute::ops::{Axis, Matmul, Reduce};
    let compute = gpu_compute();
    if compute.loop_cap().is_none() {
        return; // a hardware GPU: no such cap
    }
    let mut s = compute.session();
    let refused = |result: Result<(), ComputeError>| match result {
        Err(ComputeError::Unsupported(m)) => {
            assert!(m.contains("more than the 60000 software Vulkan"), "{m}")
        }
        other => panic!("{other:?}"),
    };
    // A sum over 2^24 values: 65,536 + 8 iterations (lavapipe: 131,070).
    let long = s.create(4 << 24).unwrap();
    let one = s.create(4).unwrap();
    refused(s.reduce(Reduce::Sum, Axis::Rows, long, one, 1, 1 << 24));
    refused(s.reduce(Reduce::Max, Axis::Cols, long, one, 1 << 24, 1));
    // A softmax row of 20,000 x 256: 3 loops of 20,000 + 2 folds of 8.
    let row = 20_000 * 256;
    let out = s.create(4 * row as u64).unwrap();
    refused(s.softmax(long, out, 1, row));
    // A dot product over 960,016 values: 60,001 tiles of 16.
    let k = 960_016;
    let spec = Matmul {
        m: 1,
        n: 1,
        k,
        transpose_a: false,
        transpose_b: false,
        alpha: 1.0,
        beta: 0.0,
    };
    let other = s.create(4 << 24).unwrap();
    refused(s.matmul(long, other, one, spec));

    // A row of 19,994 x 256 (59,998) fits, and comes out right to its end.
    let row = 19_994 * 256;
    let ones = s.upload_f32(vec![1.0; row as usize]).unwrap();
    s.softmax(ones, out, 1, row).unwrap();
    let last = s.read_f32(out, row as u64 - 1, 1).unwrap()[0];
    assert!((last * row as f32 - 1.0).abs() < 1e-3, "{last}");
}

#[test]
fn gpu_tensors_survive_a_host_snapshot_and_restore() {
    let dir = tempfile::tempdir().unwrap();
    let program = gpu_program("kernels", 1 << 30);
    let config = json!({"width": 64, "iterations": 100});
    continues_after_restore(&program, dir.path(), &config);
}

// ----- the example model on the interface --------------------------------

/// `(train_loss, val_loss, val_accuracy)` of each of `epochs` epochs of the
/// digits example with `math`, on `program`'s backend.
fn digits_epochs(program: &Program, math: &str, epochs: usize) -> Vec<[f64; 3]> {
    let dir = tempfile::tempdir().unwrap();
    let data = vec![(
        "digits".to_string(),
        common::workspace().join("examples/digits-mlp/data"),
    )];
    let env = common::trial_env(dir.path(), data);
    let config = json!({"lr": 0.05, "hidden": 32, "batch_size": 32, "seed": 3, "math": math});
    let mut trial = program.instantiate(&env, &Limits::default()).unwrap();
    trial.setup(&config.to_string()).unwrap();
    (0..epochs)
        .map(|_| {
            let (report, _) = trial.train().unwrap();
            [
                metric(&report, "train_loss"),
                metric(&report, "val_loss"),
                metric(&report, "val_accuracy"),
            ]
        })
        .collect()
}

fn assert_close(host: &[[f64; 3]], wasm: &[[f64; 3]]) {
    for (epoch, (h, w)) in host.iter().zip(wasm).enumerate() {
        // Same data order and initial weights; only the order of the sums
        // differs, so the curves agree closely but not bit for bit.
        assert!((h[0] - w[0]).abs() < 1e-3, "epoch {epoch}: {h:?} vs {w:?}");
        assert!((h[1] - w[1]).abs() < 1e-3, "epoch {epoch}: {h:?} vs {w:?}");
        assert!(
            (h[2] - w[2]).abs() <= 2.0 / 360.0,
            "epoch {epoch}: {h:?} vs {w:?}"
        );
    }
}

#[test]
fn the_digits_model_learns_the_same_on_host_compute_as_in_wasm() {
    let program = common::load("digits_mlp");
    let wasm = digits_epochs(&program, "wasm", 3);
    let host = digits_epochs(&program, "host", 3);
    assert_close(&host, &wasm);
    assert!(host[2][2] > 0.9, "{host:?}");

    let gpu = gpu_program("digits_mlp", 1 << 30);
    assert_close(&digits_epochs(&gpu, "host", 3), &wasm);
}
