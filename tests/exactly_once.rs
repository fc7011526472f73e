//! `[delivery] guarantee = "exactly_once"` with `[state] backend = "kafka"` against a broker with real
//! Kafka transactions (noida-db's Kafka service: `tests/common/broker.rs`; it is not durable across its
//! own restart, so here only the connector crashes).
//!
//! Every test ends with `outbox-cdc audit`, which reads `read_committed`: nothing missing, no duplicate,
//! no order violation, whatever crashed in between.

mod common;

use std::time::{Duration, Instant};

use common::reliability::{self, hold_running, steady_workload, wait_commits, Duplicates, Recovery, PROGRESS_TIMEOUT};
use common::{Broker, Connector, Engine, MariaDb, Writer};
use mysql_async::prelude::Queryable;
use rand::Rng;

/// The settings every test here runs with: transactions committing every 200 ms.
const EXACTLY_ONCE: &str = "[delivery]\nguarantee = \"exactly_once\"\n\
                            [state]\nbackend = \"kafka\"\ncheckpoint_interval_ms = 200\n";

/// Lines of the connector's log shown in assertion messages.
const LOG_LINES: usize = 80;

/// The audit passes (nothing missing, in order) and sees every event exactly once.
fn assert_exactly_once(name: &str, connector: &Connector, written: &common::Written) -> common::AuditRun {
    reliability::closing_audit_exactly_once(name, connector, written)
}

/// kill -9 at random moments under load: five times here, twenty with `OUTBOX_CDC_SCENARIO_FULL=1`.
/// Guards against: a checkpoint committed apart from its events (a crash between them loses or repeats
/// them), a run that resumes from a checkpoint it read before fencing the previous producer, and a
/// restart that republishes what an earlier run committed.
#[tokio::test(flavor = "multi_thread")]
async fn kill_9_under_load_loses_and_repeats_nothing() {
    let cycles = reliability::scaled(5, 20);
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Noida);
    let mut connector = Connector::start(&db, &broker, EXACTLY_ONCE);
    let writer = Writer::start(db.opts_root(), steady_workload());
    wait_commits(&writer, 200, "before the first kill").await;
    let pauses_ms: Vec<u64> = {
        let mut rng = rand::rng();
        (0..cycles).map(|_| rng.random_range(300..=2500)).collect()
    };
    eprintln!("[exactly-once kill9] pauses before each kill (ms): {pauses_ms:?}");
    for (cycle, pause) in pauses_ms.iter().enumerate() {
        hold_running(&mut connector, Duration::from_millis(*pause), &format!("before kill #{}", cycle + 1), 80).await;
        connector.kill();
        connector.restart();
    }
    let recovery = Recovery::starts(&db).wait(&connector);
    wait_commits(&writer, 200, "after the last restart").await;
    let written = writer.finish().await;
    assert!(written.errors.is_empty(), "the workload saw errors: {:?}", written.errors);
    let run = assert_exactly_once("exactly-once kill9", &connector, &written);
    let aborted = connector.stderr().matches("aborting the Kafka transaction").count();
    reliability::record(
        "exactly_once: kill -9 at random moments",
        &written,
        &run,
        Some(recovery),
        &format!("{cycles} kills under load; read_committed audit; {aborted} aborts logged"),
    );
    assert!(connector.terminate().success(), "{}", connector.log_tail(LOG_LINES));
}

/// A crash at each point of the commit: before the Kafka commit (the transaction is open: the next
/// producer's start aborts it), right after it (nothing local is left to do: the commit is the
/// checkpoint), mid state write, and mid snapshot. Each is a separate process abort under load.
#[tokio::test(flavor = "multi_thread")]
async fn a_crash_at_every_commit_point_loses_and_repeats_nothing() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Noida);
    // Rows before the first start: the snapshot runs in transactions too.
    let mut conn = db.conn().await;
    let mut seeded = common::Expected::default();
    for i in 0..1500 {
        let row = common::OutboxRow::new(format!("seed-{}", i % 10)).id(format!("seed-{i:05}"));
        common::insert_event(&mut conn, &row).await.expect("seed");
        seeded.per_aggregate.entry(format!("seed-{}", i % 10)).or_default().push(row.id.clone());
    }
    drop(conn);
    let writer = Writer::start(db.opts_root(), steady_workload());
    let mut connector = Connector::new();
    let config = connector.write_config(&db, &broker, &format!("{EXACTLY_ONCE}[snapshot]\nchunk_rows = 200\n"));
    for (i, point) in
        ["snapshot_row:700", "before_kafka_commit:5", "after_kafka_commit:5", "before_produce:300"].iter().enumerate()
    {
        connector.remove_env(FAILPOINT);
        connector.env(FAILPOINT, point);
        if i == 0 {
            connector.run(&config);
        } else {
            connector.restart();
        }
        let fired = connector.wait_exit(PROGRESS_TIMEOUT);
        assert!(
            fired.is_some_and(|s| std::os::unix::process::ExitStatusExt::signal(&s) == Some(6)),
            "failpoint {point} did not abort the process ({fired:?}):\n{}",
            connector.log_tail(LOG_LINES)
        );
        eprintln!("[exactly-once failpoints] {point} fired");
    }
    connector.remove_env(FAILPOINT);
    connector.restart();
    let recovery = Recovery::starts(&db).wait(&connector);
    wait_commits(&writer, 200, "after the last restart").await;
    let mut written = writer.finish().await;
    written.expected.per_aggregate.extend(seeded.per_aggregate);
    let run = assert_exactly_once("exactly-once failpoints", &connector, &written);
    reliability::record(
        "exactly_once: crash at each commit point",
        &written,
        &run,
        Some(recovery),
        "aborts mid snapshot, before and right after a Kafka commit, and at a read-not-produced row; 1500 rows \
         snapshotted first",
    );
    assert!(connector.terminate().success(), "{}", connector.log_tail(LOG_LINES));
}

