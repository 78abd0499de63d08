//! `[tracking]`: where results go besides `result.jsonl` and
//! `progress.csv`: TensorBoard event files (on by default) and an MLflow
//! tracking server (opt-in).

use serde::{Deserialize, Serialize};

use super::error::{ConfigError, bad};
use super::file::ExperimentToml;
use super::overrides::Overrides;

/// What the experiment's results are also written as.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tracking {
    /// A TensorBoard event file in every trial's directory (`tensorboard
    /// --logdir <experiment dir>`). On unless `[tracking] tensorboard =
    /// false` or `--no-tensorboard`.
    pub tensorboard: bool,
    /// The MLflow server trials are logged to, if any.
    #[serde(default)]
    pub mlflow: Option<MlflowTarget>,
}

/// An MLflow tracking server and the experiment there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MlflowTarget {
    /// `http://host:port`, no trailing slash.
    pub uri: String,
    /// The MLflow experiment's name (default: the wtune experiment's).
    pub experiment: String,
}

impl Default for Tracking {
    /// What experiments saved before `[tracking]` existed get on resume:
    /// TensorBoard files, the default, and no MLflow.
    fn default() -> Self {
        Tracking {
            tensorboard: true,
            mlflow: None,
        }
    }
}

/// `[tracking]` as the file and the command line say; `name` is the
/// experiment's.
pub(super) fn tracking(
    file: &ExperimentToml,
    overrides: &Overrides,
    name: &str,
) -> Result<Tracking, ConfigError> {
    let section = file.tracking.as_ref();
    let tensorboard =
        !overrides.no_tensorboard && section.and_then(|t| t.tensorboard).unwrap_or(true);
    let uri = match &overrides.mlflow {
        Some(flag) => Some((flag.as_str(), "--mlflow")),
        None => section
            .and_then(|t| t.mlflow.as_deref())
            .map(|key| (key, "tracking.mlflow =")),
    };
    let experiment = section.and_then(|t| t.mlflow_experiment.clone());
    let mlflow = match uri {
        Some(uri) => Some(MlflowTarget {
            uri: mlflow_uri(uri.0, uri.1)?,
            experiment: match experiment {
                Some(e) if e.trim().is_empty() => {
                    return Err(bad("tracking.mlflow_experiment: must not be empty"));
                }
                Some(e) => e,
                None => name.to_string(),
            },
        }),
        None if experiment.is_some() => {
            return Err(bad(
                "tracking.mlflow_experiment names an MLflow experiment, but no \
                 tracking.mlflow server is given",
            ));
        }
        None => None,
    };
    Ok(Tracking {
        tensorboard,
        mlflow,
    })
}

/// A tracking server's address as `mlflow server` prints it, checked;
/// `given` names where it came from (`--mlflow` or `tracking.mlflow =`).
fn mlflow_uri(text: &str, given: &str) -> Result<String, ConfigError> {
    let refused = |why: &str| bad(format!("{given} {text:?}: {why}"));
    if text.starts_with("https://") {
        return Err(refused(
            "https is not supported by this build (it has no TLS); give the server's \
             http:// address on a trusted network, or an http:// proxy in front of it",
        ));
    }
    if !text.starts_with("http://") {
        return Err(refused(
            "expected http://HOST:PORT, the address `mlflow server` listens on",
        ));
    }
    let uri: ureq::http::Uri = text
        .parse()
        .map_err(|e| refused(&format!("not a URI: {e}")))?;
    if uri.host().is_none_or(str::is_empty) {
        return Err(refused("no host"));
    }
    if uri.query().is_some() {
        return Err(refused(
            "a query has no place in a tracking server's address",
        ));
    }
    Ok(text.trim_end_matches('/').to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracking_uris_are_checked() {
        assert_eq!(
            mlflow_uri("http://127.0.0.1:5000/", "--mlflow").unwrap(),
            "http://127.0.0.1:5000"
        );
        assert_eq!(
            mlflow_uri("http://mlflow.lan/base", "tracking.mlflow =").unwrap(),
            "http://mlflow.lan/base"
        );
        for (text, said) in [
            ("https://x:1", "no TLS"),
            ("127.0.0.1:5000", "expected http://"),
            ("http://", "tracking.mlflow"),
            ("http://a b", "not a URI"),
            ("http://x?q=1", "query"),
        ] {
            let message = mlflow_uri(text, "tracking.mlflow =")
                .unwrap_err()
                .to_string();
            assert!(message.contains(said), "{text}: {message}");
        }
        let message = mlflow_uri("mlflow.lan", "--mlflow")
            .unwrap_err()
            .to_string();
        assert!(
            message.starts_with("--mlflow \"mlflow.lan\": "),
            "{message}"
        );
    }
}
