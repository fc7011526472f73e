//! The state store, one [`Store`] over two backends: the embedded redb file in the state directory
//! (`[state] backend = "local"`), or the compacted Kafka topic of [`super::kafka`] (`"kafka"`).
//!
//! Floor 4 (docs/ARCHITECTURE.md): imports floors 0-3.
//!
//! # Why redb (the local backend)
//! Each commit is one `fdatasync`, and a crash leaves either the old or the new record. sled was ruled out:
//! its flush issues `sync_file_range`, which does not make data durable.
//!
//! The database is opened in redb's single-writer mode: one connector writes, and `outbox-cdc status` may
//! read concurrently. A second connector on the same state directory cannot open it for writing.

use std::path::{Path, PathBuf};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use super::kafka::KafkaStore;
use super::records::hold_key;
pub use super::records::{AppliedSignal, Inspection, LastError, Paused, RequestState, SnapshotRequest, SIGNAL_BY};
use super::Checkpoint;
use crate::config::{Config, StateBackend};
use crate::error::{Error, Result};
use crate::kafka::commit::Deadline;
use crate::poison::{Hold, KnownPoison};

const CHECKPOINTS: TableDefinition<&str, &[u8]> = TableDefinition::new("checkpoints");
/// Quarantine holds: `aggregate_type \0 aggregate_id` → [`Hold`] as JSON.
const HOLDS: TableDefinition<&str, &[u8]> = TableDefinition::new("quarantine_holds");
/// Events the broker refused for good: event id → [`KnownPoison`] as JSON.
const KNOWN_POISON: TableDefinition<&str, &[u8]> = TableDefinition::new("known_poison");
/// Operational notes: `last_error` → [`LastError`], `paused` → [`Paused`], as JSON.
const NOTES: TableDefinition<&str, &[u8]> = TableDefinition::new("notes");
const LAST_ERROR_KEY: &str = "last_error";
const PAUSED_KEY: &str = "paused";
/// Notes' keys of snapshot requests: `snapshot/<id>` → [`SnapshotRequest`].
const SNAPSHOT_PREFIX: &str = "snapshot/";
/// Notes' keys of the signals carried out: `signal/<id>` → [`AppliedSignal`].
const SIGNAL_PREFIX: &str = "signal/";
/// Key of the stream checkpoint (other keys are reserved for snapshot progress and quarantine holds).
const STREAM_KEY: &str = "stream";
const FILE_NAME: &str = "outbox-cdc.redb";

/// Durable storage of the connector's state: the embedded redb file (`[state] backend = "local"`) or the
/// compacted Kafka topic of [`super::kafka`] (`"kafka"`). Everyone but the checkpointer reads and writes
/// through it alike.
#[derive(Debug)]
pub struct Store {
    backend: Backend,
}

#[derive(Debug)]
enum Backend {
    Local(Local),
    Kafka(Box<KafkaStore>),
}

/// The redb file.
struct Local {
    db: Database,
    path: PathBuf,
}

