//! The initial snapshot: rows already in the outbox table, handed over to the binlog stream at an exact
//! position.
//!
//! # The cut
//! The snapshot reads the table inside one `START TRANSACTION WITH CONSISTENT SNAPSHOT` and learns the
//! binlog position that is exactly consistent with that read view (the *cut*). The stream then starts at
//! the cut: a row committed before it is in the view and emitted by the snapshot; a row committed after it
//! is not in the view and emitted by the stream. Every row exactly once, without holding a lock for the
//! scan.
//! - MariaDB: the consistent-snapshot transaction itself reports its binlog coordinate
//!   (`binlog_snapshot_file` / `binlog_snapshot_position`), converted with `BINLOG_GTID_POS()`. No lock.
//! - MySQL: a brief lock makes the GTID read and the transaction start atomic with respect to writers of
//!   the outbox table: lock, `START TRANSACTION WITH CONSISTENT SNAPSHOT`, read `@@gtid_executed`, unlock;
//!   then scan. `snapshot.lock` chooses `LOCK TABLES … READ` on the outbox tables (default: works on
//!   managed MySQL, where FLUSH TABLES WITH READ LOCK is not allowed), or `FLUSH TABLES WITH READ LOCK`.
//!   Transactions that do not touch the outbox may commit between the lock and the GTID read: they carry
//!   no outbox rows, so where the stream starts relative to them does not matter.
//!
//! # Order and memory
//! Rows are scanned in keyset chunks along `(aggregate_type, aggregate_id, occurred_at, id)` (the
//! `idx_aggregate` index plus the primary key InnoDB appends to it), `snapshot.chunk_rows` at a time: one
//! aggregate's rows come out in `occurred_at` order, ties by id, and all of them before any streamed event
//! of that aggregate. Never OFFSET, never the whole table in memory.
//!
//! # Resuming after a crash (the overlap rule)
//! Progress is checkpointed as the last *acknowledged* key. The original read view is gone after a crash,
//! so the scan resumes in a new view `V2` from that key. The snapshot is then a list of *segments*: segment
//! `i` covers the keys after `after_i` (up to the next segment's `after`) as seen in view `V_i`. The stream
//! still starts at the original cut `V_1`, and for every outbox row it reads, at position `p` with key `k`:
//!
//! > the row was already emitted iff the segment whose key range holds `k` has a view that contains `p`.
//!
//! Rows of a resumed segment's range committed before its view were scanned; rows committed after it, or
//! with keys in an earlier segment's range, were not, and the stream emits them. The rule lives in
//! [`super::overlap`]. Keys are compared in each column's own type and collation ([`super::key_order`]):
//! the scan's `WHERE key > after` and the rule use the same typed expressions, so they agree with each
//! other and with `ORDER BY`. Once the stream has passed every segment's view, the rule can never skip
//! again and is dropped.
//!
//! A resumed snapshot must scan the same tables: keys name their table, and the state lists the tables
//! in scan order ([`SnapshotState::check_tables`] refuses a changed list with the fix).
//!
//! **The one assumption:** outbox rows are not deleted or re-keyed before they are checkpointed (the
//! cleanup job deletes only rows whose events are acknowledged). A row deleted between two views would be
//! in neither.
//!
//! Re-emitted on resume: only the unacknowledged in-flight rows after the last checkpointed key.

use std::fmt::Write as _;
use std::sync::Arc;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row};
use serde::{Deserialize, Serialize};

use super::decode::format_datetime;
use super::key_order::KeyColumns;
use super::{ServerInfo, SourceConn};
use crate::config::{ColumnNames, Config, SnapshotLock};
use crate::error::{classify_mysql, Error, Result};
use crate::outbox::{quote_ident, OutboxRow, TableName};
use crate::position::{BinlogCoord, Flavor, Gtids, Position};

/// A row's place in the scan order.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SnapshotKey {
    /// The table being scanned.
    pub table: KeyTable,
    /// `aggregate_type`.
    pub aggregate_type: String,
    /// `aggregate_id`.
    pub aggregate_id: String,
    /// `occurred_at` as the server prints it (`YYYY-MM-DD HH:MM:SS[.ffffff]`).
    pub occurred_at: String,
    /// Event id.
    pub id: String,
}

