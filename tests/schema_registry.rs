//! The Schema Registry formats end to end: MariaDB, the broker, a Schema Registry
//! (tests/common/schema_registry.py), and every record decoded by confluent-kafka's own deserializers with
//! their own registry client, not by anything of ours.
//!
//! Avro values and keys, JSON Schema and Protobuf (descriptors compiled by protoc, not by the connector's
//! protox); missing versions and mismatches dead-lettered; a registry that is down, refuses credentials,
//! takes a bearer token that is rotated on disk, serves TLS with a private CA, or is the second of several
//! URLs; subjects named by the `record_name` and `topic_record_name` strategies as confluent-kafka names them.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::connector::toml_str;
use common::pki::Pki;
use common::registry::{confluent_subjects, replace_file, Framed, SchemaRegistry};
use common::{insert_event, Broker, Connector, Engine, MariaDb, OutboxRow, Received};
use serde_json::{json, Value};

const TOPIC: &str = "outbox.event.order";
const SUBJECT: &str = "outbox.event.order-value";
const DLQ: &str = "outbox-cdc.dead-letter";
const READ_TIMEOUT: Duration = Duration::from_secs(120);
const CLI_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a connector stopped by a definite error may take to exit: connecting and classifying, no retries.
const EXIT_TIMEOUT: Duration = Duration::from_secs(60);

/// Version 1 of the order event: every Avro type the connector reads from JSON.
fn order_v1() -> Value {
    json!({
        "type": "record", "name": "OrderCreated", "namespace": "com.acme.orders",
        "fields": [
            {"name": "order_id", "type": {"type": "string", "logicalType": "uuid"}},
            {"name": "total", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
            {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID", "SHIPPED"]}},
            {"name": "lines", "type": {"type": "array", "items": {"type": "record", "name": "Line", "fields": [
                {"name": "sku", "type": "string"},
                {"name": "qty", "type": "int"},
                {"name": "weight", "type": "double"}]}}},
            {"name": "attributes", "type": {"type": "map", "values": "string"}},
            {"name": "coupon", "type": ["null", "string"], "default": null},
            {"name": "gift", "type": ["null", "Line"], "default": null},
            {"name": "placed_on", "type": {"type": "int", "logicalType": "date"}},
            {"name": "cutoff", "type": {"type": "int", "logicalType": "time-millis"}},
            {"name": "placed_at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
            {"name": "checksum", "type": {"type": "fixed", "name": "Checksum", "size": 4}},
            {"name": "raw", "type": "bytes", "default": ""},
            {"name": "priority", "type": "boolean", "default": false},
            {"name": "count", "type": "long"},
            {"name": "ratio", "type": "float"}
        ]
    })
}

/// Version 2: one more field, with a default (a backward-compatible evolution).
fn order_v2() -> Value {
    let mut v2 = order_v1();
    v2["fields"].as_array_mut().unwrap().push(json!({"name": "channel", "type": "string", "default": "web"}));
    v2
}

fn payload(n: i64) -> Value {
    json!({
        "order_id": "0b0e1c9e-8d2f-4f7e-9c1a-2a2b3c4d5e6f",
        "total": format!("{n}99.05"),
        "status": "PAID",
        "lines": [{"sku": "A-1", "qty": 2, "weight": 0.25}, {"sku": "Ü-2", "qty": 1, "weight": 3}],
        "attributes": {"tenant": "acme"},
        "coupon": {"string": "XMAS"},
        "gift": {"sku": "G", "qty": 1, "weight": 0.5},
        "placed_on": "2026-12-03",
        "cutoff": "17:30:00.250",
        "placed_at": "2026-12-03T12:34:56.123456+01:00",
        "checksum": "\u{00}\u{ff}AB",
        "count": n,
        "ratio": 0.5
    })
}

/// What confluent-kafka's AvroDeserializer returns for [`payload`] (decimals, dates and times as Python
/// prints them).
fn decoded(n: i64) -> Value {
    json!({
        "order_id": "0b0e1c9e-8d2f-4f7e-9c1a-2a2b3c4d5e6f",
        "total": format!("{n}99.05"),
        "status": "PAID",
        "lines": [{"sku": "A-1", "qty": 2, "weight": 0.25}, {"sku": "Ü-2", "qty": 1, "weight": 3.0}],
        "attributes": {"tenant": "acme"},
        "coupon": "XMAS",
        "gift": {"sku": "G", "qty": 1, "weight": 0.5},
        "placed_on": "2026-12-03",
        "cutoff": "17:30:00.250000",
        "placed_at": "2026-12-03T11:34:56.123456+00:00",
        "checksum": "\u{00}\u{ff}AB",
        "raw": "",
        "priority": false,
        "count": n,
        "ratio": 0.5
    })
}

fn registry_toml(registry: &SchemaRegistry, extra: &str) -> String {
    format!("\n[schema_registry]\nurl = \"{}\"\n{extra}\n", registry.url())
}

/// The connector's config with `kafka_extra` in `[kafka]` (`value_format = "avro"` unless it says
/// another) and `tail` appended.
fn config(connector: &Connector, db: &MariaDb, broker: &Broker, kafka_extra: &str, tail: &str) -> PathBuf {
    let path = connector.write_config(db, broker, tail);
    let format = if kafka_extra.contains("value_format") { "" } else { "value_format = \"avro\"\n" };
    let text = std::fs::read_to_string(&path).unwrap().replace(
        "topic = \"outbox.event.${aggregate_type}\"",
        &format!("topic = \"outbox.event.${{aggregate_type}}\"\n{format}{kafka_extra}"),
    );
    std::fs::write(&path, text).unwrap();
    path
}

fn decode(registry: &SchemaRegistry, records: &[Received]) -> Vec<Value> {
    decode_as(registry, "avro", records)
}

fn decode_as(registry: &SchemaRegistry, format: &str, records: &[Received]) -> Vec<Value> {
    let framed: Vec<Framed<'_>> = records
        .iter()
        .map(|r| Framed { topic: &r.topic, format, key: false, bytes: r.value.as_deref().unwrap() })
        .collect();
    registry.decode(&framed)
}

fn by_id<'a>(records: &'a [Received], id: &str) -> &'a Received {
    records.iter().find(|r| r.header_str("id") == Some(id)).unwrap_or_else(|| panic!("no record {id}"))
}

/// Snapshot and stream, every Avro type, keys as Avro strings, and two versions of one event type in one
/// topic, each record with its own version's id; headers as with `value_format = "payload"`.
#[tokio::test(flavor = "multi_thread")]
async fn snapshot_and_stream_publish_avro_that_confluent_decodes() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let registry = SchemaRegistry::start();
    let v1 = registry.register(SUBJECT, "AVRO", &order_v1().to_string(), &[]);
    let v2 = registry.register(SUBJECT, "AVRO", &order_v2().to_string(), &[]);
    assert_ne!(v1, v2);
    let key_id = registry.register(&format!("{TOPIC}-key"), "AVRO", "\"string\"", &[]);
    let mut conn = db.conn().await;
    let snapshot = OutboxRow::new("客户-1").schema_version(1).payload(payload(1));
    insert_event(&mut conn, &snapshot).await.unwrap();

    let mut connector = Connector::new();
    let path = config(
        &connector,
        &db,
        &broker,
        "key_format = \"avro\"",
        &format!("[snapshot]\nmode = \"initial\"\n{}", registry_toml(&registry, "")),
    );
    connector.run(&path);
    let mut v2_payload = payload(2);
    v2_payload["channel"] = json!("app");
    let streamed_v1 = OutboxRow::new("A-2").schema_version(1).payload(payload(3));
    let streamed_v2 = OutboxRow::new("A-2").schema_version(2).payload(v2_payload);
    for row in [&streamed_v1, &streamed_v2] {
        insert_event(&mut conn, row).await.unwrap();
    }
    let records = broker.read_all(TOPIC, 3, READ_TIMEOUT);
    assert_eq!(records.len(), 3, "{}", connector.logs());
    let ordered: Vec<&Received> =
        [&snapshot.id, &streamed_v1.id, &streamed_v2.id].iter().map(|id| by_id(&records, id)).collect();
    let owned: Vec<Received> = ordered.iter().map(|r| (*r).clone()).collect();
    let values = decode(&registry, &owned);
    let mut want_v2 = decoded(2);
    want_v2["channel"] = json!("app");
    assert_eq!(values[0], json!({"id": v1, "value": decoded(1)}));
    assert_eq!(values[1], json!({"id": v1, "value": decoded(3)}));
    assert_eq!(values[2], json!({"id": v2, "value": want_v2}));
    assert_eq!(ordered[0].header_str("source"), Some("snapshot"));
    assert_eq!(ordered[2].header_str("schema_version"), Some("2"));
    assert_eq!(ordered[2].header_str("event_type"), Some("OrderCreated"));

    let keys: Vec<Framed<'_>> = owned
        .iter()
        .map(|r| Framed { topic: TOPIC, format: "avro", key: true, bytes: r.key.as_deref().unwrap() })
        .collect();
    let keys = registry.decode(&keys);
    assert_eq!(keys[0], json!({"id": key_id, "value": "客户-1"}));
    assert_eq!(keys[2], json!({"id": key_id, "value": "A-2"}));
    connector.terminate();
}

