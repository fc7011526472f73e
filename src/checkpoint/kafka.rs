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
//! | `<name>/paused`                       | an operator's pause (a tombstone when resumed) |
//! | `<name>/snapshot/<id>`                | a snapshot on demand as it now is |
//! | `<name>/signal/<id>`                  | a signal of `[outbox] signal_table` carried out |
//! | `<name>/producers`                    | the transactional ids of the last start |
//!
//! A removed hold or poison event is a tombstone. Compaction keeps the newest record of each key; a
//! reader replays the topic in offset order, so the newest wins before compaction too.
//!
//! # One partition, and why it is checked at every read
//! Offsets order records only within a partition. After `kafka-topics --alter --partitions`, a key's
//! newer records go to another partition than its older ones (and with `exactly_once` the event producer
//! and the state writer would not even agree on a key's partition): a replay in arrival order could take
//! an old checkpoint (publishing again what was published since), bring back released holds, or apply a
//! tombstone before a newer hold, and differently at each start. So every read (open, catch-up, `status`)
//! refuses a topic that does not have exactly one partition ([`one_partition`]), with the way out: `state
//! copy --to local` reads such a topic once, merged per key ([`KafkaStore::inspect_merging_partitions`]),
//! and `state copy --to kafka` writes it to a new one-partition topic. A change while an instance runs
//! is seen at its next read: the next start, or the catch-up of a start in progress.
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
//! - **Nothing is read past.** The reader fails (definite) instead of skipping records deleted under it
//!   ([`crate::kafka::read`]); a topic whose `cleanup.policy` cannot be read (DescribeConfigs denied) is
//!   warned about at every start, naming the ACL ([`ensure_topic`]).

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::OAuthToken;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
use serde::de::DeserializeOwned;

use super::records::{hold_key, AppliedSignal, Inspection, LastError, Paused, SnapshotRequest};
use super::Checkpoint;
use crate::config::{Config, KafkaConfig};
use crate::error::{classify_kafka, classify_kafka_on, Error, KafkaResource, Result};
use crate::kafka::commit::{until_known, Deadline, Outcome};
use crate::kafka::identity::{self, Context, Tokened, Tokens};
use crate::kafka::read::{Starts, ToEnd, Until};
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
    paused: Option<Paused>,
    snapshots: BTreeMap<String, SnapshotRequest>,
    signals: BTreeMap<String, AppliedSignal>,
    producers: Option<Producers>,
}

impl State {
    fn into_inspection(self) -> Inspection {
        Inspection {
            checkpoint: self.checkpoint,
            holds: self.holds.into_values().collect(),
            last_error: self.last_error,
            known_poison: self.poison.into_values().collect(),
            paused: self.paused,
            snapshots: self.snapshots.into_values().collect(),
            signals: self.signals.into_iter().collect(),
        }
    }
}

/// The transactional ids of the connector's last start (`<name>/producers`): the next start fences them
/// when its own differ ([`KafkaStore::fence_earlier_producers`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Producers {
    /// `[delivery] transactional_id`: the event producer's id (with exactly_once), and with `.state` the
    /// state writer's.
    transactional_id: String,
    exactly_once: bool,
}

/// The state of one connector in a compacted Kafka topic.
pub struct KafkaStore {
    topic: String,
    name: String,
    /// `None` when opened to read only (`status`, `quarantine list`).
    writer: Option<ThreadedProducer<Context>>,
    /// The state writer's transactional id, for the ACL an authorization refusal names.
    writer_id: String,
    state: Mutex<State>,
    /// Where the last read of the topic ended, per partition ([`KafkaStore::catch_up`] reads on from there).
    read_to: Mutex<Starts>,
    /// Serialises writes: a transaction at a time.
    write_lock: Mutex<()>,
    /// When a commit's wait for its outcome gives up: at a stop of `run` (never for the other commands).
    deadline: Deadline,
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
    /// Transient when the broker cannot be reached; definite when the topic is not compacted, has more
    /// than one partition, may not be created or used (the message names the ACL), or holds records this
    /// build cannot read.
    pub async fn open(config: &Config, deadline: &Deadline) -> Result<KafkaStore> {
        let partitions = ensure_topic(config).await?;
        one_partition(&config.state.topic, partitions)?;
        let started = Instant::now();
        let writer_id = format!("{}.state", config.transactional_id());
        let writer = init(transactional(&config.kafka, &writer_id)?, &writer_id, "the state writer");
        let writer = match config.exactly_once() {
            // The event producer writes checkpoints too: an older one's transaction may still be open or
            // committing (its markers not yet written). Starting a producer with its transactional id makes
            // the broker finish that transaction (abort it, or complete its commit) before it answers, so
            // the read below sees every checkpoint that will ever be committed under that id. Both fences
            // run at once; the read waits for both.
            true => {
                let id = config.transactional_id();
                let events = init(transactional(&config.kafka, id)?, id, "the event producer's id");
                tokio::try_join!(writer, events)?.0
            }
            false => writer.await?,
        };
        tracing::debug!(ms = started.elapsed().as_millis() as u64, "older writers fenced");
        let (state, read_to) = read(config, State::default(), Starts::new()).await?;
        let store = KafkaStore {
            topic: config.state.topic.clone(),
            name: config.state.name.clone(),
            writer: Some(writer),
            writer_id,
            state: Mutex::new(state),
            read_to: Mutex::new(read_to),
            write_lock: Mutex::new(()),
            deadline: deadline.clone(),
        };
        store.fence_earlier_producers(config).await?;
        Ok(store)
    }

