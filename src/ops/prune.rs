//! Safe cleanup: delete outbox rows that are past the retention window **and** provably delivered.
//!
//! Floor 6, the top (docs/ARCHITECTURE.md): may import anything below; nothing imports it but `main.rs`.
//!
//! The outbox table only grows; `outbox-cdc prune --older-than 7d` (or [`prune`] from a scheduler) deletes
//! old rows in small batches. Age alone is not enough: a row can be a week old and still unpublished (the
//! connector was stopped, or is far behind), and deleting it loses the event for good, because the snapshot
//! and every re-seed read the table. So a row is deleted only when the connector's committed checkpoint
//! proves Kafka acknowledged its event.
//!
//! # The rule
//! 1. Open a consistent read view `V` whose binlog cut `C` is exact: every row visible in `V` was inserted
//!    by a transaction at or before `C` (the snapshot's view, [`snapshot::open`]: MariaDB's
//!    `binlog_snapshot_*`, MySQL's locked GTID read).
//! 2. Read the stored checkpoint `P` (read-only; the live connector keeps the writer role). `P` is the end
//!    of a source transaction such that Kafka acknowledged the events of it and of every earlier one
//!    (see [`crate::checkpoint`]).
//! 3. If `P` contains `C` (MySQL: `C ⊆ P` as GTID sets; MariaDB: per domain, `P`'s sequence number ≥ `C`'s;
//!    without GTIDs: `C ≤ P` as binlog coordinates of the same server), then every row visible in `V` was
//!    inserted at or before `C ≤ P`, so the connector read it and Kafka acknowledged its event. Only then
//!    are rows selected, *in `V`*, by `occurred_at < cutoff`, and deleted by primary key.
//! 4. Otherwise wait up to `wait` re-reading `P` (a running connector catches up within about
//!    `state.checkpoint_interval_ms`); if it still does not contain `C`, delete nothing and say why.
//!
//! On MySQL, opening `V` takes the snapshot's brief lock (`snapshot.lock`) with the `[source]` user.
//!
//! Rows inserted after `C` are not visible in `V`, so they are never selected, whatever their
//! `occurred_at` says. The `DELETE`s run on a second connection (with the `[prune]` credentials) and name
//! the selected primary keys, so they cannot reach a row the proof did not cover.
//!
//! # Invariants
//! - Nothing is deleted unless the checkpoint contains the view's cut; every deleted row is visible in that
//!   view.
//! - No checkpoint, a checkpoint of another server, an unfinished initial snapshot, or positions that
//!   cannot be compared: nothing is deleted, with a definite error. A checkpoint that is merely behind: a
//!   transient error (retry later). The snapshot refusal is load-bearing: during a snapshot the checkpoint's
//!   position is the snapshot's cut, which contains every row the snapshot has yet to publish (and its
//!   resume rule assumes no row is deleted before it is checkpointed).
//! - The state store is only read; the connector may be running.
//!
//! # What "delivered" covers
//! The checkpoint proves the connector *read past* a row's insert. Rows the configuration deliberately
//! never published count as handled too: rows that existed before a first start with `snapshot.mode =
//! "never"` (or `start_from = "current"`), and rows excluded by `snapshot.where`. Prune cannot tell those
//! apart from published rows; if that matters, keep them out with a longer retention.
//!
//! Anything that lets the checkpoint pass an outbox row *without* delivering its event would break this
//! rule. Poison rows and quarantined events are delivered to the dead-letter topic (acknowledged like any
//! record), but not always whole: a row too large for a record goes there without its payload, and
//! `quarantine release` reads that payload back from the table; records of the dead-letter topic can also be
//! removed by an operator's retention, and then the table is the only copy. So:
//!
//! - **Rows of a held aggregate are never deleted**, whatever their age, until `quarantine release` lifts the
//!   hold. The holds are read from the state store *after* the checkpoint that covers the view's cut: a hold
//!   is stored before its first record is produced, hence before the checkpoint can pass that row, so every
//!   hold on a row visible in the view is in that read. (A hold placed later is on rows after the cut, which
//!   this run does not see.)
//!
//! # Time
//! `occurred_at` is a `DATETIME` without zone. The cutoff is computed by the server as
//! `UTC_TIMESTAMP(6) - older_than`, i.e. `occurred_at` is taken to be UTC (the convention of
//! `docs/CONTRACT.md`). If your services write local time, the retention window shifts by the UTC offset;
//! safety does not depend on it, only on the checkpoint rule.
//!
//! # Why a primary-key keyset, not `(occurred_at, id)`
//! The reference schema has no index that starts with `occurred_at`; a keyset on it would sort the whole
//! table per batch. Walking the primary key (`id > last`) with the `occurred_at` filter reads the clustered
//! index once over the whole run, with any schema. The view stays open for the whole run, so InnoDB keeps
//! undo history for it meanwhile: prune a modest backlog often rather than a huge one rarely.
//!
//! # Why not without a read view
//! Selecting old rows on a plain connection and comparing the checkpoint with the server's current position
//! races with commits: a row can commit between the position read and the select. The view's cut is the
//! only position that is exact for what the select sees.

