//! Whole experiments through the real runner: bookkeeping overhead per
//! trial (`overhead`), result throughput (`throughput`) and the cost of
//! `experiment_state.json` (`state`).

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wtune::exec::WasmBackend;
use wtune::report::{ExperimentFile, Progress, StateFile, TrialFiles};
use wtune::sandbox::{Limits, Program};
use wtune::tune::{
    Fifo, FnBackend, Mode, Resources, RunSpec, Runner, Step, StopCriteria, TrialBackend,
    TrialStatus,
};

use crate::report::Summary;
use crate::{cores, scratch};

/// Which of `wtune run`'s callbacks an experiment gets.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Callbacks {
    /// None: the runner alone.
    None,
    /// `TrialFiles` only.
    ResultFiles,
    /// `TrialFiles` only, without TensorBoard event files (what they cost).
    ResultFilesWithoutTensorBoard,
    /// `TrialFiles` and `experiment.json`.
    Files,
    /// `wtune run`'s, but the progress reporter: the state file, the
    /// result files and `experiment.json`.
    AllButProgress,
    /// All of `wtune run`'s, the progress reporter writing plain lines (as
    /// when stderr is not a terminal).
    All,
}

/// CPU time (user + system, all threads) of this process so far.
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the command name, which is in parentheses and may
    // hold spaces; utime and stime are the 14th and 15th fields, in clock
    // ticks (100 per second on Linux).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    match (ticks(11), ticks(12)) {
        (Some(user), Some(system)) => Duration::from_millis((user + system) * 10),
        _ => Duration::ZERO,
    }
}

struct Ran {
    wall: Duration,
    cpu: Duration,
    results: u64,
}

/// The experiment every runner scenario runs: `configs` (one trial each)
/// to `iterations` iterations, `concurrent` at a time, FIFO, maximizing
/// `score`, into `out`.
pub fn bench_spec(
    name: &str,
    out: &Path,
    configs: Vec<Value>,
    iterations: u64,
    concurrent: usize,
) -> RunSpec {
    RunSpec {
        name: name.into(),
        output_dir: out.to_path_buf(),
        metric: Some("score".into()),
        mode: Mode::Max,
        stop: StopCriteria {
            training_iteration: Some(iterations),
            ..Default::default()
        },
        max_concurrent: concurrent,
        configs,
        checkpoint: Default::default(),
        failure: Default::default(),
        restore_from: None,
        // Trials ask nothing of the resource pool (by default one CPU
        // each, as many as there are cores): `max_concurrent` alone
        // says how many run at once.
        resources_per_trial: Resources::none(),
        resources: Default::default(),
        stop_experiment: Default::default(),
        result_order: Default::default(),
    }
}

