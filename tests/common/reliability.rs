//! Scenario bookkeeping shared by `tests/faults.rs`, `tests/scenarios.rs` and `tests/exactly_once.rs`: the
//! steady workload, waiting for progress, full-length parameters, recovery time, the closing
//! `outbox-cdc audit` with its duplicate-window check, and one JSON line per scenario for
//! `docs/RELIABILITY.md` (`scripts/reliability`).
//!
//! # The duplicate window
//! Every pipeline run logs where it resumed (`streaming position=gtid …`). An event may be published once
//! by each run that resumed before it: occurrences(id) ≤ #{runs r : seq(id) > resume(r)}. The first run
//! counts too, so an event that is never repeated is allowed exactly once. Scenarios whose recovery
//! deliberately republishes the table (a new snapshot) or whose GTID sequence restarts (`RESET MASTER`)
//! skip this check and say so in their notes.

use super::audit::Expected;
use super::connector::{AuditRun, Connector};
use super::mariadb::MariaDb;
use super::workload::{Writer, WriterConfig, Written};
use std::io::Write;
use std::time::{Duration, Instant};

/// Set to `1` for the full-length parameters (20 kill cycles, 30 s broker outage, longer workloads).
pub const FULL_ENV: &str = "OUTBOX_CDC_SCENARIO_FULL";
/// When set, each scenario appends one JSON line to this file.
pub const OUT_ENV: &str = "OUTBOX_CDC_RELIABILITY_OUT";
/// How long the connector may take to deliver everything once the workload stopped.
const CATCH_UP: Duration = Duration::from_secs(180);
/// How long a recovery may take before the test fails.
const RECOVERY_TIMEOUT: Duration = Duration::from_secs(180);

/// How long any single "wait for progress" may take.
pub const PROGRESS_TIMEOUT: Duration = Duration::from_secs(120);

/// The workload a fault lands in: 4 writers over 64 aggregates, a few hundred commits a second, paced so
/// that each fault lands in the middle of a steady stream. `max_events` only bounds a run whose `finish`
/// never comes; each commit's GTID is recorded for diagnosis and the duplicate-window check.
pub fn steady_workload() -> WriterConfig {
    WriterConfig {
        tasks: 4,
        aggregates_per_task: 16,
        max_events: 200_000,
        pause: Duration::from_millis(3),
        record_gtids: true,
        ..WriterConfig::default()
    }
}

/// Waits until the workload committed `more` transactions beyond what it has now.
pub async fn wait_commits(writer: &Writer, more: usize, what: &str) {
    let target = writer.committed() + more;
    assert!(
        writer.wait_committed(target, PROGRESS_TIMEOUT).await,
        "the workload stalled {what}: {} commits, wanted {target}",
        writer.committed()
    );
}

