//! `outbox-cdc state copy --to <backend>`: moves the connector's state between the local store
//! (`[state] dir`) and the Kafka topic (`[state] topic`, records of `[state] name`), e.g. before switching
//! `[state] backend` to `"kafka"` to run without a volume, or with `exactly_once`.
//!
//! Floor 6, the top (docs/ARCHITECTURE.md): may import anything below; nothing imports it but `main.rs`.
//!
//! # What it guarantees
//! - The connector is stopped: the local store refuses a second writer, and the Kafka side is written only
//!   while this command holds the connector's lease on the source server (a running instance with the
//!   Kafka backend holds it).
//! - Nothing newer is overwritten: when the target already holds a checkpoint, the copied one must hold
//!   every transaction it holds (same server); otherwise the copy is refused and nothing is written.
//! - The checkpoint is copied as it is (position, server, snapshot progress), with holds, known poison, the
//!   pause, the snapshots on demand and the signals carried out: the connector resumes from the target
//!   exactly where it would have resumed from the source.
//! - A state topic with more than one partition, which every other command refuses, is read here, merged
//!   per key ([`crate::checkpoint::kafka::KafkaStore::inspect_merging_partitions`]): `--to local`, then
//!   `--to kafka` with `[state] topic` naming a new one-partition topic, moves the connector off it.

use crate::checkpoint::store::Inspection;
use crate::checkpoint::Store;
use crate::config::{Config, StateBackend};
use crate::error::{Error, Result};
use crate::kafka::commit::Deadline;
use crate::lease::Lease;

/// What a copy did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyReport {
    /// The checkpoint's position, when there was one.
    pub position: Option<String>,
    /// Holds copied.
    pub holds: usize,
    /// Known poison events copied.
    pub known_poison: usize,
}

/// Copies the state from the backend `config` does not name as `to` into `to`.
///
/// # Errors
/// Definite when the source holds nothing, the target holds a newer or another server's checkpoint, or a
/// connector is running; transient when Kafka or the source server cannot be reached.
pub async fn copy(config: &Config, to: StateBackend) -> Result<CopyReport> {
    let from_backend = match to {
        StateBackend::Kafka => StateBackend::Local,
        StateBackend::Local => StateBackend::Kafka,
    };
    let with = |backend| {
        let mut c = config.clone();
        c.state.backend = backend;
        c
    };
    let (from_config, to_config) = (with(from_backend), with(to));
    // No connector may run on either side while the state moves.
    let lease = Lease::of_stopped_connector(config).await?;
    let result = async {
        // The local store opened as its one writer: no connector with the local backend runs either.
        let stopped = |e: Error| e.context("state copy needs the connector stopped");
        let from = match from_backend {
            StateBackend::Local => Store::open(&config.state.dir).map_err(stopped)?.inspection()?,
            // Any number of partitions: this is the way out of a state topic whose partitions were added.
            StateBackend::Kafka => crate::checkpoint::kafka::KafkaStore::inspect_merging_partitions(&from_config)
                .await?
                .unwrap_or_default(),
        };
        if from.checkpoint.is_none() {
            return Err(Error::definite(format!("no checkpoint in {}: nothing to copy", from_config.state_location())));
        }
        let target = Store::open_for(&to_config, &Deadline::default()).await.map_err(stopped)?;
        check_not_newer(&from, target.load()?.as_ref(), &to_config.state_location())?;
        crate::checkpoint::copy_into(&from, &target)?;
        Ok(CopyReport {
            position: from.checkpoint.as_ref().map(|c| c.position().to_string()),
            holds: from.holds.len(),
            known_poison: from.known_poison.len(),
        })
    }
    .await;
    lease.release().await;
    result
}

/// Refuses to overwrite a target checkpoint that the copied one does not hold all of.
fn check_not_newer(from: &Inspection, target: Option<&crate::checkpoint::Checkpoint>, location: &str) -> Result<()> {
    let (Some(copied), Some(existing)) = (from.checkpoint.as_ref(), target) else { return Ok(()) };
    if copied.server() != existing.server() {
        return Err(Error::definite(format!(
            "{location} holds a checkpoint of another server ({}): refusing to replace it; remove it first if it \
             is stale",
            crate::source::preflight::describe_identity(existing.server())
        )));
    }
    if !copied.position().holds_all_of(existing.position()) {
        return Err(Error::definite(format!(
            "{location} holds a newer checkpoint ({}) than the one to copy ({}): refusing to move the connector \
             back; it already runs from there",
            existing.position(),
            copied.position()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::Checkpoint;
    use crate::position::{BinlogCoord, Flavor, Gtids, Position, ServerIdentity};

    fn checkpoint(gtids: &str, server_id: u32) -> Checkpoint {
        let position = Position {
            gtids: Gtids::MariaDb(gtids.parse().unwrap()),
            coord: BinlogCoord { file: "b.1".into(), pos: 4 },
        };
        let server = ServerIdentity { flavor: Flavor::MariaDb, server_id, server_uuid: None, binlog_files: false };
        Checkpoint::for_test(position, server, None)
    }

    fn inspection(checkpoint: Checkpoint) -> Inspection {
        Inspection {
            checkpoint: Some(checkpoint),
            holds: vec![],
            last_error: None,
            known_poison: vec![],
            paused: None,
            snapshots: vec![],
            signals: vec![],
        }
    }

    /// Only a copy that holds everything the target holds, from the same server, may replace it.
    #[test]
    fn a_newer_or_foreign_target_is_never_replaced() {
        let from = inspection(checkpoint("0-1-10", 1));
        check_not_newer(&from, None, "t").expect("an empty target");
        check_not_newer(&from, Some(&checkpoint("0-1-10", 1)), "t").expect("the same position");
        check_not_newer(&from, Some(&checkpoint("0-1-9", 1)), "t").expect("an older target");
        let err = check_not_newer(&from, Some(&checkpoint("0-1-11", 1)), "t").unwrap_err();
        assert!(err.is_definite() && err.to_string().contains("newer checkpoint"), "{err}");
        let err = check_not_newer(&from, Some(&checkpoint("0-1-9", 2)), "t").unwrap_err();
        assert!(err.to_string().contains("another server"), "{err}");
    }
}
