//! The crash windows and operator-facing failures of the delivery promise, each under a continuous
//! business workload (one `orders` row + one outbox row per transaction, many aggregates), each ending
//! with `outbox-cdc audit` run against the real table and topic: 0 missing, 0 per-aggregate order
//! violations, duplicates only after the checkpoint each run resumed from (see `common::reliability`).
//!
//! The windows that a plain kill -9 hits only by luck are hit on purpose with failpoints (`src/failpoint.rs`):
//! this file needs the binary built with `--features failpoints` (`required-features` in Cargo.toml;
//! `scripts/test` passes the feature).
//!
//! The other fault scenarios (kill -9 at random moments, broker down and killed, MariaDB killed,
//! replication connection cut) live in `tests/faults.rs` and end with the same audit. `scripts/reliability`
//! reruns both with full-length parameters and writes `docs/RELIABILITY.md`.

mod common;

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::Duration;

use common::reliability::{
    self, checkpoint_seq, steady_workload, wait_commits, Duplicates, Recovery, PROGRESS_TIMEOUT,
};
use common::{Broker, Connector, Engine, MariaDb, Writer, Written};
use mysql_async::prelude::Queryable;

/// The environment variable that arms a failpoint in the connector process.
const FAILPOINT: &str = "OUTBOX_CDC_FAILPOINT";
/// How long a failpoint or a definite error may take to end the process.
const EXIT_TIMEOUT: Duration = Duration::from_secs(120);

/// Lines of the connector's log shown in assertion messages.
const LOG_LINES: usize = 120;

/// Waits for the process to end and asserts that the failpoint `name` aborted it.
fn assert_failpoint_fired(connector: &mut Connector, name: &str) -> ExitStatus {
    let status = connector.wait_exit(EXIT_TIMEOUT).unwrap_or_else(|| {
        panic!("failpoint {name} did not fire within {EXIT_TIMEOUT:?}:\n{}", connector.log_tail(LOG_LINES))
    });
    assert_eq!(
        status.signal(),
        Some(6),
        "expected SIGABRT from failpoint {name}, got {status}:\n{}",
        connector.log_tail(LOG_LINES)
    );
    assert!(connector.stderr().contains(&format!("failpoint {name} hit")), "{}", connector.log_tail(LOG_LINES));
    status
}

/// The stored checkpoint's domain-0 sequence number.
fn stored_seq(connector: &Connector) -> u64 {
    checkpoint_seq(connector.status_json().as_ref())
}

/// Database committed, connector down: events written while the connector is stopped arrive after it
/// starts again, and a graceful stop repeats nothing. Guards against: resuming from "current" instead of the
/// checkpoint, and a final checkpoint that misses the last acknowledged transactions.
#[tokio::test(flavor = "multi_thread")]
async fn window_database_committed_connector_down() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let mut connector = Connector::start(&db, &broker, "");
    let writer = Writer::start(db.opts_root(), steady_workload());
    wait_commits(&writer, 300, "before the stop").await;
    assert!(connector.terminate().success(), "graceful stop must exit 0:\n{}", connector.log_tail(LOG_LINES));
    let while_down = reliability::scaled(600, 3000);
    wait_commits(&writer, while_down, "while the connector was down").await;
    connector.restart();
    let recovery = Recovery::starts(&db).wait(&connector);
    wait_commits(&writer, 300, "after the restart").await;
    let written = writer.finish().await;
    let run = reliability::closing_audit("connector_down", &connector, &written, Duplicates::AfterCheckpoint);
    let note = format!("{while_down}+ events committed while the connector was stopped (SIGTERM)");
    reliability::record("database committed, connector down", &written, &run, Some(recovery), &note);
    assert!(connector.terminate().success(), "{}", connector.log_tail(LOG_LINES));
}

/// Kafka acknowledged, checkpoint not written: the process dies (failpoint `ack_before_checkpoint`) after
/// the watermark moved and before the store is written. Guards against: treating acknowledged-but-not-
/// checkpointed events as done (they must be published again, and only they).
#[tokio::test(flavor = "multi_thread")]
async fn window_acknowledged_not_checkpointed() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let mut connector = Connector::new();
    let config = connector.write_config(&db, &broker, "");
    let writer = Writer::start(db.opts_root(), steady_workload());
    wait_commits(&writer, 200, "before the start").await;
    connector.env(FAILPOINT, "ack_before_checkpoint:3");
    connector.run(&config);
    assert_failpoint_fired(&mut connector, "ack_before_checkpoint");
    let checkpoint = stored_seq(&connector);
    let committed = reliability::db_seq(&db);
    connector.remove_env(FAILPOINT);
    connector.restart();
    let recovery = Recovery::starts(&db).wait(&connector);
    wait_commits(&writer, 300, "after the restart").await;
    let written = writer.finish().await;
    let run = reliability::closing_audit("acked_not_checkpointed", &connector, &written, Duplicates::AfterCheckpoint);
    let note = format!(
        "abort after the watermark moved, before the 3rd checkpoint write (checkpoint seq {checkpoint}, server at \
         seq {committed}); everything after the checkpoint is republished"
    );
    reliability::record("Kafka acknowledged, checkpoint not written", &written, &run, Some(recovery), &note);
    assert!(connector.terminate().success(), "{}", connector.log_tail(LOG_LINES));
}

