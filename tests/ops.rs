//! Operations against a real MariaDB and a real Kafka-protocol broker: controlled replay (separate topic,
//! header, rate limit, checkpoint untouched) and safe cleanup (prune deletes only rows whose events the
//! checkpoint proves delivered, also while the connector is stopped with an old checkpoint).

mod common;

use std::collections::{BTreeSet, HashMap};
use std::ffi::OsString;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{insert_event, Broker, Connector, Engine, Expected, MariaDb, OutboxRow, Received};
use mysql_async::prelude::Queryable;
use outbox_cdc::config::Config;
use outbox_cdc::error::Class;
use outbox_cdc::ops::prune::{self, PruneOptions};
use outbox_cdc::ops::replay::{self, ReplayOptions};

const TOPIC: &str = "outbox.event.order";
const READ_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a CLI run of `replay`/`prune` may take before the test fails.
const CLI_TIMEOUT: Duration = Duration::from_secs(120);
/// Reading a topic that must not grow: wait this long for records that should not come.
const QUIET: Duration = Duration::from_secs(3);

/// The `[prune]` section used by the prune tests: a dedicated user with DELETE, small batches.
const PRUNE_TOML: &str = "\n[prune]\nuser = \"pruner\"\npassword = \"prune-pw\"\nbatch_rows = 3\npause_ms = 10\n";

fn load(config: &Path) -> Config {
    Config::load(config).unwrap_or_else(|e| panic!("{e}"))
}

/// A `DATETIME(6)` literal `days` days before the server's UTC now.
fn days_ago(db: &MariaDb, days: u32) -> String {
    db.sql(&format!("SELECT DATE_FORMAT(UTC_TIMESTAMP(6) - INTERVAL {days} DAY, '%Y-%m-%d %H:%i:%s.%f')"))
        .trim()
        .to_owned()
}

/// Inserts rows for `aggregates`, `per_aggregate` each, round robin, with `occurred_at` = `base` plus one
/// microsecond per row (so that `occurred_at` order is commit order); returns the expectation (ids per
/// aggregate in commit order).
async fn insert_rows(
    conn: &mut mysql_async::Conn,
    aggregate_type: &str,
    aggregates: &[&str],
    per_aggregate: usize,
    base: &str,
) -> Expected {
    let mut orders: Vec<(String, Vec<String>)> = aggregates.iter().map(|a| (a.to_string(), Vec::new())).collect();
    let mut n: u64 = 0;
    for _ in 0..per_aggregate {
        for (aggregate, ids) in orders.iter_mut() {
            let occurred_at: Option<String> = conn
                .exec_first(
                    "SELECT DATE_FORMAT(CAST(? AS DATETIME(6)) + INTERVAL ? MICROSECOND, '%Y-%m-%d %H:%i:%s.%f')",
                    (base, n),
                )
                .await
                .expect("occurred_at");
            n += 1;
            let row =
                OutboxRow::new(aggregate.clone()).aggregate_type(aggregate_type).occurred_at(occurred_at.unwrap());
            insert_event(conn, &row).await.expect("insert");
            ids.push(row.id);
        }
    }
    Expected::from_orders(orders)
}

fn ids_of(expected: &Expected) -> BTreeSet<String> {
    expected.per_aggregate.values().flatten().cloned().collect()
}

fn merge(mut a: Expected, b: &Expected) -> Expected {
    for (aggregate, ids) in &b.per_aggregate {
        a.per_aggregate.entry(aggregate.clone()).or_default().extend(ids.iter().cloned());
    }
    a
}

async fn ids_in_table(conn: &mut mysql_async::Conn) -> BTreeSet<String> {
    conn.query::<String, _>("SELECT id FROM shop.outbox_events").await.expect("select ids").into_iter().collect()
}

/// Waits until the stored checkpoint is at the server's current GTID position.
fn wait_checkpoint_caught_up(db: &MariaDb, connector: &Connector) {
    let target = db.gtid_binlog_pos();
    let caught_up = common::wait_until(READ_TIMEOUT, || {
        connector.status_json().is_some_and(|c| c["position"]["gtids"].as_str() == Some(target.as_str()))
    });
    assert!(caught_up, "checkpoint never reached {target}: {:?}\n{}", connector.status_json(), connector.logs());
}

/// Runs the binary with `args` to completion; returns (exit code, stdout, stderr).
fn run_cli(args: &[&str]) -> (Option<i32>, String, String) {
    let mut cli = Connector::new();
    cli.spawn(args.iter().map(OsString::from));
    let status = cli.wait_exit(CLI_TIMEOUT).unwrap_or_else(|| panic!("{args:?} did not finish:\n{}", cli.logs()));
    (status.code(), cli.stdout(), cli.stderr())
}

