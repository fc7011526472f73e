//! The polling relay (`source.kind = "poll"`) under the write patterns production has (issue 45, item 3),
//! each case in both modes (per-row marking, and `[poll] progress_table`): 32 concurrent writers, 30 %
//! rolled-back transactions, `INSERT IGNORE` duplicates, `auto_increment_increment = 2`, bulk inserts under
//! `innodb_autoinc_lock_mode = 2`, a transaction held 12 s with a follower of its aggregate queued on its
//! lock, a restart with held rows above the number and a release while down, `TRUNCATE` between two runs,
//! a relay paused past its lease with a release during the pause, a kill -9 during a 100k-event catch-up,
//! and the two the gap proof must survive: a detached XA transaction, and a client that keeps
//! `information_schema.INNODB_TRX` from refreshing.
//!
//! Writers of one aggregate are serialized by the aggregate's row lock (`shop.aggregates`), as an
//! application's are, so an aggregate's sequence order is its commit order and the CONTRACT's promise
//! applies: each aggregate's events published in sequence order. Every case ends by judging **every**
//! record of the topic against the table's committed events (`common::patterns::judge`): without a crash,
//! each aggregate's records must be exactly its events, once, in order; with one (a kill, a pause), nothing
//! may be missing and every step back must replay a contiguous in-order run. Each case records its figures
//! for `scripts/reliability` (`OUTBOX_CDC_SCENARIO_FULL=1` runs longer loads).
//!
//! The relays connect as `relay` (`SELECT, UPDATE` on the outbox table and `PROCESS`; with a progress table
//! also `SELECT, INSERT, UPDATE` on it), as the README tells users to.
//!
//! Each case's doc says what it showed on f915307, before issue 45's fixes.

mod common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::broker::Received;
use common::patterns::{
    assert_table_holds, count, expected_of, judge, latest_stderr, logs, max_seq, prepare, published, published_through,
    read_until_seen, record, relay_config, sample, start_relay, statement_on, table_events, trace, unpublished_up_to,
    wait_logged, wait_table_published, Mode, TableEvent, Verdict, DLQ, HELD_AT, PROGRESS_TABLE, TOPIC,
};
use common::reliability::scaled;
use common::workload::{create_aggregates, lock_aggregate, InsertShape, PatternConfig, PatternWriter, Patterned};
use common::{free_port, insert_event, wait_until, Broker, Connector, Engine, Expected, MariaDb, OutboxRow};
use mysql_async::prelude::Queryable;

/// How long the relay may take to publish what a case wrote, once the writers stopped: past the relay's
/// 30 s sweep, which finds a row committed long after its number was read.
const CATCH_UP: Duration = Duration::from_secs(90);
/// The relays' `[poll]` settings (default `batch_rows`, as users run it).
const POLL: &str = "poll_interval_ms = 50";
/// The transaction of case 6 is held this long (the pattern: past the relay's 10 s gap grace).
const HELD_FOR: Duration = Duration::from_secs(12);

/// A MariaDB with the relay user (and the progress table), a broker, and the case's start time.
struct Bench {
    db: MariaDb,
    broker: Broker,
    mode: Mode,
    started: Instant,
}

impl Bench {
    fn on(db: MariaDb, mode: Mode) -> Bench {
        let started = Instant::now();
        prepare(&db, mode);
        Bench { db, broker: Broker::start(Engine::Memory), mode, started }
    }

    fn start(mode: Mode) -> Bench {
        Bench::on(MariaDb::start(), mode)
    }

    /// A relay with [`POLL`] and `extra`, started.
    fn relay(&self, extra: &str) -> Connector {
        start_relay(&self.db, &self.broker, self.mode, POLL, extra)
    }

    /// The scenario name of case `case` in this mode, for `scripts/reliability`.
    fn name(&self, case: &str) -> String {
        format!("relay patterns, {}: {case}", self.mode.label())
    }

    /// Judges `records` against `expected` ([`judge`]), writes the case's figures, then asserts the verdict
    /// as `judging` says; the message traces the first aggregate that went wrong (sequence numbers from
    /// `events`). Returns the verdict.
    fn settle(
        &self,
        case: &str,
        judging: Judging,
        (written, table_rows): (usize, usize),
        (expected, records, events): (&Expected, &[Received], &[TableEvent]),
        note: &str,
        relays: &[&Connector],
    ) -> Verdict {
        let name = self.name(case);
        let verdict = judge(expected, records);
        record(&name, written, table_rows, &verdict, self.started.elapsed(), note);
        let context = match &verdict.first_bad {
            Some(aggregate) => format!("{}\n{}", trace(aggregate, expected, records, events), logs(relays)),
            None => logs(relays),
        };
        match judging {
            Judging::Exact => verdict.assert_exact(&name, &context),
            Judging::ReplaysOnly => verdict.assert_replays_only(&name, &context),
        }
        verdict
    }
}

/// How a case's records are judged.
#[derive(Debug, Clone, Copy)]
enum Judging {
    /// Nothing crashed: every event once, in order.
    Exact,
    /// A relay was killed or paused: nothing missing, every step back a replay of a contiguous run.
    ReplaysOnly,
}

/// A pattern writer on `db` with `cfg`.
async fn writer(db: &MariaDb, cfg: PatternConfig) -> PatternWriter {
    PatternWriter::start(db.opts_root(), cfg).await
}

/// The transactions the writers rolled back or retried, for figures.
fn rolled_back(written: &Patterned) -> String {
    format!(
        "{} transactions committed, {} events rolled back, {} retried after an error",
        written.transactions(),
        written.rolled_back.len(),
        written.errors.len()
    )
}

// ---------------------------------------------------------------------------------------------------------
// 1. 32 concurrent writers.

/// 32 writers over 48 aggregates (several writers per aggregate, serialized by its row lock): every event
/// once, in order.
/// On f915307 (before issue 45's fixes) 20-34 events per run came after a later event of their
/// aggregate.
#[tokio::test(flavor = "multi_thread")]
async fn thirty_two_writers_marking() {
    thirty_two_writers(Mode::Marking).await;
}

/// [`thirty_two_writers_marking`] with a progress table: 32 transactions open at once take sequence
/// numbers and commit out of sequence order all the time.
/// On f915307: 13-31 events after a later event of their aggregate.
#[tokio::test(flavor = "multi_thread")]
async fn thirty_two_writers_progress_table() {
    thirty_two_writers(Mode::ProgressTable).await;
}

async fn thirty_two_writers(mode: Mode) {
    let bench = Bench::start(mode);
    let relay = bench.relay("");
    let cfg = PatternConfig {
        tasks: 32,
        aggregates: 48,
        max_transactions: scaled(3_000, 15_000),
        pause: Duration::from_millis(5),
        ..PatternConfig::default()
    };
    let written = writer(&bench.db, cfg).await.join().await;
    let events = table_events(&bench.db).await;
    assert_table_holds(&events, &written);
    let expected = expected_of(&events, &HashSet::new());
    let records = read_until_seen(&bench.broker, TOPIC, &expected, CATCH_UP);
    let note = format!(
        "32 writers over 48 aggregates, each transaction locking its aggregate's row; {}",
        rolled_back(&written)
    );
    bench.settle(
        "32 concurrent writers",
        Judging::Exact,
        (written.events(), events.len()),
        (&expected, &records, &events),
        &note,
        &[&relay],
    );
}

// ---------------------------------------------------------------------------------------------------------
// 2. 30 % rolled back.

/// 4 writers over 64 aggregates, 30 % of their transactions rolled back after the outbox insert, a steady
/// load for 20 s (30 s in the full run): every committed event once, in order. Issue 45 reproduced 139
/// events republished after a later event of their aggregate with a progress table (0 with marking).
/// On f915307 marking passes; with a progress table 220,000-270,000 records for 8,500 events, 19,000-24,000
/// step backs and 9,000-11,000 events first published after a later one.
#[tokio::test(flavor = "multi_thread")]
async fn rollbacks_marking() {
    rollbacks(Mode::Marking).await;
}

/// [`rollbacks_marking`] with a progress table.
#[tokio::test(flavor = "multi_thread")]
async fn rollbacks_progress_table() {
    rollbacks(Mode::ProgressTable).await;
}