impl SnapshotKey {
    /// The key of `row` of `table`.
    pub fn of(table: &TableName, row: &OutboxRow) -> SnapshotKey {
        SnapshotKey {
            table: KeyTable::of(table),
            aggregate_type: row.aggregate_type.clone(),
            aggregate_id: row.aggregate_id.clone(),
            // Back to the server's text: decoding turned its one space into the ISO `T`.
            occurred_at: row.occurred_at.replacen('T', " ", 1),
            id: row.id.clone(),
        }
    }

    /// The four key columns' values, in scan order.
    pub fn columns(&self) -> [&str; 4] {
        [&self.aggregate_type, &self.aggregate_id, &self.occurred_at, &self.id]
    }
}

/// Which table a [`SnapshotKey`] belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum KeyTable {
    /// `database.table`, as the snapshot scanned it.
    Name(String),
    /// Written by earlier versions: the table's place in the configured (sorted) table list, which shifts
    /// when a table is added or removed. Accepted only while exactly one table is configured
    /// ([`SnapshotState::check_tables`]).
    Index(usize),
}

impl KeyTable {
    /// The key's table for `table`.
    pub fn of(table: &TableName) -> KeyTable {
        KeyTable::Name(table.to_string())
    }

    /// The table's place in `tables`.
    ///
    /// # Errors
    /// A definite error when the table is not among them.
    pub fn index_in<T: std::borrow::Borrow<TableName>>(&self, tables: &[T]) -> Result<usize> {
        let found = match self {
            KeyTable::Name(name) => tables.iter().position(|t| t.borrow().to_string() == *name),
            KeyTable::Index(i) => Some(*i).filter(|i| *i < tables.len()),
        };
        found.ok_or_else(|| {
            Error::definite(format!(
                "the unfinished snapshot was scanning outbox table {self}, which is no longer configured: put it \
                 back in [outbox] until the snapshot is done, or delete the state directory to snapshot again"
            ))
        })
    }
}

impl std::fmt::Display for KeyTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyTable::Name(name) => f.write_str(name),
            KeyTable::Index(i) => write!(f, "number {i} (a checkpoint of an earlier version)"),
        }
    }
}

/// A range of keys scanned in one read view.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    /// Position consistent with the read view.
    pub view: Position,
    /// The segment covers keys after this one (`None`: from the start).
    pub after: Option<SnapshotKey>,
}

/// Snapshot progress, stored with the checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotState {
    /// Segments in key order; the first one's view is the cut where the stream starts.
    pub segments: Vec<Segment>,
    /// Last key whose row (and every earlier one) Kafka acknowledged.
    pub last_key: Option<SnapshotKey>,
    /// Rows acknowledged so far.
    pub rows_done: u64,
    /// Estimated rows in total (from the server's statistics at the start).
    pub rows_estimate: u64,
    /// Every row was scanned and acknowledged; only the overlap rule is still in force.
    pub done: bool,
    /// The outbox tables as `database.table`, in scan order. Empty in checkpoints of earlier versions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tables: Vec<String>,
}

impl SnapshotState {
    /// The cut: where the stream starts.
    pub fn cut(&self) -> &Position {
        &self.segments[0].view
    }

    /// Refuses to resume an unfinished snapshot over other tables than it started with: a table added
    /// before the one being scanned would never be scanned, a removed one would shift the rest.
    ///
    /// # Errors
    /// A definite error naming both lists and the fix.
    pub fn check_tables(&self, configured: &[TableName]) -> Result<()> {
        let configured: Vec<String> = configured.iter().map(ToString::to_string).collect();
        let legacy_single = self.tables.is_empty() && configured.len() == 1;
        if self.tables == configured || legacy_single {
            return Ok(());
        }
        let started = if self.tables.is_empty() {
            "an unknown list (the checkpoint was written by an earlier version, which did not store it)".to_string()
        } else {
            self.tables.join(", ")
        };
        Err(Error::definite(format!(
            "the unfinished snapshot started over the outbox tables {started}, but [outbox] now configures {}: \
             restore the configuration until the snapshot is done (`outbox-cdc status` shows its progress), or \
             delete the state directory to snapshot the new list from the start",
            configured.join(", ")
        )))
    }

