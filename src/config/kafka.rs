//! `[kafka]`: the destination cluster, and the librdkafka properties the delivery guarantee owns.
//!
//! Floor 2 (docs/ARCHITECTURE.md): imports floors 0-1 (vocabulary, error, metrics).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use super::{default_true, from_env, from_file, Properties};
use crate::error::{Error, Result};

/// `[kafka]`: the destination cluster.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaConfig {
    /// Comma-separated `host:port` list.
    pub bootstrap_servers: String,
    /// Topic template. Placeholders: `${aggregate_type}`, `${event_type}`, `${database}`, `${table}`.
    #[serde(default = "default_topic")]
    pub topic: String,
    /// "envelope" (default: event metadata + `data`), "payload" (the payload only), "cloudevents"
    /// (structured JSON CloudEvents 1.0), or the payload with its schema from `[schema_registry]` in the
    /// Confluent wire format: "avro" (an Avro datum), "json_schema" (the JSON, validated) or "protobuf"
    /// (the payload as Protobuf's canonical JSON, written as the schema's top-level message named like the
    /// row's `event_type`, else its first).
    #[serde(default)]
    pub value_format: ValueFormat,
    /// "string" (default: the aggregate id's bytes), "json" (the aggregate id as a JSON string, what
    /// Debezium with JsonConverter wrote: a migrated topic keeps its partitions) or "avro" (the aggregate id
    /// as an Avro `string` under the subject `<topic>-key`, Confluent wire format, as Debezium's
    /// AvroConverter wrote string keys).
    #[serde(default)]
    pub key_format: KeyFormat,
    /// The record timestamp: "produced" (default: when the connector produced it) or "occurred_at" (the
    /// row's `occurred_at` in ms, UTC, where the table has the column; Debezium:
    /// `table.field.event.timestamp`). Broker retention counts from this timestamp.
    #[serde(default)]
    pub record_timestamp: RecordTimestamp,
    /// Compression codec: "none", "gzip", "snappy", "lz4" (default) or "zstd".
    #[serde(default = "default_compression")]
    pub compression: String,
    /// Create routed topics that do not exist yet through the Admin API. When false, a missing topic is a
    /// definite error naming it.
    #[serde(default = "default_true")]
    pub create_topics: bool,
    /// Partitions of created topics; with `create_topics = false`, the fewest partitions `check` accepts of
    /// an existing routed or dead-letter topic.
    #[serde(default = "default_partitions")]
    pub topic_partitions: i32,
    /// Replication factor of created topics; -1 lets the broker decide (`default.replication.factor`).
    #[serde(default = "default_replication_factor")]
    pub topic_replication_factor: i32,
    /// Topic-level configs for created topics, e.g. `{ "min.insync.replicas" = "2" }`.
    #[serde(default)]
    pub topic_config: BTreeMap<String, String>,
    /// Upper bound, in bytes, of records handed to the producer and not yet acknowledged, each counted with
    /// ~1 KB for librdkafka's own bookkeeping of it. When reached, the binlog reader waits: a slow broker
    /// slows the reader instead of growing memory.
    #[serde(default = "default_max_in_flight_bytes")]
    pub max_in_flight_bytes: usize,
    /// Largest record the connector produces, in bytes (librdkafka `message.max.bytes`); also set as
    /// `max.message.bytes` on topics it creates. Outbox payloads of several MB need more than Kafka's
    /// 1 MB default. A larger record is refused by the producer with a definite error naming it.
    #[serde(default = "default_max_record_bytes")]
    pub max_record_bytes: usize,
    /// librdkafka properties passed through (TLS, SASL, `linger.ms`, `batch.size`, ...). The ones the
    /// delivery guarantee depends on are outbox-cdc's: `enable.idempotence` and `enable.gapless.guarantee`
    /// (true), `acks` (all), `message.timeout.ms`/`delivery.timeout.ms` (0: a record never times out),
    /// `retries` (unlimited), `max.in.flight.requests.per.connection` (at most 5), `queuing.strategy`,
    /// `partitioner` and `transactional.id`; another value is rejected, saying why.
    /// `Debug` masks secret-looking values.
    #[serde(default)]
    pub properties: Properties,
    /// librdkafka properties whose values come from environment variables, read when a command connects:
    /// `{ "sasl.password" = "KAFKA_PASSWORD" }`. Only for secrets (keys such as `sasl.username`,
    /// `sasl.password`, `sasl.oauthbearer.client.secret`, `ssl.key.password`, whose values no message ever
    /// shows); other properties belong in `properties`. A variable that is not set, or set to nothing, is
    /// an error naming it. A key may be set in only one of `properties`, `properties_env` and
    /// `properties_file`.
    #[serde(default)]
    pub properties_env: BTreeMap<String, String>,
    /// librdkafka properties whose values are the contents of files (a Kubernetes Secret mounted as a
    /// volume), read when a command connects: `{ "sasl.password" = "/run/secrets/kafka/password" }`.
    /// Same keys as `properties_env`; a file loses one trailing line break, and an empty or unreadable
    /// file is an error naming the path. (Certificates and keys librdkafka reads from a path itself go in
    /// `properties`: `ssl.ca.location`, `ssl.key.location`.)
    #[serde(default)]
    pub properties_file: BTreeMap<String, PathBuf>,
    /// Who the connector is to the cluster: "properties" (default: as `[kafka.properties]` say, e.g. TLS,
    /// SASL/PLAIN or SCRAM, OAUTHBEARER with `sasl.oauthbearer.method = "oidc"`, GSSAPI) or "aws_iam" (Amazon
    /// MSK's IAM access control: SASL/OAUTHBEARER over TLS with a token signed from the AWS SDK's default
    /// credential chain, for every Kafka client of every command, made again before it expires).
    #[serde(default)]
    pub auth: KafkaAuth,
    /// With `auth = "aws_iam"`, the region of the MSK cluster (its tokens are signed for it); unset: the SDK's
    /// region chain (`AWS_REGION`, the profile, the instance's region).
    #[serde(default)]
    pub aws_region: Option<String>,
    /// Topic for poison rows and the held events of quarantined aggregates (see `outbox.on_poison`).
    /// Created like routed topics. Keyed by aggregate id, so each aggregate's held events stay in order.
    #[serde(default = "default_dead_letter_topic")]
    pub dead_letter_topic: String,
}

