//! The `wtune-mlflow` thread: takes what the callback queued, in order,
//! and sends it, metrics batched per run; keeps it while the server cannot
//! take it, trying again with backoff; drops the oldest metrics past a
//! bound and counts them.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::mem;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::client::{CallError, Client};
use super::metric_values;
use crate::report::scalars::Scalars;

/// Most metric values waiting while the server is away; past it the oldest
/// are dropped (and counted): a long outage costs no unbounded memory.
pub(super) const MAX_WAITING_VALUES: usize = 1_000_000;
/// MLflow's limits per `log-batch`.
const BATCH_METRICS: usize = 1000;
const BATCH_PARAMS: usize = 100;
/// First and longest wait before trying a failed request again.
const FIRST_BACKOFF: Duration = Duration::from_millis(250);
const MAX_BACKOFF: Duration = Duration::from_secs(15);
/// Times, and for how long, the server must fail the op at the front of
/// the queue, while it answers another request, before the op is given up
/// as one it cannot take: a guest's metric name its store cannot keep must
/// not hold back every other trial's results, and a store busy for a
/// moment (SQLite's "database is locked") must not cost any. At the end of
/// the experiment the time does not apply: what stays is lost anyway.
const MAX_FRONT_FAILURES: u32 = 3;
const MIN_FAILING: Duration = Duration::from_secs(10);
/// How long the end of an experiment waits for what is still queued when
/// the server is answering.
const FINISH_GRACE: Duration = Duration::from_secs(5);
/// The file in a trial's directory that names its run, so that `wtune
/// resume` logs to the same run and does not send a step twice.
pub(super) const RUN_FILE: &str = "mlflow_run.json";
/// The trial's own record of its results, read for steps the server lacks.
const RESULT_FILE: &str = "result.jsonl";

/// What the callback asks for, in the order the runner saw it.
pub(super) enum Op {
    /// A trial launched: its run is made (or found again) and its params
    /// logged.
    Start {
        trial: usize,
        trial_id: String,
        dir: PathBuf,
        config: Value,
        /// The step of the checkpoint the launch restores (0 for none):
        /// its results up to there are not reported again, they are in
        /// the trial's `result.jsonl`.
        continues_after: u64,
        /// Whether results' configuration values are metrics too
        /// ([`super::MlflowLogger::config_metrics`]).
        config_metrics: bool,
    },
    /// A trial that had ended when this process started (`wtune
    /// resume`): if its run may lack steps or its end (a process killed
    /// while they waited), its run is made or found, the steps the server
    /// lacks are sent from `result.jsonl` and the run is ended with
    /// `status`. A trial whose `mlflow_run.json` says all of it was sent
    /// costs no request.
    Settle {
        trial: usize,
        trial_id: String,
        dir: PathBuf,
        config: Value,
        /// Its last step.
        iterations: u64,
        status: &'static str,
        end_ms: u64,
        config_metrics: bool,
    },
    /// One result's metrics.
    Metrics {
        trial: usize,
        step: u64,
        timestamp_ms: u64,
        values: Vec<(String, f64)>,
    },
    /// A trial ended: `FINISHED` or `FAILED`. A trial that never launched
    /// in this process (a paused trial `wtune resume` ended without
    /// running it) has its run found from `dir`'s `mlflow_run.json`.
    End {
        trial: usize,
        dir: PathBuf,
        status: &'static str,
        end_ms: u64,
    },
    /// The experiment's best trial (its directory `dir`), tagged; the tag
    /// is taken off the experiment's runs an earlier end tagged.
    Best { trial: usize, dir: PathBuf },
    /// The experiment ended: send what is left (briefly) and stop.
    Finish,
}

impl Op {
    fn trial(&self) -> Option<usize> {
        match self {
            Op::Start { trial, .. }
            | Op::Settle { trial, .. }
            | Op::Metrics { trial, .. }
            | Op::End { trial, .. }
            | Op::Best { trial, .. } => Some(*trial),
            Op::Finish => None,
        }
    }
}

/// `mlflow_run.json`.
#[derive(Serialize, Deserialize)]
struct RunFile {
    tracking_uri: String,
    experiment_id: String,
    run_id: String,
    /// The last step whose metrics the server has.
    sent_through: u64,
    /// The server has the run's end (absent in files of older builds).
    #[serde(default)]
    ended: bool,
}

