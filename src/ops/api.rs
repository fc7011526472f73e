//! The control API of a running connector (`[control]`), on a listener of its own, every request with the
//! bearer token: `GET /v1/status`, `POST /v1/pause`, `POST /v1/resume`,
//! `POST /v1/holds/{aggregate_type}/{aggregate_id}/release`, and the snapshots on demand:
//! `POST`/`GET /v1/snapshots`, `GET`/`DELETE /v1/snapshots/{id}`, `POST /v1/snapshots/{id}/pause|resume`.
//! The app carries pause, resume and release out between runs ([`crate::app::control`]); a snapshot is
//! stored in the state store and read by the running pipeline, whose run it never stops. The CLI's
//! `status`, `pause`, `resume`, `snapshot` and `quarantine release` come here first when the connector runs
//! ([`super::client`]).
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
    tracing::info!(%addr, "serving the control API (/v1/status, /v1/pause, /v1/resume, /v1/holds, /v1/snapshots)");
    let api = Api { name: config.state.name.clone().into(), config: config.clone(), control };
    let routes = Router::new()
        .route("/v1/status", get(status))
        .route("/v1/pause", post(pause))
        .route("/v1/resume", post(resume))
        .route("/v1/holds/{aggregate_type}/{aggregate_id}/release", post(release))
        .route("/v1/snapshots", post(snapshot_ask).get(snapshot_list))
        .route("/v1/snapshots/{id}", get(snapshot_show).delete(snapshot_cancel))
        .route("/v1/snapshots/{id}/pause", post(snapshot_pause))
        .route("/v1/snapshots/{id}/resume", post(snapshot_resume))
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
    let by = if is_cli(&headers) { "cli" } else { "api" }.to_string();
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

/// The store of the instance holding the lease, or the answer of one that does not.
fn leased_store(api: &Api, headers: &HeaderMap) -> std::result::Result<Arc<crate::checkpoint::Store>, Box<Response>> {
    if let Some(refused) = other_connector(api, headers) {
        return Err(Box::new(refused));
    }
    let live = api.control.live();
    match (live.role, live.store) {
        (Role::Running | Role::Paused, Some(store)) => Ok(store),
        _ => Err(Box::new(error_response(
            StatusCode::CONFLICT,
            "this instance does not hold the lease (a standby, or starting): send the command to the active one, or \
             try again in a moment",
        ))),
    }
}

fn error_response(status: StatusCode, error: impl std::fmt::Display) -> Response {
    (status, Json(serde_json::json!({ "error": error.to_string() }))).into_response()
}

/// `POST /v1/snapshots` with `{"table", "aggregate_type", "aggregate_id", "occurred_from", "occurred_before",
/// "where"}` (all optional): `202` with the request, stored as queued; `400` for a request the config or the
/// server refuses.
async fn snapshot_ask(State(api): State<Api>, headers: HeaderMap, body: axum::body::Bytes) -> Response {
    let store = match leased_store(&api, &headers) {
        Ok(store) => store,
        Err(refused) => return *refused,
    };
    let ask: super::snapshot::Ask = match body.is_empty() {
        true => super::snapshot::Ask::default(),
        false => match serde_json::from_slice(&body) {
            Ok(ask) => ask,
            Err(e) => return error_response(StatusCode::BAD_REQUEST, format_args!("the request's JSON: {e}")),
        },
    };
    let by = if is_cli(&headers) { "cli" } else { "api" };
    match super::snapshot::ask(&api.config, &store, ask, by).await {
        Ok(request) => {
            api.control.snapshots_changed();
            (StatusCode::ACCEPTED, Json(request)).into_response()
        }
        Err(e) if e.is_definite() => error_response(StatusCode::BAD_REQUEST, e),
        Err(e) => error_response(StatusCode::SERVICE_UNAVAILABLE, e),
    }
}

