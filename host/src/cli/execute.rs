//! Running an experiment's trials to the end, for `run` and `resume` alike.

use crate::report::terminal::inert;
use crate::report::{
    DecisionLog, ExperimentFile, MlflowLogger, Progress, StateFile, TrialFiles, summary_text,
    tensorboard_line,
};
use crate::serve;
use crate::tune::resume;
use crate::tune::{
    DecisionState, ExperimentSummary, ResultOrder, RunError, RunSpec, Runner, STOPPED_BY_REQUEST,
    Scheduler, SchedulerSpec, Searcher, Trial, TrialStatus, control,
};
use crate::wasm_backend::WasmBackend;
use tokio::sync::mpsc::UnboundedSender;

use super::Failure;
use super::common::print_out;
use super::setup::Setup;

/// What `wtune resume` carries on from: the saved trials and decisions.
pub(super) struct Resumed {
    pub(super) trials: Vec<Trial>,
    pub(super) decisions: DecisionState,
    /// Trials whose checkpoint's `done` does not end them: finished trials
    /// that new stopping criteria let go on, and errored ones run again.
    pub(super) extended: Vec<String>,
}

/// What `run` and `resume` make sure of before they change anything in
/// the experiment's directory (create it, delete a restarted trial's
/// checkpoints): the trials fit the machine's compute, and the dashboard's
/// address can be listened on. Either failing afterwards left a run's
/// directory behind, or a resume's checkpoints deleted, for nothing.
pub(super) struct Ready {
    spec: RunSpec,
    listener: Option<serve::Listener>,
    /// The setup as the state file keeps it ([`Setup::saved`]).
    saved: serde_json::Value,
}

impl Ready {
    /// Fits `spec` to the compute `backend` has ([`WasmBackend::fit_spec`]),
    /// checks that `setup` can be saved, and binds `serve`'s address.
    pub(super) fn new(
        backend: &WasmBackend,
        mut spec: RunSpec,
        setup: &Setup,
        serve: Option<serve::ServeOptions>,
    ) -> Result<Self, Failure> {
        backend
            .fit_spec(&mut spec, &setup.compute, |note| eprintln!("note: {note}"))
            .map_err(Failure::user)?;
        let saved = setup.saved()?;
        let listener = serve
            .map(|options| serve::Listener::bind(&options))
            .transpose()
            .map_err(Failure::user)?;
        Ok(Self {
            spec,
            listener,
            saved,
        })
    }

    /// The run writes to `setup`'s output directory, not the one planned
    /// ([`super::common::claim`] took the next free name).
    pub(super) fn moved_to(&mut self, setup: &Setup) -> Result<(), Failure> {
        self.saved = setup.saved()?;
        self.spec.output_dir.clone_from(&setup.spec.output_dir);
        Ok(())
    }
}

/// Runs trials to the end and reports, for `run` and `resume` alike, while
/// holding the experiment directory's `lock`; with a listener, beside a
/// control server.
pub(super) fn execute(
    backend: WasmBackend,
    ready: Ready,
    (scheduler, searcher): (Box<dyn Scheduler>, Box<dyn Searcher>),
    resumed: Option<Resumed>,
    setup: &Setup,
    lock: std::fs::File,
) -> Result<(), Failure> {
    let _lock = lock;
    let Ready {
        spec,
        listener,
        saved,
    } = ready;
    let runner = assemble(backend, (spec, saved), scheduler, searcher, resumed, setup);
    let runtime = tokio::runtime::Runtime::new()
        .map_err(|e| Failure::runtime(format!("cannot start the runtime: {e}")))?;
    let (interrupt, interrupts) = tokio::sync::mpsc::unbounded_channel();
    let mut runner = runner.interrupts(interrupts);
    let dir = setup.spec.output_dir.clone();
    // Dropped after the run: the page keeps answering until then.
    let _server = match listener {
        Some(listener) => {
            let (served, server) = start_server(&runtime, runner, &dir, listener)?;
            runner = served;
            Some(server)
        }
        None => None,
    };
    forward_ctrl_c(&runtime, interrupt);
    let outcome = runtime.block_on(runner.run());
    if outcome.is_err() {
        // Blocking threads may still be inside other trials' calls; the
        // state is saved, so do not wait for them.
        runtime.shutdown_background();
    }
    report(outcome, &dir)
}

