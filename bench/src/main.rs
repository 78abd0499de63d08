//! wtune's benchmarks. Prints Markdown tables; with `--write`, also inserts
//! them as a new dated section at the top of BENCHMARKS.md's list of
//! sections, headed with the date, the commit and the machine.
//!
//! ```text
//! bash scripts/setup.sh                               # builds the guest components
//! cargo run --release -p wtune-bench -- all --write   # every scenario, into BENCHMARKS.md
//! cargo run --release -p wtune-bench -- step          # one scenario, printed only
//! ```
//!
//! Usage: `wtune-bench [SCENARIO...] [--write] [--note TEXT] [--file PATH]`.
//! Scenarios (default `all`, in this order):
//!
//! - `step`: one training step (epoch + validation) of the digits example:
//!   native, wasm in plain wasmtime (no fuel, no epoch checks), wasm in
//!   wtune with fuel metering, and wasm with its math on host compute.
//! - `overhead`: bookkeeping overhead per trial: 1,000 trials that report
//!   once and do no work, through the real runner; in the sandbox and with
//!   plain-Rust trainables, with and without result files, against what the
//!   file system alone charges for the same files.
//! - `throughput`: result throughput: 4 trials reporting 25,000 results
//!   each as fast as they can, with `wtune run`'s callbacks (state file,
//!   result files, `experiment.json`, progress), and without.
//! - `startup`: trial start latency (instantiate to first result), p50 and
//!   p99, of the instance alone and through the runner.
//! - `snapshot`: host snapshot and restore of 1, 64 and 512 MiB memories
//!   filled with random data (the worst case), and of a 64 MiB memory that
//!   is mostly untouched heap: GB/s each way, file size, encode + write.
//! - `state`: 10,000 trials with and without `experiment_state.json`.
//! - `decisions [NAME]`: per-call cost of every scheduler and searcher
//!   (those whose name contains NAME) with 10,000 trials, driven directly.
//! - `compute`: squaring `n x n` matrices on the CPU compute backend called
//!   directly, through the guest interface and in plain wasm with fuel; then
//!   `compute-gpu`.
//! - `compute-gpu`: the same on the wgpu backend where a Vulkan adapter
//!   exists.
//! - `compile`: loading a component with no cache, compiled in process and
//!   in `wtune compile-worker`, and a cache hit.
//! - `compare`: ASHA against random search at equal total fuel, on the
//!   digits example and on the native replay of `CurveSet::synthetic()`.
//! - `search`: regret of wtune's searchers and Optuna's samplers (in a venv
//!   it makes under `target/`) on eight test functions of 2 to 20
//!   dimensions, and the time a suggestion takes.
//! - `search-curves`: the model searchers inside ASHA on replayed learning
//!   curves, the synthetic set and the burn CNN's tabulated one (TPE and GP
//!   learning from the rungs, as BOHB, or from finished trials only; GP
//!   weighing cost, and GP over configuration and iteration together)
//!   against ASHA with random search, at equal fuel;
//!   `WTUNE_BENCH_ROWS="ASHA + random|ASHA + gp"` runs only the rows so
//!   labelled, `WTUNE_BENCH_SEEDS=N` N seeds per row (default 200).
//!
//! A scenario that cannot run (no GPU adapter, a guest not built, a panic)
//! says so in the output instead of stopping the others.

/// Prints a line of Markdown and keeps it for `--write`.
macro_rules! out {
    () => {
        $crate::report::emit("")
    };
    ($($arg:tt)*) => {
        $crate::report::emit(&format!($($arg)*))
    };
}

mod compare;
mod compile;
mod compute;
mod decisions;
mod experiment;
mod plain_wasm;
mod report;
mod search;
mod trial;

use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::time::Instant;

use wtune::compute::{ComputeMode, ComputeOptions};
use wtune::sandbox::{Program, Sandbox, SandboxOptions, TrialEnv};

/// Every scenario, in the order `all` runs them.
const SCENARIOS: [&str; 13] = [
    "step",
    "overhead",
    "throughput",
    "startup",
    "snapshot",
    "state",
    "decisions",
    "compute",
    "compute-gpu",
    "compile",
    "compare",
    "search",
    "search-curves",
];

const USAGE: &str = "usage: wtune-bench [SCENARIO...] [--write] [--note TEXT] [--file PATH]

SCENARIO: all (the default), or any of: step overhead throughput startup snapshot state
decisions [NAME] compute compute-gpu compile compare search search-curves
  --write      insert the results into BENCHMARKS.md as a new dated section, above the others
  --note TEXT  a paragraph for that section (say what else the machine was doing)
  --file PATH  the file --write updates (default: BENCHMARKS.md in the repository)";

