//! What a model-based searcher (TPE, GP) has seen: the trials it suggested,
//! those still running, the completed ones' results, and the failed ones in
//! case they run again; where the searcher asks, intermediate results and
//! what each trial's iterations cost. It is also what such a searcher
//! saves, so a resumed search learns from exactly what the uninterrupted
//! one would have.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::param::Param;
use crate::tune::result::Mode;
use crate::tune::saved::read_saved;

/// `map`'s entries in start order. Trial ids sort as numbers: once a
/// resume's larger sample count widens them, `trial_10000` follows
/// `trial_9999`, where a `BTreeMap` of ids puts it first. What keeps only
/// the latest trials (the GP's caps) depends on it.
pub(super) fn in_start_order<T>(map: &BTreeMap<String, T>) -> Vec<(&String, &T)> {
    let mut entries: Vec<(&String, &T)> = map.iter().collect();
    entries.sort_by(|a, b| (a.0.len(), a.0).cmp(&(b.0.len(), b.0)));
    entries
}

/// A completed trial's model values (see [`Param`]) and metric.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Observation {
    pub(super) values: Vec<f64>,
    pub(super) metric: f64,
    /// The trial's id, kept for a completed trial's final result so that
    /// an extended trial ([`History::retry`]) can take it back. `None` in
    /// model points read off curves and in histories saved before ids were
    /// kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) trial: Option<String>,
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
    /// Per trial, its intermediate results, kept only for a searcher that
    /// learns from them ([`History::record`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(super) curves: BTreeMap<String, Curve>,
    /// Per trial, its model values and the natural log of the fuel an
    /// iteration took, kept only for a searcher that weighs cost
    /// ([`History::record_cost`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(super) costs: BTreeMap<String, Observation>,
}

/// A trial's model values and its finite metrics at the iterations kept
/// ([`kept_iteration`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Curve {
    pub(super) values: Vec<f64>,
    pub(super) metrics: BTreeMap<u64, f64>,
}

