//! The control API of a running connector (`[control]`, README "The control API") against a real MariaDB
//! and broker, and the commands that use it: every endpoint refused without the token, a pause under load
//! (nothing published while paused, across a restart, then everything once each after the resume), a
//! stopped connector paused and resumed through its store, and a hold released by the running connector.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::reliability::{self, Duplicates};
use common::{free_port, ids_of_key, insert_event, wait_until, Broker, Connector, Engine, MariaDb, OutboxRow};
use common::{Writer, WriterConfig};
use mysql_async::prelude::Queryable;

const TOPIC: &str = "outbox.event.order";
const DLQ: &str = "dlq";
const READ_TIMEOUT: Duration = Duration::from_secs(120);
const TOKEN: &str = "s3cret-control-token";

/// An answer of the API: status code, headers (lower-case names) and the body.
#[derive(Debug)]
struct Answer {
    code: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {self:?}"))
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// `method path` on `port` with `headers`, HTTP/1.1 over a plain socket: nothing of ours between the test and
/// the bytes the server sends. `None` when nothing listens.
fn call(port: u16, method: &str, path: &str, headers: &[(&str, &str)]) -> Option<Answer> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(120))).ok()?;
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    if method == "POST" {
        request.push_str("Content-Length: 0\r\n");
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let mut lines = head.lines();
    let code = lines.next()?.split_whitespace().nth(1)?.parse().ok()?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Some(Answer { code, headers, body: body.to_string() })
}

/// [`call`] with the bearer token `token`.
fn with_token(port: u16, method: &str, path: &str, token: &str) -> Answer {
    let auth = format!("Bearer {token}");
    call(port, method, path, &[("Authorization", &auth)]).unwrap_or_else(|| panic!("nothing listens on {port}"))
}

/// A connector (not started) whose control API listens on a port of its own, with the token in a file of
/// its work dir when `token_file`, else one it makes itself; `extra` appended.
fn connector(db: &MariaDb, broker: &Broker, token_file: bool, extra: &str) -> (Connector, u16) {
    let control = free_port();
    let c = Connector::new();
    let token = match token_file {
        true => {
            let path = c.dir().join("control-token");
            std::fs::write(&path, TOKEN).unwrap();
            format!("token_file = {}\n", common::connector::toml_str(&path.to_string_lossy()))
        }
        false => String::new(),
    };
    c.write_config(db, broker, &format!("[control]\nlisten = \"127.0.0.1:{control}\"\n{token}{extra}"));
    (c, control)
}