fn dead_letter(broker: &Broker, id: &str, at_least: usize) -> Value {
    let dead = broker.read_all(DLQ, at_least, READ_TIMEOUT);
    let letter = by_id(&dead, id);
    serde_json::from_slice(letter.value.as_deref().unwrap()).unwrap()
}

/// A payload that does not fit is dead-lettered with the field path and the reason, its aggregate held,
/// others flow on; a row naming a version the registry does not have is dead-lettered too (never published
/// without its schema). Once the schema is registered, `quarantine release` publishes both with it.
#[tokio::test(flavor = "multi_thread")]
async fn mismatch_and_missing_version_are_dead_lettered_and_released_after_the_fix() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let registry = SchemaRegistry::start();
    let v1 = registry.register(SUBJECT, "AVRO", &order_v1().to_string(), &[]);
    let mut conn = db.conn().await;
    let mut bad = payload(1);
    bad["lines"][1]["qty"] = json!("one");
    let mismatch = OutboxRow::new("P-1").schema_version(1).payload(bad.clone());
    let held = OutboxRow::new("P-1").schema_version(1).payload(payload(2));
    let missing = OutboxRow::new("M-1").schema_version(2).payload(payload(3));
    let healthy = OutboxRow::new("H-1").schema_version(1).payload(payload(4));
    for row in [&mismatch, &held, &missing, &healthy] {
        insert_event(&mut conn, row).await.unwrap();
    }
    let mut connector = Connector::new();
    let path = config(&connector, &db, &broker, "", &registry_toml(&registry, ""));
    connector.run(&path);

    let healthy_record = broker.read_all(TOPIC, 1, READ_TIMEOUT);
    assert_eq!(healthy_record.len(), 1, "{}", connector.logs());
    assert_eq!(healthy_record[0].header_str("id"), Some(healthy.id.as_str()));
    let letter = dead_letter(&broker, &mismatch.id, 3);
    assert_eq!(letter["kind"], "schema_mismatch", "{letter}");
    let reason = letter["reason"].as_str().unwrap();
    assert!(reason.contains("$.lines[1].qty") && reason.contains("expected an integer (int)"), "{reason}");
    assert!(reason.contains(&format!("schema id {v1}")), "{reason}");
    assert_eq!(dead_letter(&broker, &held.id, 3)["kind"], "quarantined");
    let letter = dead_letter(&broker, &missing.id, 3);
    assert_eq!(letter["kind"], "schema_missing", "{letter}");
    assert!(letter["reason"].as_str().unwrap().contains("version 2"), "{letter}");
    assert!(connector.terminate().success());

    // The fixes: version 2 registered (the missing row's), and the mismatched event's schema changed so
    // that `qty` may be a string, released with `version = "latest"`.
    let v2 = registry.register(SUBJECT, "AVRO", &order_v2().to_string(), &[]);
    let (status, out, err) = connector.command(&["quarantine", "release", "order", "M-1"], CLI_TIMEOUT).unwrap();
    assert!(status.success(), "{out}{err}");
    let mut v3 = order_v2();
    v3["fields"][3]["type"]["items"]["fields"][1]["type"] = json!(["int", "string"]);
    let v3 = registry.register(SUBJECT, "AVRO", &v3.to_string(), &[]);
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("\n[schema_registry]\n", "\n[schema_registry]\nversion = \"latest\"\n");
    std::fs::write(&path, text).unwrap();
    let (status, out, err) = connector.command(&["quarantine", "release", "order", "P-1"], CLI_TIMEOUT).unwrap();
    assert!(status.success(), "{out}{err}");

    let normal = broker.read_all(TOPIC, 4, READ_TIMEOUT);
    let released: Vec<Received> =
        [&missing.id, &mismatch.id, &held.id].iter().map(|id| by_id(&normal, id).clone()).collect();
    let values = decode(&registry, &released);
    let mut want_missing = decoded(3);
    want_missing["channel"] = json!("web");
    assert_eq!(values[0], json!({"id": v2, "value": want_missing}));
    let mut want_mismatch = decoded(1);
    want_mismatch["channel"] = json!("web");
    want_mismatch["lines"][1]["qty"] = json!("one");
    assert_eq!(values[1], json!({"id": v3, "value": want_mismatch}));
    assert_eq!(values[2]["id"], json!(v3));
}