    /// Fences the producers of the connector's last start when their ids differ from this one's, then
    /// records this start's. The fences above cover only the ids the config names now: a changed (or
    /// per-pod) `transactional_id` would leave the previous producer able to commit, and switching from
    /// exactly_once to at_least_once would leave its event producer's transaction open. After fencing, the
    /// state is read on from where it was read, so a commit those producers made before the fence counts.
    async fn fence_earlier_producers(&self, config: &Config) -> Result<()> {
        let now =
            Producers { transactional_id: config.transactional_id().to_string(), exactly_once: config.exactly_once() };
        let before = self.lock().producers.clone();
        if before.as_ref() == Some(&now) {
            return Ok(());
        }
        if let Some(before) = &before {
            let mut ids = Vec::new();
            if before.transactional_id != now.transactional_id {
                ids.push(format!("{}.state", before.transactional_id));
            }
            if before.exactly_once && (!now.exactly_once || before.transactional_id != now.transactional_id) {
                ids.push(before.transactional_id.clone());
            }
            for id in &ids {
                tracing::info!(
                    id,
                    "fencing the producer of the connector's previous start (its transactional id changed)"
                );
                drop(init(transactional(&config.kafka, id)?, id, "the previous start's producer").await?);
            }
            if !ids.is_empty() {
                let starts = self.read_to.lock().unwrap_or_else(|p| p.into_inner()).clone();
                let current = self.lock().clone();
                let (state, read_to) = read(config, current, starts).await?;
                *self.lock() = state;
                *self.read_to.lock().unwrap_or_else(|p| p.into_inner()) = read_to;
            }
        }
        let json = serde_json::to_vec(&now).expect("serializes");
        self.write(vec![(format!("{}/producers", self.name), Some(json))])?;
        self.lock().producers = Some(now);
        Ok(())
    }

    /// Reads what was committed to the state topic since [`KafkaStore::open`] read it, once the producer
    /// that will commit this run's checkpoints has started (`exactly_once`: its `init_transactions` fenced
    /// every older producer with its id). The fence in `open` is a producer of its own, dropped before
    /// the run's starts: another instance (a split brain the lease cannot see) may have committed in
    /// between, and a run planned from the older read would publish again what that one committed.
    ///
    /// # Errors
    /// Transient when the checkpoint moved since `open` (the run starts again from the newer one) or the
    /// broker cannot be reached.
    pub async fn catch_up(&self, config: &Config) -> Result<()> {
        let (before, starts) = (self.lock().clone(), self.read_to.lock().unwrap_or_else(|p| p.into_inner()).clone());
        let (after, read_to) = read(config, before.clone(), starts).await?;
        let json = |c: &Option<Checkpoint>| c.as_ref().map(|c| serde_json::to_vec(c).expect("checkpoint serializes"));
        let moved = json(&before.checkpoint) != json(&after.checkpoint);
        *self.lock() = after;
        *self.read_to.lock().unwrap_or_else(|p| p.into_inner()) = read_to;
        if moved {
            return Err(Error::transient(format!(
                "the checkpoint of connector {:?} in {} moved while this instance started: another instance \
                 committed after this one read it (it is fenced now). Starting again from the newer checkpoint",
                self.name, self.topic
            )));
        }
        Ok(())
    }

    /// Reads the connector's committed state without writing or fencing anything (`status`, `check`,
    /// `quarantine list` while a connector runs). `None` when the topic does not exist yet.
    ///
    /// # Errors
    /// Transient when the broker cannot be reached; definite for unreadable records, a topic with more
    /// than one partition, or one the principal may not read.
    pub async fn inspect(config: &Config) -> Result<Option<Inspection>> {
        let partitions = topic_partitions(config).await?;
        if partitions == 0 {
            return Ok(None);
        }
        one_partition(&config.state.topic, partitions)?;
        let (state, _) = read(config, State::default(), Starts::new()).await?;
        Ok(Some(state.into_inspection()))
    }

