//! A table added to `[outbox] tables` of a connector that streamed already (README "Tables added later"),
//! against a real MariaDB and broker: its rows written before the restart are snapshotted, those written
//! after are streamed, each once and in order per aggregate, while another table's writers go on; and
//! the same with the connector crashed in the middle of that snapshot.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::reliability::{self, Duplicates};
use common::{wait_until, Broker, Connector, Engine, Expected, MariaDb, OutboxRow, Writer, WriterConfig};
use mysql_async::prelude::Queryable;

const ORDERS: &str = "outbox.event.order";
const MORE: &str = "outbox.event.more";
const READ_TIMEOUT: Duration = Duration::from_secs(180);
const FAILPOINT: &str = "OUTBOX_CDC_FAILPOINT";

/// Inserts the `i`th row of `shop.outbox_more` (aggregate type `more`, 10 aggregates round-robin) in one
/// autocommit statement, recording its id after its aggregate's earlier ones in `ids` (commit order).
async fn insert_more_row(conn: &mut mysql_async::Conn, i: usize, ids: &mut BTreeMap<String, Vec<String>>) {
    let aggregate = format!("M-{}", i % 10);
    let row = OutboxRow { aggregate_type: "more".into(), ..OutboxRow::new(aggregate.clone()) };
    conn.exec_drop(
        "INSERT INTO shop.outbox_more (id, aggregate_type, aggregate_id, event_type, schema_version, payload, \
         occurred_at, next_attempt_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (
            &row.id,
            &row.aggregate_type,
            &row.aggregate_id,
            &row.event_type,
            row.schema_version,
            row.payload.to_string(),
            &row.occurred_at,
            &row.next_attempt_at,
        ),
    )
    .await
    .unwrap();
    ids.entry(aggregate).or_default().push(row.id);
}

/// Inserts `n` rows into `shop.outbox_more` ([`insert_more_row`]), recording them in `ids`.
async fn insert_more(db: &MariaDb, n: usize, ids: &mut BTreeMap<String, Vec<String>>) {
    let mut conn = db.conn().await;
    for i in 0..n {
        insert_more_row(&mut conn, i, ids).await;
    }
}

