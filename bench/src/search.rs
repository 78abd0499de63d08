//! `search`: how good the configurations each searcher finds are, per
//! trial spent, on synthetic functions with known optima, beside Optuna's
//! samplers on the same functions in the same run.
//!
//! Each function is a one-iteration trainable: a searcher suggests a
//! configuration, the function's value is its result, trials run one at a
//! time (`max_concurrent_trials = 1`). Regret is the best value so far minus
//! the function's minimum. wtune's searchers are driven directly (the
//! `Searcher` trait, as the runner drives them); Optuna's through
//! `bench/search/optuna_suite.py`, in a virtual environment this scenario
//! creates under `target/` with Optuna's pinned version. The script first
//! checks that its copy of every function gives the values this file's
//! does at the same configurations, so the two sides measure the same
//! thing.
//!
//! Optuna's `GPSampler` needs PyTorch and SciPy (several GB with PyTorch's
//! CUDA libraries), so its rows come only with `WTUNE_BENCH_OPTUNA_GP=1`,
//! which installs their pinned versions into the same venv; it runs on the
//! low-dimensional continuous functions, where GP-BO is meant to win, as
//! its suggestions take a second or more on the larger ones.
//!
//! Where outcomes are bimodal (hartmann-6: a run finds the global basin or
//! polishes a local one), medians over the default 20 seeds swing with the
//! seeds; `WTUNE_BENCH_SEEDS=N` runs N seeds per searcher and
//! `WTUNE_BENCH_FUNCTIONS=hartmann-6,branin` only the functions whose names
//! start so. The column "solved" counts the runs within 0.01 of the
//! minimum after 100 trials. Optuna's `GPSampler` takes about 35 s per
//! hartmann-6 run on these 2-core machines: 120 seeds take over an hour.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use serde_json::{Value, json};
use wtune::tune::{CurveSet, Mode, SearchSpace, SearchSpec, Searcher, Suggestion};

const TRIALS: usize = 100;
/// Seeds per searcher unless `WTUNE_BENCH_SEEDS` says otherwise.
const SEEDS: u64 = 20;
/// A run is counted as solved within this of the function's minimum.
const SOLVED: f64 = 0.01;
/// The trial counts regret is reported at.
const AT: [usize; 3] = [25, 50, 100];
/// Optuna's version, pinned so that runs compare.
const OPTUNA: &str = "optuna==5.0.0";
/// What Optuna's `GPSampler` needs besides Optuna, pinned likewise.
const OPTUNA_GP: [&str; 2] = ["torch==2.15.0", "scipy==1.17.1"];
/// The functions Optuna's `GPSampler` runs on, by name.
const GP_FUNCTIONS: [&str; 3] = ["branin (2-d)", "rotated quadratic (4-d)", HARTMANN6];
/// The function suggestion times are measured on.
const HARTMANN6: &str = "hartmann-6 (6-d)";

/// What the `search` scenario runs: `seeds` seeds per searcher (from
/// `WTUNE_BENCH_SEEDS`, default [`SEEDS`]) on the functions named in
/// `functions` (from `WTUNE_BENCH_FUNCTIONS`, comma-separated starts of
/// their names; default all), with Optuna's `GPSampler` rows when
/// `optuna_gp` (`WTUNE_BENCH_OPTUNA_GP=1`).
pub struct Settings {
    seeds: u64,
    functions: Vec<&'static str>,
    optuna_gp: bool,
}

impl Settings {
    /// The settings the environment asks for; a bad value is an error
    /// naming it, so that the bench stops before it runs anything.
    pub fn from_env() -> Result<Self, String> {
        let mut settings = Self::from_values(
            env("WTUNE_BENCH_SEEDS")?.as_deref(),
            env("WTUNE_BENCH_FUNCTIONS")?.as_deref(),
        )?;
        settings.optuna_gp = std::env::var_os("WTUNE_BENCH_OPTUNA_GP").is_some_and(|v| v == "1");
        Ok(settings)
    }

