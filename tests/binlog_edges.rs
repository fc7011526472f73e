//! Writes the binlog shows differently than a plain committed insert, against a real MariaDB and broker:
//! table names under `lower_case_table_names`, writes logged as statements, binlog and replication filters,
//! XA transactions, and rows a `ROLLBACK TO SAVEPOINT` undid. Each either streams exactly what committed
//! or stops the connector with a definite error naming the fix — never a silent skip.

mod common;

use std::time::Duration;

use common::{business_tx, insert_event, Broker, Connector, Engine, MariaDb, OutboxRow};
use mysql_async::prelude::Queryable;

const TOPIC: &str = "outbox.event.order";
const READ_TIMEOUT: Duration = Duration::from_secs(120);
const EXIT_TIMEOUT: Duration = Duration::from_secs(60);

/// A connector whose config names the outbox table `table` (instead of `shop.outbox_events`), with
/// `extra_toml` appended.
fn connector_for(db: &MariaDb, broker: &Broker, table: &str, extra_toml: &str) -> Connector {
    let connector = Connector::new();
    let config = connector.write_config(db, broker, extra_toml);
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("table = \"shop.outbox_events\"", &format!("table = \"{table}\""));
    std::fs::write(&config, text).unwrap();
    connector
}

/// Waits for a definite error (exit 2) and returns the connector's logs.
fn definite_exit(connector: &mut Connector) -> String {
    let status =
        connector.wait_exit(EXIT_TIMEOUT).unwrap_or_else(|| panic!("the connector must stop\n{}", connector.logs()));
    assert_eq!(status.code(), Some(2), "{}", connector.logs());
    connector.logs()
}

/// `outbox-cdc check`: exit status and stdout.
fn check(connector: &Connector) -> (Option<i32>, String) {
    let (status, out, err) = connector.command(&["check"], EXIT_TIMEOUT).unwrap();
    (status.code(), format!("{out}{err}"))
}

/// `outbox-cdc check` with the default configuration against `db`.
fn check_server(db: &MariaDb) -> (Option<i32>, String) {
    let broker = Broker::start(Engine::Memory);
    let connector = Connector::new();
    connector.write_config(db, &broker, "");
    check(&connector)
}

/// `lower_case_table_names=1` with the table configured in another case (`Shop.Outbox_Events`): the server
/// stores and logs `shop.outbox_events`, and every streamed event is published. Regression guard for issue
/// 16 item 7: preflight and the snapshot found the table, the binlog reader compared names exactly, and
/// 50 of 50 streamed events were skipped silently while the checkpoint moved past them.
#[tokio::test(flavor = "multi_thread")]
async fn lower_case_table_names_1_streams_a_differently_cased_name() {
    let db = MariaDb::builder().arg("--lower-case-table-names=1").start();
    assert_eq!(db.sql("SELECT @@lower_case_table_names").trim(), "1");
    let broker = Broker::start(Engine::Memory);
    let mut conn = db.conn().await;
    // Rows before the start come from the snapshot, the rest from the stream: both under the same name.
    let mut ids = Vec::new();
    for i in 0..20 {
        ids.push(business_tx(&mut conn, &format!("A-{}", i % 5)).await.unwrap());
    }
    let mut connector = connector_for(&db, &broker, "Shop.Outbox_Events", "[snapshot]\nmode = \"initial\"\n");
    connector.run(&connector.config_path());
    assert_eq!(broker.read_all(TOPIC, 20, READ_TIMEOUT).len(), 20, "{}", connector.logs());
    for i in 0..50 {
        ids.push(business_tx(&mut conn, &format!("A-{}", i % 5)).await.unwrap());
    }
    let records = broker.read_all(TOPIC, 70, READ_TIMEOUT);
    let streamed = records.iter().filter(|r| r.header_str("source") != Some("snapshot")).count();
    assert_eq!(streamed, 50, "{}", connector.logs());
    let mut got: Vec<String> = records.iter().filter_map(|r| r.header_str("id").map(str::to_string)).collect();
    got.sort();
    ids.sort();
    assert_eq!(got, ids, "{}", connector.logs());
    connector.terminate();

    let (code, out) = check(&connector);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("table Shop.Outbox_Events name: expected a base table of the server, actual shop.outbox_events"),
        "{out}"
    );
}

