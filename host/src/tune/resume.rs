//! Picking up an interrupted experiment: which trials continue, from which
//! checkpoint, and which start over.
//!
//! A trial's checkpoints on disk are the truth: the saved experiment state
//! may be a moment older than the newest checkpoint (state writes are
//! throttled), and `keep_checkpoints_num` may have deleted a checkpoint the
//! state still lists. So each trial that continues is matched against the
//! checkpoint files in its directory and continues from the newest intact
//! one, losing only the work done after it.

use std::path::{Path, PathBuf};

use super::backend::{CheckpointFault, CheckpointMeta, TrialBackend};
use super::decisions::FuelMoment;
use super::runner::{
    CHECKPOINT_DIR, CheckpointPolicy, DROPPED_DIR, checkpoint_iteration, checkpoint_path,
};
use super::schedulers::Scheduler;
use super::search::Searcher;
use super::trial::{Checkpoint, Trial, TrialStatus};

/// What happens to trials that ended in ERROR.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ErroredTrials {
    /// They stay ERROR (only unfinished trials continue).
    #[default]
    Keep,
    /// They continue from their newest checkpoint (from scratch without one).
    Retry,
    /// They start again from scratch; their checkpoints are deleted.
    Restart,
}

/// How each trial was prepared, for the user.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResumePlan {
    /// Trials continuing from a checkpoint: `(trial_id, iteration)`.
    pub continued: Vec<(String, u64)>,
    /// Trials starting over (no checkpoint of their own, or restarted):
    /// from scratch, or from their `restore_from` checkpoint.
    pub restarted: Vec<String>,
    /// Trials that had ended in ERROR and run again (also listed in
    /// `continued` or `restarted`): their scheduler and searcher must be
    /// told, see [`retry_errored`].
    pub retried: Vec<String>,
    /// Trials a control request had paused (`Trial::held`): they run
    /// again, and their scheduler, which was told they ended, must be told
    /// they are live (see [`retry_errored`]).
    pub released: Vec<String>,
    /// Trials not yet started.
    pub pending: usize,
    /// Trials that stay finished (TERMINATED, or ERROR kept).
    pub finished: usize,
    /// Checkpoint files that were skipped as damaged: `(path, why)`.
    pub damaged: Vec<(PathBuf, String)>,
}

/// Prepares saved trials to run again in `output_dir`: RUNNING and PAUSED
/// trials (and ERROR ones, per `errored`) become PAUSED at their newest
/// intact checkpoint, or PENDING from scratch without one.
pub fn prepare<B: TrialBackend>(
    backend: &B,
    trials: &mut [Trial],
    output_dir: &Path,
    policy: &CheckpointPolicy,
    errored: ErroredTrials,
) -> ResumePlan {
    prepare_at(backend, trials, output_dir, policy, errored, None)
}

