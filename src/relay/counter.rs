//! The sequence counter against what the relay has read and published. A table truncated, re-created,
//! restored or swapped (pt-osc), or a MySQL 5.7 restarted after `prune` emptied it (5.7 sets
//! `AUTO_INCREMENT` to `MAX + 1` when it starts), numbers its new rows again from low numbers. Under
//! `[poll] progress_table`'s number they count as published: never read, shown as published, deleted by
//! `prune`. So a counter at or below the number is refused ([`CounterReset`], with the statement that resets
//! the number) at a run's start, while it runs, by `prune` and by `check`. Without a progress table nothing
//! is lost (each row says whether it is published), but the new rows are below the run's cursor: the run
//! reads the table again from its first unpublished row ([`Relay::counter_started_again`]).
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2 (vocabulary, error, metrics, config), and the lease
//! and the server proof beside it (the statement that reads a counter also proves its server).
//!
//! # Why `AUTO_INCREMENT`, not `MAX(seq)`
//! `AUTO_INCREMENT` is the number the next row gets, and it is above every number the relay ever read or
//! passed (the number only passes numbers a read saw, or passed on its way to a higher row). So a counter
//! at or below the run's cursor or the number means exactly that the numbering started again. `MAX(seq)`
//! can be below the number without any reset: `prune` deletes published rows up to the number and keeps
//! held ones below it. It is read too, for the operator.
//!
//! # The bound
//! A reset is seen while the counter is still at or below what the relay has read: at a run's start, and
//! within [`COUNTER_CHECK_EVERY`] while it runs (one statement per table). Rows written after a reset past
//! that (more rows within the period than the relay had read, or past the number while no relay ran) cannot
//! be told from the published rows they replaced: reset the number before the writers write again
//! (docs/RUNBOOK.md, "Truncating, re-creating or restoring the outbox table"). MySQL 8 caches
//! `information_schema.TABLES` for `information_schema_stats_expiry` (a day by default): a stale counter
//! could refuse a table that is fine, so [`fresh_counters`] turns the cache off for the session.

use std::fmt;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::Conn;

use super::columns::OrderKey;
use super::server::{self, Seen};
use super::table::Relay;
use crate::error::mysql_codes::UNKNOWN_SYSTEM_VARIABLE;
use crate::error::{classify_mysql, Error, Result};
use crate::lease::Holding;
use crate::metrics::{metrics, PollQuery};
use crate::outbox::{quote_ident, TableName};

/// How often a run reads each table's counter (one statement per table, which also proves the reading
/// connection's server again: [`super::server`]): the bound within which it sees a counter that started
/// again. Idle, it adds a statement every 2 s to the relay's one read per `poll_interval_ms`.
pub const COUNTER_CHECK_EVERY: Duration = Duration::from_secs(2);

/// A table's sequence counter, as read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counter {
    /// `AUTO_INCREMENT`: the number the next row gets (`None`: the server does not say).
    pub next: Option<u64>,
    /// `MAX(<sequence>)` (`None`: the table is empty).
    pub max: Option<u64>,
}

impl Counter {
    /// Reads the counter of `table`, whose sequence column is `seq`, in one statement.
    ///
    /// # Errors
    /// Classified query errors.
    pub async fn read(conn: &mut Conn, table: &TableName, seq: &str) -> Result<Counter> {
        let row: Option<(Option<u64>, Option<u64>)> = conn
            .exec_first(
                format!(
                    "SELECT (SELECT AUTO_INCREMENT FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? \
                     AND TABLE_NAME = ?), (SELECT MAX({}) FROM {})",
                    quote_ident(seq),
                    table.quoted()
                ),
                (table.database.as_str(), table.table.as_str()),
            )
            .await
            .map_err(|e| classify_mysql(&e).context(format_args!("poll: reading the sequence counter of {table}")))?;
        metrics().poll_queries(PollQuery::Backlog, 1);
        let (next, max) = row.unwrap_or((None, None));
        Ok(Counter { next, max })
    }

