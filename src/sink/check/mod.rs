//! `outbox-cdc check`, the Kafka half: what `run` will need from the cluster, asked before it is needed.
//!
//! Floor 4 (docs/ARCHITECTURE.md): imports floors 0-3.
//!
//! The check connects with the producer's own configuration ([`super::kafka::producer_config`]: the
//! configured `[kafka.properties]` with the delivery guarantee's settings over them), so a property
//! librdkafka refuses, a wrong credential or an unreachable listener shows here exactly as it would at `run`.
//! Then, for every topic the connector will write to (the routed topics the caller lists, and the dead-letter
//! topic):
//! - it exists with at least `kafka.topic_partitions` partitions, or, with `kafka.create_topics = true`, a
//!   validate-only CreateTopics with the settings `run` creates it with is accepted;
//! - its `max.message.bytes` takes the producer's batches ([`super::limits::check_topic_limit`], the rule `run`
//!   applies at a topic's first record), and the dead-letter topic takes records of `kafka.max_record_bytes`.
//!
//! And once for the cluster: the idempotent producer gets a producer id (InitProducerId), which needs the
//! permission to write: `IDEMPOTENT_WRITE` on the cluster, or, from Kafka 3.0 on (KIP-679), `WRITE` on any
//! topic. librdkafka asks for it as soon as a broker is up, before any record is produced, and makes an
//! authorization error fatal: so the check produces nothing and still sees the refusal `run` would meet.
//!
//! Only when the config uses them, the exactly-once prerequisites:
//! - with `[state] backend = "kafka"`, the state topic as `run` judges it ([`state`]: one partition,
//!   compact only, its durability as warnings) and the readers' group lookup (information: it needs no ACL);
//! - with the Kafka backend, `exactly_once` or `poll.transactional`, transactions and the transactional-id
//!   ACLs ([`transactional`]), proven through probe ids under the connector's own, never with them: using
//!   the connector's id would fence a running instance. What a probe does and does not prove is there.
//!
//! Every ACL a finding asks for comes from one table, [`acls`], which the README's "Kafka ACLs" table is
//! tested against.
//!
//! # What it cannot see
//! - The broker's version: the Kafka protocol has no field for it. What the broker does say is the range of
//!   versions of each request it supports (ApiVersions); the check shows those that the connector uses.
//! - `WRITE` on each topic: only a produce request proves it, and the check does not write to the user's
//!   topics. The producer id proves write permission somewhere; a topic without it fails at `run` with
//!   TOPIC_AUTHORIZATION_FAILED, a definite error naming the topic.
//! - A validate-only CreateTopics is only as good as the broker's support of it: a broker that ignores the
//!   flag creates the topic (with the settings `run` would have used); the finding says so.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::OAuthToken;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseProducer, DeliveryResult, Producer, ProducerContext};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientContext, Statistics};

use super::kafka;
use super::topics::TopicSettings;
use crate::config::{Config, KafkaConfig, StateBackend};
use crate::error::{classify_kafka, Error, Result};
use crate::findings::{Finding, Report, Status};
use crate::kafka::identity::{self, Context, Tokened, Tokens};

pub mod acls;
mod findings;
mod state;
pub mod transactional;

use findings::{
    creation_finding, limit_finding, producer_id_finding, topic_finding, warn, ProducerId, TopicState, CHECK_TIMEOUT,
};

/// The APIs whose supported versions the check shows: the ones the connector sends.
const SHOWN_APIS: [&str; 6] = ["Produce", "Metadata", "InitProducerId", "CreateTopics", "DescribeConfigs", "Fetch"];

/// What `check` found out about the Kafka cluster.
#[derive(Debug, Clone)]
pub struct KafkaCheck {
    /// The cluster id, when the broker reports one.
    pub cluster_id: Option<String>,
    /// `id at host:port` of each broker in the metadata.
    pub brokers: Vec<String>,
    /// `(api, min, max)` of each request the first broker that answered supports, in ApiKey order.
    pub api_versions: Vec<(String, i16, i16)>,
    /// One finding per requirement, printed like the source's.
    pub report: Report,
    /// Who the cluster accepted, with `kafka.auth = "aws_iam"`.
    pub identity: Option<String>,
}

