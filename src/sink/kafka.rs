//! The Kafka producer: idempotent, `acks=all`, murmur2 partitioning, bounded in bytes.
//!
//! # Invariants
//! - Every record handed to librdkafka was first registered with the [`Watermark`]; its delivery callback
//!   either settles it with a [`Delivered`] proof or records a failure that freezes the watermark. A record
//!   that librdkafka refuses to enqueue is a failure too: nothing is ever counted as delivered without an
//!   acknowledgement.
//! - At most `max_in_flight_bytes` of records are unacknowledged at any time: [`KafkaSink::send`] waits for
//!   budget, so a slow or absent broker stops the binlog reader instead of growing memory.
//! - Per-aggregate order: records are enqueued in binlog order, keyed by aggregate id, partitioned with
//!   murmur2 (the Java client's default, so other clients agree on placement), and the idempotent producer
//!   keeps per-partition order across retries and reconnects.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, PurgeConfig, ThreadedProducer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientContext;
use tokio::sync::Semaphore;

use super::Delivered;
use crate::checkpoint::{TxId, Watermark};
use crate::config::KafkaConfig;
use crate::error::{classify_kafka, is_record_refusal, Error, Result};
use crate::metrics::metrics;
use crate::router::KafkaRecord;

/// What travels with each record through librdkafka and back to the delivery callback.
struct InFlight {
    tx: TxId,
    permits: u32,
    /// The row's `occurred_at` (Unix ms, read as UTC) for the end-to-end latency histogram.
    occurred_at_ms: Option<i64>,
}

/// Delivery callbacks: the only place where [`Delivered`] proofs are made.
struct SinkContext {
    watermark: Arc<Watermark>,
    budget: Arc<Semaphore>,
}

impl ClientContext for SinkContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, log_message: &str) {
        use rdkafka::config::RDKafkaLogLevel as L;
        match level {
            L::Emerg | L::Alert | L::Critical | L::Error => {
                tracing::error!(target: "librdkafka", fac, "{log_message}")
            }
            L::Warning => tracing::warn!(target: "librdkafka", fac, "{log_message}"),
            L::Notice | L::Info => tracing::info!(target: "librdkafka", fac, "{log_message}"),
            L::Debug => tracing::debug!(target: "librdkafka", fac, "{log_message}"),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        // Broker-down and similar conditions arrive here while librdkafka keeps retrying: informational
        // unless fatal, which the delivery callbacks will report as failures.
        if error.rdkafka_error_code() == Some(RDKafkaErrorCode::AllBrokersDown) {
            metrics().set_broker_connected(false);
        }
        tracing::warn!(target: "librdkafka", %error, "{reason}");
    }

    fn stats(&self, statistics: rdkafka::Statistics) {
        // Bootstrap entries (nodeid -1) are not cluster members.
        let brokers = statistics.brokers.values().filter(|b| b.nodeid >= 0);
        metrics().produce_retries_total(brokers.map(|b| b.txretries).sum());
    }
}

impl ProducerContext for SinkContext {
    type DeliveryOpaque = Box<InFlight>;

    fn delivery(&self, result: &DeliveryResult<'_>, in_flight: Box<InFlight>) {
        let m = metrics();
        m.record_settled(in_flight.permits as usize);
        match result {
            Ok(message) => {
                self.watermark.settle(Delivered::new(in_flight.tx));
                // Only the latency histogram needs it (by aggregate type), and only streamed rows have one.
                let aggregate_type = match in_flight.occurred_at_ms {
                    Some(_) => aggregate_type(message).unwrap_or(""),
                    None => "",
                };
                m.event_acknowledged(message.topic(), message.partition(), aggregate_type, in_flight.occurred_at_ms);
            }
            Err((error, message)) => {
                let code = error.rdkafka_error_code();
                m.produce_error(&code.map_or_else(|| "Unknown".to_string(), |c| format!("{c:?}")));
                let refused_id = code.filter(|c| is_record_refusal(*c)).and_then(|_| header(message, "id"));
                let error = match refused_id {
                    Some(id) => Error::refused_record(id.to_string(), format!("{error} (topic {})", message.topic())),
                    None => classify_kafka(error).context(format_args!(
                        "delivery to topic {} failed (the watermark stops before this record)",
                        message.topic()
                    )),
                };
                self.watermark.fail(error);
            }
        }
        self.budget.add_permits(in_flight.permits as usize);
    }
}

