//! Checkpoints: the acknowledged watermark, made durable.
//!
//! Floor 4 (docs/ARCHITECTURE.md): imports floors 0-3.
//!
//! Only an acknowledgement can move the checkpoint. The Kafka sink is the only code that can create a
//! [`crate::sink::Delivered`] proof; the [`Watermark`] is the only code that turns proofs, in source order,
//! into a position; `Checkpointer::flush` ([`checkpointer`]) is the only code that writes that
//! position to the [`Store`].
//!
//! # Invariants
//! - A stored position is always the end of a source transaction whose records, and every earlier
//!   transaction's records, Kafka acknowledged (idempotent producer, `acks=all`).
//! - The store is written at most every `checkpoint_interval_ms`, plus once on graceful shutdown; each
//!   write is one fsync'd redb transaction, so a crash leaves the previous or the new record, never a mix.
//! - The duplicate window after a crash is therefore: records acknowledged after the last write, plus
//!   records in flight.
//!
//! # Why not store offsets in Kafka
//! The position belongs to the source; storing it beside the connector keeps the promise independent of
//! the broker's consumer-group machinery, and `outbox-cdc status` can read it while the connector runs.

pub mod checkpointer;
pub mod kafka;
pub mod records;
pub mod store;
pub mod watermark;

use serde::{Deserialize, Serialize};

pub use store::Store;
pub use watermark::{Mark, TxId, Watermark};

use crate::position::on_demand::OnDemandProgress;
use crate::position::snapshot::SnapshotState;
use crate::position::{EndEvent, Position, ServerIdentity, TxProgress};

/// The stored record, as JSON (readable by `outbox-cdc status`).
///
/// Sealed: only the [`checkpointer`] constructs one and only it can save one ([`Store::save`]); everyone
/// else reads. Every type it holds is a ground-floor record (`position`), and its JSON must not change
/// without a new [`CHECKPOINT_VERSION`] (`tests/golden_state.rs` holds records written by earlier builds).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Record format version.
    version: u32,
    /// Resume point: the end of the newest fully acknowledged source transaction.
    position: Position,
    /// The server the position belongs to.
    server: ServerIdentity,
    /// Commit time (server clock, Unix seconds) of the last checkpointed transaction, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    source_timestamp: Option<u32>,
    /// The binlog event that ended that transaction, compared with the server's binlog before a resume so
    /// that a checkpoint never resumes in another history of the server (`source::history`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    end_event: Option<EndEvent>,
    /// When this record was written (Unix milliseconds).
    written_at_ms: u64,
    /// Initial snapshot in progress, or finished with its overlap rule still in force.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    snapshot: Option<SnapshotState>,
    /// The outbox rows of the transaction after `position` already published: `exactly_once` commits inside
    /// a source transaction longer than a Kafka transaction may stay open. A build without this field
    /// ignores it and publishes those rows again (duplicates, never a loss).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    inside: Option<TxProgress>,
    /// How far the snapshot on demand being read got (`pipeline::on_demand`). A build without this field
    /// starts that snapshot again from its first row (duplicates, never a loss).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    on_demand: Option<OnDemandProgress>,
    /// The outbox tables the run that wrote it publishes, as `database.table`: a table configured later is
    /// snapshotted at the next start (`pipeline::plan`). Empty in records of earlier versions, which are
    /// taken to cover the tables configured.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    tables: Vec<String>,
}

impl Checkpoint {
    /// Record format version.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Resume point: the end of the newest fully acknowledged source transaction.
    pub fn position(&self) -> &Position {
        &self.position
    }

    /// The server the position belongs to.
    pub fn server(&self) -> &ServerIdentity {
        &self.server
    }

    /// Commit time (server clock, Unix seconds) of the last checkpointed transaction, when known.
    pub fn source_timestamp(&self) -> Option<u32> {
        self.source_timestamp
    }

    /// The binlog event that ended that transaction, when known.
    pub fn end_event(&self) -> Option<EndEvent> {
        self.end_event
    }

