//! What decides: the scheduler, the search (over the parameter space) and
//! each trial's stopping criteria.

use serde_json::{Map, Value};

use super::error::{ConfigError, bad};
use super::file::{ExperimentToml, by_name, one_line, to_json};
use super::overrides::Overrides;
use crate::tune::{
    Bound, ExperimentStop, Mode, ResultOrder, SchedulerSpec, SearchSpace, SearchSpec, StopCriteria,
};

/// Stop criterion applied when none is given, so `wtune run model.wasm`
/// ends on its own.
pub const DEFAULT_ITERATIONS: u64 = 10;

/// The scheduler `--scheduler` or the file names (FIFO by default).
pub(super) fn scheduler_spec(
    file: &ExperimentToml,
    overrides: &Overrides,
) -> Result<SchedulerSpec, ConfigError> {
    scheduler(by_name(&overrides.scheduler, &file.scheduler, "fifo").as_ref())
}

/// `scheduler = "asha"` or `[scheduler]` with `type = "asha"` and parameters.
fn scheduler(value: Option<&toml::Value>) -> Result<SchedulerSpec, ConfigError> {
    let mut table = match value {
        None => return Ok(SchedulerSpec::Fifo),
        Some(toml::Value::String(name)) => {
            let mut table = toml::Table::new();
            table.insert("type".into(), toml::Value::String(name.clone()));
            table
        }
        Some(toml::Value::Table(table)) => table.clone(),
        Some(other) => {
            return Err(bad(format!(
                "scheduler must be a name such as \"asha\" or a [scheduler] table; got {other}"
            )));
        }
    };
    let name = match table.remove("type") {
        Some(toml::Value::String(name)) => name,
        _ => return Err(bad("[scheduler] needs `type`, e.g. type = \"asha\"")),
    };
    let Value::Object(parameters) = to_json(&table) else {
        unreachable!("a TOML table is a JSON object")
    };
    SchedulerSpec::from_table(&name, parameters).map_err(|e| bad(one_line(&e)))
}

/// The search over the parameter space, checked by building it once.
pub(super) struct SearchPlan {
    /// `param_space` as JSON (`{}` when absent).
    pub(super) param_space: Value,
    /// How many trials the space and `num_samples` make.
    pub(super) trial_count: u64,
    /// The search algorithm and its parameters.
    pub(super) search: SearchSpec,
}

/// `[param_space]` and the search (`--search` or the file's; random by
/// default), built once here so that their parameters are checked before
/// anything runs.
pub(super) fn search_plan(
    file: &ExperimentToml,
    overrides: &Overrides,
    num_samples: u64,
    metric: Option<&str>,
    mode: Mode,
    seed: u64,
) -> Result<SearchPlan, ConfigError> {
    let param_space = file
        .param_space
        .as_ref()
        .map_or_else(|| Value::Object(Map::new()), to_json);
    let space = SearchSpace::from_json(&param_space).map_err(|e| bad(e.to_string()))?;
    let trial_count = space
        .trial_count(num_samples)
        .map_err(|e| bad(e.to_string()))?;
    // A [search] table without `type` is random search.
    let search = match &by_name(&overrides.search, &file.search, "random") {
        None => SearchSpec::default(),
        Some(value) => SearchSpec::from_json(&serde_json::to_value(value).unwrap_or(Value::Null))
            .map_err(bad)?,
    };
    search
        .build(&space, num_samples, metric, mode, seed)
        .map_err(bad)?;
    Ok(SearchPlan {
        param_space,
        trial_count,
        search,
    })
}

/// That every parameter PBT's `hyperparam_mutations` names is in
/// `param_space` ([`super::Plan::check_mutations`]).
pub(super) fn check_mutations(
    scheduler: &SchedulerSpec,
    param_space: &Value,
) -> Result<(), ConfigError> {
    let SchedulerSpec::Pbt(pbt) = scheduler else {
        return Ok(());
    };
    let space = SearchSpace::from_json(param_space).map_err(|e| bad(e.to_string()))?;
    match pbt
        .hyperparam_mutations
        .iter()
        .find(|(name, _)| !space.may_hold(name))
    {
        Some((name, _)) => Err(bad(format!(
            "scheduler.hyperparam_mutations mutates `{name}`, which param_space does not \
             have; add it to [param_space] (PBT perturbs values the trials started with)"
        ))),
        None => Ok(()),
    }
}

