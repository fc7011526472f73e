//! `[delivery] guarantee = "exactly_once"` with `[state] backend = "kafka"` against a broker with real
//! Kafka transactions (noida-db's Kafka service: `tests/common/broker.rs`; it is not durable across its
//! own restart, so here only the connector crashes).
//!
//! Every test ends with `outbox-cdc audit`, which reads `read_committed`: nothing missing, no duplicate,
//! no order violation, whatever crashed in between.

mod common;

use std::time::{Duration, Instant};

use common::reliability::{self, Duplicates, Recovery};
use common::{Broker, Connector, Engine, MariaDb, Writer, WriterConfig};
use rand::Rng;

/// The settings every test here runs with: transactions committing every 200 ms.
const EXACTLY_ONCE: &str = "[delivery]\nguarantee = \"exactly_once\"\n\
                            [state]\nbackend = \"kafka\"\ncheckpoint_interval_ms = 200\n";

const PROGRESS_TIMEOUT: Duration = Duration::from_secs(120);

/// 4 writers over 64 aggregates, a few hundred commits a second.
fn workload() -> WriterConfig {
    WriterConfig {
        tasks: 4,
        aggregates_per_task: 16,
        max_events: 200_000,
        pause: Duration::from_millis(3),
        record_gtids: true,
        ..WriterConfig::default()
    }
}

fn log_tail(connector: &Connector) -> String {
    common::tail_file(&connector.dir().join("stderr.log"), 80)
}

async fn wait_commits(writer: &Writer, more: usize, what: &str) {
    let target = writer.committed() + more;
    assert!(
        writer.wait_committed(target, PROGRESS_TIMEOUT).await,
        "the workload stalled {what}: {} commits, wanted {target}",
        writer.committed()
    );
}

/// Sleeps `duration`, asserting that the connector keeps running.
async fn hold_running(connector: &mut Connector, duration: Duration, what: &str) {
    let until = Instant::now() + duration;
    while Instant::now() < until {
        assert!(connector.is_running(), "the connector exited ({what}):\n{}", log_tail(connector));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The audit passes (nothing missing, in order) and sees every event exactly once.
fn assert_exactly_once(name: &str, connector: &Connector, written: &common::Written) -> common::AuditRun {
    let run = reliability::closing_audit(name, connector, written, Duplicates::Reported);
    assert_eq!(
        (run.count("duplicated_ids"), run.count("duplicate_records")),
        (0, 0),
        "{name}: duplicates seen by a read_committed consumer: {:?}\n{}",
        &run.duplicates()[..run.duplicates().len().min(10)],
        log_tail(connector)
    );
    run
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
    let writer = Writer::start(db.opts_root(), workload());
    wait_commits(&writer, 200, "before the first kill").await;
    let pauses_ms: Vec<u64> = {
        let mut rng = rand::rng();
        (0..cycles).map(|_| rng.random_range(300..=2500)).collect()
    };
    eprintln!("[exactly-once kill9] pauses before each kill (ms): {pauses_ms:?}");
    for (cycle, pause) in pauses_ms.iter().enumerate() {
        hold_running(&mut connector, Duration::from_millis(*pause), &format!("before kill #{}", cycle + 1)).await;
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
    assert!(connector.terminate().success(), "{}", log_tail(&connector));
}

/// A crash at each point of the commit: before the Kafka commit (the transaction is open: the next
/// producer's start aborts it), right after it (nothing local is left to do: the commit is the
/// checkpoint), mid state write, and mid snapshot. Each is a separate process abort under load.
#[tokio::test(flavor = "multi_thread")]
async fn a_crash_at_every_commit_point_loses_and_repeats_nothing() {
    const FAILPOINT: &str = "OUTBOX_CDC_FAILPOINT";
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
    let writer = Writer::start(db.opts_root(), workload());
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
            log_tail(&connector)
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
    assert!(connector.terminate().success(), "{}", log_tail(&connector));
}

/// The state lives in Kafka: a connector started in a fresh directory (a pod without a volume, moved to
/// another node) resumes where the last one committed, and `status` reads the checkpoint from the topic.
#[tokio::test(flavor = "multi_thread")]
async fn a_fresh_process_without_local_state_resumes_exactly() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Noida);
    let mut conn = db.conn().await;
    let mut expected = common::Expected::default();
    let mut insert = async |from: usize, to: usize, conn: &mut mysql_async::Conn| {
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
    assert_eq!(read.len(), 300, "{}", log_tail(&first));
    assert!(first.terminate().success(), "{}", log_tail(&first));
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
    assert!(second.terminate().success(), "{}", log_tail(&second));
}
