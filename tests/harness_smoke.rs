//! Smoke tests of the integration-test harness itself (`tests/common/`): real MariaDB, real Tansu,
//! and the audit's rules. If one of these fails, scenario tests cannot be trusted.

mod common;

use common::{
    audit, business_tx, insert_event, Broker, Engine, Expected, MariaDb, OutboxRow, Received, Writer, WriterConfig,
};
use mysql_async::prelude::Queryable;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use std::collections::BTreeMap;
use std::time::Duration;

// ---------------------------------------------------------------- MariaDB

/// The server runs with the binlog settings the connector requires, the schema exists, and the
/// `cdc` user can do what a CDC reader does (and no more on `shop`).
#[tokio::test(flavor = "multi_thread")]
async fn mariadb_starts_with_binlog_settings_schema_and_cdc_user() {
    let db = MariaDb::start();
    let pool = db.pool().await;
    let mut conn = pool.get_conn().await.unwrap();
    let vars: (String, String, String, String, u32, u32) = conn
        .query_first(
            "SELECT @@binlog_format, @@binlog_row_image, @@binlog_row_metadata, @@character_set_server, \
             @@gtid_strict_mode, @@server_id",
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(vars, ("ROW".into(), "FULL".into(), "FULL".into(), "utf8mb4".into(), 1, db.server_id()));

    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(business_tx(&mut conn, &format!("agg-{i}")).await.unwrap());
    }
    let n: u64 = conn.query_first("SELECT COUNT(*) FROM outbox_events").await.unwrap().unwrap();
    assert_eq!(n, 5);
    let orders: u64 = conn.query_first("SELECT COUNT(*) FROM orders").await.unwrap().unwrap();
    assert_eq!(orders, 5);
    let pos = db.gtid_binlog_pos();
    assert!(pos.starts_with(&format!("0-{}-", db.server_id())), "gtid_binlog_pos = {pos}");

    // The same row read back: payload JSON with the order id, microseconds kept.
    let (payload, occurred): (String, String) = conn
        .exec_first("SELECT payload, CAST(occurred_at AS CHAR) FROM outbox_events WHERE id = ?", (&ids[0],))
        .await
        .unwrap()
        .unwrap();
    let payload: serde_json::Value = serde_json::from_str(&payload).unwrap();
    assert!(payload["order_id"].as_u64().is_some(), "{payload}");
    assert_eq!(occurred.len(), "2026-01-01 00:00:00.000000".len(), "{occurred}");

    // A hand-made row: explicit id, headers JSON, event type.
    let row = OutboxRow::new("agg-x")
        .id("00000000-0000-4000-8000-000000000001")
        .event_type("OrderShipped")
        .headers(Some(serde_json::json!({ "trace": "abc" })));
    insert_event(&mut conn, &row).await.unwrap();
    let headers: String = conn
        .query_first("SELECT headers FROM outbox_events WHERE id = '00000000-0000-4000-8000-000000000001'")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(serde_json::from_str::<serde_json::Value>(&headers).unwrap()["trace"], "abc");
    conn.query_drop("DELETE FROM outbox_events WHERE id = '00000000-0000-4000-8000-000000000001'").await.unwrap();
    let pos = db.gtid_binlog_pos();

    let mut cdc = mysql_async::Conn::new(mysql_async::Opts::from_url(&db.url_cdc()).unwrap()).await.unwrap();
    let logs: Vec<(String, u64)> = cdc.query("SHOW BINARY LOGS").await.unwrap();
    assert!(!logs.is_empty());
    cdc.query_drop("SHOW MASTER STATUS").await.unwrap();
    let cdc_pos: String = cdc.query_first("SELECT @@GLOBAL.gtid_binlog_pos").await.unwrap().unwrap();
    assert_eq!(cdc_pos, pos);
    let n: u64 = cdc.query_first("SELECT COUNT(*) FROM shop.outbox_events").await.unwrap().unwrap();
    assert_eq!(n, 5);
    assert!(cdc.query_drop("DELETE FROM shop.outbox_events").await.is_err(), "cdc must be read-only on shop");
    cdc.disconnect().await.unwrap();
    drop(conn);
    pool.disconnect().await.unwrap();
}