/// The runner with its callbacks (the decision log before the state file,
/// so that a state never counts decisions the log lacks; every callback
/// hears the end even when one fails) and, resuming, what the earlier runs
/// left.
fn assemble(
    backend: WasmBackend,
    (spec, saved): (RunSpec, serde_json::Value),
    scheduler: Box<dyn Scheduler>,
    searcher: Box<dyn Searcher>,
    resumed: Option<Resumed>,
    setup: &Setup,
) -> Runner<WasmBackend> {
    let (trials, resumed) = match resumed {
        Some(Resumed {
            trials,
            decisions,
            extended,
        }) => (trials, Some((decisions, extended))),
        None => (Vec::new(), None),
    };
    let total = searcher.total().map(|n| n.max(trials.len() as u64));
    // Sealed with the checkpoints' key: a resume that is given the key
    // then trusts the state as far as it trusts the checkpoints.
    let state = StateFile::new(saved).sealed(backend.key().cloned());
    // In fuel order, the moment the saved state was taken at.
    let moment = resumed
        .as_ref()
        .and_then(|(decisions, _)| decisions.moment.clone())
        .filter(|_| spec.result_order == ResultOrder::Fuel);
    // Resuming, a trial the saved state does not list yet may have left
    // its directory, results and checkpoints behind: its work is picked up
    // (or, continuing a moment, which the trial postdates, redone).
    let adopt = {
        let (backend, policy) = (backend.clone(), spec.checkpoint.clone());
        let at_moment = moment.is_some();
        move |trial: &mut Trial| resume::adopt_reported_at(&backend, trial, &policy, at_moment)
    };
    let mut decision_log = DecisionLog::new();
    let mut runner = Runner::new(backend, spec, scheduler).searcher(searcher);
    if let Some(moment) = moment {
        decision_log = decision_log.resumed_at(moment.decisions);
        runner = runner.continue_at(moment);
    }
    if let Some((resumed, extended)) = resumed {
        runner = runner.adopt_from_disk(adopt);
        runner = runner.fuel_burned(resumed.fuel_burned);
        if let Some(state) = resumed.stopper {
            runner = runner.stopper_state(state);
        }
        runner = runner.extending(extended);
    }
    // PBT changes configurations during trials, which TensorBoard's HParams
    // sessions and MLflow's params cannot show: their values are also
    // logged as metrics.
    let pbt = matches!(setup.scheduler, SchedulerSpec::Pbt(_));
    // The decision log before the state: at a moment, the decisions a state
    // counts are flushed before that state is written, so a kill between
    // the two never leaves a state counting decisions the log lacks.
    let mut runner = runner
        .with_trials(trials)
        .callback(decision_log)
        .callback(state)
        .callback(
            TrialFiles::new()
                .cap_per_trial(setup.limits.result_bytes)
                .tensorboard(setup.tracking.tensorboard)
                .config_scalars(pbt),
        )
        .callback(ExperimentFile::new(setup.run_info()));
    if let Some(target) = &setup.tracking.mlflow {
        match MlflowLogger::start(&target.uri, &target.experiment) {
            Ok(logger) => runner = runner.callback(logger.config_metrics(pbt)),
            Err(e) => eprintln!(
                "warning: cannot start MLflow logging ({e}); the experiment goes on without it"
            ),
        }
    }
    runner.callback(Progress::new().total(total))
}

/// Starts the dashboard and control server for `dir`, and hands its
/// requests to `runner`.
fn start_server(
    runtime: &tokio::runtime::Runtime,
    runner: Runner<WasmBackend>,
    dir: &std::path::Path,
    listener: serve::Listener,
) -> Result<(Runner<WasmBackend>, serve::Server), Failure> {
    let (controller, requests) = control::channel();
    let runner = runner.control(requests);
    let tokened = listener.tokened();
    let server = {
        let _entered = runtime.enter();
        serve::Server::start_on(listener, dir.to_path_buf(), Some(controller))
            .map_err(Failure::user)?
    };
    eprintln!("serving the dashboard at {}", server.url());
    if tokened {
        eprintln!(
            "(API requests need the token; open the page as {}#token=TOKEN)",
            server.url()
        );
    }
    Ok((runner, server))
}

/// Ctrl-C, forwarded to the runner: the first halts the run after the
/// trials' current steps, a second leaves at once.
fn forward_ctrl_c(runtime: &tokio::runtime::Runtime, interrupt: UnboundedSender<()>) {
    runtime.spawn(async move {
        let mut count = 0;
        while tokio::signal::ctrl_c().await.is_ok() {
            count += 1;
            if count == 1 {
                eprintln!(
                    "\ninterrupted: checkpointing running trials after their current step and \
                     saving state (Ctrl-C again to exit at once)"
                );
            }
            if interrupt.send(()).is_err() {
                break;
            }
        }
    });
}

/// Prints the summary and maps how the run ended to the command's outcome:
/// an interrupt is status 130, a halt or a run whose every trial failed an
/// error naming how to go on.
fn report(
    outcome: Result<ExperimentSummary, RunError>,
    dir: &std::path::Path,
) -> Result<(), Failure> {
    let summary = match outcome {
        Ok(summary) => summary,
        Err(RunError::Interrupted) => {
            return Err(Failure {
                message: format!(
                    "interrupted; continue the experiment with `wtune resume {}`",
                    dir.display()
                ),
                status: 130,
            });
        }
        Err(err @ RunError::TrialFailed { .. }) => {
            return Err(Failure::runtime(format!(
                "{}\nthe experiment stopped; continue it with `wtune resume {}`",
                inert(&err.to_string()),
                dir.display()
            )));
        }
        Err(err) => return Err(Failure::runtime(err)),
    };

    // The time the user waited, loading and compiling included: the
    // runner's own is a fraction of it for short runs.
    let mut summary = summary;
    summary.wall_time = super::started().elapsed();
    print_out(&summary_text(&summary));
    if let Some(line) = tensorboard_line(&summary.output_dir) {
        print_out(&format!("{}\n", inert(&line)));
    }
    if summary.halted.as_deref() == Some(STOPPED_BY_REQUEST) {
        eprintln!(
            "the experiment was stopped by a control request; continue it with `wtune resume {}`",
            summary.output_dir.display()
        );
        return Ok(());
    }
    if let Some(reason) = &summary.halted {
        let mut failure = Failure::runtime(format!(
            "the experiment stopped early: {}; continue it with `wtune resume {}`",
            inert(reason),
            summary.output_dir.display()
        ));
        if reason == "interrupted" {
            // The shell's convention for a run ended by SIGINT.
            failure.status = 130;
        }
        return Err(failure);
    }
    let errors = summary.count(TrialStatus::Error);
    if errors > 0 && errors == summary.trials.len() {
        return Err(Failure::runtime(format!(
            "all {errors} trials failed; see the reasons above and the logs in {}",
            summary.output_dir.display()
        )));
    }
    Ok(())
}