/// Every endpoint refuses a request without the token, or with another, with `401` and
/// `WWW-Authenticate: Bearer`; with it: the status from memory, a pause and a resume, a release of an
/// aggregate that has no hold refused (`409`), a request meant for another connector refused (`421`), an
/// unknown path `404`, all JSON.
#[tokio::test(flavor = "multi_thread")]
async fn every_endpoint_needs_the_token() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let mut conn = db.conn().await;
    for _ in 0..5 {
        insert_event(&mut conn, &OutboxRow::new("A-1")).await.unwrap();
    }
    let (mut connector, port) = connector(&db, &broker, true, "");
    connector.run(&connector.config_path());
    assert_eq!(broker.read_all(TOPIC, 5, READ_TIMEOUT).len(), 5, "{}", connector.logs());
    assert!(
        wait_until(Duration::from_secs(30), || call(port, "GET", "/v1/status", &[]).is_some()),
        "{}",
        connector.logs()
    );

    let endpoints = [
        ("GET", "/v1/status"),
        ("POST", "/v1/pause"),
        ("POST", "/v1/resume"),
        ("POST", "/v1/holds/order/A-1/release"),
        ("GET", "/v1/no-such-thing"),
    ];
    for (method, path) in endpoints {
        for auth in [None, Some("Bearer wrong-token"), Some("Basic czNjcmV0"), Some(TOKEN)] {
            let headers: Vec<(&str, &str)> = auth.map(|a| ("Authorization", a)).into_iter().collect();
            let answer = call(port, method, path, &headers).expect("the API answers");
            assert_eq!(answer.code, 401, "{method} {path} with {auth:?}: {answer:?}");
            assert_eq!(answer.header("www-authenticate"), Some("Bearer"), "{answer:?}");
            assert!(!answer.body.contains(TOKEN), "{answer:?}");
        }
    }

    // The status, from the running process: where it is, the checkpoint's fields as `status --json`, lag.
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        let status = with_token(port, "GET", "/v1/status", TOKEN);
        assert_eq!(status.code, 200, "{status:?}");
        let json = status.json();
        if json.get("position").is_some() || Instant::now() > deadline {
            break json;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(status["role"], "running", "{status}");
    assert_eq!(status["live"], true, "{status}");
    assert_eq!(status["paused"], serde_json::Value::Null, "{status}");
    assert!(status["position"].is_object(), "{status}");
    assert!(status["lag"]["source_seconds_behind"].is_number(), "{status}");
    assert_eq!(status["holds"], serde_json::json!([]), "{status}");

    let pause = with_token(port, "POST", "/v1/pause", TOKEN);
    assert_eq!((pause.code, pause.json()["paused"].clone()), (200, serde_json::json!(true)), "{pause:?}");
    assert_eq!(with_token(port, "GET", "/v1/status", TOKEN).json()["role"], "paused");
    let again = with_token(port, "POST", "/v1/pause", TOKEN).json();
    assert_eq!(again["was_paused"], true, "{again}");
    let resume = with_token(port, "POST", "/v1/resume", TOKEN);
    assert_eq!((resume.code, resume.json()["was_paused"].clone()), (200, serde_json::json!(true)), "{resume:?}");
    assert_eq!(with_token(port, "GET", "/v1/status", TOKEN).json()["role"], "running");

    let release = with_token(port, "POST", "/v1/holds/order/A-1/release", TOKEN);
    assert_eq!(release.code, 409, "{release:?}");
    assert!(release.json()["error"].as_str().unwrap().contains("no hold on aggregate order/A-1"), "{release:?}");

    let auth = format!("Bearer {TOKEN}");
    let other = call(port, "POST", "/v1/pause", &[("Authorization", &auth), ("Outbox-Cdc-Connector", "another")]);
    let other = other.expect("the API answers");
    assert_eq!(other.code, 421, "{other:?}");
    assert_eq!(with_token(port, "GET", "/v1/status", TOKEN).json()["role"], "running", "not paused by it");
    let unknown = with_token(port, "GET", "/v1/no-such-thing", TOKEN);
    assert_eq!(unknown.code, 404, "{unknown:?}");
    assert!(unknown.json()["error"].is_string());

    // Still publishing after all that, and stopping as before.
    insert_event(&mut conn, &OutboxRow::new("A-1")).await.unwrap();
    assert_eq!(broker.read_all(TOPIC, 6, READ_TIMEOUT).len(), 6, "{}", connector.logs());
    assert!(connector.terminate().success(), "{}", connector.logs());
}

/// The number of records on [`TOPIC`] once it has been quiet for a while.
fn settled(broker: &Broker) -> usize {
    broker.read_all_quiet(TOPIC, usize::MAX, Duration::from_secs(2), Duration::from_secs(20)).len()
}

