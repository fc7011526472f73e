//! `[delivery]`: the delivery guarantee, and taking over from another instance.
//!
//! Floor 2 (docs/ARCHITECTURE.md): imports floors 0-1 (vocabulary, error, metrics).

use std::time::Duration;

use serde::Deserialize;

use super::{millis, KafkaConfig, SourceKind, StateBackend, StateConfig};
use crate::error::{Error, Result};

/// `[delivery]`: what consumers can count on, and taking over from another instance.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeliveryConfig {
    /// "at_least_once" (default): after a crash, events not yet checkpointed are published again (same `id`
    /// header). "exactly_once": events and the checkpoint that covers them are written in one Kafka
    /// transaction, so consumers with `isolation.level=read_committed` see every event once across crashes
    /// and failovers (exceptions: docs/CONTRACT.md). Needs `[state] backend = "kafka"`.
    #[serde(default)]
    pub guarantee: Guarantee,
    /// The producer's `transactional.id` (`exactly_once`): stable across restarts and shared by a standby,
    /// so that a new instance fences an old one that is still alive. Default: `state.name`.
    #[serde(default)]
    pub transactional_id: Option<String>,
    /// With `exactly_once`, a transaction commits when it holds this many bytes of records, at the end of
    /// the source transaction that crossed it (or every `state.checkpoint_interval_ms`). A larger source
    /// transaction still commits whole: see docs/CONTRACT.md. Between 1 MiB and 1 GiB; default 64 MiB.
    #[serde(default = "default_transaction_max_bytes")]
    pub transaction_max_bytes: usize,
    /// With `[state] backend = "kafka"`: how soon a standby takes over after the active instance dies (kill,
    /// host loss, network cut), in milliseconds. The active instance stops publishing when it cannot renew
    /// its lease within half of this. Between 2000 and 600000; default 30000.
    #[serde(rename = "failover_timeout_ms", default = "default_failover_timeout", deserialize_with = "millis")]
    pub failover_timeout: Duration,
}

impl Default for DeliveryConfig {
    fn default() -> Self {
        DeliveryConfig {
            guarantee: Guarantee::default(),
            transactional_id: None,
            transaction_max_bytes: default_transaction_max_bytes(),
            failover_timeout: default_failover_timeout(),
        }
    }
}

/// `delivery.guarantee`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Guarantee {
    /// Every event at least once; a crash republishes what was not checkpointed.
    #[default]
    AtLeastOnce,
    /// Every event once to `read_committed` consumers: events and checkpoint in one Kafka transaction.
    ExactlyOnce,
}

fn default_transaction_max_bytes() -> usize {
    64 * 1024 * 1024
}
fn default_failover_timeout() -> Duration {
    Duration::from_millis(30_000)
}

