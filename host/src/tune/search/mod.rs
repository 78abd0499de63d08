//! Search algorithms: which configuration each new trial gets.
//!
//! A [`Searcher`] is asked for a configuration whenever the runner has room
//! for a new trial and the scheduler has no waiting trial to run. It learns
//! from every result, so model-based searchers (TPE) suggest better
//! configurations as the experiment goes on. Like schedulers, searchers are
//! pure: they see trial ids and results, never sandboxes, and their state is
//! saved with the experiment so that `wtune resume` continues the search.

mod basic;
mod gp;
mod history;
mod limiter;
mod listed;
mod normal;
mod param;
mod searcher;
mod spec;
#[cfg(test)]
mod testing;
mod tpe;

pub use basic::BasicVariant;
pub use gp::{Gp, GpConfig, MultiFidelity};
pub use limiter::ConcurrencyLimiter;
pub use listed::Listed;
pub use searcher::{Searcher, Suggestion};
pub use spec::{GridConfig, SearchAlgorithm, SearchSpec};
pub use tpe::{Tpe, TpeConfig};