/// A registry that cannot be reached is waited out: nothing published, nothing dead-lettered, the rows
/// published once it answers; a known schema keeps publishing while the registry is away.
#[tokio::test(flavor = "multi_thread")]
async fn registry_down_is_waited_out() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let mut registry = SchemaRegistry::start();
    let v1 = registry.register(SUBJECT, "AVRO", &order_v1().to_string(), &[]);
    let mut conn = db.conn().await;
    let first = OutboxRow::new("A-1").schema_version(1).payload(payload(1));
    insert_event(&mut conn, &first).await.unwrap();
    let mut connector = Connector::new();
    let path = config(&connector, &db, &broker, "", &registry_toml(&registry, "timeout_ms = 2000"));
    connector.run(&path);
    assert_eq!(broker.read_all(TOPIC, 1, READ_TIMEOUT).len(), 1, "{}", connector.logs());

    // Known (subject, version): no registry needed.
    registry.kill();
    let second = OutboxRow::new("A-1").schema_version(1).payload(payload(2));
    insert_event(&mut conn, &second).await.unwrap();
    assert_eq!(broker.read_all(TOPIC, 2, READ_TIMEOUT).len(), 2, "{}", connector.logs());

    // A version not yet known while the registry is away: waited for.
    registry.start_again();
    let v2 = registry.register(SUBJECT, "AVRO", &order_v2().to_string(), &[]);
    registry.kill();
    let third = OutboxRow::new("A-1").schema_version(2).payload(payload(3));
    const UNREACHABLE: &str = "schema registry cannot be reached";
    let said = connector.logs().matches(UNREACHABLE).count();
    insert_event(&mut conn, &third).await.unwrap();
    // The connector reached the third row and waits for the registry: then nothing more is published.
    assert!(
        common::wait_until(READ_TIMEOUT, || connector.logs().matches(UNREACHABLE).count() > said),
        "{}",
        connector.logs()
    );
    let published = broker.read_all_quiet(TOPIC, 2, Duration::from_secs(2), READ_TIMEOUT);
    assert_eq!(published.len(), 2, "published without its schema");
    assert!(connector.is_running(), "{}", connector.logs());
    registry.start_again();
    // A restart after the transient error may publish the first two again (at least once): one of each.
    let mut records = broker.read_all(TOPIC, 3, READ_TIMEOUT);
    let mut seen = std::collections::HashSet::new();
    records.retain(|r| seen.insert(r.header_str("id").unwrap().to_string()));
    assert_eq!(records.len(), 3, "{}", connector.logs());
    let ids: Vec<Value> = decode(&registry, &records).into_iter().map(|d| d["id"].clone()).collect();
    assert_eq!(ids, [json!(v1), json!(v1), json!(v2)]);
    assert!(broker.read_all(DLQ, 0, Duration::from_secs(2)).is_empty(), "nothing is dead-lettered");
    connector.terminate();
}