/// [`prepare`], for a run in fuel order continued from the saved `moment`
/// ([`super::Runner::continue_at`]): no trial continues from a checkpoint
/// past where the moment had it, since the steps after it are decided
/// again, and checkpoints past it are deleted (the resumed run makes them
/// again, the same). The trials that held slots at the moment continue
/// whatever their saved status (a state written as a resumed run starts
/// has them PAUSED, or PENDING to start over). A listed checkpoint the
/// killed run had dropped after the state listed it is put back first
/// ([`put_back_dropped`]).
pub fn prepare_at<B: TrialBackend>(
    backend: &B,
    trials: &mut [Trial],
    output_dir: &Path,
    policy: &CheckpointPolicy,
    errored: ErroredTrials,
    moment: Option<&FuelMoment>,
) -> ResumePlan {
    let mut plan = ResumePlan::default();
    crate::persist::remove_stale_temporaries(output_dir);
    for trial in trials.iter_mut() {
        // The directory may have moved since the state was written.
        trial.dir = output_dir.join(&trial.trial_id);
        crate::persist::remove_stale_temporaries(&trial.dir);
        crate::persist::remove_stale_temporaries(&trial.dir.join(CHECKPOINT_DIR));
        if moment.is_some() {
            put_back_dropped(backend, trial);
        }
        clear_dropped(trial);
        if trial.held {
            trial.held = false;
            plan.released.push(trial.trial_id.clone());
        }
        // A step a halted run left pending was checkpointed after: the
        // trial continues from there, and decides on the step first.
        let held_slot = moment
            .and_then(|m| m.clocks.iter().find(|c| c.trial_id == trial.trial_id))
            .map(|clock| clock.iteration + u64::from(clock.pending.is_some()));
        let bound = moment.map(|_| held_slot.unwrap_or(trial.iterations));
        let action = match (trial.status, errored) {
            _ if held_slot.is_some() => Action::Continue,
            (TrialStatus::Pending, _) => {
                if let Some(bound) = bound {
                    remove_checkpoints_after::<B>(trial, bound);
                }
                plan.pending += 1;
                continue;
            }
            (TrialStatus::Terminated, _) | (TrialStatus::Error, ErroredTrials::Keep) => {
                plan.finished += 1;
                continue;
            }
            (TrialStatus::Error, ErroredTrials::Restart) => Action::Restart,
            (TrialStatus::Running | TrialStatus::Paused, _)
            | (TrialStatus::Error, ErroredTrials::Retry) => Action::Continue,
        };
        if trial.status == TrialStatus::Error {
            trial.error = None;
            trial.num_failures = 0;
            plan.retried.push(trial.trial_id.clone());
        }
        if action == Action::Restart {
            let dir = trial.dir.join(CHECKPOINT_DIR);
            if let Err(err) = std::fs::remove_dir_all(&dir)
                && err.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!("removing {}: {err}", dir.display());
            }
            start_over(trial);
            plan.restarted.push(trial.trial_id.clone());
            continue;
        }
        if let Some(bound) = bound {
            remove_checkpoints_after::<B>(trial, bound);
        }
        let listed_only = moment.is_some();
        match newest_intact_of(backend, trial, policy, &mut plan.damaged, listed_only) {
            Some(iteration) => plan.continued.push((trial.trial_id.clone(), iteration)),
            None => {
                start_over(trial);
                plan.restarted.push(trial.trial_id.clone());
            }
        }
    }
    plan
}

/// Refuses, before [`prepare_at`] changes anything, a resume that would
/// start a trial over for want of a checkpoint that may well be intact:
/// none of its checkpoints can be read, and one of them for a reason other
/// than damage (written with another snapshot key, for another component,
/// or unreadable now). Starting over would cut the trial's results back to
/// nothing and overwrite its checkpoints by name. A trial with an older
/// checkpoint that reads continues from it, as from one past damaged ones:
/// with a snapshot key, a corrupted file fails its MAC, which cannot be
/// told from another key's but for the older files that verify. Checked
/// are the trials that may continue (all but TERMINATED ones, and ERROR
/// ones `errored` does not retry) and trial directories the state does not
/// list (which the run adopts, [`adopt`]), each down to its newest
/// checkpoint that reads. First refuses a saved trial list the runner
/// could not have written ([`refuse_foreign_paths`]).
pub fn refuse_unreadable<B: TrialBackend>(
    backend: &B,
    trials: &[Trial],
    output_dir: &Path,
    errored: ErroredTrials,
) -> Result<(), String> {
    refuse_foreign_paths::<B>(trials)?;
    let continues = |trial: &Trial| match trial.status {
        // PENDING ones too: a run continued from a saved moment resumes
        // those that held slots then, whatever their status.
        TrialStatus::Running | TrialStatus::Paused | TrialStatus::Pending => true,
        TrialStatus::Error => errored == ErroredTrials::Retry,
        TrialStatus::Terminated => false,
    };
    let mut dirs: Vec<PathBuf> = trials
        .iter()
        .filter(|t| continues(t))
        .map(|t| output_dir.join(&t.trial_id))
        .collect();
    let listed: Vec<&str> = trials.iter().map(|t| t.trial_id.as_str()).collect();
    for entry in std::fs::read_dir(output_dir)
        .into_iter()
        .flatten()
        .flatten()
    {
        // A trial's id, as the runner names trials (not one moved aside).
        let name = entry.file_name();
        let unlisted = name
            .to_str()
            .is_some_and(|n| is_trial_id(n) && !listed.contains(&n));
        if unlisted {
            dirs.push(entry.path());
        }
    }
    for dir in dirs {
        let mut files = checkpoint_files::<B>(&dir);
        let mut unreadable = None;
        let mut reads = false;
        while let Some((_, file)) = files.pop() {
            match backend.describe_checkpoint(&file) {
                Ok(_) => {
                    reads = true;
                    break;
                }
                Err(CheckpointFault::Damaged(_)) => {}
                Err(CheckpointFault::Unreadable(why)) => {
                    unreadable.get_or_insert(why);
                }
            }
        }
        if let (false, Some(why)) = (reads, unreadable) {
            return Err(format!(
                "{why}; no checkpoint of {} can be read, and resuming would start it over, so \
                 nothing was changed: resume with the snapshot key and the model the \
                 experiment ran with, or move its checkpoints away to start it over",
                dir.display()
            ));
        }
    }
    Ok(())
}

