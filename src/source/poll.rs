//! The polling relay's side of the table (`source.kind = "poll"`): the statements that read unpublished
//! rows in order, and mark them published or parked. The run loop that publishes what is read is
//! `pipeline::poll`.
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2 (vocabulary, error, metrics, config).
//!
//! # One relay at a time, and no lease per row
//! Relays of one connector (`[state] name`) take the same lease on the source server ([`crate::lease`]):
//! one publishes, the others stand by and take over when it dies. So a row is never claimed or locked: the
//! active relay reads, publishes, and writes each row once, when Kafka acknowledged it (`published_at`).
//! That is what makes it cheap: one row write per event, a few statements per batch, no head test.
//!
//! # The columns
//! An `AUTO_INCREMENT` sequence column (the order: see below), `published_at` (NULL until Kafka
//! acknowledged the row's event), `attempts` (how often the broker refused the row's record),
//! `next_attempt_at` (`9999-12-31 23:59:59`, [`PARKED_UNTIL`], when the row was dead-lettered: *parked*),
//! `last_error` (why). The relay's own times are `UTC_TIMESTAMP(6)`; nothing it does compares a time a
//! writer wrote, so a writer's session time zone does not matter. `outbox-cdc check` verifies the columns
//! and the index `(published_at, <sequence>)` the reads go along.
//!
//! # The order
//! An aggregate's events are published in the order of the sequence column: insertion order, whatever the
//! writers' clocks or the ties of `occurred_at`. A table without one is refused unless `poll.order =
//! "occurred_at"` (then `(occurred_at, id)`, which reverses events that share a timestamp). The relay
//! reads in that order from a cursor, so each unpublished row is read once while it publishes:
//! - **A row committed after rows with higher sequence numbers** (its transaction took its number first and
//!   committed later) is below the cursor when it becomes visible. Each read that skips numbers records
//!   them as *gaps*; gaps are read again ([`Relay::read_gaps`]) until they fill or [`GAP_GRACE`] passes (a
//!   rolled-back insert leaves a gap for ever), and every [`FULL_SWEEP_EVERY`] all unpublished rows below
//!   the cursor are looked at (a transaction open longer than the grace). In `occurred_at` order there are
//!   no gaps to know of: every read looks at all of them.
//! - **A parked row** holds its aggregate: the relay skips the aggregate's later rows (they stay
//!   unpublished) until `quarantine release` marks the parked row published; then it reads the aggregate's
//!   rows again ([`Relay::read_aggregate`]) and publishes them in order. Parking is in the table, so every
//!   relay that becomes active knows it ([`Relay::parked`]).
//!
//! An event whose transaction commits after a later event of its aggregate was already published (the
//! application wrote two events of one aggregate in concurrent transactions) is published after it: the
//! relay sees rows only once they are committed. The binlog source publishes in commit order instead.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row, Value};

use crate::config::{ColumnNames, Config, PollOrder};
use crate::error::{classify_mysql, Error, Result};
use crate::metrics::{metrics, PollQuery, POLL_BACKLOG_CAP};
use crate::outbox::{quote_ident, OutboxRow, TableName};
use crate::poison::Origin;
use crate::source::decode::Undecodable;

/// The relay's columns, as the reference schema names them: `published_at`, `attempts`,
/// `next_attempt_at`, `last_error`. (`locked_at` and `locked_by`, which earlier relays leased rows
/// with, are no longer read or written.)
pub const POLL_COLUMNS: [&str; 4] = ["published_at", "attempts", "next_attempt_at", "last_error"];

/// The relay's columns as `check` proposes to add them ([`poll_columns_ddl`]), in [`POLL_COLUMNS`] order.
pub const POLL_COLUMN_DEFINITIONS: [&str; 4] = [
    "DATETIME(6) NULL",
    "INT UNSIGNED NOT NULL DEFAULT 0",
    "DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)",
    "VARCHAR(1000) NULL",
];

/// The sequence column `check` proposes to add, and the index the relay reads along.
pub const SEQUENCE_COLUMN: &str = "seq";

/// `next_attempt_at` of a dead-lettered (parked) row. Outside `TIMESTAMP`'s range, so the column must be a
/// `DATETIME` ([`poll_column_problems`]).
pub const PARKED_UNTIL: &str = "9999-12-31 23:59:59";

/// [`HELD_AT`], as a literal [`NOT_PUBLISHED`] can be built from.
macro_rules! held_at {
    () => {
        "1000-01-01 00:00:00"
    };
}

/// `[poll] progress_table`: `published_at` of an unpublished row the number may pass: a parked row, or
/// a row of an aggregate it holds. Below the number `published_at IS NULL` means published, so these
/// rows say otherwise, and are found along the read index `(published_at, <sequence>)` however far the
/// number moved on. `prune` keeps them; release publishes them and sets the real time.
pub const HELD_AT: &str = held_at!();

/// `published_at` of a row not yet published, whatever the mode: NULL, or [`HELD_AT`].
pub const NOT_PUBLISHED: &str = concat!("(published_at IS NULL OR published_at = '", held_at!(), "')");

/// How long a gap in the sequence is read again before it counts as a rolled-back insert. Rows of a
/// transaction that commits later still than this are found by the next full sweep.
pub const GAP_GRACE: Duration = Duration::from_secs(10);

/// How often every unpublished row below the cursor is looked at (light columns only), for rows committed
/// more than [`GAP_GRACE`] after their sequence number was taken.
pub const FULL_SWEEP_EVERY: Duration = Duration::from_secs(30);

/// The most rows one sweep statement returns; a sweep continues in pages.
pub const SWEEP_PAGE: usize = 10_000;

/// How an aggregate's events are ordered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OrderKey {
    /// The table's `AUTO_INCREMENT` column: insertion order.
    Sequence(String),
    /// `occurred_at`, then the event id (`poll.order = "occurred_at"`).
    OccurredAtThenId,
}

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
    /// Whether its `published_at` is [`HELD_AT`]: the progress table's number may have passed it, so
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
    present: [bool; 8],
    /// How its aggregates' events are ordered.
    pub order: OrderKey,
    /// `last_error`'s length in characters: what the relay writes there is cut to it.
    last_error_chars: u64,
    /// The index the reads along the order go by: it starts with `(published_at, <sequence>)` (or
    /// `(published_at, occurred_at)`), and they name it. Left to itself, the optimizer reads
    /// `published_at IS NULL AND seq > ? ORDER BY seq LIMIT n` as a look-up of `published_at IS NULL`
    /// filtered by `seq > ?`, stepping over every unpublished row below the cursor (MariaDB 10.11, 600,000
    /// rows into a 1M-row backlog: 57 ms per read, 1.5 ms with the index named).
    read_index: String,
    /// `[poll] progress_table`: the sequence number every row up to which is published, as last written
    /// (0 without a progress table). Statements that could reach below it are bounded by it.
    frontier: AtomicU64,
}