/// Whether a curve keeps its metric at `iteration`: every one up to 16,
/// then a geometric grid (16, 20, 25, 31, 38, ..., each a quarter more),
/// so that a long trial keeps a few dozen points rather than one per
/// iteration. A rung between grid points is read at the grid point below
/// it, which every trial that reached the rung also passed.
pub(super) fn kept_iteration(iteration: u64) -> bool {
    if iteration <= 16 {
        return iteration >= 1;
    }
    let mut grid = 16u64;
    while grid < iteration {
        grid += grid / 4;
    }
    grid == iteration
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
            (false, Some(metric)) => self.observations.push(Observation {
                values,
                metric,
                trial: Some(trial_id.to_string()),
            }),
            (false, None) => {}
        }
    }

    /// An intermediate result of a running trial: its metric at its
    /// `training_iteration`, for multi-fidelity models, where that
    /// iteration is kept ([`kept_iteration`]). Results of trials this
    /// searcher did not suggest, or without an iteration or a finite
    /// metric, are ignored.
    pub(super) fn record(&mut self, trial_id: &str, result: &Map<String, Value>, metric: &str) {
        let Some(values) = self.pending.get(trial_id) else {
            return;
        };
        let Some(iteration) = result
            .get("training_iteration")
            .and_then(Value::as_u64)
            .filter(|&i| kept_iteration(i))
        else {
            return;
        };
        let Some(value) = result
            .get(metric)
            .and_then(Value::as_f64)
            .filter(|m| m.is_finite())
        else {
            return;
        };
        self.curves
            .entry(trial_id.to_string())
            .or_insert_with(|| Curve {
                values: values.clone(),
                metrics: BTreeMap::new(),
            })
            .metrics
            .insert(iteration, value);
    }

    /// An intermediate result of a running trial: the mean fuel its
    /// iterations took since it (re)started (`fuel_since_restore` over
    /// `iterations_since_restore`, which the runner adds to every result),
    /// for cost-aware models. A mean, not the latest iteration's fuel: a
    /// first iteration that also builds the model would make every trial
    /// ASHA stops early look dearer than the ones it promotes. Results of
    /// trials this searcher did not suggest, or without positive fuel, are
    /// ignored.
    pub(super) fn record_cost(&mut self, trial_id: &str, result: &Map<String, Value>) {
        let Some(values) = self.pending.get(trial_id) else {
            return;
        };
        let number = |key: &str| result.get(key).and_then(Value::as_f64);
        let Some(fuel) = number("fuel_since_restore")
            .zip(number("iterations_since_restore"))
            .map(|(fuel, iterations)| fuel / iterations)
            .filter(|&f| f > 0.0 && f.is_finite())
        else {
            return;
        };
        self.costs.insert(
            trial_id.to_string(),
            Observation {
                values: values.clone(),
                metric: fuel.ln(),
                trial: None,
            },
        );
    }

    /// The highest iteration at which at least `min_count` trials reported
    /// a finite metric, with those trials' model values and metrics there,
    /// in trial-id (suggestion) order: what a BOHB-style model learns from,
    /// the most faithful ranking there is enough of. `None`: no iteration
    /// has that many yet.
    pub(super) fn rung(&self, min_count: usize) -> Option<(u64, Vec<Observation>)> {
        let mut counts: BTreeMap<u64, usize> = BTreeMap::new();
        for curve in self.curves.values() {
            for &iteration in curve.metrics.keys() {
                *counts.entry(iteration).or_default() += 1;
            }
        }
        let (&at, _) = counts
            .iter()
            .rev()
            .find(|&(_, &count)| count >= min_count.max(1))?;
        let observations = self
            .curves
            .values()
            .filter_map(|c| {
                c.metrics.get(&at).map(|&metric| Observation {
                    values: c.values.clone(),
                    metric,
                    trial: None,
                })
            })
            .collect();
        Some((at, observations))
    }

    /// What a joint model of configuration and iteration learns from
    /// (MOBSTER-style): each trial's metrics at the levels, the iterations
    /// at which trials that ended without error reported last (under ASHA
    /// or HyperBand, their rungs), and a running trial's at its own last
    /// iteration too; a failed trial's only at the levels. As (model
    /// values, iteration, metric) in start order ([`in_start_order`]).
    /// Reading the curves at levels, not at every iteration, keeps a trial
    /// to the few points a scheduler judged it by, so a fit stays near the
    /// trial count.
    pub(super) fn levels(&self) -> Vec<(&[f64], u64, f64)> {
        let ends: std::collections::BTreeSet<u64> = self
            .curves
            .iter()
            .filter(|(id, _)| !self.pending.contains_key(*id) && !self.failed.contains_key(*id))
            .filter_map(|(_, c)| c.metrics.keys().next_back().copied())
            .collect();
        let ends = &ends;
        in_start_order(&self.curves)
            .into_iter()
            .flat_map(|(id, c)| {
                let last = c
                    .metrics
                    .keys()
                    .next_back()
                    .copied()
                    .filter(|_| self.pending.contains_key(id));
                c.metrics
                    .iter()
                    .filter(move |(i, _)| ends.contains(i) || Some(**i) == last)
                    .map(|(&i, &m)| (c.values.as_slice(), i, m))
            })
            .collect()
    }

    /// What a model learns from: with `multi_fidelity`, the [`History::rung`]
    /// at least `min_count` trials reached and its iteration (nothing until
    /// one exists); otherwise the completed trials' results.
    pub(super) fn learning_set(
        &self,
        multi_fidelity: bool,
        min_count: usize,
    ) -> (Cow<'_, [Observation]>, Option<u64>) {
        if !multi_fidelity {
            return (Cow::Borrowed(&self.observations), None);
        }
        match self.rung(min_count) {
            Some((iteration, at)) => (Cow::Owned(at), Some(iteration)),
            None => (Cow::Borrowed(&[]), None),
        }
    }

    /// Model values of the pending trials to count as bad ("constant
    /// liar"): all of them, except, when the model learns from the rung at
    /// `iteration`, those that reported there, which are observations.
    pub(super) fn lies(&self, iteration: Option<u64>) -> impl Iterator<Item = &Vec<f64>> {
        self.pending
            .iter()
            .filter(move |(id, _)| {
                !iteration.is_some_and(|i| {
                    self.curves
                        .get(*id)
                        .is_some_and(|c| c.metrics.contains_key(&i))
                })
            })
            .map(|(_, values)| values)
    }

    /// Model values of the trials that ended without error before
    /// reaching iteration `rung` and, at the last iteration they reported,
    /// trailed a trial that went on to reach it: those a scheduler such as
    /// ASHA stopped for ranking low there, not those a stop criterion ended
    /// for doing well. In start order ([`in_start_order`]).
    pub(super) fn stopped_below(&self, rung: u64, mode: Mode) -> Vec<&Vec<f64>> {
        let reached: Vec<&Curve> = self
            .curves
            .values()
            .filter(|c| c.metrics.contains_key(&rung))
            .collect();
        in_start_order(&self.curves)
            .into_iter()
            .filter(|(id, curve)| {
                !self.pending.contains_key(*id)
                    && !self.failed.contains_key(*id)
                    && curve
                        .metrics
                        .last_key_value()
                        .is_some_and(|(&last, &metric)| {
                            last < rung
                                && reached.iter().any(|r| {
                                    r.metrics
                                        .get(&last)
                                        .is_some_and(|&m| mode.better(m, metric))
                                })
                        })
            })
            .map(|(_, curve)| &curve.values)
            .collect()
    }

    /// The observations' trials and metrics, in completion order.
    #[cfg(test)]
    pub(super) fn ends(&self) -> Vec<(Option<&str>, f64)> {
        self.observations
            .iter()
            .map(|o| (o.trial.as_deref(), o.metric))
            .collect()
    }

    /// A trial runs again: one that failed (`wtune resume
    /// --retry-errored`), or one that completed and is extended under new
    /// stopping criteria (`wtune resume --stop`). It is pending once more,
    /// and a completed one's final result is taken back: the results it
    /// reports from here on teach instead, as if it had run under the new
    /// criteria from the start, except that its new end is learned last,
    /// in completion order. A completed trial without a finite metric is
    /// found by its curve or cost where the searcher kept one; one that
    /// left no trace, or whose observation was saved before observations
    /// kept their trial's id, cannot be found and stays as it was.
    pub(super) fn retry(&mut self, trial_id: &str) {
        if let Some(values) = self.failed.remove(trial_id) {
            self.pending.insert(trial_id.to_string(), values);
        } else if let Some(k) = self
            .observations
            .iter()
            .position(|o| o.trial.as_deref() == Some(trial_id))
        {
            let taken = self.observations.remove(k);
            self.pending.insert(trial_id.to_string(), taken.values);
        } else if let Some(values) = self
            .curves
            .get(trial_id)
            .map(|c| &c.values)
            .or_else(|| self.costs.get(trial_id).map(|c| &c.values))
            // An observation saved without its id may be this trial's.
            .filter(|v| {
                !self
                    .observations
                    .iter()
                    .any(|o| o.trial.is_none() && o.values == **v)
            })
        {
            self.pending.insert(trial_id.to_string(), values.clone());
        }
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
            && saved.failed.values().all(fits)
            && saved.curves.values().all(|c| fits(&c.values))
            && saved.costs.values().all(|c| fits(&c.values)))
        {
            return Err(format!(
                "the saved {what} state does not fit this search space; was param_space changed?"
            ));
        }
        Ok(Some(saved))
    }
}

/// Observation indices from best to worst under `mode`; ties go to the
/// earlier observation, so the order does not depend on sort internals.
pub(super) fn ranked(observations: &[Observation], mode: Mode) -> Vec<usize> {
    let sign = match mode {
        Mode::Min => 1.0,
        Mode::Max => -1.0,
    };
    let mut ranked: Vec<usize> = (0..observations.len()).collect();
    ranked.sort_by(|&a, &b| {
        let (la, lb) = (sign * observations[a].metric, sign * observations[b].metric);
        la.total_cmp(&lb).then(a.cmp(&b))
    });
    ranked
}
