//! The polling relay (`source.kind = "poll"`) against a real MariaDB and a real broker: publishing and
//! marking in sequence order, rows committed out of sequence order, several relay processes on one table
//! (one active, the others standing by), kill -9 under load, a broker outage with restarts, poison rows,
//! and prune by `published_at`. Each scenario ends by auditing the topic, in sequence order.
//!
//! The relays connect as `relay`, which has `SELECT, UPDATE` on the outbox table and nothing else: no
//! binlog privilege.

mod common;

use std::time::{Duration, Instant};

use common::connector::toml_str;
use common::workload::OutboxRow;
use common::{
    audit, free_port, insert_event, wait_until, Broker, Connector, Engine, Expected, MariaDb, Writer, WriterConfig,
};
use mysql_async::prelude::Queryable;

const TOPIC: &str = "outbox.event.order";
const DLQ: &str = "outbox-cdc.dead-letter";
const RELAY_PASSWORD: &str = "relay-secret";
const CATCH_UP: Duration = Duration::from_secs(90);

/// Creates the `relay` user (`SELECT, UPDATE` on the outbox table only). The reference table
/// (`deploy/mysql-init.sql`) has the relay's sequence column and read index.
fn create_relay_user(db: &MariaDb) {
    db.sql(&format!(
        "CREATE USER 'relay'@'127.0.0.1' IDENTIFIED BY '{RELAY_PASSWORD}';
         GRANT SELECT, UPDATE ON shop.outbox_events TO 'relay'@'127.0.0.1';
         GRANT PROCESS ON *.* TO 'relay'@'127.0.0.1';"
    ));
}

/// A relay process with its own work dir and state store, `[poll]` settings from `poll`, started.
fn relay(db: &MariaDb, broker: &Broker, poll: &str) -> Connector {
    let mut c = relay_config(db, broker, poll);
    c.run(&c.config_path());
    c
}

/// [`relay`], not started yet.
fn relay_config(db: &MariaDb, broker: &Broker, poll: &str) -> Connector {
    relay_config_with(db, broker, "", poll)
}

/// [`relay_config`] with `kafka` appended to the `[kafka]` table.
fn relay_config_with(db: &MariaDb, broker: &Broker, kafka: &str, poll: &str) -> Connector {
    let c = Connector::new();
    let text = format!(
        "[source]\nkind = \"poll\"\nhost = \"127.0.0.1\"\nport = {port}\nuser = \"relay\"\npassword = {password}\n\
         [outbox]\ntable = \"shop.outbox_events\"\n\
         [kafka]\nbootstrap_servers = {bootstrap}\ntopic = \"outbox.event.${{aggregate_type}}\"\n{kafka}\n\
         [state]\ndir = {state}\n[snapshot]\nmode = \"never\"\n{metrics}\n[poll]\n{poll}\n",
        port = db.port(),
        password = toml_str(RELAY_PASSWORD),
        bootstrap = toml_str(&broker.bootstrap()),
        state = toml_str(&c.state_dir().to_string_lossy()),
        metrics = common::connector::EPHEMERAL_METRICS,
    );
    std::fs::write(c.config_path(), text).expect("write relay config");
    c
}

async fn count(db: &MariaDb, condition: &str) -> u64 {
    let mut conn = db.conn().await;
    let n: Option<u64> =
        conn.query_first(format!("SELECT COUNT(*) FROM outbox_events WHERE {condition}")).await.expect("count rows");
    n.unwrap_or(0)
}

/// `[poll]` with the progress table of the reference schema ([`create_progress_table`]).
const PROGRESS: &str = "progress_table = \"outbox_relay_progress\"";

/// Creates the progress table as `deploy/mysql-init.sql` does, and grants `relay` what a relay with
/// `[poll] progress_table` needs: `SELECT, INSERT, UPDATE` on it, and `PROCESS`.
fn create_progress_table(db: &MariaDb) {
    db.sql(&format!(
        "{};
         GRANT SELECT, INSERT, UPDATE ON shop.outbox_relay_progress TO 'relay'@'127.0.0.1';
         GRANT PROCESS ON *.* TO 'relay'@'127.0.0.1';",
        common::mariadb::progress_ddl()
    ));
}

/// The progress table's number for the outbox table: every row up to it is published (0 without one).
async fn published_through(db: &MariaDb) -> u64 {
    let mut conn = db.conn().await;
    let through: Result<Option<u64>, _> = conn
        .query_first("SELECT published_through FROM outbox_relay_progress WHERE outbox_table = 'shop.outbox_events'")
        .await;
    through.ok().flatten().unwrap_or(0)
}

async fn max_seq(db: &MariaDb) -> u64 {
    let mut conn = db.conn().await;
    conn.query_first("SELECT COALESCE(MAX(seq), 0) FROM outbox_events").await.unwrap().unwrap_or(0)
}

