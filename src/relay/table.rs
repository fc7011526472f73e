//! The relay's view of its outbox tables: what a row read for publishing is ([`Polled`], [`Glimpse`]),
//! where it is in the order ([`Position`]), and [`Relay`], the tables' layout as loaded once per run. Its
//! statements are in the rooms beside: reading ([`super::reads`]), marking and parking
//! ([`super::marks`]), the progress table ([`super::progress`]).
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2 (vocabulary, error, metrics, config), and the fence
//! beside it.

use std::sync::Arc;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Value};

use super::columns::{
    columns_of, last_error_chars, no_order_key, order_key, poll_column_problems, poll_columns_ddl, read_index_columns,
    read_index_ddl, OrderKey,
};
use super::fence::Fence;
use super::progress::Progress;
use crate::config::{ColumnNames, Config};
use crate::error::{classify_mysql, Error, Result};
use crate::outbox::{OutboxRow, TableName};
use crate::poison::Origin;
use crate::source::decode::Undecodable;

/// How often every unpublished row below the cursor is looked at (light columns only): rows no gap led to
/// (a sequence number written by hand, a row marked unpublished again), and with a progress table the
/// numbers of rows it can pass (a released hold's parked row, a row another relay marked).
pub const FULL_SWEEP_EVERY: Duration = Duration::from_secs(30);

/// The most rows one sweep statement returns; a sweep continues in pages.
pub const SWEEP_PAGE: usize = 10_000;

/// An aggregate as its (type, id) bytes.
pub type Aggregate = (Vec<u8>, Vec<u8>);

/// Where a row is in the order: the values of the order columns (the sequence; or occurred_at and id).
pub type Position = Vec<Value>;

/// A row read for publishing.
#[derive(Debug)]
pub struct Polled {
    /// The row, or why it does not decode.
    pub row: std::result::Result<OutboxRow, Undecodable>,
    /// The primary key as stored (for the statements that mark it).
    pub key: Value,
    /// Its aggregate.
    pub aggregate: Aggregate,
    /// Where it is in the order.
    pub position: Position,
    /// Whether it is parked (dead-lettered earlier).
    pub parked: bool,
    /// Whether its `published_at` is `HELD_AT`: the progress table's number may have passed it, so
    /// once published it is marked on its own.
    pub held_at: bool,
}

impl Polled {
    /// The event id, if it decoded.
    pub fn id(&self) -> Option<&str> {
        match &self.row {
            Ok(row) => Some(&row.id),
            Err(bad) => bad.id.as_deref(),
        }
    }

    /// The sequence number (sequence order only).
    pub fn seq(&self) -> Option<u64> {
        self.position.first().and_then(sequence_value).filter(|_| self.position.len() == 1)
    }
}

/// A row as a sweep sees it first: its key, aggregate and position, without the payload.
#[derive(Debug)]
pub struct Glimpse {
    /// The primary key as stored.
    pub key: Value,
    /// Its aggregate.
    pub aggregate: Aggregate,
    /// Where it is in the order.
    pub position: Position,
}

/// One outbox table as the relay reads it.
#[derive(Debug)]
pub struct PollTable {
    /// The table.
    pub table: Arc<TableName>,
    /// Which roles it has columns for ([`crate::outbox::SLOT_NAMES`] order).
    pub(super) present: [bool; 8],
    /// How its aggregates' events are ordered.
    pub order: OrderKey,
    /// `last_error`'s length in characters: what the relay writes there is cut to it.
    pub(super) last_error_chars: u64,
    /// The index the reads along the order go by: it starts with `(published_at, <sequence>)` (or
    /// `(published_at, occurred_at)`), and they name it. Left to itself, the optimizer reads
    /// `published_at IS NULL AND seq > ? ORDER BY seq LIMIT n` as a look-up of `published_at IS NULL`
    /// filtered by `seq > ?`, stepping over every unpublished row below the cursor (MariaDB 10.11, 600,000
    /// rows into a 1M-row backlog: 57 ms per read, 1.5 ms with the index named).
    pub(super) read_index: String,
}

/// The relay: its settings and the tables it reads.
#[derive(Debug)]
pub struct Relay {
    pub(super) id: String,
    pub(super) batch_rows: usize,
    pub(super) columns: ColumnNames,
    pub(super) tables: Vec<PollTable>,
    /// How it records what it published: marks, or the progress table's numbers.
    pub(super) progress: Progress,
    /// The lease its writes are fenced with ([`Relay::fenced`]; none as loaded).
    pub(super) fence: Fence,
}

impl Relay {
    /// Reads the layout of every outbox table.
    ///
    /// # Errors
    /// A definite error for a table without the required columns, the relay's columns, or its order
    /// column; classified query errors.
    pub async fn load(conn: &mut Conn, config: &Config) -> Result<Relay> {
        let mut tables = Vec::new();
        for table in config.tables() {
            tables.push(load_table(conn, table, config).await?);
        }
        let progress = Progress::load(conn, &config.poll.progress, config.tables()).await?;
        Ok(Relay {
            id: config.poll.relay_id(),
            batch_rows: config.poll.batch_rows,
            columns: config.outbox.columns.clone(),
            tables,
            progress,
            fence: Fence::Unleased,
        })
    }