/// The relay: its settings and the tables it reads.
#[derive(Debug)]
pub struct Relay {
    id: String,
    batch_rows: usize,
    columns: ColumnNames,
    tables: Vec<PollTable>,
    /// `[poll] progress_table`, resolved.
    progress: Option<TableName>,
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
        let progress = progress_table_name(config);
        if let Some(progress) = &progress {
            check_progress_table(conn, progress, config.tables()).await?;
            for pt in &tables {
                pt.frontier.store(read_frontier(conn, progress, &pt.table).await?, Ordering::Release);
            }
        }
        Ok(Relay {
            id: config.poll.relay_id(),
            batch_rows: config.poll.batch_rows,
            columns: config.outbox.columns.clone(),
            tables,
            progress,
        })
    }

    /// Whether the relay records its progress as a number per table (`[poll] progress_table`) rather than
    /// in each row.
    pub fn has_progress_table(&self) -> bool {
        self.progress.is_some()
    }

    /// `[poll] progress_table`, when set.
    pub fn progress_table(&self) -> Option<&TableName> {
        self.progress.as_ref()
    }

    /// The sequence number of table `t` every row up to which is published, as last written (0 without a
    /// progress table).
    pub fn frontier(&self, t: usize) -> u64 {
        self.tables[t].frontier.load(Ordering::Acquire)
    }

    /// Records that every row of table `t` with a sequence number up to `through` is published (never
    /// lowers it: a relay that lost its lease may still write a lower one).
    ///
    /// # Errors
    /// Classified query errors.
    pub async fn write_frontier(&self, conn: &mut Conn, t: usize, through: u64) -> Result<()> {
        let Some(progress) = &self.progress else { return Ok(()) };
        let pt = &self.tables[t];
        conn.exec_drop(
            format!(
                "UPDATE {} SET published_through = GREATEST(published_through, ?), updated_at = UTC_TIMESTAMP(6) \
                 WHERE outbox_table = ?",
                progress.quoted()
            ),
            (through, pt.table.to_string()),
        )
        .await
        .map_err(|e| classify_mysql(&e).context(format_args!("poll: writing how far {} is published", pt.table)))?;
        metrics().poll_queries(PollQuery::Mark, 1);
        pt.frontier.fetch_max(through, Ordering::AcqRel);
        Ok(())
    }

    /// The server's open transactions, each as (connection id, start time): a sequence number a read
    /// passed without a row can still be committed only by a transaction open when it was passed.
    ///
    /// # Errors
    /// Classified query errors (a definite one without the `PROCESS` privilege).
    pub async fn open_transactions(conn: &mut Conn) -> Result<HashSet<(u64, String)>> {
        let rows: Vec<(Option<u64>, Option<String>)> = conn
            .query("SELECT trx_mysql_thread_id, CAST(trx_started AS CHAR) FROM information_schema.INNODB_TRX")
            .await
            .map_err(|e| classify_mysql(&e).context("poll: reading the server's open transactions"))?;
        metrics().poll_queries(PollQuery::Transactions, 1);
        Ok(rows.into_iter().map(|(id, started)| (id.unwrap_or(0), started.unwrap_or_default())).collect())
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
    /// scans past such a row (a small table is marked by a scan of its primary key; a range stops on the
    /// row after it) waits for its lock: up to `innodb_lock_wait_timeout` (50 s), then the run failed.
    ///
    /// # Errors
    /// Classified query errors.
    pub async fn ready_marker(conn: &mut Conn) -> Result<()> {
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

    /// The order columns of table `t`, quoted.
    fn order_columns(&self, t: usize) -> Vec<String> {
        match &self.tables[t].order {
            OrderKey::Sequence(c) => vec![quote_ident(c)],
            OrderKey::OccurredAtThenId => {
                vec![quote_ident(&self.columns.occurred_at), quote_ident(&self.columns.id)]
            }
        }
    }

    /// `position > ?` (`after`) or `position <= ?` (`!after`) for table `t`, with its parameters.
    fn compare(&self, t: usize, after: bool, position: &Position) -> (String, Vec<Value>) {
        let cols = self.order_columns(t);
        let (strict, last) = if after { (">", ">") } else { ("<", "<=") };
        match cols.as_slice() {
            [c] => (format!("{c} {last} ?"), position.clone()),
            [a, b] => (
                format!("({a} {strict} ? OR ({a} = ? AND {b} {last} ?))"),
                vec![position[0].clone(), position[0].clone(), position[1].clone()],
            ),
            _ => unreachable!("one or two order columns"),
        }
    }

    /// The columns of a full read: roles, key, flags (1: parked, 2: `published_at` = [`HELD_AT`]), the
    /// order columns, then the `[outbox] additional_placement` columns ([`Relay::polled`] reads them back).
    fn full_columns(&self, t: usize) -> String {
        let pt = &self.tables[t];
        let roles: Vec<String> = (self.columns.required().iter().zip(pt.present))
            .map(|((name, _), present)| if present { quote_ident(name) } else { "NULL".into() })
            .collect();
        format!(
            "{roles}, {id}, (next_attempt_at = '{PARKED_UNTIL}') | (COALESCE(published_at = '{HELD_AT}', 0) << 1), \
             {order}{additional}",
            roles = roles.join(", "),
            id = quote_ident(&self.columns.id),
            order = self.order_columns(t).join(", "),
            additional = self.columns.additional().iter().map(|c| format!(", {}", quote_ident(c))).collect::<String>(),
        )
    }

    /// `table` of table `t` in a statement's `FROM`, naming its read index when the statement reads `along`
    /// the order ([`PollTable::read_index`]).
    fn from(&self, t: usize, along: bool) -> String {
        let pt = &self.tables[t];
        match along {
            true => format!("{} FORCE INDEX ({})", pt.table.quoted(), quote_ident(&pt.read_index)),
            false => pt.table.quoted(),
        }
    }

    /// The rows of table `t` with `published_at IS NULL` that meet `condition`, in order, up to `limit`;
    /// `along`: the condition is a range of the order columns.
    async fn read_full(
        &self,
        conn: &mut Conn,
        t: usize,
        along: bool,
        (condition, params): (&str, Vec<Value>),
        limit: usize,
    ) -> Result<Vec<Polled>> {
        self.read_full_where(conn, t, along, "published_at IS NULL", (condition, params), limit).await
    }

    /// [`Relay::read_full`] of the rows that meet `unpublished` instead.
    async fn read_full_where(
        &self,
        conn: &mut Conn,
        t: usize,
        along: bool,
        unpublished: &str,
        (condition, params): (&str, Vec<Value>),
        limit: usize,
    ) -> Result<Vec<Polled>> {
        let sql = format!(
            "SELECT {columns} FROM {from} WHERE {unpublished} AND {condition} ORDER BY {order} LIMIT {limit}",
            columns = self.full_columns(t),
            from = self.from(t, along),
            order = self.order_columns(t).join(", "),
        );
        let rows: Vec<Row> = conn.exec(sql, params).await.map_err(|e| {
            classify_mysql(&e).context(format_args!("poll: reading unpublished rows of {}", self.tables[t].table))
        })?;
        metrics().poll_queries(PollQuery::Claim, 1);
        Ok(rows.into_iter().map(|row| self.polled(t, row)).collect())
    }

    /// Up to `poll.batch_rows` unpublished rows of table `t` after `cursor` (from the start for `None`), in
    /// order. Parked rows are among them (the caller holds their aggregates).
    ///
    /// # Errors
    /// Classified query errors.
    pub async fn read_after(&self, conn: &mut Conn, t: usize, cursor: Option<&Position>) -> Result<Vec<Polled>> {
        let (condition, params) = match cursor {
            Some(position) => self.compare(t, true, position),
            None => ("TRUE".to_string(), Vec::new()),
        };
        self.read_full(conn, t, true, (&condition, params), self.batch_rows).await
    }

    /// The unpublished rows of table `t` in the sequence ranges `gaps` (inclusive), in order, up to
    /// `poll.batch_rows`: rows committed after the read that passed their numbers.
    ///
    /// # Errors
    /// Classified query errors.
    pub async fn read_gaps(&self, conn: &mut Conn, t: usize, gaps: &[(u64, u64)]) -> Result<Vec<Polled>> {
        let OrderKey::Sequence(c) = &self.tables[t].order else { return Ok(Vec::new()) };
        if gaps.is_empty() {
            return Ok(Vec::new());
        }
        let c = quote_ident(c);
        let condition = format!("({})", vec![format!("{c} BETWEEN ? AND ?"); gaps.len()].join(" OR "));
        let params = gaps.iter().flat_map(|(lo, hi)| [Value::from(*lo), Value::from(*hi)]).collect();
        self.read_full(conn, t, true, (&condition, params), self.batch_rows).await
    }

    /// The position of the frontier of table `t` (`[poll] progress_table`), when it is above 0: nothing
    /// at or before it is unpublished.
    fn frontier_position(&self, t: usize) -> Option<Position> {
        let frontier = self.frontier(t);
        (frontier > 0).then(|| vec![Value::UInt(frontier)])
    }

    /// `after`, or the frontier of table `t` when that is further.
    fn after_frontier(&self, t: usize, after: Option<&Position>) -> Option<Position> {
        let frontier = self.frontier_position(t);
        match (after, frontier) {
            (Some(a), Some(f)) if a.first().and_then(sequence_value) < f.first().and_then(sequence_value) => Some(f),
            (Some(a), _) => Some(a.clone()),
            (None, f) => f,
        }
    }

    /// A page of the unpublished rows of table `t` up to `upto` and after `after` (and after the
    /// frontier), light columns only.
    ///
    /// # Errors
    /// Classified query errors.
    pub async fn sweep(
        &self,
        conn: &mut Conn,
        t: usize,
        after: Option<&Position>,
        upto: &Position,
    ) -> Result<Vec<Glimpse>> {
        let (mut condition, mut params) = self.compare(t, false, upto);
        if let Some(after) = self.after_frontier(t, after) {
            let (c, p) = self.compare(t, true, &after);
            condition = format!("{condition} AND {c}");
            params.extend(p);
        }
        self.glimpse(t, conn, (condition, params)).await
    }

    /// A page of the unpublished rows of table `t` in the sequence ranges `ranges` (inclusive) after
    /// `after`, light columns only.
    ///
    /// # Errors
    /// Classified query errors.
    pub async fn glimpse_ranges(
        &self,
        conn: &mut Conn,
        t: usize,
        ranges: &[(u64, u64)],
        after: Option<u64>,
    ) -> Result<Vec<Glimpse>> {
        let OrderKey::Sequence(c) = &self.tables[t].order else { return Ok(Vec::new()) };
        if ranges.is_empty() {
            return Ok(Vec::new());
        }
        let c = quote_ident(c);
        let mut condition = format!("({})", vec![format!("{c} BETWEEN ? AND ?"); ranges.len()].join(" OR "));
        let mut params: Vec<Value> = ranges.iter().flat_map(|(lo, hi)| [Value::from(*lo), Value::from(*hi)]).collect();
        if let Some(after) = after {
            condition.push_str(&format!(" AND {c} > ?"));
            params.push(Value::from(after));
        }
        self.glimpse(t, conn, (condition, params)).await
    }

    /// Up to [`SWEEP_PAGE`] unpublished rows of table `t` that meet `condition` (a range of the order
    /// columns), in order, light columns only.
    async fn glimpse(
        &self,
        t: usize,
        conn: &mut Conn,
        (condition, params): (String, Vec<Value>),
    ) -> Result<Vec<Glimpse>> {
        let order = self.order_columns(t);
        let sql = format!(
            "SELECT {id}, {at}, {ai}, {cols} FROM {from} WHERE published_at IS NULL AND {condition} \
             ORDER BY {cols} LIMIT {SWEEP_PAGE}",
            id = quote_ident(&self.columns.id),
            at = quote_ident(&self.columns.aggregate_type),
            ai = quote_ident(&self.columns.aggregate_id),
            cols = order.join(", "),
            from = self.from(t, true),
        );
        let rows: Vec<Row> = conn.exec(sql, params).await.map_err(|e| {
            classify_mysql(&e).context(format_args!("poll: sweeping unpublished rows of {}", self.tables[t].table))
        })?;
        metrics().poll_queries(PollQuery::Claim, 1);
        Ok(rows
            .into_iter()
            .map(|mut row| {
                let mut take = |i: usize| row.take::<Value, _>(i).unwrap_or(Value::NULL);
                let key = take(0);
                let aggregate = (key_bytes(&take(1)), key_bytes(&take(2)));
                let position = (3..3 + order.len()).map(take).collect();
                Glimpse { key, aggregate, position }
            })
            .collect())
    }

    /// The unpublished rows of table `t` with primary keys `keys`, in order.
    ///
    /// # Errors
    /// Classified query errors.
    pub async fn read_keys(&self, conn: &mut Conn, t: usize, keys: &[Value]) -> Result<Vec<Polled>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let condition = format!("{} IN ({})", quote_ident(&self.columns.id), vec!["?"; keys.len()].join(", "));
        self.read_full(conn, t, false, (&condition, keys.to_vec()), keys.len()).await
    }

    /// Up to `poll.batch_rows` unpublished rows of `aggregate` in table `t`, after `after` and up to
    /// `upto`, in order: the rows a lifted hold left behind, those the progress table's number passed
    /// ([`HELD_AT`]) among them. Along the `(aggregate_type, aggregate_id, ...)` index.
    ///
    /// # Errors
    /// Classified query errors.
    pub async fn read_aggregate(
        &self,
        conn: &mut Conn,
        t: usize,
        aggregate: &Aggregate,
        after: Option<&Position>,
        upto: &Position,
    ) -> Result<Vec<Polled>> {
        let (c, p) = self.compare(t, false, upto);
        let mut condition = format!(
            "{} = ? AND {} = ? AND {c}",
            quote_ident(&self.columns.aggregate_type),
            quote_ident(&self.columns.aggregate_id)
        );
        let mut params = vec![Value::Bytes(aggregate.0.clone()), Value::Bytes(aggregate.1.clone())];
        params.extend(p);
        if let Some(after) = after {
            let (c, p) = self.compare(t, true, after);
            condition = format!("{condition} AND {c}");
            params.extend(p);
        }
        let unpublished = self.unpublished(t);
        self.read_full_where(conn, t, false, &unpublished, (&condition, params), self.batch_rows).await
    }

    /// Marks rows of table `t` published; returns how many changed. With the sequence order, `seqs` are
    /// their sequence numbers, marked as ranges of consecutive numbers (a range of consecutive numbers names
    /// exactly those rows, and a range scan costs the server a fraction of a long key list: measured on
    /// MariaDB 10.11, 1,000 rows in about a third of the time); else `keys`, their primary keys. One
    /// statement per 1,000 ranges or 5,000 keys.
    ///
    /// # Errors
    /// Classified query errors (the rows stay unpublished and are published again by the next run).
    pub async fn mark_published(&self, conn: &mut Conn, t: usize, keys: &[Value], seqs: &[u64]) -> Result<u64> {
        let table = self.tables[t].table.quoted();
        let failed =
            |e: mysql_async::Error| classify_mysql(&e).context(format_args!("poll: marking rows of {table} published"));
        let marked = match &self.tables[t].order {
            OrderKey::Sequence(_) if seqs.len() == keys.len() => {
                self.update_by_sequence(conn, t, "UTC_TIMESTAMP(6)", NOT_PUBLISHED, seqs).await.map_err(failed)?
            }
            _ => {
                let mut marked = 0;
                let id = quote_ident(&self.columns.id);
                for chunk in keys.chunks(5_000) {
                    conn.exec_drop(
                        format!(
                            "UPDATE {table} SET published_at = UTC_TIMESTAMP(6) WHERE {NOT_PUBLISHED} AND {id} IN ({})",
                            vec!["?"; chunk.len()].join(", ")
                        ),
                        chunk.to_vec(),
                    )
                    .await
                    .map_err(failed)?;
                    metrics().poll_queries(PollQuery::Mark, 1);
                    marked += conn.affected_rows();
                }
                marked
            }
        };
        metrics().poll_published(marked);
        Ok(marked)
    }

    /// `[poll] progress_table`: sets `published_at` of rows of table `t` whose aggregate is held (by their
    /// sequence numbers, as ranges) to [`HELD_AT`], so that the number may pass them. Returns how many
    /// changed.
    ///
    /// # Errors
    /// Classified query errors.
    pub async fn mark_held(&self, conn: &mut Conn, t: usize, seqs: &[u64]) -> Result<u64> {
        self.update_by_sequence(conn, t, &format!("'{HELD_AT}'"), "published_at IS NULL", seqs).await.map_err(|e| {
            classify_mysql(&e).context(format_args!("poll: marking held rows of {}", self.tables[t].table))
        })
    }

    /// Sets `published_at` to `value` in the rows of table `t` that meet `only` and whose sequence number
    /// is one of `seqs` (as ranges, 1,000 to a statement); returns how many changed. Nothing without a
    /// sequence order.
    async fn update_by_sequence(
        &self,
        conn: &mut Conn,
        t: usize,
        value: &str,
        only: &str,
        seqs: &[u64],
    ) -> std::result::Result<u64, mysql_async::Error> {
        let OrderKey::Sequence(c) = &self.tables[t].order else { return Ok(0) };
        let c = quote_ident(c);
        let mut changed = 0;
        for chunk in sequence_ranges(seqs).chunks(1_000) {
            let ranges: Vec<String> = chunk
                .iter()
                .map(|(lo, hi)| match lo == hi {
                    true => format!("{c} = {lo}"),
                    false => format!("{c} BETWEEN {lo} AND {hi}"),
                })
                .collect();
            conn.query_drop(format!(
                "UPDATE {} SET published_at = {value} WHERE {only} AND ({})",
                self.tables[t].table.quoted(),
                ranges.join(" OR ")
            ))
            .await?;
            metrics().poll_queries(PollQuery::Mark, 1);
            changed += conn.affected_rows();
        }
        Ok(changed)
    }

    /// The aggregates of table `t` with rows the progress table's number passed while they were held
    /// ([`HELD_AT`]): held at a run's start until their parked rows are found released. Along the read
    /// index; none without a progress table.
    ///
    /// # Errors
    /// Classified query errors.
    pub async fn held_aggregates(&self, conn: &mut Conn, t: usize) -> Result<Vec<Aggregate>> {
        if self.progress.is_none() {
            return Ok(Vec::new());
        }
        let (at, ai) = (quote_ident(&self.columns.aggregate_type), quote_ident(&self.columns.aggregate_id));
        let rows: Vec<(Value, Value)> = conn
            .query(format!("SELECT DISTINCT {at}, {ai} FROM {} WHERE published_at = '{HELD_AT}'", self.from(t, true)))
            .await
            .map_err(|e| {
                classify_mysql(&e).context(format_args!("poll: reading the held rows of {}", self.tables[t].table))
            })?;
        metrics().poll_queries(PollQuery::Backlog, 1);
        Ok(rows.iter().map(|(a, b)| (key_bytes(a), key_bytes(b))).collect())
    }

    /// Parks a dead-lettered row: unpublished, `next_attempt_at` = [`PARKED_UNTIL`], `last_error` saying why;
    /// with a progress table `published_at` = [`HELD_AT`] too, so that the number may pass it.
    ///
    /// # Errors
    /// Classified query errors.
    pub async fn park(&self, conn: &mut Conn, t: usize, key: &Value, reason: &str) -> Result<()> {
        let pt = &self.tables[t];
        let table = pt.table.quoted();
        let id = quote_ident(&self.columns.id);
        let held = match self.progress {
            Some(_) => format!(", published_at = '{HELD_AT}'"),
            None => String::new(),
        };
        conn.exec_drop(
            format!(
                "UPDATE {table} SET next_attempt_at = '{PARKED_UNTIL}', last_error = LEFT(?, {}){held} \
                 WHERE {NOT_PUBLISHED} AND {id} = ?",
                pt.last_error_chars
            ),
            (format!("dead-lettered: {reason}"), key.clone()),
        )
        .await
        .map_err(|e| classify_mysql(&e).context(format_args!("poll: parking a dead-lettered row of {table}")))?;
        metrics().poll_queries(PollQuery::Park, 1);
        if conn.affected_rows() > 0 {
            metrics().poll_parked();
        }
        Ok(())
    }

    /// Records that the broker refused the record of the row with event id `event_id` (`attempts + 1`,
    /// `last_error`). Broker outages, timeouts and restarts are never recorded: only a refusal.
    ///
    /// # Errors
    /// Classified query errors.
    pub async fn refused(&self, conn: &mut Conn, t: usize, key: &Value, error: &str) -> Result<()> {
        let pt = &self.tables[t];
        let table = pt.table.quoted();
        let id = quote_ident(&self.columns.id);
        conn.exec_drop(
            format!(
                "UPDATE {table} SET attempts = attempts + 1, last_error = LEFT(?, {}) \
                 WHERE {NOT_PUBLISHED} AND {id} = ?",
                pt.last_error_chars
            ),
            (error, key.clone()),
        )
        .await
        .map_err(|e| classify_mysql(&e).context(format_args!("poll: recording a refused record of {table}")))?;
        metrics().poll_queries(PollQuery::Fail, 1);
        metrics().poll_failed(conn.affected_rows());
        Ok(())
    }

    /// The parked rows of table `t`, each as its aggregate and (in sequence order) its sequence number: all
    /// of them (`among` = `None`: a scan of the unpublished rows, at a run's start), or those of `among`
    /// (along the `(aggregate_type, aggregate_id, ...)` index: the cheap re-check while holds are in
    /// force).
    ///
    /// # Errors
    /// Classified query errors.
    pub async fn parked_rows(
        &self,
        conn: &mut Conn,
        t: usize,
        among: Option<&[Aggregate]>,
    ) -> Result<Vec<(Aggregate, Option<u64>)>> {
        let (at, ai) = (quote_ident(&self.columns.aggregate_type), quote_ident(&self.columns.aggregate_id));
        let seq = match &self.tables[t].order {
            OrderKey::Sequence(c) => quote_ident(c),
            OrderKey::OccurredAtThenId => "NULL".into(),
        };
        let (from, which, params) = match among {
            None => (self.from(t, self.frontier(t) > 0), String::new(), Vec::new()),
            Some([]) => return Ok(Vec::new()),
            Some(among) => (
                self.from(t, false),
                format!(" AND ({})", vec![format!("({at} = ? AND {ai} = ?)"); among.len()].join(" OR ")),
                among.iter().flat_map(|(a, b)| [Value::Bytes(a.clone()), Value::Bytes(b.clone())]).collect(),
            ),
        };
        let rows: Vec<(Value, Value, Option<u64>)> = conn
            .exec(
                format!(
                    "SELECT {at}, {ai}, {seq} FROM {from} WHERE {unpublished} \
                     AND next_attempt_at = '{PARKED_UNTIL}'{which}",
                    unpublished = self.unpublished(t),
                ),
                params,
            )
            .await
            .map_err(|e| {
                classify_mysql(&e).context(format_args!("poll: reading the parked rows of {}", self.tables[t].table))
            })?;
        metrics().poll_queries(PollQuery::Backlog, 1);
        Ok(rows.iter().map(|(a, b, seq)| ((key_bytes(a), key_bytes(b)), *seq)).collect())
    }

    /// The rows of table `t` not yet published: `published_at IS NULL`; with a progress table, above its
    /// number, or [`HELD_AT`].
    fn unpublished(&self, t: usize) -> String {
        match (&self.tables[t].order, self.frontier(t)) {
            (OrderKey::Sequence(c), frontier) if frontier > 0 => {
                format!("((published_at IS NULL AND {} > {frontier}) OR published_at = '{HELD_AT}')", quote_ident(c))
            }
            _ if self.progress.is_some() => NOT_PUBLISHED.into(),
            _ => "published_at IS NULL".into(),
        }
    }

    /// The backlog of table `t`: its unpublished rows that are not parked (counted up to
    /// [`POLL_BACKLOG_CAP`]: a count reads every row it counts), and the age of the first of them by its
    /// `occurred_at` (UTC, as the binlog source's latency metric reads it; 0 when there is none). One
    /// statement.
    ///
    /// # Errors
    /// Classified query errors.
    pub async fn backlog(&self, conn: &mut Conn, t: usize) -> Result<(u64, f64)> {
        let table = self.tables[t].table.quoted();
        let order = self.order_columns(t).join(", ");
        let from = self.from(t, self.frontier(t) > 0);
        let unpublished = self.unpublished(t);
        let (due, waited_us): (Option<u64>, Option<i64>) = conn
            .query_first(format!(
                "SELECT (SELECT COUNT(*) FROM (SELECT 1 FROM {from} WHERE {unpublished} \
                 AND next_attempt_at <> '{PARKED_UNTIL}' LIMIT {POLL_BACKLOG_CAP}) d), \
                 TIMESTAMPDIFF(MICROSECOND, (SELECT {oa} FROM {from} WHERE {unpublished} \
                 AND next_attempt_at <> '{PARKED_UNTIL}' ORDER BY {order} LIMIT 1), UTC_TIMESTAMP(6))",
                oa = quote_ident(&self.columns.occurred_at),
            ))
            .await
            .map_err(|e| classify_mysql(&e).context(format_args!("poll: counting the backlog of {table}")))?
            .unwrap_or((None, None));
        metrics().poll_queries(PollQuery::Backlog, 1);
        Ok((due.unwrap_or(0), waited_us.unwrap_or(0).max(0) as f64 / 1e6))
    }

    /// The parked (dead-lettered) rows of table `t`.
    ///
    /// # Errors
    /// Classified query errors.
    pub async fn parked(&self, conn: &mut Conn, t: usize) -> Result<u64> {
        let table = self.tables[t].table.quoted();
        let parked: Option<u64> = conn
            .query_first(format!(
                "SELECT COUNT(*) FROM {from} WHERE {unpublished} AND next_attempt_at = '{PARKED_UNTIL}'",
                from = self.from(t, self.frontier(t) > 0),
                unpublished = self.unpublished(t),
            ))
            .await
            .map_err(|e| classify_mysql(&e).context(format_args!("poll: counting the parked rows of {table}")))?;
        Ok(parked.unwrap_or(0))
    }

    /// A row of a full read as [`Polled`].
    fn polled(&self, t: usize, mut row: Row) -> Polled {
        let pt = &self.tables[t];
        let width = self.order_columns(t).len();
        let key = row.take::<Value, _>(8).unwrap_or(Value::NULL);
        let flags = row.get::<Option<u64>, _>(9).flatten().unwrap_or(0);
        let (parked, held_at) = (flags & 1 != 0, flags & 2 != 0);
        let position: Position = (10..10 + width).map(|i| row.as_ref(i).cloned().unwrap_or(Value::NULL)).collect();
        let part = |i: usize| key_bytes(row.as_ref(i).unwrap_or(&Value::NULL));
        let aggregate = (part(1), part(2));
        let image = row.clone();
        let decoded = super::snapshot::decode(&pt.table, pt.present, self.columns.payload_encoding(), 10 + width, row)
            .map(|mut r| {
                r.from_snapshot = false;
                r
            });
        let row = decoded.map_err(|e| undecodable(&pt.table, &image, e.to_string()));
        Polled { row, key, aggregate, position, parked, held_at }
    }
}

