//! Who the server is and which event ended a transaction: the identity records stored with every checkpoint
//! so that a position is never resumed against another server ([`ServerIdentity`]) or another history of
//! the same server ([`EndEvent`], compared by `source::history`). Their JSON must not change.
//!
//! Floor 0, the ground floor (docs/ARCHITECTURE.md): imports nothing of ours but other ground-floor modules.

use mysql_common::binlog::events::Event;
use serde::{Deserialize, Serialize};

use super::Flavor;

/// Length of a binlog event header (v4 format, every server since MySQL 5.0).
pub const EVENT_HEADER_LEN: usize = 19;

/// Who the server is: stored with the checkpoint so that the connector never resumes a position against
/// a different server by accident.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerIdentity {
    /// MySQL or MariaDB.
    pub flavor: Flavor,
    /// `@@server_id`.
    pub server_id: u32,
    /// `@@server_uuid` (MySQL only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_uuid: Option<String>,
    /// Read from binlog files (`source.kind = "files"`), not from the live server: a checkpoint of one
    /// never silently resumes the other.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub binlog_files: bool,
}

/// The event that ends a transaction in the binlog, as written: enough to recognise it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndEvent {
    /// Its size in bytes as its header says (checksum trailer included): it starts this many bytes before
    /// the position's offset.
    pub len: u32,
    /// CRC-32 (the zlib polynomial) of its 19-byte header and its body, without the checksum trailer.
    pub crc32: u32,
}

impl EndEvent {
    /// The fingerprint of `event`, a top-level event of the binlog (for a compressed MySQL transaction, the
    /// TRANSACTION_PAYLOAD event, not the events inside it).
    pub fn of(event: &Event) -> Self {
        let header = event.header();
        // NOTE: the v4 header laid out on the stack, not through mysql_common's `MySerialize` (which writes
        // into a Vec): this runs once per transaction on the reader's hot path.
        let mut bytes = [0u8; EVENT_HEADER_LEN];
        bytes[0..4].copy_from_slice(&header.timestamp().to_le_bytes());
        bytes[4] = header.event_type_raw();
        bytes[5..9].copy_from_slice(&header.server_id().to_le_bytes());
        bytes[9..13].copy_from_slice(&header.event_size().to_le_bytes());
        bytes[13..17].copy_from_slice(&header.log_pos().to_le_bytes());
        bytes[17..19].copy_from_slice(&header.flags_raw().to_le_bytes());
        let mut crc = crc32fast::Hasher::new();
        crc.update(&bytes);
        crc.update(event.data());
        EndEvent { len: header.event_size(), crc32: crc.finalize() }
    }
}
