//! Active/standby: which of two instances with the same config publishes. The one holding a user-level lock
//! (`GET_LOCK`) on the source server is active; the other waits for it.
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports the source connection ([`SourceConn`]) beside it, and floors 0-2
//! (error, metrics).
//!
//! # Why the source server's `GET_LOCK`
//! Every deployment of this connector already has the source server, and both instances already reach it
//! with the same user: a lock there needs no privilege, no table, no new service and no new credentials. It
//! is held by a connection, so the server itself ends it when the holder goes away: at once when the
//! holder's socket closes (kill -9: the kernel closes it), after the session's `wait_timeout` when the
//! holder falls silent (host loss, network cut: no FIN ever arrives). Kafka's group coordinator would do
//! too, but its liveness is the consumer's poll loop, a second timeout to tune and a group to name and
//! authorize; and the connector is useless without its source anyway. Nothing here is home-made
//! consensus: the server's lock table decides, we only bound how long each side may believe in it.
//!
//! # The bound
//! With `F = [delivery] failover_timeout_ms` (2000..=600000, see [`Timing`]):
//! - The lock's connection runs `SET SESSION wait_timeout = floor(F / 1 s)` (and the same
//!   `net_read_timeout`/`net_write_timeout`, for a command the server had begun to read or write), so the
//!   server drops a silent holder, and its lock, no later than `floor(F)` after the last command it
//!   received: within `F`. Floor, not ceiling: rounding up would let a takeover exceed `F` by up to a
//!   second; rounded down it is still more than `F/2` (`floor(F) >= F - 999 ms > F/2` for `F >= 2000`).
//! - The holder renews every `F/6` (`SELECT IS_USED_LOCK(name) = CONNECTION_ID()`, one round trip that also
//!   resets the server's idle timer) and counts as lost at `t + F/2`, where `t` is the time it *sent* its
//!   last renewal that came back. The server's idle timer started after it received that renewal, so a
//!   silent holder's lock cannot go to anyone before `t + floor(F)`: the holder gives up at least
//!   `floor(F) - F/2` (at least 500 ms, 1 s for `F = 2000`) before a standby can have the lock.
//! - Right after `GET_LOCK` returns 1 the holder renews once and starts counting from that renewal's send
//!   time: the moment the server granted the lock is not known to the client, the send time of a later
//!   command is a safe lower bound of when the server last heard from it.
//! - A standby blocks in `GET_LOCK(name, 1)` in a loop, so it is granted the lock the moment the server
//!   releases it: takeover is within `F` of the last command the dead holder's server saw (a cut or a host
//!   loss), and immediate after kill -9 or a graceful release. It polls in 1-second steps to notice
//!   `shutdown`, and re-checks and logs who holds the lock when that changes.
//!
//! # Use
//! ```text
//! loop {
//!     let Some(lease) = Lease::acquire(&source, &config.state.name, failover, shutdown.wait()).await? else {
//!         return Ok(()); // shut down while standing by
//!     };
//!     select! {
//!         reason = lease.lost() => { stop the pipeline (it must not publish once lease.is_held() is false) }
//!         _ = shutdown.wait() => { stop the pipeline gracefully }
//!         end = run the pipeline => { ... }
//!     }
//!     lease.release().await; // after the pipeline has stopped: only then may a standby start
//! }
//! ```
//!
//! # Invariants
//! - [`Lease::is_held`] turns false no later than `F/2` after the send time of the last good renewal, from
//!   the clock alone, even if the keeper task has not run (a starved runtime): callers that check it before
//!   each publication never publish past that instant.
//! - [`Lease::lost`] resolves at the same deadline (or sooner, when the connection fails or the server names
//!   another holder), and never un-resolves: a lost lease is never regained; acquire a new one.
//! - The lock lives on one dedicated connection; losing that connection is losing the lease.
//! - A lost lease keeps its connection, if it is still open, until the owner releases or drops the
//!   [`Lease`] (having stopped publishing): a holder that merely *could not prove* it still holds the lock
//!   does not hand it to a standby while it is still stopping. The server closes that connection `floor(F)`
//!   after the last command it received at the latest.
//!
//! # Safety does not rest on the lease
//! The lease keeps two instances from *working* at once in the normal case; it does not make a second
//! publisher impossible:
//! - A process paused longer than `F/2` (SIGSTOP, a VM freeze, a swap storm) resumes still holding its
//!   `Lease` until it looks at the clock, and a suspended VM's monotonic clock may not count the pause at
//!   all: then it learns of the loss only when its next renewal fails (the server has closed the session).
//! - The server frees the lock at once when *it* ends the session: an operator's `KILL`, a server restart
//!   or crash. The holder learns it with its next renewal, within `F/6` and a round trip.
//! - The lock is per server. Both instances must reach the *same* server, which they do with the same
//!   config while `source.host` resolves to one server. If it is a DNS name or a proxy that fails over to
//!   another server (a promoted replica), the two instances can each hold "the" lock, on two servers.
//!
//! What protects then is Kafka's own fencing: with `[delivery] guarantee = "exactly_once"` the producer's
//! `transactional.id` fences the older producer at the broker; with `at_least_once` the state writes to
//! Kafka (`[state] backend = "kafka"`) are fenced the same way, so a fenced instance cannot move the shared
//! checkpoint, and what it published twice is within the duplicates at-least-once allows.
//!
//! # Names
//! The lock is `outbox-cdc/<state.name>`. MySQL 5.7+ refuses lock names over 64 characters, and the MySQL
//! and MariaDB manuals call lock names case-insensitive (MariaDB 10.11, as measured by the tests' server,
//! compares them byte for byte and takes longer names). One rule fits all of them: [`lock_name`] keeps
//! `outbox-cdc/<name>` when the name is lower case and fits (up to 53 characters); otherwise the lock is
//! `outbox-cdc/<first 44 characters, lower-cased>~<CRC-32 of the exact name, 8 hex digits>`, at most 64
//! characters. `~` is not allowed in a connector name, so a shortened name never equals a kept one, and
//! `Orders` and `orders` get different locks on every server. Two names that share their first 44
//! characters (case aside) and their CRC-32 would share a lease: the second connector would wait, logging
//! the holder, never publish alongside.
//!
//! # Error handling
//! Connection and query failures are transient everywhere: the standby reconnects with capped back-off
//! (100 ms doubling up to `min(5 s, F/4)`), the holder reports the lease lost. A definite error from
//! connecting (wrong password, TLS settings) is returned by [`Lease::acquire`]: waiting cannot fix it.
//! A standby shut down in the middle of a `GET_LOCK` drops its connection; the server may still grant it
//! the lock for the rest of that one-second wait before the session ends and the lock is freed.
//!
//! # Cost
//! One extra connection per instance (count it in `max_connections`), a one-row query every `F/6` on the
//! active one and a blocking `GET_LOCK` every second on the standby. No privilege is needed.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::error::{classify_mysql, Error, Result};
use crate::metrics::metrics;
use crate::source::SourceConn;