/// `outbox-cdc pause` under a steady load of 4 writers (until the end of the test): the connector publishes nothing from the answer on
/// (its lag grows, it is ready and says paused, `outbox_cdc_paused` is 1), stays paused across a restart,
/// and once stopped `outbox-cdc resume` writes its store: started again it publishes every event written
/// meanwhile, once each and in order (a pause stops the run as a graceful stop does: nothing repeated).
#[tokio::test(flavor = "multi_thread")]
async fn a_pause_under_load_holds_every_event_until_resumed_across_a_restart() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let metrics = free_port();
    let (mut connector, port) =
        connector(&db, &broker, false, &format!("[metrics]\nlisten = \"127.0.0.1:{metrics}\"\n"));
    connector.run(&connector.config_path());
    let writer = Writer::start(
        db.opts_root(),
        WriterConfig { tasks: 4, max_events: 1_000_000, pause: Duration::from_millis(5), ..WriterConfig::default() },
    );
    writer.wait_committed(500, Duration::from_secs(120)).await;
    assert!(
        wait_until(Duration::from_secs(60), || broker.read_all(TOPIC, 100, Duration::from_secs(1)).len() >= 100),
        "{}",
        connector.logs()
    );

    // The CLI finds the running connector through its API, with the token the connector made.
    assert!(connector.state_dir().join("control.token").exists(), "the connector made its token");
    let (status, out, err) = connector.command(&["pause"], Duration::from_secs(60)).unwrap();
    assert!(status.success(), "{out}{err}\n{}", connector.logs());
    assert!(out.contains("paused (through its control API)"), "{out}{err}");
    let at_pause = settled(&broker);
    let committed_at_pause = writer.committed();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(writer.committed() > committed_at_pause + 100, "the writers went on");
    assert_eq!(settled(&broker), at_pause, "published while paused:\n{}", connector.logs());

    let token = std::fs::read_to_string(connector.state_dir().join("control.token")).unwrap();
    let live = with_token(port, "GET", "/v1/status", &token).json();
    assert_eq!(live["role"], "paused", "{live}");
    assert_eq!(live["paused"]["by"], "cli", "{live}");
    assert_eq!(live["ready"], true, "{live}");
    let ready = call(metrics, "GET", "/readyz", &[]).unwrap();
    assert_eq!(ready.code, 200, "{ready:?}");
    assert!(ready.body.contains("paused"), "{ready:?}");
    let page = call(metrics, "GET", "/metrics", &[]).unwrap().body;
    assert!(page.lines().any(|l| l == "outbox_cdc_paused 1"), "{page}");
    let (_, text, _) = connector.command(&["status"], Duration::from_secs(60)).unwrap();
    assert!(text.contains("paused:          since"), "{text}");

    // Paused across a restart: the pause is in the store.
    assert!(connector.terminate().success(), "{}", connector.logs());
    connector.restart();
    assert!(wait_until(Duration::from_secs(60), || {
        call(port, "GET", "/v1/status", &[("Authorization", &format!("Bearer {token}"))])
            .is_some_and(|a| a.code == 200 && a.json()["role"] == "paused")
    }));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(settled(&broker), at_pause, "published after a restart while paused:\n{}", connector.logs());

    // Stopped, it is resumed in its store, and starts publishing.
    assert!(connector.terminate().success(), "{}", connector.logs());
    let (status, out, err) = connector.command(&["resume"], Duration::from_secs(60)).unwrap();
    assert!(status.success(), "{out}{err}");
    assert!(out.contains("resumed: it is not running; it starts publishing"), "{out}{err}");
    writer.stop();
    let written = writer.finish().await;
    assert!(written.errors.is_empty(), "{:?}", written.errors);
    let resumed = Instant::now();
    connector.restart();
    let (_, report) = common::read_and_audit(&broker, TOPIC, &written.expected, READ_TIMEOUT, &connector);
    let caught_up = resumed.elapsed();
    assert_eq!(report.duplicates, 0, "a pause repeats nothing: {}", report.summary());
    let name = "paused under load, across a restart, resumed";
    let audit = reliability::closing_audit(name, &connector, &written, Duplicates::AfterCheckpoint);
    let held = written.len() - at_pause;
    reliability::record(
        name,
        &written,
        &audit,
        Some(caught_up),
        &format!(
            "4 writers; `pause` through the control API after {at_pause} records, nothing published for 3 s, \
             a restart while paused, `resume` of the stopped connector; {held} events held, published once each \
             (recovery: start after the resume to the last record read)"
        ),
    );
    assert!(connector.terminate().success());
}

/// Inserts a row whose `event_type` is not UTF-8 (an undecodable row: poison that holds its aggregate).
async fn insert_undecodable(conn: &mut mysql_async::Conn, id: &str, aggregate_id: &str) {
    conn.exec_drop(
        "INSERT INTO shop.outbox_events (id, aggregate_type, aggregate_id, event_type, schema_version, payload, \
         occurred_at, next_attempt_at) VALUES (?, 'order', ?, ?, 1, '{}', NOW(6), NOW(6))",
        (id, aggregate_id, b"\xff\xfe".to_vec()),
    )
    .await
    .unwrap();
}

