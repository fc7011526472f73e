//! The operator commands on outbox tables that are not our reference schema, against a real MariaDB and a
//! real broker: `replay --aggregate-id` on a BINARY(16) and on a BIGINT aggregate id (the id typed as it
//! is published selects exactly that aggregate's rows; one the column cannot hold is a definite error),
//! `audit` on tables without `occurred_at` (ordered by an integer id, or reported as not ordered) and on
//! BINARY(16) ids outside the audited window, and `prune` keeping a held BINARY(16) aggregate's rows. The
//! audits' records are produced by the test itself, so each defect is exactly the one planted.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{AuditRun, Broker, Connector, Engine, MariaDb, Received};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

const READ_TIMEOUT: Duration = Duration::from_secs(120);
/// How long to wait for records that must not come.
const QUIET: Duration = Duration::from_secs(3);
/// How long a CLI run may take.
const CLI_TIMEOUT: Duration = Duration::from_secs(120);
const REPLAY_TOPIC: &str = "outbox.event.order.replay";

/// Replaces the reference table with `ddl` (a `CREATE TABLE shop.outbox_events …`).
fn reshape(db: &MariaDb, ddl: &str) {
    db.sql("DROP TABLE shop.outbox_events");
    db.sql(ddl);
}

/// The `id` headers of `records`, as a set.
fn ids(records: &[Received]) -> BTreeSet<String> {
    records.iter().map(|r| r.header_str("id").expect("an id header").to_string()).collect()
}

/// Runs `outbox-cdc replay <args>` with the connector's config; returns the exit code, stdout, stderr.
fn replay(connector: &Connector, args: &[&str]) -> (Option<i32>, String, String) {
    let mut all = vec!["replay", "--rate", "10000"];
    all.extend_from_slice(args);
    let (status, out, err) = connector.command(&all, CLI_TIMEOUT).unwrap_or_else(|e| panic!("{e}"));
    (status.code(), out, err)
}

/// Produces `records` (partition, key, id) to `topic` (2 partitions), in the given order, with the `id`
/// header, as the connector would have.
fn produce(broker: &Broker, topic: &str, records: &[(i32, &str, &str)]) {
    broker.create_topic(topic, 2);
    let producer: BaseProducer =
        broker.client_config().set("enable.idempotence", "true").create().expect("create producer");
    for (partition, key, id) in records {
        let headers = OwnedHeaders::new().insert(Header { key: "id", value: Some(*id) });
        producer
            .send(BaseRecord::to(topic).partition(*partition).key(*key).payload("{}").headers(headers))
            .unwrap_or_else(|(e, _)| panic!("enqueue: {e}"));
    }
    producer.flush(Duration::from_secs(60)).expect("flush the planted records");
}

fn assert_code(run: &AuditRun, code: i32, what: &str) {
    assert_eq!(run.code, Some(code), "{what}: {:#}\n{}", run.report, run.stderr);
}

/// The report's list `field` as strings.
fn list(run: &AuditRun, field: &str) -> Vec<String> {
    run.report[field]
        .as_array()
        .map(|a| a.iter().map(|v| v.as_str().unwrap_or_default().to_string()).collect())
        .unwrap_or_default()
}

