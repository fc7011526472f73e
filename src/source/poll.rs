//! The polling relay's side of the table (`source.kind = "poll"`): which rows a relay may claim, the
//! lease it claims them with, and the statements that mark them published, failed or dead-lettered. The
//! run loop that publishes what is claimed is `pipeline::poll`.
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2 (vocabulary, error, metrics, config).
//!
//! # The columns
//! `published_at` (NULL until Kafka acknowledged the row's event), `attempts` (failed deliveries so far),
//! `next_attempt_at` (not claimed before), `locked_at` and `locked_by` (the lease: which relay claimed the
//! row, and when it last renewed the claim), `last_error` (why the last delivery failed, or why the row was
//! dead-lettered). The names are fixed ([`POLL_COLUMNS`]); `outbox-cdc check` verifies them and the index.
//! `DATETIME` values are UTC: the relay's session runs with `time_zone = '+00:00'`, so `NOW(6)` is UTC.
//!
//! # The order rule
//! An aggregate's events are ordered by the table's auto-increment column if it has one, else by
//! `(occurred_at, id)` ([`OrderKey`]); that is the order consumers see. The rule every relay keeps:
//!
//! > A row is published only after every earlier row of its aggregate was acknowledged by Kafka and marked
//! > `published_at`, or is in the same batch, earlier in it, in the same relay.
//!
//! A claim ([`Relay::claim`]) takes, per aggregate, a *head* (an unpublished row with no earlier
//! unpublished row of its aggregate) and the unpublished rows right behind it, as long as each is due
//! and not leased, in order. Why it holds with N relays:
//! - **Another relay holds an earlier row.** That row is unpublished, so no later row of the aggregate is
//!   a head, whoever looks; the rows behind it can only be claimed together with it.
//! - **Two relays claim at once.** Both may see the same head; the locking read (`FOR UPDATE SKIP
//!   LOCKED`, which also re-checks the lease on the latest version of the row) gives each row to one of
//!   them, and a relay keeps an aggregate's rows only up to the first one it did not get. A relay that
//!   did not get the head keeps nothing of that aggregate.
//! - **A lease expires and another relay takes over.** The new relay claims the head again (and what is
//!   behind it), so it republishes from the first unmarked row on: duplicates, in order. A live relay
//!   renews its lease every third of `poll.lease_ms` until it has marked the batch (also while Kafka is
//!   away and the batch waits to be produced), and stops publishing when it cannot renew; the rule needs the lease to outlast a relay's stalls (a relay frozen longer than the
//!   lease with records in flight could have them land after the new holder's: keep `lease_ms` well above
//!   the broker's request timeout).
//! - **A delivery failed.** The whole batch gets `attempts + 1` and a later `next_attempt_at`; its head is
//!   not due, so it is not claimed, and the rows behind it are not heads: the aggregate waits.
//! - **A row is poison** (undecodable, too large, or failed `poll.max_attempts` times). It goes to the
//!   dead-letter topic and is *parked*: unpublished, `next_attempt_at` = [`PARKED_UNTIL`]. Being
//!   unpublished, it holds its aggregate in every relay, not just in the one whose state store has the hold.
//!
//! An event whose transaction commits after a later event of its aggregate was already published (the
//! application wrote two events of one aggregate in concurrent transactions) is published after it: the
//! relay sees rows only once they are committed. The binlog source publishes in commit order instead.
//!
//! # Why read first and lock second
//! The head test (`NOT EXISTS` an earlier unpublished row) must see rows another relay has locked: a
//! locking read with `SKIP LOCKED` would skip exactly those and take a follower for a head. So heads and
//! their followers are found with plain reads, and only the chosen rows are then locked by primary key.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row, Value};

use crate::config::{ColumnNames, Config, PayloadEncoding};
use crate::error::{classify_mysql, Error, Result};
use crate::metrics::{metrics, PollQuery, POLL_BACKLOG_CAP};
use crate::outbox::{quote_ident, OutboxRow, TableName};
use crate::poison::Origin;
use crate::source::decode::Undecodable;

/// The relay's columns, as the reference schema names them: `published_at`, `attempts`,
/// `next_attempt_at`, `locked_at`, `locked_by`, `last_error`.
pub const POLL_COLUMNS: [&str; 6] =
    ["published_at", "attempts", "next_attempt_at", "locked_at", "locked_by", "last_error"];

/// The relay's columns as `check` proposes to add them ([`poll_columns_ddl`]), in [`POLL_COLUMNS`] order.
pub const POLL_COLUMN_DEFINITIONS: [&str; 6] = [
    "DATETIME(6) NULL",
    "INT UNSIGNED NOT NULL DEFAULT 0",
    "DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)",
    "DATETIME(6) NULL",
    "VARCHAR(128) NULL",
    "VARCHAR(1000) NULL",
];

