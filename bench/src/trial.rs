//! One trial at a time: start latency (`startup`), the example's training
//! step against native code (`step`), and host snapshots (`snapshot`).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};
use wtune::exec::WasmBackend;
use wtune::report::TrialFiles;
use wtune::sandbox::{Limits, Program, fuel_text, human_bytes};
use wtune::tune::{Callback, Fifo, Runner, Trial};
use wtune_guest::Trainable;

use crate::report::{Summary, quantile};
use crate::{plain_wasm, scratch, trial_env};

fn p50_p99(times: &[Duration]) -> String {
    let mut sorted = times.to_vec();
    sorted.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    format!(
        "{:.3} | {:.3} | {:.3}–{:.3}",
        ms(quantile(&sorted, 0.5)),
        ms(quantile(&sorted, 0.99)),
        ms(quantile(&sorted, 0.1)),
        ms(quantile(&sorted, 0.9))
    )
}

/// Stamps each trial's start and first result, as the runner reports them.
#[derive(Clone, Default)]
struct StartClock(Arc<Mutex<ClockState>>);

#[derive(Default)]
struct ClockState {
    started: Vec<Option<Instant>>,
    latencies: Vec<Duration>,
}

impl Callback for StartClock {
    fn on_trial_start(&mut self, _trials: &[Trial], index: usize) -> Result<(), String> {
        let mut state = self.0.lock().unwrap();
        if state.started.len() <= index {
            state.started.resize(index + 1, None);
        }
        state.started[index] = Some(Instant::now());
        Ok(())
    }

    fn on_result(
        &mut self,
        _trials: &[Trial],
        index: usize,
        _result: &Map<String, Value>,
    ) -> Result<(), String> {
        let mut state = self.0.lock().unwrap();
        if let Some(started) = state.started.get_mut(index).and_then(Option::take) {
            state.latencies.push(started.elapsed());
        }
        Ok(())
    }
}

/// Issue 3: trial start latency, instantiate to first result, p50 and p99.
pub fn startup(program: &Program) {
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

    // The same through the runner, one trial at a time: from the trial's
    // start (before its directory and files are made) to its first result
    // being recorded.
    crate::experiment::settle();
    let clock = StartClock::default();
    let spec = crate::experiment::bench_spec(
        "startup",
        &dir.path().join("runner"),
        vec![json!({"attack": "none", "iterations": 1}); TRIALS],
        1,
        1,
    );
    let backend = WasmBackend::new(program.clone(), limits.clone(), vec![]);
    let runner = Runner::new(backend, spec, Box::new(Fifo::default()))
        .callback(clock.clone())
        .callback(TrialFiles::new());
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(runner.run())
        .unwrap();
    let through_runner = clock.0.lock().unwrap().latencies.clone();
    assert_eq!(through_runner.len(), TRIALS);

    out!("\n### Trial start latency ({TRIALS} trials of `hostile.wasm` `none`, one at a time)\n");
    out!("| from start to | p50 (ms) | p99 (ms) | p10–p90 (ms) |\n| --- | --- | --- | --- |");
    out!(
        "| instance ready (store, WASI context, log files) | {} |",
        p50_p99(&instantiate)
    );
    out!(
        "| first result: instantiate + `setup` + first `train` | {} |",
        p50_p99(&first_result)
    );
    out!(
        "| first result recorded, through the runner with result files (trial directory, `params.json`, files, instantiate, `setup`, `train`, the result's record) | {} |",
        p50_p99(&through_runner)
    );
}