    /// The tables the snapshot scanned, in scan order; `configured` for checkpoints that did not store them.
    pub fn tables_or(&self, configured: Vec<TableName>) -> Vec<TableName> {
        let stored: Option<Vec<TableName>> = self.tables.iter().map(|t| TableName::parse(t).ok()).collect();
        stored.filter(|t| !t.is_empty()).unwrap_or(configured)
    }
}

#[cfg(test)]
mod table_list_tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<TableName> {
        list.iter().map(|t| TableName::parse(t).unwrap()).collect()
    }

    fn state(tables: &[&str]) -> SnapshotState {
        SnapshotState {
            segments: Vec::new(),
            last_key: None,
            rows_done: 0,
            rows_estimate: 0,
            done: false,
            tables: tables.iter().map(ToString::to_string).collect(),
        }
    }

    /// Guards against resuming an unfinished snapshot by a table's place in a list that changed: a table
    /// added before the current one was never scanned, one removed shifted the rest.
    #[test]
    fn a_resumed_snapshot_needs_the_table_list_it_started_with() {
        #[rustfmt::skip]
        let cases: [(&[&str], &[&str], bool); 6] = [
            (&["shop.outbox"], &["shop.outbox"], true),
            (&["a.o", "b.o"], &["a.o", "b.o"], true),
            (&["b.o"], &["a.o", "b.o"], false),
            (&["a.o", "b.o"], &["b.o"], false),
            (&[], &["shop.outbox"], true),
            (&[], &["a.o", "b.o"], false),
        ];
        for (stored, configured, ok) in cases {
            let result = state(stored).check_tables(&names(configured));
            assert_eq!(result.is_ok(), ok, "{stored:?} -> {configured:?}: {result:?}");
            if let Err(e) = result {
                assert!(e.to_string().contains("restore the configuration"), "{e}");
            }
        }
    }

    /// Keys name their table; keys stored by earlier versions (an index) still load.
    #[test]
    fn key_tables_are_names_and_legacy_indexes_still_load() {
        let tables = names(&["a.o", "b.o"]);
        let named: SnapshotKey = serde_json::from_str(
            r#"{"table":"b.o","aggregate_type":"t","aggregate_id":"1","occurred_at":"x","id":"i"}"#,
        )
        .unwrap();
        assert_eq!(named.table.index_in(&tables).unwrap(), 1);
        let legacy: SnapshotKey =
            serde_json::from_str(r#"{"table":0,"aggregate_type":"t","aggregate_id":"1","occurred_at":"x","id":"i"}"#)
                .unwrap();
        assert_eq!(legacy.table, KeyTable::Index(0));
        assert_eq!(serde_json::to_value(&named.table).unwrap(), serde_json::json!("b.o"));
        let gone = KeyTable::Name("c.o".into()).index_in(&tables).unwrap_err();
        assert!(gone.to_string().contains("no longer configured"), "{gone}");
        let legacy_state: SnapshotState =
            serde_json::from_str(r#"{"segments":[],"last_key":null,"rows_done":0,"rows_estimate":0,"done":false}"#)
                .unwrap();
        assert!(legacy_state.tables.is_empty());
    }
}

/// Rows of one keyset query, in scan order.
#[derive(Debug)]
pub struct Chunk {
    /// The rows.
    pub rows: Vec<OutboxRow>,
    /// The key of the last one: the scan continues after it.
    pub last_key: SnapshotKey,
}

/// Reads the outbox tables inside one consistent-snapshot transaction.
pub struct Scanner {
    conn: Conn,
    tables: Vec<Arc<TableName>>,
    columns: ColumnNames,
    filter: Option<String>,
    chunk_rows: usize,
    /// Next table to scan, and the key to continue after.
    table: usize,
    after: Option<SnapshotKey>,
    /// The current table's optional `headers` column and key column types: (table index, present, keys).
    table_info: Option<(usize, bool, KeyColumns)>,
}

/// Opens a consistent read view and returns it with its exact binlog position.
///
/// # Errors
/// Classified query errors; a definite error when the server cannot report the position.
pub async fn open(
    source: &SourceConn,
    info: &ServerInfo,
    config: &Config,
    after: Option<SnapshotKey>,
) -> Result<(Scanner, Position)> {
    let tables: Vec<Arc<TableName>> = config.outbox_tables()?.into_iter().map(Arc::new).collect();
    let mut conn = source.connect().await?;
    let q = |e: mysql_async::Error| classify_mysql(&e).context("opening the snapshot transaction");
    conn.query_drop("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ").await.map_err(q)?;
    let position = match info.identity.flavor {
        Flavor::MariaDb => {
            conn.query_drop("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY").await.map_err(q)?;
            let status: Vec<(String, String)> = conn.query("SHOW STATUS LIKE 'binlog_snapshot_%'").await.map_err(q)?;
            let get = |name: &str| status.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.clone());
            let file = get("binlog_snapshot_file").filter(|f| !f.is_empty()).ok_or_else(|| {
                Error::definite("the server reports no binlog_snapshot_file: binary logging (log_bin) is OFF")
            })?;
            let pos: u64 = get("binlog_snapshot_position").and_then(|p| p.parse().ok()).unwrap_or(4);
            let coord = BinlogCoord { file, pos };
            let gtids = match config.source.resume_by {
                crate::config::ResumeBy::File => Gtids::None,
                crate::config::ResumeBy::Gtid => Gtids::MariaDb(super::mariadb_gtid_at(&mut conn, &coord).await?),
            };
            Position { gtids, coord }
        }
        Flavor::MySql => {
            // Lock on a second connection: START TRANSACTION would release the lock on its own one.
            let mut lock = source.connect().await?;
            let lock_sql = match config.snapshot.lock {
                SnapshotLock::Tables => {
                    let list: Vec<String> = tables.iter().map(|t| format!("{} READ", t.quoted())).collect();
                    format!("LOCK TABLES {}", list.join(", "))
                }
                SnapshotLock::Global => "FLUSH TABLES WITH READ LOCK".to_string(),
            };
            take_lock(&mut lock, &lock_sql, config.snapshot.lock_wait_timeout_s).await?;
            let opened = async {
                conn.query_drop("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY").await.map_err(q)?;
                super::current_position(&mut conn, info, config.source.resume_by).await
            }
            .await;
            lock.query_drop("UNLOCK TABLES").await.map_err(q)?;
            drop(lock);
            opened?
        }
    };
    let table = after.as_ref().map(|k| k.table.index_in(&tables)).transpose()?.unwrap_or(0);
    Ok((
        Scanner {
            conn,
            tables,
            columns: config.outbox.columns.clone(),
            filter: config.snapshot.r#where.clone(),
            chunk_rows: config.snapshot.chunk_rows,
            table,
            after,
            table_info: None,
        },
        position,
    ))
}