async fn rollbacks(mode: Mode) {
    let bench = Bench::start(mode);
    let relay = bench.relay("");
    let cfg = PatternConfig {
        tasks: 4,
        aggregates: 64,
        max_transactions: usize::MAX,
        pause: Duration::from_millis(3),
        rollback_percent: 30,
        ..PatternConfig::default()
    };
    let w = writer(&bench.db, cfg).await;
    // The pattern is a steady load of this length (the reproduction ran 30 s).
    let load = Duration::from_secs(scaled(20, 30));
    tokio::time::sleep(load).await;
    let written = w.finish().await;
    assert!(
        written.rolled_back.len() * 5 > written.transactions(),
        "the load rolled back too little: {}",
        rolled_back(&written)
    );
    let events = table_events(&bench.db).await;
    assert_table_holds(&events, &written);
    let expected = expected_of(&events, &HashSet::new());
    let records = read_until_seen(&bench.broker, TOPIC, &expected, CATCH_UP);
    let note = format!(
        "4 writers over 64 aggregates for {load:?}, 30 % of transactions rolled back after the outbox insert; {}",
        rolled_back(&written)
    );
    bench.settle(
        "30 % of transactions rolled back",
        Judging::Exact,
        (written.events(), events.len()),
        (&expected, &records, &events),
        &note,
        &[&relay],
    );
}

// ---------------------------------------------------------------------------------------------------------
// 3. INSERT IGNORE duplicates.

/// Events written with `INSERT IGNORE` (the event id is the primary key), 30 % of the transactions
/// inserting an id already in the table again (a retried command): ignored, each burns a sequence number
/// that no row will ever fill. Every event once, in order.
/// On f915307 marking passes; with a progress table 150,000-190,000 records for 3,000 events.
#[tokio::test(flavor = "multi_thread")]
async fn insert_ignore_duplicates_marking() {
    insert_ignore_duplicates(Mode::Marking).await;
}

/// [`insert_ignore_duplicates_marking`] with a progress table.
#[tokio::test(flavor = "multi_thread")]
async fn insert_ignore_duplicates_progress_table() {
    insert_ignore_duplicates(Mode::ProgressTable).await;
}

async fn insert_ignore_duplicates(mode: Mode) {
    let bench = Bench::start(mode);
    let relay = bench.relay("");
    let cfg = PatternConfig {
        tasks: 8,
        aggregates: 64,
        max_transactions: scaled(3_000, 10_000),
        pause: Duration::from_millis(3),
        duplicate_percent: 30,
        ..PatternConfig::default()
    };
    let written = writer(&bench.db, cfg).await.join().await;
    let events = table_events(&bench.db).await;
    assert_table_holds(&events, &written);
    let burned = max_seq(&bench.db).await - events.len() as u64;
    assert!(burned > 0, "the ignored duplicates burned no sequence number: {} ignored", written.ignored_duplicates);
    let expected = expected_of(&events, &HashSet::new());
    let records = read_until_seen(&bench.broker, TOPIC, &expected, CATCH_UP);
    let note = format!(
        "8 writers over 64 aggregates with INSERT IGNORE, 30 % of transactions inserting an existing event id \
         again: {} duplicates ignored, {burned} sequence numbers burned; {}",
        written.ignored_duplicates,
        rolled_back(&written)
    );
    bench.settle(
        "INSERT IGNORE duplicates",
        Judging::Exact,
        (written.events(), events.len()),
        (&expected, &records, &events),
        &note,
        &[&relay],
    );
}

// ---------------------------------------------------------------------------------------------------------
// 4. auto_increment_increment = 2.

/// `auto_increment_increment = 2` on the server (as a multi-primary setup has it): every other sequence
/// number is never used. Without a progress table the relay publishes every event once, in order.
/// On f915307: 1 event (the table's first row) published after all the rows of the first read: the gap
/// read spanning the first read's 999 gaps returned those rows again, and they went first.
#[tokio::test(flavor = "multi_thread")]
async fn auto_increment_increment_2_marking() {
    auto_increment_increment_2(Mode::Marking).await;
}

/// [`auto_increment_increment_2_marking`] with a progress table. What the CONTRACT should promise: a
/// progress table requires `auto_increment_increment = 1` (issue 45: a number another primary may still
/// commit cannot be proven free from this server), so `run` and `check` refuse at start, exit 2, saying so
/// and what to set; after `SET GLOBAL auto_increment_increment = 1` and a restart every event is
/// published once, in order. On f915307 the relay does not refuse and publishes 73,000-87,000 records for
/// 2,000 events.
#[tokio::test(flavor = "multi_thread")]
async fn auto_increment_increment_2_progress_table() {
    auto_increment_increment_2(Mode::ProgressTable).await;
}

async fn auto_increment_increment_2(mode: Mode) {
    let bench = Bench::start(mode);
    // Before anything connects: every session takes the global value.
    bench.db.sql("SET GLOBAL auto_increment_increment = 2; SET GLOBAL auto_increment_offset = 1;");
    let cfg = PatternConfig {
        tasks: 4,
        aggregates: 64,
        max_transactions: scaled(1_000, 4_000),
        pause: Duration::from_millis(2),
        ..PatternConfig::default()
    };
    let before = writer(&bench.db, cfg.clone()).await.join().await;
    let mut relay = bench.relay("");
    let during =
        writer(&bench.db, PatternConfig { aggregate_prefix: format!("{}x", cfg.aggregate_prefix), ..cfg }).await;
    let mut written = before;
    written.merge(during.join().await);
    assert_eq!(count(&bench.db, "seq % 2 = 0").await, 0, "every sequence number odd");
    let events = table_events(&bench.db).await;
    assert_table_holds(&events, &written);
    let expected = expected_of(&events, &HashSet::new());
    let mut note =
        format!("auto_increment_increment = 2 (global), 4 writers over 128 aggregates; {}", rolled_back(&written));
    if mode == Mode::ProgressTable {
        let answer = refused_or_published(&mut relay, &bench.broker, &expected, CATCH_UP);
        let Some(Answer::Refused(status)) = answer else {
            let records = bench.broker.read_all(TOPIC, expected.len(), Duration::from_secs(2));
            let verdict = judge(&expected, &records);
            note.push_str("; the relay did not refuse at start");
            record(
                &bench.name("auto_increment_increment = 2"),
                written.events(),
                events.len(),
                &verdict,
                bench.started.elapsed(),
                &note,
            );
            panic!(
                "a relay with a progress table did not refuse auto_increment_increment = 2 at start ({}): {}\n{}",
                match answer {
                    Some(_) => "it published every event",
                    None => "it ran on",
                },
                verdict.summary(),
                relay.logs()
            );
        };
        let stderr = latest_stderr(&relay);
        let compact: String = stderr.split_whitespace().collect();
        assert!(
            status.code() == Some(2)
                && stderr.contains("auto_increment_increment")
                && compact.contains("auto_increment_increment=1"),
            "the refusal must be a definite error (exit 2) naming auto_increment_increment = 1:\n{}",
            relay.logs()
        );
        let (status, stdout, _) = relay.command(&["check"], Duration::from_secs(60)).expect("check runs");
        assert!(status.code() == Some(2) && stdout.contains("auto_increment_increment"), "check:\n{stdout}");
        bench.db.sql("SET GLOBAL auto_increment_increment = 1;");
        relay.restart();
        note.push_str(
            "; the relay refused at start (exit 2) and published everything after SET GLOBAL auto_increment_increment = 1",
        );
    }
    let records = read_until_seen(&bench.broker, TOPIC, &expected, CATCH_UP);
    bench.settle(
        "auto_increment_increment = 2",
        Judging::Exact,
        (written.events(), events.len()),
        (&expected, &records, &events),
        &note,
        &[&relay],
    );
}

// ---------------------------------------------------------------------------------------------------------
// 5. Bulk inserts under innodb_autoinc_lock_mode = 2.

/// `innodb_autoinc_lock_mode = 2` (interleaved; a server start option): 8 writers each inserting 10
/// events of one aggregate per transaction, as one multi-row `INSERT … VALUES` or one `INSERT … SELECT`
/// (whose unused reserved numbers are lost): concurrent statements take interleaved numbers, with gaps
/// that never fill. Every event once, in order.
/// On f915307: 10-180 events after a later event of their aggregate (whole transactions of 10 behind the
/// next one).
#[tokio::test(flavor = "multi_thread")]
async fn bulk_inserts_autoinc_lock_mode_2_marking() {
    bulk_inserts_autoinc_lock_mode_2(Mode::Marking).await;
}