/// Sleeps for `duration`, asserting every 100 ms that the connector process is still running (its last
/// `log_lines` lines of log in the message when it is not).
pub async fn hold_running(connector: &mut Connector, duration: Duration, what: &str, log_lines: usize) {
    let until = Instant::now() + duration;
    while Instant::now() < until {
        assert!(
            connector.is_running(),
            "the connector exited ({what}):\n{}",
            super::tail_file(&connector.dir().join("stderr.log"), log_lines)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether the full-length parameters were asked for.
pub fn full() -> bool {
    std::env::var(FULL_ENV).is_ok_and(|v| v == "1")
}

/// `short` in the default (CI) run, `long` with [`FULL_ENV`].
pub fn scaled<T>(short: T, long: T) -> T {
    if full() {
        long
    } else {
        short
    }
}

/// The sequence number of `domain` in a MariaDB GTID position such as `0-1-42` or `0-1-42,1-2-7`;
/// `None` when the domain is absent (an empty position holds no transaction).
pub fn mariadb_seq(position: &str, domain: u32) -> Option<u64> {
    position.split(',').map(str::trim).filter(|g| !g.is_empty()).find_map(|g| {
        let mut parts = g.split('-');
        let (d, _server, seq) = (parts.next()?, parts.next()?, parts.next()?);
        (d.parse::<u32>().ok()? == domain).then(|| seq.parse().expect("numeric GTID sequence"))
    })
}

/// The domain-0 sequence number in a checkpoint record (as `status --json` prints it); 0 when there is
/// no record yet or it holds no transaction of domain 0: resuming from it repeats everything.
pub fn checkpoint_seq(record: Option<&serde_json::Value>) -> u64 {
    let Some(cp) = record else { return 0 };
    let position = &cp["position"];
    assert_eq!(position["flavor"], "mariadb", "unexpected checkpoint record: {cp}");
    let gtids = position["gtids"].as_str().unwrap_or_else(|| panic!("checkpoint without gtids: {cp}"));
    mariadb_seq(gtids, 0).unwrap_or(0)
}

/// The domain-0 sequence number of the server's last transaction.
pub fn db_seq(db: &MariaDb) -> u64 {
    mariadb_seq(&db.gtid_binlog_pos(), 0).unwrap_or(0)
}

/// Where every pipeline run resumed (domain-0 sequence number of each `streaming` log line), in order.
pub fn resume_points(stderr: &str) -> Vec<u64> {
    stderr
        .lines()
        .filter_map(|line| line.split("outbox_cdc::pipeline: streaming position=gtid ").nth(1))
        .map(|rest| mariadb_seq(rest.split(" (").next().unwrap_or_default(), 0).unwrap_or(0))
        .collect()
}

/// A fault has ended: from now, how long until the stored checkpoint covers everything the server had
/// committed at this moment.
#[derive(Debug, Clone, Copy)]
pub struct Recovery {
    since: Instant,
    target: u64,
}

impl Recovery {
    /// Marks the end of a fault (call it right after restarting the service or the connector).
    pub fn starts(db: &MariaDb) -> Recovery {
        Recovery { since: Instant::now(), target: db_seq(db) }
    }

    /// Waits until the checkpoint reached the target; returns the time since the fault ended.
    ///
    /// # Panics
    /// When that takes longer than 180 s.
    pub fn wait(&self, connector: &Connector) -> Duration {
        let deadline = Instant::now() + RECOVERY_TIMEOUT;
        loop {
            if let Ok(record) = connector.try_status_json() {
                // A snapshot in progress checkpoints its cut (at once "caught up"): not recovered yet.
                let snapshot_done = record
                    .as_ref()
                    .is_some_and(|r| r["snapshot"].is_null() || r["snapshot"]["done"].as_bool() == Some(true));
                if snapshot_done && checkpoint_seq(record.as_ref()) >= self.target {
                    return self.since.elapsed();
                }
            }
            assert!(
                Instant::now() < deadline,
                "the checkpoint did not reach seq {} within {RECOVERY_TIMEOUT:?} of the fault's end:\n{}",
                self.target,
                super::tail_file(&connector.dir().join("stderr.log"), 80)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// How the closing audit judges duplicates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Duplicates {
    /// Only inside the window after each run's resume point (see the module docs).
    AfterCheckpoint,
    /// Reported, not judged: the recovery republishes on purpose (named in the notes).
    Reported,
}

/// Runs `outbox-cdc audit --json` until it passes or [`CATCH_UP`] ends (the connector may still be
/// delivering), then asserts: exit 0, nothing missing, no order violation, no split aggregate, every
/// committed id in the table, and duplicates within the window.
///
/// # Panics
/// On any of those failures, with the report and the connector's logs.
pub fn closing_audit(name: &str, connector: &Connector, written: &Written, duplicates: Duplicates) -> AuditRun {
    assert!(!written.is_empty(), "{name}: the workload wrote nothing");
    let deadline = Instant::now() + CATCH_UP;
    let run = loop {
        let run = connector.audit(&[]);
        if run.code == Some(0) || Instant::now() >= deadline {
            break run;
        }
        std::thread::sleep(Duration::from_secs(1));
    };
    let logs = || super::tail_file(&connector.dir().join("stderr.log"), 120);
    assert_eq!(run.code, Some(0), "{name}: the audit failed:\n{:#}\n{}\n{}", run.report, run.stderr, logs());
    for field in ["missing", "order_violations", "split_aggregates", "without_id"] {
        assert_eq!(run.count(field), 0, "{name}: {field}:\n{:#}", run.report);
    }
    let certain = written.len() - written.expected.uncertain.len();
    assert!(
        run.count("table_rows") as usize >= certain,
        "{name}: the table has {} rows, the workload committed {certain}",
        run.count("table_rows")
    );
    if duplicates == Duplicates::AfterCheckpoint {
        let resumes = resume_points(&connector.stderr());
        // Ids committed before the first stream position were published by a snapshot, whose duplicate
        // window is by key, not by GTID (tests/snapshot.rs checks it): not judged here.
        let first_stream = resumes.iter().copied().min().unwrap_or(0);
        let outside: Vec<String> = run
            .duplicates()
            .into_iter()
            .filter_map(|(id, count)| {
                let seq = mariadb_seq(written.gtids.get(&id)?, 0).filter(|&seq| seq > first_stream)?;
                let allowed = resumes.iter().filter(|&&r| seq > r).count() as u64;
                (count > allowed).then(|| format!("{id} (seq {seq}) {count} times, allowed {allowed}"))
            })
            .collect();
        assert!(
            outside.is_empty(),
            "{name}: {} ids duplicated outside the window after the resume points {resumes:?}: {:?}\n{}",
            outside.len(),
            &outside[..outside.len().min(10)],
            logs()
        );
    }
    eprintln!(
        "[{name}] audit: table_rows={} kafka_records={} missing=0 duplicated_ids={} duplicate_records={}",
        run.count("table_rows"),
        run.count("kafka_records"),
        run.count("duplicated_ids"),
        run.count("duplicate_records")
    );
    run
}

/// Appends the scenario's line to `$OUTBOX_CDC_RELIABILITY_OUT` (when set): events written, missing,
/// duplicated, order violations, recovery time and a note.
pub fn record(name: &str, written: &Written, audit: &AuditRun, recovery: Option<Duration>, note: &str) {
    let Some(path) = std::env::var_os(OUT_ENV) else { return };
    let line = serde_json::json!({
        "scenario": name,
        "full": full(),
        "events_written": written.len(),
        "table_rows": audit.count("table_rows"),
        "kafka_records": audit.count("kafka_records"),
        "missing": audit.count("missing"),
        "duplicated_ids": audit.count("duplicated_ids"),
        "duplicate_records": audit.count("duplicate_records"),
        "order_violations": audit.count("order_violations"),
        "recovery_ms": recovery.map(|d| d.as_millis() as u64),
        "note": note,
    });
    let mut file =
        std::fs::OpenOptions::new().create(true).append(true).open(&path).expect("open the reliability file");
    writeln!(file, "{line}").expect("append to the reliability file");
}

/// The audit's expectation for ids the test itself wrote outside a [`super::Writer`].
pub fn written_from(expected: Expected) -> Written {
    Written { expected, ..Written::default() }
}

/// [`closing_audit`] of an `exactly_once` run, read `read_committed`: every event exactly once, not a
/// duplicate anywhere.
///
/// # Panics
/// As [`closing_audit`], and on any duplicate, with the first ones and the connector's logs.
pub fn closing_audit_exactly_once(name: &str, connector: &Connector, written: &Written) -> AuditRun {
    let run = closing_audit(name, connector, written, Duplicates::Reported);
    assert_eq!(
        (run.count("duplicated_ids"), run.count("duplicate_records")),
        (0, 0),
        "{name}: duplicates seen by a read_committed consumer: {:?}\n{}",
        &run.duplicates()[..run.duplicates().len().min(10)],
        connector.log_tail(80)
    );
    run
}
