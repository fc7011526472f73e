//! The connector core against a real MariaDB and a real Kafka-protocol broker: record shape, decoding,
//! filtering, ordering, large transactions, graceful restarts and the definite errors.

mod common;

use std::time::Duration;

use common::{
    business_tx, insert_event, Broker, Connector, Engine, Expected, MariaDb, OutboxRow, Writer, WriterConfig,
};
use mysql_async::prelude::Queryable;
use serde_json::json;

const TOPIC: &str = "outbox.event.order";
const READ_TIMEOUT: Duration = Duration::from_secs(120);

/// Exact topic, key, value and headers for the interesting column values: utf8mb4 text (Chinese, emoji),
/// NULL `headers`, DATETIME(6) microseconds (including a leading zero digit), a non-default
/// schema_version, and a 4 MB payload.
#[tokio::test(flavor = "multi_thread")]
async fn records_carry_exact_values() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let mut conn = db.conn().await;

    let emoji = OutboxRow::new("客户-🚀-42")
        .event_type("OrderCreated")
        .schema_version(65535)
        .payload(json!({"note": "订单已创建 ✅", "emoji": "🙂🚀", "n": 1.5, "nested": {"a": [1, null, true]}}))
        .headers(Some(json!({"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "retries": 3})))
        .occurred_at("2026-11-30 12:34:56.012345");
    let no_headers = OutboxRow::new("A-2").headers(None).occurred_at("1999-01-02 03:04:05.000001");
    let big_text = "x".repeat(4 * 1024 * 1024);
    let big = OutboxRow::new("A-3").payload(json!({ "blob": big_text }));
    for row in [&emoji, &no_headers, &big] {
        insert_event(&mut conn, row).await.expect("insert");
    }

    let mut connector = Connector::start(&db, &broker, "");
    let records = broker.read_all(TOPIC, 3, READ_TIMEOUT);
    assert_eq!(records.len(), 3, "connector logs:\n{}", connector.logs());

    let by_id = |id: &str| records.iter().find(|r| r.header_str("id") == Some(id)).expect("record by id");
    let r = by_id(&emoji.id);
    assert_eq!(r.key_str(), Some("客户-🚀-42"));
    assert_eq!(
        r.value_json(),
        json!({
            "event_id": emoji.id,
            "type": "OrderCreated",
            "version": 65535,
            "occurred_at": "2026-11-30T12:34:56.012345",
            "aggregate_type": "order",
            "aggregate_id": "客户-🚀-42",
            "data": {"note": "订单已创建 ✅", "emoji": "🙂🚀", "n": 1.5, "nested": {"a": [1, null, true]}},
        })
    );
    let names: Vec<&str> = r.headers.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, ["id", "event_type", "aggregate_type", "schema_version", "traceparent"]);
    assert_eq!(r.header_str("schema_version"), Some("65535"));
    assert_eq!(r.header_str("traceparent"), Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"));

    let r = by_id(&no_headers.id);
    assert_eq!(r.headers.len(), 4, "NULL headers add no header");
    assert_eq!(r.value_json()["occurred_at"], "1999-01-02T03:04:05.000001");

    let r = by_id(&big.id);
    assert_eq!(r.value_json()["data"]["blob"].as_str().map(str::len), Some(4 * 1024 * 1024));
    connector.terminate();
}

/// `value_format = "payload"` sends the payload JSON alone; the topic template's other placeholders work.
#[tokio::test(flavor = "multi_thread")]
async fn payload_format_and_topic_placeholders() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let mut conn = db.conn().await;
    let row = OutboxRow::new("A-1").event_type("Shipped").payload(json!({"k": "v"}));
    insert_event(&mut conn, &row).await.unwrap();
    let mut connector = Connector::new();
    let config = connector.write_config(&db, &broker, "");
    let text = std::fs::read_to_string(&config).unwrap().replace(
        "topic = \"outbox.event.${aggregate_type}\"",
        "topic = \"${database}.${table}.${event_type}\"\nvalue_format = \"payload\"",
    );
    std::fs::write(&config, text).unwrap();
    connector.run(&config);
    let records = broker.read_all("shop.outbox_events.Shipped", 1, READ_TIMEOUT);
    assert_eq!(records.len(), 1, "{}", connector.logs());
    assert_eq!(records[0].value_json(), json!({"k": "v"}));
    connector.terminate();
}

/// Rolled-back transactions, other tables, a same-named table in another database, and UPDATE/DELETE on
/// the outbox produce nothing (default `on_update = "ignore"`).
#[tokio::test(flavor = "multi_thread")]
async fn only_committed_outbox_inserts_produce_records() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let mut conn = db.conn().await;
    conn.query_drop("CREATE DATABASE other").await.unwrap();
    conn.query_drop("CREATE TABLE other.outbox_events LIKE shop.outbox_events").await.unwrap();
    let mut connector = Connector::start(&db, &broker, "");

    let rolled_back = OutboxRow::new("A-1");
    let mut tx = conn.start_transaction(Default::default()).await.unwrap();
    insert_event(&mut tx, &rolled_back).await.unwrap();
    tx.rollback().await.unwrap();

    let elsewhere = OutboxRow::new("A-1");
    conn.exec_drop(
        "INSERT INTO other.outbox_events (id, aggregate_type, aggregate_id, event_type, schema_version, payload, \
         occurred_at, next_attempt_at) VALUES (?, 'order', 'A-1', 'X', 1, '{}', NOW(6), NOW(6))",
        (elsewhere.id.clone(),),
    )
    .await
    .unwrap();
    conn.query_drop("INSERT INTO shop.orders (customer, amount, created_at) VALUES ('c', 1.00, NOW(6))").await.unwrap();

    let first = business_tx(&mut conn, "A-1").await.unwrap();
    conn.exec_drop("UPDATE shop.outbox_events SET published_at = NOW(6) WHERE id = ?", (first.clone(),)).await.unwrap();
    conn.exec_drop("DELETE FROM shop.outbox_events WHERE id = ?", (first.clone(),)).await.unwrap();
    let last = business_tx(&mut conn, "A-1").await.unwrap();

    let records = broker.read_all(TOPIC, 2, READ_TIMEOUT);
    let ids: Vec<&str> = records.iter().filter_map(|r| r.header_str("id")).collect();
    assert_eq!(ids, [first.as_str(), last.as_str()], "{}", connector.logs());
    connector.terminate();
}

/// Eight concurrent writers over 64 aggregates: every event exactly once, per-aggregate commit order, each
/// aggregate on one partition.
#[tokio::test(flavor = "multi_thread")]
async fn concurrent_writers_keep_per_aggregate_order() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let mut connector = Connector::start(&db, &broker, "");
    let writer = Writer::start(
        db.opts_root(),
        WriterConfig { tasks: 8, aggregates_per_task: 8, max_events: 4000, ..WriterConfig::default() },
    );
    let written = writer.finish().await;
    assert!(written.errors.is_empty(), "{:?}", written.errors);
    let (_, report) = common::read_and_audit(&broker, TOPIC, &written.expected, READ_TIMEOUT, &connector);
    assert_eq!(report.duplicates, 0, "{}", report.summary());
    connector.terminate();
}

