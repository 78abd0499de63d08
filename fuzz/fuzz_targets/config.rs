//! The experiment file and the search space.
//!
//! Each input is written to `experiment.toml` in a temporary directory and
//! read by `wtune::config::plan`, the parser `wtune run --config` uses (it
//! reads only a path). The output directory is overridden with an empty
//! directory that never receives anything, so no input creates files. When
//! the file is accepted, the plan's searcher hands out configurations and is
//! told results, and the space is sampled directly, at random and as a grid:
//! sampling is where bad bounds show.
//!
//! An input that is JSON is also parsed as a search space on its own with
//! `SearchSpace::from_json` (the TOML route cannot express every JSON value)
//! and sampled the same way.
//!
//! Invariant checked: every sampled value lies in its domain (a number in
//! `[low, high]`, an integer in `[low, high)`, one of the listed values).

#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value, json};
use wtune::config::{Overrides, plan};
use wtune::tune::space::Domain;
use wtune::tune::{SearchSpace, Suggestion};

/// Configurations drawn from each accepted space, per way of drawing.
const DRAWS: u64 = 8;

struct Dirs {
    /// Holds the experiment file.
    _root: tempfile::TempDir,
    file: PathBuf,
    /// Stays empty: `plan` refuses a non-empty output directory.
    output: PathBuf,
}

fn dirs() -> &'static Dirs {
    static DIRS: OnceLock<Dirs> = OnceLock::new();
    DIRS.get_or_init(|| {
        let root = tempfile::tempdir().expect("a temporary directory");
        let output = root.path().join("out");
        std::fs::create_dir(&output).expect("the output directory");
        Dirs {
            file: root.path().join("experiment.toml"),
            output,
            _root: root,
        }
    })
}

fuzz_target!(|data: &[u8]| {
    experiment_file(data);
    if let Ok(value) = serde_json::from_slice::<Value>(data) {
        if let Ok(space) = SearchSpace::from_json(&value) {
            sample(&space, 1 + u64::from(data.len() as u8 % 4), seed_of(data));
        }
    }
});

fn seed_of(data: &[u8]) -> u64 {
    let hash = blake3::hash(data);
    u64::from_le_bytes(hash.as_bytes()[..8].try_into().unwrap())
}

fn experiment_file(data: &[u8]) {
    let dirs = dirs();
    std::fs::write(&dirs.file, data).expect("writing the experiment file");
    let overrides = Overrides {
        output_dir: Some(dirs.output.clone()),
        // Without a seed `plan` draws one at random; a seed from the input
        // keeps runs reproducible (a seed in the file is overridden).
        seed: Some(seed_of(data)),
        ..Overrides::default()
    };
    let result = plan(Path::new("model.wasm"), Some(&dirs.file), &overrides);
    assert!(
        std::fs::read_dir(&dirs.output).unwrap().next().is_none(),
        "plan wrote into the output directory"
    );
    let Ok(plan) = result else { return };
    assert_eq!(plan.spec.output_dir, dirs.output);

    // The searcher as `wtune run` builds it, fed results as a run would.
    let mut searcher = plan.searcher().expect("plan() already built it once");
    let metric = plan.spec.metric.clone().unwrap_or_else(|| "loss".into());
    for i in 0..DRAWS {
        let id = format!("trial_{i:04}");
        match searcher.suggest(&id) {
            Suggestion::Config(config) => {
                assert!(config.is_object(), "{config}");
                let result: Map<String, Value> = [(metric.clone(), json!(i as f64 * 0.5))]
                    .into_iter()
                    .collect();
                searcher.on_result(&id, &result);
                searcher.on_trial_complete(&id, Some(&result), false);
            }
            Suggestion::Wait | Suggestion::Finished => break,
        }
    }
    let _ = searcher.state();

    let space = SearchSpace::from_json(&plan.param_space).expect("plan() parsed it once");
    sample(&space, plan.num_samples.min(DRAWS), plan.seed);
}

/// Draws from `space` at random, as grids of a few points, and after a
/// skip; checks every value against its domain.
fn sample(space: &SearchSpace, num_samples: u64, seed: u64) {
    let domains: Vec<Domain> = space
        .domains()
        .into_iter()
        .map(|(_, d)| d.clone())
        .collect();
    // Two configs with each domain's place marked differently: where they
    // differ is a domain, whatever the parameter names are (they may
    // contain dots) and whatever the fixed values look like.
    let marks = (
        space.build(|i, _| json!(i)),
        space.build(|i, _| json!(-(i as i64) - 1)),
    );

    if let Ok(mut configs) = space.configs(num_samples, seed) {
        for config in configs.by_ref().take(DRAWS as usize) {
            check((&marks.0, &marks.1), &config, &domains);
        }
        configs.skip_configs(DRAWS);
        if let Some(config) = configs.next() {
            check((&marks.0, &marks.1), &config, &domains);
        }
    }
    for points in [1, 2, 5] {
        let Ok(grid) = space.enumerated(Some(points)) else {
            continue;
        };
        if let Ok(configs) = grid.configs(1, seed) {
            for config in configs.take(DRAWS as usize) {
                check((&marks.0, &marks.1), &config, &domains);
            }
        }
    }
}

fn check(marks: (&Value, &Value), config: &Value, domains: &[Domain]) {
    match marks {
        (a, b) if a == b => assert_eq!(a, config, "fixed values are copied"),
        (Value::Object(a), Value::Object(b)) => {
            let values = config.as_object().expect("tables stay tables");
            assert_eq!(a.len(), values.len(), "{config}");
            for (name, mark) in a {
                check((mark, &b[name]), &values[name], domains);
            }
        }
        (a, _) => in_domain(&domains[a.as_u64().unwrap() as usize], config),
    }
}

fn in_domain(domain: &Domain, value: &Value) {
    match *domain {
        Domain::GridSearch(ref values) | Domain::Choice(ref values) => {
            assert!(values.contains(value), "{value} not among {values:?}")
        }
        Domain::Uniform { low, high }
        | Domain::LogUniform { low, high }
        | Domain::QUniform { low, high, .. } => {
            let x = value.as_f64().unwrap_or(f64::NAN);
            assert!(low <= x && x <= high, "{value} outside {domain:?}");
        }
        Domain::RandInt { low, high } => {
            let n = value.as_i64();
            assert!(
                n.is_some_and(|n| low <= n && n < high),
                "{value} outside {domain:?}"
            );
        }
    }
}
