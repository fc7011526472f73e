//! Snapshots on demand, as an operator asks for them: `POST /v1/snapshots` and `outbox-cdc snapshot`
//! ([`ask`]), pause, resume and cancel ([`change`]), and what they show ([`view`]). The request is stored in
//! the state store; the running pipeline reads it (`pipeline::on_demand`). The CLI goes through the
//! running connector's control API when it answers, and writes the stopped connector's store otherwise.
//!
//! Floor 6, the top (docs/ARCHITECTURE.md): may import anything below; nothing imports it but `main.rs`
//! and `api`.

use crate::checkpoint::store::{Inspection, RequestState, SnapshotRequest};
use crate::checkpoint::Store;
use crate::config::{Config, Source};
use crate::error::{Error, Result};
use crate::outbox::TableName;
use crate::position::on_demand::Slice;
use crate::source::SourceConn;

/// What an operator asks: a table (may be left out when one is configured) and a slice of it.
#[derive(Debug, Clone, Default, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Ask {
    /// `database.table`, one of `[outbox] tables`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<String>,
    /// Which rows.
    #[serde(flatten)]
    pub slice: Slice,
}

/// Checks `ask` against the config and the server (the table is an outbox table, the server accepts the
/// slice's read), and stores it as queued, by `by` (`api`, `cli`, `signal`).
///
/// # Errors
/// A definite error saying what is wrong with the request; the server's and the store's errors.
pub async fn ask(config: &Config, store: &Store, ask: Ask, by: &str) -> Result<SnapshotRequest> {
    let request = checked(config, ask, by).await?;
    let store_write = request.clone();
    tokio::task::block_in_place(|| store.put_snapshot(&store_write))?;
    tracing::info!(id = %request.id, table = %request.table, slice = ?request.slice, by, "snapshot on demand asked");
    Ok(request)
}

/// `ask` checked and made a queued request, not stored.
///
/// # Errors
/// As [`ask`].
pub async fn checked(config: &Config, ask: Ask, by: &str) -> Result<SnapshotRequest> {
    let Source::Server(_) = &config.source.kind else {
        return Err(Error::definite(
            "snapshots on demand read the outbox table beside the binlog stream: the polling relay and binlog \
             files have none (the relay publishes every unpublished row anyway)",
        ));
    };
    let table = match (ask.table, config.tables()) {
        (Some(name), _) => name,
        (None, [one]) => one.to_string(),
        (None, configured) => return Err(Error::definite(format!("say which table: one of {}", list(configured)))),
    };
    let connection = config.source.kind.connection().ok_or_else(|| Error::definite("no source server configured"))?;
    let source = SourceConn::new(connection)?;
    let request = SnapshotRequest::asked(table, ask.slice, by, 0);
    crate::source::snapshot::check_request(&source, config, &request).await?;
    Ok(request)
}

fn list(tables: &[TableName]) -> String {
    tables.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

/// What an operator may do to a snapshot asked before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Stop reading it, keep its progress.
    Pause,
    /// Read it again from where it paused.
    Resume,
    /// Read nothing more of it.
    Cancel,
}

/// Applies `change` to snapshot `id` in `store`, and returns it as it now is.
///
/// # Errors
/// A definite error when there is no such snapshot or it ended; the store's errors.
pub fn change(store: &Store, id: &str, change: Change) -> Result<SnapshotRequest> {
    let inspection = store.inspection()?;
    let request = find(&inspection, id)?;
    if request.state.is_final() {
        return Err(Error::definite(format!(
            "snapshot {id} has ended ({}): nothing to change",
            state_name(request.state)
        )));
    }
    let rows = progress_rows(&inspection, id);
    let changed = match change {
        Change::Pause => SnapshotRequest { state: RequestState::Paused, ..request.clone() },
        Change::Resume => SnapshotRequest { state: RequestState::Queued, ..request.clone() },
        Change::Cancel => request.clone().finished(RequestState::Cancelled, crate::time::now_ms(), rows, None),
    };
    if changed != *request {
        store.put_snapshot(&changed)?;
    }
    Ok(changed)
}

/// The stored request `id`.
///
/// # Errors
/// A definite error when there is none.
pub fn find<'a>(inspection: &'a Inspection, id: &str) -> Result<&'a SnapshotRequest> {
    inspection
        .snapshots
        .iter()
        .find(|r| r.id == id)
        .ok_or_else(|| Error::definite(format!("no snapshot on demand {id:?} (`outbox-cdc snapshot list`)")))
}

/// Rows the checkpoint says snapshot `id` published, if it is the one being read.
fn progress_rows(inspection: &Inspection, id: &str) -> u64 {
    inspection.checkpoint.as_ref().and_then(|c| c.on_demand()).filter(|p| p.id == id).map_or(0, |p| p.rows_done)
}