/// `quarantine release` with the connector running: the command asks it through the API, the connector
/// stops reading for the release, republishes the held events in order, lifts the hold and reads on; a
/// later event of the aggregate follows the released ones. (Before the API the command refused to run
/// beside a connector: the state store is its.)
#[tokio::test(flavor = "multi_thread")]
async fn a_hold_is_released_by_the_running_connector() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let mut conn = db.conn().await;
    conn.query_drop("ALTER TABLE shop.outbox_events MODIFY event_type VARBINARY(128) NOT NULL").await.unwrap();
    let (mut connector, _) = connector(&db, &broker, false, "");
    let config = connector.config_path();
    let text = std::fs::read_to_string(&config).unwrap().replace(
        "topic = \"outbox.event.${aggregate_type}\"",
        "topic = \"outbox.event.${aggregate_type}\"\ndead_letter_topic = \"dlq\"",
    );
    std::fs::write(&config, text).unwrap();
    let first = OutboxRow::new("A-1");
    insert_event(&mut conn, &first).await.unwrap();
    insert_undecodable(&mut conn, "poison-1", "P-1").await;
    let held = [OutboxRow::new("P-1"), OutboxRow::new("P-1")];
    for row in &held {
        insert_event(&mut conn, row).await.unwrap();
    }
    connector.run(&config);
    assert_eq!(broker.read_all(DLQ, 3, READ_TIMEOUT).len(), 3, "{}", connector.logs());
    assert_eq!(broker.read_all(TOPIC, 1, READ_TIMEOUT).len(), 1);

    let (status, out, err) = connector
        .command(&["quarantine", "release", "order", "P-1", "--skip-poison"], Duration::from_secs(180))
        .unwrap();
    assert!(status.success(), "{out}{err}\n{}", connector.logs());
    assert!(out.contains("released order/P-1 (by the running connector): 2 event(s) republished"), "{out}{err}");
    assert!(connector.is_running(), "{}", connector.logs());

    let after = OutboxRow::new("P-1");
    insert_event(&mut conn, &after).await.unwrap();
    let normal = broker.read_all(TOPIC, 4, READ_TIMEOUT);
    let expected: Vec<String> = held.iter().chain([&after]).map(|r| r.id.clone()).collect();
    assert_eq!(ids_of_key(&normal, "P-1"), expected, "{}", connector.logs());
    let (_, out, _) = connector.command(&["quarantine", "list", "--json"], Duration::from_secs(30)).unwrap();
    assert_eq!(serde_json::from_str::<serde_json::Value>(&out).unwrap(), serde_json::json!([]), "{out}");
    assert!(connector.terminate().success(), "{}", connector.logs());
}

/// A relay (not started; rows marked one by one, polling every 50 ms) whose control API listens on a port of
/// its own, with the token [`TOKEN`] from `OUTBOX_CDC_CONTROL_TOKEN`.
fn relay(db: &MariaDb, broker: &Broker) -> (Connector, u16) {
    use common::patterns::{self, Mode};
    let port = free_port();
    let control = format!("[control]\nlisten = \"127.0.0.1:{port}\"\n");
    let mut relay =
        patterns::relay_config(db, broker, Mode::Marking, "poll_interval_ms = 50", &control, Some(free_port()));
    relay.env("OUTBOX_CDC_CONTROL_TOKEN", TOKEN);
    (relay, port)
}

/// The polling relay runs under the same turn: paused through the API under 2 steady writers it publishes
/// nothing (the rows written meanwhile wait in the table, unpublished), is shown paused, and resumed it
/// publishes every row once, in order (its stop marks what Kafka acknowledged, as a graceful stop does).
#[tokio::test(flavor = "multi_thread")]
async fn a_paused_relay_publishes_nothing_until_resumed() {
    use common::patterns::{self, Mode};
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    patterns::prepare(&db, Mode::Marking);
    let (mut relay, port) = relay(&db, &broker);
    relay.run(&relay.config_path());
    let writer = Writer::start(
        db.opts_root(),
        WriterConfig { tasks: 2, max_events: 1_000_000, pause: Duration::from_millis(5), ..WriterConfig::default() },
    );
    assert!(
        wait_until(Duration::from_secs(60), || broker.read_all(TOPIC, 100, Duration::from_secs(1)).len() >= 100),
        "{}",
        relay.logs()
    );

    let pause = with_token(port, "POST", "/v1/pause", TOKEN);
    assert_eq!(pause.code, 200, "{pause:?}\n{}", relay.logs());
    let at_pause = settled(&broker);
    let committed_at_pause = writer.committed();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(writer.committed() > committed_at_pause + 100, "the writers went on");
    assert_eq!(settled(&broker), at_pause, "published while paused:\n{}", relay.logs());
    let mut conn = db.conn().await;
    let waiting: u64 =
        conn.query_first("SELECT COUNT(*) FROM shop.outbox_events WHERE published_at IS NULL").await.unwrap().unwrap();
    assert!(waiting > 100, "the rows written while paused wait unpublished: {waiting}");
    let status = with_token(port, "GET", "/v1/status", TOKEN).json();
    assert_eq!((status["role"].as_str(), status["source"].as_str()), (Some("paused"), Some("poll")), "{status}");

    let resume = with_token(port, "POST", "/v1/resume", TOKEN);
    assert_eq!(resume.code, 200, "{resume:?}");
    writer.stop();
    let written = writer.finish().await;
    assert!(written.errors.is_empty(), "{:?}", written.errors);
    let (_, report) = common::read_and_audit(&broker, TOPIC, &written.expected, READ_TIMEOUT, &relay);
    assert_eq!(report.duplicates, 0, "a pause repeats nothing: {}", report.summary());
    assert!(relay.terminate().success(), "{}", relay.logs());
}

