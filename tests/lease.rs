//! The active/standby lease (`src/lease.rs`) against a real MariaDB: a standby waits while the holder lives
//! and takes over when it dies (killed connection, silent network loss, server crash); a holder that lost
//! the lease hands it over only once it has stopped; ten contenders never hold it two at a time.
//!
//! The timing assertions are the bounds the module promises for `failover_timeout` = `F` (3 s here): a
//! silent holder gives up within `F/2` of the cut, strictly before a standby can have the lock, and the
//! standby has it within `F`. Each comes with slack for a loaded machine; none is a benchmark.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::mariadb::CDC_PASSWORD;
use common::{MariaDb, Proxy};
use mysql_async::prelude::Queryable;
use outbox_cdc::config::Config;
use outbox_cdc::lease::Lease;
use outbox_cdc::source::SourceConn;
use tokio::time::Instant;

/// Slack on every timing bound: scheduling on a shared 2-core machine, the proxy's 20 ms polling.
const SLACK: Duration = Duration::from_millis(700);

/// A connector config for the server at `port` with `[state] name` and `[delivery] failover_timeout_ms`.
fn config(port: u16, name: &str, failover_ms: u64) -> Config {
    Config::parse(&format!(
        "[source]\nhost = \"127.0.0.1\"\nport = {port}\nuser = \"cdc\"\npassword = \"{CDC_PASSWORD}\"\nserver_id = 4711\n\
         connect_timeout_ms = 2000\n\
         [outbox]\ntable = \"shop.outbox_events\"\n[kafka]\nbootstrap_servers = \"127.0.0.1:1\"\n\
         [snapshot]\nmode = \"never\"\n[state]\nname = \"{name}\"\n[delivery]\nfailover_timeout_ms = {failover_ms}\n"
    ))
    .expect("test config")
}

/// Acquires the lease of `config` with a shutdown that never comes.
async fn acquire(config: &Config) -> Lease {
    let source = SourceConn::from_config(config).expect("source");
    Lease::acquire(&source, &config.state.name, config.delivery.failover_timeout, std::future::pending::<()>())
        .await
        .expect("acquire")
        .expect("no shutdown was asked for")
}

/// A standby on its own task: resolves to the lease and the instant it was acquired.
fn standby(config: Config) -> tokio::task::JoinHandle<(Lease, Instant)> {
    tokio::spawn(async move {
        let lease = acquire(&config).await;
        (lease, Instant::now())
    })
}

/// The lease's log (standby waiting, acquired, lost, released) in the test's output.
fn log() {
    let _ = tracing_subscriber::fmt().with_test_writer().with_env_filter("outbox_cdc=info").try_init();
}

/// `IS_USED_LOCK(lock)`, as the server sees it.
async fn holder_of(conn: &mut mysql_async::Conn, lock: &str) -> Option<u64> {
    conn.exec_first::<Option<u64>, _, _>("SELECT IS_USED_LOCK(?)", (lock,)).await.expect("IS_USED_LOCK").flatten()
}

/// The ids of the sessions of user `cdc` open on the server.
async fn cdc_sessions(conn: &mut mysql_async::Conn) -> std::collections::BTreeSet<u64> {
    let ids: Vec<u64> =
        conn.query("SELECT ID FROM information_schema.PROCESSLIST WHERE USER = 'cdc'").await.expect("PROCESSLIST");
    ids.into_iter().collect()
}

