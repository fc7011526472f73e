//! The Kafka state backend's read at start and its fences, driven through the library against noida-db (the
//! broker here with real transactions: `tests/common/broker.rs`), with the test itself playing the other
//! instances and producers.

mod common;

use std::time::Duration;

use common::{Broker, Engine};
use outbox_cdc::checkpoint::kafka::KafkaStore;
use outbox_cdc::config::Config;
use outbox_cdc::kafka::commit::Deadline;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

const TIMEOUT: Duration = Duration::from_secs(30);

/// A checkpoint record as the connector writes it (tests/fixtures/state).
const CHECKPOINT: &str = include_str!("fixtures/state/mariadb-stream/checkpoint.json");

/// A connector's config for `broker` (the source is never contacted here).
fn config(broker: &Broker, delivery: &str) -> Config {
    Config::parse(&format!(
        "[source]\nhost = \"127.0.0.1\"\nuser = \"u\"\npassword = \"p\"\nserver_id = 7\n\
         [outbox]\ntable = \"shop.outbox_events\"\n\
         [kafka]\nbootstrap_servers = \"{}\"\n\
         [state]\nbackend = \"kafka\"\nname = \"x\"\n{delivery}",
        broker.bootstrap()
    ))
    .expect("a valid config")
}

/// A started transactional producer with `id` (its `init_transactions` fenced every older one).
fn producer(broker: &Broker, id: &str) -> BaseProducer {
    let producer: BaseProducer =
        broker.client_config().set("transactional.id", id).create().expect("a transactional producer");
    producer.init_transactions(TIMEOUT).expect("init_transactions");
    producer
}

/// Begins a transaction on `producer` with `key` = `value` on `topic` in it.
fn write_open(producer: &BaseProducer, topic: &str, key: &str, value: &str) {
    producer.begin_transaction().expect("begin");
    producer.send(BaseRecord::to(topic).key(key).payload(value)).map_err(|(e, _)| e).expect("send");
    producer.flush(TIMEOUT).expect("flush");
}

const EXACTLY_ONCE: &str = "[delivery]\nguarantee = \"exactly_once\"\n";

/// Guards against an older read steering a newer producer: `open` fences with a producer of its own and
/// reads; the producer that commits the run's checkpoints starts later. Another instance (a split brain
/// the lease cannot see) that commits in between must not be missed: once the committing producer has
/// fenced, the state is read on, and a moved checkpoint stops the run (it starts again from the newer one).
#[tokio::test(flavor = "multi_thread")]
async fn a_checkpoint_committed_between_the_read_and_the_fence_stops_the_run() {
    let broker = Broker::start(Engine::Noida);
    let config = config(&broker, EXACTLY_ONCE);
    let store = KafkaStore::open(&config, &Deadline::default()).await.expect("open");
    assert!(store.load().is_none(), "a new state topic");
    // The other instance: its start fences this one's first fence, then it commits a checkpoint.
    let other = producer(&broker, config.transactional_id());
    write_open(&other, "outbox-cdc.state", "x/checkpoint", CHECKPOINT);
    other.commit_transaction(TIMEOUT).expect("the other instance commits");
    // This instance's committing producer starts (fencing the other), then reads on.
    let _ours = producer(&broker, config.transactional_id());
    let err = store.catch_up(&config).await.expect_err("the checkpoint moved since the read");
    assert!(!err.is_definite() && err.to_string().contains("moved while this instance started"), "{err}");
    assert!(store.load().is_some(), "the newer checkpoint was read");
    store.catch_up(&config).await.expect("nothing moved since");
}

/// Guards against a changed (or per-pod) `transactional_id` leaving the previous producer unfenced, and
/// against a switch from exactly_once to at_least_once leaving the exactly_once producer's transaction open:
/// the state records the ids of each start, and the next start fences those when its own differ.
#[tokio::test(flavor = "multi_thread")]
async fn the_previous_starts_producers_are_fenced_when_the_ids_change() {
    let broker = Broker::start(Engine::Noida);
    broker.create_topic("outbox.event.order", 1);
    let cases = [
        ("a changed transactional_id", "[delivery]\nguarantee = \"exactly_once\"\ntransactional_id = \"pod-2\"\n"),
        ("exactly_once switched to at_least_once", ""),
    ];
    for (i, (why, now)) in cases.into_iter().enumerate() {
        let before_id = format!("pod-1-{i}");
        let before = config(&broker, &format!("{EXACTLY_ONCE}transactional_id = \"{before_id}\"\n"));
        drop(KafkaStore::open(&before, &Deadline::default()).await.expect("the earlier start"));
        // The earlier start's event producer, still alive with a transaction open on an event topic.
        let earlier = producer(&broker, &before_id);
        write_open(&earlier, "outbox.event.order", "o-1", "{}");
        drop(KafkaStore::open(&config(&broker, now), &Deadline::default()).await.expect("the next start"));
        let err = earlier.commit_transaction(TIMEOUT).expect_err("fenced by the next start");
        assert!(err.to_string().to_lowercase().contains("fenc"), "{why}: {err}");
    }
}