    /// When this record was written (Unix milliseconds).
    pub fn written_at_ms(&self) -> u64 {
        self.written_at_ms
    }

    /// Snapshot progress, while a snapshot runs or its overlap rule is in force.
    pub fn snapshot(&self) -> Option<&SnapshotState> {
        self.snapshot.as_ref()
    }

    /// The outbox rows of the transaction after the position already published, when a commit came inside it.
    pub fn inside(&self) -> Option<&TxProgress> {
        self.inside.as_ref()
    }

    /// The outbox tables the run that wrote it publishes (empty: written by an earlier version).
    pub fn tables(&self) -> &[String] {
        &self.tables
    }

    /// How far the snapshot on demand being read got.
    pub fn on_demand(&self) -> Option<&OnDemandProgress> {
        self.on_demand.as_ref()
    }

    /// Where a run resumes: the stored position as the watermark's starting mark.
    pub fn into_mark(self) -> Mark {
        Mark {
            position: self.position,
            timestamp: self.source_timestamp,
            end_event: self.end_event,
            snapshot: self.snapshot.map(std::sync::Arc::new),
            inside: self.inside,
            on_demand: self.on_demand.map(std::sync::Arc::new),
        }
    }

    /// This record, written by a run that published `tables`.
    #[cfg(test)]
    pub(crate) fn covering(self, tables: &[&str]) -> Self {
        Checkpoint { tables: tables.iter().map(ToString::to_string).collect(), ..self }
    }

    /// A record for unit tests of the modules that read checkpoints.
    #[cfg(test)]
    pub(crate) fn for_test(position: Position, server: ServerIdentity, snapshot: Option<SnapshotState>) -> Self {
        Checkpoint {
            version: CHECKPOINT_VERSION,
            position,
            server,
            source_timestamp: None,
            end_event: None,
            written_at_ms: 1,
            snapshot,
            inside: None,
            on_demand: None,
            tables: Vec::new(),
        }
    }
}

/// Copies what `from` holds (another backend's state, read with [`Store::inspect_for`]) into `to`: the
/// checkpoint as it is (same position, server and snapshot progress), holds, known poison and a pause. For
/// `outbox-cdc state copy`, which checks first that `to` holds nothing newer.
///
/// # Errors
/// The write's error; what was written before it stays (a copy run again writes the same records).
pub fn copy_into(from: &store::Inspection, to: &Store) -> crate::error::Result<()> {
    for hold in &from.holds {
        to.put_hold(hold)?;
    }
    for poison in &from.known_poison {
        to.add_known_poison(poison)?;
    }
    // The target mirrors the source: a hold released on one side and left on the other would dead-letter
    // its aggregate's events again, and the next release would publish them a second time.
    let kept: std::collections::HashSet<_> = from.holds.iter().map(|h| (&h.aggregate_type, &h.aggregate_id)).collect();
    for hold in to.holds()? {
        if !kept.contains(&(&hold.aggregate_type, &hold.aggregate_id)) {
            to.remove_hold(&hold, &[])?;
        }
    }
    let known: std::collections::HashSet<_> = from.known_poison.iter().map(|p| &p.id).collect();
    let gone: Vec<String> = to.known_poison()?.into_iter().map(|p| p.id).filter(|id| !known.contains(id)).collect();
    to.forget_known_poison(&gone)?;
    to.set_paused(from.paused.as_ref())?;
    for request in &from.snapshots {
        to.put_snapshot(request)?;
    }
    // Without them a signal read again would be carried out again (a relay reads its whole table).
    for (id, applied) in &from.signals {
        to.put_applied_signal(id, applied)?;
    }
    // Last: a copy cut short leaves the target without a checkpoint rather than one without its holds.
    if let Some(checkpoint) = &from.checkpoint {
        to.save(checkpoint)?;
    }
    Ok(())
}

/// Current checkpoint record format.
pub const CHECKPOINT_VERSION: u32 = 1;
