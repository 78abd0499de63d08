//! wtune's benchmarks. Prints Markdown tables for BENCHMARKS.md.
//!
//! ```text
//! bash scripts/setup.sh                       # builds the guest components
//! cargo run --release -p wtune-bench -- all   # or one of the names below
//! ```
//!
//! - `startup`: instantiate-to-first-result latency of one trial (fresh
//!   store, WASI context and log files, `setup`, first `train`), p50/p99.
//! - `overhead`: wall time per trial of 1,000 trials that report once and do
//!   no work, through the real runner with result files on; once in the
//!   sandbox, once with plain-Rust trainables to isolate the runner.
//! - `step`: one training step (epoch + validation) of the digits example,
//!   natively and as wasm with fuel metering, and their ratio.
//! - `snapshot`: host snapshot and restore of 1, 64 and 512 MiB memories
//!   filled with random data (the worst case), and of a 64 MiB memory that
//!   is mostly untouched heap: in-memory GB/s each way, file size and the
//!   time to encode (zstd + checksum) and write it.
//! - `state`: 10,000 trials (20 iterations of 2 ms each, 32 at a time) with
//!   and without `experiment_state.json` persistence: the wall-time
//!   difference, and the share of the run spent serializing state on the
//!   runner's thread.
//! - `decisions [NAME]`: per-call cost of every scheduler and searcher
//!   (those whose name contains NAME) with 10,000 trials, driven directly by
//!   a loop that calls them as the runner does (no runner, no sandbox), and
//!   the size and cost of their `state()`.
//! - `compute`: squaring an `n x n` matrix (512, 1024, 2048) on the CPU
//!   compute backend called directly, through the guest interface, and in
//!   plain wasm with fuel; and the interface's cost per call.
//! - `compute-gpu` (also part of `compute`): the same products on the wgpu
//!   backend, in process against through the interface and worker.
//! - `compile`: loading a component with no cache, compiled in the host
//!   process against in `wtune compile-worker`, and a cache hit.
//! - `compare`: ASHA against random search (FIFO) at equal total fuel
//!   (`stop_experiment.max_fuel`): on the digits example in the sandbox
//!   (best `val_accuracy` reached, 10 seeds), and on the native replay of
//!   `CurveSet::synthetic()` (regret against its known optimum, 200 seeds).

mod compare;
mod compile;
mod compute;
mod decisions;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wtune::exec::WasmBackend;
use wtune::report::{ExperimentFile, StateFile, TrialFiles};
use wtune::sandbox::{Limits, Program, Sandbox, SandboxOptions, TrialEnv};
use wtune::tune::{Fifo, FnBackend, Mode, RunSpec, Runner, Step, StopCriteria, TrialBackend};
use wtune_guest::Trainable;

/// Scratch space for trial directories. Not /tmp: on these machines /tmp
/// makes file creation ~15x slower than the work disk (3 ms vs 0.2 ms for a
/// directory with three files), which would measure the disk, not wtune.
fn scratch() -> tempfile::TempDir {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/wtune-bench-scratch");
    std::fs::create_dir_all(&base).unwrap();
    tempfile::tempdir_in(base).unwrap()
}

/// A trial's filesystem under `dir`: `dir/work` for the guest (created),
/// `dir` for the logs.
fn trial_env(dir: &Path, data: Vec<(String, PathBuf)>) -> TrialEnv {
    let work_dir = dir.join("work");
    std::fs::create_dir_all(&work_dir).unwrap();
    TrialEnv {
        work_dir,
        log_dir: dir.to_path_buf(),
        data,
    }
}

