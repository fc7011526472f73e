//! `check` for the Kafka state backend (`[state] backend = "kafka"`): the state topic as `run` will refuse
//! or warn about it, and the readers' consumer-group lookup.
//!
//! Floor 4 (docs/ARCHITECTURE.md): imports floors 0-3.
//!
//! The rules are `checkpoint::kafka`'s, asked without its side effects (it creates a missing topic): one
//! partition ([`one_partition`]'s refusal is the fix), compact-only (`ensure_topic`), the durability advice
//! [`topic_advice`] logs at every start, and the replication factor against the events' topics. Nothing is
//! read from the topic here: `check` reads the connector's state through [`crate::checkpoint::Store`].
//!
//! # The group lookup
//! The readers (the state read, `quarantine release`, `audit`) set a `group.id`, because librdkafka's
//! `assign()` needs one, and librdkafka then looks the group's coordinator up (FindCoordinator, which needs
//! `Describe` on the group). They never join, fetch or commit the group, and ignore a refusal of that
//! lookup ([`crate::kafka::read`]). So the finding is information, never a failure: a consumer with the
//! state reader's own settings is started, and either its group comes up or the lookup is refused.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::OAuthToken;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientContext, Statistics};

use super::acls::{grant, operations_on, Command, Resource};
use super::findings::{fail, ok, warn, TopicState, CHECK_TIMEOUT};
use crate::checkpoint::kafka::{one_partition, reader_config, topic_advice, topic_settings};
use crate::config::Config;
use crate::error::{classify_kafka, Error, Result};
use crate::findings::Finding;
use crate::kafka::identity::{self, Context, Tokened, Tokens};

/// The state topic in the metadata: its state, and its first partition's replicas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Layout {
    pub state: TopicState,
    /// Replicas of partition 0 (its replication factor), when it exists.
    pub replicas: Option<usize>,
    /// Brokers in the cluster.
    pub brokers: usize,
}

/// The state topic's layout from a metadata request for it alone (creates nothing).
pub(super) fn layout(client: &rdkafka::client::Client<impl ClientContext>, topic: &str) -> Result<Layout> {
    let metadata = client
        .fetch_metadata(Some(topic), CHECK_TIMEOUT)
        .map_err(|e| classify_kafka(&e).context(format_args!("fetching the metadata of Kafka topic {topic:?}")))?;
    let brokers = metadata.brokers().len();
    let Some(t) = metadata.topics().iter().find(|t| t.name() == topic) else {
        return Ok(Layout { state: TopicState::Missing, replicas: None, brokers });
    };
    let state = match t.error().map(RDKafkaErrorCode::from) {
        None if t.partitions().is_empty() => TopicState::Missing,
        None => TopicState::Exists(t.partitions().len()),
        Some(RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic) => TopicState::Missing,
        Some(RDKafkaErrorCode::TopicAuthorizationFailed) => TopicState::Denied,
        Some(code) => TopicState::Error(code.to_string()),
    };
    let replicas = t.partitions().iter().find(|p| p.id() == 0).map(|p| p.replicas().len());
    Ok(Layout { state, replicas, brokers })
}

/// The state topic's configs from DescribeConfigs; `Err` says why they are unknown.
pub(super) async fn describe(
    admin: &AdminClient<Context>,
    topic: &str,
) -> std::result::Result<BTreeMap<String, String>, String> {
    let resource = ResourceSpecifier::Topic(topic);
    let options = AdminOptions::new().request_timeout(Some(CHECK_TIMEOUT));
    let results = admin.describe_configs([&resource], &options).await.map_err(|e| e.to_string())?;
    match results.into_iter().next() {
        Some(Ok(config)) => Ok(config.entries.into_iter().filter_map(|e| Some((e.name, e.value?))).collect()),
        Some(Err(code)) => Err(format!("the broker answered {code:?}")),
        None => Err("the broker answered nothing".to_string()),
    }
}