fn state_file_bytes(connector: &Connector) -> Vec<u8> {
    std::fs::read(connector.state_dir().join("outbox-cdc.redb")).expect("read the state file")
}

/// Replay of an `occurred_at` window and one aggregate type goes to `<topic>.replay` with the `replay`
/// header, the live record's key, value and id, per-aggregate order; the live topic gains nothing; a
/// replay through the CLI with `--topic` leaves the stopped connector's state file byte for byte as it was.
#[tokio::test(flavor = "multi_thread")]
async fn replay_republishes_a_window_to_a_separate_topic() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let mut conn = db.conn().await;
    let mut connector = Connector::start(&db, &broker, "");

    let window = insert_rows(&mut conn, "order", &["A-1", "A-2"], 3, "2026-01-15 10:00:00.000001").await;
    let before = insert_rows(&mut conn, "order", &["A-1"], 2, "2025-12-31 23:59:59.999998").await;
    let after = insert_rows(&mut conn, "order", &["A-2"], 2, "2026-02-01 00:00:00").await;
    insert_rows(&mut conn, "customer", &["C-1"], 2, "2026-01-15 10:00:00").await;
    let live_expected = merge(merge(window.clone(), &before), &after);
    let (live, _) = common::read_and_audit(&broker, TOPIC, &live_expected, READ_TIMEOUT, &connector);
    broker.read_all("outbox.event.customer", 2, READ_TIMEOUT);

    // While the connector runs: the library call a scheduler would make.
    let config = load(&connector.config_path());
    let options = ReplayOptions {
        since: Some("2026-01-01".into()),
        until: Some("2026-02-01 00:00:00".into()),
        aggregate_type: Some("order".into()),
        rate_per_sec: 1_000,
        ..ReplayOptions::default()
    };
    let report = replay::replay(&config, &options).await.unwrap_or_else(|e| panic!("replay: {e}"));
    assert_eq!(report.rows, 6);
    assert_eq!(report.topics.iter().map(String::as_str).collect::<Vec<_>>(), ["outbox.event.order.replay"]);

    let replayed = broker.read_all("outbox.event.order.replay", window.len(), READ_TIMEOUT);
    let audit = common::audit(&window, &replayed);
    assert!(audit.is_clean() && audit.duplicates == 0, "{}", audit.summary());
    let live_by_id: HashMap<&str, &Received> = live.iter().map(|r| (r.header_str("id").unwrap(), r)).collect();
    for r in &replayed {
        let id = r.header_str("id").expect("id header");
        let original = live_by_id[id];
        assert_eq!((r.key.as_ref(), r.value.as_ref()), (original.key.as_ref(), original.value.as_ref()), "{id}");
        assert_eq!(r.header_str("replay"), Some("true"));
        assert!(r.header_str("replayed_at").is_some_and(|t| t.ends_with('Z') && t.contains('T')), "{r:?}");
        assert_eq!(r.header("source"), None, "replays are not snapshot records");
        for name in ["event_type", "aggregate_type", "schema_version"] {
            assert_eq!(r.header(name), original.header(name), "{name}");
        }
    }
    assert!(broker.read_all("outbox.event.customer.replay", 1, QUIET).is_empty(), "filtered by aggregate type");

    // Stopped connector: its state file must not change, whatever the replay does.
    assert!(connector.terminate().success(), "{}", connector.logs());
    let state_before = state_file_bytes(&connector);
    let config_path = connector.config_path();
    let (code, stdout, stderr) = run_cli(&[
        "replay",
        "--config",
        config_path.to_str().unwrap(),
        "--aggregate-id",
        "A-2",
        "--topic",
        "custom.replay",
        "--rate",
        "500",
    ]);
    assert_eq!(code, Some(0), "stdout: {stdout}\nstderr: {stderr}");
    assert!(stdout.contains("replayed 5 record(s)"), "{stdout}");
    let a2: Vec<String> = window.per_aggregate["A-2"].iter().chain(&after.per_aggregate["A-2"]).cloned().collect();
    let custom = broker.read_all("custom.replay", a2.len(), READ_TIMEOUT);
    let audit = common::audit(&Expected::from_orders([("A-2", a2)]), &custom);
    assert!(audit.is_clean() && audit.duplicates == 0, "{}", audit.summary());
    assert_eq!(state_file_bytes(&connector), state_before, "replay must not touch the checkpoint store");
    let live_now = broker.read_all(TOPIC, live_expected.len() + 1, QUIET);
    assert_eq!(live_now.len(), live_expected.len(), "replay must not write to the live topic");
}

