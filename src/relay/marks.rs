//! What the relay writes into its outbox tables, and the counts it asks of them: rows marked published (as
//! ranges of sequence numbers, or by key), held (`HELD_AT`), parked (dead-lettered), refused; the parked
//! rows and the backlog; and the rows `quarantine release` marks published after it republished them. Every
//! write of a run is fenced by its lease ([`super::fence`]).
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2 (vocabulary, error, metrics, config).

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Value};

use super::columns::{OrderKey, PARKED_UNTIL};
use super::progress::{HELD_AT, NOT_PUBLISHED};
use super::ranges::sequence_ranges;
use super::table::{key_bytes, Aggregate, Relay};
use crate::config::ColumnNames;
use crate::error::{classify_mysql, Result};
use crate::metrics::{metrics, PollQuery, POLL_BACKLOG_CAP};
use crate::outbox::{quote_ident, TableName};

impl Relay {
    /// Marks rows of table `t` published; returns how many changed (counted by the caller once its round
    /// commits, `relay::fence`). With the sequence order, `seqs` are
    /// their sequence numbers, marked as ranges of consecutive numbers (a range of consecutive numbers names
    /// exactly those rows, and a range scan costs the server a fraction of a long key list: measured on
    /// MariaDB 10.11, 1,000 rows in about a third of the time); else `keys`, their primary keys. One
    /// statement per 1,000 ranges or 5,000 keys.
    ///
    /// # Errors
    /// Classified query errors (the rows stay unpublished and are published again by the next run).
    pub async fn mark_published(&self, conn: &mut Conn, t: usize, keys: &[Value], seqs: &[u64]) -> Result<u64> {
        let table = self.tables[t].table.quoted();
        let what = format!("poll: marking rows of {table} published");
        let marked = match &self.tables[t].order {
            OrderKey::Sequence(_) if seqs.len() == keys.len() => {
                self.update_by_sequence(conn, t, "UTC_TIMESTAMP(6)", NOT_PUBLISHED, seqs, &what).await?
            }
            _ => {
                let mut marked = 0;
                let id = quote_ident(&self.columns.id);
                let fence = self.fence.condition(&self.columns.id);
                for chunk in keys.chunks(5_000) {
                    self.fence.before_write(conn).await?;
                    conn.exec_drop(
                        format!(
                            "UPDATE {table} SET published_at = UTC_TIMESTAMP(6) WHERE {NOT_PUBLISHED} AND {id} IN ({}) \
                             AND {fence}",
                            vec!["?"; chunk.len()].join(", ")
                        ),
                        chunk.to_vec(),
                    )
                    .await
                    .map_err(|e| classify_mysql(&e).context(&what))?;
                    metrics().poll_queries(PollQuery::Mark, 1);
                    let changed = conn.affected_rows();
                    self.fence.after_write(conn, changed).await?;
                    marked += changed;
                }
                marked
            }
        };
        Ok(marked)
    }

    /// `[poll] progress_table`: sets `published_at` of rows of table `t` whose aggregate is held (by their
    /// sequence numbers, as ranges) to [`HELD_AT`], so that the number may pass them. Returns how many
    /// changed.
    ///
    /// # Errors
    /// Classified query errors.
    pub async fn mark_held(&self, conn: &mut Conn, t: usize, seqs: &[u64]) -> Result<u64> {
        let what = format!("poll: marking held rows of {}", self.tables[t].table);
        self.update_by_sequence(conn, t, &format!("'{HELD_AT}'"), "published_at IS NULL", seqs, &what).await
    }

