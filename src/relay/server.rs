//! The server every connection of a relay run reaches: the one its lease is held on, writable, and with a
//! progress table numbering rows one by one ([`prove`]). The relay's proofs assume one server: the rows a
//! read passed, the open transactions that may still commit a number, and the marks all happen where the
//! lease is. A read/write-splitting proxy (ProxySQL, MaxScale) or a DNS name over a primary and its
//! replicas can send a connection (or a statement) to a replica, which lags and lists none of the
//! primary's transactions: the number would pass rows the primary commits later. A second writable
//! primary beside this one (`auto_increment_increment > 1`) takes numbers the relay never sees taken.
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2 (vocabulary, error, metrics, config) and the fence
//! and lease beside it.
//!
//! # How a connection is proven
//! One statement reads `@@server_id` (and `@@server_uuid` on MySQL; MariaDB has none), `@@read_only`,
//! `@@GLOBAL.auto_increment_increment` (what new sessions, the writers', start with) and who holds the
//! lease's lock there (`IS_USED_LOCK`), so that no proxy can answer parts of it from different servers.
//! The server ids must be the lease's, and the lock held by the lease's connection: a lock is per server,
//! so this proves the very server even where two share a `server_id` (a clone; MariaDB, which has no
//! `server_uuid`). A lock not held there while the ids match is judged after the lease's next renewal: if
//! the lease renewed after this connection looked, the lock was the lease's all along, on another server;
//! if not, the lease was lost.
//!
//! # When
//! Every connection of a run when it is opened (the reader and the marker; a run that ends opens new ones,
//! proven again); the reader again with each read of the sequence counters, every
//! [`super::counter::COUNTER_CHECK_EVERY`], in the same statement ([`proof_columns`]); each listing of the
//! open transactions carries the proof in its own statement ([`super::proof::open_transactions`]); the
//! marker's writes prove it row by row ([`super::fence`]). Reads between two proofs are not proven one by
//! one: a proxy that routes single statements of a connection to another server is seen within
//! [`super::counter::COUNTER_CHECK_EVERY`], not at once. Connect the relay to the primary directly, or pin
//! its user to the primary in the proxy.

use std::fmt;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::Conn;

use super::fence::Fence;
use crate::error::{classify_mysql, Error, Result};
use crate::lease::Holding;
use crate::outbox::TableName;

/// What a connection says about the server it reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// `@@server_id`.
    pub server_id: u32,
    /// `@@server_uuid` (MySQL only).
    pub server_uuid: Option<String>,
    /// `@@read_only`.
    pub read_only: bool,
    /// `@@GLOBAL.auto_increment_increment`.
    pub increment: u64,
    /// The connection holding the lease's lock there (`None`: free, or no lease to ask about).
    pub lock_holder: Option<u64>,
}

impl Seen {
    /// The server `conn` reached, without a lease: its ids and settings (`outbox-cdc check`).
    ///
    /// # Errors
    /// Classified query errors.
    pub async fn read(conn: &mut Conn) -> Result<Seen> {
        let rows: Vec<(String, String)> = conn
            .query(
                "SHOW GLOBAL VARIABLES WHERE Variable_name IN \
                 ('server_id', 'server_uuid', 'read_only', 'auto_increment_increment')",
            )
            .await
            .map_err(|e| classify_mysql(&e).context("poll: reading the server's identity"))?;
        let get = |name: &str| rows.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str());
        Ok(Seen {
            server_id: get("server_id").and_then(|v| v.parse().ok()).unwrap_or_default(),
            server_uuid: get("server_uuid").filter(|v| !v.is_empty()).map(str::to_string),
            read_only: get("read_only").is_some_and(|v| v.eq_ignore_ascii_case("ON") || v == "1"),
            increment: get("auto_increment_increment").and_then(|v| v.parse().ok()).unwrap_or(1),
            lock_holder: None,
        })
    }

    /// The server `conn` reached, and who holds `lease`'s lock there, in one statement.
    async fn read_leased(conn: &mut Conn, lease: &Holding) -> Result<Seen> {
        let row: Option<ProofRow> = conn
            .exec_first(format!("SELECT {}", proof_columns(lease)), (lease.lock(),))
            .await
            .map_err(|e| classify_mysql(&e).context("poll: proving the server's identity"))?;
        Ok(Seen::of(row.ok_or_else(|| Error::transient("poll: the server's identity came back empty"))?))
    }

    /// The columns of [`proof_columns`], as read.
    pub(super) fn of((server_id, server_uuid, read_only, increment, lock_holder): ProofRow) -> Seen {
        Seen { server_id, server_uuid, read_only: read_only != 0, increment, lock_holder }
    }
}

/// The columns [`proof_columns`] lists, as read.
pub(super) type ProofRow = (u32, Option<String>, i64, u64, Option<u64>);

