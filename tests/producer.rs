//! The producer's fatal errors, end to end: the connector runs in-process (`app::run`) against a real
//! MariaDB and librdkafka's mock cluster, which fails chosen produce requests deterministically. Each
//! scenario that delivers ends by auditing the partition against what was committed.

mod common;

use std::time::{Duration, Instant};

use common::connector::toml_str;
use common::mariadb::CDC_PASSWORD;
use common::{audit, insert_event, Expected, MariaDb, OutboxRow, Received};
use outbox_cdc::app::{self, RunOptions};
use outbox_cdc::config::Config;
use outbox_cdc::pipeline::Shutdown;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use rdkafka::{Offset, TopicPartitionList};

const TOPIC: &str = "outbox.event.order";
/// How long the connector may take to deliver the test's few events.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(120);

/// A connector config for `db` and the mock cluster at `bootstrap`, with quick restarts. The test's
/// events are one transaction, which a long `linger.ms` and one request in flight send as one batch: the
/// mock cluster does not check an idempotent producer's sequence numbers (only a transactional one's), so
/// a second request already built behind a failed one, which Kafka refuses, would be written.
fn config(db: &MariaDb, bootstrap: &str, state: &std::path::Path) -> Config {
    let text = format!(
        "[source]\nhost = \"127.0.0.1\"\nport = {port}\nuser = \"cdc\"\npassword = {password}\nserver_id = 4711\n\
         start_from = \"earliest\"\nreconnect_initial_backoff_ms = 100\nreconnect_max_backoff_ms = 500\n\
         [outbox]\ntable = \"shop.outbox_events\"\n\
         [kafka]\nbootstrap_servers = {bootstrap}\ncreate_topics = false\n\
         [kafka.properties]\n\"linger.ms\" = \"100\"\n\"max.in.flight\" = \"1\"\n\
         [state]\ndir = {state}\ncheckpoint_interval_ms = 100\n\
         [snapshot]\nmode = \"never\"\n\
         [metrics]\nenabled = false\n",
        port = db.port(),
        password = toml_str(CDC_PASSWORD),
        bootstrap = toml_str(bootstrap),
        state = toml_str(&state.to_string_lossy()),
    );
    Config::parse(&text).expect("test config")
}

/// A mock cluster with [`TOPIC`] on one partition.
fn cluster() -> MockCluster<'static, DefaultProducerContext> {
    // The connector's logs, shown for a failing test.
    let _ = tracing_subscriber::fmt().with_test_writer().with_env_filter("info").try_init();
    let cluster = MockCluster::new(1).expect("mock cluster");
    cluster.create_topic(TOPIC, 1, 1).expect("create topic");
    cluster
}

/// Commits `n` events of aggregate `A` in one transaction; returns their ids in commit order.
async fn commit_events(db: &MariaDb, n: usize) -> Vec<String> {
    let mut conn = db.conn().await;
    let mut tx = conn.start_transaction(mysql_async::TxOpts::default()).await.expect("begin");
    let mut ids = Vec::with_capacity(n);
    for _ in 0..n {
        let row = OutboxRow::new("A");
        insert_event(&mut tx, &row).await.expect("insert");
        ids.push(row.id);
    }
    tx.commit().await.expect("commit");
    ids
}

/// Everything in the partition, in offset order.
fn read_partition(bootstrap: &str) -> Vec<Received> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "producer-test")
        .set("enable.partition.eof", "true")
        .create()
        .expect("consumer");
    let mut assignment = TopicPartitionList::new();
    assignment.add_partition_offset(TOPIC, 0, Offset::Beginning).expect("assignment");
    consumer.assign(&assignment).expect("assign");
    let mut records = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => records.push(Received {
                topic: m.topic().to_string(),
                partition: m.partition(),
                offset: m.offset(),
                key: m.key().map(<[u8]>::to_vec),
                value: m.payload().map(<[u8]>::to_vec),
                headers: m
                    .headers()
                    .map(|h| h.iter().map(|h| (h.key.to_string(), h.value.unwrap_or_default().to_vec())).collect())
                    .unwrap_or_default(),
                timestamp: m.timestamp().to_millis(),
            }),
            Some(Err(KafkaError::PartitionEOF(_))) => return records,
            Some(Err(e)) => panic!("reading {TOPIC}: {e}"),
            None => {}
        }
    }
    panic!("no end of partition within 30 s")
}

