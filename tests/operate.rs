//! Operating the connector against a real MariaDB and a real broker: the metrics and health endpoint,
//! poison rows (each kind) to the dead-letter topic with aggregate quarantine across a restart, and
//! `quarantine release`.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{
    free_port, ids_of_key, insert_event, wait_until, Broker, Connector, Engine, MariaDb, OutboxRow, Received,
};
use mysql_async::prelude::Queryable;
use outbox_cdc::metrics::{names, COMMIT, VERSION};
use serde_json::json;

const TOPIC: &str = "outbox.event.order";
const DLQ: &str = "dlq";
const READ_TIMEOUT: Duration = Duration::from_secs(120);

/// `GET path` on the connector's endpoint: (status code, body); `None` when nothing listens.
fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let code = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    Some((code, body))
}

/// The value of one sample line `name{labels} value` in a metrics page.
fn sample(page: &str, series: &str) -> Option<f64> {
    page.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// `/metrics` exposes every documented metric with real values; `/healthz` answers; `/readyz` follows
/// the broker going away and coming back.
#[tokio::test(flavor = "multi_thread")]
async fn metrics_health_and_readiness() {
    let db = MariaDb::start();
    let mut broker = Broker::start(Engine::Memory);
    let mut conn = db.conn().await;
    conn.query_drop("SET GLOBAL binlog_expire_logs_seconds = 3600").await.unwrap();
    for i in 0..20 {
        insert_event(&mut conn, &OutboxRow::new(format!("A-{}", i % 4))).await.unwrap();
    }
    let port = free_port();
    let mut connector = Connector::start(
        &db,
        &broker,
        &format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\npurge_check_interval_ms = 1000\n"),
    );
    assert_eq!(broker.read_all(TOPIC, 20, READ_TIMEOUT).len(), 20, "{}", connector.logs());

    assert_eq!(get(port, "/healthz").map(|r| r.0), Some(200), "{}", connector.logs());
    assert!(
        wait_until(Duration::from_secs(60), || get(port, "/readyz").is_some_and(|r| r.0 == 200)),
        "/readyz never became ready: {:?}\n{}",
        get(port, "/readyz"),
        connector.logs()
    );
    let page = || get(port, "/metrics").expect("metrics endpoint").1;
    assert!(
        wait_until(Duration::from_secs(30), || {
            sample(&page(), "outbox_cdc_events_acknowledged_total{topic=\"outbox.event.order\"}") == Some(20.0)
        }),
        "{}",
        page()
    );
    let text = page();
    for name in names::ALL {
        assert!(text.contains(&format!("# TYPE {name} ")), "{name} missing:\n{text}");
    }
    assert_eq!(sample(&text, "outbox_cdc_events_read_total{topic=\"outbox.event.order\"}"), Some(20.0), "{text}");
    assert_eq!(
        sample(&text, "outbox_cdc_end_to_end_latency_seconds_count{aggregate_type=\"order\"}"),
        Some(20.0),
        "{text}"
    );
    assert_eq!(sample(&text, "outbox_cdc_records_in_flight"), Some(0.0), "{text}");
    assert_eq!(sample(&text, names::IN_FLIGHT_BYTES), Some(0.0), "{text}");
    assert_eq!(sample(&text, names::BYTES_IN_FLIGHT), Some(0.0), "the deprecated name, kept one release: {text}");
    let build = format!("{}{{version=\"{VERSION}\",commit=\"{COMMIT}\"}} 1", names::BUILD_INFO);
    assert!(text.lines().any(|l| l == build), "no {build:?} in:\n{text}");
    let partitions: f64 = text
        .lines()
        .filter(|l| l.starts_with("outbox_cdc_partition_events_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(partitions, 20.0, "{text}");
    // Caught up in the active binlog: nothing to read, no risk; the retention is the server's.
    assert!(
        wait_until(Duration::from_secs(30), || {
            let text = page();
            sample(&text, names::BINLOG_RETENTION_SECONDS) == Some(3600.0)
                && sample(&text, names::BINLOG_NEEDED_BYTES) == Some(0.0)
                && sample(&text, names::PURGE_RISK_RATIO) == Some(0.0)
        }),
        "{}",
        page()
    );

    broker.stop();
    assert!(
        wait_until(Duration::from_secs(90), || get(port, "/readyz").is_some_and(|r| r.0 == 503)),
        "/readyz stayed ready without a broker: {:?}",
        get(port, "/readyz")
    );
    assert_eq!(get(port, "/healthz").map(|r| r.0), Some(200));
    broker.start_again();
    assert!(
        wait_until(Duration::from_secs(90), || get(port, "/readyz").is_some_and(|r| r.0 == 200)),
        "/readyz did not recover: {:?}\n{}",
        get(port, "/readyz"),
        connector.logs()
    );
    connector.terminate();
}

/// Inserts a row with raw SQL values (to write what the normal helpers refuse to).
async fn insert_raw(
    conn: &mut mysql_async::Conn,
    id: &str,
    aggregate_type: &str,
    aggregate_id: &str,
    event_type: &[u8],
    payload: &str,
) {
    conn.exec_drop(
        "INSERT INTO shop.outbox_events (id, aggregate_type, aggregate_id, event_type, schema_version, payload, \
         occurred_at, next_attempt_at) VALUES (?, ?, ?, ?, 1, ?, NOW(6), NOW(6))",
        (id, aggregate_type, aggregate_id, event_type.to_vec(), payload),
    )
    .await
    .unwrap();
}

fn by_id<'a>(records: &'a [Received], id: &str) -> &'a Received {
    records.iter().find(|r| r.header_str("id") == Some(id)).unwrap_or_else(|| panic!("no record with id {id}"))
}

/// Poison rows of each kind go to the dead-letter topic with their coordinates and reason, their
/// aggregates are held (later events follow them there, also after a restart), other aggregates flow on,
/// and `quarantine release` republishes the held events in order once the poison is skipped.
#[tokio::test(flavor = "multi_thread")]
async fn poison_rows_are_dead_lettered_held_and_released() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let mut conn = db.conn().await;
    // Columns loose enough to hold what a buggy service might write.
    conn.query_drop(
        "ALTER TABLE shop.outbox_events MODIFY event_type VARBINARY(128) NOT NULL, MODIFY payload LONGTEXT NOT NULL",
    )
    .await
    .unwrap();

    let mut connector = Connector::new();
    let config = connector.write_config(&db, &broker, "");
    let text = std::fs::read_to_string(&config).unwrap().replace(
        "topic = \"outbox.event.${aggregate_type}\"",
        "topic = \"outbox.event.${aggregate_type}\"\nmax_record_bytes = 20000\ndead_letter_topic = \"dlq\"",
    );
    std::fs::write(&config, text).unwrap();

    let good = |agg: &str| OutboxRow::new(agg);
    let e1 = good("A-1");
    insert_event(&mut conn, &e1).await.unwrap();
    insert_raw(&mut conn, "undecodable-1", "order", "P-1", b"\xff\xfe", "{}").await;
    let e3 = good("P-1");
    insert_event(&mut conn, &e3).await.unwrap();
    insert_raw(&mut conn, "empty-agg-1", "order", "", b"Created", "{}").await;
    insert_raw(&mut conn, "illegal-topic-1", "bad type", "T-1", b"Created", "{}").await;
    insert_raw(&mut conn, "bad-json-1", "order", "P-2", b"Created", "{not json").await;
    let big = format!("{{\"blob\": \"{}\"}}", "x".repeat(30_000));
    insert_raw(&mut conn, "too-large-1", "order", "P-3", b"Created", &big).await;
    let e8 = good("A-1");
    insert_event(&mut conn, &e8).await.unwrap();
    let e9 = good("P-3");
    insert_event(&mut conn, &e9).await.unwrap();

    connector.run(&config);
    let dead = broker.read_all(DLQ, 7, READ_TIMEOUT);
    assert_eq!(dead.len(), 7, "{}", connector.logs());
    let normal = broker.read_all(TOPIC, 2, READ_TIMEOUT);
    assert_eq!(normal.len(), 2, "only healthy aggregates flow on");
    assert_eq!(ids_of_key(&normal, "A-1"), [e1.id.clone(), e8.id.clone()]);

    for (id, kind) in [
        ("undecodable-1", "undecodable"),
        (e3.id.as_str(), "quarantined"),
        ("empty-agg-1", "empty_aggregate_id"),
        ("illegal-topic-1", "illegal_topic"),
        ("bad-json-1", "invalid_payload"),
        ("too-large-1", "too_large"),
        (e9.id.as_str(), "quarantined"),
    ] {
        let r = by_id(&dead, id);
        assert_eq!(r.header_str("dead_letter_kind"), Some(kind), "{id}");
        let v = r.value_json();
        assert_eq!(v["kind"], kind, "{v}");
        assert!(v["origin"]["file"].as_str().is_some_and(|f| !f.is_empty()), "{v}");
        assert!(v["origin"]["gtid"].as_str().is_some_and(|g| g.starts_with("0-")), "{v}");
        assert_eq!(v["row"]["columns"]["id"], id, "{v}");
    }
    let undecodable = by_id(&dead, "undecodable-1").value_json();
    assert_eq!(undecodable["row"]["columns"]["event_type"], json!({"hex": "fffe"}), "{undecodable}");
    assert!(undecodable["reason"].as_str().unwrap().contains("event_type"), "{undecodable}");
    let too_large = by_id(&dead, "too-large-1").value_json();
    assert!(too_large["row"]["columns"]["payload"].as_str().unwrap().contains("bytes omitted"), "{too_large}");
    // Held events keep their aggregate's key, hence its partition and order.
    let p1: Vec<&Received> = dead.iter().filter(|r| r.key_str() == Some("P-1")).collect();
    assert_eq!(p1.len(), 2);
    assert!(p1[0].offset < p1[1].offset && p1[0].header_str("id") == Some("undecodable-1"));

    let (status, out, err) = connector.command(&["quarantine", "list", "--json"], Duration::from_secs(30)).unwrap();
    assert!(status.success(), "{out}{err}");
    let holds: serde_json::Value = serde_json::from_str(&out).unwrap();
    let mut held: Vec<String> = holds
        .as_array()
        .unwrap()
        .iter()
        .map(|h| format!("{}/{}", h["aggregate_type"].as_str().unwrap(), h["aggregate_id"].as_str().unwrap()))
        .collect();
    held.sort();
    assert_eq!(held, ["bad type/T-1", "order/", "order/P-1", "order/P-2", "order/P-3"]);

    // Holds survive a restart.
    connector.terminate();
    connector.restart();
    let e10 = good("P-1");
    insert_event(&mut conn, &e10).await.unwrap();
    let dead = broker.read_all(DLQ, 8, READ_TIMEOUT);
    assert_eq!(by_id(&dead, &e10.id).header_str("dead_letter_kind"), Some("quarantined"), "{}", connector.logs());
    assert!(connector.terminate().success());

    // The poison row itself cannot be republished: release refuses unless told to skip it.
    let (status, out, err) =
        connector.command(&["quarantine", "release", "order", "P-1"], Duration::from_secs(120)).unwrap();
    assert_eq!(status.code(), Some(2), "{out}{err}");
    assert!(err.contains("still poison"), "{err}");
    let (status, out, err) = connector
        .command(&["quarantine", "release", "order", "P-1", "--skip-poison"], Duration::from_secs(120))
        .unwrap();
    assert!(status.success(), "{out}{err}");
    assert!(out.contains("2 event(s) republished"), "{out}");
    let normal = broker.read_all(TOPIC, 4, READ_TIMEOUT);
    assert_eq!(normal.len(), 4);
    assert_eq!(ids_of_key(&normal, "P-1"), [e3.id.clone(), e10.id.clone()]);
    assert!(by_id(&normal, &e3.id).header_str("released_from_hold").is_some_and(|h| h.starts_with("undecodable-1@")));

    // Released: new events of P-1 flow normally again, after the released ones.
    connector.restart();
    let e11 = good("P-1");
    insert_event(&mut conn, &e11).await.unwrap();
    let normal = broker.read_all(TOPIC, 5, READ_TIMEOUT);
    assert_eq!(ids_of_key(&normal, "P-1"), [e3.id.clone(), e10.id.clone(), e11.id.clone()], "{}", connector.logs());
    assert!(connector.terminate().success());
    let (_, out, _) = connector.command(&["quarantine", "list", "--json"], Duration::from_secs(30)).unwrap();
    assert_eq!(serde_json::from_str::<serde_json::Value>(&out).unwrap().as_array().unwrap().len(), 4, "{out}");
}