/// Committed data and the GTID position survive SIGKILL + restart, and SIGTERM + restart.
#[tokio::test(flavor = "multi_thread")]
async fn mariadb_survives_kill_and_restart() {
    let mut db = MariaDb::start();
    let mut conn = db.conn().await;
    for i in 0..20 {
        business_tx(&mut conn, &format!("agg-{}", i % 3)).await.unwrap();
    }
    drop(conn);
    let pos = db.gtid_binlog_pos();

    db.kill();
    assert!(!db.is_running());
    db.start_again();
    assert_eq!(db.sql("SELECT COUNT(*) FROM shop.outbox_events").trim(), "20");
    assert_eq!(db.gtid_binlog_pos(), pos);

    db.restart(); // graceful
    let mut conn = db.conn().await;
    business_tx(&mut conn, "agg-after").await.unwrap();
    let n: u64 = conn.query_first("SELECT COUNT(*) FROM outbox_events").await.unwrap().unwrap();
    assert_eq!(n, 21);
    drop(conn);
    db.stop();
}

/// Extra server arguments override the defaults (tests of bad settings rely on it).
#[test]
fn mariadb_builder_extra_args_override_defaults() {
    let db = MariaDb::builder().arg("--binlog-row-metadata=MINIMAL").arg("--binlog-format=MIXED").start();
    assert_eq!(db.sql("SELECT @@binlog_row_metadata, @@binlog_format").trim(), "MINIMAL\tMIXED");
}

/// The Writer commits exactly `max_events`, each aggregate owned by one task, all ids in the table.
#[tokio::test(flavor = "multi_thread")]
async fn writer_commits_bounded_count_with_per_aggregate_order() {
    let db = MariaDb::start();
    let cfg = WriterConfig { tasks: 4, aggregates_per_task: 5, max_events: 400, ..WriterConfig::default() };
    let writer = Writer::start(db.opts_root(), cfg);
    let written = writer.join().await;
    assert!(written.errors.is_empty(), "{:?}", written.errors);
    assert_eq!(written.len(), 400);
    assert_eq!(written.expected.per_aggregate.len(), 20);
    assert!(written.expected.uncertain.is_empty());

    // Per aggregate, the table's occurred_at order (set client-side before each commit) matches the
    // recorded commit order.
    let mut conn = db.conn().await;
    let rows: Vec<(String, String)> =
        conn.query("SELECT aggregate_id, id FROM outbox_events ORDER BY aggregate_id, occurred_at").await.unwrap();
    let mut from_db: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (agg, id) in rows {
        from_db.entry(agg).or_default().push(id);
    }
    assert_eq!(from_db, written.expected.per_aggregate);
}

/// The Writer rides through a MariaDB crash: it reconnects, marks commits with unknown outcome as
/// uncertain, and after resolving them the expectation equals the table exactly.
#[tokio::test(flavor = "multi_thread")]
async fn writer_survives_mariadb_kill() {
    let mut db = MariaDb::start();
    let cfg = WriterConfig { tasks: 3, max_events: 600, ..WriterConfig::default() };
    let writer = Writer::start(db.opts_root(), cfg);
    assert!(writer.wait_committed(150, Duration::from_secs(60)).await);
    db.kill();
    tokio::time::sleep(Duration::from_millis(300)).await;
    db.start_again();
    let mut written = writer.join().await;
    assert_eq!(written.len(), 600, "errors: {:?}", written.errors);

    let mut conn = db.conn().await;
    written.resolve_uncertain(&mut conn).await.unwrap();
    let mut ids: Vec<String> = conn.query("SELECT id FROM outbox_events").await.unwrap();
    ids.sort();
    let mut expected_ids = written.ids();
    expected_ids.sort();
    assert_eq!(ids, expected_ids);
}