/// [`bulk_inserts_autoinc_lock_mode_2_marking`] with a progress table. On f915307: 170,000-210,000
/// records for 6,000 events.
#[tokio::test(flavor = "multi_thread")]
async fn bulk_inserts_autoinc_lock_mode_2_progress_table() {
    bulk_inserts_autoinc_lock_mode_2(Mode::ProgressTable).await;
}

async fn bulk_inserts_autoinc_lock_mode_2(mode: Mode) {
    let bench = Bench::on(MariaDb::builder().arg("--innodb-autoinc-lock-mode=2").start(), mode);
    assert_eq!(bench.db.sql("SELECT @@innodb_autoinc_lock_mode").trim(), "2");
    let relay = bench.relay("");
    let cfg = PatternConfig {
        tasks: 8,
        aggregates: 32,
        max_transactions: scaled(600, 3_000),
        pause: Duration::from_millis(2),
        events_per_tx: 10,
        shape: InsertShape::Bulk,
        ..PatternConfig::default()
    };
    let written = writer(&bench.db, cfg).await.join().await;
    let events = table_events(&bench.db).await;
    assert_table_holds(&events, &written);
    let burned = max_seq(&bench.db).await - events.len() as u64;
    // Transactions whose 10 events did not get 10 consecutive numbers.
    let seq_of: std::collections::HashMap<&str, u64> = events.iter().map(|e| (e.id.as_str(), e.seq)).collect();
    let interleaved = written
        .committed
        .values()
        .flatten()
        .filter(|(_, ids)| {
            let seqs: Vec<u64> = ids.iter().map(|id| seq_of[id.as_str()]).collect();
            seqs.windows(2).any(|w| w[1] != w[0] + 1)
        })
        .count();
    let expected = expected_of(&events, &HashSet::new());
    let records = read_until_seen(&bench.broker, TOPIC, &expected, CATCH_UP);
    let note = format!(
        "innodb_autoinc_lock_mode = 2, 8 writers over 32 aggregates, 10 events per transaction (multi-row \
         INSERT … VALUES or INSERT … SELECT): {burned} sequence numbers burned, {interleaved} transactions with \
         non-consecutive numbers; {}",
        rolled_back(&written)
    );
    bench.settle(
        "bulk inserts under innodb_autoinc_lock_mode = 2",
        Judging::Exact,
        (written.events(), events.len()),
        (&expected, &records, &events),
        &note,
        &[&relay],
    );
}

// ---------------------------------------------------------------------------------------------------------
// 6. A transaction held 12 s with a same-aggregate follower queued on its lock.

/// T1 locks aggregate A's business row, inserts A's event and stays open 12 s (past the relay's 10 s gap
/// grace) while a steady writer commits other aggregates' events above its sequence number; T2, queued on
/// A's lock, inserts A's next event and commits right after T1. T1's event must reach Kafka before T2's
/// (CONTRACT: "published before any later row of its aggregate"). Issue 45: T2's came first, in both modes.
/// On f915307 so it does, in both modes; without a progress table the marks also wait on T1's row lock
/// meanwhile (a 50 s lock-wait timeout and a restart when T1 stayed open longer).
#[tokio::test(flavor = "multi_thread")]
async fn a_transaction_held_12s_with_a_queued_follower_marking() {
    held_transaction_with_a_follower(Mode::Marking).await;
}

/// [`a_transaction_held_12s_with_a_queued_follower_marking`] with a progress table.
#[tokio::test(flavor = "multi_thread")]
async fn a_transaction_held_12s_with_a_queued_follower_progress_table() {
    held_transaction_with_a_follower(Mode::ProgressTable).await;
}