/// Takes the snapshot's brief MySQL lock (`snapshot.lock`) on `conn`, waiting at most `timeout_s` seconds.
///
/// A `LOCK TABLES … READ` queues behind any open transaction that wrote to the outbox, and while it waits
/// every new outbox insert of the application queues behind *it*: with the server's default
/// `lock_wait_timeout` (one year) a forgotten transaction would stall the application. So the wait is
/// bounded; giving up is transient, and the run is retried from the checkpoint with back-off.
///
/// # Errors
/// A transient error when the wait timed out (saying so and why), classified query errors otherwise.
pub async fn take_lock(conn: &mut Conn, lock_sql: &str, timeout_s: u32) -> Result<()> {
    const ER_LOCK_WAIT_TIMEOUT: u16 = 1205;
    conn.query_drop(format!("SET SESSION lock_wait_timeout = {}", timeout_s.max(1)))
        .await
        .map_err(|e| classify_mysql(&e).context("bounding the snapshot lock's wait (lock_wait_timeout)"))?;
    conn.query_drop(lock_sql).await.map_err(|e| match &e {
        mysql_async::Error::Server(server) if server.code == ER_LOCK_WAIT_TIMEOUT => Error::transient(format!(
            "`{lock_sql}` (snapshot.lock) waited {timeout_s} s (snapshot.lock_wait_timeout_s) behind a transaction \
             that holds the outbox table open, and gave up so as not to block the application's outbox inserts \
             any longer; retrying with back-off. If this repeats, look for a long-running transaction on the \
             outbox table (information_schema.innodb_trx)"
        )),
        _ => classify_mysql(&e).context(format_args!(
            "`{lock_sql}` (snapshot.lock): grant LOCK TABLES on the outbox tables, or choose another lock"
        )),
    })
}