/// `lower_case_table_names=0` (Linux's default): `Outbox_Events` is another table than `outbox_events`, so
/// a name in another case is refused before streaming, naming the table the server has.
#[tokio::test(flavor = "multi_thread")]
async fn lower_case_table_names_0_refuses_a_differently_cased_name() {
    let db = MariaDb::start();
    assert_eq!(db.sql("SELECT @@lower_case_table_names").trim(), "0");
    let broker = Broker::start(Engine::Memory);
    let mut connector = connector_for(&db, &broker, "shop.Outbox_Events", "");
    let (code, out) = check(&connector);
    assert_eq!(code, Some(2), "{out}");
    assert!(
        out.contains("compares table names case-sensitively (lower_case_table_names=0) and has shop.outbox_events"),
        "{out}"
    );
    connector.run(&connector.config_path());
    let logs = definite_exit(&mut connector);
    assert!(logs.contains("has shop.outbox_events"), "{logs}");
}

/// `lower_case_table_names=2` is for case-insensitive file systems; MariaDB on a case-sensitive one (any
/// Linux test machine) turns it into 0 at start-up and says so, and the connector then applies the rule of
/// 0. (The rule of 2, case-insensitive matching of the server's spelling, is the rule of 1 in the reader and
/// is covered by the unit test `table_map_names_follow_the_server_rule`.)
#[tokio::test(flavor = "multi_thread")]
async fn lower_case_table_names_2_on_linux_behaves_as_0() {
    let db = MariaDb::builder().arg("--lower-case-table-names=2").start();
    assert_eq!(db.sql("SELECT @@lower_case_table_names").trim(), "0");
    let log = std::fs::read_to_string(db.dir().join("mariadbd.out")).unwrap_or_default() + &db.error_log_tail(200);
    assert!(log.contains("lower_case_table_names was set to 2"), "{log}");
    let broker = Broker::start(Engine::Memory);
    let connector = connector_for(&db, &broker, "shop.Outbox_Events", "");
    let (code, out) = check(&connector);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("lower_case_table_names=0"), "{out}");
}

/// A session with `binlog_format=STATEMENT` (or MIXED) that inserts into the outbox leaves a QUERY event
/// and no rows: the connector stops at it with a definite error naming the fix, instead of dropping the
/// event (issue 16 item 8). Events committed before it are published.
#[tokio::test(flavor = "multi_thread")]
async fn statement_format_outbox_insert_is_definite() {
    for format in ["STATEMENT", "MIXED"] {
        let db = MariaDb::start();
        let broker = Broker::start(Engine::Memory);
        let mut conn = db.conn().await;
        let mut connector = Connector::start(&db, &broker, "");
        let before = business_tx(&mut conn, "A-1").await.unwrap();
        assert_eq!(broker.read_all(TOPIC, 1, READ_TIMEOUT).len(), 1, "{}", connector.logs());

        conn.query_drop(format!("SET SESSION binlog_format = '{format}'")).await.unwrap();
        insert_event(&mut conn, &OutboxRow::new("A-1")).await.unwrap();
        let logs = definite_exit(&mut connector);
        assert!(logs.contains("logged in statement format"), "{format}: {logs}");
        assert!(logs.contains("binlog_format=ROW"), "{format}: {logs}");
        let records = broker.read_all(TOPIC, 1, READ_TIMEOUT);
        assert_eq!(records.iter().filter_map(|r| r.header_str("id")).collect::<Vec<_>>(), [before.as_str()]);
    }
}