use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Value};

use super::ids::IdColumn;
use crate::checkpoint::Store;
use crate::config::{ColumnNames, Config, Connection, OnUpdate, PollOrder};
use crate::error::{classify_mysql, Error, Result};
use crate::outbox::{quote_ident, TableName};
use crate::position::{Gtids, Position};
use crate::relay::HELD_AT;
use crate::source::{self, preflight, snapshot, SourceConn};

/// What to prune, besides the `[prune]` config.
#[derive(Debug, Clone)]
pub struct PruneOptions {
    /// Retention window: rows whose `occurred_at` is older than the server's `UTC_TIMESTAMP(6)` minus this
    /// are candidates.
    pub older_than: Duration,
    /// How long to wait for the checkpoint to reach the view's cut before giving up.
    pub wait: Duration,
    /// Count the rows that would be deleted; delete nothing.
    pub dry_run: bool,
}

/// What a prune run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PruneReport {
    /// Rows deleted (with `dry_run`: rows that would have been deleted).
    pub rows_deleted: u64,
    /// `DELETE` statements run.
    pub batches: u64,
    /// The `occurred_at` bound: rows strictly older were candidates (server time, UTC).
    pub cutoff: String,
    /// The read view's cut `C`.
    pub view: Position,
    /// The checkpoint `P` that contained it.
    pub checkpoint: Position,
}

/// Whether the checkpoint `checkpoint` contains every transaction at or before `cut`; `None` when the two
/// positions cannot be compared (different kinds).
pub fn checkpoint_covers(checkpoint: &Position, cut: &Position) -> Option<bool> {
    match (&cut.gtids, &checkpoint.gtids) {
        // NOTE: a position is a transaction boundary; a cut equal to the checkpoint is covered.
        (Gtids::None, Gtids::None) => Some(cut.coord <= checkpoint.coord),
        (cut, checkpoint) => cut.is_within(checkpoint),
    }
}

/// How often the checkpoint is re-read while waiting for the connector to catch up.
const RECHECK_EVERY: Duration = Duration::from_millis(250);

/// Deletes outbox rows older than `options.older_than` whose events the checkpoint proves delivered, in
/// batches of `prune.batch_rows` with `prune.pause_ms` between them.
///
/// # Errors
/// Definite when there is no usable checkpoint (none, another server's, an unfinished snapshot,
/// incomparable positions) or `outbox.on_update = "fail"`; transient when the checkpoint stays behind the
/// server's position for `options.wait`; classified server errors otherwise. Batches deleted before an
/// error stay deleted (each was proven on its own).
pub async fn prune(config: &Config, options: &PruneOptions) -> Result<PruneReport> {
    if config.outbox.on_update == OnUpdate::Fail {
        return Err(Error::definite(
            "outbox.on_update = \"fail\" makes the connector stop on any DELETE from the outbox table, \
             including prune's; set it to \"ignore\" or \"warn\" before pruning",
        ));
    }
    let tables = config.tables().to_vec();
    let source = SourceConn::from_config(config)?;
    let mut conn = source.connect().await?;
    let info = source::server_info(&mut conn).await?;
    drop(conn);
    let first = usable_checkpoint(config, &info.identity).await?;

    let (mut scanner, cut) = snapshot::open(&source, &info, config, config.tables(), None).await?;
    let result = async {
        let checkpoint = wait_for_coverage(config, &info.identity, first, &cut, options.wait).await?;
        // Read after the covering checkpoint (see "What delivered covers").
        let held = held_aggregates(config).await?;
        let view = scanner.view_conn();
        let cutoff = cutoff(view, options.older_than).await?;
        tracing::info!(view = %cut, checkpoint = %checkpoint, %cutoff, "the checkpoint covers the read view: pruning");
        let mut deleter = if options.dry_run { None } else { Some(delete_conn(config)?.connect().await?) };
        let mut report =
            PruneReport { rows_deleted: 0, batches: 0, cutoff: cutoff.clone(), view: cut.clone(), checkpoint };
        for table in &tables {
            prune_table(config, table, &cutoff, &held, view, deleter.as_mut(), &mut report).await?;
        }
        if let Some(conn) = deleter {
            let _ = conn.disconnect().await;
        }
        Ok::<_, Error>(report)
    }
    .await;
    scanner.close().await;
    let report = result?;
    tracing::info!(rows = report.rows_deleted, batches = report.batches, dry_run = options.dry_run, "prune done");
    Ok(report)
}

