//! Per-trial result files, written as results arrive:
//! - `params.json`: the trial's configuration;
//! - `result.jsonl`: one JSON object per result (metrics, auto-filled
//!   fields, nested `config`), `pandas.read_json(path, lines=True)`;
//! - `progress.csv`: the same results flattened (`config/lr` columns),
//!   `pandas.read_csv(path)`. Columns come from the first result; metrics
//!   that first appear later are only in `result.jsonl`.
//!
//! A trial that continues (after a pause, a recovered failure or `wtune
//! resume`) appends to its files, as Ray Tune does: iterations redone after a
//! restore appear again with their new results.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use serde_json::{Map, Value};

use crate::persist;
use crate::tune::{Callback, Trial};

struct Writers {
    jsonl: BufWriter<File>,
    csv: csv::Writer<File>,
    columns: Option<Vec<String>>,
}

/// The callback that writes every trial's result files.
#[derive(Default)]
pub struct TrialFiles {
    open: HashMap<usize, Writers>,
}

impl TrialFiles {
    /// A logger with no files open yet.
    pub fn new() -> Self {
        Self::default()
    }
}

fn open(dir: &Path, config: &Value) -> Result<Writers, String> {
    persist::create_dir(dir)?;
    let name = |file: &str| dir.join(file);
    // Written once into a fresh directory, so no fsync: two fsyncs per trial
    // would dominate the runner's bookkeeping (see BENCHMARKS.md).
    std::fs::write(name("params.json"), persist::json_bytes(config))
        .map_err(|e| format!("writing {}: {e}", name("params.json").display()))?;
    let append = |file: &str| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(name(file))
            .map_err(|e| format!("opening {}: {e}", name(file).display()))
    };
    // A continuing trial keeps its CSV's columns.
    let columns = std::fs::read(name("progress.csv")).ok().and_then(|bytes| {
        let mut reader = csv::Reader::from_reader(bytes.as_slice());
        let header = reader.headers().ok()?;
        (!header.is_empty()).then(|| header.iter().map(str::to_string).collect())
    });
    Ok(Writers {
        jsonl: BufWriter::new(append("result.jsonl")?),
        csv: csv::Writer::from_writer(append("progress.csv")?),
        columns,
    })
}

impl Writers {
    fn append(&mut self, result: &Map<String, Value>) -> std::io::Result<()> {
        serde_json::to_writer(&mut self.jsonl, result)?;
        self.jsonl.write_all(b"\n")?;
        self.jsonl.flush()?;

        let mut flat = Vec::new();
        for (key, value) in result {
            flatten(key, value, &mut flat);
        }
        if self.columns.is_none() {
            let columns: Vec<String> = flat.iter().map(|(k, _)| k.clone()).collect();
            self.csv.write_record(&columns)?;
            self.columns = Some(columns);
        }
        let row: HashMap<&str, &str> = flat.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let columns = self.columns.as_ref().expect("set above");
        self.csv.write_record(
            columns
                .iter()
                .map(|c| row.get(c.as_str()).copied().unwrap_or("")),
        )?;
        self.csv.flush()
    }
}

/// `{"config": {"lr": 0.1}}` -> `("config/lr", "0.1")`, as Ray's CSV logger does.
fn flatten(prefix: &str, value: &Value, out: &mut Vec<(String, String)>) {
    match value {
        Value::Object(map) if prefix.is_empty() || !map.is_empty() => {
            for (key, v) in map {
                let name = if prefix.is_empty() {
                    key.clone()
                } else {
                    format!("{prefix}/{key}")
                };
                flatten(&name, v, out);
            }
        }
        Value::Null => out.push((prefix.to_string(), String::new())),
        Value::String(s) => out.push((prefix.to_string(), s.clone())),
        other => out.push((prefix.to_string(), other.to_string())),
    }
}

impl Callback for TrialFiles {
    fn on_trial_start(&mut self, trials: &[Trial], index: usize) -> Result<(), String> {
        let trial = &trials[index];
        let writers = open(&trial.dir, &trial.config)?;
        self.open.insert(index, writers);
        Ok(())
    }

