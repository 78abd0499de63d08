//! The few calls of MLflow's REST API (`/api/2.0/mlflow/...`) that logging
//! trials as runs needs, over plain HTTP, each with a short deadline.

use std::time::Duration;

use serde_json::{Value, json};

/// Longest one request may take, connecting included: a server that hangs
/// costs the background thread this much per try, never the experiment.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Most bytes of a server's answer read.
const MAX_ANSWER: u64 = 1 << 20;
/// Most characters of a server's answer quoted in a message.
const QUOTED: usize = 200;

/// Why a request did not do what it asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum CallError {
    /// Worth trying again later: the server could not be reached, or asks
    /// to be asked later (429), or a gateway could not reach it (502-504).
    Transient(String),
    /// The server answered, and failed the request (500 and the other
    /// 5xx), or answered
    /// something that is not MLflow's API: the server may be unwell, or the
    /// request may be one it cannot take (a metric name its store cannot
    /// keep), which only asking it something else tells apart.
    Failed(String),
    /// The server refused the request itself (4xx): sending it again would
    /// be refused again.
    Rejected(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Transient(message)
            | CallError::Failed(message)
            | CallError::Rejected(message) => f.write_str(message),
        }
    }
}

/// A tracking server at `base` (`http://host:port`, no trailing slash).
pub(super) struct Client {
    agent: ureq::Agent,
    base: String,
    /// The `Authorization` header every request carries, if any.
    authorization: Option<String>,
}

impl Client {
    /// A client of the server at `base`, with the credentials MLflow's own
    /// client reads from the environment (see [`authorization`]).
    pub(super) fn new(base: &str) -> Self {
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(REQUEST_TIMEOUT))
            .http_status_as_error(false)
            .build()
            .into();
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        Client {
            agent,
            base: base.trim_end_matches('/').to_string(),
            authorization: authorization(
                var("MLFLOW_TRACKING_TOKEN"),
                var("MLFLOW_TRACKING_USERNAME"),
                var("MLFLOW_TRACKING_PASSWORD"),
            ),
        }
    }

    /// The id of the experiment called `name`, made if there is none.
    pub(super) fn experiment_id(&self, name: &str) -> Result<String, CallError> {
        let by_name = |this: &Self| {
            this.get("experiments/get-by-name", &[("experiment_name", name)])
                .map(|answer| string_at(&answer, &["experiment", "experiment_id"]))
        };
        match by_name(self) {
            Ok(Some(id)) => return Ok(id),
            Ok(None) => return Err(not_mlflow("experiments/get-by-name")),
            Err(CallError::Rejected(_)) => {}
            Err(e) => return Err(e),
        }
        match self.post("experiments/create", &json!({"name": name})) {
            Ok(answer) => string_at(&answer, &["experiment_id"])
                .ok_or_else(|| not_mlflow("experiments/create")),
            // Made meanwhile by someone else (another wtune, say).
            Err(CallError::Rejected(_)) => by_name(self)?.ok_or_else(|| not_mlflow("get-by-name")),
            Err(e) => Err(e),
        }
    }

    /// Makes a run; its id.
    pub(super) fn create_run(
        &self,
        experiment_id: &str,
        name: &str,
        start_ms: u64,
        tags: &[(String, String)],
    ) -> Result<String, CallError> {
        let tags: Vec<Value> = tags
            .iter()
            .map(|(key, value)| json!({"key": key, "value": value}))
            .collect();
        let answer = self.post(
            "runs/create",
            &json!({"experiment_id": experiment_id, "run_name": name,
                    "start_time": start_ms, "tags": tags}),
        )?;
        string_at(&answer, &["run", "info", "run_id"]).ok_or_else(|| not_mlflow("runs/create"))
    }

    /// Logs metrics `(key, value, timestamp ms, step)`, params and tags in
    /// one request (MLflow takes at most 1000 metrics, 100 params and 100
    /// tags at once; the caller keeps to that).
    pub(super) fn log_batch(
        &self,
        run_id: &str,
        metrics: &[(String, f64, u64, u64)],
        params: &[(String, String)],
        tags: &[(String, String)],
    ) -> Result<(), CallError> {
        let metrics: Vec<Value> = metrics
            .iter()
            .map(|(key, value, timestamp, step)| {
                json!({"key": key, "value": value, "timestamp": timestamp, "step": step})
            })
            .collect();
        let pairs = |pairs: &[(String, String)]| -> Vec<Value> {
            pairs
                .iter()
                .map(|(key, value)| json!({"key": key, "value": value}))
                .collect()
        };
        self.post(
            "runs/log-batch",
            &json!({"run_id": run_id, "metrics": metrics, "params": pairs(params),
                    "tags": pairs(tags)}),
        )
        .map(drop)
    }

    /// The highest step of any metric the server has for the run (`None`
    /// for none): MLflow's run carries each metric's latest value, at its
    /// highest step.
    pub(super) fn last_step(&self, run_id: &str) -> Result<Option<u64>, CallError> {
        let answer = self.get("runs/get", &[("run_id", run_id)])?;
        let metrics = answer
            .pointer("/run/data/metrics")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        Ok(metrics
            .iter()
            .filter_map(|m| {
                m.get("step")
                    .and_then(|s| s.as_u64().or_else(|| s.as_str()?.parse().ok()))
            })
            .max())
    }

    /// The ids of the experiment's runs whose tags hold every `(key,
    /// value)` of `tags`, at most 1000. A value with a `'` in it cannot be
    /// put in MLflow's filter: then none.
    pub(super) fn tagged_runs(
        &self,
        experiment_id: &str,
        tags: &[(&str, &str)],
    ) -> Result<Vec<String>, CallError> {
        if tags
            .iter()
            .any(|(key, value)| key.contains('`') || value.contains('\''))
        {
            return Ok(Vec::new());
        }
        let filter: Vec<String> = tags
            .iter()
            .map(|(key, value)| format!("tags.`{key}` = '{value}'"))
            .collect();
        let answer = self.post(
            "runs/search",
            &json!({"experiment_ids": [experiment_id], "filter": filter.join(" and "),
                    "max_results": 1000}),
        )?;
        Ok(answer
            .get("runs")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .filter_map(|run| string_at(run, &["info", "run_id"]))
            .collect())
    }

    /// Takes the tag `key` off a run.
    pub(super) fn delete_tag(&self, run_id: &str, key: &str) -> Result<(), CallError> {
        self.post("runs/delete-tag", &json!({"run_id": run_id, "key": key}))
            .map(drop)
    }

    /// Sets a run's status (`RUNNING`, `FINISHED`, `FAILED`, `KILLED`), and
    /// its end time when it has ended.
    pub(super) fn update_run(
        &self,
        run_id: &str,
        status: &str,
        end_ms: Option<u64>,
    ) -> Result<(), CallError> {
        let mut body = json!({"run_id": run_id, "status": status});
        if let Some(end) = end_ms {
            body["end_time"] = json!(end);
        }
        self.post("runs/update", &body).map(drop)
    }

    fn url(&self, path: &str) -> String {
        format!("{}/api/2.0/mlflow/{path}", self.base)
    }

    fn get(&self, path: &str, query: &[(&str, &str)]) -> Result<Value, CallError> {
        let mut request = self.agent.get(self.url(path));
        for (key, value) in query {
            request = request.query(*key, *value);
        }
        if let Some(authorization) = &self.authorization {
            request = request.header("Authorization", authorization);
        }
        answer(path, request.call())
    }

    fn post(&self, path: &str, body: &Value) -> Result<Value, CallError> {
        let mut request = self.agent.post(self.url(path));
        if let Some(authorization) = &self.authorization {
            request = request.header("Authorization", authorization);
        }
        answer(path, request.send_json(body))
    }
}

