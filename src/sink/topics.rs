//! The topics a sink writes to: each is made sure to exist (created through the Admin API when allowed)
//! and to take the producer's batches ([`super::limits`]) before its first record.
//!
//! Floor 4 (docs/ARCHITECTURE.md): imports floors 0-3.
//!
//! # Invariants
//! - A topic's `max.message.bytes` takes the producer's largest batch ([`check_topic_limit`]), checked by
//!   [`Topics::ensure`] before its first record.
//! - The dead-letter topic keeps every record until an operator removes it ([`TopicSettings::config_of`]).
//! - An admin client lives for one topic's check: made then, it holds a fresh token with `kafka.auth =
//!   "aws_iam"` (an admin client is never polled for the next one, [`crate::kafka::identity`]).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::error::KafkaError;
use rdkafka::producer::Producer;
use rdkafka::types::RDKafkaErrorCode;

use super::delivery::SinkProducer;
use super::limits::{check_topic_limit, required_topic_limit};
use crate::config::KafkaConfig;
use crate::error::{classify_kafka, Error, Result};
use crate::kafka::identity::{self, Context};

/// How long a metadata or admin request may take.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

/// Settings for topics the sink creates.
#[derive(Debug, Clone)]
pub(super) struct TopicSettings {
    pub(super) create: bool,
    pub(super) partitions: i32,
    pub(super) replication_factor: i32,
    pub(super) config: BTreeMap<String, String>,
    /// `kafka.dead_letter_topic`: created to keep its records for good (see [`TopicSettings::config_of`]).
    dead_letter_topic: String,
}

impl TopicSettings {
    /// The settings of topics created for `config`: its own, with room for the largest record and for the
    /// largest batch of several (`batch_limit_bytes`).
    pub(super) fn of(config: &KafkaConfig, batch_limit_bytes: usize) -> Self {
        TopicSettings {
            create: config.create_topics,
            partitions: config.topic_partitions,
            replication_factor: config.topic_replication_factor,
            config: {
                let mut topic_config = config.topic_config.clone();
                // Room for the largest record and for the largest batch of several.
                let max_message_bytes = config.max_record_bytes.max(required_topic_limit(batch_limit_bytes));
                topic_config.entry("max.message.bytes".to_string()).or_insert_with(|| max_message_bytes.to_string());
                topic_config
            },
            dead_letter_topic: config.dead_letter_topic.clone(),
        }
    }

    /// The configuration a topic is created with. The dead-letter topic keeps every record until an
    /// operator removes it (`retention.ms = -1`, no compaction): `quarantine release` must find a hold's
    /// first record to prove it republishes the whole hold ([`crate::ops::release`]).
    pub(super) fn config_of(&self, topic: &str) -> BTreeMap<String, String> {
        let mut config = self.config.clone();
        if topic == self.dead_letter_topic {
            config.insert("retention.ms".into(), "-1".into());
            config.insert("retention.bytes".into(), "-1".into());
            config.insert("cleanup.policy".into(), "delete".into());
        }
        config
    }
}

/// The topics a sink writes to: which of them this run checked, and how to create a missing one.
pub(super) struct Topics {
    /// The admin client's configuration and context, for the client of each check.
    admin: (rdkafka::config::ClientConfig, Context),
    settings: TopicSettings,
    /// Topics checked in this run: each exists and takes the producer's batches.
    known: HashSet<String>,
    /// Dead letters are cut to `max_record_bytes`: the dead-letter topic must take records that large.
    max_record_bytes: usize,
}

impl Topics {
    /// The topics of a producer with `config` whose batches go up to `batch_limit_bytes`.
    ///
    /// # Errors
    /// A definite error when a secret of the configuration cannot be read.
    pub(super) fn new(config: &KafkaConfig, batch_limit_bytes: usize) -> Result<Self> {
        Ok(Topics {
            admin: (config.client_config()?, Context::of(config)?),
            settings: TopicSettings::of(config, batch_limit_bytes),
            known: HashSet::new(),
            max_record_bytes: config.max_record_bytes,
        })
    }

    /// `kafka.dead_letter_topic`.
    pub(super) fn dead_letter_topic(&self) -> &str {
        &self.settings.dead_letter_topic
    }

    /// Makes sure `topic` exists and takes the producer's batches, once per run ([`Topics::check`]).
    ///
    /// # Errors
    /// As [`Topics::check`].
    pub(super) async fn ensure(&mut self, producer: &Arc<SinkProducer>, topic: &str) -> Result<()> {
        if self.known.contains(topic) {
            return Ok(());
        }
        self.check(producer, topic).await?;
        self.known.insert(topic.to_string());
        Ok(())
    }

    /// Makes sure `topic` exists (creates it through the Admin API when allowed) and takes the producer's
    /// batches: its `max.message.bytes`, read with DescribeConfigs, is checked against them and kept for
    /// [`super::KafkaSink::fits`] and the delivery callbacks. A broker that does not say is logged, not an error.
    async fn check(&self, producer: &Arc<SinkProducer>, topic: &str) -> Result<()> {
        let admin: AdminClient<Context> = identity::create(&self.admin.0, self.admin.1.clone())?;
        let checked = self.check_with(&admin, producer, topic).await;
        // Dropping an admin client joins its polling thread and destroys its handle: not on the stream's task.
        tokio::task::spawn_blocking(move || drop(admin));
        checked
    }

