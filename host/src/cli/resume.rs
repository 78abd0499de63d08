//! `wtune resume`: an interrupted experiment, continued from its directory.

use std::path::{Path, PathBuf};

mod changes;

use crate::report::state;
use crate::sandbox::{Program, SandboxOptions};
use crate::tune::resume::{self, ErroredTrials};
use crate::tune::{DecisionState, FuelMoment, Listed, ResultOrder, Scheduler, Searcher};
use crate::wasm_backend::WasmBackend;

use super::Failure;
use super::args::{CacheArgs, ResumeArgs};
use super::common::{lock, sandbox, snapshot_key};
use super::execute::{Ready, Resumed, execute};
use super::setup::Setup;
use changes::Changes;

/// The entry point of `wtune resume DIR`: continues an interrupted
/// experiment from its saved state, refusing before anything changes when
/// the state, the component or the saved decisions do not fit.
pub(super) fn resume_experiment(args: ResumeArgs) -> Result<(), Failure> {
    let serve = args.serve.options()?;
    let (lock, sealed) = locked_state(&args.dir, args.previous_state)?;
    let (state, mut setup) = opened_state(
        sealed,
        args.snapshot_key_file,
        &args.dir,
        args.previous_state,
    )?;
    let model = args
        .model
        .map(|m| std::path::absolute(&m).unwrap_or(m))
        .unwrap_or_else(|| setup.model.clone());
    // Everything that can refuse the resume comes before anything changes
    // in the directory.
    let changes = Changes::new(args.changes, &args.fixed, &setup)?;
    let mut trials = state.trials;
    let more_trials = changes.resample(&mut setup, trials.len())?;
    let extended = changes.extend_stops(&mut setup, &mut trials)?;
    changes.relimit(&mut setup)?;
    changes.move_compute(&mut setup);
    let backend = admitted_backend(&mut setup, model, args.cache)?;
    let decisions = &state.decisions;
    let (mut scheduler, mut searcher) = restored_deciders(&setup, decisions)?;
    if more_trials {
        scheduler.on_more_trials();
    }
    let errored = if args.retry_errored {
        ErroredTrials::Retry
    } else if args.restart_errored {
        ErroredTrials::Restart
    } else {
        ErroredTrials::Keep
    };
    let output_dir = std::path::absolute(&args.dir).unwrap_or(args.dir.clone());
    resume::refuse_unreadable(&backend, &trials, &output_dir, errored).map_err(Failure::user)?;
    setup.spec.output_dir = output_dir.clone();
    let ready = Ready::new(&backend, setup.spec.clone(), &setup, serve)?;
    if args.previous_state {
        move_damaged_state_aside(&args.dir)?;
    }
    let moment = fuel_moment(&setup, decisions, &state.status);
    let plan = resume::prepare_at(
        &backend,
        &mut trials,
        &output_dir,
        &setup.spec.checkpoint,
        errored,
        moment,
    );
    for (path, why) in &plan.damaged {
        eprintln!(
            "note: skipping damaged checkpoint {}: {why}",
            path.display()
        );
    }
    eprintln!(
        "resuming {}: {} trials continue from checkpoints, {} start over, {} not started yet, {} finished",
        output_dir.display(),
        plan.continued.len(),
        plan.restarted.len(),
        plan.pending,
        plan.finished
    );
    resume::retry_errored(&plan, &trials, scheduler.as_mut(), searcher.as_mut());
    if !extended.is_empty() {
        eprintln!(
            "extending {} finished trial{} under the new stopping criteria: {}",
            extended.len(),
            if extended.len() == 1 { "" } else { "s" },
            extended.join(", ")
        );
    }
    for trial in trials.iter().filter(|t| extended.contains(&t.trial_id)) {
        // They ended for the scheduler and the searcher: live again.
        scheduler.on_trial_retry(trial);
        searcher.on_trial_retry(&trial.trial_id);
    }
    // A trial that ended in ERROR and runs again from a result that says
    // `done` was being extended under new stopping criteria when it failed
    // (nothing else runs a finished trial again): that result does not end
    // it now either.
    let mut extended = extended;
    extended.extend(plan.retried.iter().cloned());
    let decisions = decisions.clone();
    execute(
        backend,
        ready,
        (scheduler, searcher),
        Some(Resumed {
            trials,
            decisions,
            extended,
        }),
        &setup,
        lock,
    )
}