impl Scanner {
    /// Estimated rows to scan (server statistics; exact for small tables).
    ///
    /// # Errors
    /// Classified query errors.
    pub async fn estimate_rows(&mut self) -> Result<u64> {
        let mut total = 0;
        for t in &self.tables {
            let rows: Option<Option<u64>> = self
                .conn
                .exec_first(
                    "SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
                    (&t.database, &t.table),
                )
                .await
                .map_err(|e| classify_mysql(&e))?;
            total += rows.flatten().unwrap_or(0);
        }
        Ok(total)
    }

    /// The next chunk of rows in key order; `None` when the snapshot is complete.
    ///
    /// # Errors
    /// Classified query errors; definite errors for rows that cannot be decoded.
    pub async fn next_chunk(&mut self) -> Result<Option<Chunk>> {
        while self.table < self.tables.len() {
            let rows = self.query_chunk().await?;
            let Some(last) = rows.last() else {
                self.table += 1;
                self.after = None;
                continue;
            };
            let last_key = SnapshotKey::of(&self.tables[self.table], last);
            self.after = Some(last_key.clone());
            return Ok(Some(Chunk { rows, last_key }));
        }
        Ok(None)
    }

    /// Runs the next keyset query and decodes its rows as they arrive.
    async fn query_chunk(&mut self) -> Result<Vec<OutboxRow>> {
        let headers = self.columns.headers.clone();
        let table = self.tables[self.table].clone();
        if self.table_info.as_ref().is_none_or(|(t, _, _)| *t != self.table) {
            let present = self.has_column(&headers).await?;
            let keys = KeyColumns::load(&mut self.conn, &table, &self.columns).await?;
            self.table_info = Some((self.table, present, keys));
        }
        let (_, has_headers, keys) = self.table_info.as_ref().expect("loaded above");
        let has_headers = *has_headers;
        let c = &self.columns;
        let key_cols = [&c.aggregate_type, &c.aggregate_id, &c.occurred_at, &c.id].map(|n| quote_ident(n));
        let mut sql = format!(
            "SELECT {}, {}, {}, {}, {}, {}, {}, {} FROM {}",
            key_cols[0],
            key_cols[1],
            key_cols[2],
            key_cols[3],
            quote_ident(&c.event_type),
            quote_ident(&c.schema_version),
            quote_ident(&c.payload),
            if has_headers { quote_ident(&headers) } else { "NULL".into() },
            &table.quoted()
        );
        let mut conditions = Vec::new();
        if let Some(filter) = &self.filter {
            conditions.push(format!("({filter})"));
        }
        let mut params: Vec<mysql_async::Value> = Vec::new();
        if let Some(after) = self.after.as_ref().filter(|k| k.table == KeyTable::of(&table)) {
            // Expanded form of (a, b, c, d) > (?, ?, ?, ?): every optimizer turns it into an index range.
            // Each value is typed as its column (key_order): the order of `ORDER BY`, not of the text.
            let [pa, pb, pc, pd] = keys.columns.each_ref().map(|(_, t)| t.param_sql());
            conditions.push(format!(
                "({a} > {pa} OR ({a} = {pa} AND ({b} > {pb} OR ({b} = {pb} AND ({c} > {pc} OR ({c} = {pc} AND {d} > {pd}))))))",
                a = key_cols[0],
                b = key_cols[1],
                c = key_cols[2],
                d = key_cols[3]
            ));
            let [va, vb, vc, vd] = keys.params(after.columns())?;
            params.extend([va.clone(), va, vb.clone(), vb, vc.clone(), vc, vd]);
        }
        if !conditions.is_empty() {
            let _ = write!(sql, " WHERE {}", conditions.join(" AND "));
        }
        let _ = write!(sql, " ORDER BY {} LIMIT {}", key_cols.join(", "), self.chunk_rows);
        let failed = |e: mysql_async::Error| classify_mysql(&e).context(format_args!("snapshot scan of {table}"));
        let capacity = self.chunk_rows.min(4096);
        if params.is_empty() {
            decode_all(self.conn.query_iter(sql).await.map_err(failed)?, &table, capacity).await
        } else {
            decode_all(self.conn.exec_iter(sql, params).await.map_err(failed)?, &table, capacity).await
        }
    }

