//! Outbox tables that are not our reference schema, against a real MariaDB and a real broker: Debezium's
//! reference table mapped through `[outbox.columns]` (no `schema_version`, no `occurred_at`), BINARY(16)
//! ids, BIGINT aggregate ids, a TIMESTAMP(6) `occurred_at`, and an integer id standing in for a missing
//! `occurred_at`. Each table is streamed and, where its rows can be ordered, snapshotted; the two paths
//! must publish identical records for identical rows, and `outbox-cdc audit` must pass.

mod common;

use std::time::Duration;

use common::{Broker, Connector, Engine, MariaDb, Received};

const READ_TIMEOUT: Duration = Duration::from_secs(120);
const DEAD_LETTER: &str = "outbox-cdc.dead-letter";
const TOPIC: &str = "outbox.event.order";

/// Debezium's names, mapped onto our roles.
const DEBEZIUM_COLUMNS: &str = "[outbox.columns]\nid = \"id\"\naggregate_type = \"aggregatetype\"\n\
     aggregate_id = \"aggregateid\"\nevent_type = \"type\"\npayload = \"payload\"\n";

/// Replaces the reference table with `ddl` (a `CREATE TABLE shop.outbox_events …`).
fn reshape(db: &MariaDb, ddl: &str) {
    db.sql("DROP TABLE shop.outbox_events");
    db.sql(ddl);
}

/// How long a test waits for the connector to stream.
const STREAMING_TIMEOUT: Duration = Duration::from_secs(120);

fn value(r: &Received) -> serde_json::Value {
    serde_json::from_slice(r.value.as_deref().expect("a value")).expect("a JSON value")
}

/// What a record says apart from which row it is and which path read it: key, value without
/// `event_id`, headers without `id` and `source`. The snapshot's and the stream's records of equal rows
/// must be equal in this.
fn content(r: &Received) -> serde_json::Value {
    let mut v = value(r);
    v.as_object_mut().expect("an envelope").remove("event_id");
    let headers: Vec<(String, String)> = r
        .headers
        .iter()
        .filter(|(k, _)| k != "id" && k != "source")
        .map(|(k, v)| (k.clone(), String::from_utf8_lossy(v).into_owned()))
        .collect();
    serde_json::json!({ "key": String::from_utf8_lossy(r.key.as_deref().unwrap_or_default()), "value": v, "headers": headers })
}

/// The record whose `id` header is `id`.
fn by_id<'a>(records: &'a [Received], id: &str, connector: &Connector) -> &'a Received {
    records
        .iter()
        .find(|r| r.header_str("id") == Some(id))
        .unwrap_or_else(|| panic!("{id} was not published\n{}", connector.logs()))
}

/// Runs the audit and requires it to pass.
fn audit_passes(connector: &Connector) {
    let run = connector.audit(&[]);
    assert_eq!(run.code, Some(0), "audit: {}\n{}", run.report, run.stderr);
    assert_eq!(run.count("missing"), 0, "{}", run.report);
}