    /// [`Counter::read`], with the columns that say which server answered ([`server::proof_columns`]).
    async fn read_proven(conn: &mut Conn, table: &TableName, seq: &str, lease: &Holding) -> Result<(Seen, Counter)> {
        let row: Option<ProvenCounter> = conn
            .exec_first(
                format!(
                    "SELECT {}, (SELECT AUTO_INCREMENT FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? \
                     AND TABLE_NAME = ?), (SELECT MAX({}) FROM {})",
                    server::proof_columns(lease),
                    quote_ident(seq),
                    table.quoted()
                ),
                (lease.lock(), table.database.as_str(), table.table.as_str()),
            )
            .await
            .map_err(|e| classify_mysql(&e).context(format_args!("poll: reading the sequence counter of {table}")))?;
        metrics().poll_queries(PollQuery::Backlog, 1);
        let (id, uuid, read_only, increment, holder, next, max) =
            row.ok_or_else(|| Error::transient(format!("poll: the sequence counter of {table} came back empty")))?;
        Ok((Seen::of((id, uuid, read_only, increment, holder)), Counter { next, max }))
    }

    /// Whether the numbering started again below `seen` (the highest number read or published): the next
    /// row's number is at or below it.
    pub fn started_again(&self, seen: u64) -> bool {
        self.next.is_some_and(|next| next <= seen)
    }
}

/// Turns MySQL 8's cache of `information_schema.TABLES` off for the session
/// (`information_schema_stats_expiry = 0`), so that [`Counter::read`] reads the live counter. Nothing on
/// servers without the cache (MariaDB, MySQL 5.7), whose counter is always live.
///
/// # Errors
/// Classified query errors.
pub async fn fresh_counters(conn: &mut Conn) -> Result<()> {
    match conn.query_drop("SET SESSION information_schema_stats_expiry = 0").await {
        Err(mysql_async::Error::Server(e)) if e.code == UNKNOWN_SYSTEM_VARIABLE => Ok(()),
        other => other.map_err(|e| classify_mysql(&e).context("poll: reading live sequence counters")),
    }
}

/// [`Counter::read_proven`]'s row: [`server::ProofRow`]'s columns, then `AUTO_INCREMENT` and `MAX`.
type ProvenCounter = (u32, Option<String>, i64, u64, Option<u64>, Option<u64>, Option<u64>);

/// A sequence counter at or below `[poll] progress_table`'s number: refused, with what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterReset {
    /// The outbox table.
    pub table: TableName,
    /// Its sequence column.
    pub seq: String,
    /// The progress table.
    pub progress: TableName,
    /// Its `published_through` for the outbox table.
    pub number: u64,
    /// The counter as read.
    pub counter: Counter,
}

impl CounterReset {
    /// `Some` when `counter` of `table` (sequence column `seq`) is at or below `number`, the progress table
    /// `progress`'s number for it.
    pub fn judge(table: &TableName, seq: &str, progress: &TableName, number: u64, counter: Counter) -> Option<Self> {
        counter.started_again(number).then(|| CounterReset {
            table: table.clone(),
            seq: seq.to_string(),
            progress: progress.clone(),
            number,
            counter,
        })
    }

    /// The statement that resets the number of the outbox table to 0 (the relay then publishes every row of
    /// the table that is not marked published).
    pub fn reset_statement(&self) -> String {
        reset_statement(&self.progress, &self.table)
    }
}

/// `UPDATE <progress> SET published_through = 0 … WHERE outbox_table = '<outbox>'`: how an operator resets
/// the number of `outbox` once its sequence started again.
pub fn reset_statement(progress: &TableName, outbox: &TableName) -> String {
    let name = outbox.to_string().replace('\\', "\\\\").replace('\'', "''");
    format!(
        "UPDATE {} SET published_through = 0, updated_at = UTC_TIMESTAMP(6) WHERE outbox_table = '{name}'",
        progress.quoted()
    )
}

impl fmt::Display for CounterReset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = |v: Option<u64>| v.map_or("none".to_string(), |v| v.to_string());
        write!(
            f,
            "{table}: its sequence started again below what the relay published: AUTO_INCREMENT {next}, \
             MAX({seq}) {max}, but [poll] progress_table {progress} says every row up to {number} is \
             published. The table was truncated, re-created, restored or swapped (pt-osc), or MySQL 5.7 \
             restarted after prune emptied it: its new rows are numbered again from low numbers, and the relay \
             would take those at or below {number} as published (never read, and deleted by prune). Nothing of \
             it is published until the number is reset. Make sure every event written before the reset was \
             published (the relay had caught up: `outbox-cdc status` before it, or the topic), then run: \
             {reset}; and start the relay: it publishes every row of the table not marked published (rows \
             still there from before the reset again: duplicates, never a loss)",
            table = self.table,
            next = shown(self.counter.next),
            seq = self.seq,
            max = shown(self.counter.max),
            progress = self.progress,
            number = self.number,
            reset = self.reset_statement(),
        )
    }
}

