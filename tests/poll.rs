//! The polling relay (`source.kind = "poll"`) against a real MariaDB and a real broker: publishing and
//! marking, several relay processes on one table, kill -9 under load, the lease of a dead relay, a broker
//! outage, poison rows, and prune by `published_at`. Each scenario ends by auditing the topic.
//!
//! The relays connect as `relay`, which has `SELECT, UPDATE` on the outbox table and nothing else: no
//! binlog privilege.

mod common;

use std::time::{Duration, Instant};

use common::connector::toml_str;
use common::workload::OutboxRow;
use common::{
    audit, free_port, insert_event, wait_until, Broker, Connector, Engine, Expected, MariaDb, Writer, WriterConfig,
};
use mysql_async::prelude::Queryable;

const TOPIC: &str = "outbox.event.order";
const DLQ: &str = "outbox-cdc.dead-letter";
const RELAY_PASSWORD: &str = "relay-secret";
const CATCH_UP: Duration = Duration::from_secs(90);

/// Creates the `relay` user: `SELECT, UPDATE` on the outbox table only.
fn create_relay_user(db: &MariaDb) {
    db.sql(&format!(
        "CREATE USER 'relay'@'127.0.0.1' IDENTIFIED BY '{RELAY_PASSWORD}';
         GRANT SELECT, UPDATE ON shop.outbox_events TO 'relay'@'127.0.0.1';"
    ));
}

/// A relay process with its own work dir and state store, `[poll]` settings from `poll`, started.
fn relay(db: &MariaDb, broker: &Broker, poll: &str) -> Connector {
    let mut c = relay_config(db, broker, poll);
    c.run(&c.config_path());
    c
}

/// [`relay`], not started yet.
fn relay_config(db: &MariaDb, broker: &Broker, poll: &str) -> Connector {
    relay_config_with(db, broker, "", poll)
}

/// [`relay_config`] with `kafka` appended to the `[kafka]` table.
fn relay_config_with(db: &MariaDb, broker: &Broker, kafka: &str, poll: &str) -> Connector {
    let c = Connector::new();
    let text = format!(
        "[source]\nkind = \"poll\"\nhost = \"127.0.0.1\"\nport = {port}\nuser = \"relay\"\npassword = {password}\n\
         [outbox]\ntable = \"shop.outbox_events\"\n\
         [kafka]\nbootstrap_servers = {bootstrap}\ntopic = \"outbox.event.${{aggregate_type}}\"\n{kafka}\n\
         [state]\ndir = {state}\n[snapshot]\nmode = \"never\"\n{metrics}\n[poll]\n{poll}\n",
        port = db.port(),
        password = toml_str(RELAY_PASSWORD),
        bootstrap = toml_str(&broker.bootstrap()),
        state = toml_str(&c.state_dir().to_string_lossy()),
        metrics = common::connector::EPHEMERAL_METRICS,
    );
    std::fs::write(c.config_path(), text).expect("write relay config");
    c
}

async fn count(db: &MariaDb, condition: &str) -> u64 {
    let mut conn = db.conn().await;
    let n: Option<u64> =
        conn.query_first(format!("SELECT COUNT(*) FROM outbox_events WHERE {condition}")).await.expect("count rows");
    n.unwrap_or(0)
}

/// The relays holding leases on unpublished rows.
async fn holders(db: &MariaDb) -> Vec<String> {
    let mut conn = db.conn().await;
    conn.query("SELECT DISTINCT locked_by FROM outbox_events WHERE published_at IS NULL AND locked_by IS NOT NULL")
        .await
        .expect("read the lease holders")
}