/// The second instance with the same name waits while the first holds the lease and takes over once the
/// first's connection is killed; the killed holder reports the loss; other names are not blocked (also names
/// MySQL would confuse or refuse: differing only in case, longer than its 64 characters; this MariaDB does
/// neither, so here that part checks the names sent and that the server grants each on its own); a
/// released lease is free at once; an acquire that is shut down returns no lease.
#[tokio::test(flavor = "multi_thread")]
async fn a_standby_waits_while_the_holder_lives_and_takes_over_when_it_is_killed() {
    log();
    let db = MariaDb::start();
    let f = Duration::from_millis(3000);
    let orders = config(db.port(), "orders", 3000);
    let mut root = db.conn().await;

    let active = acquire(&orders).await;
    assert!(active.is_held());
    assert_eq!(holder_of(&mut root, active.lock()).await, Some(active.connection_id()));
    let waiting = standby(orders.clone());

    // A different connector on the same server is not blocked.
    let payments = tokio::time::timeout(f, acquire(&config(db.port(), "payments", 3000)))
        .await
        .expect("another name is acquired at once");
    // Names MySQL would confuse (case-insensitive lock names) or refuse (over 64 characters) get locks of
    // their own: none of these waits for another.
    let long = |last: char| format!("{}{last}", "a".repeat(99));
    let mut others = Vec::new();
    for name in ["Orders".to_string(), "ORDERS".to_string(), long('b'), long('c')] {
        let other = tokio::time::timeout(f, acquire(&config(db.port(), &name, 3000)))
            .await
            .unwrap_or_else(|_| panic!("{name} waited for another connector's lease"));
        assert!(other.lock().len() <= 64, "{}", other.lock());
        assert_eq!(holder_of(&mut root, other.lock()).await, Some(other.connection_id()));
        others.push(other);
    }

    // The standby waits through several GET_LOCK polls and renewals of the holder.
    tokio::time::sleep(f).await;
    assert!(!waiting.is_finished(), "the standby acquired a lease that is held");
    assert!(active.is_held(), "the holder renews its lease");

    // An acquire shut down while it waits returns no lease.
    let source = SourceConn::from_config(&orders).unwrap();
    let before = cdc_sessions(&mut root).await;
    let shut = Lease::acquire(&source, "orders", f, tokio::time::sleep(Duration::from_millis(1500))).await.unwrap();
    assert!(shut.is_none(), "shutdown ends the wait without a lease");
    // Its last GET_LOCK ends on the server within its 1-second wait (the module's docs: it may be granted
    // the lock in that second, and its connection then closes); wait until its session is gone (not for a
    // time, which a loaded server can overrun), so that the hand-overs below are between the two instances
    // only.
    let its: Vec<u64> = cdc_sessions(&mut root).await.difference(&before).copied().collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    while cdc_sessions(&mut root).await.iter().any(|id| its.contains(id)) {
        assert!(Instant::now() < deadline, "the shut-down acquire's session {its:?} stays open");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let killed = Instant::now();
    root.query_drop(format!("KILL {}", active.connection_id())).await.expect("KILL the holder's connection");
    let (taken, taken_at) = tokio::time::timeout(f, waiting).await.expect("takeover within F").unwrap();
    assert!(taken_at - killed < f, "took over {:?} after the kill", taken_at - killed);
    let reason = tokio::time::timeout(f / 2 + SLACK, active.lost()).await.expect("the killed holder notices");
    assert!(!active.is_held());
    eprintln!("killed holder: {reason}");
    assert_eq!(holder_of(&mut root, taken.lock()).await, Some(taken.connection_id()));

    // A released lease is free at once, and can be taken again.
    let lock = taken.lock().to_string();
    taken.release().await;
    assert_eq!(holder_of(&mut root, &lock).await, None, "RELEASE_LOCK freed it");
    let again = tokio::time::timeout(f, acquire(&orders)).await.expect("free lease acquired at once");
    again.release().await;
    payments.release().await;
    for other in others {
        other.release().await;
    }
    active.release().await;
}

/// A holder cut off by a silent network partition (no FIN, no RST: a host loss) stops counting itself
/// active within F/2, strictly before the standby, connected directly, is granted the lock, and the standby
/// has it within F. Fails when the lock connection keeps the server's default `wait_timeout` (the server
/// would keep the dead holder's lock for hours) or when the holder gives up later than the server can
/// hand the lock on.
#[tokio::test(flavor = "multi_thread")]
async fn a_silent_holder_gives_up_before_the_standby_takes_over() {
    log();
    let db = MariaDb::start();
    let f = Duration::from_millis(3000);
    let proxy = Proxy::start(db.port());
    let active = acquire(&config(proxy.port(), "orders", 3000)).await;
    let waiting = standby(config(db.port(), "orders", 3000));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!waiting.is_finished(), "the standby acquired a lease that is held");

    let cut = Instant::now();
    proxy.blackhole(Duration::from_secs(60));
    let lost = active.lost();
    let reason = tokio::time::timeout(f, lost).await.expect("the cut-off holder gives up");
    let lost_at = Instant::now();
    assert!(!active.is_held());
    let (taken, taken_at) = tokio::time::timeout(f + SLACK, waiting).await.expect("the standby takes over").unwrap();
    eprintln!("cut-off holder: {reason}; lost after {:?}, standby acquired after {:?}", lost_at - cut, taken_at - cut);
    assert!(lost_at - cut <= f / 2 + SLACK, "the holder gave up {:?} after the cut", lost_at - cut);
    assert!(lost_at < taken_at, "the holder still counted itself active when the standby took over");
    assert!(taken_at - cut <= f + SLACK, "the standby took over {:?} after the cut", taken_at - cut);
    let mut root = db.conn().await;
    assert_eq!(holder_of(&mut root, taken.lock()).await, Some(taken.connection_id()));
    taken.release().await;
}