/// Debezium's reference outbox table as it is (`id` VARCHAR(255), `aggregatetype`, `aggregateid`, `type`,
/// `payload` JSON; no `schema_version`, no `occurred_at`, no `headers`): preflight used to refuse it for
/// the missing columns. It streams; its records leave out `version` and `occurred_at` (never `null`) and
/// the `schema_version` header. Its snapshot is refused with the reason and the fix: nothing in the table
/// says in which order one aggregate's events were written.
///
/// Guards against a refusal that only the docs explain: under the default `snapshot.mode`, `check` itself
/// names both settings that make the table work (a time column mapped as `occurred_at`, or `[snapshot]
/// mode = "never"` with `start_after` in MySQL and MariaDB form), and each of them passes `check`.
#[tokio::test(flavor = "multi_thread")]
async fn debezium_reference_table_streams_and_its_snapshot_is_refused() {
    let db = MariaDb::start();
    reshape(
        &db,
        "CREATE TABLE shop.outbox_events (id VARCHAR(255) PRIMARY KEY, aggregatetype VARCHAR(255) NOT NULL, \
         aggregateid VARCHAR(255) NOT NULL, type VARCHAR(255) NOT NULL, payload JSON) DEFAULT CHARSET=utf8mb4",
    );
    let broker = Broker::start(Engine::Memory);
    let connector = Connector::new();
    // An empty [snapshot] table: the default mode, not the harness's "never".
    connector.write_config(&db, &broker, &format!("{DEBEZIUM_COLUMNS}[snapshot]\n"));
    let (status, out, err) = connector.command(&["check"], Duration::from_secs(60)).unwrap();
    assert_eq!(status.code(), Some(2), "{out}{err}");
    assert!(out.contains("[ok  ] table shop.outbox_events columns"), "{out}");
    assert!(out.contains("[FAIL] table shop.outbox_events snapshot key order"), "{out}");
    assert!(out.contains("has no occurred_at column and its id column id is not an integer"), "{out}");
    for fix in [
        "snapshot.mode \"initial\", the default",
        "`[outbox.columns] occurred_at = \"created_at\"`",
        "`[snapshot] mode = \"never\"`",
        "`[source] start_after = \"3e11fa47-71ca-11e1-9e33-c80aa9429562:1-1000\"` on MySQL",
        "`\"0-1-1000\"` on MariaDB",
    ] {
        assert!(out.contains(fix), "check does not say {fix:?}:\n{out}");
    }
    assert!(out.contains("absent: records carry no envelope `version`"), "{out}");
    connector.write_config(&db, &broker, &format!("{DEBEZIUM_COLUMNS}[snapshot]\nmode = \"never\"\n"));
    let (status, out, err) = connector.command(&["check"], Duration::from_secs(60)).unwrap();
    assert_eq!(status.code(), Some(0), "snapshot.mode = \"never\" passes check\n{out}{err}");

    let mut connector = Connector::start(&db, &broker, DEBEZIUM_COLUMNS);
    connector.wait_streaming(STREAMING_TIMEOUT);
    for (i, aggregate) in ["o-1", "o-2", "o-1"].iter().enumerate() {
        db.sql(&format!(
            "INSERT INTO shop.outbox_events VALUES ('e-{i}', 'order', '{aggregate}', 'OrderEvent{i}', \
             '{{\"n\": {i}, \"text\": \"\u{1F680}\"}}')"
        ));
    }
    let records = broker.read_all(TOPIC, 3, READ_TIMEOUT);
    assert_eq!(records.len(), 3, "{}", connector.logs());
    let first = by_id(&records, "e-0", &connector);
    assert_eq!(first.key.as_deref(), Some(&b"o-1"[..]));
    assert_eq!(
        value(first),
        serde_json::json!({"event_id": "e-0", "type": "OrderEvent0", "aggregate_type": "order",
                           "aggregate_id": "o-1", "data": {"n": 0, "text": "\u{1F680}"}})
    );
    let names: Vec<&str> = first.headers.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, ["id", "event_type", "aggregate_type"]);
    assert!(broker.read_all(DEAD_LETTER, 1, Duration::from_secs(2)).is_empty(), "{}", connector.logs());
    connector.terminate();
    audit_passes(&connector);

    // The other fix: a time column mapped as occurred_at orders the snapshot under the default mode.
    db.sql("ALTER TABLE shop.outbox_events ADD created_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)");
    connector.write_config(&db, &broker, &format!("{DEBEZIUM_COLUMNS}occurred_at = \"created_at\"\n[snapshot]\n"));
    let (status, out, err) = connector.command(&["check"], Duration::from_secs(60)).unwrap();
    assert!(out.contains("[ok  ] table shop.outbox_events snapshot key order"), "{out}{err}");
    assert_eq!(status.code(), Some(0), "occurred_at = \"created_at\" passes check\n{out}{err}");
}

/// A name set in `[outbox.columns]` must exist: a typo is a definite error naming it, never a silently
/// dropped field (an optional column absent under its *default* name is fine).
#[tokio::test(flavor = "multi_thread")]
async fn a_misspelt_optional_column_is_refused_by_name() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let connector = Connector::new();
    connector.write_config(&db, &broker, "[outbox.columns]\noccurred_at = \"occured_at\"\n");
    let (status, out, err) = connector.command(&["check"], Duration::from_secs(60)).unwrap();
    assert_eq!(status.code(), Some(2), "{out}{err}");
    assert!(out.contains("missing `occured_at` (occurred_at)"), "{out}");
}

