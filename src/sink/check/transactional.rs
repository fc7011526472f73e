//! `check` for Kafka transactions: does the broker serve them, and may the connector's principal use its
//! transactional ids (`<transactional_id>` with `exactly_once` or `poll.transactional`,
//! `<transactional_id>.state` with `[state] backend = "kafka"`).
//!
//! Floor 4 (docs/ARCHITECTURE.md): imports floors 0-3.
//!
//! # Why the connector's own ids are never used
//! Only InitProducerId proves `Write` on a transactional id, and InitProducerId *is* the fence: the broker
//! bumps the id's epoch, aborts its open transaction, and the running connector's next commit fails
//! (`checkpoint::kafka`, "A stale instance cannot write"). A `check` run beside a healthy connector must
//! not do that. So each id is probed through another one under it, `<id>.outbox-cdc-check`
//! ([`probe_id`]): a transactional producer with that id runs `init_transactions` (FindCoordinator, which
//! needs `Describe`, then InitProducerId, which needs `Write`) and is dropped without a transaction. No
//! record is written, no producer of ours is fenced; the broker keeps the probe id's (empty) state until
//! its `transactional.id.expiration.ms`.
//!
//! # What a probe proves, and what it does not
//! - **Granted**: the broker serves transactions, and `Write` on ids starting with `<id>` is allowed: by
//!   an ACL by prefix (`--resource-pattern-type prefixed`) of `<id>` or shorter, by `*`, or because the
//!   cluster has no authorizer. That covers `<id>` itself. (An ACL whose prefix is longer than `<id>` and
//!   starts `<id>.outbox-cdc-check` would also pass; nobody grants that.)
//! - **Refused** (TRANSACTIONAL_ID_AUTHORIZATION_FAILED): the broker serves transactions and authorizes
//!   ids, and none of the principal's ACLs covers the probe id. That is not a proof that `<id>` is refused:
//!   a literal ACL on `<id>` does not cover the probe. The finding is a warning that says so, with the
//!   prefixed grant that both `run` and `check` accept.
//! - **Unsupported**: the broker has no transactions (Tansu 0.6); `exactly_once` and the Kafka backend
//!   cannot run there. A failure.
//!
//! # Why not another request
//! - DescribeAcls would show literal ACLs too, but needs `Describe` on the cluster (rarely granted to a
//!   connector), and the client cannot tell which principal it is (mTLS, OAuth) to filter them.
//! - FindCoordinator for the id itself would prove `Describe` without fencing, but librdkafka sends it
//!   only inside `init_transactions`, which goes on to InitProducerId; DescribeTransactions (KIP-664) is
//!   not in librdkafka either.

use rdkafka::producer::{BaseProducer, Producer};
use rdkafka::types::RDKafkaErrorCode;

use super::acls::{grant, Resource};
use super::findings::{fail, ok, warn, CHECK_TIMEOUT};
use crate::config::{Config, KafkaConfig};
use crate::error::{Error, Result};
use crate::findings::Finding;
use crate::kafka::identity::{self, Context};

/// What each probe id appends to the id it stands for: a name no connector's id ends in.
pub const PROBE_SUFFIX: &str = ".outbox-cdc-check";

/// The id a probe uses for `id` (module doc).
pub fn probe_id(id: &str) -> String {
    format!("{id}{PROBE_SUFFIX}")
}

/// The transactional ids `config` uses, each with the resource the README's table names it by.
pub(super) fn ids(config: &Config) -> Vec<(Resource, String)> {
    let mut ids = Vec::new();
    if config.exactly_once() || config.poll.transactional {
        ids.push((Resource::TransactionalId, config.transactional_id().to_string()));
    }
    if config.state.backend == crate::config::StateBackend::Kafka {
        ids.push((Resource::StateWriterId, super::acls::state_writer_id(config)));
    }
    ids
}

/// How `init_transactions` with a probe id ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Probe {
    /// A producer id was assigned.
    Granted,
    /// TRANSACTIONAL_ID_AUTHORIZATION_FAILED.
    Refused,
    /// The broker does not serve transactions: librdkafka's text.
    Unsupported(String),
    /// Anything else (no coordinator within the timeout, a broker error): the code and librdkafka's text.
    Failed(Option<RDKafkaErrorCode>, String),
}

/// Runs `init_transactions` with `probe` as the transactional id, on a blocking thread.
///
/// # Errors
/// A definite error when librdkafka refuses the configuration.
pub(super) async fn probe(kafka: &KafkaConfig, probe: &str) -> Result<Probe> {
    let mut cc = kafka.client_config()?;
    cc.set("transactional.id", probe).set("enable.idempotence", "true").set("acks", "all");
    let producer: BaseProducer<Context> = identity::client(kafka, &cc)?;
    let outcome = tokio::task::spawn_blocking(move || producer.init_transactions(CHECK_TIMEOUT))
        .await
        .map_err(|e| Error::transient(format!("the Kafka check's task failed: {e}")))?;
    Ok(match outcome {
        Ok(()) => Probe::Granted,
        Err(e) => match e.rdkafka_error_code() {
            Some(RDKafkaErrorCode::TransactionalIdAuthorizationFailed) => Probe::Refused,
            Some(RDKafkaErrorCode::UnsupportedFeature | RDKafkaErrorCode::UnsupportedVersion) => {
                Probe::Unsupported(e.to_string())
            }
            code => Probe::Failed(code, e.to_string()),
        },
    })
}