/// A holder whose renewals stall (the network goes silent for a moment, then comes back) gives up within
/// F/2 but keeps the lock's connection until it has stopped and releases: the standby takes over only then,
/// not when the network comes back. Fails when a lost lease closes its connection at once.
#[tokio::test(flavor = "multi_thread")]
async fn a_lost_lease_is_handed_over_only_when_released() {
    log();
    let db = MariaDb::start();
    let f = Duration::from_millis(3000);
    let proxy = Proxy::start(db.port());
    let active = acquire(&config(proxy.port(), "orders", 3000)).await;
    let waiting = standby(config(db.port(), "orders", 3000));
    tokio::time::sleep(Duration::from_millis(1200)).await;

    // Silent for 2 s: longer than F/2, shorter than the server's wait_timeout (F). The renewal in flight
    // reaches the server when the network comes back, which restarts its idle timer: it would close the
    // session at cut + 2 s + F at the earliest.
    let cut = Instant::now();
    proxy.blackhole(Duration::from_millis(2000));
    tokio::time::timeout(f, active.lost()).await.expect("the stalled holder gives up");
    assert!(!active.is_held());
    tokio::time::sleep_until(cut + Duration::from_millis(3500)).await;
    assert!(!waiting.is_finished(), "the standby took over before the lost holder had stopped");

    let released = Instant::now();
    active.release().await;
    let (taken, taken_at) = tokio::time::timeout(f, waiting).await.expect("the standby takes over").unwrap();
    eprintln!("standby acquired {:?} after the release", taken_at - released);
    assert!(taken_at - released <= Duration::from_secs(1) + SLACK);
    taken.release().await;
}