/// One transaction with 200,000 outbox rows streams through (it is produced while it is read), in order.
#[tokio::test(flavor = "multi_thread")]
async fn transaction_with_200k_rows() {
    const ROWS: usize = 200_000;
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let mut connector = Connector::start(&db, &broker, "");
    let mut conn = db.conn().await;
    conn.query_drop("SET SESSION max_statement_time = 0").await.unwrap();
    // MariaDB's SEQUENCE engine generates the rows; one INSERT … SELECT = one transaction.
    conn.query_drop(format!(
        "INSERT INTO shop.outbox_events (id, aggregate_type, aggregate_id, event_type, schema_version, payload, \
         occurred_at, next_attempt_at) \
         SELECT CONCAT('bulk-', LPAD(seq, 7, '0')), 'order', CONCAT('agg-', seq % 97), 'Bulk', 1, \
                JSON_OBJECT('n', seq, 'text', '批量'), NOW(6), NOW(6) FROM seq_1_to_{ROWS}"
    ))
    .await
    .unwrap();
    let expected = Expected::from_orders((0..97).map(|a| {
        let ids: Vec<String> = (1..=ROWS).filter(|n| n % 97 == a).map(|n| format!("bulk-{n:07}")).collect();
        (format!("agg-{a}"), ids)
    }));
    let (_, report) = common::read_and_audit(&broker, TOPIC, &expected, Duration::from_secs(600), &connector);
    assert_eq!(report.duplicates, 0);
    connector.terminate();
}