/// Debezium's table with the variants teams run: a BINARY(16) UUID id, a BIGINT aggregate id and a
/// TIMESTAMP(6) mapped as `occurred_at`. Ids with 0x00 and 0xFF bytes and trailing zero bytes (which the
/// binlog leaves out) are published as the same UUID text by the snapshot and the stream; aggregate ids
/// 20 and 100 are scanned in numeric order one row per chunk (the keyset resumes after a BINARY id and a
/// BIGINT); the two paths publish identical records, and the audit passes.
#[tokio::test(flavor = "multi_thread")]
async fn binary_ids_bigint_aggregates_and_timestamps_snapshot_and_stream_alike() {
    // TIMESTAMP values are written in the session's zone and published in UTC: make them the same here.
    let db = MariaDb::builder().arg("--default-time-zone=+00:00").start();
    reshape(
        &db,
        "CREATE TABLE shop.outbox_events (id BINARY(16) PRIMARY KEY, aggregatetype VARCHAR(255) NOT NULL, \
         aggregateid BIGINT NOT NULL, type VARCHAR(255) NOT NULL, payload JSON NOT NULL, \
         created_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), \
         KEY idx_aggregate (aggregatetype, aggregateid, created_at)) DEFAULT CHARSET=utf8mb4",
    );
    let rows: [(i64, &str); 4] = [
        (100, "1970-01-01 00:00:01.000000"),
        (20, "2026-03-29 01:00:00.000001"),
        (100, "2026-10-25 00:59:59.999999"),
        (-7, "2038-01-19 03:14:07.000000"),
    ];
    // `source` 0x00 for the snapshot's rows, 0xff for the stream's; trailing zeros are in every id. The
    // stream's rows go to other aggregates (+1000): theirs would otherwise be out of occurred_at order
    // after the snapshot's, which the audit rightly reports.
    let id = |source: u8, i: usize| format!("{source:02x}ff00{i:02x}-0000-4000-8000-000000000000");
    let aggregate_of = |source: u8, aggregate: i64| if source == 0 { aggregate } else { aggregate + 1000 };
    let insert = |source: u8| {
        for (i, (aggregate, at)) in rows.iter().enumerate() {
            db.sql(&format!(
                "INSERT INTO shop.outbox_events VALUES (UNHEX(REPLACE('{}', '-', '')), 'order', {}, \
                 'Placed', '{{\"i\": {i}}}', '{at}')",
                id(source, i),
                aggregate_of(source, *aggregate)
            ));
        }
    };
    insert(0x00);
    let columns = format!("{DEBEZIUM_COLUMNS}occurred_at = \"created_at\"\n");
    let broker = Broker::start(Engine::Memory);
    let mut connector =
        Connector::start(&db, &broker, &format!("{columns}[snapshot]\nmode = \"initial\"\nchunk_rows = 1\n"));
    connector.wait_streaming(STREAMING_TIMEOUT);
    insert(0xff);
    let records = broker.read_all(TOPIC, 8, READ_TIMEOUT);
    assert_eq!(records.len(), 8, "{}", connector.logs());
    for (i, (aggregate, at)) in rows.iter().enumerate() {
        let snap = by_id(&records, &id(0x00, i), &connector);
        let stream = by_id(&records, &id(0xff, i), &connector);
        assert_eq!(snap.header_str("source"), Some("snapshot"));
        for (source, record) in [(0x00, snap), (0xff, stream)] {
            let v = value(record);
            let aggregate = aggregate_of(source, *aggregate).to_string();
            assert_eq!((&v["aggregate_id"], &v["event_id"]), (&aggregate.clone().into(), &id(source, i).into()), "{v}");
            assert_eq!(v["occurred_at"], at.replacen(' ', "T", 1), "{v}");
            assert_eq!(record.key.as_deref(), Some(aggregate.as_bytes()));
        }
        let without_aggregate = |r: &Received| {
            let mut c = content(r);
            c["key"] = serde_json::Value::Null;
            c["value"]["aggregate_id"] = serde_json::Value::Null;
            c
        };
        assert_eq!(without_aggregate(snap), without_aggregate(stream), "row {i}");
    }
    // Per aggregate, the snapshot's records come in occurred_at order.
    let snapshot_order: Vec<String> = records
        .iter()
        .filter(|r| r.header_str("source") == Some("snapshot") && r.key.as_deref() == Some(&b"100"[..]))
        .map(|r| r.header_str("id").unwrap().to_string())
        .collect();
    assert_eq!(snapshot_order, [id(0, 0), id(0, 2)]);
    assert!(broker.read_all(DEAD_LETTER, 1, Duration::from_secs(2)).is_empty(), "{}", connector.logs());
    connector.terminate();
    audit_passes(&connector);
}

