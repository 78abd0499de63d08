//! Schedulers by name: the one place that names every algorithm.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::asha::{Asha, AshaConfig};
use super::fifo::Fifo;
use super::hyperband::{HyperBand, HyperBandConfig};
use super::median::{MedianStopping, MedianStoppingConfig};
use super::pbt::{PbtConfig, PopulationBasedTraining};
use super::scheduler::Scheduler;
use crate::tune::result::Mode;
use crate::tune::table::{from_table, no_parameters};

/// A scheduler by name and parameters, as an experiment file gives it:
/// `scheduler = "asha"`, or a `[scheduler]` table with `type = "asha"` and
/// the parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
pub enum SchedulerSpec {
    /// [`Fifo`].
    #[default]
    Fifo,
    /// [`Asha`].
    Asha(AshaConfig),
    /// [`MedianStopping`].
    #[serde(rename = "median_stopping")]
    MedianStopping(MedianStoppingConfig),
    /// [`HyperBand`] (synchronous).
    #[serde(rename = "hyperband")]
    HyperBand(HyperBandConfig),
    /// [`PopulationBasedTraining`].
    Pbt(PbtConfig),
}

impl SchedulerSpec {
    /// The names known, for error messages.
    pub const NAMES: [&'static str; 5] = ["fifo", "asha", "median_stopping", "hyperband", "pbt"];

    /// The scheduler named by `name` with the parameters in `table` (an
    /// experiment file's `[scheduler]` without `type`). Errors name the
    /// key at fault, unlike the tagged deserialization, which loses it.
    pub fn from_table(name: &str, table: Map<String, Value>) -> Result<Self, String> {
        const SECTION: &str = "scheduler";
        Ok(match name {
            "fifo" => {
                no_parameters(&table, SECTION, name)?;
                SchedulerSpec::Fifo
            }
            "asha" => SchedulerSpec::Asha(from_table(table, SECTION)?),
            "median_stopping" => SchedulerSpec::MedianStopping(from_table(table, SECTION)?),
            "hyperband" => SchedulerSpec::HyperBand(from_table(table, SECTION)?),
            "pbt" => SchedulerSpec::Pbt(from_table(table, SECTION)?),
            other => {
                return Err(format!(
                    "scheduler {other:?} is not known; available: {}",
                    Self::NAMES.map(|n| format!("{n:?}")).join(", ")
                ));
            }
        })
    }

    /// The result field the scheduler measures progress in; `None` for
    /// FIFO, which measures none.
    pub fn time_attr(&self) -> Option<&str> {
        match self {
            SchedulerSpec::Fifo => None,
            SchedulerSpec::Asha(c) => Some(&c.time_attr),
            SchedulerSpec::MedianStopping(c) => Some(&c.time_attr),
            SchedulerSpec::HyperBand(c) => Some(&c.time_attr),
            SchedulerSpec::Pbt(c) => Some(&c.time_attr),
        }
    }

    /// Whether the scheduler ends every trial by itself (ASHA at `max_t`,
    /// HyperBand at `max_t` unless `stop_last_trials = false`), so that no
    /// default stopping criterion is needed.
    pub fn ends_trials(&self) -> bool {
        match self {
            SchedulerSpec::Asha(_) => true,
            SchedulerSpec::HyperBand(config) => config.stop_last_trials,
            SchedulerSpec::Fifo | SchedulerSpec::MedianStopping(_) | SchedulerSpec::Pbt(_) => false,
        }
    }

    /// Builds the scheduler for an experiment ranking by `metric`/`mode`.
    pub fn build(
        &self,
        metric: Option<&str>,
        mode: Mode,
        seed: u64,
    ) -> Result<Box<dyn Scheduler>, String> {
        Ok(match self {
            SchedulerSpec::Fifo => Box::new(Fifo::default()),
            SchedulerSpec::Asha(config) => {
                let metric = metric.ok_or(
                    "the asha scheduler ranks trials by the experiment's metric; set `metric`",
                )?;
                Box::new(Asha::new(config.clone(), metric, mode, seed)?)
            }
            SchedulerSpec::MedianStopping(config) => {
                let metric = metric.ok_or(
                    "the median_stopping scheduler ranks trials by the experiment's metric; \
                     set `metric`",
                )?;
                Box::new(MedianStopping::new(config.clone(), metric, mode)?)
            }
            SchedulerSpec::HyperBand(config) => {
                let metric = metric.ok_or(
                    "the hyperband scheduler ranks trials by the experiment's metric; set `metric`",
                )?;
                Box::new(HyperBand::new(config.clone(), metric, mode)?)
            }
            SchedulerSpec::Pbt(config) => {
                let metric = metric.ok_or(
                    "the pbt scheduler ranks trials by the experiment's metric; set `metric`",
                )?;
                Box::new(PopulationBasedTraining::new(
                    config.clone(),
                    metric,
                    mode,
                    seed,
                )?)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::tune::asha::AshaVariant;

    fn spec(value: Value) -> Result<SchedulerSpec, String> {
        serde_json::from_value(value).map_err(|e| e.to_string())
    }

    #[test]
    fn specs_name_hyperband_and_the_asha_variant() {
        assert!(SchedulerSpec::NAMES.contains(&"hyperband"));
        let hb = spec(json!({"type": "hyperband", "max_t": 9, "time_attr": "fuel_total"})).unwrap();
        let SchedulerSpec::HyperBand(config) = &hb else {
            panic!("hyperband expected, got {hb:?}")
        };
        assert_eq!(
            (
                config.max_t,
                config.reduction_factor,
                config.stop_last_trials
            ),
            (9.0, 3.0, true)
        );
        assert_eq!(config.time_attr, "fuel_total");
        assert!(hb.ends_trials(), "max_t ends every trial");
        let open_ended = spec(json!({"type": "hyperband", "stop_last_trials": false})).unwrap();
        assert!(!open_ended.ends_trials());
        assert_eq!(
            hb.build(Some("loss"), Mode::Min, 0).unwrap().name(),
            "hyperband"
        );
        let message = hb.build(None, Mode::Min, 0).err().unwrap();
        assert!(message.contains("`metric`"), "{message}");
        let message = spec(json!({"type": "hyperband", "max_t": 0}))
            .unwrap()
            .build(Some("loss"), Mode::Min, 0)
            .err()
            .unwrap();
        assert!(message.contains("max_t"), "{message}");
        let message = spec(json!({"type": "hyperband", "brackets": 2})).unwrap_err();
        assert!(message.contains("brackets"), "{message}");

        let asha = spec(json!({"type": "asha", "variant": "promotion"})).unwrap();
        let SchedulerSpec::Asha(config) = &asha else {
            panic!("asha expected, got {asha:?}")
        };
        assert_eq!(config.variant, AshaVariant::Promotion);
        assert!(asha.ends_trials());
        let SchedulerSpec::Asha(default) = spec(json!({"type": "asha"})).unwrap() else {
            panic!("asha expected")
        };
        assert_eq!(default.variant, AshaVariant::Stopping);
        let message = spec(json!({"type": "asha", "variant": "eager"})).unwrap_err();
        assert!(message.contains("scheduler.variant"), "{message}");
    }
}