/// Whether `name` is a trial id as the runner makes them: `trial_` and
/// digits.
fn is_trial_id(name: &str) -> bool {
    name.strip_prefix("trial_")
        .is_some_and(|k| !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()))
}

/// Refuses saved trials whose ids or checkpoint paths the runner could not
/// have written: each id `trial_<digits>`, once, and each checkpoint at
/// [`checkpoint_path`] of its iteration. Resuming joins them onto the output
/// directory, deletes under them (restarted trials' checkpoints, dropped
/// ones) and renames over them, and grants the trial's `work` folder to the
/// guest: a damaged or hand-edited state naming `../elsewhere` or an
/// absolute path must change nothing outside the experiment.
fn refuse_foreign_paths<B: TrialBackend>(trials: &[Trial]) -> Result<(), String> {
    let refused = |why: String| {
        Err(format!(
            "the saved state {why}; the runner never writes that, so the state was damaged or \
             edited, and nothing was changed"
        ))
    };
    let mut seen = std::collections::HashSet::new();
    for trial in trials {
        let id = &trial.trial_id;
        if !is_trial_id(id) {
            return refused(format!("names a trial {id:?}, not `trial_` and digits"));
        }
        if !seen.insert(id.as_str()) {
            return refused(format!("lists trial {id} twice"));
        }
        for checkpoint in &trial.checkpoints {
            let expected = checkpoint_path::<B>(checkpoint.iteration);
            if checkpoint.path != expected {
                return refused(format!(
                    "lists a checkpoint of {id} at {:?} where its iteration {} is kept at {}",
                    checkpoint.path,
                    checkpoint.iteration,
                    expected.display()
                ));
            }
        }
    }
    Ok(())
}

/// Tells the scheduler and the searcher (restored from the saved state,
/// where these trials had ended) that the ERROR trials in `plan.retried`
/// are live again, so that their completion counts once; and the scheduler
/// that the trials in `plan.released` are (the searcher never saw them
/// end).
pub fn retry_errored(
    plan: &ResumePlan,
    trials: &[Trial],
    scheduler: &mut dyn Scheduler,
    searcher: &mut dyn Searcher,
) {
    for id in &plan.retried {
        if let Some(trial) = trials.iter().find(|t| &t.trial_id == id) {
            scheduler.on_trial_retry(trial);
            searcher.on_trial_retry(id);
        }
    }
    for id in &plan.released {
        if let Some(trial) = trials.iter().find(|t| &t.trial_id == id) {
            scheduler.on_trial_retry(trial);
        }
    }
}

