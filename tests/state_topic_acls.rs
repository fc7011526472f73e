//! What the readers of the state and dead-letter topics do when the cluster is not as the connector would
//! make it (issue 46): a state topic with more than one partition, a principal with only the ACLs it needs,
//! records deleted under a reader, configs it may not describe.
//!
//! Every test here runs against librdkafka's mock cluster (`rdkafka::mocking::MockCluster`), in process: it
//! fails chosen requests with chosen error codes, which is how an ACL refusal or a deleted segment looks to
//! the client. Tansu has no ACLs and no transactions, and noida-db cannot be told to refuse a request. The
//! mock cluster has no DescribeConfigs (nor CreateTopics): its topics are created through its own API, and
//! every DescribeConfigs fails, as a denied one does.

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use outbox_cdc::checkpoint::kafka::KafkaStore;
use outbox_cdc::config::Config;
use outbox_cdc::error::{Denied, Kind};
use outbox_cdc::kafka::commit::Deadline;
use outbox_cdc::kafka::identity::Context;
use outbox_cdc::kafka::read::{Starts, ToEnd, Until};
use rdkafka::config::ClientConfig;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, DefaultProducerContext, Producer};
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

const STATE_TOPIC: &str = "outbox-cdc.state";
const TIMEOUT: Duration = Duration::from_secs(30);

/// A checkpoint record as the connector writes it (tests/fixtures/state), at GTID position `0-1-42,1-2-7`.
const CHECKPOINT: &str = include_str!("fixtures/state/mariadb-stream/checkpoint.json");

/// The log lines of every test in this binary, for the tests that assert a warning.
fn logs() -> Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Arc::new(Mutex::new(Vec::new()));
        let sink = logs.clone();
        let _ = tracing_subscriber::fmt()
            .with_env_filter("info")
            .with_ansi(false)
            .with_writer(move || Tee(sink.clone()))
            .try_init();
        logs
    })
    .clone()
}

/// Writes to the shared log buffer and to stderr (shown for a failing test).
struct Tee(Arc<Mutex<Vec<u8>>>);

impl Write for Tee {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        std::io::stderr().write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A mock cluster with the state topic on `partitions` partitions.
fn cluster(partitions: i32) -> MockCluster<'static, DefaultProducerContext> {
    logs();
    let cluster = MockCluster::new(1).expect("mock cluster");
    cluster.create_topic(STATE_TOPIC, partitions, 1).expect("create the state topic");
    cluster
}

/// Connector `x`'s config with the Kafka state backend on `bootstrap` (the source is never contacted).
fn config(bootstrap: &str) -> Config {
    Config::parse(&format!(
        "[source]\nhost = \"127.0.0.1\"\nuser = \"u\"\npassword = \"p\"\nserver_id = 7\n\
         [outbox]\ntable = \"shop.outbox_events\"\n\
         [kafka]\nbootstrap_servers = \"{bootstrap}\"\ncreate_topics = false\n\
         [state]\nbackend = \"kafka\"\nname = \"x\"\n"
    ))
    .expect("a valid config")
}

/// Writes `key` = `value` (`None`: a tombstone) to `partition` of `topic`, as another client would.
fn write(bootstrap: &str, topic: &str, partition: i32, key: &str, value: Option<&str>) {
    let producer: BaseProducer = ClientConfig::new().set("bootstrap.servers", bootstrap).create().expect("a producer");
    let mut record = BaseRecord::<str, str>::to(topic).key(key).partition(partition);
    if let Some(value) = value {
        record = record.payload(value);
    }
    producer.send(record).map_err(|(e, _)| e).expect("send");
    producer.flush(TIMEOUT).expect("flush");
}

/// The checkpoint fixture at MariaDB GTID position `gtids`.
fn checkpoint(gtids: &str) -> String {
    CHECKPOINT.replacen("\"gtids\":\"0-1-42,1-2-7\"", &format!("\"gtids\":\"{gtids}\""), 1)
}

/// A reader's settings as the connector's readers have them: a `group.id` (librdkafka's condition for
/// `assign()`), read_committed.
fn reader_config(bootstrap: &str) -> ClientConfig {
    let mut cc = ClientConfig::new();
    cc.set("bootstrap.servers", bootstrap)
        .set("group.id", "outbox-cdc-quarantine-release")
        .set("isolation.level", "read_committed")
        .set("fetch.wait.max.ms", "10");
    cc
}

