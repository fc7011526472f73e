//! `[poll] progress_table`: the table that records, per outbox table, the sequence number every row up to
//! which is published, and the `published_at` value of the rows that number passes unpublished.
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2 (vocabulary, error, metrics, config).

use std::collections::HashSet;

use mysql_async::prelude::Queryable;
use mysql_async::Conn;

use super::columns::columns_of;
use crate::config::Config;
use crate::error::{classify_mysql, Error, Result};
use crate::metrics::{metrics, PollQuery};
use crate::outbox::TableName;

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
/// ([`open_transactions`]).
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
    open_transactions(conn).await.map_err(|e| match !e.is_definite() {
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
