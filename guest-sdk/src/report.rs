//! What a training iteration returns to the host.

/// The metrics of one `train()` call, and whether the trainable is finished.
///
/// ```
/// use wtune_guest::Report;
/// let report = Report::new().metric("loss", 0.25).metric("accuracy", 0.9);
/// assert_eq!(report.metrics().len(), 2);
/// assert!(!report.is_done());
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Report {
    metrics: Vec<(String, f64)>,
    done: bool,
}

impl Report {
    /// An empty report (no metrics, not done).
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a named metric. Names must be unique within one report and must
    /// not collide with the fields the host fills in (`training_iteration`,
    /// `fuel_total`, ...); the host rejects such a report with a clear error.
    pub fn metric(mut self, name: impl Into<String>, value: f64) -> Self {
        self.metrics.push((name.into(), value));
        self
    }

    /// Marks the trainable as finished: the host ends the trial as TERMINATED
    /// after recording this report.
    pub fn done(mut self, done: bool) -> Self {
        self.done = done;
        self
    }

    /// The metrics added so far, in order.
    pub fn metrics(&self) -> &[(String, f64)] {
        &self.metrics
    }

    /// Whether [`Report::done`] was set.
    pub fn is_done(&self) -> bool {
        self.done
    }

    pub(crate) fn into_wit(self) -> crate::bindings::wtune::trainable::types::Report {
        use crate::bindings::wtune::trainable::types::{Metric, Report as WitReport};
        WitReport {
            metrics: self
                .metrics
                .into_iter()
                .map(|(name, value)| Metric { name, value })
                .collect(),
            done: self.done,
        }
    }
}
