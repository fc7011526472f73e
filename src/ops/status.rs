//! `outbox-cdc status`: what the state directory holds, readable while the connector runs; for the polling
//! relay, which keeps no position, what its tables hold.
//!
//! Floor 6, the top (docs/ARCHITECTURE.md): may import anything below; nothing imports it but `main.rs`.

use crate::checkpoint::store::{Inspection, LastError, Paused, RequestState, SnapshotRequest};
use crate::checkpoint::{Checkpoint, Store};
use crate::config::{Config, Source};
use crate::error::Result;
use crate::metrics::POLL_BACKLOG_CAP;
use crate::position::on_demand::OnDemandProgress;
use crate::relay::Relay;
use crate::source::{self, preflight, SourceConn};
use crate::time::utc_text;

/// Prints the stored checkpoint, what it means now (lag, purge risk, snapshot progress), holds and the last
/// error, times as UTC text with their age; `json` prints the stored record (Unix times, unchanged: scripts
/// read it) with the holds and last error beside it, and before the first checkpoint those two alone (no
/// `position`).
///
/// # Errors
/// A definite error when the store cannot be read.
pub async fn print(config: &Config, json: bool) -> Result<()> {
    // A running connector answers from its memory (its control API), with where it is and its lag.
    let live = match super::client::Client::for_config(config)? {
        Some(client) => tokio::task::block_in_place(|| client.call("GET", "/v1/status"))?,
        None => None,
    };
    if let Some(live) = &live {
        if json {
            println!("{}", serde_json::to_string_pretty(live).expect("serializes"));
            return Ok(());
        }
        println!("connector:       {} ({})", config.state.name, describe_role(live));
    }
    if matches!(config.source.kind, Source::Poll(_)) {
        return print_relay(config, json).await;
    }
    // No store yet reads as an empty one: no checkpoint, no holds, no error.
    let inspection = match live.map(inspection_of).transpose()?.flatten() {
        Some(inspection) => inspection,
        None => Store::inspect_for(config).await?.unwrap_or_default(),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&document(config, inspection)).expect("serializes"));
        return Ok(());
    }
    let last_error = redacted(inspection.last_error);
    let Some(cp) = &inspection.checkpoint else {
        println!("no checkpoint in {} (the connector has not started yet)", config.state_location());
        print_paused(inspection.paused.as_ref(), crate::time::now_ms());
        if let Some(e) = &last_error {
            println!("{}", last_error_line(e, crate::time::now_ms()));
        }
        return Ok(());
    };
    let now_ms = crate::time::now_ms();
    let now_s = now_ms / 1000;
    println!("position:        {}", cp.position());
    if let Some(inside) = cp.inside() {
        println!("inside it:       {inside} are published (a long transaction committed part by part)");
    }
    println!("server:          {}", preflight::describe_identity(cp.server()));
    match cp.source_timestamp() {
        Some(ts) => {
            let age = now_s.saturating_sub(u64::from(ts));
            println!("last committed:  {} ({age} s ago, source clock)", utc_text(u64::from(ts) * 1000));
        }
        None => println!("last committed:  (no transaction checkpointed yet)"),
    }
    if let Some(end) = cp.end_event() {
        let start = cp.position().coord.pos.saturating_sub(u64::from(end.len));
        println!(
            "end event:       {} B at {}:{start}, CRC-32 {:08x} (compared with the server's binlog before a resume)",
            end.len,
            cp.position().coord.file,
            end.crc32
        );
    }
    if matches!(config.source.kind, Source::Server(_)) {
        println!("purge risk:      {}", purge_risk(config, cp, now_s).await);
    }
    if let Some(snapshot) = &cp.snapshot() {
        if snapshot.done && snapshot.segments.len() == 1 {
            println!("snapshot:        done ({} rows)", snapshot.rows_done);
        } else if snapshot.done {
            println!(
                "snapshot:        done ({} rows); the stream still skips rows published by {} resumed segment(s)",
                snapshot.rows_done,
                snapshot.segments.len() - 1
            );
        } else {
            let pct = if snapshot.rows_estimate > 0 {
                format!(
                    " ({:.1}%)",
                    100.0 * snapshot.rows_done as f64 / snapshot.rows_estimate.max(snapshot.rows_done) as f64
                )
            } else {
                String::new()
            };
            println!(
                "snapshot:        in progress: {} of ~{} rows{pct}, {} read view(s), cut at {}",
                snapshot.rows_done,
                snapshot.rows_estimate,
                snapshot.segments.len(),
                snapshot.cut()
            );
            if !snapshot.tables.is_empty() {
                println!("snapshot tables: {} (a resume needs this [outbox] list)", snapshot.tables.join(", "));
            }
        }
    }
    for line in snapshot_lines(&inspection.snapshots, cp.on_demand()) {
        println!("on demand:       {line}");
    }
    let age_ms = now_ms.saturating_sub(cp.written_at_ms());
    println!("written:         {} ({:.1} s ago)", utc_text(cp.written_at_ms()), age_ms as f64 / 1000.0);
    print_paused(inspection.paused.as_ref(), now_ms);
    print_holds_and_last_error(inspection.holds.len(), last_error.as_ref(), now_ms);
    Ok(())
}