impl std::fmt::Debug for Local {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Local").field("path", &self.path).finish()
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
        create_private_dir(dir)?;
        let path = dir.join(FILE_NAME);
        create_private_file(&path)?;
        let db = Database::builder().set_concurrency_mode(redb::ConcurrencyMode::SingleWriter).create(&path).map_err(
            |e| match e {
                redb::DatabaseError::DatabaseAlreadyOpen => {
                    store_error(&path, "already open", "another outbox-cdc process uses this state directory")
                }
                other => store_error(&path, "cannot open", other),
            },
        )?;
        let tx = db.begin_write().map_err(|e| store_error(&path, "begin", e))?;
        for table in [CHECKPOINTS, HOLDS, KNOWN_POISON, NOTES] {
            tx.open_table(table).map_err(|e| store_error(&path, "open table", e))?;
        }
        tx.commit().map_err(|e| store_error(&path, "commit", e))?;
        Ok(Store { backend: Backend::Local(Local { db, path }) })
    }

    /// Opens the store `config` names, as its one writer: the local file, or the Kafka topic (which fences
    /// any older writer first, see [`super::kafka`]; its commits wait for their outcome until `deadline`).
    ///
    /// # Errors
    /// As [`Store::open`] and [`KafkaStore::open`].
    pub async fn open_for(config: &Config, deadline: &Deadline) -> Result<Store> {
        match config.state.backend {
            StateBackend::Local => Store::open(&config.state.dir),
            StateBackend::Kafka => {
                Ok(Store { backend: Backend::Kafka(Box::new(KafkaStore::open(config, deadline).await?)) })
            }
        }
    }

    /// Reads everything in the store `config` names without writing (`status`, `quarantine list`, `check`,
    /// `prune`); `None` when there is none yet.
    ///
    /// # Errors
    /// As [`Store::inspect`] and [`KafkaStore::inspect`].
    pub async fn inspect_for(config: &Config) -> Result<Option<Inspection>> {
        match config.state.backend {
            StateBackend::Local => Store::inspect(&config.state.dir),
            StateBackend::Kafka => KafkaStore::inspect(config).await,
        }
    }

    /// The Kafka backend, when this store is one (`exactly_once` writes its checkpoint itself).
    pub fn kafka(&self) -> Option<&KafkaStore> {
        match &self.backend {
            Backend::Kafka(k) => Some(k),
            Backend::Local(_) => None,
        }
    }

    /// Where the state lives, for messages.
    pub fn describe(&self) -> String {
        match &self.backend {
            Backend::Local(l) => l.path.display().to_string(),
            Backend::Kafka(k) => format!("Kafka topic {}", k.topic()),
        }
    }

    /// Reads the stream checkpoint without taking the writer role (for `status` while a connector runs).
    ///
    /// # Errors
    /// A definite error when the file exists but cannot be read.
    pub fn read_only(dir: &Path) -> Result<Option<Checkpoint>> {
        Ok(Store::inspect(dir)?.and_then(|i| i.checkpoint))
    }

    /// Reads everything without taking the writer role (`status`, `quarantine list` while a connector runs).
    /// `None` when there is no store yet.
    ///
    /// # Errors
    /// A definite error when the file exists but cannot be read.
    pub fn inspect(dir: &Path) -> Result<Option<Inspection>> {
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
                    return Store::open(copy.path())?.inspection().map(Some);
                }
            };
        let tx = db.begin_read().map_err(|e| store_error(&path, "begin read", e))?;
        Ok(Some(Inspection {
            checkpoint: read_one(&path, &tx, CHECKPOINTS, STREAM_KEY)?,
            holds: read_all(&path, &tx, HOLDS)?,
            last_error: read_one(&path, &tx, NOTES, LAST_ERROR_KEY)?,
            known_poison: read_all(&path, &tx, KNOWN_POISON)?,
            paused: read_one(&path, &tx, NOTES, PAUSED_KEY)?,
            snapshots: read_snapshots(&path, &tx)?,
            signals: read_notes(&path, &tx, SIGNAL_PREFIX)?,
        }))
    }

    /// Everything in this store, as [`Store::inspect`] reads a store it does not hold.
    ///
    /// # Errors
    /// A definite error when the store cannot be read or holds an unreadable record.
    pub fn inspection(&self) -> Result<Inspection> {
        Ok(Inspection {
            checkpoint: self.load()?,
            holds: self.holds()?,
            last_error: self.last_error()?,
            known_poison: self.known_poison()?,
            paused: self.paused()?,
            snapshots: self.snapshots()?,
            signals: self.applied_signals()?,
        })
    }

    /// The stored stream checkpoint, if any.
    ///
    /// # Errors
    /// A definite error when the store cannot be read or holds an unreadable record.
    pub fn load(&self) -> Result<Option<Checkpoint>> {
        match &self.backend {
            Backend::Local(l) => l.load(),
            Backend::Kafka(k) => Ok(k.load()),
        }
    }

    /// Durably replaces the stream checkpoint. Only the checkpointer saves.
    ///
    /// # Errors
    /// A definite error when the write fails (disk full, permissions): the previous record stays;
    /// transient when Kafka cannot take it.
    pub(super) fn save(&self, checkpoint: &Checkpoint) -> Result<()> {
        match &self.backend {
            Backend::Local(l) => l.save(checkpoint),
            Backend::Kafka(k) => k.save(checkpoint),
        }
    }

    /// Records a checkpoint that the event producer committed in its Kafka transaction (`exactly_once`).
    pub(super) fn committed(&self, checkpoint: &Checkpoint) {
        if let Backend::Kafka(k) = &self.backend {
            k.committed(checkpoint);
        }
    }

    /// [`Store::save`] for unit tests of the modules that read checkpoints.
    #[cfg(test)]
    pub(crate) fn save_for_test(&self, checkpoint: &Checkpoint) -> Result<()> {
        self.save(checkpoint)
    }

    /// Aggregates on hold.
    ///
    /// # Errors
    /// A definite error when the store cannot be read.
    pub fn holds(&self) -> Result<Vec<Hold>> {
        match &self.backend {
            Backend::Local(l) => l.holds(),
            Backend::Kafka(k) => Ok(k.holds()),
        }
    }

    /// Durably places a hold.
    ///
    /// # Errors
    /// A definite error when the write fails.
    pub fn put_hold(&self, hold: &Hold) -> Result<()> {
        match &self.backend {
            Backend::Local(l) => l.put_hold(hold),
            Backend::Kafka(k) => k.put_hold(hold),
        }
    }

    /// Durably removes a hold and forgets the known-poison ids it covered.
    ///
    /// # Errors
    /// A definite error when the write fails.
    pub fn remove_hold(&self, hold: &Hold, event_ids: &[String]) -> Result<()> {
        match &self.backend {
            Backend::Local(l) => l.remove_hold(hold, event_ids),
            Backend::Kafka(k) => k.remove_hold(hold, event_ids),
        }
    }

    /// Forgets known-poison events (`state copy` mirroring a source that no longer has them).
    ///
    /// # Errors
    /// A definite error when the write fails.
    pub fn forget_known_poison(&self, event_ids: &[String]) -> Result<()> {
        if event_ids.is_empty() {
            return Ok(());
        }
        match &self.backend {
            Backend::Local(l) => l.write(|tx| {
                let mut poison = tx.open_table(KNOWN_POISON)?;
                for id in event_ids {
                    poison.remove(id.as_str())?;
                }
                Ok(())
            }),
            Backend::Kafka(k) => k.forget_known_poison(event_ids),
        }
    }

    /// Events the broker refused for good.
    ///
    /// # Errors
    /// A definite error when the store cannot be read.
    pub fn known_poison(&self) -> Result<Vec<KnownPoison>> {
        match &self.backend {
            Backend::Local(l) => l.known_poison(),
            Backend::Kafka(k) => Ok(k.known_poison()),
        }
    }

    /// Durably remembers an event the broker refused for good.
    ///
    /// # Errors
    /// A definite error when the write fails.
    pub fn add_known_poison(&self, poison: &KnownPoison) -> Result<()> {
        match &self.backend {
            Backend::Local(l) => l.add_known_poison(poison),
            Backend::Kafka(k) => k.add_known_poison(poison),
        }
    }

    /// Records the error that stopped or restarted the pipeline (for `status`).
    ///
    /// # Errors
    /// A definite error when the write fails.
    pub fn set_last_error(&self, error: &crate::error::Error) -> Result<()> {
        let record = LastError {
            at_ms: crate::time::now_ms(),
            class: if error.is_definite() { "definite" } else { "transient" }.to_string(),
            message: error.to_string(),
        };
        match &self.backend {
            Backend::Local(l) => l.set_last_error(&record),
            Backend::Kafka(k) => k.set_last_error(&record),
        }
    }

    /// The last recorded error.
    ///
    /// # Errors
    /// A definite error when the store cannot be read.
    pub fn last_error(&self) -> Result<Option<LastError>> {
        match &self.backend {
            Backend::Local(l) => l.last_error(),
            Backend::Kafka(k) => Ok(k.last_error()),
        }
    }

    /// Records an operator's pause (`Some`) or its end (`None`), durably.
    ///
    /// # Errors
    /// A definite error when the write fails.
    pub fn set_paused(&self, paused: Option<&Paused>) -> Result<()> {
        match &self.backend {
            Backend::Local(l) => l.set_paused(paused),
            Backend::Kafka(k) => k.set_paused(paused),
        }
    }

    /// The operator's pause, if the connector is paused.
    ///
    /// # Errors
    /// A definite error when the store cannot be read.
    pub fn paused(&self) -> Result<Option<Paused>> {
        match &self.backend {
            Backend::Local(l) => l.paused(),
            Backend::Kafka(k) => Ok(k.paused()),
        }
    }

    /// Stores an operator's snapshot on demand as it now is (asked, paused, cancelled, ended), durably.
    ///
    /// # Errors
    /// A definite error when the write fails.
    pub fn put_snapshot(&self, request: &SnapshotRequest) -> Result<()> {
        match &self.backend {
            Backend::Local(l) => l.put_snapshot(request),
            Backend::Kafka(k) => k.put_snapshot(request),
        }
    }

    /// Records that signal `id` was carried out: read again after a restart, it is not carried out twice.
    ///
    /// # Errors
    /// A definite error when the write fails.
    pub fn put_applied_signal(&self, id: &str, applied: &AppliedSignal) -> Result<()> {
        match &self.backend {
            Backend::Local(l) => {
                let json = serde_json::to_vec(applied).expect("serializes");
                l.write(|tx| {
                    tx.open_table(NOTES)?.insert(format!("{SIGNAL_PREFIX}{id}").as_str(), json.as_slice())?;
                    Ok(())
                })
            }
            Backend::Kafka(k) => k.put_applied_signal(id, applied),
        }
    }

    /// Whether signal `id` was carried out.
    ///
    /// # Errors
    /// A definite error when the store cannot be read.
    pub fn applied_signal(&self, id: &str) -> Result<Option<AppliedSignal>> {
        match &self.backend {
            Backend::Local(l) => l.read(|path, tx| read_one(path, tx, NOTES, &format!("{SIGNAL_PREFIX}{id}"))),
            Backend::Kafka(k) => Ok(k.applied_signal(id)),
        }
    }

    /// Every signal carried out, by id.
    ///
    /// # Errors
    /// A definite error when the store cannot be read.
    pub fn applied_signals(&self) -> Result<Vec<(String, AppliedSignal)>> {
        match &self.backend {
            Backend::Local(l) => l.read(|path, tx| read_notes(path, tx, SIGNAL_PREFIX)),
            Backend::Kafka(k) => Ok(k.applied_signals()),
        }
    }

    /// Whether signal `id` was carried out: its note, or the pause it asked for. A pause by signal is one
    /// record (the pause names the signal), so a crash between it and its note cannot carry it out twice.
    ///
    /// # Errors
    /// A definite error when the store cannot be read.
    pub fn signal_carried_out(&self, id: &str) -> Result<bool> {
        Ok(self.applied_signal(id)?.is_some() || self.paused()?.is_some_and(|p| p.signal() == Some(id)))
    }

    /// Every snapshot on demand asked of this connector, in the order they were asked.
    ///
    /// # Errors
    /// A definite error when the store cannot be read.
    pub fn snapshots(&self) -> Result<Vec<SnapshotRequest>> {
        match &self.backend {
            Backend::Local(l) => l.read(read_snapshots),
            Backend::Kafka(k) => Ok(k.snapshots()),
        }
    }
}

