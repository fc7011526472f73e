//! The lease a relay run writes under, checked by the statements that write ([`Fence`]): a relay that lost
//! its lease (paused past it, cut off, its lock's connection killed) must not write into the tables its
//! successor now publishes from. A held row marked again by it would hold an aggregate its successor
//! published; a number it wrote after an operator reset the number would pass rows never published.
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2 (vocabulary, error, metrics, config) and the lease
//! beside it ([`Holding`]).
//!
//! # Two checks, and why both
//! - **Before each write**, the client's: [`Holding::is_held`], from the clock alone, as the sink checks it
//!   before each record. It stops a relay that was paused (SIGSTOP: the monotonic clock counts the pause)
//!   before it sends anything.
//! - **In each write**, the server's: every statement that writes names the lease in its `WHERE`,
//!   `IS_USED_LOCK(<lock>) = <the lease's connection>`, so a row changes only if the lease's lock is held
//!   by this instance's connection *when the server changes that row*. It stops what the client's check
//!   cannot see: a statement sent while the lease was held and run after it was lost (waiting for a row
//!   lock, or in a network buffer), and a host whose clock did not count a pause (a frozen VM). The lock
//!   argument names a column of the row (`IF(<column> IS NULL, NULL, <lock>)`): a constant `IS_USED_LOCK`
//!   is evaluated once, before the statement waits for any row lock (MariaDB 10.11 reads it as a constant
//!   condition), and a statement that started in time would change rows after the lease moved on.
//!
//! A write that changed no row asks the server whether the lease is still this instance's; if not, the
//! run ends (transient: it stands by), and nothing it meant to write is taken as written.
//!
//! # A successor reads after its predecessor's last write ([`Fence::drain`])
//! The check holds when the server changes a row; the change is seen when the statement commits. A relay
//! killed (or cut off) in the middle of a mark leaves the statement running on the server: it changes the
//! rows it reached while the lease was still its own and commits when it ends, after the lease moved. A
//! successor that read in between saw those rows unpublished and publishes them again, and its next read,
//! after the commit, skips the rest: a crash's replay with a hole in it, an aggregate's events going back
//! and then forward past some (seen once in a full-length kill -9 during a catch-up: 5 events of one
//! aggregate republished after 40 later ones). So every write names the lease in a comment
//! ([`Fence::condition`]), and a run reads nothing until no statement naming it runs on another
//! connection: one `information_schema.PROCESSLIST` query, needing the `PROCESS` privilege every relay
//! has.
//!
//! # A round of marks commits whole or not at all ([`Fence::begin`], [`Fence::commit`])
//! A statement that outlives the lease changes the rows it reached before the lease moved and not those
//! after (the check in its `WHERE`): in the order of its plan, which for a small table is the primary key's
//! (event ids, in no order of the relay's), so the rows a successor finds left to publish could be any
//! subset. The marker's writes are therefore one transaction per round: committed only when the server
//! still names this instance's lease connection as the lock's holder once every row is written (a lock
//! released never returns to the same connection, so the lease was held throughout) and the clock still
//! says held; rolled back otherwise, and by the server when the client goes away in the middle. Its
//! session's `wait_timeout` is the lease's (`floor(F)`), and it pings while idle: a relay paused or cut
//! off in the middle of a round holds those rows' locks no longer than it could hold the lease. What is
//! left is a host whose clock did not count a pause between the check and the `COMMIT`. The main
//! connection's writes (a parked row) are single-row statements in autocommit.
//!
//! # Statement-based binlogs
//! With `binlog_format = STATEMENT` a replica runs the statement itself, where no relay holds the lock:
//! `IS_USED_LOCK` in it would change nothing on the replica. There the check is evaluated into a user
//! variable first (`SET @outbox_cdc_fence = …`), which the binlog carries with the statement; it holds for
//! the statement's start only, and a pause between the two statements is not seen. Use `ROW` or `MIXED`
//! (MIXED logs these statements as rows).

use std::future::Future;
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use mysql_async::Conn;

use crate::error::{classify_mysql, Error, Result};
use crate::lease::Holding;
use crate::outbox::quote_ident;

/// The user variable the check is evaluated into with `binlog_format = STATEMENT`.
const VARIABLE: &str = "@outbox_cdc_fence";

/// How often [`Fence::drain`] looks again, and how often it says that it still waits.
const DRAIN_POLL: Duration = Duration::from_millis(100);
const DRAIN_REPORT: Duration = Duration::from_secs(10);