/// The document `status --json` prints and `GET /v1/status` answers (which adds where the connector is
/// and its lag): the stored checkpoint's record (Unix times, unchanged: scripts read it), with the holds,
/// the last error and, when paused, the pause beside it; before the first checkpoint those alone (no
/// `position`: the first run may have stopped before it, with an error worth showing). The polling relay
/// keeps no checkpoint: `source` says `poll`.
pub fn document(config: &Config, inspection: Inspection) -> serde_json::Value {
    let mut value = match &inspection.checkpoint {
        Some(cp) => serde_json::to_value(cp).expect("serializes"),
        None => serde_json::json!({}),
    };
    if matches!(config.source.kind, Source::Poll(_)) {
        value["source"] = serde_json::json!("poll");
    }
    value["holds"] = serde_json::to_value(&inspection.holds).expect("serializes");
    value["last_error"] = serde_json::to_value(redacted(inspection.last_error)).expect("serializes");
    // Only when paused: the document of a connector that was never paused stays as scripts read it
    // (tests/golden_state.rs).
    if let Some(paused) = &inspection.paused {
        value["paused"] = serde_json::to_value(paused).expect("serializes");
    }
    // Likewise only once a snapshot on demand was asked; its progress is the checkpoint's `on_demand`.
    if !inspection.snapshots.is_empty() {
        value["snapshots"] = serde_json::to_value(&inspection.snapshots).expect("serializes");
    }
    value
}

/// One line per snapshot on demand, the one being read with its acknowledged rows (`progress`).
pub fn snapshot_lines(requests: &[SnapshotRequest], progress: Option<&OnDemandProgress>) -> Vec<String> {
    requests
        .iter()
        .map(|r| {
            let slice = serde_json::to_string(&r.slice).expect("serializes");
            let slice = if r.slice.is_whole() { "every row".to_string() } else { slice };
            let state = match (r.state, progress.filter(|p| p.id == r.id)) {
                (RequestState::Queued, Some(p)) => format!("running, {} rows published", p.rows_done),
                (RequestState::Paused, Some(p)) => format!("paused at {} rows", p.rows_done),
                (RequestState::Failed, _) => format!("failed: {}", r.error.as_deref().unwrap_or("?")),
                (state, _) => {
                    let state = serde_json::to_value(state).expect("serializes");
                    let rows = r.rows.map(|n| format!(", {n} rows")).unwrap_or_default();
                    format!("{}{rows}", state.as_str().unwrap_or("?"))
                }
            };
            format!("{} of {} ({slice}): {state}, asked by {} at {}", r.id, r.table, r.by, utc_text(r.requested_at_ms))
        })
        .collect()
}