impl Local {
    /// The stored stream checkpoint, if any.
    ///
    /// # Errors
    /// A definite error when the store cannot be read or holds an unreadable record.
    fn load(&self) -> Result<Option<Checkpoint>> {
        let tx = self.db.begin_read().map_err(|e| store_error(&self.path, "begin read", e))?;
        let table = tx.open_table(CHECKPOINTS).map_err(|e| store_error(&self.path, "open table", e))?;
        let value = table.get(STREAM_KEY).map_err(|e| store_error(&self.path, "read", e))?;
        value.map(|v| decode(&self.path, v.value())).transpose()
    }

    /// Durably replaces the stream checkpoint (one fsync'd transaction). Only the checkpointer saves.
    ///
    /// # Errors
    /// A definite error when the write fails (disk full, permissions): the previous record stays.
    fn save(&self, checkpoint: &Checkpoint) -> Result<()> {
        let json = serde_json::to_vec(checkpoint).expect("checkpoint serializes");
        let tx = self.db.begin_write().map_err(|e| store_error(&self.path, "begin write", e))?;
        {
            let mut table = tx.open_table(CHECKPOINTS).map_err(|e| store_error(&self.path, "open table", e))?;
            table.insert(STREAM_KEY, json.as_slice()).map_err(|e| store_error(&self.path, "write", e))?;
        }
        crate::failpoint!("checkpoint_write");
        tx.commit().map_err(|e| store_error(&self.path, "commit", e))
    }

