//! What `wtune resume` may change of a saved experiment, and why the rest
//! stays. New stopping criteria, a new sample count, the trials' limits,
//! the concurrency and where compute runs change how far the experiment
//! goes and what each trial may use; the metric, seed, algorithms,
//! checkpoint mode, data and directory are what its saved decisions and
//! checkpoints rest on, so the flags for them are refused with the reason.

use crate::compute::ComputeMode;
use crate::config::{self, Overrides};
use crate::tune::{StopCriteria, Trial, TrialStatus};

use super::super::Failure;
use super::super::args::{ChangeArgs, FixedOnResume};
use super::super::common::limits_line;
use super::super::setup::Setup;

/// The flags `wtune resume` takes to change the experiment.
pub(super) struct Changes {
    stop: Vec<String>,
    num_samples: Option<u64>,
    limits: Overrides,
    compute: Option<ComputeMode>,
}

impl Changes {
    /// The changes the flags ask for, after refusing the flags for what
    /// the experiment keeps.
    pub(super) fn new(
        args: ChangeArgs,
        fixed: &FixedOnResume,
        setup: &Setup,
    ) -> Result<Self, Failure> {
        refuse_fixed(fixed, setup)?;
        let compute = match args.compute.as_deref() {
            None => None,
            Some(text) => Some(text.parse::<ComputeMode>().map_err(|_| {
                Failure::user(format!(
                    "--compute {text:?} is not a backend; use auto, cpu or gpu"
                ))
            })?),
        };
        Ok(Self {
            compute,
            stop: args.stop,
            num_samples: args.num_samples,
            limits: Overrides {
                max_concurrent: args.max_concurrent,
                fuel: args.limits.fuel,
                fuel_per_call: args.limits.fuel_per_call,
                memory: args.limits.memory,
                timeout: args.limits.timeout,
                ..Overrides::default()
            },
        })
    }

    /// Puts the limit and concurrency flags over the saved ones, saying
    /// what the trials run under when any changed.
    pub(super) fn relimit(&self, setup: &mut Setup) -> Result<(), Failure> {
        let before = (setup.limits.clone(), setup.spec.max_concurrent);
        let mut notes = Vec::new();
        setup.spec.max_concurrent = config::resumed_limits(
            &mut setup.limits,
            &self.limits,
            setup.spec.max_concurrent,
            &mut notes,
        )
        .map_err(Failure::user)?;
        for note in notes {
            eprintln!("note: {note}");
        }
        if setup.limits != before.0 {
            eprintln!("from now on, {}", limits_line(&setup.limits));
        }
        if setup.spec.max_concurrent != before.1 {
            eprintln!(
                "from now on, up to {} trials at once (was {})",
                setup.spec.max_concurrent, before.1
            );
        }
        Ok(())
    }

    /// Puts `--compute` over the saved backend, saying so when it changed.
    /// A GPU that is not there is found when the sandbox opens compute.
    pub(super) fn move_compute(&self, setup: &mut Setup) {
        let Some(mode) = self.compute else {
            return;
        };
        let saved = std::mem::replace(&mut setup.compute.mode, mode);
        if saved != mode {
            eprintln!("from now on, compute = \"{mode}\" (was \"{saved}\")");
        }
    }

    /// A new sample count, which must make at least the `created` trials
    /// the experiment already has. Returns whether it makes more trials
    /// than the saved count, so that a scheduler told the searcher was done
    /// can be told otherwise.
    pub(super) fn resample(&self, setup: &mut Setup, created: usize) -> Result<bool, Failure> {
        let Some(num_samples) = self.num_samples else {
            return Ok(false);
        };
        if num_samples == 0 {
            return Err(Failure::user("--num-samples must be at least 1"));
        }
        if setup.param_space.is_null() && setup.fixed_config.is_none() {
            return Err(Failure::user(
                "--num-samples: this experiment was saved by a wtune that created every trial \
                 up front; its trials cannot be added to",
            ));
        }
        let before = setup.searcher()?.total();
        let saved = setup.num_samples;
        setup.num_samples = num_samples;
        let after = setup.searcher()?.total();
        if let Some(total) = after.filter(|&t| t < created as u64) {
            return Err(Failure::user(format!(
                "--num-samples {num_samples} makes {total} trials, but the experiment has \
                 created {created} already; give a count that makes at least {created}"
            )));
        }
        if num_samples != saved {
            eprintln!("num_samples {saved} -> {num_samples}");
        }
        Ok(matches!((before, after), (Some(b), Some(a)) if a > b))
    }