/// Graceful stops (SIGTERM) in the middle of a steady load, then restarts: nothing lost and — because a
/// graceful stop drains and checkpoints at a transaction boundary — nothing repeated.
#[tokio::test(flavor = "multi_thread")]
async fn graceful_restarts_lose_and_repeat_nothing() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Sqlite);
    let mut connector = Connector::start(&db, &broker, "");
    let writer = Writer::start(
        db.opts_root(),
        WriterConfig { tasks: 4, max_events: 3000, pause: Duration::from_millis(2), ..WriterConfig::default() },
    );
    for round in 1..=3 {
        writer.wait_committed(round * 600, Duration::from_secs(120)).await;
        let status = connector.terminate();
        assert!(status.success(), "graceful stop must exit 0: {status}\n{}", connector.logs());
        connector.restart();
    }
    let written = writer.finish().await;
    let (_, report) = common::read_and_audit(&broker, TOPIC, &written.expected, READ_TIMEOUT, &connector);
    assert_eq!(report.duplicates, 0, "graceful restarts must not repeat events: {}", report.summary());
    connector.terminate();
}

/// A purged binlog is a definite error (exit 2) that says so and names the way out — never a silent skip.
#[tokio::test(flavor = "multi_thread")]
async fn purged_binlog_is_a_definite_error() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let mut conn = db.conn().await;
    let mut connector = Connector::start(&db, &broker, "");
    business_tx(&mut conn, "A-1").await.unwrap();
    assert_eq!(broker.read_all(TOPIC, 1, READ_TIMEOUT).len(), 1, "{}", connector.logs());
    assert!(connector.terminate().success());
    // `check` reads the checkpoint's last event back from the server: the same transaction.
    let (status, out, err) = connector.command(&["check"], Duration::from_secs(60)).unwrap();
    assert!(status.success(), "{out}{err}");
    assert!(out.contains("[ok  ] checkpoint history: expected the transaction that ends at mysql-bin."), "{out}");
    assert!(out.contains("actual the same transaction"), "{out}");

    // While the connector is down: more events, then the binlogs holding them are purged.
    for _ in 0..3 {
        business_tx(&mut conn, "A-1").await.unwrap();
        conn.query_drop("FLUSH BINARY LOGS").await.unwrap();
    }
    common::purge_binlogs_before_current(&mut conn).await;
    // Nothing left to compare the checkpoint with, and its position is gone.
    let (status, out, _) = connector.command(&["check"], Duration::from_secs(60)).unwrap();
    assert_eq!(status.code(), Some(2), "{out}");
    assert!(out.contains("actual binlog file purged, not compared"), "{out}");
    assert!(out.contains("[FAIL] checkpoint position"), "{out}");

    connector.restart();
    let status = connector
        .wait_exit(Duration::from_secs(60))
        .unwrap_or_else(|| panic!("connector must stop\n{}", connector.logs()));
    assert_eq!(status.code(), Some(2), "{}", connector.logs());
    let logs = connector.logs();
    assert!(logs.contains("no longer in the server's binlogs"), "{logs}");
    assert!(logs.contains("re-snapshot") || logs.contains("Way out"), "{logs}");
}

/// `check` reports each bad setting with the expected value and the fix, and exits 2.
#[tokio::test(flavor = "multi_thread")]
async fn check_reports_bad_settings() {
    let db = MariaDb::builder().arg("--binlog-row-metadata=MINIMAL").arg("--binlog-row-image=MINIMAL").start();
    let broker = Broker::start(Engine::Memory);
    let mut connector = Connector::new();
    let config = connector.write_config(&db, &broker, "");
    connector.spawn(["check".into(), "--config".into(), config.into_os_string()]);
    let status = connector.wait_exit(Duration::from_secs(60)).expect("check must finish");
    assert_eq!(status.code(), Some(2), "{}", connector.logs());
    let out = connector.stdout();
    assert!(out.contains("[FAIL] binlog_row_metadata: expected FULL, actual MINIMAL"), "{out}");
    assert!(out.contains("[FAIL] binlog_row_image: expected FULL, actual MINIMAL"), "{out}");
    assert!(out.contains("fix: SET GLOBAL binlog_row_metadata = 'FULL'"), "{out}");
    assert!(out.contains("[ok  ] binlog_format"), "{out}");

    // `run` refuses to start on the same server, with the same diagnosis.
    let config = connector.config_path();
    connector.run(&config);
    let status = connector.wait_exit(Duration::from_secs(60)).expect("run must stop");
    assert_eq!(status.code(), Some(2), "{}", connector.logs());
    assert!(connector.stderr().contains("binlog_row_metadata"), "{}", connector.logs());
}

/// Missing privileges and a missing outbox table are reported by `check`.
#[tokio::test(flavor = "multi_thread")]
async fn check_reports_missing_grants_and_table() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    db.sql("REVOKE REPLICATION SLAVE ON *.* FROM 'cdc'@'127.0.0.1'; REVOKE REPLICATION SLAVE ON *.* FROM 'cdc'@'localhost'; DROP TABLE shop.outbox_events;");
    let mut connector = Connector::new();
    let config = connector.write_config(&db, &broker, "");
    connector.spawn(["check".into(), "--config".into(), config.into_os_string()]);
    let status = connector.wait_exit(Duration::from_secs(60)).expect("check must finish");
    assert_eq!(status.code(), Some(2), "{}", connector.logs());
    let out = connector.stdout();
    assert!(out.contains("[FAIL] privilege REPLICATION SLAVE"), "{out}");
    assert!(out.contains("[FAIL] table shop.outbox_events"), "{out}");
}