/// Inserts one transaction of `rows` outbox rows for aggregate `big-1` (ids `big-0000001`…, increasing
/// `occurred_at`) and returns the ids and the transaction's GTID.
async fn big_transaction(db: &MariaDb, rows: usize) -> (Vec<String>, String) {
    let mut conn = db.conn().await;
    conn.query_drop(format!(
        "INSERT INTO shop.outbox_events (id, aggregate_type, aggregate_id, event_type, schema_version, payload, \
         occurred_at, next_attempt_at) \
         SELECT CONCAT('big-', LPAD(seq, 7, '0')), 'order', 'big-1', 'BulkImported', 1, JSON_OBJECT('n', seq), \
                TIMESTAMP('2026-01-01 00:00:00') + INTERVAL seq MICROSECOND, NOW(6) FROM seq_1_to_{rows}"
    ))
    .await
    .expect("insert the large transaction");
    let gtid: String = conn.query_first("SELECT @@last_gtid").await.expect("@@last_gtid").expect("a GTID");
    ((1..=rows).map(|i| format!("big-{i:07}")).collect(), gtid)
}

/// Adds ids the test wrote itself (one aggregate, in order, one GTID) to the workload's record.
fn add_written(written: &mut Written, aggregate: &str, ids: &[String], gtid: &str) {
    written.expected.per_aggregate.insert(aggregate.to_owned(), ids.to_vec());
    written.gtids.extend(ids.iter().map(|id| (id.clone(), gtid.to_owned())));
}

/// Killed in the middle of a large transaction (failpoint `row_produced` at row 1,000 of 2,000), while the
/// workload runs. Guards against: checkpointing inside a transaction (a resume would skip its tail), and
/// losing or reordering the rows of the transaction that was being produced.
#[tokio::test(flavor = "multi_thread")]
async fn window_killed_mid_transaction() {
    const ROWS: usize = 2000;
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    // The large transaction is the first outbox transaction in the binlog, so hit 1,000 lands in it.
    let (big_ids, big_gtid) = big_transaction(&db, ROWS).await;
    let writer = Writer::start(db.opts_root(), steady_workload());
    let mut connector = Connector::new();
    let config = connector.write_config(&db, &broker, "");
    connector.env(FAILPOINT, format!("row_produced:{}", ROWS / 2));
    connector.run(&config);
    assert_failpoint_fired(&mut connector, "row_produced");
    let checkpoint = stored_seq(&connector);
    connector.remove_env(FAILPOINT);
    connector.restart();
    let recovery = Recovery::starts(&db).wait(&connector);
    wait_commits(&writer, 300, "after the restart").await;
    let mut written = writer.finish().await;
    add_written(&mut written, "big-1", &big_ids, &big_gtid);
    let run = reliability::closing_audit("mid_transaction", &connector, &written, Duplicates::AfterCheckpoint);
    let note = format!(
        "abort after row {} of a {ROWS}-row transaction (checkpoint seq {checkpoint}); the whole transaction is \
         read again",
        ROWS / 2
    );
    reliability::record("killed mid-transaction", &written, &run, Some(recovery), &note);
    assert!(connector.terminate().success(), "{}", connector.log_tail(LOG_LINES));
}

/// Seeds `n` rows (ids `seed-0000001`…) over 10 aggregates before the first start, for the snapshot.
async fn seed(db: &MariaDb, n: usize) -> Written {
    let mut conn = db.conn().await;
    conn.query_drop(format!(
        "INSERT INTO shop.outbox_events (id, aggregate_type, aggregate_id, event_type, schema_version, payload, \
         occurred_at, next_attempt_at) \
         SELECT CONCAT('seed-', LPAD(seq, 7, '0')), 'order', CONCAT('seed-agg-', seq % 10), 'Seeded', 1, \
                JSON_OBJECT('n', seq), TIMESTAMP('2025-01-01 00:00:00') + INTERVAL seq MICROSECOND, NOW(6) \
         FROM seq_1_to_{n}"
    ))
    .await
    .expect("seed the outbox");
    let mut written = Written::default();
    for i in 1..=n {
        written.expected.per_aggregate.entry(format!("seed-agg-{}", i % 10)).or_default().push(format!("seed-{i:07}"));
    }
    written
}