/// The signal table of the tests below, in Debezium's layout (README "Signals").
const SIGNAL_TABLE: &str = "CREATE TABLE shop.debezium_signal (id VARCHAR(42) PRIMARY KEY, type VARCHAR(32) NOT NULL, \
                            data VARCHAR(2048) NULL)";

/// Inserts signal `id` of type `kind` (no data).
async fn signal(conn: &mut mysql_async::Conn, id: &str, kind: &str) {
    conn.exec_drop("INSERT INTO shop.debezium_signal (id, type) VALUES (?, ?)", (id, kind)).await.unwrap();
}

/// Waits until the API says `role`, paused by `by` when paused.
fn wait_role(port: u16, role: &str, by: Option<&str>, connector: &Connector) {
    let status = || call(port, "GET", "/v1/status", &[("Authorization", &format!("Bearer {TOKEN}"))]);
    assert!(
        wait_until(Duration::from_secs(60), || status().is_some_and(|a| a.code == 200
            && a.json()["role"] == role
            && by.is_none_or(|by| a.json()["paused"]["by"] == by))),
        "not {role} by {by:?}: {:?}\n{}",
        status(),
        connector.logs()
    );
}

/// `pause` and `resume` rows of the signal table under 4 steady writers: the connector reads the pause
/// from the binlog, stores it naming the signal and publishes nothing more (its lag grows); killed -9 and
/// started again it stays paused, reads its signal table on the side, notes a second `pause` written while
/// paused, and resumes on the `resume` row; then every event once, in order. The pauses are read again by the
/// resumed run (its checkpoint is before them) and not carried out twice: a second pause would hold the
/// events and fail the read. A `resume` of the running connector, before, does nothing. The pause and the
/// resume are the README's (section "Signals"), as written.
#[tokio::test(flavor = "multi_thread")]
async fn pause_and_resume_signals_under_load_across_a_kill() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let section = &readme[readme.find("### Signals").expect("README has ### Signals")..];
    let second = section.match_indices("```sql\n").nth(1).expect("a second sql block").0 + 7;
    let block = &section[second..second + section[second..].find("```").unwrap()];
    let statements: Vec<&str> = block.split(";\n").map(str::trim).filter(|s| !s.is_empty()).collect();
    let [pause, resume] = statements[..] else { panic!("the pause and the resume: {statements:?}") };
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let mut conn = db.conn().await;
    conn.query_drop(SIGNAL_TABLE).await.unwrap();
    let (mut connector, port) = connector(&db, &broker, true, "");
    connector.outbox_setting("signal_table = \"shop.debezium_signal\"");
    let (_, out, _) = connector.command(&["check"], Duration::from_secs(60)).unwrap();
    assert!(out.contains("[ok  ] signal table shop.debezium_signal: expected id, type, data"), "{out}");
    connector.run(&connector.config_path());
    let writer = Writer::start(
        db.opts_root(),
        WriterConfig { tasks: 4, max_events: 1_000_000, pause: Duration::from_millis(5), ..WriterConfig::default() },
    );
    assert!(
        wait_until(Duration::from_secs(60), || broker.read_all(TOPIC, 100, Duration::from_secs(1)).len() >= 100),
        "{}",
        connector.logs()
    );
    signal(&mut conn, "r-0", "resume").await;
    conn.query_drop(pause.trim_end_matches(';')).await.unwrap();
    let by = "signal maintenance-2026-12-07";
    wait_role(port, "paused", Some(by), &connector);
    let at_pause = settled(&broker);
    let committed_at_pause = writer.committed();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(writer.committed() > committed_at_pause + 100, "the writers went on");
    assert_eq!(settled(&broker), at_pause, "published while paused:\n{}", connector.logs());
    assert!(connector.logs().contains("paused by a signal"), "{}", connector.logs());

    connector.kill();
    connector.restart();
    wait_role(port, "paused", Some(by), &connector);
    signal(&mut conn, "p-2", "pause").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(settled(&broker), at_pause, "published after a restart while paused:\n{}", connector.logs());
    conn.query_drop(resume.trim_end_matches(';')).await.unwrap();
    wait_role(port, "running", None, &connector);
    assert!(connector.logs().contains("resumed by a signal"), "{}", connector.logs());
    writer.stop();
    let written = writer.finish().await;
    assert!(written.errors.is_empty(), "{:?}", written.errors);
    let (_, report) = common::read_and_audit(&broker, TOPIC, &written.expected, READ_TIMEOUT, &connector);
    assert_eq!(report.duplicates, 0, "a pause repeats nothing: {}", report.summary());
    assert!(written.len() > at_pause + 100, "events were held by the pause");
    assert!(connector.terminate().success(), "{}", connector.logs());
}