fn default_dead_letter_topic() -> String {
    "outbox-cdc.dead-letter".to_string()
}

/// Shape of the Kafka record value.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ValueFormat {
    /// `{"event_id","type","version","occurred_at","aggregate_type","aggregate_id","data"}`.
    #[default]
    Envelope,
    /// The payload only (Debezium's expanded payload): its JSON, or with `payload_encoding = "bytes"` its
    /// bytes.
    Payload,
    /// Structured JSON CloudEvents 1.0 (`specversion`, `id`, `source`, `type`, `subject`, `time`,
    /// `datacontenttype`, `data`).
    #[serde(rename = "cloudevents")]
    CloudEvents,
    /// The payload as an Avro datum of its registered schema, Confluent framed.
    Avro,
    /// The payload, validated against its registered JSON Schema, Confluent framed.
    JsonSchema,
    /// The payload (Protobuf's canonical JSON) as the registered schema's top-level message named like the
    /// row's `event_type` (else its first), Confluent framed with the message-index array.
    Protobuf,
}

impl ValueFormat {
    /// Whether the value is encoded with a schema from the registry.
    pub fn uses_registry(self) -> bool {
        matches!(self, ValueFormat::Avro | ValueFormat::JsonSchema | ValueFormat::Protobuf)
    }
}