    async fn has_column(&mut self, name: &str) -> Result<bool> {
        let table = &self.tables[self.table];
        let found: Option<u8> = self
            .conn
            .exec_first(
                "SELECT 1 FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? AND COLUMN_NAME = ?",
                (&table.database, &table.table, name),
            )
            .await
            .map_err(|e| classify_mysql(&e))?;
        Ok(found.is_some())
    }

    /// Scans on a task of its own, one chunk ahead of the caller: the server runs the next keyset query
    /// while the caller produces the current chunk. At most three chunks are in memory (one being read, one
    /// waiting, one with the caller). The read view ends when the scan is complete or the result is dropped.
    pub fn prefetch(mut self) -> Prefetch {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let task = tokio::spawn(async move {
            loop {
                let next = self.next_chunk().await;
                let more = matches!(next, Ok(Some(_)));
                if tx.send(next).await.is_err() || !more {
                    break;
                }
            }
            self.close().await;
        });
        Prefetch { rx, task }
    }

    /// The connection that holds the read view, for callers that run their own queries in the same view
    /// (`prune` selects the rows its proof covers through it).
    pub fn view_conn(&mut self) -> &mut Conn {
        &mut self.conn
    }

    /// Ends the read view.
    pub async fn close(mut self) {
        let _ = self.conn.query_drop("COMMIT").await;
        let _ = self.conn.disconnect().await;
    }
}

/// Decodes a chunk's rows as they arrive.
async fn decode_all<P: mysql_async::prelude::Protocol>(
    mut result: mysql_async::QueryResult<'_, 'static, P>,
    table: &Arc<TableName>,
    capacity: usize,
) -> Result<Vec<OutboxRow>> {
    let mut rows = Vec::with_capacity(capacity);
    while let Some(row) =
        result.next().await.map_err(|e| classify_mysql(&e).context(format_args!("snapshot scan of {table}")))?
    {
        rows.push(decode(table, row)?);
    }
    Ok(rows)
}

/// Decodes one scanned row (columns in the order of [`Scanner::query_chunk`]'s SELECT), moving its values.
///
/// The first chunk's plain query returns every value as text; the later chunks' prepared statements return
/// typed values. A DATETIME (`occurred_at`) is written like the stream writes it, with the column's declared
/// fractional digits, so an event's `occurred_at` does not depend on how it was read.
fn decode(table: &Arc<TableName>, mut row: Row) -> Result<OutboxRow> {
    let mut text = |i: usize, what: &str| -> Result<Option<String>> {
        match row.take::<mysql_async::Value, _>(i) {
            None | Some(mysql_async::Value::NULL) => Ok(None),
            Some(mysql_async::Value::Bytes(b)) => String::from_utf8(b)
                .map(Some)
                .map_err(|_| Error::definite(format!("snapshot of {table}: column {what} is not valid UTF-8"))),
            Some(mysql_async::Value::Date(y, mo, d, h, mi, s, us)) => {
                let fsp = row.columns_ref().get(i).map_or(0, |c| c.decimals());
                Ok(Some(format_datetime(y, mo, d, h, mi, s, us, fsp)))
            }
            Some(other) => Ok(Some(other.as_sql(true).trim_matches('\'').to_string())),
        }
    };
    let id = need(text(3, "id")?, table, "id")?;
    let mut occurred_at = need(text(2, "occurred_at")?, table, "occurred_at")?;
    let version = need(text(5, "schema_version")?, table, "schema_version")?;
    let schema_version = version.parse::<u16>().map_err(|_| {
        Error::definite(format!("outbox row id={id} in {table}: schema_version {version} is not in 0..=65535"))
    })?;
    if let Some(space) = occurred_at.find(' ') {
        occurred_at.replace_range(space..=space, "T");
    }
    Ok(OutboxRow {
        table: table.clone(),
        aggregate_type: need(text(0, "aggregate_type")?, table, "aggregate_type")?,
        aggregate_id: need(text(1, "aggregate_id")?, table, "aggregate_id")?,
        event_type: need(text(4, "event_type")?, table, "event_type")?,
        schema_version,
        payload: need(text(6, "payload")?, table, "payload")?,
        headers: text(7, "headers")?,
        occurred_at,
        id,
        from_snapshot: true,
    })
}