/// Waits until no row is unpublished (other than parked, dead-lettered ones).
async fn wait_all_published(db: &MariaDb, relays: &[&Connector]) {
    let deadline = Instant::now() + CATCH_UP;
    loop {
        let left = count(db, "published_at IS NULL AND next_attempt_at < '9999-01-01'").await;
        if left == 0 {
            return;
        }
        if Instant::now() >= deadline {
            let logs: Vec<String> = relays.iter().map(|r| common::tail_file(&r.dir().join("stderr.log"), 60)).collect();
            panic!("{left} rows still unpublished after {CATCH_UP:?}:\n{}", logs.join("\n-----\n"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `outbox-cdc audit` through `relay`'s config: nothing missing, nothing out of order.
fn closing_audit(relay: &Connector) -> common::AuditRun {
    let run = relay.audit(&[]);
    assert_eq!(run.code, Some(0), "audit failed: {}\n{}", run.report, run.stderr);
    assert_eq!((run.count("missing"), run.count("order_violations")), (0, 0), "{}", run.report);
    run
}

/// Inserts `n` events of each aggregate, interleaved, `occurred_at` increasing; returns the expectation.
async fn insert_interleaved(db: &MariaDb, aggregates: &[&str], n: usize) -> Expected {
    let mut conn = db.conn().await;
    let mut orders: Vec<(String, Vec<String>)> = aggregates.iter().map(|a| (a.to_string(), Vec::new())).collect();
    for _ in 0..n {
        for (aggregate, ids) in orders.iter_mut() {
            let row = OutboxRow::new(aggregate.as_str());
            insert_event(&mut conn, &row).await.expect("insert event");
            ids.push(row.id);
        }
    }
    Expected::from_orders(orders)
}

/// The relay's statements, driven directly against MariaDB as two relays (`r1`, `r2`) would: a claim
/// leases an aggregate's rows in order; a failed delivery counts an attempt, records the error, backs off
/// 1-2 s and releases the lease; the aggregate's later row waits behind a retried one; a lease taken over
/// cannot be renewed or marked by its former holder, nor can an expired one. The relay's counters follow
/// (this is the only test of this binary that runs a relay in its own process).
#[tokio::test(flavor = "multi_thread")]
async fn claims_failures_and_leases_follow_the_order_rule() {
    use outbox_cdc::config::Config;
    use outbox_cdc::source::{poll::Relay, SourceConn};
    let db = MariaDb::start();
    create_relay_user(&db);
    let config = |relay_id: &str| {
        Config::parse(&format!(
            "[source]\nkind = \"poll\"\nhost = \"127.0.0.1\"\nport = {}\nuser = \"relay\"\npassword = \"{RELAY_PASSWORD}\"\n\
             [outbox]\ntable = \"shop.outbox_events\"\n[kafka]\nbootstrap_servers = \"127.0.0.1:1\"\n\
             [snapshot]\nmode = \"never\"\n[poll]\nlease_ms = 1000\nrelay_id = \"{relay_id}\"\n",
            db.port()
        ))
        .unwrap()
    };
    let (c1, c2) = (config("r1"), config("r2"));
    let mut conn = SourceConn::from_config(&c1).unwrap().connect().await.unwrap();
    let expected = insert_interleaved(&db, &["A", "B"], 2).await;
    let r1 = Relay::load(&mut conn, &c1).await.unwrap();
    let r2 = Relay::load(&mut conn, &c2).await.unwrap();
    let ids = |claimed: &[outbox_cdc::source::poll::Claimed]| -> Vec<String> {
        claimed.iter().map(|c| c.id().unwrap().to_string()).collect()
    };

    let claimed = r1.claim(&mut conn, 0).await.unwrap();
    let all: Vec<String> = ["A", "B"].iter().flat_map(|a| expected.per_aggregate[*a].clone()).collect();
    assert_eq!(ids(&claimed), all, "each aggregate's rows, in order");
    assert!(r2.claim(&mut conn, 0).await.unwrap().is_empty(), "all leased to r1");
    let keys: Vec<mysql_async::Value> = claimed.iter().map(|c| c.key.clone()).collect();
    assert!(r1.renew(&mut conn, 0, &keys).await.unwrap());

    r1.fail(&mut conn, 0, &keys[..2], "broker said no").await.unwrap();
    let (attempts, error, locked, wait_ms): (u32, String, Option<String>, i64) = conn
        .exec_first(
            "SELECT attempts, last_error, locked_by, TIMESTAMPDIFF(MICROSECOND, NOW(6), next_attempt_at) DIV 1000 \
             FROM shop.outbox_events WHERE id = ?",
            (&all[0],),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!((attempts, error.as_str(), locked), (1, "broker said no", None));
    assert!((800..=2000).contains(&wait_ms), "retry in {wait_ms} ms, expected 1-2 s");
    assert!(r2.claim(&mut conn, 0).await.unwrap().is_empty(), "A waits for its retry, B is r1's");
    assert_eq!(r1.mark_published(&mut conn, 0, &keys[2..]).await.unwrap(), 2);

    // A's first event is due again, its second not yet: only the first is claimed.
    conn.exec_drop("UPDATE shop.outbox_events SET next_attempt_at = NOW(6) WHERE id = ?", (&all[0],)).await.unwrap();
    let retried = r2.claim(&mut conn, 0).await.unwrap();
    assert_eq!(ids(&retried), [all[0].clone()]);
    assert_eq!(retried[0].attempts, 1);
    assert!(!r1.renew(&mut conn, 0, &keys[..1]).await.unwrap(), "r2 holds it now");
    assert_eq!(r1.mark_published(&mut conn, 0, &keys[..1]).await.unwrap(), 0);
    assert_eq!(r2.mark_published(&mut conn, 0, &keys[..1]).await.unwrap(), 1);

    // A's second row waits for its retry through what follows: its own back-off (1-2 s from its failure)
    // may run out during the lease's 1.2 s on a loaded machine, and it would then be claimed beside D.
    conn.exec_drop("UPDATE shop.outbox_events SET next_attempt_at = NOW(6) + INTERVAL 1 HOUR WHERE id = ?", (&all[1],))
        .await
        .unwrap();

    // A lease that expired (lease_ms = 1000) is taken over by the next claim.
    let late = insert_interleaved(&db, &["D"], 1).await;
    let held = r1.claim(&mut conn, 0).await.unwrap();
    assert_eq!(ids(&held), late.per_aggregate["D"]);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let taken = r2.claim(&mut conn, 0).await.unwrap();
    assert_eq!(ids(&taken), late.per_aggregate["D"]);
    assert!(!r1.renew(&mut conn, 0, &[held[0].key.clone()]).await.unwrap());
    // Due and unpublished: D (leased, in flight); A's second row waits for its retry (pushed back above).
    let (backlog, waited_s) = r2.backlog(&mut conn, 0).await.unwrap();
    assert_eq!(backlog, 1);
    assert!(waited_s >= 1.2, "D became due before the lease expired: {waited_s}");

    let page = outbox_cdc::metrics::metrics().render();
    let value = |series: &str| sample(&page, series).unwrap_or_else(|| panic!("no {series} in:\n{page}"));
    assert_eq!(value("outbox_cdc_poll_rows_claimed_total"), 7.0, "4 + 1 + D twice");
    assert_eq!(value("outbox_cdc_poll_rows_failed_total"), 2.0);
    assert_eq!(value("outbox_cdc_poll_rows_published_total"), 3.0);
    assert_eq!(value("outbox_cdc_poll_lease_takeovers_total"), 1.0);
    // Claims: 4 that leased rows (6 statements each), 2 that found heads all leased by the
    // other relay (2 reads: the rows behind the heads are not free), 1 that found no head.
    assert!(value("outbox_cdc_poll_queries_total{kind=\"claim\"}") >= 24.0, "{page}");
    assert_eq!(value("outbox_cdc_poll_queries_total{kind=\"mark\"}"), 3.0);
    assert_eq!(value("outbox_cdc_poll_queries_total{kind=\"fail\"}"), 1.0);
    assert_eq!(value("outbox_cdc_poll_queries_total{kind=\"renew\"}"), 6.0, "3 renewals of 2 statements");
    assert_eq!(value("outbox_cdc_poll_queries_total{kind=\"backlog\"}"), 1.0);
}

/// The value of one sample line `name{labels} value` in a metrics page.
fn sample(page: &str, series: &str) -> Option<f64> {
    page.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// `GET /metrics` on 127.0.0.1:`port`; `None` while nothing answers.
fn scrape(port: u16) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(stream, "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    response.split_once("\r\n\r\n").map(|(_, body)| body.to_string())
}

/// A relay process's `/metrics` while rows flow: the binlog source's event counters where they apply, and
/// the relay's own: rows claimed and published, a lease taken over from a dead relay, a parked row holding
/// its aggregate (so its follower shows as backlog, waiting longer and longer), claim and mark statements,
/// idle polls while nothing is due. Regression guard: the relay exposed none of its own counters.
#[tokio::test(flavor = "multi_thread")]
async fn a_relays_metrics_count_queries_rows_leases_and_backlog() {
    let db = MariaDb::start();
    create_relay_user(&db);
    let broker = Broker::start(Engine::Memory);
    let mut conn = db.conn().await;
    // A row leased by a relay that died an hour ago, a poison row (invalid headers) and the row behind it.
    let orphan = OutboxRow::new("O");
    insert_event(&mut conn, &orphan).await.unwrap();
    conn.exec_drop(
        "UPDATE outbox_events SET locked_by = 'gone:1', locked_at = NOW(6) - INTERVAL 1 HOUR WHERE id = ?",
        (&orphan.id,),
    )
    .await
    .unwrap();
    insert_event(&mut conn, &OutboxRow::new("P").headers(Some(serde_json::json!([1])))).await.unwrap();
    let mut expected = insert_interleaved(&db, &["A", "B", "C"], 10).await;
    expected.per_aggregate.insert("O".into(), vec![orphan.id.clone()]);

    let port = free_port();
    let mut relay = relay_config(&db, &broker, "poll_interval_ms = 50");
    let config = std::fs::read_to_string(relay.config_path()).unwrap();
    let config =
        config.replace(common::connector::EPHEMERAL_METRICS, &format!("\n[metrics]\nlisten = \"127.0.0.1:{port}\"\n"));
    std::fs::write(relay.config_path(), config).unwrap();
    relay.run(&relay.config_path());
    let records = broker.read_all(TOPIC, expected.len(), CATCH_UP);
    let report = audit(&expected, &records);
    assert!(report.is_clean(), "{}\n{}", report.summary(), relay.logs());
    wait_all_published(&db, &[&relay]).await;
    insert_event(&mut conn, &OutboxRow::new("P")).await.unwrap();

    let page = || scrape(port).unwrap_or_default();
    let value = |page: &str, series: &str| sample(page, series).unwrap_or(-1.0);
    // The backlog is counted every 5 s: wait for a count that sees P's follower waiting.
    assert!(
        wait_until(Duration::from_secs(30), || {
            let p = page();
            value(&p, "outbox_cdc_poll_backlog_rows") == 1.0 && value(&p, "outbox_cdc_poll_oldest_due_seconds") > 0.0
        }),
        "the held row never showed as backlog:\n{}\n{}",
        page(),
        relay.logs()
    );
    let first = page();
    for (series, want) in [
        ("outbox_cdc_poll_rows_claimed_total", 32.0),
        ("outbox_cdc_poll_rows_published_total", 31.0),
        ("outbox_cdc_poll_rows_parked_total", 1.0),
        ("outbox_cdc_poll_rows_failed_total", 0.0),
        ("outbox_cdc_poll_lease_takeovers_total", 1.0),
        ("outbox_cdc_poll_leases_lost_total", 0.0),
        ("outbox_cdc_events_acknowledged_total{topic=\"outbox.event.order\"}", 31.0),
        ("outbox_cdc_events_read_total{topic=\"outbox.event.order\"}", 31.0),
        ("outbox_cdc_end_to_end_latency_seconds_count{aggregate_type=\"order\"}", 31.0),
        ("outbox_cdc_records_in_flight", 0.0),
        ("outbox_cdc_quarantined_aggregates", 1.0),
        ("outbox_cdc_dead_letters_total{kind=\"invalid_headers\"}", 1.0),
    ] {
        assert_eq!(value(&first, series), want, "{series}:\n{first}");
    }
    for kind in ["claim", "mark", "park", "backlog"] {
        let series = format!("outbox_cdc_poll_queries_total{{kind=\"{kind}\"}}");
        assert!(value(&first, &series) >= 1.0, "{series}:\n{first}");
    }
    // Idle: one claim statement (the heads read) per poll, and the idle polls count.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let second = page();
    let grew = |series: &str| value(&second, series) - value(&first, series);
    assert!(grew("outbox_cdc_poll_idle_polls_total") >= 5.0, "{first}\n-----\n{second}");
    assert!(
        grew("outbox_cdc_poll_queries_total{kind=\"claim\"}") <= grew("outbox_cdc_poll_idle_polls_total") + 1.0,
        "{first}\n-----\n{second}"
    );
    assert_eq!(grew("outbox_cdc_poll_queries_total{kind=\"mark\"}"), 0.0);
    assert!(relay.terminate().success(), "{}", relay.logs());
}

/// One relay publishes every row in order, marks it published and releases its lease; `check` passes for
/// a user with `SELECT, UPDATE` on the table and no binlog privilege.
#[tokio::test(flavor = "multi_thread")]
async fn a_relay_publishes_marks_and_passes_check() {
    let db = MariaDb::start();
    create_relay_user(&db);
    let broker = Broker::start(Engine::Memory);
    let relay = relay(&db, &broker, "poll_interval_ms = 50");
    let expected = insert_interleaved(&db, &["A", "B", "C"], 20).await;
    let records = broker.read_all(TOPIC, expected.len(), CATCH_UP);
    let report = audit(&expected, &records);
    assert!(report.is_clean() && report.duplicates == 0, "{}\n{}", report.summary(), relay.logs());
    wait_all_published(&db, &[&relay]).await;
    assert_eq!(count(&db, "locked_by IS NOT NULL OR locked_at IS NOT NULL OR attempts > 0").await, 0);
    let (status, stdout, stderr) = relay.command(&["check"], Duration::from_secs(60)).expect("check runs");
    assert!(status.success(), "check failed:\n{stdout}\n{stderr}");
    for line in ["claim index", "privilege UPDATE on shop.outbox_events", "all checks passed"] {
        assert!(stdout.contains(line), "{line} not in:\n{stdout}");
    }
    // The reference schema's (aggregate_type, aggregate_id, occurred_at) index makes every claim read the
    // published rows kept too (docs/PERFORMANCE.md): check warns and proposes the index that does not;
    // with it, the warning goes.
    let ddl = "ALTER TABLE `shop`.`outbox_events` ADD INDEX idx_unpublished (`aggregate_type`, `aggregate_id`, \
               `published_at`, `occurred_at`), ALGORITHM=INPLACE, LOCK=NONE";
    assert!(stdout.contains(ddl), "{stdout}");
    db.sql(&format!("{};", ddl.replace("`shop`.", "shop.")));
    let (status, stdout, _) = relay.command(&["check"], Duration::from_secs(60)).expect("check runs");
    assert!(status.success() && !stdout.contains("idx_unpublished"), "{stdout}");
    closing_audit(&relay);
}

/// `check` refuses a table without the claim index, printing the `ALTER TABLE` that adds it, and a user
/// without `UPDATE`; the relay itself refuses a table without the relay's columns.
#[tokio::test(flavor = "multi_thread")]
async fn check_refuses_a_table_the_relay_cannot_use() {
    let db = MariaDb::start();
    create_relay_user(&db);
    let broker = Broker::start(Engine::Memory);
    db.sql("ALTER TABLE shop.outbox_events DROP INDEX idx_ready; REVOKE UPDATE ON shop.outbox_events FROM 'relay'@'127.0.0.1';");
    let mut relay = relay(&db, &broker, "");
    relay.kill();
    let (status, stdout, _) = relay.command(&["check"], Duration::from_secs(60)).expect("check runs");
    assert_eq!(status.code(), Some(2), "{stdout}");
    assert!(
        stdout.contains(
            "ALTER TABLE `shop`.`outbox_events` ADD INDEX idx_ready (`published_at`, `next_attempt_at`, `occurred_at`)"
        ),
        "{stdout}"
    );
    assert!(stdout.contains("GRANT SELECT, UPDATE ON shop.outbox_events"), "{stdout}");

    // A table whose relay columns are named otherwise (here: `locked_by` is `claimed_by`): check and the
    // relay both name the missing column and give the DDL that adds it, and only it.
    db.sql("ALTER TABLE shop.outbox_events CHANGE COLUMN locked_by claimed_by VARCHAR(128) NULL;");
    let ddl = "ALTER TABLE `shop`.`outbox_events` ADD COLUMN `locked_by` VARCHAR(128) NULL";
    let (status, stdout, _) = relay.command(&["check"], Duration::from_secs(60)).expect("check runs");
    assert_eq!(status.code(), Some(2), "{stdout}");
    assert!(stdout.contains("no `locked_by` column") && stdout.contains(ddl), "{stdout}");
    relay.restart();
    let status = relay.wait_exit(Duration::from_secs(60)).expect("the relay stops on a table it cannot use");
    assert_eq!(status.code(), Some(2), "{}", relay.logs());
    assert!(relay.stderr().contains("no `locked_by` column") && relay.stderr().contains(ddl), "{}", relay.logs());
}

/// Four relay processes on one table under a concurrent workload with small batches: every event
/// published, each aggregate's events in commit order, whichever relay held them.
#[tokio::test(flavor = "multi_thread")]
async fn four_relays_keep_per_aggregate_order() {
    let db = MariaDb::start();
    create_relay_user(&db);
    let broker = Broker::start(Engine::Memory);
    let relays: Vec<Connector> = (0..4).map(|_| relay(&db, &broker, "batch_rows = 7\npoll_interval_ms = 20")).collect();
    let writer = Writer::start(
        db.opts_root(),
        WriterConfig { tasks: 4, aggregates_per_task: 4, max_events: 1200, ..WriterConfig::default() },
    );
    let written = writer.join().await;
    assert!(written.errors.is_empty(), "{:?}", written.errors);
    let refs: Vec<&Connector> = relays.iter().collect();
    wait_all_published(&db, &refs).await;
    let records = broker.read_all(TOPIC, written.len(), CATCH_UP);
    let report = audit(&written.expected, &records);
    assert!(report.is_clean(), "{}", report.summary());
    let busy = relays.iter().filter(|r| r.stderr().contains("polling the outbox table")).count();
    assert_eq!(busy, 4);
    closing_audit(&relays[0]);
}

/// Relays SIGKILLed and restarted under load (4 relays, one kill every ~400 ms, 8 kills; 20 in the full
/// run), with a short
/// lease: nothing lost, order kept; duplicates only of rows that were published and not yet marked, which
/// a kill leaves at most one batch of per killed relay.
#[tokio::test(flavor = "multi_thread")]
async fn killed_relays_lose_nothing_and_keep_order() {
    let db = MariaDb::start();
    create_relay_user(&db);
    let broker = Broker::start(Engine::Memory);
    let batch = 10;
    let poll = format!("batch_rows = {batch}\npoll_interval_ms = 20\nlease_ms = 1000");
    let mut relays: Vec<Connector> = (0..4).map(|_| relay(&db, &broker, &poll)).collect();
    let writer = Writer::start(
        db.opts_root(),
        WriterConfig {
            tasks: 4,
            aggregates_per_task: 8,
            max_events: 100_000,
            pause: Duration::from_millis(3),
            ..WriterConfig::default()
        },
    );
    // 20 kills, the scenario, with OUTBOX_CDC_SCENARIO_FULL=1.
    let kills = common::reliability::scaled(8, 20);
    for k in 0..kills {
        tokio::time::sleep(Duration::from_millis(400)).await;
        let r = &mut relays[k % 4];
        r.kill();
        r.restart();
    }
    let written = writer.finish().await;
    assert!(written.errors.is_empty(), "{:?}", written.errors);
    let refs: Vec<&Connector> = relays.iter().collect();
    wait_all_published(&db, &refs).await;
    let records = broker.read_all(TOPIC, written.len(), CATCH_UP);
    let report = audit(&written.expected, &records);
    assert!(report.is_clean(), "{}", report.summary());
    assert!(report.duplicates <= kills * batch, "{} duplicates for {kills} kills", report.duplicates);
    let run = closing_audit(&relays[0]);
    let note = format!("4 relays (batch_rows {batch}, lease_ms 1000), {kills} SIGKILLs 400 ms apart under load");
    common::reliability::record("polling relay: kill -9 of relays under load", &written, &run, None, &note);
}

/// A relay killed after Kafka acknowledged its batch and before it marked the rows (failpoint
/// `poll_batch_acked`) leaves them leased and unpublished; once the lease expires they are published again,
/// in order, with the same ids: the duplicates are exactly that batch.
#[tokio::test(flavor = "multi_thread")]
async fn a_crash_between_publish_and_mark_republishes_the_batch() {
    let db = MariaDb::start();
    create_relay_user(&db);
    let broker = Broker::start(Engine::Memory);
    let expected = insert_interleaved(&db, &["A", "B"], 5).await;
    let mut relay = relay_config(&db, &broker, "lease_ms = 1000\npoll_interval_ms = 50");
    relay.env("OUTBOX_CDC_FAILPOINT", "poll_batch_acked:1");
    relay.run(&relay.config_path());
    let exited = relay.wait_exit(Duration::from_secs(60)).expect("the failpoint must end the process");
    assert!(!exited.success(), "{}", relay.logs());
    let first = broker.read_all(TOPIC, expected.len(), CATCH_UP);
    assert_eq!(first.len(), expected.len(), "the batch was acknowledged before the crash");
    assert_eq!(count(&db, "published_at IS NULL AND locked_by IS NOT NULL").await, expected.len() as u64);
    relay.remove_env("OUTBOX_CDC_FAILPOINT");
    relay.restart();
    wait_all_published(&db, &[&relay]).await;
    let records = broker.read_all(TOPIC, 2 * expected.len(), CATCH_UP);
    let report = audit(&expected, &records);
    assert!(report.is_clean(), "{}", report.summary());
    assert_eq!(report.duplicates, expected.len(), "exactly the unmarked batch again");
    closing_audit(&relay);
}

/// MariaDB crashes (SIGKILL) under load with two relays running and comes back after 2 s: the relays
/// reconnect by themselves, and nothing committed is lost or reordered (a batch whose mark was lost with the
/// crash is published again once its lease expires).
#[tokio::test(flavor = "multi_thread")]
async fn database_crash_and_restart() {
    let mut db = MariaDb::start();
    create_relay_user(&db);
    let broker = Broker::start(Engine::Memory);
    let poll = "batch_rows = 20\npoll_interval_ms = 20\nlease_ms = 1000";
    let mut relays: Vec<Connector> = (0..2).map(|_| relay(&db, &broker, poll)).collect();
    let writer = Writer::start(
        db.opts_root(),
        WriterConfig {
            tasks: 2,
            aggregates_per_task: 8,
            max_events: 100_000,
            pause: Duration::from_millis(5),
            ..WriterConfig::default()
        },
    );
    assert!(writer.wait_committed(150, CATCH_UP).await);
    db.kill();
    tokio::time::sleep(Duration::from_secs(2)).await;
    db.start_again();
    let at_restart = writer.committed();
    assert!(writer.wait_committed(at_restart + 150, CATCH_UP).await, "the workload must resume");
    let mut written = writer.finish().await;
    written.resolve_uncertain(&mut db.conn().await).await.unwrap();
    let refs: Vec<&Connector> = relays.iter().collect();
    wait_all_published(&db, &refs).await;
    let records = broker.read_all(TOPIC, written.len(), CATCH_UP);
    let report = audit(&written.expected, &records);
    assert!(report.is_clean(), "{}", report.summary());
    for r in relays.iter_mut() {
        assert!(r.is_running(), "a relay exited:\n{}", r.logs());
    }
    let run = closing_audit(&relays[0]);
    let note = "2 relays (lease_ms 1000); MariaDB SIGKILLed under load, started again after 2 s";
    common::reliability::record("polling relay: MariaDB killed and restarted", &written, &run, None, note);
}

/// Rows leased by a relay that died stay untouched until the lease expires, then another relay takes
/// them over and publishes them in order; other aggregates flow meanwhile.
#[tokio::test(flavor = "multi_thread")]
async fn a_dead_relays_lease_is_taken_over_when_it_expires() {
    let db = MariaDb::start();
    create_relay_user(&db);
    let broker = Broker::start(Engine::Memory);
    let expected = insert_interleaved(&db, &["A", "B"], 5).await;
    // A relay that claimed A's first three events and died: its lease is fresh.
    db.sql(
        "UPDATE shop.outbox_events SET locked_at = UTC_TIMESTAMP(6), locked_by = 'dead-relay:1' \
         WHERE aggregate_id = 'A' ORDER BY occurred_at, id LIMIT 3",
    );
    let leased_at = Instant::now();
    let relay = relay(&db, &broker, "lease_ms = 3000\npoll_interval_ms = 50");
    // B flows at once; A waits for the lease.
    let b = broker.read_all(TOPIC, 5, CATCH_UP);
    let b_keys: Vec<&str> = b.iter().filter_map(|r| r.key_str()).collect();
    assert!(b_keys.iter().all(|k| *k == "B") && b_keys.len() == 5, "{b_keys:?}\n{}", relay.logs());
    assert!(leased_at.elapsed() < Duration::from_millis(2500), "B took too long to test the lease");
    assert_eq!(count(&db, "aggregate_id = 'A' AND published_at IS NOT NULL").await, 0);
    wait_all_published(&db, &[&relay]).await;
    assert!(leased_at.elapsed() >= Duration::from_millis(2900), "A was published before the lease expired");
    let records = broker.read_all(TOPIC, expected.len(), CATCH_UP);
    let report = audit(&expected, &records);
    assert!(report.is_clean() && report.duplicates == 0, "{}", report.summary());
    closing_audit(&relay);
}

/// The broker goes away under load and comes back: nothing is marked published while it is away (the
/// relay waits, renewing its lease), and everything arrives in order afterwards without a restart.
#[tokio::test(flavor = "multi_thread")]
async fn broker_down_then_up() {
    let db = MariaDb::start();
    create_relay_user(&db);
    let mut broker = Broker::start(Engine::Sqlite);
    broker.create_topic(TOPIC, 4);
    let mut relay = relay(&db, &broker, "poll_interval_ms = 50\nlease_ms = 2000");
    let writer = Writer::start(
        db.opts_root(),
        WriterConfig {
            tasks: 2,
            aggregates_per_task: 8,
            max_events: 100_000,
            pause: Duration::from_millis(10),
            ..WriterConfig::default()
        },
    );
    assert!(writer.wait_committed(100, CATCH_UP).await);
    // Rows keep coming: wait for progress, not for an empty backlog.
    let deadline = Instant::now() + CATCH_UP;
    while count(&db, "published_at IS NOT NULL").await < 100 {
        assert!(Instant::now() < deadline, "nothing published before the outage:\n{}", relay.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    broker.stop();
    let published_before = count(&db, "published_at IS NOT NULL").await;
    let outage = Duration::from_secs(common::reliability::scaled(5, 30));
    tokio::time::sleep(outage).await;
    assert_eq!(count(&db, "published_at IS NOT NULL").await, published_before, "marked while the broker was down");
    assert!(relay.is_running(), "{}", relay.logs());
    broker.start_again();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let written = writer.finish().await;
    assert!(written.errors.is_empty(), "{:?}", written.errors);
    wait_all_published(&db, &[&relay]).await;
    let records = broker.read_all(TOPIC, written.len(), CATCH_UP);
    let report = audit(&written.expected, &records);
    assert!(report.is_clean(), "{}", report.summary());
    let run = closing_audit(&relay);
    let note = format!("one relay (lease_ms 2000), broker (durable SQLite engine) stopped for {outage:?} under load");
    common::reliability::record("polling relay: broker down", &written, &run, None, &note);
}

/// While the broker is away, a batch larger than the in-flight budget keeps its relay waiting to produce;
/// the relay renews its lease meanwhile, so a second relay never takes the batch over (which would publish
/// it twice, and could interleave the two relays' copies). Regression: the lease was renewed only while
/// waiting for acknowledgements, not while the sink waited for budget.
#[tokio::test(flavor = "multi_thread")]
async fn the_lease_is_renewed_while_the_sink_waits_for_a_slow_broker() {
    let db = MariaDb::start();
    create_relay_user(&db);
    let mut broker = Broker::start(Engine::Sqlite);
    broker.create_topic(TOPIC, 4);
    let kafka = "max_in_flight_bytes = 1048576";
    let poll = "lease_ms = 1000\npoll_interval_ms = 50\nbatch_rows = 40";
    let mut first = relay_config_with(&db, &broker, kafka, poll);
    first.run(&first.config_path());
    let mut expected = insert_interleaved(&db, &["warm-up"], 1).await;
    wait_all_published(&db, &[&first]).await;
    broker.stop();
    // One transaction, so that one claim takes all 30 rows (3 MB, three times the in-flight budget).
    let mut conn = db.conn().await;
    let mut tx = conn.start_transaction(mysql_async::TxOpts::default()).await.unwrap();
    let mut ids = Vec::new();
    for _ in 0..30 {
        let row = OutboxRow::new("A").payload(serde_json::json!({ "blob": "x".repeat(100_000) }));
        insert_event(&mut tx, &row).await.unwrap();
        ids.push(row.id);
    }
    tx.commit().await.unwrap();
    expected.per_aggregate.insert("A".into(), ids);
    // The first relay claims the batch and waits for budget; the second must find nothing to take over.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = holders(&db).await;
    assert_eq!(before.len(), 1, "the first relay holds the batch: {before:?}\n{}", first.logs());
    let mut second = relay_config_with(&db, &broker, kafka, poll);
    second.run(&second.config_path());
    tokio::time::sleep(Duration::from_secs(4)).await;
    let after = holders(&db).await;
    assert_eq!(after, before, "the batch changed hands while the broker was away");
    broker.start_again();
    wait_all_published(&db, &[&first, &second]).await;
    let records = broker.read_all(TOPIC, expected.len(), CATCH_UP);
    let report = audit(&expected, &records);
    assert!(report.is_clean() && report.duplicates == 0, "{}", report.summary());
    assert!(first.is_running() && second.is_running(), "{}\n{}", first.logs(), second.logs());
}

/// A poison row (invalid headers) and a row that failed `max_attempts` deliveries go to the dead-letter
/// topic and hold their aggregates (the rows behind them stay unpublished, or follow them to the
/// dead-letter topic when claimed in the same batch), while other aggregates flow;
/// `quarantine list` shows the holds. `prune` deletes published rows by `published_at` only: never an
/// unpublished one, never one of a held aggregate. `quarantine release` lets the held aggregate flow again,
/// in order. The audit finds missing exactly the dead-lettered events that were not republished, and
/// nothing out of order.
#[tokio::test(flavor = "multi_thread")]
async fn poison_rows_hold_their_aggregate_until_release_and_prune_goes_by_published_at() {
    let db = MariaDb::start();
    create_relay_user(&db);
    db.sql("CREATE USER 'pruner'@'127.0.0.1' IDENTIFIED BY 'p'; GRANT SELECT, DELETE ON shop.outbox_events TO 'pruner'@'127.0.0.1';");
    let broker = Broker::start(Engine::Memory);
    let mut conn = db.conn().await;
    let mut ids = std::collections::HashMap::new();
    for (name, aggregate, headers) in [
        ("a1", "A", None),
        ("a2", "A", Some(serde_json::json!([1, 2]))),
        ("a3", "A", None),
        ("b1", "B", None),
        ("c1", "C", None),
        ("c2", "C", None),
        ("b2", "B", None),
    ] {
        let row = OutboxRow::new(aggregate).headers(headers);
        insert_event(&mut conn, &row).await.unwrap();
        ids.insert(name, row.id);
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    conn.exec_drop("UPDATE outbox_events SET attempts = 3, last_error = 'broker said no' WHERE id = ?", (&ids["c1"],))
        .await
        .unwrap();
    let relay = relay(&db, &broker, "poll_interval_ms = 50\nmax_attempts = 3");
    // One claim took every row: the poison rows' followers in the batch follow them to the dead-letter
    // topic (as with the binlog source); all four are parked there, holding A and C.
    let dead = broker.read_all(DLQ, 4, CATCH_UP);
    let dead: Vec<(&str, &str)> = dead
        .iter()
        .map(|r| (r.header_str("id").unwrap_or("?"), r.header_str("dead_letter_kind").unwrap_or("?")))
        .collect();
    let mut want: Vec<(&str, &str)> = vec![
        (&ids["a2"], "invalid_headers"),
        (&ids["a3"], "quarantined"),
        (&ids["c1"], "rejected_by_broker"),
        (&ids["c2"], "quarantined"),
    ];
    let mut got = dead.clone();
    got.sort();
    want.sort();
    assert_eq!(got, want, "{}", relay.logs());
    let a_order: Vec<&str> = dead.iter().map(|(id, _)| *id).filter(|id| *id == ids["a2"] || *id == ids["a3"]).collect();
    assert_eq!(a_order, [ids["a2"].as_str(), ids["a3"].as_str()]);
    let normal = broker.read_all(TOPIC, 3, CATCH_UP);
    let expected =
        Expected::from_orders([("A", vec![ids["a1"].clone()]), ("B", vec![ids["b1"].clone(), ids["b2"].clone()])]);
    let report = audit(&expected, &normal);
    assert!(report.is_clean() && normal.len() == 3, "{}\n{:?}", report.summary(), normal.len());
    // A row written behind a parked one waits, however often the relay polls.
    let a4 = OutboxRow::new("A");
    insert_event(&mut conn, &a4).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let unpublished: Vec<String> =
        conn.query("SELECT id FROM outbox_events WHERE published_at IS NULL ORDER BY id").await.unwrap();
    let mut want = vec![ids["a2"].clone(), ids["a3"].clone(), ids["c1"].clone(), ids["c2"].clone(), a4.id.clone()];
    want.sort();
    assert_eq!(unpublished, want);
    let parked: Vec<(String, String)> =
        conn.query("SELECT id, last_error FROM outbox_events WHERE next_attempt_at > '9999-01-01'").await.unwrap();
    assert_eq!(parked.len(), 4, "{parked:?}");
    assert!(parked.iter().all(|(_, e)| e.starts_with("dead-lettered: ")), "{parked:?}");
    let (status, stdout, stderr) = relay.command(&["quarantine", "list", "--json"], Duration::from_secs(30)).unwrap();
    assert!(status.success(), "{stdout}\n{stderr}");
    let holds: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let mut held: Vec<&str> = holds.as_array().unwrap().iter().filter_map(|h| h["aggregate_id"].as_str()).collect();
    held.sort();
    assert_eq!(held, ["A", "C"], "{stdout}");
    // `status` asks the table (the relay keeps no position): a4 is due but waits behind A's parked rows.
    let (status, stdout, stderr) = relay.command(&["status", "--json"], Duration::from_secs(30)).unwrap();
    assert!(status.success(), "{stdout}\n{stderr}");
    let shown: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let table = &shown["tables"][0];
    assert_eq!(
        (shown["source"].as_str(), table["table"].as_str(), table["due_rows"].as_u64(), table["parked_rows"].as_u64()),
        (Some("poll"), Some("shop.outbox_events"), Some(1), Some(4)),
        "{stdout}"
    );
    assert_eq!(shown["holds"].as_array().map(Vec::len), Some(2), "{stdout}");
    let (status, stdout, _) = relay.command(&["status"], Duration::from_secs(30)).unwrap();
    for line in ["shop.outbox_events: 1 row(s) due, the oldest due", "; 4 parked", "2 aggregate(s) held"] {
        assert!(status.success() && stdout.contains(line), "{line} not in:\n{stdout}");
    }

    // Prune: every row "published" two days ago, then one day's retention.
    conn.query_drop(
        "UPDATE outbox_events SET published_at = UTC_TIMESTAMP(6) - INTERVAL 2 DAY WHERE published_at IS NOT NULL",
    )
    .await
    .unwrap();
    let config = std::fs::read_to_string(relay.config_path()).unwrap();
    std::fs::write(
        relay.config_path(),
        format!("{config}\n[prune]\nuser = \"pruner\"\npassword = \"p\"\npause_ms = 0\nbatch_rows = 1\n"),
    )
    .unwrap();
    let (status, stdout, stderr) =
        relay.command(&["prune", "--older-than", "1d"], Duration::from_secs(60)).expect("prune runs");
    assert!(status.success(), "{stdout}\n{stderr}");
    // b1, b2 deleted; a1 kept (A is held), the unpublished four kept.
    assert!(stdout.contains("deleted 2 row(s) with published_at <"), "{stdout}");
    let left: Vec<String> = conn.query("SELECT id FROM outbox_events ORDER BY id").await.unwrap();
    let mut want = vec![
        ids["a1"].clone(),
        ids["a2"].clone(),
        ids["a3"].clone(),
        ids["c1"].clone(),
        ids["c2"].clone(),
        a4.id.clone(),
    ];
    want.sort();
    assert_eq!(left, want);

    // Release A (its poison row skipped): the held a3 is republished, the parked rows are marked
    // published, and a4, which waited behind them, follows in order.
    let mut relay = relay;
    assert!(relay.terminate().success(), "{}", relay.logs());
    let (status, stdout, stderr) = relay
        .command(&["quarantine", "release", "order", "A", "--skip-poison"], Duration::from_secs(60))
        .expect("release runs");
    assert!(status.success(), "{stdout}\n{stderr}");
    relay.restart();
    let normal = broker.read_all(TOPIC, 5, CATCH_UP);
    let a: Vec<&str> = normal.iter().filter(|r| r.key_str() == Some("A")).filter_map(|r| r.header_str("id")).collect();
    assert_eq!(a, [ids["a1"].as_str(), ids["a3"].as_str(), a4.id.as_str()], "{}", relay.logs());
    wait_all_published(&db, &[&relay]).await;
    assert_eq!(count(&db, "published_at IS NULL").await, 2, "C stays held");

    // The audit: what is missing from the topic is exactly what went to the dead-letter topic and was not
    // republished (a2 skipped, C held), nothing is out of order; without those rows, it passes.
    let run = relay.audit(&[]);
    assert_eq!(run.code, Some(1), "{}\n{}", run.report, run.stderr);
    let mut missing: Vec<&str> =
        run.report["missing_ids"].as_array().unwrap().iter().filter_map(|id| id.as_str()).collect();
    missing.sort();
    let mut dead_lettered = vec![ids["a2"].as_str(), ids["c1"].as_str(), ids["c2"].as_str()];
    dead_lettered.sort();
    assert_eq!((missing, run.count("order_violations")), (dead_lettered.clone(), 0), "{}", run.report);
    let others = format!("id NOT IN ('{}')", dead_lettered.join("', '"));
    let run = relay.audit(&["--where", &others]);
    assert_eq!(run.code, Some(0), "audit failed: {}\n{}", run.report, run.stderr);
    assert_eq!((run.count("missing"), run.count("order_violations")), (0, 0), "{}", run.report);
    let of = |names: &[&str]| names.iter().map(|n| ids[n].clone()).collect::<Vec<String>>();
    let mut a = of(&["a1", "a2", "a3"]);
    a.push(a4.id.clone());
    let written = common::reliability::written_from(Expected::from_orders([
        ("A", a),
        ("B", of(&["b1", "b2"])),
        ("C", of(&["c1", "c2"])),
    ]));
    let note = "one relay, max_attempts 3: an invalid-headers row and a row past max_attempts dead-lettered and \
                parked (their aggregates held), prune by published_at, release of one hold; audited without the 3 \
                dead-lettered rows not republished (the full audit reports exactly those missing)";
    common::reliability::record("polling relay: poison rows", &written, &run, None, note);
}