/// Shape of the Kafka record key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyFormat {
    /// The aggregate id's UTF-8 bytes.
    #[default]
    String,
    /// The aggregate id as a JSON string (with quotes).
    Json,
    /// The aggregate id as an Avro `string` of the subject `<topic>-key`, Confluent framed.
    Avro,
}

/// `kafka.auth`: how the connector proves who it is to the cluster.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KafkaAuth {
    /// As `[kafka.properties]` configure it (or no authentication).
    #[default]
    Properties,
    /// Amazon MSK IAM: SASL/OAUTHBEARER with a SigV4-presigned `kafka-cluster:Connect` token.
    AwsIam,
}

/// What `auth = "aws_iam"` sets unless the properties do, and the one value it allows there.
const AWS_IAM_PROPERTIES: &[(&str, &str)] = &[("security.protocol", "SASL_SSL"), ("sasl.mechanism", "OAUTHBEARER")];

/// Which time the Kafka record carries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordTimestamp {
    /// When the connector produced the record (the producer's clock).
    #[default]
    Produced,
    /// The row's `occurred_at` (ms, UTC), where the table has the column.
    OccurredAt,
}

fn default_topic() -> String {
    "outbox.event.${aggregate_type}".into()
}
fn default_compression() -> String {
    "lz4".into()
}

fn default_partitions() -> i32 {
    12
}
fn default_replication_factor() -> i32 {
    -1
}
fn default_max_in_flight_bytes() -> usize {
    16 * 1024 * 1024
}

fn default_max_record_bytes() -> usize {
    16 * 1024 * 1024
}

/// A librdkafka property the delivery guarantee depends on: the values that keep it (compared without
/// case), and why no other value may.
struct OwnedProperty {
    keys: &'static [&'static str],
    allowed: fn(&str) -> bool,
    why: &'static str,
}

/// librdkafka properties outbox-cdc sets itself (aliases included). A record that fails for good while a
/// later record of its partition gets through is written *after* that later record once the run restarts
/// from the checkpoint (A2, A1, A2): so no record may time out or run out of retries, and a batch that
/// fails for good must stop the producer (gap-less idempotence) rather than let the next batch through.
const OWNED_PROPERTIES: &[OwnedProperty] = &[
    OwnedProperty {
        keys: &["enable.idempotence"],
        allowed: |v| v.eq_ignore_ascii_case("true"),
        why: "the idempotent producer keeps each partition's records in order across retries and reconnects; \
              outbox-cdc always sets it to true",
    },
    OwnedProperty {
        keys: &["enable.gapless.guarantee"],
        allowed: |v| v.eq_ignore_ascii_case("true"),
        why: "without it a batch that fails for good lets the next batches of its partition through, and \
              the restart writes the failed records after them; outbox-cdc always sets it to true",
    },
    OwnedProperty {
        keys: &["acks", "request.required.acks"],
        allowed: |v| v.eq_ignore_ascii_case("all") || v == "-1",
        why: "only acks=all keeps an acknowledged record when a partition leader fails; outbox-cdc always \
              uses acks=all",
    },
    OwnedProperty {
        keys: &["message.timeout.ms", "delivery.timeout.ms"],
        allowed: |v| v == "0",
        why: "a record that times out lets later records of its partition through, and the restart writes it \
              after them. outbox-cdc never times a record out: while the broker is unreachable it waits \
              (logged, and outbox_cdc_ready = 0) and nothing unacknowledged is checkpointed",
    },
    OwnedProperty {
        keys: &["retries", "message.send.max.retries"],
        allowed: |v| v == "2147483647",
        why: "a record that runs out of retries fails while later records of its partition get through; \
              outbox-cdc retries without limit",
    },
    OwnedProperty {
        keys: &["max.in.flight.requests.per.connection", "max.in.flight"],
        allowed: |v| v.parse::<u32>().is_ok_and(|n| (1..=5).contains(&n)),
        why: "the idempotent producer keeps order with at most 5 requests in flight per connection",
    },
    OwnedProperty {
        keys: &["queuing.strategy"],
        allowed: |v| v.eq_ignore_ascii_case("fifo"),
        why: "records must leave in the order they were produced",
    },
    OwnedProperty {
        keys: &["partitioner"],
        allowed: |v| v == "murmur2_random",
        why: "outbox-cdc places each aggregate with murmur2 (the Java client's partitioner), so that every \
              client agrees on an aggregate's partition",
    },
    OwnedProperty {
        keys: &["transactional.id"],
        allowed: |_| false,
        why: "outbox-cdc sets it from [delivery] transactional_id with guarantee = \"exactly_once\" (the polling \
              relay: [poll] transactional = true)",
    },
];

