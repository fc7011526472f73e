//! The embedded checkpoint store: one redb file in the state directory.
//!
//! # Why redb
//! Each commit is one `fdatasync`, and a crash leaves either the old or the new record. sled was ruled out:
//! its flush issues `sync_file_range`, which does not make data durable.
//!
//! The database is opened in redb's single-writer mode: one connector writes, and `outbox-cdc status` may
//! read concurrently. A second connector on the same state directory cannot open it for writing.

use std::path::{Path, PathBuf};

use redb::{Database, ReadableDatabase, TableDefinition};

use super::Checkpoint;
use crate::error::{Error, Result};

const CHECKPOINTS: TableDefinition<&str, &[u8]> = TableDefinition::new("checkpoints");
/// Key of the stream checkpoint (other keys are reserved for snapshot progress and quarantine holds).
const STREAM_KEY: &str = "stream";
const FILE_NAME: &str = "outbox-cdc.redb";

/// Durable checkpoint storage.
pub struct Store {
    db: Database,
    path: PathBuf,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish()
    }
}

fn store_error(path: &Path, what: &str, err: impl std::fmt::Display) -> Error {
    Error::definite(format!(
        "checkpoint store {}: {what}: {err}. The connector stops without advancing anything; fix the state \
         directory (space, permissions) and restart",
        path.display()
    ))
}

impl Store {
    /// Opens (creating if needed) the store in `dir`.
    ///
    /// # Errors
    /// A definite error when the directory cannot be created or the database is locked by another
    /// connector or corrupt.
    pub fn open(dir: &Path) -> Result<Store> {
        std::fs::create_dir_all(dir).map_err(|e| store_error(dir, "cannot create the directory", e))?;
        let path = dir.join(FILE_NAME);
        let db = Database::builder().set_concurrency_mode(redb::ConcurrencyMode::SingleWriter).create(&path).map_err(
            |e| match e {
                redb::DatabaseError::DatabaseAlreadyOpen => {
                    store_error(&path, "already open", "another outbox-cdc process uses this state directory")
                }
                other => store_error(&path, "cannot open", other),
            },
        )?;
        let tx = db.begin_write().map_err(|e| store_error(&path, "begin", e))?;
        tx.open_table(CHECKPOINTS).map_err(|e| store_error(&path, "open table", e))?;
        tx.commit().map_err(|e| store_error(&path, "commit", e))?;
        Ok(Store { db, path })
    }

    /// Reads the stream checkpoint without taking the writer role (for `status` while a connector runs).
    ///
    /// # Errors
    /// A definite error when the file exists but cannot be read.
    pub fn read_only(dir: &Path) -> Result<Option<Checkpoint>> {
        let path = dir.join(FILE_NAME);
        if !path.exists() {
            return Ok(None);
        }
        let db =
            match Database::builder().set_concurrency_mode(redb::ConcurrencyMode::SingleWriter).open_read_only(&path) {
                Ok(db) => db,
                // After a crash the file needs redb's repair, which only a writer can do. Repair a private
                // copy instead: the state file stays untouched and unlocked for the next `run`.
                Err(read_only_error) => {
                    let copy = tempfile::tempdir()
                        .map_err(|e| store_error(&path, "cannot create a temporary directory", e))?;
                    std::fs::copy(&path, copy.path().join(FILE_NAME))
                        .map_err(|_| store_error(&path, "cannot open read-only", read_only_error))?;
                    return Store::open(copy.path())?.load();
                }
            };
        let tx = db.begin_read().map_err(|e| store_error(&path, "begin read", e))?;
        let table = match tx.open_table(CHECKPOINTS) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(store_error(&path, "open table", e)),
        };
        let value = table.get(STREAM_KEY).map_err(|e| store_error(&path, "read", e))?;
        value.map(|v| decode(&path, v.value())).transpose()
    }

    /// The stored stream checkpoint, if any.
    ///
    /// # Errors
    /// A definite error when the store cannot be read or holds an unreadable record.
    pub fn load(&self) -> Result<Option<Checkpoint>> {
        let tx = self.db.begin_read().map_err(|e| store_error(&self.path, "begin read", e))?;
        let table = tx.open_table(CHECKPOINTS).map_err(|e| store_error(&self.path, "open table", e))?;
        let value = table.get(STREAM_KEY).map_err(|e| store_error(&self.path, "read", e))?;
        value.map(|v| decode(&self.path, v.value())).transpose()
    }

    /// Durably replaces the stream checkpoint (one fsync'd transaction).
    ///
    /// # Errors
    /// A definite error when the write fails (disk full, permissions): the previous record stays.
    pub fn save(&self, checkpoint: &Checkpoint) -> Result<()> {
        let json = serde_json::to_vec(checkpoint).expect("checkpoint serializes");
        let tx = self.db.begin_write().map_err(|e| store_error(&self.path, "begin write", e))?;
        {
            let mut table = tx.open_table(CHECKPOINTS).map_err(|e| store_error(&self.path, "open table", e))?;
            table.insert(STREAM_KEY, json.as_slice()).map_err(|e| store_error(&self.path, "write", e))?;
        }
        tx.commit().map_err(|e| store_error(&self.path, "commit", e))
    }
}

fn decode(path: &Path, bytes: &[u8]) -> Result<Checkpoint> {
    serde_json::from_slice(bytes).map_err(|e| store_error(path, "unreadable checkpoint record", e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::CHECKPOINT_VERSION;
    use crate::position::{BinlogCoord, Flavor, Gtids, Position};
    use crate::source::ServerIdentity;

    fn checkpoint(pos: u64) -> Checkpoint {
        Checkpoint {
            version: CHECKPOINT_VERSION,
            position: Position {
                gtids: Gtids::MariaDb("0-1-42".parse().unwrap()),
                coord: BinlogCoord { file: "bin.000002".into(), pos },
            },
            server: ServerIdentity { flavor: Flavor::MariaDb, server_id: 1, server_uuid: None, binlog_files: false },
            source_timestamp: Some(1_700_000_000),
            written_at_ms: 1,
            snapshot: None,
        }
    }

    #[test]
    fn save_load_roundtrip_and_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            assert_eq!(store.load().unwrap(), None);
            store.save(&checkpoint(100)).unwrap();
            store.save(&checkpoint(200)).unwrap();
            assert_eq!(store.load().unwrap(), Some(checkpoint(200)));
            // A reader can look while the writer holds the store.
            assert_eq!(Store::read_only(dir.path()).unwrap(), Some(checkpoint(200)));
        }
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.load().unwrap(), Some(checkpoint(200)));
    }

    #[test]
    fn second_writer_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let _first = Store::open(dir.path()).unwrap();
        let err = Store::open(dir.path()).unwrap_err();
        assert!(err.is_definite());
    }

    #[test]
    fn record_is_human_readable_json() {
        let json = serde_json::to_string(&checkpoint(5)).unwrap();
        assert!(json.contains("\"0-1-42\""), "{json}");
        assert!(json.contains("bin.000002"), "{json}");
    }
}