/// The remaining crash points, one after the other on one deployment under load: mid snapshot chunk
/// (`snapshot_row`), a row read but not produced (`before_produce`), mid checkpoint write
/// (`checkpoint_write`) and during graceful shutdown (`shutdown_drained`). Guards against: a snapshot that
/// restarts from scratch or skips the rest of a chunk, a torn checkpoint record, and a shutdown that
/// checkpoints more than was acknowledged.
#[tokio::test(flavor = "multi_thread")]
async fn crash_at_each_failpoint() {
    const SEED: usize = 3000;
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let seeded = seed(&db, SEED).await;
    let writer = Writer::start(db.opts_root(), steady_workload());
    let mut connector = Connector::new();
    let config = connector.write_config(&db, &broker, "[snapshot]\nmode = \"initial\"\nchunk_rows = 500\n");
    // Mid chunk 3 of the snapshot, then the 200th streamed row, then the 4th checkpoint write.
    for point in ["snapshot_row:1250", "before_produce:200", "checkpoint_write:4"] {
        connector.remove_env(FAILPOINT);
        connector.env(FAILPOINT, point);
        if point.starts_with("snapshot") {
            connector.run(&config);
        } else {
            connector.restart();
        }
        assert_failpoint_fired(&mut connector, point.split(':').next().expect("name"));
        eprintln!("[failpoints] {point}: checkpoint seq {}", stored_seq(&connector));
    }
    connector.remove_env(FAILPOINT);
    connector.env(FAILPOINT, "shutdown_drained");
    connector.restart();
    let streaming = |c: &Connector| c.stderr().matches("outbox_cdc::pipeline: streaming").count();
    let before = streaming(&connector);
    assert!(
        common::wait_until(PROGRESS_TIMEOUT, || streaming(&connector) > before),
        "no streaming after the restart:\n{}",
        connector.log_tail(LOG_LINES)
    );
    wait_commits(&writer, 200, "before the graceful stop").await;
    let status = connector.terminate();
    assert_eq!(status.signal(), Some(6), "shutdown_drained must abort the stop, got {status}");
    connector.remove_env(FAILPOINT);
    connector.restart();
    let recovery = Recovery::starts(&db).wait(&connector);
    wait_commits(&writer, 300, "after the last restart").await;
    let mut written = writer.finish().await;
    written.expected.per_aggregate.extend(seeded.expected.per_aggregate);
    let run = reliability::closing_audit("failpoints", &connector, &written, Duplicates::AfterCheckpoint);
    let note = format!(
        "{SEED} rows snapshotted, then aborts mid snapshot chunk, at a read-not-produced row, inside a checkpoint \
         write and during graceful shutdown; seeded rows are outside the GTID window check"
    );
    reliability::record("crash at each failpoint", &written, &run, Some(recovery), &note);
    assert!(connector.terminate().success(), "{}", connector.log_tail(LOG_LINES));
}

/// A private tmpfs mounted on a directory for the test's lifetime (root only).
struct TmpfsMount {
    at: PathBuf,
}

impl TmpfsMount {
    fn mount(at: &Path, size: &str) -> Option<TmpfsMount> {
        std::fs::create_dir_all(at).expect("create the mount point");
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| TmpfsMount { at: at.to_owned() })
    }
}

impl Drop for TmpfsMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.at).status();
    }
}

/// Fills the filesystem holding `dir` with a file `filler` until it is full.
fn fill(dir: &Path) -> u64 {
    use std::io::Write;
    let mut file = std::fs::File::create(dir.join("filler")).expect("create the filler");
    let block = vec![0u8; 64 * 1024];
    let mut written = 0;
    while file.write_all(&block).is_ok() {
        written += block.len() as u64;
    }
    let _ = file.sync_all();
    written
}

