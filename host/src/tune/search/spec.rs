//! Searchers by name: the one place that names every search algorithm.

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

use super::basic::BasicVariant;
use super::gp::{Gp, GpConfig};
use super::limiter::ConcurrencyLimiter;
use super::searcher::Searcher;
use super::tpe::{Tpe, TpeConfig};
use crate::tune::result::Mode;
use crate::tune::space::SearchSpace;
use crate::tune::table::from_table;

/// A searcher by name and parameters, as an experiment file gives it:
/// `search = "tpe"`, or a `[search]` table with `type` (default `random`),
/// the searcher's parameters, and `max_concurrent` for any searcher.
///
/// Deserializing checks the keys itself instead of relying on serde:
/// `max_concurrent` sits beside the searcher's own keys, and serde's
/// `deny_unknown_fields` neither works on a struct with a flattened field
/// nor sees extra keys next to a unit variant (`type = "random"`). Every
/// unknown key is refused with the keys that searcher takes, and a wrong
/// value's message names its key (the searcher's own config is read, not
/// the tagged enum, which loses the key).
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct SearchSpec {
    /// Which searcher, with its parameters.
    #[serde(flatten)]
    pub algorithm: SearchAlgorithm,
    /// At most this many suggested trials live at once
    /// ([`ConcurrencyLimiter`]); `None` leaves only the runner's own limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_concurrent: Option<usize>,
}

/// The searchers known, with their parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
pub enum SearchAlgorithm {
    /// [`BasicVariant::random`].
    #[default]
    Random,
    /// [`BasicVariant::grid`].
    Grid(GridConfig),
    /// [`Tpe`].
    Tpe(TpeConfig),
    /// [`Gp`].
    Gp(GpConfig),
}

/// Grid search's parameter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct GridConfig {
    /// Values tried for each continuous domain (uniform, loguniform,
    /// randint, quniform); without it those domains are an error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub points: Option<usize>,
}

impl GridConfig {
    /// The keys a `[search]` table with `type = "grid"` takes.
    pub const FIELDS: [&'static str; 1] = ["points"];
}

impl SearchAlgorithm {
    /// The searcher's name, as `type` gives it.
    pub fn name(&self) -> &'static str {
        match self {
            SearchAlgorithm::Random => "random",
            SearchAlgorithm::Grid(_) => "grid",
            SearchAlgorithm::Tpe(_) => "tpe",
            SearchAlgorithm::Gp(_) => "gp",
        }
    }

    /// The keys this searcher takes besides `type` and `max_concurrent`.
    fn fields(name: &str) -> &'static [&'static str] {
        match name {
            "grid" => &GridConfig::FIELDS,
            "tpe" => &TpeConfig::FIELDS,
            "gp" => &GpConfig::FIELDS,
            _ => &[],
        }
    }
}