/// A source transaction longer than a Kafka transaction may stay open (200,000 outbox rows over 25 aggregates
/// in one `INSERT … SELECT`) commits inside itself once its Kafka transaction has been open for half of
/// `transaction.timeout.ms`, and kill -9 in it loses and repeats nothing: three times the process is killed
/// 300 ms after it committed inside the transaction, and each next one resumes after the rows its
/// predecessors committed, further every time. Before, a commit waited for the source transaction's end:
/// nothing of it ever committed while the run lived, each run began it again at its first row, and on a
/// broker that enforces `transaction.timeout.ms` the broker aborted it at every try. noida-db: the only broker
/// here with real Kafka transactions; it does not enforce `transaction.timeout.ms` (measured: a commit 8 s into
/// a transaction with a 3 s timeout succeeds), so the test asks for the commits inside instead of the
/// broker's aborts. `transaction.timeout.ms` is 2 s: the transaction takes longer than its 1 s half to produce
/// here (about 50,000 rows/s) and on a machine several times faster.
#[tokio::test(flavor = "multi_thread")]
async fn a_source_transaction_longer_than_a_kafka_transaction_commits_inside_it() {
    const ROWS: usize = 200_000;
    const AGGREGATES: usize = 25;
    const KILLS: usize = 3;
    const SPLIT: &str = "committing it in parts from now on";
    const RESUMED: &str = "resuming inside a source transaction";
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Noida);
    let settings = format!("{EXACTLY_ONCE}[kafka.properties]\n\"transaction.timeout.ms\" = \"2000\"\n");
    let mut connector = Connector::start(&db, &broker, &settings);
    let mut conn = db.conn().await;
    common::insert_event(&mut conn, &common::OutboxRow::new("before").id("before-1")).await.expect("before");
    let read = broker.read_committed("outbox.event.order", 1, PROGRESS_TIMEOUT);
    assert_eq!(read.len(), 1, "the connector streams before the long transaction:\n{}", connector.log_tail(LOG_LINES));
    conn.query_drop(format!(
        "INSERT INTO shop.outbox_events (id, aggregate_type, aggregate_id, event_type, schema_version, payload, \
         occurred_at, next_attempt_at) \
         SELECT CONCAT('long-', LPAD(seq, 7, '0')), 'order', CONCAT('long-', seq % {AGGREGATES}), 'BulkImported', 1, \
                JSON_OBJECT('n', seq), TIMESTAMP('2026-01-01 00:00:00') + INTERVAL seq MICROSECOND, NOW(6) \
         FROM seq_1_to_{ROWS}"
    ))
    .await
    .expect("the long transaction");
    common::insert_event(&mut conn, &common::OutboxRow::new("after").id("after-1")).await.expect("after");
    let last: String = conn.query_first("SELECT @@last_gtid").await.expect("@@last_gtid").expect("a GTID");
    drop(conn);
    // The debug line of each commit (the harness runs the connector with outbox_cdc=debug); `status` would
    // wait for the transaction a killed process left open.
    let through = format!("checkpoint committed with its events position=gtid {last} (");
    let mut kills = 0;
    while kills < KILLS {
        // This run committed inside the transaction: after the first says it splits it, or a later one that
        // it resumed inside it, a commit says how far in it is.
        let (wanted, count) = if kills == 0 { (SPLIT, 1) } else { (RESUMED, kills) };
        let committed_inside = |log: &str| {
            log.matches(wanted).count() >= count
                && log.rsplit(wanted).next().is_some_and(|since| {
                    since.lines().any(|l| l.contains("checkpoint committed with its events") && l.contains("inside="))
                })
        };
        let deadline = Instant::now() + PROGRESS_TIMEOUT;
        while !committed_inside(&connector.stderr()) && !connector.stderr().contains(&through) {
            assert!(
                Instant::now() < deadline,
                "no commit inside the {ROWS}-row transaction (after \"{wanted}\" {count} times) within \
                 {PROGRESS_TIMEOUT:?}:\n{}",
                connector.log_tail(LOG_LINES)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if connector.stderr().contains(&through) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        connector.kill();
        kills += 1;
        connector.restart();
    }
    let deadline = Instant::now() + PROGRESS_TIMEOUT;
    while !connector.stderr().contains(&through) {
        assert!(Instant::now() < deadline, "no checkpoint at {last} in time:\n{}", connector.log_tail(LOG_LINES));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // `… published=the first N outbox rows of gtid …`, once a start: N grows at every one.
    let log = connector.stderr();
    let resumed: Vec<u64> = log
        .lines()
        .filter(|l| l.contains(RESUMED))
        .filter_map(|l| l.split("published=the first ").nth(1)?.split(' ').next()?.parse().ok())
        .collect();
    assert!(!resumed.is_empty(), "a kill landed inside the transaction:\n{}", connector.log_tail(LOG_LINES));
    assert_eq!(
        resumed.len(),
        kills,
        "every restart resumed inside the transaction:\n{}",
        connector.log_tail(LOG_LINES)
    );
    assert!(resumed.windows(2).all(|w| w[0] < w[1]), "each run committed more of it: {resumed:?}");
    eprintln!("[exactly-once long transaction] {kills} kills; the runs resumed after {resumed:?} rows");
    let mut expected = common::Expected::default();
    expected.per_aggregate.insert("before".into(), vec!["before-1".into()]);
    expected.per_aggregate.insert("after".into(), vec!["after-1".into()]);
    for seq in 1..=ROWS {
        expected.per_aggregate.entry(format!("long-{}", seq % AGGREGATES)).or_default().push(format!("long-{seq:07}"));
    }
    let written = reliability::written_from(expected);
    let run = assert_exactly_once("long transaction", &connector, &written);
    reliability::record(
        "exactly_once: a 200,000-row source transaction, killed -9 inside it",
        &written,
        &run,
        None,
        &format!(
            "transaction.timeout.ms 2 s, checkpoint_interval_ms 200; {kills} kills, resumed after {resumed:?} rows"
        ),
    );
    assert!(connector.terminate().success(), "{}", connector.log_tail(LOG_LINES));
}

/// The state lives in Kafka: a connector started in a fresh directory (a pod without a volume, moved to
/// another node) resumes where the last one committed, and `status` reads the checkpoint from the topic.
#[tokio::test(flavor = "multi_thread")]
async fn a_fresh_process_without_local_state_resumes_exactly() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Noida);
    let mut conn = db.conn().await;
    let mut expected = common::Expected::default();
    let insert = async |from: usize, to: usize, conn: &mut mysql_async::Conn| {
        let mut ids = Vec::new();
        for i in from..to {
            let row = common::OutboxRow::new(format!("agg-{}", i % 7)).id(format!("ev-{i:05}"));
            common::insert_event(conn, &row).await.expect("insert");
            ids.push((format!("agg-{}", i % 7), row.id.clone()));
        }
        ids
    };
    for (agg, id) in insert(0, 300, &mut conn).await {
        expected.per_aggregate.entry(agg).or_default().push(id);
    }
    let mut first = Connector::start(&db, &broker, EXACTLY_ONCE);
    let read = broker.read_committed("outbox.event.order", 300, PROGRESS_TIMEOUT);
    assert_eq!(read.len(), 300, "{}", first.log_tail(LOG_LINES));
    assert!(first.terminate().success(), "{}", first.log_tail(LOG_LINES));
    assert!(!first.state_dir().join("outbox-cdc.redb").exists(), "the Kafka backend writes nothing locally");

    for (agg, id) in insert(300, 500, &mut conn).await {
        expected.per_aggregate.entry(agg).or_default().push(id);
    }
    // Another directory, the same config: only Kafka knows where the first one stopped.
    let mut second = Connector::start(&db, &broker, EXACTLY_ONCE);
    let status = second.status_json().expect("status reads the checkpoint from the state topic");
    assert!(status["position"]["gtids"].is_string(), "{status:#}");
    let written = reliability::written_from(expected);
    assert_exactly_once("fresh process", &second, &written);
    assert!(!second.stderr().contains("snapshot: consistent read view opened"), "no new snapshot");
    assert!(second.terminate().success(), "{}", second.log_tail(LOG_LINES));
}

