//! The initial snapshot: rows already in the outbox table, handed over to the binlog stream at an exact
//! position.
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2 (vocabulary, error, metrics, config).
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
//! Each table is read by one query, `ORDER BY (aggregate_type, aggregate_id, occurred_at, id)` without a
//! LIMIT, streamed row by row from the server and cut into chunks of `snapshot.chunk_rows` here: one
//! aggregate's rows come out in `occurred_at` order, ties by id, and all of them before any streamed event
//! of that aggregate. With an index that starts with those columns the server walks it (`FORCE INDEX`:
//! without a LIMIT the optimizer would rather sort); without one it sorts the table once, then streams.
//! At most three chunks are in memory; when Kafka holds the caller back, the socket fills and the server
//! waits (`net_write_timeout` is raised to the session's `wait_timeout` for that). Never OFFSET, never
//! the whole table in memory.
//!
//! # Why not keyset chunks
//! The scan was once a keyset query per chunk (`WHERE key > last ORDER BY key LIMIT chunk_rows`). With the
//! `(aggregate_type, aggregate_id, occurred_at)` index each chunk is an index range, but without it (a
//! table shaped like Debezium's) each chunk scanned and sorted the rest of the table: time grew with the
//! rows squared (1M rows: 465 s against 13.9 s). One sorted read is a single scan and sort on the server,
//! walked in index order when the index is there. The key is still what a crash resumes from.
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
//! in scan order ([`crate::position::snapshot::SnapshotState::check_tables`] refuses a changed list with the fix).
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

use super::column_types::{uuid_text, TypeFamily};
use super::decode::format_datetime;
use super::key_order::{index_in_key_order, index_prefix, KeyColumns};
use super::{ServerInfo, SourceConn};
use crate::config::{ColumnNames, Config, PayloadEncoding, SnapshotLock};
use crate::error::{classify_mysql, Error, Result};
use crate::outbox::{quote_ident, ColumnValue, OutboxRow, Payload, SchemaVersion, TableName};
use crate::position::on_demand::{Slice, SnapshotRequest};
use crate::position::snapshot::{KeyTable, SnapshotKey};
use crate::position::{BinlogCoord, Flavor, Gtids, Position};

/// Rows of the scan, in key order: `snapshot.chunk_rows` of them (fewer at the end of a table).
#[derive(Debug)]
pub struct Chunk {
    /// The rows.
    pub rows: Vec<OutboxRow>,
    /// The key of the last one: a resumed scan continues after it.
    pub last_key: SnapshotKey,
}

/// Reads the outbox tables inside one consistent-snapshot transaction.
pub struct Scanner {
    conn: Conn,
    tables: Vec<Arc<TableName>>,
    columns: ColumnNames,
    filter: Option<String>,
    /// The parameters of `filter`'s placeholders (a snapshot on demand's slice).
    filter_params: Vec<mysql_async::Value>,
    /// A snapshot on demand's read: always prepared.
    on_demand: bool,
    chunk_rows: usize,
    /// First table to scan, and the key to continue after in it.
    table: usize,
    after: Option<SnapshotKey>,
}

/// Opens a consistent read view of `tables` and returns it with its exact binlog position.
///
/// # Errors
/// Classified query errors; a definite error when the server cannot report the position.
pub async fn open(
    source: &SourceConn,
    info: &ServerInfo,
    config: &Config,
    tables: &[TableName],
    after: Option<SnapshotKey>,
) -> Result<(Scanner, Position)> {
    let tables: Vec<Arc<TableName>> = tables.iter().cloned().map(Arc::new).collect();
    // A server connection (`source`) exists only for the kinds that have a `resume_by`.
    let resume_by = config.source.kind.resume_by().unwrap_or_default();
    let mut conn = source.connect().await?;
    let q = |e: mysql_async::Error| classify_mysql(&e).context("opening the snapshot transaction");
    conn.query_drop("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ").await.map_err(q)?;
    // The scan is one streamed query per table: while Kafka holds the caller back, the server waits to
    // write the next rows. Let it wait as long as an idle session may, not the default 60 s.
    conn.query_drop("SET SESSION net_write_timeout = @@SESSION.wait_timeout").await.map_err(q)?;
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
            let gtids = match resume_by {
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
                super::current_position(&mut conn, info, resume_by).await
            }
            .await;
            lock.query_drop("UNLOCK TABLES").await.map_err(q)?;
            drop(lock);
            opened?
        }
    };
    let table = after.as_ref().map(|k| k.table.index_in(&tables)).transpose().map_err(Error::definite)?.unwrap_or(0);
    Ok((
        Scanner {
            conn,
            tables,
            columns: config.outbox.columns.clone(),
            filter: config.snapshot.r#where.clone(),
            filter_params: Vec::new(),
            on_demand: false,
            chunk_rows: config.snapshot.chunk_rows,
            table,
            after,
        },
        position,
    ))
}