/// The finding "the broker serves transactions", from the first probe's outcome.
pub(super) fn transactions_finding(probe_id: &str, outcome: &Probe) -> Finding {
    const SETTING: &str = "kafka transactions";
    let expected = "the broker serves transactions ([state] backend = \"kafka\", exactly_once, poll.transactional)";
    match outcome {
        Probe::Granted => ok(SETTING, expected, &format!("yes: a producer with transactional id {probe_id} started")),
        Probe::Refused => ok(
            SETTING,
            expected,
            &format!("yes: the broker authorizes transactional ids (it refused {probe_id}, see below)"),
        ),
        Probe::Unsupported(text) => fail(
            SETTING,
            expected,
            &format!("no: {text}"),
            "this broker cannot run exactly_once, the Kafka state backend or poll.transactional (Apache Kafka \
             0.11 or later, or a compatible broker with transactions, is needed; Tansu 0.6 has none): use \
             another broker, or [state] backend = \"local\" with at_least_once",
        ),
        Probe::Failed(code, text) => fail(
            SETTING,
            expected,
            &format!("not within {} s ({code:?}: {text})", CHECK_TIMEOUT.as_secs()),
            "see the broker's log: its transaction coordinator (__transaction_state) must be available; check \
             again",
        ),
    }
}

/// The finding for transactional id `id` (the README's `resource`), from its probe's outcome (module doc:
/// what each outcome proves).
pub(super) fn id_finding(resource: Resource, id: &str, outcome: &Probe) -> Finding {
    let setting = format!("kafka transactional id {id}");
    let expected = "Write, Describe (proven without fencing: through a probe id under it)";
    let probe = probe_id(id);
    let prefixed = grant(&["Write", "Describe"], &format!("--transactional-id {id} --resource-pattern-type prefixed"));
    let literal = grant(&["Write", "Describe"], &format!("--transactional-id {id}"));
    let role = match resource {
        Resource::StateWriterId => "the state writer",
        _ => "the event producer",
    };
    match outcome {
        Probe::Granted => ok(
            &setting,
            expected,
            &format!(
                "granted: {probe} got a producer id, so ids starting with {id} are allowed (an ACL by prefix, `*`, \
                 or no authorizer); {id} itself was not used, so no running instance was fenced"
            ),
        ),
        Probe::Refused => warn(
            &setting,
            expected,
            &format!(
                "not proven: the probe id {probe} was refused (TRANSACTIONAL_ID_AUTHORIZATION_FAILED). A literal \
                 ACL on {id} does not cover it, and {id} itself is not tried (that would fence {role} of a running \
                 instance)"
            ),
            &format!(
                "if the principal has no ACL on {id}, run stops with TRANSACTIONAL_ID_AUTHORIZATION_FAILED. Grant \
                 it by prefix, which check can prove: {prefixed} (or literally, which it cannot: {literal})"
            ),
        ),
        Probe::Unsupported(_) | Probe::Failed(..) => warn(
            &setting,
            expected,
            "not proven: the broker's transactions are not available (see kafka transactions)",
            &format!("once they are, run needs: {literal}"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::findings::Status;

    /// What each probe outcome is reported as: only a missing broker feature fails; a refused probe id is a
    /// warning, since a literal ACL on the real id would not cover it.
    #[test]
    fn probe_findings() {
        let cases: &[(Probe, Status, Status, &str)] = &[
            (Probe::Granted, Status::Ok, Status::Ok, "no running instance was fenced"),
            (Probe::Refused, Status::Ok, Status::Warn, "--transactional-id t --resource-pattern-type prefixed"),
            (Probe::Unsupported("x".into()), Status::Fail, Status::Warn, "--transactional-id t"),
            (Probe::Failed(None, "x".into()), Status::Fail, Status::Warn, "--transactional-id t"),
        ];
        for (outcome, transactions, id, says) in cases {
            let t = transactions_finding("t.outbox-cdc-check", outcome);
            assert_eq!(t.status, *transactions, "{outcome:?}: {t:?}");
            let f = id_finding(Resource::TransactionalId, "t", outcome);
            assert_eq!(f.status, *id, "{outcome:?}: {f:?}");
            assert!(f.actual.contains(says) || f.fix.contains(says), "{outcome:?} must say {says:?}: {f:?}");
        }
    }

    /// The probe ids stand under the ids they prove, and are none of the connector's own.
    #[test]
    fn probe_ids_are_under_the_real_ones() {
        let config = crate::config::Config::parse(
            "[source]\nhost = \"h\"\nuser = \"u\"\nserver_id = 1\n[outbox]\ntable = \"s.t\"\n[kafka]\n\
             bootstrap_servers = \"b:9092\"\n[state]\nbackend = \"kafka\"\nname = \"orders\"\n\
             [delivery]\nguarantee = \"exactly_once\"\n",
        )
        .unwrap();
        let ids = ids(&config);
        let names: Vec<&str> = ids.iter().map(|(_, id)| id.as_str()).collect();
        assert_eq!(names, ["orders", "orders.state"]);
        for (_, id) in &ids {
            let probe = probe_id(id);
            assert!(probe.starts_with(id.as_str()) && !names.contains(&probe.as_str()), "{probe}");
        }
    }
}
