//! What the runner decided, one record per decision, so that two runs can
//! be compared decision by decision (`wtune decisions A B`).

use serde::{Deserialize, Serialize};

use crate::tune::schedulers::Decision;
use crate::tune::trial::Trial;

/// One decision about one trial, as [`super::Callback::on_decision`] hears
/// it. Every field is a function of the seed and the results alone (no
/// wall time), so runs that decided the same have equal records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecisionRecord {
    /// The experiment's fuel time of the event, in fuel order
    /// ([`super::ResultOrder::Fuel`]); absent in arrival order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fuel_time: Option<u64>,
    /// The trial decided on.
    pub trial_id: String,
    /// Its `training_iteration` then.
    pub iteration: u64,
    /// Its `fuel_total` then.
    pub fuel_total: u64,
    /// `START` (the trial took a slot), `CONTINUE`, `CHECKPOINT`, `STOP`,
    /// `PAUSE`, `EXPLOIT` (after a result), `RECOVER` or `ERROR` (after a
    /// failure).
    pub decision: String,
    /// Why, where there is more to say: the stop reason, the trial an
    /// exploit clones, a failure's reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

impl DecisionRecord {
    /// A record of `decision` about `trial` at `fuel_time`.
    pub(super) fn new(trial: &Trial, fuel_time: Option<u64>, decision: &str) -> Self {
        Self {
            fuel_time,
            trial_id: trial.trial_id.clone(),
            iteration: trial.iterations,
            fuel_total: trial.fuel_total,
            decision: decision.to_string(),
            why: None,
        }
    }

    /// With `why` said.
    pub(super) fn why(mut self, why: Option<String>) -> Self {
        self.why = why;
        self
    }
}

/// The name a record gives `decision`.
pub(super) fn decision_name(decision: &Decision) -> &'static str {
    match decision {
        Decision::Continue => "CONTINUE",
        Decision::Stop => "STOP",
        Decision::Pause => "PAUSE",
        Decision::Checkpoint => "CHECKPOINT",
        Decision::Exploit { .. } => "EXPLOIT",
    }
}