fn main() {
    let what = std::env::args().nth(1).unwrap_or_else(|| "all".into());
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf();
    let sandbox = Sandbox::new(SandboxOptions {
        cache_dir: Some(root.join("target/wtune-bench-cache")),
        ..Default::default()
    })
    .expect("engine");
    let guest = |name: &str| -> Program {
        let path = root
            .join("target/wasm32-wasip2/release")
            .join(format!("{name}.wasm"));
        sandbox
            .load(&path)
            .unwrap_or_else(|e| panic!("{e} (run `bash scripts/setup.sh` first)"))
    };
    println!(
        "machine: {} cores; wtune {}",
        cores(),
        env!("CARGO_PKG_VERSION")
    );
    if matches!(what.as_str(), "all" | "startup") {
        startup(&guest("hostile"));
    }
    if matches!(what.as_str(), "all" | "overhead") {
        overhead(&guest("hostile"));
    }
    if matches!(what.as_str(), "all" | "step") {
        step(
            &guest("digits_mlp"),
            &root.join("examples/digits-mlp/data"),
            sandbox.compute().kind,
        );
    }
    if matches!(what.as_str(), "all" | "snapshot") {
        snapshot(&guest("stateful"));
    }
    if matches!(what.as_str(), "all" | "state") {
        state_writes();
    }
    if matches!(what.as_str(), "all" | "decisions") {
        decisions::run(std::env::args().nth(2).as_deref());
    }
    if matches!(what.as_str(), "all" | "compute") {
        compute::run(&guest("kernels"));
    }
    if matches!(what.as_str(), "all" | "compute" | "compute-gpu") {
        compute::run_gpu(&root.join("target/wasm32-wasip2/release/kernels.wasm"));
    }
    if matches!(what.as_str(), "all" | "compile") {
        compile::run(&root);
    }
    if matches!(what.as_str(), "all" | "compare") {
        compare::replay();
        compare::digits(&root, &guest("digits_mlp"));
    }
}

fn state_writes() {
    const TRIALS: usize = 10_000;
    const ITERATIONS: u64 = 20;
    const CONCURRENT: usize = 32;
    let step_time = Duration::from_millis(2);
    println!(
        "\n### Experiment state persistence ({TRIALS} trials x {ITERATIONS} iterations of {} ms, {CONCURRENT} at a time)\n",
        step_time.as_millis()
    );
    println!(
        "| run | wall (s) | state writes | state size | serializing on the runner thread |\n| --- | --- | --- | --- | --- |"
    );
    let backend = move || {
        FnBackend::new(move |config: &Value| {
            let x = config["x"].as_f64().unwrap_or(0.0);
            Ok(move |it: u64| {
                std::thread::sleep(step_time);
                Ok(Step {
                    metrics: vec![
                        ("score".into(), x * it as f64),
                        ("loss".into(), 1.0 / (1.0 + x * it as f64)),
                    ],
                    done: false,
                    fuel: 1_000_000,
                })
            })
        })
    };
    let run = |with_state: bool| {
        let dir = scratch();
        let spec = RunSpec {
            name: "state".into(),
            output_dir: dir.path().join("out"),
            metric: Some("score".into()),
            mode: Mode::Max,
            stop: StopCriteria {
                training_iteration: Some(ITERATIONS),
                ..Default::default()
            },
            max_concurrent: CONCURRENT,
            configs: (0..TRIALS)
                .map(|i| json!({"x": i as f64 / TRIALS as f64, "name": format!("config-{i}")}))
                .collect(),
            checkpoint: Default::default(),
            failure: Default::default(),
            restore_from: None,
            resources_per_trial: Default::default(),
            resources: Default::default(),
            stop_experiment: Default::default(),
        };
        let mut runner = Runner::new(backend(), spec, Box::new(Fifo::default()));
        let mut stats = None;
        if with_state {
            let state = StateFile::new(json!({"bench": true}));
            stats = Some(state.stats());
            runner = runner.callback(state);
        }
        let started = Instant::now();
        tokio::runtime::Runtime::new()
            .unwrap()
            .block_on(runner.run())
            .unwrap();
        let wall = started.elapsed();
        let size =
            std::fs::metadata(dir.path().join("out/experiment_state.json")).map_or(0, |m| m.len());
        (wall, stats, size)
    };
    let (without, _, _) = run(false);
    println!(
        "| runner alone | {:.2} | - | - | - |",
        without.as_secs_f64()
    );
    let (with, stats, size) = run(true);
    let stats = stats.unwrap();
    let serialize = Duration::from_nanos(
        stats
            .serialize_ns
            .load(std::sync::atomic::Ordering::Relaxed),
    );
    println!(
        "| runner + experiment_state.json | {:.2} ({:+.2}%) | {} + final | {} | {:.1} ms ({:.2}% of wall) |",
        with.as_secs_f64(),
        (with.as_secs_f64() / without.as_secs_f64() - 1.0) * 100.0,
        stats.writes.load(std::sync::atomic::Ordering::Relaxed),
        wtune::sandbox::human_bytes(size),
        serialize.as_secs_f64() * 1e3,
        serialize.as_secs_f64() / with.as_secs_f64() * 100.0
    );
}