/// The state topic's findings: it exists (or `run` may create it) with one partition, compact only, and
/// as durable as the events (warnings).
pub(super) fn topic_findings(
    config: &Config,
    layout: &Layout,
    described: std::result::Result<BTreeMap<String, String>, String>,
) -> Vec<Finding> {
    let topic = &config.state.topic;
    let setting = format!("kafka state topic {topic}");
    let expected = "exists with exactly 1 partition, or may be created";
    let partitions = match &layout.state {
        TopicState::Exists(n) => *n,
        TopicState::Missing if config.kafka.create_topics => {
            return vec![ok(
                &setting,
                expected,
                "missing; run creates it (1 partition, cleanup.policy=compact, retention.ms=-1): Create on the topic \
                 or the cluster is needed for that, and not tried here",
            )]
        }
        TopicState::Missing => {
            return vec![fail(
                &setting,
                expected,
                "missing (kafka.create_topics = false)",
                &format!(
                    "create it: kafka-topics --bootstrap-server <kafka.bootstrap_servers> --create --topic {topic} \
                     --partitions 1 --config cleanup.policy=compact --config retention.ms=-1"
                ),
            )]
        }
        TopicState::Denied => {
            let operations = operations_on(Command::Run, config, Resource::StateTopic);
            return vec![fail(
                &setting,
                expected,
                "not permitted to describe it (TOPIC_AUTHORIZATION_FAILED)",
                &grant(&operations, &format!("--topic {topic}")),
            )];
        }
        TopicState::Error(code) => {
            return vec![fail(
                &setting,
                expected,
                &format!("the metadata answered {code}"),
                "see the broker's log; check again once the topic's partition has a leader",
            )]
        }
    };
    let mut findings = vec![match one_partition(topic, partitions) {
        Ok(()) => ok(&setting, expected, "exists, 1 partition"),
        Err(refusal) => fail(&setting, expected, &format!("{partitions} partitions"), &refusal.to_string()),
    }];
    let wanted = topic_settings(&config.kafka);
    findings.push(policy_finding(topic, &wanted, described.as_ref()));
    if let Some(replicas) = layout.replicas {
        findings.push(replication_finding(config, replicas, layout.brokers));
    }
    if let Ok(described) = &described {
        for advice in topic_advice(topic, described, &wanted) {
            let (actual, fix) = advice.split_once(" Fix: ").unwrap_or((advice.as_str(), ""));
            let setting = format!("kafka state topic {topic} durability and size");
            findings.push(warn(&setting, "as run creates it (kafka.topic_config, short segments)", actual, fix));
        }
    }
    findings
}

/// `cleanup.policy`: exactly the policy the state topic is created with (`compact`); `delete` in it would
/// expire the checkpoint and holds. Unknown (DescribeConfigs denied) is the warning `run` logs at every
/// start.
// NOTE: `checkpoint::kafka::ensure_topic` refuses the same at start, inline; the two must agree.
fn policy_finding(
    topic: &str,
    wanted: &BTreeMap<String, String>,
    described: std::result::Result<&BTreeMap<String, String>, &String>,
) -> Finding {
    let setting = format!("kafka state topic {topic} cleanup.policy");
    let want = wanted.get("cleanup.policy").map_or("compact", String::as_str);
    let expected = format!("{want} only");
    let policy = match described {
        Ok(described) => described.get("cleanup.policy"),
        Err(why) => {
            return warn(
                &setting,
                &expected,
                &format!("unknown ({why}); run starts anyway, and warns at every start"),
                &format!(
                    "grant DescribeConfigs so that check and every start verify it ({}), or check it by hand \
                     (kafka-configs --describe --entity-type topics --entity-name {topic}): a delete policy loses \
                     holds and an idle checkpoint after retention.ms",
                    grant(&["DescribeConfigs"], &format!("--topic {topic}"))
                ),
            )
        }
    };
    match policy {
        Some(policy) if policy.split(',').map(str::trim).all(|p| p == want) => ok(&setting, &expected, policy),
        Some(policy) => fail(
            &setting,
            &expected,
            policy,
            &format!(
                "run refuses it: its records would expire and the connector would lose its checkpoint and holds. \
                 kafka-configs --alter --entity-type topics --entity-name {topic} --add-config cleanup.policy={want}"
            ),
        ),
        None => warn(&setting, &expected, "not in the broker's answer", "check it by hand (kafka-configs --describe)"),
    }
}