/// Refused credentials stop the connector with a definite error saying what to set; with the right
/// password (from the environment) it publishes.
#[tokio::test(flavor = "multi_thread")]
async fn refused_credentials_are_definite_until_fixed() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let registry = SchemaRegistry::start_with(Some("connector:s3cret"));
    let id = registry.register(SUBJECT, "AVRO", &order_v1().to_string(), &[]);
    let mut conn = db.conn().await;
    let row = OutboxRow::new("A-1").schema_version(1).payload(payload(1));
    insert_event(&mut conn, &row).await.unwrap();
    let mut connector = Connector::new();
    let auth = "username = \"connector\"\npassword_env = \"REGISTRY_PASSWORD\"";
    let path = config(&connector, &db, &broker, "", &registry_toml(&registry, auth));
    connector.env("REGISTRY_PASSWORD", "wr0ng-pw");
    connector.run(&path);
    let status = connector.wait_exit(Duration::from_secs(60)).unwrap_or_else(|| panic!("{}", connector.logs()));
    assert_eq!(status.code(), Some(2), "{}", connector.logs());
    let logs = connector.logs();
    assert!(logs.contains("refused the connector's credentials (HTTP 401"), "{logs}");
    assert!(logs.contains("schema_registry.username"), "{logs}");
    assert!(!logs.contains("wr0ng-pw"), "the password is never logged: {logs}");
    assert!(broker.read_all(DLQ, 0, Duration::from_secs(2)).is_empty());

    connector.env("REGISTRY_PASSWORD", "s3cret");
    connector.restart();
    let records = broker.read_all(TOPIC, 1, READ_TIMEOUT);
    assert_eq!(records.len(), 1, "{}", connector.logs());
    assert_eq!(decode(&registry, &records)[0], json!({"id": id, "value": decoded(1)}));
    connector.terminate();
}

