//! Smoke tests of noida-db's Kafka transactions (`Engine::Noida`), the broker of the exactly-once tests.
//!
//! Those tests are only as good as the broker's transactions: if a noida-db version hid fewer records,
//! fenced no zombie or kept a transaction open forever, an exactly-once test could pass on a broken
//! connector or hang on a correct one. Each test here pins one behaviour a real Kafka broker has and
//! the exactly-once tests rely on, with `rdkafka` (the client the connector uses), and fails if it
//! changes. The version itself is checked by the harness (`noida_db_path`).

mod common;

use common::{Broker, Engine, Isolation, Received};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};
use std::time::Duration;

/// How long a call or a read may take to get what it waits for (a loaded machine's noida-db is slow).
const TIMEOUT: Duration = Duration::from_secs(60);
/// Reads that must come back empty or short wait this long for records that must not appear.
const SHORT: Duration = Duration::from_secs(2);

fn transactional_producer(broker: &Broker, transactional_id: &str) -> ThreadedProducer<DefaultProducerContext> {
    let producer: ThreadedProducer<DefaultProducerContext> = broker
        .client_config()
        .set("transactional.id", transactional_id)
        .set("transaction.timeout.ms", "60000")
        .set("linger.ms", "0")
        .create()
        .expect("create transactional producer");
    producer.init_transactions(TIMEOUT).expect("init_transactions");
    producer
}

fn send(producer: &ThreadedProducer<DefaultProducerContext>, topic: &str, key: &str, value: &str) {
    producer.send(BaseRecord::to(topic).key(key).payload(value)).map_err(|(e, _)| e).expect("enqueue record");
}

fn values(records: &[Received]) -> Vec<String> {
    records.iter().map(|r| String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned()).collect()
}

/// Committed transactions are visible to read_committed, an aborted one is not (but is to
/// read_uncommitted), and records committed after the aborted ones are still read, in order, past them.
/// Guards against a broker that shows aborted records, or whose abort marker hides what follows.
#[test]
fn noida_commit_and_abort_read_committed_hides_only_aborted_records() {
    let broker = Broker::start(Engine::Noida);
    broker.create_topic("events", 1);
    broker.create_topic_with("state", 1, &[("cleanup.policy", "compact"), ("retention.ms", "-1")]);
    let producer = transactional_producer(&broker, "tx-commit-abort");

    producer.begin_transaction().unwrap();
    for v in ["c1", "c2", "c3"] {
        send(&producer, "events", "agg", v);
    }
    send(&producer, "state", "connector", "checkpoint-1");
    producer.commit_transaction(TIMEOUT).expect("commit the first transaction");

    producer.begin_transaction().unwrap();
    for v in ["a1", "a2"] {
        send(&producer, "events", "agg", v);
    }
    send(&producer, "state", "connector", "checkpoint-aborted");
    producer.flush(TIMEOUT).expect("flush the aborted transaction's records to the broker");
    producer.abort_transaction(TIMEOUT).expect("abort the second transaction");

    producer.begin_transaction().unwrap();
    for v in ["c4", "c5"] {
        send(&producer, "events", "agg", v);
    }
    send(&producer, "state", "connector", "checkpoint-2");
    producer.commit_transaction(TIMEOUT).expect("commit the third transaction");

    let committed = broker.read_committed("events", 5, TIMEOUT);
    assert_eq!(values(&committed), ["c1", "c2", "c3", "c4", "c5"], "read_committed of events: {committed:?}");
    let uncommitted = broker.read_uncommitted("events", 7, TIMEOUT);
    assert_eq!(values(&uncommitted), ["c1", "c2", "c3", "a1", "a2", "c4", "c5"], "read_uncommitted: {uncommitted:?}");
    // The aborted records really sit between the committed ones in the log: read_committed skipped them.
    let offset_of = |v: &str| uncommitted.iter().find(|r| r.value.as_deref() == Some(v.as_bytes())).unwrap().offset;
    assert!(offset_of("c3") < offset_of("a1") && offset_of("a2") < offset_of("c4"));

    let state = broker.read_committed("state", 2, TIMEOUT);
    assert_eq!(values(&state), ["checkpoint-1", "checkpoint-2"], "read_committed of the compacted topic");
    let state_all = broker.read_uncommitted("state", 3, TIMEOUT);
    assert_eq!(values(&state_all), ["checkpoint-1", "checkpoint-aborted", "checkpoint-2"]);

    // Reading to the end terminates and agrees with the quiet-period readers.
    assert_eq!(values(&broker.read_to_end("events", Isolation::ReadCommitted, TIMEOUT)), values(&committed));
    assert_eq!(values(&broker.read_to_end("state", Isolation::ReadUncommitted, TIMEOUT)), values(&state_all));
}

