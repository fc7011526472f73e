//! The records the state store keeps besides the checkpoint, as both backends read and write them.
//!
//! Floor 4 (docs/ARCHITECTURE.md): imports floors 0-3.

use serde::{Deserialize, Serialize};

use super::Checkpoint;
use crate::poison::{Hold, KnownPoison};
pub use crate::position::on_demand::{RequestState, SnapshotRequest};

/// Everything in the store, read without the writer role.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inspection {
    /// The stream checkpoint.
    pub checkpoint: Option<Checkpoint>,
    /// Aggregates on hold.
    pub holds: Vec<Hold>,
    /// The last error that stopped or restarted the pipeline.
    pub last_error: Option<LastError>,
    /// Events the broker refused for good.
    pub known_poison: Vec<KnownPoison>,
    /// An operator's pause, until resumed.
    pub paused: Option<Paused>,
    /// Snapshots on demand asked of the connector, in the order they were asked.
    pub snapshots: Vec<SnapshotRequest>,
    /// The signals of `[outbox] signal_table` carried out, by id: kept while their rows may be read again
    /// (a relay reads the whole table).
    pub signals: Vec<(String, AppliedSignal)>,
}

/// An operator paused the connector (`POST /v1/pause`, `outbox-cdc pause`): it reads and publishes nothing,
/// across restarts and failovers, until resumed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Paused {
    /// When (Unix ms).
    pub at_ms: u64,
    /// What asked: `api`, `cli`, or `signal <id>` (a `pause` row of `[outbox] signal_table`).
    pub by: String,
}

impl Paused {
    /// The id of the signal that paused, when one did.
    pub fn signal(&self) -> Option<&str> {
        self.by.strip_prefix(SIGNAL_BY)
    }
}

/// How a request or a pause names the signal that asked for it: `signal <id>`.
pub const SIGNAL_BY: &str = "signal ";

/// A signal of `[outbox] signal_table` carried out (kept by its id, so that one read again is not).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppliedSignal {
    /// When (Unix ms).
    pub at_ms: u64,
    /// Its type.
    pub kind: String,
    /// What it did.
    pub outcome: String,
}

/// The last error that stopped or restarted the pipeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastError {
    /// When (Unix ms).
    pub at_ms: u64,
    /// `transient` or `definite`.
    pub class: String,
    /// The message.
    pub message: String,
}

/// The key of a hold: `aggregate_type \0 aggregate_id`.
pub(super) fn hold_key(aggregate_type: &str, aggregate_id: &str) -> String {
    format!("{aggregate_type}\0{aggregate_id}")
}