/// A switchover behind the name the connectors use, with the old primary still up: the active instance's
/// binlog connection is ended on the old primary, and its next run finds that `source.host` now leads to the
/// promoted replica while its lease is on the old primary. It releases the lease before fencing anything;
/// the lease moves with the instances to the new primary, where one of them resumes the checkpoint
/// (`--accept-new-server`, as the RUNBOOK's planned failover says) and publishes what is written there.
/// Before, the instance kept the lease on the old primary, fenced, and retried for ever ("the lease is held
/// on server_id 11 but the binlog connection reached server_id 22"), and the standby waited on the old
/// primary: nothing written after the switchover was published. A real replica (GTID replication) is the
/// new primary, a loopback proxy the name; noida-db, as `exactly_once` needs a broker with transactions.
#[tokio::test(flavor = "multi_thread")]
async fn a_switchover_with_the_old_primary_up_moves_the_lease_and_publishes() {
    const BEFORE: usize = 20;
    const AFTER: usize = 20;
    let primary = MariaDb::builder().server_id(11).start();
    let replica = MariaDb::builder().server_id(22).start();
    primary.sql(
        "CREATE USER 'repl'@'127.0.0.1' IDENTIFIED BY 'repl'; GRANT REPLICATION SLAVE ON *.* TO 'repl'@'127.0.0.1'",
    );
    // The replica's binlog holds the primary's transactions from here on, as a replica set up from a backup.
    replica.sql(&format!(
        "RESET MASTER; SET GLOBAL gtid_slave_pos = '{}'; CHANGE MASTER TO MASTER_HOST = '127.0.0.1', \
         MASTER_PORT = {}, MASTER_USER = 'repl', MASTER_PASSWORD = 'repl', MASTER_USE_GTID = slave_pos; START SLAVE",
        primary.gtid_binlog_pos(),
        primary.port()
    ));
    let proxy = common::Proxy::start(primary.port());
    let broker = Broker::start(Engine::Noida);
    let mut instances = [Connector::new(), Connector::new()];
    for connector in &mut instances {
        let config = connector.write_config(&primary, &broker, &standby_settings());
        let text = std::fs::read_to_string(&config).expect("config");
        let text = text.replacen(&format!("port = {}", primary.port()), &format!("port = {}", proxy.port()), 1);
        std::fs::write(&config, text).expect("config");
        connector.spawn(["run".into(), "--config".into(), config.into_os_string(), "--accept-new-server".into()]);
        if !is_active(connector) {
            wait_standby_or_active(connector).await;
        }
    }
    let mut expected = common::Expected::default();
    let mut conn = primary.conn().await;
    for i in 0..BEFORE {
        let row = common::OutboxRow::new("switch").id(format!("sw-{i:03}"));
        common::insert_event(&mut conn, &row).await.expect("insert on the primary");
        expected.per_aggregate.entry("switch".into()).or_default().push(row.id.clone());
    }
    drop(conn);
    let read = broker.read_committed("outbox.event.order", BEFORE, PROGRESS_TIMEOUT);
    assert_eq!(read.len(), BEFORE, "published before the switchover:\n{}", instances[0].log_tail(LOG_LINES));

    // The switchover: the replica has everything, is promoted, and the name leads to it. The old primary
    // stays up with every session but the binlog dump, which it ends (as `KILL` or a timeout would).
    let caught_up = Instant::now() + PROGRESS_TIMEOUT;
    while replica.sql("SELECT @@gtid_slave_pos").trim() != primary.gtid_binlog_pos() {
        assert!(Instant::now() < caught_up, "the replica did not catch up: {}", replica.sql("SHOW SLAVE STATUS\\G"));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    replica.sql("STOP SLAVE; RESET SLAVE ALL");
    proxy.retarget(replica.port());
    let dumps =
        primary.sql("SELECT GROUP_CONCAT(ID) FROM information_schema.PROCESSLIST WHERE COMMAND = 'Binlog Dump'");
    let dumps = dumps.trim();
    assert!(!dumps.is_empty() && dumps != "NULL", "the active instance streams from the primary");
    for id in dumps.split(',') {
        primary.sql(&format!("KILL {id}"));
    }
    let mut conn = replica.conn().await;
    for i in BEFORE..BEFORE + AFTER {
        let row = common::OutboxRow::new("switch").id(format!("sw-{i:03}"));
        common::insert_event(&mut conn, &row).await.expect("insert on the new primary");
        expected.per_aggregate.entry("switch".into()).or_default().push(row.id.clone());
    }
    drop(conn);
    let read = broker.read_committed("outbox.event.order", BEFORE + AFTER, PROGRESS_TIMEOUT);
    let logs = || format!("{}\n---\n{}", instances[0].log_tail(LOG_LINES), instances[1].log_tail(LOG_LINES));
    assert_eq!(read.len(), BEFORE + AFTER, "published after the switchover:\n{}", logs());
    let released = instances.iter().any(|c| c.stderr().contains("source.host now leads to server_id 22"));
    assert!(released, "an instance released the lease it held on the old primary:\n{}", logs());
    let both = logs();
    let active = instances.iter_mut().position(is_active).unwrap_or_else(|| panic!("no active instance:\n{both}"));
    let written = reliability::written_from(expected);
    let run = assert_exactly_once("switchover", &instances[active], &written);
    reliability::record(
        "exactly_once: switchover with the old primary up",
        &written,
        &run,
        None,
        "GTID replica promoted behind a proxy, the old primary's binlog dump ended, two instances; the lease \
         moves to the new primary before anything is fenced",
    );
    for connector in &mut instances {
        assert!(connector.terminate().success(), "{}", connector.log_tail(LOG_LINES));
    }
}

/// Waits until `connector`'s current process holds the lease or waits for it.
async fn wait_standby_or_active(connector: &mut Connector) {
    let deadline = Instant::now() + PROGRESS_TIMEOUT;
    while !is_active(connector) && !current_log(connector).contains("standby: waiting for the lease") {
        assert!(connector.is_running(), "the connector exited:\n{}", connector.log_tail(LOG_LINES));
        assert!(Instant::now() < deadline, "neither active nor standby:\n{}", connector.log_tail(LOG_LINES));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// With `exactly_once` and a 3 s failover timeout: the settings of the active/standby tests.
fn standby_settings() -> String {
    EXACTLY_ONCE.replace("[delivery]\n", "[delivery]\nfailover_timeout_ms = 3000\n")
}

/// The logs of the connector's current process (after the harness's last start marker).
fn current_log(connector: &Connector) -> String {
    let logs = connector.stderr();
    let start = logs.rfind("=== harness: start #").unwrap_or(0);
    logs[start..].to_string()
}

/// Whether `connector`'s current process holds the lease and publishes (it logged the acquisition).
fn is_active(connector: &mut Connector) -> bool {
    connector.is_running() && current_log(connector).contains("lease acquired")
}

/// Waits until `connector`'s current process says that it waits for the lease, failing the test (with `what`
/// and its log) when it exits first. A standby's start takes as long as the machine makes it: never a fixed
/// time.
async fn wait_standby(connector: &mut Connector, what: &str) {
    let deadline = Instant::now() + PROGRESS_TIMEOUT;
    while !current_log(connector).contains("standby: waiting for the lease") {
        assert!(connector.is_running(), "{what}: the connector exited:\n{}", connector.log_tail(LOG_LINES));
        assert!(
            Instant::now() < deadline,
            "{what}: the connector does not wait for the lease:\n{}",
            connector.log_tail(LOG_LINES)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Active/standby: two instances with the same config; the active one is killed -9 under load, again and
/// again (3 times here, 10 with `OUTBOX_CDC_SCENARIO_FULL=1`), and the standby takes over each time,
/// within the failover timeout. Every event reaches `read_committed` consumers once. The failover times
/// (kill to the new active's first committed checkpoint) go to docs/RELIABILITY.md.
#[tokio::test(flavor = "multi_thread")]
async fn the_standby_takes_over_after_kill_9_with_nothing_lost_or_repeated() {
    let rounds = reliability::scaled(3, 10);
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Noida);
    let settings = standby_settings();
    let mut instances = [Connector::start(&db, &broker, &settings), Connector::new()];
    let writer = Writer::start(db.opts_root(), steady_workload());
    assert!(
        common::wait_until(PROGRESS_TIMEOUT, || is_active(&mut instances[0])),
        "the first instance never became active:\n{}",
        instances[0].log_tail(LOG_LINES)
    );
    let config = instances[1].write_config(&db, &broker, &settings);
    instances[1].run(&config);
    let mut failovers = Vec::new();
    for round in 0..rounds {
        let (active, standby) = (round % 2, (round + 1) % 2);
        wait_standby(&mut instances[standby], &format!("round {round}, the other instance")).await;
        assert!(!current_log(&instances[standby]).contains("streaming position"), "a standby published");
        wait_commits(&writer, 100, "before the kill").await;
        let before = instances[standby].stderr().matches("checkpoint committed with its events").count();
        let killed = Instant::now();
        instances[active].kill();
        assert!(
            common::wait_until(PROGRESS_TIMEOUT, || instances[standby]
                .stderr()
                .matches("checkpoint committed with its events")
                .count()
                > before),
            "round {round}: the standby did not take over:\n{}",
            instances[standby].log_tail(LOG_LINES)
        );
        failovers.push(killed.elapsed());
        instances[active].restart();
    }
    let written = {
        wait_commits(&writer, 200, "after the last failover").await;
        writer.finish().await
    };
    let last_active = rounds % 2;
    let run = assert_exactly_once("failover", &instances[last_active], &written);
    let mut ms: Vec<u128> = failovers.iter().map(Duration::as_millis).collect();
    ms.sort_unstable();
    let (median, max) = (ms[ms.len() / 2], ms[ms.len() - 1]);
    eprintln!("[failover] kill -9 to the standby's first commit (ms): {ms:?}; median {median}, max {max}");
    reliability::record(
        "exactly_once: active killed -9, standby takes over",
        &written,
        &run,
        None,
        &format!(
            "{rounds} failovers with failover_timeout_ms = 3000; kill to the new active's first committed \
             checkpoint: median {median} ms, max {max} ms ({ms:?})"
        ),
    );
    for instance in &mut instances {
        assert!(instance.terminate().success(), "{}", instance.log_tail(LOG_LINES));
    }
}

/// Two instances started at the same moment, again and again (3 times here, 10 with
/// `OUTBOX_CDC_SCENARIO_FULL=1`): one publishes, the other waits; never both.
#[tokio::test(flavor = "multi_thread")]
async fn two_instances_started_together_never_publish_together() {
    let rounds = reliability::scaled(3, 10);
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Noida);
    let settings = standby_settings();
    let writer = Writer::start(db.opts_root(), steady_workload());
    let mut instances = [Connector::new(), Connector::new()];
    let configs: Vec<_> = instances.iter().map(|i| i.write_config(&db, &broker, &settings)).collect();
    for round in 0..rounds {
        for (instance, config) in instances.iter_mut().zip(&configs) {
            instance.run(config);
        }
        assert!(
            common::wait_until(PROGRESS_TIMEOUT, || instances.iter_mut().any(is_active)),
            "round {round}: neither became active:\n{}\n{}",
            instances[0].log_tail(LOG_LINES),
            instances[1].log_tail(LOG_LINES)
        );
        hold_running(&mut instances[0], Duration::from_secs(3), "both running", 80).await;
        let active: Vec<bool> = instances.iter_mut().map(is_active).collect();
        assert_eq!(
            active.iter().filter(|a| **a).count(),
            1,
            "round {round}: active instances {active:?}:\n{}\n{}",
            instances[0].log_tail(LOG_LINES),
            instances[1].log_tail(LOG_LINES)
        );
        for instance in &mut instances {
            assert!(instance.terminate().success(), "{}", instance.log_tail(LOG_LINES));
        }
    }
    wait_commits(&writer, 100, "at the end").await;
    let written = writer.finish().await;
    instances[0].run(&configs[0]);
    let run = assert_exactly_once("started together", &instances[0], &written);
    reliability::record(
        "exactly_once: two instances started together",
        &written,
        &run,
        None,
        &format!("{rounds} simultaneous starts of two instances: one active each time"),
    );
    assert!(instances[0].terminate().success(), "{}", instances[0].log_tail(LOG_LINES));
}

/// Sends `signal` (`STOP`, `CONT`) to the connector's process.
fn signal(connector: &Connector, signal: &str) {
    let pid = connector.pid().expect("running").to_string();
    let ok = std::process::Command::new("kill").args([&format!("-{signal}"), &pid]).status().expect("kill");
    assert!(ok.success(), "kill -{signal} {pid}");
}

/// A zombie: the active instance is paused (SIGSTOP: a VM freeze, a GC pause of the host) longer than the
/// failover timeout, the standby takes over, then the old one wakes up with an open Kafka transaction and
/// records it had not sent. Its producer is fenced by the new one's: nothing it sends becomes visible, it
/// cannot commit a checkpoint, and it goes back to waiting as a standby. `read_committed` consumers see
/// every event once.
#[tokio::test(flavor = "multi_thread")]
async fn a_paused_active_that_wakes_up_is_fenced() {
    paused_active_wakes_up(&standby_settings(), true).await;
}

/// The same with `at_least_once` and the Kafka backend: the woken instance's state writer is fenced, so the
/// stored checkpoint never moves backwards (sampled before and after it wakes), nothing is lost, and what it
/// may publish after waking is a duplicate (the documented bound: what it had already handed to the
/// producer).
#[tokio::test(flavor = "multi_thread")]
async fn at_least_once_a_paused_active_cannot_move_the_checkpoint_back() {
    let settings = standby_settings().replace("guarantee = \"exactly_once\"", "guarantee = \"at_least_once\"");
    paused_active_wakes_up(&settings, false).await;
}

async fn paused_active_wakes_up(settings: &str, exactly_once: bool) {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Noida);
    let mut old = Connector::start(&db, &broker, settings);
    let writer = Writer::start(db.opts_root(), steady_workload());
    assert!(common::wait_until(PROGRESS_TIMEOUT, || is_active(&mut old)), "{}", old.log_tail(LOG_LINES));
    let mut new = Connector::new();
    let config = new.write_config(&db, &broker, settings);
    new.run(&config);
    wait_standby(&mut new, "the second instance").await;
    wait_commits(&writer, 200, "before the pause").await;
    signal(&old, "STOP");
    assert!(
        common::wait_until(PROGRESS_TIMEOUT, || is_active(&mut new)),
        "the standby did not take over from a paused active:\n{}",
        new.log_tail(LOG_LINES)
    );
    wait_commits(&writer, 300, "after the takeover").await;
    let before_wake = reliability::checkpoint_seq(new.status_json().as_ref());
    signal(&old, "CONT");
    // The woken instance notices (its lease is gone, its producer fenced) and waits again.
    assert!(
        common::wait_until(PROGRESS_TIMEOUT, || current_log(&old).contains("standby: waiting for the lease")),
        "the woken instance did not go back to standby:\n{}",
        old.log_tail(LOG_LINES)
    );
    let after_wake = reliability::checkpoint_seq(new.status_json().as_ref());
    assert!(after_wake >= before_wake, "the checkpoint moved back from seq {before_wake} to {after_wake}");
    wait_commits(&writer, 200, "after the wake-up").await;
    let written = writer.finish().await;
    let (name, note) = match exactly_once {
        true => (
            "exactly_once: paused active wakes up after the takeover",
            "SIGSTOP of the active past failover_timeout_ms = 3000, standby takes over, SIGCONT: the old producer \
             is fenced and the old instance waits as a standby",
        ),
        false => (
            "at_least_once, Kafka state: paused active wakes up after the takeover",
            "as above with at_least_once: the old state writer is fenced, the checkpoint never moved back; \
             duplicates are what the old one had handed to its producer",
        ),
    };
    let run = match exactly_once {
        true => assert_exactly_once("zombie", &new, &written),
        false => reliability::closing_audit("zombie, at least once", &new, &written, Duplicates::Reported),
    };
    reliability::record(name, &written, &run, None, note);
    for instance in [&mut new, &mut old] {
        assert!(instance.terminate().success(), "{}", instance.log_tail(LOG_LINES));
    }
}

/// `outbox-cdc state copy`: an at-least-once connector with the local store moves to the Kafka backend and
/// `exactly_once` without republishing anything; a copy while the connector runs, and one that would move
/// the Kafka checkpoint back, are refused.
#[tokio::test(flavor = "multi_thread")]
async fn state_copy_moves_a_local_connector_to_kafka_without_repeating_anything() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Noida);
    let mut conn = db.conn().await;
    let mut expected = common::Expected::default();
    let mut insert = async |range: std::ops::Range<usize>| {
        for i in range {
            let row = common::OutboxRow::new(format!("agg-{}", i % 9)).id(format!("ev-{i:05}"));
            common::insert_event(&mut conn, &row).await.expect("insert");
            expected.per_aggregate.entry(format!("agg-{}", i % 9)).or_default().push(row.id.clone());
        }
    };
    insert(0..200).await;
    let mut connector = Connector::start(&db, &broker, "");
    assert_eq!(broker.read_committed("outbox.event.order", 200, PROGRESS_TIMEOUT).len(), 200);
    assert!(connector.terminate().success(), "{}", connector.log_tail(LOG_LINES));
    let copy = |connector: &Connector, to: &str| {
        connector.command(&["state", "copy", "--to", to], PROGRESS_TIMEOUT).expect("state copy finishes")
    };
    let (status, stdout, stderr) = copy(&connector, "kafka");
    assert!(status.success() && stdout.contains("copied the checkpoint"), "{stdout}\n{stderr}");

    // The same directory, now with the Kafka backend and exactly once.
    connector.write_config(&db, &broker, EXACTLY_ONCE);
    connector.run(&connector.config_path());
    assert!(common::wait_until(PROGRESS_TIMEOUT, || is_active(&mut connector)), "{}", connector.log_tail(LOG_LINES));
    let (status, _, stderr) = copy(&connector, "local");
    assert_eq!(status.code(), Some(2), "a copy while the connector runs:\n{stderr}");
    assert!(stderr.contains("is running"), "{stderr}");
    insert(200..400).await;
    let written = reliability::written_from(std::mem::take(&mut expected));
    let run = assert_exactly_once("state copy", &connector, &written);
    assert_eq!(run.count("kafka_records"), 400, "nothing republished after the move");
    assert!(connector.terminate().success(), "{}", connector.log_tail(LOG_LINES));

    // The local store is now behind the topic: copying it over would move the connector back.
    let (status, _, stderr) = copy(&connector, "kafka");
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("newer checkpoint"), "{stderr}");
}