/// After `quarantine release` republished a hold's events: marks their rows published (they were parked,
/// and held their aggregate in every relay), so the aggregate's later rows are published after them. `ids`
/// are event ids as published. Returns how many rows changed.
///
/// # Errors
/// Classified query errors.
pub async fn mark_released(conn: &mut Conn, table: &TableName, columns: &ColumnNames, ids: &[String]) -> Result<u64> {
    if ids.is_empty() {
        return Ok(0);
    }
    let id_family = super::snapshot::role_columns(conn, table, columns).await?[0].flatten();
    let marks = vec![super::column_types::id_param_sql(id_family); ids.len()].join(", ");
    conn.exec_drop(
        format!(
            "UPDATE {} SET published_at = UTC_TIMESTAMP(6), next_attempt_at = UTC_TIMESTAMP(6) \
             WHERE {NOT_PUBLISHED} AND {} IN ({marks})",
            table.quoted(),
            quote_ident(&columns.id)
        ),
        ids.to_vec(),
    )
    .await
    .map_err(|e| classify_mysql(&e).context(format_args!("marking the released rows of {table} published")))?;
    Ok(conn.affected_rows())
}

/// A row that does not decode, with its columns rendered as far as possible.
fn undecodable(table: &Arc<TableName>, row: &Row, message: String) -> Undecodable {
    let render = |i: usize| -> serde_json::Value {
        match row.as_ref(i) {
            None | Some(Value::NULL) => serde_json::Value::Null,
            Some(Value::Bytes(b)) => match std::str::from_utf8(b) {
                Ok(s) => s.into(),
                Err(_) => serde_json::json!({ "hex": b.iter().map(|x| format!("{x:02x}")).collect::<String>() }),
            },
            Some(other) => other.as_sql(true).trim_matches('\'').into(),
        }
    };
    let text = |i: usize| render(i).as_str().map(String::from);
    let image = crate::outbox::SLOT_NAMES.iter().enumerate().map(|(i, name)| (name.to_string(), render(i))).collect();
    Undecodable {
        table: table.clone(),
        id: text(0),
        aggregate_type: text(1),
        aggregate_id: text(2),
        image,
        message: format!("outbox row in {table}: {message}"),
    }
}