/// The state topic's replication factor against the events' (`kafka.topic_replication_factor`, or up to
/// 3 where the broker decides): a checkpoint must not be lost where the events it covers survive.
fn replication_finding(config: &Config, replicas: usize, brokers: usize) -> Finding {
    let topic = &config.state.topic;
    let setting = format!("kafka state topic {topic} replication factor");
    let configured = config.kafka.topic_replication_factor;
    let (wanted, source) = match usize::try_from(configured) {
        Ok(n) if n > 0 => (n, "kafka.topic_replication_factor"),
        _ => (brokers.min(3), "the usual 3, or every broker of a smaller cluster"),
    };
    let expected = format!(">= {wanted} ({source})");
    if replicas >= wanted {
        return ok(&setting, &expected, &replicas.to_string());
    }
    warn(
        &setting,
        &expected,
        &format!("{replicas} on a cluster of {brokers} broker(s)"),
        &format!(
            "losing {replicas} broker(s) loses the checkpoint and holds, while the events they cover may survive: \
             raise it with kafka-reassign-partitions (a reassignment that lists {wanted} replicas for {topic}-0)"
        ),
    )
}

/// How the readers' group lookup went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum GroupLookup {
    /// The group's coordinator was found.
    Found,
    /// GROUP_AUTHORIZATION_FAILED.
    Refused,
    /// Neither within the timeout: the last error, if any.
    NoAnswer(Option<String>),
}

/// The consumer's context: the group state from the statistics, the refusal from the error callback.
#[derive(Default)]
struct LookupContext {
    seen: std::sync::Mutex<(Option<String>, Option<KafkaError>)>,
    tokens: Tokens,
}

impl Tokened for LookupContext {
    fn tokens(&self) -> &Tokens {
        &self.tokens
    }
}

impl ClientContext for LookupContext {
    const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;

    fn generate_oauth_token(&self, _config: Option<&str>) -> Result<OAuthToken, Box<dyn std::error::Error>> {
        self.tokens.generate()
    }

    fn stats(&self, statistics: Statistics) {
        if let Some(cgrp) = statistics.cgrp {
            self.seen.lock().unwrap_or_else(|p| p.into_inner()).0 = Some(cgrp.state);
        }
    }
    fn error(&self, error: KafkaError, _reason: &str) {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).1 = Some(error);
    }
}

impl ConsumerContext for LookupContext {}

/// Starts a consumer with the state reader's settings (its `group.id`) and waits until its group comes up
/// or the lookup is refused. Returns the group's name and the outcome.
///
/// # Errors
/// A definite error when librdkafka refuses the configuration.
pub(super) async fn group_lookup(config: &Config) -> Result<(String, GroupLookup)> {
    let mut cc = reader_config(config)?;
    let group = cc.get("group.id").unwrap_or_default().to_string();
    cc.set("statistics.interval.ms", "100");
    let consumer: BaseConsumer<LookupContext> =
        identity::create(&cc, LookupContext { tokens: Tokens::of(&config.kafka)?, ..LookupContext::default() })?;
    let outcome = tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + CHECK_TIMEOUT;
        loop {
            let refused = |e: &KafkaError| e.rdkafka_error_code() == Some(RDKafkaErrorCode::GroupAuthorizationFailed);
            if let Some(Err(e)) = consumer.poll(Duration::from_millis(50)) {
                if refused(&e) {
                    return GroupLookup::Refused;
                }
            }
            let seen = consumer.context().seen.lock().unwrap_or_else(|p| p.into_inner());
            match &*seen {
                (Some(state), _) if state == "up" => return GroupLookup::Found,
                (_, Some(e)) if refused(e) => return GroupLookup::Refused,
                (_, last) if Instant::now() >= deadline => {
                    return GroupLookup::NoAnswer(last.as_ref().map(|e| e.to_string()))
                }
                _ => {}
            }
        }
    })
    .await
    .map_err(|e| Error::transient(format!("the Kafka check's task failed: {e}")))?;
    Ok((group, outcome))
}