/// Where a running connector is, from its control API's status.
fn describe_role(live: &serde_json::Value) -> String {
    let lag = &live["lag"];
    match live["role"].as_str().unwrap_or("?") {
        "running" => format!(
            "running, {:.1} s behind the source, {} record(s) in flight; live from its control API",
            lag["source_seconds_behind"].as_f64().unwrap_or(0.0),
            lag["records_in_flight"].as_i64().unwrap_or(0)
        ),
        "paused" => "paused by an operator; live from its control API".to_string(),
        _ => "this instance does not hold the lease (a standby, or starting); the rest is the stored state".to_string(),
    }
}

/// The store's part of a running connector's status document, as `status` reads a store: `None` when the
/// instance holds no store (a standby: the stored state is read instead).
///
/// # Errors
/// A definite error when the document is not one this build's API answers.
fn inspection_of(mut live: serde_json::Value) -> Result<Option<Inspection>> {
    if live["role"] == "waiting" {
        return Ok(None);
    }
    let unreadable = |e: serde_json::Error| {
        crate::error::Error::definite(format!("the control API's status is not this build's: {e}"))
    };
    let mut take = |key: &str| live.as_object_mut().and_then(|o| o.remove(key)).unwrap_or(serde_json::Value::Null);
    let holds = serde_json::from_value(take("holds")).map_err(unreadable)?;
    let last_error = serde_json::from_value(take("last_error")).map_err(unreadable)?;
    let paused = serde_json::from_value(take("paused")).map_err(unreadable)?;
    let snapshots = match take("snapshots") {
        serde_json::Value::Null => Vec::new(),
        list => serde_json::from_value(list).map_err(unreadable)?,
    };
    for key in ["name", "role", "ready", "lag", "live", "note", "source"] {
        take(key);
    }
    let checkpoint = match live.get("position") {
        Some(_) => Some(serde_json::from_value(live).map_err(unreadable)?),
        None => None,
    };
    let signals = Vec::new();
    Ok(Some(Inspection { checkpoint, holds, last_error, known_poison: Vec::new(), paused, snapshots, signals }))
}

/// The `paused:` line, when an operator paused the connector.
fn print_paused(paused: Option<&Paused>, now_ms: u64) {
    if let Some(p) = paused {
        let ago = now_ms.saturating_sub(p.at_ms) / 1000;
        println!(
            "paused:          since {} ({ago} s ago, by {}): nothing is read or published until `outbox-cdc resume`",
            utc_text(p.at_ms),
            p.by
        );
    }
}

/// The stored last error with its message redacted: messages are redacted when an error is built, but a
/// record written by an older version may not be.
fn redacted(last_error: Option<LastError>) -> Option<LastError> {
    last_error.map(|mut e| {
        e.message = crate::secret::redact(&e.message).into_owned();
        e
    })
}

/// The `quarantine:` and `last error:` lines that end both forms of `status`.
fn print_holds_and_last_error(holds: usize, last_error: Option<&LastError>, now_ms: u64) {
    match holds {
        0 => println!("quarantine:      none"),
        n => println!("quarantine:      {n} aggregate(s) held (outbox-cdc quarantine list)"),
    }
    match last_error {
        Some(e) => println!("{}", last_error_line(e, now_ms)),
        None => println!("last error:      none"),
    }
}

/// One polled table's state, as `status` shows it.
#[derive(Debug, serde::Serialize)]
struct PolledTable {
    table: String,
    /// Unpublished rows due now, counted up to [`POLL_BACKLOG_CAP`].
    due_rows: u64,
    /// Whether `due_rows` stopped at the cap.
    due_rows_capped: bool,
    /// Seconds since the oldest due row became due.
    oldest_due_s: f64,
    /// Dead-lettered rows, never due again (`quarantine list`).
    parked_rows: u64,
    /// `[poll] progress_table`: every row with a sequence number up to this is published.
    #[serde(skip_serializing_if = "Option::is_none")]
    published_through: Option<u64>,
}