/// The columns that say which server a statement ran on, for a statement on `lease`'s server, with the
/// lock's name as their one parameter: `@@server_id`, `@@server_uuid` (MySQL; `NULL` on MariaDB, which has
/// none), `@@GLOBAL.read_only`, `@@GLOBAL.auto_increment_increment`, `IS_USED_LOCK(?)` ([`Seen::of`]).
pub(super) fn proof_columns(lease: &Holding) -> String {
    let uuid = match lease.server().server_uuid {
        Some(_) => "@@server_uuid",
        None => "NULL",
    };
    format!("@@server_id, {uuid}, @@GLOBAL.read_only, @@GLOBAL.auto_increment_increment, IS_USED_LOCK(?)")
}

/// Why a connection's server is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Its `server_id` or `server_uuid` is not the lease's.
    AnotherServer {
        /// Which connection (`reading`, `marking`).
        connection: &'static str,
        /// The lease's server: `server_id`, `server_uuid`.
        lease: (u32, Option<String>),
        /// This connection's.
        seen: (u32, Option<String>),
    },
    /// The same `server_id`, but the lease's lock is not held by the lease's connection there, while the
    /// lease renewed after this connection looked: another server with the same `server_id`.
    LockElsewhere {
        /// Which connection.
        connection: &'static str,
        /// The shared `server_id`.
        server_id: u32,
    },
    /// `@@read_only` is on: a replica, or a demoted primary.
    ReadOnly {
        /// Its `server_id`.
        server_id: u32,
    },
    /// `[poll] progress_table` with `auto_increment_increment` above 1.
    Increment {
        /// The progress table.
        progress: TableName,
        /// The global value.
        increment: u64,
    },
}

const DIRECT: &str = "Connect the relay to the primary directly, not through a read/write-splitting proxy (or \
                      route the relay's user to the primary only in the proxy)";

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ids = |(id, uuid): &(u32, Option<String>)| match uuid {
            Some(uuid) => format!("server_id {id} ({uuid})"),
            None => format!("server_id {id}"),
        };
        match self {
            Refusal::AnotherServer { connection, lease, seen } => write!(
                f,
                "poll: the relay's {connection} connection reached {}, but its lease is held on {}: source.host \
                 leads to more than one server (a read/write-splitting proxy such as ProxySQL or MaxScale, a \
                 name or load balancer over a primary and its replicas). On another server than the lease's the \
                 relay would miss rows a replica has not applied yet, and with a progress table take numbers \
                 as free that the primary still commits. {DIRECT}",
                ids(seen),
                ids(lease)
            ),
            Refusal::LockElsewhere { connection, server_id } => write!(
                f,
                "poll: the relay's {connection} connection reached a server with the lease's server_id \
                 {server_id} on which the lease is not held, while it was held on the lease's server: two \
                 servers share server_id {server_id} (a cloned server or replica) and source.host leads to \
                 both. Give each server its own server_id. {DIRECT}"
            ),
            Refusal::ReadOnly { server_id } => write!(
                f,
                "poll: the source server (server_id {server_id}) is read-only (@@read_only = ON): a replica, or \
                 a demoted primary. The relay marks what it published in the table it reads and proves numbers \
                 free on the server where rows are written: it runs against the writable primary. {DIRECT}"
            ),
            Refusal::Increment { progress, increment } => write!(
                f,
                "poll: [poll] progress_table = {progress} needs @@GLOBAL.auto_increment_increment = 1, the server has \
                 {increment}: with a larger step (set for another writable primary beside this one, or by hand) \
                 sequence numbers are taken where the relay cannot see them, and the progress table's number \
                 could pass a row committed later. Write to one primary with SET GLOBAL \
                 auto_increment_increment = 1 (and the same in the server's configuration), or remove [poll] \
                 progress_table to mark rows one by one"
            ),
        }
    }
}

impl From<Refusal> for Error {
    fn from(refusal: Refusal) -> Error {
        Error::definite(refusal.to_string())
    }
}

/// What a connection's server is, judged: fine, refused, or the lease's lock not seen there (judged after
/// the lease's next renewal).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Judged {
    Proven,
    Refused(Refusal),
    LockNotSeen,
}