    fn write(&self, f: impl FnOnce(&redb::WriteTransaction) -> Result<(), redb::Error>) -> Result<()> {
        let tx = self.db.begin_write().map_err(|e| store_error(&self.path, "begin write", e))?;
        f(&tx).map_err(|e| store_error(&self.path, "write", e))?;
        tx.commit().map_err(|e| store_error(&self.path, "commit", e))
    }

    fn read<T>(&self, f: impl FnOnce(&Path, &redb::ReadTransaction) -> Result<T>) -> Result<T> {
        let tx = self.db.begin_read().map_err(|e| store_error(&self.path, "begin read", e))?;
        f(&self.path, &tx)
    }

    /// Aggregates on hold.
    ///
    /// # Errors
    /// A definite error when the store cannot be read.
    fn holds(&self) -> Result<Vec<Hold>> {
        self.read(|path, tx| read_all(path, tx, HOLDS))
    }

    /// Durably places a hold.
    ///
    /// # Errors
    /// A definite error when the write fails.
    fn put_hold(&self, hold: &Hold) -> Result<()> {
        let json = serde_json::to_vec(hold).expect("serializes");
        self.write(|tx| {
            tx.open_table(HOLDS)?
                .insert(hold_key(&hold.aggregate_type, &hold.aggregate_id).as_str(), json.as_slice())?;
            Ok(())
        })
    }