/// `replay --aggregate-id <UUID text>` on a BINARY(16) aggregate id selects exactly that aggregate's rows
/// (it used to compare the column with the UUID's text, which no 16-byte value equals, and replay nothing),
/// also when the UUID is typed in upper case; a malformed UUID is a definite error (exit 2) naming the flag
/// and the column's type, not an empty replay.
#[test]
fn replay_selects_a_binary16_aggregate_by_its_uuid_text() {
    let db = MariaDb::start();
    reshape(
        &db,
        "CREATE TABLE shop.outbox_events (id CHAR(36) PRIMARY KEY, aggregate_type VARCHAR(64) NOT NULL, \
         aggregate_id BINARY(16) NOT NULL, event_type VARCHAR(128) NOT NULL, schema_version INT NOT NULL, \
         payload JSON NOT NULL, occurred_at DATETIME(6) NOT NULL, \
         KEY idx_aggregate (aggregate_type, aggregate_id, occurred_at)) DEFAULT CHARSET=utf8mb4",
    );
    // Trailing zero bytes, 0x00 and 0xff: the UUIDs differ only where a careless conversion would not see it.
    let chosen = "00ff0001-0000-4000-8000-000000000000";
    let others = ["00ff0001-0000-4000-8000-000000000001", "ffff0001-0000-4000-8000-000000000000"];
    let mut expected = BTreeSet::new();
    for (a, aggregate) in std::iter::once(&chosen).chain(&others).enumerate() {
        for e in 0..3 {
            let id = format!("e-{a}-{e}");
            db.sql(&format!(
                "INSERT INTO shop.outbox_events VALUES ('{id}', 'order', UNHEX(REPLACE('{aggregate}', '-', '')), \
                 'Placed', 1, '{{}}', '2026-01-15 10:00:0{e}')"
            ));
            if a == 0 {
                expected.insert(id);
            }
        }
    }
    let broker = Broker::start(Engine::Memory);
    let connector = Connector::new();
    connector.write_config(&db, &broker, "");

    let (code, out, err) = replay(&connector, &["--aggregate-id", chosen]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("replayed 3 record(s)"), "{out}{err}");
    let replayed = broker.read_all(REPLAY_TOPIC, 3, READ_TIMEOUT);
    assert_eq!(ids(&replayed), expected, "{out}{err}");
    assert!(replayed.iter().all(|r| r.key_str() == Some(chosen)), "{replayed:?}");
    let order: Vec<&str> = replayed.iter().map(|r| r.header_str("id").unwrap()).collect();
    assert_eq!(order, ["e-0-0", "e-0-1", "e-0-2"], "one aggregate, in occurred_at order");

    // Upper case is the same UUID.
    let (code, out, err) = replay(&connector, &["--aggregate-id", &chosen.to_uppercase(), "--topic", "upper.replay"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert_eq!(ids(&broker.read_all("upper.replay", 3, READ_TIMEOUT)), expected);

    for malformed in ["not-a-uuid", "00ff00010000400080000000000000000000", "00ff0001-0000-4000-8000-00000000000g"] {
        let (code, out, err) = replay(&connector, &["--aggregate-id", malformed, "--topic", "never.replay"]);
        assert_eq!(code, Some(2), "{malformed}: {out}{err}");
        for part in ["--aggregate-id", "`aggregate_id`", "binary(16)", "8-4-4-4-12"] {
            assert!(err.contains(part), "{malformed}: {part} missing from: {err}");
        }
    }
    assert!(broker.read_all("never.replay", 1, QUIET).is_empty(), "a refused replay produces nothing");
}

/// `replay --aggregate-id <decimal>` on a BIGINT aggregate id compares integers: 2^53 + 1 selects its own
/// rows and not those of 2^53 (which a comparison as DOUBLEs would not tell apart); `--aggregate-type`
/// still selects as text. Something that is not an integer is a definite error (exit 2) naming the flag
/// and the column's type: compared with the column as text, `o-1` used to be the number 0 and replayed
/// aggregate 0's events.
#[test]
fn replay_selects_a_bigint_aggregate_by_its_decimal_text() {
    let db = MariaDb::start();
    reshape(
        &db,
        "CREATE TABLE shop.outbox_events (id BIGINT UNSIGNED AUTO_INCREMENT PRIMARY KEY, \
         aggregate_type VARCHAR(64) NOT NULL, aggregate_id BIGINT NOT NULL, event_type VARCHAR(128) NOT NULL, \
         schema_version INT NOT NULL, payload JSON NOT NULL, occurred_at DATETIME(6) NOT NULL, \
         KEY idx_aggregate (aggregate_type, aggregate_id, occurred_at)) DEFAULT CHARSET=utf8mb4",
    );
    // Ids 1..=3 for 2^53 + 1, 4..=6 for 2^53, 7..=9 for 0, 10 for 2^53 + 1 as a customer.
    for aggregate in ["9007199254740993", "9007199254740992", "0"] {
        for e in 0..3 {
            db.sql(&format!(
                "INSERT INTO shop.outbox_events (aggregate_type, aggregate_id, event_type, schema_version, payload, \
                 occurred_at) VALUES ('order', {aggregate}, 'Placed', 1, '{{}}', '2026-01-15 10:00:0{e}')"
            ));
        }
    }
    db.sql(
        "INSERT INTO shop.outbox_events (aggregate_type, aggregate_id, event_type, schema_version, payload, \
         occurred_at) VALUES ('customer', 9007199254740993, 'Joined', 1, '{}', '2026-01-15 10:00:00')",
    );
    let broker = Broker::start(Engine::Memory);
    let connector = Connector::new();
    connector.write_config(&db, &broker, "");

    let (code, out, err) = replay(&connector, &["--aggregate-type", "order", "--aggregate-id", "9007199254740993"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("replayed 3 record(s)"), "{out}{err}");
    let replayed = broker.read_all(REPLAY_TOPIC, 3, READ_TIMEOUT);
    let want: BTreeSet<String> = ["1", "2", "3"].map(String::from).into();
    assert_eq!(ids(&replayed), want, "{out}{err}");
    assert!(replayed.iter().all(|r| r.key_str() == Some("9007199254740993")), "{replayed:?}");
    assert!(broker.read_all("outbox.event.customer.replay", 1, QUIET).is_empty(), "filtered by aggregate type");

    for not_an_integer in ["o-1", "1.5", "18446744073709551616"] {
        let (code, out, err) = replay(&connector, &["--aggregate-id", not_an_integer, "--topic", "never.replay"]);
        assert_eq!(code, Some(2), "{not_an_integer}: {out}{err}");
        for part in ["--aggregate-id", "`aggregate_id`", "bigint", "decimal digits"] {
            assert!(err.contains(part), "{not_an_integer}: {part} missing from: {err}");
        }
    }
    assert!(broker.read_all("never.replay", 1, QUIET).is_empty(), "a refused replay produces nothing");
}

/// A table without `occurred_at` whose id is an integer is audited in id order, as its snapshot is
/// ordered: events 9 then 10 are in order (as text "10" sorts first), and a planted 100 before 99 in
/// one aggregate is an order violation (exit 1). The audit used to accept any order for such a table.
#[test]
fn audit_orders_a_table_without_occurred_at_by_its_integer_id() {
    let db = MariaDb::start();
    reshape(
        &db,
        "CREATE TABLE shop.outbox_events (id BIGINT UNSIGNED PRIMARY KEY, aggregate_type VARCHAR(64) NOT NULL, \
         aggregate_id VARCHAR(128) NOT NULL, event_type VARCHAR(128) NOT NULL, schema_version INT NOT NULL, \
         payload LONGTEXT NOT NULL) DEFAULT CHARSET=utf8mb4",
    );
    for (case, ids) in [("good", [8, 9, 10, 11]), ("bad", [98, 99, 100, 101])] {
        for id in ids {
            db.sql(&format!("INSERT INTO shop.outbox_events VALUES ({id}, '{case}', '{case}-1', 'E', 1, '{{}}')"));
        }
    }
    let broker = Broker::start(Engine::Memory);
    produce(
        &broker,
        "outbox.event.good",
        &[(0, "good-1", "8"), (0, "good-1", "9"), (0, "good-1", "10"), (0, "good-1", "11")],
    );
    produce(
        &broker,
        "outbox.event.bad",
        &[(1, "bad-1", "98"), (1, "bad-1", "100"), (1, "bad-1", "99"), (1, "bad-1", "101")],
    );
    let connector = Connector::new();
    connector.write_config(&db, &broker, "");

    let good = connector.audit(&["--where", "aggregate_type = 'good'"]);
    assert_code(&good, 0, "good");
    assert_eq!(good.count("order_violations"), 0, "{:#}", good.report);
    assert_eq!(list(&good, "order_by_id"), ["shop.outbox_events"], "{:#}", good.report);
    assert!(list(&good, "order_not_checked").is_empty(), "{:#}", good.report);

    let bad = connector.audit(&["--where", "aggregate_type = 'bad'"]);
    assert_code(&bad, 1, "bad");
    assert_eq!(bad.count("order_violations"), 1, "{:#}", bad.report);
    assert_eq!(bad.count("missing"), 0, "{:#}", bad.report);
    let samples = list(&bad, "order_violation_samples");
    assert!(
        samples.len() == 1 && samples[0].contains("99 (ordered by id") && samples[0].contains("after 100"),
        "{samples:?}"
    );

    let (status, out, err) = connector.command(&["audit", "--where", "aggregate_type = 'good'"], CLI_TIMEOUT).unwrap();
    assert_eq!(status.code(), Some(0), "{out}{err}");
    assert!(out.contains("order in shop.outbox_events checked by id (it has no occurred_at)"), "{out}");
}

/// A table with neither `occurred_at` nor an integer id (Debezium's reference table) cannot be checked for
/// order: the audit passes on what it can check, and says, in the JSON and the text report, that order was
/// not checked and why (it used to pass without a word, as if order had been checked).
#[test]
fn audit_says_order_was_not_checked_on_a_table_with_neither() {
    let db = MariaDb::start();
    reshape(
        &db,
        "CREATE TABLE shop.outbox_events (id VARCHAR(255) PRIMARY KEY, aggregatetype VARCHAR(255) NOT NULL, \
         aggregateid VARCHAR(255) NOT NULL, type VARCHAR(255) NOT NULL, payload JSON) DEFAULT CHARSET=utf8mb4",
    );
    for id in ["e-1", "e-2", "e-3"] {
        db.sql(&format!("INSERT INTO shop.outbox_events VALUES ('{id}', 'order', 'o-1', 'Placed', '{{}}')"));
    }
    let broker = Broker::start(Engine::Memory);
    // Any order is as good as another here.
    produce(&broker, "outbox.event.order", &[(0, "o-1", "e-3"), (0, "o-1", "e-1"), (0, "o-1", "e-2")]);
    let connector = Connector::new();
    connector.write_config(
        &db,
        &broker,
        "[outbox.columns]\nid = \"id\"\naggregate_type = \"aggregatetype\"\naggregate_id = \"aggregateid\"\n\
         event_type = \"type\"\npayload = \"payload\"\n",
    );

    let run = connector.audit(&[]);
    assert_code(&run, 0, "audit");
    assert_eq!((run.count("missing"), run.count("order_violations")), (0, 0), "{:#}", run.report);
    let unchecked = list(&run, "order_not_checked");
    assert_eq!(unchecked.len(), 1, "{:#}", run.report);
    for part in ["shop.outbox_events", "no `occurred_at` column", "`id`", "varchar(255)", "not an integer"] {
        assert!(unchecked[0].contains(part), "{part}: {unchecked:?}");
    }
    assert!(list(&run, "order_by_id").is_empty(), "{:#}", run.report);

    let (status, out, err) = connector.command(&["audit"], CLI_TIMEOUT).unwrap();
    assert_eq!(status.code(), Some(0), "{out}{err}");
    assert!(out.contains("order NOT CHECKED in shop.outbox_events: it has no `occurred_at` column"), "{out}");
    assert!(out.contains("PASSED (per-aggregate order not checked in every table, see above)"), "{out}");
}

/// Records of BINARY(16) ids outside the audited window are found in the table (reported as outside the
/// window), not reported as ids the table does not have: the lookup compares the UUIDs' bytes, not their
/// text. A UUID the table does not hold is still "not in the table".
#[test]
fn audit_finds_binary16_ids_outside_the_window_in_the_table() {
    let db = MariaDb::start();
    reshape(
        &db,
        "CREATE TABLE shop.outbox_events (id BINARY(16) PRIMARY KEY, aggregate_type VARCHAR(64) NOT NULL, \
         aggregate_id VARCHAR(128) NOT NULL, event_type VARCHAR(128) NOT NULL, schema_version INT NOT NULL, \
         payload JSON NOT NULL, occurred_at DATETIME(6) NOT NULL) DEFAULT CHARSET=utf8mb4",
    );
    let id = |i: u8| format!("{i:02x}ff0000-0000-4000-8000-000000000000");
    for i in 0..4u8 {
        db.sql(&format!(
            "INSERT INTO shop.outbox_events VALUES (UNHEX(REPLACE('{}', '-', '')), 'order', 'o-1', 'Placed', 1, \
             '{{}}', '2026-01-0{} 00:00:00')",
            id(i),
            i + 1
        ));
    }
    let broker = Broker::start(Engine::Memory);
    let (ids, stranger) = ((0..4).map(id).collect::<Vec<_>>(), "77777777-0000-4000-8000-000000000000");
    let mut records: Vec<(i32, &str, &str)> = ids.iter().map(|i| (0, "o-1", i.as_str())).collect();
    records.push((0, "o-1", stranger));
    produce(&broker, "outbox.event.order", &records);
    let connector = Connector::new();
    connector.write_config(&db, &broker, "");

    // Rows 2 and 3 (2026-01-03, 2026-01-04) are the window; rows 0 and 1 are older.
    let run = connector.audit(&["--since", "2026-01-03 00:00:00"]);
    assert_code(&run, 0, "audit");
    assert_eq!(run.count("table_rows"), 2, "{:#}", run.report);
    assert_eq!(run.count("missing"), 0, "{:#}", run.report);
    assert_eq!(run.count("outside_window"), 2, "{:#}", run.report);
    assert_eq!(run.count("not_in_table"), 1, "{:#}", run.report);
    assert_eq!(list(&run, "not_in_table_ids"), [stranger], "{:#}", run.report);
}

/// `prune` keeps every row of a held aggregate also when its aggregate id is a BINARY(16): the hold names
/// the aggregate by its UUID text, which the column used to be compared with as text, matching nothing, so
/// prune deleted the held rows (and with them the payload `quarantine release` needs).
#[test]
fn prune_keeps_the_rows_of_a_held_binary16_aggregate() {
    let db = MariaDb::start();
    reshape(
        &db,
        "CREATE TABLE shop.outbox_events (id CHAR(36) PRIMARY KEY, aggregate_type VARCHAR(64) NOT NULL, \
         aggregate_id BINARY(16) NOT NULL, event_type VARCHAR(128) NOT NULL, schema_version INT NOT NULL, \
         payload LONGTEXT NOT NULL, occurred_at DATETIME(6) NOT NULL, \
         KEY idx_aggregate (aggregate_type, aggregate_id, occurred_at)) DEFAULT CHARSET=utf8mb4",
    );
    db.sql(
        "CREATE USER 'pruner'@'127.0.0.1' IDENTIFIED BY 'prune-pw'; \
         GRANT SELECT, DELETE ON shop.outbox_events TO 'pruner'@'127.0.0.1'",
    );
    let (healthy, poisoned) = ("0a000000-0000-4000-8000-000000000000", "0b000000-0000-4000-8000-000000000000");
    // Ten days old: a 7-day retention may delete all three, but for the hold.
    let rows = [
        ("e-1", healthy, "{}".to_string()),
        ("e-2", poisoned, format!("\"{}\"", "x".repeat(30_000))),
        ("e-3", poisoned, "{}".to_string()),
    ];
    for (id, aggregate, payload) in &rows {
        db.sql(&format!(
            "INSERT INTO shop.outbox_events VALUES ('{id}', 'order', UNHEX(REPLACE('{aggregate}', '-', '')), \
             'Placed', 1, '{payload}', UTC_TIMESTAMP(6) - INTERVAL 10 DAY)"
        ));
    }
    let broker = Broker::start(Engine::Memory);
    let mut connector = Connector::new();
    let config = connector.write_config(&db, &broker, "\n[prune]\nuser = \"pruner\"\npassword = \"prune-pw\"\n");
    // Records up to 20 kB, and a dead-letter topic: e-2 is poison, and its aggregate is held.
    let text = std::fs::read_to_string(&config).unwrap().replace(
        "topic = \"outbox.event.${aggregate_type}\"",
        "topic = \"outbox.event.${aggregate_type}\"\nmax_record_bytes = 20000\ndead_letter_topic = \"dlq\"",
    );
    std::fs::write(&config, text).unwrap();
    connector.run(&config);
    let dead = broker.read_all("dlq", 2, READ_TIMEOUT);
    assert_eq!(ids(&dead), ["e-2", "e-3"].map(String::from).into(), "{}", connector.logs());
    assert_eq!(ids(&broker.read_all("outbox.event.order", 1, READ_TIMEOUT)), ["e-1".to_string()].into());
    assert!(connector.terminate().success(), "{}", connector.logs());
    let (status, out, err) = connector.command(&["quarantine", "list"], CLI_TIMEOUT).unwrap();
    assert!(status.success() && out.contains(poisoned), "the hold names the aggregate's UUID text: {out}{err}");

    let (status, out, err) = connector.command(&["prune", "--older-than", "7d"], CLI_TIMEOUT).unwrap();
    assert!(status.success(), "{out}{err}");
    assert!(out.contains("deleted 1 row(s)"), "{out}{err}");
    assert_eq!(db.sql("SELECT id FROM shop.outbox_events ORDER BY id"), "e-2\ne-3\n", "the held rows are kept");
}