    /// Puts `--stop` flags over the saved stopping criteria. A trial that
    /// ended because a saved criterion was met, and that the new ones let
    /// go on, is made PAUSED so that it continues from its newest
    /// checkpoint (or starts over without one); returns their ids. Trials a
    /// scheduler stopped, or that said they were done, stay finished.
    pub(super) fn extend_stops(
        &self,
        setup: &mut Setup,
        trials: &mut [Trial],
    ) -> Result<Vec<String>, Failure> {
        if self.stop.is_empty() {
            return Ok(Vec::new());
        }
        let saved_at_most = |key: &str| {
            setup
                .spec
                .stop
                .thresholds
                .iter()
                .any(|t| t.metric == key && matches!(t.bound, crate::tune::Bound::AtMost(_)))
        };
        let table = config::stop_flags(&self.stop, saved_at_most)
            .map_err(|e| Failure::user(e.to_string()))?;
        let newer = StopCriteria::from_json(&table).map_err(Failure::user)?;
        // A threshold on a metric the trials do not report (a typo such as
        // `training_iterations`) would extend nothing, be saved with the
        // setup, and then fail every trial at its next result and every
        // later `--stop`: refused while nothing has changed.
        if let Some(e) = trials
            .iter()
            .filter_map(|t| t.last_result.as_ref())
            .find_map(|result| newer.check_metrics(result).err())
        {
            return Err(Failure::user(format!("--stop: {e}; nothing was changed")));
        }
        let old = setup.spec.stop.clone();
        let new = old.merged(&newer);
        let mut extended = Vec::new();
        for trial in trials.iter_mut() {
            let Some(result) = &trial.last_result else {
                continue;
            };
            // Ended by a saved criterion (not by the scheduler or the
            // trainable's `done`), which the new ones no longer meet.
            let ended_by_criteria =
                trial.status == TrialStatus::Terminated
                    && old.reached(result).ok().flatten().is_some_and(|reason| {
                        trial.stop_reason.as_deref() == Some(reason.as_str())
                    })
                    && matches!(new.reached(result), Ok(None));
            if ended_by_criteria {
                trial.status = TrialStatus::Paused;
                trial.stop_reason = None;
                extended.push(trial.trial_id.clone());
            }
        }
        setup.spec.stop = new;
        Ok(extended)
    }
}

/// Refuses the `wtune run` flags for what a resumed experiment keeps,
/// each with the reason and what to do instead.
fn refuse_fixed(fixed: &FixedOnResume, setup: &Setup) -> Result<(), Failure> {
    let new_run = "start a new run with `wtune run` instead (`--restore-from` a checkpoint \
                   keeps a trial's training)";
    let spec = &setup.spec;
    let reason = if fixed.config.is_some() {
        Some(
            "`wtune resume` continues with the setup saved in the experiment directory and \
             reads no experiment file; what may change is given as flags: --stop, \
             --num-samples, --max-concurrent, --fuel, --fuel-per-call, --memory, --timeout, \
             --compute"
                .to_owned(),
        )
    } else if fixed.name.is_some() || fixed.output_dir.is_some() {
        Some(format!(
            "the experiment keeps its name ({}) and directory ({})",
            spec.name,
            spec.output_dir.display()
        ))
    } else if fixed.metric.is_some() || fixed.mode.is_some() {
        let metric = spec.metric.as_deref().unwrap_or("no metric");
        Some(format!(
            "--metric and --mode cannot change: the trials were ranked by `{metric}` ({}) and \
             the scheduler's and searcher's saved decisions rest on it; {new_run}",
            spec.mode
        ))
    } else if fixed.seed.is_some() {
        Some(format!(
            "--seed cannot change: the configurations still to come follow the saved seed \
             {}, and another seed would not continue this experiment; {new_run}",
            setup.seed
        ))
    } else if fixed.scheduler.is_some() || fixed.search.is_some() {
        Some(format!(
            "--scheduler and --search cannot change: the saved decisions belong to the \
             experiment's algorithms and cannot pass to others; {new_run}"
        ))
    } else if fixed.checkpoint.is_some() {
        Some(format!(
            "--checkpoint cannot change: the trials' checkpoints were written in {} mode, and \
             they continue from them",
            setup.checkpoint
        ))
    } else if !fixed.data.is_empty() {
        Some(
            "--data cannot change: the trials were set up with the data granted at the start, \
             and continuing them on other data would mix two experiments"
                .to_owned(),
        )
    } else if fixed.restore_from.is_some() {
        Some(
            "--restore-from does not apply: each trial continues from its own newest \
             checkpoint"
                .to_owned(),
        )
    } else {
        None
    };
    match reason {
        Some(reason) => Err(Failure::user(reason)),
        None => Ok(()),
    }
}