/// The stored checkpoint, if prune may rely on it.
async fn usable_checkpoint(config: &Config, server: &crate::position::ServerIdentity) -> Result<Position> {
    let dir = config.state_location();
    let checkpoint = Store::inspect_for(config).await?.and_then(|i| i.checkpoint).ok_or_else(|| {
        Error::definite(format!(
            "no checkpoint in {dir}: nothing can be proven delivered, so prune deletes nothing. Run the connector \
             (with this config's [state]) first"
        ))
    })?;
    if checkpoint.server() != server {
        return Err(Error::definite(format!(
            "the checkpoint in {} belongs to {}, but [source] is {}: its position proves nothing about this \
             server's rows; prune deletes nothing. Point [source] at the connector's server",
            dir,
            preflight::describe_identity(checkpoint.server()),
            preflight::describe_identity(server)
        )));
    }
    if checkpoint.snapshot().as_ref().is_some_and(|s| !s.done) {
        return Err(Error::definite(
            "the connector's initial snapshot is not finished; its resume rule assumes no outbox row is deleted \
             before it is published, so prune deletes nothing until the snapshot is done",
        ));
    }
    Ok(checkpoint.position().clone())
}

/// The aggregates on hold, as `(aggregate_type, aggregate_id)`: their rows are kept.
async fn held_aggregates(config: &Config) -> Result<Vec<(String, String)>> {
    let holds = Store::inspect_for(config).await?.map(|i| i.holds).unwrap_or_default();
    if !holds.is_empty() {
        tracing::info!(held = holds.len(), "keeping every row of the aggregates on hold (quarantine list)");
    }
    Ok(holds.into_iter().map(|h| (h.aggregate_type, h.aggregate_id)).collect())
}

/// The condition that leaves the rows of held aggregates in `table` out, and its parameters; empty without
/// holds.
///
/// A hold names its aggregate as published; each part is compared in its column's own type
/// ([`super::ids`]), or a BINARY(16) or integer aggregate id would never match and its held rows would be
/// deleted. A hold whose id cannot be a value of this table's column (a UUID's text against an integer
/// column) has no rows here to keep.
///
/// # Errors
/// Classified query errors reading the columns' types.
async fn not_held(
    columns: &ColumnNames,
    table: &TableName,
    view: &mut Conn,
    held: &[(String, String)],
) -> Result<(String, Vec<Value>)> {
    let mut sql = String::new();
    let mut params = Vec::with_capacity(held.len() * 2);
    if held.is_empty() {
        return Ok((sql, params));
    }
    let c = columns;
    let type_column = IdColumn::require(view, table, &c.aggregate_type).await?;
    let id_column = IdColumn::require(view, table, &c.aggregate_id).await?;
    let (t, i) = (quote_ident(&type_column.name), quote_ident(&id_column.name));
    for (aggregate_type, aggregate_id) in held {
        let (Ok(type_value), Ok(id_value)) = (type_column.value(aggregate_type), id_column.value(aggregate_id)) else {
            continue;
        };
        // Compared in the columns' collation: a case-insensitive one keeps more rows, never fewer.
        sql.push_str(&format!(" AND NOT ({t} = ? AND {i} = ?)"));
        params.push(type_value.param());
        params.push(id_value.param());
    }
    Ok((sql, params))
}