// ---------------------------------------------------------------- Broker

/// Produces `n` records round-robin over `aggregates` keys with an idempotent acks=all producer,
/// header `id` = `<agg>-<seq>`; returns the expectation (send order = per-key order).
async fn produce(broker: &Broker, topic: &str, n: usize, aggregates: usize) -> Expected {
    let producer: FutureProducer = broker
        .client_config()
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .create()
        .unwrap();
    let mut per_aggregate: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut deliveries = Vec::with_capacity(n);
    for i in 0..n {
        let agg = format!("agg-{}", i % aggregates);
        let id = format!("{agg}-{i}");
        let value = serde_json::json!({ "i": i }).to_string();
        let record = FutureRecord::to(topic)
            .key(&agg)
            .payload(&value)
            .headers(OwnedHeaders::new().insert(Header { key: "id", value: Some(&id) }));
        // send_result enqueues now, so the send order is the order of this loop.
        deliveries.push(producer.send_result(record).map_err(|(e, _)| e).unwrap());
        per_aggregate.entry(agg).or_default().push(id);
    }
    for d in deliveries {
        d.await.unwrap().map_err(|(e, _)| e).unwrap();
    }
    Expected { per_aggregate, ..Expected::default() }
}

/// SQLite engine: topic creation, 1000 records read back in per-key order, and they survive a
/// graceful restart and a kill -9 + restart.
#[tokio::test(flavor = "multi_thread")]
async fn broker_sqlite_roundtrip_and_restarts() {
    let mut broker = Broker::start(Engine::Sqlite);
    broker.create_topic("outbox.event.order", 3);
    assert_eq!(broker.partition_count("outbox.event.order"), Some(3));
    let expected = produce(&broker, "outbox.event.order", 1000, 20).await;

    let got = broker.read_all("outbox.event.order", 1000, Duration::from_secs(60));
    let report = audit(&expected, &got);
    assert!(report.is_clean() && report.duplicates == 0 && got.len() == 1000, "{}", report.summary());
    assert!(got.iter().all(|r| r.key_str().is_some_and(|k| r.header_str("id").unwrap().starts_with(k))));
    assert!(got[0].value_json()["i"].as_u64().is_some());

    broker.restart();
    let again = broker.read_all("outbox.event.order", 1000, Duration::from_secs(60));
    assert_eq!(sorted(&again), sorted(&got));

    broker.kill();
    broker.start_again();
    let again = broker.read_all("outbox.event.order", 1000, Duration::from_secs(60));
    assert_eq!(sorted(&again), sorted(&got));
    broker.stop();
}

/// Memory engine: the same roundtrip, fast.
#[tokio::test(flavor = "multi_thread")]
async fn broker_memory_roundtrip() {
    let broker = Broker::start(Engine::Memory);
    broker.create_topic("outbox.event.order", 2);
    let expected = produce(&broker, "outbox.event.order", 1000, 10).await;
    let got = broker.read_all("outbox.event.order", 1000, Duration::from_secs(60));
    let report = audit(&expected, &got);
    assert!(report.is_clean() && report.duplicates == 0 && got.len() == 1000, "{}", report.summary());
}

/// An unknown topic reads as empty (after the timeout) on the SQLite engine.
#[test]
fn broker_read_unknown_topic_is_empty() {
    let broker = Broker::start(Engine::Sqlite);
    assert!(broker.read_all("no.such.topic", 0, Duration::from_secs(2)).is_empty());
}

fn sorted(v: &[Received]) -> Vec<Received> {
    let mut v = v.to_vec();
    v.sort_by_key(|r| (r.partition, r.offset));
    v
}

// ---------------------------------------------------------------- audit rules

fn rec(partition: i32, offset: i64, id: &str) -> Received {
    Received {
        topic: "t".into(),
        partition,
        offset,
        key: None,
        value: None,
        headers: vec![("id".into(), id.as_bytes().to_vec())],
        timestamp: None,
    }
}