/// Waits until the progress table says every row up to `seq` is published.
async fn wait_through(db: &MariaDb, seq: u64, relays: &[&Connector]) {
    let deadline = Instant::now() + CATCH_UP;
    while published_through(db).await < seq {
        if Instant::now() >= deadline {
            let logs: Vec<String> = relays.iter().map(|r| common::tail_file(&r.dir().join("stderr.log"), 60)).collect();
            panic!(
                "not published through {seq} after {CATCH_UP:?}: {}\n{}",
                published_through(db).await,
                logs.join("\n-----\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until no row is unpublished (other than parked, dead-lettered ones): no row above the progress
/// table's number (when there is one) without `published_at`.
async fn wait_all_published(db: &MariaDb, relays: &[&Connector]) {
    let deadline = Instant::now() + CATCH_UP;
    loop {
        let above = match published_through(db).await {
            0 => String::new(),
            through => format!(" AND seq > {through}"),
        };
        let left = count(db, &format!("published_at IS NULL AND next_attempt_at < '9999-01-01'{above}")).await;
        if left == 0 {
            return;
        }
        if Instant::now() >= deadline {
            let logs: Vec<String> = relays.iter().map(|r| common::tail_file(&r.dir().join("stderr.log"), 60)).collect();
            panic!("{left} rows still unpublished after {CATCH_UP:?}:\n{}", logs.join("\n-----\n"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `outbox-cdc audit` through `relay`'s config: nothing missing, nothing out of order.
fn closing_audit(relay: &Connector) -> common::AuditRun {
    let run = relay.audit(&[]);
    assert_eq!(run.code, Some(0), "audit failed: {}\n{}", run.report, run.stderr);
    assert_eq!((run.count("missing"), run.count("order_violations")), (0, 0), "{}", run.report);
    run
}

/// Inserts `n` events of each aggregate, interleaved, `occurred_at` increasing; returns the expectation.
async fn insert_interleaved(db: &MariaDb, aggregates: &[&str], n: usize) -> Expected {
    insert_interleaved_with(db, aggregates, n, |_, row| row).await
}

/// [`insert_interleaved`], each row passed through `shape` with its place in the insertion order first.
async fn insert_interleaved_with(
    db: &MariaDb,
    aggregates: &[&str],
    n: usize,
    shape: impl Fn(usize, OutboxRow) -> OutboxRow,
) -> Expected {
    let mut conn = db.conn().await;
    let mut orders: Vec<(String, Vec<String>)> = aggregates.iter().map(|a| (a.to_string(), Vec::new())).collect();
    let mut place = 0;
    for _ in 0..n {
        for (aggregate, ids) in orders.iter_mut() {
            let row = shape(place, OutboxRow::new(aggregate.as_str()));
            insert_event(&mut conn, &row).await.expect("insert event");
            ids.push(row.id);
            place += 1;
        }
    }
    Expected::from_orders(orders)
}

/// Insertion order, whatever the timestamps say and whenever the rows commit: events of one transaction
/// that share an `occurred_at` (ids chosen so that id order reverses them), an event whose writer's clock
/// is an hour behind, and a row whose transaction took its sequence number before rows the relay already
/// published and committed after them (found through the gap the read passed). The audit checks order by
/// the sequence column. Before the rebuild the relay ordered by (occurred_at, id) on this schema and
/// reversed the ties.
#[tokio::test(flavor = "multi_thread")]
async fn events_keep_insertion_order_through_ties_skew_and_late_commits() {
    let db = MariaDb::start();
    create_relay_user(&db);
    let broker = Broker::start(Engine::Memory);
    let relay = relay(&db, &broker, "poll_interval_ms = 50");
    let mut conn = db.conn().await;
    let mut late = db.conn().await;
    let mut tx = late.start_transaction(mysql_async::TxOpts::default()).await.unwrap();
    let x1 = OutboxRow::new("X").id("x-9");
    insert_event(&mut tx, &x1).await.unwrap();
    // Committed after x-9 took its number: published first, the read passing x-9's number as a gap.
    let y1 = OutboxRow::new("Y");
    insert_event(&mut conn, &y1).await.unwrap();
    let first = broker.read_all(TOPIC, 1, CATCH_UP);
    assert_eq!(first[0].header_str("id"), Some(y1.id.as_str()), "{}", relay.logs());
    // The same transaction goes on: two more events of X at x-9's very timestamp, ids sorting before it.
    let at = x1.occurred_at.clone();
    let x2 = OutboxRow::new("X").id("x-5").occurred_at(&at);
    let x3 = OutboxRow::new("X").id("x-1").occurred_at(&at);
    insert_event(&mut tx, &x2).await.unwrap();
    insert_event(&mut tx, &x3).await.unwrap();
    tx.commit().await.unwrap();
    // A writer whose clock is an hour behind.
    let skewed: Option<String> = conn
        .exec_first("SELECT DATE_FORMAT(CAST(? AS DATETIME(6)) - INTERVAL 1 HOUR, '%Y-%m-%d %H:%i:%s.%f')", (&at,))
        .await
        .unwrap();
    let x4 = OutboxRow::new("X").occurred_at(skewed.unwrap());
    insert_event(&mut conn, &x4).await.unwrap();
    let records = broker.read_all(TOPIC, 5, CATCH_UP);
    let x: Vec<&str> = records.iter().filter(|r| r.key_str() == Some("X")).filter_map(|r| r.header_str("id")).collect();
    assert_eq!(x, ["x-9", "x-5", "x-1", x4.id.as_str()], "{}", relay.logs());
    wait_all_published(&db, &[&relay]).await;
    let run = closing_audit(&relay);
    assert_eq!(run.count("duplicates"), 0, "{}", run.report);
}

/// The value of one sample line `name{labels} value` in a metrics page.
fn sample(page: &str, series: &str) -> Option<f64> {
    page.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// A relay process's `/metrics` while rows flow: the binlog source's event counters where they apply, and
/// the relay's own: rows read and published, a parked row holding its aggregate (so its follower shows as
/// backlog, waiting longer and longer), read and mark statements, idle polls while nothing is due.
/// Regression guard: the relay exposed none of its own counters.
#[tokio::test(flavor = "multi_thread")]
async fn a_relays_metrics_count_queries_rows_and_backlog() {
    let db = MariaDb::start();
    create_relay_user(&db);
    let broker = Broker::start(Engine::Memory);
    let mut conn = db.conn().await;
    // A poison row (invalid headers), then rows of three aggregates.
    insert_event(&mut conn, &OutboxRow::new("P").headers(Some(serde_json::json!([1])))).await.unwrap();
    let expected = insert_interleaved(&db, &["A", "B", "C"], 10).await;

    let port = free_port();
    let mut relay = relay_config(&db, &broker, "poll_interval_ms = 50");
    let config = std::fs::read_to_string(relay.config_path()).unwrap();
    let config = config.replace(
        common::connector::EPHEMERAL_METRICS,
        &format!("\n[metrics]\nlisten = \"127.0.0.1:{port}\"\n{}", common::connector::EPHEMERAL_CONTROL),
    );
    std::fs::write(relay.config_path(), config).unwrap();
    relay.run(&relay.config_path());
    let records = broker.read_all(TOPIC, expected.len(), CATCH_UP);
    let report = audit(&expected, &records);
    assert!(report.is_clean(), "{}\n{}", report.summary(), relay.logs());
    wait_all_published(&db, &[&relay]).await;
    insert_event(&mut conn, &OutboxRow::new("P")).await.unwrap();

    let page = || common::scrape(port).unwrap_or_default();
    let value = |page: &str, series: &str| sample(page, series).unwrap_or(-1.0);
    // The backlog is counted every 10 s while rows are held: wait for a count that sees P's follower.
    assert!(
        wait_until(Duration::from_secs(30), || {
            let p = page();
            value(&p, "outbox_cdc_poll_backlog_rows") == 1.0 && value(&p, "outbox_cdc_poll_oldest_due_seconds") > 0.0
        }),
        "the held row never showed as backlog:\n{}\n{}",
        page(),
        relay.logs()
    );
    let first = page();
    for (series, want) in [
        ("outbox_cdc_poll_rows_claimed_total", 31.0),
        ("outbox_cdc_poll_rows_published_total", 30.0),
        ("outbox_cdc_poll_rows_parked_total", 1.0),
        ("outbox_cdc_poll_rows_failed_total", 0.0),
        ("outbox_cdc_events_acknowledged_total{topic=\"outbox.event.order\"}", 30.0),
        ("outbox_cdc_events_read_total{topic=\"outbox.event.order\"}", 30.0),
        ("outbox_cdc_end_to_end_latency_seconds_count{aggregate_type=\"order\"}", 30.0),
        ("outbox_cdc_records_in_flight", 0.0),
        ("outbox_cdc_quarantined_aggregates", 1.0),
        ("outbox_cdc_dead_letters_total{kind=\"invalid_headers\"}", 1.0),
    ] {
        assert_eq!(value(&first, series), want, "{series}:\n{first}");
    }
    for kind in ["claim", "mark", "park", "backlog"] {
        let series = format!("outbox_cdc_poll_queries_total{{kind=\"{kind}\"}}");
        assert!(value(&first, &series) >= 1.0, "{series}:\n{first}");
    }
    // Idle: one read per poll, and the idle polls count (five of them, however long the machine takes).
    let idle = |page: &str| value(page, "outbox_cdc_poll_idle_polls_total");
    let mut second = page();
    assert!(
        wait_until(CATCH_UP, || {
            second = page();
            idle(&second) - idle(&first) >= 5.0
        }),
        "{first}\n-----\n{second}"
    );
    let grew = |series: &str| value(&second, series) - value(&first, series);
    assert!(
        grew("outbox_cdc_poll_queries_total{kind=\"claim\"}") <= grew("outbox_cdc_poll_idle_polls_total") + 1.0,
        "{first}\n-----\n{second}"
    );
    assert_eq!(grew("outbox_cdc_poll_queries_total{kind=\"mark\"}"), 0.0);
    assert!(relay.terminate().success(), "{}", relay.logs());
}

/// One relay publishes every row in order and marks it published, writing nothing else; `check` passes for
/// a user with `SELECT, UPDATE` on the table and no binlog privilege.
#[tokio::test(flavor = "multi_thread")]
async fn a_relay_publishes_marks_and_passes_check() {
    let db = MariaDb::start();
    create_relay_user(&db);
    let broker = Broker::start(Engine::Memory);
    let relay = relay(&db, &broker, "poll_interval_ms = 50");
    let expected = insert_interleaved(&db, &["A", "B", "C"], 20).await;
    let records = broker.read_all(TOPIC, expected.len(), CATCH_UP);
    let report = audit(&expected, &records);
    assert!(report.is_clean() && report.duplicates == 0, "{}\n{}", report.summary(), relay.logs());
    wait_all_published(&db, &[&relay]).await;
    assert_eq!(count(&db, "attempts > 0 OR last_error IS NOT NULL").await, 0);
    let (status, stdout, stderr) = relay.command(&["check"], Duration::from_secs(60)).expect("check runs");
    assert!(status.success(), "check failed:\n{stdout}\n{stderr}");
    for line in ["read index", "event order", "by `seq`", "privilege UPDATE on shop.outbox_events", "all checks passed"]
    {
        assert!(stdout.contains(line), "{line} not in:\n{stdout}");
    }
    closing_audit(&relay);
}

/// The relay's reads go along the unpublished index from the cursor, stepping over no row below it: with
/// 2,000 rows held behind parked ones at the start of the table and reads of 50 rows, the server's
/// index-condition checks that failed (`Handler_icp_attempts - Handler_icp_match`) stay near zero (0
/// measured). Left to the optimizer, MariaDB read `published_at IS NULL` from its first entry and
/// filtered `seq > cursor` row by row: every read stepped over the held rows again (99,160 failed checks
/// here without the index named), and reading a 1M-row backlog cost the server 26 s of CPU instead of 3.
#[tokio::test(flavor = "multi_thread")]
async fn reads_step_over_no_held_row() {
    let db = MariaDb::start();
    create_relay_user(&db);
    let broker = Broker::start(Engine::Memory);
    db.sql(
        "USE shop;
         INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, schema_version, payload,
           occurred_at, next_attempt_at, last_error)
         SELECT UUID(), 'held', CONCAT('held-', s.seq), 'Created', 1, JSON_OBJECT('n', s.seq), UTC_TIMESTAMP(6),
           '9999-12-31 23:59:59', 'dead-lettered: test' FROM seq_0_to_19 s;
         INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, schema_version, payload,
           occurred_at, next_attempt_at)
         SELECT UUID(), 'held', CONCAT('held-', s.seq % 20), 'Created', 1, JSON_OBJECT('n', s.seq), UTC_TIMESTAMP(6),
           UTC_TIMESTAMP(6) FROM seq_1_to_2000 s;
         INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, schema_version, payload,
           occurred_at, next_attempt_at)
         SELECT UUID(), 'order', CONCAT('order-', s.seq % 10), 'Created', 1, JSON_OBJECT('n', s.seq),
           UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) FROM seq_1_to_1500 s;",
    );
    let icp = || async {
        let mut conn = db.conn().await;
        let rows: Vec<(String, u64)> = conn
            .query("SHOW GLOBAL STATUS WHERE Variable_name IN ('Handler_icp_attempts', 'Handler_icp_match')")
            .await
            .expect("read the index-condition counters");
        let value = |name: &str| rows.iter().find(|(n, _)| n == name).map_or(0, |(_, v)| *v);
        value("Handler_icp_attempts") - value("Handler_icp_match")
    };
    let failed_before = icp().await;
    let relay = relay(&db, &broker, "poll_interval_ms = 50\nbatch_rows = 50");
    let deadline = Instant::now() + CATCH_UP;
    while count(&db, "published_at IS NULL AND aggregate_type = 'order'").await > 0 {
        assert!(Instant::now() < deadline, "the order rows were not all published:\n{}", relay.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let failed = icp().await - failed_before;
    assert!(failed < 2_000, "{failed} index-condition checks failed: the reads stepped over held rows");
    assert_eq!(broker.read_all(TOPIC, 1_500, CATCH_UP).len(), 1_500);
    assert_eq!(count(&db, "published_at IS NULL AND aggregate_type = 'held'").await, 2_020, "held rows stay");
}

/// `[poll] order = "occurred_at"` on a table without a sequence column: the relay finds the index on
/// `(published_at, occurred_at, id)` under whatever name and reads along it in reads of 7 rows. The rows
/// come in groups of 5 sharing one `occurred_at` (a multi-row insert on a millisecond clock), so most reads
/// end inside a tie and the next one resumes by id (`occurred_at > ? OR (occurred_at = ? AND id > ?)`);
/// ids sort in insertion order, so `(occurred_at, id)` order is insertion order, and every row is
/// published once, in that order.
#[tokio::test(flavor = "multi_thread")]
async fn occurred_at_order_reads_along_its_index() {
    let db = MariaDb::start();
    create_relay_user(&db);
    let broker = Broker::start(Engine::Memory);
    db.sql(
        "ALTER TABLE shop.outbox_events DROP COLUMN seq, DROP INDEX idx_unpublished, \
         ADD INDEX by_occurred_at (published_at, occurred_at, id)",
    );
    let expected = insert_interleaved_with(&db, &["A", "B", "C"], 20, |n, row| {
        row.id(format!("e{n:03}")).occurred_at(format!("2026-01-01 00:00:{:02}.000000", n / 5))
    })
    .await;
    let relay = relay(&db, &broker, "order = \"occurred_at\"\npoll_interval_ms = 50\nbatch_rows = 7");
    let records = broker.read_all(TOPIC, expected.len(), CATCH_UP);
    let report = audit(&expected, &records);
    assert!(report.is_clean() && report.duplicates == 0, "{}\n{}", report.summary(), relay.logs());
    wait_all_published(&db, &[&relay]).await;
    closing_audit(&relay);
}

/// A row whose `next_attempt_at` a writer set with `NOW(6)` in a session five hours ahead of UTC (the
/// README's example INSERT, run from another time zone) is published at once: the relay compares no time a
/// writer wrote. Before the rebuild it was not due for five hours, and invisible in the backlog metric.
#[tokio::test(flavor = "multi_thread")]
async fn a_writer_in_another_time_zone_is_published_at_once() {
    let db = MariaDb::start();
    create_relay_user(&db);
    let broker = Broker::start(Engine::Memory);
    let relay = relay(&db, &broker, "poll_interval_ms = 50");
    let mut conn = db.conn().await;
    conn.query_drop("SET time_zone = '+05:00'").await.unwrap();
    conn.exec_drop(
        "INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, schema_version, payload, \
         occurred_at, next_attempt_at) VALUES ('tz-1', 'order', 'T', 'OrderCreated', 1, '{}', UTC_TIMESTAMP(6), NOW(6))",
        (),
    )
    .await
    .unwrap();
    let records = broker.read_all(TOPIC, 1, Duration::from_secs(30));
    assert_eq!(records.first().and_then(|r| r.header_str("id")), Some("tz-1"), "{}", relay.logs());
}

/// `check` refuses a user without `UPDATE`; `check` and the relay both refuse a table without the read
/// index (every read would scan the table), a `TIMESTAMP` `next_attempt_at` (it cannot hold the
/// parked date: strict mode refused every parking, others stored a zero date that was due at once) and a
/// table without a sequence column, each with the `ALTER TABLE` that fixes it; `[poll] order =
/// "occurred_at"` is the explicit way out of the second.
#[tokio::test(flavor = "multi_thread")]
async fn check_refuses_a_table_the_relay_cannot_use() {
    let db = MariaDb::start();
    create_relay_user(&db);
    let broker = Broker::start(Engine::Memory);
    db.sql("ALTER TABLE shop.outbox_events DROP INDEX idx_unpublished; REVOKE UPDATE ON shop.outbox_events FROM 'relay'@'127.0.0.1';");
    let mut relay = relay(&db, &broker, "");
    relay.kill();
    let (status, stdout, _) = relay.command(&["check"], Duration::from_secs(60)).expect("check runs");
    assert_eq!(status.code(), Some(2), "{stdout}");
    assert!(
        stdout.contains("ALTER TABLE `shop`.`outbox_events` ADD INDEX idx_unpublished (`published_at`, `seq`)"),
        "{stdout}"
    );
    assert!(stdout.contains("GRANT SELECT, UPDATE ON shop.outbox_events"), "{stdout}");
    db.sql("GRANT UPDATE ON shop.outbox_events TO 'relay'@'127.0.0.1'; ALTER TABLE shop.outbox_events ADD INDEX idx_unpublished (published_at, seq);");

    let refused_by_both = |relay: &mut Connector, needles: &[&str]| {
        let (status, stdout, _) = relay.command(&["check"], Duration::from_secs(60)).expect("check runs");
        assert_eq!(status.code(), Some(2), "{stdout}");
        for needle in needles {
            assert!(stdout.contains(needle), "{needle} not in:\n{stdout}");
        }
        relay.restart();
        let status = relay.wait_exit(Duration::from_secs(60)).expect("the relay stops on a table it cannot use");
        assert_eq!(status.code(), Some(2), "{}", relay.logs());
        for needle in needles {
            assert!(relay.stderr().contains(needle), "{needle} not in:\n{}", relay.logs());
        }
    };
    db.sql("ALTER TABLE shop.outbox_events DROP INDEX idx_unpublished");
    refused_by_both(
        &mut relay,
        &["ALTER TABLE `shop`.`outbox_events` ADD INDEX idx_unpublished (`published_at`, `seq`), ALGORITHM=INPLACE"],
    );
    db.sql("ALTER TABLE shop.outbox_events ADD INDEX idx_unpublished (published_at, seq)");
    db.sql("ALTER TABLE shop.outbox_events MODIFY next_attempt_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6);");
    refused_by_both(
        &mut relay,
        &[
            "next_attempt_at is timestamp",
            "MODIFY COLUMN `next_attempt_at` DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)",
        ],
    );
    db.sql("ALTER TABLE shop.outbox_events MODIFY next_attempt_at DATETIME(6) NOT NULL; ALTER TABLE shop.outbox_events DROP COLUMN seq;");
    refused_by_both(
        &mut relay,
        &[
            "has no AUTO_INCREMENT column",
            "ADD COLUMN `seq` BIGINT UNSIGNED NOT NULL AUTO_INCREMENT UNIQUE",
            "order = \"occurred_at\"",
        ],
    );
    let config = std::fs::read_to_string(relay.config_path()).unwrap();
    std::fs::write(relay.config_path(), config.replace("[poll]\n", "[poll]\norder = \"occurred_at\"\n")).unwrap();
    let (_, stdout, _) = relay.command(&["check"], Duration::from_secs(60)).expect("check runs");
    assert!(stdout.contains("by `occurred_at`, then `id`"), "{stdout}");
}

/// Four relay processes on one table under a concurrent workload with small batches: one publishes (the
/// holder of the lease), three stand by; every event published once, each aggregate's events in order.
#[tokio::test(flavor = "multi_thread")]
async fn four_relays_keep_per_aggregate_order() {
    let db = MariaDb::start();
    create_relay_user(&db);
    let broker = Broker::start(Engine::Memory);
    let relays: Vec<Connector> = (0..4).map(|_| relay(&db, &broker, "batch_rows = 7\npoll_interval_ms = 20")).collect();
    let writer = Writer::start(
        db.opts_root(),
        WriterConfig { tasks: 4, aggregates_per_task: 4, max_events: 1200, ..WriterConfig::default() },
    );
    let written = writer.join().await;
    assert!(written.errors.is_empty(), "{:?}", written.errors);
    let refs: Vec<&Connector> = relays.iter().collect();
    wait_all_published(&db, &refs).await;
    let records = broker.read_all(TOPIC, written.len(), CATCH_UP);
    let report = audit(&written.expected, &records);
    assert!(report.is_clean(), "{}", report.summary());
    assert_eq!(report.duplicates, 0, "{}", report.summary());
    let active = relays.iter().filter(|r| r.stderr().contains("polling the outbox table")).count();
    let standing_by = relays.iter().filter(|r| r.stderr().contains("standby: waiting for the lease")).count();
    assert_eq!((active, standing_by), (1, 3));
    closing_audit(&relays[0]);
}

/// Relays SIGKILLed and restarted under load (4 relays, one kill every ~400 ms, 8 kills; 20 in the full
/// run): a standby takes over each killed active relay (its lock goes with its socket); nothing lost,
/// order kept; duplicates only of rows that were published and not yet marked, which a kill of the active
/// relay leaves at most the batches in flight of.
#[tokio::test(flavor = "multi_thread")]
async fn killed_relays_lose_nothing_and_keep_order() {
    killed_relays(false).await;
}

/// [`killed_relays_lose_nothing_and_keep_order`] with a progress table: the writers' concurrent
/// transactions commit out of sequence order all the time, so reads pass numbers taken and not yet
/// committed; the frontier waits for each, and a kill loses none.
#[tokio::test(flavor = "multi_thread")]
async fn killed_relays_with_a_progress_table_lose_nothing_and_keep_order() {
    killed_relays(true).await;
}

async fn killed_relays(progress: bool) {
    let db = MariaDb::start();
    create_relay_user(&db);
    if progress {
        create_progress_table(&db);
    }
    let broker = Broker::start(Engine::Memory);
    let batch = 10;
    let poll = format!("batch_rows = {batch}\npoll_interval_ms = 20\n{}", if progress { PROGRESS } else { "" });
    let mut relays: Vec<Connector> = (0..4).map(|_| relay(&db, &broker, &poll)).collect();
    let writer = Writer::start(
        db.opts_root(),
        WriterConfig {
            tasks: 4,
            aggregates_per_task: 8,
            max_events: 100_000,
            pause: Duration::from_millis(3),
            ..WriterConfig::default()
        },
    );
    // 20 kills, the scenario, with OUTBOX_CDC_SCENARIO_FULL=1.
    let kills = common::reliability::scaled(8, 20);
    for k in 0..kills {
        tokio::time::sleep(Duration::from_millis(400)).await;
        let r = &mut relays[k % 4];
        r.kill();
        r.restart();
    }
    let written = writer.finish().await;
    assert!(written.errors.is_empty(), "{:?}", written.errors);
    let refs: Vec<&Connector> = relays.iter().collect();
    wait_all_published(&db, &refs).await;
    let records = broker.read_all(TOPIC, written.len(), CATCH_UP);
    let report = audit(&written.expected, &records);
    assert!(report.is_clean(), "{}", report.summary());
    let in_flight = 32 * batch; // relay::run's MAX_PENDING_BATCHES batches
    assert!(report.duplicates <= kills * in_flight, "{} duplicates for {kills} kills", report.duplicates);
    let run = closing_audit(&relays[0]);
    let (scenario, how) = match progress {
        false => ("polling relay: kill -9 of relays under load", "rows marked one by one"),
        true => ("polling relay with a progress table: kill -9 of relays under load", "a progress table"),
    };
    let note = format!("4 relays (one active, batch_rows {batch}, {how}), {kills} SIGKILLs 400 ms apart under load");
    common::reliability::record(scenario, &written, &run, None, &note);
}

/// A relay killed after Kafka acknowledged its batch and before it marked the rows (failpoint
/// `poll_batch_acked`) leaves them unpublished; the next run publishes them again, in order, with the same
/// ids: the duplicates are exactly that batch.
#[tokio::test(flavor = "multi_thread")]
async fn a_crash_between_publish_and_mark_republishes_the_batch() {
    let db = MariaDb::start();
    create_relay_user(&db);
    let broker = Broker::start(Engine::Memory);
    let expected = insert_interleaved(&db, &["A", "B"], 5).await;
    let mut relay = relay_config(&db, &broker, "poll_interval_ms = 50");
    relay.env("OUTBOX_CDC_FAILPOINT", "poll_batch_acked:1");
    relay.run(&relay.config_path());
    let exited = relay.wait_exit(Duration::from_secs(60)).expect("the failpoint must end the process");
    assert!(!exited.success(), "{}", relay.logs());
    let first = broker.read_all(TOPIC, expected.len(), CATCH_UP);
    assert_eq!(first.len(), expected.len(), "the batch was acknowledged before the crash");
    assert_eq!(count(&db, "published_at IS NULL").await, expected.len() as u64);
    relay.remove_env("OUTBOX_CDC_FAILPOINT");
    relay.restart();
    wait_all_published(&db, &[&relay]).await;
    let records = broker.read_all(TOPIC, 2 * expected.len(), CATCH_UP);
    let report = audit(&expected, &records);
    assert!(report.is_clean(), "{}", report.summary());
    assert_eq!(report.duplicates, expected.len(), "exactly the unmarked batch again");
    closing_audit(&relay);
}

/// MariaDB crashes (SIGKILL) under load with two relays running and comes back after 2 s: the relays
/// reconnect by themselves, and nothing committed is lost or reordered (a batch whose mark was lost with the
/// crash is published again by the next run).
#[tokio::test(flavor = "multi_thread")]
async fn database_crash_and_restart() {
    database_crash(false).await;
}

/// [`database_crash_and_restart`] with a progress table: the crash rolls back the transactions that held
/// gaps open, and their connections come back with new ids; the number passes no row lost with them.
#[tokio::test(flavor = "multi_thread")]
async fn database_crash_and_restart_with_a_progress_table() {
    database_crash(true).await;
}

async fn database_crash(progress: bool) {
    let mut db = MariaDb::start();
    create_relay_user(&db);
    if progress {
        create_progress_table(&db);
    }
    let broker = Broker::start(Engine::Memory);
    let poll = format!("batch_rows = 20\npoll_interval_ms = 20\n{}", if progress { PROGRESS } else { "" });
    let mut relays: Vec<Connector> = (0..2).map(|_| relay(&db, &broker, &poll)).collect();
    let writer = Writer::start(
        db.opts_root(),
        WriterConfig {
            tasks: 2,
            aggregates_per_task: 8,
            max_events: 100_000,
            pause: Duration::from_millis(5),
            ..WriterConfig::default()
        },
    );
    assert!(writer.wait_committed(150, CATCH_UP).await);
    db.kill();
    tokio::time::sleep(Duration::from_secs(2)).await;
    db.start_again();
    let at_restart = writer.committed();
    assert!(writer.wait_committed(at_restart + 150, CATCH_UP).await, "the workload must resume");
    let mut written = writer.finish().await;
    written.resolve_uncertain(&mut db.conn().await).await.unwrap();
    let refs: Vec<&Connector> = relays.iter().collect();
    wait_all_published(&db, &refs).await;
    let records = broker.read_all(TOPIC, written.len(), CATCH_UP);
    let report = audit(&written.expected, &records);
    assert!(report.is_clean(), "{}", report.summary());
    for r in relays.iter_mut() {
        assert!(r.is_running(), "a relay exited:\n{}", r.logs());
    }
    let run = closing_audit(&relays[0]);
    let (scenario, how) = match progress {
        false => ("polling relay: MariaDB killed and restarted", "rows marked one by one"),
        true => ("polling relay with a progress table: MariaDB killed and restarted", "a progress table"),
    };
    let note = format!("2 relays (one active, {how}); MariaDB SIGKILLed under load, started again after 2 s");
    common::reliability::record(scenario, &written, &run, None, &note);
}

/// The active relay is paused (SIGSTOP) under load past the failover timeout: a standby takes over, and
/// when the paused one resumes it finds its lease gone and stands by; nothing is lost. Not asserted: the
/// order of the paused relay's last records, which it had handed to its producer and can send when it
/// resumes, after its successor's (the gap `poll.transactional` closes: the test below; a producer that
/// gave up on records instead reordered events whenever a delivery was slow, seen under load in this test).
#[tokio::test(flavor = "multi_thread")]
async fn a_paused_relay_stands_by_and_loses_nothing() {
    paused_relay_wakes_up(Engine::Memory, "").await;
}

/// [`a_paused_relay_stands_by_and_loses_nothing`] with a progress table: the paused relay's marker may
/// write the number after its successor wrote a higher one; the number only grows (`GREATEST`), so
/// nothing the successor published is read again and nothing it did not is passed.
#[tokio::test(flavor = "multi_thread")]
async fn a_paused_relay_with_a_progress_table_stands_by_and_loses_nothing() {
    paused_relay_wakes_up(Engine::Memory, PROGRESS).await;
}

/// The same with `poll.transactional = true`, on noida-db (the broker here with transactions): the relay
/// that takes over fences the paused one's producer, so when it resumes nothing it had handed over lands
/// after its successor's records. Asserted: 0 missing, 0 order violations, and every aggregate's last
/// record is its last event, read `read_committed` after the paused relay resumed. The paused relay's
/// producer lingers 500 ms so that it is caught holding records; without the option the same run ends with
/// aggregates on a stale last record (the paused relay's late duplicates).
#[tokio::test(flavor = "multi_thread")]
async fn a_paused_transactional_relay_is_fenced_and_keeps_order() {
    paused_relay_wakes_up(Engine::Noida, "transactional = true").await;
}

/// Two relays with `poll`, the active one SIGSTOPped under load past `failover_timeout_ms`, resumed once
/// its successor published everything; `transactional` relays are held to order and to their last records.
async fn paused_relay_wakes_up(engine: Engine, poll: &str) {
    let transactional = poll.contains("transactional = true");
    let progress = poll.contains(PROGRESS);
    let db = MariaDb::start();
    create_relay_user(&db);
    if progress {
        create_progress_table(&db);
    }
    let broker = Broker::start(engine);
    let start = |db: &MariaDb| {
        let kafka = if transactional { "properties = { \"linger.ms\" = \"500\" }" } else { "" };
        let mut c = relay_config_with(db, &broker, kafka, &format!("batch_rows = 50\npoll_interval_ms = 20\n{poll}"));
        let text = std::fs::read_to_string(c.config_path()).unwrap();
        std::fs::write(c.config_path(), format!("{text}\n[delivery]\nfailover_timeout_ms = 3000\n")).unwrap();
        c.run(&c.config_path());
        c
    };
    let first = start(&db);
    assert!(
        wait_until(Duration::from_secs(30), || first.stderr().contains("polling the outbox table")),
        "{}",
        first.logs()
    );
    let second = start(&db);
    let writer = Writer::start(
        db.opts_root(),
        WriterConfig {
            tasks: 4,
            aggregates_per_task: 4,
            max_events: 100_000,
            pause: Duration::from_millis(5),
            ..WriterConfig::default()
        },
    );
    assert!(writer.wait_committed(200, CATCH_UP).await);
    let pid = first.pid().expect("running") as i32;
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let stopped = Instant::now();
    assert!(
        wait_until(Duration::from_secs(30), || second.stderr().contains("polling the outbox table")),
        "the standby never took over:\n{}",
        second.logs()
    );
    let took_over = stopped.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    if transactional {
        // The successor publishes everything first: a record the paused relay sends when it resumes can
        // only land after all of its successor's, where a consumer would end on it.
        let written = writer.finish().await;
        wait_all_published(&db, &[&second]).await;
        unsafe { libc::kill(pid, libc::SIGCONT) };
        assert!(
            wait_until(Duration::from_secs(30), || first.stderr().contains("lease lost")),
            "the paused relay never noticed:\n{}",
            first.logs()
        );
        tokio::time::sleep(Duration::from_secs(3)).await;
        let records = broker.read_committed(TOPIC, written.len(), CATCH_UP);
        let report = audit(&written.expected, &records);
        assert!(report.is_clean() && report.stale_tails.is_empty(), "{}", report.summary());
        let run = closing_audit(&second);
        let note = format!(
            "2 relays with poll.transactional (noida-db, failover_timeout_ms 3000, linger.ms 500); the active \
             SIGSTOPped under load, the standby active {:.1} s later and publishing everything, then SIGCONT: the \
             old producer is fenced; order and every aggregate's last record checked read_committed",
            took_over.as_secs_f64()
        );
        common::reliability::record(
            "polling relay, transactional: paused relay is fenced",
            &written,
            &run,
            None,
            &note,
        );
        return;
    }
    unsafe { libc::kill(pid, libc::SIGCONT) };
    tokio::time::sleep(Duration::from_secs(3)).await;
    let written = writer.finish().await;
    assert!(written.errors.is_empty(), "{:?}", written.errors);
    wait_all_published(&db, &[&first, &second]).await;
    assert!(
        wait_until(CATCH_UP, || first.stderr().contains("lease lost")),
        "the paused relay never noticed:\n{}",
        first.logs()
    );
    let records = broker.read_all(TOPIC, written.len(), CATCH_UP);
    let report = audit(&written.expected, &records);
    assert!(report.missing.is_empty() && report.split_aggregates.is_empty(), "{}", report.summary());
    let run = second.audit(&[]);
    assert_eq!(run.count("missing"), 0, "{}\n{}", run.report, run.stderr);
    let (scenario, how) = match progress {
        false => ("polling relay: paused relay wakes up after the takeover", ""),
        true => ("polling relay with a progress table: paused relay wakes up after the takeover", ", a progress table"),
    };
    let note = format!(
        "2 relays (failover_timeout_ms 3000{how}); the active SIGSTOPped under load, the standby active {:.1} s \
         later, SIGCONT 2 s after that: the old holder stands by; order not asserted (known gap without \
         poll.transactional)",
        took_over.as_secs_f64()
    );
    common::reliability::record(scenario, &written, &run, None, &note);
}

/// The broker goes away under load and comes back, and the relay is restarted twice while it is away:
/// nothing is marked published meanwhile, nothing is dead-lettered or counted against a row (before the
/// rebuild each failure, the topic-metadata timeout of every new run among them, added an attempt to every
/// row of the batch, and rows reached `max_attempts` and were dead-lettered as `rejected_by_broker`), and
/// everything arrives in order afterwards.
#[tokio::test(flavor = "multi_thread")]
async fn broker_down_then_up() {
    broker_down(false).await;
}

/// [`broker_down_then_up`] with a progress table: the number does not move while the broker is away.
#[tokio::test(flavor = "multi_thread")]
async fn broker_down_then_up_with_a_progress_table() {
    broker_down(true).await;
}

/// The rows published: marked, or (with a progress table) up to its number.
async fn published_rows(db: &MariaDb) -> u64 {
    count(db, &format!("published_at IS NOT NULL OR seq <= {}", published_through(db).await)).await
}

async fn broker_down(progress: bool) {
    let db = MariaDb::start();
    create_relay_user(&db);
    if progress {
        create_progress_table(&db);
    }
    let mut broker = Broker::start(Engine::Sqlite);
    broker.create_topic(TOPIC, 4);
    let poll = format!("poll_interval_ms = 50\nmax_attempts = 2\n{}", if progress { PROGRESS } else { "" });
    let mut relay = relay(&db, &broker, &poll);
    let writer = Writer::start(
        db.opts_root(),
        WriterConfig {
            tasks: 2,
            aggregates_per_task: 8,
            max_events: 100_000,
            pause: Duration::from_millis(10),
            ..WriterConfig::default()
        },
    );
    assert!(writer.wait_committed(100, CATCH_UP).await);
    // Rows keep coming: wait for progress, not for an empty backlog.
    let deadline = Instant::now() + CATCH_UP;
    while published_rows(&db).await < 100 {
        assert!(Instant::now() < deadline, "nothing published before the outage:\n{}", relay.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    broker.stop();
    let published_before = published_rows(&db).await;
    let outage = Duration::from_secs(common::reliability::scaled(20, 60));
    for _ in 0..2 {
        tokio::time::sleep(outage / 3).await;
        relay.kill();
        relay.restart();
    }
    tokio::time::sleep(outage / 3).await;
    assert_eq!(published_rows(&db).await, published_before, "marked while the broker was down");
    assert!(relay.is_running(), "{}", relay.logs());
    broker.start_again();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let written = writer.finish().await;
    assert!(written.errors.is_empty(), "{:?}", written.errors);
    wait_all_published(&db, &[&relay]).await;
    let records = broker.read_all(TOPIC, written.len(), CATCH_UP);
    let report = audit(&written.expected, &records);
    assert!(report.is_clean(), "{}", report.summary());
    assert_eq!(count(&db, "attempts > 0 OR next_attempt_at > '9999-01-01'").await, 0, "counted or parked");
    assert!(broker.read_all(DLQ, 1, Duration::from_secs(3)).is_empty(), "dead letters from an outage");
    let run = closing_audit(&relay);
    let (scenario, how) = match progress {
        false => ("polling relay: broker down", "rows marked one by one"),
        true => ("polling relay with a progress table: broker down", "a progress table"),
    };
    let note = format!(
        "one relay ({how}), broker (durable SQLite engine) stopped for {outage:?} under load, the relay killed \
         and restarted twice meanwhile: 0 dead letters, 0 attempts counted"
    );
    common::reliability::record(scenario, &written, &run, None, &note);
}

/// Two poison rows (invalid headers) go to the dead-letter topic, are parked (their reason cut to a short
/// `last_error`) and hold their aggregates:
/// the rows behind them stay unpublished in the table, however often the relay reads, while other
/// aggregates flow; `quarantine list` and `status` show the holds. `prune` deletes published rows by
/// `published_at` only: never an unpublished one, never one of a held aggregate. `quarantine release` lets
/// the held aggregate flow again, in order. The audit finds missing exactly the events of held aggregates
/// that were not published, and nothing out of order.
#[tokio::test(flavor = "multi_thread")]
async fn poison_rows_hold_their_aggregate_until_release_and_prune_goes_by_published_at() {
    let db = MariaDb::start();
    create_relay_user(&db);
    // A `last_error` shorter than the reasons the relay writes: cut to it (in strict mode, which refuses an
    // over-long value, parking failed for ever before).
    db.sql("ALTER TABLE shop.outbox_events MODIFY last_error VARCHAR(40) NULL;");
    db.sql("CREATE USER 'pruner'@'127.0.0.1' IDENTIFIED BY 'p'; GRANT SELECT, DELETE ON shop.outbox_events TO 'pruner'@'127.0.0.1';");
    let broker = Broker::start(Engine::Memory);
    let mut conn = db.conn().await;
    let mut ids = std::collections::HashMap::new();
    for (name, aggregate, headers) in [
        ("a1", "A", None),
        ("a2", "A", Some(serde_json::json!([1, 2]))),
        ("a3", "A", None),
        ("b1", "B", None),
        ("c1", "C", Some(serde_json::json!("x"))),
        ("c2", "C", None),
        ("b2", "B", None),
    ] {
        let row = OutboxRow::new(aggregate).headers(headers);
        insert_event(&mut conn, &row).await.unwrap();
        ids.insert(name, row.id);
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let relay = relay(&db, &broker, "poll_interval_ms = 50");
    // The poison rows are dead-lettered and parked, holding A and C; the rows behind them stay in the table.
    let dead = broker.read_all(DLQ, 2, CATCH_UP);
    let mut got: Vec<(&str, &str)> = dead
        .iter()
        .map(|r| (r.header_str("id").unwrap_or("?"), r.header_str("dead_letter_kind").unwrap_or("?")))
        .collect();
    let mut want: Vec<(&str, &str)> = vec![(&ids["a2"], "invalid_headers"), (&ids["c1"], "invalid_headers")];
    got.sort();
    want.sort();
    assert_eq!(got, want, "{}", relay.logs());
    let normal = broker.read_all(TOPIC, 3, CATCH_UP);
    let expected =
        Expected::from_orders([("A", vec![ids["a1"].clone()]), ("B", vec![ids["b1"].clone(), ids["b2"].clone()])]);
    let report = audit(&expected, &normal);
    assert!(report.is_clean() && normal.len() == 3, "{}\n{:?}", report.summary(), normal.len());
    // A row written behind a parked one waits, however often the relay polls.
    let a4 = OutboxRow::new("A");
    insert_event(&mut conn, &a4).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let unpublished: Vec<String> =
        conn.query("SELECT id FROM outbox_events WHERE published_at IS NULL ORDER BY id").await.unwrap();
    let mut want = vec![ids["a2"].clone(), ids["a3"].clone(), ids["c1"].clone(), ids["c2"].clone(), a4.id.clone()];
    want.sort();
    assert_eq!(unpublished, want);
    let parked: Vec<(String, String)> =
        conn.query("SELECT id, last_error FROM outbox_events WHERE next_attempt_at > '9999-01-01'").await.unwrap();
    assert_eq!(parked.len(), 2, "{parked:?}");
    assert!(parked.iter().all(|(_, e)| e.starts_with("dead-lettered: ")), "{parked:?}");
    let (status, stdout, stderr) = relay.command(&["quarantine", "list", "--json"], Duration::from_secs(30)).unwrap();
    assert!(status.success(), "{stdout}\n{stderr}");
    let holds: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let mut held: Vec<&str> = holds.as_array().unwrap().iter().filter_map(|h| h["aggregate_id"].as_str()).collect();
    held.sort();
    assert_eq!(held, ["A", "C"], "{stdout}");
    // `status` asks the table (the relay keeps no position): a3, c2 and a4 wait behind the parked rows.
    let (status, stdout, stderr) = relay.command(&["status", "--json"], Duration::from_secs(30)).unwrap();
    assert!(status.success(), "{stdout}\n{stderr}");
    let shown: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let table = &shown["tables"][0];
    assert_eq!(
        (shown["source"].as_str(), table["table"].as_str(), table["due_rows"].as_u64(), table["parked_rows"].as_u64()),
        (Some("poll"), Some("shop.outbox_events"), Some(3), Some(2)),
        "{stdout}"
    );
    assert_eq!(shown["holds"].as_array().map(Vec::len), Some(2), "{stdout}");
    let (status, stdout, _) = relay.command(&["status"], Duration::from_secs(30)).unwrap();
    for line in ["shop.outbox_events: 3 row(s) due, the oldest due", "; 2 parked", "2 aggregate(s) held"] {
        assert!(status.success() && stdout.contains(line), "{line} not in:\n{stdout}");
    }

    // Prune: every row "published" two days ago, then one day's retention.
    conn.query_drop(
        "UPDATE outbox_events SET published_at = UTC_TIMESTAMP(6) - INTERVAL 2 DAY WHERE published_at IS NOT NULL",
    )
    .await
    .unwrap();
    let config = std::fs::read_to_string(relay.config_path()).unwrap();
    std::fs::write(
        relay.config_path(),
        format!("{config}\n[prune]\nuser = \"pruner\"\npassword = \"p\"\npause_ms = 0\nbatch_rows = 1\n"),
    )
    .unwrap();
    let (status, stdout, stderr) =
        relay.command(&["prune", "--older-than", "1d"], Duration::from_secs(60)).expect("prune runs");
    assert!(status.success(), "{stdout}\n{stderr}");
    // b1, b2 deleted; a1 kept (A is held), the unpublished four kept.
    assert!(stdout.contains("deleted 2 row(s) with published_at <"), "{stdout}");
    let left: Vec<String> = conn.query("SELECT id FROM outbox_events ORDER BY id").await.unwrap();
    let mut want = vec![
        ids["a1"].clone(),
        ids["a2"].clone(),
        ids["a3"].clone(),
        ids["c1"].clone(),
        ids["c2"].clone(),
        a4.id.clone(),
    ];
    want.sort();
    assert_eq!(left, want);

    // Release A (its poison row skipped): the parked row is marked published, and a3 and a4, which waited
    // behind it, follow in order.
    let mut relay = relay;
    assert!(relay.terminate().success(), "{}", relay.logs());
    let (status, stdout, stderr) = relay
        .command(&["quarantine", "release", "order", "A", "--skip-poison"], Duration::from_secs(60))
        .expect("release runs");
    assert!(status.success(), "{stdout}\n{stderr}");
    relay.restart();
    let normal = broker.read_all(TOPIC, 5, CATCH_UP);
    let a: Vec<&str> = normal.iter().filter(|r| r.key_str() == Some("A")).filter_map(|r| r.header_str("id")).collect();
    assert_eq!(a, [ids["a1"].as_str(), ids["a3"].as_str(), a4.id.as_str()], "{}", relay.logs());
    let mut published = false;
    for _ in 0..300 {
        if count(&db, "published_at IS NULL AND aggregate_id <> 'C'").await == 0 {
            published = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(published, "A's rows were not all marked published:\n{}", relay.logs());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(count(&db, "published_at IS NULL").await, 2, "C stays held");

    // The audit: what is missing from the topic is exactly a2 (skipped) and C's rows (held), nothing is out
    // of order; without those rows, it passes.
    let run = relay.audit(&[]);
    assert_eq!(run.code, Some(1), "{}\n{}", run.report, run.stderr);
    let mut missing: Vec<&str> =
        run.report["missing_ids"].as_array().unwrap().iter().filter_map(|id| id.as_str()).collect();
    missing.sort();
    let mut dead_lettered = vec![ids["a2"].as_str(), ids["c1"].as_str(), ids["c2"].as_str()];
    dead_lettered.sort();
    assert_eq!((missing, run.count("order_violations")), (dead_lettered.clone(), 0), "{}", run.report);
    let others = format!("id NOT IN ('{}')", dead_lettered.join("', '"));
    let run = relay.audit(&["--where", &others]);
    assert_eq!(run.code, Some(0), "audit failed: {}\n{}", run.report, run.stderr);
    assert_eq!((run.count("missing"), run.count("order_violations")), (0, 0), "{}", run.report);
    let of = |names: &[&str]| names.iter().map(|n| ids[n].clone()).collect::<Vec<String>>();
    let mut a = of(&["a1", "a2", "a3"]);
    a.push(a4.id.clone());
    let written = common::reliability::written_from(Expected::from_orders([
        ("A", a),
        ("B", of(&["b1", "b2"])),
        ("C", of(&["c1", "c2"])),
    ]));
    let note = "one relay: two invalid-headers rows dead-lettered and parked (their aggregates held, the rows \
                behind them left in the table), prune by published_at, release of one hold; audited without the \
                3 rows not published (the full audit reports exactly those missing)";
    common::reliability::record("polling relay: poison rows", &written, &run, None, note);

    // Release C from another relay's state dir, while the first relay runs: the hold is found through the
    // parked row and its dead letter; the active relay then publishes c2, which waited behind it.
    let other = relay_config(&db, &broker, "poll_interval_ms = 50");
    let (status, stdout, stderr) = other
        .command(&["quarantine", "release", "order", "C", "--skip-poison"], Duration::from_secs(60))
        .expect("release runs");
    assert!(status.success(), "{stdout}\n{stderr}");
    let normal = broker.read_all(TOPIC, 6, CATCH_UP);
    let c: Vec<&str> = normal.iter().filter(|r| r.key_str() == Some("C")).filter_map(|r| r.header_str("id")).collect();
    assert_eq!(c, [ids["c2"].as_str()], "{}", relay.logs());
    wait_all_published(&db, &[&relay]).await;
    assert_eq!(count(&db, "published_at IS NULL").await, 0);
}

/// With a progress table the relay writes one number per batch instead of marking rows: a backlog of 1,000
/// rows is published with no row marked, and a relay stopped and started again goes on after that number
/// (no duplicates). `check` passes.
#[tokio::test(flavor = "multi_thread")]
async fn a_progress_table_publishes_by_number_and_restarts_after_it() {
    let db = MariaDb::start();
    create_relay_user(&db);
    create_progress_table(&db);
    let broker = Broker::start(Engine::Memory);
    let aggregates = ["A", "B", "C", "D", "E"];
    let first = insert_interleaved(&db, &aggregates, 200).await;
    let mut relay = relay(&db, &broker, &format!("poll_interval_ms = 50\nbatch_rows = 100\n{PROGRESS}"));
    wait_through(&db, max_seq(&db).await, &[&relay]).await;
    assert_eq!(count(&db, "published_at IS NOT NULL").await, 0, "no row marked on its own:\n{}", relay.logs());
    assert!(relay.terminate().success(), "{}", relay.logs());
    let second = insert_interleaved(&db, &aggregates, 100).await;
    relay.restart();
    wait_through(&db, max_seq(&db).await, &[&relay]).await;
    let records = broker.read_all(TOPIC, 1_500, CATCH_UP);
    let report = audit(&first.merged(&second), &records);
    assert!(report.is_clean(), "{}", report.summary());
    assert_eq!((records.len(), report.duplicates), (1_500, 0), "{}", report.summary());
    let (status, stdout, stderr) = relay.command(&["check"], Duration::from_secs(60)).expect("check runs");
    assert!(status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("progress table shop.outbox_relay_progress") && stdout.contains("PROCESS"), "{stdout}");
    let (_, stdout, _) = relay.command(&["status"], Duration::from_secs(30)).unwrap();
    assert!(stdout.contains(&format!("published through sequence number {}", max_seq(&db).await)), "{stdout}");
    // prune counts the rows published by number (published_at NULL), by their occurred_at.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (status, stdout, stderr) =
        relay.command(&["prune", "--older-than", "1s", "--dry-run"], Duration::from_secs(60)).unwrap();
    assert!(status.success() && stdout.contains("would delete 1500 row(s)"), "{stdout}\n{stderr}");
    let run = closing_audit(&relay);
    assert_eq!(run.count("duplicates"), 0, "{}", run.report);
}

/// A number taken by a transaction that rolled back is proven free and passed. The number a read passes
/// while the transaction that took it is still open holds the frontier for as long as that transaction is
/// open (here past the 10 s the relay reads gaps again for); the rows above it are marked one by one
/// meanwhile (never waiting for the open transaction's lock), and when it commits its row is published
/// and the frontier passes everything. Had the frontier passed the open transaction's number, its row
/// would be lost when it committed.
#[tokio::test(flavor = "multi_thread")]
async fn the_frontier_passes_a_rolled_back_number_and_waits_for_an_open_transaction() {
    let db = MariaDb::start();
    create_relay_user(&db);
    create_progress_table(&db);
    let broker = Broker::start(Engine::Memory);
    let mut conn = db.conn().await;
    let before = insert_interleaved(&db, &["A"], 3).await;
    let mut other = db.conn().await;
    let mut tx = other.start_transaction(mysql_async::TxOpts::default()).await.unwrap();
    insert_event(&mut tx, &OutboxRow::new("A")).await.unwrap();
    tx.rollback().await.unwrap();
    let between = insert_interleaved(&db, &["A"], 2).await;
    let relay = relay(&db, &broker, &format!("poll_interval_ms = 50\n{PROGRESS}"));
    broker.read_all(TOPIC, 5, CATCH_UP);
    wait_through(&db, max_seq(&db).await, &[&relay]).await;
    let mut tx = other.start_transaction(mysql_async::TxOpts::default()).await.unwrap();
    let late = OutboxRow::new("L");
    insert_event(&mut tx, &late).await.unwrap();
    let mut after = Vec::new();
    for _ in 0..20 {
        let row = OutboxRow::new("B");
        insert_event(&mut conn, &row).await.unwrap();
        after.push(row.id);
    }
    let held_at: u64 =
        conn.query_first("SELECT MIN(seq) - 1 FROM outbox_events WHERE aggregate_id = 'B'").await.unwrap().unwrap();
    broker.read_all(TOPIC, 25, CATCH_UP);
    // Past the 10 s the relay reads gaps again for, and until the rows above the open transaction's number
    // are marked (however long a loaded machine takes): the frontier never passes that number meanwhile.
    let started = Instant::now();
    let marked = || count(&db, "aggregate_id = 'B' AND published_at IS NOT NULL");
    while started.elapsed() < Duration::from_secs(12) || marked().await < 20 {
        let through = published_through(&db).await;
        assert!(through < held_at, "the frontier passed {held_at}, taken by an open transaction: {through}");
        assert!(started.elapsed() < CATCH_UP, "B's rows not marked one by one:\n{}", relay.logs());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tx.commit().await.unwrap();
    let records = broker.read_all(TOPIC, 26, CATCH_UP);
    assert_eq!(records.last().and_then(|r| r.header_str("id")), Some(late.id.as_str()), "{}", relay.logs());
    wait_through(&db, max_seq(&db).await, &[&relay]).await;
    let expected = before.merged(&between).merged(&Expected::from_orders([("B", after), ("L", vec![late.id.clone()])]));
    let report = audit(&expected, &records);
    assert!(report.is_clean() && report.duplicates == 0, "{}", report.summary());
    assert!(!relay.stderr().contains("Lock wait timeout"), "{}", relay.logs());
    closing_audit(&relay);
}

/// Rows the number passed while their aggregate was held (`published_at` = HELD_AT).
async fn held_at(db: &MariaDb) -> u64 {
    count(db, "published_at = '1000-01-01 00:00:00'").await
}

/// Waits until at most `n` rows are held: a released one gets its real `published_at` once published.
async fn wait_held(db: &MariaDb, n: u64, relay: &Connector, what: &str) {
    let deadline = Instant::now() + CATCH_UP;
    while held_at(db).await > n {
        assert!(Instant::now() < deadline, "{what} never marked:\n{}", relay.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A parked row and the rows it holds do not hold the number: they are marked `published_at` =
/// 1000-01-01 (one write each) and the number passes them, so other aggregates stay published by number
/// (none marked one by one); a restart keeps the holds; `prune` keeps the held rows. `quarantine
/// release` (from another relay's state) while the relay runs, and while it is down, lets the held rows
/// follow in order; each is marked with its real time then. Before, the parked row stopped the number
/// and every row after it was marked on its own until the release (the bench's held run: 4,676 row
/// writes/s).
#[tokio::test(flavor = "multi_thread")]
async fn parked_and_held_rows_do_not_hold_the_number() {
    let db = MariaDb::start();
    create_relay_user(&db);
    create_progress_table(&db);
    let broker = Broker::start(Engine::Memory);
    let mut conn = db.conn().await;
    let poison = |a: &str| OutboxRow::new(a).headers(Some(serde_json::json!([1, 2])));
    let rows = [
        OutboxRow::new("A"),
        poison("A"),
        OutboxRow::new("B"),
        poison("C"),
        OutboxRow::new("B"),
        OutboxRow::new("A"),
        OutboxRow::new("C"),
        OutboxRow::new("B"),
    ];
    for row in &rows {
        insert_event(&mut conn, row).await.unwrap();
    }
    let poll = format!("poll_interval_ms = 50\n{PROGRESS}");
    let mut relay = relay(&db, &broker, &poll);
    broker.read_all(DLQ, 2, CATCH_UP);
    wait_through(&db, 8, &[&relay]).await;
    assert_eq!(broker.read_all(TOPIC, 4, CATCH_UP).len(), 4, "A1 and B1-B3");
    let table: Vec<(u64, String, Option<String>)> = conn
        .query("SELECT seq, aggregate_id, CAST(published_at AS CHAR) FROM outbox_events ORDER BY seq")
        .await
        .unwrap();
    // Only the rows of held aggregates not published: A1, in flight when A2 was dead-lettered, is not.
    assert_eq!(held_at(&db).await, 4, "A2, C1 (parked), A3 and C2 (held): {table:?}\n{}", relay.logs());
    assert_eq!(count(&db, "published_at > '1000-01-01'").await, 0, "no row marked on its own:\n{}", relay.logs());
    let (_, stdout, _) = relay.command(&["status"], Duration::from_secs(30)).unwrap();
    assert!(stdout.contains("2 row(s) due") && stdout.contains("2 parked"), "{stdout}");
    // From another relay's state, which knows no hold: the held rows are kept by their published_at.
    let other = relay_config(&db, &broker, &poll);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (status, stdout, stderr) =
        other.command(&["prune", "--older-than", "1s", "--dry-run"], Duration::from_secs(60)).unwrap();
    assert!(status.success() && stdout.contains("would delete 4 row(s)"), "held rows kept: {stdout}\n{stderr}");

    relay.kill();
    relay.restart();
    insert_event(&mut conn, &OutboxRow::new("B")).await.unwrap();
    wait_through(&db, 9, &[&relay]).await;
    let records = broker.read_all_quiet(TOPIC, 5, Duration::from_secs(3), CATCH_UP);
    assert_eq!(records.len(), 5, "held across the restart");

    let release = |aggregate: &str| {
        let (status, stdout, stderr) = other
            .command(&["quarantine", "release", "order", aggregate, "--skip-poison"], Duration::from_secs(60))
            .expect("release runs");
        assert!(status.success(), "{stdout}\n{stderr}");
    };
    release("C");
    let records = broker.read_all(TOPIC, 6, CATCH_UP);
    let c: Vec<&str> = records.iter().filter(|r| r.key_str() == Some("C")).filter_map(|r| r.header_str("id")).collect();
    assert_eq!(c, [rows[6].id.as_str()], "released while running:\n{}", relay.logs());
    wait_held(&db, 2, &relay, "C2").await;

    assert!(relay.terminate().success(), "{}", relay.logs());
    release("A");
    relay.restart();
    let records = broker.read_all(TOPIC, 7, CATCH_UP);
    let a: Vec<&str> = records.iter().filter(|r| r.key_str() == Some("A")).filter_map(|r| r.header_str("id")).collect();
    assert_eq!(a, [rows[0].id.as_str(), rows[5].id.as_str()], "released while down:\n{}", relay.logs());
    wait_held(&db, 0, &relay, "A3").await;
    assert_eq!(published_through(&db).await, 9, "{}", relay.logs());
    assert_eq!(broker.read_all_quiet(TOPIC, 7, Duration::from_secs(3), CATCH_UP).len(), 7, "no duplicate");
}

/// `run` refuses a progress table it cannot use, with the fix: none (the `CREATE TABLE`), without the
/// `PROCESS` privilege, or beside a `TIMESTAMP` `published_at`; `check` reports each.
#[tokio::test(flavor = "multi_thread")]
async fn a_progress_table_the_relay_cannot_use_is_refused() {
    let db = MariaDb::start();
    create_relay_user(&db);
    let broker = Broker::start(Engine::Memory);
    let mut relay = relay_config(&db, &broker, &format!("poll_interval_ms = 50\n{PROGRESS}"));
    let (_, stdout, _) = relay.command(&["check"], Duration::from_secs(60)).expect("check runs");
    assert!(stdout.contains("CREATE TABLE `shop`.`outbox_relay_progress`"), "{stdout}");
    relay.run(&relay.config_path());
    let exited = relay.wait_exit(Duration::from_secs(60)).expect("a relay without its progress table stops");
    assert!(!exited.success(), "{}", relay.logs());
    assert!(relay.stderr().contains("CREATE TABLE `shop`.`outbox_relay_progress`"), "{}", relay.logs());
    create_progress_table(&db);
    db.sql("REVOKE PROCESS ON *.* FROM 'relay'@'127.0.0.1';");
    let (_, stdout, _) = relay.command(&["check"], Duration::from_secs(60)).expect("check runs");
    assert!(stdout.contains("GRANT PROCESS ON *.*"), "{stdout}");
    relay.restart();
    let exited = relay.wait_exit(Duration::from_secs(60)).expect("a relay without PROCESS stops");
    assert!(!exited.success(), "{}", relay.logs());
    assert!(relay.stderr().contains("needs the PROCESS privilege"), "{}", relay.logs());

    // Rows the number passes unpublished are marked 1000-01-01: a TIMESTAMP `published_at` cannot hold it.
    db.sql(
        "GRANT PROCESS ON *.* TO 'relay'@'127.0.0.1'; \
         ALTER TABLE shop.outbox_events MODIFY COLUMN published_at TIMESTAMP(6) NULL;",
    );
    let fix = "MODIFY COLUMN `published_at` DATETIME(6) NULL";
    let (_, stdout, _) = relay.command(&["check"], Duration::from_secs(60)).expect("check runs");
    assert!(stdout.contains("published_at is timestamp") && stdout.contains(fix), "{stdout}");
    relay.restart();
    let exited = relay.wait_exit(Duration::from_secs(60)).expect("a relay with a TIMESTAMP published_at stops");
    assert!(!exited.success(), "{}", relay.logs());
    assert!(relay.stderr().contains(fix), "{}", relay.logs());
}

/// The statement a refusal prints after `then run: `, up to `; and start the relay`: executed as printed.
fn printed_statement(text: &str) -> String {
    let start = text.rfind("then run: ").expect("the refusal prints what to run") + "then run: ".len();
    let end = start + text[start..].find("; and start the relay").expect("the statement's end");
    text[start..end].to_string()
}

/// Issue 45, finding 4: a table truncated under the progress table's number numbers its new rows below it,
/// where the relay took them as published (before: 100 events published, the relay stopped, `TRUNCATE`, 50
/// new events, the relay started: none published, the relay silent; prune would have deleted them). Now
/// the relay refuses to start, naming the counter and the number, and prints the statement that resets the
/// number; `check` and `prune` refuse the same. Run as printed, the relay publishes the 50. A `TRUNCATE`
/// while it runs ends the run the same way, within a counter check.
#[tokio::test(flavor = "multi_thread")]
async fn a_sequence_started_again_below_the_number_is_refused_with_the_reset() {
    let db = MariaDb::start();
    create_relay_user(&db);
    create_progress_table(&db);
    let broker = Broker::start(Engine::Memory);
    let first = insert_interleaved(&db, &["A", "B"], 50).await;
    let mut relay = relay(&db, &broker, &format!("poll_interval_ms = 50\n{PROGRESS}"));
    wait_through(&db, 100, &[&relay]).await;
    assert!(relay.terminate().success(), "{}", relay.logs());
    db.sql("TRUNCATE TABLE shop.outbox_events");
    let second = insert_interleaved(&db, &["A", "B"], 25).await;

    relay.restart();
    let exited = relay.wait_exit(Duration::from_secs(60)).expect("a relay whose table started again stops");
    assert!(!exited.success(), "{}", relay.logs());
    let stderr = relay.stderr();
    for part in ["shop.outbox_events", "AUTO_INCREMENT 51", "MAX(seq) 50", "every row up to 100 is published"] {
        assert!(stderr.contains(part), "{part}:\n{}", relay.logs());
    }
    let statement = printed_statement(&stderr);
    assert!(statement.starts_with("UPDATE `shop`.`outbox_relay_progress` SET published_through = 0"), "{statement}");
    let (status, stdout, _) = relay.command(&["check"], Duration::from_secs(60)).expect("check runs");
    assert!(!status.success() && stdout.contains("sequence counter") && stdout.contains(&statement), "{stdout}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (status, stdout, stderr) =
        relay.command(&["prune", "--older-than", "1s", "--dry-run"], Duration::from_secs(60)).expect("prune runs");
    assert!(!status.success() && stderr.contains(&statement), "prune must not count them: {stdout}\n{stderr}");

    db.sql(&statement);
    relay.restart();
    wait_through(&db, 50, &[&relay]).await;
    let records = broker.read_all(TOPIC, 150, CATCH_UP);
    let report = audit(&first.merged(&second), &records);
    assert!(report.is_clean() && report.duplicates == 0, "{}", report.summary());

    db.sql("TRUNCATE TABLE shop.outbox_events");
    insert_interleaved(&db, &["C"], 10).await;
    let exited = relay.wait_exit(Duration::from_secs(60)).expect("refused while running");
    assert!(!exited.success(), "{}", relay.logs());
    let tail = common::tail_file(&relay.dir().join("stderr.log"), 20);
    assert!(tail.contains("AUTO_INCREMENT 11") && tail.contains("every row up to 50 is published"), "{tail}");
}

/// Issue 45, finding 4, without a progress table: rows written after a `TRUNCATE` while the relay runs are
/// numbered below its cursor, where only the 30 s sweep looked (before). The relay sees the sequence start
/// again within a counter check, says so, and reads the table again from its first unpublished row.
#[tokio::test(flavor = "multi_thread")]
async fn a_truncated_table_is_read_again_from_its_first_row() {
    let db = MariaDb::start();
    create_relay_user(&db);
    let broker = Broker::start(Engine::Memory);
    let first = insert_interleaved(&db, &["A", "B"], 50).await;
    let relay = relay(&db, &broker, "poll_interval_ms = 50");
    broker.read_all(TOPIC, 100, CATCH_UP);
    wait_all_published(&db, &[&relay]).await;
    db.sql("TRUNCATE TABLE shop.outbox_events");
    let second = insert_interleaved(&db, &["A", "B"], 25).await;
    assert!(
        wait_until(CATCH_UP, || relay.stderr().contains("sequence started again below the last row read")),
        "{}",
        relay.logs()
    );
    wait_all_published(&db, &[&relay]).await;
    let records = broker.read_all(TOPIC, 150, CATCH_UP);
    let report = audit(&first.merged(&second), &records);
    assert!(report.is_clean() && report.duplicates == 0, "{}", report.summary());
}

/// The relay's marks of the outbox table that run on the server now.
const MARKS_RUNNING: &str = "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE USER = 'relay' \
                             AND INFO LIKE 'UPDATE `shop`.`outbox_events`%'";

/// Waits until one mark of `relay` runs on the server: one waiting for the row lock a transaction of the
/// test holds.
async fn wait_for_a_mark_on_a_lock(conn: &mut mysql_async::Conn, relay: &Connector) {
    let deadline = Instant::now() + CATCH_UP;
    while conn.query_first::<u64, _>(MARKS_RUNNING).await.unwrap() != Some(1) {
        assert!(Instant::now() < deadline, "the mark never waited for the row's lock:\n{}", relay.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Issue 45, finding 7: a relay that lost its lease kept writing (its marker task was never stopped, and
/// nothing in its statements named the lease), so a paused relay could mark a row its successor had
/// published as held again. Here its mark of a published row is sent while it holds the lease and waits
/// for the row's lock (a transaction of the test holds it); meanwhile the lease's connection is killed and
/// another connection takes the lock, as a successor would. When the row's lock is released, the mark
/// changes nothing: every write checks, row by row on the server, that the lease is still this relay's
/// (before: the row was marked published by the relay that had lost its lease). Once the stand-in
/// successor lets go, the relay takes the lease again and publishes the row (a duplicate, never a loss).
#[tokio::test(flavor = "multi_thread")]
async fn a_relay_that_lost_its_lease_writes_nothing_more() {
    let db = MariaDb::start();
    create_relay_user(&db);
    let broker = Broker::start(Engine::Memory);
    let mut conn = db.conn().await;
    insert_event(&mut conn, &OutboxRow::new("A")).await.unwrap();
    let mut locker = db.conn().await;
    let mut tx = locker.start_transaction(mysql_async::TxOpts::default()).await.unwrap();
    tx.query_drop("SELECT * FROM outbox_events FOR UPDATE").await.unwrap();

    let mut relay = relay_config(&db, &broker, "poll_interval_ms = 50");
    let text = std::fs::read_to_string(relay.config_path()).unwrap();
    std::fs::write(relay.config_path(), text.replace("[state]\n", "[state]\nname = \"fenced\"\n")).unwrap();
    relay.run(&relay.config_path());
    broker.read_all(TOPIC, 1, CATCH_UP);
    wait_for_a_mark_on_a_lock(&mut conn, &relay).await;

    // The stand-in successor waits for the lock first, so that it gets it the moment it is free.
    let lock = "outbox-cdc/fenced";
    let holder: u64 = conn.query_first(format!("SELECT IS_USED_LOCK('{lock}')")).await.unwrap().unwrap();
    let mut successor = db.conn().await;
    let successor_id: u64 = successor.query_first("SELECT CONNECTION_ID()").await.unwrap().unwrap();
    let take = tokio::spawn(async move {
        let got: Option<i64> = successor.query_first(format!("SELECT GET_LOCK('{lock}', 60)")).await.unwrap();
        (successor, got)
    });
    let queued = format!(
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = {successor_id} AND INFO LIKE '%GET_LOCK%'"
    );
    while conn.query_first::<u64, _>(&queued).await.unwrap() != Some(1) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    conn.query_drop(format!("KILL {holder}")).await.unwrap();
    let (successor, got) = take.await.unwrap();
    assert_eq!(got, Some(1), "the stand-in successor holds the lease");
    assert!(wait_until(CATCH_UP, || relay.stderr().contains("lease lost")), "{}", relay.logs());

    tx.commit().await.unwrap();
    let deadline = Instant::now() + CATCH_UP;
    while conn.query_first::<u64, _>(MARKS_RUNNING).await.unwrap() != Some(0) {
        assert!(Instant::now() < deadline, "the mark never ended:\n{}", relay.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(count(&db, "published_at IS NOT NULL").await, 0, "written without the lease:\n{}", relay.logs());

    drop(successor);
    wait_all_published(&db, &[&relay]).await;
    assert_eq!(broker.read_all(TOPIC, 2, CATCH_UP).len(), 2, "published again by the relay holding the lease");
    assert!(relay.terminate().success(), "{}", relay.logs());
}

/// A relay killed while its round of marks waits for a row's lock (a transaction of the test holds the 60th
/// of 100 rows) leaves the mark running on the server: it has changed the 59 rows before the locked one (in
/// the plan's order: this small table is scanned by its primary key, the event id) and the rows after it
/// fail the lease check once the lease moved. The next run reads nothing until the statement ended, and the
/// server rolls the round back with the dead session: the 100 rows are published again, once each, in
/// order. On 61b49a6 the next run read at once, while the mark ran, and the killed relay's partial mark
/// committed later (seen once at full length in `relay_patterns::kill_during_catch_up_marking`: rows
/// 41005-41805 republished, 42005-48805 not). With the wait but marks in autocommit, the 59 rows committed
/// and the replay had holes: 21 broken replays, events of each aggregate skipped inside it.
#[tokio::test(flavor = "multi_thread")]
async fn the_next_run_reads_after_a_killed_relays_last_mark() {
    let db = MariaDb::start();
    create_relay_user(&db);
    let broker = Broker::start(Engine::Memory);
    let expected = insert_interleaved(&db, &["A", "B", "C", "D"], 25).await;
    let mut conn = db.conn().await;
    let seqs: Vec<u64> = conn.query("SELECT seq FROM outbox_events ORDER BY seq").await.unwrap();
    assert_eq!(seqs.len(), 100);
    let mut locker = db.conn().await;
    let mut tx = locker.start_transaction(mysql_async::TxOpts::default()).await.unwrap();
    tx.query_drop(format!("SELECT * FROM outbox_events WHERE seq = {} FOR UPDATE", seqs[59])).await.unwrap();

    let mut relay = relay(&db, &broker, "poll_interval_ms = 50");
    assert_eq!(broker.read_all(TOPIC, 100, CATCH_UP).len(), 100);
    wait_for_a_mark_on_a_lock(&mut conn, &relay).await;
    relay.kill();
    relay.restart();
    assert!(
        wait_until(CATCH_UP, || common::patterns::latest_stderr(&relay).contains("waiting for writes an earlier run")),
        "the next run did not wait for the killed relay's mark:\n{}",
        relay.logs()
    );
    std::thread::sleep(Duration::from_secs(2));
    let meanwhile = broker.read_all(TOPIC, 101, Duration::from_secs(1)).len();
    assert_eq!(meanwhile, 100, "published while the killed relay's mark still ran:\n{}", relay.logs());

    tx.commit().await.unwrap();
    wait_all_published(&db, &[&relay]).await;
    let records = broker.read_all(TOPIC, 141, CATCH_UP);
    let verdict = common::patterns::judge(&expected, &records);
    verdict.assert_replays_only("the run after the killed relay's mark", &relay.logs());
    assert_eq!(verdict.duplicates, 100, "the killed relay's round rolled back whole: {}", verdict.summary());
    assert!(relay.terminate().success(), "{}", relay.logs());
}

/// A read/write-splitting proxy as ProxySQL or MaxScale can be set up: the first connection (a relay's
/// lease) goes to `primary`, every later one (its reads and marks) to `replica`. Returns its port.
fn splitting_proxy(primary: u16, replica: u16) -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
    tokio::spawn(async move {
        let mut accepted = 0;
        while let Ok((mut client, _)) = listener.accept().await {
            accepted += 1;
            let upstream = if accepted == 1 { primary } else { replica };
            tokio::spawn(async move {
                if let Ok(mut server) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            });
        }
    });
    port
}

/// Issue 45, finding 5: the relay's proofs assume one server, and it never checked which one its
/// connections reached. Behind a read/write-splitting proxy that sends the lease's connection to the
/// primary and the reads to a second server (here with the same `server_id`, as MariaDB has no
/// `server_uuid`), the relay used to run on the second server's table in silence. Now every connection
/// proves it reaches the server where the lease's lock is held by the lease's connection, and the relay
/// stops with what to do. A read-only server (a replica) and `auto_increment_increment = 2` with a progress
/// table are refused too, by `run` and by `check`.
#[tokio::test(flavor = "multi_thread")]
async fn every_relay_connection_reaches_the_writable_primary_of_its_lease() {
    let primary = MariaDb::start();
    let replica = MariaDb::builder().server_id(primary.server_id()).start();
    create_relay_user(&primary);
    create_relay_user(&replica);
    let broker = Broker::start(Engine::Memory);
    let direct = "Connect the relay to the primary directly, not through a read/write-splitting proxy";

    let mut relay = relay_config(&primary, &broker, "poll_interval_ms = 50");
    let text = std::fs::read_to_string(relay.config_path()).unwrap();
    let proxy = splitting_proxy(primary.port(), replica.port());
    let proxied = text.replace(&format!("port = {}\n", primary.port()), &format!("port = {proxy}\n"));
    std::fs::write(relay.config_path(), proxied).unwrap();
    relay.run(&relay.config_path());
    let exited = relay.wait_exit(Duration::from_secs(60)).expect("a relay behind a splitting proxy stops");
    assert!(!exited.success(), "{}", relay.logs());
    let stderr = relay.stderr();
    assert!(stderr.contains("on which the lease is not held") && stderr.contains(direct), "{}", relay.logs());

    std::fs::write(relay.config_path(), &text).unwrap();
    primary.sql("SET GLOBAL read_only = 1");
    let (status, stdout, _) = relay.command(&["check"], Duration::from_secs(60)).expect("check runs");
    assert!(!status.success() && stdout.contains("[FAIL] server read_only"), "{stdout}");
    relay.restart();
    let exited = relay.wait_exit(Duration::from_secs(60)).expect("a relay on a read-only server stops");
    assert!(!exited.success(), "{}", relay.logs());
    let tail = common::tail_file(&relay.dir().join("stderr.log"), 20);
    assert!(tail.contains("read-only (@@read_only = ON)") && tail.contains(direct), "{tail}");
    primary.sql("SET GLOBAL read_only = 0");

    create_progress_table(&primary);
    let mut relay = relay_config(&primary, &broker, &format!("poll_interval_ms = 50\n{PROGRESS}"));
    primary.sql("SET GLOBAL auto_increment_increment = 2");
    let (status, stdout, _) = relay.command(&["check"], Duration::from_secs(60)).expect("check runs");
    assert!(!status.success() && stdout.contains("[FAIL] auto_increment_increment"), "{stdout}");
    relay.run(&relay.config_path());
    let exited = relay.wait_exit(Duration::from_secs(60)).expect("a step of 2 with a progress table stops");
    assert!(!exited.success(), "{}", relay.logs());
    assert!(
        relay.stderr().contains("needs @@GLOBAL.auto_increment_increment = 1, the server has 2"),
        "{}",
        relay.logs()
    );

    primary.sql("SET GLOBAL auto_increment_increment = 1");
    let expected = insert_interleaved(&primary, &["A", "B"], 5).await;
    relay.restart();
    wait_through(&primary, max_seq(&primary).await, &[&relay]).await;
    let report = audit(&expected, &broker.read_all(TOPIC, 10, CATCH_UP));
    assert!(report.is_clean(), "{}", report.summary());
}