/// How long [`Lease::of_stopped_connector`] waits before it concludes that an instance runs: more than a
/// standby's one-second `GET_LOCK` poll.
pub const STOPPED_WAIT: Duration = Duration::from_secs(3);

/// The prefix of every lock this connector takes.
const PREFIX: &str = "outbox-cdc/";
/// The longest lock name MySQL accepts (error 3057, ER_USER_LOCK_WRONG_NAME, beyond it).
const MAX_LOCK_NAME: usize = 64;
/// Characters kept from a name that has to be shortened: prefix + 44 + `~` + 8 hex digits = 64.
const KEPT_CHARS: usize = MAX_LOCK_NAME - PREFIX.len() - 1 - 8;
/// How long one `GET_LOCK` waits on the server before the standby checks `shutdown` and the holder again.
const POLL_SECONDS: u64 = 1;
/// First and longest pause between reconnects of a standby.
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// The lock name for connector `name` (`[state] name`); see the module docs, "Names".
pub fn lock_name(name: &str) -> String {
    let plain = format!("{PREFIX}{name}");
    if plain.len() <= MAX_LOCK_NAME && !name.chars().any(|c| c.is_ascii_uppercase()) {
        return plain;
    }
    let kept: String = name.chars().take(KEPT_CHARS).collect::<String>().to_ascii_lowercase();
    format!("{PREFIX}{kept}~{:08x}", crc32fast::hash(name.as_bytes()))
}

/// The lock a running connector's holder takes beside its lease: `outbox-cdc-config/<CRC-32 of the name>/
/// <fingerprint of the configuration>`, 42 characters. A standby whose configuration's lock is held by
/// another connection than the lease's runs beside a different connector of the same name.
pub fn config_lock_name(name: &str, fingerprint: u32) -> String {
    format!("outbox-cdc-config/{:08x}/{fingerprint:08x}", crc32fast::hash(name.as_bytes()))
}

/// The timeouts derived from `failover_timeout`; see the module docs, "The bound".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    failover: Duration,
}

impl Timing {
    /// Timing for a failover timeout (the config keeps it within 2 s..=600 s; shorter values are raised
    /// to 2 s, where the bound still holds).
    pub fn new(failover: Duration) -> Self {
        Timing { failover: failover.max(Duration::from_secs(2)) }
    }