/// Disk full under the state directory while the connector runs: it must stop loudly (exit 2, a message
/// naming the store and the fix) with the stored checkpoint where it was, and resume with nothing missing
/// once space is freed. The state directory is a private 16 MiB tmpfs (needs root; the test says so and
/// passes vacuously otherwise).
#[tokio::test(flavor = "multi_thread")]
async fn state_directory_full() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let mut connector = Connector::new();
    let config = connector.write_config(&db, &broker, "");
    let Some(_mount) = TmpfsMount::mount(&connector.state_dir(), "16m") else {
        eprintln!("[state_full] SKIPPED: cannot mount a tmpfs here (not root?)");
        return;
    };
    let writer = Writer::start(db.opts_root(), steady_workload());
    connector.run(&config);
    wait_commits(&writer, 300, "before the disk fills").await;
    assert!(
        common::wait_until(PROGRESS_TIMEOUT, || stored_seq(&connector) > 0),
        "no checkpoint before the disk filled:\n{}",
        connector.log_tail(LOG_LINES)
    );
    let filled = fill(&connector.state_dir());
    let frozen = stored_seq(&connector);
    let status = connector.wait_exit(EXIT_TIMEOUT).unwrap_or_else(|| {
        panic!(
            "the connector kept running on a full state directory ({filled} bytes filled):\n{}",
            connector.log_tail(LOG_LINES)
        )
    });
    assert_eq!(status.code(), Some(2), "a full state directory is definite:\n{}", connector.log_tail(LOG_LINES));
    let stderr = connector.stderr();
    assert!(stderr.contains("checkpoint store") && stderr.contains("without advancing anything"), "{stderr}");
    assert_eq!(stored_seq(&connector), frozen, "the checkpoint moved after the disk filled");
    std::fs::remove_file(connector.state_dir().join("filler")).expect("free the space");
    connector.restart();
    let recovery = Recovery::starts(&db).wait(&connector);
    wait_commits(&writer, 300, "after the space was freed").await;
    let written = writer.finish().await;
    let run = reliability::closing_audit("state_full", &connector, &written, Duplicates::AfterCheckpoint);
    let note = "state dir on a 16 MiB tmpfs filled to ENOSPC under load: exit 2, checkpoint unchanged; resumed \
                after freeing space";
    reliability::record("disk full under the state directory", &written, &run, Some(recovery), note);
    assert!(connector.terminate().success(), "{}", connector.log_tail(LOG_LINES));
}

/// The binlog holding the checkpoint is purged while the connector is down: the definite error (exit 2,
/// "no longer in the server's binlogs", the checkpoint untouched), then the operator's recovery with
/// `snapshot.mode = "when_needed"`: a new snapshot, nothing missing. Guards against: silently resuming
/// past a gap.
#[tokio::test(flavor = "multi_thread")]
async fn binlog_purged_while_down_then_when_needed() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let mut connector = Connector::start(&db, &broker, "");
    let writer = Writer::start(db.opts_root(), steady_workload());
    wait_commits(&writer, 300, "before the stop").await;
    assert!(connector.terminate().success(), "{}", connector.log_tail(LOG_LINES));
    let checkpoint = stored_seq(&connector);
    let mut conn = db.conn().await;
    for _ in 0..3 {
        wait_commits(&writer, 100, "while the connector was down").await;
        conn.query_drop("FLUSH BINARY LOGS").await.expect("flush binary logs");
    }
    common::purge_binlogs_before_current(&mut conn).await;

    connector.restart();
    let status =
        connector.wait_exit(EXIT_TIMEOUT).unwrap_or_else(|| panic!("must stop:\n{}", connector.log_tail(LOG_LINES)));
    assert_eq!(status.code(), Some(2), "{}", connector.log_tail(LOG_LINES));
    assert!(connector.stderr().contains("no longer in the server's binlogs"), "{}", connector.log_tail(LOG_LINES));
    assert_eq!(stored_seq(&connector), checkpoint, "a refused start must not touch the checkpoint");

    let config = connector.write_config(&db, &broker, "[snapshot]\nmode = \"when_needed\"\n");
    connector.run(&config);
    let recovery = Recovery::starts(&db).wait(&connector);
    assert!(connector.stderr().contains("taking a new snapshot"), "{}", connector.log_tail(LOG_LINES));
    wait_commits(&writer, 300, "after the recovery").await;
    let written = writer.finish().await;
    let run = reliability::closing_audit("binlog_purged", &connector, &written, Duplicates::Reported);
    let note = "binlogs purged past the checkpoint while down: exit 2 naming the purge; recovered with \
                snapshot.mode = when_needed, which republishes the table (duplicates by design)";
    reliability::record("binlog purged while down, when_needed snapshot", &written, &run, Some(recovery), note);
    assert!(connector.terminate().success(), "{}", connector.log_tail(LOG_LINES));
}

/// Merges a second workload's record into the first.
fn merge(mut a: Written, b: Written) -> Written {
    a.expected.per_aggregate.extend(b.expected.per_aggregate);
    a.expected.uncertain.extend(b.expected.uncertain);
    a.gtids.extend(b.gtids);
    a.errors.extend(b.errors);
    a
}