/// What `information_schema` says about a table's columns: name, data type, extra.
pub(crate) async fn columns_of(conn: &mut Conn, table: &TableName) -> Result<Vec<(String, String, String)>> {
    conn.exec(
        "SELECT COLUMN_NAME, DATA_TYPE, EXTRA FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
        (&table.database, &table.table),
    )
    .await
    .map_err(|e| classify_mysql(&e).context(format_args!("reading the columns of {table}")))
}

/// A key's bytes, to compare keys read by different statements (text and binary protocol).
pub fn key_bytes(value: &Value) -> Vec<u8> {
    match value {
        Value::Bytes(b) => b.clone(),
        other => other.as_sql(true).into_bytes(),
    }
}

/// `seqs` as ranges of consecutive numbers (inclusive), in order.
fn sequence_ranges(seqs: &[u64]) -> Vec<(u64, u64)> {
    let mut sorted = seqs.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    for seq in sorted {
        match ranges.last_mut() {
            Some((_, hi)) if *hi + 1 == seq => *hi = seq,
            _ => ranges.push((seq, seq)),
        }
    }
    ranges
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

/// The types the relay can use for each of its columns, in [`POLL_COLUMNS`] order. `next_attempt_at` holds
/// [`PARKED_UNTIL`], which a `TIMESTAMP` cannot (strict mode refuses the write, others store a zero date).
const POLL_COLUMN_TYPES: [&[&str]; 4] = [
    &["datetime", "timestamp"],
    &["tinyint", "smallint", "mediumint", "int", "bigint"],
    &["datetime"],
    &["varchar", "char", "text", "tinytext", "mediumtext", "longtext"],
];

/// The types relay column `i` ([`POLL_COLUMNS`] order) may have. With a progress table `published_at`
/// holds [`HELD_AT`], outside `TIMESTAMP`'s range, so it must be a `DATETIME` too.
fn poll_column_types(i: usize, progress: bool) -> &'static [&'static str] {
    if progress && i == 0 {
        &["datetime"]
    } else {
        POLL_COLUMN_TYPES[i]
    }
}