/// Re-reads the checkpoint until it covers `cut`, for up to `wait`.
async fn wait_for_coverage(
    config: &Config,
    server: &crate::position::ServerIdentity,
    mut checkpoint: Position,
    cut: &Position,
    wait: Duration,
) -> Result<Position> {
    let deadline = Instant::now() + wait;
    loop {
        match checkpoint_covers(&checkpoint, cut) {
            Some(true) => return Ok(checkpoint),
            Some(false) => {}
            None => {
                return Err(Error::definite(format!(
                    "the checkpoint {checkpoint} and the server's position {cut} are of different kinds \
                     (source.resume_by changed?); prune deletes nothing"
                )))
            }
        }
        if Instant::now() >= deadline {
            return Err(Error::transient(format!(
                "the checkpoint {checkpoint} is behind the server's position {cut} (waited {wait:?}): rows \
                 inserted in between may not be in Kafka yet, so prune deleted nothing. Start the connector, \
                 or let it catch up, and prune again"
            )));
        }
        tokio::time::sleep(RECHECK_EVERY).await;
        checkpoint = usable_checkpoint(config, server).await?;
    }
}

/// `UTC_TIMESTAMP(6) - older_than` as the server prints a `DATETIME(6)`.
async fn cutoff(view: &mut Conn, older_than: Duration) -> Result<String> {
    let micros = u64::try_from(older_than.as_micros()).unwrap_or(u64::MAX);
    let cutoff: Option<String> = view
        .exec_first("SELECT DATE_FORMAT(UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND, '%Y-%m-%d %H:%i:%s.%f')", (micros,))
        .await
        .map_err(|e| classify_mysql(&e).context("computing the retention cutoff"))?;
    cutoff.ok_or_else(|| Error::definite(format!("--older-than {older_than:?} is out of the server's date range")))
}

/// The connection settings for the `DELETE`s: `[source]` with `[prune]`'s overrides.
fn delete_conn(config: &Config) -> Result<SourceConn> {
    let with_overrides = |source: &Connection| {
        let mut c = source.clone();
        let prune = &config.prune;
        if let Some(host) = &prune.host {
            c.host = host.clone();
        }
        if let Some(port) = prune.port {
            c.port = port;
        }
        if let Some(user) = &prune.user {
            c.user = user.clone();
            c.password = prune.password.clone();
            c.password_env = prune.password_env.clone();
            c.password_file = prune.password_file.clone();
            // A user of its own with a password of its own logs in with that password, not with the token of
            // the connector's identity.
            if c.password.is_some() || c.password_env.is_some() || c.password_file.is_some() {
                c.auth = crate::config::Auth::Password;
            }
        }
        c
    };
    SourceConn::settings(config)
        .and_then(|source| SourceConn::new(&with_overrides(source)))
        .map_err(|e| e.context("[prune] connection"))
}

/// Selects candidate ids of `table` in the view, batch by batch, and deletes each batch.
async fn prune_table(
    config: &Config,
    table: &TableName,
    cutoff: &str,
    held: &[(String, String)],
    view: &mut Conn,
    mut deleter: Option<&mut Conn>,
    report: &mut PruneReport,
) -> Result<()> {
    if crate::source::snapshot::role_columns(view, table, &config.outbox.columns).await?[7].is_none() {
        return Err(Error::definite(format!(
            "prune deletes rows by their age, read from occurred_at, and {table} has no `{}` column: map the \
             column that says when each event was written as occurred_at in [outbox.columns]",
            config.outbox.columns.occurred_at
        )));
    }
    let (id, occurred_at) = (quote_ident(&config.outbox.columns.id), quote_ident(&config.outbox.columns.occurred_at));
    let batch = config.prune.batch_rows;
    let pause = config.prune.pause;
    let (not_held, held_params) = not_held(&config.outbox.columns, table, view, held).await?;
    let mut after: Option<Value> = None;
    loop {
        let select = format!(
            "SELECT {id} FROM {t} WHERE {occurred_at} < ?{not_held}{keyset} ORDER BY {id} LIMIT {batch}",
            t = table.quoted(),
            keyset = if after.is_some() { format!(" AND {id} > ?") } else { String::new() },
        );
        let mut params = vec![Value::from(cutoff)];
        params.extend(held_params.iter().cloned());
        params.extend(after.clone());
        let ids: Vec<Value> = view
            .exec(select, params)
            .await
            .map_err(|e| classify_mysql(&e).context(format_args!("selecting {table}")))?;
        let Some(last) = ids.last().cloned() else {
            return Ok(());
        };
        let n = ids.len() as u64;
        if let Some(conn) = deleter.as_deref_mut() {
            let placeholders = vec!["?"; ids.len()].join(", ");
            // The occurred_at bound again: a row re-inserted under a deleted id after the view is not the
            // row the proof covers, and is left alone unless it is old as well.
            let delete =
                format!("DELETE FROM {t} WHERE {id} IN ({placeholders}) AND {occurred_at} < ?", t = table.quoted());
            let mut params = ids;
            params.push(Value::from(cutoff));
            conn.exec_drop(delete, params)
                .await
                .map_err(|e| classify_mysql(&e).context(format_args!("deleting from {table} (prune user)")))?;
            report.rows_deleted += conn.affected_rows();
            report.batches += 1;
            tracing::debug!(%table, rows = conn.affected_rows(), total = report.rows_deleted, "pruned a batch");
        } else {
            report.rows_deleted += n;
        }
        after = Some(last);
        if n < batch as u64 {
            return Ok(());
        }
        if deleter.is_some() && !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
    }
}