    /// The relay with its writes fenced by `fence` (a run's lease).
    pub fn fenced(self, fence: Fence) -> Relay {
        Relay { fence, ..self }
    }

    /// How the relay records what it published (`[poll] progress_table`).
    pub fn progress(&self) -> &Progress {
        &self.progress
    }

    /// The sequence number of table `t` every row up to which is published, as last written (0 without a
    /// progress table).
    pub fn frontier(&self, t: usize) -> u64 {
        self.progress.frontier(t)
    }

    /// Records that every row of table `t` with a sequence number up to `through` is published
    /// ([`Progress::write_frontier`]).
    ///
    /// # Errors
    /// Classified query errors.
    pub async fn write_frontier(&self, conn: &mut Conn, t: usize, through: u64) -> Result<()> {
        self.progress.write_frontier(conn, t, &self.tables[t].table, through, &self.fence).await
    }

    /// This relay's name, for logs.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The polled tables.
    pub fn tables(&self) -> &[PollTable] {
        &self.tables
    }

    /// Readies the connection the marks go through: `READ COMMITTED` (unless the binlog is in `STATEMENT`
    /// format, where InnoDB refuses writes at that level), so that a mark never waits for a transaction
    /// that inserted a row and has not committed. At the server's default, `REPEATABLE READ`, a mark that
    /// scans past such a row (a small table is marked by a scan of its primary key) waits for its lock: up
    /// to `innodb_lock_wait_timeout` (50 s), then the run failed. With a lease, the session's `wait_timeout`
    /// is the lease's: a round of marks left open by a relay that fell silent ends with it
    /// ([`super::fence`]).
    ///
    /// # Errors
    /// Classified query errors.
    pub async fn ready_marker(&self, conn: &mut Conn) -> Result<()> {
        if let Some(s) = self.fence.session_timeout_s() {
            conn.query_drop(format!("SET SESSION wait_timeout = {s}"))
                .await
                .map_err(|e| classify_mysql(&e).context("poll: setting the marks' session timeout"))?;
        }
        let format: Option<String> = conn
            .query_first("SELECT @@binlog_format")
            .await
            .map_err(|e| classify_mysql(&e).context("poll: reading binlog_format"))?;
        if !format.is_some_and(|f| f.eq_ignore_ascii_case("STATEMENT")) {
            conn.query_drop("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                .await
                .map_err(|e| classify_mysql(&e).context("poll: setting the marks' isolation level"))?;
        }
        Ok(())
    }

    /// Where a row of table `t` was read, for dead letters and holds.
    pub fn origin(&self, t: usize) -> Origin {
        Origin {
            snapshot: false,
            gtid: None,
            file: format!("{} (polled)", self.tables[t].table),
            position: 0,
            row_index: 0,
        }
    }
}

async fn load_table(conn: &mut Conn, table: &TableName, config: &Config) -> Result<PollTable> {
    let (columns, order, progress) = (&config.outbox.columns, config.poll.order, &config.poll.progress);
    let present = crate::source::snapshot::present_roles(conn, table, columns).await?;
    let found = columns_of(conn, table).await?;
    let problems = poll_column_problems(table, &found, progress);
    if !problems.is_empty() {
        return Err(Error::definite(format!(
            "{}. Add them (source.kind = \"poll\"): {}",
            problems.join("; "),
            poll_columns_ddl(table, &found, progress).unwrap_or_default()
        )));
    }
    let order =
        order_key(&found, columns, order).ok_or_else(|| Error::definite(no_order_key(table, columns, order)))?;
    let last_error_chars = last_error_chars(conn, table).await?;
    let read_along = read_index_columns(&order, columns);
    let read_index =
        crate::source::key_order::index_in_key_order(conn, table, &read_along).await?.ok_or_else(|| {
            Error::definite(format!(
                "{table} has no index on ({}, ...): every read of the polling relay would scan the table. Add it: {}",
                read_along.join(", "),
                read_index_ddl(table, &order, columns)
            ))
        })?;
    Ok(PollTable { table: Arc::new(table.clone()), present, order, last_error_chars, read_index })
}

/// A key's bytes, to compare keys read by different statements (text and binary protocol).
pub fn key_bytes(value: &Value) -> Vec<u8> {
    match value {
        Value::Bytes(b) => b.clone(),
        other => other.as_sql(true).into_bytes(),
    }
}

/// A sequence value as read (binary or text protocol).
pub fn sequence_value(value: &Value) -> Option<u64> {
    match value {
        Value::UInt(n) => Some(*n),
        Value::Int(n) => u64::try_from(*n).ok(),
        Value::Bytes(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sequence values read in either protocol.
    #[test]
    fn sequence_values_read_in_both_protocols() {
        assert_eq!(sequence_value(&Value::UInt(7)), Some(7));
        assert_eq!(sequence_value(&Value::Int(7)), Some(7));
        assert_eq!(sequence_value(&Value::Bytes(b"18446744073709551615".to_vec())), Some(u64::MAX));
        assert_eq!(sequence_value(&Value::Int(-1)), None);
    }
}