fn expected() -> Expected {
    Expected::from_orders([("a", vec!["a1", "a2", "a3"]), ("b", vec!["b1", "b2"])])
}

#[test]
fn audit_clean_when_all_in_order_interleaved() {
    let got = [rec(0, 0, "a1"), rec(0, 1, "b1"), rec(0, 2, "a2"), rec(0, 3, "b2"), rec(0, 4, "a3")];
    let r = audit(&expected(), &got);
    assert!(r.is_clean(), "{}", r.summary());
    assert_eq!(r.duplicates, 0);
    assert_eq!(r.records, 5);
}

#[test]
fn audit_reports_missing() {
    let got = [rec(0, 0, "a1"), rec(0, 1, "a3"), rec(1, 0, "b1"), rec(1, 1, "b2")];
    let r = audit(&expected(), &got);
    assert_eq!(r.missing, vec!["a2".to_string()]);
    assert!(r.order_violations.is_empty(), "a gap is not a reorder: {}", r.summary());
}

#[test]
fn audit_counts_redelivery_as_duplicate_not_violation() {
    // Crash after a3, replay from a2: a1 a2 a3 | a2 a3.
    let got = [rec(0, 0, "a1"), rec(0, 1, "a2"), rec(0, 2, "a3"), rec(0, 3, "a2"), rec(0, 4, "a3")];
    let r = audit(&Expected::from_orders([("a", vec!["a1", "a2", "a3"])]), &got);
    assert_eq!(r.duplicates, 2);
    assert!(r.is_clean(), "{}", r.summary());
}

#[test]
fn audit_reports_first_occurrence_out_of_order() {
    let got = [rec(0, 0, "a1"), rec(0, 1, "a3"), rec(0, 2, "a2"), rec(0, 3, "a3")];
    let r = audit(&Expected::from_orders([("a", vec!["a1", "a2", "a3"])]), &got);
    assert_eq!(r.order_violations.len(), 1, "{}", r.summary());
    assert!(r.order_violations[0].contains("a2"), "{}", r.summary());
    assert_eq!(r.duplicates, 1);
    assert!(r.missing.is_empty());
}

#[test]
fn audit_sorts_by_partition_and_offset_first() {
    let got = [rec(0, 2, "a3"), rec(0, 0, "a1"), rec(0, 1, "a2")];
    let r = audit(&Expected::from_orders([("a", vec!["a1", "a2", "a3"])]), &got);
    assert!(r.is_clean(), "{}", r.summary());
}

#[test]
fn audit_reports_aggregate_split_across_partitions() {
    let got = [rec(0, 0, "a1"), rec(1, 0, "a2"), rec(0, 1, "a3")];
    let r = audit(&Expected::from_orders([("a", vec!["a1", "a2", "a3"])]), &got);
    assert_eq!(r.split_aggregates.len(), 1, "{}", r.summary());
    assert!(!r.is_clean());
}

#[test]
fn audit_reports_unexpected_and_headerless_records() {
    let mut no_header = rec(0, 1, "x");
    no_header.headers.clear();
    let got = [rec(0, 0, "a1"), no_header, rec(0, 2, "zzz")];
    let r = audit(&Expected::from_orders([("a", vec!["a1"])]), &got);
    assert_eq!(r.unexpected.len(), 2, "{}", r.summary());
}

#[test]
fn audit_tolerates_absent_uncertain_but_checks_present_ones() {
    let mut exp = Expected::from_orders([("a", vec!["a1", "a2", "a3"])]);
    exp.uncertain.insert("a2".into());
    let r = audit(&exp, &[rec(0, 0, "a1"), rec(0, 1, "a3")]);
    assert!(r.is_clean(), "{}", r.summary());
    let r = audit(&exp, &[rec(0, 0, "a1"), rec(0, 1, "a3"), rec(0, 2, "a2")]);
    assert_eq!(r.order_violations.len(), 1, "{}", r.summary());
}