/// Each relay column of a table ([`POLL_COLUMNS`] order): `None` when usable, else `Some(None)` when it is
/// missing, `Some(Some(type))` when it has a type the relay cannot use.
fn poll_column_faults(found: &[(String, String, String)], progress: bool) -> [Option<Option<String>>; 4] {
    std::array::from_fn(|i| match found.iter().find(|c| c.0.eq_ignore_ascii_case(POLL_COLUMNS[i])) {
        None => Some(None),
        Some((_, data_type, _))
            if !poll_column_types(i, progress).contains(&data_type.to_ascii_lowercase().as_str()) =>
        {
            Some(Some(data_type.clone()))
        }
        Some(_) => None,
    })
}

/// What is wrong with the relay's columns of a table (missing, or of a type the relay cannot use), one
/// finding each; empty when they are usable. Also what `check` reports. `progress`: `[poll]
/// progress_table` is set.
pub fn poll_column_problems(table: &TableName, found: &[(String, String, String)], progress: bool) -> Vec<String> {
    POLL_COLUMNS
        .iter()
        .zip(poll_column_faults(found, progress))
        .enumerate()
        .filter_map(|(i, (name, fault))| match fault? {
            None => Some(format!(
                "{table} has no `{name}` column, which the polling relay needs (the relay's column names are fixed)"
            )),
            Some(data_type) => {
                let types = poll_column_types(i, progress);
                let why = if types == POLL_COLUMN_TYPES[i] {
                    ""
                } else {
                    " ([poll] progress_table: rows it passes unpublished are marked 1000-01-01, outside TIMESTAMP's range)"
                };
                Some(format!("{table}.{name} is {data_type}; the polling relay needs one of {}{why}", types.join(", ")))
            }
        })
        .collect()
}