impl fmt::Display for KafkaCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "kafka: cluster id {}; broker(s): {}",
            self.cluster_id.as_deref().unwrap_or("(not reported)"),
            self.brokers.join(", ")
        )?;
        writeln!(f, "kafka broker version: {}", describe_versions(&self.api_versions))?;
        if let Some(who) = &self.identity {
            writeln!(f, "kafka identity: {who}: accepted by the cluster")?;
        }
        write!(f, "{}", self.report)
    }
}

/// The broker's version as far as the protocol tells it.
fn describe_versions(apis: &[(String, i16, i16)]) -> String {
    if apis.is_empty() {
        return "not part of the Kafka protocol, and the broker's ApiVersions answer was not seen (a broker \
                before Kafka 0.10, or api.version.request = false)"
            .to_string();
    }
    let shown: Vec<String> = SHOWN_APIS
        .iter()
        .filter_map(|name| apis.iter().find(|(api, _, _)| api == name))
        .map(|(api, min, max)| format!("{api} v{min}-{max}"))
        .collect();
    format!(
        "not part of the Kafka protocol; the broker supports {} request types, among them {}",
        apis.len(),
        shown.join(", ")
    )
}

/// An error librdkafka reported through the error callback: its code, and its text.
type SeenError = (Option<RDKafkaErrorCode>, String);

/// What the check's producer saw through librdkafka's callbacks.
#[derive(Debug, Default)]
struct Observed {
    /// From the `APIVERSION` debug lines of the first broker that answered.
    api_versions: Vec<(String, i16, i16)>,
    /// The idempotent producer's state and id, from the statistics.
    producer_id: Option<(String, i64)>,
    /// Errors librdkafka reported while retrying (connection, TLS, SASL), newest last.
    errors: Vec<SeenError>,
}

/// Collects [`Observed`]; every other log line goes to `tracing` at debug level (the check prints findings,
/// not librdkafka's retries).
#[derive(Default)]
struct CheckContext {
    observed: Mutex<Observed>,
    tokens: Tokens,
}

impl Tokened for CheckContext {
    fn tokens(&self) -> &Tokens {
        &self.tokens
    }
}

impl CheckContext {
    fn observed(&self) -> std::sync::MutexGuard<'_, Observed> {
        self.observed.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl ClientContext for CheckContext {
    const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;

    fn generate_oauth_token(&self, _config: Option<&str>) -> Result<OAuthToken, Box<dyn std::error::Error>> {
        self.tokens.generate()
    }

    fn log(&self, _level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        if fac == "APIVERSION" {
            if let Some(api) = parse_api_version(log_message) {
                let mut observed = self.observed();
                // Each broker logs its list; keep the first broker's.
                if !observed.api_versions.iter().any(|(name, _, _)| *name == api.0) {
                    observed.api_versions.push(api);
                }
            }
            return;
        }
        tracing::debug!(target: "librdkafka", fac, "{log_message}");
    }

    fn error(&self, error: KafkaError, reason: &str) {
        let mut observed = self.observed();
        observed.errors.push((error.rdkafka_error_code(), format!("{error}: {reason}")));
        let excess = observed.errors.len().saturating_sub(16);
        observed.errors.drain(..excess);
    }

    fn stats(&self, statistics: Statistics) {
        if let Some(eos) = statistics.eos {
            self.observed().producer_id = Some((eos.idemp_state, eos.producer_id));
        }
    }
}

impl ProducerContext for CheckContext {
    type DeliveryOpaque = ();

