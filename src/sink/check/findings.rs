//! The Kafka check's judgements: what `run` needs, set against what the cluster answered, as findings with
//! the fix for each. Pure: the asking is in [`super`].
//!
//! Floor 4 (docs/ARCHITECTURE.md): imports floors 0-3.

use std::time::Duration;

use rdkafka::types::RDKafkaErrorCode;

use crate::findings::{Finding, Status};
use crate::sink::limits;
use crate::sink::topics::TopicSettings;

/// How long each question to the cluster may take.
pub(super) const CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// A topic as the metadata shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum TopicState {
    /// Not in the cluster.
    Missing,
    /// The connector's principal may not describe it.
    Denied,
    /// The metadata's error for it.
    Error(String),
    /// Exists with this many partitions.
    Exists(usize),
}

/// The finding for a topic that exists, is missing (and may not be created), or cannot be described.
pub(super) fn topic_finding(
    topic: &str,
    state: &TopicState,
    settings: &TopicSettings,
    created_by_validation: bool,
) -> Finding {
    let setting = format!("kafka topic {topic}");
    let wanted = settings.partitions;
    let expected = if settings.create {
        "exists, or may be created".to_string()
    } else {
        format!("exists with at least {wanted} partition(s) (kafka.topic_partitions; kafka.create_topics = false)")
    };
    let config = settings.config_of(topic);
    let max_message_bytes = config.get("max.message.bytes").map_or("", String::as_str);
    let create_it = format!(
        "create it (kafka-topics --create --topic {topic} --partitions {wanted} --config \
         max.message.bytes={max_message_bytes}), or set kafka.create_topics = true"
    );
    match state {
        TopicState::Exists(n) if !settings.create && (*n as i64) < i64::from(wanted) => fail(
            &setting,
            &expected,
            &format!("{n} partition(s)"),
            &format!(
                "kafka.topic_partitions = {wanted} but the topic has {n}: add partitions before the first event \
                 (kafka-topics --alter --topic {topic} --partitions {wanted}; adding them later moves \
                 aggregates to other partitions, and their order across the move is lost), or set \
                 kafka.topic_partitions = {n} if {n} is what you want"
            ),
        ),
        TopicState::Exists(n) if created_by_validation => ok(
            &setting,
            &expected,
            &format!(
                "{n} partition(s): the broker created it although asked only to validate its creation (with the \
                 settings run would have used)"
            ),
        ),
        TopicState::Exists(n) => ok(&setting, &expected, &format!("exists, {n} partition(s)")),
        TopicState::Missing => fail(&setting, &expected, "missing", &create_it),
        TopicState::Denied => fail(
            &setting,
            &expected,
            "not permitted to describe it (TOPIC_AUTHORIZATION_FAILED)",
            &format!(
                "grant the connector's principal DESCRIBE and WRITE on the topic (kafka-acls --add \
                 --allow-principal User:<name> --operation Describe --operation Write --topic {topic}); \
                 with kafka.create_topics = true, CREATE too"
            ),
        ),
        TopicState::Error(code) => fail(
            &setting,
            &expected,
            &format!("the metadata answered {code}"),
            "see the broker's log; check again once the topic's partitions have a leader",
        ),
    }
}

/// The finding for a validate-only CreateTopics that answered `code` (`None`: accepted).
pub(super) fn creation_finding(
    setting: &str,
    expected: &str,
    settings: &TopicSettings,
    code: Option<RDKafkaErrorCode>,
) -> Finding {
    let partitions = settings.partitions;
    match code {
        None | Some(RDKafkaErrorCode::TopicAlreadyExists) => ok(
            setting,
            expected,
            &format!("missing; the broker accepts its creation ({partitions} partition(s)), which run will do"),
        ),
        Some(c @ (RDKafkaErrorCode::TopicAuthorizationFailed | RDKafkaErrorCode::ClusterAuthorizationFailed)) => fail(
            setting,
            expected,
            &format!("missing, and creating it is not permitted ({c:?})"),
            "grant the connector's principal CREATE on the cluster or on the topic (kafka-acls --add \
                 --allow-principal User:<name> --operation Create --topic <topic>), or create the topic yourself \
                 and set kafka.create_topics = false",
        ),
        Some(RDKafkaErrorCode::InvalidReplicationFactor) => fail(
            setting,
            expected,
            &format!("missing, and replication factor {} is refused", settings.replication_factor),
            "set kafka.topic_replication_factor to at most the number of brokers, or -1 for the broker's \
             default.replication.factor",
        ),
        Some(RDKafkaErrorCode::InvalidPartitions) => fail(
            setting,
            expected,
            &format!("missing, and {partitions} partition(s) are refused"),
            "set kafka.topic_partitions to a count the broker accepts",
        ),
        Some(c @ (RDKafkaErrorCode::InvalidConfig | RDKafkaErrorCode::PolicyViolation)) => fail(
            setting,
            expected,
            &format!("missing, and its settings are refused ({c:?})"),
            "the broker refuses kafka.topic_config (with max.message.bytes as check computes it): fix \
             kafka.topic_config, or create the topic yourself and set kafka.create_topics = false",
        ),
        Some(c) => fail(
            setting,
            expected,
            &format!("missing, and the broker refused its creation ({c:?})"),
            "see the broker's log, or create the topic yourself and set kafka.create_topics = false",
        ),
    }
}

