//! `[snapshot]`: rows that exist before the connector's first start.
//!
//! Floor 2 (docs/ARCHITECTURE.md): imports floors 0-1 (vocabulary, error, metrics).

use serde::Deserialize;

use crate::error::{Error, Result};

/// `[snapshot]`: rows that exist before the connector's first start.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotConfig {
    /// "initial" (default: snapshot when there is no checkpoint, then stream), "never" (stream only, from
    /// `source.start_from`), "initial_only" (snapshot, checkpoint, exit 0) or "when_needed" (like initial,
    /// and also re-snapshot when the checkpoint's position was purged from the server's binlogs).
    #[serde(default)]
    pub mode: SnapshotMode,
    /// Optional SQL condition restricting the snapshot, e.g. `published_at IS NULL`.
    #[serde(default)]
    pub r#where: Option<String>,
    /// Rows per chunk of the snapshot's streamed scan, and so per snapshot checkpoint (one chunk is read
    /// ahead while the previous one is produced: at most three are in memory).
    #[serde(default = "default_chunk_rows")]
    pub chunk_rows: usize,
    /// MySQL only: the brief lock that makes the snapshot's GTID read exact. "tables" (default,
    /// `LOCK TABLES … READ` on the outbox tables; needs the LOCK TABLES privilege) or "global"
    /// (`FLUSH TABLES WITH READ LOCK`; needs RELOAD, not allowed on most managed services). MariaDB needs
    /// no lock.
    #[serde(default)]
    pub lock: SnapshotLock,
    /// MySQL only: how long (seconds, at least 1) the snapshot's lock may wait behind an open transaction
    /// on the outbox tables. While it waits, the application's new outbox inserts wait behind it; when the
    /// time is up the connector gives up, logs why, and retries with back-off. Default 10.
    #[serde(default = "default_lock_wait_timeout_s")]
    pub lock_wait_timeout_s: u32,
}

impl Default for SnapshotConfig {
    fn default() -> Self {
        SnapshotConfig {
            mode: SnapshotMode::default(),
            r#where: None,
            chunk_rows: default_chunk_rows(),
            lock: SnapshotLock::default(),
            lock_wait_timeout_s: default_lock_wait_timeout_s(),
        }
    }
}

/// When to snapshot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotMode {
    /// Snapshot when there is no checkpoint, then stream.
    #[default]
    Initial,
    /// Never snapshot.
    Never,
    /// Snapshot, checkpoint, exit.
    InitialOnly,
    /// Like `initial`, and re-snapshot when the checkpoint's position was purged.
    WhenNeeded,
}

/// MySQL snapshot lock.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotLock {
    /// `LOCK TABLES … READ` on the outbox tables.
    #[default]
    Tables,
    /// `FLUSH TABLES WITH READ LOCK`.
    Global,
}

fn default_lock_wait_timeout_s() -> u32 {
    10
}

fn default_chunk_rows() -> usize {
    2_000
}

impl SnapshotConfig {
    /// Checks the section on its own.
    pub(super) fn validate(&self) -> Result<()> {
        if !(1..=1_000_000).contains(&self.chunk_rows) {
            return Err(Error::definite("snapshot.chunk_rows must be between 1 and 1000000"));
        }
        if self.r#where.as_deref().is_some_and(|w| w.contains(';')) {
            return Err(Error::definite("snapshot.where must be one SQL condition (no `;`)"));
        }
        Ok(())
    }
}
