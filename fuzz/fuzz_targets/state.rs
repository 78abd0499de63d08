//! The experiment-state loader, `wtune::report::state::decode`, and what
//! `wtune resume` does next with a decoded state: build the scheduler and
//! searcher its saved setup names and hand them, and an experiment stopper,
//! their saved states; then drive them a little with the saved trials.
//!
//! The first byte of an input picks the mode, the rest is the file:
//! - bit 0 clear: the rest is a whole state file (header line and body);
//! - bit 0 set: the rest is the JSON body, and the target writes the header
//!   line with the body's checksum in front of it (as anyone who can write
//!   the file can), so the parsing behind the checksum is fuzzed.
//!
//! Invariants checked: a decoded state written back out decodes to the same
//! state; a restored scheduler or searcher hands out indices of existing
//! trials, and its own state restores into a fresh one.

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use wtune::report::state::{ExperimentState, STATE_VERSION, decode};
use wtune::tune::{
    ExperimentStop, ExperimentStopper, Mode, PlateauConfig, RunSpec, Scheduler, SchedulerSpec,
    SearchSpace, SearchSpec, Searcher, Suggestion, Totals, Trial,
};

/// Trials handed to the restored decision makers, at most.
const MAX_TRIALS: usize = 64;
const METRIC: &str = "loss";

fn with_header(body: &[u8]) -> Vec<u8> {
    let mut file = format!(
        "wtune-experiment-state {STATE_VERSION} blake3={}\n",
        blake3::hash(body).to_hex()
    )
    .into_bytes();
    file.extend_from_slice(body);
    file.push(b'\n');
    file
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let file = if mode & 1 != 0 {
        with_header(rest)
    } else {
        rest.to_vec()
    };
    let path = Path::new("experiment_state.json");
    // A sealed state's MAC cannot hold for arbitrary bytes: what matters
    // here is what reading it does, as the dashboard reads it.
    let state = match decode(path, &file) {
        Ok(sealed) => sealed.unchecked(),
        Err(err) => {
            let _ = err.to_string();
            return;
        }
    };

    // Written back out (as the state writer serializes it), it reads the same.
    let value = serde_json::to_value(&state).expect("a decoded state serializes");
    let body = serde_json::to_vec(&state).expect("a decoded state serializes");
    let again = decode(path, &with_header(&body))
        .and_then(|sealed| sealed.open(None))
        .unwrap_or_else(|e| panic!("a re-written state is refused: {e}"));
    assert_eq!(
        serde_json::to_value(&again).unwrap(),
        value,
        "the state changed across a write and a read"
    );

    resume(&state);
});

/// The parts of the saved setup `wtune resume` rebuilds the decision makers
/// from (the rest of the setup names the component and its limits).
#[derive(Deserialize)]
struct Setup {
    spec: RunSpec,
    scheduler: SchedulerSpec,
    seed: u64,
    num_samples: u64,
    #[serde(default)]
    param_space: Value,
    #[serde(default)]
    search: SearchSpec,
}