/// The finding for a topic's `max.message.bytes`: the rule `run` applies at the topic's first record
/// ([`crate::sink::limits::check_topic_limit`]), and for the dead-letter topic room for a record of `max_record_bytes`.
/// A smaller routed topic only dead-letters its larger records; an unknown limit cannot be checked.
pub(super) fn limit_finding(
    topic: &str,
    limit: std::result::Result<usize, String>,
    batch_limit_bytes: usize,
    max_record_bytes: usize,
    dead_letter: bool,
) -> Finding {
    let setting = format!("kafka topic {topic} max.message.bytes");
    let batches = limits::required_topic_limit(batch_limit_bytes);
    let records =
        if dead_letter { format!(", and >= kafka.max_record_bytes ({max_record_bytes})") } else { String::new() };
    let expected = format!(">= {batches} (the producer's batches){records}");
    let raise = |to: usize| {
        format!("kafka-configs --alter --entity-type topics --entity-name {topic} --add-config max.message.bytes={to}")
    };
    let limit = match limit {
        Ok(l) => l,
        Err(why) => {
            return warn(
                &setting,
                &expected,
                &format!("unknown ({why})"),
                &format!(
                    "cannot be checked: keep the topic's max.message.bytes at {} or more",
                    batches.max(if dead_letter { max_record_bytes } else { 0 })
                ),
            )
        }
    };
    if let Err(e) = limits::check_topic_limit(topic, limit, batch_limit_bytes) {
        return fail(&setting, &expected, &limit.to_string(), &e.to_string());
    }
    if dead_letter && limit < max_record_bytes {
        return fail(
            &setting,
            &expected,
            &limit.to_string(),
            &format!(
                "a dead letter of up to kafka.max_record_bytes would be refused: {}, or lower \
                 kafka.max_record_bytes to {limit}",
                raise(max_record_bytes)
            ),
        );
    }
    if limit < max_record_bytes {
        return warn(
            &setting,
            &expected,
            &format!("{limit}, below kafka.max_record_bytes ({max_record_bytes})"),
            &format!(
                "records of this topic larger than {limit} bytes go to the dead-letter topic; if they should not, \
                 {}",
                raise(max_record_bytes)
            ),
        );
    }
    ok(&setting, &expected, &limit.to_string())
}

/// How the idempotent producer's InitProducerId ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum ProducerId {
    /// The broker assigned this producer id.
    Assigned(i64),
    /// The producer failed fatally with this error (an authorization refusal is fatal in librdkafka).
    Fatal(RDKafkaErrorCode, String),
    /// Neither within the timeout: the idempotence state, and the last error librdkafka reported.
    NoAnswer(String, Option<String>),
}