/// The server crashes (SIGKILL) and comes back: the holder reports the loss, the two standbys (one that
/// was waiting, one that arrives during the outage) reconnect, and exactly one of them holds the lease.
#[tokio::test(flavor = "multi_thread")]
async fn after_a_server_crash_exactly_one_contender_takes_the_lease() {
    log();
    let mut db = MariaDb::start();
    let f = Duration::from_millis(3000);
    let orders = config(db.port(), "orders", 3000);
    let active = acquire(&orders).await;
    let first = standby(orders.clone());
    tokio::time::sleep(Duration::from_millis(1200)).await;

    db.kill();
    let reason = tokio::time::timeout(f / 2 + SLACK, active.lost()).await.expect("the holder notices the crash");
    eprintln!("holder after the crash: {reason}");
    let second = standby(orders.clone());
    tokio::time::sleep(Duration::from_millis(500)).await;
    db.start_again();

    // Reconnect back-off is capped at F/4; the first one to get through holds it.
    let started = Instant::now();
    while !first.is_finished() && !second.is_finished() {
        assert!(started.elapsed() < f * 5, "no contender acquired the lease after the restart");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The other keeps waiting through several polls.
    tokio::time::sleep(f).await;
    assert!(first.is_finished() != second.is_finished(), "both contenders hold the lease");
    let (winner, loser) = if first.is_finished() { (first, second) } else { (second, first) };
    let (lease, _) = winner.await.unwrap();
    let mut root = db.conn().await;
    assert_eq!(holder_of(&mut root, lease.lock()).await, Some(lease.connection_id()));
    // Handing over works after the outage too.
    lease.release().await;
    let (next, _) = tokio::time::timeout(f, loser).await.expect("the other one takes over").unwrap();
    assert_eq!(holder_of(&mut root, next.lock()).await, Some(next.connection_id()));
    next.release().await;
    active.release().await;
}

/// Ten contenders started at the same instant take the lease in turn, many times: never two at once (each
/// holder counts itself in and asks the server whom it names as the holder), and the lease passes between
/// contenders.
#[tokio::test(flavor = "multi_thread")]
async fn ten_contenders_never_hold_it_two_at_a_time() {
    const CONTENDERS: usize = 10;
    const TURNS: usize = 40;
    log();
    let db = MariaDb::start();
    let orders = config(db.port(), "orders", 3000);
    let barrier = Arc::new(tokio::sync::Barrier::new(CONTENDERS));
    let holding = Arc::new(AtomicUsize::new(0));
    let turns = Arc::new(AtomicUsize::new(0));
    let (done_tx, done_rx) = tokio::sync::watch::channel(false);
    let winners: Arc<Mutex<Vec<usize>>> = Arc::default();
    let mut tasks = Vec::new();
    for me in 0..CONTENDERS {
        let (orders, barrier, holding, turns, winners) =
            (orders.clone(), barrier.clone(), holding.clone(), turns.clone(), winners.clone());
        let mut done = done_rx.clone();
        let done_tx = done_tx.clone();
        let mut root = db.conn().await;
        tasks.push(tokio::spawn(async move {
            let source = SourceConn::from_config(&orders).unwrap();
            let mut violations = Vec::new();
            barrier.wait().await;
            loop {
                let mut done_now = done.clone();
                let shutdown = async move {
                    let _ = done_now.wait_for(|d| *d).await;
                };
                let Some(lease) =
                    Lease::acquire(&source, "orders", Duration::from_millis(3000), shutdown).await.expect("acquire")
                else {
                    break;
                };
                if holding.fetch_add(1, Ordering::SeqCst) != 0 {
                    violations.push(format!("contender {me} acquired while another held the lease"));
                }
                let named = holder_of(&mut root, lease.lock()).await;
                if named != Some(lease.connection_id()) {
                    violations.push(format!("contender {me} holds, the server names {named:?}"));
                }
                winners.lock().unwrap().push(me);
                tokio::time::sleep(Duration::from_millis(5 + (me as u64 * 7) % 20)).await;
                if !lease.is_held() {
                    violations.push(format!("contender {me} lost its lease while nothing failed"));
                }
                holding.fetch_sub(1, Ordering::SeqCst);
                lease.release().await;
                if turns.fetch_add(1, Ordering::SeqCst) + 1 >= TURNS {
                    let _ = done_tx.send(true);
                }
                if *done.borrow_and_update() {
                    break;
                }
            }
            violations
        }));
    }
    let mut violations = Vec::new();
    for task in tasks {
        violations.extend(tokio::time::timeout(Duration::from_secs(120), task).await.expect("contenders end").unwrap());
    }
    assert!(violations.is_empty(), "{violations:#?}");
    let winners = winners.lock().unwrap().clone();
    assert!(winners.len() >= TURNS, "{} turns", winners.len());
    let distinct: std::collections::BTreeSet<usize> = winners.iter().copied().collect();
    assert!(distinct.len() >= 2, "the lease never passed between contenders: {winners:?}");
}