    fn on_result(
        &mut self,
        trials: &[Trial],
        index: usize,
        result: &Map<String, Value>,
    ) -> Result<(), String> {
        let dir = &trials[index].dir;
        let writers = self
            .open
            .get_mut(&index)
            .ok_or_else(|| format!("result files for {} are not open", trials[index].trial_id))?;
        writers
            .append(result)
            .map_err(|e| format!("writing results in {}: {e}", dir.display()))
    }

    fn on_trial_end(&mut self, _trials: &[Trial], index: usize) -> Result<(), String> {
        self.open.remove(&index);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn flattening_matches_ray_csv_columns() {
        let mut out = Vec::new();
        flatten(
            "",
            &json!({"loss": 0.5, "config": {"lr": 0.1, "opt": {"name": "sgd"}}, "x": null}),
            &mut out,
        );
        let keys: Vec<&str> = out.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["loss", "config/lr", "config/opt/name", "x"]);
        assert_eq!(out[2].1, "sgd");
        assert_eq!(out[3].1, "");
    }

    #[test]
    fn writes_params_jsonl_and_csv_with_stable_columns() {
        let dir = tempfile::tempdir().unwrap();
        let trial = Trial::new(
            "trial_0000".into(),
            json!({"lr": 0.1}),
            dir.path().join("trial_0000"),
        );
        let trials = vec![trial];
        let mut files = TrialFiles::new();
        files.on_trial_start(&trials, 0).unwrap();
        let r1 = json!({"loss": 1.0, "training_iteration": 1, "config": {"lr": 0.1}});
        let r2 = json!({"loss": 0.5, "late": 3.0, "training_iteration": 2, "config": {"lr": 0.1}});
        files
            .on_result(&trials, 0, r1.as_object().unwrap())
            .unwrap();
        files
            .on_result(&trials, 0, r2.as_object().unwrap())
            .unwrap();
        files.on_trial_end(&trials, 0).unwrap();
        let tdir = dir.path().join("trial_0000");
        let params: Value =
            serde_json::from_str(&std::fs::read_to_string(tdir.join("params.json")).unwrap())
                .unwrap();
        assert_eq!(params, json!({"lr": 0.1}));
        let jsonl = std::fs::read_to_string(tdir.join("result.jsonl")).unwrap();
        assert_eq!(jsonl.lines().count(), 2);
        assert_eq!(
            serde_json::from_str::<Value>(jsonl.lines().nth(1).unwrap()).unwrap()["late"],
            json!(3.0)
        );
        let csv = std::fs::read_to_string(tdir.join("progress.csv")).unwrap();
        assert_eq!(
            csv,
            "loss,training_iteration,config/lr\n1.0,1,0.1\n0.5,2,0.1\n"
        );
    }

    #[test]
    fn a_continuing_trial_appends_under_the_same_columns() {
        let dir = tempfile::tempdir().unwrap();
        let trials = vec![Trial::new(
            "trial_0000".into(),
            json!({}),
            dir.path().join("trial_0000"),
        )];
        let r = |i: u64| json!({"loss": 1.0 / i as f64, "training_iteration": i});
        for i in 1..=2 {
            let mut files = TrialFiles::new();
            files.on_trial_start(&trials, 0).unwrap();
            files
                .on_result(&trials, 0, r(i).as_object().unwrap())
                .unwrap();
            files.on_trial_end(&trials, 0).unwrap();
        }
        let tdir = dir.path().join("trial_0000");
        let csv = std::fs::read_to_string(tdir.join("progress.csv")).unwrap();
        assert_eq!(csv, "loss,training_iteration\n1.0,1\n0.5,2\n");
        let jsonl = std::fs::read_to_string(tdir.join("result.jsonl")).unwrap();
        assert_eq!(jsonl.lines().count(), 2);
    }

    #[test]
    fn unwritable_directory_fails_the_trial_with_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let blocker = dir.path().join("file");
        std::fs::write(&blocker, "x").unwrap();
        let trials = vec![Trial::new(
            "trial_0000".into(),
            json!({}),
            blocker.join("trial_0000"),
        )];
        let message = TrialFiles::new().on_trial_start(&trials, 0).unwrap_err();
        assert!(
            message.contains("cannot create directory") && message.contains("trial_0000"),
            "{message}"
        );
    }
}