/// What [`adopt`] made of a new trial's directory, found on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Adopted {
    /// No directory: the trial is new.
    Nothing,
    /// The directory holds this trial's configuration: the trial continues
    /// from the newest intact checkpoint there (at this iteration), or from
    /// scratch (`None`), its result files cut back to match.
    Continued(Option<u64>),
    /// The directory holds another configuration (the searcher suggested
    /// differently this time): it was moved aside to this path.
    MovedAside(PathBuf),
}

/// Picks up what an earlier run left in a new trial's directory. A run
/// killed before its state listed a trial leaves the trial's directory,
/// results and checkpoints behind; resuming, the searcher suggests that
/// trial again (the same id, and with a seeded searcher the same
/// configuration), and the work on disk is continued rather than redone.
/// The trial stays PENDING; when a checkpoint is found it is recorded, so
/// that the trial's launch restores it.
pub fn adopt<B: TrialBackend>(
    backend: &B,
    trial: &mut Trial,
    policy: &CheckpointPolicy,
    damaged: &mut Vec<(PathBuf, String)>,
) -> Adopted {
    let params = match std::fs::read(trial.dir.join("params.json")) {
        Ok(bytes) => serde_json::from_slice::<serde_json::Value>(&bytes).ok(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !trial.dir.exists() => {
            return Adopted::Nothing;
        }
        Err(_) => None,
    };
    clear_dropped(trial);
    crate::persist::remove_stale_temporaries(&trial.dir);
    crate::persist::remove_stale_temporaries(&trial.dir.join(CHECKPOINT_DIR));
    if params.as_ref() != Some(&trial.config) {
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let aside = trial
            .dir
            .with_file_name(format!("{}.stale-{stamp}", trial.trial_id));
        if let Err(err) = std::fs::rename(&trial.dir, &aside) {
            tracing::warn!("moving {} aside: {err}", trial.dir.display());
        }
        return Adopted::MovedAside(aside);
    }
    let restored = newest_intact(backend, trial, policy, damaged);
    trial.status = TrialStatus::Pending;
    Adopted::Continued(restored)
}

/// [`adopt`], saying what it found (for [`super::Runner::adopt_from_disk`]).
pub fn adopt_reported<B: TrialBackend>(backend: &B, trial: &mut Trial, policy: &CheckpointPolicy) {
    adopt_reported_at(backend, trial, policy, false);
}

/// [`adopt_reported`]; `at_moment`: the run continues from a saved moment
/// in fuel order ([`prepare_at`]), which the trial postdates: it starts over
/// (its steps are decided again), its checkpoints deleted.
pub fn adopt_reported_at<B: TrialBackend>(
    backend: &B,
    trial: &mut Trial,
    policy: &CheckpointPolicy,
    at_moment: bool,
) {
    if at_moment {
        remove_checkpoints_after::<B>(trial, 0);
    }
    let mut damaged = Vec::new();
    let adopted = adopt(backend, trial, policy, &mut damaged);
    for (path, why) in damaged {
        tracing::warn!(trial = %trial.trial_id, "skipping damaged checkpoint {}: {why}", path.display());
    }
    match adopted {
        Adopted::Nothing => {}
        Adopted::Continued(Some(iteration)) => tracing::info!(
            trial = %trial.trial_id,
            "found on disk from the interrupted run: continuing from its checkpoint at iteration \
             {iteration}"
        ),
        Adopted::Continued(None) => tracing::info!(
            trial = %trial.trial_id,
            "found on disk from the interrupted run, with no checkpoint: starting over"
        ),
        Adopted::MovedAside(path) => tracing::warn!(
            trial = %trial.trial_id,
            "its directory from the interrupted run held another configuration; moved aside to {}",
            path.display()
        ),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Continue,
    Restart,
}

fn start_over(trial: &mut Trial) {
    trial.status = TrialStatus::Pending;
    trial.checkpoints.clear();
    trial.iterations = 0;
    trial.time_total_s = 0.0;
    trial.fuel_total = 0;
    trial.last_result = None;
    trial.stop_reason = None;
    trial.iterations_since_restore = 0;
    trial.time_since_restore = 0.0;
    trial.fuel_since_restore = 0;
}

/// Deletes `trial`'s checkpoint files past `iteration`, and forgets them.
fn remove_checkpoints_after<B: TrialBackend>(trial: &mut Trial, iteration: u64) {
    let dir = trial.dir.join(CHECKPOINT_DIR);
    for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let name = entry.file_name();
        let Some(at) = name.to_str().and_then(checkpoint_iteration::<B>) else {
            continue;
        };
        if at > iteration
            && let Err(err) = std::fs::remove_file(entry.path())
        {
            tracing::warn!("removing {}: {err}", entry.path().display());
        }
    }
    trial.checkpoints.retain(|c| c.iteration <= iteration);
}

/// The checkpoint files in the trial directory `dir`, by iteration, oldest
/// first: `(iteration, file)`. Files the backend does not name as its
/// checkpoints are left out.
fn checkpoint_files<B: TrialBackend>(dir: &Path) -> Vec<(u64, PathBuf)> {
    let mut files: Vec<(u64, PathBuf)> = std::fs::read_dir(dir.join(CHECKPOINT_DIR))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let iteration = checkpoint_iteration::<B>(entry.file_name().to_str()?)?;
            Some((iteration, entry.path()))
        })
        .collect();
    files.sort();
    files
}