/// Waits until the partition holds every id of `ids` at least once.
async fn wait_delivered(bootstrap: &str, ids: &[String], run: &tokio::task::JoinHandle<outbox_cdc::error::Result<()>>) {
    let deadline = Instant::now() + DELIVERY_TIMEOUT;
    loop {
        let records = read_partition(bootstrap);
        let delivered = ids.iter().all(|id| records.iter().any(|r| r.header_str("id") == Some(id.as_str())));
        if delivered {
            return;
        }
        assert!(!run.is_finished(), "the connector stopped before delivering everything");
        assert!(Instant::now() < deadline, "not delivered within {DELIVERY_TIMEOUT:?}: {} records", records.len());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Guards against exit 2 on a fatal idempotent-producer error (issue 16, item 12): OUT_OF_ORDER_SEQUENCE_NUMBER
/// at the head of the line makes librdkafka's producer fatal. The run restarts from the checkpoint with a
/// new producer (four times here), delivers everything in order and keeps running.
#[tokio::test(flavor = "multi_thread")]
async fn a_fatal_producer_error_restarts_with_a_new_producer() {
    let db = MariaDb::start();
    let cluster = cluster();
    let bootstrap = cluster.bootstrap_servers();
    let ids = commit_events(&db, 10).await;
    let fatal = RDKafkaRespErr::RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER;
    cluster.request_errors(RDKafkaApiKey::Produce, &[fatal; app::MAX_PRODUCER_FATAL_RUNS as usize - 1]);

    let state = tempfile::tempdir().expect("state dir");
    let (trigger, shutdown) = Shutdown::new();
    let run = tokio::spawn(app::run(config(&db, &bootstrap, state.path()), RunOptions::default(), shutdown));
    wait_delivered(&bootstrap, &ids, &run).await;
    assert!(!run.is_finished(), "the connector stopped");
    trigger.trigger();
    run.await.expect("run task").expect("graceful stop");

    let report = audit(&Expected::from_orders([("A", ids)]), &read_partition(&bootstrap));
    assert!(report.is_clean(), "{}", report.summary());
}

/// The bound of item 12: a producer that fails fatally in every run stops the connector with a definite
/// error after `MAX_PRODUCER_FATAL_RUNS` runs in a row, saying what to look for.
#[tokio::test(flavor = "multi_thread")]
async fn a_producer_that_keeps_failing_fatally_stops_the_connector() {
    let db = MariaDb::start();
    let cluster = cluster();
    let bootstrap = cluster.bootstrap_servers();
    commit_events(&db, 3).await;
    let fatal = RDKafkaRespErr::RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER;
    cluster.request_errors(RDKafkaApiKey::Produce, &[fatal; 100]);

    let state = tempfile::tempdir().expect("state dir");
    let (_trigger, shutdown) = Shutdown::new();
    let run = app::run(config(&db, &bootstrap, state.path()), RunOptions::default(), shutdown);
    let error = tokio::time::timeout(DELIVERY_TIMEOUT, run).await.expect("stops").expect_err("a definite error");
    assert!(error.is_definite(), "{error}");
    assert!(error.to_string().contains("failed fatally in 5 runs in a row"), "{error}");
}

/// Guards against a batch of valid records being refused as too large, and its first record quarantined
/// (issue 16, item 13): a routed topic whose `max.message.bytes` is below the producer's batches (here
/// 100000 against librdkafka's 1000000 `batch.size`) is a definite error before its first record is
/// produced, naming both limits and what to change. Against Tansu, which reports a topic's
/// `max.message.bytes` when it was set at creation (and nothing otherwise: the connector then logs that it
/// cannot check, and goes on).
#[tokio::test(flavor = "multi_thread")]
async fn a_topic_that_refuses_the_producers_batches_stops_the_connector_at_start() {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    let db = MariaDb::start();
    let broker = common::Broker::start(common::Engine::Memory);
    let admin: AdminClient<DefaultClientContext> = broker.client_config().create().expect("admin");
    let options = AdminOptions::new().request_timeout(Some(Duration::from_secs(10)));
    let topic = NewTopic::new(TOPIC, 1, TopicReplication::Fixed(1)).set("max.message.bytes", "100000");
    let created = admin.create_topics([&topic], &options).await.expect("create topic");
    assert!(created.iter().all(Result::is_ok), "{created:?}");
    commit_events(&db, 3).await;

    let mut connector = common::Connector::start(&db, &broker, "");
    let status = connector.wait_exit(DELIVERY_TIMEOUT).expect("the connector stops");
    let logs = connector.stderr();
    assert_eq!(status.code(), Some(2), "{logs}");
    assert!(logs.contains("max.message.bytes = 100000") && logs.contains("batch.size"), "{logs}");
    assert!(broker.read_all(TOPIC, 0, Duration::from_secs(2)).is_empty(), "nothing is produced");
    let holds = connector.status_json().map(|s| s["holds"].clone()).unwrap_or_default();
    assert!(holds.as_array().is_none_or(Vec::is_empty), "an aggregate was quarantined: {holds}");
}
