//! docs/MIGRATING-FROM-DEBEZIUM.md, run as written: its example `connector.toml` (read from the document,
//! with only the connection settings, the state directory and `start_after` replaced) against its example
//! table (Debezium's reference outbox table with a `tenant` column and a `created_at` TIMESTAMP(6)) on a
//! real MariaDB and a real broker, taking over at a GTID position as the document's procedure says.
//!
//! Rows written before the take-over position are Debezium's: none of them may be published again. Every
//! row after it is checked record by record: topic, key (a JSON string, as Debezium's JsonConverter wrote
//! it), headers (`id`, `event_type`, `aggregate_type`, `tenant`, `eventType`), value (the payload JSON
//! itself, or a tombstone for a NULL payload), timestamp (`created_at` in ms) and per-aggregate order.

mod common;

use std::time::Duration;

use common::{Broker, Connector, Engine, MariaDb, Received};

const DOC: &str = include_str!("../docs/MIGRATING-FROM-DEBEZIUM.md");
const TOPIC: &str = "outbox.event.order";

/// The first fenced block of `language` after the heading `heading`.
fn doc_block(heading: &str, language: &str) -> String {
    let section = &DOC[DOC.find(heading).unwrap_or_else(|| panic!("{heading} not in the document"))..];
    let fence = format!("```{language}\n");
    let start = section.find(&fence).unwrap_or_else(|| panic!("no {language} block after {heading}")) + fence.len();
    let end = start + section[start..].find("```").expect("a closed block");
    section[start..end].to_string()
}

/// The document's example configuration, pointed at `db` and `broker`, starting after `gtids`.
fn example_config(connector: &Connector, db: &MariaDb, broker: &Broker, gtids: &str) -> std::path::PathBuf {
    let mut config: toml::Table = doc_block("## The example", "toml").parse().expect("the example is TOML");
    let section = |config: &mut toml::Table, name: &str| -> toml::Table {
        config.get(name).and_then(|v| v.as_table()).cloned().unwrap_or_else(|| panic!("no [{name}]"))
    };
    let mut source = section(&mut config, "source");
    source.remove("password_env");
    source.insert("host".into(), "127.0.0.1".into());
    source.insert("port".into(), i64::from(db.port()).into());
    source.insert("user".into(), "cdc".into());
    source.insert("password".into(), common::mariadb::CDC_PASSWORD.into());
    source.insert("start_after".into(), gtids.into());
    // Never the test server's own id.
    source.insert("server_id".into(), i64::from(db.server_id() % 60_000 + 1_000).into());
    config.insert("source".into(), source.into());
    let mut kafka = section(&mut config, "kafka");
    kafka.insert("bootstrap_servers".into(), broker.bootstrap().into());
    config.insert("kafka".into(), kafka.into());
    let mut state = toml::Table::new();
    state.insert("dir".into(), connector.state_dir().to_string_lossy().into_owned().into());
    config.insert("state".into(), state.into());
    let mut metrics = toml::Table::new();
    metrics.insert("listen".into(), "127.0.0.1:0".into());
    config.insert("metrics".into(), metrics.into());
    let path = connector.dir().join("connector.toml");
    std::fs::write(&path, toml::to_string(&config).unwrap()).unwrap();
    path
}

/// One row of the example table: id, aggregate, type, payload (None: NULL), tenant, created_at.
type Row = (&'static str, &'static str, &'static str, Option<&'static str>, &'static str, &'static str);

fn insert(db: &MariaDb, (id, aggregate, event_type, payload, tenant, at): Row) {
    let payload = payload.map_or("NULL".to_string(), |p| format!("'{p}'"));
    db.sql(&format!(
        "INSERT INTO shop.outbox VALUES ('{id}', 'order', '{aggregate}', '{event_type}', {payload}, '{tenant}', '{at}')"
    ));
}

fn header<'r>(record: &'r Received, name: &str) -> Option<&'r str> {
    record.header_str(name)
}

/// Milliseconds since the epoch of a UTC `YYYY-MM-DD HH:MM:SS.ffffff`.
fn millis(at: &str) -> i64 {
    outbox_cdc::time::parse_occurred_at_ms(&at.replacen(' ', "T", 1)).expect("a date-time")
}