/// A request as the API shows it: the stored record, and for the one being read `running` and its
/// acknowledged rows (`rows_done`, from the checkpoint).
pub fn view(inspection: &Inspection, request: &SnapshotRequest) -> serde_json::Value {
    let mut value = serde_json::to_value(request).expect("serializes");
    let progress = inspection.checkpoint.as_ref().and_then(|c| c.on_demand()).filter(|p| p.id == request.id);
    if let Some(progress) = progress.filter(|_| !request.state.is_final()) {
        value["rows_done"] = serde_json::json!(progress.rows_done);
        if request.state == RequestState::Queued {
            value["running"] = serde_json::json!(true);
        }
    }
    value
}

fn state_name(state: RequestState) -> String {
    serde_json::to_value(state).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
}

/// What `outbox-cdc snapshot` does.
#[derive(Debug, Clone)]
pub enum Command {
    /// Ask for one.
    Start(Ask),
    /// List them.
    List,
    /// Show one.
    Show(String),
    /// Pause, resume or cancel one.
    Change(String, Change),
}

/// `outbox-cdc snapshot …`: through the running connector's control API when it answers, else on the
/// stopped connector's store (a snapshot asked then starts with its next run).
///
/// # Errors
/// The API's refusal or the request's, the store's errors.
pub async fn run(config: &Config, command: Command, json: bool) -> Result<()> {
    if let Some(client) = super::client::Client::for_config(config)? {
        let (method, path, body) = match &command {
            Command::Start(ask) => {
                ("POST", "/v1/snapshots".to_string(), Some(serde_json::to_value(ask).expect("serializes")))
            }
            Command::List => ("GET", "/v1/snapshots".to_string(), None),
            Command::Show(id) => ("GET", format!("/v1/snapshots/{id}"), None),
            Command::Change(id, Change::Cancel) => ("DELETE", format!("/v1/snapshots/{id}"), None),
            Command::Change(id, Change::Pause) => ("POST", format!("/v1/snapshots/{id}/pause"), None),
            Command::Change(id, Change::Resume) => ("POST", format!("/v1/snapshots/{id}/resume"), None),
        };
        if let Some(answer) = tokio::task::block_in_place(|| client.call_with(method, &path, body.as_ref()))? {
            print(&command, &answer, json, "through its control API");
            return Ok(());
        }
    }
    let why = "asking for, or changing, a snapshot on demand of a connector whose control API does not answer \
               needs it stopped (it writes the state store)";
    let answer = super::with_stopped_store(config, why, async |store| {
        let inspection = store.inspection()?;
        Ok(match &command {
            Command::Start(a) => serde_json::to_value(ask(config, store, a.clone(), "cli").await?).expect("serializes"),
            Command::List => serde_json::json!({
                "snapshots": inspection.snapshots.iter().map(|r| view(&inspection, r)).collect::<Vec<_>>()
            }),
            Command::Show(id) => view(&inspection, find(&inspection, id)?),
            Command::Change(id, what) => serde_json::to_value(change(store, id, *what)?).expect("serializes"),
        })
    })
    .await?;
    print(&command, &answer, json, "in its state store: it is not running");
    Ok(())
}

/// Prints `answer` to `command`.
fn print(command: &Command, answer: &serde_json::Value, json: bool, how: &str) {
    if json {
        println!("{}", serde_json::to_string_pretty(answer).expect("serializes"));
        return;
    }
    let one = |v: &serde_json::Value| {
        let request: Option<SnapshotRequest> = serde_json::from_value(v.clone()).ok();
        let rows = v["rows_done"].as_u64().map(|n| format!(", {n} rows acknowledged")).unwrap_or_default();
        match request {
            Some(r) => {
                let running = if v["running"] == true { "running" } else { "" };
                let state = if running.is_empty() { state_name(r.state) } else { running.to_string() };
                let slice = if r.slice.is_whole() {
                    "every row".into()
                } else {
                    serde_json::to_string(&r.slice).unwrap_or_default()
                };
                format!("{}  {}  {}  {state}{rows}", r.id, r.table, slice)
            }
            None => v.to_string(),
        }
    };
    match command {
        Command::Start(_) => println!("snapshot asked ({how}): {}", one(answer)),
        Command::List => {
            let list = answer["snapshots"].as_array().cloned().unwrap_or_default();
            if list.is_empty() {
                println!("no snapshot on demand was asked");
            }
            for v in &list {
                println!("{}", one(v));
            }
        }
        Command::Show(_) => println!("{}", one(answer)),
        Command::Change(_, _) => println!("{} ({how})", one(answer)),
    }
}