    /// Reads the connector's committed state like [`KafkaStore::inspect`], from a state topic of any number
    /// of partitions: the way out of a topic whose partitions were added (`state copy --to local`, then
    /// `--to kafka` into a new one-partition topic). Each partition is replayed on its own (offsets order
    /// records within one), then merged per key: the checkpoint that holds every other partition's (a
    /// checkpoint only moves forward), and every hold and known poison event found in any partition. A hold
    /// released after the partitions changed comes back: it keeps its aggregate held, and its next release
    /// republishes its events a second time, in order; nothing is lost or reordered.
    ///
    /// # Errors
    /// As [`KafkaStore::inspect`]; definite when the partitions' checkpoints do not follow one another
    /// (another server's, or a diverged history).
    pub async fn inspect_merging_partitions(config: &Config) -> Result<Option<Inspection>> {
        let partitions = topic_partitions(config).await?;
        if partitions == 0 {
            return Ok(None);
        }
        if partitions == 1 {
            return KafkaStore::inspect(config).await;
        }
        let states = read_each_partition(config).await?;
        let merged = merge(&config.state.topic, states)?;
        tracing::warn!(
            topic = config.state.topic,
            partitions,
            holds = merged.holds.len(),
            "read the state topic's {partitions} partitions one by one and merged them per key: the newest \
             checkpoint, every hold and known poison event. A hold released since the partitions changed is \
             back: release it again (its events are published a second time, in order)"
        );
        Ok(Some(merged.into_inspection()))
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

    /// The checkpoint as last read or committed.
    pub fn load(&self) -> Option<Checkpoint> {
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

    pub(super) fn forget_known_poison(&self, event_ids: &[String]) -> Result<()> {
        self.write(event_ids.iter().map(|id| (format!("{}/poison/{id}", self.name), None)).collect())?;
        let mut state = self.lock();
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

    pub(super) fn set_paused(&self, paused: Option<&Paused>) -> Result<()> {
        let json = paused.map(|p| serde_json::to_vec(p).expect("serializes"));
        self.write(vec![(format!("{}/paused", self.name), json)])?;
        self.lock().paused = paused.cloned();
        Ok(())
    }

    pub(super) fn paused(&self) -> Option<Paused> {
        self.lock().paused.clone()
    }

    pub(super) fn put_snapshot(&self, request: &SnapshotRequest) -> Result<()> {
        let json = serde_json::to_vec(request).expect("serializes");
        self.write(vec![(format!("{}/snapshot/{}", self.name, request.id), Some(json))])?;
        self.lock().snapshots.insert(request.id.clone(), request.clone());
        Ok(())
    }

    pub(super) fn snapshots(&self) -> Vec<SnapshotRequest> {
        self.lock().snapshots.values().cloned().collect()
    }

    pub(super) fn put_applied_signal(&self, id: &str, applied: &AppliedSignal) -> Result<()> {
        let json = serde_json::to_vec(applied).expect("serializes");
        self.write(vec![(format!("{}/signal/{id}", self.name), Some(json))])?;
        self.lock().signals.insert(id.to_string(), applied.clone());
        Ok(())
    }

    pub(super) fn applied_signal(&self, id: &str) -> Option<AppliedSignal> {
        self.lock().signals.get(id).cloned()
    }

    pub(super) fn applied_signals(&self) -> Vec<(String, AppliedSignal)> {
        self.lock().signals.iter().map(|(id, applied)| (id.clone(), applied.clone())).collect()
    }

    /// Writes `records` (`None`: a tombstone) in one transaction of the state writer and waits for its
    /// commit.
    fn write(&self, records: Vec<(String, Option<Vec<u8>>)>) -> Result<()> {
        let Some(writer) = &self.writer else {
            return Err(Error::definite("the state store was opened to read only"));
        };
        let _one_at_a_time = self.write_lock.lock().unwrap_or_else(|p| p.into_inner());
        let acl = Some(KafkaResource::TransactionalId(&self.writer_id));
        let failed = |e: KafkaError, what: &str| {
            if let KafkaError::Transaction(t) = &e {
                if t.txn_requires_abort() {
                    let _ = writer.abort_transaction(STATE_TIMEOUT);
                }
                if t.is_fatal() && crate::error::is_fenced(&e) {
                    return Error::producer_fenced(format!(
                        "writing to the state topic {}: {e}. Another instance of connector {:?} took over \
                         (its start fenced this one): this instance stops writing",
                        self.topic, self.name
                    ));
                }
            }
            classify_kafka_on(&e, acl).context(format_args!("{what} the state topic {}", self.topic))
        };
        writer.begin_transaction().map_err(|e| failed(e, "beginning a transaction on"))?;
        for (key, value) in &records {
            let mut record = BaseRecord::<String, Vec<u8>>::to(&self.topic).key(key);
            if let Some(value) = value {
                record = record.payload(value);
            }
            if let Err((e, _)) = writer.send(record) {
                let _ = writer.abort_transaction(STATE_TIMEOUT);
                let acl = Some(KafkaResource::Topic(&self.topic, &["Write", "Describe"]));
                return Err(
                    classify_kafka_on(&e, acl).context(format_args!("writing to the state topic {}", self.topic))
                );
            }
        }
        crate::failpoint!("checkpoint_write");
        // A commit that timed out may still commit: asked again until its outcome is known (taken for a
        // failure, a release would be written, and its events republished, twice), or a stop gives up.
        match until_known(writer, STATE_TIMEOUT, &self.deadline) {
            Outcome::Known(result) => result.map_err(|e| failed(e, "committing to")),
            Outcome::Unknown => Err(Error::commit_unknown(format!(
                "stopping with the outcome of a commit to the state topic {} unknown: the next start's \
                 init_transactions completes or aborts it",
                self.topic
            ))),
        }
    }
}

/// Starts `producer`'s transactions (`init_transactions`): fences every older producer with its id `id`.
async fn init(producer: ThreadedProducer<Context>, id: &str, what: &str) -> Result<ThreadedProducer<Context>> {
    tokio::task::spawn_blocking(move || producer.init_transactions(STATE_TIMEOUT).map(|()| producer))
        .await
        .map_err(|e| Error::transient(format!("starting {what} failed: {e}")))?
        .map_err(|e| {
            classify_kafka_on(&e, Some(KafkaResource::TransactionalId(id)))
                .context(format_args!("fencing older producers ({what}, init_transactions)"))
        })
}

/// A transactional producer with `id`, for the state topic.
fn transactional(kafka: &KafkaConfig, id: &str) -> Result<ThreadedProducer<Context>> {
    let mut cc = kafka.client_config()?;
    cc.set("transactional.id", id)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("partitioner", "murmur2_random")
        .set("linger.ms", "0");
    identity::client(kafka, &cc).map_err(|e| e.context("creating the state writer"))
}

/// Partitions of the state topic (0 when it does not exist).
///
/// # Errors
/// Definite when the principal may not describe it: a refused topic is not a missing one (`status` would
/// say there is no state, `open` would try to create it).
async fn topic_partitions(config: &Config) -> Result<usize> {
    let cc = config.kafka.client_config()?;
    let context = Context::of(&config.kafka)?;
    let topic = config.state.topic.clone();
    tokio::task::spawn_blocking(move || {
        let acl = Some(KafkaResource::Topic(&topic, &["Read", "Describe"]));
        let consumer: BaseConsumer<Context> = identity::create(&cc, context)?;
        let metadata = consumer
            .fetch_metadata(Some(&topic), STATE_TIMEOUT)
            .map_err(|e| classify_kafka_on(&e, acl).context(format_args!("reading the metadata of {topic}")))?;
        let Some(t) = metadata.topics().iter().find(|t| t.name() == topic) else { return Ok(0) };
        match t.error().map(RDKafkaErrorCode::from) {
            None => Ok(t.partitions().len()),
            Some(RDKafkaErrorCode::UnknownTopicOrPartition) => Ok(0),
            Some(code) => Err(classify_kafka_on(&KafkaError::MetadataFetch(code), acl)
                .context(format_args!("reading the metadata of the state topic {topic}"))),
        }
    })
    .await
    .map_err(|e| Error::transient(format!("reading the state topic's metadata failed: {e}")))?
}

/// Refuses a state topic of `partitions` partitions other than one (module doc), with the way out.
pub(crate) fn one_partition(topic: &str, partitions: usize) -> Result<()> {
    if partitions == 1 {
        return Ok(());
    }
    Err(Error::definite(format!(
        "the state topic {topic:?} has {partitions} partitions; it must have exactly 1. The connector replays \
         it in offset order, and offsets order records only within a partition: a start could take an old \
         checkpoint (and publish again what was published since), bring back released holds, or apply a \
         tombstone before a newer hold. Kafka cannot take partitions away: move the state to a new topic. \
         Stop every connector that uses {topic:?}; for each, run `outbox-cdc -c <its config> state copy --to \
         local` (it reads the connector's records from every partition, keeps the newest checkpoint and every \
         hold; release again any hold that comes back); create the new topic (kafka-topics --bootstrap-server \
         <kafka.bootstrap_servers> --create --topic <new topic> --partitions 1 --config cleanup.policy=compact \
         --config retention.ms=-1, or let the connector create it); set [state] topic = \"<new topic>\" in \
         each config and run `outbox-cdc -c <its config> state copy --to kafka`; then start the connectors"
    )))
}

/// Creates the state topic when it is missing (compacted, kept for good, one partition), and refuses one
/// that the broker says is not compacted: its records would expire and the connector would lose its place.
/// Returns its partition count.
///
/// When the topic's configs cannot be read (DescribeConfigs denied, as on managed clusters that grant
/// only Read and Write), the start goes on with a warning naming the missing ACL, at every start: a
/// refusal would stop connectors on clusters where the operator cannot get that ACL but created the
/// topic right; the warning says what is at stake (a `delete`-policy topic loses holds and an idle
/// checkpoint after its retention) and what to check by hand.
async fn ensure_topic(config: &Config) -> Result<usize> {
    let topic = &config.state.topic;
    let admin: AdminClient<Context> = identity::client(&config.kafka, &config.kafka.client_config()?)?;
    // A broker that does not answer DescribeConfigs within this is warned about like one that refuses it.
    let options =
        AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))).request_timeout(Some(STATE_TIMEOUT / 4));
    let mut partitions = topic_partitions(config).await?;
    if partitions == 0 {
        if !config.kafka.create_topics {
            return Err(Error::definite(format!(
                "the state topic {topic:?} does not exist and kafka.create_topics = false: create it with \
                 cleanup.policy=compact and retention.ms=-1 (kafka-topics --create --topic {topic} --partitions 1 \
                 --config cleanup.policy=compact --config retention.ms=-1)"
            )));
        }
        let settings = topic_settings(&config.kafka);
        let mut new_topic = NewTopic::new(topic, 1, TopicReplication::Fixed(config.kafka.topic_replication_factor));
        for (key, value) in &settings {
            new_topic = new_topic.set(key, value);
        }
        let results = admin.create_topics([&new_topic], &options).await.map_err(|e| classify_kafka(&e))?;
        for result in results {
            match result {
                Ok(_) => partitions = 1,
                // Created by another instance meanwhile, with whatever partitions it chose.
                Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => partitions = topic_partitions(config).await?,
                Err((name, code)) => {
                    return Err(classify_kafka_on(
                        &KafkaError::AdminOp(code),
                        Some(KafkaResource::Topic(topic, &["Create"])),
                    )
                    .context(format_args!("creating the state topic {name:?}")))
                }
            }
        }
        tracing::info!(topic, ?settings, "created the state topic (compacted)");
    }
    let resource = ResourceSpecifier::Topic(topic);
    let described = match admin.describe_configs([&resource], &options).await {
        Ok(results) => match results.into_iter().next() {
            Some(Ok(described)) => Ok(described),
            Some(Err(code)) => Err(KafkaError::AdminOp(code).to_string()),
            None => Err("no answer".to_string()),
        },
        Err(e) => Err(e.to_string()),
    };
    let described: BTreeMap<String, String> = match described {
        Ok(described) => described.entries.into_iter().filter_map(|e| Some((e.name, e.value?))).collect(),
        Err(error) => {
            unverified(topic, &error);
            return Ok(partitions);
        }
    };
    match described.get("cleanup.policy") {
        Some(policy) if !policy.split(',').any(|p| p.trim() == "compact") || policy.contains("delete") => {
            return Err(Error::definite(format!(
                "the state topic {topic:?} has cleanup.policy = {policy}: its records would expire and the \
                 connector would lose its checkpoint. Make it compacted only (kafka-configs --alter \
                 --entity-type topics --entity-name {topic} --add-config cleanup.policy=compact)"
            )));
        }
        Some(_) => {}
        None => unverified(topic, "the answer has no cleanup.policy"),
    }
    for advice in topic_advice(topic, &described, &topic_settings(&config.kafka)) {
        tracing::warn!("{advice}");
    }
    Ok(partitions)
}