#[tokio::test(flavor = "multi_thread")]
async fn the_documented_example_takes_over_from_debezium_record_by_record() {
    // TIMESTAMP values are written in the session's zone: make it UTC, as the document's example is read.
    let db = MariaDb::builder().arg("--default-time-zone=+00:00").start();
    db.sql(&doc_block("## The example", "sql").replacen("CREATE TABLE outbox", "CREATE TABLE shop.outbox", 1));

    // What Debezium published before it was stopped, then the position its offset holds.
    let debeziums: [Row; 3] = [
        ("d-1", "1", "OrderCreated", Some(r#"{"id": 1}"#), "acme", "2026-11-30 12:00:00.000001"),
        ("d-2", "2", "OrderCreated", Some(r#"{"id": 2}"#), "acme", "2026-11-30 12:00:00.000002"),
        ("d-3", "1", "OrderPaid", Some(r#"{"id": 1, "paid": true}"#), "globex", "2026-11-30 12:00:00.000003"),
    ];
    for row in debeziums {
        insert(&db, row);
    }
    let taken_over_at = db.gtid_binlog_pos();
    // Written while neither connector ran: outbox-cdc must publish exactly these, in this order per aggregate.
    let ours: [Row; 6] = [
        (
            "4d47e190-0402-4048-bc2c-89dd54343cdc",
            "1",
            "OrderShipped",
            Some(r#"{"id": 1, "customerId": 123}"#),
            "acme",
            "2026-11-30 12:34:56.123456",
        ),
        ("e-2", "2", "OrderPaid", Some(r#"{"id": 2, "note": "订单 🚀"}"#), "acme", "2026-11-30 12:34:57.000000"),
        ("e-3", "1", "OrderClosed", None, "acme", "2026-11-30 12:34:58.500000"),
        ("e-4", "say \"3\"", "OrderCreated", Some(r#"{"id": 3}"#), "globex", "1970-01-01 00:00:01.000000"),
        ("e-5", "2", "OrderClosed", Some(r#"{"id": 2}"#), "globex", "2038-01-19 03:14:07.999999"),
        ("e-6", "1", "OrderReopened", Some(r#"{"id": 1}"#), "acme", "2026-11-30 12:35:00.000000"),
    ];
    for row in ours {
        insert(&db, row);
    }
    let broker = Broker::start(Engine::Memory);
    let mut connector = Connector::new();
    let config = example_config(&connector, &db, &broker, &taken_over_at);
    connector.run(&config);

    let records = broker.read_all(TOPIC, ours.len(), Duration::from_secs(120));
    let ids: Vec<&str> = records.iter().filter_map(|r| header(r, "id")).collect();
    assert_eq!(records.len(), ours.len(), "published {ids:?}\n{}", connector.logs());
    for (id, ..) in debeziums {
        assert!(!ids.contains(&id), "{id} was Debezium's and was published again\n{}", connector.logs());
    }
    for (id, aggregate, event_type, payload, tenant, at) in ours {
        let record = records.iter().find(|r| header(r, "id") == Some(id)).expect("published");
        let key = serde_json::to_string(aggregate).unwrap();
        assert_eq!(record.key.as_deref(), Some(key.as_bytes()), "{id}: the key is a JSON string");
        match payload {
            Some(payload) => {
                let value: serde_json::Value = serde_json::from_slice(record.value.as_deref().unwrap()).unwrap();
                assert_eq!(value, serde_json::from_str::<serde_json::Value>(payload).unwrap(), "{id}");
            }
            None => assert_eq!(record.value, None, "{id}: a NULL payload is a tombstone"),
        }
        assert_eq!(record.timestamp, Some(millis(at)), "{id}: the timestamp is created_at");
        let headers: Vec<(&str, &str)> =
            record.headers.iter().map(|(k, v)| (k.as_str(), std::str::from_utf8(v).unwrap())).collect();
        assert_eq!(
            headers,
            [
                ("id", id),
                ("event_type", event_type),
                ("aggregate_type", "order"),
                ("tenant", tenant),
                ("eventType", event_type)
            ],
            "{id}"
        );
    }
    // Per aggregate, one partition, in commit order.
    for aggregate in ["1", "2", "say \"3\""] {
        let key = serde_json::to_string(aggregate).unwrap();
        let of: Vec<&Received> = records.iter().filter(|r| r.key.as_deref() == Some(key.as_bytes())).collect();
        assert!(of.windows(2).all(|w| w[0].partition == w[1].partition && w[0].offset < w[1].offset), "{aggregate}");
        let published: Vec<&str> = of.iter().filter_map(|r| header(r, "id")).collect();
        let written: Vec<&str> = ours.iter().filter(|r| r.1 == aggregate).map(|r| r.0).collect();
        assert_eq!(published, written, "aggregate {aggregate}");
    }
    connector.terminate();
}

/// Runs the README's example against a fresh MariaDB with `start_after = gtid` and returns the connector
/// once it has exited with 2 (a definite error).
fn refused_start_after(gtid: &str) -> Connector {
    let db = MariaDb::start();
    db.sql(&doc_block("## The example", "sql").replacen("CREATE TABLE outbox", "CREATE TABLE shop.outbox", 1));
    let broker = Broker::start(Engine::Memory);
    let mut connector = Connector::new();
    let config = example_config(&connector, &db, &broker, gtid);
    connector.run(&config);
    let status = connector.wait_exit(Duration::from_secs(60)).expect("the connector stops");
    assert_eq!(status.code(), Some(2), "{}", connector.logs());
    connector
}

/// `start_after` refuses GTIDs the server has not executed (another server, a typo): starting there would
/// wait for transactions that never come while the real ones are skipped.
#[tokio::test(flavor = "multi_thread")]
async fn start_after_beyond_the_server_is_refused() {
    let connector = refused_start_after("0-1-999999");
    assert!(connector.stderr().contains("have not reached GTID 0-1-999999"), "{}", connector.logs());
}

/// A MySQL GTID set given to a MariaDB server (a MySQL user's Debezium offset, or a document's example of
/// the other kind) is refused with the form this server takes and an example of it, not only a parse error.
#[tokio::test(flavor = "multi_thread")]
async fn start_after_of_the_other_server_kind_says_which_form_this_server_takes() {
    let connector = refused_start_after("3e11fa47-71ca-11e1-9e33-c80aa9429562:1-1000");
    let err = connector.stderr();
    for part in [
        "not a MariaDB GTID position",
        "This server is MariaDB",
        "@@gtid_binlog_pos",
        "0-1-1000",
        "is a MySQL GTID set",
    ] {
        assert!(err.contains(part), "{part:?} not in\n{}", connector.logs());
    }
}
