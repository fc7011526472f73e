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
//! # Statement-based binlogs
//! With `binlog_format = STATEMENT` a replica runs the statement itself, where no relay holds the lock:
//! `IS_USED_LOCK` in it would change nothing on the replica. There the check is evaluated into a user
//! variable first (`SET @outbox_cdc_fence = …`), which the binlog carries with the statement; it holds for
//! the statement's start only, and a pause between the two statements is not seen. Use `ROW` or `MIXED`
//! (MIXED logs these statements as rows).

use mysql_async::prelude::Queryable;
use mysql_async::Conn;

use crate::error::{classify_mysql, Error, Result};
use crate::lease::Holding;
use crate::outbox::quote_ident;

/// The user variable the check is evaluated into with `binlog_format = STATEMENT`.
const VARIABLE: &str = "@outbox_cdc_fence";

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
    pub fn condition(&self, column: &str) -> String {
        match self {
            Fence::Unleased => "TRUE".to_string(),
            Fence::InStatement(lease) => format!(
                "IS_USED_LOCK(IF({} IS NULL, NULL, {})) = {}",
                quote_ident(column),
                literal(lease.lock()),
                lease.connection_id()
            ),
            Fence::Variable(_) => format!("{VARIABLE} = 1"),
        }
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