/// Inserts into `shop.outbox_more` until `stop`, from a task of its own; returns what it wrote.
fn keep_inserting(db: &MariaDb, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<BTreeMap<String, Vec<String>>> {
    let opts = db.opts_root();
    tokio::spawn(async move {
        let mut conn = mysql_async::Conn::new(opts).await.unwrap();
        let mut ids: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut i = 0;
        while !stop.load(Ordering::SeqCst) {
            insert_more_row(&mut conn, i, &mut ids).await;
            i += 1;
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        ids
    })
}

/// Merges `later` after `earlier`, per aggregate.
fn merged(mut earlier: BTreeMap<String, Vec<String>>, later: BTreeMap<String, Vec<String>>) -> Expected {
    for (aggregate, ids) in later {
        earlier.entry(aggregate).or_default().extend(ids);
    }
    Expected { per_aggregate: earlier, uncertain: Default::default() }
}

/// The connector's config with both tables.
fn add_table(connector: &Connector) {
    let path = connector.config_path();
    let config = std::fs::read_to_string(&path).unwrap();
    assert!(config.contains("table = \"shop.outbox_events\""), "{config}");
    let both =
        config.replace("table = \"shop.outbox_events\"", "tables = [\"shop.outbox_events\", \"shop.outbox_more\"]");
    std::fs::write(&path, both).unwrap();
}

/// Runs the scenario: a connector on `shop.outbox_events` only, under 4 writers, while rows go into
/// `shop.outbox_more` too; stopped, the table added, started again with `failpoint` armed (then restarted
/// without it once it fired) while both tables keep being written. Returns the records of both topics and
/// what was written to each.
async fn scenario(failpoint: Option<&str>) -> Scenario {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    db.conn().await.query_drop("CREATE TABLE shop.outbox_more LIKE shop.outbox_events").await.unwrap();
    let mut more = BTreeMap::new();
    insert_more(&db, 1_000, &mut more).await;
    let mut connector = Connector::new();
    connector.write_config(&db, &broker, "[snapshot]\nchunk_rows = 100\n");
    connector.run(&connector.config_path());
    let orders = Writer::start(
        db.opts_root(),
        WriterConfig { tasks: 4, max_events: 1_000_000, pause: Duration::from_millis(5), ..WriterConfig::default() },
    );
    orders.wait_committed(300, Duration::from_secs(60)).await;
    insert_more(&db, 500, &mut more).await;
    assert!(connector.terminate().success(), "{}", connector.logs());
    assert!(broker.read_all(MORE, 0, Duration::from_secs(2)).is_empty(), "a table not configured was published");

    add_table(&connector);
    let stop = Arc::new(AtomicBool::new(false));
    let during = keep_inserting(&db, stop.clone());
    if let Some(failpoint) = failpoint {
        connector.env(FAILPOINT, failpoint);
        connector.restart();
        assert!(connector.wait_exit(READ_TIMEOUT).is_some_and(|s| !s.success()), "no crash:\n{}", connector.logs());
        connector.remove_env(FAILPOINT);
    }
    connector.restart();
    // Done once a checkpoint names both tables with no unfinished snapshot (its record goes once the stream
    // is past its read views).
    let done = wait_until(READ_TIMEOUT, || {
        connector.status_json().is_some_and(|s| {
            s["tables"].as_array().is_some_and(|t| t.len() == 2)
                && (s["snapshot"].is_null() || s["snapshot"]["done"] == true)
        })
    });
    assert!(done, "the added table's snapshot never finished:\n{}", connector.logs());
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::SeqCst);
    let more = merged(more, during.await.unwrap());
    orders.stop();
    let orders = orders.finish().await;
    assert!(orders.errors.is_empty(), "{:?}", orders.errors);
    let more_records = broker.read_all(MORE, more.len(), READ_TIMEOUT);
    let order_records = broker.read_all(ORDERS, orders.len(), READ_TIMEOUT);
    Scenario { more_records, more, order_records, orders: orders.expected, connector, _services: (db, broker) }
}

/// What [`scenario`] leaves: the records and what was written, per table, and the connector with its
/// database and broker still running (for the closing audit).
struct Scenario {
    more_records: Vec<common::Received>,
    more: Expected,
    order_records: Vec<common::Received>,
    orders: Expected,
    connector: Connector,
    _services: (MariaDb, Broker),
}

/// Without a crash: every row of the added table once (1,500 written before the restart, snapshotted;
/// the rest streamed), each aggregate's records in commit order on every record, the snapshot's before
/// the stream's; the other table's stream complete, in order, once each across the restart.
#[tokio::test(flavor = "multi_thread")]
async fn a_table_added_later_is_snapshotted_then_streamed_once_each() {
    let Scenario { more_records, more, order_records, orders, mut connector, _services } = scenario(None).await;
    let report = common::audit(&more, &more_records);
    assert!(report.is_clean() && report.duplicates == 0, "the added table: {}\n{}", report.summary(), connector.logs());
    let from_snapshot = more_records.iter().filter(|r| r.header_str("source") == Some("snapshot")).count();
    assert!(from_snapshot >= 1_500, "{from_snapshot} records from the snapshot");
    let report = common::audit(&orders, &order_records);
    assert!(report.is_clean() && report.duplicates == 0, "the other table: {}\n{}", report.summary(), connector.logs());
    eprintln!(
        "added table: {} records, {from_snapshot} from its snapshot; other table: {} records",
        more_records.len(),
        order_records.len()
    );
    assert!(connector.terminate().success(), "{}", connector.logs());
}

/// Crashed (a failpoint's abort, as a kill -9) at the added table's 350th snapshot row, and started
/// again: the snapshot resumes in a new read view and ends; every row of the added table is published, each
/// aggregate in commit order (duplicates only of rows after the last checkpoint), the other table's
/// stream complete and in order.
#[tokio::test(flavor = "multi_thread")]
async fn a_crash_in_the_added_tables_snapshot_resumes_it() {
    let Scenario { more_records, more, order_records, orders, mut connector, _services } =
        scenario(Some("snapshot_row:350")).await;
    let report = common::audit(&more, &more_records);
    assert!(report.is_clean(), "the added table: {}\n{}", report.summary(), connector.logs());
    let report = common::audit(&orders, &order_records);
    assert!(report.is_clean(), "the other table: {}\n{}", report.summary(), connector.logs());
    let logs = connector.logs();
    assert!(logs.contains("resuming the snapshot after the last acknowledged key"), "not resumed:\n{logs}");
    let written = common::Written { expected: orders.merged(&more), ..common::Written::default() };
    let name = "a table added to the config, crashed in its snapshot";
    let audit = reliability::closing_audit(name, &connector, &written, Duplicates::Reported);
    reliability::record(
        name,
        &written,
        &audit,
        None,
        &format!(
            "4 writers on the first table, inserts into the added one across the restart; the added table's \
             snapshot aborted at its 350th row and resumed in a new read view: {} of its records for {} rows, \
             nothing missing, each aggregate in commit order",
            more_records.len(),
            more.len()
        ),
    );
    assert!(connector.terminate().success(), "{}", connector.logs());
}