/// Poison rows with `exactly_once`: the dead letters are in the transaction of the checkpoint that passes
/// them, so a crash before its commit leaves none visible and the restart writes each once; the hold lives
/// in the state topic (`status` shows it) and `quarantine release`, run with the connector stopped (it takes
/// the lease), republishes the held events in order.
#[tokio::test(flavor = "multi_thread")]
async fn dead_letters_commit_with_their_checkpoint_and_release_works_from_kafka_state() {
    const DLQ: &str = "dlq";
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Noida);
    let mut conn = db.conn().await;
    let big =
        |aggregate: &str| common::OutboxRow::new(aggregate).payload(serde_json::json!({ "blob": "x".repeat(30_000) }));
    let (a1, poison, held, a2) =
        (common::OutboxRow::new("A-1"), big("P-1"), common::OutboxRow::new("P-1"), common::OutboxRow::new("A-2"));
    for row in [&a1, &poison, &held, &a2] {
        common::insert_event(&mut conn, row).await.expect("insert");
    }
    let mut connector = Connector::new();
    let write = |connector: &Connector, max: u32| {
        let config = connector.write_config(&db, &broker, EXACTLY_ONCE);
        let topic = "topic = \"outbox.event.${aggregate_type}\"";
        let text = std::fs::read_to_string(&config).unwrap().replace(
            topic,
            &format!(
                "{topic}\nmax_record_bytes = {max}\ndead_letter_topic = \"{DLQ}\"\n\
                 topic_config = {{ \"max.message.bytes\" = \"1048588\" }}"
            ),
        );
        std::fs::write(&config, text).unwrap();
        config
    };
    let config = write(&connector, 20_000);
    // Crash before the first commit: the dead letters produced so far are aborted.
    connector.env("OUTBOX_CDC_FAILPOINT", "before_kafka_commit:1");
    connector.run(&config);
    let exited = connector.wait_exit(PROGRESS_TIMEOUT);
    assert!(
        exited.is_some_and(|s| std::os::unix::process::ExitStatusExt::signal(&s) == Some(6)),
        "the failpoint did not fire ({exited:?}):\n{}",
        connector.log_tail(LOG_LINES)
    );
    connector.remove_env("OUTBOX_CDC_FAILPOINT");
    connector.restart();
    // Read once the restart committed: noida-db's fetch does not resume a read_committed reader that
    // started while the aborted transaction was still open (tests/common/broker.rs).
    // (The first commit after a start comes at once, with the first source transaction only: wait for the
    // next, which holds the rest.)
    assert!(
        common::wait_until(PROGRESS_TIMEOUT, || current_log(&connector)
            .matches("checkpoint committed with its events")
            .count()
            >= 3),
        "{}",
        connector.log_tail(LOG_LINES)
    );
    let dead = broker.read_to_end(DLQ, common::Isolation::ReadCommitted, PROGRESS_TIMEOUT);
    let dead_ids: Vec<_> = dead.iter().filter_map(|r| r.header_str("id")).collect();
    assert_eq!(dead_ids, [poison.id.as_str(), held.id.as_str()], "{}", connector.log_tail(LOG_LINES));
    let live = broker.read_to_end("outbox.event.order", common::Isolation::ReadCommitted, PROGRESS_TIMEOUT);
    let mut live_ids: Vec<_> = live.iter().filter_map(|r| r.header_str("id")).collect();
    live_ids.sort_unstable();
    let mut want = [a1.id.as_str(), a2.id.as_str()];
    want.sort_unstable();
    assert_eq!(live_ids, want);
    let holds = |connector: &Connector| {
        let (status, out, err) = connector.command(&["quarantine", "list", "--json"], PROGRESS_TIMEOUT).unwrap();
        assert!(status.success(), "{err}");
        serde_json::from_str::<serde_json::Value>(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
    };
    let listed = holds(&connector);
    assert_eq!(listed[0]["aggregate_id"], "P-1", "the hold is read from the state topic: {listed:#}");
    assert!(connector.terminate().success(), "{}", connector.log_tail(LOG_LINES));

    write(&connector, 100_000);
    let (status, out, err) = connector.command(&["quarantine", "release", "order", "P-1"], PROGRESS_TIMEOUT).unwrap();
    assert!(status.success() && out.contains("2 event(s) republished"), "{out}\n{err}");
    let live = broker.read_to_end("outbox.event.order", common::Isolation::ReadCommitted, PROGRESS_TIMEOUT);
    let p1: Vec<_> = live.iter().filter(|r| r.key_str() == Some("P-1")).filter_map(|r| r.header_str("id")).collect();
    assert_eq!(p1, [poison.id.as_str(), held.id.as_str()]);
    assert_eq!(holds(&connector), serde_json::json!([]), "the hold is lifted in the state topic");
}