/// `next_attempt_at` of a dead-lettered (parked) row: never due.
pub const PARKED_UNTIL: &str = "9999-12-31 23:59:59";

/// The longest retry delay after a failed delivery, in seconds.
pub const MAX_RETRY_DELAY_S: u64 = 300;

/// The retry delay's ceiling after the `attempts`-th failed delivery: `min(300 s, 2^attempts s)`; the
/// delay is drawn from its upper half ([`Relay::fail`]).
pub fn retry_ceiling_s(attempts: u32) -> u64 {
    1u64.checked_shl(attempts).unwrap_or(u64::MAX).min(MAX_RETRY_DELAY_S)
}

/// How an aggregate's events are ordered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OrderKey {
    /// The table's `AUTO_INCREMENT` column.
    AutoIncrement(String),
    /// `occurred_at`, then the event id.
    OccurredAtThenId,
}

/// The fewest heads a claim asks for ([`PollTable::heads_wanted`]).
const MIN_HEADS: usize = 16;

/// One outbox table as the relay reads it.
#[derive(Debug)]
pub struct PollTable {
    /// The table.
    pub table: Arc<TableName>,
    /// Which roles it has columns for ([`crate::outbox::SLOT_NAMES`] order).
    present: [bool; 8],
    /// How its aggregates' events are ordered.
    pub order: OrderKey,
    /// How many heads the next claim asks for. A claim reads every unpublished row of the aggregates of
    /// its heads and keeps `poll.batch_rows` of them, so with a deep backlog per aggregate (a catch-up)
    /// asking for `batch_rows` heads would read up to `batch_rows` × the backlog to keep `batch_rows`.
    /// After a claim whose read was cut at `batch_rows`, the next asks for twice the aggregates that read
    /// reached (at least [`MIN_HEADS`]); after one that was not cut, for `batch_rows` again.
    heads_wanted: AtomicUsize,
}

/// The heads the claim after one asks for: `read_rows` rows of `aggregates` aggregates were read, at most
/// `batch_rows` ([`PollTable::heads_wanted`]).
fn next_heads_wanted(read_rows: usize, aggregates: usize, batch_rows: usize) -> usize {
    if read_rows < batch_rows {
        return batch_rows;
    }
    (2 * aggregates).clamp(MIN_HEADS.min(batch_rows), batch_rows)
}

/// A claimed row.
#[derive(Debug)]
pub struct Claimed {
    /// The row, or why it does not decode.
    pub row: std::result::Result<OutboxRow, Undecodable>,
    /// The primary key as stored (for the statements that mark it).
    pub key: Value,
    /// Failed deliveries so far.
    pub attempts: u32,
    /// Why the last one failed.
    pub last_error: Option<String>,
}

impl Claimed {
    /// The event id, if it decoded.
    pub fn id(&self) -> Option<&str> {
        match &self.row {
            Ok(row) => Some(&row.id),
            Err(bad) => bad.id.as_deref(),
        }
    }
}

/// One relay: its id in `locked_by`, its settings, and the tables it polls.
#[derive(Debug)]
pub struct Relay {
    id: String,
    lease_us: u64,
    batch_rows: usize,
    columns: ColumnNames,
    tables: Vec<PollTable>,
}