/// Scratch space for trial directories. Not /tmp: on these machines /tmp
/// makes file creation ~15x slower than the work disk (3 ms vs 0.2 ms for a
/// directory with three files), which would measure the disk, not wtune.
fn scratch() -> tempfile::TempDir {
    scratch_in(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/wtune-bench-scratch"))
}

/// A fresh scratch directory under `base`.
fn scratch_in(base: &Path) -> tempfile::TempDir {
    std::fs::create_dir_all(base).unwrap();
    tempfile::tempdir_in(base).unwrap()
}

/// Where the file-heavy scenarios run again to separate wtune's cost from
/// the disk's: a memory file system, when the machine has one.
fn memory_scratch() -> Option<PathBuf> {
    let shm = Path::new("/dev/shm");
    let base = shm.join(format!("wtune-bench-{}", std::process::id()));
    (shm.is_dir() && std::fs::create_dir_all(&base).is_ok()).then_some(base)
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
        gpu: None,
    }
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// What the command line asked for.
struct Args {
    scenarios: Vec<&'static str>,
    /// `decisions NAME`.
    decisions_filter: Option<String>,
    write: bool,
    note: Option<String>,
    file: Option<PathBuf>,
    /// The `search` scenario's settings, read when it is asked for.
    search: Option<search::Settings>,
    /// The `search-curves` scenario's settings, likewise.
    curves: Option<search::CurveSettings>,
}

fn parse(args: &[String]) -> Result<Args, String> {
    let mut parsed = Args {
        scenarios: Vec::new(),
        decisions_filter: None,
        write: false,
        note: None,
        file: None,
        search: None,
        curves: None,
    };
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--write" => parsed.write = true,
            "--note" => parsed.note = Some(rest.next().ok_or("--note needs a text")?.clone()),
            "--file" => {
                parsed.file = Some(rest.next().ok_or("--file needs a path")?.into());
                parsed.write = true;
            }
            "-h" | "--help" => return Err(String::new()),
            "all" => parsed.scenarios.extend(SCENARIOS),
            name => match SCENARIOS.iter().find(|s| **s == name) {
                Some(scenario) => parsed.scenarios.push(scenario),
                None if parsed.scenarios.last() == Some(&"decisions")
                    && parsed.decisions_filter.is_none()
                    && !name.starts_with('-') =>
                {
                    parsed.decisions_filter = Some(name.to_string());
                }
                None => return Err(format!("unknown scenario or option `{name}`")),
            },
        }
    }
    if parsed.scenarios.is_empty() {
        parsed.scenarios.extend(SCENARIOS);
    }
    // Once each, in the order asked; `compute` includes `compute-gpu`.
    let mut seen = Vec::new();
    for s in parsed.scenarios.drain(..) {
        if !seen.contains(&s) {
            seen.push(s);
        }
    }
    if seen.contains(&"compute") {
        seen.retain(|s| *s != "compute-gpu");
    }
    parsed.scenarios = seen;
    if parsed.scenarios.contains(&"search") {
        parsed.search = Some(search::Settings::from_env()?);
    }
    if parsed.scenarios.contains(&"search-curves") {
        parsed.curves = Some(search::CurveSettings::from_env()?);
    }
    Ok(parsed)
}

/// The Vulkan adapter the compute backend finds, described; `None` when
/// there is none.
fn gpu() -> Option<String> {
    let gpu = wtune::compute::gpu::LocalGpu::open().ok()?;
    let adapter = gpu.adapter();
    Some(if adapter.software {
        format!(
            "none in hardware (Vulkan finds only the software adapter {}, {})",
            adapter.name, adapter.driver
        )
    } else {
        format!(
            "{} ({}, {})",
            adapter.name, adapter.device_type, adapter.driver
        )
    })
}

/// The digits example loaded once per compute backend this machine has,
/// labelled for the step table: the CPU kernels, and wgpu where a Vulkan
/// adapter (software included) exists.
fn host_math(root: &Path, example: &Path) -> Vec<(String, Program)> {
    let mut loaded = Vec::new();
    for mode in [ComputeMode::Cpu, ComputeMode::Gpu] {
        let Ok(sandbox) = Sandbox::new(SandboxOptions {
            cache_dir: Some(root.join("target/wtune-bench-cache")),
            compute: ComputeOptions {
                mode,
                ..ComputeOptions::default()
            },
            ..Default::default()
        }) else {
            continue; // no Vulkan adapter: no GPU row
        };
        let info = sandbox.compute();
        let label = match mode {
            ComputeMode::Gpu => format!("the wgpu backend, {}", info.name),
            _ => "the CPU backend".to_string(),
        };
        loaded.push((label, sandbox.load(example).expect("the digits example")));
    }
    loaded
}

/// `value` as one shell word: as it is when it holds only characters no
/// shell treats specially, else in single quotes.
fn shell_word(value: &str) -> String {
    let plain = !value.is_empty()
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ",._-/=:+".contains(c));
    if plain {
        value.to_string()
    } else {
        format!("'{}'", value.replace('\'', r"'\''"))
    }
}