/// [`print`] for the polling relay: it has no position (a row's `published_at`, and the progress table's
/// number when it has one, are its progress), so it prints each table's due and parked rows, asked of the
/// database, then the holds and last error.
async fn print_relay(config: &Config, json: bool) -> Result<()> {
    let source = SourceConn::from_config(config)?;
    let mut conn = source.connect().await?;
    let relay = Relay::load(&mut conn, config).await?;
    let mut tables = Vec::new();
    for (t, polled) in relay.tables().iter().enumerate() {
        let (due_rows, oldest_due_s) = relay.backlog(&mut conn, t).await?;
        let parked_rows = relay.parked(&mut conn, t).await?;
        let due_rows_capped = due_rows >= POLL_BACKLOG_CAP;
        tables.push(PolledTable {
            table: polled.table.to_string(),
            due_rows,
            due_rows_capped,
            oldest_due_s,
            parked_rows,
            published_through: relay.progress().published_through(t),
        });
    }
    let inspection = Store::inspect_for(config).await?.unwrap_or_default();
    if json {
        let mut value = document(config, inspection);
        value["tables"] = serde_json::to_value(&tables).expect("serializes");
        println!("{}", serde_json::to_string_pretty(&value).expect("serializes"));
        return Ok(());
    }
    let paused = inspection.paused.clone();
    let holds = inspection.holds;
    let last_error = redacted(inspection.last_error);
    let progress = match relay.progress().table() {
        Some(table) => format!("the progress table {table} and each row's published_at are its progress"),
        None => "each row's published_at is its progress".to_string(),
    };
    println!("source:          polling relay (no position: {progress})");
    for t in &tables {
        let more = if t.due_rows_capped { "at least " } else { "" };
        let oldest = match t.due_rows {
            0 => String::new(),
            _ => format!(", the oldest due {:.1} s", t.oldest_due_s),
        };
        let through =
            t.published_through.map(|n| format!("; published through sequence number {n}")).unwrap_or_default();
        println!(
            "table:           {}: {more}{} row(s) due{oldest}; {} parked{through}",
            t.table, t.due_rows, t.parked_rows
        );
    }
    print_paused(paused.as_ref(), crate::time::now_ms());
    print_holds_and_last_error(holds.len(), last_error.as_ref(), crate::time::now_ms());
    Ok(())
}

/// `last error:` with when (UTC and how long ago), the class and the message.
fn last_error_line(e: &LastError, now_ms: u64) -> String {
    let ago = now_ms.saturating_sub(e.at_ms) / 1000;
    format!("last error:      {} ({ago} s ago, {}): {}", utc_text(e.at_ms), e.class, e.message)
}

/// The purge risk of the checkpoint, or why it cannot be measured now.
async fn purge_risk(config: &Config, cp: &Checkpoint, now_s: u64) -> String {
    let measure = async {
        let source = SourceConn::from_config(config)?;
        let mut conn = source.connect().await?;
        source::purge::measure(&mut conn, cp.position(), cp.source_timestamp(), now_s).await
    };
    match tokio::time::timeout(std::time::Duration::from_secs(10), measure).await {
        Ok(Ok(risk)) => risk.to_string(),
        Ok(Err(e)) => format!("unknown (cannot ask the server: {e})"),
        Err(_) => "unknown (the server did not answer within 10 s)".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_error_says_when_in_utc_and_how_long_ago() {
        let e = LastError { at_ms: 1_796_042_096_789, class: "definite".into(), message: "binlog purged".into() };
        assert_eq!(
            last_error_line(&e, 1_796_042_156_000),
            "last error:      2026-11-30T12:34:56Z (59 s ago, definite): binlog purged"
        );
    }
}
