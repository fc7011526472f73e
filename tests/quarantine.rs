//! Holds against a real MariaDB and a real broker, at their edges: an oversized poison row released from
//! the table after `prune` (which keeps a held aggregate's rows), a crash right after a poison row in the
//! stream and in the snapshot (the restart must not divert the events before it), and a dead-letter topic that lost a hold's first record
//! (release must refuse, not lift the hold silently).

mod common;

use std::path::Path;
use std::time::Duration;

use common::{ids_of_key, insert_event, Broker, Connector, Engine, MariaDb, OutboxRow};
use mysql_async::prelude::Queryable;
use outbox_cdc::ops::prune::{self, PruneOptions};
use serde_json::json;

const TOPIC: &str = "outbox.event.order";
const DLQ: &str = "dlq";
const READ_TIMEOUT: Duration = Duration::from_secs(120);
const CLI_TIMEOUT: Duration = Duration::from_secs(120);
/// Records up to 20 kB; [`big`] rows are over it.
const SMALL_LIMIT: &str = "max_record_bytes = 20000";
const RAISED_LIMIT: &str = "max_record_bytes = 100000";
const PRUNE_TOML: &str = "\n[prune]\nuser = \"pruner\"\npassword = \"prune-pw\"\nbatch_rows = 3\npause_ms = 10\n";

/// A connector config with a dead-letter topic and [`SMALL_LIMIT`]; the topics it creates take Kafka's
/// default 1 MB records, so raising `max_record_bytes` is all the operator's fix needs (the connector
/// checks a topic's `max.message.bytes` against its own limits at the topic's first use).
fn write_config(connector: &Connector, db: &MariaDb, broker: &Broker, extra: &str) -> std::path::PathBuf {
    let config = connector.write_config(db, broker, extra);
    let text = std::fs::read_to_string(&config).unwrap().replace(
        "topic = \"outbox.event.${aggregate_type}\"",
        &format!(
            "topic = \"outbox.event.${{aggregate_type}}\"\n{SMALL_LIMIT}\ndead_letter_topic = \"{DLQ}\"\n\
             topic_config = {{ \"max.message.bytes\" = \"1048588\" }}"
        ),
    );
    std::fs::write(&config, text).unwrap();
    config
}

/// The operator's fix for a too-large row: a higher `kafka.max_record_bytes`.
fn raise_limit(config: &Path) {
    let text = std::fs::read_to_string(config).unwrap().replace(SMALL_LIMIT, RAISED_LIMIT);
    std::fs::write(config, text).unwrap();
}

/// The 30 kB payload of a too-large row.
fn blob() -> String {
    "x".repeat(30_000)
}

fn big(aggregate_id: &str) -> OutboxRow {
    OutboxRow::new(aggregate_id).payload(json!({ "blob": blob() }))
}

/// `ids` read in order, with repeats of an id right after itself allowed (at-least-once), is `expected`.
fn assert_in_order(ids: &[String], expected: &[&str], logs: &str) {
    let mut deduped: Vec<&str> = Vec::new();
    for id in ids {
        if deduped.last() != Some(&id.as_str()) {
            deduped.push(id);
        }
    }
    assert_eq!(deduped, expected, "order of the aggregate's events in {TOPIC}: {ids:?}\n{logs}");
}

fn occurred_days_ago(db: &MariaDb, days: u32) -> String {
    db.sql(&format!("SELECT DATE_FORMAT(UTC_TIMESTAMP(6) - INTERVAL {days} DAY, '%Y-%m-%d %H:%i:%s.%f')"))
        .trim()
        .to_owned()
}