/// `value_format = "json_schema"`: the payload validated against its registered schema (which references
/// another subject's), framed as written and decoded by confluent-kafka's JSONDeserializer; a payload that
/// breaks the schema is dead-lettered with its path.
#[tokio::test(flavor = "multi_thread")]
async fn json_schema_validates_and_frames() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let registry = SchemaRegistry::start();
    let money = json!({"$schema": "http://json-schema.org/draft-07/schema#", "$id": "https://acme.example/money.json",
        "type": "object", "properties": {"amount": {"type": "string", "pattern": "^[0-9]+\\.[0-9]{2}$"},
        "currency": {"type": "string"}}, "required": ["amount", "currency"]});
    registry.register("money", "JSON", &money.to_string(), &[]);
    let order = json!({"$schema": "http://json-schema.org/draft-07/schema#", "title": "OrderCreated", "type": "object",
        "properties": {"lines": {"type": "array", "items": {"type": "object",
            "properties": {"sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}}, "required": ["sku", "qty"]}},
            "total": {"$ref": "https://acme.example/money.json"}},
        "required": ["lines", "total"]});
    let id = registry.register(SUBJECT, "JSON", &order.to_string(), &[("https://acme.example/money.json", "money", 1)]);
    let mut conn = db.conn().await;
    let good_payload = json!({"lines": [{"sku": "A", "qty": 2}], "total": {"amount": "19.90", "currency": "CHF"}});
    let good = OutboxRow::new("A-1").schema_version(1).payload(good_payload.clone());
    let bad = OutboxRow::new("B-1").schema_version(1).payload(
        json!({"lines": [{"sku": "A", "qty": 2}, {"sku": "B", "qty": 0}], "total": {"amount": "1", "currency": "CHF"}}),
    );
    for row in [&bad, &good] {
        insert_event(&mut conn, row).await.unwrap();
    }
    let mut connector = Connector::new();
    let path = config(&connector, &db, &broker, "value_format = \"json_schema\"", &registry_toml(&registry, ""));
    connector.run(&path);
    let records = broker.read_all(TOPIC, 1, READ_TIMEOUT);
    assert_eq!(records.len(), 1, "{}", connector.logs());
    let value = records[0].value.as_deref().unwrap();
    assert_eq!((value[0], &value[1..5]), (0, &id.to_be_bytes()[..]), "magic byte and schema id");
    assert_eq!(&value[5..], good.payload.to_string().as_bytes(), "the JSON as the row holds it");
    assert_eq!(decode_as(&registry, "json", &records)[0], json!({"id": id, "value": good_payload}));
    let letter = dead_letter(&broker, &bad.id, 1);
    assert_eq!(letter["kind"], "schema_mismatch", "{letter}");
    let reason = letter["reason"].as_str().unwrap();
    assert!(reason.contains("at $.lines[1].qty") && reason.contains("minimum"), "{reason}");
    connector.terminate();
}

const MONEY_PROTO: &str =
    "syntax = \"proto3\";\npackage acme;\nmessage Money { string currency = 1; int64 units = 2; int32 nanos = 3; }\n";
const ORDER_PROTO: &str = "syntax = \"proto3\";\npackage acme.orders;\nimport \"acme/money.proto\";\n\
    message OrderCreated {\n  message Line { string sku = 1; int32 qty = 2; acme.Money price = 3; }\n\
    enum Status { NEW = 0; PAID = 1; }\n  string order_id = 1;\n  repeated Line lines = 2;\n  acme.Money total = 3;\n\
    Status status = 4;\n  map<string, string> attributes = 5;\n}\n\
    message OrderCancelled {\n  string order_id = 1;\n  string reason = 2;\n}\n";

/// The `.proto` files compiled by protoc (grpcio-tools' `python3 -m grpc_tools.protoc`), not by protox, the
/// connector's own compiler: what the consumer side reads is not ours.
struct Protoc {
    /// protoc's FileDescriptorSet (`--include_imports`: each file after those it imports).
    set_file: PathBuf,
    /// Each file's FileDescriptorProto, base64, by name: what confluent-kafka's deserializer asks the
    /// registry for (`?format=serialized`).
    serialized: HashMap<String, String>,
}

/// [`MONEY_PROTO`] as `acme/money.proto` and [`ORDER_PROTO`] as `order.proto`, compiled by protoc in `dir`.
fn descriptors(dir: &Path) -> Protoc {
    use base64::Engine as _;
    use prost::Message as _;
    std::fs::create_dir_all(dir.join("acme")).unwrap();
    std::fs::write(dir.join("acme/money.proto"), MONEY_PROTO).unwrap();
    std::fs::write(dir.join("order.proto"), ORDER_PROTO).unwrap();
    let set_file = dir.join("descriptors.pb");
    let output = std::process::Command::new("python3")
        .args(["-m", "grpc_tools.protoc", "--include_imports"])
        .arg(format!("--proto_path={}", dir.display()))
        .arg(format!("--descriptor_set_out={}", set_file.display()))
        .arg("order.proto")
        .output()
        .expect("run python3 -m grpc_tools.protoc (grpcio-tools)");
    assert!(output.status.success(), "protoc: {}", String::from_utf8_lossy(&output.stderr));
    let bytes = std::fs::read(&set_file).unwrap();
    let set = prost_reflect::prost_types::FileDescriptorSet::decode(bytes.as_slice()).expect("protoc's descriptor set");
    // Encoded again, the set is protoc's bytes exactly: each file's bytes below are protoc's own.
    assert_eq!(set.encode_to_vec(), bytes, "prost dropped or reordered something of protoc's descriptors");
    let serialized = set
        .file
        .iter()
        .map(|f| (f.name().to_string(), base64::engine::general_purpose::STANDARD.encode(f.encode_to_vec())))
        .collect();
    Protoc { set_file, serialized }
}

/// `value_format = "protobuf"`: the payload as canonical JSON becomes the schema's message named like the
/// row's event type, else its first (nested messages, an enum, a map, a message from a referenced
/// `.proto`), framed with the message-index array, decoded by confluent-kafka's ProtobufDeserializer
/// (which finds the writer's message by that array); a field the message lacks is dead-lettered.
#[tokio::test(flavor = "multi_thread")]
async fn protobuf_with_nested_messages_and_a_referenced_proto() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let registry = SchemaRegistry::start();
    let scratch = tempfile::tempdir().unwrap();
    let serialized = descriptors(scratch.path()).serialized;
    registry.register_protobuf("acme.money", MONEY_PROTO, &serialized["acme/money.proto"], &[]);
    let id = registry.register_protobuf(
        SUBJECT,
        ORDER_PROTO,
        &serialized["order.proto"],
        &[("acme/money.proto", "acme.money", 1)],
    );
    let mut conn = db.conn().await;
    let order = json!({"orderId": "o-1", "lines": [{"sku": "A", "qty": 2, "price": {"currency": "CHF", "units": "9", "nanos": 950000000}}],
        "total": {"currency": "CHF", "units": "19", "nanos": 900000000}, "status": "PAID", "attributes": {"tenant": "acme"}});
    let good = OutboxRow::new("A-1").schema_version(1).payload(order.clone());
    let bad = OutboxRow::new("B-1").schema_version(1).payload(json!({"lines": [{"sku": "A", "weight": 1}]}));
    let cancelled_payload = json!({"orderId": "o-2", "reason": "out of stock"});
    let cancelled =
        OutboxRow::new("C-1").event_type("OrderCancelled").schema_version(1).payload(cancelled_payload.clone());
    for row in [&bad, &good, &cancelled] {
        insert_event(&mut conn, row).await.unwrap();
    }
    let mut connector = Connector::new();
    let path = config(&connector, &db, &broker, "value_format = \"protobuf\"", &registry_toml(&registry, ""));
    connector.run(&path);
    let records = broker.read_all(TOPIC, 2, READ_TIMEOUT);
    assert_eq!(records.len(), 2, "{}", connector.logs());
    // Two aggregates, perhaps two partitions: taken by event id, not by arrival.
    let records = [by_id(&records, &good.id).clone(), by_id(&records, &cancelled.id).clone()];
    let value = records[0].value.as_deref().unwrap();
    assert_eq!((value[0], &value[1..5], value[5]), (0, &id.to_be_bytes()[..], 0), "magic, id, message index [0]");
    assert_eq!(&records[1].value.as_deref().unwrap()[5..7], &[2, 2], "message index [1]: OrderCancelled");
    let decoded = decode_as(&registry, "protobuf", &records);
    assert_eq!(decoded[0], json!({"id": id, "value": order}));
    assert_eq!(decoded[1], json!({"id": id, "value": cancelled_payload}));
    let letter = dead_letter(&broker, &bad.id, 1);
    assert_eq!(letter["kind"], "schema_mismatch", "{letter}");
    let reason = letter["reason"].as_str().unwrap();
    assert!(reason.contains("at $.lines[0]") && reason.contains("weight"), "{reason}");
    connector.terminate();
}

/// `check` reaches the registry, authenticates, and says for each subject it can name (the routed topics'
/// value and key subjects) whether it resolves; a missing one fails with the fix.
#[tokio::test(flavor = "multi_thread")]
async fn check_reaches_the_registry_and_names_each_subject() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let registry = SchemaRegistry::start_with(Some("connector:s3cret"));
    let id = registry.register(SUBJECT, "AVRO", &order_v1().to_string(), &[]);
    let mut conn = db.conn().await;
    insert_event(&mut conn, &OutboxRow::new("A-1").payload(payload(1))).await.unwrap();
    let connector = Connector::new();
    let auth = "username = \"connector\"\npassword = \"s3cret\"";
    let path = config(&connector, &db, &broker, "key_format = \"avro\"", &registry_toml(&registry, auth));
    let (status, out, err) = connector.command(&["check"], CLI_TIMEOUT).unwrap();
    assert_eq!(status.code(), Some(2), "{out}{err}");
    assert!(out.contains("[ok  ] schema registry: expected reachable, credentials accepted"), "{out}");
    assert!(out.contains(&format!("[ok  ] subject {SUBJECT}: expected registered")), "{out}");
    assert!(out.contains(&format!("latest version 1 (id {id})")), "{out}");
    assert!(out.contains(&format!("[FAIL] subject {TOPIC}-key")), "{out}");
    assert!(out.contains("register the schema \"string\" under it"), "{out}");

    registry.register(&format!("{TOPIC}-key"), "AVRO", "\"string\"", &[]);
    let (status, out, err) = connector.command(&["check"], CLI_TIMEOUT).unwrap();
    assert!(status.success(), "{out}{err}");

    let text = std::fs::read_to_string(&path).unwrap().replace("s3cret", "nope");
    std::fs::write(&path, text).unwrap();
    let (status, out, err) = connector.command(&["check"], CLI_TIMEOUT).unwrap();
    assert_eq!(status.code(), Some(2), "{out}{err}");
    assert!(out.contains("[FAIL] schema registry") && out.contains("refused the connector's credentials"), "{out}");
}