/// How the writes of a run are fenced by its lease.
#[derive(Debug, Clone)]
pub enum Fence {
    /// No lease (a run started without one): the writes are not fenced.
    Unleased,
    /// Each write checks the lease for each row it changes, in its `WHERE`.
    InStatement(Holding),
    /// `binlog_format = STATEMENT`: the check is evaluated into [`VARIABLE`] before each write.
    Variable(Holding),
}

impl Fence {
    /// The fence for a run under `lease` on the server of `conn` (whose `binlog_format` decides how).
    ///
    /// # Errors
    /// Classified query errors.
    pub async fn for_run(conn: &mut Conn, lease: Option<Holding>) -> Result<Fence> {
        let Some(lease) = lease else { return Ok(Fence::Unleased) };
        let format: Option<String> = conn
            .query_first("SELECT @@binlog_format")
            .await
            .map_err(|e| classify_mysql(&e).context("poll: reading binlog_format"))?;
        Ok(match format.is_some_and(|f| f.eq_ignore_ascii_case("STATEMENT")) {
            true => Fence::Variable(lease),
            false => Fence::InStatement(lease),
        })
    }

    /// The lease, when there is one.
    pub fn lease(&self) -> Option<&Holding> {
        match self {
            Fence::Unleased => None,
            Fence::InStatement(lease) | Fence::Variable(lease) => Some(lease),
        }
    }

    /// The condition a write adds to its `WHERE`, for a table with the `NOT NULL` column `column`
    /// (unquoted).
    /// The comment names the lease, so that a successor waits for the statement ([`Fence::drain`]).
    pub fn condition(&self, column: &str) -> String {
        match self {
            Fence::Unleased => "TRUE".to_string(),
            Fence::InStatement(lease) => format!(
                "{} IS_USED_LOCK(IF({} IS NULL, NULL, {})) = {}",
                tag(lease),
                quote_ident(column),
                literal(lease.lock()),
                lease.connection_id()
            ),
            Fence::Variable(lease) => format!("{} {VARIABLE} = 1", tag(lease)),
        }
    }

    /// Before a run reads or writes anything: waits until no write under this lease (an earlier run's, of
    /// this instance or another) is still running on the server of `conn`, so that every row it will ever
    /// mark is marked before the run reads (module docs). Returns at once without a lease; early when
    /// `stop` resolves (a stop requested: the caller reads nothing then).
    ///
    /// # Errors
    /// Transient when the lease is lost while waiting; classified query errors.
    pub async fn drain(&self, conn: &mut Conn, stop: impl Future<Output = ()>) -> Result<()> {
        let Some(lease) = self.lease() else { return Ok(()) };
        let sql = format!(
            "SELECT ID, TIME, LEFT(INFO, 120) FROM information_schema.PROCESSLIST \
             WHERE ID <> CONNECTION_ID() AND INFO LIKE {}",
            literal(&format!("%{}%", tag(lease)))
        );
        tokio::pin!(stop);
        let started = Instant::now();
        let mut reported: Option<Instant> = None;
        loop {
            let running: Vec<(u64, u64, Option<String>)> = conn
                .query(&sql)
                .await
                .map_err(|e| classify_mysql(&e).context("poll: listing the writes of an earlier run"))?;
            let Some((id, time, info)) = running.first() else {
                if reported.is_some() {
                    tracing::info!(waited_ms = started.elapsed().as_millis() as u64, "the earlier run's writes ended");
                }
                return Ok(());
            };
            if reported.is_none_or(|at| at.elapsed() >= DRAIN_REPORT) {
                tracing::warn!(
                    statements = running.len(),
                    connection = id,
                    running_s = time,
                    statement = info.as_deref().unwrap_or(""),
                    "waiting for writes an earlier run of this relay left running on the server to end: read \
                     before they commit, the rows they mark would be published again with a hole in the replay \
                     (`KILL QUERY <connection>` ends one; the rows it would have marked are published again)"
                );
                reported = Some(Instant::now());
            }
            if !lease.is_held() {
                return Err(lost("its renewal is overdue"));
            }
            tokio::select! {
                _ = tokio::time::sleep(DRAIN_POLL) => {}
                _ = &mut stop => return Ok(()),
            }
        }
    }

    /// Begins a round of writes on `conn` that [`Fence::commit`] ends.
    ///
    /// # Errors
    /// Classified query errors.
    pub async fn begin(&self, conn: &mut Conn) -> Result<()> {
        conn.query_drop("START TRANSACTION").await.map_err(|e| classify_mysql(&e).context("poll: beginning the marks"))
    }