/// The moment a run in fuel order continues from: the saved state's, or
/// none, said once, when an unfinished run's state (`status`) marks none
/// (a halted run, an older wtune's state) and decisions may then differ
/// from an uninterrupted run's.
fn fuel_moment<'a>(
    setup: &Setup,
    decisions: &'a DecisionState,
    status: &str,
) -> Option<&'a FuelMoment> {
    if setup.spec.result_order != ResultOrder::Fuel {
        return None;
    }
    if decisions.moment.is_none() && status != "finished" {
        eprintln!(
            "note: the saved state marks no moment of the run to continue from (the run was \
             halted, or saved by an older wtune): from here, decisions may differ from those \
             of an uninterrupted run"
        );
    }
    decisions.moment.as_ref()
}

/// Locks the experiment directory, then reads its state (the one before
/// the newest with `previous`). Locked before the state is read, not only
/// before anything changes (resuming moves a damaged state aside and
/// deletes the checkpoints of restarted trials): a wtune finishing beside
/// this one may still write a newer state. A missing directory is left to
/// the state's error.
fn locked_state(dir: &Path, previous: bool) -> Result<(std::fs::File, state::Sealed), Failure> {
    let lock = dir.is_dir().then(|| lock(dir)).transpose()?;
    let state = state::load(dir, previous).map_err(|e| {
        let hint = match e {
            state::StateError::Damaged(..) if !previous => format!(
                "; the state before it is kept: run `wtune resume {} --previous-state`",
                dir.display()
            ),
            _ => String::new(),
        };
        Failure::user(format!("{e}{hint}"))
    })?;
    let lock =
        lock.ok_or_else(|| Failure::user(format!("{} is not a directory", dir.display())))?;
    Ok((lock, state))
}

/// The state, opened under the snapshot key, and its setup. The key is the
/// one `given` on the command line, which the state must be sealed with
/// (and which the resumed run then uses, wherever the setup said it was);
/// else the one the state's setup names, whose MAC then guards against
/// accidents, not against whoever can write the directory, who could name
/// a key of their own. An unsealed state naming a key was written before
/// states were sealed (or lost its seal): read, with a warning.
fn opened_state(
    sealed: state::Sealed,
    given: Option<PathBuf>,
    dir: &Path,
    previous: bool,
) -> Result<(state::ExperimentState, Setup), Failure> {
    let unreadable = |e: serde_json::Error| {
        Failure::user(format!(
            "{}: the saved setup cannot be read by this wtune: {e}",
            dir.display()
        ))
    };
    let named: Setup = serde_json::from_value(sealed.setup().clone()).map_err(unreadable)?;
    let given = given.map(|file| std::path::absolute(&file).unwrap_or(file));
    let key_file = match (&given, &named.snapshot_key_file) {
        (Some(file), _) => Some(file.clone()),
        (None, Some(file)) if sealed.is_sealed() => Some(file.clone()),
        (None, Some(file)) => {
            eprintln!(
                "warning: the saved state names the snapshot key {} but carries no MAC (written \
                 by an older wtune, or its seal was removed); pass --snapshot-key-file to \
                 require one",
                file.display()
            );
            None
        }
        (None, None) => None,
    };
    let key = snapshot_key(key_file.as_deref())?;
    let state = sealed.open(key.as_ref()).map_err(|e| {
        let hint = if given.is_none() && key.is_none() {
            "; resume with --snapshot-key-file".to_owned()
        } else if !previous {
            // A damaged file fails its MAC as an edited one does.
            format!(
                "; if it was damaged, the state before it is kept: run `wtune resume {} \
                 --previous-state`",
                dir.display()
            )
        } else {
            String::new()
        };
        Failure::user(format!("{e}{hint}; nothing was changed"))
    })?;
    // The body is authenticated now: read again from it, not from what
    // was read before.
    let mut setup: Setup = serde_json::from_value(state.setup.clone()).map_err(unreadable)?;
    if given.is_some() {
        setup.snapshot_key_file = given;
    }
    Ok((state, setup))
}