/// `GET /v1/snapshots`: every snapshot asked, the one being read with `running` and `rows_done`.
async fn snapshot_list(State(api): State<Api>, headers: HeaderMap) -> Response {
    let store = match leased_store(&api, &headers) {
        Ok(store) => store,
        Err(refused) => return *refused,
    };
    match store.inspection() {
        Ok(inspection) => {
            let list: Vec<_> = inspection.snapshots.iter().map(|r| super::snapshot::view(&inspection, r)).collect();
            (StatusCode::OK, Json(serde_json::json!({ "snapshots": list }))).into_response()
        }
        Err(e) => error_response(StatusCode::SERVICE_UNAVAILABLE, e),
    }
}

/// `GET /v1/snapshots/{id}`.
async fn snapshot_show(State(api): State<Api>, Path(id): Path<String>, headers: HeaderMap) -> Response {
    let store = match leased_store(&api, &headers) {
        Ok(store) => store,
        Err(refused) => return *refused,
    };
    match store.inspection() {
        Ok(inspection) => match super::snapshot::find(&inspection, &id) {
            Ok(request) => (StatusCode::OK, Json(super::snapshot::view(&inspection, request))).into_response(),
            Err(e) => error_response(StatusCode::NOT_FOUND, e),
        },
        Err(e) => error_response(StatusCode::SERVICE_UNAVAILABLE, e),
    }
}

/// `DELETE /v1/snapshots/{id}`: cancel.
async fn snapshot_cancel(State(api): State<Api>, Path(id): Path<String>, headers: HeaderMap) -> Response {
    snapshot_change(&api, &id, &headers, super::snapshot::Change::Cancel)
}

/// `POST /v1/snapshots/{id}/pause`.
async fn snapshot_pause(State(api): State<Api>, Path(id): Path<String>, headers: HeaderMap) -> Response {
    snapshot_change(&api, &id, &headers, super::snapshot::Change::Pause)
}

/// `POST /v1/snapshots/{id}/resume`.
async fn snapshot_resume(State(api): State<Api>, Path(id): Path<String>, headers: HeaderMap) -> Response {
    snapshot_change(&api, &id, &headers, super::snapshot::Change::Resume)
}

/// Applies `change` to snapshot `id`: `200` with it as it now is, `404` when there is none, `409` when it ended.
fn snapshot_change(api: &Api, id: &str, headers: &HeaderMap, change: super::snapshot::Change) -> Response {
    let store = match leased_store(api, headers) {
        Ok(store) => store,
        Err(refused) => return *refused,
    };
    let known = store.inspection().map(|i| i.snapshots.iter().any(|r| r.id == id));
    match known {
        Ok(true) => {}
        Ok(false) => return error_response(StatusCode::NOT_FOUND, format_args!("no snapshot on demand {id:?}")),
        Err(e) => return error_response(StatusCode::SERVICE_UNAVAILABLE, e),
    }
    match tokio::task::block_in_place(|| super::snapshot::change(&store, id, change)) {
        Ok(request) => {
            api.control.snapshots_changed();
            (StatusCode::OK, Json(request)).into_response()
        }
        Err(e) if e.is_definite() => error_response(StatusCode::CONFLICT, e),
        Err(e) => error_response(StatusCode::SERVICE_UNAVAILABLE, e),
    }
}

/// Whether the request comes from the CLI.
fn is_cli(headers: &HeaderMap) -> bool {
    headers.get("user-agent").and_then(|v| v.to_str().ok()).is_some_and(|a| a.starts_with("outbox-cdc"))
}

async fn not_found() -> Response {
    let error = "no such endpoint: GET /v1/status, POST /v1/pause, /v1/resume, \
                 /v1/holds/{aggregate_type}/{aggregate_id}/release, POST or GET /v1/snapshots, GET or DELETE \
                 /v1/snapshots/{id}, POST /v1/snapshots/{id}/pause, /v1/snapshots/{id}/resume";
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