impl SearchSpec {
    /// The names known, for error messages.
    pub const NAMES: [&'static str; 4] = ["random", "grid", "tpe", "gp"];

    /// Reads a spec from `search = "name"` or a `[search]` table (as JSON;
    /// TOML converts to this). Errors are whole sentences starting with
    /// `search`, ready to show as they are.
    pub fn from_json(value: &Value) -> Result<Self, String> {
        let mut table = match value {
            Value::String(name) => {
                Map::from_iter([("type".to_string(), Value::from(name.clone()))])
            }
            Value::Object(table) => table.clone(),
            other => {
                return Err(format!(
                    "search must be a name such as \"tpe\" or a [search] table; got {other}"
                ));
            }
        };
        let name = match table.get("type") {
            None => "random".to_string(),
            Some(Value::String(name)) => name.clone(),
            Some(other) => {
                return Err(format!(
                    "search.type must be a searcher name such as \"tpe\"; got {other}"
                ));
            }
        };
        if !Self::NAMES.contains(&name.as_str()) {
            return Err(format!(
                "search {name:?} is not known; available: {}",
                Self::NAMES.map(|n| format!("{n:?}")).join(", ")
            ));
        }
        let fields = SearchAlgorithm::fields(&name);
        if let Some(key) = table.keys().find(|k| {
            !matches!(k.as_str(), "type" | "max_concurrent") && !fields.contains(&k.as_str())
        }) {
            let takes: Vec<String> = fields
                .iter()
                .chain(&["max_concurrent"])
                .map(|k| format!("`{k}`"))
                .collect();
            return Err(format!(
                "search: unknown key `{key}` for the {name} searcher, which takes {}",
                takes.join(", ")
            ));
        }
        let max_concurrent = match table.remove("max_concurrent") {
            None => None,
            Some(v) => match v.as_u64() {
                Some(n) if n >= 1 => Some(n as usize),
                _ => {
                    return Err(format!(
                        "search.max_concurrent must be a whole number of at least 1; got {v}"
                    ));
                }
            },
        };
        table.remove("type");
        let algorithm = match name.as_str() {
            "grid" => SearchAlgorithm::Grid(from_table(table, "search")?),
            "tpe" => SearchAlgorithm::Tpe(from_table(table, "search")?),
            "gp" => SearchAlgorithm::Gp(from_table(table, "search")?),
            // "random": the checks above leave no other name, and no key.
            _ => SearchAlgorithm::Random,
        };
        Ok(Self {
            algorithm,
            max_concurrent,
        })
    }

    /// Builds the searcher for an experiment of `num_samples` over `space`,
    /// ranking by `metric`/`mode` where the searcher learns, drawing with
    /// `seed`. Errors name the parameter at fault.
    pub fn build(
        &self,
        space: &SearchSpace,
        num_samples: u64,
        metric: Option<&str>,
        mode: Mode,
        seed: u64,
    ) -> Result<Box<dyn Searcher>, String> {
        let searcher: Box<dyn Searcher> = match &self.algorithm {
            SearchAlgorithm::Random => {
                Box::new(BasicVariant::random(space, num_samples, seed).map_err(|e| e.to_string())?)
            }
            SearchAlgorithm::Grid(config) => {
                if config.points == Some(0) {
                    return Err("search.points must be at least 1".into());
                }
                Box::new(
                    BasicVariant::grid(space, num_samples, config.points)
                        .map_err(|e| e.to_string())?,
                )
            }
            SearchAlgorithm::Tpe(config) => {
                let metric = learns_from(metric, "tpe")?;
                let tpe = Tpe::new(config.clone(), space, num_samples, metric, mode, seed)?;
                // Grids are refused above, so this only bounds num_samples.
                space.trial_count(num_samples).map_err(|e| e.to_string())?;
                Box::new(tpe)
            }
            SearchAlgorithm::Gp(config) => {
                let metric = learns_from(metric, "gp")?;
                let gp = Gp::new(config.clone(), space, num_samples, metric, mode, seed)?;
                space.trial_count(num_samples).map_err(|e| e.to_string())?;
                Box::new(gp)
            }
        };
        Ok(match self.max_concurrent {
            Some(max) => Box::new(ConcurrencyLimiter::new(searcher, max)?),
            None => searcher,
        })
    }
}

/// The metric a model-based searcher named `name` learns from.
fn learns_from<'a>(metric: Option<&'a str>, name: &str) -> Result<&'a str, String> {
    metric.ok_or_else(|| {
        format!(
            "the {name} searcher learns from the experiment's metric; set `metric` (and `mode`)"
        )
    })
}

