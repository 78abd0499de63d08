//! A backend whose trainables are plain Rust closures: for testing and
//! benchmarking the runner without a sandbox, the way Syne Tune replays
//! learning curves.
//!
//! Checkpoints are small JSON files holding the iteration and fuel counts.
//! A step function made by [`FnBackend::new`] is a function of the config
//! and the iteration number, so restoring those counts restores the trial;
//! a closure that keeps other state across calls restarts it. Trainables
//! with state of their own (model weights, an optimizer's moments) use
//! [`FnBackend::stateful`]: their [`StatefulStep::state`] goes into every
//! checkpoint and comes back on restore, as a guest's `save`/`restore`
//! bytes do.

use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{
    CheckpointFault, CheckpointInfo, CheckpointMeta, Step, TrialBackend, TrialFailure, TrialLaunch,
    TrialSession,
};

/// A trainable with state that checkpoints carry: what
/// [`FnBackend::stateful`] builds for each launch.
pub trait StatefulStep: Send + 'static {
    /// Runs one training iteration; `iteration` is 1-based and counts the
    /// iterations restored from a checkpoint.
    fn step(&mut self, iteration: u64) -> Result<Step, TrialFailure>;

    /// The state to checkpoint now; the factory gets it back when a trial
    /// is launched from that checkpoint.
    fn state(&self) -> Value;
}

/// What a session drives, whichever way it was built.
trait Trainable: Send {
    fn step(&mut self, iteration: u64) -> Result<Step, TrialFailure>;
    /// `None`: nothing to save beyond the counters.
    fn state(&self) -> Option<Value>;
}

/// A [`FnBackend::new`] step function: all it knows is the iteration.
struct Stateless<F>(F);

impl<F> Trainable for Stateless<F>
where
    F: FnMut(u64) -> Result<Step, TrialFailure> + Send,
{
    fn step(&mut self, iteration: u64) -> Result<Step, TrialFailure> {
        (self.0)(iteration)
    }

    fn state(&self) -> Option<Value> {
        None
    }
}

/// A [`FnBackend::stateful`] trainable.
struct Stateful<S>(S);

impl<S: StatefulStep> Trainable for Stateful<S> {
    fn step(&mut self, iteration: u64) -> Result<Step, TrialFailure> {
        self.0.step(iteration)
    }

    fn state(&self) -> Option<Value> {
        Some(self.0.state())
    }
}

type Factory =
    dyn Fn(&Value, Option<&Value>) -> Result<Box<dyn Trainable>, TrialFailure> + Send + Sync;

/// Builds each trial's step function from its config; the step function gets
/// the 1-based iteration number.
///
/// ```
/// use wtune::tune::{FnBackend, Step};
/// let backend = FnBackend::new(|config| {
///     let lr = config["lr"].as_f64().unwrap_or(0.1);
///     Ok(move |iteration: u64| Ok(Step {
///         metrics: vec![("loss".into(), 1.0 / (1.0 + lr * iteration as f64))],
///         done: false,
///         fuel: 1,
///     }))
/// });
/// # let _ = backend;
/// ```
#[derive(Clone)]
pub struct FnBackend {
    factory: Arc<Factory>,
}

impl FnBackend {
    /// A backend from a factory of step functions.
    pub fn new<F, S>(factory: F) -> Self
    where
        F: Fn(&Value) -> Result<S, TrialFailure> + Send + Sync + 'static,
        S: FnMut(u64) -> Result<Step, TrialFailure> + Send + 'static,
    {
        Self {
            factory: Arc::new(move |config, _state| {
                Ok(Box::new(Stateless(factory(config)?)) as Box<dyn Trainable>)
            }),
        }
    }

    /// A backend whose trainables have state that checkpoints carry. The
    /// factory gets the trial's config and, when the trial is launched from
    /// a checkpoint, the [`StatefulStep::state`] saved in it (`None` for a
    /// fresh trial, and for a checkpoint written without state). A PBT
    /// exploit launches a trial from another trial's checkpoint with a new
    /// config: the factory then gets the new config with the cloned state,
    /// as a guest gets `setup(new config)` and then `restore(bytes)`.
    ///
    /// ```
    /// use serde_json::{Value, json};
    /// use wtune::tune::{FnBackend, StatefulStep, Step, TrialFailure};
    ///
    /// /// Gradient descent on x^2, from wherever the checkpoint left x.
    /// struct Descent { x: f64, lr: f64 }
    ///
    /// impl StatefulStep for Descent {
    ///     fn step(&mut self, _iteration: u64) -> Result<Step, TrialFailure> {
    ///         self.x -= self.lr * 2.0 * self.x;
    ///         Ok(Step { metrics: vec![("loss".into(), self.x * self.x)], done: false, fuel: 1 })
    ///     }
    ///     fn state(&self) -> Value {
    ///         json!({"x": self.x})
    ///     }
    /// }
    ///
    /// let backend = FnBackend::stateful(|config: &Value, state: Option<&Value>| {
    ///     Ok(Descent {
    ///         x: state.and_then(|s| s["x"].as_f64()).unwrap_or(1.0),
    ///         lr: config["lr"].as_f64().ok_or_else(|| TrialFailure::new("lr missing"))?,
    ///     })
    /// });
    /// # let _ = backend;
    /// ```
    pub fn stateful<F, S>(factory: F) -> Self
    where
        F: Fn(&Value, Option<&Value>) -> Result<S, TrialFailure> + Send + Sync + 'static,
        S: StatefulStep,
    {
        Self {
            factory: Arc::new(move |config, state| {
                Ok(Box::new(Stateful(factory(config, state)?)) as Box<dyn Trainable>)
            }),
        }
    }
}