/// `[stop]` with the `--stop KEY=VALUE` flags over it; with neither, and a
/// scheduler that does not end trials itself, [`DEFAULT_ITERATIONS`] (and
/// a note saying so).
pub(super) fn stop_criteria(
    file: &ExperimentToml,
    overrides: &Overrides,
    scheduler: &SchedulerSpec,
    objective: (Option<&str>, Mode),
    notes: &mut Vec<String>,
) -> Result<StopCriteria, ConfigError> {
    let mut stop_table = file
        .stop
        .as_ref()
        .map(to_json)
        .and_then(|v| v.as_object().cloned())
        .unwrap_or_default();
    let flags = stop_flags(&overrides.stop, |key| stops_at_most(&stop_table, key))?;
    stop_table.extend(flags);
    let mut stop = StopCriteria::from_json(&stop_table).map_err(bad)?;
    if stop == StopCriteria::default() && !scheduler.ends_trials() {
        stop.training_iteration = Some(DEFAULT_ITERATIONS);
        notes.push(format!(
            "no stopping criteria given; each trial stops after {DEFAULT_ITERATIONS} iterations"
        ));
    }
    note_thresholds_against_mode(&stop, objective, notes);
    Ok(stop)
}

/// A note for a threshold on the ranked metric that points the way the
/// mode moves it away from: `loss = 0.05` with `mode = "min"` stops a
/// trial once the loss is *at least* 0.05, mostly at its first result. It
/// may be meant (stop a diverging trial), so it is not refused.
fn note_thresholds_against_mode(
    stop: &StopCriteria,
    (metric, mode): (Option<&str>, Mode),
    notes: &mut Vec<String>,
) {
    let Some(metric) = metric else { return };
    for threshold in stop.thresholds.iter().filter(|t| t.metric == metric) {
        let (shown, written, wanted, x) = match (&threshold.bound, mode) {
            (Bound::AtLeast(x), Mode::Min) => (">=", "at_most", "<=", x),
            (Bound::AtMost(x), Mode::Max) => ("<=", "at_least", ">=", x),
            _ => continue,
        };
        notes.push(format!(
            "stop.{metric} stops a trial once {metric} {shown} {x}, while mode = \"{mode}\" \
             moves {metric} the other way; if {x} is a target to reach, write \
             {metric} = {{ {written} = {x} }} or --stop '{metric}{wanted}{x}'"
        ));
    }
}

/// `deterministic`: whether results reach the scheduler and the searcher in
/// fuel-time order ([`ResultOrder::Fuel`]), so that a seeded run decides
/// the same on every machine. On by default when the scheduler measures
/// progress in fuel; a note says so when something measured in wall time
/// decides anyway.
pub(super) fn result_order(
    file: &ExperimentToml,
    scheduler: &SchedulerSpec,
    stop: &StopCriteria,
    stop_experiment: &ExperimentStop,
    notes: &mut Vec<String>,
) -> ResultOrder {
    if !fuel_order_chosen(file, scheduler) {
        return ResultOrder::Arrival;
    }
    let mut wall = Vec::new();
    if let Some(attr) = scheduler.time_attr().filter(|a| a.starts_with("time_")) {
        wall.push(format!("scheduler.time_attr = \"{attr}\""));
    }
    if stop.time_total_s.is_some() {
        wall.push("stop.time_total_s".to_string());
    }
    if stop_experiment.max_time.is_some() {
        wall.push("stop_experiment.max_time".to_string());
    }
    if !wall.is_empty() {
        notes.push(format!(
            "results are decided on in fuel order, but {} measure wall time: runs on other \
             machines may decide differently",
            wall.join(", ")
        ));
    }
    ResultOrder::Fuel
}