/// Runs `scenario`; a panic becomes a "not measured" note in the output.
fn run(name: &str, scenario: impl FnOnce()) {
    let started = Instant::now();
    eprintln!("[wtune-bench] {name}...");
    if let Err(panic) = std::panic::catch_unwind(AssertUnwindSafe(scenario)) {
        let message = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("it panicked");
        out!("\n### `{name}`: not measured\n\n{message}");
    }
    eprintln!(
        "[wtune-bench] {name} took {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let parsed = match parse(&args) {
        Ok(parsed) => parsed,
        Err(message) => {
            if !message.is_empty() {
                eprintln!("wtune-bench: {message}");
            }
            eprintln!("{USAGE}");
            std::process::exit(if message.is_empty() { 0 } else { 2 });
        }
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf();
    let started = Instant::now();
    let date = report::now_utc();
    let commit = report::commit(&root);
    let load_before = report::load();
    let machine = report::machine(gpu().as_deref());
    eprintln!("[wtune-bench] {date}, commit {commit}; {machine}");

    let sandbox = Sandbox::new(SandboxOptions {
        cache_dir: Some(root.join("target/wtune-bench-cache")),
        ..Default::default()
    })
    .expect("engine");
    let wasm = |name: &str| {
        root.join("target/wasm32-wasip2/release")
            .join(format!("{name}.wasm"))
    };
    let guest = |name: &str| -> Program {
        let path = wasm(name);
        sandbox.load(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (run `bash scripts/setup.sh` first)",
                path.display()
            )
        })
    };
    let data = root.join("examples/digits-mlp/data");
    for &scenario in &parsed.scenarios {
        run(scenario, || match scenario {
            "step" => trial::step(
                &guest("digits_mlp"),
                &wasm("digits_mlp"),
                &data,
                &host_math(&root, &wasm("digits_mlp")),
            ),
            "overhead" => experiment::overhead(&guest("hostile")),
            "throughput" => experiment::throughput(&guest("hostile")),
            "startup" => trial::startup(&guest("hostile")),
            "snapshot" => trial::snapshot(&guest("stateful")),
            "state" => experiment::state_writes(),
            "decisions" => decisions::run(parsed.decisions_filter.as_deref()),
            "compute" => {
                compute::run(&guest("kernels"));
                compute::run_gpu(&wasm("kernels"));
            }
            "compute-gpu" => compute::run_gpu(&wasm("kernels")),
            "compile" => compile::run(&root),
            "compare" => {
                compare::replay();
                compare::digits(&root, &guest("digits_mlp"));
            }
            "search" => search::run(
                &root,
                parsed.search.as_ref().expect("read with the scenario list"),
            ),
            "search-curves" => search::learning_curves(
                &root,
                parsed.curves.as_ref().expect("read with the scenario list"),
            ),
            other => unreachable!("scenario {other} is in SCENARIOS"),
        });
    }

    if parsed.write {
        // The command as given, without the note's text, after the bench's
        // settings from the environment.
        let mut settings: Vec<String> = std::env::vars_os()
            .filter_map(|(name, value)| {
                let name = name.into_string().ok()?;
                name.starts_with("WTUNE_BENCH_")
                    .then(|| format!("{name}={}", shell_word(&value.to_string_lossy())))
            })
            .collect();
        settings.sort();
        let mut command = settings.join(" ");
        if !command.is_empty() {
            command.push(' ');
        }
        command.push_str("cargo run --release -p wtune-bench --");
        let mut given = args.iter();
        while let Some(arg) = given.next() {
            if arg == "--note" {
                given.next();
                continue;
            }
            command.push(' ');
            command.push_str(arg);
        }
        let header = report::Header {
            date,
            commit,
            command,
            machine,
            load_before,
            load_after: report::load(),
            took: started.elapsed(),
            note: parsed.note,
        };
        let section = report::section(&header, &report::printed());
        let path = parsed.file.unwrap_or_else(|| root.join("BENCHMARKS.md"));
        match report::write_section(&path, &section) {
            Ok(()) => eprintln!("[wtune-bench] wrote a new section into {}", path.display()),
            Err(e) => {
                eprintln!("wtune-bench: writing {}: {e}", path.display());
                std::process::exit(1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Result<Args, String> {
        parse(
            &line
                .split_whitespace()
                .map(String::from)
                .collect::<Vec<_>>(),
        )
    }

    #[test]
    fn the_command_line() {
        let every: Vec<&str> = SCENARIOS
            .into_iter()
            .filter(|s| *s != "compute-gpu")
            .collect();
        assert_eq!(args("").unwrap().scenarios, every);
        let all = args("all --write --note shared").unwrap();
        assert!(all.write);
        assert_eq!(all.note.as_deref(), Some("shared"));
        assert!(!all.scenarios.contains(&"compute-gpu"), "inside compute");
        let some = args("decisions asha startup").unwrap();
        assert_eq!(some.scenarios, ["decisions", "startup"]);
        assert_eq!(some.decisions_filter.as_deref(), Some("asha"));
        assert_eq!(args("compute-gpu").unwrap().scenarios, ["compute-gpu"]);
        assert!(args("nonsense").is_err());
        assert!(args("startup asha").is_err());
        assert!(args("--note").is_err());
    }
}