/// The `ALTER TABLE` that gives a table the relay's columns it lacks (`ADD COLUMN`) or has with a type the
/// relay cannot use (`MODIFY COLUMN`: check what the column holds first); `None` when they are all usable.
pub fn poll_columns_ddl(table: &TableName, found: &[(String, String, String)], progress: bool) -> Option<String> {
    let clauses: Vec<String> = POLL_COLUMNS
        .iter()
        .zip(POLL_COLUMN_DEFINITIONS)
        .zip(poll_column_faults(found, progress))
        .filter_map(|((name, definition), fault)| {
            let verb = if fault?.is_some() { "MODIFY" } else { "ADD" };
            Some(format!("{verb} COLUMN {} {definition}", quote_ident(name)))
        })
        .collect();
    (!clauses.is_empty()).then(|| format!("ALTER TABLE {} {}", table.quoted(), clauses.join(", ")))
}

/// The `ALTER TABLE` that gives a table the sequence column and the index the relay reads along. Rows
/// already in the table are numbered in primary-key order.
pub fn sequence_ddl(table: &TableName) -> String {
    format!(
        "ALTER TABLE {} ADD COLUMN `{SEQUENCE_COLUMN}` BIGINT UNSIGNED NOT NULL AUTO_INCREMENT UNIQUE, \
         ADD INDEX idx_unpublished (`published_at`, `{SEQUENCE_COLUMN}`)",
        table.quoted()
    )
}