/// Whether the experiment decides in fuel order: `deterministic`, by
/// default on when the scheduler measures progress in fuel.
pub(super) fn fuel_order_chosen(file: &ExperimentToml, scheduler: &SchedulerSpec) -> bool {
    let fuel_clock = scheduler
        .time_attr()
        .is_some_and(|attr| attr.starts_with("fuel_"));
    file.deterministic.unwrap_or(fuel_clock)
}

/// In fuel order, a note when `max_concurrent_trials` was left to default
/// to this machine's cores and more than one trial runs: decisions depend
/// on it.
pub(super) fn note_default_concurrency(
    file: &ExperimentToml,
    overrides: &Overrides,
    order: ResultOrder,
    (max_concurrent, trial_count): (usize, u64),
    notes: &mut Vec<String>,
) {
    if order == ResultOrder::Fuel
        && trial_count > 1
        && file.max_concurrent_trials.is_none()
        && overrides.max_concurrent.is_none()
    {
        notes.push(format!(
            "max_concurrent_trials defaults to this machine's cores ({max_concurrent}); \
             decisions in fuel order depend on it: set it to decide the same on machines \
             with other core counts"
        ));
    }
}

/// `--stop` flags as a `[stop]` table. Each is `KEY=VALUE`, `KEY>=VALUE`
/// or `KEY<=VALUE`: `<=` stops a trial once the metric is at most the
/// value, `>=` once it is at least; `=` keeps the direction of the
/// criterion on `KEY` that it replaces (`at_most(KEY)` says whether that
/// is `<=`), and is `>=` where there is none. `training_iteration`,
/// `time_total_s` and `fuel_total` are limits, given with `=` only.
pub fn stop_flags(
    items: &[String],
    at_most: impl Fn(&str) -> bool,
) -> Result<Map<String, Value>, ConfigError> {
    let mut table = Map::new();
    for item in items {
        let Some(equals) = item.find('=') else {
            return Err(bad(format!(
                "--stop {item:?}: expected KEY=VALUE, KEY<=VALUE or KEY>=VALUE, e.g. \
                 --stop training_iteration=20 or --stop 'loss<=0.05'"
            )));
        };
        let head = item[..equals].trim_end();
        let (key, direction) = match head.as_bytes().last() {
            Some(b'<') => (&head[..head.len() - 1], Some("at_most")),
            Some(b'>') => (&head[..head.len() - 1], Some("at_least")),
            _ => (head, None),
        };
        let key = key.trim();
        let text = item[equals + 1..].trim();
        if key.is_empty() {
            return Err(bad(format!(
                "--stop {item:?}: no KEY before the `=`, e.g. --stop training_iteration=20"
            )));
        }
        let number = text
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite())
            .ok_or_else(|| bad(format!("--stop {item:?}: {text:?} is not a finite number")))?;
        let limit = LIMITS.contains(&key);
        if limit && direction.is_some() {
            return Err(bad(format!(
                "--stop {item:?}: {key} is a limit, reached when the trial gets to it; \
                 write --stop {key}={text}"
            )));
        }
        // An earlier flag on the same key is the criterion this replaces.
        let replaced_at_most = match table.get(key) {
            Some(earlier) => earlier.get("at_most").is_some(),
            None => at_most(key),
        };
        let direction = direction.or((!limit && replaced_at_most).then_some("at_most"));
        let value = match direction {
            Some(direction) => Value::Object(Map::from_iter([(
                direction.to_string(),
                Value::from(number),
            )])),
            None => Value::from(number),
        };
        table.insert(key.to_string(), value);
    }
    Ok(table)
}

/// The `[stop]` keys that are limits of every trial, not metric thresholds.
const LIMITS: [&str; 3] = ["training_iteration", "time_total_s", "fuel_total"];

/// Whether the `[stop]` table's criterion on `key` stops at or below its
/// value (`{ at_most = x }`).
fn stops_at_most(table: &Map<String, Value>, key: &str) -> bool {
    table
        .get(key)
        .and_then(Value::as_object)
        .is_some_and(|bound| bound.contains_key("at_most"))
}
