//! Snapshots on demand (README "Snapshots on demand") against a real MariaDB and broker: asked through the
//! control API under a steady write load and killed (-9) in the middle, every row of the slice published
//! again with the snapshot headers, each aggregate's snapshot rows in order on every record, the stream
//! complete and in order beside it; through the CLI on a stopped connector: a slice, a pause and a cancel
//! kept across the restart, the refusals; and asked from SQL through a signal table in Debezium's layout.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::reliability::{self, Duplicates};
use common::{free_port, insert_event, wait_until, Broker, Connector, Engine, MariaDb, OutboxRow, Received};
use common::{Writer, WriterConfig};

const TOPIC: &str = "outbox.event.order";
const READ_TIMEOUT: Duration = Duration::from_secs(180);
const TOKEN: &str = "snapshot-test-token";
const CHUNK_ROWS: usize = 200;
const FAILPOINT: &str = "OUTBOX_CDC_FAILPOINT";

/// `method path` with the token and a JSON `body`, HTTP/1.1 over a plain socket: the status code and the
/// body as JSON. `None` when nothing listens.
fn call(port: u16, method: &str, path: &str, body: Option<&serde_json::Value>) -> Option<(u16, serde_json::Value)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(120))).ok()?;
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nAuthorization: Bearer {TOKEN}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let code = head.lines().next()?.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, serde_json::from_str(body).unwrap_or(serde_json::Value::Null)))
}

/// A connector (not started) with its control API on a port of its own and the token in a file.
fn connector(db: &MariaDb, broker: &Broker) -> (Connector, u16) {
    let control = free_port();
    let c = Connector::new();
    let path = c.dir().join("control-token");
    std::fs::write(&path, TOKEN).unwrap();
    let token = common::connector::toml_str(&path.to_string_lossy());
    c.write_config(
        db,
        broker,
        &format!(
            "[control]\nlisten = \"127.0.0.1:{control}\"\ntoken_file = {token}\n[snapshot]\nchunk_rows = {CHUNK_ROWS}\n\
             [state]\ncheckpoint_interval_ms = 20\n"
        ),
    );
    (c, control)
}

/// The records of snapshot `id` (header `snapshot_id`), and the others (the stream's and the initial
/// snapshot's), in each partition's order.
fn split<'a>(records: &'a [Received], id: &str) -> (Vec<&'a Received>, Vec<&'a Received>) {
    records.iter().partition(|r| r.header_str("snapshot_id") == Some(id))
}

/// Waits until snapshot `id` is in `state` (through the API), and returns it.
fn wait_state(port: u16, id: &str, state: &str, connector: &Connector) -> serde_json::Value {
    let mut last = serde_json::Value::Null;
    let reached = wait_until(READ_TIMEOUT, || {
        last = call(port, "GET", &format!("/v1/snapshots/{id}"), None).map(|(_, v)| v).unwrap_or_default();
        last["state"] == state
    });
    assert!(reached, "snapshot {id} never {state}: {last}\n{}", connector.logs());
    last
}