/// The ordering key of a table under `order`: its auto-increment column; or, when the user chose
/// `occurred_at`, `(occurred_at, id)` if it has an `occurred_at` column. `None` when there is none.
pub fn order_key(found: &[(String, String, String)], columns: &ColumnNames, order: PollOrder) -> Option<OrderKey> {
    match order {
        PollOrder::Sequence => found
            .iter()
            .find(|c| c.2.to_ascii_lowercase().contains("auto_increment"))
            .map(|(name, _, _)| OrderKey::Sequence(name.clone())),
        PollOrder::OccurredAt => {
            found.iter().any(|c| c.0.eq_ignore_ascii_case(&columns.occurred_at)).then_some(OrderKey::OccurredAtThenId)
        }
    }
}

/// Why a table has no order key under `order`, with the fix.
pub fn no_order_key(table: &TableName, columns: &ColumnNames, order: PollOrder) -> String {
    match order {
        PollOrder::Sequence => format!(
            "{table} has no AUTO_INCREMENT column: the polling relay publishes each aggregate's events in \
             insertion order, which only a sequence column records (occurred_at ties and writers' clocks \
             reorder them). Add one: {}. Or set [poll] order = \"occurred_at\" to order by ({}, {}) instead, \
             which reverses events that share a timestamp",
            sequence_ddl(table),
            columns.occurred_at,
            columns.id
        ),
        PollOrder::OccurredAt => format!(
            "{table} has no `{}` column for [poll] order = \"occurred_at\": map the column that says when each \
             event was written as occurred_at in [outbox.columns], or add a sequence column and remove \
             [poll] order: {}",
            columns.occurred_at,
            sequence_ddl(table)
        ),
    }
}

/// `last_error`'s declared length in characters (`TEXT` types: their byte limit).
async fn last_error_chars(conn: &mut Conn, table: &TableName) -> Result<u64> {
    let chars: Option<Option<u64>> = conn
        .exec_first(
            "SELECT CHARACTER_MAXIMUM_LENGTH FROM information_schema.COLUMNS \
             WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? AND COLUMN_NAME = 'last_error'",
            (&table.database, &table.table),
        )
        .await
        .map_err(|e| classify_mysql(&e).context(format_args!("reading the columns of {table}")))?;
    Ok(chars.flatten().unwrap_or(1000).clamp(1, 65_535))
}

async fn load_table(conn: &mut Conn, table: &TableName, config: &Config) -> Result<PollTable> {
    let (columns, order, progress) = (&config.outbox.columns, config.poll.order, config.poll.progress_table.is_some());
    let present = super::snapshot::present_roles(conn, table, columns).await?;
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
    let read_index = super::key_order::index_in_key_order(conn, table, &read_along).await?.ok_or_else(|| {
        Error::definite(format!(
            "{table} has no index on ({}, ...): every read of the polling relay would scan the table. Add it: {}",
            read_along.join(", "),
            read_index_ddl(table, &order, columns)
        ))
    })?;
    Ok(PollTable {
        table: Arc::new(table.clone()),
        present,
        order,
        last_error_chars,
        read_index,
        frontier: AtomicU64::new(0),
    })
}

/// `[poll] progress_table` as a table name: a bare name is in the first outbox table's database.
pub fn progress_table_name(config: &Config) -> Option<TableName> {
    let name = config.poll.progress_table.as_deref()?;
    Some(match name.split_once('.') {
        Some((database, table)) => TableName { database: database.into(), table: table.into() },
        None => TableName { database: config.tables()[0].database.clone(), table: name.into() },
    })
}

/// The `CREATE TABLE` of a progress table: one row per outbox table (`database.table`), the sequence
/// number every row up to which is published.
pub fn progress_table_ddl(progress: &TableName) -> String {
    format!(
        "CREATE TABLE {} (outbox_table VARCHAR(255) NOT NULL PRIMARY KEY, \
         published_through BIGINT UNSIGNED NOT NULL, updated_at DATETIME(6) NOT NULL) ENGINE=InnoDB",
        progress.quoted()
    )
}

/// What the relay needs for a progress table, refused with the fix when missing: the table, a row for
/// each outbox table (added at 0: nothing is known published by number yet), and the `PROCESS` privilege
/// ([`Relay::open_transactions`]).
///
/// # Errors
/// Definite errors naming what is missing; classified query errors.
pub async fn check_progress_table(conn: &mut Conn, progress: &TableName, outboxes: &[TableName]) -> Result<()> {
    let found = columns_of(conn, progress).await?;
    let has = |name: &str| found.iter().any(|c| c.0.eq_ignore_ascii_case(name));
    if !["outbox_table", "published_through", "updated_at"].iter().all(|c| has(c)) {
        return Err(Error::definite(format!(
            "[poll] progress_table = {progress}: {}. Create it: {}; and grant the relay's user SELECT, INSERT, \
             UPDATE on it",
            match found.is_empty() {
                true => "there is no such table (or the relay's user cannot see it)".to_string(),
                false => "it lacks the columns outbox_table, published_through, updated_at".to_string(),
            },
            progress_table_ddl(progress)
        )));
    }
    for outbox in outboxes {
        conn.exec_drop(
            format!(
                "INSERT IGNORE INTO {} (outbox_table, published_through, updated_at) VALUES (?, 0, UTC_TIMESTAMP(6))",
                progress.quoted()
            ),
            (outbox.to_string(),),
        )
        .await
        .map_err(|e| {
            let error = classify_mysql(&e);
            match !error.is_definite() {
                true => error.context(format_args!("poll: adding {outbox} to {progress}")),
                false => Error::definite(format!(
                    "[poll] progress_table = {progress}: cannot add {outbox} to it ({e}); grant the relay's user \
                     SELECT, INSERT, UPDATE on it"
                )),
            }
        })?;
    }
    Relay::open_transactions(conn).await.map_err(|e| match !e.is_definite() {
        true => e,
        false => Error::definite(format!(
            "[poll] progress_table needs the PROCESS privilege, to read information_schema.INNODB_TRX ({e}): \
             a sequence number a read passed without a row is known free only once every transaction open \
             then has ended. Grant it: GRANT PROCESS ON *.* TO <the relay's user>"
        )),
    })?;
    Ok(())
}