/// Whether a checkpoint file described by `meta` holds the `listed` one.
fn holds(meta: &CheckpointMeta, listed: &Checkpoint) -> bool {
    meta.iteration == listed.iteration
        && meta.fuel_total == listed.fuel_total
        // Within a rounding: the listing went through JSON.
        && (listed.time_total_s - meta.time_total_s).abs() <= 1e-9 * meta.time_total_s.abs()
}

/// Puts back the checkpoints `trial` lists that its run dropped after the
/// saved state listed them, and that a kill left in [`DROPPED_DIR`] (see
/// `tune/runner/retired.rs`): where the listed path is missing, or holds
/// another checkpoint (a PBT clone that took its name), the dropped file
/// that holds the listed checkpoint takes its place.
fn put_back_dropped<B: TrialBackend>(backend: &B, trial: &Trial) {
    let aside_dir = trial.dir.join(CHECKPOINT_DIR).join(DROPPED_DIR);
    let mut aside: Vec<PathBuf> = match std::fs::read_dir(&aside_dir) {
        Ok(entries) => entries.flatten().map(|e| e.path()).collect(),
        Err(_) => return,
    };
    aside.sort();
    for listed in &trial.checkpoints {
        let path = trial.dir.join(&listed.path);
        let describes = |file: &Path| {
            (backend.describe_checkpoint(file)).is_ok_and(|meta| holds(&meta, listed))
        };
        if describes(&path) {
            continue;
        }
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let found = aside.iter().position(|file| {
            let dropped_as = file.file_name().and_then(|n| n.to_str());
            dropped_as.is_some_and(|n| n.strip_prefix(name).is_some_and(|s| s.starts_with('.')))
                && describes(file)
        });
        let Some(found) = found else {
            continue;
        };
        let file = aside.remove(found);
        match std::fs::rename(&file, &path) {
            Ok(()) => tracing::info!(
                trial = %trial.trial_id,
                "put back {}: the run dropped it after the saved state listed it",
                path.display()
            ),
            Err(err) => tracing::warn!("putting back {}: {err}", path.display()),
        }
    }
}

