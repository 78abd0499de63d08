//! Control requests to a running experiment (`wtune::tune::control`): stop,
//! pause, resume and add trials, and stop the experiment, as a control
//! server sends them, against the real runner with plain-Rust trainables.
//! Every wait here polls for a state with a generous limit; nothing asserts
//! how long anything takes.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wtune::report::{StateFile, TrialFiles, state};
use wtune::tune::resume::{self, ErroredTrials};
use wtune::tune::{
    Asha, AshaConfig, CheckpointPolicy, Command, ControlError, Controller, ExperimentSummary, Fifo,
    FnBackend, Mode, RunError, RunSpec, Runner, STOPPED_BY_REQUEST, Scheduler, Step, StopCriteria,
    Trial, TrialStatus, control,
};

/// Trials that report `score = x * iteration` every millisecond or so, for
/// `iterations` iterations.
fn spec(dir: &Path, configs: Vec<Value>, iterations: u64, max_concurrent: usize) -> RunSpec {
    RunSpec {
        metric: Some("score".into()),
        mode: Mode::Max,
        stop: StopCriteria {
            training_iteration: Some(iterations),
            ..Default::default()
        },
        max_concurrent,
        configs,
        checkpoint: CheckpointPolicy::default(),
        ..RunSpec::new("control", dir.to_path_buf())
    }
}

fn slow() -> FnBackend {
    FnBackend::new(|config: &Value| {
        let x = config["x"].as_f64().unwrap_or(1.0);
        Ok(move |it: u64| {
            std::thread::sleep(Duration::from_millis(1));
            Ok(Step {
                metrics: vec![("score".into(), x * it as f64)],
                done: false,
                fuel: 1,
            })
        })
    })
}

/// Starts the run on its own task; returns the controller and the handle.
fn start(
    runtime: &tokio::runtime::Runtime,
    spec: RunSpec,
    scheduler: Box<dyn Scheduler>,
) -> (
    Controller,
    tokio::task::JoinHandle<Result<ExperimentSummary, RunError>>,
) {
    let (controller, requests) = control::channel();
    let runner = Runner::new(slow(), spec, scheduler)
        .callback(TrialFiles::new())
        .callback(StateFile::new(json!({"test": true})))
        .control(requests);
    let handle = runtime.spawn(runner.run());
    (controller, handle)
}