/// Under 4 writers, a snapshot of every `order` row (12,000 and what the writers add) asked through the API,
/// the connector crashed (a failpoint's abort, as a kill -9) at the snapshot's 10,000th row, restarted: the snapshot resumes from its
/// last checkpointed chunk (fewer rows again than Kafka had of it: a start over republishes them all) and
/// ends.
/// Judged on every record: each row that was in the table when it was asked comes with `source: snapshot`
/// and its `snapshot_id`, its `id` unchanged; each aggregate's snapshot records go forward one event at a
/// time, going back only where the killed run's unacknowledged chunks are read again (at most once per
/// aggregate); the stream's records, beside it, miss nothing and keep each aggregate's commit order, and
/// some land among the snapshot's (the stream is not held back for the snapshot).
///
/// Its first version killed the connector once 600 snapshot records were read, and passed with the resume
/// broken (progress ignored): the 4,000 rows took 0.3 s, so the kill came after the snapshot was done.
/// With four chunks in flight, 3,500 rows took less than the 100 ms between checkpoints, and it failed for
/// want of a checkpoint before the crash: hence 10,000 rows and 20 ms.
#[tokio::test(flavor = "multi_thread")]
async fn a_snapshot_on_demand_under_load_resumes_after_a_kill_and_keeps_each_order() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let before =
        Writer::start(db.opts_root(), WriterConfig { tasks: 4, max_events: 12_000, ..WriterConfig::default() });
    let before = before.join().await;
    assert!(before.errors.is_empty() && before.len() >= 12_000, "{} written, {:?}", before.len(), before.errors);
    let (mut connector, port) = connector(&db, &broker);
    connector.env(FAILPOINT, "on_demand_row:10000");
    connector.run(&connector.config_path());
    assert!(broker.read_all(TOPIC, before.len(), READ_TIMEOUT).len() >= before.len(), "{}", connector.logs());

    let during = Writer::start(
        db.opts_root(),
        WriterConfig { tasks: 4, max_events: 1_000_000, pause: Duration::from_millis(5), ..WriterConfig::default() },
    );
    during.wait_committed(200, Duration::from_secs(60)).await;
    let (code, asked) = call(port, "POST", "/v1/snapshots", Some(&serde_json::json!({ "aggregate_type": "order" })))
        .expect("the API answers");
    assert_eq!(code, 202, "{asked}");
    let id = asked["id"].as_str().expect("an id").to_string();
    assert_eq!(asked["state"], "queued", "{asked}");

    // Killed (aborted, as by kill -9: nothing flushed, nothing checkpointed on the way out) at its 10,000th
    // row, armed before the start: the snapshot is under way, with checkpoints (every 20 ms) behind it.
    assert!(connector.wait_exit(READ_TIMEOUT).is_some_and(|s| !s.success()), "no crash:\n{}", connector.logs());
    let delivered_before = split(&broker.read_all(TOPIC, 0, Duration::from_secs(2)), &id).0.len();
    assert!(delivered_before > 0, "nothing of the snapshot before the crash:\n{}", connector.logs());
    connector.remove_env(FAILPOINT);
    connector.restart();
    let done = wait_state(port, &id, "done", &connector);
    during.stop();
    let during = during.finish().await;
    assert!(during.errors.is_empty(), "{:?}", during.errors);

    let expected = before.expected.merged(&during.expected);
    let records = broker.read_all(TOPIC, expected.len() + before.len(), READ_TIMEOUT);
    let (snapshot, stream) = split(&records, &id);

    // The stream beside it: nothing missing, each aggregate in commit order.
    let stream: Vec<Received> = stream.into_iter().cloned().collect();
    let report = common::audit::audit(&expected, &stream);
    assert!(report.is_clean(), "the stream: {}\n{}", report.summary(), connector.logs());

    // Every row of the table when it was asked, with the snapshot's headers and its own id.
    let in_snapshot: HashSet<&str> = snapshot.iter().filter_map(|r| r.header_str("id")).collect();
    let missing: Vec<String> = before.ids().into_iter().filter(|id| !in_snapshot.contains(id.as_str())).collect();
    assert!(
        missing.is_empty(),
        "{} rows not in the snapshot, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
    assert!(snapshot.iter().all(|r| r.header_str("source") == Some("snapshot")), "a snapshot record without source");
    assert!(done["rows"].as_u64().unwrap() >= before.len() as u64, "{done}");
    // Resumed from its last checkpointed chunk, not from the start: fewer rows again than Kafka had of it
    // when it crashed (a start over would publish every one of those again).
    let again = snapshot.len() - in_snapshot.len();
    assert!(again < delivered_before, "{again} rows published twice, {delivered_before} before the crash");

    // Each aggregate's snapshot records, on every record: one event forward at a time, or back once to
    // where the resumed scan started.
    let place: HashMap<&str, (&str, usize)> = expected
        .per_aggregate
        .iter()
        .flat_map(|(aggregate, ids)| ids.iter().enumerate().map(move |(i, id)| (id.as_str(), (aggregate.as_str(), i))))
        .collect();
    let mut last: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for r in &snapshot {
        let id = r.header_str("id").unwrap();
        let (aggregate, at) = place[id];
        match last.get_mut(aggregate) {
            None => drop(last.insert(aggregate, (at, 0))),
            Some((previous, backs)) => {
                assert!(at == *previous + 1 || at <= *previous, "{aggregate}: snapshot record #{at} after #{previous}");
                if at <= *previous {
                    *backs += 1;
                    assert!(*backs <= 1, "{aggregate}: the snapshot went back twice (one kill)");
                }
                *previous = at;
            }
        }
    }

    // The stream ran beside it: stream records between the snapshot's first and last record, in a
    // partition's order (the longest run of snapshot records is printed; it depends on how many stream
    // events were ready while each chunk's acknowledgement was awaited, so it is not judged).
    let mut sorted: Vec<&Received> = records.iter().collect();
    sorted.sort_by_key(|r| (r.partition, r.offset));
    let (mut run, mut longest, mut beside) = (0, 0, 0);
    let mut seen: HashSet<i32> = HashSet::new();
    let last_of: HashMap<i32, i64> =
        snapshot.iter().map(|r| (r.partition, r.offset)).fold(HashMap::new(), |mut m, (p, o)| {
            let e = m.entry(p).or_insert(o);
            *e = (*e).max(o);
            m
        });
    for r in sorted {
        match r.header_str("snapshot_id") == Some(id.as_str()) {
            true => {
                run += 1;
                longest = longest.max(run);
                seen.insert(r.partition);
            }
            false => {
                run = 0;
                if seen.contains(&r.partition) && last_of.get(&r.partition).is_some_and(|last| r.offset < *last) {
                    beside += 1;
                }
            }
        }
    }
    assert!(beside > 0, "no stream record between the snapshot's records: the stream waited for it");
    eprintln!(
        "snapshot {id}: {} records for {} rows, {again} again after the crash ({delivered_before} before it), longest \
         run {longest}, {beside} stream records among them; stream {} records for {} events",
        snapshot.len(),
        before.len(),
        stream.len(),
        expected.len()
    );
    let written = common::Written { expected, ..common::Written::default() };
    let name = "snapshot on demand under load, crashed in the middle";
    let audit = reliability::closing_audit(name, &connector, &written, Duplicates::Reported);
    reliability::record(
        name,
        &written,
        &audit,
        None,
        &format!(
            "4 writers; a snapshot on demand of the {} rows in the table through the control API, aborted at its \
             10,000th row and resumed: {again} rows again of {delivered_before} delivered before the crash, every \
             row of the table in the snapshot, each aggregate's snapshot rows in order on every record; the \
             duplicates are the snapshot's, on purpose",
            before.len()
        ),
    );
    assert!(connector.terminate().success(), "{}", connector.logs());
}