/// librdkafka properties that have their own `[kafka]` setting.
const DEDICATED_PROPERTIES: &[&str] =
    &["bootstrap.servers", "compression.type", "compression.codec", "message.max.bytes"];

/// Refuses a `properties_env` or `properties_file` key that is set elsewhere too, that outbox-cdc owns or
/// has a dedicated setting for, or that is not a secret: only the values of secret-looking keys are kept
/// out of every message ([`crate::secret::is_secret_key`]), and these tables hold secrets.
fn validate_secret_properties(kafka: &KafkaConfig) -> Result<()> {
    let env = kafka.properties_env.iter().map(|(k, v)| ("properties_env", k, v.is_empty()));
    let file = kafka.properties_file.iter().map(|(k, v)| ("properties_file", k, v.as_os_str().is_empty()));
    for (table, key, empty) in env.chain(file) {
        let elsewhere = [
            ("properties", kafka.properties.contains_key(key)),
            ("properties_env", kafka.properties_env.contains_key(key)),
            ("properties_file", kafka.properties_file.contains_key(key)),
        ];
        if let Some((other, _)) = elsewhere.iter().find(|(other, set)| *set && *other != table) {
            return Err(Error::definite(format!(
                "kafka.{table}.\"{key}\" is set in kafka.{other} too: set each property in one place"
            )));
        }
        if empty {
            return Err(Error::definite(format!("kafka.{table}.\"{key}\" names nothing: name a variable or a file")));
        }
        if OWNED_PROPERTIES.iter().any(|o| o.keys.contains(&key.as_str())) {
            return Err(Error::definite(format!(
                "kafka.{table}.\"{key}\": outbox-cdc sets {key} itself (the delivery guarantee depends on it); \
                 remove it"
            )));
        }
        if DEDICATED_PROPERTIES.contains(&key.as_str()) {
            return Err(Error::definite(format!("kafka.{table}.\"{key}\": use the dedicated [kafka] setting instead")));
        }
        if !crate::secret::is_secret_key(key) {
            return Err(Error::definite(format!(
                "kafka.{table}.\"{key}\": {table} is for secrets (sasl.username, sasl.password, \
                 sasl.oauthbearer.client.secret, ssl.key.password, ...), whose values no message shows; \
                 {key} is not one, set it in [kafka.properties]"
            )));
        }
    }
    Ok(())
}

/// Refuses librdkafka properties that would weaken the delivery guarantee, saying why and what to do.
fn validate_kafka_properties(properties: &BTreeMap<String, String>) -> Result<()> {
    for (key, value) in properties {
        let Some(owned) = OWNED_PROPERTIES.iter().find(|o| o.keys.contains(&key.as_str())) else {
            continue;
        };
        if !(owned.allowed)(value.trim()) {
            return Err(Error::definite(format!(
                "kafka.properties.\"{key}\" = {value:?} would weaken the delivery guarantee: {}. Remove it from \
                 [kafka.properties]",
                owned.why
            )));
        }
    }
    Ok(())
}

/// `transaction.timeout.ms` unless configured: how long a Kafka transaction may stay open (the broker's
/// `transaction.max.timeout.ms`, 15 minutes by default, caps it).
pub const DEFAULT_TRANSACTION_TIMEOUT_MS: u64 = 60_000;