/// The warning of a state topic whose configs could not be read ([`ensure_topic`]).
fn unverified(topic: &str, error: &str) {
    tracing::warn!(
        topic,
        %error,
        "the state topic's cleanup.policy could not be verified (DescribeConfigs: {error}). If it is not \
         compact-only (cleanup.policy=compact, retention.ms=-1), Kafka deletes its records after retention.ms \
         (7 days by default): holds are lifted and an idle connector's checkpoint is lost. Grant the ACL so \
         that every start checks it (kafka-acls --bootstrap-server <kafka.bootstrap_servers> --add \
         --allow-principal User:<the connector's principal> --operation DescribeConfigs --topic {topic}), or \
         check it by hand (kafka-configs --describe --entity-type topics --entity-name {topic})"
    );
}

/// Kafka never compacts a partition's active segment, and by default rolls it only after 7 days or 1 GiB:
/// a state topic created with the defaults grows by every checkpoint for a week, and every start and every
/// failover reads all of it. These keep what a start reads to about an hour of writes plus one record per
/// key, as Kafka Streams' and Connect's compacted topics are kept in practice.
const COMPACTION: &[(&str, &str)] = &[
    ("segment.ms", "3600000"),
    ("segment.bytes", "16777216"),
    ("min.cleanable.dirty.ratio", "0.1"),
    // How long a tombstone (a released hold) stays readable after compaction: a reader slower than this
    // could miss it.
    ("delete.retention.ms", "86400000"),
];