impl Relay {
    /// Reads the layout of every outbox table.
    ///
    /// # Errors
    /// A definite error for a table without the required columns, the relay's columns, or an ordering
    /// column; classified query errors.
    pub async fn load(conn: &mut Conn, config: &Config) -> Result<Relay> {
        // READ COMMITTED: the relay's locking statements then lock the rows they change and no gaps, so
        // they never block (or deadlock with) the application's inserts into the table. Seen under the
        // default REPEATABLE READ: a mark `UPDATE` reading along idx_ready held next-key locks that an
        // application's outbox INSERT deadlocked with, rolling the business transaction back.
        conn.query_drop("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
            .await
            .map_err(|e| classify_mysql(&e).context("poll: setting the relay's isolation level"))?;
        let mut tables = Vec::new();
        for table in config.tables() {
            tables.push(load_table(conn, table, &config.outbox.columns, config.poll.batch_rows).await?);
        }
        Ok(Relay {
            id: config.poll.relay_id(),
            lease_us: config.poll.lease_ms * 1000,
            batch_rows: config.poll.batch_rows,
            columns: config.outbox.columns.clone(),
            tables,
        })
    }

    /// This relay's `locked_by`.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The polled tables.
    pub fn tables(&self) -> &[PollTable] {
        &self.tables
    }

    /// Where a claimed row was read, for dead letters and holds.
    pub fn origin(&self, t: usize) -> Origin {
        Origin {
            snapshot: false,
            gtid: None,
            file: format!("{} (polled)", self.tables[t].table),
            position: 0,
            row_index: 0,
        }
    }

    /// `lease free` for alias `a` (empty for none): never leased, or its lease expired.
    fn lease_free(&self, a: &str) -> String {
        format!("({a}locked_at IS NULL OR {a}locked_at < NOW(6) - INTERVAL {} MICROSECOND)", self.lease_us)
    }

    /// Claims up to `poll.batch_rows` rows of table `t` under the order rule (module doc): heads and the
    /// due, free rows right behind them, locked by primary key and leased to this relay in one short
    /// transaction. Returns them in publishing order (each aggregate's rows in order).
    ///
    /// # Errors
    /// Classified query errors (nothing is leased then).
    pub async fn claim(&self, conn: &mut Conn, t: usize) -> Result<Vec<Claimed>> {
        let pt = &self.tables[t];
        let table = pt.table.quoted();
        let (at, ai, id) = (
            quote_ident(&self.columns.aggregate_type),
            quote_ident(&self.columns.aggregate_id),
            quote_ident(&self.columns.id),
        );
        let failed = |what: &'static str| {
            let name = pt.table.clone();
            move |e: mysql_async::Error| classify_mysql(&e).context(format_args!("poll: {what} {name}"))
        };
        // 1. Heads: due, free, and no earlier unpublished row of their aggregate (plain read).
        let before = match &pt.order {
            OrderKey::AutoIncrement(c) => format!("e.{c} < o.{c}", c = quote_ident(c)),
            OrderKey::OccurredAtThenId => {
                let oa = quote_ident(&self.columns.occurred_at);
                format!("(e.{oa} < o.{oa} OR (e.{oa} = o.{oa} AND e.{id} < o.{id}))")
            }
        };
        let heads_sql = format!(
            "SELECT o.{at}, o.{ai} FROM {table} o WHERE o.published_at IS NULL AND o.next_attempt_at <= NOW(6) \
             AND {free} AND NOT EXISTS (SELECT 1 FROM {table} e WHERE e.{at} = o.{at} AND e.{ai} = o.{ai} \
             AND e.published_at IS NULL AND {before}) ORDER BY o.next_attempt_at LIMIT {n}",
            free = self.lease_free("o."),
            n = pt.heads_wanted.load(Ordering::Relaxed)
        );
        let heads: Vec<(Value, Value)> = conn.query(heads_sql).await.map_err(failed("finding heads in"))?;
        metrics().poll_queries(PollQuery::Claim, 1);
        if heads.is_empty() {
            return Ok(Vec::new());
        }
        // 2. The unpublished rows of those aggregates, in order (plain read).
        let order = match &pt.order {
            OrderKey::AutoIncrement(c) => quote_ident(c),
            OrderKey::OccurredAtThenId => format!("{}, {id}", quote_ident(&self.columns.occurred_at)),
        };
        let roles: Vec<String> = (self.columns.required().iter().zip(pt.present))
            .map(|((name, _), present)| if present { quote_ident(name) } else { "NULL".into() })
            .collect();
        let aggregates = vec![format!("({at} = ? AND {ai} = ?)"); heads.len()].join(" OR ");
        let rows_sql = format!(
            "SELECT {roles}, {id}, attempts, last_error, next_attempt_at <= NOW(6), {free}, locked_by IS NOT NULL\
             {additional} FROM {table} \
             WHERE published_at IS NULL AND ({aggregates}) ORDER BY {at}, {ai}, {order} LIMIT {n}",
            roles = roles.join(", "),
            // `[outbox] additional_placement` columns, after the relay's own (ADDITIONAL_FROM).
            additional = self.columns.additional().iter().map(|c| format!(", {}", quote_ident(c))).collect::<String>(),
            free = self.lease_free(""),
            n = self.batch_rows
        );
        let params: Vec<Value> = heads.iter().flat_map(|(t, i)| [t.clone(), i.clone()]).collect();
        let rows: Vec<Row> = conn.exec(rows_sql, params).await.map_err(failed("reading"))?;
        metrics().poll_queries(PollQuery::Claim, 1);
        // Per aggregate, the prefix of rows that are due and free.
        let heads: HashSet<Aggregate> = heads.iter().map(|(t, i)| (key_bytes(t), key_bytes(i))).collect();
        let seen: Vec<(Aggregate, bool, bool)> = rows
            .iter()
            .map(|row| {
                let part = |i: usize| key_bytes(row.as_ref(i).unwrap_or(&Value::NULL));
                let flag = |i: usize| row.get::<Option<i64>, _>(i).flatten() == Some(1);
                ((part(1), part(2)), flag(11), flag(12))
            })
            .collect();
        let aggregates = seen.iter().map(|(a, _, _)| a).collect::<HashSet<_>>().len();
        pt.heads_wanted.store(next_heads_wanted(rows.len(), aggregates, self.batch_rows), Ordering::Relaxed);
        let groups = choose(&seen, |a| heads.contains(a));
        let chosen: Vec<(usize, Row)> =
            groups.into_iter().zip(rows).filter_map(|(group, row)| group.map(|g| (g, row))).collect();
        if chosen.is_empty() {
            return Ok(Vec::new());
        }
        // 3. Lock the chosen rows by primary key, re-checking on their latest versions; keep each
        //    aggregate's prefix up to the first row not locked; lease them.
        let keys: Vec<Value> = chosen.iter().map(|(_, r)| r.as_ref(8).cloned().unwrap_or(Value::NULL)).collect();
        let marks = vec!["?"; keys.len()].join(", ");
        let mut tx =
            conn.start_transaction(mysql_async::TxOpts::default()).await.map_err(failed("starting the claim of"))?;
        let lock_sql = format!(
            "SELECT {id} FROM {table} WHERE {id} IN ({marks}) AND published_at IS NULL \
             AND next_attempt_at <= NOW(6) AND {free} FOR UPDATE SKIP LOCKED",
            free = self.lease_free("")
        );
        let locked: Vec<Value> = tx.exec(lock_sql, keys).await.map_err(failed("locking rows of"))?;
        metrics().poll_queries(PollQuery::Claim, 2);
        let locked: HashSet<Vec<u8>> = locked.iter().map(key_bytes).collect();
        let got: Vec<bool> =
            chosen.iter().map(|(_, row)| locked.contains(&key_bytes(row.as_ref(8).unwrap_or(&Value::NULL)))).collect();
        let groups: Vec<usize> = chosen.iter().map(|(g, _)| *g).collect();
        let kept: Vec<Row> = keep_locked(&groups, &got)
            .into_iter()
            .zip(chosen)
            .filter(|(keep, _)| *keep)
            .map(|(_, (_, row))| row)
            .collect();
        if kept.is_empty() {
            tx.rollback().await.map_err(failed("ending the claim of"))?;
            metrics().poll_queries(PollQuery::Claim, 1);
            return Ok(Vec::new());
        }
        let keys: Vec<Value> = kept.iter().map(|r| r.as_ref(8).cloned().unwrap_or(Value::NULL)).collect();
        let lease_sql = format!(
            "UPDATE {table} SET locked_at = NOW(6), locked_by = ? WHERE {id} IN ({})",
            vec!["?"; keys.len()].join(", ")
        );
        let mut params = vec![Value::from(self.id.as_str())];
        params.extend(keys);
        tx.exec_drop(lease_sql, params).await.map_err(failed("leasing rows of"))?;
        tx.commit().await.map_err(failed("committing the claim of"))?;
        metrics().poll_queries(PollQuery::Claim, 2);
        // A claimable row still naming a holder is one whose lease expired (a release clears it).
        let taken_over = kept.iter().filter(|r| r.get::<Option<i64>, _>(TAKEN_OVER).flatten() == Some(1)).count();
        metrics().poll_claimed(kept.len() as u64, taken_over as u64);
        let encoding = self.columns.payload_encoding();
        Ok(kept.into_iter().map(|row| claimed(&pt.table, pt.present, encoding, row)).collect())
    }