    /// The settings for the seed and function variables' values (`None`:
    /// not set), without Optuna's `GPSampler`.
    fn from_values(seeds: Option<&str>, wanted: Option<&str>) -> Result<Self, String> {
        let seeds = seed_count(seeds, SEEDS)?;
        let names: Vec<&'static str> = functions().iter().map(|f| f.name).collect();
        let functions = match wanted {
            None => names,
            Some(wanted) => {
                let wanted: Vec<&str> = wanted.split(',').map(str::trim).collect();
                let listed = || format!("the functions: {}", names.join(", "));
                if let Some(unknown) = wanted
                    .iter()
                    .find(|w| w.is_empty() || !names.iter().any(|n| n.starts_with(*w)))
                {
                    return Err(if unknown.is_empty() {
                        format!(
                            "WTUNE_BENCH_FUNCTIONS names an empty function; unset it to run \
                             them all, or give the starts of their names, comma-separated; {}",
                            listed()
                        )
                    } else {
                        format!(
                            "WTUNE_BENCH_FUNCTIONS: no function's name starts with {unknown:?}; {}",
                            listed()
                        )
                    });
                }
                names
                    .iter()
                    .copied()
                    .filter(|n| wanted.iter().any(|w| n.starts_with(w)))
                    .collect()
            }
        };
        Ok(Self {
            seeds,
            functions,
            optuna_gp: false,
        })
    }
}

/// `WTUNE_BENCH_SEEDS`'s value (`None`: not set, `default`), a whole
/// number above 0.
fn seed_count(value: Option<&str>, default: u64) -> Result<u64, String> {
    match value {
        None => Ok(default),
        Some(v) => match v.trim().parse::<u64>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!(
                "WTUNE_BENCH_SEEDS must be a whole number above 0, got {v:?}"
            )),
        },
    }
}

/// What the `search-curves` scenario runs: `seeds` seeds per row (from
/// `WTUNE_BENCH_SEEDS`, default [`CURVE_SEEDS`]) of the rows labelled in
/// `rows` (from `WTUNE_BENCH_ROWS`, labels separated by `|`; default all
/// of [`curve_searchers`]).
pub struct CurveSettings {
    seeds: u64,
    rows: Vec<&'static str>,
}

/// Seeds per row of `search-curves` unless `WTUNE_BENCH_SEEDS` says
/// otherwise: the spread between two 200-seed runs of one row is about
/// 0.001 of mean regret.
const CURVE_SEEDS: u64 = 200;

impl CurveSettings {
    /// The settings the environment asks for; a bad value is an error
    /// naming it, so that the bench stops before it runs anything.
    pub fn from_env() -> Result<Self, String> {
        Self::from_values(
            env("WTUNE_BENCH_SEEDS")?.as_deref(),
            env("WTUNE_BENCH_ROWS")?.as_deref(),
        )
    }

    fn from_values(seeds: Option<&str>, wanted: Option<&str>) -> Result<Self, String> {
        let seeds = seed_count(seeds, CURVE_SEEDS)?;
        let labels: Vec<&'static str> = curve_searchers().iter().map(|r| r.0).collect();
        let rows = match wanted {
            None => labels,
            Some(wanted) => {
                let wanted: Vec<&str> = wanted.split('|').map(str::trim).collect();
                if let Some(unknown) = wanted.iter().find(|w| !labels.contains(w)) {
                    return Err(format!(
                        "WTUNE_BENCH_ROWS: no row is labelled {unknown:?}; the rows: {}",
                        labels.join(" | ")
                    ));
                }
                labels.into_iter().filter(|l| wanted.contains(l)).collect()
            }
        };
        Ok(Self { seeds, rows })
    }
}

