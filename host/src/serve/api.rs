//! The HTTP routes: the JSON API under `/api`, the dashboard's files, and
//! errors that are always JSON. Every handler checks what the client sent
//! before it reaches the runner, and the runner checks it again against the
//! trials as they are ([`crate::tune::control`]), so nothing a client sends
//! can do more than get a 4xx.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};

use super::view::{self, ExperimentDir, LogRange};
use crate::tune::{Command, ControlError, Controller, Trial};

/// Largest request body: a config is a few kilobytes.
pub const MAX_BODY: usize = 1 << 20;

/// What every handler shares.
pub struct App {
    /// The experiment shown.
    pub dir: ExperimentDir,
    /// The running experiment's runner, when this server controls one.
    pub controller: Option<Controller>,
    /// The bearer token's hash, when one is required.
    pub token: Option<blake3::Hash>,
}

/// An error answer: a status and `{"error": message}`.
#[derive(Debug)]
pub struct ApiError(StatusCode, String);

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self(status, message.into())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, axum::Json(json!({"error": self.1}))).into_response()
    }
}

impl From<ControlError> for ApiError {
    fn from(err: ControlError) -> Self {
        let status = match err {
            ControlError::UnknownTrial(_) => StatusCode::NOT_FOUND,
            ControlError::Conflict(_) | ControlError::Ended => StatusCode::CONFLICT,
            ControlError::Invalid(_) => StatusCode::BAD_REQUEST,
            ControlError::Busy => StatusCode::SERVICE_UNAVAILABLE,
        };
        Self(status, err.to_string())
    }
}

type Answer = Result<Response, ApiError>;

/// All routes, the API behind the token check.
pub fn router(app: Arc<App>) -> Router {
    let api = Router::new()
        .route("/experiment", get(experiment))
        .route("/experiment/stop", post(stop_experiment))
        .route("/trials", get(trials).post(add_trial))
        .route("/trials/{id}", get(trial))
        .route("/trials/{id}/results", get(results))
        .route("/trials/{id}/logs", get(logs))
        .route("/trials/{id}/stop", post(stop_trial))
        .route("/trials/{id}/pause", post(pause_trial))
        .route("/trials/{id}/resume", post(resume_trial))
        .route("/openapi.json", get(openapi))
        .route_layer(middleware::from_fn_with_state(app.clone(), authorize));
    Router::new()
        .nest("/api", api)
        .route("/", get(|| page("text/html; charset=utf-8", INDEX)))
        .route(
            "/app.js",
            get(|| page("text/javascript; charset=utf-8", APP)),
        )
        .route("/style.css", get(|| page("text/css; charset=utf-8", STYLE)))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(middleware::from_fn_with_state(app.clone(), guard))
        .with_state(app)
}

const INDEX: &str = include_str!("page/index.html");
const APP: &str = include_str!("page/app.js");
const STYLE: &str = include_str!("page/style.css");
const OPENAPI: &str = include_str!("openapi.json");

/// One of the dashboard's files. The page shows what untrusted trainables
/// reported, so it may load nothing but its own files.
async fn page(content_type: &'static str, body: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; \
             frame-ancestors 'none'",
        ),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

async fn not_found(request: Request) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!(
            "no such route: {} {}",
            request.method(),
            request.uri().path()
        ),
    )
}

async fn method_not_allowed(request: Request) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!(
            "{} is not allowed on {}",
            request.method(),
            request.uri().path()
        ),
    )
}

/// Refuses what a web page elsewhere could make a browser send: another
/// site's page may post to loopback (cross-site requests), and one whose
/// name was rebound to 127.0.0.1 may read the answers (DNS rebinding). So
/// without a token the `Host` must be this server's loopback address, and
/// a request that names another origin may change nothing. Oversized bodies
/// are refused on their length, before they are read.
async fn guard(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let headers = request.headers();
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    if app.token.is_none() && !host.is_some_and(loopback_host) {
        return ApiError::new(
            StatusCode::FORBIDDEN,
            "without a token this server answers only requests addressed to a loopback \
             address (127.0.0.1, [::1]) or localhost (the Host header); serve with a token to be \
             reached by other names",
        )
        .into_response();
    }
    // With a token, the token is the protection: a browser never adds it
    // to another site's request, and a proxy in front may rewrite Host or
    // the scheme.
    let writes = !matches!(
        *request.method(),
        axum::http::Method::GET | axum::http::Method::HEAD
    );
    if writes && app.token.is_none() {
        let origin = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok());
        let same_origin = origin.is_none_or(|o| {
            let o = o
                .strip_prefix("http://")
                .or_else(|| o.strip_prefix("https://"));
            o.is_some() && o == host
        });
        let cross_site = headers
            .get("sec-fetch-site")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v == "cross-site" || v == "same-site");
        if !same_origin || cross_site {
            return ApiError::new(
                StatusCode::FORBIDDEN,
                "requests from other sites' pages may not change the experiment",
            )
            .into_response();
        }
    }
    let length = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if length.is_some_and(|n| n > MAX_BODY as u64) {
        return ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request bodies are limited to {MAX_BODY} bytes"),
        )
        .into_response();
    }
    next.run(request).await
}