/// The failpoint variable of the connector (src/failpoint.rs).
const FAILPOINT: &str = "OUTBOX_CDC_FAILPOINT";

/// Another transactional writer of the shared state topic (a connector sharing it, killed in the middle of
/// a commit, as the broker sees it) leaves a transaction open there, three times; the connector commits on
/// after it, and is restarted each time. Guards against a state read that ends at the last stable offset
/// (librdkafka's end of partition for a `read_committed` reader): the restart resumed from the checkpoint
/// before the open transaction and published again everything committed since (200 of 350 events twice
/// when found). It waits instead, says why, and reads on once the transaction ends (here: the writer's next
/// start fences it, as a restarted connector's would). Audited read_committed: nothing missing, nothing twice.
#[tokio::test(flavor = "multi_thread")]
async fn a_transaction_another_writer_left_open_never_hides_a_checkpoint() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Noida);
    let mut x = Connector::start(&db, &broker, EXACTLY_ONCE);
    let writer = Writer::start(db.opts_root(), steady_workload());
    wait_commits(&writer, 200, "before the first round").await;
    let mut other = None;
    let committing = |x: &Connector| current_log(x).contains("checkpoint committed with its events");
    for round in 1..=3 {
        // The transaction of the last round ends (as a restarted writer's start or the broker's timeout
        // would end it): the waiting read goes on.
        if let Some(last) = other.take() {
            rdkafka::producer::Producer::abort_transaction(&last, Duration::from_secs(30)).expect("abort");
        }
        assert!(common::wait_until(PROGRESS_TIMEOUT, || committing(&x)), "round {round}: {}", x.log_tail(LOG_LINES));
        other = Some(open_foreign_transaction(&broker, "outbox-cdc.state"));
        // The connector commits checkpoints after that transaction: the ones its restart must find.
        wait_commits(&writer, 150, &format!("round {round}, after the transaction opened")).await;
        hold_running(&mut x, Duration::from_millis(800), &format!("round {round}, committing"), 80).await;
        assert!(x.terminate().success(), "round {round}: {}", x.log_tail(LOG_LINES));
        x.restart();
        assert!(
            common::wait_until(PROGRESS_TIMEOUT, || current_log(&x)
                .contains("waiting for a transaction another producer left open")),
            "round {round}: the start did not wait for the open transaction:\n{}",
            x.log_tail(LOG_LINES)
        );
        eprintln!("[other writer] round {round}: the start waits for the open transaction");
    }
    let last = other.take().expect("opened in the last round");
    rdkafka::producer::Producer::abort_transaction(&last, Duration::from_secs(30)).expect("abort");
    let recovery = Recovery::starts(&db).wait(&x);
    wait_commits(&writer, 200, "after the last round").await;
    let written = writer.finish().await;
    assert!(written.errors.is_empty(), "the workload saw errors: {:?}", written.errors);
    let run = assert_exactly_once("other writer", &x, &written);
    reliability::record(
        "exactly_once: another writer's transaction left open on the state topic",
        &written,
        &run,
        Some(recovery),
        "a transaction left open on the shared state topic 3 times; the connector restarted after each; read_committed audit",
    );
    assert!(x.terminate().success(), "{}", x.log_tail(LOG_LINES));
}