fn gbps(bytes: u64, d: Duration) -> String {
    format!("{:.2}", bytes as f64 / d.as_secs_f64() / 1e9)
}

fn snapshot(program: &Program) {
    const ROUNDS: usize = 5;
    let limits = Limits {
        memory_bytes: 1 << 30,
        fuel_per_call: None,
        call_timeout: None,
        ..Limits::default()
    };
    let cases = [
        ("1 MiB random", json!({"buffer_kib": 1 << 10})),
        ("64 MiB random", json!({"buffer_kib": 64 << 10})),
        ("512 MiB random", json!({"buffer_kib": 512 << 10})),
        (
            "64 MiB, mostly untouched heap",
            json!({"buffer_kib": 64, "reserve_mib": 64}),
        ),
    ];
    println!("\n### Host snapshots (stateful.wasm, best of {ROUNDS})\n");
    println!(
        "| memory | size | snapshot (GB/s) | restore (GB/s) | plain copy into fresh memory (GB/s) | encode + write (ms) | file |\n| --- | --- | --- | --- | --- | --- | --- |"
    );
    for (name, config) in cases {
        let dir = scratch();
        let env = trial_env(dir.path(), vec![]);
        let mut instance = program.instantiate(&env, &limits).unwrap();
        instance.setup(&config.to_string()).unwrap();
        let (mut take, mut restore, mut write) = (Duration::MAX, Duration::MAX, Duration::MAX);
        let mut image = None;
        let mut file = 0;
        for _ in 0..ROUNDS {
            let started = Instant::now();
            let taken = instance.snapshot().unwrap();
            take = take.min(started.elapsed());

            let meta = wtune::snapshot::SnapshotMeta {
                component: program.digest().into(),
                trial_id: "bench".into(),
                config: config.clone(),
                iteration: 0,
                fuel_total: 0,
                time_total_s: 0.0,
                result: Value::Null,
            };
            let taken = wtune::snapshot::Payload::Memory(taken);
            let started = Instant::now();
            file =
                wtune::snapshot::write(&dir.path().join("s.wtsnap"), &meta, &taken, None).unwrap();
            let wtune::snapshot::Payload::Memory(taken) = taken else {
                unreachable!("written as a memory snapshot")
            };
            write = write.min(started.elapsed());

            // Restoring includes creating the fresh instance it lands in.
            let started = Instant::now();
            let restored = program.restore(&env, &limits, &taken, 0, 0).unwrap();
            restore = restore.min(started.elapsed());
            drop(restored);
            image = Some(taken);
        }
        let image = image.unwrap();
        let size = image.memory_bytes();
        println!(
            "| {name} | {} | {} | {} | {} | {} | {} |",
            wtune::sandbox::human_bytes(size),
            gbps(size, take),
            gbps(size, restore),
            gbps(size, fresh_copy(size as usize, ROUNDS)),
            ms(write),
            wtune::sandbox::human_bytes(file)
        );
    }
}

/// Best time of `rounds` copies of `size` bytes into freshly allocated
/// memory: what a restore's writes cost at least on this machine, since a
/// restored instance's memory is fresh and every page is touched first by
/// the copy (the kernel's page faults and zeroing, not wtune's work).
fn fresh_copy(size: usize, rounds: usize) -> Duration {
    let source = vec![0x5au8; size];
    (0..rounds)
        .map(|_| {
            let mut fresh = vec![0u8; size];
            let started = Instant::now();
            fresh.copy_from_slice(&source);
            let took = started.elapsed();
            std::hint::black_box(&fresh);
            took
        })
        .min()
        .unwrap_or(Duration::MAX)
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1e3)
}