/// Whether `host` (a `Host` header) names this machine's loopback:
/// `localhost` or a loopback address written out (all of 127.0.0.0/8, as
/// the server may listen on any of them; a rebound name is never an
/// address). Any port: a forwarded port (`ssh -L`) reaches the server
/// under another.
fn loopback_host(host: &str) -> bool {
    let name = match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    };
    let address = name
        .strip_prefix('[')
        .and_then(|n| n.strip_suffix(']'))
        .unwrap_or(name);
    name == "localhost"
        || address
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Lets a request through when no token is set or it carries the token.
async fn authorize(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let Some(expected) = app.token else {
        return next.run(request).await;
    };
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    // blake3::Hash compares in constant time.
    match given {
        Some(token) if blake3::hash(token.as_bytes()) == expected => next.run(request).await,
        Some(_) => {
            ApiError::new(StatusCode::UNAUTHORIZED, "the bearer token is wrong").into_response()
        }
        None => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "this server needs `Authorization: Bearer TOKEN` (the token given to --serve-token)",
        )
        .into_response(),
    }
}

fn json_answer(status: StatusCode, value: Value) -> Answer {
    Ok((status, axum::Json(value)).into_response())
}

/// Runs blocking file work off the async workers.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
}

fn unreadable(message: String) -> ApiError {
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, message)
}

/// The controller, while the runner it talks to is running.
fn live(app: &App) -> Option<&Controller> {
    app.controller.as_ref().filter(|c| !c.is_closed())
}

async fn experiment(State(app): State<Arc<App>>) -> Answer {
    let control = live(&app).is_some();
    blocking(move || {
        let state = app.dir.state().map_err(unreadable)?;
        let header = view::header(&state, app.dir.path());
        let best = header
            .metric
            .as_deref()
            .and_then(|m| view::best(&state.trials, m, header.mode))
            .map(view::summary);
        let status = if control {
            "running"
        } else {
            state.status.as_str()
        };
        json_answer(
            StatusCode::OK,
            json!({
                "name": header.name,
                // Not `Path` itself, which cannot be JSON when it is not
                // UTF-8: every answer would fail.
                "dir": app.dir.path().to_string_lossy(),
                "status": status,
                "control": control,
                "metric": header.metric,
                "mode": header.mode,
                "written": state.written,
                "counts": view::counts(&state.trials),
                "best": best,
            }),
        )
    })
    .await
}

async fn trials(State(app): State<Arc<App>>) -> Answer {
    blocking(move || {
        let state = app.dir.state().map_err(unreadable)?;
        let trials: Vec<Value> = state.trials.iter().map(view::summary).collect();
        json_answer(StatusCode::OK, json!({"trials": trials}))
    })
    .await
}

/// Checks a trial id from a path before it is looked up.
fn trial_id(id: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    let Path(id) = id.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.body_text()))?;
    if id.is_empty()
        || id.len() > 200
        || !id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("there is no trial {id:?}"),
        ));
    }
    Ok(id)
}

/// The trial: from the runner when it runs (it knows trials the state file
/// does not list yet), else from the state file.
async fn find_trial(app: &Arc<App>, id: &str, fresh: bool) -> Result<Trial, ApiError> {
    if fresh && let Some(controller) = live(app) {
        match controller.send(Command::GetTrial(id.to_string())).await {
            Ok(reply) => {
                if let Some(trial) = reply.trial {
                    return Ok(trial);
                }
            }
            Err(ControlError::UnknownTrial(_)) => {
                return Err(ControlError::UnknownTrial(id.to_string()).into());
            }
            // Ended or busy: the state file still answers.
            Err(_) => {}
        }
    }
    let (shared, wanted) = (app.clone(), id.to_string());
    let found = blocking(move || {
        let state = shared.dir.state().map_err(unreadable)?;
        Ok(state.trials.iter().find(|t| t.trial_id == wanted).cloned())
    })
    .await?;
    match found {
        Some(trial) => Ok(trial),
        // Added a moment ago: the runner knows it before the state does.
        None if !fresh && live(app).is_some() => Box::pin(find_trial(app, id, true)).await,
        None => Err(ControlError::UnknownTrial(id.to_string()).into()),
    }
}