impl KafkaConfig {
    /// The event producer's `transaction.timeout.ms` (`exactly_once`): `properties."transaction.timeout.ms"`,
    /// else [`DEFAULT_TRANSACTION_TIMEOUT_MS`].
    ///
    /// # Errors
    /// A definite error when the property is not a number.
    pub fn transaction_timeout_ms(&self) -> Result<u64> {
        match self.properties.get("transaction.timeout.ms") {
            Some(v) => v.trim().parse::<u64>().map_err(|_| {
                Error::definite(format!("kafka.properties.\"transaction.timeout.ms\" = {v:?} is not a number"))
            }),
            None => Ok(DEFAULT_TRANSACTION_TIMEOUT_MS),
        }
    }

    /// The librdkafka configuration every Kafka client starts from: the producer, the admin client, the
    /// state store's clients, and the consumers of `audit` and `quarantine release`; with the secrets of
    /// `properties_env` and `properties_file` read ([`KafkaConfig::resolved_properties`]).
    ///
    /// # Errors
    /// A definite error when a secret's variable or file is missing.
    pub fn client_config(&self) -> Result<rdkafka::config::ClientConfig> {
        let mut cc = rdkafka::config::ClientConfig::new();
        cc.set("bootstrap.servers", &self.bootstrap_servers).set("client.id", "outbox-cdc");
        for (k, v) in &self.resolved_properties()? {
            cc.set(k, v);
        }
        Ok(cc)
    }

    /// `properties` with the secrets of `properties_env` and `properties_file` added: what every Kafka
    /// client of every command (`run`, `check`, `audit`, `replay`, `quarantine release`) is configured with.
    ///
    /// # Errors
    /// A definite error naming the variable that is not set (or empty), or the file that cannot be read or
    /// is empty; never with a secret's value.
    pub fn resolved_properties(&self) -> Result<Properties> {
        let mut resolved: BTreeMap<String, String> =
            self.properties.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        for (key, var) in &self.properties_env {
            let secret = from_env(&format!("kafka.properties_env (for {key})"), var)?;
            if secret.expose().is_empty() {
                return Err(Error::definite(format!(
                    "kafka.properties_env (for {key}) names {var}, but that environment variable is empty"
                )));
            }
            resolved.insert(key.clone(), secret.expose().to_string());
        }
        for (key, path) in &self.properties_file {
            let secret = from_file(&format!("kafka.properties_file (for {key})"), path)?;
            resolved.insert(key.clone(), secret.expose().to_string());
        }
        if self.auth == KafkaAuth::AwsIam {
            for (key, value) in AWS_IAM_PROPERTIES {
                resolved.entry((*key).to_string()).or_insert_with(|| (*value).to_string());
            }
        }
        Ok(resolved.into_iter().collect())
    }
}

impl KafkaConfig {
    /// Checks the section on its own (`topic` is parsed by [`super::Config::parse`]): the dead-letter
    /// topic's name, the properties the delivery guarantee owns or that have a setting of their own, the
    /// secret tables, and the bounds.
    pub(super) fn validate(&self) -> Result<()> {
        if !crate::topic::is_legal_topic(&self.dead_letter_topic) {
            return Err(Error::definite(format!(
                "kafka.dead_letter_topic {:?} is not a legal Kafka topic name (1-249 of [a-zA-Z0-9._-])",
                self.dead_letter_topic
            )));
        }
        validate_kafka_properties(&self.properties)?;
        for key in DEDICATED_PROPERTIES {
            if self.properties.contains_key(*key) {
                return Err(Error::definite(format!(
                    "kafka.properties.{key}: use the dedicated [kafka] setting instead"
                )));
            }
        }
        validate_secret_properties(self)?;
        self.validate_auth()?;
        if self.topic_partitions < 1 {
            return Err(Error::definite("kafka.topic_partitions must be at least 1"));
        }
        if self.max_in_flight_bytes < 1024 * 1024 {
            return Err(Error::definite("kafka.max_in_flight_bytes must be at least 1 MiB"));
        }
        if !(1024..=1_000_000_000).contains(&self.max_record_bytes) {
            return Err(Error::definite("kafka.max_record_bytes must be between 1024 and 1000000000"));
        }
        if !["none", "gzip", "snappy", "lz4", "zstd"].contains(&self.compression.as_str()) {
            return Err(Error::definite(format!(
                "kafka.compression = {:?}: expected none, gzip, snappy, lz4 or zstd",
                self.compression
            )));
        }
        Ok(())
    }
}