/// Guards against the loss of an oversized poison row (issue 16, item 3): its dead letter carries no
/// payload, `prune` deleted its row, and `quarantine release` could never republish it, so the runbook's
/// "raise the limit, then release" did not work. Now prune keeps every row of a held aggregate, and release
/// reads the payload back from the table by id.
#[tokio::test(flavor = "multi_thread")]
async fn an_oversized_row_is_released_whole_after_prune() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    db.sql(
        "CREATE USER 'pruner'@'127.0.0.1' IDENTIFIED BY 'prune-pw'; \
         GRANT SELECT, DELETE ON shop.outbox_events TO 'pruner'@'127.0.0.1'",
    );
    let mut conn = db.conn().await;
    let old = occurred_days_ago(&db, 10);
    let healthy = OutboxRow::new("A-1").occurred_at(old.clone());
    let poison = big("P-1").occurred_at(old.clone());
    let held = OutboxRow::new("P-1").occurred_at(old);
    for row in [&healthy, &poison, &held] {
        insert_event(&mut conn, row).await.unwrap();
    }

    let mut connector = Connector::new();
    let config = write_config(&connector, &db, &broker, PRUNE_TOML);
    connector.run(&config);
    let dead = broker.read_all(DLQ, 2, READ_TIMEOUT);
    assert_eq!(ids_of_key(&dead, "P-1"), [poison.id.clone(), held.id.clone()], "{}", connector.logs());
    assert!(broker.read_all(TOPIC, 1, READ_TIMEOUT).iter().any(|r| r.header_str("id") == Some(&healthy.id)));

    // Every row is ten days old and delivered (to its topic or the dead-letter topic): only the healthy
    // aggregate's row may go.
    let options = PruneOptions { older_than: Duration::from_secs(7 * 86_400), wait: READ_TIMEOUT, dry_run: false };
    let loaded = outbox_cdc::config::Config::load(&config).unwrap();
    let report = prune::prune(&loaded, &options).await.unwrap_or_else(|e| panic!("prune: {e}\n{}", connector.logs()));
    assert_eq!(report.rows_deleted, 1, "prune deleted rows of a held aggregate");
    let left: Vec<String> = conn.query("SELECT id FROM shop.outbox_events ORDER BY id").await.unwrap();
    let mut kept = vec![poison.id.clone(), held.id.clone()];
    kept.sort();
    assert_eq!(left, kept);
    assert!(connector.terminate().success());

    raise_limit(&config);
    let (status, out, err) = connector.command(&["quarantine", "release", "order", "P-1"], CLI_TIMEOUT).unwrap();
    assert!(status.success(), "{out}{err}");
    assert!(out.contains("2 event(s) republished"), "{out}");
    let normal = broker.read_all(TOPIC, 3, READ_TIMEOUT);
    assert_in_order(&ids_of_key(&normal, "P-1"), &[&poison.id, &held.id], &connector.logs());
    let released = normal.iter().find(|r| r.header_str("id") == Some(&poison.id)).unwrap();
    let value = String::from_utf8_lossy(released.value.as_deref().unwrap());
    assert!(value.contains(&blob()), "the released event lacks its payload: {}", &value[..value.len().min(300)]);
}

/// Guards against a crash right after a poison row diverting the events *before* it (issue 16, item 5):
/// the restart read the poison row's transaction again, found the aggregate on hold, and sent the event
/// written before the poison row to the dead-letter topic behind it, so release published it after the
/// poison row. The crash is the `row_produced` failpoint on the poison row's dead letter: the hold is stored,
/// nothing of the transaction is checkpointed.
#[tokio::test(flavor = "multi_thread")]
async fn a_restart_after_a_poison_row_keeps_the_events_before_it_in_order() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let mut conn = db.conn().await;
    let before = OutboxRow::new("P-1");
    let poison = big("P-1");
    let after = OutboxRow::new("P-1");
    conn.query_drop("BEGIN").await.unwrap();
    for row in [&before, &poison, &after] {
        insert_event(&mut conn, row).await.unwrap();
    }
    conn.query_drop("COMMIT").await.unwrap();

    crash_after_the_poison_row_then_release(&db, &broker, "", "row_produced:2", [&before, &poison, &after]);
}

/// The same crash in the initial snapshot (issue 16, item 5): the `snapshot_row` failpoint aborts right
/// after the poison row's dead letter, before its chunk is acknowledged, so the resumed snapshot scans the
/// aggregate's earlier row again; it must go to the normal topic, not behind the poison row.
#[tokio::test(flavor = "multi_thread")]
async fn a_resumed_snapshot_keeps_the_events_before_a_poison_row_in_order() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let mut conn = db.conn().await;
    // The snapshot scans one aggregate in occurred_at order.
    let at = |second: u32| {
        db.sql(&format!(
            "SELECT DATE_FORMAT(UTC_TIMESTAMP(6) - INTERVAL 1 HOUR + INTERVAL {second} SECOND, '%Y-%m-%d %H:%i:%s.%f')"
        ))
        .trim()
        .to_owned()
    };
    let before = OutboxRow::new("P-1").occurred_at(at(1));
    let poison = big("P-1").occurred_at(at(2));
    let after = OutboxRow::new("P-1").occurred_at(at(3));
    for row in [&before, &poison, &after] {
        insert_event(&mut conn, row).await.unwrap();
    }

    crash_after_the_poison_row_then_release(
        &db,
        &broker,
        "[snapshot]\nmode = \"initial\"\nchunk_rows = 500\n",
        "snapshot_row:2",
        [&before, &poison, &after],
    );
}