/// Keeps the readiness metric honest while the producer is idle (librdkafka only connects when it has
/// something to send): a metadata request every few seconds, for as long as the producer lives.
async fn probe_brokers(producer: std::sync::Weak<ThreadedProducer<SinkContext>>) {
    const EVERY: Duration = Duration::from_secs(5);
    loop {
        let Some(p) = producer.upgrade() else { return };
        let reachable =
            tokio::task::spawn_blocking(move || p.client().fetch_metadata(None, EVERY).is_ok()).await.unwrap_or(false);
        metrics().set_broker_connected(reachable);
        tokio::time::sleep(EVERY).await;
    }
}

/// The `aggregate_type` header's value: looked up where the router puts it first (a linear search by name
/// costs a fifth of the delivery callbacks' time at 100k records/s).
fn aggregate_type<'a>(message: &'a rdkafka::message::BorrowedMessage<'_>) -> Option<&'a str> {
    use rdkafka::message::Headers;
    match message.headers()?.try_get(crate::router::AGGREGATE_TYPE_HEADER_INDEX) {
        Some(h) if h.key == "aggregate_type" => h.value.and_then(|v| std::str::from_utf8(v).ok()),
        _ => header(message, "aggregate_type"),
    }
}

/// A header's value as text.
fn header<'a>(message: &'a rdkafka::message::BorrowedMessage<'_>, name: &str) -> Option<&'a str> {
    use rdkafka::message::Headers;
    message.headers()?.iter().find(|h| h.key == name).and_then(|h| std::str::from_utf8(h.value?).ok())
}

/// Settings for topics the sink creates.
#[derive(Debug, Clone)]
struct TopicSettings {
    create: bool,
    partitions: i32,
    replication_factor: i32,
    config: BTreeMap<String, String>,
    /// `kafka.dead_letter_topic`: created to keep its records for good (see [`TopicSettings::config_of`]).
    dead_letter_topic: String,
}

impl TopicSettings {
    /// The configuration a topic is created with. The dead-letter topic keeps every record until an
    /// operator removes it (`retention.ms = -1`, no compaction): `quarantine release` must find a hold's
    /// first record to prove it republishes the whole hold ([`crate::release`]).
    fn config_of(&self, topic: &str) -> BTreeMap<String, String> {
        let mut config = self.config.clone();
        if topic == self.dead_letter_topic {
            config.insert("retention.ms".into(), "-1".into());
            config.insert("retention.bytes".into(), "-1".into());
            config.insert("cleanup.policy".into(), "delete".into());
        }
        config
    }
}

/// The Kafka side of the pipeline.
pub struct KafkaSink {
    producer: Arc<ThreadedProducer<SinkContext>>,
    admin: AdminClient<DefaultClientContext>,
    watermark: Arc<Watermark>,
    budget: Arc<Semaphore>,
    max_in_flight_bytes: usize,
    max_record_bytes: usize,
    known_topics: HashSet<String>,
    topics: TopicSettings,
}

/// Builds the librdkafka configuration shared by the producer and the admin client.
pub fn client_config(config: &KafkaConfig) -> ClientConfig {
    let mut cc = ClientConfig::new();
    cc.set("bootstrap.servers", &config.bootstrap_servers).set("client.id", "outbox-cdc");
    for (k, v) in &config.properties {
        cc.set(k, v);
    }
    cc
}

const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

/// Headroom for librdkafka's per-record framing when checking a record against `message.max.bytes`.
const RECORD_OVERHEAD_BYTES: usize = 512;

/// Memory a record costs in librdkafka beyond its own bytes until it is acknowledged: the message struct,
/// one allocation per header, its copy in the uncompressed and the compressed batch. Measured with the
/// broker paused (docs/PERFORMANCE.md, "Memory under pressure"): ~1 KB per 630-byte record. Counted in the
/// in-flight budget so that `max_in_flight_bytes` bounds memory, not just record bytes.
pub const IN_FLIGHT_OVERHEAD_BYTES: usize = 1024;