/// `binlog-ignore-db` / `binlog-do-db` that keep the outbox's database out of the binlog fail preflight
/// (issue 16 item 8: the snapshot would read the rows, the stream never sees them).
#[tokio::test(flavor = "multi_thread")]
async fn binlog_filters_hiding_the_outbox_fail_preflight() {
    for arg in ["--binlog-ignore-db=shop", "--binlog-do-db=billing"] {
        let (code, out) = check_server(&MariaDb::builder().arg(arg).start());
        assert_eq!(code, Some(2), "{arg}: {out}");
        assert!(out.contains("[FAIL] binlog filters for shop.outbox_events"), "{arg}: {out}");
        assert!(out.contains("remove binlog-do-db / binlog-ignore-db"), "{arg}: {out}");
    }
    // A filter that keeps the outbox's database passes.
    let (code, out) = check_server(&MariaDb::builder().arg("--binlog-do-db=shop").start());
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("[ok  ] binlog filters for shop.outbox_events"), "{out}");
}

/// A replica whose `replicate-*` filters drop the outbox table fails preflight: what the filter drops never
/// reaches the replica's binlog.
#[tokio::test(flavor = "multi_thread")]
async fn replica_filters_hiding_the_outbox_fail_preflight() {
    let db = MariaDb::builder().arg("--replicate-wild-ignore-table=shop.outbox%").start();
    // A configured (not started) replication connection is enough for SHOW ALL SLAVES STATUS to show it.
    db.sql("CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT=9, MASTER_USER='repl'");
    let (code, out) = check_server(&db);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("[FAIL] replication filters for shop.outbox_events"), "{out}");
    assert!(out.contains("replicate-wild-ignore-table = shop.outbox% matches shop.outbox_events"), "{out}");
}

/// An XA transaction that inserts into the outbox is refused with a definite error before any of its rows
/// is published (issue 16 item 9: MariaDB logs the branch's rows at XA PREPARE, before its outcome).
#[tokio::test(flavor = "multi_thread")]
async fn xa_outbox_write_is_definite_and_unpublished() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let mut conn = db.conn().await;
    let mut connector = Connector::start(&db, &broker, "");
    let before = business_tx(&mut conn, "A-1").await.unwrap();
    assert_eq!(broker.read_all(TOPIC, 1, READ_TIMEOUT).len(), 1, "{}", connector.logs());

    conn.query_drop("XA START 'x1'").await.unwrap();
    insert_event(&mut conn, &OutboxRow::new("A-1")).await.unwrap();
    conn.query_drop("XA END 'x1'").await.unwrap();
    conn.query_drop("XA PREPARE 'x1'").await.unwrap();
    let logs = definite_exit(&mut connector);
    assert!(logs.contains("XA transaction"), "{logs}");
    conn.query_drop("XA ROLLBACK 'x1'").await.unwrap();
    // The connector has stopped: one record, read to a quiet second however slow the machine.
    let records = broker.read_all(TOPIC, 1, READ_TIMEOUT);
    assert_eq!(records.iter().filter_map(|r| r.header_str("id")).collect::<Vec<_>>(), [before.as_str()]);
}

/// An XA transaction elsewhere (not on the outbox) is read through: outbox events after it are published.
#[tokio::test(flavor = "multi_thread")]
async fn xa_elsewhere_is_read_through() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let mut conn = db.conn().await;
    let mut connector = Connector::start(&db, &broker, "");
    conn.query_drop("XA START 'x2'").await.unwrap();
    conn.query_drop("INSERT INTO shop.orders (customer, amount, created_at) VALUES ('c', 1.00, NOW(6))").await.unwrap();
    conn.query_drop("XA END 'x2'").await.unwrap();
    conn.query_drop("XA PREPARE 'x2'").await.unwrap();
    conn.query_drop("XA COMMIT 'x2'").await.unwrap();
    let after = business_tx(&mut conn, "A-1").await.unwrap();
    let records = broker.read_all(TOPIC, 1, READ_TIMEOUT);
    assert_eq!(
        records.iter().filter_map(|r| r.header_str("id")).collect::<Vec<_>>(),
        [after.as_str()],
        "{}",
        connector.logs()
    );
    connector.terminate();
}