/// A transactional producer of the test's own, with a transaction left open on `topic` (one record in it):
/// another connector killed in the middle of a transaction, as the broker sees it.
fn open_foreign_transaction(broker: &Broker, topic: &str) -> rdkafka::producer::BaseProducer {
    use rdkafka::producer::{BaseRecord, Producer};
    let producer: rdkafka::producer::BaseProducer = broker
        .client_config()
        .set("transactional.id", "a-foreign-writer")
        .set("transaction.timeout.ms", "600000")
        .create()
        .expect("a transactional producer");
    producer.init_transactions(Duration::from_secs(30)).expect("init_transactions");
    producer.begin_transaction().expect("begin");
    producer.send(BaseRecord::to(topic).key("foreign").payload("open")).map_err(|(e, _)| e).expect("send");
    producer.flush(Duration::from_secs(30)).expect("flush");
    producer
}

/// `quarantine release` reads the shared dead-letter topic to its high watermark. Guards against a release
/// that stopped at the last stable offset, before another writer's open transaction: it lifted the hold
/// without the held events dead-lettered after that point, and those were never published.
#[tokio::test(flavor = "multi_thread")]
async fn a_release_reads_the_hold_past_another_writers_open_transaction() {
    const DLQ: &str = "dlq";
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Noida);
    broker.create_topic(DLQ, 1);
    let mut conn = db.conn().await;
    let poison = common::OutboxRow::new("P-1").payload(serde_json::json!({ "blob": "x".repeat(30_000) }));
    common::insert_event(&mut conn, &poison).await.expect("insert");
    let mut connector = Connector::new();
    let write = |connector: &Connector, max: u32| {
        let config = connector.write_config(&db, &broker, EXACTLY_ONCE);
        let topic = "topic = \"outbox.event.${aggregate_type}\"";
        let text = std::fs::read_to_string(&config).unwrap().replace(
            topic,
            &format!(
                "{topic}\nmax_record_bytes = {max}\ndead_letter_topic = \"{DLQ}\"\n\
                 topic_config = {{ \"max.message.bytes\" = \"1048588\" }}"
            ),
        );
        std::fs::write(&config, text).unwrap();
        config
    };
    connector.run(&write(&connector, 20_000));
    let dead = |n: usize| broker.read_committed(DLQ, n, PROGRESS_TIMEOUT).len() >= n;
    assert!(common::wait_until(PROGRESS_TIMEOUT, || dead(1)), "{}", connector.log_tail(LOG_LINES));
    // Another writer opens a transaction on the dead-letter topic; the hold's later events go after it.
    let foreign = open_foreign_transaction(&broker, DLQ);
    let held: Vec<common::OutboxRow> = (0..3).map(|_| common::OutboxRow::new("P-1")).collect();
    for row in &held {
        common::insert_event(&mut conn, row).await.expect("insert");
    }
    let uncommitted = || broker.read_uncommitted(DLQ, 5, Duration::from_secs(1)).len();
    assert!(common::wait_until(PROGRESS_TIMEOUT, || uncommitted() >= 5), "{}", connector.log_tail(LOG_LINES));
    hold_running(&mut connector, Duration::from_millis(1000), "committing the dead letters", 80).await;
    assert!(connector.terminate().success(), "{}", connector.log_tail(LOG_LINES));

    write(&connector, 100_000);
    // The foreign transaction ends once the release said that it waits for it (or ended without saying so,
    // which fails below): never at a time, which a slow machine may reach before the release does.
    const WAITS: &str = "waiting for a transaction another producer left open";
    let release = ["quarantine", "release", "order", "P-1"];
    let (status, out, err) = connector
        .command_during(&release, PROGRESS_TIMEOUT, move |running| {
            running.wait_for_stderr(WAITS);
            rdkafka::producer::Producer::abort_transaction(&foreign, Duration::from_secs(30)).expect("abort");
        })
        .unwrap();
    assert!(err.contains(WAITS), "the release did not say that it waits:\n{out}\n{err}");
    assert!(status.success() && out.contains("4 event(s) republished"), "{out}\n{err}");
    let live = broker.read_to_end("outbox.event.order", common::Isolation::ReadCommitted, PROGRESS_TIMEOUT);
    let p1: Vec<_> = live.iter().filter(|r| r.key_str() == Some("P-1")).filter_map(|r| r.header_str("id")).collect();
    let want: Vec<&str> = std::iter::once(&poison).chain(&held).map(|r| r.id.as_str()).collect();
    assert_eq!(p1, want, "every held event republished, in order");
}