/// A table without `occurred_at` whose id is an AUTO_INCREMENT BIGINT, and without an index for the
/// snapshot: `check` warns with the `ALTER TABLE` that adds one; the snapshot orders each aggregate's rows
/// by the id (the key is in effect `(aggregate_type, aggregate_id, id)`, stored in the checkpoint with the
/// id in `occurred_at`'s place) and resumes after it chunk by chunk; the snapshot and the stream publish
/// identical records, without `occurred_at`, and the audit passes.
#[tokio::test(flavor = "multi_thread")]
async fn integer_ids_order_a_table_without_occurred_at() {
    let db = MariaDb::start();
    reshape(
        &db,
        "CREATE TABLE shop.outbox_events (id BIGINT UNSIGNED AUTO_INCREMENT PRIMARY KEY, \
         aggregate_type VARCHAR(64) NOT NULL, aggregate_id VARCHAR(128) NOT NULL, event_type VARCHAR(128) NOT NULL, \
         schema_version INT NOT NULL, payload LONGTEXT NOT NULL) DEFAULT CHARSET=utf8mb4",
    );
    // Ids 1..=12: the snapshot's rows 1..=6, the stream's 7..=12, row i and row i + 6 alike.
    let insert = || {
        for i in 0..6 {
            db.sql(&format!(
                "INSERT INTO shop.outbox_events (aggregate_type, aggregate_id, event_type, schema_version, payload) \
                 VALUES ('order', 'a-{}', 'E{i}', {i}, '{{\"i\": {i}}}')",
                i % 2
            ));
        }
    };
    insert();
    let broker = Broker::start(Engine::Memory);
    // No index serves the snapshot's order: check says so with the ALTER TABLE, and shows how each column
    // is published; the snapshot still runs, in order.
    let snapshot = "[snapshot]\nmode = \"initial\"\nchunk_rows = 2\n";
    let checker = Connector::new();
    checker.write_config(&db, &broker, snapshot);
    let (status, out, err) = checker.command(&["check"], Duration::from_secs(60)).unwrap();
    assert!(status.success(), "{out}{err}");
    assert!(out.contains("[WARN] table shop.outbox_events snapshot index"), "{out}");
    assert!(
        out.contains(
            "ALTER TABLE `shop`.`outbox_events` ADD INDEX idx_outbox_cdc_snapshot (`aggregate_type`, `aggregate_id`)"
        ),
        "{out}"
    );
    assert!(out.contains("[ok  ] table shop.outbox_events id: expected a mapped column, or absent if optional, actual `id` bigint(20) unsigned: its decimal digits"), "{out}");
    assert!(out.contains("[ok  ] table shop.outbox_events occurred_at: expected a mapped column, or absent if optional, actual absent"), "{out}");
    let mut connector = Connector::start(&db, &broker, snapshot);
    connector.wait_streaming(STREAMING_TIMEOUT);
    insert();
    let records = broker.read_all(TOPIC, 12, READ_TIMEOUT);
    assert_eq!(records.len(), 12, "{}", connector.logs());
    for i in 1..=6 {
        let snap = by_id(&records, &i.to_string(), &connector);
        let stream = by_id(&records, &(i + 6).to_string(), &connector);
        assert_eq!(snap.header_str("source"), Some("snapshot"));
        assert_eq!(content(snap), content(stream), "row {i}");
        assert!(value(stream).get("occurred_at").is_none(), "{}", value(stream));
    }
    // Per aggregate, in id order: a-0 holds 1, 3, 5 and then the stream's 7, 9, 11.
    let a0: Vec<&str> =
        records.iter().filter(|r| r.key.as_deref() == Some(&b"a-0"[..])).map(|r| r.header_str("id").unwrap()).collect();
    assert_eq!(a0, ["1", "3", "5", "7", "9", "11"]);
    connector.terminate();
    audit_passes(&connector);
}