/// A column that must not be NULL.
fn need(value: Option<String>, table: &TableName, what: &str) -> Result<String> {
    value.ok_or_else(|| Error::definite(format!("snapshot of {table}: column {what} is NULL")))
}

/// A [`Scanner`] running one chunk ahead ([`Scanner::prefetch`]).
pub struct Prefetch {
    rx: tokio::sync::mpsc::Receiver<Result<Option<Chunk>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Prefetch {
    /// As [`Scanner::next_chunk`]. Cancel-safe.
    ///
    /// # Errors
    /// The scanner's errors.
    pub async fn next_chunk(&mut self) -> Result<Option<Chunk>> {
        self.rx.recv().await.unwrap_or_else(|| Err(Error::transient("the snapshot scan task stopped unexpectedly")))
    }
}

impl Drop for Prefetch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use mysql_common::constants::ColumnType;
    use mysql_common::packets::Column;
    use mysql_common::value::Value;

    use super::*;

    /// A scanned row as the SELECT returns it, with `occurred_at` as given and declared with `fsp` digits.
    fn scanned(occurred_at: Value, fsp: u8) -> Row {
        let text = || Column::new(ColumnType::MYSQL_TYPE_VAR_STRING);
        let columns: Arc<[Column]> = Arc::from(vec![
            text(),
            text(),
            Column::new(ColumnType::MYSQL_TYPE_DATETIME).with_decimals(fsp),
            text(),
            text(),
            Column::new(ColumnType::MYSQL_TYPE_SHORT),
            text(),
            text(),
        ]);
        let values = vec![
            Value::Bytes(b"order".to_vec()),
            Value::Bytes(b"order-1".to_vec()),
            occurred_at,
            Value::Bytes(b"7c1f2b9e-0000-4000-8000-000000000001".to_vec()),
            Value::Bytes(b"OrderCreated".to_vec()),
            Value::UInt(3),
            Value::Bytes(br#"{"total":"45.48"}"#.to_vec()),
            Value::NULL,
        ];
        mysql_common::row::new_row(values, columns)
    }

    #[test]
    fn occurred_at_reads_the_same_from_text_and_binary_rows() {
        let table = Arc::new(TableName { database: "shop".into(), table: "outbox_events".into() });
        let cases = [
            (Value::Bytes(b"2026-01-02 03:04:05.000000".to_vec()), 6, "2026-01-02T03:04:05.000000"),
            (Value::Date(2026, 1, 2, 3, 4, 5, 0), 6, "2026-01-02T03:04:05.000000"),
            (Value::Bytes(b"2026-01-02 03:04:05.120".to_vec()), 3, "2026-01-02T03:04:05.120"),
            (Value::Date(2026, 1, 2, 3, 4, 5, 120_000), 3, "2026-01-02T03:04:05.120"),
            (Value::Bytes(b"2026-01-02 03:04:05".to_vec()), 0, "2026-01-02T03:04:05"),
            (Value::Date(2026, 1, 2, 3, 4, 5, 0), 0, "2026-01-02T03:04:05"),
        ];
        for (value, fsp, expected) in cases {
            let row = decode(&table, scanned(value.clone(), fsp)).unwrap();
            assert_eq!(row.occurred_at, expected, "{value:?} with {fsp} digits");
            assert_eq!((row.schema_version, row.headers.as_deref()), (3, None));
            assert!(row.from_snapshot);
        }
    }

    #[test]
    fn null_occurred_at_is_a_definite_error() {
        let table = Arc::new(TableName { database: "shop".into(), table: "outbox_events".into() });
        let err = decode(&table, scanned(Value::NULL, 6)).unwrap_err();
        assert!(err.to_string().contains("occurred_at is NULL"), "{err}");
    }
}