/// Guards against a run dropped on losing its lease with its Kafka transaction still open: the broker kept
/// it open until `transaction.timeout.ms` (noida-db: for ever), and every `read_committed` consumer of its
/// partitions, and every other connector's state read, waited that long. The lock's connection is killed
/// and the lock taken by the test, so the connector stays a standby: its transaction must be aborted now.
#[tokio::test(flavor = "multi_thread")]
async fn losing_the_lease_aborts_the_open_transaction() {
    const TOPIC: &str = "outbox.event.order";
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Noida);
    // Commits 20 s apart: after the first (at once), the transaction stays open while events flow.
    broker.create_topic(TOPIC, 1);
    let settings = standby_settings().replace("checkpoint_interval_ms = 200", "checkpoint_interval_ms = 20000");
    let mut connector = Connector::start(&db, &broker, &settings);
    let writer = Writer::start(db.opts_root(), steady_workload());
    assert!(common::wait_until(PROGRESS_TIMEOUT, || is_active(&mut connector)), "{}", connector.log_tail(LOG_LINES));
    wait_commits(&writer, 300, "before the lease is lost").await;
    let open = |isolation| broker.watermarks(TOPIC, 0, isolation).1;
    assert!(
        common::wait_until(PROGRESS_TIMEOUT, || open(common::Isolation::ReadCommitted)
            < open(common::Isolation::ReadUncommitted)),
        "no transaction open on {TOPIC}:\n{}",
        connector.log_tail(LOG_LINES)
    );
    let mut admin = db.conn().await;
    let lock = "outbox-cdc/outbox-cdc";
    let holder: Option<u64> = admin.query_first(format!("SELECT IS_USED_LOCK('{lock}')")).await.unwrap();
    admin.query_drop(format!("KILL {}", holder.expect("the connector holds the lease"))).await.unwrap();
    let got: Option<i64> = admin.query_first(format!("SELECT GET_LOCK('{lock}', 10)")).await.unwrap();
    assert_eq!(got, Some(1), "the test takes the lease");
    // Within the transaction's own 60 s timeout, opened at most 20 s ago (a broker that honours it would
    // abort it then), with room for a loaded machine: the run that lost its lease notices within
    // failover_timeout_ms / 2 and aborts at once.
    assert!(
        common::wait_until(Duration::from_secs(30), || open(common::Isolation::ReadCommitted)
            == open(common::Isolation::ReadUncommitted)),
        "the transaction of the run that lost its lease is still open:\n{}",
        connector.log_tail(LOG_LINES)
    );
    // The connector takes the lease back and resumes from its last commit: nothing lost, nothing twice.
    drop(admin);
    wait_commits(&writer, 200, "after the lease came back").await;
    let written = writer.finish().await;
    assert_exactly_once("lease lost", &connector, &written);
    assert!(connector.terminate().success(), "{}", connector.log_tail(LOG_LINES));
}