/// Through the CLI on a stopped connector: a snapshot whose condition names a column dropped after it was
/// asked (it fails, saying why, and the next is read), a slice (one aggregate) asked, another asked and
/// paused, a third asked and cancelled; started, the connector publishes the slice again and only it,
/// leaves the paused one until `snapshot resume` (through the API then), and never reads the cancelled
/// one. The refusals: a table not configured, a condition the server does not take, an unknown id, a change to an
/// ended snapshot.
#[tokio::test(flavor = "multi_thread")]
async fn snapshots_asked_paused_and_cancelled_through_the_cli_and_the_api() {
    use mysql_async::prelude::Queryable;
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let mut conn = db.conn().await;
    for i in 0..300 {
        insert_event(&mut conn, &OutboxRow::new(format!("A-{}", i % 3))).await.unwrap();
    }
    let (mut connector, port) = connector(&db, &broker);
    connector.run(&connector.config_path());
    assert_eq!(broker.read_all(TOPIC, 300, READ_TIMEOUT).len(), 300, "{}", connector.logs());

    // The refusals, through the API of the running connector.
    for (body, says) in [
        (serde_json::json!({ "table": "nope.outbox_events" }), "not one of the outbox tables"),
        (serde_json::json!({ "where": "no_such_column = 1" }), "refuses the slice"),
        (serde_json::json!({ "aggregate_typ": "order" }), "unknown field"),
    ] {
        let (code, answer) = call(port, "POST", "/v1/snapshots", Some(&body)).unwrap();
        assert_eq!(code, 400, "{body}: {answer}");
        assert!(answer["error"].as_str().unwrap().contains(says), "{body}: {answer}");
    }
    let (code, _) = call(port, "GET", "/v1/snapshots/snap-0000000000000-0000", None).unwrap();
    assert_eq!(code, 404);
    assert!(connector.terminate().success(), "{}", connector.logs());

    let cli = |args: &[&str]| {
        let (status, out, err) = connector.command(args, Duration::from_secs(60)).unwrap();
        assert!(status.success(), "{args:?}: {out}{err}");
        out
    };
    let id_of = |out: &str| out.split_whitespace().find(|w| w.starts_with("snap-")).unwrap().to_string();
    // First in line, a snapshot whose condition breaks after it was asked: it fails, saying why, and the
    // next one is read.
    conn.query_drop("ALTER TABLE shop.outbox_events ADD COLUMN doomed INT NULL").await.unwrap();
    let doomed = id_of(&cli(&["snapshot", "start", "--where", "doomed IS NULL"]));
    conn.query_drop("ALTER TABLE shop.outbox_events DROP COLUMN doomed").await.unwrap();
    let slice = cli(&["snapshot", "start", "--aggregate-id", "A-1"]);
    assert!(slice.contains("in its state store: it is not running"), "{slice}");
    let slice = id_of(&slice);
    let paused = id_of(&cli(&["snapshot", "start", "--where", "aggregate_id = 'A-2'"]));
    cli(&["snapshot", "pause", &paused]);
    let cancelled = id_of(&cli(&["snapshot", "start"]));
    cli(&["snapshot", "cancel", &cancelled]);
    let list = cli(&["snapshot", "list"]);
    assert!(list.contains(&format!("{paused}  shop.outbox_events")) && list.contains("paused"), "{list}");
    assert!(list.contains("cancelled"), "{list}");

    connector.restart();
    let failed = wait_state(port, &doomed, "failed", &connector);
    assert!(failed["error"].as_str().unwrap().contains("refuses the snapshot's read"), "{failed}");
    let done = wait_state(port, &slice, "done", &connector);
    assert_eq!(done["rows"], 100, "{done}");
    let shown = wait_state(port, &paused, "paused", &connector);
    assert_eq!(shown["rows_done"], serde_json::Value::Null, "a paused snapshot that never started: {shown}");
    let records = broker.read_all_quiet(TOPIC, 400, Duration::from_secs(3), READ_TIMEOUT);
    let of = |id: &str| split(&records, id).0;
    assert_eq!(of(&slice).len(), 100, "the slice, once");
    assert!(of(&slice).iter().all(|r| r.key_str() == Some("A-1")));
    assert!(of(&paused).is_empty() && of(&cancelled).is_empty(), "a paused or cancelled snapshot published");

    // Resumed through the API, the paused one is read; a change to an ended one is refused.
    let (code, answer) = call(port, "POST", &format!("/v1/snapshots/{paused}/resume"), None).unwrap();
    assert_eq!(code, 200, "{answer}");
    wait_state(port, &paused, "done", &connector);
    let records = broker.read_all(TOPIC, 500, READ_TIMEOUT);
    assert_eq!(split(&records, &paused).0.len(), 100);
    assert!(split(&records, &paused).0.iter().all(|r| r.key_str() == Some("A-2")));
    let (code, answer) = call(port, "DELETE", &format!("/v1/snapshots/{slice}"), None).unwrap();
    assert_eq!(code, 409, "{answer}");
    let status = connector.status_json().unwrap();
    assert_eq!(status["snapshots"].as_array().map(Vec::len), Some(4), "{status}");
    assert!(connector.terminate().success(), "{}", connector.logs());
}