/// A table of Avro/Protobuf users: the payload a LONGBLOB (`payload_encoding = "bytes"`, `value_format =
/// "payload"`), `schema_version` text, a NULL or empty payload published as a tombstone
/// (`tombstone_on_empty_payload`). The bytes (0x00, 0xFF, invalid UTF-8, not JSON) arrive unchanged,
/// from the snapshot and from the stream alike; tombstones keep the key and headers; `check` says how the
/// payload is published; nothing is dead-lettered and the audit passes.
#[tokio::test(flavor = "multi_thread")]
async fn bytes_payloads_and_tombstones_snapshot_and_stream_alike() {
    let db = MariaDb::start();
    reshape(
        &db,
        "CREATE TABLE shop.outbox_events (id VARCHAR(64) PRIMARY KEY, aggregate_type VARCHAR(64) NOT NULL, \
         aggregate_id VARCHAR(128) NOT NULL, event_type VARCHAR(128) NOT NULL, schema_version VARCHAR(16) NOT NULL, \
         payload LONGBLOB NULL, occurred_at DATETIME(6) NOT NULL, \
         KEY idx_aggregate (aggregate_type, aggregate_id, occurred_at)) DEFAULT CHARSET=utf8mb4",
    );
    // (hex payload or NULL, expected value: None = tombstone)
    let rows: [(&str, Option<&[u8]>); 4] = [
        ("X'00FFC328007B'", Some(&[0x00, 0xff, 0xc3, 0x28, 0x00, 0x7b])),
        ("X''", None),
        ("NULL", None),
        ("X'0A0B'", Some(&[0x0a, 0x0b])),
    ];
    let insert = |prefix: &str| {
        for (i, (payload, _)) in rows.iter().enumerate() {
            db.sql(&format!(
                "INSERT INTO shop.outbox_events VALUES ('{prefix}-{i}', 'order', '{prefix}-a', 'E{i}', 'v2.{i}', \
                 {payload}, '2026-11-30 12:00:00.00000{i}')"
            ));
        }
    };
    insert("snap");
    let broker = Broker::start(Engine::Memory);
    let extra = "[outbox]\npayload_encoding = \"bytes\"\ntombstone_on_empty_payload = true\n\
                 [kafka]\nvalue_format = \"payload\"\n[snapshot]\nmode = \"initial\"\nchunk_rows = 1\n";
    // The harness writes [outbox] and [kafka] itself: merge ours into them.
    let checker = Connector::new();
    merged_config(&checker, &db, &broker, extra);
    let (status, out, err) = checker.command(&["check"], Duration::from_secs(60)).unwrap();
    assert!(status.success(), "{out}{err}");
    assert!(out.contains("`payload` longblob: its bytes unchanged (payload_encoding = \"bytes\")"), "{out}");
    let mut connector = Connector::new();
    connector.run(std::path::Path::new(&merged_config(&connector, &db, &broker, extra)));
    connector.wait_streaming(STREAMING_TIMEOUT);
    insert("live");
    let records = broker.read_all(TOPIC, 8, READ_TIMEOUT);
    assert_eq!(records.len(), 8, "{}", connector.logs());
    for prefix in ["snap", "live"] {
        for (i, (_, expected)) in rows.iter().enumerate() {
            let record = by_id(&records, &format!("{prefix}-{i}"), &connector);
            assert_eq!(record.value.as_deref(), *expected, "{prefix}-{i}");
            assert_eq!(record.key.as_deref(), Some(format!("{prefix}-a").as_bytes()), "{prefix}-{i}");
            assert_eq!(record.header_str("schema_version"), Some(format!("v2.{i}").as_str()), "{prefix}-{i}");
            assert_eq!(record.header_str("event_type"), Some(format!("E{i}").as_str()), "{prefix}-{i}");
        }
    }
    assert!(broker.read_all(DEAD_LETTER, 1, Duration::from_secs(2)).is_empty(), "{}", connector.logs());
    connector.terminate();
    audit_passes(&connector);
}

/// The harness's configuration with `extra`'s sections merged key by key into its own (TOML forbids a
/// table twice), written to the connector's directory; its path.
fn merged_config(connector: &Connector, db: &MariaDb, broker: &Broker, extra: &str) -> String {
    let path = connector.write_config(db, broker, "");
    let mut config: toml::Table = std::fs::read_to_string(&path).unwrap().parse().unwrap();
    let extra: toml::Table = extra.parse().unwrap();
    for (name, section) in extra {
        let merged = config.entry(name).or_insert_with(|| toml::Table::new().into());
        for (key, value) in section.as_table().unwrap() {
            merged.as_table_mut().unwrap().insert(key.clone(), value.clone());
        }
    }
    std::fs::write(&path, toml::to_string(&config).unwrap()).unwrap();
    path.to_string_lossy().into_owned()
}