/// Guards against two different connectors left at the default `[state] name` on one server: the second
/// was a silent, permanent standby. It now says why it waits and what to change; a standby of the same
/// connector does not.
#[tokio::test(flavor = "multi_thread")]
async fn a_different_connector_under_the_same_name_is_diagnosed() {
    const DIFFERENT: &str = "runs with another configuration";
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Noida);
    let mut active = Connector::start(&db, &broker, EXACTLY_ONCE);
    assert!(common::wait_until(PROGRESS_TIMEOUT, || is_active(&mut active)), "{}", active.log_tail(LOG_LINES));
    let mut other = Connector::new();
    let config = other.write_config(&db, &broker, EXACTLY_ONCE);
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("topic = \"outbox.event.${aggregate_type}\"", "topic = \"other.${aggregate_type}\"");
    std::fs::write(&config, text).unwrap();
    other.run(&config);
    assert!(
        common::wait_until(PROGRESS_TIMEOUT, || other.stderr().contains(DIFFERENT)),
        "the other connector waits without saying why:\n{}",
        other.log_tail(LOG_LINES)
    );
    let mut standby = Connector::start(&db, &broker, EXACTLY_ONCE);
    assert!(
        common::wait_until(PROGRESS_TIMEOUT, || standby.stderr().contains("standby: waiting for the lease")),
        "{}",
        standby.log_tail(LOG_LINES)
    );
    hold_running(&mut standby, Duration::from_secs(2), "a standby of the same connector", 40).await;
    assert!(!standby.stderr().contains(DIFFERENT), "{}", standby.log_tail(LOG_LINES));
    for connector in [&mut active, &mut other, &mut standby] {
        assert!(connector.terminate().success(), "{}", connector.log_tail(LOG_LINES));
    }
}

/// A connector that dies within a checkpoint interval of every start (OOM-killed, a liveness probe too
/// tight) moves its checkpoint at every start all the same. Guards against the first checkpoint coming one
/// interval after the start: such a crash loop republished everything since its last checkpoint at every
/// restart, for ever (3,000 duplicate records for 1,800 events in 5 kills when found).
async fn a_crash_loop_moves_the_checkpoint_every_start(settings: &str, name: &str) {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Noida);
    let mut connector = Connector::start(&db, &broker, settings);
    let writer = Writer::start(db.opts_root(), steady_workload());
    let mut last = 0;
    for kill in 1..=5 {
        wait_commits(&writer, 100, &format!("{name}: before kill #{kill}")).await;
        assert!(
            common::wait_until(PROGRESS_TIMEOUT, || current_log(&connector).contains("streaming")),
            "{name}: start #{kill} did not stream:\n{}",
            connector.log_tail(LOG_LINES)
        );
        // The interval is 10 s: a checkpoint stored within half of it after the stream started is the start's
        // own, not the interval's. Killed once it is stored (not after a fixed time, which a loaded machine
        // may overrun before the first checkpoint).
        let stored = || {
            let log = current_log(&connector);
            let streamed = &log[log.find("streaming").unwrap_or(0)..];
            streamed.contains("checkpoint written") || streamed.contains("checkpoint committed with its events")
        };
        assert!(
            common::wait_until(Duration::from_secs(5), stored),
            "{name}: start #{kill} stored no checkpoint within 5 s of streaming:\n{}",
            connector.log_tail(LOG_LINES)
        );
        connector.kill();
        let now = reliability::checkpoint_seq(connector.status_json().as_ref());
        assert!(
            now > last,
            "{name}: start #{kill} moved no checkpoint ({last} -> {now}):\n{}",
            connector.log_tail(LOG_LINES)
        );
        last = now;
        connector.restart();
    }
    let recovery = Recovery::starts(&db).wait(&connector);
    let written = writer.finish().await;
    let run = reliability::closing_audit(name, &connector, &written, Duplicates::Reported);
    reliability::record(
        name,
        &written,
        &run,
        Some(recovery),
        "5 kill -9 each right after a start's first checkpoint, 10 s checkpoint interval",
    );
    assert!(connector.terminate().success(), "{}", connector.log_tail(LOG_LINES));
}

#[tokio::test(flavor = "multi_thread")]
async fn exactly_once_a_crash_loop_moves_the_checkpoint_every_start() {
    let settings = EXACTLY_ONCE.replace("checkpoint_interval_ms = 200", "checkpoint_interval_ms = 10000");
    a_crash_loop_moves_the_checkpoint_every_start(&settings, "exactly_once: crash loop, a kill soon after each start")
        .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn at_least_once_a_crash_loop_moves_the_checkpoint_every_start() {
    let settings = "[state]\ncheckpoint_interval_ms = 10000\n";
    a_crash_loop_moves_the_checkpoint_every_start(settings, "crash loop, a kill soon after each start").await;
}

/// A broker without transactions (Tansu 0.6 has none): `exactly_once` stops at once with exit 2 and says
/// so, instead of retrying for ever.
#[tokio::test(flavor = "multi_thread")]
async fn exactly_once_on_a_broker_without_transactions_fails_loud() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let mut connector = Connector::start(&db, &broker, EXACTLY_ONCE);
    let exited = connector.wait_exit(PROGRESS_TIMEOUT);
    assert_eq!(exited.and_then(|s| s.code()), Some(2), "{}", connector.log_tail(LOG_LINES));
    assert!(connector.stderr().contains("transactions"), "{}", connector.log_tail(LOG_LINES));
}