/// How far `outbox` is published, as the progress table says (0 when it has no row for it).
///
/// # Errors
/// Classified query errors.
pub async fn read_frontier(conn: &mut Conn, progress: &TableName, outbox: &TableName) -> Result<u64> {
    let through: Option<u64> = conn
        .exec_first(
            format!("SELECT published_through FROM {} WHERE outbox_table = ?", progress.quoted()),
            (outbox.to_string(),),
        )
        .await
        .map_err(|e| classify_mysql(&e).context(format_args!("poll: reading how far {outbox} is published")))?;
    Ok(through.unwrap_or(0))
}

/// The columns the relay's read index starts with under `order`.
pub fn read_index_columns<'a>(order: &'a OrderKey, columns: &'a ColumnNames) -> Vec<&'a str> {
    match order {
        OrderKey::Sequence(c) => vec!["published_at", c.as_str()],
        OrderKey::OccurredAtThenId => vec!["published_at", columns.occurred_at.as_str()],
    }
}

/// The `ALTER TABLE` that adds the relay's read index under `order`, online.
pub fn read_index_ddl(table: &TableName, order: &OrderKey, columns: &ColumnNames) -> String {
    let indexed = match order {
        OrderKey::Sequence(c) => quote_ident(c),
        OrderKey::OccurredAtThenId => format!("{}, {}", quote_ident(&columns.occurred_at), quote_ident(&columns.id)),
    };
    format!(
        "ALTER TABLE {} ADD INDEX idx_unpublished (`published_at`, {indexed}), ALGORITHM=INPLACE, LOCK=NONE",
        table.quoted()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(name: &str, data_type: &str, extra: &str) -> (String, String, String) {
        (name.into(), data_type.into(), extra.into())
    }

    /// The reference schema passes; a missing or mistyped relay column is named, a TIMESTAMP
    /// next_attempt_at among them (it cannot hold the parked date); the order key is the auto-increment
    /// column, or (occurred_at, id) only when chosen, else none with the ALTER TABLE that adds one.
    #[test]
    fn poll_columns_and_order_key_follow_the_table() {
        let table = TableName { database: "shop".into(), table: "outbox_events".into() };
        let reference = vec![
            col("id", "char", ""),
            col("seq", "bigint", "auto_increment"),
            col("occurred_at", "datetime", ""),
            col("published_at", "datetime", ""),
            col("attempts", "int", ""),
            col("next_attempt_at", "datetime", ""),
            col("last_error", "varchar", ""),
        ];
        assert!(poll_column_problems(&table, &reference, false).is_empty());
        assert!(poll_column_problems(&table, &reference, true).is_empty());
        let columns = ColumnNames::default();
        assert_eq!(order_key(&reference, &columns, PollOrder::Sequence), Some(OrderKey::Sequence("seq".into())));
        assert_eq!(order_key(&reference, &columns, PollOrder::OccurredAt), Some(OrderKey::OccurredAtThenId));
        let no_seq: Vec<_> = reference.iter().filter(|c| c.0 != "seq").cloned().collect();
        assert_eq!(order_key(&no_seq, &columns, PollOrder::Sequence), None);
        let why = no_order_key(&table, &columns, PollOrder::Sequence);
        assert!(why.contains("ADD COLUMN `seq` BIGINT UNSIGNED NOT NULL AUTO_INCREMENT UNIQUE"), "{why}");
        assert!(why.contains("order = \"occurred_at\""), "{why}");

        let mut broken: Vec<_> = reference.iter().filter(|c| c.0 != "last_error").cloned().collect();
        broken.iter_mut().find(|c| c.0 == "next_attempt_at").unwrap().1 = "timestamp".into();
        let problems = poll_column_problems(&table, &broken, false);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("next_attempt_at is timestamp"), "{problems:?}");
        assert!(problems[1].contains("no `last_error` column"), "{problems:?}");
        assert_eq!(
            poll_columns_ddl(&table, &broken, false).as_deref(),
            Some(
                "ALTER TABLE `shop`.`outbox_events` MODIFY COLUMN `next_attempt_at` DATETIME(6) NOT NULL DEFAULT \
                 CURRENT_TIMESTAMP(6), ADD COLUMN `last_error` VARCHAR(1000) NULL"
            )
        );
        assert_eq!(poll_columns_ddl(&table, &reference, false), None);

        // `published_at TIMESTAMP` serves without a progress table, not with one (HELD_AT is out of range).
        let mut stamped = reference.clone();
        stamped.iter_mut().find(|c| c.0 == "published_at").unwrap().1 = "timestamp".into();
        assert!(poll_column_problems(&table, &stamped, false).is_empty());
        let problems = poll_column_problems(&table, &stamped, true);
        assert!(problems.len() == 1 && problems[0].contains("published_at is timestamp"), "{problems:?}");
        assert!(problems[0].contains("progress_table"), "{problems:?}");
        assert_eq!(
            poll_columns_ddl(&table, &stamped, true).as_deref(),
            Some("ALTER TABLE `shop`.`outbox_events` MODIFY COLUMN `published_at` DATETIME(6) NULL")
        );
    }

    /// Consecutive numbers become one range; a number missing between two splits them.
    #[test]
    fn marked_numbers_become_exact_ranges() {
        assert_eq!(sequence_ranges(&[7, 3, 4, 5, 9, 10, 12, 4]), [(3, 5), (7, 7), (9, 10), (12, 12)]);
        assert!(sequence_ranges(&[]).is_empty());
    }

    /// Sequence values read in either protocol.
    #[test]
    fn sequence_values_read_in_both_protocols() {
        assert_eq!(sequence_value(&Value::UInt(7)), Some(7));
        assert_eq!(sequence_value(&Value::Int(7)), Some(7));
        assert_eq!(sequence_value(&Value::Bytes(b"18446744073709551615".to_vec())), Some(u64::MAX));
        assert_eq!(sequence_value(&Value::Int(-1)), None);
    }
}