/// Reads `topic` to its end; returns the values read.
fn read_to_end(bootstrap: &str, topic: &str) -> outbox_cdc::error::Result<Vec<String>> {
    let until = Until { quiet: Duration::ZERO, stall: TIMEOUT };
    let topics = [topic.to_string()];
    let mut reader =
        ToEnd::start(&reader_config(bootstrap), Context::default(), &topics, &Starts::new(), until, topic)?
            .if_lost("the test's advice");
    let mut values = Vec::new();
    while let Some(message) = reader.next_record()? {
        use rdkafka::message::Message;
        values.push(String::from_utf8_lossy(message.payload().unwrap_or_default()).into_owned());
    }
    Ok(values)
}

/// Guards against a state topic with more than one partition being taken (issue 46, finding 1): its
/// records are replayed in arrival order across partitions, so an old checkpoint or a released hold could
/// come back. `open` (`run`, `quarantine release`, `state copy --to kafka`) and `inspect` (`status`,
/// `quarantine list`) refuse it, saying how to move off it; `state copy --to local` reads it, merged per
/// key, keeping the newest checkpoint whichever partition it is in.
#[tokio::test(flavor = "multi_thread")]
async fn a_state_topic_of_three_partitions_is_refused_with_the_way_out() {
    let cluster = cluster(3);
    let bootstrap = cluster.bootstrap_servers();
    // Written before and after partitions were added: the newer checkpoint landed in another partition.
    write(&bootstrap, STATE_TOPIC, 0, "x/checkpoint", Some(&checkpoint("0-1-50")));
    write(&bootstrap, STATE_TOPIC, 2, "x/checkpoint", Some(&checkpoint("0-1-42")));
    let config = config(&bootstrap);

    let refused = KafkaStore::open(&config, &Deadline::default()).await.expect_err("open must refuse the topic");
    assert!(refused.is_definite(), "{refused}");
    for says in ["has 3 partitions; it must have exactly 1", "state copy --to local", "--partitions 1", "[state] topic"]
    {
        assert!(refused.to_string().contains(says), "must say {says:?}: {refused}");
    }
    let refused = KafkaStore::inspect(&config).await.expect_err("status must refuse the topic");
    assert!(refused.is_definite() && refused.to_string().contains("has 3 partitions"), "{refused}");

    let merged = KafkaStore::inspect_merging_partitions(&config).await.expect("state copy reads it").expect("state");
    let position = merged.checkpoint.expect("a checkpoint").position().to_string();
    assert!(position.contains("0-1-50"), "the newest checkpoint, not the last one read: {position}");
}

/// Guards against an ACL-less consumer group stopping every read (issue 46, finding 2): librdkafka looks up
/// the coordinator of a reader's `group.id` even though the reader only `assign()`s; with the lookup
/// refused (GROUP_AUTHORIZATION_FAILED, as for a principal without an ACL on the group) the dead-letter
/// reader and the state reader (`status`) still read everything.
#[tokio::test(flavor = "multi_thread")]
async fn an_assign_only_reader_needs_no_acl_on_its_group() {
    let cluster = cluster(1);
    let bootstrap = cluster.bootstrap_servers();
    write(&bootstrap, STATE_TOPIC, 0, "x/checkpoint", Some(CHECKPOINT));
    write(&bootstrap, "dead-letters", 0, "k", Some("a"));
    write(&bootstrap, "dead-letters", 0, "k", Some("b"));
    cluster.request_errors(
        RDKafkaApiKey::FindCoordinator,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED; 100],
    );

    let values = tokio::task::spawn_blocking(move || read_to_end(&bootstrap, "dead-letters")).await.unwrap();
    assert_eq!(values.expect("the read completes without the group"), ["a", "b"]);
    let config = config(&cluster.bootstrap_servers());
    let state = KafkaStore::inspect(&config).await.expect("status reads without the group").expect("state");
    assert!(state.checkpoint.is_some());
}