    /// Ends the round [`Fence::begin`] began: commits it when the lease is still this instance's on the
    /// server, after every row of it was written, and by the clock; rolls it back otherwise (module docs).
    ///
    /// # Errors
    /// Transient when the lease is no longer this instance's (nothing of the round was written); classified
    /// query errors (the round's outcome is then the server's: it rolls back a session that ends first).
    pub async fn commit(&self, conn: &mut Conn) -> Result<()> {
        let failed = |e: mysql_async::Error| classify_mysql(&e).context("poll: committing the marks");
        let Some(lease) = self.lease() else { return conn.query_drop("COMMIT").await.map_err(failed) };
        let held: Option<Option<i64>> =
            conn.query_first(format!("SELECT {}", held_on_server(lease))).await.map_err(failed)?;
        if held.flatten() != Some(1) || !lease.is_held() {
            conn.query_drop("ROLLBACK").await.map_err(failed)?;
            return Err(lost("the server or the clock says so at the end of a round of marks"));
        }
        conn.query_drop(format!("COMMIT {}", tag(lease))).await.map_err(failed)
    }

    /// The `wait_timeout` a writing connection's session gets ([`Fence::begin`]): the lease's, or `None`
    /// without one (the server's default stays).
    pub fn session_timeout_s(&self) -> Option<u64> {
        self.lease().map(Holding::session_timeout_s)
    }

    /// Before a write: the lease still provably held by the clock, and with a statement-based binlog the
    /// server's check evaluated into [`VARIABLE`].
    ///
    /// # Errors
    /// Transient when the lease is not provably held; classified query errors.
    pub async fn before_write(&self, conn: &mut Conn) -> Result<()> {
        let lease = match self {
            Fence::Unleased => return Ok(()),
            Fence::InStatement(lease) | Fence::Variable(lease) => lease,
        };
        if !lease.is_held() {
            return Err(lost("its renewal is overdue"));
        }
        if let Fence::Variable(lease) = self {
            conn.query_drop(format!("SET {VARIABLE} = ({})", held_on_server(lease)))
                .await
                .map_err(|e| classify_mysql(&e).context("poll: checking the lease before a write"))?;
        }
        Ok(())
    }

    /// After a write that changed `changed` rows: when none, whether that was the fence (the server no
    /// longer names this instance's connection as the lease's holder).
    ///
    /// # Errors
    /// Transient when the lease is no longer this instance's; classified query errors.
    pub async fn after_write(&self, conn: &mut Conn, changed: u64) -> Result<()> {
        let lease = match self {
            Fence::InStatement(lease) | Fence::Variable(lease) if changed == 0 => lease,
            _ => return Ok(()),
        };
        let held: Option<Option<i64>> = conn
            .query_first(format!("SELECT {}", held_on_server(lease)))
            .await
            .map_err(|e| classify_mysql(&e).context("poll: checking the lease after a write"))?;
        match held.flatten() {
            Some(1) => Ok(()),
            _ => Err(lost("the server names another holder of its lock")),
        }
    }
}

/// `IS_USED_LOCK(<lock>) = <connection>` for `lease`.
fn held_on_server(lease: &Holding) -> String {
    format!("IS_USED_LOCK({}) = {}", literal(lease.lock()), lease.connection_id())
}

/// The comment every write under `lease` carries: `/* outbox-cdc fence <lock> */` (a lock name is made of
/// `[A-Za-z0-9._~/-]`: it cannot end the comment).
fn tag(lease: &Holding) -> String {
    format!("/* outbox-cdc fence {} */", lease.lock())
}

/// `text` as an SQL string literal.
fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\\', "\\\\").replace('\'', "''"))
}

/// The run's end when its lease is lost: nothing more is written.
fn lost(why: &str) -> Error {
    Error::lease_lost(format!(
        "poll: the lease is no longer provably held ({why}): stopped writing to the tables; waiting as a standby"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unleased writes are not fenced, and a lock's name is quoted as a string. (The fenced conditions need
    /// a lease, which only a server gives: `tests/poll.rs` runs them, a relay that lost its lease.)
    #[test]
    fn unleased_writes_are_not_fenced_and_lock_names_are_quoted() {
        assert_eq!(Fence::Unleased.condition("id"), "TRUE");
        assert_eq!(literal("outbox-cdc/o'k"), "'outbox-cdc/o''k'");
    }
}