    /// The lock connection's `wait_timeout` (and net read/write timeouts), in seconds: `floor(F)`.
    pub fn session_timeout_s(&self) -> u64 {
        self.failover.as_secs()
    }

    /// How often the holder renews: `F/6`.
    pub fn renew_every(&self) -> Duration {
        self.failover / 6
    }

    /// How long after the send time of its last good renewal the holder still counts itself active: `F/2`.
    pub fn give_up_after(&self) -> Duration {
        self.failover / 2
    }

    /// The longest pause between a standby's reconnects: `min(5 s, F/4)`.
    fn backoff_max(&self) -> Duration {
        (self.failover / 4).min(BACKOFF_MAX)
    }
}

/// What the holder's keeper task and the [`Lease`] share.
#[derive(Debug)]
struct Shared {
    /// The instant [`Shared::last_ok`] counts from.
    origin: Instant,
    /// Send time of the last good renewal, in nanoseconds since `origin`.
    last_ok_ns: AtomicU64,
    /// Set once the lease is lost; never cleared.
    lost: AtomicBool,
}

impl Shared {
    fn last_ok(&self) -> Instant {
        self.origin + Duration::from_nanos(self.last_ok_ns.load(Ordering::Acquire))
    }

    fn renewed(&self, sent: Instant) {
        let ns = u64::try_from(sent.saturating_duration_since(self.origin).as_nanos()).unwrap_or(u64::MAX);
        self.last_ok_ns.store(ns, Ordering::Release);
    }
}

/// [`Lease::is_held`], apart from the lease: the publishing code's check, so that no record is handed to
/// the producer past the lease's deadline even while the task that would see [`Lease::lost`] is busy (a
/// state write blocks it for up to its timeout). It also names the lock and the connection holding it, so
/// that a statement on the lease's server can check the lease itself (`IS_USED_LOCK(lock) = connection`:
/// the polling relay's writes, `relay::fence`).
#[derive(Debug, Clone)]
pub struct Holding {
    shared: Arc<Shared>,
    timing: Timing,
    /// The server-side lock name.
    lock: String,
    /// The server's id of the connection holding the lock.
    connection_id: u64,
    /// The server the lock is held on.
    server: LeaseServer,
}

impl Holding {
    /// As [`Lease::is_held`].
    pub fn is_held(&self) -> bool {
        !self.shared.lost.load(Ordering::Acquire)
            && Instant::now() < self.shared.last_ok() + self.timing.give_up_after()
    }

    /// As [`Lease::lock`].
    pub fn lock(&self) -> &str {
        &self.lock
    }

    /// The `wait_timeout` of the lock's connection, in seconds (`floor(F)`): a session of the holder that
    /// falls silent ends no later than its lease can pass to a standby.
    pub fn session_timeout_s(&self) -> u64 {
        self.timing.session_timeout_s()
    }

    /// As [`Lease::connection_id`].
    pub fn connection_id(&self) -> u64 {
        self.connection_id
    }

    /// As [`Lease::server`].
    pub fn server(&self) -> &LeaseServer {
        &self.server
    }

    /// When the last renewal that came back was sent: the server named this instance's connection as the
    /// lock's holder after that instant (and a lock lost is never held again by the same lease).
    pub fn renewed_at(&self) -> Instant {
        self.shared.last_ok()
    }
}

/// `outbox_cdc_standby` is 1 while [`Lease::acquire`] waits, however the wait ends (the lease, shutdown, an
/// error, or the future dropped): a standby is not ready by design, and alerts must tell it from an instance
/// that is not ready for a reason to act on.
struct StandingBy;

impl StandingBy {
    fn start() -> StandingBy {
        metrics().standby(true);
        StandingBy
    }
}

impl Drop for StandingBy {
    fn drop(&mut self) {
        metrics().standby(false);
    }
}

/// A held lease: this instance is the active one until [`Lease::lost`] resolves. Dropping it closes the
/// lock's connection (the server releases the lock); [`Lease::release`] does so explicitly and waits.
#[derive(Debug)]
pub struct Lease {
    /// The server-side lock name.
    lock: String,
    /// The server's id of the connection holding the lock (`CONNECTION_ID()`).
    connection_id: u64,
    /// The server the lock is held on.
    server: LeaseServer,
    timing: Timing,
    shared: Arc<Shared>,
    /// `Some(reason)` once lost.
    state: watch::Receiver<Option<String>>,
    /// Asks the keeper to release (sent) or just to close (dropped with the lease).
    stop: Option<oneshot::Sender<()>>,
    /// The keeper task, which owns the connection.
    keeper: Option<JoinHandle<()>>,
}