impl KafkaSink {
    /// Creates the producer.
    ///
    /// # Errors
    /// A definite error for an invalid librdkafka configuration.
    pub fn new(config: &KafkaConfig, watermark: Arc<Watermark>) -> Result<Self> {
        let budget = Arc::new(Semaphore::new(config.max_in_flight_bytes));
        let mut cc = client_config(config);
        cc.set("enable.idempotence", "true")
            .set("acks", "all")
            .set("partitioner", "murmur2_random")
            .set("compression.type", &config.compression)
            .set("allow.auto.create.topics", "false")
            .set("message.max.bytes", config.max_record_bytes.to_string())
            .set("queue.buffering.max.messages", "2000000")
            .set("queue.buffering.max.kbytes", "2097151")
            .set("statistics.interval.ms", "5000");
        if !config.properties.contains_key("linger.ms") {
            cc.set("linger.ms", "5");
        }
        let context = SinkContext { watermark: watermark.clone(), budget: budget.clone() };
        let producer: ThreadedProducer<SinkContext> =
            cc.create_with_context(context).map_err(|e| classify_kafka(&e))?;
        let admin: AdminClient<DefaultClientContext> =
            client_config(config).create().map_err(|e| classify_kafka(&e))?;
        let producer = Arc::new(producer);
        tokio::spawn(probe_brokers(Arc::downgrade(&producer)));
        Ok(KafkaSink {
            producer,
            admin,
            watermark,
            budget,
            max_in_flight_bytes: config.max_in_flight_bytes,
            max_record_bytes: config.max_record_bytes,
            known_topics: HashSet::new(),
            topics: TopicSettings {
                create: config.create_topics,
                partitions: config.topic_partitions,
                replication_factor: config.topic_replication_factor,
                config: {
                    let mut topic_config = config.topic_config.clone();
                    topic_config
                        .entry("max.message.bytes".to_string())
                        .or_insert_with(|| config.max_record_bytes.to_string());
                    topic_config
                },
                dead_letter_topic: config.dead_letter_topic.clone(),
            },
        })
    }

    /// Whether `record` is within `kafka.max_record_bytes`, with room for librdkafka's own per-record
    /// overhead (which it counts against `message.max.bytes` too).
    pub fn fits(&self, record: &KafkaRecord) -> bool {
        record.size_bytes() + RECORD_OVERHEAD_BYTES <= self.max_record_bytes
    }

    /// The largest record this sink produces.
    pub fn max_record_bytes(&self) -> usize {
        self.max_record_bytes
    }