    /// Durably removes a hold and forgets the known-poison ids it covered.
    ///
    /// # Errors
    /// A definite error when the write fails.
    fn remove_hold(&self, hold: &Hold, event_ids: &[String]) -> Result<()> {
        self.write(|tx| {
            tx.open_table(HOLDS)?.remove(hold_key(&hold.aggregate_type, &hold.aggregate_id).as_str())?;
            let mut poison = tx.open_table(KNOWN_POISON)?;
            for id in event_ids {
                poison.remove(id.as_str())?;
            }
            Ok(())
        })
    }

    /// Events the broker refused for good.
    ///
    /// # Errors
    /// A definite error when the store cannot be read.
    fn known_poison(&self) -> Result<Vec<KnownPoison>> {
        self.read(|path, tx| read_all(path, tx, KNOWN_POISON))
    }

    /// Durably remembers an event the broker refused for good.
    ///
    /// # Errors
    /// A definite error when the write fails.
    fn add_known_poison(&self, poison: &KnownPoison) -> Result<()> {
        let json = serde_json::to_vec(poison).expect("serializes");
        self.write(|tx| {
            tx.open_table(KNOWN_POISON)?.insert(poison.id.as_str(), json.as_slice())?;
            Ok(())
        })
    }

    /// Records the error that stopped or restarted the pipeline (for `status`).
    ///
    /// # Errors
    /// A definite error when the write fails.
    fn set_last_error(&self, record: &LastError) -> Result<()> {
        let json = serde_json::to_vec(record).expect("serializes");
        self.write(|tx| {
            tx.open_table(NOTES)?.insert(LAST_ERROR_KEY, json.as_slice())?;
            Ok(())
        })
    }

    /// The last recorded error.
    ///
    /// # Errors
    /// A definite error when the store cannot be read.
    fn last_error(&self) -> Result<Option<LastError>> {
        self.read(|path, tx| read_one(path, tx, NOTES, LAST_ERROR_KEY))
    }

    fn set_paused(&self, paused: Option<&Paused>) -> Result<()> {
        let json = paused.map(|p| serde_json::to_vec(p).expect("serializes"));
        self.write(|tx| {
            let mut notes = tx.open_table(NOTES)?;
            match &json {
                Some(json) => drop(notes.insert(PAUSED_KEY, json.as_slice())?),
                None => drop(notes.remove(PAUSED_KEY)?),
            }
            Ok(())
        })
    }

    fn put_snapshot(&self, request: &SnapshotRequest) -> Result<()> {
        let json = serde_json::to_vec(request).expect("serializes");
        self.write(|tx| {
            tx.open_table(NOTES)?.insert(format!("{SNAPSHOT_PREFIX}{}", request.id).as_str(), json.as_slice())?;
            Ok(())
        })
    }