/// Guards against a refused transactional id being retried for ever as if the broker were down (issue 46,
/// finding 2): the start fails as definite, naming the `kafka-acls` command for that id.
#[tokio::test(flavor = "multi_thread")]
async fn a_refused_transactional_id_is_definite_and_names_the_acl() {
    let cluster = cluster(1);
    cluster.request_errors(
        RDKafkaApiKey::InitProducerId,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_TRANSACTIONAL_ID_AUTHORIZATION_FAILED; 20],
    );
    let config = config(&cluster.bootstrap_servers());
    let refused = tokio::time::timeout(TIMEOUT * 2, KafkaStore::open(&config, &Deadline::default()))
        .await
        .expect("a refusal, not a wait")
        .expect_err("open must fail");
    assert!(refused.is_definite(), "{refused}");
    assert_eq!(refused.kind(), &Kind::AuthorizationDenied(Denied::TransactionalId), "{refused}");
    assert!(
        refused.to_string().contains("--operation Write --operation Describe --transactional-id x.state"),
        "{refused}"
    );
}

/// Guards against a topic the principal may not describe being taken for a missing one (issue 46, finding
/// 2): `status` said there was no state at all. It is a definite error naming the topic's ACL.
#[tokio::test(flavor = "multi_thread")]
async fn a_refused_state_topic_is_not_a_missing_one() {
    let cluster = cluster(1);
    write(&cluster.bootstrap_servers(), STATE_TOPIC, 0, "x/checkpoint", Some(CHECKPOINT));
    cluster
        .topic_error(STATE_TOPIC, RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED)
        .expect("topic error");
    let config = config(&cluster.bootstrap_servers());
    let refused = KafkaStore::inspect(&config).await.expect_err("status must fail");
    assert!(refused.is_definite(), "{refused}");
    assert_eq!(refused.kind(), &Kind::AuthorizationDenied(Denied::Topic), "{refused}");
    assert!(
        refused.to_string().contains("--operation Read --operation Describe --topic outbox-cdc.state"),
        "{refused}"
    );
}

/// Guards against a silent jump over deleted records (issue 46, finding 3): with librdkafka's default
/// `auto.offset.reset`, a reader whose next offset was deleted (retention, DeleteRecords) jumps to the end
/// and looks complete; a release would lift a hold whose tail it never read. Here the mock cluster's own
/// retention (about 5 MiB per partition) deletes the partition's first records before a read that starts
/// at offset 0: the read fails as definite, naming the partition and the offsets lost, with the caller's
/// advice.
#[tokio::test(flavor = "multi_thread")]
async fn records_deleted_under_a_reader_stop_it() {
    let cluster = cluster(1);
    let bootstrap = cluster.bootstrap_servers();
    let big = "x".repeat(800_000);
    for _ in 0..8 {
        write(&bootstrap, "dead-letters", 0, "k", Some(&big));
    }
    let read = tokio::task::spawn_blocking(move || {
        let until = Until { quiet: Duration::ZERO, stall: TIMEOUT };
        let topics = ["dead-letters".to_string()];
        let starts: Starts = [(("dead-letters".to_string(), 0), 0)].into_iter().collect();
        let mut reader =
            ToEnd::start(&reader_config(&bootstrap), Context::default(), &topics, &starts, until, "dead-letters")?
                .if_lost("the test's advice");
        let mut records = 0;
        while reader.next_record()?.is_some() {
            records += 1;
        }
        Ok::<_, outbox_cdc::error::Error>(records)
    })
    .await
    .unwrap();
    let err = read.expect_err("the read must not jump over the deleted records");
    assert!(err.is_definite() && err.kind() == &Kind::RecordsDeleted, "{err}");
    for says in ["dead-letters/0 offsets 0 to", "the test's advice"] {
        assert!(err.to_string().contains(says), "must say {says:?}: {err}");
    }
}

/// Guards against a state topic whose cleanup.policy could not be read being taken silently (issue 46,
/// finding 3): a `delete`-policy topic would lose holds and an idle checkpoint after its retention. The
/// start goes on (managed clusters may deny DescribeConfigs) with a warning that names the missing ACL.
#[tokio::test(flavor = "multi_thread")]
async fn an_unreadable_state_topic_policy_is_warned_about_at_start() {
    let cluster = cluster(1);
    let config = config(&cluster.bootstrap_servers());
    let store = KafkaStore::open(&config, &Deadline::default()).await.expect("the start goes on");
    drop(store);
    let logs = String::from_utf8_lossy(&logs().lock().unwrap()).into_owned();
    assert!(logs.contains("cleanup.policy could not be verified"), "{logs}");
    assert!(logs.contains("--operation DescribeConfigs --topic outbox-cdc.state"), "{logs}");
}
