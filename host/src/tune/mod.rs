//! Tuning logic: trials, search spaces, stopping, scheduling and the runner
//! loop. Nothing here knows about wasmtime; execution sits behind
//! [`TrialBackend`], so the runner can be tested and benchmarked with any
//! backend, including plain Rust functions ([`FnBackend`]).

pub mod asha;
mod backend;
pub mod control;
mod decisions;
pub mod hyperband;
pub mod median;
mod native;
pub mod pbt;
pub mod replay;
pub mod resources;
mod result;
pub mod resume;
mod runner;
mod scheduler;
pub mod search;
pub mod space;
mod stop;
pub mod stopper;
mod trial;

pub use asha::{Asha, AshaConfig, AshaVariant};
pub use backend::{
    CheckpointInfo, CheckpointMeta, Step, TrialBackend, TrialFailure, TrialLaunch, TrialSession,
};
pub use control::{Command, ControlError, Controller, Reply, Requests};
pub use decisions::{Deciders, DecisionState, SavedState};
pub use hyperband::{HyperBand, HyperBandConfig};
pub use median::{MedianStopping, MedianStoppingConfig};
pub use native::{FnBackend, StatefulStep};
pub use pbt::{PbtConfig, PopulationBasedTraining};
pub use replay::{CurveSet, replay_backend};
pub use resources::{
    Acquire, PoolSpec, ResourcePool, Resources, detect_gpus, fit_gpu, machine_gpus,
};
pub use result::{AUTO_FIELDS, Mode};
pub(crate) use runner::best_trial;
pub use runner::{
    CHECKPOINT_DIR, Callback, CheckpointPolicy, ExperimentSummary, FailFast, FailurePolicy,
    RunError, RunSpec, Runner, STOPPED_BY_REQUEST, TrialSetup,
};
pub use scheduler::{Decision, Fifo, Scheduler, SchedulerSpec};
pub use search::{
    BasicVariant, ConcurrencyLimiter, GridConfig, Listed, SearchAlgorithm, SearchSpec, Searcher,
    Suggestion, Tpe, TpeConfig,
};
pub use space::{SearchSpace, SpaceError};
pub use stop::{Bound, StopCriteria, Threshold};
pub use stopper::{ExperimentStop, ExperimentStopper, PlateauConfig, Totals};
pub use trial::{Checkpoint, Trial, TrialStatus};