/// An environment variable's value; `None` where it is not set.
fn env(name: &str) -> Result<Option<String>, String> {
    match std::env::var(name) {
        Ok(v) => Ok(Some(v)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(format!("{name} is not valid UTF-8")),
    }
}

/// A test function: its search space (as `param_space` writes it) and its
/// value, whose minimum is 0.
struct Function {
    name: &'static str,
    space: Value,
    value: fn(&Value) -> f64,
}

fn num(config: &Value, key: &str) -> f64 {
    config[key].as_f64().expect("the space defines it")
}

/// `n` parameters `x0..` uniform in `[low, high]`.
fn box_space(n: usize, low: f64, high: f64) -> Value {
    (0..n)
        .map(|i| (format!("x{i}"), json!({"uniform": [low, high]})))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

fn xs(config: &Value, n: usize) -> Vec<f64> {
    (0..n).map(|i| num(config, &format!("x{i}"))).collect()
}

fn branin(c: &Value) -> f64 {
    let (x, y) = (num(c, "x0"), num(c, "x1"));
    let pi = std::f64::consts::PI;
    let (b, cc, t) = (5.1 / (4.0 * pi * pi), 5.0 / pi, 1.0 / (8.0 * pi));
    (y - b * x * x + cc * x - 6.0).powi(2) + 10.0 * (1.0 - t) * x.cos() + 10.0
        - 0.397_887_357_729_738_2
}

fn rotated(c: &Value) -> f64 {
    let x = xs(c, 4);
    10.0 * (x[0] + x[1] - 1.0).powi(2)
        + 0.5 * (x[0] - x[1]).powi(2)
        + 10.0 * (x[2] + x[3]).powi(2)
        + 0.5 * (x[2] - x[3] - 2.0).powi(2)
}

fn hartmann6(c: &Value) -> f64 {
    const A: [[f64; 6]; 4] = [
        [10.0, 3.0, 17.0, 3.5, 1.7, 8.0],
        [0.05, 10.0, 17.0, 0.1, 8.0, 14.0],
        [3.0, 3.5, 1.7, 10.0, 17.0, 8.0],
        [17.0, 8.0, 0.05, 10.0, 0.1, 14.0],
    ];
    const P: [[f64; 6]; 4] = [
        [0.1312, 0.1696, 0.5569, 0.0124, 0.8283, 0.5886],
        [0.2329, 0.4135, 0.8307, 0.3736, 0.1004, 0.9991],
        [0.2348, 0.1451, 0.3522, 0.2883, 0.3047, 0.6650],
        [0.4047, 0.8828, 0.8732, 0.5743, 0.1091, 0.0381],
    ];
    const ALPHA: [f64; 4] = [1.0, 1.2, 3.0, 3.2];
    let x = xs(c, 6);
    let sum: f64 = (0..4)
        .map(|i| {
            let e: f64 = (0..6).map(|j| A[i][j] * (x[j] - P[i][j]).powi(2)).sum();
            ALPHA[i] * (-e).exp()
        })
        .sum();
    3.322_368_011_415_515 - sum
}

fn rosenbrock(c: &Value) -> f64 {
    let x = xs(c, 8);
    x.windows(2)
        .map(|w| 100.0 * (w[1] - w[0] * w[0]).powi(2) + (1.0 - w[0]).powi(2))
        .sum()
}

fn ackley(c: &Value) -> f64 {
    let x = xs(c, 10);
    let n = x.len() as f64;
    let squares = x.iter().map(|v| v * v).sum::<f64>() / n;
    let cosines = x
        .iter()
        .map(|v| (std::f64::consts::TAU * v).cos())
        .sum::<f64>()
        / n;
    -20.0 * (-0.2 * squares.sqrt()).exp() - cosines.exp() + 20.0 + std::f64::consts::E
}

fn shifted_sphere(c: &Value) -> f64 {
    xs(c, 20)
        .iter()
        .enumerate()
        .map(|(i, v)| (v - (i as f64 * 0.37).sin() * 3.0).powi(2))
        .sum()
}

fn mixed(c: &Value) -> f64 {
    let lr = num(c, "lr").log10();
    let layers = num(c, "layers");
    let act = match c["act"].as_str().expect("a choice of strings") {
        "gelu" => 0.0,
        "relu" => 0.5,
        _ => 1.0,
    };
    (lr + 3.0 + 0.1 * (layers - 4.0)).powi(2) + act + (num(c, "dropout") - 0.3).powi(2)
}

fn categorical(c: &Value) -> f64 {
    let pick = |key: &str, best: &str| {
        if c[key].as_str() == Some(best) {
            0.0
        } else {
            1.0
        }
    };
    pick("a", "p")
        + pick("b", "q") * 0.8
        + pick("c", "r") * 0.6
        + pick("d", "s") * 0.4
        + (num(c, "u") - 0.25).powi(2)
        + (num(c, "v") - 0.75).powi(2)
}

fn functions() -> Vec<Function> {
    let choice = |values: [&str; 3]| json!({"choice": values});
    vec![
        Function {
            name: "branin (2-d)",
            space: json!({"x0": {"uniform": [-5, 10]}, "x1": {"uniform": [0, 15]}}),
            value: branin,
        },
        Function {
            name: "rotated quadratic (4-d)",
            space: box_space(4, -5.0, 5.0),
            value: rotated,
        },
        Function {
            name: "mixed: log, int, choice, float (4-d)",
            space: json!({
                "lr": {"loguniform": [1e-5, 1.0]},
                "layers": {"randint": [1, 9]},
                "act": {"choice": ["relu", "tanh", "gelu", "none"]},
                "dropout": {"uniform": [0.0, 0.6]},
            }),
            value: mixed,
        },
        Function {
            name: HARTMANN6,
            space: box_space(6, 0.0, 1.0),
            value: hartmann6,
        },
        Function {
            name: "categorical + 2 floats (6-d)",
            space: json!({
                "a": choice(["p", "x", "y"]), "b": choice(["x", "q", "y"]),
                "c": choice(["x", "y", "r"]), "d": choice(["s", "x", "y"]),
                "u": {"uniform": [0, 1]}, "v": {"uniform": [0, 1]},
            }),
            value: categorical,
        },
        Function {
            name: "rosenbrock (8-d)",
            space: box_space(8, -2.0, 2.0),
            value: rosenbrock,
        },
        Function {
            name: "ackley (10-d)",
            space: box_space(10, -5.0, 5.0),
            value: ackley,
        },
        Function {
            name: "shifted sphere (20-d)",
            space: box_space(20, -5.0, 5.0),
            value: shifted_sphere,
        },
    ]
}

/// wtune's searchers compared, as `[search]` tables.
fn searchers() -> Vec<(&'static str, Value)> {
    vec![
        ("wtune random", json!({"type": "random"})),
        ("wtune tpe (joint, default)", json!({"type": "tpe"})),
        (
            "wtune tpe, rank_weights = false",
            json!({"type": "tpe", "rank_weights": false}),
        ),
        (
            "wtune tpe, multivariate = false",
            json!({"type": "tpe", "multivariate": false}),
        ),
        ("wtune gp", json!({"type": "gp"})),
    ]
}

/// Best-so-far regret at each of [`AT`], one run.
fn regrets(function: &Function, spec: &Value, seed: u64) -> Vec<f64> {
    let space = SearchSpace::from_json(&function.space).expect("a valid space");
    let mut searcher = SearchSpec::from_json(spec)
        .and_then(|s| s.build(&space, TRIALS as u64, Some("loss"), Mode::Min, seed))
        .expect("a valid searcher");
    let mut best = f64::INFINITY;
    let mut out = Vec::new();
    for i in 0..TRIALS {
        let id = format!("trial_{i:04}");
        let Suggestion::Config(config) = searcher.suggest(&id) else {
            panic!("{}: no suggestion at trial {i}", function.name);
        };
        let value = (function.value)(&config);
        best = best.min(value);
        let result = json!({"loss": value});
        searcher.on_trial_complete(&id, result.as_object(), false);
        if AT.contains(&(i + 1)) {
            out.push(best.max(0.0));
        }
    }
    out
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        0.5 * (values[n / 2 - 1] + values[n / 2])
    }
}

/// One table row: median regret at each of [`AT`], then the mean at the
/// last and how many runs were within [`SOLVED`] of the minimum there.
fn row(runs: &[Vec<f64>]) -> String {
    let mut cells: Vec<String> = (0..AT.len())
        .map(|k| {
            let mut at: Vec<f64> = runs.iter().map(|r| r[k]).collect();
            format!("{:.4}", median(&mut at))
        })
        .collect();
    let last = runs.iter().map(|r| r[AT.len() - 1]).sum::<f64>() / runs.len() as f64;
    cells.push(format!("{last:.4}"));
    let solved = runs.iter().filter(|r| r[AT.len() - 1] < SOLVED).count();
    cells.push(format!("{solved} of {}", runs.len()));
    cells.join(" | ")
}

/// Milliseconds one suggestion takes after `observations` completed
/// trials (on Hartmann-6), median of 5.
fn suggestion_ms(spec: &Value, observations: usize) -> f64 {
    let function = functions()
        .into_iter()
        .find(|f| f.name == HARTMANN6)
        .expect("hartmann-6 is a function");
    let space = SearchSpace::from_json(&function.space).expect("a valid space");
    let total = observations as u64 + 5;
    let mut searcher: Box<dyn Searcher> = SearchSpec::from_json(spec)
        .and_then(|s| s.build(&space, total, Some("loss"), Mode::Min, 1))
        .expect("a valid searcher");
    let mut times = Vec::new();
    for i in 0..observations + 5 {
        let id = format!("trial_{i:05}");
        let began = Instant::now();
        let Suggestion::Config(config) = searcher.suggest(&id) else {
            panic!("no suggestion");
        };
        if i >= observations {
            times.push(began.elapsed().as_secs_f64() * 1e3);
        }
        let result = json!({"loss": (function.value)(&config)});
        searcher.on_trial_complete(&id, result.as_object(), false);
    }
    median(&mut times)
}

/// A venv under `target/` with Optuna, and with what its `GPSampler` needs
/// when `gp`; `None` (said) where it cannot be made, e.g. offline.
fn optuna_python(root: &Path, gp: bool) -> Option<PathBuf> {
    let venv = root.join("target/bench-optuna-venv");
    let python = venv.join("bin/python");
    let import = if gp {
        "import optuna, torch, scipy"
    } else {
        "import optuna"
    };
    let ready = || {
        Command::new(&python)
            .args(["-c", import])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if ready() {
        return Some(python);
    }
    let mut packages = vec![OPTUNA];
    if gp {
        packages.extend(OPTUNA_GP);
    }
    let made = (python.exists()
        || Command::new("python3")
            .arg("-m")
            .arg("venv")
            .arg(&venv)
            .status()
            .is_ok_and(|s| s.success()))
        && Command::new(&python)
            .args(["-m", "pip", "install", "--quiet"])
            .args(&packages)
            .status()
            .is_ok_and(|s| s.success());
    if made && ready() {
        Some(python)
    } else {
        out!(
            "(Optuna could not be installed in {}: its rows are missing)",
            venv.display()
        );
        None
    }
}

/// Optuna's rows for `functions` as `settings` ask, by function name:
/// `(sampler, cells)`; and its suggestion times. Checks first that the
/// script's functions match these.
fn optuna(root: &Path, functions: &[Function], settings: &Settings) -> Option<Value> {
    let python = optuna_python(root, settings.optuna_gp)?;
    // Each function's value at a few seeded random configurations.
    let checks: Vec<Value> = functions
        .iter()
        .map(|f| {
            let space = SearchSpace::from_json(&f.space).expect("a valid space");
            let mut random = SearchSpec::from_json(&json!({"type": "random"}))
                .and_then(|s| s.build(&space, 5, Some("loss"), Mode::Min, 3))
                .expect("random search");
            let points: Vec<Value> = (0..5)
                .map(|i| {
                    let Suggestion::Config(config) = random.suggest(&format!("c{i}")) else {
                        panic!("no suggestion");
                    };
                    json!({"config": config, "value": (f.value)(&config)})
                })
                .collect();
            json!({"name": f.name, "space": f.space, "points": points})
        })
        .collect();
    let gp: &[&str] = if settings.optuna_gp {
        &GP_FUNCTIONS
    } else {
        &[]
    };
    let input = json!({
        "functions": checks, "trials": TRIALS, "seeds": settings.seeds, "at": AT,
        "gp_functions": gp,
    });
    let script = root.join("bench/search/optuna_suite.py");
    let output = Command::new(&python)
        .arg(&script)
        .arg(input.to_string())
        .output()
        .ok()?;
    if !output.status.success() {
        out!(
            "(Optuna's suite failed: {})",
            String::from_utf8_lossy(&output.stderr).trim()
        );
        return None;
    }
    serde_json::from_slice(&output.stdout).ok()
}

/// The searchers `search-curves` runs inside ASHA, by label: TPE and GP
/// learning from the rungs (`multi_fidelity`, as BOHB) or from finished
/// trials only; GP weighing each configuration's cost (`cost_exponent`),
/// alone and with `multi_fidelity`; and one GP over configuration and
/// iteration (`multi_fidelity = "joint"`), alone and weighing cost.
fn curve_searchers() -> Vec<(&'static str, Value)> {
    vec![
        ("ASHA + random", json!("random")),
        ("ASHA + tpe", json!("tpe")),
        (
            "ASHA + tpe, multi_fidelity (BOHB-style)",
            json!({"type": "tpe", "multi_fidelity": true}),
        ),
        ("ASHA + gp", json!("gp")),
        (
            "ASHA + gp, multi_fidelity",
            json!({"type": "gp", "multi_fidelity": true}),
        ),
        (
            "ASHA + gp, cost_exponent 1",
            json!({"type": "gp", "cost_exponent": 1.0}),
        ),
        (
            "ASHA + gp, multi_fidelity, cost_exponent 1",
            json!({"type": "gp", "multi_fidelity": true, "cost_exponent": 1.0}),
        ),
        (
            "ASHA + gp, multi_fidelity joint (MOBSTER-style)",
            json!({"type": "gp", "multi_fidelity": "joint"}),
        ),
        (
            "ASHA + gp, multi_fidelity joint, cost_exponent 1",
            json!({"type": "gp", "multi_fidelity": "joint", "cost_exponent": 1.0}),
        ),
    ]
}

/// Model-based search inside ASHA on replayed learning curves: whether the
/// model searchers ([`curve_searchers`]) beat random search at equal fuel.
/// On `CurveSet::synthetic()`, whose curves cross, and on the tabulated
/// curves of the digits CNN (`examples/replay/curves/digits-cnn.json`).
pub fn learning_curves(root: &Path, settings: &CurveSettings) {
    let tabulated = root.join("examples/replay/curves/digits-cnn.json");
    let sets = [
        (Ok(CurveSet::synthetic()), "CurveSet::synthetic()"),
        (
            CurveSet::load(&tabulated),
            "examples/replay/curves/digits-cnn.json",
        ),
    ];
    for (set, source) in sets {
        let set = match set {
            Ok(set) => set,
            Err(e) => {
                out!("\n{source}: not run ({e})");
                continue;
            }
        };
        crate::compare::replay_rows(
            &set,
            source,
            "Searchers inside ASHA (grace 1, rf 3) at equal fuel",
            curve_searchers()
                .into_iter()
                .filter(|(label, _)| settings.rows.contains(label))
                .map(|(label, search)| {
                    let asha = crate::compare::asha_grace(&set, 1);
                    (label.to_string(), Some(asha), search)
                })
                .collect(),
            settings.seeds,
        );
    }
}

pub fn run(root: &Path, settings: &Settings) {
    let seeds = settings.seeds;
    let functions: Vec<Function> = functions()
        .into_iter()
        .filter(|f| settings.functions.contains(&f.name))
        .collect();
    out!("### Search quality: regret after 25 / 50 / 100 trials, beside Optuna");
    out!();
    out!(
        "One-iteration trials, one at a time, {} seeds per searcher (seeds 0 to {}); \
         regret = best value so far minus the function's minimum. Median at 25, 50 and 100 \
         trials, then the mean at 100 and the runs within {SOLVED} of the minimum there. \
         Optuna {} runs in the same sitting (`bench/search/optuna_suite.py`, its functions \
         checked against these).",
        seeds,
        seeds - 1,
        OPTUNA.trim_start_matches("optuna==")
    );
    out!();
    let optuna = optuna(root, &functions, settings);
    out!(
        "| function | searcher | median @25 | median @50 | median @100 | mean @100 | solved @100 |"
    );
    out!("| --- | --- | --- | --- | --- | --- | --- |");
    for function in &functions {
        for (label, spec) in searchers() {
            let runs: Vec<Vec<f64>> = (0..seeds).map(|s| regrets(function, &spec, s)).collect();
            out!("| {} | {label} | {} |", function.name, row(&runs));
        }
        let rows = optuna
            .as_ref()
            .and_then(|o| o["rows"][function.name].as_array());
        for r in rows.into_iter().flatten() {
            let runs: Vec<Vec<f64>> =
                serde_json::from_value(r["regrets"].clone()).expect("lists of regrets");
            out!(
                "| {} | {} | {} |",
                function.name,
                r["sampler"].as_str().unwrap_or("?"),
                row(&runs)
            );
        }
    }
    out!();
    if !settings.functions.contains(&HARTMANN6) {
        return;
    }
    out!("Time per suggestion on Hartmann-6 (median of 5 suggestions):");
    out!();
    out!("| searcher | after 100 observations | after 200 | after 1,000 |");
    out!("| --- | --- | --- | --- |");
    // A GP's cost grows with the cube of its observations: it is timed up
    // to 200, as the targets are (TPE's at 1,000).
    let ms = |t: Option<f64>| t.map_or("-".to_string(), |t| format!("{t:.2} ms"));
    for (label, spec) in searchers().into_iter().skip(1) {
        let gp = spec["type"] == "gp";
        out!(
            "| {label} | {} | {} | {} |",
            ms(Some(suggestion_ms(&spec, 100))),
            ms(Some(suggestion_ms(&spec, 200))),
            ms((!gp).then(|| suggestion_ms(&spec, 1000)))
        );
    }
    if let Some(times) = optuna.as_ref().and_then(|o| o["times"].as_array()) {
        for t in times {
            out!(
                "| {} | {} | {} | {} |",
                t["sampler"].as_str().unwrap_or("?"),
                ms(t["at_100"].as_f64()),
                ms(t["at_200"].as_f64()),
                ms(t["at_1000"].as_f64())
            );
        }
    }
    out!();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_default_select_and_refuse_clearly() {
        let all = Settings::from_values(None, None).unwrap();
        assert_eq!((all.seeds, all.functions.len()), (SEEDS, functions().len()));

        let some = Settings::from_values(Some(" 120 "), Some("hartmann, bran")).unwrap();
        assert_eq!(some.seeds, 120);
        assert_eq!(some.functions, vec!["branin (2-d)", HARTMANN6]);

        for bad in ["0", "-1", "many", ""] {
            let e = Settings::from_values(Some(bad), None).err().unwrap();
            assert!(
                e.contains("WTUNE_BENCH_SEEDS") && e.contains(&format!("{bad:?}")),
                "{e}"
            );
        }
        let e = Settings::from_values(None, Some("bran,tsp")).err().unwrap();
        assert!(
            e.contains("\"tsp\"") && e.contains("rosenbrock (8-d)"),
            "{e}"
        );
        for empty in ["", "bran,", " , hartmann"] {
            let e = Settings::from_values(None, Some(empty)).err().unwrap();
            assert!(
                e.contains("empty") && e.contains("branin (2-d)"),
                "{empty:?}: {e}"
            );
        }
    }

    #[test]
    fn curve_settings_default_select_and_refuse_clearly() {
        let all = CurveSettings::from_values(None, None).unwrap();
        assert_eq!(all.seeds, CURVE_SEEDS);
        assert_eq!(all.rows.len(), curve_searchers().len());

        let some =
            CurveSettings::from_values(Some("40"), Some("ASHA + gp | ASHA + random")).unwrap();
        assert_eq!(some.seeds, 40);
        // In the table's order, whatever the order asked.
        assert_eq!(some.rows, vec!["ASHA + random", "ASHA + gp"]);

        let e = CurveSettings::from_values(Some("0"), None).err().unwrap();
        assert!(e.contains("WTUNE_BENCH_SEEDS"), "{e}");
        for bad in ["ASHA + gpx", "ASHA + random|", ""] {
            let e = CurveSettings::from_values(None, Some(bad)).err().unwrap();
            assert!(
                e.contains("WTUNE_BENCH_ROWS") && e.contains("ASHA + tpe, multi_fidelity"),
                "{bad:?}: {e}"
            );
        }
    }
}