/// A compacted topic keeps the configs the state backend creates it with (`cleanup.policy=compact`,
/// `retention.ms=-1`), as DescribeConfigs reports them.
#[test]
fn noida_creates_compacted_topic_with_its_configs() {
    let broker = Broker::start(Engine::Noida);
    broker.create_topic_with("state", 1, &[("cleanup.policy", "compact"), ("retention.ms", "-1")]);
    let configs = broker.topic_configs("state");
    assert_eq!(configs.get("cleanup.policy").map(String::as_str), Some("compact"), "{configs:?}");
    assert_eq!(configs.get("retention.ms").map(String::as_str), Some("-1"), "{configs:?}");

    broker.create_topic("plain", 1);
    let configs = broker.topic_configs("plain");
    assert_eq!(configs.get("cleanup.policy").map(String::as_str), Some("delete"), "{configs:?}");
}

/// A second producer with the same `transactional.id` fences the first: the zombie's commit fails
/// with a fatal fencing error, its open transaction is aborted, the new owner's transaction commits.
/// Guards against a broker on which two instances could both publish in exactly_once mode.
#[test]
fn noida_fences_a_zombie_producer_with_the_same_transactional_id() {
    let broker = Broker::start(Engine::Noida);
    broker.create_topic("events", 1);
    let zombie = transactional_producer(&broker, "tx-fence");
    zombie.begin_transaction().unwrap();
    send(&zombie, "events", "agg", "zombie-1");
    zombie.flush(TIMEOUT).expect("flush the zombie's record to the broker");
    assert_eq!(
        values(&broker.read_uncommitted("events", 1, TIMEOUT)),
        ["zombie-1"],
        "the zombie's record is in the log"
    );

    let owner = transactional_producer(&broker, "tx-fence");

    let err = zombie.commit_transaction(TIMEOUT).expect_err("the fenced zombie must not commit");
    let KafkaError::Transaction(ref rd) = err else { panic!("commit of a fenced producer: {err:?}") };
    assert!(rd.is_fatal(), "fencing must be fatal: {rd:?}");
    assert_eq!(rd.code(), RDKafkaErrorCode::Fenced, "{rd:?}");
    // Fatal means for good: the zombie cannot start another transaction either.
    assert!(zombie.begin_transaction().is_err(), "a fenced producer began a new transaction");

    owner.begin_transaction().unwrap();
    send(&owner, "events", "agg", "owner-1");
    send(&owner, "events", "agg", "owner-2");
    owner.commit_transaction(TIMEOUT).expect("the new owner commits");

    let committed = broker.read_committed("events", 2, TIMEOUT);
    assert_eq!(values(&committed), ["owner-1", "owner-2"], "read_committed: {committed:?}");
    let all = broker.read_uncommitted("events", 3, TIMEOUT);
    assert_eq!(values(&all), ["zombie-1", "owner-1", "owner-2"], "read_uncommitted: {all:?}");
}