    /// Hands one record of transaction `tx` to the producer, waiting for in-flight budget first.
    /// `occurred_at_ms` feeds the end-to-end latency histogram.
    ///
    /// # Errors
    /// Definite when the topic is missing and may not be created, or the record is refused for good;
    /// transient for broker unavailability during topic checks.
    pub async fn send(&mut self, tx: TxId, record: &KafkaRecord, occurred_at_ms: Option<i64>) -> Result<()> {
        if !self.known_topics.contains(&record.topic) {
            self.ensure_topic(&record.topic).await?;
            self.known_topics.insert(record.topic.clone());
        }
        let permits = (record.size_bytes() + IN_FLIGHT_OVERHEAD_BYTES).min(self.max_in_flight_bytes) as u32;
        self.budget.acquire_many(permits).await.expect("the budget semaphore is never closed").forget();
        self.watermark.add_record(tx);
        let mut headers = OwnedHeaders::new_with_capacity(record.headers.len());
        for (key, value) in &record.headers {
            headers = headers.insert(Header { key, value: Some(value) });
        }
        metrics().event_produced(&record.topic, permits as usize);
        let mut pending = BaseRecord::with_opaque_to(&record.topic, Box::new(InFlight { tx, permits, occurred_at_ms }))
            .key(&record.key)
            .payload(&record.value)
            .headers(headers);
        loop {
            match self.producer.send(pending) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    pending = back;
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                Err((error, _)) => {
                    let error = classify_kafka(&error)
                        .context(format_args!("producing to {} (key {})", record.topic, record.key));
                    metrics().record_settled(permits as usize);
                    self.budget.add_permits(permits as usize);
                    self.watermark.fail(Error::transient(error.to_string()));
                    return Err(error);
                }
            }
        }
    }

    /// Waits until every record handed to the producer is acknowledged (or failed), up to `timeout`.
    /// Returns whether everything settled.
    pub async fn drain(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.watermark.unsettled() == 0 {
                return true;
            }
            if self.watermark.failed() || Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Drops every queued and in-flight record without waiting (after a failure): they were never
    /// acknowledged, so the watermark never counts them, and they are produced again after the restart.
    pub fn abort(&self) {
        self.producer.purge(PurgeConfig::default().queue().inflight());
    }

    /// Makes sure `topic` exists: creates it through the Admin API when allowed.
    async fn ensure_topic(&self, topic: &str) -> Result<()> {
        if self.topic_partitions(topic).await? > 0 {
            return Ok(());
        }
        if !self.topics.create {
            return Err(Error::definite(format!(
                "Kafka topic {topic:?} does not exist and kafka.create_topics = false: create it, or allow \
                 the connector to create it"
            )));
        }
        let replication = TopicReplication::Fixed(self.topics.replication_factor);
        let mut new_topic = NewTopic::new(topic, self.topics.partitions, replication);
        let config = self.topics.config_of(topic);
        for (k, v) in &config {
            new_topic = new_topic.set(k, v);
        }
        let options = AdminOptions::new().operation_timeout(Some(METADATA_TIMEOUT));
        let results = self.admin.create_topics([&new_topic], &options).await.map_err(|e| classify_kafka(&e))?;
        for result in results {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((name, code)) => {
                    let err = classify_kafka(&KafkaError::AdminOp(code));
                    return Err(err.context(format_args!("creating Kafka topic {name:?}")));
                }
            }
        }
        tracing::info!(topic, partitions = self.topics.partitions, "created Kafka topic");
        let deadline = Instant::now() + METADATA_TIMEOUT;
        while self.topic_partitions(topic).await? == 0 {
            if Instant::now() >= deadline {
                return Err(Error::transient(format!("Kafka topic {topic:?} was created but has no partitions yet")));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    /// Partition count of `topic`, 0 when it does not exist.
    async fn topic_partitions(&self, topic: &str) -> Result<usize> {
        let producer = self.producer.clone();
        let name = topic.to_string();
        let metadata =
            tokio::task::spawn_blocking(move || producer.client().fetch_metadata(Some(&name), METADATA_TIMEOUT))
                .await
                .map_err(|e| Error::transient(format!("metadata task failed: {e}")))?
                .map_err(|e| classify_kafka(&e).context(format_args!("fetching metadata of topic {topic:?}")))?;
        let partitions = metadata
            .topics()
            .iter()
            .find(|t| t.name() == topic)
            .filter(|t| t.error().is_none())
            .map(|t| t.partitions().len())
            .unwrap_or(0);
        Ok(partitions)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards against a dead-letter topic created with the cluster's default retention (7 days): a hold
    /// released later would have lost its first records ([`crate::release`] then refuses).
    #[test]
    fn the_dead_letter_topic_keeps_its_records() {
        let settings = TopicSettings {
            create: true,
            partitions: 1,
            replication_factor: 1,
            config: BTreeMap::from([("retention.ms".to_string(), "604800000".to_string())]),
            dead_letter_topic: "dlq".into(),
        };
        let dlq = settings.config_of("dlq");
        assert_eq!(dlq.get("retention.ms").map(String::as_str), Some("-1"));
        assert_eq!(dlq.get("retention.bytes").map(String::as_str), Some("-1"));
        assert_eq!(dlq.get("cleanup.policy").map(String::as_str), Some("delete"));
        assert_eq!(settings.config_of("orders").get("retention.ms").map(String::as_str), Some("604800000"));
    }
}