/// The write-permission finding from the InitProducerId outcome.
pub(super) fn producer_id_finding(outcome: &ProducerId) -> Finding {
    const SETTING: &str = "kafka write permission (idempotent producer id)";
    const EXPECTED: &str = "InitProducerId answered with a producer id";
    match outcome {
        ProducerId::Assigned(id) => ok(SETTING, EXPECTED, &format!("producer id {id}")),
        ProducerId::Fatal(
            code @ (RDKafkaErrorCode::ClusterAuthorizationFailed | RDKafkaErrorCode::TopicAuthorizationFailed),
            reason,
        ) => fail(
            SETTING,
            EXPECTED,
            &format!("refused ({code:?}): {reason}"),
            "grant the connector's principal WRITE on its topics (Kafka 3.0+: kafka-acls --add --allow-principal \
             User:<name> --operation Write --topic <topic>, for the routed and the dead-letter topics) or, on \
             older brokers, IDEMPOTENT_WRITE on the cluster (--operation IdempotentWrite --cluster)",
        ),
        ProducerId::Fatal(RDKafkaErrorCode::UnsupportedFeature, reason) => fail(
            SETTING,
            EXPECTED,
            &format!("not supported: {reason}"),
            "the broker cannot serve an idempotent producer (Kafka 0.11 or later is needed); the connector's \
             ordering and duplicate guarantees depend on it",
        ),
        ProducerId::Fatal(code, reason) => fail(
            SETTING,
            EXPECTED,
            &format!("failed ({code:?}): {reason}"),
            "see the broker's log; run cannot produce until the producer gets an id",
        ),
        ProducerId::NoAnswer(state, last) => fail(
            SETTING,
            EXPECTED,
            &format!(
                "no producer id within {} s (state {state}{})",
                CHECK_TIMEOUT.as_secs(),
                last.as_ref().map(|l| format!(", last error: {l}")).unwrap_or_default()
            ),
            "check that the broker supports idempotent producers and serves InitProducerId (its log), then check \
             again",
        ),
    }
}

fn finding(setting: &str, expected: &str, actual: &str, status: Status, fix: &str) -> Finding {
    Finding {
        setting: setting.into(),
        expected: expected.into(),
        actual: actual.into(),
        status,
        fix: if status == Status::Ok { String::new() } else { fix.into() },
    }
}

pub(super) fn ok(setting: &str, expected: &str, actual: &str) -> Finding {
    finding(setting, expected, actual, Status::Ok, "")
}

pub(super) fn warn(setting: &str, expected: &str, actual: &str, fix: &str) -> Finding {
    finding(setting, expected, actual, Status::Warn, fix)
}