async fn trial(State(app): State<Arc<App>>, id: Result<Path<String>, PathRejection>) -> Answer {
    let id = trial_id(id)?;
    let trial = find_trial(&app, &id, true).await?;
    json_answer(StatusCode::OK, view::detail(&trial))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResultsQuery {
    offset: Option<u64>,
    /// The file `offset` is in, as the answer that gave it named it.
    file: Option<u64>,
    limit: Option<usize>,
}

/// Most records one results answer carries.
const MAX_RESULTS: usize = 100_000;

async fn results(
    State(app): State<Arc<App>>,
    id: Result<Path<String>, PathRejection>,
    query: Result<Query<ResultsQuery>, QueryRejection>,
) -> Answer {
    let id = trial_id(id)?;
    let Query(query) = query.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.body_text()))?;
    let limit = query.limit.unwrap_or(10_000);
    if limit == 0 || limit > MAX_RESULTS {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("limit must be between 1 and {MAX_RESULTS}"),
        ));
    }
    let trial = find_trial(&app, &id, false).await?;
    blocking(move || {
        let read = app
            .dir
            .results(&trial, query.offset.unwrap_or(0), query.file, limit)
            .map_err(unreadable)?;
        // A string: an inode may pass what a JavaScript number holds.
        json_answer(
            StatusCode::OK,
            json!({"results": read.records, "next_offset": read.next_offset,
                   "reset": read.reset, "file": read.file.to_string()}),
        )
    })
    .await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LogsQuery {
    offset: Option<u64>,
    tail: Option<u64>,
}

async fn logs(
    State(app): State<Arc<App>>,
    id: Result<Path<String>, PathRejection>,
    query: Result<Query<LogsQuery>, QueryRejection>,
) -> Answer {
    let id = trial_id(id)?;
    let Query(query) = query.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.body_text()))?;
    let range = match (query.offset, query.tail) {
        (Some(_), Some(_)) => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "give offset or tail, not both",
            ));
        }
        (_, Some(tail)) => LogRange::Tail(tail),
        (offset, None) => LogRange::From(offset.unwrap_or(0)),
    };
    let trial = find_trial(&app, &id, false).await?;
    blocking(move || {
        let log = app.dir.log(&trial, range).map_err(unreadable)?;
        json_answer(
            StatusCode::OK,
            json!({"text": log.text, "offset": log.offset, "next_offset": log.next_offset}),
        )
    })
    .await
}

/// Sends a command to the runner; answers 409 when there is none.
async fn control(app: &App, command: Command, status: StatusCode) -> Answer {
    let Some(controller) = app.controller.as_ref() else {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "this server only shows the experiment; to control it, run it with \
                 `wtune resume {} --serve`",
                app.dir.path().display()
            ),
        ));
    };
    let reply = controller.send(command).await?;
    let mut body = json!({"message": reply.message});
    if let Some(trial) = &reply.trial {
        body["trial"] = view::summary(trial);
    }
    json_answer(status, body)
}

async fn stop_trial(
    State(app): State<Arc<App>>,
    id: Result<Path<String>, PathRejection>,
) -> Answer {
    let id = trial_id(id)?;
    control(&app, Command::StopTrial(id), StatusCode::ACCEPTED).await
}

async fn pause_trial(
    State(app): State<Arc<App>>,
    id: Result<Path<String>, PathRejection>,
) -> Answer {
    let id = trial_id(id)?;
    control(&app, Command::PauseTrial(id), StatusCode::ACCEPTED).await
}

async fn resume_trial(
    State(app): State<Arc<App>>,
    id: Result<Path<String>, PathRejection>,
) -> Answer {
    let id = trial_id(id)?;
    control(&app, Command::ResumeTrial(id), StatusCode::ACCEPTED).await
}

async fn stop_experiment(State(app): State<Arc<App>>) -> Answer {
    control(&app, Command::StopExperiment, StatusCode::ACCEPTED).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewTrial {
    config: Value,
}

async fn add_trial(
    State(app): State<Arc<App>>,
    headers: axum::http::HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    // A JSON content type cannot be sent cross-site without the browser
    // asking first (a CORS preflight, which this server never allows).
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(';').next() == Some("application/json"));
    if !json {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "send the body as Content-Type: application/json",
        ));
    }
    let body = body.map_err(|e| ApiError::new(e.status(), e.body_text()))?;
    let NewTrial { config } = serde_json::from_slice(&body).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("the body must be {{\"config\": {{...}}}}: {e}"),
        )
    })?;
    control(&app, Command::AddTrial(config), StatusCode::CREATED).await
}

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}