/// The configs the state topic is created with: `kafka.topic_config` (its durability settings, e.g.
/// `min.insync.replicas`, apply to the checkpoints as to the events they cover: a checkpoint must not be
/// lost where its events survive), then compaction for good ([`COMPACTION`]) over it.
pub(crate) fn topic_settings(kafka: &KafkaConfig) -> BTreeMap<String, String> {
    let mut settings = kafka.topic_config.clone();
    settings.retain(|k, _| !matches!(k.as_str(), "retention.ms" | "retention.bytes" | "cleanup.policy"));
    settings.insert("cleanup.policy".into(), "compact".into());
    settings.insert("retention.ms".into(), "-1".into());
    for (key, value) in COMPACTION {
        settings.insert((*key).into(), (*value).into());
    }
    settings
}

/// What an existing state topic lacks of `wanted` ([`topic_settings`]): segments that keep it large (what
/// every start reads grows), a weaker `min.insync.replicas` than the events'. Each with the command that fixes it.
pub(crate) fn topic_advice(
    topic: &str,
    described: &BTreeMap<String, String>,
    wanted: &BTreeMap<String, String>,
) -> Vec<String> {
    let number = |map: &BTreeMap<String, String>, key: &str| map.get(key).and_then(|v| v.parse::<f64>().ok());
    let mut fix = Vec::new();
    for key in ["segment.ms", "segment.bytes", "min.cleanable.dirty.ratio"] {
        if let (Some(has), Some(want)) = (number(described, key), number(wanted, key)) {
            // Up to 24 times ours is still fine (a day of segments); only a topic left at Kafka's defaults is not.
            let limit = if key == "min.cleanable.dirty.ratio" { 0.5 } else { want * 24.0 };
            if has > limit {
                fix.push(format!("{key}={}", wanted[key]));
            }
        }
    }
    let mut advice = Vec::new();
    if !fix.is_empty() {
        advice.push(format!(
            "the state topic {topic:?} keeps its records uncompacted for long ({}): Kafka never compacts the active \
             segment, so every start and every failover reads all that accumulated. Fix: kafka-configs --alter \
             --entity-type topics --entity-name {topic} --add-config {}",
            fix.iter()
                .map(|f| f.split('=').next().unwrap_or_default())
                .map(|k| format!("{k} = {}", described[k]))
                .collect::<Vec<_>>()
                .join(", "),
            fix.join(",")
        ));
    }
    if let (Some(has), Some(want)) = (number(described, "min.insync.replicas"), number(wanted, "min.insync.replicas")) {
        if has < want {
            advice.push(format!(
                "the state topic {topic:?} has min.insync.replicas = {has}, below the events' {want} \
                 (kafka.topic_config): a checkpoint could be lost where the events it covers survive. Fix: \
                 kafka-configs --alter --entity-type topics --entity-name {topic} --add-config min.insync.replicas={want}"
            ));
        }
    }
    advice
}