    fn paused(&self) -> Result<Option<Paused>> {
        self.read(|path, tx| read_one(path, tx, NOTES, PAUSED_KEY))
    }
}

/// Creates `dir` (and missing parents) with mode 0700: the store is the connector's alone.
///
/// An existing directory keeps its mode, with a warning when others may read it. It is not tightened: the
/// operator may have opened it on purpose (a monitoring account in the group running `outbox-cdc status`),
/// or it is a volume whose mode the platform owns (Kubernetes' `fsGroup` makes it group-accessible, and a
/// process that does not own it cannot chmod it); a connector silently changing what it did not create
/// would surprise them more than it protects. Nothing secret is stored (see [`crate::secret`]).
pub(crate) fn create_private_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    match std::fs::metadata(dir) {
        Ok(meta) => {
            let mode = meta.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                tracing::warn!(
                    dir = %dir.display(),
                    mode = format_args!("{mode:o}"),
                    "the state directory is open to other users; `chmod 700` it unless that is intended"
                );
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| store_error(dir, "cannot create the directory", e)),
        Err(e) => Err(store_error(dir, "cannot read the directory", e)),
    }
}

/// Creates the store file with mode 0600 if it does not exist yet (redb would create it with the umask's
/// mode, usually 0644); redb initialises an empty file.
fn create_private_file(path: &Path) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(store_error(path, "cannot create", e)),
    }
}

fn decode<T: serde::de::DeserializeOwned>(path: &Path, bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| store_error(path, "unreadable record", e))
}

fn read_one<T: serde::de::DeserializeOwned>(
    path: &Path,
    tx: &redb::ReadTransaction,
    table: TableDefinition<&str, &[u8]>,
    key: &str,
) -> Result<Option<T>> {
    let table = match tx.open_table(table) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(store_error(path, "open table", e)),
    };
    let value = table.get(key).map_err(|e| store_error(path, "read", e))?;
    value.map(|v| decode(path, v.value())).transpose()
}

/// The snapshot requests among the notes (keys `snapshot/<id>`), in id order.
fn read_snapshots(path: &Path, tx: &redb::ReadTransaction) -> Result<Vec<SnapshotRequest>> {
    Ok(read_notes(path, tx, SNAPSHOT_PREFIX)?.into_iter().map(|(_, request)| request).collect())
}

/// The notes under `prefix` (`snapshot/`, `signal/`), by the rest of their key.
fn read_notes<T: serde::de::DeserializeOwned>(
    path: &Path,
    tx: &redb::ReadTransaction,
    prefix: &str,
) -> Result<Vec<(String, T)>> {
    let table = match tx.open_table(NOTES) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
        Err(e) => return Err(store_error(path, "open table", e)),
    };
    let mut out = Vec::new();
    // Every key of the prefix sorts before the prefix with its last byte raised ('/' + 1 = '0').
    let end = format!("{}0", prefix.trim_end_matches('/'));
    for entry in table.range(prefix..end.as_str()).map_err(|e| store_error(path, "read", e))? {
        let (key, value) = entry.map_err(|e| store_error(path, "read", e))?;
        out.push((key.value()[prefix.len()..].to_string(), decode(path, value.value())?));
    }
    Ok(out)
}