/// What a prune run of the polling relay's table did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedPruneReport {
    /// Rows deleted (with `dry_run`: rows that would have been deleted).
    pub rows_deleted: u64,
    /// `DELETE` statements run.
    pub batches: u64,
    /// The `published_at` bound: rows published strictly earlier were deleted (server time, UTC).
    pub cutoff: String,
}

/// `prune` for the polling relay (`source.kind = "poll"`): deletes rows whose `published_at` is older than
/// `options.older_than`, in batches of `prune.batch_rows` with `prune.pause_ms` between them.
///
/// No binlog proof is needed: the relay sets `published_at` only after Kafka acknowledged the row's event,
/// so `published_at` is the proof. With a progress table, its number is: a table whose sequence started
/// again at or below it (truncated, re-created, restored) is refused ([`crate::relay::CounterReset`]), as
/// the relay refuses it, since its new rows there would be deleted unpublished. Unpublished rows (due, leased, failed, or parked after a dead letter)
/// are never candidates, and rows of aggregates held in this state store are kept as with the binlog
/// source. The relay's session and this cutoff are both UTC.
///
/// # Errors
/// Classified server errors. Batches deleted before an error stay deleted.
pub async fn prune_published(config: &Config, options: &PruneOptions) -> Result<PublishedPruneReport> {
    let source = SourceConn::from_config(config)?;
    let mut conn = source.connect().await?;
    let held = held_aggregates(config).await?;
    let cutoff = cutoff(&mut conn, options.older_than).await?;
    let mut deleter = if options.dry_run { None } else { Some(delete_conn(config)?.connect().await?) };
    let mut report = PublishedPruneReport { rows_deleted: 0, batches: 0, cutoff: cutoff.clone() };
    let id = quote_ident(&config.outbox.columns.id);
    let batch = config.prune.batch_rows;
    let pause = config.prune.pause;
    let progress = config.poll.progress.table();
    for table in config.tables() {
        let (not_held, held_params) = not_held(&config.outbox.columns, table, &mut conn, &held).await?;
        // With a progress table, rows up to its number are published too (their `published_at` stays
        // NULL): they are deleted by their `occurred_at`. Held rows (`published_at` = HELD_AT, the number
        // passed them) are not published, whatever their place.
        let marked = format!("(`published_at` > '{HELD_AT}' AND `published_at` < ?)");
        let (published, published_params) = match &progress {
            None => (marked, vec![Value::from(cutoff.as_str())]),
            Some(progress) => {
                let through = crate::relay::read_frontier(&mut conn, progress, table).await?;
                let occurred_at = quote_ident(&config.outbox.columns.occurred_at);
                let found = crate::relay::columns_of(&mut conn, table).await?;
                let order = crate::relay::order_key(&found, &config.outbox.columns, PollOrder::Sequence);
                let Some(crate::relay::OrderKey::Sequence(seq)) = order else {
                    return Err(Error::definite(format!(
                        "{table} has no AUTO_INCREMENT column for [poll] progress_table"
                    )));
                };
                // A sequence that started again has new, unpublished rows at or below the number.
                crate::relay::fresh_counters(&mut conn).await?;
                crate::relay::refuse_reset(&mut conn, progress, table, &seq, through).await?;
                let seq = quote_ident(&seq);
                (
                    format!("({marked} OR (`published_at` IS NULL AND {seq} <= ? AND {occurred_at} < ?))"),
                    vec![Value::from(cutoff.as_str()), Value::from(through), Value::from(cutoff.as_str())],
                )
            }
        };
        let mut after: Option<Value> = None;
        loop {
            let select = format!(
                "SELECT {id} FROM {t} WHERE {published}{not_held}{keyset} ORDER BY {id} LIMIT {batch}",
                t = table.quoted(),
                keyset = if after.is_some() { format!(" AND {id} > ?") } else { String::new() },
            );
            let mut params = published_params.clone();
            params.extend(held_params.iter().cloned());
            params.extend(after.clone());
            let ids: Vec<Value> = conn
                .exec(select, params)
                .await
                .map_err(|e| classify_mysql(&e).context(format_args!("selecting published rows of {table}")))?;
            let Some(last) = ids.last().cloned() else { break };
            let n = ids.len() as u64;
            if let Some(deleter) = deleter.as_mut() {
                let placeholders = vec!["?"; ids.len()].join(", ");
                // The bound again: only rows that are still published that long ago.
                let delete =
                    format!("DELETE FROM {t} WHERE {id} IN ({placeholders}) AND {published}", t = table.quoted());
                let mut params = ids;
                params.extend(published_params.iter().cloned());
                deleter
                    .exec_drop(delete, params)
                    .await
                    .map_err(|e| classify_mysql(&e).context(format_args!("deleting from {table} (prune user)")))?;
                report.rows_deleted += deleter.affected_rows();
                report.batches += 1;
            } else {
                report.rows_deleted += n;
            }
            after = Some(last);
            if n < batch as u64 {
                break;
            }
            if deleter.is_some() && !pause.is_zero() {
                tokio::time::sleep(pause).await;
            }
        }
    }
    if let Some(c) = deleter {
        let _ = c.disconnect().await;
    }
    tracing::info!(rows = report.rows_deleted, batches = report.batches, dry_run = options.dry_run, "prune done");
    Ok(report)
}