    /// Renews this relay's lease on `keys`; false when it no longer holds all of them (another relay took
    /// over after the lease expired: stop publishing them).
    ///
    /// # Errors
    /// Classified query errors.
    pub async fn renew(&self, conn: &mut Conn, t: usize, keys: &[Value]) -> Result<bool> {
        let table = self.tables[t].table.quoted();
        let id = quote_ident(&self.columns.id);
        let marks = vec!["?"; keys.len()].join(", ");
        let mut params = vec![Value::from(self.id.as_str())];
        params.extend(keys.iter().cloned());
        let failed =
            |e: mysql_async::Error| classify_mysql(&e).context(format_args!("poll: renewing the lease on {table}"));
        conn.exec_drop(
            format!(
                "UPDATE {table} SET locked_at = NOW(6) WHERE locked_by = ? AND published_at IS NULL AND {id} IN ({marks})"
            ),
            params.clone(),
        )
        .await
        .map_err(failed)?;
        let held: Option<u64> = conn
            .exec_first(
                format!(
                    "SELECT COUNT(*) FROM {table} WHERE locked_by = ? AND published_at IS NULL AND {id} IN ({marks})"
                ),
                params,
            )
            .await
            .map_err(failed)?;
        metrics().poll_queries(PollQuery::Renew, 2);
        Ok(held == Some(keys.len() as u64))
    }

