//! Schedulers: the [`Scheduler`] interface, one file per algorithm, and
//! [`SchedulerSpec`], which builds them by name.

pub mod asha;
mod fifo;
pub mod hyperband;
pub mod median;
pub mod pbt;
mod scheduler;
#[cfg(test)]
pub(crate) mod sim;
mod spec;

pub use fifo::Fifo;
pub use scheduler::{Decision, Scheduler};
pub use spec::SchedulerSpec;