/// Guards against a release that lifts a hold with its first events gone (issue 16, item 4): the
/// dead-letter topic lost the poison row's record (here the broker lost its data), a later held event
/// arrived, and release republished that one alone and lifted the hold, silently without the poison row.
/// Now release refuses with exit 2, names the missing event, and keeps the hold.
#[tokio::test(flavor = "multi_thread")]
async fn release_refuses_when_the_first_record_of_the_hold_is_gone() {
    let db = MariaDb::start();
    let mut broker = Broker::start(Engine::Memory);
    let mut conn = db.conn().await;
    let poison = big("P-1");
    insert_event(&mut conn, &poison).await.unwrap();

    let mut connector = Connector::new();
    let config = write_config(&connector, &db, &broker, "");
    connector.run(&config);
    let dead = broker.read_all(DLQ, 1, READ_TIMEOUT);
    assert_eq!(ids_of_key(&dead, "P-1"), [poison.id.as_str()], "{}", connector.logs());
    assert!(connector.terminate().success());

    // The memory engine forgets every record on restart: the hold's first record is gone.
    broker.restart();
    connector.restart();
    let later = OutboxRow::new("P-1");
    insert_event(&mut conn, &later).await.unwrap();
    let dead = broker.read_all(DLQ, 1, READ_TIMEOUT);
    assert_eq!(ids_of_key(&dead, "P-1"), [later.id.as_str()], "{}", connector.logs());
    assert!(connector.terminate().success());

    raise_limit(&config);
    let (status, out, err) = connector.command(&["quarantine", "release", "order", "P-1"], CLI_TIMEOUT).unwrap();
    assert_eq!(status.code(), Some(2), "release lifted a hold whose first record is gone:\n{out}{err}");
    assert!(err.contains(&poison.id) && err.contains("not in the dead-letter topic"), "{err}");
    let (_, out, _) = connector.command(&["quarantine", "list", "--json"], CLI_TIMEOUT).unwrap();
    let holds: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(holds.as_array().map(Vec::len), Some(1), "the hold must stay: {out}");
    assert!(broker.read_all(TOPIC, 0, Duration::from_secs(3)).is_empty(), "nothing may be republished");

    // The operator's decision (after recovering the poison row's event from the table): release anyway.
    let (status, out, err) =
        connector.command(&["quarantine", "release", "order", "P-1", "--accept-missing"], CLI_TIMEOUT).unwrap();
    assert!(status.success(), "{out}{err}");
    assert!(out.contains("1 event(s) republished") && out.contains(&poison.id), "{out}");
    assert_eq!(ids_of_key(&broker.read_all(TOPIC, 1, READ_TIMEOUT), "P-1"), [later.id.as_str()]);
    let (_, out, _) = connector.command(&["quarantine", "list", "--json"], CLI_TIMEOUT).unwrap();
    assert_eq!(serde_json::from_str::<serde_json::Value>(&out).unwrap().as_array().map(Vec::len), Some(0), "{out}");
}

/// Runs a connector with `extra` config until `failpoint` crashes it right after the poison row's dead
/// letter, restarts it, and checks the order rule of a hold: the event before the poison row reached the
/// normal topic, the poison row and the one after it were diverted, and release publishes all three in order.
fn crash_after_the_poison_row_then_release(
    db: &MariaDb,
    broker: &Broker,
    extra: &str,
    failpoint: &str,
    [before, poison, after]: [&OutboxRow; 3],
) {
    let mut connector = Connector::new();
    let config = write_config(&connector, db, broker, extra);
    connector.env(outbox_cdc::failpoint::ENV, failpoint);
    connector.run(&config);
    let status = connector.wait_exit(READ_TIMEOUT).expect("the failpoint crashes the connector");
    assert!(!status.success(), "{}", connector.logs());
    connector.remove_env(outbox_cdc::failpoint::ENV);
    connector.restart();

    let dead = broker.read_all(DLQ, 2, READ_TIMEOUT);
    let normal = broker.read_all(TOPIC, 1, READ_TIMEOUT);
    assert!(connector.terminate().success());
    let held = ids_of_key(&dead, "P-1");
    assert!(!held.contains(&before.id), "the event before the poison row was diverted: {held:?}\n{}", connector.logs());
    assert!(held.contains(&poison.id) && held.contains(&after.id), "{held:?}");
    assert!(ids_of_key(&normal, "P-1").contains(&before.id));

    raise_limit(&config);
    let (status, out, err) = connector.command(&["quarantine", "release", "order", "P-1"], CLI_TIMEOUT).unwrap();
    assert!(status.success(), "{out}{err}");
    let normal = broker.read_all(TOPIC, 3, READ_TIMEOUT);
    assert_in_order(&ids_of_key(&normal, "P-1"), &[&before.id, &poison.id, &after.id], &connector.logs());
}