    /// Marks `keys` published and releases their lease, in one statement; returns how many rows this relay
    /// still held (fewer: another relay took over and publishes them again).
    ///
    /// # Errors
    /// Classified query errors (the rows stay leased until the lease expires, then are published again).
    pub async fn mark_published(&self, conn: &mut Conn, t: usize, keys: &[Value]) -> Result<u64> {
        if keys.is_empty() {
            return Ok(0);
        }
        let table = self.tables[t].table.quoted();
        let id = quote_ident(&self.columns.id);
        let mut params = vec![Value::from(self.id.as_str())];
        params.extend(keys.iter().cloned());
        conn.exec_drop(
            format!(
                "UPDATE {table} SET published_at = NOW(6), locked_at = NULL, locked_by = NULL \
                 WHERE locked_by = ? AND published_at IS NULL AND {id} IN ({})",
                vec!["?"; keys.len()].join(", ")
            ),
            params,
        )
        .await
        .map_err(|e| classify_mysql(&e).context(format_args!("poll: marking rows of {table} published")))?;
        metrics().poll_queries(PollQuery::Mark, 1);
        metrics().poll_published(conn.affected_rows());
        Ok(conn.affected_rows())
    }

    /// Parks a dead-lettered row (module doc): unpublished, never due, `last_error` saying why.
    ///
    /// # Errors
    /// Classified query errors.
    pub async fn park(&self, conn: &mut Conn, t: usize, key: &Value, reason: &str) -> Result<()> {
        let table = self.tables[t].table.quoted();
        let id = quote_ident(&self.columns.id);
        conn.exec_drop(
            format!(
                "UPDATE {table} SET next_attempt_at = '{PARKED_UNTIL}', locked_at = NULL, locked_by = NULL, \
                 last_error = LEFT(?, 1000) WHERE locked_by = ? AND published_at IS NULL AND {id} = ?"
            ),
            (format!("dead-lettered: {reason}"), self.id.as_str(), key.clone()),
        )
        .await
        .map_err(|e| classify_mysql(&e).context(format_args!("poll: parking a dead-lettered row of {table}")))?;
        metrics().poll_queries(PollQuery::Park, 1);
        if conn.affected_rows() > 0 {
            metrics().poll_parked();
        }
        Ok(())
    }

    /// Records a failed delivery of `keys`: `attempts + 1`, `last_error`, `next_attempt_at` = now + a delay
    /// drawn from `[c/2, c]` with `c` = [`retry_ceiling_s`] of the new count, and the lease released.
    ///
    /// # Errors
    /// Classified query errors (the rows stay leased until the lease expires).
    pub async fn fail(&self, conn: &mut Conn, t: usize, keys: &[Value], error: &str) -> Result<()> {
        if keys.is_empty() {
            return Ok(());
        }
        let table = self.tables[t].table.quoted();
        let id = quote_ident(&self.columns.id);
        let mut params = vec![Value::from(error), Value::from(self.id.as_str())];
        params.extend(keys.iter().cloned());
        // `next_attempt_at` is assigned before `attempts` and computed from `attempts + 1`, so that it reads
        // the same whether the server assigns left to right or simultaneously (SIMULTANEOUS_ASSIGNMENT).
        conn.exec_drop(
            format!(
                "UPDATE {table} SET \
                 next_attempt_at = NOW(6) + INTERVAL FLOOR(LEAST({MAX_RETRY_DELAY_S}, POW(2, LEAST(attempts + 1, 20))) \
                 * (0.5 + RAND() / 2) * 1000000) MICROSECOND, \
                 attempts = attempts + 1, last_error = LEFT(?, 1000), locked_at = NULL, locked_by = NULL \
                 WHERE locked_by = ? AND published_at IS NULL AND {id} IN ({})",
                vec!["?"; keys.len()].join(", ")
            ),
            params,
        )
        .await
        .map_err(|e| classify_mysql(&e).context(format_args!("poll: recording a failed delivery on {table}")))?;
        metrics().poll_queries(PollQuery::Fail, 1);
        metrics().poll_failed(conn.affected_rows());
        Ok(())
    }

    /// The backlog of table `t`: its due unpublished rows (counted up to [`POLL_BACKLOG_CAP`]: a count reads
    /// every row it counts) and the seconds since the oldest of them became due (0 when none is). One
    /// statement, along `idx_ready`.
    ///
    /// # Errors
    /// Classified query errors.
    pub async fn backlog(&self, conn: &mut Conn, t: usize) -> Result<(u64, f64)> {
        let table = self.tables[t].table.quoted();
        let (due, waited_us): (Option<u64>, Option<i64>) = conn
            .query_first(format!(
                "SELECT (SELECT COUNT(*) FROM (SELECT 1 FROM {table} WHERE published_at IS NULL \
                 AND next_attempt_at <= NOW(6) LIMIT {POLL_BACKLOG_CAP}) d), \
                 TIMESTAMPDIFF(MICROSECOND, (SELECT MIN(next_attempt_at) FROM {table} WHERE published_at IS NULL), NOW(6))"
            ))
            .await
            .map_err(|e| classify_mysql(&e).context(format_args!("poll: counting the backlog of {table}")))?
            .unwrap_or((None, None));
        metrics().poll_queries(PollQuery::Backlog, 1);
        Ok((due.unwrap_or(0), waited_us.unwrap_or(0).max(0) as f64 / 1e6))
    }

