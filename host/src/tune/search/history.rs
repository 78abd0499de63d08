//! What a model-based searcher (TPE, GP) has seen: the trials it suggested,
//! those still running, the completed ones' results, and the failed ones in
//! case they run again. It is also what such a searcher saves, so a resumed
//! search learns from exactly what the uninterrupted one would have.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::param::Param;
use crate::tune::result::Mode;
use crate::tune::saved::read_saved;

/// A completed trial's model values (see [`Param`]) and metric.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Observation {
    pub(super) values: Vec<f64>,
    pub(super) metric: f64,
}

/// A model-based searcher's record of its trials, saved as it is.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct History {
    /// Suggestions made; suggestion `k` draws from random stream `k`.
    pub(super) suggested: u64,
    /// In completion order, which TPE's recency weights depend on.
    pub(super) observations: Vec<Observation>,
    /// Suggested trials not yet complete, with their model values.
    pub(super) pending: BTreeMap<String, Vec<f64>>,
    /// Trials that ended in ERROR, with their model values, in case
    /// `wtune resume --retry-errored` runs them again.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(super) failed: BTreeMap<String, Vec<f64>>,
}

impl History {
    /// Records a suggestion made to `trial_id`.
    pub(super) fn suggest(&mut self, trial_id: &str, values: Vec<f64>) {
        self.suggested += 1;
        self.pending.insert(trial_id.to_string(), values);
    }

    /// A trial ended: it teaches its final `metric` when it completed with
    /// a finite one; an error is kept aside in case it is retried. Trials
    /// this searcher did not suggest are ignored.
    pub(super) fn complete(
        &mut self,
        trial_id: &str,
        result: Option<&Map<String, Value>>,
        error: bool,
        metric: &str,
    ) {
        let Some(values) = self.pending.remove(trial_id) else {
            return;
        };
        let metric = result
            .and_then(|r| r.get(metric))
            .and_then(Value::as_f64)
            .filter(|m| m.is_finite());
        match (error, metric) {
            (true, _) => {
                self.failed.insert(trial_id.to_string(), values);
            }
            (false, Some(metric)) => self.observations.push(Observation { values, metric }),
            (false, None) => {}
        }
    }

    /// A failed trial runs again: it is pending once more.
    pub(super) fn retry(&mut self, trial_id: &str) {
        if let Some(values) = self.failed.remove(trial_id) {
            self.pending.insert(trial_id.to_string(), values);
        }
    }

    /// Observation indices from best to worst under `mode`; ties go to the
    /// earlier observation, so the order does not depend on sort internals.
    pub(super) fn ranked(&self, mode: Mode) -> Vec<usize> {
        let sign = match mode {
            Mode::Min => 1.0,
            Mode::Max => -1.0,
        };
        let mut ranked: Vec<usize> = (0..self.observations.len()).collect();
        ranked.sort_by(|&a, &b| {
            let (la, lb) = (
                sign * self.observations[a].metric,
                sign * self.observations[b].metric,
            );
            la.total_cmp(&lb).then(a.cmp(&b))
        });
        ranked
    }

    /// Reads a saved history, checking that every value fits `params`;
    /// `what` names the searcher in errors ("TPE"). `Ok(None)`: nothing was
    /// saved.
    pub(super) fn restore(
        state: &Value,
        params: &[Param],
        what: &str,
    ) -> Result<Option<Self>, String> {
        let Some(saved) = read_saved::<History>(state, what)? else {
            return Ok(None);
        };
        let fits = |values: &Vec<f64>| {
            values.len() == params.len() && values.iter().zip(params).all(|(&x, p)| p.admits(x))
        };
        if !(saved.observations.iter().all(|o| fits(&o.values))
            && saved.pending.values().all(fits)
            && saved.failed.values().all(fits))
        {
            return Err(format!(
                "the saved {what} state does not fit this search space; was param_space changed?"
            ));
        }
        Ok(Some(saved))
    }
}