/// Sends `command` until the trial it returns satisfies `done` (the runner
/// answers between events, so each answer is a fresh look).
async fn until(controller: &Controller, command: Command, done: impl Fn(&Trial) -> bool) -> Trial {
    let started = Instant::now();
    loop {
        // A trial created later is unknown until then.
        let seen = match controller.send(command.clone()).await {
            Ok(reply) => Some(reply.trial.expect("a trial in the reply")),
            Err(ControlError::UnknownTrial(_)) => None,
            Err(err) => panic!("{command:?}: {err}"),
        };
        if let Some(trial) = seen.as_ref().filter(|t| done(t)) {
            return trial.clone();
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "gave up waiting; last seen: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[test]
fn requests_stop_pause_resume_and_add_trials_between_steps() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let configs = vec![json!({"x": 1.0}), json!({"x": 2.0}), json!({"x": 3.0})];
    let (controller, handle) = start(
        &runtime,
        spec(dir.path(), configs, 1_000_000, 2),
        Box::new(Fifo::default()),
    );
    runtime.block_on(async {
        // Bad requests change nothing.
        assert_eq!(
            controller
                .send(Command::StopTrial("trial_9999".into()))
                .await
                .unwrap_err(),
            ControlError::UnknownTrial("trial_9999".into())
        );
        let err = controller
            .send(Command::AddTrial(json!([1, 2])))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, ControlError::Invalid(m) if m.contains("JSON object")),
            "{err:?}"
        );

        // The first request is taken after the first trials started.
        let stopping = controller
            .send(Command::StopTrial("trial_0000".into()))
            .await
            .unwrap();
        assert_eq!(stopping.trial.unwrap().status, TrialStatus::Running);
        let stopped = until(&controller, get("trial_0000"), |t| {
            t.status == TrialStatus::Terminated
        })
        .await;
        assert_eq!(stopped.stop_reason.as_deref(), Some(STOPPED_BY_REQUEST));
        assert!(!stopped.held, "an ended trial is not held");
        let err = controller
            .send(Command::StopTrial("trial_0000".into()))
            .await
            .unwrap_err();
        assert!(matches!(err, ControlError::Conflict(_)), "{err:?}");

        // A running trial is checkpointed and held PAUSED; its slot goes to
        // the next trial, and no scheduler decision starts it again.
        let pausing = controller
            .send(Command::PauseTrial("trial_0001".into()))
            .await
            .unwrap();
        assert!(pausing.trial.unwrap().held);
        let paused = until(&controller, Command::PauseTrial("trial_0001".into()), |t| {
            t.status == TrialStatus::Paused
        })
        .await;
        assert!(paused.held);
        assert_eq!(
            paused.latest_checkpoint().map(|c| c.iteration),
            Some(paused.iterations),
            "paused at a checkpoint of its last iteration"
        );
        until(&controller, Command::PauseTrial("trial_0002".into()), |t| {
            t.status == TrialStatus::Paused
        })
        .await;

        // Both slots are free, two trials held: a new trial takes one.
        let added = controller
            .send(Command::AddTrial(json!({"x": 5.0})))
            .await
            .unwrap()
            .trial
            .unwrap();
        assert_eq!(added.trial_id, "trial_0003");
        assert_eq!(added.config, json!({"x": 5.0}));
        until(&controller, get("trial_0003"), |t| {
            t.status == TrialStatus::Running && t.iterations > 0
        })
        .await;
        let err = controller
            .send(Command::ResumeTrial("trial_0003".into()))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, ControlError::Conflict(m) if m.contains("not held")),
            "{err:?}"
        );

        // Resumed, a held trial continues from its checkpoint.
        let resumed = controller
            .send(Command::ResumeTrial("trial_0001".into()))
            .await
            .unwrap()
            .trial
            .unwrap();
        assert!(!resumed.held);
        until(&controller, get("trial_0001"), |t| {
            t.status == TrialStatus::Running && t.iterations > paused.iterations
        })
        .await;

        let first = controller.send(Command::StopExperiment).await.unwrap();
        assert!(first.message.contains("stops"), "{first:?}");
        // The run may end before a second request is taken.
        match controller.send(Command::StopExperiment).await {
            Ok(again) => assert!(again.message.contains("already stopping"), "{again:?}"),
            Err(err) => assert_eq!(err, ControlError::Ended),
        }
    });
    let summary = runtime.block_on(handle).unwrap().unwrap();
    assert_eq!(summary.halted.as_deref(), Some(STOPPED_BY_REQUEST));
    let status = |id: &str| {
        let t = summary.trials.iter().find(|t| t.trial_id == id).unwrap();
        (t.status, t.held)
    };
    assert_eq!(status("trial_0000"), (TrialStatus::Terminated, false));
    assert_eq!(status("trial_0001"), (TrialStatus::Paused, false));
    assert_eq!(status("trial_0002"), (TrialStatus::Paused, true));
    assert_eq!(status("trial_0003"), (TrialStatus::Paused, false));
    // The run is over: requests say so.
    assert_eq!(
        runtime
            .block_on(controller.send(get("trial_0000")))
            .unwrap_err(),
        ControlError::Ended
    );

    // `wtune resume` runs held trials again, and tells their scheduler.
    let mut saved = state::load(dir.path(), false).unwrap().unchecked();
    let mut trials = std::mem::take(&mut saved.trials);
    assert!(trials[2].held, "the hold is saved");
    let plan = resume::prepare(
        &slow(),
        &mut trials,
        dir.path(),
        &CheckpointPolicy::default(),
        ErroredTrials::Keep,
    );
    assert_eq!(plan.released, ["trial_0002"]);
    assert!(trials.iter().all(|t| !t.held));
}

fn get(id: &str) -> Command {
    Command::GetTrial(id.into())
}