/// A live [`FnBackend`] trial.
pub struct FnSession {
    trainable: Box<dyn Trainable>,
    iteration: u64,
    fuel_total: u64,
    time_restored_s: f64,
}

/// The content of an [`FnBackend`] checkpoint file.
#[derive(Debug, Serialize, Deserialize)]
struct FnCheckpoint {
    trial_id: String,
    iteration: u64,
    fuel_total: u64,
    time_total_s: f64,
    #[serde(default)]
    result: Option<serde_json::Map<String, Value>>,
    /// A [`StatefulStep`]'s state; absent for step functions without one
    /// (and in checkpoints written before stateful trainables existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    state: Option<Value>,
}

fn read(path: &Path) -> Result<FnCheckpoint, TrialFailure> {
    let bytes = std::fs::read(path)
        .map_err(|e| TrialFailure::new(format!("reading checkpoint {}: {e}", path.display())))?;
    serde_json::from_slice::<FnCheckpoint>(&bytes)
        .map_err(|e| TrialFailure::new(format!("checkpoint {} is damaged: {e}", path.display())))
}

impl TrialBackend for FnBackend {
    type Session = FnSession;

    fn launch(&self, launch: &TrialLaunch) -> Result<FnSession, TrialFailure> {
        let restored = match &launch.restore {
            Some(path) => read(path)?,
            None => FnCheckpoint {
                trial_id: launch.trial_id.clone(),
                iteration: 0,
                fuel_total: 0,
                time_total_s: 0.0,
                result: None,
                state: None,
            },
        };
        Ok(FnSession {
            trainable: (self.factory)(&launch.config, restored.state.as_ref())?,
            iteration: restored.iteration,
            fuel_total: restored.fuel_total,
            time_restored_s: restored.time_total_s,
        })
    }

    fn describe_checkpoint(&self, path: &Path) -> Result<CheckpointMeta, CheckpointFault> {
        let bytes = std::fs::read(path).map_err(|e| {
            CheckpointFault::Unreadable(format!("reading checkpoint {}: {e}", path.display()))
        })?;
        let checkpoint = serde_json::from_slice::<FnCheckpoint>(&bytes).map_err(|e| {
            CheckpointFault::Damaged(format!("checkpoint {} is damaged: {e}", path.display()))
        })?;
        Ok(CheckpointMeta {
            iteration: checkpoint.iteration,
            time_total_s: checkpoint.time_total_s,
            fuel_total: checkpoint.fuel_total,
            result: checkpoint.result,
        })
    }
}

impl TrialSession for FnSession {
    fn train(&mut self) -> Result<Step, TrialFailure> {
        self.iteration += 1;
        let step = self.trainable.step(self.iteration)?;
        self.fuel_total += step.fuel;
        Ok(step)
    }

    fn fuel_total(&self) -> u64 {
        self.fuel_total
    }

    fn iteration(&self) -> u64 {
        self.iteration
    }

    fn time_restored_s(&self) -> f64 {
        self.time_restored_s
    }

    fn save(&mut self, path: &Path, info: &CheckpointInfo<'_>) -> Result<u64, TrialFailure> {
        let checkpoint = FnCheckpoint {
            trial_id: info.trial_id.to_string(),
            iteration: self.iteration,
            fuel_total: self.fuel_total,
            time_total_s: info.time_total_s,
            result: info.result.cloned(),
            state: self.trainable.state(),
        };
        let bytes = serde_json::to_vec(&checkpoint).expect("checkpoints serialize");
        crate::persist::write_atomic(path, &bytes)
            .map_err(|e| TrialFailure::new(format!("writing {}: {e}", path.display())))?;
        Ok(bytes.len() as u64)
    }

    fn stop(self) -> Result<(), TrialFailure> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::Mutex;

    use serde_json::json;

    use super::*;

    /// Accumulates `config.add` into a running sum each step; the sum is
    /// the state, so only a checkpoint that carries it can continue it.
    struct Summer {
        sum: f64,
        add: f64,
    }

    impl StatefulStep for Summer {
        fn step(&mut self, _iteration: u64) -> Result<Step, TrialFailure> {
            self.sum += self.add;
            Ok(Step {
                metrics: vec![("sum".into(), self.sum)],
                done: false,
                fuel: 2,
            })
        }

        fn state(&self) -> Value {
            json!({"sum": self.sum})
        }
    }