    /// [`Topics::check`] with `admin`.
    async fn check_with(&self, admin: &AdminClient<Context>, producer: &Arc<SinkProducer>, topic: &str) -> Result<()> {
        self.ensure_exists(admin, producer, topic).await?;
        let limit = self.read_topic_limit(admin, topic).await;
        if let Some(limit) = limit {
            check_topic_limit(topic, limit, producer.context().batch_limit_bytes)?;
            if topic == self.settings.dead_letter_topic && limit < self.max_record_bytes {
                return Err(Error::definite(format!(
                    "the dead-letter topic {topic:?} has max.message.bytes = {limit}, below kafka.max_record_bytes = \
                     {}: a dead letter (up to that size) could be refused. Raise the topic's max.message.bytes to \
                     at least {}, or lower kafka.max_record_bytes",
                    self.max_record_bytes, self.max_record_bytes
                )));
            }
            if limit < self.max_record_bytes {
                tracing::info!(
                    topic,
                    max_message_bytes = limit,
                    "the topic's max.message.bytes is below kafka.max_record_bytes: larger records of this topic \
                     are dead-lettered as too large"
                );
            }
        }
        producer.context().topic_limits.write().unwrap_or_else(|p| p.into_inner()).insert(topic.to_string(), limit);
        Ok(())
    }

    /// `max.message.bytes` of `topic` as the broker reports it, or `None` (logged) when it does not.
    async fn read_topic_limit(&self, admin: &AdminClient<Context>, topic: &str) -> Option<usize> {
        let resource = ResourceSpecifier::Topic(topic);
        let options = AdminOptions::new().request_timeout(Some(METADATA_TIMEOUT));
        let why = match admin.describe_configs([&resource], &options).await {
            Ok(results) => match results.into_iter().next() {
                Some(Ok(config)) => match config.get("max.message.bytes").and_then(|e| e.value.as_deref()) {
                    Some(value) => match value.trim().parse() {
                        Ok(limit) => return Some(limit),
                        Err(_) => format!("it answered max.message.bytes = {value:?}"),
                    },
                    None => "its answer has no max.message.bytes".to_string(),
                },
                Some(Err(code)) => format!("it answered {code:?}"),
                None => "it answered nothing".to_string(),
            },
            Err(e) => e.to_string(),
        };
        tracing::info!(
            topic,
            reason = %why,
            "cannot read the topic's max.message.bytes (DescribeConfigs): its records are checked against \
             kafka.max_record_bytes only; keep that, and kafka.properties.\"batch.size\", at or below the topic's \
             max.message.bytes"
        );
        None
    }

    /// Makes sure `topic` exists: creates it through the Admin API when allowed.
    async fn ensure_exists(
        &self,
        admin: &AdminClient<Context>,
        producer: &Arc<SinkProducer>,
        topic: &str,
    ) -> Result<()> {
        if topic_partitions(producer, topic).await? > 0 {
            return Ok(());
        }
        if !self.settings.create {
            return Err(Error::definite(format!(
                "Kafka topic {topic:?} does not exist and kafka.create_topics = false: create it, or allow \
                 the connector to create it"
            )));
        }
        let replication = TopicReplication::Fixed(self.settings.replication_factor);
        let mut new_topic = NewTopic::new(topic, self.settings.partitions, replication);
        let config = self.settings.config_of(topic);
        for (k, v) in &config {
            new_topic = new_topic.set(k, v);
        }
        let options = AdminOptions::new().operation_timeout(Some(METADATA_TIMEOUT));
        let results = admin.create_topics([&new_topic], &options).await.map_err(|e| classify_kafka(&e))?;
        for result in results {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((name, code)) => {
                    let err = classify_kafka(&KafkaError::AdminOp(code));
                    return Err(err.context(format_args!("creating Kafka topic {name:?}")));
                }
            }
        }
        tracing::info!(topic, partitions = self.settings.partitions, "created Kafka topic");
        let deadline = Instant::now() + METADATA_TIMEOUT;
        while topic_partitions(producer, topic).await? == 0 {
            if Instant::now() >= deadline {
                return Err(Error::transient(format!("Kafka topic {topic:?} was created but has no partitions yet")));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }
}

/// Partition count of `topic`, 0 when it does not exist.
async fn topic_partitions(producer: &Arc<SinkProducer>, topic: &str) -> Result<usize> {
    let producer = producer.clone();
    let name = topic.to_string();
    let metadata = tokio::task::spawn_blocking(move || producer.client().fetch_metadata(Some(&name), METADATA_TIMEOUT))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards against a dead-letter topic created with the cluster's default retention (7 days): a hold
    /// released later would have lost its first records ([`crate::ops::release`] then refuses).
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