/// The state topic's client settings for reading: `read_committed`, in large fetches (a state topic that
/// compaction has not yet shrunk can hold many records). librdkafka refuses `assign()` without a
/// `group.id`; the group is never used, and needs no ACL ([`crate::kafka::read`]).
pub(crate) fn reader_config(config: &Config) -> Result<rdkafka::ClientConfig> {
    let mut cc = config.kafka.client_config()?;
    cc.set("group.id", format!("{}.state-reader", config.state.name))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("fetch.wait.max.ms", "50")
        .set("fetch.max.bytes", "52428800")
        .set("max.partition.fetch.bytes", "16777216");
    Ok(cc)
}

/// Reads the connector's records from every partition of the state topic, from `starts` (the beginning
/// where none is given) to the high watermarks the topic has now (see [`crate::reading`]), `read_committed`,
/// applying them to `state`. Returns where each partition was read to.
///
/// A transaction another producer left open on the topic (a connector sharing it, killed mid-transaction)
/// holds the read back until the broker ends it: the read waits, bounded by the broker's
/// `transaction.max.timeout.ms`, and logs why. Stopping at the first end-of-partition instead would miss
/// every checkpoint committed after that transaction.
///
/// # Errors
/// Definite when the topic has more than one partition (module doc), or records not yet read were
/// deleted under the reader; as [`apply`].
async fn read(config: &Config, state: State, starts: Starts) -> Result<(State, Starts)> {
    read_into(config, state, starts, true, |state, _, key, value| apply(state, key, value)).await
}