    /// Each launch's config and restored state, in order.
    type Launches = Arc<Mutex<Vec<(Value, Option<Value>)>>>;

    /// A backend of [`Summer`]s that logs what each launch was given.
    fn summers(log: Launches) -> FnBackend {
        FnBackend::stateful(move |config: &Value, state: Option<&Value>| {
            log.lock().unwrap().push((config.clone(), state.cloned()));
            Ok(Summer {
                sum: state.map_or(Ok(0.0), |s| {
                    s["sum"]
                        .as_f64()
                        .ok_or_else(|| TrialFailure::permanent("state without sum"))
                })?,
                add: config["add"].as_f64().unwrap_or(1.0),
            })
        })
    }

    fn launch(config: Value, restore: Option<PathBuf>) -> TrialLaunch {
        TrialLaunch {
            trial_id: "trial_0000".into(),
            config,
            trial_dir: std::env::temp_dir(),
            restore,
            resources: Default::default(),
            gpus: Vec::new(),
        }
    }

    fn save(session: &mut FnSession, path: &Path, config: &Value) -> u64 {
        let info = CheckpointInfo {
            trial_id: "trial_0000",
            config,
            iteration: session.iteration(),
            time_total_s: 1.5,
            result: None,
        };
        session.save(path, &info).unwrap()
    }

    fn metric(step: Step) -> f64 {
        step.metrics[0].1
    }

    #[test]
    fn stateful_checkpoints_carry_the_state_into_a_new_config() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("checkpoint.ckpt");
        let log = Arc::new(Mutex::new(Vec::new()));
        let backend = summers(log.clone());
        let config = json!({"add": 2.0});
        let mut session = backend.launch(&launch(config.clone(), None)).unwrap();
        for _ in 0..3 {
            session.train().unwrap();
        }
        assert!(save(&mut session, &path, &config) > 0);
        assert_eq!(
            metric(session.train().unwrap()),
            8.0,
            "saving changes nothing"
        );

        // The same config continues where the checkpoint left off.
        let mut same = backend
            .launch(&launch(config.clone(), Some(path.clone())))
            .unwrap();
        assert_eq!((same.iteration(), same.fuel_total()), (3, 6));
        assert_eq!(same.time_restored_s(), 1.5);
        assert_eq!(metric(same.train().unwrap()), 8.0);
        assert_eq!(same.iteration(), 4);

        // An exploit: another config, the cloned state.
        let other = json!({"add": -10.0});
        let mut cloned = backend
            .launch(&launch(other.clone(), Some(path.clone())))
            .unwrap();
        assert_eq!(
            metric(cloned.train().unwrap()),
            -4.0,
            "6 carried over, then -10"
        );
        assert_eq!(
            *log.lock().unwrap(),
            [
                (config.clone(), None),
                (config, Some(json!({"sum": 6.0}))),
                (other, Some(json!({"sum": 6.0}))),
            ]
        );
        let meta = backend.describe_checkpoint(&path).unwrap();
        assert_eq!((meta.iteration, meta.fuel_total), (3, 6));
    }

    #[test]
    fn checkpoints_without_state_still_load() {
        let dir = tempfile::tempdir().unwrap();
        // A checkpoint as written before stateful trainables existed.
        let old = dir.path().join("old.ckpt");
        std::fs::write(
            &old,
            r#"{"trial_id":"trial_0000","iteration":4,"fuel_total":9,"time_total_s":2.0}"#,
        )
        .unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut session = summers(log.clone())
            .launch(&launch(json!({}), Some(old.clone())))
            .unwrap();
        assert_eq!((session.iteration(), session.fuel_total()), (4, 9));
        assert_eq!(
            metric(session.train().unwrap()),
            1.0,
            "the state starts afresh"
        );
        assert_eq!(log.lock().unwrap()[0].1, None);

        // Step functions without state write no `state` field, so the files
        // stay as older versions read them.
        let plain = FnBackend::new(|_: &Value| {
            Ok(|i: u64| {
                Ok(Step {
                    metrics: vec![("i".into(), i as f64)],
                    done: false,
                    fuel: 1,
                })
            })
        });
        let mut session = plain.launch(&launch(json!({}), Some(old))).unwrap();
        assert_eq!(metric(session.train().unwrap()), 5.0);
        let path = dir.path().join("plain.ckpt");
        save(&mut session, &path, &json!({}));
        let written: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(written["iteration"], 5);
        assert!(written.get("state").is_none(), "{written}");
    }

    #[test]
    fn a_damaged_state_fails_the_launch_as_the_factory_says() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.ckpt");
        std::fs::write(
            &path,
            r#"{"trial_id":"t","iteration":1,"fuel_total":1,"time_total_s":0.0,"state":{"x":1}}"#,
        )
        .unwrap();
        let failure = summers(Arc::default())
            .launch(&launch(json!({}), Some(path)))
            .err()
            .unwrap();
        assert_eq!(failure, TrialFailure::permanent("state without sum"));
    }
}
