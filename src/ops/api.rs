//! The control API of a running connector (`[control]`), on a listener of its own, every request with the
//! bearer token: `GET /v1/status`, `POST /v1/pause`, `POST /v1/resume`,
//! `POST /v1/holds/{aggregate_type}/{aggregate_id}/release`. The app carries the commands out between
//! runs ([`crate::app::control`]); the CLI's `status`, `pause`, `resume` and `quarantine release` come here
//! first when the connector runs ([`super::client`]).
//!
//! Floor 6, the top (docs/ARCHITECTURE.md): may import anything below; nothing imports it but `main.rs`.
//!
//! # Answers
//! JSON always. `200` with the document; `401` without the token; `421` when the request names another
//! connector (the `Outbox-Cdc-Connector` header the CLI sends: it never steers a connector of another
//! config that took the address); `409` when this instance does not hold the lease (a standby: ask the
//! active one) or the command was refused for good (`{"error": …}`: no hold on that aggregate, …); `503`
//! when it could not be carried out now (the connector stopping, Kafka away: ask again).
//!
//! # The token
//! `[control] token_env` or `token_file`, else `OUTBOX_CDC_CONTROL_TOKEN`, else one the connector makes at
//! its first start: 32 random bytes as hex in `control.token` in the state directory, readable by its user
//! only, where the commands on the same host find it.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};

use super::client::CONNECTOR_HEADER;
use crate::app::control::{Command, ControlHandle, Role};
use crate::checkpoint::store::Inspection;
use crate::config::{Config, TokenSource};
use crate::error::{Error, Result};
use crate::http::{require_bearer, BearerToken};

/// What the routes share.
#[derive(Clone)]
struct Api {
    name: Arc<str>,
    config: Arc<Config>,
    control: ControlHandle,
}

/// Binds the control API and serves it in a task of its own, aborted when the returned guard drops;
/// `None` when `[control] enabled = false`, or when its address is taken (logged as an error: the
/// connector runs on, without it).
///
/// # Errors
/// A definite error when the token cannot be read or made.
pub async fn start(config: &Arc<Config>, control: ControlHandle) -> Result<Option<ApiTask>> {
    if !config.control.enabled {
        return Ok(None);
    }
    let token = token_for_run(config)?;
    let listener = match crate::http::bind(
        config.control.listen,
        "the control API",
        "set [control] listen to a free address, or enabled = false",
    )
    .await
    {
        Ok(listener) => listener,
        Err(e) => {
            tracing::error!("{e}: the control API is off (the connector runs on without it)");
            return Ok(None);
        }
    };
    let addr = listener.local_addr().map(|a| a.to_string()).unwrap_or_default();
    tracing::info!(%addr, "serving the control API (/v1/status, /v1/pause, /v1/resume, /v1/holds/.../release)");
    let api = Api { name: config.state.name.clone().into(), config: config.clone(), control };
    let routes = Router::new()
        .route("/v1/status", get(status))
        .route("/v1/pause", post(pause))
        .route("/v1/resume", post(resume))
        .route("/v1/holds/{aggregate_type}/{aggregate_id}/release", post(release))
        .fallback(not_found)
        .with_state(api);
    let task = tokio::spawn(crate::http::serve(listener, require_bearer(routes, token)));
    Ok(Some(ApiTask(task)))
}

/// The control API's task, aborted when dropped.
pub struct ApiTask(tokio::task::JoinHandle<()>);

impl Drop for ApiTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The token the run serves with: as configured, or the one it made (made now at the first start).
fn token_for_run(config: &Config) -> Result<BearerToken> {
    let secret = match config.control.token(&config.state.dir)? {
        Some(secret) => secret,
        None => {
            let TokenSource::Made(path) = config.control.token_source(&config.state.dir) else {
                unreachable!("only a token the connector makes can be missing")
            };
            make_token(&path)?
        }
    };
    BearerToken::new(secret.expose().to_string())
        .map_err(|e| Error::definite(format!("the control API's token: {e}: set another")))
}

/// Makes a token at `path`: 32 random bytes as hex, in a file only this user may read, created anew.
fn make_token(path: &std::path::Path) -> Result<crate::secret::Secret> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let failed = |e: std::io::Error| {
        Error::definite(format!(
            "cannot make the control API's token in {}: {e}; set [control] token_file or token_env, or enabled = \
             false",
            path.display()
        ))
    };
    // The state directory, made as the store makes it (0700) when this comes first.
    if let Some(dir) = path.parent() {
        crate::checkpoint::store::create_private_dir(dir)?;
    }
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .map_err(failed)?;
    let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path).map_err(failed)?;
    file.write_all(token.as_bytes()).and_then(|()| file.sync_all()).map_err(failed)?;
    tracing::info!(file = %path.display(), "made the control API's token");
    Ok(crate::secret::Secret::new(token))
}