/// A trial's run, as far as the thread knows it.
struct Run {
    dir: PathBuf,
    run_id: String,
    sent_through: u64,
    /// Its params were logged by this process.
    params_logged: bool,
    /// Found in `mlflow_run.json`: marked running again at its start.
    found_again: bool,
    /// The server has its end (kept in `mlflow_run.json`).
    ended: bool,
    /// Steps the server lacks from before this process were queued from
    /// the trial's `result.jsonl` (once per process: later launches of
    /// the trial in it find their results still queued or sent).
    caught_up: bool,
}

/// What happened to what was queued, told at the end.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Outcome {
    /// Metric values dropped while the server was away (the oldest first).
    pub(super) dropped: u64,
    /// Metric values, run updates and tags still queued when the
    /// experiment ended with the server away.
    pub(super) unsent_values: u64,
    pub(super) unsent_updates: u64,
    /// Requests the server refused, and the first refusal.
    pub(super) refused: u64,
    pub(super) first_refusal: Option<String>,
}

/// The tag of the experiment's best trial's run.
const BEST_TAG: &str = "wtune.best_trial";
/// The tag naming a run's experiment directory, which tells this
/// experiment's runs from another's of the same name.
const EXPERIMENT_DIR_TAG: &str = "wtune.experiment_dir";
/// The tag a run is made with that names its creation (the process, the
/// time and the trial's index), for finding it when the answer is lost.
const CREATION_TAG: &str = "wtune.creation";

/// The experiment directory a trial's directory `dir` is in, as tagged.
fn experiment_dir(dir: &Path) -> String {
    dir.parent()
        .map(|p| p.display().to_string())
        .unwrap_or_default()
}

pub(super) struct Worker {
    client: Client,
    uri: String,
    experiment: String,
    experiment_id: Option<String>,
    runs: HashMap<usize, Run>,
    /// Per trial whose run is being made: the tag its creation carries,
    /// so that a retry after an answer that never came (the server made
    /// the run, and the request timed out) finds that run, rather than
    /// leaving it RUNNING beside a second one.
    creating: HashMap<usize, String>,
    queue: VecDeque<Op>,
    waiting_values: usize,
    /// The server stopped answering: the first error, told once.
    down: Option<String>,
    told_down: bool,
    told_back: bool,
    backoff: Duration,
    /// Times in a row the server failed the op at the front of the queue,
    /// and since when.
    front_failures: u32,
    front_failing_since: Option<Instant>,
    /// Queued results the last metrics batch merged.
    merged: usize,
    /// Trials one of whose ops the server failed until it was given up,
    /// and none has gone through since: their next results get one try.
    failing_trials: std::collections::HashSet<usize>,
    outcome: Outcome,
    /// The server refused the experiment itself (credentials, say): no
    /// run can be logged, so nothing more is sent, only counted.
    refusing: bool,
}

impl Worker {
    pub(super) fn new(uri: &str, experiment: &str) -> Self {
        Worker {
            client: Client::new(uri),
            uri: uri.to_string(),
            experiment: experiment.to_string(),
            experiment_id: None,
            runs: HashMap::new(),
            creating: HashMap::new(),
            queue: VecDeque::new(),
            waiting_values: 0,
            down: None,
            told_down: false,
            told_back: false,
            backoff: FIRST_BACKOFF,
            front_failures: 0,
            front_failing_since: None,
            merged: 0,
            failing_trials: Default::default(),
            outcome: Outcome::default(),
            refusing: false,
        }
    }