impl Lease {
    /// Waits until this instance holds the lock [`lock_name`]`(name)` on a connection of its own, as a
    /// standby: logging who holds it (connection id and client host, from `IS_USED_LOCK` and the process
    /// list) whenever that changes, reconnecting after connection failures. Returns `Ok(None)` as soon as
    /// `shutdown` resolves.
    ///
    /// # Errors
    /// A definite error when connecting cannot succeed (credentials, TLS); everything else is retried.
    pub async fn acquire<F: Future>(
        source: &SourceConn,
        name: &str,
        failover_timeout: Duration,
        shutdown: F,
    ) -> Result<Option<Lease>> {
        Lease::acquire_as(source, name, None, failover_timeout, shutdown).await
    }

    /// [`Lease::acquire`] for a running connector whose configuration has the fingerprint `config`
    /// ([`config_lock_name`]): the holder also takes the lock of its configuration, and a standby whose
    /// configuration's lock is not held by the lease's holder says so loudly. Two different connectors
    /// left at the default `[state] name` on one server would otherwise make the second a silent,
    /// permanent standby.
    ///
    /// # Errors
    /// As [`Lease::acquire`].
    pub async fn acquire_as<F: Future>(
        source: &SourceConn,
        name: &str,
        config: Option<u32>,
        failover_timeout: Duration,
        shutdown: F,
    ) -> Result<Option<Lease>> {
        let config_lock = config.map(|fingerprint| config_lock_name(name, fingerprint));
        let _standing_by = StandingBy::start();
        let lock = lock_name(name);
        let timing = Timing::new(failover_timeout);
        let started = Instant::now();
        let mut backoff = BACKOFF_FIRST;
        let mut holder_seen: Option<u64> = None;
        tokio::pin!(shutdown);
        loop {
            let connected = tokio::select! {
                _ = &mut shutdown => return Ok(None),
                c = open(source, timing) => c,
            };
            let (mut conn, connection_id, server) = match connected {
                Ok(c) => c,
                Err(e) if e.is_definite() => return Err(e.context(format_args!("lease {lock}"))),
                Err(e) => {
                    tracing::warn!(lock = %lock, error = %e, retry_in_ms = backoff.as_millis() as u64, "standby: cannot reach the source server for the lease");
                    tokio::select! {
                        _ = &mut shutdown => return Ok(None),
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(timing.backoff_max());
                    continue;
                }
            };
            backoff = BACKOFF_FIRST;
            let why = loop {
                // The server answers within POLL_SECONDS; a connection that does not answer within
                // that plus the renewal deadline is gone.
                let wait = Duration::from_secs(POLL_SECONDS) + timing.give_up_after();
                let got = tokio::select! {
                    _ = &mut shutdown => return Ok(None),
                    r = tokio::time::timeout(wait, try_lock(&mut conn, &lock)) => r,
                };
                match got {
                    Err(_) => break format!("GET_LOCK did not answer within {} ms", wait.as_millis()),
                    Ok(Err(e)) => break e.to_string(),
                    Ok(Ok(None)) => break "GET_LOCK returned NULL (the connection was killed)".to_string(),
                    Ok(Ok(Some(false))) => {
                        let who = tokio::time::timeout(wait, async {
                            match holder_id(&mut conn, &lock).await? {
                                Some(id) if holder_seen != Some(id) => {
                                    Ok(Some((id, holder_host(&mut conn, id).await?)))
                                }
                                _ => Ok::<_, Error>(None),
                            }
                        });
                        match who.await {
                            Ok(Ok(Some((id, host)))) => {
                                holder_seen = Some(id);
                                tracing::info!(lock = %lock, holder_connection = id, holder_host = %host, "standby: waiting for the lease held by connection {id} from {host}");
                                if let Some(config_lock) = &config_lock {
                                    let same = tokio::time::timeout(wait, holder_id(&mut conn, config_lock)).await;
                                    if matches!(same, Ok(Ok(holder)) if holder != Some(id)) {
                                        tracing::warn!(
                                            lock = %lock,
                                            holder_connection = id,
                                            holder_host = %host,
                                            "standby: the instance holding the lease of connector {name:?} runs with \
                                             another configuration (other outbox tables, topics, broker or state \
                                             topic), or an older outbox-cdc. If it is a different connector, give \
                                             each its own [state] name: this one would otherwise wait for ever and \
                                             never publish. During a rolling change of the configuration this is \
                                             expected and ends when the old instance stops"
                                        );
                                    }
                                }
                            }
                            Ok(Ok(None)) => {}
                            Ok(Err(e)) => break e.to_string(),
                            Err(_) => break "the holder query did not answer".to_string(),
                        }
                    }
                    Ok(Ok(Some(true))) => {
                        // Count from a command sent after the grant (see "The bound").
                        let sent = Instant::now();
                        match tokio::time::timeout(timing.give_up_after(), renew(&mut conn, &lock)).await {
                            Ok(Ok(true)) => {
                                if let Some(config_lock) = &config_lock {
                                    // Best effort: only a standby's diagnosis depends on it.
                                    let _ = conn.query_drop(format!("SELECT GET_LOCK('{config_lock}', 0)")).await;
                                }
                                let lease = Lease::start(conn, lock, connection_id, server, timing, sent);
                                tracing::info!(lock = %lease.lock, connection = connection_id, "lease acquired after {} ms", started.elapsed().as_millis());
                                return Ok(Some(lease));
                            }
                            Ok(Ok(false)) => break "granted, but the server names another holder".to_string(),
                            Ok(Err(e)) => break e.to_string(),
                            Err(_) => break "the first renewal did not answer".to_string(),
                        }
                    }
                }
            };
            tracing::warn!(lock = %lock, reason = %why, "standby: lease connection lost; reconnecting");
            close(conn).await;
        }
    }

    /// The lease of the connector `config` names, for a command that needs it stopped (`quarantine
    /// release`, `state copy`): taken at once, or refused after [`STOPPED_WAIT`] as held by a running
    /// instance. Release it when done.
    ///
    /// # Errors
    /// A definite error saying the connector runs; what [`Lease::acquire`] returns otherwise.
    pub async fn of_stopped_connector(config: &crate::config::Config) -> Result<Lease> {
        let source = SourceConn::from_config(config)?;
        let failover = config.delivery.failover_timeout;
        let name = &config.state.name;
        Lease::acquire(&source, name, failover, tokio::time::sleep(STOPPED_WAIT)).await?.ok_or_else(|| {
            Error::definite(format!(
                "connector {name:?} is running (another process holds its lease on the source server): stop it first"
            ))
        })
    }

    /// Starts the keeper task that renews the lock on `conn`.
    fn start(
        conn: Conn,
        lock: String,
        connection_id: u64,
        server: LeaseServer,
        timing: Timing,
        sent: Instant,
    ) -> Lease {
        let shared = Arc::new(Shared { origin: sent, last_ok_ns: AtomicU64::new(0), lost: AtomicBool::new(false) });
        let (state_tx, state) = watch::channel(None);
        let (stop, stop_rx) = oneshot::channel();
        metrics().lease_held(true);
        let keeper = tokio::spawn(keep(conn, lock.clone(), timing, shared.clone(), state_tx, stop_rx));
        Lease { lock, connection_id, server, timing, shared, state, stop: Some(stop), keeper: Some(keeper) }
    }

    /// The server the lock is held on: the binlog connection must reach the same ([`LeaseServer::check_same`]).
    pub fn server(&self) -> &LeaseServer {
        &self.server
    }

    /// The server-side lock name.
    pub fn lock(&self) -> &str {
        &self.lock
    }

    /// The server's id of the connection holding the lock (`CONNECTION_ID()`, what `IS_USED_LOCK` returns).
    pub fn connection_id(&self) -> u64 {
        self.connection_id
    }

    /// The instant after which this lease can no longer be proven held unless a renewal succeeds first.
    pub fn held_until(&self) -> Instant {
        self.shared.last_ok() + self.timing.give_up_after()
    }

    /// Whether the lease is still provably held: not lost, and the deadline of the last good renewal not yet
    /// passed (from the clock, even if the keeper task has not run). Cheap: check it before publishing.
    pub fn is_held(&self) -> bool {
        !self.shared.lost.load(Ordering::Acquire) && Instant::now() < self.held_until()
    }

    /// A cloneable view of [`Lease::is_held`] for the code that publishes (the sink checks it before each
    /// record it hands to the producer).
    pub fn holding(&self) -> Holding {
        Holding {
            shared: self.shared.clone(),
            timing: self.timing,
            lock: self.lock.clone(),
            connection_id: self.connection_id,
            server: self.server.clone(),
        }
    }

    /// Resolves with the reason once the lease can no longer be proven held: the connection failed, no
    /// renewal came back within `F/2` of the last good one being sent, or the server names another holder.
    /// Cheap to create (a channel handle) and cancel-safe: call it in every `tokio::select!` round, or keep
    /// one. Then stop publishing and [`Lease::release`]: until then the lock's connection stays open (if it
    /// still is), so that a standby does not start while this instance is still stopping; the server closes
    /// it `floor(F)` after the last renewal at the latest.
    pub fn lost(&self) -> impl Future<Output = String> + Send + 'static {
        let mut state = self.state.clone();
        async move {
            match state.wait_for(Option::is_some).await {
                Ok(reason) => reason.clone().unwrap_or_default(),
                Err(_) => "the lease's keeper task ended".to_string(),
            }
        }
    }