/// The polling relay polls its signal table (README "Signals"): a `pause` row under 2 steady writers pauses
/// it (the rows written meanwhile wait unpublished), a `resume` row resumes it, and every row is
/// published once, in order. A Debezium signal it does not take is noted and logged, once.
#[tokio::test(flavor = "multi_thread")]
async fn the_relay_polls_pause_and_resume_signals() {
    use common::patterns::{self, Mode};
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    patterns::prepare(&db, Mode::Marking);
    let mut conn = db.conn().await;
    conn.query_drop(SIGNAL_TABLE).await.unwrap();
    signal(&mut conn, "old-1", "execute-snapshot").await;
    let (mut relay, port) = relay(&db, &broker);
    relay.outbox_setting("signal_table = \"shop.debezium_signal\"");
    // `check` says what the relay needs of the table: the grant, then the layout.
    let (status, out, _) = relay.command(&["check"], Duration::from_secs(60)).unwrap();
    assert_eq!(status.code(), Some(2), "{out}");
    assert!(out.contains("GRANT SELECT ON shop.debezium_signal TO 'relay'@'127.0.0.1'"), "{out}");
    conn.query_drop("GRANT SELECT ON shop.debezium_signal TO 'relay'@'127.0.0.1'").await.unwrap();
    let (_, out, _) = relay.command(&["check"], Duration::from_secs(60)).unwrap();
    let line = out.lines().find(|l| l.contains("signal table shop.debezium_signal")).unwrap_or_else(|| panic!("{out}"));
    assert!(line.starts_with("[ok  ]") && line.contains("id varchar, type varchar, data varchar"), "{out}");
    relay.run(&relay.config_path());
    let writer = Writer::start(
        db.opts_root(),
        WriterConfig { tasks: 2, max_events: 1_000_000, pause: Duration::from_millis(5), ..WriterConfig::default() },
    );
    assert!(
        wait_until(Duration::from_secs(60), || broker.read_all(TOPIC, 100, Duration::from_secs(1)).len() >= 100),
        "{}",
        relay.logs()
    );
    signal(&mut conn, "p-1", "pause").await;
    wait_role(port, "paused", Some("signal p-1"), &relay);
    let at_pause = settled(&broker);
    let committed_at_pause = writer.committed();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(writer.committed() > committed_at_pause + 100, "the writers went on");
    assert_eq!(settled(&broker), at_pause, "published while paused:\n{}", relay.logs());
    let waiting: u64 =
        conn.query_first("SELECT COUNT(*) FROM shop.outbox_events WHERE published_at IS NULL").await.unwrap().unwrap();
    assert!(waiting > 100, "the rows written while paused wait unpublished: {waiting}");

    signal(&mut conn, "r-1", "resume").await;
    wait_role(port, "running", None, &relay);
    writer.stop();
    let written = writer.finish().await;
    assert!(written.errors.is_empty(), "{:?}", written.errors);
    let (_, report) = common::read_and_audit(&broker, TOPIC, &written.expected, READ_TIMEOUT, &relay);
    assert_eq!(report.duplicates, 0, "a pause repeats nothing: {}", report.summary());
    let logs = relay.logs();
    assert_eq!(logs.matches("signal the polling relay does not take").count(), 1, "{logs}");
    assert!(relay.terminate().success(), "{}", relay.logs());
}