    /// Sets `published_at` to `value` in the rows of table `t` that meet `only` and whose sequence number
    /// is one of `seqs` (as ranges, 1,000 to a statement), while the lease is this run's
    /// ([`super::fence`]); returns how many changed. Nothing without a sequence order.
    async fn update_by_sequence(
        &self,
        conn: &mut Conn,
        t: usize,
        value: &str,
        only: &str,
        seqs: &[u64],
        what: &str,
    ) -> Result<u64> {
        let OrderKey::Sequence(c) = &self.tables[t].order else { return Ok(0) };
        let fence = self.fence.condition(c);
        let c = quote_ident(c);
        let mut changed = 0;
        for chunk in sequence_ranges(seqs).chunks(1_000) {
            let ranges: Vec<String> = chunk
                .iter()
                .map(|(lo, hi)| match lo == hi {
                    true => format!("{c} = {lo}"),
                    // Its last number on its own: a range's scan reads the record after its end to know it
                    // ended, and when that is a row a transaction inserted and has not committed (a gap),
                    // the scan waits for that transaction, up to `innodb_lock_wait_timeout`, whatever the
                    // isolation level or the index (MariaDB 10.11, two ranges in one statement). Ended on a
                    // point, the range's scan stops on its own last row.
                    false => format!("({c} BETWEEN {lo} AND {} OR {c} = {hi})", hi - 1),
                })
                .collect();
            self.fence.before_write(conn).await?;
            conn.query_drop(format!(
                "UPDATE {} SET published_at = {value} WHERE {only} AND ({}) AND {fence}",
                self.tables[t].table.quoted(),
                ranges.join(" OR ")
            ))
            .await
            .map_err(|e| classify_mysql(&e).context(what))?;
            metrics().poll_queries(PollQuery::Mark, 1);
            let rows = conn.affected_rows();
            self.fence.after_write(conn, rows).await?;
            changed += rows;
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
        let Some(held_at) = self.progress.held_at() else { return Ok(Vec::new()) };
        let (at, ai) = (quote_ident(&self.columns.aggregate_type), quote_ident(&self.columns.aggregate_id));
        let rows: Vec<(Value, Value)> = conn
            .query(format!("SELECT DISTINCT {at}, {ai} FROM {} WHERE published_at = '{held_at}'", self.from(t, true)))
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
        let held = self.progress.held_at().map(|held_at| format!(", published_at = '{held_at}'")).unwrap_or_default();
        let fence = self.fence.condition(&self.columns.id);
        self.fence.before_write(conn).await?;
        conn.exec_drop(
            format!(
                "UPDATE {table} SET next_attempt_at = '{PARKED_UNTIL}', last_error = LEFT(?, {}){held} \
                 WHERE {NOT_PUBLISHED} AND {id} = ? AND {fence}",
                pt.last_error_chars
            ),
            (format!("dead-lettered: {reason}"), key.clone()),
        )
        .await
        .map_err(|e| classify_mysql(&e).context(format_args!("poll: parking a dead-lettered row of {table}")))?;
        metrics().poll_queries(PollQuery::Park, 1);
        let changed = conn.affected_rows();
        self.fence.after_write(conn, changed).await?;
        if changed > 0 {
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
        let fence = self.fence.condition(&self.columns.id);
        self.fence.before_write(conn).await?;
        conn.exec_drop(
            format!(
                "UPDATE {table} SET attempts = attempts + 1, last_error = LEFT(?, {}) \
                 WHERE {NOT_PUBLISHED} AND {id} = ? AND {fence}",
                pt.last_error_chars
            ),
            (error, key.clone()),
        )
        .await
        .map_err(|e| classify_mysql(&e).context(format_args!("poll: recording a refused record of {table}")))?;
        metrics().poll_queries(PollQuery::Fail, 1);
        let changed = conn.affected_rows();
        self.fence.after_write(conn, changed).await?;
        metrics().poll_failed(changed);
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

    /// The rows of table `t` not yet published ([`super::progress::Progress::unpublished`]).
    pub(super) fn unpublished(&self, t: usize) -> String {
        self.progress.unpublished(t, &self.tables[t].order)
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
    let id_family = crate::source::snapshot::role_columns(conn, table, columns).await?[0].flatten();
    let marks = vec![crate::source::column_types::id_param_sql(id_family); ids.len()].join(", ");
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