/// Reads the connector's records from each partition of the state topic into a state of its own (the way
/// out of a topic with more than one partition: [`KafkaStore::inspect_merging_partitions`]).
async fn read_each_partition(config: &Config) -> Result<BTreeMap<i32, State>> {
    let states = BTreeMap::<i32, State>::new();
    let read = read_into(config, states, Starts::new(), false, |states, partition, key, value| {
        apply(states.entry(partition).or_default(), key, value)
    });
    Ok(read.await?.0)
}

/// Applies one record (partition, key without the `<name>/` prefix, value; `None`: a tombstone) to a `T`.
type ApplyTo<T> = fn(&mut T, i32, &str, Option<&[u8]>) -> Result<()>;

/// Reads the connector's records (keys without the `<name>/` prefix) into `into` with `each`; with
/// `one_partition`, refuses a topic of any other number of partitions. See [`read`].
async fn read_into<T: Send + 'static>(
    config: &Config,
    mut into: T,
    starts: Starts,
    one_partition: bool,
    each: ApplyTo<T>,
) -> Result<(T, Starts)> {
    let cc = reader_config(config)?;
    let tokens = Tokens::of(&config.kafka)?;
    let stall = crate::kafka::read::transaction_max_timeout(&cc, &tokens).await + STATE_TIMEOUT;
    let (topic, name) = (config.state.topic.clone(), config.state.name.clone());
    tokio::task::spawn_blocking(move || {
        let until = Until { quiet: Duration::ZERO, stall };
        let what = format!("the state topic {topic}");
        let reader = ToEnd::start(&cc, StateReader { tokens }, std::slice::from_ref(&topic), &starts, until, what)?;
        let mut reader = reader.if_lost(format!(
            "the state read from it would be incomplete (an old checkpoint, a released hold could come back), \
             so the connector does not start. A state topic must be compact-only: kafka-configs --alter \
             --entity-type topics --entity-name {topic} --add-config cleanup.policy=compact,retention.ms=-1. \
             Then check what it holds with `outbox-cdc status` before starting: a checkpoint older than the \
             events published means they are published again; a missing one, a start per snapshot.mode"
        ));
        if one_partition {
            self::one_partition(&topic, reader.partition_count(&topic))?;
        }
        let prefix = format!("{name}/");
        let started = Instant::now();
        while let Some(message) = reader.next_record()? {
            let Some(key) = message.key().and_then(|k| std::str::from_utf8(k).ok()) else { continue };
            let Some(key) = key.strip_prefix(&prefix) else { continue };
            let at = (message.partition(), message.offset());
            each(&mut into, at.0, key, message.payload())
                .map_err(|e| e.context(format_args!("state topic {topic}, partition {}, offset {}", at.0, at.1)))?;
        }
        tracing::debug!(records = reader.records(), ms = started.elapsed().as_millis() as u64, "state topic read");
        Ok((into, reader.positions()))
    })
    .await
    .map_err(|e| Error::transient(format!("reading the state topic failed: {e}")))?
}

/// Merges the states read from each partition of `topic` ([`KafkaStore::inspect_merging_partitions`]).
///
/// # Errors
/// Definite when no partition's checkpoint holds every other's.
fn merge(topic: &str, states: BTreeMap<i32, State>) -> Result<State> {
    let mut merged = State::default();
    let checkpoints: Vec<(i32, &Checkpoint)> =
        states.iter().filter_map(|(p, s)| s.checkpoint.as_ref().map(|c| (*p, c))).collect();
    let newest = checkpoints.iter().find(|(_, c)| {
        checkpoints.iter().all(|(_, o)| c.server() == o.server() && c.position().holds_all_of(o.position()))
    });
    match newest {
        Some((_, c)) => merged.checkpoint = Some((*c).clone()),
        None if checkpoints.is_empty() => {}
        None => {
            let found: Vec<String> =
                checkpoints.iter().map(|(p, c)| format!("partition {p}: {}", c.position())).collect();
            return Err(Error::definite(format!(
                "the state topic {topic:?} holds checkpoints of this connector in several partitions, and none \
                 holds all the others ({}): they are not one connector's history. Nothing was copied; find out \
                 which is right before going on",
                found.join("; ")
            )));
        }
    }
    for state in states.into_values() {
        for (key, hold) in state.holds {
            match merged.holds.get(&key) {
                Some(kept) if kept.held_at_ms >= hold.held_at_ms => {}
                _ => drop(merged.holds.insert(key, hold)),
            }
        }
        merged.poison.extend(state.poison);
        if state.last_error.as_ref().map(|e| e.at_ms) > merged.last_error.as_ref().map(|e| e.at_ms) {
            merged.last_error = state.last_error;
        }
        if state.paused.as_ref().map(|p| p.at_ms) > merged.paused.as_ref().map(|p| p.at_ms) {
            merged.paused = state.paused;
        }
        merged.snapshots.extend(state.snapshots);
        merged.signals.extend(state.signals);
        merged.producers = merged.producers.or(state.producers);
    }
    Ok(merged)
}