/// With `create_topics = false`, a routed topic that does not exist stops the connector with a definite
/// error naming the topic.
#[tokio::test(flavor = "multi_thread")]
async fn missing_topic_without_create_is_definite() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Sqlite);
    let mut conn = db.conn().await;
    business_tx(&mut conn, "A-1").await.unwrap();
    let mut connector = Connector::new();
    let config = connector.write_config(&db, &broker, "");
    let text = std::fs::read_to_string(&config).unwrap().replace("[state]", "create_topics = false\n\n[state]");
    std::fs::write(&config, text).unwrap();
    connector.run(&config);
    let status = connector
        .wait_exit(Duration::from_secs(60))
        .unwrap_or_else(|| panic!("connector must stop\n{}", connector.logs()));
    assert_eq!(status.code(), Some(2), "{}", connector.logs());
    assert!(connector.stderr().contains("\"outbox.event.order\" does not exist"), "{}", connector.logs());
}

/// `on_update = "fail"` turns an UPDATE of an outbox row into a definite error.
#[tokio::test(flavor = "multi_thread")]
async fn update_fails_when_configured() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let mut conn = db.conn().await;
    let mut connector = Connector::new();
    let config = connector.write_config(&db, &broker, "");
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("table = \"shop.outbox_events\"", "table = \"shop.outbox_events\"\non_update = \"fail\"");
    std::fs::write(&config, text).unwrap();
    connector.run(&config);
    let id = business_tx(&mut conn, "A-1").await.unwrap();
    assert_eq!(broker.read_all(TOPIC, 1, READ_TIMEOUT).len(), 1, "{}", connector.logs());
    conn.exec_drop("UPDATE shop.outbox_events SET attempts = attempts + 1 WHERE id = ?", (id,)).await.unwrap();
    let status = connector
        .wait_exit(Duration::from_secs(60))
        .unwrap_or_else(|| panic!("connector must stop\n{}", connector.logs()));
    assert_eq!(status.code(), Some(2), "{}", connector.logs());
    assert!(connector.stderr().contains("UPDATE on outbox table shop.outbox_events"), "{}", connector.logs());
}

/// A checkpoint written against one server is not resumed against another without
/// `--accept-new-server`.
#[tokio::test(flavor = "multi_thread")]
async fn different_server_is_refused() {
    let first = MariaDb::builder().server_id(11).start();
    let second = MariaDb::builder().server_id(22).start();
    let broker = Broker::start(Engine::Memory);
    let mut connector = Connector::start(&first, &broker, "");
    let mut conn = first.conn().await;
    business_tx(&mut conn, "A-1").await.unwrap();
    assert_eq!(broker.read_all(TOPIC, 1, READ_TIMEOUT).len(), 1, "{}", connector.logs());
    assert!(connector.terminate().success());

    let config = connector.write_config(&second, &broker, "");
    connector.run(&config);
    let status = connector
        .wait_exit(Duration::from_secs(60))
        .unwrap_or_else(|| panic!("connector must stop\n{}", connector.logs()));
    assert_eq!(status.code(), Some(2), "{}", connector.logs());
    assert!(connector.stderr().contains("checkpoint belongs to another server"), "{}", connector.logs());
}

/// A server that is itself a replica must write replicated transactions to its own binlog
/// (`log_slave_updates`), or events written on its primary never reach the connector.
#[tokio::test(flavor = "multi_thread")]
async fn check_requires_log_slave_updates_on_a_replica() {
    let db = MariaDb::builder().arg("--log-slave-updates=0").start();
    let broker = Broker::start(Engine::Memory);
    // Configured as a replica of some primary (never started): enough for the server to report it.
    db.sql("CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT=1, MASTER_USER='repl'");
    let mut connector = Connector::new();
    let config = connector.write_config(&db, &broker, "");
    connector.spawn(["check".into(), "--config".into(), config.into_os_string()]);
    let status = connector.wait_exit(Duration::from_secs(60)).expect("check must finish");
    assert_eq!(status.code(), Some(2), "{}", connector.logs());
    let out = connector.stdout();
    assert!(out.contains("[FAIL] log_slave_updates: expected ON (the server is a replica), actual OFF"), "{out}");
}