    fn delivery(&self, _: &DeliveryResult<'_>, _: ()) {}
}

/// `(api, min, max)` from librdkafka's `APIVERSION` debug line `…ApiKey Produce (0) Versions 0..11`.
fn parse_api_version(line: &str) -> Option<(String, i16, i16)> {
    let rest = &line[line.find("ApiKey ")? + "ApiKey ".len()..];
    let (name, rest) = rest.split_once(" (")?;
    let versions = rest.split_once("Versions ")?.1.trim();
    let (min, max) = versions.split_once("..")?;
    Some((name.to_string(), min.trim().parse().ok()?, max.trim().parse().ok()?))
}

/// Checks the cluster `config` names for everything `run` will need, writing to the `routed` topics (as
/// the caller could list them: `Err` says why it could not) and the dead-letter topic, and with the Kafka
/// state backend or transactions, their prerequisites (module doc).
///
/// # Errors
/// A definite error when librdkafka refuses the configuration or the broker the credentials; a transient
/// one when no broker answers. Everything else is a finding.
pub async fn check(full: &Config, routed: Result<Vec<String>>) -> Result<KafkaCheck> {
    let config = &full.kafka;
    let (mut cc, batch_limit_bytes) = kafka::producer_config(config)?;
    // The ApiVersions answer is logged only at debug level with the `feature` context; the statistics carry
    // the idempotent producer's state.
    let debug = match config.properties.get("debug") {
        Some(d) if !d.trim().is_empty() => format!("{d},feature"),
        _ => "feature".to_string(),
    };
    cc.set("debug", &debug).set("statistics.interval.ms", "100").set_log_level(RDKafkaLogLevel::Debug);
    let tokens = Tokens::of(config)?;
    let producer: BaseProducer<CheckContext> =
        identity::create(&cc, CheckContext { tokens: tokens.clone(), ..CheckContext::default() })?;
    let producer = Arc::new(producer);
    let admin: AdminClient<Context> = identity::create(&kafka::client_config(config)?, Context::new(tokens))?;
    let settings = TopicSettings::of(config, batch_limit_bytes);

    let mut report = Report::default();
    let mut topics: BTreeSet<String> = BTreeSet::new();
    match routed {
        Ok(list) if list.is_empty() => report.findings.push(warn(
            "kafka routed topics",
            "the topics the outbox rows route to",
            "none yet (the topic template depends on the rows, and the table has none)",
            "only the dead-letter topic was checked; the routed topics are checked when rows exist",
        )),
        Ok(list) => topics.extend(list),
        Err(e) => report.findings.push(warn(
            "kafka routed topics",
            "the topics the outbox rows route to",
            "cannot be listed",
            &format!("only the dead-letter topic was checked ({e})"),
        )),
    }
    topics.insert(config.dead_letter_topic.clone());

    let (cluster_id, brokers) = blocking(&producer, connect).await?;
    let identity = producer.context().tokens.last_who();
    for topic in &topics {
        let dead_letter = *topic == config.dead_letter_topic;
        check_topic(&producer, &admin, &settings, config, topic, dead_letter, batch_limit_bytes, &mut report).await?;
    }
    let outcome = blocking(&producer, |p| Ok(await_producer_id(p))).await?;
    report.findings.push(producer_id_finding(&outcome));
    check_exactly_once(full, &producer, &admin, &mut report).await?;
    let api_versions = producer.context().observed().api_versions.clone();
    Ok(KafkaCheck { cluster_id, brokers, api_versions, report, identity })
}

/// The exactly-once prerequisites `config` asks for (module doc): the state topic and the readers' group
/// lookup with the Kafka backend, then transactions and each transactional id.
async fn check_exactly_once(
    config: &Config,
    producer: &Arc<BaseProducer<CheckContext>>,
    admin: &AdminClient<Context>,
    report: &mut Report,
) -> Result<()> {
    if config.state.backend == StateBackend::Kafka {
        let topic = config.state.topic.clone();
        let layout = blocking(producer, move |p| state::layout(p.client(), &topic)).await?;
        let described = match layout.state {
            TopicState::Exists(_) => state::describe(admin, &config.state.topic).await,
            _ => Err("the topic is not there".to_string()),
        };
        report.findings.extend(state::topic_findings(config, &layout, described));
    }
    let mut first = true;
    for (resource, id) in transactional::ids(config) {
        let probe_id = transactional::probe_id(&id);
        let outcome = transactional::probe(&config.kafka, &probe_id).await?;
        if std::mem::take(&mut first) {
            report.findings.push(transactional::transactions_finding(&probe_id, &outcome));
        }
        report.findings.push(transactional::id_finding(resource, &id, &outcome));
    }
    if config.state.backend == StateBackend::Kafka {
        let (group, lookup) = state::group_lookup(config).await?;
        report.findings.push(state::group_finding(&group, &lookup));
    }
    Ok(())
}

/// The routed topics known without reading outbox rows (`source.kind = "files"` has no table to read): the
/// topic template rendered for each outbox table, when it depends on no column of the row.
///
/// # Errors
/// Why they are not known: the template depends on the rows.
pub fn topics_without_rows(config: &Config) -> Result<Vec<String>> {
    let template = config.topic();
    if template.uses_columns() != (false, false) {
        return Err(Error::definite(format!(
            "kafka.topic {:?} depends on the rows' columns, which source.kind = \"files\" has no table to list",
            config.kafka.topic
        )));
    }
    let topics: BTreeSet<String> = config.tables().iter().map(|t| template.render_parts(t, "", "")).collect();
    Ok(topics.into_iter().collect())
}

/// Runs `f` on the producer on a blocking thread (librdkafka's metadata calls block).
async fn blocking<T: Send + 'static>(
    producer: &Arc<BaseProducer<CheckContext>>,
    f: impl FnOnce(&BaseProducer<CheckContext>) -> Result<T> + Send + 'static,
) -> Result<T> {
    let producer = producer.clone();
    tokio::task::spawn_blocking(move || f(&producer))
        .await
        .map_err(|e| Error::transient(format!("the Kafka check's task failed: {e}")))?
}

/// Asks for the cluster's metadata: the first answer proves that the listener, TLS and SASL settings work.
fn connect(producer: &BaseProducer<CheckContext>) -> Result<(Option<String>, Vec<String>)> {
    let client = producer.client();
    let metadata = match client.fetch_metadata(None, CHECK_TIMEOUT) {
        Ok(m) => m,
        Err(e) => {
            // The error callbacks of the attempts are queued until polled.
            for _ in 0..20 {
                producer.poll(Duration::from_millis(10));
            }
            let context = producer.context();
            return Err(unreachable(&e, &context.observed().errors, context.tokens.denied_hint()));
        }
    };
    let brokers = metadata.brokers().iter().map(|b| format!("{} at {}:{}", b.id(), b.host(), b.port())).collect();
    Ok((client.fetch_cluster_id(CHECK_TIMEOUT), brokers))
}

/// Why no broker answered: a refused credential or certificate is definite (it needs an operator), anything
/// else transient (as for the source: exit 3, "cannot be reached").
fn unreachable(error: &KafkaError, seen: &[SeenError], denied_hint: Option<String>) -> Error {
    let definite = seen.iter().rev().find(|(code, _)| {
        matches!(code, Some(RDKafkaErrorCode::Authentication | RDKafkaErrorCode::SaslAuthenticationFailed))
            || matches!(code, Some(RDKafkaErrorCode::SSL))
    });
    if let Some((code, reason)) = definite {
        if let (Some(hint), false) = (denied_hint, matches!(code, Some(RDKafkaErrorCode::SSL))) {
            return Error::definite(format!("Kafka refused the connection: {reason}. {hint}"));
        }
        return Error::definite(format!(
            "Kafka refused the connection: {reason}. Check the security.protocol, ssl.* and sasl.* entries of \
             [kafka.properties] and the broker's listener"
        ));
    }
    let last = seen.last().map(|(_, r)| format!(" (last error: {r})")).unwrap_or_default();
    classify_kafka(error).context(format_args!(
        "no Kafka broker answered within {} s{last}; check kafka.bootstrap_servers, the network, and that \
         security.protocol matches the broker's listener (a TLS client waits on a plaintext listener)",
        CHECK_TIMEOUT.as_secs()
    ))
}

/// The topic's state in the metadata, asked for the topic alone (as `run` does: with
/// `allow.auto.create.topics = false` the request creates nothing, and a topic the principal may not describe
/// answers TOPIC_AUTHORIZATION_FAILED instead of being left out).
fn topic_state(producer: &BaseProducer<CheckContext>, topic: &str) -> Result<TopicState> {
    let metadata = producer
        .client()
        .fetch_metadata(Some(topic), CHECK_TIMEOUT)
        .map_err(|e| classify_kafka(&e).context(format_args!("fetching the metadata of Kafka topic {topic:?}")))?;
    let Some(t) = metadata.topics().iter().find(|t| t.name() == topic) else { return Ok(TopicState::Missing) };
    Ok(match t.error().map(RDKafkaErrorCode::from) {
        None if t.partitions().is_empty() => TopicState::Missing,
        None => TopicState::Exists(t.partitions().len()),
        Some(RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic) => TopicState::Missing,
        Some(RDKafkaErrorCode::TopicAuthorizationFailed) => TopicState::Denied,
        Some(code) => TopicState::Error(code.to_string()),
    })
}

#[allow(clippy::too_many_arguments)]
async fn check_topic(
    producer: &Arc<BaseProducer<CheckContext>>,
    admin: &AdminClient<Context>,
    settings: &TopicSettings,
    config: &KafkaConfig,
    topic: &str,
    dead_letter: bool,
    batch_limit_bytes: usize,
    report: &mut Report,
) -> Result<()> {
    let name = topic.to_string();
    let mut state = blocking(producer, move |p| topic_state(p, &name)).await?;
    let mut created_by_validation = false;
    if state == TopicState::Missing && settings.create {
        let finding = validate_creation(admin, settings, topic).await?;
        if finding.status == Status::Fail {
            report.findings.push(finding);
            return Ok(());
        }
        let name = topic.to_string();
        state = blocking(producer, move |p| topic_state(p, &name)).await?;
        created_by_validation = state != TopicState::Missing;
        if !created_by_validation {
            report.findings.push(finding);
            return Ok(());
        }
    }
    report.findings.push(topic_finding(topic, &state, settings, created_by_validation));
    if matches!(state, TopicState::Exists(_)) {
        let limit = read_topic_limit(admin, topic).await;
        report.findings.push(limit_finding(topic, limit, batch_limit_bytes, config.max_record_bytes, dead_letter));
    }
    Ok(())
}

/// Asks the broker to validate the creation of `topic` with the settings `run` would create it with.
async fn validate_creation(admin: &AdminClient<Context>, settings: &TopicSettings, topic: &str) -> Result<Finding> {
    let setting = format!("kafka topic {topic}");
    let expected = "exists, or may be created";
    let topic_config = settings.config_of(topic);
    let mut new_topic = NewTopic::new(topic, settings.partitions, TopicReplication::Fixed(settings.replication_factor));
    for (k, v) in &topic_config {
        new_topic = new_topic.set(k, v);
    }
    let options = AdminOptions::new().validate_only(true).request_timeout(Some(CHECK_TIMEOUT));
    let results = admin
        .create_topics([&new_topic], &options)
        .await
        .map_err(|e| classify_kafka(&e).context(format_args!("validating the creation of Kafka topic {topic:?}")))?;
    let code = results.into_iter().find_map(|r| r.err().map(|(_, code)| code));
    Ok(creation_finding(&setting, expected, settings, code))
}

/// `max.message.bytes` of `topic` from DescribeConfigs; `Err` says why it is unknown.
async fn read_topic_limit(admin: &AdminClient<Context>, topic: &str) -> std::result::Result<usize, String> {
    let resource = ResourceSpecifier::Topic(topic);
    let options = AdminOptions::new().request_timeout(Some(CHECK_TIMEOUT));
    let results = admin.describe_configs([&resource], &options).await.map_err(|e| e.to_string())?;
    match results.into_iter().next() {
        Some(Ok(config)) => match config.get("max.message.bytes").and_then(|e| e.value.as_deref()) {
            Some(value) => value.trim().parse().map_err(|_| format!("the broker answered {value:?}")),
            None => Err("the broker's answer has no max.message.bytes".to_string()),
        },
        Some(Err(code)) => Err(format!("the broker answered {code:?}")),
        None => Err("the broker answered nothing".to_string()),
    }
}

/// Polls the producer until it has a producer id or failed fatally.
fn await_producer_id(producer: &BaseProducer<CheckContext>) -> ProducerId {
    let deadline = Instant::now() + CHECK_TIMEOUT;
    loop {
        producer.poll(Duration::from_millis(50));
        if let Some((code, reason)) = producer.client().fatal_error() {
            return ProducerId::Fatal(code, reason);
        }
        let observed = producer.context().observed();
        match &observed.producer_id {
            Some((state, id)) if state == "Assigned" && *id >= 0 => return ProducerId::Assigned(*id),
            state if Instant::now() >= deadline => {
                let state = state.as_ref().map_or_else(|| "unknown".to_string(), |(s, _)| s.clone());
                return ProducerId::NoAnswer(state, observed.errors.last().map(|(_, r)| r.clone()));
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use rdkafka::mocking::MockCluster;
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

    use super::findings::tests::config;
    use super::*;

    /// Why no broker answered: a refused credential or TLS setup is definite (exit 2), anything else
    /// transient (exit 3), and the last error librdkafka reported is in the message.
    #[test]
    fn unreachable_classification() {
        let timeout = KafkaError::MetadataFetch(RDKafkaErrorCode::BrokerTransportFailure);
        let seen = |code: RDKafkaErrorCode, reason: &str| vec![(Some(code), reason.to_string())];
        let cases: &[(Vec<SeenError>, bool, &str)] = &[
            (vec![], false, "no Kafka broker answered within 10 s; check kafka.bootstrap_servers"),
            (
                seen(RDKafkaErrorCode::BrokerTransportFailure, "Connection refused"),
                false,
                "last error: Connection refused",
            ),
            (seen(RDKafkaErrorCode::Authentication, "SASL authentication error"), true, "SASL authentication error"),
            (seen(RDKafkaErrorCode::SaslAuthenticationFailed, "bad password"), true, "sasl.*"),
            (seen(RDKafkaErrorCode::SSL, "certificate verify failed"), true, "certificate verify failed"),
        ];
        for (errors, definite, text) in cases {
            let error = unreachable(&timeout, errors, None);
            assert_eq!(error.is_definite(), *definite, "{errors:?}: {error}");
            assert!(error.to_string().contains(text), "{errors:?}: {error}");
        }
        // With aws_iam, a refused token gets the IAM causes; a refused certificate keeps the TLS advice.
        let hint = || Some("The cluster refused the MSK IAM token".to_string());
        let refused = seen(RDKafkaErrorCode::Authentication, "SASL authentication error: Access denied");
        let error = unreachable(&timeout, &refused, hint()).to_string();
        assert!(error.contains("Access denied. The cluster refused the MSK IAM token"), "{error}");
        let error = unreachable(&timeout, &seen(RDKafkaErrorCode::SSL, "certificate verify failed"), hint());
        assert!(error.to_string().contains("ssl.*"), "{error}");
    }

    /// Without rows, only a template that depends on no column of the row names its topics.
    #[test]
    fn topics_without_rows_from_the_template() {
        let config = |topic: &str| {
            let text = format!(
                "[source]\nkind = \"files\"\nbinlog_dir = \"/b\"\n[outbox]\ntables = [\"shop.a\", \"shop.b\"]\n[kafka]\n\
                 bootstrap_servers = \"b:9092\"\ntopic = \"{topic}\"\n[snapshot]\nmode = \"never\"\n"
            );
            crate::config::Config::parse(&text).unwrap()
        };
        let fixed = topics_without_rows(&config("outbox.${database}.${table}")).unwrap();
        assert_eq!(fixed, ["outbox.shop.a", "outbox.shop.b"]);
        assert_eq!(topics_without_rows(&config("events")).unwrap(), ["events"]);
        let by_type = topics_without_rows(&config("outbox.event.${aggregate_type}")).unwrap_err();
        assert!(by_type.to_string().contains("depends on the rows' columns"), "{by_type}");
    }

    /// librdkafka's `APIVERSION` debug lines, as its log callback passes them.
    #[test]
    fn api_version_lines() {
        let cases = [
            (
                "[thrd:127.0.0.1:9092/bootstrap]: 127.0.0.1:9092/bootstrap:   ApiKey Produce (0) Versions 0..11",
                Some(("Produce", 0, 11)),
            ),
            ("  ApiKey InitProducerId (22) Versions 0..5", Some(("InitProducerId", 0, 5))),
            ("Broker API support:", None),
            ("  ApiKey Produce (0) Versions x..11", None),
        ];
        for (line, expected) in cases {
            let parsed = parse_api_version(line);
            assert_eq!(parsed, expected.map(|(n, a, b)| (n.to_string(), a, b)), "{line}");
        }
    }

    /// An InitProducerId refused for lack of permission (CLUSTER_AUTHORIZATION_FAILED, as a Kafka broker
    /// with ACLs answers a principal without IDEMPOTENT_WRITE/WRITE) is a failed finding naming the ACL, not
    /// an error that hides the other findings, and not a pass. librdkafka's mock cluster injects the refusal
    /// (the test broker, Tansu, has no ACLs).
    #[tokio::test(flavor = "multi_thread")]
    async fn a_refused_producer_id_fails_the_write_permission_check() {
        let cluster = MockCluster::new(1).unwrap();
        cluster.create_topic("outbox.event.order", 1, 1).unwrap();
        cluster.create_topic("outbox-cdc.dead-letter", 1, 1).unwrap();
        cluster.request_errors(
            RDKafkaApiKey::InitProducerId,
            &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED],
        );
        let config = config(&cluster.bootstrap_servers(), "create_topics = false\ntopic_partitions = 1", "");
        let checked = check(&config, Ok(vec!["outbox.event.order".into()])).await.unwrap();
        let text = checked.to_string();
        let write = checked.report.findings.iter().find(|f| f.setting.contains("write permission")).expect("{text}");
        assert_eq!(write.status, Status::Fail, "{text}");
        assert!(write.actual.contains("ClusterAuthorizationFailed") && write.fix.contains("IdempotentWrite"), "{text}");
        let topics: Vec<&Finding> = checked
            .report
            .findings
            .iter()
            .filter(|f| f.setting.starts_with("kafka topic") && !f.setting.contains("max.message"))
            .collect();
        assert!(topics.len() == 2 && topics.iter().all(|f| f.status == Status::Ok), "{text}");
    }

    /// The other side: the mock cluster grants a producer id, and the check reports it.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_granted_producer_id_passes() {
        let cluster = MockCluster::new(1).unwrap();
        cluster.create_topic("outbox-cdc.dead-letter", 1, 1).unwrap();
        let config = config(&cluster.bootstrap_servers(), "create_topics = false\ntopic_partitions = 1", "");
        let checked = check(&config, Ok(vec![])).await.unwrap();
        let text = checked.to_string();
        let write = checked.report.findings.iter().find(|f| f.setting.contains("write permission")).expect("{text}");
        assert_eq!(write.status, Status::Ok, "{text}");
        assert!(write.actual.starts_with("producer id "), "{text}");
        assert!(text.contains("kafka broker version: not part of the Kafka protocol; the broker supports"), "{text}");
    }

    /// The Kafka state backend's prerequisites on librdkafka's mock cluster (in process; Tansu has no
    /// transactions and no ACLs, noida-db no authorizer): the broker refuses FindCoordinator for the probe's
    /// transactional id with TRANSACTIONAL_ID_AUTHORIZATION_FAILED, as Kafka answers a principal without
    /// any ACL on it. The check says what it could not prove and how to grant it so that it can, and it
    /// never used the connector's own id. The mock has no DescribeConfigs: the policy is unknown, a warning
    /// naming the ACL, as at `run`. Guards against `check` probing none of these (issue 46, finding 7).
    #[tokio::test(flavor = "multi_thread")]
    async fn a_refused_transactional_id_is_a_warning_with_the_grant() {
        let cluster = MockCluster::new(1).unwrap();
        cluster.create_topic("outbox-cdc.dead-letter", 1, 1).unwrap();
        cluster.create_topic("outbox-cdc.state", 1, 1).unwrap();
        cluster.request_errors(
            RDKafkaApiKey::FindCoordinator,
            &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_TRANSACTIONAL_ID_AUTHORIZATION_FAILED],
        );
        let state = "[state]\nbackend = \"kafka\"\nname = \"orders\"\n";
        let config = config(&cluster.bootstrap_servers(), "create_topics = false\ntopic_partitions = 1", state);
        let checked = check(&config, Ok(vec![])).await.unwrap();
        let text = checked.to_string();
        let find = |setting: &str| checked.report.findings.iter().find(|f| f.setting == setting).expect(&text).clone();

        let id = find("kafka transactional id orders.state");
        assert_eq!(id.status, Status::Warn, "{text}");
        assert!(id.actual.contains("not proven: the probe id orders.state.outbox-cdc-check was refused"), "{text}");
        assert!(
            id.fix.contains("--operation Write --operation Describe --transactional-id orders.state --resource-pattern-type prefixed"),
            "{text}"
        );
        assert!(find("kafka transactions").actual.starts_with("yes: the broker authorizes"), "{text}");
        assert_eq!(find("kafka state topic outbox-cdc.state").status, Status::Ok, "{text}");
        let policy = find("kafka state topic outbox-cdc.state cleanup.policy");
        assert_eq!(policy.status, Status::Warn, "{text}");
        assert!(policy.fix.contains("--operation DescribeConfigs --topic outbox-cdc.state"), "{text}");
        assert_eq!(find("kafka consumer group orders.state-reader (the readers' lookup)").status, Status::Ok);
        assert!(checked.report.failures().next().is_none(), "{text}");
    }

    /// A principal without an ACL on the readers' group (GROUP_AUTHORIZATION_FAILED on FindCoordinator, from
    /// the mock cluster: no test broker has ACLs) is reported as what it is: a refused lookup the readers
    /// ignore, never a failure (`tests/state_topic_acls.rs` shows the readers reading through it).
    #[tokio::test(flavor = "multi_thread")]
    async fn a_refused_group_lookup_is_information() {
        let cluster = MockCluster::new(1).unwrap();
        cluster.request_errors(
            RDKafkaApiKey::FindCoordinator,
            &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED; 50],
        );
        let config = config(&cluster.bootstrap_servers(), "", "[state]\nbackend = \"kafka\"\nname = \"orders\"\n");
        let (group, lookup) = state::group_lookup(&config).await.unwrap();
        assert_eq!((group.as_str(), &lookup), ("orders.state-reader", &state::GroupLookup::Refused));
        let finding = state::group_finding(&group, &lookup);
        assert_eq!(finding.status, Status::Ok, "{finding:?}");
        assert!(finding.actual.contains("GROUP_AUTHORIZATION_FAILED"), "{finding:?}");
    }

    /// A broker that refuses the probe's InitProducerId itself (the principal may describe the id but not
    /// write it) is reported the same way; the mock cluster injects it (the check's own idempotent producer
    /// is not in play: the probe is called alone).
    #[tokio::test(flavor = "multi_thread")]
    async fn a_refused_init_producer_id_is_a_refused_probe() {
        let cluster = MockCluster::new(1).unwrap();
        cluster.request_errors(
            RDKafkaApiKey::InitProducerId,
            &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_TRANSACTIONAL_ID_AUTHORIZATION_FAILED],
        );
        let config = config(&cluster.bootstrap_servers(), "", "");
        let outcome = transactional::probe(&config.kafka, "orders.outbox-cdc-check").await.unwrap();
        assert_eq!(outcome, transactional::Probe::Refused);
        let granted = transactional::probe(&config.kafka, "orders.outbox-cdc-check").await.unwrap();
        assert_eq!(granted, transactional::Probe::Granted);
    }
}