/// The server's identity changes under the checkpoint: first `RESET MASTER` (binlogs and GTIDs start
/// over on the same server), then a different server. Each time the connector must refuse to resume, exit
/// 2 and say why, leaving the checkpoint alone. After `RESET MASTER` it is refused twice: while the new
/// history is shorter than the checkpoint, and once it has written past the checkpoint's GTID, when the
/// server itself would resume there without complaint and only the checkpoint's end event tells the
/// histories apart (regression: that resume skipped the new history's first transactions silently).
/// Recovery: restart with `snapshot.mode = "when_needed"`, which snapshots again; nothing is missing.
#[tokio::test(flavor = "multi_thread")]
async fn server_identity_changed_is_refused() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let mut connector = Connector::start(&db, &broker, "");
    let writer = Writer::start(db.opts_root(), steady_workload());
    wait_commits(&writer, 300, "before the stop").await;
    let first = writer.finish().await;
    assert!(
        common::wait_until(PROGRESS_TIMEOUT, || stored_seq(&connector) >= reliability::db_seq(&db)),
        "not caught up:\n{}",
        connector.log_tail(LOG_LINES)
    );
    assert!(connector.terminate().success(), "{}", connector.log_tail(LOG_LINES));
    let checkpoint = connector.status_json();
    let checkpointed = stored_seq(&connector);

    db.sql("RESET MASTER");
    let mut refuse = |when: &str| {
        let logged = connector.stderr().len();
        connector.restart();
        let status = connector
            .wait_exit(EXIT_TIMEOUT)
            .unwrap_or_else(|| panic!("must stop {when}:\n{}", connector.log_tail(LOG_LINES)));
        assert_eq!(status.code(), Some(2), "RESET MASTER must be refused {when}:\n{}", connector.log_tail(LOG_LINES));
        let stderr = connector.stderr();
        let message = stderr[logged..].lines().find(|l| l.contains("history diverged")).unwrap_or_default().to_owned();
        eprintln!("[identity] {when}: {message}");
        assert!(!message.is_empty(), "the refusal must say why:\n{}", connector.log_tail(LOG_LINES));
        assert_eq!(connector.status_json(), checkpoint, "a refused start must not touch the checkpoint");
    };
    refuse("before the new history reaches the checkpoint's GTID");
    let writer = Writer::start(db.opts_root(), steady_workload());
    assert!(
        common::wait_until(PROGRESS_TIMEOUT, || reliability::db_seq(&db) > checkpointed + 50),
        "the new history did not pass GTID sequence {checkpointed}"
    );
    refuse("after the new history passed the checkpoint's GTID");

    let other = MariaDb::builder().server_id(db.server_id() + 1).start();
    let config = connector.write_config(&other, &broker, "");
    connector.run(&config);
    let status =
        connector.wait_exit(EXIT_TIMEOUT).unwrap_or_else(|| panic!("must stop:\n{}", connector.log_tail(LOG_LINES)));
    assert_eq!(status.code(), Some(2), "another server must be refused:\n{}", connector.log_tail(LOG_LINES));
    assert!(connector.stderr().contains("checkpoint belongs to another server"), "{}", connector.log_tail(LOG_LINES));
    assert_eq!(connector.status_json(), checkpoint, "a refused start must not touch the checkpoint");
    drop(other);

    // The way out the refusal names: snapshot.mode = "when_needed" snapshots the table again when the
    // checkpoint cannot be resumed (moving the state directory away and starting afresh does the same).
    let logged = connector.stderr().len();
    let config = connector.write_config(&db, &broker, "[snapshot]\nmode = \"when_needed\"\n");
    connector.run(&config);
    let recovery = Recovery::starts(&db).wait(&connector);
    assert!(
        connector.stderr()[logged..].contains("cannot be resumed on this server; taking a new snapshot"),
        "{}",
        connector.log_tail(LOG_LINES)
    );
    wait_commits(&writer, 300, "after the recovery").await;
    let written = merge(first, writer.finish().await);
    let run = reliability::closing_audit("identity_changed", &connector, &written, Duplicates::Reported);
    let note = "RESET MASTER (before and after the new history reaches the checkpoint's GTID), then a different \
                server: all refused with exit 2, checkpoint untouched; recovered with snapshot.mode = when_needed \
                (snapshots the table again, so it republishes it)";
    reliability::record("server identity changed (RESET MASTER, other server)", &written, &run, Some(recovery), note);
    assert!(connector.terminate().success(), "{}", connector.log_tail(LOG_LINES));
}