/// An open transaction holds the last stable offset (LSO): a read_committed reader ends before its
/// first record. `init_transactions` by a new producer with the same `transactional.id` aborts it, so
/// the LSO moves to the high watermark and reading to the end terminates without the old owner's
/// records: what the connector relies on when it loads its state topic at start.
#[test]
fn noida_open_transaction_holds_the_lso_until_the_next_owner_aborts_it() {
    let broker = Broker::start(Engine::Noida);
    broker.create_topic("state", 1);
    let old = transactional_producer(&broker, "tx-lso");
    old.begin_transaction().unwrap();
    send(&old, "state", "connector", "committed-before");
    old.commit_transaction(TIMEOUT).unwrap();
    let (_, stable) = broker.watermarks("state", 0, Isolation::ReadCommitted);

    old.begin_transaction().unwrap();
    for v in ["open-1", "open-2", "open-3"] {
        send(&old, "state", "connector", v);
    }
    old.flush(TIMEOUT).expect("flush the open transaction's records to the broker");

    let (_, lso) = broker.watermarks("state", 0, Isolation::ReadCommitted);
    let (_, high) = broker.watermarks("state", 0, Isolation::ReadUncommitted);
    assert_eq!(lso, stable, "the LSO must stay before the open transaction (high watermark {high})");
    assert_eq!(high, stable + 3, "the open transaction's 3 records are in the log");
    let seen = broker.read_to_end("state", Isolation::ReadCommitted, TIMEOUT);
    assert_eq!(values(&seen), ["committed-before"], "read_committed while a transaction is open");

    // A new instance takes over the transactional.id (old is now a zombie and never commits).
    let new = transactional_producer(&broker, "tx-lso");
    let (_, lso) = broker.watermarks("state", 0, Isolation::ReadCommitted);
    let (_, high) = broker.watermarks("state", 0, Isolation::ReadUncommitted);
    assert_eq!(lso, high, "after init_transactions of the same id the old transaction is aborted (marker written)");
    assert!(high > stable + 3, "the abort marker takes an offset: high {high}, stable before {stable}");
    let seen = broker.read_to_end("state", Isolation::ReadCommitted, TIMEOUT);
    assert_eq!(values(&seen), ["committed-before"], "the aborted records stay hidden");

    new.begin_transaction().unwrap();
    send(&new, "state", "connector", "committed-after");
    new.commit_transaction(TIMEOUT).unwrap();
    let seen = broker.read_to_end("state", Isolation::ReadCommitted, TIMEOUT);
    assert_eq!(values(&seen), ["committed-before", "committed-after"]);
    drop(old);
}

/// Consumer offsets sent with `send_offsets_to_transaction` are committed with the transaction and
/// discarded with an aborted one: a consume-transform-produce loop (or the inbox example) resumes
/// exactly after what it produced.
#[test]
fn noida_send_offsets_to_transaction_commits_offsets_only_with_the_transaction() {
    let broker = Broker::start(Engine::Noida);
    broker.create_topic("input", 1);
    broker.create_topic("output", 1);
    let seed: ThreadedProducer<DefaultProducerContext> = broker.client_config().create().unwrap();
    for v in ["in-1", "in-2", "in-3", "in-4", "in-5"] {
        send(&seed, "input", "agg", v);
    }
    seed.flush(TIMEOUT).unwrap();

    let group = "inbox-group";
    let consumer: BaseConsumer = broker
        .client_config()
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .set("session.timeout.ms", "6000")
        .create()
        .unwrap();
    consumer.subscribe(&["input"]).unwrap();
    let mut consumed = Vec::new();
    let deadline = std::time::Instant::now() + TIMEOUT;
    while consumed.len() < 5 {
        assert!(std::time::Instant::now() < deadline, "group consumer read only {consumed:?}");
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            let m = m.expect("group consumer poll");
            consumed.push(rdkafka::Message::offset(&m));
        }
    }
    assert_eq!(consumed, [0, 1, 2, 3, 4]);
    let cgm = consumer.group_metadata().expect("group metadata of a subscribed consumer");

    let producer = transactional_producer(&broker, "tx-offsets");
    let offsets_at = |next: i64| {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset("input", 0, Offset::Offset(next)).unwrap();
        tpl
    };
    producer.begin_transaction().unwrap();
    send(&producer, "output", "agg", "out-1..3");
    producer.send_offsets_to_transaction(&offsets_at(3), &cgm, TIMEOUT).expect("send_offsets_to_transaction");
    producer.commit_transaction(TIMEOUT).expect("commit with offsets");
    assert_eq!(committed_offset(&consumer), Offset::Offset(3), "offsets commit with the transaction");

    producer.begin_transaction().unwrap();
    send(&producer, "output", "agg", "out-4..5");
    producer.send_offsets_to_transaction(&offsets_at(5), &cgm, TIMEOUT).expect("send_offsets_to_transaction");
    producer.abort_transaction(TIMEOUT).expect("abort with offsets");
    assert_eq!(committed_offset(&consumer), Offset::Offset(3), "an aborted transaction's offsets are discarded");
    assert_eq!(values(&broker.read_all_quiet("output", 1, SHORT, TIMEOUT)), ["out-1..3"]);

    // A plain (non-transactional) commit of the group still works next to it.
    consumer.commit(&offsets_at(5), CommitMode::Sync).expect("plain offset commit");
    assert_eq!(committed_offset(&consumer), Offset::Offset(5));
}

fn committed_offset(consumer: &BaseConsumer) -> Offset {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition("input", 0);
    let committed = consumer.committed_offsets(tpl, TIMEOUT).expect("committed offsets of the group");
    committed.find_partition("input", 0).expect("input/0 in the committed offsets").offset()
}