/// Runs `configs` (one trial each) to `iterations` iterations, `concurrent`
/// at a time, with `callbacks`, into `out`.
fn run_experiment<B: TrialBackend>(
    backend: B,
    configs: Vec<Value>,
    iterations: u64,
    concurrent: usize,
    out: &Path,
    callbacks: Callbacks,
) -> Ran {
    let trials = configs.len();
    let spec = bench_spec("bench", out, configs, iterations, concurrent);
    let mut runner = Runner::new(backend, spec, Box::new(Fifo::default()));
    // In `wtune run`'s order.
    if matches!(callbacks, Callbacks::AllButProgress | Callbacks::All) {
        runner = runner.callback(StateFile::new(json!({"bench": true})));
    }
    if callbacks != Callbacks::None {
        let tensorboard = callbacks != Callbacks::ResultFilesWithoutTensorBoard;
        runner = runner.callback(TrialFiles::new().tensorboard(tensorboard));
    }
    if matches!(
        callbacks,
        Callbacks::Files | Callbacks::AllButProgress | Callbacks::All
    ) {
        runner = runner.callback(ExperimentFile::new(Value::Null));
    }
    if callbacks == Callbacks::All {
        runner = runner.callback(Progress::with_terminal(false).total(Some(trials as u64)));
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let cpu = cpu_time();
    let started = Instant::now();
    let summary = runtime.block_on(runner.run()).unwrap();
    let wall = started.elapsed();
    let cpu = cpu_time().saturating_sub(cpu);
    assert_eq!(summary.count(TrialStatus::Terminated), trials);
    Ran {
        wall,
        cpu,
        results: summary.trials.iter().map(|t| t.iterations).sum(),
    }
}

fn hostile(program: &Program) -> WasmBackend {
    WasmBackend::new(program.clone(), Limits::default(), vec![])
}

/// Trials that do no work: each step reports `score` and returns.
fn no_work(done: bool) -> FnBackend {
    FnBackend::new(move |_: &Value| {
        Ok(move |it: u64| {
            Ok(Step {
                metrics: vec![("score".into(), it as f64)],
                done,
                fuel: 0,
            })
        })
    })
}

/// One row of a table: an experiment run into the directory it is given.
type Case<'a, T> = Box<dyn FnMut(&Path) -> T + 'a>;

/// Writes back what earlier runs left to the disk (their deleted
/// directories included), so that it is not charged to the next run.
pub fn settle() {
    let _ = std::process::Command::new("sync").status();
}

/// Runs each case `repeats` times, round robin, so that a machine whose
/// speed drifts (this VM's file system does, by 2-5x within minutes) weighs
/// on every case alike; each run gets a fresh scratch directory, after
/// [`settle`], under `base` (the default scratch place when `None`).
/// Returns each case's results.
fn interleaved<T>(repeats: usize, base: Option<&Path>, cases: &mut [Case<'_, T>]) -> Vec<Vec<T>> {
    let mut results: Vec<Vec<T>> = cases.iter().map(|_| Vec::new()).collect();
    for _ in 0..repeats {
        for (case, results) in cases.iter_mut().zip(&mut results) {
            settle();
            let dir = base.map_or_else(scratch, crate::scratch_in);
            results.push(case(&dir.path().join("out")));
        }
    }
    results
}

/// Issue 2's bookkeeping overhead: many trials that report once and do no
/// work. Their ideal wall time is zero, so the overhead per trial is the
/// wall time over the number of trials. Run on the disk, then again on a
/// memory file system when there is one: this VM's disk charges more per
/// trial for the files alone than the target allows.
pub fn overhead(program: &Program) {
    const TRIALS: usize = 1000;
    const REPEATS: usize = 5;
    let concurrent = cores();
    out!(
        "\n### Bookkeeping overhead ({TRIALS} trials that report once and do no work, {concurrent} at a time, {REPEATS} runs of each row, interleaved)\n"
    );
    out!(
        "Overhead per trial = (wall time - ideal) / trials, where the ideal is 0: the trials \
         do no work. Issue 2's target: under 1 ms per trial with result files on. The last \
         row of each table is what the file system charges for the same directories and \
         files without wtune; the last column subtracts it from each row, round by round \
         (each round runs every row once, in a few seconds). The experiment directories are \
         on the disk (`target/`), then on a memory file system (`/dev/shm`, tmpfs) where the \
         machine has one.\n"
    );
    overhead_table(program, TRIALS, REPEATS, "the disk (`target/`)", None);
    match crate::memory_scratch() {
        Some(base) => {
            overhead_table(program, TRIALS, REPEATS, "tmpfs (`/dev/shm`)", Some(&base));
            let _ = std::fs::remove_dir_all(&base);
        }
        None => out!("\nOn tmpfs: not measured (no `/dev/shm` on this machine).\n"),
    }
}

/// One table of [`overhead`], with the experiment directories under `base`.
fn overhead_table(
    program: &Program,
    trials: usize,
    repeats: usize,
    place: &str,
    base: Option<&Path>,
) {
    let concurrent = cores();
    out!("\nOn {place}:\n");
    out!(
        "| backend, callbacks | overhead per trial (ms) | vs 1 ms | above the floor, per round (ms) |\n| --- | --- | --- | --- |"
    );
    let configs = || vec![json!({"attack": "none", "iterations": 1}); trials];
    let wasm = |callbacks| {
        move |out: &Path| {
            run_experiment(hostile(program), configs(), 1, concurrent, out, callbacks).wall
        }
    };
    let native = |callbacks| {
        move |out: &Path| {
            run_experiment(no_work(true), configs(), 1, concurrent, out, callbacks).wall
        }
    };
    let rows: [(&str, Case<Duration>); 5] = [
        (
            "wasm sandbox (`hostile.wasm` `none`), `wtune run`'s callbacks but progress (state file, result files, `experiment.json`)",
            Box::new(wasm(Callbacks::AllButProgress)),
        ),
        (
            "wasm sandbox, result files and `experiment.json`",
            Box::new(wasm(Callbacks::Files)),
        ),
        (
            "plain Rust (`FnBackend`), result files and `experiment.json`",
            Box::new(native(Callbacks::Files)),
        ),
        (
            "plain Rust, no callbacks (the runner alone)",
            Box::new(native(Callbacks::None)),
        ),
        (
            "file system floor: a trial's directories and files, without wtune",
            Box::new(|out: &Path| file_floor(trials, out)),
        ),
    ];
    let (names, mut cases): (Vec<&str>, Vec<_>) = rows.into_iter().unzip();
    let walls = interleaved(repeats, base, &mut cases);
    let floor = walls.last().expect("the floor's row").clone();
    for (i, (name, walls)) in names.iter().zip(&walls).enumerate() {
        let per_trial = Summary::ms(walls).map(|ms| ms / trials as f64);
        // Each row against the floor of the same round, minutes apart at
        // most: what wtune adds to what the file system charges anyway.
        let above = if i + 1 == names.len() || name.contains("no callbacks") {
            "-".to_string()
        } else {
            let differences: Vec<f64> = walls
                .iter()
                .zip(&floor)
                .map(|(wall, floor)| {
                    (wall.as_secs_f64() - floor.as_secs_f64()) * 1e3 / trials as f64
                })
                .collect();
            Summary::of(&differences).cell(3)
        };
        out!(
            "| {name} | {} | {:.2}x | {above} |",
            per_trial.cell(3),
            per_trial.median
        );
    }
}

/// The file operations of `trials` sandboxed trials that report once, done
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

/// Issue 2's result throughput: a few trials reporting as fast as they can,
/// result files on.
pub fn throughput(program: &Program) {
    const TRIALS: usize = 4;
    const ITERATIONS: u64 = 25_000;
    const REPEATS: usize = 5;
    let results = TRIALS as u64 * ITERATIONS;
    // One trial per core, as `wtune run` runs them by default.
    let concurrent = cores();
    out!(
        "\n### Result throughput ({TRIALS} trials x {ITERATIONS} results, {concurrent} at a time, no work per `train()`, {REPEATS} runs of each row, interleaved)\n"
    );
    out!(
        "Issue 7's target: over 100,000 results/s with result files on (TensorBoard event \
         files included, issue 32). \"Host CPU\" is the process's user + system time (all \
         threads, 10 ms resolution) per result. Every result is checked to be in \
         `result.jsonl` and `progress.csv` after each run, and each trial to have its event \
         file where it should.\n"
    );
    out!(
        "| backend, callbacks | results/s | wall per result (µs) | host CPU per result (µs) |\n| --- | --- | --- | --- |"
    );
    let configs = || vec![json!({"attack": "none", "iterations": ITERATIONS}); TRIALS];
    // Runs an experiment and checks that every result reached both files.
    let checked = |ran: Ran, out: &Path, callbacks: Callbacks| {
        assert_eq!(ran.results, results);
        if callbacks != Callbacks::None {
            for i in 0..TRIALS {
                let dir = out.join(format!("trial_{i:04}"));
                let lines = |file: &str| {
                    std::fs::read_to_string(dir.join(file))
                        .unwrap()
                        .lines()
                        .count() as u64
                };
                assert_eq!(lines("result.jsonl"), ITERATIONS);
                assert_eq!(lines("progress.csv"), ITERATIONS + 1);
                let events = std::fs::read_dir(&dir)
                    .unwrap()
                    .filter(|e| {
                        let name = e.as_ref().unwrap().file_name();
                        name.to_string_lossy().contains("tfevents")
                    })
                    .count();
                let expected = usize::from(callbacks != Callbacks::ResultFilesWithoutTensorBoard);
                assert_eq!(events, expected, "{}", dir.display());
            }
        }
        ran
    };
    let native = |callbacks, concurrent| {
        move |out: &Path| {
            let ran = run_experiment(
                no_work(false),
                configs(),
                ITERATIONS,
                concurrent,
                out,
                callbacks,
            );
            checked(ran, out, callbacks)
        }
    };
    let rows: [(String, Case<Ran>); 6] = [
        (
            "wasm sandbox (`hostile.wasm` `none`), `wtune run`'s callbacks (state file, result files, `experiment.json`, progress)".into(),
            Box::new(|out: &Path| {
                let ran = run_experiment(
                    hostile(program),
                    configs(),
                    ITERATIONS,
                    concurrent,
                    out,
                    Callbacks::All,
                );
                checked(ran, out, Callbacks::All)
            }),
        ),
        (
            "plain Rust (`FnBackend`), `wtune run`'s callbacks".into(),
            Box::new(native(Callbacks::All, concurrent)),
        ),
        (
            "plain Rust, result files only".into(),
            Box::new(native(Callbacks::ResultFiles, concurrent)),
        ),
        (
            "plain Rust, result files only, no TensorBoard event files".into(),
            Box::new(native(Callbacks::ResultFilesWithoutTensorBoard, concurrent)),
        ),
        (
            "plain Rust, no callbacks (the runner alone)".into(),
            Box::new(native(Callbacks::None, concurrent)),
        ),
        (
            format!("plain Rust, no callbacks, all {TRIALS} at once on {concurrent} cores"),
            Box::new(native(Callbacks::None, TRIALS)),
        ),
    ];
    let (names, mut cases): (Vec<String>, Vec<_>) = rows.into_iter().unzip();
    let runs = interleaved(REPEATS, None, &mut cases);
    for (name, runs) in names.iter().zip(runs) {
        let walls: Vec<f64> = runs.iter().map(|r| r.wall.as_secs_f64()).collect();
        let wall = Summary::of(&walls);
        let cpus: Vec<f64> = runs
            .iter()
            .map(|r| r.cpu.as_secs_f64() * 1e6 / results as f64)
            .collect();
        out!(
            "| {name} | {} | {} | {} |",
            wall.map(|s| results as f64 / s).cell(0),
            wall.map(|s| s * 1e6 / results as f64).cell(2),
            Summary::of(&cpus).cell(2)
        );
    }
}

/// Issue 5: what `experiment_state.json` costs an experiment of 10,000
/// trials.
pub fn state_writes() {
    const TRIALS: usize = 10_000;
    const ITERATIONS: u64 = 20;
    const CONCURRENT: usize = 32;
    const PAIRS: usize = 3;
    let step_time = Duration::from_millis(2);
    out!(
        "\n### Experiment state writes ({TRIALS} trials x {ITERATIONS} iterations of {} ms, {CONCURRENT} at a time; {PAIRS} runs without and with the state, alternating)\n",
        step_time.as_millis()
    );
    out!(
        "Serializing happens on the runner's thread; keeping the previous state, writing, \
         fsync and rename on the `wtune-state` thread.\n"
    );
    out!(
        "| run | wall (s) | state writes per run | state size | serializing on the runner thread, per run | per write: serialize / write + fsync (ms) |\n| --- | --- | --- | --- | --- | --- |"
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
    let spec = |out: &Path| {
        let configs = (0..TRIALS)
            .map(|i| json!({"x": i as f64 / TRIALS as f64, "name": format!("config-{i}")}))
            .collect();
        bench_spec("state", out, configs, ITERATIONS, CONCURRENT)
    };
    struct WithState {
        wall: Duration,
        writes: u64,
        serialize: Duration,
        write: Duration,
        size: u64,
    }
    let run = |with_state: bool| {
        settle();
        let dir = scratch();
        let out = dir.path().join("out");
        let mut runner = Runner::new(backend(), spec(&out), Box::new(Fifo::default()));
        let state = StateFile::new(json!({"bench": true}));
        let stats = state.stats();
        if with_state {
            runner = runner.callback(state);
        }
        let started = Instant::now();
        tokio::runtime::Runtime::new()
            .unwrap()
            .block_on(runner.run())
            .unwrap();
        WithState {
            wall: started.elapsed(),
            writes: stats.writes.load(Ordering::Relaxed),
            serialize: Duration::from_nanos(stats.serialize_ns.load(Ordering::Relaxed)),
            write: Duration::from_nanos(stats.write_ns.load(Ordering::Relaxed)),
            size: std::fs::metadata(out.join("experiment_state.json")).map_or(0, |m| m.len()),
        }
    };
    let (mut without, mut with) = (Vec::new(), Vec::new());
    for _ in 0..PAIRS {
        without.push(run(false).wall);
        with.push(run(true));
    }
    let alone = Summary::ms(&without).map(|ms| ms / 1e3);
    out!("| runner alone | {} | - | - | - | - |", alone.cell(2));
    let walls: Vec<Duration> = with.iter().map(|w| w.wall).collect();
    let wall = Summary::ms(&walls).map(|ms| ms / 1e3);
    let writes: Vec<f64> = with.iter().map(|w| w.writes as f64).collect();
    let share: Vec<f64> = with
        .iter()
        .map(|w| w.serialize.as_secs_f64() / w.wall.as_secs_f64() * 100.0)
        .collect();
    let serialize: Vec<f64> = with
        .iter()
        .map(|w| w.serialize.as_secs_f64() * 1e3)
        .collect();
    let per_write = |f: fn(&WithState) -> Duration| {
        let each: Vec<f64> = with
            .iter()
            .filter(|w| w.writes > 0)
            .map(|w| f(w).as_secs_f64() * 1e3 / w.writes as f64)
            .collect();
        if each.is_empty() {
            "-".to_string()
        } else {
            format!("{:.1}", Summary::of(&each).median)
        }
    };
    out!(
        "| runner + `experiment_state.json` | {} ({:+.1}% vs alone, medians) | {} + the final one | {} | {} ms = {}% of the wall time | {} / {} |",
        wall.cell(2),
        (wall.median / alone.median - 1.0) * 100.0,
        Summary::of(&writes).cell(0),
        wtune::sandbox::human_bytes(with.iter().map(|w| w.size).max().unwrap_or(0)),
        Summary::of(&serialize).cell(1),
        Summary::of(&share).cell(2),
        per_write(|w| w.serialize),
        per_write(|w| w.write)
    );
    out!(
        "\nThe serializing share is what the state takes from the runner's thread (the state \
         file spaces its writes to keep it near 0.5%); the wall-time difference between the \
         rows also carries this machine's run-to-run noise."
    );
}
