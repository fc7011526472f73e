//! How the relay records in the table what it published, as one type with the behaviour inside
//! ([`Progress`]), chosen once from the config (`[poll] progress_table`, [`PollProgress`]): each row's
//! `published_at` ([`Progress::Marking`]), or the progress table's number per outbox table, every row up
//! to which is published ([`Progress::Table`]). The statements of the shared path ask it what "not yet
//! published" means and what a held row carries; they never ask which it is. The run's side of the same
//! choice (what it covers, proves and hands to the marker) is `relay::ledger`.
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2 (vocabulary, error, metrics, config), and the fence
//! beside it.

use std::sync::atomic::{AtomicU64, Ordering};

use mysql_async::prelude::Queryable;
use mysql_async::Conn;

use super::columns::{columns_of, OrderKey};
use super::fence::Fence;
use crate::config::PollProgress;
use crate::error::{classify_mysql, Error, Result};
use crate::metrics::{metrics, PollQuery};
use crate::outbox::{quote_ident, TableName};

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

/// How the relay records what it published.
#[derive(Debug)]
pub enum Progress {
    /// No progress table: each row's `published_at` is set once its event is acknowledged.
    Marking,
    /// `[poll] progress_table`: a number per outbox table; rows it passes unpublished say so with
    /// [`HELD_AT`].
    Table(ProgressTable),
}

/// `[poll] progress_table`, and the number of each outbox table as last written.
#[derive(Debug)]
pub struct ProgressTable {
    /// The table.
    name: TableName,
    /// Per outbox table (in the relay's order): the sequence number every row up to which is published,
    /// as last written. Statements that could reach below it are bounded by it.
    frontiers: Vec<AtomicU64>,
}

impl Progress {
    /// The progress the config asks for, ready: with a progress table, the table checked
    /// ([`check_progress_table`]) and the number of each of `outboxes` read.
    ///
    /// # Errors
    /// As [`check_progress_table`] and [`read_frontier`].
    pub async fn load(conn: &mut Conn, config: &PollProgress, outboxes: &[TableName]) -> Result<Progress> {
        let PollProgress::Table(name) = config else { return Ok(Progress::Marking) };
        check_progress_table(conn, name, outboxes).await?;
        let mut frontiers = Vec::new();
        for outbox in outboxes {
            frontiers.push(AtomicU64::new(read_frontier(conn, name, outbox).await?));
        }
        Ok(Progress::Table(ProgressTable { name: name.clone(), frontiers }))
    }

    /// `[poll] progress_table`, when set.
    pub fn table(&self) -> Option<&TableName> {
        match self {
            Progress::Marking => None,
            Progress::Table(table) => Some(&table.name),
        }
    }

    /// The sequence number of outbox table `t` every row up to which is published, as last written (0
    /// without a progress table).
    pub fn frontier(&self, t: usize) -> u64 {
        self.published_through(t).unwrap_or(0)
    }

    /// [`Progress::frontier`], `None` without a progress table (`outbox-cdc status` prints it).
    pub fn published_through(&self, t: usize) -> Option<u64> {
        match self {
            Progress::Marking => None,
            Progress::Table(table) => Some(table.frontiers[t].load(Ordering::Acquire)),
        }
    }

    /// Records that every row of outbox table `t` (`outbox`) with a sequence number up to `through` is
    /// published, while `fence`'s lease is this run's (never lowers it). Nothing without a progress table:
    /// the marks are the progress.
    ///
    /// # Errors
    /// Transient when the lease is lost ([`Fence::after_write`]); classified query errors.
    pub async fn write_frontier(
        &self,
        conn: &mut Conn,
        t: usize,
        outbox: &TableName,
        through: u64,
        fence: &Fence,
    ) -> Result<()> {
        let Progress::Table(table) = self else { return Ok(()) };
        fence.before_write(conn).await?;
        conn.exec_drop(
            format!(
                "UPDATE {} SET published_through = GREATEST(published_through, ?), updated_at = UTC_TIMESTAMP(6) \
                 WHERE outbox_table = ? AND {}",
                table.name.quoted(),
                fence.condition("outbox_table")
            ),
            (through, outbox.to_string()),
        )
        .await
        .map_err(|e| classify_mysql(&e).context(format_args!("poll: writing how far {outbox} is published")))?;
        metrics().poll_queries(PollQuery::Mark, 1);
        let changed = conn.affected_rows();
        fence.after_write(conn, changed).await?;
        table.frontiers[t].fetch_max(through, Ordering::AcqRel);
        Ok(())
    }

    /// The `published_at` of an unpublished row the number passed (a parked row, or one of an aggregate
    /// it holds): [`HELD_AT`]. `None` when marking: every unpublished row is NULL.
    pub fn held_at(&self) -> Option<&'static str> {
        match self {
            Progress::Marking => None,
            Progress::Table(_) => Some(HELD_AT),
        }
    }

    /// The rows of outbox table `t` (ordered by `order`) neither marked nor held nor passed by the number,
    /// as a condition: `published_at IS NULL`; with a progress table, above its number.
    pub fn due(&self, t: usize, order: &OrderKey) -> String {
        match (self, order, self.frontier(t)) {
            (Progress::Table(_), OrderKey::Sequence(c), frontier) if frontier > 0 => {
                format!("published_at IS NULL AND {} > {frontier}", quote_ident(c))
            }
            _ => "published_at IS NULL".into(),
        }
    }

    /// The rows of outbox table `t` (ordered by `order`) not yet published, as a condition:
    /// `published_at IS NULL`; with a progress table, above its number, or [`HELD_AT`].
    pub fn unpublished(&self, t: usize, order: &OrderKey) -> String {
        let Progress::Table(_) = self else { return "published_at IS NULL".into() };
        match (order, self.frontier(t)) {
            (OrderKey::Sequence(c), frontier) if frontier > 0 => {
                format!("((published_at IS NULL AND {} > {frontier}) OR published_at = '{HELD_AT}')", quote_ident(c))
            }
            _ => NOT_PUBLISHED.into(),
        }
    }
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

/// What the relay needs for a progress table, refused with the fix when missing: the table, and a row for
/// each outbox table (added at 0: nothing is known published by number yet).
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