    /// Releases the lock (`RELEASE_LOCK`) and closes its connection; a lost lease only closes it. Call it
    /// once this instance has stopped publishing.
    pub async fn release(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(keeper) = self.keeper.take() {
            let _ = keeper.await;
        }
    }
}

/// The holder's keeper: renews every `F/6` until the lease is lost, released, or dropped.
async fn keep(
    mut conn: Conn,
    lock: String,
    timing: Timing,
    shared: Arc<Shared>,
    state: watch::Sender<Option<String>>,
    mut stop: oneshot::Receiver<()>,
) {
    let reason = loop {
        let last_ok = shared.last_ok();
        tokio::select! {
            release = &mut stop => {
                shared.lost.store(true, Ordering::Release);
                if release.is_ok() {
                    let released = tokio::time::timeout(
                        timing.give_up_after(),
                        conn.query_drop(format!("DO RELEASE_LOCK('{lock}')")),
                    ).await;
                    tracing::info!(lock = %lock, ok = matches!(released, Ok(Ok(()))), "lease released");
                }
                metrics().lease_held(false);
                let _ = state.send(Some("released".to_string()));
                close(conn).await;
                return;
            }
            _ = tokio::time::sleep_until(last_ok + timing.renew_every()) => {}
        }
        let sent = Instant::now();
        // A renewal is not interrupted by a release request: it ends by the deadline anyway, and an
        // interrupted query would leave the connection unusable for RELEASE_LOCK.
        match tokio::time::timeout_at(last_ok + timing.give_up_after(), renew(&mut conn, &lock)).await {
            Ok(Ok(true)) => shared.renewed(sent),
            Ok(Ok(false)) => break "the server no longer names this connection as the lock's holder".to_string(),
            Ok(Err(e)) => break format!("the lock's connection failed: {e}"),
            Err(_) => {
                break format!(
                    "no renewal came back within {} ms (half of failover_timeout_ms)",
                    timing.give_up_after().as_millis()
                )
            }
        }
    };
    shared.lost.store(true, Ordering::Release);
    metrics().lease_held(false);
    tracing::warn!(lock = %lock, "lease lost: {reason}; stopping publication");
    let _ = state.send(Some(reason));
    // The connection stays open until the owner has stopped publishing and releases (or drops) the lease:
    // closing it now would hand a lock that may still be ours to a standby while this instance is still
    // stopping. Not renewed any more, it is closed by the server `floor(F)` after its last command at most.
    let _ = stop.await;
    close(conn).await;
}