    /// The parked (dead-lettered) rows of table `t`: unpublished, never due again. Along `idx_ready`.
    ///
    /// # Errors
    /// Classified query errors.
    pub async fn parked(&self, conn: &mut Conn, t: usize) -> Result<u64> {
        let table = self.tables[t].table.quoted();
        let parked: Option<u64> = conn
            .query_first(format!(
                "SELECT COUNT(*) FROM {table} WHERE published_at IS NULL AND next_attempt_at = '{PARKED_UNTIL}'"
            ))
            .await
            .map_err(|e| classify_mysql(&e).context(format_args!("poll: counting the parked rows of {table}")))?;
        Ok(parked.unwrap_or(0))
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
            "UPDATE {} SET published_at = UTC_TIMESTAMP(6), next_attempt_at = UTC_TIMESTAMP(6), locked_at = NULL, \
             locked_by = NULL WHERE published_at IS NULL AND {} IN ({marks})",
            table.quoted(),
            quote_ident(&columns.id)
        ),
        ids.to_vec(),
    )
    .await
    .map_err(|e| classify_mysql(&e).context(format_args!("marking the released rows of {table} published")))?;
    Ok(conn.affected_rows())
}

/// An aggregate as its (type, id) bytes.
type Aggregate = (Vec<u8>, Vec<u8>);

/// The order rule on a claim's plain read (module doc). `rows` are `(aggregate, due, free)` in (aggregate,
/// order key) order, every unpublished row of the aggregates found as heads; `is_head` says whether an
/// aggregate was found as one. Returns, per row, the group (one per aggregate) it is claimed in, or `None`:
/// each aggregate's rows from its first on, while they are due and free. The first row of an aggregate is
/// its earliest unpublished one, so a leased or failed row stops its aggregate wherever it is. An aggregate
/// met a second time (ids equal only in the columns' collation, whose rows interleave) claims nothing then.
fn choose(rows: &[(Aggregate, bool, bool)], is_head: impl Fn(&Aggregate) -> bool) -> Vec<Option<usize>> {
    let mut seen: HashSet<&Aggregate> = HashSet::new();
    let mut current: Option<&Aggregate> = None;
    let (mut group, mut open) = (0, false);
    rows.iter()
        .map(|(aggregate, due, free)| {
            if current != Some(aggregate) {
                group += 1;
                open = is_head(aggregate) && seen.insert(aggregate);
                current = Some(aggregate);
            }
            open = open && *due && *free;
            open.then_some(group)
        })
        .collect()
}

/// After the locking read: which chosen rows to keep, given each one's group and whether this relay got its
/// lock: each group's rows up to the first one it did not get (another relay has that one, or it changed).
fn keep_locked(groups: &[usize], locked: &[bool]) -> Vec<bool> {
    let mut broken = None;
    groups
        .iter()
        .zip(locked)
        .map(|(group, locked)| {
            if broken == Some(*group) {
                return false;
            }
            if !locked {
                broken = Some(*group);
            }
            *locked
        })
        .collect()
}

/// A key's bytes, to compare keys read by different statements (text and binary protocol).
fn key_bytes(value: &Value) -> Vec<u8> {
    match value {
        Value::Bytes(b) => b.clone(),
        other => other.as_sql(true).into_bytes(),
    }
}

/// In a row of the claim's read: whether the row still names a holder (`locked_by`).
const TAKEN_OVER: usize = 13;

/// Where the `[outbox] additional_placement` columns start in a row of the claim's read.
const ADDITIONAL_FROM: usize = 14;