/// Opens the sorted read of `slice` of `table` for a snapshot on demand, from after `after`: the initial
/// snapshot's read ([`Scanner`], in key order, chunked), in a read view of its own with no position and no
/// lock. A snapshot on demand hands nothing over to the stream, which goes on where it is: it publishes
/// again what the slice holds.
///
/// # Errors
/// A definite error for a slice on `occurred_at` of a table without that column; classified query errors.
pub async fn open_slice(
    source: &SourceConn,
    config: &Config,
    table: &TableName,
    slice: &Slice,
    after: Option<SnapshotKey>,
) -> Result<Scanner> {
    let mut scanner = Scanner::of_slice(source, config, table, slice, after).await?;
    let q = |e: mysql_async::Error| classify_mysql(&e).context("opening a snapshot on demand's read");
    let conn = &mut scanner.conn;
    conn.query_drop("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ").await.map_err(q)?;
    conn.query_drop("SET SESSION net_write_timeout = @@SESSION.wait_timeout").await.map_err(q)?;
    conn.query_drop("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY").await.map_err(q)?;
    Ok(scanner)
}

/// Checks a snapshot on demand before it is stored, whoever asked (the API, the CLI, a signal): its table
/// is an outbox table, its `where` is not empty, and the server accepts its slice's read.
///
/// # Errors
/// A definite error saying what is wrong with the request; transient when the server cannot be reached.
pub async fn check_request(source: &SourceConn, config: &Config, request: &SnapshotRequest) -> Result<()> {
    let configured = config.tables();
    let named = &request.table;
    let parsed = TableName::parse(named).map_err(|e| Error::definite(format!("table {named:?}: {e}")))?;
    let Some(table) = configured.iter().find(|t| **t == parsed) else {
        let list = configured.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
        return Err(Error::definite(format!("{parsed} is not one of the outbox tables ([outbox] tables): {list}")));
    };
    if request.slice.condition.as_deref().is_some_and(|c| c.trim().is_empty()) {
        return Err(Error::definite("`where` is empty: leave it out to read every row"));
    }
    check_slice(source, config, table, &request.slice).await
}

/// Checks that the server accepts the read of `slice` of `table` (its `where` parses, its columns exist)
/// by preparing it, without reading a row: a request is refused when asked, not failed later.
///
/// # Errors
/// A definite error naming what the server said; transient when the server cannot be reached.
pub async fn check_slice(source: &SourceConn, config: &Config, table: &TableName, slice: &Slice) -> Result<()> {
    let mut scanner = Scanner::of_slice(source, config, table, slice, None).await?;
    let table = scanner.tables[0].clone();
    let present = present_roles(&mut scanner.conn, &table, &scanner.columns).await?;
    let keys = KeyColumns::load(&mut scanner.conn, &table, &scanner.columns).await?;
    let (sql, _) = scanner.scan_sql(&table, present, &keys, None, None)?;
    let statement = scanner.conn.prep(&sql).await.map_err(|e| match &e {
        mysql_async::Error::Server(server) => {
            Error::definite(format!("the server refuses the slice's read of {table}: {}", server.message))
        }
        _ => classify_mysql(&e).context(format_args!("checking the slice's read of {table}")),
    })?;
    let _ = scanner.conn.close(statement).await;
    let _ = scanner.conn.disconnect().await;
    Ok(())
}

/// The slice's conditions on `table` as SQL with `?` placeholders, and their values in order.
///
/// # Errors
/// A definite error for a window on `occurred_at` when the table has no such column.
async fn slice_sql(
    conn: &mut Conn,
    table: &TableName,
    columns: &ColumnNames,
    slice: &Slice,
) -> Result<(Option<String>, Vec<mysql_async::Value>)> {
    if (slice.occurred_from.is_some() || slice.occurred_before.is_some())
        // present_roles' slot 7 is occurred_at.
        && !present_roles(conn, table, columns).await?[7]
    {
        return Err(Error::definite(format!(
            "{table} has no `{}` column: a snapshot on demand cannot select an occurred_at window of it",
            columns.occurred_at
        )));
    }
    let mut conditions = Vec::new();
    let mut params = Vec::new();
    for (column, value, op) in [
        (&columns.aggregate_type, &slice.aggregate_type, "="),
        (&columns.aggregate_id, &slice.aggregate_id, "="),
        (&columns.occurred_at, &slice.occurred_from, ">="),
        (&columns.occurred_at, &slice.occurred_before, "<"),
    ] {
        if let Some(value) = value {
            conditions.push(format!("{} {op} ?", quote_ident(column)));
            params.push(mysql_async::Value::from(value.as_str()));
        }
    }
    if let Some(condition) = &slice.condition {
        conditions.push(format!("({condition})"));
    }
    Ok(((!conditions.is_empty()).then(|| conditions.join(" AND ")), params))
}