/// 600 rows at 200 records/s take about 3 s: not less than 0.8x that (the limit is honoured), and not
/// absurdly more (the limiter does not stall). Generous bounds: this is a rate, not a benchmark.
#[tokio::test(flavor = "multi_thread")]
async fn replay_rate_limit_is_honoured() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let mut conn = db.conn().await;
    let rows = insert_rows(&mut conn, "order", &["R-1", "R-2", "R-3"], 200, "2026-01-15 10:00:00").await;
    let work = Connector::new();
    let config = load(&work.write_config(&db, &broker, ""));
    // Create the topic first, so the timed run measures producing, not the broker's topic creation.
    broker.create_topic("outbox.event.order.replay", 12);

    let rate = 200;
    let started = Instant::now();
    let report = replay::replay(&config, &ReplayOptions { rate_per_sec: rate, ..ReplayOptions::default() })
        .await
        .unwrap_or_else(|e| panic!("replay: {e}"));
    let elapsed = started.elapsed().as_secs_f64();
    eprintln!("replayed {} records at --rate {rate} in {elapsed:.2} s", report.rows);
    assert_eq!(report.rows, 600);
    // Record n goes at n / rate: the last of 600 at 599 / 200 s.
    let expected = 599.0 / f64::from(rate);
    assert!(elapsed >= 0.8 * expected, "600 records at {rate}/s took only {elapsed:.2} s (expected ~{expected:.2} s)");
    assert!(elapsed <= 4.0 * expected, "600 records at {rate}/s took {elapsed:.2} s (expected ~{expected:.2} s)");
    let replayed = broker.read_all("outbox.event.order.replay", rows.len(), READ_TIMEOUT);
    let audit = common::audit(&rows, &replayed);
    assert!(audit.is_clean() && audit.duplicates == 0, "{}", audit.summary());
}

/// Creates the `pruner` user of [`PRUNE_TOML`]; the replication user `cdc` keeps SELECT only.
fn create_pruner(db: &MariaDb) {
    db.sql(
        "CREATE USER 'pruner'@'127.0.0.1' IDENTIFIED BY 'prune-pw'; \
         GRANT SELECT, DELETE ON shop.outbox_events TO 'pruner'@'127.0.0.1'",
    );
}

/// With the connector running and caught up: rows older than the window are deleted in batches (with the
/// `[prune]` user), newer ones stay, and every deleted row's event is in Kafka. Before the connector ever
/// checkpointed, prune refuses (definite) and deletes nothing.
#[tokio::test(flavor = "multi_thread")]
async fn prune_deletes_old_checkpointed_rows_and_keeps_new_ones() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    create_pruner(&db);
    let mut conn = db.conn().await;
    let old = insert_rows(&mut conn, "order", &["P-1", "P-2"], 4, &days_ago(&db, 10)).await;
    let young = insert_rows(&mut conn, "order", &["P-1", "P-3"], 2, &days_ago(&db, 6)).await;

    let mut connector = Connector::new();
    let config = load(&connector.write_config(&db, &broker, PRUNE_TOML));
    let options = PruneOptions { older_than: Duration::from_secs(7 * 86_400), wait: Duration::ZERO, dry_run: false };
    let error = prune::prune(&config, &options).await.expect_err("no checkpoint yet");
    assert_eq!(error.class(), Class::Definite, "{error}");
    assert!(error.to_string().contains("no checkpoint"), "{error}");
    assert_eq!(ids_in_table(&mut conn).await.len(), old.len() + young.len());

    connector.run(&connector.config_path());
    let all = merge(old.clone(), &young);
    common::read_and_audit(&broker, TOPIC, &all, READ_TIMEOUT, &connector);

    let dry = prune::prune(&config, &PruneOptions { dry_run: true, wait: READ_TIMEOUT, ..options.clone() })
        .await
        .unwrap_or_else(|e| panic!("dry run: {e}\n{}", connector.logs()));
    assert_eq!(dry.rows_deleted, old.len() as u64);
    assert_eq!(ids_in_table(&mut conn).await.len(), all.len(), "a dry run deletes nothing");

    let report = prune::prune(&config, &PruneOptions { wait: READ_TIMEOUT, ..options })
        .await
        .unwrap_or_else(|e| panic!("prune: {e}\n{}", connector.logs()));
    assert_eq!(report.rows_deleted, old.len() as u64);
    assert_eq!(report.batches, old.len().div_ceil(3) as u64, "batches of prune.batch_rows = 3");
    assert_eq!(ids_in_table(&mut conn).await, ids_of(&young), "exactly the old rows are gone");

    // The connector reads prune's DELETEs from the binlog and ignores them.
    let more = insert_rows(&mut conn, "order", &["P-1"], 1, &days_ago(&db, 0)).await;
    common::read_and_audit(&broker, TOPIC, &merge(all, &more), READ_TIMEOUT, &connector);
    assert!(connector.is_running(), "{}", connector.logs());
    connector.terminate();
}