/// A row of the claim's read (roles, key, attempts, last_error, due, free, taken over, additional columns) as a
/// [`Claimed`].
fn claimed(table: &Arc<TableName>, present: [bool; 8], encoding: PayloadEncoding, mut row: Row) -> Claimed {
    let key = row.take::<Value, _>(8).unwrap_or(Value::NULL);
    let attempts = row.get::<Option<u32>, _>(9).flatten().unwrap_or(0);
    let last_error = row.get::<Option<String>, _>(10).flatten();
    let image = row.clone();
    let decoded = super::snapshot::decode(table, present, encoding, ADDITIONAL_FROM, row).map(|mut r| {
        r.from_snapshot = false;
        r
    });
    let row = decoded.map_err(|e| undecodable(table, &image, e.to_string()));
    Claimed { row, key, attempts, last_error }
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

/// The types the relay can use for each of its columns, in [`POLL_COLUMNS`] order.
const POLL_COLUMN_TYPES: [&[&str]; 6] = [
    &["datetime", "timestamp"],
    &["tinyint", "smallint", "mediumint", "int", "bigint"],
    &["datetime", "timestamp"],
    &["datetime", "timestamp"],
    &["varchar", "char", "text", "tinytext", "mediumtext"],
    &["varchar", "text", "tinytext", "mediumtext", "longtext"],
];

/// Each relay column of a table ([`POLL_COLUMNS`] order): `None` when usable, else `Some(None)` when it is
/// missing, `Some(Some(type))` when it has a type the relay cannot use.
fn poll_column_faults(found: &[(String, String, String)]) -> [Option<Option<String>>; 6] {
    std::array::from_fn(|i| match found.iter().find(|c| c.0.eq_ignore_ascii_case(POLL_COLUMNS[i])) {
        None => Some(None),
        Some((_, data_type, _)) if !POLL_COLUMN_TYPES[i].contains(&data_type.to_ascii_lowercase().as_str()) => {
            Some(Some(data_type.clone()))
        }
        Some(_) => None,
    })
}

/// What is wrong with the relay's columns of a table (missing, or of a type the relay cannot use), one
/// finding each; empty when they are usable. Also what `check` reports.
pub fn poll_column_problems(table: &TableName, found: &[(String, String, String)]) -> Vec<String> {
    POLL_COLUMNS
        .iter()
        .zip(poll_column_faults(found))
        .zip(POLL_COLUMN_TYPES)
        .filter_map(|((name, fault), types)| match fault? {
            None => Some(format!(
                "{table} has no `{name}` column, which the polling relay needs (the relay's column names are fixed)"
            )),
            Some(data_type) => {
                Some(format!("{table}.{name} is {data_type}; the polling relay needs one of {}", types.join(", ")))
            }
        })
        .collect()
}

/// The `ALTER TABLE` that gives a table the relay's columns it lacks (`ADD COLUMN`) or has with a type the
/// relay cannot use (`MODIFY COLUMN`: check what the column holds first); `None` when they are all usable.
pub fn poll_columns_ddl(table: &TableName, found: &[(String, String, String)]) -> Option<String> {
    let clauses: Vec<String> = POLL_COLUMNS
        .iter()
        .zip(POLL_COLUMN_DEFINITIONS)
        .zip(poll_column_faults(found))
        .filter_map(|((name, definition), fault)| {
            let verb = if fault?.is_some() { "MODIFY" } else { "ADD" };
            Some(format!("{verb} COLUMN {} {definition}", quote_ident(name)))
        })
        .collect();
    (!clauses.is_empty()).then(|| format!("ALTER TABLE {} {}", table.quoted(), clauses.join(", ")))
}

/// The ordering key of a table: its auto-increment column, else `(occurred_at, id)` when it has an
/// `occurred_at` column.
pub fn order_key(found: &[(String, String, String)], columns: &ColumnNames) -> Option<OrderKey> {
    if let Some((name, _, _)) = found.iter().find(|c| c.2.to_ascii_lowercase().contains("auto_increment")) {
        return Some(OrderKey::AutoIncrement(name.clone()));
    }
    found.iter().any(|c| c.0.eq_ignore_ascii_case(&columns.occurred_at)).then_some(OrderKey::OccurredAtThenId)
}

async fn load_table(conn: &mut Conn, table: &TableName, columns: &ColumnNames, batch_rows: usize) -> Result<PollTable> {
    let present = super::snapshot::present_roles(conn, table, columns).await?;
    let found = columns_of(conn, table).await?;
    let problems = poll_column_problems(table, &found);
    if !problems.is_empty() {
        return Err(Error::definite(format!(
            "{}. Add them (source.kind = \"poll\"): {}",
            problems.join("; "),
            poll_columns_ddl(table, &found).unwrap_or_default()
        )));
    }
    let order = order_key(&found, columns).ok_or_else(|| {
        Error::definite(format!(
            "{table} has neither an AUTO_INCREMENT column nor `{}`: the polling relay cannot tell the order of \
             an aggregate's events. Map the column that says when each event was written as occurred_at in \
             [outbox.columns]",
            columns.occurred_at
        ))
    })?;
    Ok(PollTable { table: Arc::new(table.clone()), present, order, heads_wanted: AtomicUsize::new(batch_rows) })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The retry ceiling doubles from 2 s and stops at 300 s, also for counts that would overflow.
    #[test]
    fn retry_ceiling_doubles_up_to_five_minutes() {
        let ceilings: Vec<u64> = [0, 1, 2, 5, 8, 9, 63, 64, 1000].into_iter().map(retry_ceiling_s).collect();
        assert_eq!(ceilings, [1, 2, 4, 32, 256, 300, 300, 300, 300]);
    }

    fn agg(name: &str) -> Aggregate {
        (b"order".to_vec(), name.as_bytes().to_vec())
    }

    /// The order rule on a claim's read, one case per way an aggregate stops: a leased row (another relay's),
    /// a row not due (a failed delivery waiting), a parked row; an aggregate that was not a head; an
    /// aggregate met twice. Rows after the stop are never claimed, even when due and free.
    #[test]
    fn an_aggregate_is_claimed_from_its_first_row_while_due_and_free() {
        let (a, b, c, d, e) = (agg("A"), agg("B"), agg("C"), agg("D"), agg("E"));
        let rows = vec![
            (a.clone(), true, true),
            (a.clone(), true, true),
            (a.clone(), true, false), // leased by another relay
            (a.clone(), true, true),
            (b.clone(), true, false), // B's first row is leased: nothing of B
            (b.clone(), true, true),
            (c.clone(), false, true), // C's first row waits for its retry (or is parked)
            (c.clone(), true, true),
            (d.clone(), true, true), // not among the heads
            (e.clone(), true, true),
            (a.clone(), true, true), // A again (collation): not a head the second time
        ];
        let heads = [a.clone(), b.clone(), c.clone(), e.clone()];
        let got = choose(&rows, |x| heads.contains(x));
        assert_eq!(got, [Some(1), Some(1), None, None, None, None, None, None, None, Some(5), None]);
    }

    /// A read cut at batch_rows asks next for twice the aggregates it reached (16 at least, batch_rows at
    /// most); a read that was not cut asks for batch_rows heads again.
    #[test]
    fn a_deep_backlog_narrows_the_next_claims_heads() {
        assert_eq!(next_heads_wanted(500, 5, 500), 16, "catch-up: 5 aggregates of 100 rows filled the batch");
        assert_eq!(next_heads_wanted(500, 40, 500), 80);
        assert_eq!(next_heads_wanted(500, 400, 500), 500);
        assert_eq!(next_heads_wanted(120, 3, 500), 500, "not cut: the backlog is shallow");
        assert_eq!(next_heads_wanted(7, 1, 7), 7, "batch_rows below the minimum");
    }

    /// After the locking read, a group keeps its rows up to the first one another relay locked first;
    /// other groups are unaffected.
    #[test]
    fn a_row_not_locked_cuts_its_aggregate_there() {
        let groups = [1, 1, 1, 2, 2, 3];
        let locked = [true, false, true, true, true, false];
        assert_eq!(keep_locked(&groups, &locked), [true, false, false, true, true, false]);
    }

    fn col(name: &str, data_type: &str, extra: &str) -> (String, String, String) {
        (name.into(), data_type.into(), extra.into())
    }

    /// The reference schema passes; a missing or mistyped relay column is named; the order key is the
    /// auto-increment column when there is one, else occurred_at then id, else none.
    #[test]
    fn poll_columns_and_order_key_follow_the_table() {
        let table = TableName { database: "shop".into(), table: "outbox_events".into() };
        let reference = vec![
            col("id", "char", ""),
            col("occurred_at", "datetime", ""),
            col("published_at", "datetime", ""),
            col("attempts", "int", ""),
            col("next_attempt_at", "datetime", ""),
            col("locked_at", "datetime", ""),
            col("locked_by", "varchar", ""),
            col("last_error", "varchar", ""),
        ];
        assert!(poll_column_problems(&table, &reference).is_empty());
        let columns = ColumnNames::default();
        assert_eq!(order_key(&reference, &columns), Some(OrderKey::OccurredAtThenId));
        let mut with_seq = reference.clone();
        with_seq.push(col("seq", "bigint", "auto_increment"));
        assert_eq!(order_key(&with_seq, &columns), Some(OrderKey::AutoIncrement("seq".into())));
        let no_order: Vec<_> = reference.iter().filter(|c| c.0 != "occurred_at").cloned().collect();
        assert_eq!(order_key(&no_order, &columns), None);

        let mut broken: Vec<_> = reference.iter().filter(|c| c.0 != "locked_by").cloned().collect();
        broken.iter_mut().find(|c| c.0 == "attempts").unwrap().1 = "varchar".into();
        let problems = poll_column_problems(&table, &broken);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("attempts is varchar"), "{problems:?}");
        assert!(problems[1].contains("no `locked_by` column"), "{problems:?}");
        assert_eq!(
            poll_columns_ddl(&table, &broken).as_deref(),
            Some(
                "ALTER TABLE `shop`.`outbox_events` MODIFY COLUMN `attempts` INT UNSIGNED NOT NULL DEFAULT 0, \
                 ADD COLUMN `locked_by` VARCHAR(128) NULL"
            )
        );
        assert_eq!(poll_columns_ddl(&table, &reference), None);
    }
}