/// What `wtune resume` does with the saved decision states: build the
/// scheduler and searcher the saved setup names and hand them their states
/// (a setup that cannot be read gets small default ones, so that hand-made
/// states reach the restore code too).
fn resume(state: &ExperimentState) {
    let trials: Vec<Trial> = state.trials.iter().take(MAX_TRIALS).cloned().collect();
    let saved = &state.decisions;
    let setup = Setup::deserialize(&state.setup).ok();

    let build_scheduler = || match &setup {
        Some(setup) => setup
            .scheduler
            .build(setup.spec.metric.as_deref(), setup.spec.mode, setup.seed)
            .ok(),
        None => default_scheduler(&saved.scheduler.name),
    };
    if let Some(mut scheduler) = build_scheduler()
        && !saved.scheduler.name.is_empty()
        && saved.scheduler.name == scheduler.name()
        && scheduler.restore_state(&saved.scheduler.state).is_ok()
    {
        drive_scheduler(scheduler.as_mut(), &trials);
        let own = scheduler.state();
        let mut fresh = build_scheduler().unwrap();
        if let Err(e) = fresh.restore_state(&own) {
            panic!("a scheduler's own state is refused: {e}\n{own}");
        }
    }

    let build_searcher = || match &setup {
        Some(setup) if !setup.param_space.is_null() => wtune::config::searcher(
            &setup.search,
            &setup.param_space,
            setup.num_samples,
            &setup.spec,
            setup.seed,
        )
        .ok(),
        Some(_) => None,
        None => default_searcher(saved.searcher.as_ref()?.name.as_str()),
    };
    if let Some(saved) = &saved.searcher
        && let Some(mut searcher) = build_searcher()
        && saved.name == searcher.name()
        && searcher.restore_state(&saved.state).is_ok()
    {
        drive_searcher(searcher.as_mut(), &trials);
        let own = searcher.state();
        let mut fresh = build_searcher().unwrap();
        if let Err(e) = fresh.restore_state(&own) {
            panic!("a searcher's own state is refused: {e}\n{own}");
        }
    }

    if let Some(saved) = &saved.stopper {
        let build_stopper = || match &setup {
            Some(setup) => ExperimentStopper::new(
                &setup.spec.stop_experiment,
                setup.spec.metric.as_deref(),
                setup.spec.mode,
            )
            .ok(),
            None => {
                let config = ExperimentStop {
                    max_time: Some(3600.0),
                    max_fuel: Some(1 << 40),
                    plateau: Some(PlateauConfig::default()),
                    ..ExperimentStop::default()
                };
                ExperimentStopper::new(&config, Some(METRIC), Mode::Min).ok()
            }
        };
        if let Some(mut stopper) = build_stopper()
            && stopper.restore_state(saved).is_ok()
        {
            let totals = Totals {
                elapsed_s: 1.0,
                fuel_total: 0,
                trials_created: trials.len(),
            };
            let _ = stopper.check(totals);
            for trial in &trials {
                if let Some(result) = &trial.last_result {
                    let _ = stopper.on_result(&trial.trial_id, result, totals);
                }
            }
            let own = stopper.state();
            let mut fresh = build_stopper().unwrap();
            if let Err(e) = fresh.restore_state(&own) {
                panic!("the experiment stopper's own state is refused: {e}\n{own}");
            }
        }
    }
}

/// The scheduler called `name`, with small parameters.
fn default_scheduler(name: &str) -> Option<Box<dyn Scheduler>> {
    let spec = match name {
        "pbt" => json!({"type": "pbt", "hyperparam_mutations": {"lr": {"uniform": [0.0, 1.0]}}}),
        name if SchedulerSpec::NAMES.contains(&name) => json!({ "type": name }),
        _ => return None,
    };
    let spec: SchedulerSpec = serde_json::from_value(spec).unwrap();
    Some(spec.build(Some(METRIC), Mode::Min, 0).unwrap())
}

fn drive_scheduler(scheduler: &mut dyn Scheduler, trials: &[Trial]) {
    for index in scheduler.take_stops(trials) {
        assert!(index < trials.len(), "take_stops: no trial {index}");
    }
    if let Some(index) = scheduler.choose_next(trials) {
        assert!(index < trials.len(), "choose_next: no trial {index}");
    }
    for trial in trials {
        let _ = scheduler.resources(trial);
        if let Some(result) = &trial.last_result {
            let _ = scheduler.on_result(trial, result);
        }
    }
    if let Some(index) = scheduler.choose_next(trials) {
        assert!(index < trials.len(), "choose_next: no trial {index}");
    }
}

/// The searcher called `name`, over a small fixed space.
fn default_searcher(name: &str) -> Option<Box<dyn Searcher>> {
    if !SearchSpec::NAMES.contains(&name) {
        return None;
    }
    let space = SearchSpace::from_json(&json!({
        "lr": {"loguniform": [1e-4, 1e-1]},
        "width": {"choice": [16, 32, 64]},
        "depth": {"randint": [1, 4]},
    }))
    .unwrap();
    let spec = match name {
        "grid" => json!({"type": "grid", "points": 3}),
        name => json!({ "type": name }),
    };
    let spec = SearchSpec::from_json(&spec).unwrap();
    Some(spec.build(&space, 16, Some(METRIC), Mode::Min, 0).unwrap())
}

fn drive_searcher(searcher: &mut dyn Searcher, trials: &[Trial]) {
    for trial in trials {
        let result = trial.last_result.as_ref();
        if let Some(result) = result {
            searcher.on_result(&trial.trial_id, result);
        }
        searcher.on_trial_complete(&trial.trial_id, result, trial.error.is_some());
    }
    for i in 0..4 {
        let id = format!("trial_fuzz_{i}");
        match searcher.suggest(&id) {
            Suggestion::Config(config) => {
                assert!(config.is_object(), "{config}");
                let result: Map<String, Value> =
                    [(METRIC.to_string(), json!(i))].into_iter().collect();
                searcher.on_trial_complete(&id, Some(&result), false);
            }
            Suggestion::Wait | Suggestion::Finished => break,
        }
    }
}
