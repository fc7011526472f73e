//! Checkpoints: the acknowledged watermark, made durable.
//!
//! Only an acknowledgement can move the checkpoint. The Kafka sink is the only code that can create a
//! [`crate::sink::Delivered`] proof; the [`Watermark`] is the only code that turns proofs, in source order,
//! into a position; `Checkpointer::flush` (in `pipeline/checkpointer.rs`) is the only code that writes that
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

pub mod store;
pub mod watermark;

use serde::{Deserialize, Serialize};

pub use store::Store;
pub use watermark::{Mark, TxId, Watermark};

use crate::position::EndEvent;
use crate::position::Position;
use crate::position::ServerIdentity;

/// The stored record, as JSON (readable by `outbox-cdc status`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Record format version.
    pub version: u32,
    /// Resume point: the end of the newest fully acknowledged source transaction.
    pub position: Position,
    /// The server the position belongs to.
    pub server: ServerIdentity,
    /// Commit time (server clock, Unix seconds) of the last checkpointed transaction, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_timestamp: Option<u32>,
    /// The binlog event that ended that transaction, compared with the server's binlog before a resume so
    /// that a checkpoint never resumes in another history of the server (`source::history`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_event: Option<EndEvent>,
    /// When this record was written (Unix milliseconds).
    pub written_at_ms: u64,
    /// Initial snapshot in progress, or finished with its overlap rule still in force.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<crate::position::snapshot::SnapshotState>,
}

/// Current checkpoint record format.
pub const CHECKPOINT_VERSION: u32 = 1;