async fn held_transaction_with_a_follower(mode: Mode) {
    let bench = Bench::start(mode);
    let relay = bench.relay("");
    let steady = writer(
        &bench.db,
        PatternConfig {
            tasks: 3,
            aggregates: 24,
            max_transactions: usize::MAX,
            pause: Duration::from_millis(10),
            ..PatternConfig::default()
        },
    )
    .await;
    assert!(steady.wait_committed(50, CATCH_UP).await, "the steady writer stalled");
    let aggregate = "held-A".to_owned();
    create_aggregates(&mut bench.db.conn().await, std::slice::from_ref(&aggregate)).await.unwrap();

    let mut c1 = bench.db.conn().await;
    let mut t1 = c1.start_transaction(mysql_async::TxOpts::default()).await.unwrap();
    lock_aggregate(&mut t1, &aggregate).await.unwrap();
    let a1 = OutboxRow::new(aggregate.as_str());
    insert_event(&mut t1, &a1).await.unwrap();
    let held_since = Instant::now();
    let a1_seq: u64 = t1.exec_first("SELECT seq FROM outbox_events WHERE id = ?", (&a1.id,)).await.unwrap().unwrap();

    // T2 on its own connection: queued on A's lock until T1 commits, then A's next event, committed at once.
    let mut c2 = bench.db.conn().await;
    let t2_connection = c2.id();
    let a2 = OutboxRow::new(aggregate.as_str());
    let follower = {
        let (a2, aggregate) = (a2.clone(), aggregate.clone());
        tokio::spawn(async move {
            let mut t2 = c2.start_transaction(mysql_async::TxOpts::default()).await.unwrap();
            lock_aggregate(&mut t2, &aggregate).await.unwrap();
            insert_event(&mut t2, &a2).await.unwrap();
            t2.commit().await.unwrap();
            Instant::now()
        })
    };
    let queued = format!(
        "SELECT COUNT(*) FROM information_schema.INNODB_TRX WHERE trx_mysql_thread_id = {t2_connection} AND trx_state = 'LOCK WAIT'"
    );
    let db = &bench.db;
    assert!(wait_until(CATCH_UP, || db.sql(&queued).trim() == "1"), "T2 never queued on A's lock");
    // The relay has published a row above T1's number (its reads passed that number as a gap). Seen in
    // Kafka: without a progress table the marks may wait for T1's row lock.
    let above: String = loop {
        let mut c = db.conn().await;
        let id: Option<String> =
            c.exec_first("SELECT id FROM outbox_events WHERE seq > ? ORDER BY seq LIMIT 1", (a1_seq,)).await.unwrap();
        if let Some(id) = id {
            break id;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let broker = &bench.broker;
    assert!(
        wait_until(CATCH_UP, || broker
            .read_all(TOPIC, 1, Duration::from_secs(1))
            .iter()
            .any(|r| r.header_str("id") == Some(&above))),
        "nothing above T1's number was published:\n{}",
        relay.logs()
    );
    // The pattern: T1 stays open for 12 s.
    tokio::time::sleep(HELD_FOR.saturating_sub(held_since.elapsed())).await;
    t1.commit().await.unwrap();
    let t1_committed = Instant::now();
    let t2_committed = follower.await.unwrap();
    let gap_ms = t2_committed.saturating_duration_since(t1_committed).as_millis();
    let more = steady.committed() + 100;
    assert!(steady.wait_committed(more, CATCH_UP).await, "the steady writer stalled");
    let written = steady.finish().await;

    let events = table_events(db).await;
    assert_table_holds(&events, &written);
    let seq = |id: &str| events.iter().find(|e| e.id == id).map(|e| e.seq);
    assert!(seq(&a1.id) < seq(&a2.id), "T2's event took a number after T1's");
    let expected = expected_of(&events, &HashSet::new());
    let records = read_until_seen(broker, TOPIC, &expected, CATCH_UP);
    let of_a: Vec<String> = records
        .iter()
        .filter(|r| r.key_str() == Some(aggregate.as_str()))
        .map(|r| {
            format!("{}:{} {}", r.partition, r.offset, if r.header_str("id") == Some(&a1.id) { "T1" } else { "T2" })
        })
        .collect();
    let note = format!(
        "T1 held A's row lock and its outbox insert {:.1} s beside 3 steady writers, T2 queued on the lock \
         committed {gap_ms} ms after T1; A's records in Kafka: {of_a:?}",
        t1_committed.duration_since(held_since).as_secs_f64()
    );
    bench.settle(
        "a transaction held 12 s, its follower queued on the lock",
        Judging::Exact,
        (written.events() + 2, events.len()),
        (&expected, &records, &events),
        &note,
        &[&relay],
    );
}

// ---------------------------------------------------------------------------------------------------------
// 7. A restart with held rows above the number and a release while down.

/// A poison row of aggregate H is dead-lettered and parked; H's next events are held behind it (with a
/// progress table: marked 1000-01-01, and the number passes them). A transaction open since before the
/// poison row keeps the number behind all of them. The relay is stopped, `quarantine release` runs while
/// it is down, the relay starts again, the long transaction commits and H gets one more event: H's held
/// events must come out, in order, before it. Issue 45: with a progress table they stayed held for good and
/// the new event overtook them.
/// On f915307: so they do (H2 and H3 missing, 2 held rows at the end); without a progress table the marks
/// waited for the long transaction's row lock until `innodb_lock_wait_timeout` (50 s), the run restarted
/// and republished 80-110 events (a run that was not stopped).
#[tokio::test(flavor = "multi_thread")]
async fn held_rows_released_while_down_marking() {
    held_rows_released_while_down(Mode::Marking).await;
}

/// [`held_rows_released_while_down_marking`] with a progress table.
#[tokio::test(flavor = "multi_thread")]
async fn held_rows_released_while_down_progress_table() {
    held_rows_released_while_down(Mode::ProgressTable).await;
}

async fn held_rows_released_while_down(mode: Mode) {
    let bench = Bench::start(mode);
    let db = &bench.db;
    let port = free_port();
    let mut relay = relay_config(db, &bench.broker, mode, POLL, "", Some(port));
    relay.run(&relay.config_path());
    let steady_cfg = PatternConfig {
        tasks: 2,
        aggregates: 16,
        max_transactions: usize::MAX,
        pause: Duration::from_millis(5),
        ..PatternConfig::default()
    };
    let steady = writer(db, steady_cfg.clone()).await;
    assert!(steady.wait_committed(50, CATCH_UP).await, "the steady writer stalled");

    // The long transaction: its number is below everything of H.
    let mut long = db.conn().await;
    let mut long_tx = long.start_transaction(mysql_async::TxOpts::default()).await.unwrap();
    let l1 = OutboxRow::new("L");
    insert_event(&mut long_tx, &l1).await.unwrap();
    let mut conn = db.conn().await;
    let h1 = OutboxRow::new("H").headers(Some(serde_json::json!([1, 2])));
    let (h2, h3) = (OutboxRow::new("H"), OutboxRow::new("H"));
    for row in [&h1, &h2, &h3] {
        insert_event(&mut conn, row).await.unwrap();
    }
    let dead = bench.broker.read_all(DLQ, 1, CATCH_UP);
    assert!(dead.iter().any(|r| r.header_str("id") == Some(h1.id.as_str())), "H1 not dead-lettered:\n{}", relay.logs());
    let more = steady.committed() + 50;
    assert!(steady.wait_committed(more, CATCH_UP).await, "the steady writer stalled");
    let first = steady.finish().await;
    // Everything but L and H published (marked one by one above a number L holds back), H held.
    let held = match mode {
        Mode::Marking => "aggregate_id = 'H' AND published_at IS NULL".to_owned(),
        Mode::ProgressTable => format!("aggregate_id = 'H' AND published_at = '{HELD_AT}'"),
    };
    let deadline = Instant::now() + CATCH_UP;
    loop {
        let through = published_through(db).await;
        let others = format!("aggregate_id NOT IN ('H', 'L') AND published_at IS NULL AND seq > {through}");
        if count(db, &held).await >= 3 && count(db, &others).await == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "H not held, or other rows not published:\n{}", relay.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let seq_of = |id: &str| {
        let id = id.to_owned();
        async move {
            let mut c = db.conn().await;
            let seq: Option<u64> = c.exec_first("SELECT seq FROM outbox_events WHERE id = ?", (id,)).await.unwrap();
            seq.unwrap()
        }
    };
    let through_at_stop = published_through(db).await;
    if mode == Mode::ProgressTable {
        assert!(through_at_stop < seq_of(&h2.id).await, "the number passed the held rows: {through_at_stop}");
    }
    assert!(relay.terminate().success(), "{}", relay.logs());

    let other = relay_config(db, &bench.broker, mode, POLL, "", None);
    let (status, stdout, stderr) = other
        .command(&["quarantine", "release", "order", "H", "--skip-poison"], Duration::from_secs(60))
        .expect("release runs");
    assert!(status.success(), "{stdout}\n{stderr}");
    relay.restart();
    // The restarted relay has been through its first poll (the lift of released holds among it) once it
    // polled idle.
    let idle = || common::scrape(port).and_then(|p| sample(&p, "outbox_cdc_poll_idle_polls_total")).unwrap_or(0.0);
    assert!(wait_until(CATCH_UP, || idle() >= 1.0), "the restarted relay never polled idle:\n{}", relay.logs());
    long_tx.commit().await.unwrap();
    let h4 = OutboxRow::new("H");
    insert_event(&mut conn, &h4).await.unwrap();
    let then = writer(db, PatternConfig { max_transactions: 100, ..steady_cfg }).await.join().await;

    let mut written = first;
    written.merge(then);
    let table = table_events(db).await;
    assert_table_holds(&table, &written);
    let leave_out: HashSet<String> = [h1.id.clone()].into();
    let expected = expected_of(&table, &leave_out);
    let records = read_until_seen(&bench.broker, TOPIC, &expected, CATCH_UP);
    let of_h: Vec<&str> = records
        .iter()
        .filter(|r| r.key_str() == Some("H"))
        .filter_map(|r| r.header_str("id"))
        .map(|id| match id {
            _ if id == h2.id => "H2",
            _ if id == h3.id => "H3",
            _ if id == h4.id => "H4",
            _ => "?",
        })
        .collect();
    let published_all = wait_table_published(db, Duration::from_secs(10)).await;
    let held_left = count(db, &format!("published_at = '{HELD_AT}'")).await;
    let note = format!(
        "a poison row parks H, H2 and H3 held behind it; a transaction open since before them keeps the number at \
         {through_at_stop}; relay stopped, H released, relay started, the transaction committed, H4 written: H in \
         Kafka {of_h:?}, {held_left} rows still held at the end"
    );
    // The writers' events, L, and H1 to H4.
    bench.settle(
        "restart with held rows above the number, released while down",
        Judging::Exact,
        (written.events() + 5, table.len()),
        (&expected, &records, &table),
        &note,
        &[&relay],
    );
    assert!(published_all && held_left == 0, "rows left unpublished: {held_left} held\n{}", relay.logs());
}

// ---------------------------------------------------------------------------------------------------------
// 8. TRUNCATE between two runs.

/// 100 events published, the relay stopped, `TRUNCATE TABLE outbox_events`, 50 new events (numbered from 1
/// again), the relay started: the 50 must be published, or the relay must refuse at start (exit 2) naming
/// the table and the statement that fixes it; after that statement, run as shown, the 50 are published.
/// Either way every event once, in order.
#[tokio::test(flavor = "multi_thread")]
async fn truncate_between_runs_marking() {
    truncate_between_runs(Mode::Marking).await;
}

/// [`truncate_between_runs_marking`] with a progress table. Issue 45: after 40 s none of the 50 had
/// reached Kafka, and the relay ran on in silence (their numbers are below the progress table's); on
/// f915307 the same after 90 s. Marking passes.
#[tokio::test(flavor = "multi_thread")]
async fn truncate_between_runs_progress_table() {
    truncate_between_runs(Mode::ProgressTable).await;
}

/// Inserts `n` events round-robin over `aggregates`, one transaction each.
async fn insert_round_robin(db: &MariaDb, aggregates: &[&str], n: usize) {
    let mut conn = db.conn().await;
    for i in 0..n {
        insert_event(&mut conn, &OutboxRow::new(aggregates[i % aggregates.len()])).await.unwrap();
    }
}

/// How a started relay answered what it found: it exited (refused), or published every id of `expected`.
enum Answer {
    Refused(std::process::ExitStatus),
    Published,
}

/// Waits until `relay` exits or publishes every id of `expected`; `None` after `timeout`.
fn refused_or_published(
    relay: &mut Connector,
    broker: &Broker,
    expected: &Expected,
    timeout: Duration,
) -> Option<Answer> {
    let deadline = Instant::now() + timeout;
    let wanted: HashSet<&str> = expected.per_aggregate.values().flatten().map(String::as_str).collect();
    while Instant::now() < deadline {
        if let Some(status) = relay.wait_exit(Duration::from_millis(500)) {
            return Some(Answer::Refused(status));
        }
        let records = broker.read_all(TOPIC, wanted.len(), Duration::from_secs(2));
        let seen: HashSet<&str> = records.iter().filter_map(|r| r.header_str("id")).collect();
        if wanted.iter().all(|id| seen.contains(id)) {
            return Some(Answer::Published);
        }
    }
    None
}

async fn truncate_between_runs(mode: Mode) {
    let bench = Bench::start(mode);
    let db = &bench.db;
    let mut relay = bench.relay("");
    let aggregates = ["T0", "T1", "T2", "T3", "T4"];
    insert_round_robin(db, &aggregates, 100).await;
    let mut events = table_events(db).await;
    let before = expected_of(&events, &HashSet::new());
    let records = read_until_seen(&bench.broker, TOPIC, &before, CATCH_UP);
    assert_eq!(judge(&before, &records).missing.len(), 0, "the first 100 were not published:\n{}", relay.logs());
    assert!(wait_table_published(db, CATCH_UP).await, "the first 100 not marked:\n{}", relay.logs());
    let through = published_through(db).await;
    assert!(relay.terminate().success(), "{}", relay.logs());

    db.sql("TRUNCATE TABLE shop.outbox_events");
    insert_round_robin(db, &aggregates, 50).await;
    let new_events = table_events(db).await;
    let after = expected_of(&new_events, &HashSet::new());
    events.extend(new_events);
    let expected = before.merged(&after);
    relay.restart();
    let answer = refused_or_published(&mut relay, &bench.broker, &after, CATCH_UP);
    let how = match answer {
        Some(Answer::Published) => "the relay published the 50 new events".to_owned(),
        Some(Answer::Refused(status)) => {
            let stderr = latest_stderr(&relay);
            assert_eq!(status.code(), Some(2), "the relay exited, not as a refusal:\n{}", relay.logs());
            let names_table = stderr.contains("shop.outbox_events") || stderr.contains("`shop`.`outbox_events`");
            let fix = statement_on(&stderr, PROGRESS_TABLE);
            assert!(
                names_table && fix.is_some(),
                "the refusal must name the outbox table and show the statement that fixes it (an UPDATE or \
                 DELETE of {PROGRESS_TABLE}):\n{}",
                relay.logs()
            );
            let fix = fix.unwrap();
            db.sql(&format!("USE shop; {fix}"));
            relay.restart();
            format!("the relay refused at start (exit 2) and published the 50 after the fix it showed: {fix}")
        }
        None => {
            let records = bench.broker.read_all(TOPIC, expected.len(), Duration::from_secs(2));
            let verdict = judge(&expected, &records);
            let note = format!("100 events published (progress number {through}), relay stopped, TRUNCATE TABLE, 50 new events, relay started: neither published nor refused");
            record(&bench.name("TRUNCATE between two runs"), 150, 50, &verdict, bench.started.elapsed(), &note);
            panic!(
                "after TRUNCATE the relay neither published the 50 new events nor refused within {CATCH_UP:?} (number \
                 {through}, new rows numbered 1 to 50): {}\n{}",
                verdict.summary(),
                relay.logs()
            )
        }
    };
    let records = read_until_seen(&bench.broker, TOPIC, &expected, CATCH_UP);
    let note = format!("100 events published (progress number {through}), relay stopped, TRUNCATE TABLE, 50 new events, relay started: {how}");
    bench.settle(
        "TRUNCATE between two runs",
        Judging::Exact,
        (150, 50),
        (&expected, &records, &events),
        &note,
        &[&relay],
    );
}

// ---------------------------------------------------------------------------------------------------------
// 9. A relay paused past its lease, a release during the pause.

/// Two relays (failover after 10 s). Aggregate H is held by a parked poison row while a writer adds H
/// events behind it. The active relay is SIGSTOPped, `quarantine release` of H runs during the pause, the
/// standby takes over (H no longer held) and publishes H's rows while steady writers write other
/// aggregates; then the paused relay resumes (SIGCONT), finds its lease lost and stands by. Nothing may be
/// missing, every step back must replay a contiguous run (the paused relay's producer may still send what
/// it had, CONTRACT), and at the end no row may be left unpublished or held.
#[tokio::test(flavor = "multi_thread")]
async fn paused_relay_with_a_release_during_the_pause_marking() {
    paused_relay_with_a_release(Mode::Marking).await;
}

/// [`paused_relay_with_a_release_during_the_pause_marking`] with a progress table, and the paused relay's
/// marks slow when it is stopped (the progress table's row locked for a moment): it resumes with H's rows
/// still to mark held, which its successor has since published by number. Issue 45, item 7: its marker is
/// never stopped, marks them 1000-01-01, and they stay unpublished for good: on f915307 19-21 rows are
/// left held. Marking passes.
#[tokio::test(flavor = "multi_thread")]
async fn paused_relay_with_a_release_during_the_pause_progress_table() {
    paused_relay_with_a_release(Mode::ProgressTable).await;
}

async fn paused_relay_with_a_release(mode: Mode) {
    let bench = Bench::start(mode);
    let db = &bench.db;
    // Long enough for `quarantine release` to finish while the paused relay still holds the lease.
    let failover = "[delivery]\nfailover_timeout_ms = 10000\n";
    let first = bench.relay(failover);
    assert!(wait_logged(&first, "polling the outbox table", Duration::from_secs(60)), "{}", first.logs());
    let second = bench.relay(failover);
    assert!(wait_logged(&second, "standby: waiting for the lease", Duration::from_secs(60)), "{}", second.logs());
    let held_aggregate = "H0";
    create_aggregates(&mut db.conn().await, &[held_aggregate.to_owned()]).await.unwrap();
    let mut conn = db.conn().await;
    let poison = OutboxRow::new(held_aggregate).headers(Some(serde_json::json!([1, 2])));
    insert_event(&mut conn, &poison).await.unwrap();
    let dead = bench.broker.read_all(DLQ, 1, CATCH_UP);
    assert!(
        dead.iter().any(|r| r.header_str("id") == Some(poison.id.as_str())),
        "not dead-lettered:\n{}",
        first.logs()
    );
    // Parked (with a progress table: and passed by the number).
    let deadline = Instant::now() + CATCH_UP;
    loop {
        let passed = match mode {
            Mode::Marking => String::new(),
            Mode::ProgressTable => format!(" AND seq <= {}", published_through(db).await),
        };
        if count(db, &format!("id = '{}' AND next_attempt_at > '9999-01-01'{passed}", poison.id)).await == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "the poison row was not parked:\n{}", first.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // With a progress table: a slow statement of the marks. The progress table's row is locked, so the
    // active relay's marker waits on writing its number (after three rows of W) while it is handed H's
    // rows to mark held, and is stopped with them queued.
    let mut holder = db.conn().await;
    let mut lock = holder.start_transaction(mysql_async::TxOpts::default()).await.unwrap();
    let mut w = Vec::new();
    if mode == Mode::ProgressTable {
        lock.query_drop(format!(
            "SELECT published_through FROM {PROGRESS_TABLE} WHERE outbox_table = 'shop.outbox_events' FOR UPDATE"
        ))
        .await
        .unwrap();
        for _ in 0..3 {
            let row = OutboxRow::new("W");
            insert_event(&mut conn, &row).await.unwrap();
            w.push(row.id);
        }
        // A statement of the relay's user on the progress table that has run for a second: waiting for the
        // lock (an autocommit statement waiting on a row lock is not listed in INNODB_TRX).
        let waiting = "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE USER = 'relay' AND \
                       INFO LIKE '%outbox_relay_progress%' AND TIME >= 1";
        assert!(wait_until(CATCH_UP, || db.sql(waiting).trim() != "0"), "the marker never waited:\n{}", first.logs());
    }
    let h_cfg = PatternConfig {
        tasks: 1,
        aggregates: 1,
        aggregate_prefix: "H".into(),
        max_transactions: usize::MAX,
        pause: Duration::from_millis(5),
        ..PatternConfig::default()
    };
    let h_writer = writer(db, h_cfg).await;
    assert!(h_writer.wait_committed(20, CATCH_UP).await, "H's writer stalled");

    let pid = first.pid().expect("running") as i32;
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let stopped = Instant::now();
    lock.rollback().await.unwrap();
    // H's rows written before the pause, which the paused relay saw held.
    let h_last: u64 = db
        .sql(&format!("SELECT MAX(seq) FROM shop.outbox_events WHERE aggregate_id = '{held_aggregate}'"))
        .trim()
        .parse()
        .expect("H has rows");
    let other = relay_config(db, &bench.broker, mode, POLL, "", None);
    let (status, stdout, stderr) = other
        .command(&["quarantine", "release", "order", held_aggregate, "--skip-poison"], Duration::from_secs(60))
        .expect("release runs");
    assert!(status.success(), "{stdout}\n{stderr}");
    assert!(
        !latest_stderr(&second).contains("polling the outbox table"),
        "the standby took over before the release finished ({:.1} s after the stop): raise failover_timeout_ms",
        stopped.elapsed().as_secs_f64()
    );
    let steady = writer(
        db,
        PatternConfig {
            tasks: 3,
            aggregates: 24,
            max_transactions: usize::MAX,
            pause: Duration::from_millis(5),
            ..PatternConfig::default()
        },
    )
    .await;
    assert!(
        wait_logged(&second, "polling the outbox table", Duration::from_secs(60)),
        "no takeover:\n{}",
        second.logs()
    );
    let took_over = stopped.elapsed();
    // The successor has published everything up to H's rows of before the pause; then the paused relay
    // resumes.
    let deadline = Instant::now() + CATCH_UP;
    while unpublished_up_to(db, h_last).await > 0 {
        assert!(Instant::now() < deadline, "the successor did not publish H's rows:\n{}", second.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    unsafe { libc::kill(pid, libc::SIGCONT) };
    assert!(wait_logged(&first, "lease lost", CATCH_UP), "the paused relay never noticed:\n{}", first.logs());
    let more = steady.committed() + 100;
    assert!(steady.wait_committed(more, CATCH_UP).await, "the steady writer stalled");
    let mut written = steady.finish().await;
    written.merge(h_writer.finish().await);

    let published_all = wait_table_published(db, Duration::from_secs(30)).await;
    let held_left = count(db, &format!("published_at = '{HELD_AT}'")).await;
    let events = table_events(db).await;
    assert_table_holds(&events, &written);
    let leave_out: HashSet<String> = [poison.id.clone()].into();
    let expected = expected_of(&events, &leave_out);
    let records = read_until_seen(&bench.broker, TOPIC, &expected, CATCH_UP);
    let note = format!(
        "2 relays (failover_timeout_ms 10000), H held by a parked row while a writer adds H events{}, the active \
         SIGSTOPped, H released during the pause, the standby active {:.1} s after the stop, SIGCONT once it \
         published H; {held_left} rows left held (1000-01-01) at the end",
        match mode {
            Mode::Marking => "",
            Mode::ProgressTable => " (the marker waiting on a locked progress row meanwhile)",
        },
        took_over.as_secs_f64(),
    );
    let case = "paused relay, a release during the pause";
    let relays = [&first, &second];
    let judged = (&expected, &records[..], &events[..]);
    bench.settle(case, Judging::ReplaysOnly, (written.events() + 1 + w.len(), events.len()), judged, &note, &relays);
    assert!(
        published_all && held_left == 0,
        "{}: {} rows left unpublished, {held_left} of them held (1000-01-01): the paused relay marked rows its \
         successor had published\n{}",
        bench.name(case),
        common::patterns::unpublished(db).await,
        logs(&relays)
    );
}

// ---------------------------------------------------------------------------------------------------------
// 10. kill -9 during a 100k-event catch-up.

/// The most records the CONTRACT lets one crash republish, in both modes: the rows produced and not yet
/// marked, which a run keeps at or below 32 reads' worth (`relay::run::UNMARKED_READS` × the default
/// `batch_rows` of 1,000).
const DUPLICATES_PER_CRASH: usize = 32 * 1_000;

/// 100,000 events loaded, one relay catching up, killed -9 once a third is published and started again:
/// nothing missing, every step back a replay of a contiguous run, and the duplicates within
/// [`DUPLICATES_PER_CRASH`] (measured and recorded).
/// On f915307 11,156, 32,091 and 36,820 records republished in three runs (over the bound twice), and once
/// a replay that skipped 7,000 rows (apparently the killed relay's last mark statement finishing on the
/// server after the next run had started reading).
#[tokio::test(flavor = "multi_thread")]
async fn kill_during_catch_up_marking() {
    kill_during_catch_up(Mode::Marking).await;
}

/// [`kill_during_catch_up_marking`] with a progress table. Issue 45: acknowledged rows wait up to a second
/// before the number moves, so a crash republishes about the last second of the catch-up. On f915307 1,000
/// to 1,651 records republished (the debug build catches up at about 20,000 events a second).
#[tokio::test(flavor = "multi_thread")]
async fn kill_during_catch_up_progress_table() {
    kill_during_catch_up(Mode::ProgressTable).await;
}

async fn kill_during_catch_up(mode: Mode) {
    let bench = Bench::start(mode);
    let db = &bench.db;
    let n = 100_000;
    db.sql(&format!(
        "USE shop; INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, schema_version, payload, \
         occurred_at, next_attempt_at) \
         SELECT CONCAT('catch-up-', LPAD(s.seq, 7, '0')), 'order', CONCAT('k', s.seq % 200), 'OrderCreated', 1, \
         JSON_OBJECT('n', s.seq), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) FROM seq_1_to_{n} s ORDER BY s.seq"
    ));
    let events = table_events(db).await;
    let expected = expected_of(&events, &HashSet::new());
    assert_eq!(expected.len(), n);
    let mut relay = bench.relay("");
    let started = Instant::now();
    let deadline = started + Duration::from_secs(300);
    let mut at_kill = published(db).await;
    while at_kill < n as u64 / 3 {
        assert!(
            Instant::now() < deadline && relay.is_running(),
            "the catch-up stalled at {at_kill}:\n{}",
            relay.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        at_kill = published(db).await;
    }
    relay.kill();
    let after_kill = published(db).await;
    relay.restart();
    let records = read_until_seen(&bench.broker, TOPIC, &expected, Duration::from_secs(300));
    let catch_up = started.elapsed();
    let note = format!(
        "100,000 events loaded, one relay (default batch_rows), SIGKILL once {after_kill} rows were published, \
         started again; caught up in {:.1} s (CONTRACT's window: {DUPLICATES_PER_CRASH} records)",
        catch_up.as_secs_f64(),
    );
    let case = "kill -9 during a 100k-event catch-up";
    let judged = (&expected, &records[..], &events[..]);
    let verdict = bench.settle(case, Judging::ReplaysOnly, (n, n), judged, &note, &[&relay]);
    assert!(
        verdict.duplicates <= DUPLICATES_PER_CRASH,
        "{}: {} records republished after one crash, more than the {DUPLICATES_PER_CRASH} the CONTRACT states",
        bench.name(case),
        verdict.duplicates
    );
}

// ---------------------------------------------------------------------------------------------------------
// The judge itself, on hand-made sequences.

/// Records of aggregate `A` (events `a0`, `a1`, …) on partition 0, in the order of `positions`.
fn walk(positions: &[usize]) -> Vec<Received> {
    positions.iter().enumerate().map(|(offset, p)| record_of(0, offset as i64, "A", &format!("a{p}"))).collect()
}

fn record_of(partition: i32, offset: i64, key: &str, id: &str) -> Received {
    Received {
        topic: TOPIC.to_owned(),
        partition,
        offset,
        key: Some(key.as_bytes().to_vec()),
        value: None,
        headers: vec![("id".to_owned(), id.as_bytes().to_vec())],
        timestamp: None,
    }
}

/// Aggregate `A` with events `a0` … `a<n-1>`.
fn events_of_a(n: usize) -> Expected {
    Expected::from_orders([("A", (0..n).map(|i| format!("a{i}")).collect::<Vec<_>>())])
}

#[test]
fn judge_accepts_every_event_once_in_order() {
    let v = judge(&events_of_a(5), &walk(&[0, 1, 2, 3, 4]));
    assert!(v.is_exact(), "{}", v.summary());
    assert_eq!((v.records, v.duplicates, v.step_backs), (5, 0, 0));
}

/// The republished rows: a run published again after later events, with nothing crashing.
#[test]
fn judge_rejects_a_republished_step_back_without_a_crash_and_counts_it_as_a_replay() {
    let v = judge(&events_of_a(5), &walk(&[0, 1, 2, 3, 4, 2, 3, 4]));
    assert!(!v.is_exact() && v.is_replays_only(), "{}", v.summary());
    assert_eq!((v.duplicates, v.duplicated_ids, v.step_backs), (3, 3, 1));
}

#[test]
fn judge_accepts_a_replay_after_a_crash_that_goes_on_into_new_events() {
    let v = judge(&events_of_a(8), &walk(&[0, 1, 2, 3, 4, 2, 3, 4, 5, 6, 7]));
    assert!(v.is_replays_only() && v.stale_tails.is_empty(), "{}", v.summary());
    assert_eq!((v.duplicates, v.step_backs), (3, 1));
    // The whole aggregate again from the start.
    let v = judge(&events_of_a(3), &walk(&[0, 1, 2, 0, 1, 2]));
    assert!(v.is_replays_only(), "{}", v.summary());
}

/// A paused relay's producer sending its last records after its successor's: a replayed run in the middle,
/// and, when nothing follows it, a stale tail.
#[test]
fn judge_accepts_a_late_replayed_run_and_reports_a_stale_tail() {
    let v = judge(&events_of_a(10), &walk(&[0, 1, 2, 3, 4, 5, 6, 7, 8, 5, 6, 9]));
    assert!(v.is_replays_only() && v.stale_tails.is_empty(), "{}", v.summary());
    let v = judge(&events_of_a(10), &walk(&[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 5, 6]));
    assert!(v.is_replays_only() && v.stale_tails.len() == 1, "{}", v.summary());
}

/// The late commit: an event first published after a later one of its aggregate, in both verdicts.
#[test]
fn judge_rejects_a_late_first_occurrence() {
    let v = judge(&events_of_a(4), &walk(&[0, 2, 1, 3]));
    assert!(!v.is_replays_only() && v.order_violations.len() == 1, "{}", v.summary());
    assert!(v.order_violations[0].contains("event #1 (a1)") && v.order_violations[0].contains("after event #2"));
    // Hidden inside what looks like a replay: a2's first occurrence is after a3.
    let v = judge(&events_of_a(4), &walk(&[0, 1, 3, 0, 1, 2, 3]));
    assert_eq!(v.order_violations.len(), 1, "{}", v.summary());
}

/// A replay that skips events: the consumer sees a1 again, then a3 again without a2 between.
#[test]
fn judge_rejects_a_replay_that_skips_events() {
    let v = judge(&events_of_a(5), &walk(&[0, 1, 2, 3, 4, 1, 3, 4]));
    assert!(!v.is_replays_only() && v.broken_replays.len() == 1, "{}", v.summary());
    assert!(v.broken_replays[0].contains("event #3 (a3)"), "{}", v.summary());
}

#[test]
fn judge_reports_missing_events() {
    let v = judge(&events_of_a(4), &walk(&[0, 1, 3]));
    assert_eq!((v.missing, v.order_violations.len()), (vec!["a2".to_owned()], 0));
}

#[test]
fn judge_counts_every_repeat_of_one_event() {
    let v = judge(&events_of_a(3), &walk(&[0, 1, 1, 1, 2]));
    assert!(v.is_replays_only() && !v.is_exact(), "{}", v.summary());
    assert_eq!((v.duplicates, v.duplicated_ids, v.step_backs), (2, 1, 2));
}

/// Records come in any order: the judge reads each partition in offset order, aggregates apart.
#[test]
fn judge_reads_partitions_in_offset_order() {
    let expected = Expected::from_orders([("A", vec!["a0", "a1", "a2"]), ("B", vec!["b0", "b1"])]);
    let records = vec![
        record_of(1, 1, "B", "b1"),
        record_of(0, 2, "A", "a2"),
        record_of(0, 0, "A", "a0"),
        record_of(1, 0, "B", "b0"),
        record_of(0, 1, "A", "a1"),
    ];
    let v = judge(&expected, &records);
    assert!(v.is_exact(), "{}", v.summary());
    // Offsets say b1 came first.
    let records = vec![record_of(1, 0, "B", "b1"), record_of(1, 1, "B", "b0")];
    let v = judge(&Expected::from_orders([("B", vec!["b0", "b1"])]), &records);
    assert_eq!(v.order_violations.len(), 1, "{}", v.summary());
}

#[test]
fn judge_rejects_split_aggregates_unknown_ids_and_records_without_an_id() {
    let expected = Expected::from_orders([("A", vec!["a0", "a1"])]);
    let mut no_id = record_of(0, 2, "A", "x");
    no_id.headers.clear();
    let records = vec![record_of(0, 0, "A", "a0"), record_of(1, 0, "A", "a1"), record_of(0, 1, "A", "zz"), no_id];
    let v = judge(&expected, &records);
    assert!(!v.is_replays_only(), "{}", v.summary());
    assert_eq!((v.split_aggregates.len(), v.unexpected.len()), (1, 2), "{}", v.summary());
}

/// The aggregate a failure message traces: the first with an order violation, before one that only has
/// duplicates; the trace starts a few records before the first record out of step.
#[test]
fn judge_points_at_the_first_order_violation_and_traces_it() {
    let expected = Expected::from_orders([("A", vec!["a0", "a1"]), ("B", vec!["b0", "b1", "b2"])]);
    let records = vec![
        record_of(0, 0, "A", "a0"),
        record_of(0, 1, "A", "a0"),
        record_of(0, 2, "A", "a1"),
        record_of(1, 0, "B", "b0"),
        record_of(1, 1, "B", "b2"),
        record_of(1, 2, "B", "b1"),
    ];
    let v = judge(&expected, &records);
    assert_eq!(v.first_bad.as_deref(), Some("B"), "{}", v.summary());
    let events: Vec<TableEvent> = ["a0", "b0", "a1", "b1", "b2"]
        .iter()
        .enumerate()
        .map(|(i, id)| TableEvent { seq: i as u64 + 1, aggregate_id: id[..1].to_uppercase(), id: id.to_string() })
        .collect();
    assert_eq!(
        trace("B", &expected, &records, &events),
        "aggregate B's records from #0 of 3: #0 seq 2 @1:0, #2 seq 5 @1:1, #1 seq 4 @1:2"
    );
}

/// The fix a refusal shows is found as shown, without the prose around it.
#[test]
fn the_fix_a_refusal_shows_is_found() {
    let text = "ERROR outbox_cdc: shop.outbox_events: sequence numbers restarted below the number (run `UPDATE \
                `shop`.`outbox_relay_progress` SET published_through = 0 WHERE outbox_table = 'shop.outbox_events'`).\n";
    assert_eq!(
        statement_on(text, PROGRESS_TABLE).as_deref(),
        Some(
            "UPDATE `shop`.`outbox_relay_progress` SET published_through = 0 WHERE outbox_table = 'shop.outbox_events'"
        )
    );
    let text = "then DELETE FROM shop.outbox_relay_progress WHERE outbox_table = 'shop.outbox_events'; and restart";
    assert_eq!(
        statement_on(text, PROGRESS_TABLE).as_deref(),
        Some("DELETE FROM shop.outbox_relay_progress WHERE outbox_table = 'shop.outbox_events'")
    );
    assert_eq!(statement_on("UPDATE shop.outbox_events SET x = 1;", PROGRESS_TABLE), None);
}

// ---------------------------------------------------------------------------------------------------------
// 11. A detached XA transaction.

/// An XA transaction inserts aggregate X's event, is prepared, and its client goes away: MariaDB keeps it,
/// detached (`INNODB_TRX` lists it with thread 0), while steady writers commit above its number and the
/// relay publishes them. 12 s later another connection commits it, then X gets its next event. X's events
/// must come out once, in order, and nothing may be missing. Issue 45, finding 5: the proof knew a
/// transaction by its thread and start time, which the detach changes, so it passed the prepared row's
/// number as free (with a progress table the row then counted as published when it committed).
/// On 0d6e591 (the old proof) X's prepared event came out after X's next event, in both modes.
#[tokio::test(flavor = "multi_thread")]
async fn a_detached_xa_transaction_marking() {
    detached_xa(Mode::Marking).await;
}

/// [`a_detached_xa_transaction_marking`] with a progress table.
#[tokio::test(flavor = "multi_thread")]
async fn a_detached_xa_transaction_progress_table() {
    detached_xa(Mode::ProgressTable).await;
}

async fn detached_xa(mode: Mode) {
    let bench = Bench::start(mode);
    let db = &bench.db;
    let relay = bench.relay("");
    let steady = writer(
        db,
        PatternConfig {
            tasks: 3,
            aggregates: 24,
            max_transactions: usize::MAX,
            pause: Duration::from_millis(10),
            ..PatternConfig::default()
        },
    )
    .await;
    assert!(steady.wait_committed(50, CATCH_UP).await, "the steady writer stalled");
    let aggregate = "xa-X".to_owned();
    create_aggregates(&mut db.conn().await, std::slice::from_ref(&aggregate)).await.unwrap();

    let mut xa = db.conn().await;
    xa.query_drop("XA START 'outbox-cdc-test'").await.unwrap();
    lock_aggregate(&mut xa, &aggregate).await.unwrap();
    let x1 = OutboxRow::new(aggregate.as_str());
    insert_event(&mut xa, &x1).await.unwrap();
    let x1_seq: u64 = xa.exec_first("SELECT seq FROM outbox_events WHERE id = ?", (&x1.id,)).await.unwrap().unwrap();
    xa.query_drop("XA END 'outbox-cdc-test'").await.unwrap();
    xa.query_drop("XA PREPARE 'outbox-cdc-test'").await.unwrap();
    let prepared = Instant::now();
    xa.disconnect().await.unwrap();
    let detached = "SELECT COUNT(*) FROM information_schema.INNODB_TRX WHERE trx_mysql_thread_id = 0";
    assert!(wait_until(CATCH_UP, || db.sql(detached).trim() == "1"), "the XA transaction is not listed detached");

    // The relay has published rows above the prepared row's number: its reads passed that number.
    let above: String = loop {
        let mut c = db.conn().await;
        let id: Option<String> =
            c.exec_first("SELECT id FROM outbox_events WHERE seq > ? ORDER BY seq LIMIT 1", (x1_seq,)).await.unwrap();
        if let Some(id) = id {
            break id;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let broker = &bench.broker;
    assert!(
        wait_until(CATCH_UP, || broker
            .read_all(TOPIC, 1, Duration::from_secs(1))
            .iter()
            .any(|r| r.header_str("id") == Some(&above))),
        "nothing above the prepared row's number was published:\n{}",
        relay.logs()
    );
    tokio::time::sleep(HELD_FOR.saturating_sub(prepared.elapsed())).await;
    db.sql("XA COMMIT 'outbox-cdc-test';");
    let held_for = prepared.elapsed();
    let x2 = OutboxRow::new(aggregate.as_str());
    insert_event(&mut db.conn().await, &x2).await.unwrap();
    let more = steady.committed() + 100;
    assert!(steady.wait_committed(more, CATCH_UP).await, "the steady writer stalled");
    let written = steady.finish().await;

    let events = table_events(db).await;
    assert_table_holds(&events, &written);
    let expected = expected_of(&events, &HashSet::new());
    let records = read_until_seen(broker, TOPIC, &expected, CATCH_UP);
    let note = format!(
        "an XA transaction prepared and detached {:.1} s (listed with thread 0) beside 3 steady writers, then \
         committed from another connection, its aggregate's next event after it",
        held_for.as_secs_f64()
    );
    bench.settle(
        "a detached XA transaction",
        Judging::Exact,
        (written.events() + 2, events.len()),
        (&expected, &records, &events),
        &note,
        &[&relay],
    );
}

// ---------------------------------------------------------------------------------------------------------
// 12. A client that keeps INNODB_TRX from refreshing.

/// A client reads `information_schema.INNODB_TRX` every 30 ms (a monitoring agent polling fast), which
/// keeps the server's copy from refreshing: it is refreshed only when nobody read it for 100 ms. Once the
/// copy is frozen, a transaction T inserts aggregate S's event and stays open while steady writers commit
/// above its number. The relay must not take T's number as free from the stale copy: it says the listing
/// is stale, and once the client stops and T commits, S's event comes out before S's next one, nothing
/// missing. Before the listing had to show its own transaction, the frozen copy (from before T began)
/// listed no T and proved its number free (with a progress table, T's event then counted as published).
/// On 0d6e591 the relay took the frozen copy as fresh and never said otherwise, in both modes (and its
/// reads failed with max_prepared_stmt_count after about 40 s, restarting the run).
#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_keeps_innodb_trx_stale_marking() {
    stale_innodb_trx(Mode::Marking).await;
}

/// [`a_client_that_keeps_innodb_trx_stale_marking`] with a progress table.
#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_keeps_innodb_trx_stale_progress_table() {
    stale_innodb_trx(Mode::ProgressTable).await;
}

async fn stale_innodb_trx(mode: Mode) {
    let bench = Bench::start(mode);
    let db = &bench.db;
    let relay = bench.relay("");
    let steady = writer(
        db,
        PatternConfig {
            tasks: 3,
            aggregates: 24,
            max_transactions: usize::MAX,
            pause: Duration::from_millis(10),
            ..PatternConfig::default()
        },
    )
    .await;
    assert!(steady.wait_committed(50, CATCH_UP).await, "the steady writer stalled");
    let aggregate = "stale-S".to_owned();
    create_aggregates(&mut db.conn().await, std::slice::from_ref(&aggregate)).await.unwrap();

    // The fast reader: its copy of INNODB_TRX freezes as long as it reads.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (mut conn, stop) = (db.conn().await, stop.clone());
        tokio::spawn(async move {
            let mut reads = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _: Option<u64> =
                    conn.query_first("SELECT COUNT(*) FROM information_schema.INNODB_TRX").await.unwrap();
                reads += 1;
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
            reads
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;

    let mut c1 = db.conn().await;
    let mut t = c1.start_transaction(mysql_async::TxOpts::default()).await.unwrap();
    lock_aggregate(&mut t, &aggregate).await.unwrap();
    let s1 = OutboxRow::new(aggregate.as_str());
    insert_event(&mut t, &s1).await.unwrap();
    let opened = Instant::now();
    let said = wait_logged(&relay, "INNODB_TRX is not refreshed", CATCH_UP);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let reads = reader.await.unwrap();
    assert!(said, "the relay never said its listings were stale ({reads} fast reads):\n{}", relay.logs());
    t.commit().await.unwrap();
    let held_for = opened.elapsed();
    let s2 = OutboxRow::new(aggregate.as_str());
    insert_event(&mut db.conn().await, &s2).await.unwrap();
    let more = steady.committed() + 100;
    assert!(steady.wait_committed(more, CATCH_UP).await, "the steady writer stalled");
    let written = steady.finish().await;

    let events = table_events(db).await;
    assert_table_holds(&events, &written);
    let expected = expected_of(&events, &HashSet::new());
    let records = read_until_seen(&bench.broker, TOPIC, &expected, CATCH_UP);
    let note = format!(
        "a client read INNODB_TRX every 30 ms ({reads} reads) while T held S's event open {:.1} s beside 3 steady \
         writers; the relay said its listings were stale; S's next event after T's commit",
        held_for.as_secs_f64()
    );
    bench.settle(
        "a client that keeps INNODB_TRX stale",
        Judging::Exact,
        (written.events() + 2, events.len()),
        (&expected, &records, &events),
        &note,
        &[&relay],
    );
}