    /// Runs until [`Op::Finish`] (or the callback is gone) and what was
    /// queued is sent or given up on.
    pub(super) fn run(mut self, ops: Receiver<Op>) -> Outcome {
        let mut finish_by: Option<Instant> = None;
        let mut retry_at: Option<Instant> = None;
        loop {
            if finish_by.is_some_and(|by| Instant::now() >= by) {
                break;
            }
            // Take what has arrived; wait for more only when there is
            // nothing to send now.
            let wait = match (self.queue.is_empty(), retry_at) {
                (true, _) if finish_by.is_some() => break,
                (true, _) => None,
                (false, Some(at)) => Some(at.saturating_duration_since(Instant::now())),
                (false, None) => Some(Duration::ZERO),
            };
            let first = match wait {
                None => ops.recv().map_err(|_| RecvTimeoutError::Disconnected),
                Some(wait) => ops.recv_timeout(wait),
            };
            let mut finishing = false;
            match first {
                Ok(op) => finishing |= self.accept(op),
                Err(RecvTimeoutError::Disconnected) => {
                    finishing = true;
                    // Nothing more can come, and nothing waits: a retry
                    // due later is waited for here, not spun on.
                    if let Some(at) = retry_at {
                        let until = finish_by.map_or(at, |by| at.min(by));
                        std::thread::sleep(until.saturating_duration_since(Instant::now()));
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
            }
            while let Ok(op) = ops.try_recv() {
                finishing |= self.accept(op);
            }
            // At the end, what waits for a retry gets one try at once (and
            // the loop no longer waits for ops that cannot come).
            if finishing && finish_by.is_none() {
                finish_by = Some(Instant::now() + FINISH_GRACE);
                retry_at = None;
            }
            if retry_at.is_some_and(|at| Instant::now() < at) {
                continue;
            }
            retry_at = None;
            if self.queue.is_empty() {
                continue;
            }
            let front_trial = self.queue.front().and_then(Op::trial);
            let sent = self.send_front();
            // The server answered, failing the op: it may be the op's fault.
            let answered = matches!(sent, Err(CallError::Failed(_)));
            let sent = sent.map_err(|error| self.poisoned(error, finish_by.is_some()));
            if !matches!(sent, Err(CallError::Transient(_))) {
                self.front_changed();
            }
            match sent {
                Ok(()) => {
                    if let Some(trial) = front_trial {
                        self.failing_trials.remove(&trial);
                    }
                    if self.down.take().is_some() && !self.told_back {
                        self.told_back = true;
                        tracing::warn!(
                            "MLflow at {} answers again; what waited is being sent",
                            self.uri
                        );
                    }
                    self.backoff = FIRST_BACKOFF;
                }
                Err(CallError::Transient(message) | CallError::Failed(message)) => {
                    if !self.told_down {
                        self.told_down = true;
                        tracing::warn!(
                            "MLflow at {}: {message}. The experiment goes on; its results \
                             are in the trial directories and are sent when the server \
                             answers (this is said once)",
                            self.uri
                        );
                    }
                    self.down.get_or_insert(message);
                    // At the end, a server that is away gets no more time;
                    // one that answers, failing the op, gets its tries
                    // within the grace, after which the op is given up.
                    if finish_by.is_some() && !answered {
                        break;
                    }
                    let at = Instant::now() + self.backoff;
                    retry_at = Some(finish_by.map_or(at, |by| at.min(by)));
                    self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
                }
                Err(CallError::Rejected(message)) if self.experiment_id.is_none() => {
                    // Without its experiment nothing can be logged: asking
                    // again for every result would only load the server.
                    self.refused(message);
                    self.refusing = true;
                    for op in mem::take(&mut self.queue) {
                        self.unsent(&op);
                    }
                    self.waiting_values = 0;
                }
                Err(CallError::Rejected(message)) => {
                    // Sending it again would be refused again: it goes. The
                    // server answered: the next op need not wait.
                    self.backoff = FIRST_BACKOFF;
                    let op = self.queue.pop_front();
                    if let Some(Op::Metrics { values, .. }) = &op {
                        self.waiting_values -= values.len();
                    }
                    self.refused(message);
                }
            }
            if finish_by.is_some_and(|by| Instant::now() >= by) {
                break;
            }
        }
        for op in mem::take(&mut self.queue) {
            self.unsent(&op);
        }
        self.outcome
    }

    /// `error` from sending the front op, as the queue should take it: a
    /// failure the server gave [`MAX_FRONT_FAILURES`] times in a row,
    /// while it answers a request for the experiment, is the op's, and it
    /// is refused; another is the server's, and the op waits.
    fn poisoned(&mut self, error: CallError, finishing: bool) -> CallError {
        let CallError::Failed(message) = error else {
            return error;
        };
        if self.experiment_id.is_none() {
            // The experiment itself failed: nothing else would answer.
            return CallError::Transient(message);
        }
        self.front_failures += 1;
        let since = *self.front_failing_since.get_or_insert_with(Instant::now);
        let trial = self.queue.front().and_then(Op::trial);
        // Results of a trial whose op the server failed before likely hold
        // the same metric name: they get one try. Its start, end or tag
        // get their full tries.
        let repeat = matches!(
            self.queue.front(),
            Some(Op::Metrics { trial, .. }) if self.failing_trials.contains(trial)
        );
        let given_up = repeat
            || (self.front_failures >= MAX_FRONT_FAILURES
                && (finishing || since.elapsed() >= MIN_FAILING));
        if !given_up {
            return CallError::Transient(message);
        }
        match self.client.experiment_id(&self.experiment) {
            Ok(_) => {
                self.failing_trials.extend(trial);
                CallError::Rejected(format!(
                    "{message} (failed {} time(s) in a row while the server answered other \
                     requests)",
                    self.front_failures
                ))
            }
            Err(_) => CallError::Transient(message),
        }
    }

    /// Counts `op` as never sent.
    fn unsent(&mut self, op: &Op) {
        match op {
            Op::Metrics { values, .. } => self.outcome.unsent_values += values.len() as u64,
            Op::Finish => {}
            _ => self.outcome.unsent_updates += 1,
        }
    }

    /// Queues `op`; true for [`Op::Finish`].
    fn accept(&mut self, op: Op) -> bool {
        match op {
            Op::Finish => return true,
            op if self.refusing => self.unsent(&op),
            Op::Metrics { ref values, .. } => {
                self.waiting_values += values.len();
                self.queue.push_back(op);
                self.drop_oldest();
            }
            op => self.queue.push_back(op),
        }
        false
    }

    /// Another op is at the front of the queue: its failures start afresh.
    fn front_changed(&mut self) {
        self.front_failures = 0;
        self.front_failing_since = None;
    }

    /// Drops the oldest metrics while more than [`MAX_WAITING_VALUES`] wait.
    fn drop_oldest(&mut self) {
        while self.waiting_values > MAX_WAITING_VALUES {
            let Some(at) = self
                .queue
                .iter()
                .position(|op| matches!(op, Op::Metrics { .. }))
            else {
                return;
            };
            if at == 0 {
                self.front_changed();
            }
            if let Some(Op::Metrics { values, .. }) = self.queue.remove(at) {
                self.waiting_values -= values.len();
                self.outcome.dropped += values.len() as u64;
            }
        }
    }

    /// Sends the op at the front of the queue (with the metrics of its
    /// trial that follow it, when it is metrics) and takes it off the queue
    /// when the server has it.
    fn send_front(&mut self) -> Result<(), CallError> {
        let experiment_id = match &self.experiment_id {
            Some(id) => id.clone(),
            None => {
                let id = self.client.experiment_id(&self.experiment)?;
                self.experiment_id = Some(id.clone());
                id
            }
        };
        let Some(front) = self.queue.front() else {
            return Ok(());
        };
        match front {
            Op::Start {
                trial,
                trial_id,
                dir,
                config,
                continues_after,
                config_metrics,
            } => {
                let (trial, trial_id, dir, config) =
                    (*trial, trial_id.clone(), dir.clone(), config.clone());
                let (continues_after, config_metrics) = (*continues_after, *config_metrics);
                let from_scratch = continues_after == 0;
                self.start(
                    &experiment_id,
                    trial,
                    &trial_id,
                    dir,
                    &config,
                    false,
                    from_scratch,
                )?;
                self.queue.pop_front();
                self.catch_up(trial, continues_after, config_metrics);
            }
            Op::Metrics { trial, .. } => {
                let trial = *trial;
                self.send_metrics(&experiment_id, trial)?;
            }
            Op::End {
                trial,
                dir,
                status,
                end_ms,
            } => {
                let trial = *trial;
                if !self.runs.contains_key(&trial)
                    && let Some(saved) = self.saved_run(dir, &experiment_id)
                {
                    // Made by an earlier process, and left RUNNING there.
                    let run = Run {
                        dir: dir.clone(),
                        run_id: saved.run_id,
                        sent_through: saved.sent_through,
                        params_logged: true,
                        found_again: false,
                        ended: false,
                        caught_up: true,
                    };
                    self.runs.insert(trial, run);
                }
                if let Some(run) = self.runs.get(&trial) {
                    self.client.update_run(&run.run_id, status, Some(*end_ms))?;
                }
                self.queue.pop_front();
                if let Some(run) = self.runs.get_mut(&trial) {
                    run.ended = true;
                    let run = &self.runs[&trial];
                    self.save(run, &experiment_id);
                }
            }
            Op::Settle {
                trial,
                trial_id,
                dir,
                config,
                iterations,
                status,
                end_ms,
                config_metrics,
            } => {
                let (trial, trial_id, dir, config) =
                    (*trial, trial_id.clone(), dir.clone(), config.clone());
                let (iterations, status, end_ms, config_metrics) =
                    (*iterations, *status, *end_ms, *config_metrics);
                if self.all_sent(&dir, &experiment_id, iterations) {
                    self.queue.pop_front();
                    return Ok(());
                }
                self.start(&experiment_id, trial, &trial_id, dir, &config, true, false)?;
                // In its place: the steps the server lacks, then the end.
                self.queue.pop_front();
                self.queue.push_front(Op::End {
                    trial,
                    dir: self.runs[&trial].dir.clone(),
                    status,
                    end_ms,
                });
                self.catch_up(trial, iterations, config_metrics);
            }
            Op::Best { trial, dir } => {
                // A trial settled by `wtune resume` whose run had all it
                // needed is known only from its file.
                let run_id = match self.runs.get(trial) {
                    Some(run) => Some(run.run_id.clone()),
                    None => self.saved_run(dir, &experiment_id).map(|f| f.run_id),
                };
                if let Some(run_id) = run_id {
                    let tags = [
                        (BEST_TAG, "true"),
                        (EXPERIMENT_DIR_TAG, &experiment_dir(dir)),
                    ];
                    for stale in self.client.tagged_runs(&experiment_id, &tags)? {
                        if stale != run_id {
                            self.client.delete_tag(&stale, BEST_TAG)?;
                        }
                    }
                    let tag = [(BEST_TAG.to_string(), "true".to_string())];
                    self.client.log_batch(&run_id, &[], &[], &tag)?;
                }
                self.queue.pop_front();
            }
            Op::Finish => {
                self.queue.pop_front();
            }
        }
        Ok(())
    }

    /// Makes the trial's run, or finds the one an earlier launch (or an
    /// earlier `wtune run` of this experiment) made, logs its params the
    /// first time this process sees it, and marks a run found again as
    /// running unless it is only being settled (`settling`: the trial had
    /// ended; a run made then starts at its first result's time). A trial
    /// that starts over (`from_scratch`, its result files cut back to
    /// nothing) whose run found again holds steps gets a new run, the old
    /// one ended as KILLED: its steps are of an attempt that was thrown
    /// away, and the new attempt's would be taken for them. Safe to try
    /// again after any failure: each step is kept.
    #[allow(clippy::too_many_arguments)]
    fn start(
        &mut self,
        experiment_id: &str,
        trial: usize,
        trial_id: &str,
        dir: PathBuf,
        config: &Value,
        settling: bool,
        from_scratch: bool,
    ) -> Result<(), CallError> {
        if !self.runs.contains_key(&trial) {
            let found = match self.saved_run(&dir, experiment_id) {
                Some(saved) => {
                    // A process killed between a batch's arrival and the
                    // file's update left the file behind the server: the
                    // server's own last step says what not to send again.
                    let on_server = match self.client.last_step(&saved.run_id) {
                        Ok(step) => step.unwrap_or(0),
                        // Gone or unreadable there (an answer too large
                        // to read, from a guest's thousands of metric
                        // names): the file's word stands.
                        Err(CallError::Rejected(_) | CallError::Failed(_)) => 0,
                        Err(e) => return Err(e),
                    };
                    let sent_through = saved.sent_through.max(on_server);
                    if from_scratch && sent_through > 0 {
                        self.client
                            .update_run(&saved.run_id, "KILLED", Some(now_ms()))?;
                        // Its file named the old run: gone, so that nothing
                        // (an end, should the new run's creation be refused)
                        // takes that run for this attempt's.
                        let file = dir.join(RUN_FILE);
                        if let Err(e) = std::fs::remove_file(&file)
                            && e.kind() != std::io::ErrorKind::NotFound
                        {
                            tracing::warn!("removing {}: {e}", file.display());
                        }
                        None
                    } else {
                        Some((saved, sent_through))
                    }
                }
                None => None,
            };
            let run = match found {
                Some((saved, sent_through)) => {
                    let run = Run {
                        dir,
                        run_id: saved.run_id,
                        sent_through,
                        params_logged: false,
                        found_again: !settling,
                        ended: false,
                        caught_up: false,
                    };
                    // Running again: a process killed before its end is
                    // sent must not leave the file saying it was.
                    if saved.ended && !settling {
                        self.save(&run, experiment_id);
                    }
                    run
                }
                None => {
                    let start_ms = if settling {
                        first_result_ms(&dir).unwrap_or_else(now_ms)
                    } else {
                        now_ms()
                    };
                    let retried = self.creating.contains_key(&trial);
                    let creation = self
                        .creating
                        .entry(trial)
                        .or_insert_with(|| format!("{}-{}-{trial}", std::process::id(), now_ms()))
                        .clone();
                    let made = if retried {
                        let tag = [(CREATION_TAG, creation.as_str())];
                        self.client.tagged_runs(experiment_id, &tag)?.pop()
                    } else {
                        None
                    };
                    let run_id = match made {
                        Some(run_id) => run_id,
                        None => {
                            let tags = [
                                ("wtune.trial_id".to_string(), trial_id.to_string()),
                                ("wtune.trial_dir".to_string(), dir.display().to_string()),
                                (EXPERIMENT_DIR_TAG.to_string(), experiment_dir(&dir)),
                                (CREATION_TAG.to_string(), creation),
                            ];
                            self.client
                                .create_run(experiment_id, trial_id, start_ms, &tags)?
                        }
                    };
                    self.creating.remove(&trial);
                    let run = Run {
                        dir,
                        run_id,
                        sent_through: 0,
                        params_logged: false,
                        found_again: false,
                        ended: false,
                        caught_up: false,
                    };
                    // Named in the trial's directory before anything else
                    // is sent, so a process killed now leaves no second run.
                    self.save(&run, experiment_id);
                    run
                }
            };
            self.runs.insert(trial, run);
        }
        let run = &self.runs[&trial];
        let run_id = run.run_id.clone();
        if run.params_logged || run.found_again {
            self.client.update_run(&run_id, "RUNNING", None)?;
        }
        if !run.params_logged {
            // MLflow takes a param logged again with the same value and
            // refuses one with another (a config PBT changed before a
            // `wtune resume`): the first stays, and that refusal is no
            // reason to lose the run.
            for chunk in super::params(config).chunks(BATCH_PARAMS) {
                match self.client.log_batch(&run_id, &[], chunk, &[]) {
                    Ok(()) => {}
                    Err(CallError::Rejected(message)) => self.refused(message),
                    Err(e) => return Err(e),
                }
            }
        }
        if let Some(run) = self.runs.get_mut(&trial) {
            run.params_logged = true;
            run.found_again = false;
        }
        Ok(())
    }

    /// The trial's `mlflow_run.json` (in `dir`), when it names a run of
    /// this server's `experiment_id`.
    fn saved_run(&self, dir: &Path, experiment_id: &str) -> Option<RunFile> {
        std::fs::read(dir.join(RUN_FILE))
            .ok()
            .and_then(|bytes| serde_json::from_slice::<RunFile>(&bytes).ok())
            .filter(|f| f.tracking_uri == self.uri && f.experiment_id == experiment_id)
    }

    /// Whether the trial's `mlflow_run.json` (in `dir`) says that the
    /// server has its steps through `iterations` and its end.
    fn all_sent(&self, dir: &Path, experiment_id: &str, iterations: u64) -> bool {
        self.saved_run(dir, experiment_id)
            .is_some_and(|f| f.ended && f.sent_through >= iterations)
    }

    /// Queues, ahead of everything else, the trial's results from before
    /// this process that the server lacks: those after the run's last sent
    /// step up to the checkpoint this launch restores, which no launch
    /// reports again. A process killed with results still queued (or a
    /// server away until the kill) would otherwise leave those steps out
    /// of the run for good. They are read from `result.jsonl`, which holds
    /// every result up to a checkpoint before the checkpoint exists.
    fn catch_up(&mut self, trial: usize, continues_after: u64, config_metrics: bool) {
        let Some(run) = self.runs.get_mut(&trial) else {
            return;
        };
        if mem::replace(&mut run.caught_up, true) || continues_after <= run.sent_through {
            return;
        }
        let ops = match saved_results(
            &run.dir,
            trial,
            run.sent_through,
            continues_after,
            config_metrics,
        ) {
            Ok(ops) => ops,
            Err(message) => {
                tracing::warn!(
                    "MLflow at {}: steps {} to {continues_after} of {} are not sent: {message}",
                    self.uri,
                    run.sent_through + 1,
                    run.dir.display()
                );
                return;
            }
        };
        for op in ops.into_iter().rev() {
            if let Op::Metrics { values, .. } = &op {
                self.waiting_values += values.len();
            }
            self.queue.push_front(op);
        }
        self.drop_oldest();
    }

    /// Counts a refused request; says the first.
    fn refused(&mut self, message: String) {
        self.outcome.refused += 1;
        if self.outcome.first_refusal.is_none() {
            tracing::warn!("MLflow at {} refused a request: {message}", self.uri);
            self.outcome.first_refusal = Some(message);
        }
    }

    /// Sends the metrics at the front of the queue, with those of the same
    /// trial queued after them up to its next other op, in batches of
    /// MLflow's size; steps the server already has (from before a
    /// `wtune resume`) are skipped.
    fn send_metrics(&mut self, experiment_id: &str, trial: usize) -> Result<(), CallError> {
        match self.send_metrics_of(experiment_id, trial, usize::MAX) {
            // One of the results merged into the batch may be what the
            // server cannot take: the front one goes alone, so that only
            // the one refused is dropped.
            Err(CallError::Rejected(_) | CallError::Failed(_)) if self.merged > 1 => {
                self.send_metrics_of(experiment_id, trial, 1)
            }
            sent => sent,
        }
    }

    /// [`Worker::send_metrics`], merging at most `most` queued results.
    fn send_metrics_of(
        &mut self,
        experiment_id: &str,
        trial: usize,
        most: usize,
    ) -> Result<(), CallError> {
        self.merged = 0;
        let Some(run) = self.runs.get(&trial) else {
            // No run (its start was refused): nothing of it can be sent.
            if let Some(Op::Metrics { values, .. }) = self.queue.pop_front() {
                self.waiting_values -= values.len();
                self.outcome.refused += 1;
            }
            return Ok(());
        };
        let mut batch: Vec<(String, f64, u64, u64)> = Vec::new();
        // Queue positions taken whole, and the last step among them.
        let mut taken = Vec::new();
        let mut last_step = run.sent_through;
        for (i, op) in self.queue.iter().enumerate() {
            if op.trial() != Some(trial) {
                continue;
            }
            let Op::Metrics {
                step,
                timestamp_ms,
                values,
                ..
            } = op
            else {
                break;
            };
            if taken.len() == most {
                break;
            }
            // A step queued twice (redone after a recovery) keeps its
            // first values, as the server would had the first been sent.
            if *step > last_step {
                if !batch.is_empty() && batch.len() + values.len() > BATCH_METRICS {
                    break;
                }
                batch.extend(
                    values
                        .iter()
                        .map(|(key, value)| (key.clone(), *value, *timestamp_ms, *step)),
                );
                last_step = last_step.max(*step);
            }
            taken.push(i);
        }
        self.merged = taken.len();
        // One result with more metrics than a batch holds goes in pieces.
        for chunk in batch.chunks(BATCH_METRICS) {
            self.client.log_batch(&run.run_id, chunk, &[], &[])?;
        }
        for i in taken.into_iter().rev() {
            if let Some(Op::Metrics { values, .. }) = self.queue.remove(i) {
                self.waiting_values -= values.len();
            }
        }
        if let Some(run) = self.runs.get_mut(&trial)
            && last_step > run.sent_through
        {
            run.sent_through = last_step;
            let run = &self.runs[&trial];
            self.save(run, experiment_id);
        }
        Ok(())
    }

    /// Writes the trial's `mlflow_run.json` (a lost write costs a second
    /// run, nothing more: steps are checked with the server when the run is
    /// found again).
    fn save(&self, run: &Run, experiment_id: &str) {
        let file = RunFile {
            tracking_uri: self.uri.clone(),
            experiment_id: experiment_id.to_string(),
            run_id: run.run_id.clone(),
            sent_through: run.sent_through,
            ended: run.ended,
        };
        let path = run.dir.join(RUN_FILE);
        let temp = run.dir.join(format!(".{RUN_FILE}.tmp"));
        let written = std::fs::create_dir_all(&run.dir)
            .and_then(|()| std::fs::write(&temp, serde_json::to_vec(&file).unwrap_or_default()))
            .and_then(|()| std::fs::rename(&temp, &path));
        if let Err(e) = written {
            tracing::warn!("writing {}: {e}", path.display());
        }
    }
}

/// The results of `dir`'s `result.jsonl` of steps after `after` up to
/// `through`, as the metrics ops their reports made: the first line of each
/// step (a trial that recovered from a failure reported its redone steps
/// again, and the first values sent for a step are the ones that stay).
/// Read a line at a time: the file may be as large as the trial's result
/// limit.
fn saved_results(
    dir: &Path,
    trial: usize,
    after: u64,
    through: u64,
    config_metrics: bool,
) -> Result<Vec<Op>, String> {
    let path = dir.join(RESULT_FILE);
    let unreadable = |e: std::io::Error| format!("reading {}: {e}", path.display());
    let mut reader = BufReader::new(File::open(&path).map_err(unreadable)?);
    let mut line = Vec::new();
    let mut scalars = Scalars::default();
    let mut ops = Vec::new();
    let mut last = after;
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line).map_err(unreadable)? == 0 {
            break;
        }
        // A line still being written belongs to a step past `through`.
        if line.last() != Some(&b'\n') {
            break;
        }
        let Ok(result) = serde_json::from_slice::<Map<String, Value>>(&line) else {
            continue;
        };
        let Some(step) = result.get("training_iteration").and_then(Value::as_u64) else {
            continue;
        };
        if step <= last || step > through {
            continue;
        }
        last = step;
        scalars.fill(&result, config_metrics);
        ops.push(Op::Metrics {
            trial,
            step,
            timestamp_ms: result_ms(&result).unwrap_or_else(now_ms),
            values: metric_values(&scalars),
        });
    }
    Ok(ops)
}