/// Measures how long a start's state read takes as the state topic grows (docs/RELIABILITY.md, "Start
/// time and the state topic's size"): for each size in `OUTBOX_CDC_STATE_SIZES` (default 1000, 100000,
/// 1000000), a fresh topic holding that many records (a checkpoint record each, as many connectors' and
/// uncompacted checkpoints would leave, in transactions of 5,000), then `KafkaStore::open` timed. A
/// measurement, not a check: run it with `--ignored --nocapture`.
///
/// The broker is noida-db, timing `open` (the fences, then the read), or with `OUTBOX_CDC_STATE_BROKER=tansu`
/// Tansu's memory engine, timing `inspect` (the same read to the high watermarks, without the fences, which
/// need transactions; records written outside transactions). noida-db keeps every record in one JSON file
/// and cannot serve a topic of 600k such records (no fetch answered in 120 s, then a malformed
/// FindCoordinator response), so the 1M figure is Tansu's.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "a measurement (docs/RELIABILITY.md); minutes at 1M records"]
async fn measure_the_state_read_by_topic_size() {
    let sizes: Vec<usize> = std::env::var("OUTBOX_CDC_STATE_SIZES")
        .unwrap_or_else(|_| "1000,100000,1000000".into())
        .split(',')
        .map(|s| s.trim().parse().expect("a number"))
        .collect();
    let transactional = std::env::var("OUTBOX_CDC_STATE_BROKER").as_deref() != Ok("tansu");
    for size in sizes {
        let (_broker, config, filler) = if transactional {
            let broker = Broker::start(Engine::Noida);
            let config = config(&broker, EXACTLY_ONCE);
            drop(KafkaStore::open(&config, &Deadline::default()).await.expect("creates the topic"));
            let filler = producer(&broker, "filler");
            (broker, config, filler)
        } else {
            let broker = Broker::start(Engine::Memory);
            let config = config(&broker, "");
            broker.create_topic("outbox-cdc.state", 1);
            let filler: BaseProducer = broker.client_config().create().expect("a producer");
            (broker, config, filler)
        };
        let started = std::time::Instant::now();
        for chunk in (0..size).collect::<Vec<_>>().chunks(5_000) {
            if transactional {
                filler.begin_transaction().expect("begin");
            }
            for i in chunk {
                let key = format!("c{}/checkpoint", i % 50);
                let record = BaseRecord::to("outbox-cdc.state").key(&key).payload(CHECKPOINT);
                let mut record = record;
                loop {
                    match filler.send(record) {
                        Ok(()) => break,
                        Err((_, back)) => {
                            filler.poll(Duration::from_millis(10));
                            record = back;
                        }
                    }
                }
            }
            if transactional {
                filler.commit_transaction(TIMEOUT).expect("commit");
            } else {
                filler.flush(TIMEOUT).expect("flush");
            }
        }
        if !transactional {
            // The connector's own checkpoint last: `inspect` finds it only by reading to the end.
            let record = BaseRecord::to("outbox-cdc.state").key("x/checkpoint").payload(CHECKPOINT);
            filler.send(record).map_err(|(e, _)| e).expect("send");
            filler.flush(TIMEOUT).expect("flush");
        }
        let filled = started.elapsed();
        let started = std::time::Instant::now();
        if transactional {
            drop(KafkaStore::open(&config, &Deadline::default()).await.expect("open"));
        } else {
            let state = KafkaStore::inspect(&config).await.expect("inspect").expect("the topic exists");
            assert!(state.checkpoint.is_some(), "read to the last record");
        }
        let read = started.elapsed();
        println!(
            "[state read] {} {size} records ({} bytes each): filled in {:.1} s, {} in {:.2} s",
            if transactional { "noida-db:" } else { "Tansu:" },
            CHECKPOINT.len(),
            filled.as_secs_f64(),
            if transactional { "open (fences + read)" } else { "inspect (read alone)" },
            read.as_secs_f64()
        );
    }
}