/// Deletes what a run left in `trial`'s [`DROPPED_DIR`]: no saved state
/// lists it (or [`put_back_dropped`] took it).
fn clear_dropped(trial: &Trial) {
    let aside_dir = trial.dir.join(CHECKPOINT_DIR).join(DROPPED_DIR);
    if let Err(err) = std::fs::remove_dir_all(&aside_dir)
        && err.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!("removing {}: {err}", aside_dir.display());
    }
}

/// Makes `trial` PAUSED at its newest intact checkpoint; returns its
/// iteration, or `None` when there is none.
fn newest_intact<B: TrialBackend>(
    backend: &B,
    trial: &mut Trial,
    policy: &CheckpointPolicy,
    damaged: &mut Vec<(PathBuf, String)>,
) -> Option<u64> {
    newest_intact_of(backend, trial, policy, damaged, false)
}

/// [`newest_intact`]; `listed_only`: only a checkpoint the saved trial
/// lists counts (continuing a moment, whose state lists every checkpoint
/// written before it): a file that differs from its listing replaced it
/// after the moment (a PBT exploit's clone does), and is deleted.
fn newest_intact_of<B: TrialBackend>(
    backend: &B,
    trial: &mut Trial,
    policy: &CheckpointPolicy,
    damaged: &mut Vec<(PathBuf, String)>,
    listed_only: bool,
) -> Option<u64> {
    let mut files = checkpoint_files::<B>(&trial.dir);
    while let Some((iteration, _)) = files.pop() {
        let path = checkpoint_path::<B>(iteration);
        let meta = match backend.describe_checkpoint(&trial.dir.join(&path)) {
            Ok(meta) if meta.iteration == iteration => meta,
            Ok(meta) => {
                damaged.push((
                    trial.dir.join(&path),
                    format!("it holds iteration {}", meta.iteration),
                ));
                continue;
            }
            Err(fault) => {
                damaged.push((trial.dir.join(&path), fault.reason().to_owned()));
                continue;
            }
        };
        let listing = trial
            .checkpoints
            .iter()
            .find(|c| c.iteration == iteration && holds(&meta, c));
        let (listed, halt) = (listing.is_some(), listing.is_some_and(|c| c.halt));
        // The listing's score, where it has one: a halt checkpoint adopted
        // as its step's periodic one was scored again with the step's
        // result, which its file (written before) does not hold.
        let listed_score = listing.map(|c| c.score);
        // A checkpoint taken only because the run halted in fuel order may
        // hold a step no decision was made on, which only the halt's saved
        // moment remembers: without it, the trial does the step again, and
        // it is decided on then.
        let why = match (listed_only, listed, halt) {
            (false, _, true) => "taken as the run halted, whose moment the saved state lacks",
            (true, false, _) => "written after the moment the run continues from",
            _ => "",
        };
        if !why.is_empty() {
            let file = trial.dir.join(&path);
            tracing::info!(trial = %trial.trial_id, "deleting {}: {why}", file.display());
            if let Err(err) = std::fs::remove_file(&file) {
                tracing::warn!("removing {}: {err}", file.display());
            }
            continue;
        }
        // Keep the recorded checkpoints that still exist and are older.
        trial.checkpoints.retain(|c| {
            c.iteration < iteration && c.path != path && trial.dir.join(&c.path).is_file()
        });
        let score = listed_score.unwrap_or_else(|| policy.score(meta.result.as_ref()));
        let bytes = std::fs::metadata(trial.dir.join(&path)).map_or(0, |m| m.len());
        trial.checkpoints.push(Checkpoint {
            path,
            iteration,
            time_total_s: meta.time_total_s,
            fuel_total: meta.fuel_total,
            score,
            bytes,
            halt,
        });
        trial.status = TrialStatus::Paused;
        trial.iterations = meta.iteration;
        trial.time_total_s = meta.time_total_s;
        trial.fuel_total = meta.fuel_total;
        trial.last_result = meta.result;
        trial.stop_reason = None;
        return Some(iteration);
    }
    None
}
