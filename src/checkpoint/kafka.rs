//! The Kafka state backend (`[state] backend = "kafka"`): the checkpoint, holds, known poison and the last
//! error as records of a compacted topic, keyed by connector, so that the process keeps nothing on disk.
//!
//! Floor 4 (docs/ARCHITECTURE.md): imports floors 0-3.
//!
//! # Records
//! One compacted topic (`state.topic`, `cleanup.policy=compact`, `retention.ms=-1`), shared by any number
//! of connectors. Each record's key starts with the connector's `state.name` and a `/`:
//!
//! | key                                   | value (JSON)           |
//! |---------------------------------------|------------------------|
//! | `<name>/checkpoint`                   | the checkpoint record  |
//! | `<name>/hold/<aggregate_type>\0<id>`  | a hold                 |
//! | `<name>/poison/<event id>`            | a known poison event   |
//! | `<name>/last_error`                   | the last error         |
//!
//! A removed hold or poison event is a tombstone. Compaction keeps the newest record of each key; a
//! reader replays the topic in offset order, so the newest wins before compaction too.
//!
//! # Invariants
//! - **Written in Kafka transactions, read `read_committed`.** Every write is a transaction of the state
//!   writer (transactional id `<delivery.transactional_id>.state`), committed before the call returns. With
//!   `exactly_once` the checkpoint is not written here but by the event producer, in the transaction that
//!   holds the events it covers ([`KafkaStore::committed`] records it once that commits).
//! - **A stale instance cannot write.** Opening the store calls `init_transactions` on the state writer's
//!   transactional id: an older instance that still runs (after losing its lease, or a split brain) is
//!   fenced from then on, and its next write fails instead of moving the checkpoint backwards.
//! - **The state is read after the fence.** [`KafkaStore::open`] first fences, then reads to the end: no
//!   transaction of an older writer can still commit after the read. With `exactly_once` it fences the
//!   event producer's transactional id too (that producer writes the checkpoints): an older instance
//!   paused in the middle of a commit has its transaction finished by the broker first, else the read
//!   could stop before that commit's checkpoint and the run would publish its events a second time
//!   (`tests/exactly_once.rs`, the paused active).
//! - Writes are serialised (one lock) and update the in-memory copy only once committed.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};
use serde::de::DeserializeOwned;

use super::records::{hold_key, Inspection, LastError};
use super::Checkpoint;
use crate::config::Config;
use crate::error::{classify_kafka, Error, Result};
use crate::poison::{Hold, KnownPoison};

/// How long a state write (one transaction) or the read at start may take before it fails as transient.
const STATE_TIMEOUT: Duration = Duration::from_secs(60);

/// What one connector keeps in the state topic, as last committed.
#[derive(Debug, Default, Clone)]
struct State {
    checkpoint: Option<Checkpoint>,
    holds: BTreeMap<String, Hold>,
    poison: BTreeMap<String, KnownPoison>,
    last_error: Option<LastError>,
}

/// The state of one connector in a compacted Kafka topic.
pub struct KafkaStore {
    topic: String,
    name: String,
    /// `None` when opened to read only (`status`, `quarantine list`).
    writer: Option<ThreadedProducer<DefaultProducerContext>>,
    state: Mutex<State>,
    /// Serialises writes: a transaction at a time.
    write_lock: Mutex<()>,
}

impl std::fmt::Debug for KafkaStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaStore").field("topic", &self.topic).field("name", &self.name).finish()
    }
}

