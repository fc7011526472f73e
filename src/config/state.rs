//! `[state]`: where the checkpoint and the rest of the connector's state live.
//!
//! Floor 2 (docs/ARCHITECTURE.md): imports floors 0-1 (vocabulary, error, metrics).

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::{millis, SourceKind};
use crate::error::{Error, Result};

/// `[state]`: where the checkpoint, the snapshot's progress, holds and known poison live.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateConfig {
    /// "local" (default): an embedded store in `dir`, on this host's disk. "kafka": a compacted topic
    /// (`topic`), so that the process keeps nothing on disk: a pod without a volume, moved to another node,
    /// or a standby on another host resumes exactly. With "kafka" two instances of one connector (`name`)
    /// never publish at the same time: the one holding a lease on the source server publishes, the other
    /// waits (`[delivery] failover_timeout_ms`).
    #[serde(default)]
    pub backend: StateBackend,
    /// Directory of the embedded checkpoint store (created if missing); `backend = "local"` only.
    #[serde(default = "default_state_dir")]
    pub dir: PathBuf,
    /// The compacted topic of `backend = "kafka"` (created with `cleanup.policy=compact`, `retention.ms=-1`
    /// and one partition if missing). Several connectors may share it: their records are keyed by `name`.
    #[serde(default = "default_state_topic")]
    pub topic: String,
    /// This connector's name: the key of its records in the state topic, its lease on the source server,
    /// and the default `[delivery] transactional_id`. Connectors that share a state topic or a source
    /// server need different names; a standby has the same. 1-100 characters of `[A-Za-z0-9._-]`.
    #[serde(default = "default_connector_name")]
    pub name: String,
    /// The acknowledged watermark is written at most this often (and on graceful shutdown). Lower means a
    /// smaller duplicate window after a crash, at one fsync per write. With `[delivery] guarantee =
    /// "exactly_once"`, it is how often the Kafka transaction commits: the latency consumers with
    /// `read_committed` see, up to this interval.
    #[serde(rename = "checkpoint_interval_ms", default = "default_checkpoint_interval", deserialize_with = "millis")]
    pub checkpoint_interval: Duration,
}

impl Default for StateConfig {
    fn default() -> Self {
        StateConfig {
            backend: StateBackend::default(),
            dir: default_state_dir(),
            topic: default_state_topic(),
            name: default_connector_name(),
            checkpoint_interval: default_checkpoint_interval(),
        }
    }
}

/// `state.backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StateBackend {
    /// The embedded store under `state.dir`.
    #[default]
    Local,
    /// The compacted topic `state.topic`.
    Kafka,
}

fn default_state_topic() -> String {
    "outbox-cdc.state".into()
}
fn default_connector_name() -> String {
    "outbox-cdc".into()
}

fn default_state_dir() -> PathBuf {
    PathBuf::from("state")
}
fn default_checkpoint_interval() -> Duration {
    Duration::from_millis(1_000)
}

impl StateConfig {
    /// Checks the section, with the source kind that decides whether the Kafka backend can hold a lease:
    /// names that Kafka and the lease accept, a checkpoint period.
    pub(super) fn validate(&self, kind: SourceKind) -> Result<()> {
        let legal_name = |n: &str| {
            (1..=100).contains(&n.len()) && n.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        };
        if !legal_name(&self.name) {
            return Err(Error::definite(format!(
                "state.name {:?} must be 1-100 characters of [A-Za-z0-9._-]",
                self.name
            )));
        }
        if !crate::topic::is_legal_topic(&self.topic) {
            return Err(Error::definite(format!(
                "state.topic {:?} is not a legal Kafka topic name (1-249 of [a-zA-Z0-9._-])",
                self.topic
            )));
        }
        if self.checkpoint_interval.is_zero() {
            return Err(Error::definite(
                "state.checkpoint_interval_ms must be at least 1: it is the period of the checkpoint writer (with \
                 exactly_once, of the Kafka commits)",
            ));
        }
        if self.backend == StateBackend::Kafka && kind == SourceKind::Poll {
            return Err(Error::definite(
                "state.backend = \"kafka\" does not apply to the polling relay: its state is the outbox table \
                 itself (published_at, parked rows), and its standbys share it through the source server's \
                 lease; remove it",
            ));
        }
        if self.backend == StateBackend::Kafka && kind == SourceKind::Files {
            return Err(Error::definite(
                "state.backend = \"kafka\" needs a source server: its lease (which keeps two instances from \
                 publishing at once) is held there, and source.kind = \"files\" has none; use the local backend",
            ));
        }
        Ok(())
    }
}
