//! Tuning logic: trials, search spaces, stopping, scheduling and the runner
//! loop. Nothing here knows about wasmtime; execution sits behind
//! [`TrialBackend`], so the runner can be tested and benchmarked with any
//! backend, including plain Rust functions ([`FnBackend`]).

mod backend;
pub mod control;
mod decisions;
pub mod experiment_stop;
pub mod replay;
pub mod resources;
mod result;
pub mod resume;
mod runner;
mod saved;
mod schedulers;
pub mod search;
pub mod space;
mod table;
mod trial;
mod trial_stop;

pub use crate::machine::{detect_gpus, machine_gpus};
pub use asha::{Asha, AshaConfig, AshaVariant};
pub use backend::closure::{FnBackend, StatefulStep};
pub use backend::{
    CheckpointFault, CheckpointInfo, CheckpointMeta, Step, TrialBackend, TrialFailure, TrialLaunch,
    TrialSession,
};
pub use control::{Command, ControlError, Controller, Reply, Requests};
pub use decisions::{
    AtMoment, Deciders, DecisionState, FuelMoment, PendingStep, SavedClock, SavedState,
};
/// [`experiment_stop`] under its earlier name.
pub use experiment_stop as stopper;
pub use experiment_stop::{ExperimentStop, ExperimentStopper, PlateauConfig, Totals};
pub use hyperband::{HyperBand, HyperBandConfig};
pub use median::{MedianStopping, MedianStoppingConfig};
pub use pbt::{PbtConfig, PopulationBasedTraining};
pub use replay::{CurveSet, replay_backend};
pub use resources::{Acquire, PoolSpec, ResourcePool, Resources, fit_gpu};
pub use result::{AUTO_FIELDS, Mode, check_metric_names};
pub(crate) use runner::best_trial;
pub use runner::{
    CHECKPOINT_DIR, Callback, CheckpointPolicy, DecisionRecord, ExperimentSummary, FailFast,
    FailurePolicy, ResultOrder, RunError, RunSpec, Runner, STOPPED_BY_REQUEST, TrialSetup,
};
pub use schedulers::{Decision, Fifo, Scheduler, SchedulerSpec};
pub use schedulers::{asha, hyperband, median, pbt};
pub use search::{
    BasicVariant, ConcurrencyLimiter, GridConfig, Listed, SearchAlgorithm, SearchSpec, Searcher,
    Suggestion, Tpe, TpeConfig,
};
pub use space::{SearchSpace, SpaceError};
pub use trial::{Checkpoint, Trial, TrialStatus};
pub use trial_stop::{Bound, StopCriteria, Threshold};