impl From<CounterReset> for Error {
    fn from(reset: CounterReset) -> Error {
        Error::definite(reset.to_string())
    }
}

/// Refuses `table` (sequence column `seq`) when its counter is at or below `number`, the progress table
/// `progress`'s number for it (`prune`, `check`).
///
/// # Errors
/// [`CounterReset`] as a definite error; classified query errors.
pub async fn refuse_reset(
    conn: &mut Conn,
    progress: &TableName,
    table: &TableName,
    seq: &str,
    number: u64,
) -> Result<()> {
    let counter = Counter::read(conn, table, seq).await?;
    match CounterReset::judge(table, seq, progress, number, counter) {
        Some(reset) => Err(reset.into()),
        None => Ok(()),
    }
}

impl Relay {
    /// Whether the sequence of table `t` started again at or below `cursor` (the last number read in
    /// order) or the progress table's number. With a progress table that is refused ([`CounterReset`]);
    /// without, `true`: the rows numbered again are below the cursor, and the run reads the table again
    /// from its first unpublished row. `false` for a table ordered by `occurred_at`.
    ///
    /// # Errors
    /// [`CounterReset`] as a definite error; classified query errors.
    pub async fn counter_started_again(&self, conn: &mut Conn, t: usize, cursor: Option<u64>) -> Result<bool> {
        let OrderKey::Sequence(seq) = &self.tables[t].order else { return Ok(false) };
        let table = &self.tables[t].table;
        let counter = match self.fence.lease() {
            None => Counter::read(conn, table, seq).await?,
            Some(lease) => {
                // The reading connection's server proven again, by the statement that read the counter.
                let (seen, counter) = Counter::read_proven(conn, table, seq, lease).await?;
                let looked = tokio::time::Instant::now();
                server::judged(&seen, looked, lease, "reading", self.progress.table()).await?;
                counter
            }
        };
        match self.progress.table() {
            None => Ok(cursor.is_some_and(|cursor| counter.started_again(cursor))),
            Some(progress) => {
                let seen = self.frontier(t).max(cursor.unwrap_or(0));
                match CounterReset::judge(table, seq, progress, seen, counter) {
                    Some(reset) => Err(CounterReset { number: self.frontier(t), ..reset }.into()),
                    None => Ok(false),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(name: &str) -> TableName {
        TableName::parse(name).unwrap()
    }

    /// The counter started again exactly when the next number is at or below what was seen; a counter the
    /// server does not report never refuses.
    #[test]
    fn a_counter_at_or_below_what_was_seen_started_again() {
        let counter = |next| Counter { next, max: None };
        for (next, seen, again) in [
            (Some(101), 100, false), // the next row after 100: fine
            (Some(100), 100, true),  // 100 again
            (Some(1), 100, true),    // TRUNCATE, empty
            (Some(51), 100, true),   // TRUNCATE, 50 new rows
            (Some(1), 0, false),     // nothing read, no number
            (None, 100, false),      // not reported
        ] {
            assert_eq!(counter(next).started_again(seen), again, "next {next:?}, seen {seen}");
        }
    }

    /// The refusal names the table, the number, the counter and the statement that resets the number for
    /// the progress table's layout (`outbox_table` holds `database.table`, quotes doubled).
    #[test]
    fn the_refusal_says_what_to_run() {
        let (outbox, progress) = (table("shop.outbox_events"), table("shop.outbox_relay_progress"));
        let counter = Counter { next: Some(51), max: Some(50) };
        assert!(CounterReset::judge(&outbox, "seq", &progress, 50, counter).is_none());
        let reset = CounterReset::judge(&outbox, "seq", &progress, 100, counter).expect("refused");
        let error = Error::from(reset.clone());
        assert!(error.is_definite());
        let text = error.to_string();
        for part in ["shop.outbox_events", "AUTO_INCREMENT 51", "MAX(seq) 50", "up to 100", "pt-osc"] {
            assert!(text.contains(part), "{part}: {text}");
        }
        let statement = "UPDATE `shop`.`outbox_relay_progress` SET published_through = 0, updated_at = \
                         UTC_TIMESTAMP(6) WHERE outbox_table = 'shop.outbox_events'";
        assert_eq!(reset.reset_statement(), statement);
        assert!(text.contains(statement), "{text}");
        assert_eq!(
            reset_statement(&progress, &table("o'b.t")),
            "UPDATE `shop`.`outbox_relay_progress` SET published_through = 0, updated_at = UTC_TIMESTAMP(6) \
             WHERE outbox_table = 'o''b.t'"
        );
    }
}