/// Opens the lock's connection with the session timeouts of [`Timing`] and returns it with its
/// `CONNECTION_ID()`.
async fn open(source: &SourceConn, timing: Timing) -> Result<(Conn, u64, LeaseServer)> {
    let mut conn = source.connect().await?;
    let s = timing.session_timeout_s();
    let setup = async {
        conn.query_drop(format!("SET SESSION wait_timeout = {s}, net_read_timeout = {s}, net_write_timeout = {s}"))
            .await?;
        let id = conn.query_first::<u64, _>("SELECT CONNECTION_ID()").await?;
        let variables: Vec<(String, String)> = conn.query(SERVER_VARIABLES).await?;
        Ok::<_, mysql_async::Error>((id, variables))
    };
    match tokio::time::timeout(timing.give_up_after(), setup).await {
        Ok(Ok((Some(id), variables))) => Ok((conn, id, LeaseServer::of(&variables)?)),
        Ok(Ok((None, _))) => Err(Error::transient("SELECT CONNECTION_ID() returned no row")),
        Ok(Err(e)) => Err(classify_mysql(&e).context("setting up the lease connection")),
        Err(_) => Err(Error::transient("setting up the lease connection timed out")),
    }
}

/// Which server `source` reaches now: one connection, [`SERVER_VARIABLES`]. `source.host` may lead elsewhere
/// than when a lease was taken on it (a switchover behind a DNS name or a proxy, the old primary still up).
///
/// # Errors
/// As connecting and [`LeaseServer::of`].
pub async fn server_reached_by(source: &SourceConn) -> Result<LeaseServer> {
    let mut conn = source.connect().await?;
    let variables: Vec<(String, String)> =
        conn.query(SERVER_VARIABLES).await.map_err(|e| classify_mysql(&e).context("reading the server's identity"))?;
    close(conn).await;
    LeaseServer::of(&variables)
}

/// The server variables that say which server the lease is on, and whether it can give one lock to all.
pub const SERVER_VARIABLES: &str =
    "SHOW GLOBAL VARIABLES WHERE Variable_name IN ('server_id', 'server_uuid', 'wsrep_on')";