impl DeliveryConfig {
    /// Checks the section, with what exactly-once depends on: the state backend and checkpoint period,
    /// the source kind, and the Kafka transaction timeout.
    pub(super) fn validate(&self, state: &StateConfig, kind: SourceKind, kafka: &KafkaConfig) -> Result<()> {
        let delivery = self;
        if delivery.transactional_id.as_deref().is_some_and(|id| id.is_empty() || id.len() > 249) {
            return Err(Error::definite("delivery.transactional_id must be 1 to 249 characters"));
        }
        if !(2_000..=600_000).contains(&delivery.failover_timeout.as_millis()) {
            return Err(Error::definite("delivery.failover_timeout_ms must be between 2000 and 600000"));
        }
        if !(1024 * 1024..=1024 * 1024 * 1024).contains(&delivery.transaction_max_bytes) {
            return Err(Error::definite("delivery.transaction_max_bytes must be between 1 MiB and 1 GiB"));
        }
        if delivery.guarantee == Guarantee::ExactlyOnce {
            if kind == SourceKind::Poll {
                return Err(Error::definite(
                    "delivery.guarantee = \"exactly_once\" needs the binlog: the polling relay marks rows \
                     published in the database after Kafka acknowledged them, and no transaction spans both; use \
                     \"at_least_once\" (each event keeps its `id` header for consumers to deduplicate)",
                ));
            }
            if state.backend != StateBackend::Kafka {
                return Err(Error::definite(
                    "delivery.guarantee = \"exactly_once\" needs [state] backend = \"kafka\": the checkpoint is \
                     written in the same Kafka transaction as the events it covers",
                ));
            }
            let timeout_ms = kafka.transaction_timeout_ms()?;
            if state.checkpoint_interval.as_millis().saturating_mul(2) > u128::from(timeout_ms) {
                return Err(Error::definite(format!(
                    "state.checkpoint_interval_ms = {} is more than half of kafka.properties.\"transaction.timeout.ms\" \
                     = {timeout_ms}: a transaction stays open about one interval and then commits, and the broker \
                     aborts one that stays open longer than that timeout, so the commits would fail (at or above \
                     it, none would ever succeed). Lower the interval, or raise the timeout (at most the broker's \
                     transaction.max.timeout.ms, 15 minutes by default)",
                    state.checkpoint_interval.as_millis()
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::MINIMAL;
    use crate::config::*;

    /// Exactly-once needs the Kafka state backend and the binlog; names must suit Kafka and the lease.
    #[test]
    fn delivery_and_state_settings_are_checked_together() {
        let c = Config::parse(MINIMAL).unwrap();
        assert_eq!((c.delivery.guarantee, c.state.backend), (Guarantee::AtLeastOnce, StateBackend::Local));
        assert_eq!(c.transactional_id(), "outbox-cdc");
        let with = |extra: &str| Config::parse(&format!("{MINIMAL}\n{extra}"));
        let err = with("[delivery]\nguarantee = \"exactly_once\"").unwrap_err().to_string();
        assert!(err.contains("backend = \"kafka\""), "{err}");
        let c = with("[delivery]\nguarantee = \"exactly_once\"\n[state]\nbackend = \"kafka\"\nname = \"orders-1\"")
            .unwrap();
        assert!(c.exactly_once());
        assert_eq!((c.transactional_id(), c.state.topic.as_str()), ("orders-1", "outbox-cdc.state"));
        assert!(with("[state]\nname = \"a b\"").unwrap_err().to_string().contains("state.name"));
        assert!(with("[state]\ntopic = \"a/b\"").unwrap_err().to_string().contains("state.topic"));
        assert!(with("[delivery]\nfailover_timeout_ms = 500").unwrap_err().to_string().contains("failover_timeout_ms"));
        let err = with("[kafka.properties]\n\"transactional.id\" = \"x\"").unwrap_err().to_string();
        assert!(err.contains("[delivery] transactional_id"), "{err}");
    }

    /// Settings that would silently break the commits: each refused with what to change.
    #[test]
    fn settings_that_break_the_commits_are_refused() {
        let eos = "[delivery]\nguarantee = \"exactly_once\"\n[state]\nbackend = \"kafka\"\n";
        let with = |extra: &str| Config::parse(&format!("{MINIMAL}\n{extra}"));
        let refusals: &[(String, &str)] = &[
            // The periodic writer's timer panicked on a zero period, and the run restarted for ever.
            ("[state]\ncheckpoint_interval_ms = 0".into(), "at least 1"),
            // At or above the transaction timeout nothing ever commits.
            (format!("{eos}checkpoint_interval_ms = 60000"), "more than half"),
            (
                format!(
                    "{eos}checkpoint_interval_ms = 2000\n[kafka.properties]\n\"transaction.timeout.ms\" = \"3000\""
                ),
                "more than half",
            ),
            (format!("{eos}[kafka.properties]\n\"transaction.timeout.ms\" = \"soon\""), "not a number"),
        ];
        for (extra, expected) in refusals {
            let err = with(extra).unwrap_err();
            assert!(err.is_definite() && err.to_string().contains(expected), "{extra}: {err}");
        }
        with(&format!("{eos}checkpoint_interval_ms = 30000")).expect("half of the default timeout");
        with("[state]\ncheckpoint_interval_ms = 60000").expect("at_least_once has no transaction timeout");
    }
}