/// `[schema_registry]` listing `urls` in order, and `extra`.
fn registry_toml_at(urls: &[String], extra: &str) -> String {
    let urls: Vec<String> = urls.iter().map(|u| toml_str(u)).collect();
    format!("\n[schema_registry]\nurl = [{}]\n{extra}\n", urls.join(", "))
}

/// `bearer_token_file`: the token is read from its file; when it is rotated on disk (the registry then
/// refuses the old one), the running process uses the new one for its next lookup: a version registered
/// after the rotation is looked up, and its row is published and decoded, with no exit and no restart.
///
/// Guards against the token being read once per process (issue 44): the lookup after the rotation still
/// sent the old token, was refused (HTTP 401, a definite error) and the connector stopped with exit 2.
#[tokio::test(flavor = "multi_thread")]
async fn a_bearer_token_rotated_on_disk_is_used_without_a_restart() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let registry = SchemaRegistry::builder().bearer("tok3n-one-8f2c").start();
    assert_eq!(registry.status("/subjects", None), 401, "the registry must want a token");
    let v1 = registry.register(SUBJECT, "AVRO", &order_v1().to_string(), &[]);
    let mut conn = db.conn().await;
    let first = OutboxRow::new("A-1").schema_version(1).payload(payload(1));
    insert_event(&mut conn, &first).await.unwrap();
    let mut connector = Connector::new();
    let token_file = connector.dir().join("registry-token");
    replace_file(&token_file, "tok3n-one-8f2c\n");
    let auth = format!("bearer_token_file = {}", toml_str(&token_file.to_string_lossy()));
    let path = config(&connector, &db, &broker, "", &registry_toml(&registry, &auth));
    connector.run(&path);
    assert_eq!(broker.read_all(TOPIC, 1, READ_TIMEOUT).len(), 1, "{}", connector.logs());
    let pid = connector.pid();

    // The rotation: the registry takes only the new token, then the connector's file holds it. Each file
    // is replaced whole, as a mounted secret is.
    registry.rotate_bearer("tok3n-two-51ad");
    assert_eq!(registry.status("/subjects", Some("Bearer tok3n-one-8f2c")), 401, "the old token must be refused");
    assert_eq!(registry.status("/subjects", Some("Bearer tok3n-two-51ad")), 200, "the new token must be taken");
    replace_file(&token_file, "tok3n-two-51ad\n");
    let v2 = registry.register(SUBJECT, "AVRO", &order_v2().to_string(), &[]);
    let mut v2_payload = payload(2);
    v2_payload["channel"] = json!("app");
    // Version 2 was never looked up: the first request after the rotation. Version 1 is known.
    let second = OutboxRow::new("A-1").schema_version(2).payload(v2_payload);
    let third = OutboxRow::new("A-2").schema_version(1).payload(payload(3));
    for row in [&second, &third] {
        insert_event(&mut conn, row).await.unwrap();
    }
    let published = || broker.read_all(TOPIC, 3, Duration::from_secs(2)).len() >= 3;
    common::wait_until(READ_TIMEOUT, || !connector.is_running() || published());
    assert!(
        connector.is_running(),
        "the connector stopped after the token rotation (did it send the old token?):\n{}",
        connector.logs()
    );
    assert_eq!(connector.pid(), pid, "the same process");
    let records = broker.read_all(TOPIC, 3, READ_TIMEOUT);
    assert_eq!(records.len(), 3, "each row once:\n{}", connector.logs());
    let ordered: Vec<Received> =
        [&first.id, &second.id, &third.id].iter().map(|id| by_id(&records, id).clone()).collect();
    let mut want_v2 = decoded(2);
    want_v2["channel"] = json!("app");
    assert_eq!(
        decode(&registry, &ordered),
        [
            json!({"id": v1, "value": decoded(1)}),
            json!({"id": v2, "value": want_v2}),
            json!({"id": v1, "value": decoded(3)})
        ]
    );
    assert!(!connector.logs().contains("tok3n"), "a token is never logged:\n{}", connector.logs());
    assert!(connector.terminate().success(), "{}", connector.logs());
}