/// Signals from SQL, in Debezium's layout: the README's example (the table, an `execute-snapshot` of every
/// `order` row) run as written, and an `execute-snapshot` with `additional-conditions` for one aggregate,
/// read from the binlog, each ask for a snapshot of their slice; one in a
/// rolled-back transaction asks nothing; one naming a table that is not an outbox table is stored as failed,
/// saying why; a type outbox-cdc does not take is recorded and ignored. With the checkpoint put back before
/// them (as after a crash), the signals are read again and nothing is asked twice.
#[tokio::test(flavor = "multi_thread")]
async fn signals_in_debeziums_layout_ask_for_snapshots_once() {
    use mysql_async::prelude::Queryable;
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let mut conn = db.conn().await;
    // The README's example, as written: the table, and an execute-snapshot of every `order` row.
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let section = &readme[readme.find("### Signals").expect("README has ### Signals")..];
    let block = &section[section.find("```sql\n").expect("a sql block") + 7..];
    let statements: Vec<&str> =
        block[..block.find("```").unwrap()].split(";\n").map(str::trim).filter(|s| !s.is_empty()).collect();
    assert_eq!(statements.len(), 2, "{statements:?}");
    conn.query_drop(statements[0].trim_end_matches(';')).await.unwrap();
    for i in 0..300 {
        insert_event(&mut conn, &OutboxRow::new(format!("A-{}", i % 3))).await.unwrap();
    }
    let (mut connector, port) = connector(&db, &broker);
    connector.outbox_setting("signal_table = \"shop.debezium_signal\"");
    connector.run(&connector.config_path());
    assert_eq!(broker.read_all(TOPIC, 300, READ_TIMEOUT).len(), 300, "{}", connector.logs());
    let first_checkpoint = connector.status_json().unwrap();

    let signal = |id: &str, kind: &str, data: &str| {
        format!("INSERT INTO shop.debezium_signal (id, type, data) VALUES ('{id}', '{kind}', '{data}')")
    };
    conn.query_drop(statements[1].trim_end_matches(';')).await.unwrap();
    conn.query_drop("BEGIN").await.unwrap();
    conn.query_drop(signal("s-rolled-back", "execute-snapshot", r#"{"data-collections": ["shop.outbox_events"]}"#))
        .await
        .unwrap();
    conn.query_drop("ROLLBACK").await.unwrap();
    conn.query_drop(signal(
        "s-1",
        "execute-snapshot",
        concat!(
            r#"{"data-collections": ["shop.outbox_events"], "type": "incremental", "additional-conditions": "#,
            r#"[{"data-collection": "shop.outbox_events", "filter": "aggregate_id = ''A-1''"}]}"#
        ),
    ))
    .await
    .unwrap();
    conn.query_drop(signal("s-2", "execute-snapshot", r#"{"data-collections": ["shop.not_an_outbox"]}"#))
        .await
        .unwrap();
    conn.query_drop(signal("s-3", "log", r#"{"message": "hello"}"#)).await.unwrap();

    let listed = || call(port, "GET", "/v1/snapshots", None).map(|(_, v)| v["snapshots"].clone()).unwrap_or_default();
    assert!(
        wait_until(READ_TIMEOUT, || listed()
            .as_array()
            .is_some_and(|l| l.len() == 3 && l.iter().filter(|r| r["state"] == "done").count() == 2)),
        "{}\n{}",
        listed(),
        connector.logs()
    );
    let list = listed();
    let list = list.as_array().unwrap();
    let readmes = list.iter().find(|r| r["by"] == "signal ad-hoc-1").expect("the README's signal");
    assert_eq!((readmes["state"].as_str(), readmes["rows"].as_u64()), (Some("done"), Some(300)), "{readmes}");
    assert_eq!(readmes["slice"]["where"], "aggregate_type = 'order'", "{readmes}");
    let done = list.iter().find(|r| r["by"] == "signal s-1").unwrap();
    assert_eq!((done["state"].as_str(), done["rows"].as_u64()), (Some("done"), Some(100)), "{done}");
    assert_eq!(done["slice"]["where"], "aggregate_id = 'A-1'", "{done}");
    let failed = list.iter().find(|r| r["state"] == "failed").expect("the signal naming another table failed");
    assert!(failed["error"].as_str().unwrap().contains("not one of the outbox tables"), "{failed}");
    let records = broker.read_all_quiet(TOPIC, 700, Duration::from_secs(3), READ_TIMEOUT);
    let id = done["id"].as_str().unwrap();
    assert_eq!(split(&records, id).0.len(), 100);
    assert!(split(&records, id).0.iter().all(|r| r.key_str() == Some("A-1")));
    assert!(connector.logs().contains("signal of a type outbox-cdc does not take"), "{}", connector.logs());

    // The checkpoint put back before the signals: read again, nothing is asked twice.
    assert!(connector.terminate().success(), "{}", connector.logs());
    let before = first_checkpoint.clone();
    common::connector::rewrite_checkpoint(&connector.state_dir(), |record| {
        record["position"] = before["position"].clone();
        record["end_event"] = before["end_event"].clone();
        record["source_timestamp"] = before["source_timestamp"].clone();
    });
    connector.restart();
    // Read again (the log says so, at debug level, for each of the three signals it carried out).
    assert!(
        wait_until(READ_TIMEOUT, || connector.logs().matches("signal carried out before: skipped").count() == 4),
        "the signals were not read again:\n{}",
        connector.logs()
    );
    assert_eq!(listed().as_array().map(Vec::len), Some(3), "a signal carried out twice: {}", listed());
    assert!(connector.terminate().success(), "{}", connector.logs());
}