/// The server a lease is held on: the binlog connection must reach the same one ([`LeaseServer::check_same`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseServer {
    /// `@@server_id`.
    pub server_id: u32,
    /// `@@server_uuid` (MySQL only).
    pub server_uuid: Option<String>,
}

impl LeaseServer {
    /// From [`SERVER_VARIABLES`]' rows.
    ///
    /// # Errors
    /// Definite for a Galera node (`wsrep_on = ON`): `GET_LOCK` there is refused or holds on one node
    /// only, so two instances connected to two nodes would each hold "the" lease and publish at once.
    pub fn of(variables: &[(String, String)]) -> Result<LeaseServer> {
        let get = |name: &str| variables.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str());
        if get("wsrep_on").is_some_and(|v| v.eq_ignore_ascii_case("ON") || v == "1") {
            return Err(Error::definite(
                "the source server is a Galera cluster node (wsrep_on = ON): its GET_LOCK is not one lock for the \
                 whole cluster (Galera refuses or scopes user locks per node), so two instances reaching two \
                 nodes would both be active. Point [source] at one node (not a load balancer over several) or at \
                 an asynchronous replica of the cluster, which also serves the binlog",
            ));
        }
        Ok(LeaseServer {
            server_id: get("server_id").and_then(|v| v.parse().ok()).unwrap_or_default(),
            server_uuid: get("server_uuid").filter(|v| !v.is_empty()).map(str::to_string),
        })
    }

    /// That the binlog connection (`server_id`, `server_uuid`) reaches the server the lease is held on.
    ///
    /// # Errors
    /// Transient when it does not (a proxy or DNS name that failed over between the two connections, or a
    /// pool of replicas behind one name): another instance may hold the lease on that server and publish.
    /// The run does not start; it is tried again after the back-off.
    pub fn check_same(&self, server_id: u32, server_uuid: Option<&str>) -> Result<()> {
        if self.is(server_id, server_uuid) {
            return Ok(());
        }
        Err(Error::lease_elsewhere(format!(
            "the lease is held on server_id {} ({}) but the binlog connection reached server_id {server_id} ({}): \
             source.host leads to more than one server (a proxy or DNS name that failed over, a pool of replicas). \
             Another instance could hold the lease on that server and publish at the same time, so this one does \
             not start. Point source.host at one server",
            self.server_id,
            self.server_uuid.as_deref().unwrap_or("no uuid"),
            server_uuid.unwrap_or("no uuid"),
        )))
    }
}

impl LeaseServer {
    /// Whether `server_id` and `server_uuid` (when both sides know one) name this server.
    pub fn is(&self, server_id: u32, server_uuid: Option<&str>) -> bool {
        let uuids_differ = matches!((&self.server_uuid, server_uuid), (Some(a), Some(b)) if a != b);
        self.server_id == server_id && !uuids_differ
    }
}

impl std::fmt::Display for LeaseServer {
    /// `server_id 11 (uuid …)`, or `server_id 11` without a uuid.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.server_uuid {
            Some(uuid) => write!(f, "server_id {} ({uuid})", self.server_id),
            None => write!(f, "server_id {}", self.server_id),
        }
    }
}

/// One `GET_LOCK(lock, POLL_SECONDS)`: `Some(true)` granted, `Some(false)` timed out (held elsewhere),
/// `None` for NULL (an error on the server, e.g. the connection was killed).
async fn try_lock(conn: &mut Conn, lock: &str) -> Result<Option<bool>> {
    let got: Option<Option<i64>> = conn
        .query_first(format!("SELECT GET_LOCK('{lock}', {POLL_SECONDS})"))
        .await
        .map_err(|e| classify_mysql(&e).context("GET_LOCK"))?;
    Ok(got.flatten().map(|v| v == 1))
}

/// Whether the server names this connection as the lock's holder; the command also resets the server's
/// idle timer (`wait_timeout`).
async fn renew(conn: &mut Conn, lock: &str) -> Result<bool> {
    let held: Option<Option<i64>> = conn
        .query_first(format!("SELECT IS_USED_LOCK('{lock}') = CONNECTION_ID()"))
        .await
        .map_err(|e| classify_mysql(&e).context("renewing the lease"))?;
    Ok(held.flatten() == Some(1))
}

/// Which connection holds the lock (`IS_USED_LOCK`); `None` when it is free right now.
async fn holder_id(conn: &mut Conn, lock: &str) -> Result<Option<u64>> {
    let id: Option<Option<u64>> = conn
        .query_first(format!("SELECT IS_USED_LOCK('{lock}')"))
        .await
        .map_err(|e| classify_mysql(&e).context("IS_USED_LOCK"))?;
    Ok(id.flatten())
}