/// `url = "https://…"` with `tls_ca_file`: a registry whose certificate a private CA signed is trusted,
/// and the records are decoded by a client trusting the same CA (confluent-kafka's `ssl.ca.location`).
/// Without `tls_ca_file` (the public CAs only) `run` and `check` stop with a definite error naming the
/// certificate problem and the setting; nothing is published or dead-lettered.
///
/// Guards against the refused handshake being classified transient: the connector waited for the
/// registry forever, saying only that it "cannot be reached".
#[tokio::test(flavor = "multi_thread")]
async fn a_registry_behind_tls_with_a_private_ca() {
    let pki = Pki::new();
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let registry = SchemaRegistry::builder().tls(pki.server_tls()).start();
    assert!(registry.url().starts_with("https://127.0.0.1:"), "{}", registry.url());
    let id = registry.register(SUBJECT, "AVRO", &order_v1().to_string(), &[]);
    let mut conn = db.conn().await;
    let row = OutboxRow::new("A-1").schema_version(1).payload(payload(1));
    insert_event(&mut conn, &row).await.unwrap();

    let mut connector = Connector::new();
    let ca = format!("tls_ca_file = {}", toml_str(&pki.ca_pem().to_string_lossy()));
    let path = config(&connector, &db, &broker, "", &registry_toml(&registry, &ca));
    connector.run(&path);
    let records = broker.read_all(TOPIC, 1, READ_TIMEOUT);
    assert_eq!(records.len(), 1, "{}", connector.logs());
    assert_eq!(decode(&registry, &records), [json!({"id": id, "value": decoded(1)})]);
    assert!(connector.terminate().success(), "{}", connector.logs());

    // Without tls_ca_file only the public CAs are trusted: waiting cannot fix that, so `run` and `check`
    // stop (exit 2) and say which certificate and which setting.
    let mut untrusting = Connector::new();
    let path = config(&untrusting, &db, &broker, "", &registry_toml(&registry, ""));
    untrusting.run(&path);
    let status = untrusting.wait_exit(EXIT_TIMEOUT).unwrap_or_else(|| {
        panic!("an untrusted certificate must stop the connector, not be waited out:\n{}", untrusting.logs())
    });
    assert_eq!(status.code(), Some(2), "{}", untrusting.logs());
    let refusal = ["invalid peer certificate: UnknownIssuer", "schema_registry.tls_ca_file"];
    for text in refusal {
        assert!(untrusting.stderr().contains(text), "run must say {text:?}:\n{}", untrusting.logs());
    }
    let (status, out, err) = untrusting.command(&["check"], CLI_TIMEOUT).unwrap();
    assert_eq!(status.code(), Some(2), "{out}{err}");
    for text in refusal {
        assert!(out.contains(text) || err.contains(text), "check must say {text:?}:\n{out}{err}");
    }
    assert_eq!(broker.read_all(TOPIC, 1, Duration::from_secs(2)).len(), 1, "published without its schema");
    assert!(broker.read_all(DLQ, 0, Duration::from_secs(2)).is_empty(), "nothing is dead-lettered");
}

/// Runs a connector whose `url` lists `first`, then the working `registry`, over rows naming two versions
/// (two lookups, each through the list), and returns it with what it published.
async fn published_past(first: &str, registry: &SchemaRegistry) -> (Connector, Vec<Value>, [u32; 2]) {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let v1 = registry.register(SUBJECT, "AVRO", &order_v1().to_string(), &[]);
    let v2 = registry.register(SUBJECT, "AVRO", &order_v2().to_string(), &[]);
    let mut conn = db.conn().await;
    let old = OutboxRow::new("A-1").schema_version(1).payload(payload(1));
    let new = OutboxRow::new("A-1").schema_version(2).payload(payload(2));
    for row in [&old, &new] {
        insert_event(&mut conn, row).await.unwrap();
    }
    let mut connector = Connector::new();
    let urls = [first.to_string(), registry.url()];
    let path = config(&connector, &db, &broker, "", &registry_toml_at(&urls, ""));
    connector.run(&path);
    let records = broker.read_all(TOPIC, 2, READ_TIMEOUT);
    assert_eq!(records.len(), 2, "{}", connector.logs());
    let ordered: Vec<Received> = [&old.id, &new.id].iter().map(|id| by_id(&records, id).clone()).collect();
    let values = decode(registry, &ordered);
    assert!(connector.terminate().success(), "{}", connector.logs());
    (connector, values, [v1, v2])
}

/// `url = [a, b]` where nothing listens at `a`: each lookup goes on to `b` within the request (no
/// "cannot be reached", no wait), and the records carry `b`'s ids.
#[tokio::test(flavor = "multi_thread")]
async fn a_first_url_where_nothing_listens_is_passed_over() {
    let registry = SchemaRegistry::start();
    let down = common::free_port();
    assert!(common::port_is_free(down), "nothing may listen on {down}");
    let (connector, values, [v1, v2]) = published_past(&format!("http://127.0.0.1:{down}"), &registry).await;
    let mut want_v2 = decoded(2);
    want_v2["channel"] = json!("web");
    assert_eq!(values, [json!({"id": v1, "value": decoded(1)}), json!({"id": v2, "value": want_v2})]);
    assert!(!connector.logs().contains("cannot be reached"), "{}", connector.logs());
    assert!(common::port_is_free(down), "nothing listened on {down} meanwhile");
}

/// `url = [a, b]` where `a` answers every request 503: `a` is asked and passed over for `b` within the
/// request, for each lookup.
#[tokio::test(flavor = "multi_thread")]
async fn a_first_url_answering_503_is_passed_over() {
    let registry = SchemaRegistry::start();
    let unavailable = SchemaRegistry::builder().unavailable().start();
    let (connector, values, [v1, v2]) = published_past(&unavailable.url(), &registry).await;
    let mut want_v2 = decoded(2);
    want_v2["channel"] = json!("web");
    assert_eq!(values, [json!({"id": v1, "value": decoded(1)}), json!({"id": v2, "value": want_v2})]);
    assert!(!connector.logs().contains("cannot be reached"), "{}", connector.logs());
    for version in [1, 2] {
        let asked = format!("\"GET /subjects/{SUBJECT}/versions/{version} HTTP/1.1\"");
        assert!(unavailable.log().contains(&format!("{asked} 503")), "{asked} first: {}", unavailable.log());
        assert!(registry.log().contains(&format!("{asked} 200")), "{asked} then: {}", registry.log());
    }
}