/// The backend for the component at `model`, which must be the one the
/// experiment ran: its digest is checked before the file is compiled, so
/// resuming compiles (and runs) nothing the experiment did not admit.
fn admitted_backend(
    setup: &mut Setup,
    model: PathBuf,
    cache: CacheArgs,
) -> Result<WasmBackend, Failure> {
    let sandbox = sandbox(
        cache,
        SandboxOptions {
            max_wasm_stack: setup.max_wasm_stack,
            compute: setup.compute,
            compile: setup.compile,
            allowed_components: setup.allowed_components.clone(),
            ..SandboxOptions::default()
        },
    )?;
    let bytes = std::fs::read(&model)
        .map_err(|e| Failure::user(format!("cannot read {}: {e}", model.display())))?;
    let digest = blake3::hash(&bytes).to_hex().to_string();
    if digest != setup.model_blake3 {
        return Err(Failure::user(format!(
            "{} is not the component the experiment ran (its blake3 {}, expected {:.12}); pass \
             the original with --model",
            model.display(),
            &digest[..12],
            setup.model_blake3
        )));
    }
    let program: Program = sandbox
        .load_bytes(&bytes)
        .map_err(|e| Failure::user(format!("{}: {e}", model.display())))?;
    setup.model = model;
    let key = snapshot_key(setup.snapshot_key_file.as_deref())?;
    WasmBackend::new(program, setup.limits.clone(), setup.data.clone())
        .snapshot_key(key)
        .checkpoint_mode(setup.checkpoint)
        .map_err(Failure::user)
}

/// A scheduler and a searcher, ready to continue.
type Deciders = (Box<dyn Scheduler>, Box<dyn Searcher>);

/// The scheduler and searcher the setup names, with their saved states
/// taken back; refused when the state is of another algorithm.
fn restored_deciders(setup: &Setup, decisions: &DecisionState) -> Result<Deciders, Failure> {
    let mut scheduler = setup.scheduler()?;
    let saved = &decisions.scheduler;
    // The first state early versions wrote had no scheduler yet (no name):
    // nothing to take back.
    if !saved.name.is_empty() {
        if saved.name != scheduler.name() {
            return Err(Failure::user(format!(
                "the saved state is of the {} scheduler, but the experiment's setup names {}",
                saved.name,
                scheduler.name()
            )));
        }
        scheduler
            .restore_state(&saved.state)
            .map_err(|e| Failure::user(format!("the saved {} scheduler state: {e}", saved.name)))?;
    }
    let searcher = match &decisions.searcher {
        Some(saved) if !setup.param_space.is_null() => {
            let mut searcher = setup.searcher()?;
            if saved.name != searcher.name() {
                return Err(Failure::user(format!(
                    "the saved state is of the {} searcher, but the experiment's setup names {}",
                    saved.name,
                    searcher.name()
                )));
            }
            searcher.restore_state(&saved.state).map_err(|e| {
                Failure::user(format!("the saved {} searcher state: {e}", saved.name))
            })?;
            searcher
        }
        // Set up before searchers existed: every trial was created up
        // front and is in the saved list.
        _ => Box::new(Listed::default()),
    };
    Ok((scheduler, searcher))
}

/// Keeps the damaged newest state out of the way: the first write of this
/// run would otherwise make it the "previous" one, replacing the good state
/// being resumed from.
fn move_damaged_state_aside(dir: &Path) -> Result<(), Failure> {
    let current = dir.join(state::STATE_FILE);
    if current.exists() {
        let aside = dir.join("experiment_state.damaged.json");
        std::fs::rename(&current, &aside)
            .map_err(|e| Failure::runtime(format!("moving {} aside: {e}", current.display())))?;
        eprintln!("note: the damaged state is kept as {}", aside.display());
    }
    Ok(())
}