/// Issue 1: the digits example's training step, native against wasm
/// without instrumentation, wasm with fuel (wtune) and wasm with its math
/// on the host's compute kernels, once per backend in `host_math` (its
/// label and the example loaded in a sandbox on that backend).
pub fn step(program: &Program, wasm: &Path, data: &Path, host_math: &[(String, Program)]) {
    const STEPS: usize = 15;
    let config = json!({"lr": 0.05, "hidden": 64, "batch_size": 32, "momentum": 0.9});

    let mut native_config: digits_mlp::Config = serde_json::from_value(config.clone()).unwrap();
    native_config.data_dir = data.display().to_string();
    let mut native = digits_mlp::DigitsMlp::from_config(&native_config).unwrap();
    let native_times: Vec<Duration> = (0..STEPS)
        .map(|_| {
            let started = Instant::now();
            native.train().unwrap();
            started.elapsed()
        })
        .collect();

    let plain = plain_wasm::train_times(wasm, &[("digits", data)], &config.to_string(), STEPS);

    let dir = scratch();
    let env = trial_env(dir.path(), vec![("digits".into(), PathBuf::from(data))]);
    let in_sandbox = |program: &Program, config: &Value| {
        let mut instance = program.instantiate(&env, &Limits::default()).unwrap();
        instance.setup(&config.to_string()).unwrap();
        let mut times = Vec::new();
        let mut fuel = Vec::new();
        for _ in 0..STEPS {
            let (_, stats) = instance.train().unwrap();
            times.push(stats.elapsed);
            fuel.push(stats.fuel);
        }
        fuel.sort();
        (times, fuel[STEPS / 2])
    };
    let (metered, wasm_fuel) = in_sandbox(program, &config);
    let mut host_config = config.clone();
    host_config["math"] = json!("host");

    let native = Summary::ms(&native_times);
    let row = |name: String, times: &[Duration]| {
        let s = Summary::ms(times);
        out!(
            "| {name} | {} | {:.2} |",
            s.cell(2),
            s.median / native.median
        );
    };
    out!(
        "\n### The digits example's training step (one epoch + validation, hidden 64, batch 32; {STEPS} steps)\n"
    );
    out!(
        "Issue 7's target: the example with fuel metering on within 1.2x of native. The example experiment as shipped (`examples/digits-mlp/experiment.toml`) sets `math = \"host\"`: the last rows, one per compute backend (`compute = \"auto\"` picks the CPU kernels unless a hardware GPU is present).\n\n| build | step (ms) | vs native (medians) |\n| --- | --- | --- |"
    );
    row("native (the same Rust code, release)".into(), &native_times);
    match plain {
        Ok(times) => row(
            "wasm32-wasip2 in plain wasmtime, no fuel, no epoch checks".into(),
            &times,
        ),
        Err(e) => out!(
            "| wasm32-wasip2 in plain wasmtime | not measured: {} | - |",
            format!("{e:#}").replace('\n', " ")
        ),
    }
    row(
        format!(
            "wasm32-wasip2 in wtune, fuel on ({} fuel/step)",
            fuel_text(wasm_fuel)
        ),
        &metered,
    );
    for (backend, program) in host_math {
        let (host, host_fuel) = in_sandbox(program, &host_config);
        row(
            format!(
                "wasm32-wasip2 in wtune, `math = \"host\"` on {backend} ({} fuel/step)",
                fuel_text(host_fuel)
            ),
            &host,
        );
    }
}

fn gbps(bytes: u64, times: &[Duration]) -> String {
    let gb = bytes as f64 / 1e9;
    Summary::ms(times).map(|ms| gb / (ms / 1e3)).cell(2)
}

/// Issue 4: snapshot and restore bandwidth and size on disk.
pub fn snapshot(program: &Program) {
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
    out!("\n### Host snapshots (`stateful.wasm`, {ROUNDS} rounds)\n");
    out!(
        "Random memory is the worst case: nothing is zero, nothing compresses. \"restore\" \
         includes creating the fresh instance it lands in. The plain copy into freshly \
         allocated memory (small pages, the kernel's faults and zeroing) is what a \
         restore would cost at least without the huge pages it asks for over each \
         2 MiB block it fills. \"checkpoint\" is what a trial's checkpoint costs: the \
         memories compressed straight into a spool file, then laid out into the \
         snapshot file (fsync included).\n"
    );
    out!(
        "| memory | size | snapshot (GB/s) | restore (GB/s) | plain copy into fresh memory (GB/s) | encode + write (ms) | checkpoint (ms) | file |\n| --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    for (name, config) in cases {
        let dir = scratch();
        let env = trial_env(dir.path(), vec![]);
        let mut instance = program.instantiate(&env, &limits).unwrap();
        instance.setup(&config.to_string()).unwrap();
        let (mut take, mut restore, mut write) = (Vec::new(), Vec::new(), Vec::new());
        let mut checkpoint = Vec::new();
        let mut image = None;
        let mut file = 0;
        for _ in 0..ROUNDS {
            let started = Instant::now();
            let taken = instance.snapshot().unwrap();
            take.push(started.elapsed());

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
            write.push(started.elapsed());

            let started = Instant::now();
            let path = dir.path().join("c.wtsnap");
            let spool = wtune::snapshot::Spool::beside(&path).unwrap();
            let (layout, spool) = instance.snapshot_into(spool).unwrap();
            wtune::snapshot::write_spooled(&path, &meta, &layout, spool, None).unwrap();
            checkpoint.push(started.elapsed());

            let started = Instant::now();
            let restored = program.restore(&env, &limits, &taken, 0, 0).unwrap();
            restore.push(started.elapsed());
            drop(restored);
            image = Some(taken);
        }
        let size = image.unwrap().memory_bytes();
        out!(
            "| {name} | {} | {} | {} | {} | {} | {} | {} |",
            human_bytes(size),
            gbps(size, &take),
            gbps(size, &restore),
            gbps(size, &fresh_copies(size as usize, ROUNDS)),
            Summary::ms(&write).cell(1),
            Summary::ms(&checkpoint).cell(1),
            human_bytes(file)
        );
    }
}

/// `rounds` copies of `size` bytes into freshly allocated memory: what a
/// restore's writes would cost at least on this machine with small pages,
/// since a restored instance's memory is fresh and every page is touched
/// first by the copy (the kernel's page faults and zeroing, not wtune's
/// work).
fn fresh_copies(size: usize, rounds: usize) -> Vec<Duration> {
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
        .collect()
}