impl KafkaStore {
    /// Opens the store as this connector's one writer: creates the topic if missing, fences any older
    /// writer, then reads the connector's records up to the end.
    ///
    /// # Errors
    /// Transient when the broker cannot be reached; definite when the topic is not compacted, may not be
    /// created, or holds records this build cannot read.
    pub async fn open(config: &Config) -> Result<KafkaStore> {
        let partitions = ensure_topic(config).await?;
        let started = Instant::now();
        let writer = init(writer(config)?, "the state writer");
        let writer = match config.exactly_once() {
            // The event producer writes checkpoints too: an older one's transaction may still be open or
            // committing (its markers not yet written). Starting a producer with its transactional id makes
            // the broker finish that transaction (abort it, or complete its commit) before it answers, so
            // the read below sees every checkpoint that will ever be committed under that id. Both fences
            // run at once; the read waits for both.
            true => {
                let events = init(transactional(config, config.transactional_id())?, "the event producer's id");
                tokio::try_join!(writer, events)?.0
            }
            false => writer.await?,
        };
        tracing::debug!(ms = started.elapsed().as_millis() as u64, "older writers fenced");
        let state = read(config, partitions).await?;
        Ok(KafkaStore {
            topic: config.state.topic.clone(),
            name: config.state.name.clone(),
            writer: Some(writer),
            state: Mutex::new(state),
            write_lock: Mutex::new(()),
        })
    }