/// A `ROLLBACK TO SAVEPOINT` after a change to a non-transactional table is written to the binlog inside
/// the transaction, after the rows it undid: those rows are not published (issue 16 item 9: a rolled-back
/// part of a group was published as committed).
#[tokio::test(flavor = "multi_thread")]
async fn rows_undone_by_rollback_to_savepoint_are_not_published() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let mut conn = db.conn().await;
    conn.query_drop("CREATE TABLE shop.audit_log (id INT) ENGINE=MyISAM").await.unwrap();
    let mut connector = Connector::start(&db, &broker, "");
    let (kept, undone, last) = (OutboxRow::new("A-1"), OutboxRow::new("A-1"), OutboxRow::new("A-1"));
    conn.query_drop("BEGIN").await.unwrap();
    insert_event(&mut conn, &kept).await.unwrap();
    conn.query_drop("SAVEPOINT s1").await.unwrap();
    conn.query_drop("INSERT INTO shop.audit_log VALUES (1)").await.unwrap();
    insert_event(&mut conn, &undone).await.unwrap();
    conn.query_drop("ROLLBACK TO SAVEPOINT s1").await.unwrap();
    insert_event(&mut conn, &last).await.unwrap();
    conn.query_drop("COMMIT").await.unwrap();
    let table: Vec<String> = conn.query("SELECT id FROM shop.outbox_events ORDER BY occurred_at, id").await.unwrap();
    assert!(!table.contains(&undone.id), "the server rolled it back");

    let records = broker.read_all(TOPIC, 2, READ_TIMEOUT);
    let got: Vec<&str> = records.iter().filter_map(|r| r.header_str("id")).collect();
    assert_eq!(got, [kept.id.as_str(), last.id.as_str()], "{}", connector.logs());
    connector.terminate();
}

/// Two connectors configured with one `server_id`: the server keeps one replication connection per id and
/// drops the other (MariaDB's ER_SLAVE_SAME_ID, 4052). Regression guard: that error was transient, so the two
/// reconnected and dropped each other in turn forever; now the dropped one stops with exit 2 and the fix.
#[tokio::test(flavor = "multi_thread")]
async fn two_connectors_with_one_server_id_stop_with_the_fix() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let mut first = Connector::start(&db, &broker, "");
    let deadline = std::time::Instant::now() + READ_TIMEOUT;
    while !first.logs().contains("streaming") {
        assert!(std::time::Instant::now() < deadline, "the first connector never streamed\n{}", first.logs());
        std::thread::sleep(Duration::from_millis(200));
    }
    let first_config = std::fs::read_to_string(first.config_path()).unwrap();
    let server_id = first_config.lines().find(|l| l.starts_with("server_id")).unwrap().to_string();
    let mut second = Connector::new();
    let config = second.write_config(&db, &broker, "");
    let text = std::fs::read_to_string(&config).unwrap();
    let own = text.lines().find(|l| l.starts_with("server_id")).unwrap().to_string();
    std::fs::write(&config, text.replace(&own, &server_id)).unwrap();
    second.run(&config);

    let deadline = std::time::Instant::now() + EXIT_TIMEOUT;
    let stopped = loop {
        if let Some(status) = first.wait_exit(Duration::from_millis(500)) {
            break (status, first.logs());
        }
        if let Some(status) = second.wait_exit(Duration::from_millis(500)) {
            break (status, second.logs());
        }
        assert!(
            std::time::Instant::now() < deadline,
            "neither connector stopped\nfirst:\n{}\nsecond:\n{}",
            first.logs(),
            second.logs()
        );
    };
    assert_eq!(stopped.0.code(), Some(2), "{}", stopped.1);
    assert!(stopped.1.contains("its own server_id"), "{}", stopped.1);
}