/// The order events as two Avro records in one namespace: `com.acme.orders.OrderCreated` ([`order_v1`])
/// and `com.acme.orders.OrderCancelled`.
fn cancelled_avro() -> Value {
    json!({"type": "record", "name": "OrderCancelled", "namespace": "com.acme.orders", "fields": [
        {"name": "order_id", "type": "string"}, {"name": "reason", "type": "string"}]})
}

/// `subject = strategy` with `value_format = format` ("avro" or "protobuf"): each event type's schema is
/// registered under the subject that confluent-kafka's own serializer computes for it with the same
/// strategy (asked of confluent-kafka, not written here), the rows' event types are the records' full names
/// (what `record_name` documents), and every record of two event types carries its subject's schema id
/// and is decoded by confluent-kafka.
async fn subjects_are_confluents(format: &str, strategy: &str) {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let registry = SchemaRegistry::start();
    let scratch = tempfile::tempdir().unwrap();
    // Per event type: (its full name, the subject confluent-kafka computes, the id registered there), and
    // the payloads of the two types with what confluent-kafka decodes the first to.
    let mut types: Vec<(String, String, u32)> = Vec::new();
    let (created, created_decoded, cancelled) = match format {
        "avro" => {
            for schema in [order_v1(), cancelled_avro()] {
                let file = scratch.path().join(format!("{}.avsc", schema["name"].as_str().unwrap()));
                std::fs::write(&file, schema.to_string()).unwrap();
                let [subject]: [String; 1] = confluent_subjects(strategy, TOPIC, "avro", &file, None)
                    .try_into()
                    .expect("one subject for one record");
                let id = registry.register(&subject, "AVRO", &schema.to_string(), &[]);
                let name = format!("{}.{}", schema["namespace"].as_str().unwrap(), schema["name"].as_str().unwrap());
                types.push((name, subject, id));
            }
            (payload(1), decoded(1), json!({"order_id": "o-2", "reason": "out of stock"}))
        }
        "protobuf" => {
            let protoc = descriptors(scratch.path());
            registry.register_protobuf("acme.money", MONEY_PROTO, &protoc.serialized["acme/money.proto"], &[]);
            let subjects = confluent_subjects(strategy, TOPIC, "protobuf", &protoc.set_file, Some("order.proto"));
            let names = ["acme.orders.OrderCreated", "acme.orders.OrderCancelled"];
            assert_eq!(subjects.len(), names.len(), "one subject per message of order.proto: {subjects:?}");
            for (name, subject) in names.into_iter().zip(subjects) {
                let references = [("acme/money.proto", "acme.money", 1)];
                let id =
                    registry.register_protobuf(&subject, ORDER_PROTO, &protoc.serialized["order.proto"], &references);
                types.push((name.to_string(), subject, id));
            }
            let created = json!({"orderId": "o-1", "lines": [{"sku": "A", "qty": 2}],
                "total": {"currency": "CHF", "units": "19", "nanos": 900000000}, "status": "PAID"});
            (created.clone(), created, json!({"orderId": "o-2", "reason": "out of stock"}))
        }
        other => panic!("no format {other}"),
    };
    assert!(types.iter().all(|(_, subject, _)| subject != SUBJECT), "the strategy is not topic_name: {types:?}");
    let rows = [
        OutboxRow::new("A-1").event_type(&types[0].0).schema_version(1).payload(created.clone()),
        OutboxRow::new("A-1").event_type(&types[1].0).schema_version(1).payload(cancelled.clone()),
        OutboxRow::new("B-1").event_type(&types[0].0).schema_version(1).payload(created),
        OutboxRow::new("B-1").event_type(&types[1].0).schema_version(1).payload(cancelled.clone()),
    ];
    let mut conn = db.conn().await;
    for row in &rows {
        insert_event(&mut conn, row).await.unwrap();
    }
    let mut connector = Connector::new();
    let kafka = format!("value_format = \"{format}\"");
    let path =
        config(&connector, &db, &broker, &kafka, &registry_toml(&registry, &format!("subject = \"{strategy}\"")));
    connector.run(&path);
    let records = broker.read_all(TOPIC, rows.len(), READ_TIMEOUT);
    assert_eq!(records.len(), rows.len(), "{types:?}\n{}", connector.logs());
    let ordered: Vec<Received> = rows.iter().map(|row| by_id(&records, &row.id).clone()).collect();
    let want = |i: usize, value: &Value| json!({"id": types[i].2, "value": value});
    assert_eq!(
        decode_as(&registry, format, &ordered),
        [want(0, &created_decoded), want(1, &cancelled), want(0, &created_decoded), want(1, &cancelled)],
        "{types:?}"
    );
    assert!(connector.terminate().success(), "{}", connector.logs());
}

/// `subject = "record_name"`, Avro: the records' full names.
#[tokio::test(flavor = "multi_thread")]
async fn record_name_subjects_are_confluents_for_avro() {
    subjects_are_confluents("avro", "record_name").await;
}

/// `subject = "topic_record_name"`, Avro: the topic, then the records' full names.
#[tokio::test(flavor = "multi_thread")]
async fn topic_record_name_subjects_are_confluents_for_avro() {
    subjects_are_confluents("avro", "topic_record_name").await;
}

/// `subject = "record_name"`, Protobuf: the messages' full names; one `.proto` of two messages registered
/// under each, the row's event type picking the message.
#[tokio::test(flavor = "multi_thread")]
async fn record_name_subjects_are_confluents_for_protobuf() {
    subjects_are_confluents("protobuf", "record_name").await;
}

/// `subject = "topic_record_name"`, Protobuf: the topic, then the messages' full names.
#[tokio::test(flavor = "multi_thread")]
async fn topic_record_name_subjects_are_confluents_for_protobuf() {
    subjects_are_confluents("protobuf", "topic_record_name").await;
}