/// A scan's error: as [`classify_mysql`] says, except that a snapshot on demand's statement the server
/// refuses for good (its `where` names a column that is gone, no longer parses, names a table that is
/// gone) is definite: the snapshot fails, saying why, and the stream goes on, instead of a run retried for
/// ever on a statement that cannot run.
fn scan_error(error: &mysql_async::Error, on_demand: bool) -> Error {
    /// ER_BAD_FIELD_ERROR, ER_PARSE_ERROR, ER_NON_UNIQ_ERROR, ER_UNKNOWN_TABLE, ER_SP_DOES_NOT_EXIST,
    /// ER_WRONG_ARGUMENTS: the statement itself.
    const STATEMENT_REFUSED: [u16; 6] = [1054, 1064, 1052, 1109, 1305, 1210];
    match error {
        mysql_async::Error::Server(server) if on_demand && STATEMENT_REFUSED.contains(&server.code) => Error::definite(
            format!("the server refuses the snapshot's read ({} {}): {}", server.code, server.state, server.message),
        ),
        _ => classify_mysql(error),
    }
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
    /// The read of `slice` of `table` after `after`, on a new connection, before any statement of its own:
    /// what [`open_slice`] opens a read view for and [`check_slice`] prepares.
    async fn of_slice(
        source: &SourceConn,
        config: &Config,
        table: &TableName,
        slice: &Slice,
        after: Option<SnapshotKey>,
    ) -> Result<Scanner> {
        let mut conn = source.connect().await?;
        let (filter, filter_params) = slice_sql(&mut conn, table, &config.outbox.columns, slice).await?;
        Ok(Scanner {
            conn,
            tables: vec![Arc::new(table.clone())],
            columns: config.outbox.columns.clone(),
            filter,
            filter_params,
            on_demand: true,
            chunk_rows: config.snapshot.chunk_rows,
            table: 0,
            after,
        })
    }

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

    /// Streams every table's rows in key order into `tx`, in chunks of `snapshot.chunk_rows`. Returns
    /// `false` when the receiver is gone.
    async fn scan(&mut self, tx: &tokio::sync::mpsc::Sender<Result<Option<Chunk>>>) -> Result<bool> {
        for i in self.table..self.tables.len() {
            let table = self.tables[i].clone();
            let present = present_roles(&mut self.conn, &table, &self.columns).await?;
            let keys = KeyColumns::load(&mut self.conn, &table, &self.columns).await?;
            let names = keys.columns.each_ref().map(|(name, _)| name.as_str());
            let index = index_in_key_order(&mut self.conn, &table, &index_prefix(names)).await?;
            let after = self.after.take().filter(|k| k.table == KeyTable::of(&table));
            let (sql, params) = self.scan_sql(&table, present, &keys, index.as_deref(), after.as_ref())?;
            let on_demand = self.on_demand;
            let failed =
                |e: mysql_async::Error| scan_error(&e, on_demand).context(format_args!("snapshot scan of {table}"));
            let scan = Stream {
                table: &table,
                present,
                encoding: self.columns.payload_encoding(),
                chunk_rows: self.chunk_rows,
            };
            // A snapshot on demand's read is always a prepared statement: its `where` is one condition,
            // never a second statement.
            let open = match params.is_empty() && self.filter_params.is_empty() && !self.on_demand {
                true => scan.send(self.conn.query_iter(sql).await.map_err(failed)?, tx).await?,
                false => scan.send(self.conn.exec_iter(sql, params).await.map_err(failed)?, tx).await?,
            };
            if !open {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The query that reads `table` in key order from after `after` to its end, and its parameters.
    fn scan_sql(
        &self,
        table: &TableName,
        present: [bool; 8],
        keys: &KeyColumns,
        index: Option<&str>,
        after: Option<&SnapshotKey>,
    ) -> Result<(String, Vec<mysql_async::Value>)> {
        // The roles in SLOT_NAMES order, NULL for an optional one the table lacks ([`decode`] reads them so).
        let select: Vec<String> = (self.columns.required().iter().zip(present))
            .map(|((name, _), present)| if present { quote_ident(name) } else { "NULL".into() })
            .chain(self.columns.additional().iter().map(|name| quote_ident(name)))
            .collect();
        let key_cols = keys.columns.each_ref().map(|(name, _)| quote_ident(name));
        let mut sql = format!("SELECT {} FROM {}", select.join(", "), table.quoted());
        if let Some(index) = index {
            // Without a LIMIT the optimizer prefers scanning and sorting the whole table to walking the
            // index: the walk streams its first row at once and needs no temporary file.
            let _ = write!(sql, " FORCE INDEX ({})", quote_ident(index));
        }
        let mut conditions = Vec::new();
        if let Some(filter) = &self.filter {
            conditions.push(format!("({filter})"));
        }
        let mut params: Vec<mysql_async::Value> = self.filter_params.clone();
        if let Some(after) = after {
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
        // No LIMIT: one sorted read of the whole table (see "Order and memory").
        let _ = write!(sql, " ORDER BY {}", key_cols.join(", "));
        Ok((sql, params))
    }

    /// Scans on a task of its own: the server streams the rows while the caller produces the chunk before.
    /// At most three chunks are in memory (one being read, one waiting, one with the caller). The read view
    /// ends when the scan is complete or the result is dropped.
    pub fn prefetch(mut self) -> Prefetch {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let task = tokio::spawn(async move {
            match self.scan(&tx).await {
                Ok(true) => {
                    if tx.send(Ok(None)).await.is_ok() {
                        self.close().await;
                    }
                }
                // The caller is gone, or the scan failed part-way: the connection may still hold rows of the
                // result, which ending the view politely would read to the end. Dropping it ends the view.
                Ok(false) => {}
                Err(error) => {
                    let _ = tx.send(Err(error)).await;
                }
            }
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

/// Which roles ([`crate::outbox::SLOT_NAMES`] order) `table` has a column for, from `information_schema`.
///
/// # Errors
/// As [`role_columns`].
pub async fn present_roles(conn: &mut Conn, table: &TableName, columns: &ColumnNames) -> Result<[bool; 8]> {
    Ok(role_columns(conn, table, columns).await?.map(|c| c.is_some()))
}

/// The type family of each role's column ([`crate::outbox::SLOT_NAMES`] order): `None` for an optional
/// role the table lacks, `Some(None)` for a column of a type the connector does not read (preflight's
/// finding).
///
/// # Errors
/// A definite error naming a column the table must have but lacks (a required role, or an optional one
/// named in `[outbox.columns]`); classified query errors.
pub async fn role_columns(
    conn: &mut Conn,
    table: &TableName,
    columns: &ColumnNames,
) -> Result<[Option<Option<TypeFamily>>; 8]> {
    let found = column_types_of(conn, table).await?;
    let mut roles = [None; 8];
    for (slot, (name, required)) in columns.required().into_iter().enumerate() {
        match found.iter().find(|c| c.0.eq_ignore_ascii_case(name)) {
            Some((_, data_type, column_type, charset)) => {
                roles[slot] = Some(TypeFamily::of_sql(data_type, column_type, charset.as_deref()).ok());
            }
            None if required => {
                let names: Vec<&str> = found.iter().map(|c| c.0.as_str()).collect();
                return Err(Error::definite(format!(
                    "outbox table {table} has no column `{name}` ({}; columns: {}); fix [outbox.columns] or the \
                     table",
                    crate::outbox::SLOT_NAMES[slot],
                    names.join(", ")
                )));
            }
            None => {}
        }
    }
    Ok(roles)
}

/// `table`'s columns as `information_schema` describes their types: name, `DATA_TYPE`, `COLUMN_TYPE`,
/// `CHARACTER_SET_NAME` (what [`TypeFamily::of_sql`] reads).
///
/// # Errors
/// Classified query errors.
pub async fn column_types_of(
    conn: &mut Conn,
    table: &TableName,
) -> Result<Vec<(String, String, String, Option<String>)>> {
    conn.exec(
        "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, CHARACTER_SET_NAME FROM information_schema.COLUMNS \
         WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
        (&table.database, &table.table),
    )
    .await
    .map_err(|e| classify_mysql(&e).context(format_args!("reading the columns of {table}")))
}

/// One table's sorted read, cut into chunks.
struct Stream<'a> {
    table: &'a Arc<TableName>,
    present: [bool; 8],
    encoding: PayloadEncoding,
    chunk_rows: usize,
}

impl Stream<'_> {
    /// Decodes the rows as they arrive and sends them on in chunks; `false` when the receiver is gone.
    async fn send<P: mysql_async::prelude::Protocol>(
        &self,
        mut result: mysql_async::QueryResult<'_, 'static, P>,
        tx: &tokio::sync::mpsc::Sender<Result<Option<Chunk>>>,
    ) -> Result<bool> {
        let table = self.table;
        let capacity = self.chunk_rows.min(4096);
        let mut rows = Vec::with_capacity(capacity);
        loop {
            let row = result
                .next()
                .await
                .map_err(|e| classify_mysql(&e).context(format_args!("snapshot scan of {table}")))?;
            let end = row.is_none();
            if let Some(row) = row {
                rows.push(decode(table, self.present, self.encoding, 8, row)?);
            }
            if rows.len() == self.chunk_rows || (end && !rows.is_empty()) {
                let rows = std::mem::replace(&mut rows, Vec::with_capacity(capacity));
                let last_key = SnapshotKey::of(table, rows.last().expect("not empty"));
                if tx.send(Ok(Some(Chunk { rows, last_key }))).await.is_err() {
                    return Ok(false);
                }
            }
            if end {
                return Ok(true);
            }
        }
    }
}

/// Decodes one scanned row (the roles in [`crate::outbox::SLOT_NAMES`] order, as [`Scanner::query_chunk`]
/// selects them, and the additional columns from index `additional_from` to the end), moving its values. `present` says which roles the table
/// has: an absent optional role is `None` in the row, a NULL in a present column is an error as in the
/// stream (a NULL payload is [`Payload::Null`], which the router judges, as for the stream).
///
/// The first chunk's plain query returns every value as text; the later chunks' prepared statements return
/// typed values. A DATETIME (`occurred_at`) is written like the stream writes it, with the column's declared
/// fractional digits, so an event's `occurred_at` does not depend on how it was read.
pub(crate) fn decode(
    table: &Arc<TableName>,
    present: [bool; 8],
    encoding: PayloadEncoding,
    additional_from: usize,
    mut row: Row,
) -> Result<OutboxRow> {
    let payload = match (encoding, row.take::<mysql_async::Value, _>(5)) {
        (_, None | Some(mysql_async::Value::NULL)) => Payload::Null,
        (PayloadEncoding::Bytes, Some(mysql_async::Value::Bytes(bytes))) => Payload::Bytes(bytes),
        (PayloadEncoding::Json, Some(mysql_async::Value::Bytes(bytes))) => Payload::Json(
            String::from_utf8(bytes)
                .map_err(|_| Error::definite(format!("snapshot of {table}: column payload is not valid UTF-8")))?,
        ),
        (_, Some(other)) => {
            return Err(Error::definite(format!(
                "snapshot of {table}: column payload has an unexpected type: {other:?}"
            )))
        }
    };
    let additional =
        (additional_from..row.len()).map(|i| additional_value(table, &mut row, i)).collect::<Result<Vec<_>>>()?;
    let mut text = |i: usize, what: &str| text_value(table, &mut row, i, what);
    let id = need(text(0, "id")?, table, "id")?;
    let event_type = match present[3] {
        true => Some(need(text(3, "event_type")?, table, "event_type")?),
        false => None,
    };
    let schema_version = match present[4] {
        true => {
            let integer = row.columns_ref().get(4).is_some_and(|c| is_integer(c.column_type()));
            let version = need(text_value(table, &mut row, 4, "schema_version")?, table, "schema_version")?;
            Some(match integer {
                true => SchemaVersion::Integer(version.parse::<i128>().map_err(|_| {
                    Error::definite(format!(
                        "outbox row id={id} in {table}: schema_version {version} is not an integer"
                    ))
                })?),
                false => SchemaVersion::Text(version),
            })
        }
        false => None,
    };
    let mut text = |i: usize, what: &str| text_value(table, &mut row, i, what);
    let occurred_at = match present[7] {
        true => Some(iso_datetime(need(text(7, "occurred_at")?, table, "occurred_at")?)),
        false => None,
    };
    Ok(OutboxRow {
        table: table.clone(),
        aggregate_type: need(text(1, "aggregate_type")?, table, "aggregate_type")?,
        aggregate_id: need(text(2, "aggregate_id")?, table, "aggregate_id")?,
        event_type,
        schema_version,
        payload,
        headers: text(6, "headers")?,
        occurred_at,
        id,
        additional,
        from_snapshot: true,
        snapshot_id: None,
    })
}

/// Value `i` of a scanned row as the text the stream publishes; `None` for NULL (or an absent role).
fn text_value(table: &TableName, row: &mut Row, i: usize, what: &str) -> Result<Option<String>> {
    match row.take::<mysql_async::Value, _>(i) {
        None | Some(mysql_async::Value::NULL) => Ok(None),
        Some(mysql_async::Value::Bytes(b)) if row.columns_ref().get(i).is_some_and(is_binary16) => {
            uuid_text(&b).map(Some).map_err(|e| Error::definite(format!("snapshot of {table}: column {what}: {e}")))
        }
        Some(mysql_async::Value::Bytes(b)) => String::from_utf8(b)
            .map(Some)
            .map_err(|_| Error::definite(format!("snapshot of {table}: column {what} is not valid UTF-8"))),
        Some(mysql_async::Value::Date(y, mo, d, h, mi, s, us)) => {
            let fsp = row.columns_ref().get(i).map_or(0, |c| c.decimals());
            Ok(Some(format_datetime(y, mo, d, h, mi, s, us, fsp)))
        }
        Some(other) => Ok(Some(other.as_sql(true).trim_matches('\'').to_string())),
    }
}

/// `YYYY-MM-DD HH:MM:SS[.f]` (a text-protocol DATETIME) with the stream's `T`; other text unchanged.
fn iso_datetime(mut text: String) -> String {
    if let Some(space) = text.find(' ') {
        text.replace_range(space..=space, "T");
    }
    text
}

/// Value `i` (an `[outbox] additional_placement` column) of a scanned row, as the stream reads it.
fn additional_value(table: &TableName, row: &mut Row, i: usize) -> Result<ColumnValue> {
    use mysql_async::consts::ColumnType as T;
    let ty = row.columns_ref().get(i).map(|c| c.column_type());
    let name = row.columns_ref().get(i).map(|c| c.name_str().into_owned()).unwrap_or_default();
    let Some(text) = text_value(table, row, i, &name)? else { return Ok(ColumnValue::Null) };
    Ok(match ty {
        Some(ty) if is_integer(ty) => ColumnValue::Integer(text.parse().map_err(|_| {
            Error::definite(format!("snapshot of {table}: column {name} = {text:?} is not an integer"))
        })?),
        Some(T::MYSQL_TYPE_JSON) => ColumnValue::Json(text),
        Some(T::MYSQL_TYPE_DATETIME | T::MYSQL_TYPE_DATETIME2 | T::MYSQL_TYPE_TIMESTAMP | T::MYSQL_TYPE_TIMESTAMP2) => {
            ColumnValue::Text(iso_datetime(text))
        }
        _ => ColumnValue::Text(text),
    })
}

/// Whether a result column's type is an integer type.
fn is_integer(ty: mysql_async::consts::ColumnType) -> bool {
    use mysql_async::consts::ColumnType as T;
    matches!(
        ty,
        T::MYSQL_TYPE_TINY | T::MYSQL_TYPE_SHORT | T::MYSQL_TYPE_INT24 | T::MYSQL_TYPE_LONG | T::MYSQL_TYPE_LONGLONG
    )
}

/// Whether a result column is a BINARY(16) (a UUID, read as [`uuid_text`] like the stream reads it).
fn is_binary16(column: &mysql_async::Column) -> bool {
    const BINARY_CHARSET: u16 = 63;
    column.column_type() == mysql_async::consts::ColumnType::MYSQL_TYPE_STRING
        && column.character_set() == BINARY_CHARSET
        && column.column_length() == 16
}

/// A column that must not be NULL.
fn need(value: Option<String>, table: &TableName, what: &str) -> Result<String> {
    value.ok_or_else(|| Error::definite(format!("snapshot of {table}: column {what} is NULL")))
}

/// A [`Scanner`] streaming on its own task ([`Scanner::prefetch`]).
pub struct Prefetch {
    rx: tokio::sync::mpsc::Receiver<Result<Option<Chunk>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Prefetch {
    /// The next chunk of rows in key order; `None` when the snapshot is complete. Cancel-safe.
    ///
    /// # Errors
    /// Classified query errors; definite errors for rows that cannot be decoded.
    pub async fn next_chunk(&mut self) -> Result<Option<Chunk>> {
        self.rx.recv().await.unwrap_or_else(|| Err(Error::transient("the snapshot scan task stopped unexpectedly")))
    }
}

impl Prefetch {
    /// [`Prefetch::next_chunk`] if one is read already, without waiting.
    pub fn try_next_chunk(&mut self) -> Option<Result<Option<Chunk>>> {
        match self.rx.try_recv() {
            Ok(next) => Some(next),
            Err(tokio::sync::mpsc::error::TryRecvError::Empty) => None,
            Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => {
                Some(Err(Error::transient("the snapshot scan task stopped unexpectedly")))
            }
        }
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

    /// A scanned row as the SELECT returns it (roles in SLOT_NAMES order), with `occurred_at` as given
    /// and declared with `fsp` digits.
    fn scanned(occurred_at: Value, fsp: u8) -> Row {
        let text = || Column::new(ColumnType::MYSQL_TYPE_VAR_STRING);
        let columns: Arc<[Column]> = Arc::from(vec![
            text(),
            text(),
            text(),
            text(),
            Column::new(ColumnType::MYSQL_TYPE_SHORT),
            text(),
            text(),
            Column::new(ColumnType::MYSQL_TYPE_DATETIME).with_decimals(fsp),
        ]);
        let values = vec![
            Value::Bytes(b"7c1f2b9e-0000-4000-8000-000000000001".to_vec()),
            Value::Bytes(b"order".to_vec()),
            Value::Bytes(b"order-1".to_vec()),
            Value::Bytes(b"OrderCreated".to_vec()),
            Value::UInt(3),
            Value::Bytes(br#"{"total":"45.48"}"#.to_vec()),
            Value::NULL,
            occurred_at,
        ];
        mysql_common::row::new_row(values, columns)
    }

    /// A table without the optional columns: the SELECT gives NULL in their places, the row carries
    /// `None`; the same NULL in a column the table has is an error, as in the stream.
    #[test]
    fn absent_optional_roles_are_none_and_present_nulls_are_errors() {
        let table = Arc::new(TableName { database: "shop".into(), table: "outbox_events".into() });
        let mut required_only = [true; 8];
        for slot in [3, 4, 6, 7] {
            required_only[slot] = false;
        }
        let row = decode(&table, required_only, PayloadEncoding::Json, 8, scanned(Value::NULL, 6)).unwrap();
        assert_eq!((row.event_type, row.schema_version, row.occurred_at, row.headers), (None, None, None, None));
        let err = decode(&table, [true; 8], PayloadEncoding::Json, 8, scanned(Value::NULL, 6)).unwrap_err();
        assert!(err.to_string().contains("occurred_at is NULL"), "{err}");
    }

    /// The snapshot's side of [`crate::source::column_types::expectations`], on the same table as the
    /// stream's: a BINARY(16) id (result column of type STRING, binary charset, length 16) becomes its
    /// UUID text, an integer aggregate id its digits (binary protocol) or its text (text protocol), texts
    /// arrive unchanged.
    #[test]
    fn ids_and_texts_as_the_expectations_say() {
        use crate::source::column_types::expectations::{BINARY16, INTEGERS, TEXTS};
        let table = Arc::new(TableName { database: "shop".into(), table: "outbox_events".into() });
        let with = |id: (Column, Value), aggregate_id: (Column, Value)| {
            let mut row = scanned(Value::Bytes(b"2026-01-02 03:04:05".to_vec()), 0);
            let mut columns: Vec<Column> = row.columns_ref().to_vec();
            let mut values: Vec<Value> = (0..8).map(|i| row.take(i).unwrap()).collect();
            (columns[0], values[0]) = id;
            (columns[2], values[2]) = aggregate_id;
            decode(&table, [true; 8], PayloadEncoding::Json, 8, mysql_common::row::new_row(values, Arc::from(columns)))
                .unwrap()
        };
        let text = |s: &str| (Column::new(ColumnType::MYSQL_TYPE_VAR_STRING), Value::Bytes(s.as_bytes().to_vec()));
        let binary16 = Column::new(ColumnType::MYSQL_TYPE_STRING).with_character_set(63).with_column_length(16);
        for (bytes, expected) in BINARY16 {
            let row = with((binary16.clone(), Value::Bytes(bytes.to_vec())), text("a"));
            assert_eq!(row.id, *expected);
        }
        for (n, expected) in INTEGERS {
            let binary = match i64::try_from(*n) {
                Ok(i) => Value::Int(i),
                Err(_) => Value::UInt(u64::try_from(*n).unwrap()),
            };
            let as_text = Value::Bytes(expected.as_bytes().to_vec());
            for value in [binary, as_text] {
                let row = with(text("e-1"), (Column::new(ColumnType::MYSQL_TYPE_LONGLONG), value));
                assert_eq!(row.aggregate_id, *expected);
            }
        }
        for s in TEXTS {
            let row = with(text(s), text(s));
            assert_eq!((row.id.as_str(), row.aggregate_id.as_str()), (*s, *s));
        }
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
            let row = decode(&table, [true; 8], PayloadEncoding::Json, 8, scanned(value.clone(), fsp)).unwrap();
            assert_eq!(row.occurred_at.as_deref(), Some(expected), "{value:?} with {fsp} digits");
            assert_eq!((row.schema_version, row.headers.as_deref()), (Some(SchemaVersion::Integer(3)), None));
            assert!(row.from_snapshot);
        }
    }

    /// The payload as `payload_encoding` reads it (bytes unchanged, NULL as [`Payload::Null`] in both
    /// encodings), a text schema_version, and additional columns by their result type, from the text
    /// protocol (the first chunk) and the binary one alike.
    #[test]
    fn payloads_versions_and_additional_columns_as_the_stream_reads_them() {
        let table = Arc::new(TableName { database: "shop".into(), table: "outbox_events".into() });
        let with = |version: (Column, Value), payload: Value, additional: Vec<(Column, Value)>, encoding| {
            let mut row = scanned(Value::Bytes(b"2026-01-02 03:04:05".to_vec()), 0);
            let mut columns: Vec<Column> = row.columns_ref().to_vec();
            let mut values: Vec<Value> = (0..8).map(|i| row.take(i).unwrap()).collect();
            (columns[4], values[4]) = version;
            values[5] = payload;
            for (column, value) in additional {
                columns.push(column);
                values.push(value);
            }
            decode(&table, [true; 8], encoding, 8, mysql_common::row::new_row(values, Arc::from(columns))).unwrap()
        };
        let text = |s: &[u8]| (Column::new(ColumnType::MYSQL_TYPE_VAR_STRING), Value::Bytes(s.to_vec()));
        let int = Column::new(ColumnType::MYSQL_TYPE_LONGLONG);
        let bytes = vec![0x00, 0xff, 0xc3, 0x28];
        let row = with(text(b"v2"), Value::Bytes(bytes.clone()), Vec::new(), PayloadEncoding::Bytes);
        assert_eq!((row.payload, row.schema_version), (Payload::Bytes(bytes), Some(SchemaVersion::Text("v2".into()))));
        for encoding in [PayloadEncoding::Json, PayloadEncoding::Bytes] {
            assert_eq!(with(text(b"1"), Value::NULL, Vec::new(), encoding).payload, Payload::Null);
        }
        let row = with(
            (int.clone(), Value::Bytes(b"-70000".to_vec())),
            Value::Bytes(b"{}".to_vec()),
            Vec::new(),
            PayloadEncoding::Json,
        );
        assert_eq!(row.schema_version, Some(SchemaVersion::Integer(-70_000)));
        let additional = vec![
            text("acme 🚀".as_bytes()),
            (int.clone(), Value::Bytes(b"-42".to_vec())),
            (int, Value::UInt(u64::MAX)),
            (Column::new(ColumnType::MYSQL_TYPE_JSON), Value::Bytes(br#"{"a": 1}"#.to_vec())),
            (
                Column::new(ColumnType::MYSQL_TYPE_DATETIME).with_decimals(6),
                Value::Bytes(b"2026-03-29 01:00:00.000001".to_vec()),
            ),
            (Column::new(ColumnType::MYSQL_TYPE_DATETIME).with_decimals(3), Value::Date(2026, 3, 29, 1, 0, 0, 120_000)),
            (Column::new(ColumnType::MYSQL_TYPE_VAR_STRING), Value::NULL),
        ];
        let row = with(text(b"1"), Value::Bytes(b"{}".to_vec()), additional, PayloadEncoding::Json);
        assert_eq!(
            row.additional,
            [
                ColumnValue::Text("acme 🚀".into()),
                ColumnValue::Integer(-42),
                ColumnValue::Integer(u64::MAX.into()),
                ColumnValue::Json(r#"{"a": 1}"#.into()),
                ColumnValue::Text("2026-03-29T01:00:00.000001".into()),
                ColumnValue::Text("2026-03-29T01:00:00.120".into()),
                ColumnValue::Null,
            ]
        );
    }

    #[test]
    fn null_occurred_at_is_a_definite_error() {
        let table = Arc::new(TableName { database: "shop".into(), table: "outbox_events".into() });
        let err = decode(&table, [true; 8], PayloadEncoding::Json, 8, scanned(Value::NULL, 6)).unwrap_err();
        assert!(err.to_string().contains("occurred_at is NULL"), "{err}");
    }
}