/// Regression guard for the one way prune could lose events: rows written while the connector is stopped,
/// with `occurred_at` values that make them "old", are not yet in Kafka. Prune must delete nothing (not
/// even the old rows the checkpoint does cover: it cannot tell them apart in one view) and say why; once
/// the connector has caught up, prune deletes them, and every deleted row's event is in Kafka.
#[tokio::test(flavor = "multi_thread")]
async fn prune_never_deletes_rows_behind_a_stopped_connectors_checkpoint() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    create_pruner(&db);
    let mut conn = db.conn().await;
    let mut connector = Connector::start(&db, &broker, PRUNE_TOML);
    let delivered = insert_rows(&mut conn, "order", &["S-1", "S-2"], 3, &days_ago(&db, 9)).await;
    common::read_and_audit(&broker, TOPIC, &delivered, READ_TIMEOUT, &connector);
    wait_checkpoint_caught_up(&db, &connector);
    assert!(connector.terminate().success(), "{}", connector.logs());

    // Written after the stop (young), then made old: the classic "old but unpublished" rows.
    let unpublished = insert_rows(&mut conn, "order", &["S-2", "S-3"], 3, &days_ago(&db, 0)).await;
    for id in ids_of(&unpublished) {
        conn.exec_drop("UPDATE shop.outbox_events SET occurred_at = occurred_at - INTERVAL 30 DAY WHERE id = ?", (id,))
            .await
            .unwrap();
    }
    let everything = ids_of(&merge(delivered.clone(), &unpublished));
    assert_eq!(ids_in_table(&mut conn).await, everything);

    let config_path = connector.config_path();
    let config = load(&config_path);
    let options =
        PruneOptions { older_than: Duration::from_secs(7 * 86_400), wait: Duration::from_secs(1), dry_run: false };
    let error = prune::prune(&config, &options).await.expect_err("the checkpoint is behind");
    assert_eq!(error.class(), Class::Transient, "{error}");
    assert!(error.to_string().contains("is behind the server's position"), "{error}");
    assert_eq!(ids_in_table(&mut conn).await, everything, "nothing deleted");
    let (code, stdout, stderr) =
        run_cli(&["prune", "--config", config_path.to_str().unwrap(), "--older-than", "7d", "--wait", "1s"]);
    assert_eq!(code, Some(3), "exit code of a transient refusal\nstdout: {stdout}\nstderr: {stderr}");
    assert!(stderr.contains("prune deleted nothing") && stderr.contains("Start the connector"), "{stderr}");
    assert_eq!(ids_in_table(&mut conn).await, everything, "nothing deleted by the CLI either");

    connector.restart();
    let all = merge(delivered, &unpublished);
    let (records, _) = common::read_and_audit(&broker, TOPIC, &all, READ_TIMEOUT, &connector);
    let (code, stdout, stderr) =
        run_cli(&["prune", "--config", config_path.to_str().unwrap(), "--older-than", "7d", "--wait", "120s"]);
    assert_eq!(code, Some(0), "stdout: {stdout}\nstderr: {stderr}\n{}", connector.logs());
    assert!(stdout.contains(&format!("deleted {} row(s)", everything.len())), "{stdout}");
    assert!(ids_in_table(&mut conn).await.is_empty());
    let in_kafka: BTreeSet<String> = records.iter().filter_map(|r| r.header_str("id").map(str::to_owned)).collect();
    assert!(everything.is_subset(&in_kafka), "a deleted row's event is missing from Kafka");
    connector.terminate();
}

/// `--version` names the commit the binary was built from (what a bug report needs), as the
/// `outbox_cdc_build_info` gauge does.
#[test]
fn version_names_the_commit() {
    let (code, stdout, stderr) = run_cli(&["--version"]);
    assert_eq!(code, Some(0), "{stderr}");
    let commit = outbox_cdc::metrics::COMMIT;
    // The harness heads each start's output with a line of its own.
    let printed = stdout.lines().filter(|l| !l.starts_with("=== harness")).collect::<Vec<_>>().join("\n");
    assert_eq!(printed, format!("outbox-cdc {} ({commit})", env!("CARGO_PKG_VERSION")), "{stderr}");
}