    /// Reads the connector's committed state without writing or fencing anything (`status`, `check`,
    /// `quarantine list` while a connector runs). `None` when the topic does not exist yet.
    ///
    /// # Errors
    /// Transient when the broker cannot be reached; definite for unreadable records.
    pub async fn inspect(config: &Config) -> Result<Option<Inspection>> {
        let partitions = topic_partitions(config).await?;
        if partitions == 0 {
            return Ok(None);
        }
        let state = read(config, partitions).await?;
        Ok(Some(Inspection {
            checkpoint: state.checkpoint,
            holds: state.holds.into_values().collect(),
            last_error: state.last_error,
            known_poison: state.poison.into_values().collect(),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The key of the checkpoint record, for the event producer's transaction (`exactly_once`).
    pub fn checkpoint_key(&self) -> String {
        format!("{}/checkpoint", self.name)
    }

    /// The state topic.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    pub(super) fn load(&self) -> Option<Checkpoint> {
        self.lock().checkpoint.clone()
    }

    pub(super) fn save(&self, checkpoint: &Checkpoint) -> Result<()> {
        let json = serde_json::to_vec(checkpoint).expect("checkpoint serializes");
        self.write(vec![(self.checkpoint_key(), Some(json))])?;
        self.lock().checkpoint = Some(checkpoint.clone());
        Ok(())
    }

    /// Records a checkpoint the event producer committed in its own transaction.
    pub(super) fn committed(&self, checkpoint: &Checkpoint) {
        self.lock().checkpoint = Some(checkpoint.clone());
    }

    pub(super) fn holds(&self) -> Vec<Hold> {
        self.lock().holds.values().cloned().collect()
    }

    pub(super) fn put_hold(&self, hold: &Hold) -> Result<()> {
        let key = hold_key(&hold.aggregate_type, &hold.aggregate_id);
        let json = serde_json::to_vec(hold).expect("serializes");
        self.write(vec![(format!("{}/hold/{key}", self.name), Some(json))])?;
        self.lock().holds.insert(key, hold.clone());
        Ok(())
    }

    pub(super) fn remove_hold(&self, hold: &Hold, event_ids: &[String]) -> Result<()> {
        let key = hold_key(&hold.aggregate_type, &hold.aggregate_id);
        let mut records = vec![(format!("{}/hold/{key}", self.name), None)];
        records.extend(event_ids.iter().map(|id| (format!("{}/poison/{id}", self.name), None)));
        self.write(records)?;
        let mut state = self.lock();
        state.holds.remove(&key);
        for id in event_ids {
            state.poison.remove(id);
        }
        Ok(())
    }

    pub(super) fn known_poison(&self) -> Vec<KnownPoison> {
        self.lock().poison.values().cloned().collect()
    }

    pub(super) fn add_known_poison(&self, poison: &KnownPoison) -> Result<()> {
        let json = serde_json::to_vec(poison).expect("serializes");
        self.write(vec![(format!("{}/poison/{}", self.name, poison.id), Some(json))])?;
        self.lock().poison.insert(poison.id.clone(), poison.clone());
        Ok(())
    }

    pub(super) fn set_last_error(&self, record: &LastError) -> Result<()> {
        let json = serde_json::to_vec(record).expect("serializes");
        self.write(vec![(format!("{}/last_error", self.name), Some(json))])?;
        self.lock().last_error = Some(record.clone());
        Ok(())
    }

    pub(super) fn last_error(&self) -> Option<LastError> {
        self.lock().last_error.clone()
    }

    /// Writes `records` (`None`: a tombstone) in one transaction of the state writer and waits for its
    /// commit.
    fn write(&self, records: Vec<(String, Option<Vec<u8>>)>) -> Result<()> {
        let Some(writer) = &self.writer else {
            return Err(Error::definite("the state store was opened to read only"));
        };
        let _one_at_a_time = self.write_lock.lock().unwrap_or_else(|p| p.into_inner());
        let failed = |e: KafkaError, what: &str| {
            if let KafkaError::Transaction(t) = &e {
                if t.txn_requires_abort() {
                    let _ = writer.abort_transaction(STATE_TIMEOUT);
                }
                if t.is_fatal() && crate::error::is_fenced(&e) {
                    return Error::transient(format!(
                        "writing to the state topic {}: {e}. Another instance of connector {:?} took over \
                         (its start fenced this one): this instance stops writing",
                        self.topic, self.name
                    ));
                }
            }
            classify_kafka(&e).context(format_args!("{what} the state topic {}", self.topic))
        };
        writer.begin_transaction().map_err(|e| failed(e, "beginning a transaction on"))?;
        for (key, value) in &records {
            let mut record = BaseRecord::<String, Vec<u8>>::to(&self.topic).key(key);
            if let Some(value) = value {
                record = record.payload(value);
            }
            if let Err((e, _)) = writer.send(record) {
                let _ = writer.abort_transaction(STATE_TIMEOUT);
                return Err(classify_kafka(&e).context(format_args!("writing to the state topic {}", self.topic)));
            }
        }
        crate::failpoint!("checkpoint_write");
        writer.commit_transaction(STATE_TIMEOUT).map_err(|e| failed(e, "committing to"))
    }
}

/// The state writer: a transactional producer whose id is `<transactional_id>.state`.
fn writer(config: &Config) -> Result<ThreadedProducer<DefaultProducerContext>> {
    transactional(config, &format!("{}.state", config.transactional_id()))
}

/// Starts `producer`'s transactions (`init_transactions`): fences every older producer with its id.
async fn init(
    producer: ThreadedProducer<DefaultProducerContext>,
    what: &str,
) -> Result<ThreadedProducer<DefaultProducerContext>> {
    tokio::task::spawn_blocking(move || producer.init_transactions(STATE_TIMEOUT).map(|()| producer))
        .await
        .map_err(|e| Error::transient(format!("starting {what} failed: {e}")))?
        .map_err(|e| classify_kafka(&e).context(format_args!("fencing older producers ({what}, init_transactions)")))
}

/// A transactional producer with `id`, for the state topic.
fn transactional(config: &Config, id: &str) -> Result<ThreadedProducer<DefaultProducerContext>> {
    let mut cc = config.kafka.client_config()?;
    cc.set("transactional.id", id)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("partitioner", "murmur2_random")
        .set("linger.ms", "0");
    cc.create().map_err(|e| classify_kafka(&e).context("creating the state writer"))
}

/// Partitions of the state topic (0 when it does not exist).
async fn topic_partitions(config: &Config) -> Result<usize> {
    let cc = config.kafka.client_config()?;
    let topic = config.state.topic.clone();
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = cc.create().map_err(|e| classify_kafka(&e))?;
        let metadata = consumer
            .fetch_metadata(Some(&topic), STATE_TIMEOUT)
            .map_err(|e| classify_kafka(&e).context(format_args!("reading the metadata of {topic}")))?;
        Ok(metadata
            .topics()
            .iter()
            .find(|t| t.name() == topic && t.error().is_none())
            .map_or(0, |t| t.partitions().len()))
    })
    .await
    .map_err(|e| Error::transient(format!("reading the state topic's metadata failed: {e}")))?
}

/// Creates the state topic when it is missing (compacted, kept for good, one partition), and refuses one
/// that the broker says is not compacted: its records would expire and the connector would lose its place.
/// Returns its partition count.
async fn ensure_topic(config: &Config) -> Result<usize> {
    let topic = &config.state.topic;
    let admin: AdminClient<DefaultClientContext> =
        config.kafka.client_config()?.create().map_err(|e| classify_kafka(&e))?;
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let mut partitions = topic_partitions(config).await?;
    if partitions == 0 {
        if !config.kafka.create_topics {
            return Err(Error::definite(format!(
                "the state topic {topic:?} does not exist and kafka.create_topics = false: create it with \
                 cleanup.policy=compact and retention.ms=-1 (kafka-topics --create --topic {topic} --partitions 1 \
                 --config cleanup.policy=compact --config retention.ms=-1)"
            )));
        }
        let new_topic = NewTopic::new(topic, 1, TopicReplication::Fixed(config.kafka.topic_replication_factor))
            .set("cleanup.policy", "compact")
            .set("retention.ms", "-1");
        let results = admin.create_topics([&new_topic], &options).await.map_err(|e| classify_kafka(&e))?;
        for result in results {
            match result {
                Ok(_) => partitions = 1,
                // Created by another instance meanwhile, with whatever partitions it chose.
                Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => partitions = topic_partitions(config).await?,
                Err((name, code)) => {
                    return Err(classify_kafka(&KafkaError::AdminOp(code))
                        .context(format_args!("creating the state topic {name:?}")))
                }
            }
        }
        tracing::info!(topic, "created the state topic (compacted)");
    }
    let resource = ResourceSpecifier::Topic(topic);
    if let Ok(results) = admin.describe_configs([&resource], &options).await {
        if let Some(Ok(described)) = results.into_iter().next() {
            if let Some(policy) = described.get("cleanup.policy").and_then(|e| e.value.as_deref()) {
                if !policy.split(',').any(|p| p.trim() == "compact") || policy.contains("delete") {
                    return Err(Error::definite(format!(
                        "the state topic {topic:?} has cleanup.policy = {policy}: its records would expire and the \
                         connector would lose its checkpoint. Make it compacted only (kafka-configs --alter \
                         --entity-type topics --entity-name {topic} --add-config cleanup.policy=compact)"
                    )));
                }
            }
        }
    }
    Ok(partitions)
}

/// Reads the connector's records from every partition of the state topic, from the beginning to the end,
/// `read_committed`.
async fn read(config: &Config, partitions: usize) -> Result<State> {
    let mut cc = config.kafka.client_config()?;
    cc.set("group.id", format!("{}.state-reader", config.state.name))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", "read_committed")
        .set("fetch.wait.max.ms", "50");
    let (topic, name) = (config.state.topic.clone(), config.state.name.clone());
    tokio::task::spawn_blocking(move || read_blocking(cc, &topic, &name, partitions))
        .await
        .map_err(|e| Error::transient(format!("reading the state topic failed: {e}")))?
}

/// The state reader's context: the end of a partition is how the reader knows it is done, not an error
/// worth librdkafka's "Global error" line at every start.
struct StateReader;

impl rdkafka::ClientContext for StateReader {
    fn error(&self, error: KafkaError, reason: &str) {
        if error.rdkafka_error_code() != Some(RDKafkaErrorCode::PartitionEOF) {
            tracing::warn!(target: "librdkafka", %error, "{reason}");
        }
    }
}

impl rdkafka::consumer::ConsumerContext for StateReader {}

fn read_blocking(cc: rdkafka::ClientConfig, topic: &str, name: &str, partitions: usize) -> Result<State> {
    let consumer: BaseConsumer<StateReader> = cc.create_with_context(StateReader).map_err(|e| classify_kafka(&e))?;
    let mut assignment = TopicPartitionList::new();
    for p in 0..partitions as i32 {
        assignment.add_partition_offset(topic, p, Offset::Beginning).expect("valid offset");
    }
    consumer.assign(&assignment).map_err(|e| classify_kafka(&e))?;
    let prefix = format!("{name}/");
    let mut state = State::default();
    let mut at_end = vec![false; partitions];
    let deadline = Instant::now() + STATE_TIMEOUT;
    while at_end.iter().any(|done| !done) {
        if Instant::now() >= deadline {
            return Err(Error::transient(format!(
                "reading the state topic {topic} did not reach its end within {STATE_TIMEOUT:?} (an open \
                 transaction of another writer holds it back, or the broker is slow)"
            )));
        }
        match consumer.poll(Duration::from_millis(200)) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(p))) => at_end[p as usize] = true,
            Some(Err(e)) => return Err(classify_kafka(&e).context(format_args!("reading the state topic {topic}"))),
            Some(Ok(message)) => {
                at_end[message.partition() as usize] = false;
                let Some(key) = message.key().and_then(|k| std::str::from_utf8(k).ok()) else { continue };
                let Some(key) = key.strip_prefix(&prefix) else { continue };
                apply(&mut state, key, message.payload())
                    .map_err(|e| e.context(format_args!("state topic {topic}, offset {}", message.offset())))?;
            }
        }
    }
    Ok(state)
}