/// `on_poison = "fail"` stops with a definite error naming the row instead of dead-lettering it.
#[tokio::test(flavor = "multi_thread")]
async fn on_poison_fail_stops_with_a_definite_error() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let mut conn = db.conn().await;
    let mut bad = OutboxRow::new("");
    bad.id = "empty-aggregate".into();
    insert_event(&mut conn, &bad).await.unwrap();
    let mut connector = Connector::new();
    let config = connector.write_config(&db, &broker, "");
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("table = \"shop.outbox_events\"", "table = \"shop.outbox_events\"\non_poison = \"fail\"");
    std::fs::write(&config, text).unwrap();
    connector.run(&config);
    let status = connector.wait_exit(Duration::from_secs(60)).expect("connector exits");
    assert_eq!(status.code(), Some(2), "{}", connector.logs());
    let logs = connector.logs();
    assert!(logs.contains("empty-aggregate") && logs.contains("on_poison"), "{logs}");
}

/// The purge-risk warning fires while the binlog the checkpoint needs still exists: the checkpoint sits
/// in a rotated binlog, the server keeps binlogs for 20 s, and the broker is down so the connector cannot
/// move on. `status` shows the same risk.
#[tokio::test(flavor = "multi_thread")]
async fn purge_risk_is_reported_before_the_binlog_is_gone() {
    let db = MariaDb::start();
    let mut broker = Broker::start(Engine::Memory);
    let mut conn = db.conn().await;
    insert_event(&mut conn, &OutboxRow::new("A-1")).await.unwrap();
    let extra = "[metrics]\nlisten = \"127.0.0.1:0\"\npurge_check_interval_ms = 1000\npurge_warn_ratio = 0.5\n";
    let mut connector = Connector::start(&db, &broker, extra);
    assert_eq!(broker.read_all(TOPIC, 1, READ_TIMEOUT).len(), 1);
    assert!(connector.terminate().success());

    conn.query_drop("FLUSH BINARY LOGS").await.unwrap();
    conn.query_drop("SET GLOBAL binlog_expire_logs_seconds = 20").await.unwrap();
    insert_event(&mut conn, &OutboxRow::new("A-1")).await.unwrap();
    broker.stop();
    std::thread::sleep(Duration::from_secs(11));

    let (status, out, err) = connector.command(&["status"], Duration::from_secs(60)).unwrap();
    assert!(status.success(), "{out}{err}");
    let line = out.lines().find(|l| l.starts_with("purge risk:")).unwrap_or_else(|| panic!("{out}"));
    let percent: f64 = line.split_whitespace().nth(2).and_then(|p| p.trim_end_matches('%').parse().ok()).unwrap();
    assert!(percent >= 50.0, "{line}");
    assert!(line.contains("retention 20 s"), "{line}");
    assert!(out.lines().any(|l| l.starts_with("end event:") && l.contains(" B at mysql-bin.")), "{out}");

    connector.restart();
    assert!(wait_until(Duration::from_secs(30), || connector.logs().contains("purge risk")), "{}", connector.logs());
    connector.kill();
}