/// Judges `seen` on `connection` against the lease (its server and its lock's connection, when there is
/// one) and `[poll] progress_table` (`progress`, when set).
fn judge(connection: &'static str, lease: Option<&Holding>, seen: &Seen, progress: Option<&TableName>) -> Judged {
    if let Some(lease) = lease {
        let server = lease.server();
        let uuids_differ = matches!((&server.server_uuid, &seen.server_uuid), (Some(a), Some(b)) if a != b);
        if server.server_id != seen.server_id || uuids_differ {
            return Judged::Refused(Refusal::AnotherServer {
                connection,
                lease: (server.server_id, server.server_uuid.clone()),
                seen: (seen.server_id, seen.server_uuid.clone()),
            });
        }
        if seen.lock_holder != Some(lease.connection_id()) {
            return Judged::LockNotSeen;
        }
    }
    if seen.read_only {
        return Judged::Refused(Refusal::ReadOnly { server_id: seen.server_id });
    }
    match progress {
        Some(progress) if seen.increment != 1 => {
            Judged::Refused(Refusal::Increment { progress: progress.clone(), increment: seen.increment })
        }
        _ => Judged::Proven,
    }
}

/// Proves that `conn` (the run's `connection`: `reading`, `marking`) reached the server `fence`'s lease is
/// held on, that it is writable, and (with `[poll] progress_table`, `progress`) that it numbers rows one
/// by one.
///
/// # Errors
/// A [`Refusal`] as a definite error; transient when the lease turns out lost; classified query errors.
pub async fn prove(
    conn: &mut Conn,
    fence: &Fence,
    connection: &'static str,
    progress: Option<&TableName>,
) -> Result<()> {
    let Some(lease) = fence.lease() else {
        return match judge(connection, None, &Seen::read(conn).await?, progress) {
            Judged::Refused(refusal) => Err(refusal.into()),
            Judged::Proven | Judged::LockNotSeen => Ok(()),
        };
    };
    let seen = Seen::read_leased(conn, lease).await?;
    judged(&seen, tokio::time::Instant::now(), lease, connection, progress).await
}

/// Judges what a statement on `connection` saw of its server (`seen`, read back by `looked`) against
/// `lease` and `progress` ([`prove`]).
///
/// # Errors
/// As [`prove`].
pub(super) async fn judged(
    seen: &Seen,
    looked: tokio::time::Instant,
    lease: &Holding,
    connection: &'static str,
    progress: Option<&TableName>,
) -> Result<()> {
    match judge(connection, Some(lease), seen, progress) {
        Judged::Proven => Ok(()),
        Judged::Refused(refusal) => Err(refusal.into()),
        Judged::LockNotSeen => {
            // The lease renews every F/6: a renewal sent after this connection looked proves the lock was
            // the lease's all along, somewhere else.
            while lease.is_held() && lease.renewed_at() <= looked {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            match lease.is_held() {
                true => Err(Refusal::LockElsewhere { connection, server_id: seen.server_id }.into()),
                false => Err(Error::lease_lost(
                    "poll: the lease was lost while the relay proved its connection's server; waiting as a standby",
                )),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(server_id: u32, read_only: bool, increment: u64) -> Seen {
        Seen { server_id, server_uuid: None, read_only, increment, lock_holder: None }
    }

    /// Without a lease (`check`): a read-only server is refused, and a step above 1 with a progress table
    /// only. (With a lease the ids and the lock decide first: `tests/poll.rs`, a second server behind a
    /// proxy.)
    #[test]
    fn a_replica_and_a_step_above_one_are_refused() {
        let progress = TableName::parse("shop.outbox_relay_progress").unwrap();
        let numbered = Some(&progress);
        assert_eq!(judge("reading", None, &seen(1, false, 1), numbered), Judged::Proven);
        assert_eq!(judge("reading", None, &seen(1, false, 2), None), Judged::Proven);
        assert_eq!(
            judge("reading", None, &seen(1, false, 2), numbered),
            Judged::Refused(Refusal::Increment { progress: progress.clone(), increment: 2 })
        );
        assert_eq!(
            judge("marking", None, &seen(7, true, 2), numbered),
            Judged::Refused(Refusal::ReadOnly { server_id: 7 })
        );
    }

    /// Each refusal is definite and says what to do.
    #[test]
    fn each_refusal_says_what_to_do() {
        let refusals = [
            Refusal::AnotherServer { connection: "reading", lease: (1, Some("u-1".into())), seen: (2, None) },
            Refusal::LockElsewhere { connection: "marking", server_id: 3 },
            Refusal::ReadOnly { server_id: 4 },
            Refusal::Increment { progress: TableName::parse("shop.p").unwrap(), increment: 2 },
        ];
        for (refusal, part) in refusals.into_iter().zip([
            "reached server_id 2, but its lease is held on server_id 1 (u-1)",
            "two servers share server_id 3",
            "read-only (@@read_only = ON)",
            "progress_table = shop.p needs @@GLOBAL.auto_increment_increment = 1, the server has 2",
        ]) {
            let error = Error::from(refusal);
            assert!(error.is_definite() && error.to_string().contains(part), "{part}: {error}");
        }
        assert!(Error::from(Refusal::ReadOnly { server_id: 4 }).to_string().contains("not through a read/write"));
    }
}