impl<'de> Deserialize<'de> for SearchSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        Self::from_json(&value).map_err(D::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tune::search::Suggestion;
    use serde_json::json;

    fn spec(value: Value) -> Result<SearchSpec, String> {
        SearchSpec::from_json(&value)
    }

    fn space(value: Value) -> SearchSpace {
        SearchSpace::from_json(&value).unwrap()
    }

    #[test]
    fn specs_by_name_or_table_default_to_random() {
        assert_eq!(SearchSpec::default().algorithm, SearchAlgorithm::Random);
        assert_eq!(spec(json!("random")).unwrap(), SearchSpec::default());
        assert_eq!(spec(json!({})).unwrap(), SearchSpec::default());
        assert_eq!(
            spec(json!("tpe")).unwrap().algorithm,
            SearchAlgorithm::Tpe(TpeConfig::default())
        );
        let s =
            spec(json!({"type": "tpe", "gamma": 0.15, "n_candidates": 48, "max_concurrent": 4}))
                .unwrap();
        assert_eq!(s.max_concurrent, Some(4));
        let SearchAlgorithm::Tpe(config) = &s.algorithm else {
            panic!("tpe expected")
        };
        assert_eq!(
            (config.gamma, config.n_candidates, config.n_initial_points),
            (0.15, 48, 10)
        );
        let s = spec(json!({"type": "grid", "points": 5})).unwrap();
        assert_eq!(
            s.algorithm,
            SearchAlgorithm::Grid(GridConfig { points: Some(5) })
        );
        assert_eq!(
            spec(json!({"max_concurrent": 2})).unwrap(),
            SearchSpec {
                algorithm: SearchAlgorithm::Random,
                max_concurrent: Some(2)
            }
        );
    }

    #[test]
    fn specs_round_trip_through_serde() {
        for value in [
            json!({"type": "random"}),
            json!({"type": "grid", "points": 3, "max_concurrent": 2}),
            json!({"type": "tpe", "n_initial_points": 5, "gamma": 0.3, "n_candidates": 10, "prior_weight": 2.0, "multivariate": false, "constant_liar": false, "rank_weights": false, "multi_fidelity": true}),
            json!({"type": "gp", "n_initial_points": 4, "n_candidates": 100, "n_local_search": 2, "multi_fidelity": true, "cost_exponent": 0.5}),
            json!({"type": "gp", "n_initial_points": 4, "n_candidates": 100, "n_local_search": 2, "multi_fidelity": "joint", "cost_exponent": 0.0}),
        ] {
            let s: SearchSpec = serde_json::from_value(value.clone()).unwrap();
            assert_eq!(serde_json::to_value(&s).unwrap(), value);
        }
        let s: SearchSpec = toml::from_str("type = \"tpe\"\ngamma = 0.5").unwrap();
        assert_eq!(
            s.algorithm,
            SearchAlgorithm::Tpe(TpeConfig {
                gamma: 0.5,
                ..Default::default()
            })
        );
    }

    #[test]
    fn key_lists_match_what_serde_reads() {
        let tpe = serde_json::to_value(TpeConfig::default()).unwrap();
        assert_eq!(
            tpe.as_object().unwrap().keys().collect::<Vec<_>>(),
            TpeConfig::FIELDS
        );
        let grid = serde_json::to_value(GridConfig { points: Some(1) }).unwrap();
        assert_eq!(
            grid.as_object().unwrap().keys().collect::<Vec<_>>(),
            GridConfig::FIELDS
        );
        let gp = serde_json::to_value(GpConfig::default()).unwrap();
        assert_eq!(
            gp.as_object().unwrap().keys().collect::<Vec<_>>(),
            GpConfig::FIELDS
        );
    }

    #[test]
    fn unknown_names_keys_and_bad_values_are_refused_clearly() {
        let cases = [
            (
                json!("bayes"),
                "search \"bayes\" is not known; available: \"random\", \"grid\", \"tpe\", \"gp\"",
            ),
            (
                json!(3),
                "search must be a name such as \"tpe\" or a [search] table; got 3",
            ),
            (json!({"type": 1}), "search.type must be a searcher name"),
            (
                json!({"type": "tpe", "gama": 0.3}),
                "search: unknown key `gama` for the tpe searcher, which takes `n_initial_points`, \
                 `gamma`, `n_candidates`, `prior_weight`, `multivariate`, `constant_liar`, \
                 `rank_weights`, `multi_fidelity`, `max_concurrent`",
            ),
            (
                json!({"type": "random", "points": 3}),
                "search: unknown key `points` for the random searcher, which takes `max_concurrent`",
            ),
            (
                json!({"max_concurrent": 0}),
                "search.max_concurrent must be a whole number of at least 1; got 0",
            ),
            (
                json!({"max_concurrent": "4"}),
                "search.max_concurrent must be a whole number",
            ),
            (
                json!({"type": "tpe", "gamma": "high"}),
                "search.gamma: invalid type: string \"high\", expected f64",
            ),
            (
                json!({"type": "gp", "multi_fidelity": "mobster"}),
                "search.multi_fidelity: invalid value: string \"mobster\", expected true, false \
                 or \"joint\"",
            ),
        ];
        for (value, expected) in cases {
            let message = spec(value).unwrap_err();
            assert!(
                message.starts_with(expected),
                "{message}\n expected: {expected}"
            );
        }
        let message = toml::from_str::<SearchSpec>("type = \"grid\"\nstep = 2")
            .unwrap_err()
            .to_string();
        assert!(
            message.contains("unknown key `step` for the grid searcher"),
            "{message}"
        );
    }

    #[test]
    fn build_makes_each_searcher_and_wraps_the_limit() {
        let s = space(json!({"x": {"uniform": [0, 1]}, "c": {"choice": [1, 2]}}));
        let build = |value: Value, metric: Option<&str>| {
            spec(value).unwrap().build(&s, 3, metric, Mode::Min, 7)
        };
        let random = build(json!("random"), None).unwrap();
        assert_eq!((random.name(), random.total()), ("random", Some(3)));
        let grid = build(json!({"type": "grid", "points": 4}), None).unwrap();
        assert_eq!((grid.name(), grid.total()), ("grid", Some(24)));
        let tpe = build(json!("tpe"), Some("loss")).unwrap();
        assert_eq!((tpe.name(), tpe.total()), ("tpe", Some(3)));
        let gp = build(json!({"type": "gp", "n_local_search": 3}), Some("loss")).unwrap();
        assert_eq!((gp.name(), gp.total()), ("gp", Some(3)));

        let mut limited = build(json!({"max_concurrent": 1}), None).unwrap();
        assert!(matches!(limited.suggest("a"), Suggestion::Config(_)));
        assert_eq!(limited.suggest("b"), Suggestion::Wait);
        assert!(limited.state().get("live").is_some(), "{}", limited.state());
    }

    #[test]
    fn build_errors_name_what_is_wrong() {
        let s = space(json!({"lr": {"uniform": [0, 1]}}));
        let err = |value: Value, metric: Option<&str>| {
            spec(value)
                .unwrap()
                .build(&s, 3, metric, Mode::Min, 7)
                .err()
                .unwrap()
        };
        assert_eq!(
            err(json!("grid"), None),
            "param_space.lr: grid search cannot enumerate a uniform domain; give `points` in \
             [search] or use grid_search/choice"
        );
        assert_eq!(
            err(json!({"type": "grid", "points": 0}), None),
            "search.points must be at least 1"
        );
        assert_eq!(
            err(
                json!({"type": "grid", "points": 1_000_000_000_000u64}),
                None
            ),
            "search.points: must be at most 10000000, the most trials one space may generate"
        );
        assert!(err(json!("tpe"), None).contains("set `metric`"));
        assert_eq!(
            err(json!("gp"), None),
            "the gp searcher learns from the experiment's metric; set `metric` (and `mode`)"
        );
        assert_eq!(
            err(json!({"type": "gp", "n_local_search": 0}), Some("loss")),
            "search.n_local_search must be between 1 and 1000, got 0"
        );
        assert!(
            err(json!({"type": "tpe", "gamma": 1.5}), Some("loss"))
                .starts_with("search.gamma must be in (0, 1)")
        );
        let huge = spec(json!("tpe"))
            .unwrap()
            .build(&s, 20_000_000, Some("loss"), Mode::Min, 0);
        assert!(huge.err().unwrap().contains("more than"));
    }
}