/// The readers' group finding: information, never a failure (module doc).
pub(super) fn group_finding(group: &str, outcome: &GroupLookup) -> Finding {
    let setting = format!("kafka consumer group {group} (the readers' lookup)");
    let expected = "no ACL needed: the readers assign partitions and never use the group";
    match outcome {
        GroupLookup::Found => ok(&setting, expected, "the lookup was answered"),
        GroupLookup::Refused => ok(
            &setting,
            expected,
            "the lookup was refused (GROUP_AUTHORIZATION_FAILED), which the readers ignore: nothing to grant",
        ),
        GroupLookup::NoAnswer(last) => ok(
            &setting,
            expected,
            &format!(
                "the lookup was not answered within {} s{}; the readers do not wait for it",
                CHECK_TIMEOUT.as_secs(),
                last.as_ref().map(|l| format!(" (last error: {l})")).unwrap_or_default()
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::findings::Status;

    fn config(extra: &str) -> Config {
        Config::parse(&format!(
            "[source]\nhost = \"h\"\nuser = \"u\"\nserver_id = 1\n[outbox]\ntable = \"s.t\"\n[kafka]\n\
             bootstrap_servers = \"b:9092\"\n{extra}\n[state]\nbackend = \"kafka\"\nname = \"orders\"\n"
        ))
        .unwrap()
    }

    /// What DescribeConfigs answered, as [`topic_findings`] takes it.
    type Described = std::result::Result<BTreeMap<String, String>, String>;

    fn described(pairs: &[(&str, &str)]) -> Described {
        Ok(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
    }

    /// The state topic's rules, one row each: one partition, compact only, a replication factor as the
    /// events', and a policy that cannot be read is a warning (as at `run`).
    #[test]
    fn state_topic_findings() {
        let compact = described(&[("cleanup.policy", "compact")]);
        let layout = |state, replicas, brokers| Layout { state, replicas, brokers };
        let cases: Vec<(&str, Config, Layout, Described, Status, &str)> = vec![
            ("ready", config(""), layout(TopicState::Exists(1), Some(1), 1), compact.clone(), Status::Ok, ""),
            (
                "3 partitions",
                config(""),
                layout(TopicState::Exists(3), Some(1), 1),
                compact.clone(),
                Status::Fail,
                "state copy --to local",
            ),
            (
                "delete",
                config(""),
                layout(TopicState::Exists(1), Some(1), 1),
                described(&[("cleanup.policy", "delete")]),
                Status::Fail,
                "cleanup.policy=compact",
            ),
            (
                "both",
                config(""),
                layout(TopicState::Exists(1), Some(1), 1),
                described(&[("cleanup.policy", "compact,delete")]),
                Status::Fail,
                "cleanup.policy=compact",
            ),
            (
                "denied configs",
                config(""),
                layout(TopicState::Exists(1), Some(1), 1),
                Err("TopicAuthorizationFailed".into()),
                Status::Warn,
                "--operation DescribeConfigs --topic outbox-cdc.state",
            ),
            (
                "one copy of 3",
                config(""),
                layout(TopicState::Exists(1), Some(1), 3),
                compact.clone(),
                Status::Warn,
                "kafka-reassign-partitions",
            ),
            (
                "below the events'",
                config("topic_replication_factor = 2"),
                layout(TopicState::Exists(1), Some(1), 1),
                compact.clone(),
                Status::Warn,
                "kafka-reassign-partitions",
            ),
            (
                "weaker min.insync",
                config("topic_config = { \"min.insync.replicas\" = \"2\" }"),
                layout(TopicState::Exists(1), Some(3), 3),
                described(&[("cleanup.policy", "compact"), ("min.insync.replicas", "1")]),
                Status::Warn,
                "min.insync.replicas=2",
            ),
            (
                "missing, created by run",
                config(""),
                layout(TopicState::Missing, None, 1),
                Err("x".into()),
                Status::Ok,
                "",
            ),
            (
                "missing",
                config("create_topics = false"),
                layout(TopicState::Missing, None, 1),
                Err("x".into()),
                Status::Fail,
                "--partitions 1 --config cleanup.policy=compact",
            ),
            (
                "denied",
                config(""),
                layout(TopicState::Denied, None, 1),
                Err("x".into()),
                Status::Fail,
                "--operation DescribeConfigs --operation Create --topic outbox-cdc.state",
            ),
        ];
        for (name, config, layout, described, status, says) in cases {
            let findings = topic_findings(&config, &layout, described);
            let worst = findings.iter().map(|f| f.status).max_by_key(|s| *s as u8).unwrap();
            assert_eq!(worst, status, "{name}: {findings:#?}");
            assert!(findings.iter().any(|f| f.fix.contains(says)), "{name} must say {says:?}: {findings:#?}");
        }
    }

    /// The group lookup never fails the check, whatever it answered.
    #[test]
    fn the_group_lookup_is_information() {
        for outcome in [GroupLookup::Found, GroupLookup::Refused, GroupLookup::NoAnswer(None)] {
            assert_eq!(group_finding("g", &outcome).status, Status::Ok, "{outcome:?}");
        }
    }
}