/// The time of the first result in `dir`'s `result.jsonl`, in ms.
fn first_result_ms(dir: &Path) -> Option<u64> {
    let mut line = Vec::new();
    BufReader::new(File::open(dir.join(RESULT_FILE)).ok()?)
        .read_until(b'\n', &mut line)
        .ok()?;
    result_ms(&serde_json::from_slice(&line).ok()?)
}

/// When `result` was reported, in ms: its `timestamp` (whole seconds).
pub(super) fn result_ms(result: &Map<String, Value>) -> Option<u64> {
    Some(result.get("timestamp")?.as_u64()?.saturating_mul(1000))
}

pub(super) fn now_ms() -> u64 {
    crate::report::unix_time().as_millis() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A metrics op as (step, timestamp in ms, values).
    type Sent = (u64, u64, Vec<(String, f64)>);

    fn steps_and_values(ops: &[Op]) -> Vec<Sent> {
        ops.iter()
            .map(|op| match op {
                Op::Metrics {
                    trial: 7,
                    step,
                    timestamp_ms,
                    values,
                } => (*step, *timestamp_ms, values.clone()),
                _ => panic!("not trial 7's metrics"),
            })
            .collect()
    }

    #[test]
    fn saved_results_are_the_first_line_of_each_step_in_range() {
        let dir = tempfile::tempdir().unwrap();
        let line = |step: u64, loss: f64| {
            format!(
                r#"{{"loss": {loss}, "training_iteration": {step}, "timestamp": {}, "config": {{"lr": 0.5}}, "done": false}}"#,
                1_700_000_000 + step
            )
        };
        let text = [
            line(1, 1.0),
            line(2, 0.9),
            line(3, 0.8),
            // Redone after a recovery: the first values stay.
            line(2, 0.7),
            line(3, 0.6),
            "not json".into(),
            r#"{"loss": 1.0}"#.into(),
            line(4, 0.5),
        ]
        .join("\n");
        // A line still being written when the file is read.
        let text = format!("{text}\n{}", &line(5, 0.4)[..20]);
        std::fs::write(dir.path().join(RESULT_FILE), text).unwrap();

        let ops = saved_results(dir.path(), 7, 1, 3, false).unwrap();
        assert_eq!(
            steps_and_values(&ops),
            [
                (2, 1_700_000_002_000, vec![("loss".into(), 0.9)]),
                (3, 1_700_000_003_000, vec![("loss".into(), 0.8)]),
            ]
        );
        let ops = saved_results(dir.path(), 7, 3, 9, true).unwrap();
        assert_eq!(
            steps_and_values(&ops),
            [(
                4,
                1_700_000_004_000,
                vec![("loss".into(), 0.5), ("config/lr".into(), 0.5)]
            )]
        );
        assert!(
            saved_results(dir.path(), 7, 4, 9, false)
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn a_missing_result_file_is_an_error_that_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let Err(message) = saved_results(dir.path(), 0, 0, 5, false) else {
            panic!("read a file that is not there");
        };
        assert!(message.contains("result.jsonl"), "{message}");
    }
}