/// Parses a retention such as `7d`, `36h`, `90m`, `45s` or `2w` (one number and one unit).
///
/// # Errors
/// A definite error naming the accepted forms.
pub fn parse_age(text: &str) -> Result<Duration> {
    let bad = || Error::definite(format!("{text:?} is not an age: write a number and a unit, e.g. 7d, 36h, 90m, 45s"));
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number.parse().map_err(|_| bad())?;
    let seconds = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        "w" => 7 * 86_400,
        _ => return Err(bad()),
    };
    n.checked_mul(seconds).map(Duration::from_secs).ok_or_else(bad)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::Checkpoint;
    use crate::position::snapshot::SnapshotState;
    use crate::position::ServerIdentity;
    use crate::position::{BinlogCoord, Flavor};

    fn config(state_dir: &std::path::Path) -> Config {
        let text = format!(
            "[source]\nhost = \"127.0.0.1\"\nuser = \"cdc\"\nserver_id = 5401\n\
             [outbox]\ntable = \"shop.outbox_events\"\n[kafka]\nbootstrap_servers = \"127.0.0.1:9092\"\n\
             [state]\ndir = {:?}\n",
            state_dir.to_str().unwrap()
        );
        Config::parse(&text).unwrap()
    }

    fn server(server_id: u32) -> ServerIdentity {
        ServerIdentity { flavor: Flavor::MariaDb, server_id, server_uuid: None, binlog_files: false }
    }

    fn store_checkpoint(dir: &std::path::Path, server_id: u32, snapshot: Option<SnapshotState>) {
        let checkpoint = Checkpoint::for_test(pos(maria("0-1-42"), "b.000001", 4), server(server_id), snapshot);
        Store::open(dir).unwrap().save_for_test(&checkpoint).unwrap();
    }

    /// The refusals that keep prune from trusting a checkpoint that proves nothing about these rows: each
    /// is definite (an operator must act) and happens before any row is read.
    #[tokio::test]
    async fn unusable_checkpoints_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let config = config(dir.path());
        let err = usable_checkpoint(&config, &server(1)).await.unwrap_err();
        assert!(err.is_definite() && err.to_string().contains("no checkpoint"), "{err}");

        store_checkpoint(dir.path(), 2, None);
        let err = usable_checkpoint(&config, &server(1)).await.unwrap_err();
        assert!(err.is_definite() && err.to_string().contains("belongs to"), "{err}");
        assert_eq!(usable_checkpoint(&config, &server(2)).await.unwrap(), pos(maria("0-1-42"), "b.000001", 4));

        let cut = pos(maria("0-1-40"), "b.000001", 4);
        let unfinished = SnapshotState {
            added: false,
            segments: vec![crate::position::snapshot::Segment { view: cut, after: None }],
            last_key: None,
            rows_done: 10,
            rows_estimate: 100,
            done: false,
            tables: vec!["shop.outbox_events".into()],
        };
        store_checkpoint(dir.path(), 2, Some(unfinished.clone()));
        let err = usable_checkpoint(&config, &server(2)).await.unwrap_err();
        assert!(err.is_definite() && err.to_string().contains("snapshot is not finished"), "{err}");
        store_checkpoint(dir.path(), 2, Some(SnapshotState { done: true, ..unfinished }));
        usable_checkpoint(&config, &server(2)).await.expect("a finished snapshot is fine");
    }

    fn pos(gtids: Gtids, file: &str, at: u64) -> Position {
        Position { gtids, coord: BinlogCoord { file: file.into(), pos: at } }
    }

    fn maria(text: &str) -> Gtids {
        Gtids::MariaDb(text.parse().unwrap())
    }

    fn mysql(text: &str) -> Gtids {
        Gtids::MySql(text.parse().unwrap())
    }

    const U1: &str = "3e11fa47-71ca-11e1-9e33-c80aa9429562";
    const U2: &str = "4e11fa47-71ca-11e1-9e33-c80aa9429562";

    /// One row per rule: (checkpoint, cut, covered?).
    #[test]
    fn checkpoint_covers_the_cut_only_when_it_contains_it() {
        let cases = [
            // MariaDB: per domain, sequence numbers; equal is covered.
            (maria("0-1-10"), maria("0-1-10"), Some(true)),
            (maria("0-1-11"), maria("0-1-10"), Some(true)),
            (maria("0-1-9"), maria("0-1-10"), Some(false)),
            // A domain the checkpoint never saw is not covered.
            (maria("0-1-10"), maria("0-1-10,1-1-1"), Some(false)),
            (maria("0-1-10,1-1-1"), maria("0-1-10"), Some(true)),
            // An empty cut (a server without transactions) is covered by anything.
            (maria("0-1-1"), maria(""), Some(true)),
            // MySQL: subset.
            (mysql(&format!("{U1}:1-10")), mysql(&format!("{U1}:1-10")), Some(true)),
            (mysql(&format!("{U1}:1-9")), mysql(&format!("{U1}:1-10")), Some(false)),
            (mysql(&format!("{U1}:1-10")), mysql(&format!("{U1}:1-10,{U2}:1")), Some(false)),
            (mysql(&format!("{U1}:1-10,{U2}:1-3")), mysql(&format!("{U1}:1-10,{U2}:1")), Some(true)),
            // Different kinds never compare.
            (maria("0-1-10"), mysql(&format!("{U1}:1")), None),
            (Gtids::None, maria("0-1-1"), None),
        ];
        for (checkpoint, cut, expected) in cases {
            let (p, c) = (pos(checkpoint, "b.000001", 4), pos(cut, "b.000001", 4));
            assert_eq!(checkpoint_covers(&p, &c), expected, "checkpoint {p}, cut {c}");
        }
        // Without GTIDs: binlog coordinates, numeric suffix order.
        let p = pos(Gtids::None, "b.000002", 100);
        assert_eq!(checkpoint_covers(&p, &pos(Gtids::None, "b.000002", 100)), Some(true));
        assert_eq!(checkpoint_covers(&p, &pos(Gtids::None, "b.000001", 900)), Some(true));
        assert_eq!(checkpoint_covers(&p, &pos(Gtids::None, "b.000002", 101)), Some(false));
    }

    #[test]
    fn ages_parse_with_one_unit() {
        assert_eq!(parse_age("7d").unwrap(), Duration::from_secs(7 * 86_400));
        assert_eq!(parse_age("36h").unwrap(), Duration::from_secs(36 * 3_600));
        assert_eq!(parse_age("90m").unwrap(), Duration::from_secs(90 * 60));
        assert_eq!(parse_age("0s").unwrap(), Duration::ZERO);
        assert_eq!(parse_age("2w").unwrap(), Duration::from_secs(14 * 86_400));
        for bad in ["", "7", "d", "7 days", "-1d", "1.5h", "7D", "99999999999999999999w"] {
            assert!(parse_age(bad).is_err(), "{bad:?}");
        }
    }
}