/// Applies one record (key without the connector prefix; `None`: a tombstone) to `state`.
fn apply(state: &mut State, key: &str, value: Option<&[u8]>) -> Result<()> {
    fn parse<T: DeserializeOwned>(key: &str, bytes: &[u8]) -> Result<T> {
        serde_json::from_slice(bytes).map_err(|e| {
            Error::definite(format!(
                "unreadable state record {key:?}: {e}. It was written by another build or by hand; the \
                 connector stops without touching it"
            ))
        })
    }
    if key == "checkpoint" {
        state.checkpoint = value.map(|v| parse(key, v)).transpose()?;
    } else if key == "last_error" {
        state.last_error = value.map(|v| parse(key, v)).transpose()?;
    } else if let Some(hold) = key.strip_prefix("hold/") {
        match value {
            Some(v) => drop(state.holds.insert(hold.to_string(), parse(key, v)?)),
            None => drop(state.holds.remove(hold)),
        }
    } else if let Some(id) = key.strip_prefix("poison/") {
        match value {
            Some(v) => drop(state.poison.insert(id.to_string(), parse(key, v)?)),
            None => drop(state.poison.remove(id)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The newest record of a key wins, a tombstone removes, unknown keys of this connector are skipped
    /// (a newer build's), and an unreadable known record stops the connector.
    #[test]
    fn records_replay_in_offset_order() {
        let mut state = State::default();
        let hold = Hold {
            aggregate_type: "t".into(),
            aggregate_id: "a".into(),
            hold_id: "h".into(),
            kind: crate::poison::PoisonKind::Undecodable,
            reason: "r".into(),
            origin: "o".into(),
            held_at_ms: 1,
            first_event: None,
            start: None,
        };
        apply(&mut state, "hold/t\0a", Some(&serde_json::to_vec(&hold).unwrap())).unwrap();
        apply(&mut state, "poison/e-1", Some(br#"{"id":"e-1","message":"m"}"#)).unwrap();
        apply(&mut state, "future/thing", Some(b"whatever")).unwrap();
        assert_eq!((state.holds.len(), state.poison.len()), (1, 1));
        apply(&mut state, "hold/t\0a", None).unwrap();
        assert!(state.holds.is_empty());
        let err = apply(&mut state, "checkpoint", Some(b"{not json")).unwrap_err();
        assert!(err.is_definite() && err.to_string().contains("unreadable state record"), "{err}");
    }
}