/// The client host (`address:port`) of connection `id`, for the standby's log: `?` when the server will not
/// say (another user's connection without the PROCESS privilege, a process list that is not there).
async fn holder_host(conn: &mut Conn, id: u64) -> Result<String> {
    match conn
        .query_first::<String, _>(format!("SELECT HOST FROM information_schema.PROCESSLIST WHERE ID = {id}"))
        .await
    {
        Ok(host) => Ok(host.unwrap_or_else(|| "?".to_string())),
        Err(mysql_async::Error::Server(_)) => Ok("?".to_string()),
        Err(e) => Err(classify_mysql(&e).context("reading the lock holder's host")),
    }
}

/// Closes a connection without waiting long on a dead network: the server ends the session (and releases
/// its locks) when the socket closes, or after `wait_timeout` when the close never reaches it.
async fn close(conn: Conn) {
    let _ = tokio::time::timeout(Duration::from_secs(1), conn.disconnect()).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards against a lease that is no lease: a Galera node (per-node locks) is refused, and a binlog
    /// connection that reached another server than the lock's (a proxy that failed over, a pool of
    /// replicas behind one name) keeps the run from starting.
    #[test]
    fn the_lease_needs_one_server_for_all() {
        let vars = |v: &[(&str, &str)]| v.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect::<Vec<_>>();
        let err = LeaseServer::of(&vars(&[("server_id", "1"), ("wsrep_on", "ON")])).unwrap_err();
        assert!(err.is_definite() && err.to_string().contains("Galera"), "{err}");
        let mariadb = LeaseServer::of(&vars(&[("server_id", "1"), ("wsrep_on", "OFF")])).unwrap();
        assert_eq!(mariadb, LeaseServer { server_id: 1, server_uuid: None });
        let mysql = LeaseServer::of(&vars(&[("server_id", "1"), ("server_uuid", "u-1")])).unwrap();
        mariadb.check_same(1, None).expect("the same MariaDB server");
        mysql.check_same(1, Some("u-1")).expect("the same MySQL server");
        let err = mariadb.check_same(2, None).unwrap_err();
        assert!(!err.is_definite() && err.kind() == &crate::error::Kind::LeaseElsewhere, "{err}");
        let err = mysql.check_same(1, Some("u-2")).unwrap_err();
        assert!(err.to_string().contains("u-2"), "a server cloned with its server_id: {err}");
    }

    /// Every name the config accepts (1-100 of `[A-Za-z0-9._-]`) gives a lock name MySQL accepts, one per
    /// name as the server compares them (case-insensitively).
    #[test]
    fn lock_names_fit_and_stay_distinct() {
        assert_eq!(lock_name("orders"), "outbox-cdc/orders");
        let fits = "a".repeat(53);
        assert_eq!(lock_name(&fits), format!("outbox-cdc/{fits}"));
        let long = "a".repeat(54);
        let shortened = lock_name(&long);
        assert_eq!(shortened.len(), 64, "{shortened}");
        assert!(shortened.starts_with(&format!("outbox-cdc/{}~", "a".repeat(44))), "{shortened}");
        assert_eq!(lock_name(&"x".repeat(100)).len(), 64);
        // Stable across builds: CRC-32 (IEEE) of the exact name.
        assert_eq!(lock_name(&long), format!("outbox-cdc/{}~{:08x}", "a".repeat(44), crc32fast::hash(long.as_bytes())));
        let lower = |s: &str| s.to_ascii_lowercase();
        let names = ["Orders", "orders", "ORDERS", &"a".repeat(54), &format!("{}b", "a".repeat(53))];
        let locks: Vec<String> = names.iter().map(|n| lower(&lock_name(n))).collect();
        for (i, a) in locks.iter().enumerate() {
            assert!(a.len() <= 64);
            for b in &locks[i + 1..] {
                assert_ne!(a, b, "two names share a lock as the server compares names");
            }
        }
    }

    /// The holder gives up strictly before the server can release a silent holder's lock, and the server
    /// releases it within the failover timeout, for every timeout the config accepts.
    #[test]
    fn the_holder_gives_up_before_the_server_hands_the_lock_on() {
        for ms in (2000..=600_000).step_by(7) {
            let t = Timing::new(Duration::from_millis(ms));
            let server_releases = Duration::from_secs(t.session_timeout_s());
            assert!(server_releases <= Duration::from_millis(ms), "{ms}: takeover within the failover timeout");
            assert!(
                t.give_up_after() + Duration::from_millis(500) <= server_releases,
                "{ms}: the holder stops at least 500 ms before the server can release"
            );
            assert!(t.renew_every() * 3 <= t.give_up_after(), "{ms}: three renewals per deadline");
        }
    }
}
