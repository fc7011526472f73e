//! The listing that proves a sequence number free: the oldest and the newest transaction that has written
//! and is still open on the server, by InnoDB transaction id ([`open_transactions`]). A number a read passed
//! without a row (a *gap*) was taken by a transaction that has not committed yet, or that rolled back; once
//! every transaction that had written when the gap was passed has ended, the gap holds what it will ever
//! hold (`relay::gaps` reads it once more then).
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2 (vocabulary, error, metrics) and the fence beside it.
//!
//! # Why transaction ids, as numbers
//! InnoDB gives a transaction its id (`trx_id`) from one counter when it first writes, keeps it until it
//! ends, through `XA PREPARE` and a client that went away (a detached XA transaction is listed with
//! thread 0, the same id), and through crash recovery. A transaction that took a sequence number has
//! written (the number is taken by the insert that becomes its first write at the latest). So "every
//! transaction that had written at listing 1 has ended" is "every open writer's id is above the newest id
//! listing 1 saw": two numbers, no identity kept from one listing to the next. Transactions that have not
//! written are listed with id 0 (MariaDB) or an id above the 6-byte range ids live in (MySQL prints the
//! transaction's address there): they can hold no number, and are left out ([`WRITER_IDS`]).
//!
//! The time columns would not do: `trx_started` is printed in the server's system time zone, not the
//! session's, to the second, and a cut by time is wrong for the hour a clock turns back.

use mysql_async::prelude::Queryable;
use mysql_async::Conn;

use super::fence::Fence;
use crate::error::{classify_mysql, Error, Result};
use crate::metrics::{metrics, PollQuery};

/// The transaction ids of transactions that have written: InnoDB keeps them in 6 bytes (`DB_TRX_ID`).
const WRITER_IDS: &str = "BETWEEN 1 AND 281474976710655";

/// A listing's row: the lease lock's holder, the oldest and the newest writer, whether it shows itself.
type Listing = (Option<u64>, Option<u64>, Option<u64>, bool);

/// The open transactions that have written, as one listing saw them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Writers {
    /// The oldest one's id (`None`: none is open).
    pub oldest: Option<u64>,
    /// The newest one's id.
    pub newest: Option<u64>,
    /// Whether the listing is newer than the statement that asked for it ([`open_transactions`]): a
    /// stale one proves nothing.
    pub fresh: bool,
}

/// Lists the open transactions that have written ([`Writers`]), inside a transaction of its own that the
/// listing must show: `information_schema.INNODB_TRX` is a copy, refreshed only when nobody read it for
/// 100 ms, so a client that reads it more often (a monitoring agent, several relays on one server) keeps it
/// as it was, for ever (MariaDB 10.11: a transaction open 2 s was never listed to a client reading every
/// 30 ms). A listing that shows its own transaction was made after that transaction started: it is
/// [`Writers::fresh`]. With a lease (`fence`), the statement also says who holds the lease's lock where it
/// ran: a listing from another server than the lease's (a replica behind a proxy lists none of the
/// primary's transactions) proves nothing, and is refused ([`super::server`]). Needs the `PROCESS`
/// privilege.
///
/// # Errors
/// Transient when the listing is not from the lease's server (or the lease is lost); classified query
/// errors (a definite one without the `PROCESS` privilege).
pub async fn open_transactions(conn: &mut Conn, fence: &Fence) -> Result<Writers> {
    let failed = |e: mysql_async::Error| classify_mysql(&e).context("poll: reading the server's open transactions");
    let holder = match fence.lease() {
        Some(_) => "IS_USED_LOCK(?)",
        None => "NULL",
    };
    let sql = format!(
        "SELECT {holder}, MIN(CASE WHEN id {WRITER_IDS} THEN id END), MAX(CASE WHEN id {WRITER_IDS} THEN id END), \
         COALESCE(MAX(thread = CONNECTION_ID()), 0) \
         FROM (SELECT CAST(trx_id AS UNSIGNED) id, trx_mysql_thread_id thread FROM information_schema.INNODB_TRX) t"
    );
    let params: Vec<mysql_async::Value> = fence.lease().map(|lease| lease.lock().into()).into_iter().collect();
    conn.query_drop("START TRANSACTION WITH CONSISTENT SNAPSHOT").await.map_err(failed)?;
    let listed: std::result::Result<Option<Listing>, _> = conn.exec_first(sql, params).await;
    conn.query_drop("COMMIT").await.map_err(failed)?;
    metrics().poll_queries(PollQuery::Transactions, 1);
    let (holder, oldest, newest, fresh) = listed.map_err(failed)?.unwrap_or_default();
    if let Some(lease) = fence.lease() {
        if holder != Some(lease.connection_id()) {
            return Err(Error::transient(
                "poll: the open transactions were listed on a server where this instance's lease is not held \
                 (the lease was lost, or a proxy sent the statement to another server): no sequence number is \
                 proven free by that list",
            ));
        }
    }
    Ok(Writers { oldest, newest, fresh })
}

/// Refuses a relay whose user cannot list the open transactions (no `PROCESS`), with the grant that fixes
/// it: without the listing no gap is ever proven, and every gap would be read again for ever.
///
/// # Errors
/// Definite without the privilege; classified query errors.
pub async fn require_listing(conn: &mut Conn) -> Result<()> {
    match open_transactions(conn, &Fence::Unleased).await {
        Err(e) if e.is_definite() => Err(Error::definite(format!(
            "the polling relay needs the PROCESS privilege, to read information_schema.INNODB_TRX ({e}): a \
             sequence number a read passed without a row is read again until every transaction that could \
             still commit a row there has ended. Grant it: GRANT PROCESS ON *.* TO <the relay's user>"
        ))),
        other => other.map(|_| ()),
    }
}