#[test]
fn a_held_trial_keeps_the_run_open_until_it_is_resumed() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (controller, handle) = start(
        &runtime,
        spec(dir.path(), vec![json!({"x": 1.0})], 300, 1),
        Box::new(Fifo::default()),
    );
    runtime.block_on(async {
        controller
            .send(Command::PauseTrial("trial_0000".into()))
            .await
            .unwrap();
        until(&controller, get("trial_0000"), |t| {
            t.status == TrialStatus::Paused
        })
        .await;
        // Nothing runs now; a run that ended here would refuse the resume.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!handle.is_finished());
        controller
            .send(Command::ResumeTrial("trial_0000".into()))
            .await
            .unwrap();
    });
    let summary = runtime.block_on(handle).unwrap().unwrap();
    let trial = &summary.trials[0];
    assert_eq!(trial.status, TrialStatus::Terminated);
    assert_eq!(trial.iterations, 300);
    assert_eq!(summary.halted, None);
}

#[test]
fn holds_work_with_a_scheduler_that_pauses_trials_itself() {
    // ASHA's promotion variant pauses trials at each rung and promotes
    // them later; a held trial must be neither promoted nor stopped by it
    // while held, and must finish normally once resumed.
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let config = AshaConfig {
        max_t: 60.0,
        grace_period: 5.0,
        reduction_factor: 2.0,
        variant: wtune::tune::AshaVariant::Promotion,
        ..AshaConfig::default()
    };
    let asha = Asha::new(config, "score", Mode::Max, 0).unwrap();
    let configs = (1..=4).map(|x| json!({"x": x as f64})).collect();
    let (controller, handle) = start(&runtime, spec(dir.path(), configs, 60, 2), Box::new(asha));
    runtime.block_on(async {
        // Trials are created as slots free up: the second once the first
        // has launched (the first launch is a probe of the configs).
        until(&controller, get("trial_0001"), |_| true).await;
        controller
            .send(Command::PauseTrial("trial_0001".into()))
            .await
            .unwrap();
        until(&controller, get("trial_0001"), |t| {
            t.status == TrialStatus::Paused
        })
        .await;
        until(&controller, get("trial_0000"), |t| t.status.is_finished()).await;
        until(&controller, get("trial_0001"), |t| {
            t.status == TrialStatus::Paused && t.held
        })
        .await;
        controller
            .send(Command::ResumeTrial("trial_0001".into()))
            .await
            .unwrap();
    });
    let summary = runtime.block_on(handle).unwrap().unwrap();
    assert_eq!(summary.halted, None);
    for trial in &summary.trials {
        assert!(trial.status.is_finished(), "{trial:?}");
        assert!(!trial.held);
    }
    let resumed = &summary.trials[1];
    assert_eq!(resumed.status, TrialStatus::Terminated, "{resumed:?}");
}

#[test]
fn a_held_trial_at_the_end_of_the_list_does_not_stop_new_trials() {
    // Trials are created one at a time as slots free up, and none while the
    // newest waits to start; a held one must not count as waiting.
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let configs = (1..=3).map(|x| json!({"x": x as f64})).collect();
    let (controller, handle) = start(
        &runtime,
        spec(dir.path(), configs, 30, 1),
        Box::new(Fifo::default()),
    );
    runtime.block_on(async {
        let added = controller
            .send(Command::AddTrial(json!({"x": 9.0})))
            .await
            .unwrap()
            .trial
            .unwrap();
        let held = controller
            .send(Command::PauseTrial(added.trial_id.clone()))
            .await
            .unwrap()
            .trial
            .unwrap();
        assert_eq!((held.status, held.held), (TrialStatus::Pending, true));
        // Every listed config runs while it is held...
        until(&controller, get("trial_0003"), |t| t.status.is_finished()).await;
        // ...and then the run waits for it, until it is stopped.
        controller
            .send(Command::StopTrial(added.trial_id.clone()))
            .await
            .unwrap();
    });
    let summary = runtime.block_on(handle).unwrap().unwrap();
    let ran: Vec<(&str, TrialStatus, u64)> = summary
        .trials
        .iter()
        .map(|t| (t.trial_id.as_str(), t.status, t.iterations))
        .collect();
    assert_eq!(
        ran,
        [
            ("trial_0000", TrialStatus::Terminated, 30),
            ("trial_0001", TrialStatus::Terminated, 0),
            ("trial_0002", TrialStatus::Terminated, 30),
            ("trial_0003", TrialStatus::Terminated, 30),
        ]
    );
}
