//! `outbox-cdc audit` against deliberately broken topics: it must fail on a missing record, an
//! out-of-order pair and an aggregate split over two partitions, report duplicates and records the table
//! does not have without failing, and pass on a good topic. The records are produced by the test itself
//! (no connector), so each defect is exactly the one planted.

mod common;

use std::time::Duration;

use common::{insert_event, new_event_id, AuditRun, Broker, Connector, Engine, MariaDb, OutboxRow};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

/// Events per aggregate; two aggregates per case.
const EVENTS: usize = 4;

/// One planted record: partition, aggregate, id.
type Planted = (i32, String, String);

/// Writes `EVENTS` rows for each of two aggregates of `case` (aggregate type = case, topic
/// `outbox.event.<case>`), `occurred_at` increasing per aggregate. Returns the ids per aggregate.
async fn rows(db: &MariaDb, case: &str) -> Vec<(String, Vec<String>)> {
    let mut conn = db.conn().await;
    let mut out = Vec::new();
    for a in 0..2 {
        let aggregate = format!("{case}-agg{a}");
        let mut ids = Vec::new();
        for e in 0..EVENTS {
            let id = new_event_id();
            let row = OutboxRow::new(aggregate.as_str())
                .aggregate_type(case)
                .id(id.as_str())
                .occurred_at(format!("2026-01-01 00:00:0{e}.00000{a}"));
            insert_event(&mut conn, &row).await.expect("insert outbox row");
            ids.push(id);
        }
        out.push((aggregate, ids));
    }
    out
}

/// Produces `records` to `outbox.event.<case>` (2 partitions), in the given order, with the `id` header.
fn produce(broker: &Broker, case: &str, records: &[Planted]) {
    let topic = format!("outbox.event.{case}");
    broker.create_topic(&topic, 2);
    let producer: BaseProducer =
        broker.client_config().set("enable.idempotence", "true").create().expect("create producer");
    for (partition, aggregate, id) in records {
        let headers = OwnedHeaders::new().insert(Header { key: "id", value: Some(id.as_str()) });
        producer
            .send(BaseRecord::to(&topic).partition(*partition).key(aggregate.as_str()).payload("{}").headers(headers))
            .unwrap_or_else(|(e, _)| panic!("enqueue: {e}"));
    }
    producer.flush(Duration::from_secs(60)).expect("flush the planted records");
}

/// The records of a correct delivery: aggregate `a` on partition `a`, in order.
fn in_order(rows: &[(String, Vec<String>)]) -> Vec<Planted> {
    let mut out = Vec::new();
    for (a, (aggregate, ids)) in rows.iter().enumerate() {
        out.extend(ids.iter().map(|id| (a as i32, aggregate.clone(), id.clone())));
    }
    out
}

fn only(case: &str) -> String {
    format!("aggregate_type = '{case}'")
}

fn assert_code(run: &AuditRun, code: i32, what: &str) {
    assert_eq!(run.code, Some(code), "{what}: {:#}\n{}", run.report, run.stderr);
}

/// The four cases in one database and broker; each audited alone with `--where`, then all together.
#[tokio::test(flavor = "multi_thread")]
async fn audit_fails_on_broken_topics_and_passes_on_a_good_one() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);

    // good: in order, plus a redelivery of one event (a duplicate) and a record the table does not have.
    let good = rows(&db, "good").await;
    let mut records = in_order(&good);
    let redelivered = good[0].1[2].clone();
    records.push((0, good[0].0.clone(), redelivered.clone()));
    records.push((0, good[0].0.clone(), "not-in-the-table".into()));
    produce(&broker, "good", &records);
    // An old row of the good case that was never produced: outside a `--since` window, missing without.
    let old = OutboxRow::new("good-agg0").aggregate_type("good").occurred_at("2020-06-01 00:00:00.000000");
    insert_event(&mut db.conn().await, &old).await.expect("insert the old row");

    // gap: one record never produced.
    let gap = rows(&db, "gap").await;
    let lost = gap[1].1[2].clone();
    produce(&broker, "gap", &in_order(&gap).into_iter().filter(|(_, _, id)| *id != lost).collect::<Vec<_>>());

    // late: events #1 and #2 of one aggregate swapped.
    let late = rows(&db, "late").await;
    let mut records = in_order(&late);
    records.swap(1, 2);
    produce(&broker, "late", &records);

    // split: the second half of one aggregate on the other partition.
    let split = rows(&db, "split").await;
    let mut records = in_order(&split);
    for r in records.iter_mut().take(EVENTS).skip(EVENTS / 2) {
        r.0 = 1;
    }
    produce(&broker, "split", &records);

    let connector = Connector::new();
    connector.write_config(&db, &broker, "");

    let run = connector.audit(&["--since", "2025-01-01 00:00:00", "--where", &only("good")]);
    assert_code(&run, 0, "good topic in the window since 2025");
    assert_eq!(run.count("table_rows"), 2 * EVENTS as u64);
    assert_eq!(run.count("missing"), 0);
    assert_eq!(run.count("order_violations"), 0);
    assert_eq!(run.duplicates(), [(redelivered, 2)], "{:#}", run.report);
    assert_eq!(run.count("duplicate_records"), 1);
    assert_eq!(run.report["not_in_table_ids"], serde_json::json!(["not-in-the-table"]));
    // The other cases' 23 records are in the table, outside the window.
    assert_eq!(run.count("outside_window"), 3 * 2 * EVENTS as u64 - 1);
    assert_eq!(run.count("kafka_records"), 4 * 2 * EVENTS as u64 + 2 - 1);

    let run = connector.audit(&["--where", &only("good")]);
    assert_code(&run, 1, "good topic with the never-produced old row in the window");
    assert_eq!(run.report["missing_ids"], serde_json::json!([old.id]));

    let run = connector.audit(&["--where", &only("gap")]);
    assert_code(&run, 1, "gap");
    assert_eq!(run.report["missing_ids"], serde_json::json!([lost]));
    assert_eq!(run.count("order_violations"), 0, "a gap is not disorder");

    let run = connector.audit(&["--where", &only("late")]);
    assert_code(&run, 1, "late");
    assert_eq!((run.count("missing"), run.count("order_violations")), (0, 1), "{:#}", run.report);
    let sample = run.report["order_violation_samples"][0].as_str().unwrap_or_default().to_owned();
    assert!(sample.contains(&late[0].1[1]) && sample.contains(&late[0].1[2]), "{sample}");

    let run = connector.audit(&["--where", &only("split")]);
    assert_code(&run, 1, "split");
    assert_eq!((run.count("missing"), run.count("split_aggregates")), (0, 1), "{:#}", run.report);

    let run = connector.audit(&[]);
    assert_code(&run, 1, "everything");
    assert_eq!(run.count("table_rows"), 4 * 2 * EVENTS as u64 + 1);
    assert_eq!(run.count("missing"), 2);
    assert_eq!(run.report["topics"].as_array().map(Vec::len), Some(4));
}

/// An empty outbox and no topic yet: nothing to miss, the audit passes (it must not trip over its own empty
/// spill file or an unknown topic).
#[tokio::test(flavor = "multi_thread")]
async fn audit_of_an_empty_outbox_passes() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let connector = Connector::new();
    connector.write_config(&db, &broker, "");
    let run = connector.audit(&[]);
    assert_code(&run, 0, "empty outbox");
    assert_eq!((run.count("table_rows"), run.count("kafka_records")), (0, 0), "{:#}", run.report);
}