pub(super) fn fail(setting: &str, expected: &str, actual: &str, fix: &str) -> Finding {
    finding(setting, expected, actual, Status::Fail, fix)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::config::KafkaConfig;

    /// A `[kafka]` section read through the config parser, with `kafka` added to it (also the Kafka check's
    /// mock-cluster tests).
    pub(in crate::sink::check) fn kafka_config(bootstrap: &str, kafka: &str) -> KafkaConfig {
        config(bootstrap, kafka, "").kafka
    }

    /// The whole config of [`kafka_config`], with `sections` (`[state]`, `[delivery]`) after `[kafka]`.
    pub(in crate::sink::check) fn config(bootstrap: &str, kafka: &str, sections: &str) -> crate::config::Config {
        let text = format!(
            "[source]\nhost = \"h\"\nuser = \"u\"\nserver_id = 1\n[outbox]\ntable = \"s.t\"\n[kafka]\n\
             bootstrap_servers = \"{bootstrap}\"\n{kafka}\n{sections}\n"
        );
        crate::config::Config::parse(&text).unwrap()
    }

    fn settings(kafka: &str) -> TopicSettings {
        TopicSettings::of(&kafka_config("b:9092", kafka), 1_000_000)
    }

    /// The topic rules, one row each: partitions count only when the connector may not create topics.
    #[test]
    fn topic_findings() {
        let fixed = settings("create_topics = false\ntopic_partitions = 6");
        let creating = settings("create_topics = true\ntopic_partitions = 6");
        let cases: &[(&TopicSettings, TopicState, Status, &str)] = &[
            (&fixed, TopicState::Exists(6), Status::Ok, ""),
            (&fixed, TopicState::Exists(12), Status::Ok, ""),
            (&fixed, TopicState::Exists(3), Status::Fail, "kafka.topic_partitions = 3"),
            (&creating, TopicState::Exists(3), Status::Ok, ""),
            (&fixed, TopicState::Missing, Status::Fail, "kafka-topics --create --topic t --partitions 6"),
            (&fixed, TopicState::Denied, Status::Fail, "--operation Describe --operation Write --topic t"),
            (&creating, TopicState::Error("LeaderNotAvailable".into()), Status::Fail, "leader"),
        ];
        for (settings, state, status, fix) in cases {
            let finding = topic_finding("t", state, settings, false);
            assert_eq!(finding.status, *status, "{state:?}: {finding:?}");
            assert!(finding.fix.contains(fix), "{state:?}: {}", finding.fix);
        }
    }

    /// A validate-only CreateTopics: each refusal the broker can answer gets its own fix.
    #[test]
    fn creation_findings() {
        let s = settings("create_topics = true\ntopic_replication_factor = 3");
        let cases: &[(Option<RDKafkaErrorCode>, Status, &str)] = &[
            (None, Status::Ok, ""),
            (Some(RDKafkaErrorCode::TopicAlreadyExists), Status::Ok, ""),
            (Some(RDKafkaErrorCode::TopicAuthorizationFailed), Status::Fail, "--operation Create"),
            (Some(RDKafkaErrorCode::ClusterAuthorizationFailed), Status::Fail, "--operation Create"),
            (Some(RDKafkaErrorCode::InvalidReplicationFactor), Status::Fail, "kafka.topic_replication_factor"),
            (Some(RDKafkaErrorCode::PolicyViolation), Status::Fail, "kafka.topic_config"),
            (Some(RDKafkaErrorCode::RequestTimedOut), Status::Fail, "broker's log"),
        ];
        for (code, status, fix) in cases {
            let finding = creation_finding("kafka topic t", "e", &s, *code);
            assert_eq!(finding.status, *status, "{code:?}: {finding:?}");
            assert!(finding.fix.contains(fix), "{code:?}: {}", finding.fix);
        }
    }

    /// `max.message.bytes`: below the producer's batches fails for every topic (as at `run`), below
    /// `max_record_bytes` fails for the dead-letter topic only, unknown is a warning.
    #[test]
    fn limit_findings() {
        let batch = 1_000_000;
        let max_record = 16 * 1024 * 1024;
        let batches = limits::required_topic_limit(batch);
        let cases: &[(std::result::Result<usize, String>, bool, Status, &str)] = &[
            (Ok(max_record), false, Status::Ok, ""),
            (Ok(max_record), true, Status::Ok, ""),
            (Ok(1_048_588), false, Status::Warn, "dead-letter"),
            (Ok(1_048_588), true, Status::Fail, &format!("max.message.bytes={max_record}")),
            (Ok(100_000), false, Status::Fail, "batch.size"),
            (Ok(batches - 1), true, Status::Fail, "batch.size"),
            (Err("the broker answered nothing".into()), false, Status::Warn, &format!("{batches} or more")),
            (Err("the broker answered nothing".into()), true, Status::Warn, &format!("{max_record} or more")),
        ];
        for (limit, dead_letter, status, fix) in cases {
            let finding = limit_finding("t", limit.clone(), batch, max_record, *dead_letter);
            assert_eq!(finding.status, *status, "{limit:?} dead letter {dead_letter}: {finding:?}");
            assert!(finding.fix.contains(fix), "{limit:?} dead letter {dead_letter}: {}", finding.fix);
        }
    }

    /// The write-permission finding: an authorization refusal names the ACL to grant.
    #[test]
    fn producer_id_findings() {
        let cases: &[(ProducerId, Status, &str)] = &[
            (ProducerId::Assigned(7), Status::Ok, ""),
            (
                ProducerId::Fatal(RDKafkaErrorCode::ClusterAuthorizationFailed, "r".into()),
                Status::Fail,
                "IdempotentWrite",
            ),
            (
                ProducerId::Fatal(RDKafkaErrorCode::TopicAuthorizationFailed, "r".into()),
                Status::Fail,
                "--operation Write",
            ),
            (ProducerId::Fatal(RDKafkaErrorCode::UnsupportedFeature, "r".into()), Status::Fail, "0.11"),
            (ProducerId::Fatal(RDKafkaErrorCode::Fenced, "r".into()), Status::Fail, "broker's log"),
            (ProducerId::NoAnswer("RequestPID".into(), None), Status::Fail, "InitProducerId"),
        ];
        for (outcome, status, fix) in cases {
            let finding = producer_id_finding(outcome);
            assert_eq!(finding.status, *status, "{outcome:?}: {finding:?}");
            assert!(finding.fix.contains(fix), "{outcome:?}: {}", finding.fix);
        }
    }
}