fn read_all<T: serde::de::DeserializeOwned>(
    path: &Path,
    tx: &redb::ReadTransaction,
    table: TableDefinition<&str, &[u8]>,
) -> Result<Vec<T>> {
    let table = match tx.open_table(table) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
        Err(e) => return Err(store_error(path, "open table", e)),
    };
    let mut out = Vec::new();
    for entry in table.iter().map_err(|e| store_error(path, "read", e))? {
        let (_, value) = entry.map_err(|e| store_error(path, "read", e))?;
        out.push(decode(path, value.value())?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::CHECKPOINT_VERSION;
    use crate::position::ServerIdentity;
    use crate::position::{BinlogCoord, Flavor, Gtids, Position};

    fn checkpoint(pos: u64) -> Checkpoint {
        Checkpoint {
            version: CHECKPOINT_VERSION,
            position: Position {
                gtids: Gtids::MariaDb("0-1-42".parse().unwrap()),
                coord: BinlogCoord { file: "bin.000002".into(), pos },
            },
            server: ServerIdentity { flavor: Flavor::MariaDb, server_id: 1, server_uuid: None, binlog_files: false },
            source_timestamp: Some(1_700_000_000),
            end_event: Some(crate::position::EndEvent { len: 31, crc32: 0x8d2f_11a0 }),
            written_at_ms: 1,
            snapshot: None,
            inside: None,
            on_demand: None,
            tables: Vec::new(),
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

    /// Guards against `state copy` leaving in the target a hold the source had released: its events would
    /// go to the dead-letter topic again and the next release would republish them a second time.
    #[test]
    fn a_copy_mirrors_the_source_holds_and_known_poison() {
        let hold = |id: &str| crate::poison::Hold {
            aggregate_type: "order".into(),
            aggregate_id: id.into(),
            hold_id: format!("h-{id}"),
            kind: crate::poison::PoisonKind::Undecodable,
            reason: "r".into(),
            origin: "o".into(),
            held_at_ms: 1,
            first_event: None,
            start: None,
        };
        let poison = |id: &str| KnownPoison { id: id.into(), message: "m".into() };
        let dir = tempfile::tempdir().unwrap();
        let target = Store::open(dir.path()).unwrap();
        target.put_hold(&hold("released")).unwrap();
        target.put_hold(&hold("kept")).unwrap();
        target.add_known_poison(&poison("e-released")).unwrap();
        let from = Inspection {
            checkpoint: Some(checkpoint(300)),
            holds: vec![hold("kept"), hold("new")],
            last_error: None,
            known_poison: vec![poison("e-new")],
            paused: None,
            snapshots: Vec::new(),
            signals: vec![("s-1".into(), AppliedSignal { at_ms: 1, kind: "pause".into(), outcome: "paused".into() })],
        };
        crate::checkpoint::copy_into(&from, &target).unwrap();
        assert_eq!(target.applied_signals().unwrap(), from.signals, "the signals carried out go with the state");
        assert!(target.signal_carried_out("s-1").unwrap());
        let mut held: Vec<String> = target.holds().unwrap().into_iter().map(|h| h.aggregate_id).collect();
        held.sort();
        assert_eq!(held, ["kept", "new"]);
        let known: Vec<String> = target.known_poison().unwrap().into_iter().map(|p| p.id).collect();
        assert_eq!(known, ["e-new"]);
        assert_eq!(target.load().unwrap(), Some(checkpoint(300)));
    }

    #[test]
    fn second_writer_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let _first = Store::open(dir.path()).unwrap();
        let err = Store::open(dir.path()).unwrap_err();
        assert!(err.is_definite());
    }

    /// The state directory (and parents it creates) and the store file are the owner's only; an existing
    /// directory keeps the mode it has.
    #[test]
    fn state_directory_is_created_private() {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let root = tempfile::tempdir().unwrap();
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let dir = root.path().join("parent").join("state");
        drop(Store::open(&dir).unwrap());
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&root.path().join("parent")), 0o700);
        assert_eq!(mode(&dir.join(FILE_NAME)), 0o600);
        assert_eq!(mode(root.path()), 0o755);

        let open = root.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        drop(Store::open(&open).unwrap());
        assert_eq!(mode(&open), 0o755, "an existing directory is warned about, not changed");
        assert_eq!(mode(&open.join(FILE_NAME)), 0o600);
    }

    /// Regression: an rdkafka configuration error with a misspelled secret key was stored as `last_error`
    /// with the password in it, and `outbox-cdc status` printed it.
    #[test]
    fn stored_last_error_never_holds_a_secret_value() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let error = crate::error::Error::definite("Client config error: \"sasl.pasword\" = \"hunter2\"")
            .context("starting; password=hunter3");
        store.set_last_error(&error).unwrap();
        let stored = store.last_error().unwrap().unwrap().message;
        assert!(!stored.contains("hunter"), "{stored}");
        assert!(stored.contains("sasl.pasword"), "{stored}");
    }

    #[test]
    fn record_is_human_readable_json() {
        let json = serde_json::to_string(&checkpoint(5)).unwrap();
        assert!(json.contains("\"0-1-42\""), "{json}");
        assert!(json.contains("bin.000002"), "{json}");
    }
}