/// The answer to a request that names another connector, if it does: `421 Misdirected Request`.
fn other_connector(api: &Api, headers: &HeaderMap) -> Option<Response> {
    let named = headers.get(CONNECTOR_HEADER)?.to_str().unwrap_or("");
    (named != &*api.name).then(|| {
        let error = format!("this is connector {:?}, not {named:?}", &*api.name);
        (StatusCode::MISDIRECTED_REQUEST, Json(serde_json::json!({ "error": error }))).into_response()
    })
}

/// `GET /v1/status`: what `status --json` prints, from this process's memory, with where it is
/// (`role`), its lag as on `/metrics`, and whether it is ready.
async fn status(State(api): State<Api>, headers: HeaderMap) -> Response {
    if let Some(refused) = other_connector(&api, &headers) {
        return refused;
    }
    let live = api.control.live();
    let inspection = live.store.as_ref().map_or(Ok(Inspection::default()), |store| store.inspection());
    let mut document = match inspection {
        Ok(inspection) => super::status::document(&api.config, inspection),
        Err(e) => return answer(Err(e)),
    };
    document["name"] = serde_json::json!(&*api.name);
    document["role"] = serde_json::json!(live.role);
    document["ready"] = serde_json::json!(crate::health::health().ready());
    document["lag"] = serde_json::json!(crate::metrics::metrics().lag());
    document["live"] = serde_json::json!(true);
    if live.role == Role::Waiting {
        document["note"] = serde_json::json!(
            "this instance does not hold the lease (a standby, or starting): the active one's status is the \
             connector's"
        );
    }
    (StatusCode::OK, Json(document)).into_response()
}

/// `POST /v1/pause`.
async fn pause(State(api): State<Api>, headers: HeaderMap) -> Response {
    if let Some(refused) = other_connector(&api, &headers) {
        return refused;
    }
    let by = headers.get("user-agent").and_then(|v| v.to_str().ok()).unwrap_or("api");
    let by = if by.starts_with("outbox-cdc") { "cli" } else { "api" }.to_string();
    answer(api.control.ask(|answer| Command::Pause { by, answer }).await)
}

/// `POST /v1/resume`.
async fn resume(State(api): State<Api>, headers: HeaderMap) -> Response {
    if let Some(refused) = other_connector(&api, &headers) {
        return refused;
    }
    answer(api.control.ask(|answer| Command::Resume { answer }).await)
}

/// The options of a release, as `quarantine release` takes them.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ReleaseOptions {
    #[serde(default)]
    skip_poison: bool,
    #[serde(default)]
    accept_missing: bool,
}

/// `POST /v1/holds/{aggregate_type}/{aggregate_id}/release[?skip_poison=true&accept_missing=true]`: the
/// `quarantine release` flow, with the run stopped meanwhile ([`crate::app::control`]).
async fn release(
    State(api): State<Api>,
    Path((aggregate_type, aggregate_id)): Path<(String, String)>,
    Query(options): Query<ReleaseOptions>,
    headers: HeaderMap,
) -> Response {
    if let Some(refused) = other_connector(&api, &headers) {
        return refused;
    }
    let config = api.config.clone();
    let work: crate::app::control::Work = Box::new(move |store| {
        Box::pin(async move {
            let report = super::release::release_from(
                &store,
                &config,
                &aggregate_type,
                &aggregate_id,
                options.skip_poison,
                options.accept_missing,
            )
            .await?;
            Ok(serde_json::json!({
                "aggregate_type": aggregate_type,
                "aggregate_id": aggregate_id,
                "republished": report.republished,
                "skipped": report.skipped,
                "missing_first": report.missing_first,
            }))
        })
    });
    answer(api.control.ask(|answer| Command::WhileStopped { what: "quarantine release", work, answer }).await)
}

async fn not_found() -> Response {
    let error = "no such endpoint: GET /v1/status, POST /v1/pause, /v1/resume, \
                 /v1/holds/{aggregate_type}/{aggregate_id}/release";
    (StatusCode::NOT_FOUND, Json(serde_json::json!({ "error": error }))).into_response()
}

/// A command's answer as a response: `200` with the document, `409` refused for good, `503` not now.
fn answer(answer: Result<serde_json::Value>) -> Response {
    match answer {
        Ok(document) => (StatusCode::OK, Json(document)).into_response(),
        Err(e) => {
            let status = match e.is_definite() {
                true => StatusCode::CONFLICT,
                false => StatusCode::SERVICE_UNAVAILABLE,
            };
            (status, Json(serde_json::json!({ "error": e.to_string() }))).into_response()
        }
    }
}