/// The state reader's context: librdkafka's errors go to the log as warnings.
struct StateReader {
    tokens: Tokens,
}

impl Tokened for StateReader {
    fn tokens(&self) -> &Tokens {
        &self.tokens
    }
}

impl rdkafka::ClientContext for StateReader {
    const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;

    fn generate_oauth_token(&self, _config: Option<&str>) -> Result<OAuthToken, Box<dyn std::error::Error>> {
        self.tokens.generate()
    }

    fn error(&self, error: KafkaError, reason: &str) {
        tracing::warn!(target: "librdkafka", %error, "{reason}");
    }
}

impl rdkafka::consumer::ConsumerContext for StateReader {}

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
    } else if key == "paused" {
        state.paused = value.map(|v| parse(key, v)).transpose()?;
    } else if key == "producers" {
        state.producers = value.map(|v| parse(key, v)).transpose()?;
    } else if let Some(hold) = key.strip_prefix("hold/") {
        match value {
            Some(v) => drop(state.holds.insert(hold.to_string(), parse(key, v)?)),
            None => drop(state.holds.remove(hold)),
        }
    } else if let Some(id) = key.strip_prefix("signal/") {
        match value {
            Some(v) => drop(state.signals.insert(id.to_string(), parse(key, v)?)),
            None => drop(state.signals.remove(id)),
        }
    } else if let Some(id) = key.strip_prefix("snapshot/") {
        match value {
            Some(v) => drop(state.snapshots.insert(id.to_string(), parse(key, v)?)),
            None => drop(state.snapshots.remove(id)),
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
    /// The state topic is created to stay small (what every start reads), with the events' durability; an
    /// existing one left at Kafka's defaults, or weaker than the events, is warned about with the fix.
    #[test]
    fn the_state_topic_stays_small_and_as_durable_as_the_events() {
        let mut config = Config::parse(
            "[source]\nhost = \"h\"\nuser = \"u\"\npassword = \"p\"\nserver_id = 7\n[outbox]\ntable = \"s.o\"\n\
             [kafka]\nbootstrap_servers = \"b:9092\"\n[kafka.topic_config]\n\"min.insync.replicas\" = \"2\"\n\
             \"retention.ms\" = \"604800000\"\n",
        )
        .unwrap();
        config.state.backend = crate::config::StateBackend::Kafka;
        let wanted = topic_settings(&config.kafka);
        let get = |k: &str| wanted.get(k).map(String::as_str);
        assert_eq!((get("cleanup.policy"), get("retention.ms")), (Some("compact"), Some("-1")));
        assert_eq!((get("segment.ms"), get("min.insync.replicas")), (Some("3600000"), Some("2")));

        let defaults: BTreeMap<String, String> = [
            ("segment.ms", "604800000"),
            ("segment.bytes", "1073741824"),
            ("min.cleanable.dirty.ratio", "0.5"),
            ("min.insync.replicas", "1"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let advice = topic_advice("st", &defaults, &wanted);
        assert_eq!(advice.len(), 2, "{advice:?}");
        assert!(advice[0].contains("--add-config segment.ms=3600000,segment.bytes=16777216"), "{}", advice[0]);
        assert!(advice[1].contains("min.insync.replicas=2"), "{}", advice[1]);
        assert!(topic_advice("st", &wanted, &wanted).is_empty(), "as created: nothing to say");
    }

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
        // A pause, then its end (a tombstone): what a standby taking over reads.
        apply(&mut state, "paused", Some(br#"{"at_ms":5,"by":"api"}"#)).unwrap();
        assert_eq!(state.paused, Some(Paused { at_ms: 5, by: "api".into() }));
        apply(&mut state, "paused", None).unwrap();
        assert_eq!(state.paused, None);
        let err = apply(&mut state, "checkpoint", Some(b"{not json")).unwrap_err();
        assert!(err.is_definite() && err.to_string().contains("unreadable state record"), "{err}");
    }
}