fn startup(program: &Program) {
    const TRIALS: usize = 300;
    let dir = scratch();
    let limits = Limits::default();
    let mut instantiate = Vec::with_capacity(TRIALS);
    let mut first_result = Vec::with_capacity(TRIALS);
    for i in 0..TRIALS {
        let env = trial_env(&dir.path().join(format!("t{i}")), vec![]);
        let started = Instant::now();
        let mut instance = program.instantiate(&env, &limits).unwrap();
        instantiate.push(started.elapsed());
        instance.setup(r#"{"attack":"none"}"#).unwrap();
        instance.train().unwrap();
        first_result.push(started.elapsed());
    }
    instantiate.sort();
    first_result.sort();
    println!("\n### Trial start latency ({TRIALS} trials, hostile.wasm `none`)\n");
    println!("| stage | p50 (ms) | p99 (ms) |\n| --- | --- | --- |");
    println!(
        "| instantiate (store, WASI, log files) | {} | {} |",
        ms(percentile(&instantiate, 0.5)),
        ms(percentile(&instantiate, 0.99))
    );
    println!(
        "| instantiate + setup + first train | {} | {} |",
        ms(percentile(&first_result, 0.5)),
        ms(percentile(&first_result, 0.99))
    );
}

fn run_experiment<B: TrialBackend>(backend: B, trials: usize, out: &Path, files: bool) -> Duration {
    let spec = RunSpec {
        name: "overhead".into(),
        output_dir: out.to_path_buf(),
        metric: Some("score".into()),
        mode: Mode::Max,
        stop: StopCriteria {
            training_iteration: Some(1),
            ..Default::default()
        },
        max_concurrent: cores(),
        configs: vec![json!({"attack": "none", "iterations": 1}); trials],
        checkpoint: Default::default(),
        failure: Default::default(),
        restore_from: None,
        resources_per_trial: Default::default(),
        resources: Default::default(),
        stop_experiment: Default::default(),
    };
    let mut runner = Runner::new(backend, spec, Box::new(Fifo::default()));
    if files {
        runner = runner
            .callback(TrialFiles::new())
            .callback(ExperimentFile::new(Value::Null));
    }
    let started = Instant::now();
    let summary = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(runner.run())
        .unwrap();
    let wall = started.elapsed();
    assert_eq!(summary.count(wtune::tune::TrialStatus::Terminated), trials);
    wall
}

fn overhead(program: &Program) {
    const TRIALS: usize = 1000;
    const REPEATS: usize = 3;
    println!(
        "\n### Runner overhead ({TRIALS} trials that report once and do no work, result files on, {} at a time)\n",
        cores()
    );
    println!(
        "| backend | wall time per run (s), median of {REPEATS} | per trial (ms) |\n| --- | --- | --- |"
    );
    let measure = |name: &str, run: &mut dyn FnMut(&Path) -> Duration| {
        let mut walls: Vec<Duration> = (0..REPEATS)
            .map(|_| {
                let dir = scratch();
                run(&dir.path().join("out"))
            })
            .collect();
        walls.sort();
        let median = walls[REPEATS / 2];
        println!(
            "| {name} | {:.3} (min {:.3}, max {:.3}) | {:.3} |",
            median.as_secs_f64(),
            walls[0].as_secs_f64(),
            walls[REPEATS - 1].as_secs_f64(),
            median.as_secs_f64() * 1e3 / TRIALS as f64
        );
    };
    measure("wasm sandbox (hostile.wasm `none`)", &mut |out| {
        let backend = WasmBackend::new(program.clone(), Limits::default(), vec![]);
        run_experiment(backend, TRIALS, out, true)
    });
    let no_work = || {
        FnBackend::new(|_: &Value| {
            Ok(|_: u64| {
                Ok(Step {
                    metrics: vec![("score".into(), 1.0)],
                    done: true,
                    fuel: 0,
                })
            })
        })
    };
    measure("plain Rust (FnBackend): runner + files", &mut |out| {
        run_experiment(no_work(), TRIALS, out, true)
    });
    measure(
        "plain Rust (FnBackend): runner alone, no files",
        &mut |out| run_experiment(no_work(), TRIALS, out, false),
    );
    // What the file system alone charges for the files a sandboxed trial
    // gets, measured in the same minute: on a VM whose file creation cost
    // swings, the rows above are only comparable to this one.
    measure(
        "file system floor: what the files cost without wtune",
        &mut |out| file_floor(TRIALS, out),
    );
}

/// The file operations of `TRIALS` sandboxed trials that report once, done
/// by a plain loop on as many threads as trials run at once: per trial a
/// directory and its `work/` directory, `params.json`, `result.jsonl` and
/// `progress.csv` with one line each.
fn file_floor(trials: usize, out: &Path) -> Duration {
    std::fs::create_dir_all(out).unwrap();
    let started = Instant::now();
    std::thread::scope(|scope| {
        for thread in 0..cores() {
            scope.spawn(move || {
                for i in (thread..trials).step_by(cores()) {
                    let dir = out.join(format!("trial_{i:04}"));
                    std::fs::create_dir_all(dir.join("work")).unwrap();
                    std::fs::write(dir.join("params.json"), b"{\"attack\": \"none\"}").unwrap();
                    std::fs::write(dir.join("result.jsonl"), b"{\"score\": 1.0}\n").unwrap();
                    std::fs::write(dir.join("progress.csv"), b"score\n1.0\n").unwrap();
                }
            });
        }
    });
    started.elapsed()
}

fn step(program: &Program, data: &Path, backend: &str) {
    const STEPS: usize = 15;
    let config = json!({"lr": 0.05, "hidden": 64, "batch_size": 32, "momentum": 0.9});

    let mut native_config: digits_mlp::Config = serde_json::from_value(config.clone()).unwrap();
    native_config.data_dir = data.display().to_string();
    let mut native = digits_mlp::DigitsMlp::from_config(&native_config).unwrap();
    let mut native_times = Vec::new();
    for _ in 0..STEPS {
        let started = Instant::now();
        native.train().unwrap();
        native_times.push(started.elapsed());
    }

    let dir = scratch();
    let env = trial_env(dir.path(), vec![("digits".into(), PathBuf::from(data))]);
    // The guest's step with its math in wasm, then on the host's kernels.
    let in_sandbox = |config: &Value| {
        let mut instance = program.instantiate(&env, &Limits::default()).unwrap();
        instance.setup(&config.to_string()).unwrap();
        let mut times = Vec::new();
        let mut fuel = Vec::new();
        for _ in 0..STEPS {
            let (_, stats) = instance.train().unwrap();
            times.push(stats.elapsed);
            fuel.push(stats.fuel);
        }
        times.sort();
        fuel.sort();
        (percentile(&times, 0.5), fuel[STEPS / 2])
    };
    let (w, wasm_fuel) = in_sandbox(&config);
    let mut host_config = config.clone();
    host_config["math"] = json!("host");
    let (h, host_fuel) = in_sandbox(&host_config);
    native_times.sort();
    let n = percentile(&native_times, 0.5);
    println!(
        "\n### Digits example training step (one epoch + validation, hidden 64, batch 32; median of {STEPS})\n"
    );
    println!("| build | step (ms) | vs native |\n| --- | --- | --- |");
    println!("| native (same Rust code, release) | {} | 1.00 |", ms(n));
    println!(
        "| wasm32-wasip2 in wtune, fuel on ({} fuel/step) | {} | {:.2} |",
        wtune::sandbox::fuel_text(wasm_fuel),
        ms(w),
        w.as_secs_f64() / n.as_secs_f64()
    );
    println!(
        "| wasm32-wasip2 in wtune, `math = \"host\"` on the {} backend ({} fuel/step) | {} | {:.2} |",
        backend,
        wtune::sandbox::fuel_text(host_fuel),
        ms(h),
        h.as_secs_f64() / n.as_secs_f64()
    );
}