impl KafkaConfig {
    /// `auth = "aws_iam"` owns the SASL mechanism and asks for TLS that verifies the broker: an MSK token is a
    /// bearer credential for 15 minutes, which anyone who reads it off a plaintext connection (or off a
    /// broker that is not the cluster) can replay. MSK serves IAM on its SASL_SSL listener (port 9098).
    fn validate_auth(&self) -> Result<()> {
        let property = |key: &str| self.properties.get(key).map(|v| v.trim().to_ascii_lowercase());
        if self.auth != KafkaAuth::AwsIam {
            if self.aws_region.is_some() {
                return Err(Error::definite("kafka.aws_region is only for kafka.auth = \"aws_iam\"; remove it"));
            }
            return Ok(());
        }
        let mechanism = property("sasl.mechanism").or_else(|| property("sasl.mechanisms"));
        let refusals = [
            (
                "security.protocol",
                property("security.protocol").filter(|v| v != "sasl_ssl"),
                "MSK serves IAM on its SASL_SSL listener (port 9098), and a token sent without TLS can be \
                 replayed for 15 minutes by whoever reads it; remove it (aws_iam sets SASL_SSL)",
            ),
            (
                "sasl.mechanism",
                mechanism.filter(|v| v != "oauthbearer"),
                "aws_iam authenticates with SASL/OAUTHBEARER; remove it",
            ),
            (
                "sasl.oauthbearer.method",
                property("sasl.oauthbearer.method").filter(|v| v != "default"),
                "aws_iam makes the tokens itself; an OIDC token endpoint is another way to authenticate, \
                 set kafka.auth = \"properties\" for it",
            ),
            (
                "enable.sasl.oauthbearer.unsecure.jwt",
                property("enable.sasl.oauthbearer.unsecure.jwt").filter(|v| v != "false"),
                "an unsigned JWT is not an MSK token; remove it",
            ),
            (
                "enable.ssl.certificate.verification",
                property("enable.ssl.certificate.verification").filter(|v| v != "true"),
                "a token must go only to a broker whose certificate is verified; remove it",
            ),
            (
                "ssl.endpoint.identification.algorithm",
                property("ssl.endpoint.identification.algorithm").filter(|v| v != "https"),
                "a token must go only to a broker whose certificate names it; remove it",
            ),
        ];
        for (key, value, why) in refusals {
            if let Some(value) = value {
                return Err(Error::definite(format!(
                    "kafka.properties.\"{key}\" = {value:?} with kafka.auth = \"aws_iam\": {why}"
                )));
            }
        }
        if self.aws_region.as_deref().is_some_and(|r| r.trim().is_empty()) {
            return Err(Error::definite("kafka.aws_region is empty: name the MSK cluster's region, or remove it"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::tests::MINIMAL;
    use crate::config::*;

    /// Guards against a user-set `message.timeout.ms` (or a retry limit, or idempotence without the
    /// gap-less guarantee) letting later records of a partition overtake one that failed: the restart would
    /// then write A2, A1, A2. Each owned property (and its librdkafka alias) is refused with the reason, and
    /// the values that keep the guarantee are accepted.
    #[test]
    fn properties_that_weaken_the_delivery_guarantee_are_rejected() {
        let cases: &[(&str, &str, Option<&str>)] = &[
            ("enable.idempotence", "false", Some("in order across retries")),
            ("enable.idempotence", "TRUE", None),
            ("enable.gapless.guarantee", "false", Some("fails for good")),
            ("enable.gapless.guarantee", "true", None),
            ("acks", "1", Some("acks=all")),
            ("request.required.acks", "0", Some("acks=all")),
            ("acks", "all", None),
            ("acks", "-1", None),
            ("message.timeout.ms", "2000", Some("never times a record out")),
            ("delivery.timeout.ms", "300000", Some("never times a record out")),
            ("message.timeout.ms", "0", None),
            ("retries", "10", Some("retries without limit")),
            ("message.send.max.retries", "3", Some("retries without limit")),
            ("max.in.flight.requests.per.connection", "6", Some("at most 5")),
            ("max.in.flight", "0", Some("at most 5")),
            ("max.in.flight", "1", None),
            ("max.in.flight.requests.per.connection", "5", None),
            ("queuing.strategy", "lifo", Some("order they were produced")),
            ("partitioner", "consistent_random", Some("murmur2")),
            ("transactional.id", "outbox", Some("[delivery] transactional_id")),
            ("linger.ms", "20", None),
            ("batch.size", "65536", None),
        ];
        for (key, value, refusal) in cases {
            let text = format!("{MINIMAL}\n[kafka.properties]\n\"{key}\" = \"{value}\"\n");
            match (Config::parse(&text), refusal) {
                (Ok(_), None) => {}
                (Err(e), Some(why)) => {
                    let e = e.to_string();
                    assert!(e.contains(key) && e.contains(why) && e.contains("Remove it"), "{key}={value}: {e}");
                }
                (result, _) => panic!("{key}={value}: {:?}", result.map(|_| ())),
            }
        }
    }

    /// Regression: `[kafka.properties]` printed every value in `Debug`, a SASL password (or a misspelled
    /// one) included.
    #[test]
    fn kafka_property_secrets_are_redacted_in_debug() {
        let text = format!(
            "{MINIMAL}\n[kafka.properties]\n\"sasl.password\" = \"hunter2\"\n\"sasl.pasword\" = \"hunter3\"\n\
             \"linger.ms\" = \"7\"\n[prune]\nuser = \"p\"\npassword = \"hunter4\"\n"
        );
        let c = Config::parse(&text).unwrap();
        let dbg = format!("{c:?}");
        for secret in ["hunter2", "hunter3", "hunter4"] {
            assert!(!dbg.contains(secret), "{secret} in {dbg}");
        }
        assert!(dbg.contains(r#""linger.ms": "7""#), "{dbg}");
        assert_eq!(c.kafka.properties.get("sasl.password").map(String::as_str), Some("hunter2"));
    }

    /// The secrets of `properties_env` and `properties_file` join the literal properties; a file loses
    /// its trailing newline. A missing variable or file is a definite error naming it and the setting.
    #[test]
    fn kafka_secrets_are_read_from_the_environment_and_files() {
        let dir = tempfile::tempdir().unwrap();
        let password = dir.path().join("kafka-password");
        std::fs::write(&password, "hunter2\n").unwrap();
        // PATH: a variable every test process has, so that the test sets none.
        let text = format!(
            "{MINIMAL}\n[kafka.properties]\n\"sasl.mechanism\" = \"SCRAM-SHA-512\"\n[kafka.properties_env]\n\
             \"sasl.username\" = \"PATH\"\n[kafka.properties_file]\n\"sasl.password\" = \"{}\"\n",
            password.display()
        );
        let config = Config::parse(&text).unwrap();
        let resolved = config.kafka.resolved_properties().unwrap();
        let get = |key: &str| resolved.get(key).map(String::as_str);
        assert_eq!(get("sasl.mechanism"), Some("SCRAM-SHA-512"));
        assert_eq!(get("sasl.password"), Some("hunter2"));
        assert_eq!(get("sasl.username"), std::env::var("PATH").ok().as_deref());
        assert!(!format!("{config:?}{resolved:?}").contains("hunter2"));

        std::fs::remove_file(&password).unwrap();
        let error = config.kafka.resolved_properties().unwrap_err();
        let text_of = error.to_string();
        assert!(error.is_definite(), "{text_of}");
        assert!(text_of.contains("kafka.properties_file (for sasl.password)"), "{text_of}");
        assert!(text_of.contains(&password.display().to_string()) && text_of.contains("No such file"), "{text_of}");

        std::fs::write(&password, "\n").unwrap();
        let error = config.kafka.resolved_properties().unwrap_err().to_string();
        assert!(error.contains("the file is empty") && error.contains("kafka-password"), "{error}");

        let unset = "OUTBOX_CDC_TEST_UNSET_KAFKA_VAR";
        let config =
            Config::parse(&format!("{MINIMAL}\n[kafka.properties_env]\n\"sasl.password\" = \"{unset}\"\n")).unwrap();
        let error = config.kafka.resolved_properties().unwrap_err();
        assert!(error.is_definite());
        assert!(error.to_string().contains(&format!("kafka.properties_env (for sasl.password) names {unset}")));
    }

    /// `auth = "aws_iam"` sets SASL_SSL and OAUTHBEARER for every client (the filtered copies of `audit`'s
    /// reader included, which start from `resolved_properties`), and refuses what would send its token in
    /// clear, to an unverified broker or by another mechanism; `aws_region` goes only with it.
    #[test]
    fn aws_iam_owns_the_mechanism_and_asks_for_verified_tls() {
        let parse = |extra: &str| Config::parse(&format!("{MINIMAL}auth = \"aws_iam\"\n{extra}"));
        let config = parse("aws_region = \"eu-west-1\"\n").unwrap();
        let resolved = config.kafka.resolved_properties().unwrap();
        assert_eq!(resolved.get("security.protocol").map(String::as_str), Some("SASL_SSL"));
        assert_eq!(resolved.get("sasl.mechanism").map(String::as_str), Some("OAUTHBEARER"));
        let kept = parse("[kafka.properties]\n\"security.protocol\" = \"sasl_ssl\"\n").unwrap();
        assert_eq!(
            kept.kafka.resolved_properties().unwrap().get("security.protocol").map(String::as_str),
            Some("sasl_ssl")
        );
        for (property, why) in [
            ("\"security.protocol\" = \"SASL_PLAINTEXT\"", "SASL_SSL listener"),
            ("\"sasl.mechanism\" = \"SCRAM-SHA-512\"", "OAUTHBEARER"),
            ("\"sasl.mechanisms\" = \"PLAIN\"", "OAUTHBEARER"),
            ("\"sasl.oauthbearer.method\" = \"oidc\"", "makes the tokens itself"),
            ("\"enable.sasl.oauthbearer.unsecure.jwt\" = \"true\"", "unsigned JWT"),
            ("\"enable.ssl.certificate.verification\" = \"false\"", "certificate is verified"),
            ("\"ssl.endpoint.identification.algorithm\" = \"none\"", "certificate names it"),
        ] {
            let error = parse(&format!("[kafka.properties]\n{property}\n")).unwrap_err().to_string();
            assert!(error.contains(why) && error.contains("aws_iam"), "{property}: {error}");
        }
        let error = parse("aws_region = \" \"\n").unwrap_err().to_string();
        assert!(error.contains("kafka.aws_region is empty"), "{error}");
        let error = Config::parse(&format!("{MINIMAL}aws_region = \"eu-west-1\"\n")).unwrap_err().to_string();
        assert!(error.contains("only for kafka.auth = \"aws_iam\""), "{error}");
        let plain = Config::parse(MINIMAL).unwrap().kafka.resolved_properties().unwrap();
        assert!(!plain.contains_key("sasl.mechanism") && !plain.contains_key("security.protocol"));
    }
}