/// What a request's answer says: its JSON, or why not.
fn answer(
    path: &str,
    sent: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
) -> Result<Value, CallError> {
    let mut response = sent.map_err(|e| CallError::Transient(format!("{path}: {e}")))?;
    let status = response.status();
    let text = response
        .body_mut()
        .with_config()
        .limit(MAX_ANSWER)
        .read_to_string()
        .unwrap_or_default();
    let json: Option<Value> = serde_json::from_str(&text).ok();
    if status.is_success() {
        return json.ok_or_else(|| {
            CallError::Failed(format!(
                "{path}: the answer is not MLflow's (not JSON): {}",
                quoted(&text)
            ))
        });
    }
    // MLflow's errors are {"error_code": ..., "message": ...}.
    let said = json
        .as_ref()
        .and_then(|j| {
            Some(format!(
                "{}: {}",
                j.get("error_code")?.as_str()?,
                j.get("message")?.as_str()?
            ))
        })
        .unwrap_or_else(|| quoted(&text));
    let message = format!("{path}: HTTP {}: {said}", status.as_u16());
    match status.as_u16() {
        // Ask later, or a gateway in front of the server that cannot reach
        // it: the server's, not the request's.
        429 | 502 | 503 | 504 => Err(CallError::Transient(message)),
        _ if status.is_client_error() => Err(CallError::Rejected(message)),
        _ if status.is_server_error() => Err(CallError::Failed(message)),
        _ => Err(CallError::Transient(message)),
    }
}

/// The `Authorization` header for MLflow's environment variables:
/// `MLFLOW_TRACKING_TOKEN` as a bearer token, else
/// `MLFLOW_TRACKING_USERNAME` and `MLFLOW_TRACKING_PASSWORD` as basic
/// authentication (as `mlflow server --app-name basic-auth` takes). Over
/// plain HTTP they cross the network in the clear, as with MLflow's client.
fn authorization(
    token: Option<String>,
    username: Option<String>,
    password: Option<String>,
) -> Option<String> {
    use base64::Engine;
    if let Some(token) = token {
        return Some(format!("Bearer {token}"));
    }
    let (username, password) = (username?, password.unwrap_or_default());
    let pair = format!("{username}:{password}");
    Some(format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(pair)
    ))
}

fn string_at(value: &Value, path: &[&str]) -> Option<String> {
    let mut at = value;
    for key in path {
        at = at.get(key)?;
    }
    at.as_str().map(str::to_string)
}

fn not_mlflow(path: &str) -> CallError {
    CallError::Transient(format!(
        "{path}: the answer lacks what MLflow's API returns"
    ))
}

/// The start of an answer, on one line, for a message.
fn quoted(text: &str) -> String {
    let line: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(QUOTED)
        .collect();
    if text.chars().count() > QUOTED {
        format!("{line}...")
    } else {
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_come_as_mlflows_client_sends_them() {
        let s = |v: &str| Some(v.to_string());
        assert_eq!(authorization(None, None, None), None);
        assert_eq!(authorization(None, None, s("pw")), None);
        assert_eq!(authorization(s("t0k"), s("u"), s("p")), s("Bearer t0k"));
        // RFC 7617's example.
        assert_eq!(
            authorization(None, s("Aladdin"), s("open sesame")),
            s("Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ==")
        );
    }

    #[test]
    fn quoted_answers_are_one_short_line() {
        let quoted_line = quoted(&format!("a\nb\u{1b}{}", "x".repeat(300)));
        assert!(quoted_line.starts_with("a b "), "{quoted_line}");
        assert!(quoted_line.ends_with("..."));
        assert_eq!(quoted_line.chars().count(), QUOTED + 3);
    }
}
