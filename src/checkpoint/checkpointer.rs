//! Turns the acknowledged watermark into stored checkpoints, off the pipeline's task.
//!
//! Floor 4 (docs/ARCHITECTURE.md): imports floors 0-3.
//!
//! A checkpoint write is an fsync'd redb commit, milliseconds to tens of milliseconds on a busy disk. The
//! periodic writes run on tokio's blocking pool ([`Checkpointer::every`]), so the reader and the producer
//! never stall on the disk, and a run that waits for Kafka budget still checkpoints what was acknowledged.
//!
//! # Invariants
//! - Writes are serialised by a lock held from reading the watermark to the end of the commit: as the
//!   watermark only moves forward, a stored checkpoint never goes backwards, whichever write comes last.
//! - Only a position the watermark reached (everything before it acknowledged) or an explicit start point
//!   ([`Checkpointer::save_now`]) is ever written.
//! - Within a run, a write never moves the position backwards from the last one written or declared
//!   ([`Checkpointer::already_saved`]): it must hold every transaction the previous one held
//!   ([`Position::holds_all_of`](crate::position::Position::holds_all_of)). A write that would is refused as a definite error and nothing is stored.
//!   The check is per run, from the point the run declared: a run that re-snapshots after an unresumable
//!   checkpoint (`snapshot.mode = "when_needed"`, e.g. after `RESET MASTER`) starts a new line of positions.
//!
//! The checkpointer is the only code that constructs a [`Checkpoint`] and the only caller of
//! [`Store::save`]; both are sealed to this module.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::FutureExt;
use tokio::task::JoinHandle;

use super::{Checkpoint, Mark, Store, Watermark, CHECKPOINT_VERSION};
use crate::error::{Error, Result};
use crate::metrics::metrics;
use crate::position::ServerIdentity;
use crate::time::now_ms;

/// Writes checkpoints of one run; shared by the run and its periodic writer.
pub(crate) struct Checkpointer {
    store: Arc<Store>,
    server: ServerIdentity,
    /// The outbox tables this run publishes, written into every record.
    tables: Vec<String>,
    /// The last mark written. Held while writing.
    saved: Mutex<Option<Mark>>,
    /// `exactly_once`: the watermark is never written; each checkpoint goes into the Kafka transaction
    /// of the events it covers ([`Checkpointer::record`], then [`Checkpointer::committed`]).
    in_transactions: std::sync::atomic::AtomicBool,
}

impl Checkpointer {
    pub(crate) fn new(store: Arc<Store>, server: ServerIdentity, tables: Vec<String>) -> Arc<Self> {
        Arc::new(Checkpointer {
            store,
            server,
            tables,
            saved: Mutex::new(None),
            in_transactions: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// From now on the watermark is not written ([`Checkpointer::flush`] does nothing): acknowledged is not
    /// committed in a Kafka transaction, and a checkpoint past uncommitted events would skip them after a
    /// crash. The run writes each checkpoint into its transaction instead.
    pub(crate) fn write_in_transactions(&self) {
        self.in_transactions.store(true, std::sync::atomic::Ordering::Release);
    }

    /// The checkpoint record for `mark`, to be written into the Kafka transaction that holds every event
    /// before it (`exactly_once`). Nothing is stored until [`Checkpointer::committed`].
    ///
    /// # Errors
    /// A definite error when `mark` is behind the last checkpoint (see the module's invariants).
    pub(crate) fn record(&self, mark: &Mark) -> Result<Checkpoint> {
        let saved = self.lock();
        self.check_forward(saved.as_ref(), mark)?;
        Ok(self.checkpoint_of(mark))
    }

    /// The Kafka transaction holding `checkpoint`, [`Checkpointer::record`]'s record for `mark`, committed.
    pub(crate) fn committed(&self, mark: Mark, checkpoint: &Checkpoint) {
        let mut saved = self.lock();
        self.store.committed(checkpoint);
        match &mark.inside {
            Some(inside) => tracing::debug!(position = %mark.position, %inside, "checkpoint committed with its events"),
            None => tracing::debug!(position = %mark.position, "checkpoint committed with its events"),
        }
        metrics().checkpoint_written(mark.timestamp);
        *saved = Some(mark);
    }

    /// The store it writes to.
    pub(crate) fn store(&self) -> &Arc<Store> {
        &self.store
    }

    fn lock(&self) -> MutexGuard<'_, Option<Mark>> {
        // A panic mid-write leaves `saved` at a mark that was or was not written; either only costs a
        // redundant write later.
        self.saved.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The last mark written (or declared durable with [`Checkpointer::already_saved`]).
    pub(crate) fn saved(&self) -> Option<Mark> {
        self.lock().clone()
    }

    /// Declares `mark` durable without writing it (the run resumes from the stored checkpoint).
    pub(crate) fn already_saved(&self, mark: Mark) {
        *self.lock() = Some(mark);
    }

    /// Writes the watermark if it moved since the last write.
    pub(crate) fn flush(&self, watermark: &Watermark) -> Result<()> {
        if self.in_transactions.load(std::sync::atomic::Ordering::Acquire) {
            return Ok(());
        }
        let mut saved = self.lock();
        let Some(mark) = watermark.mark() else {
            return Ok(());
        };
        if saved.as_ref() == Some(&mark) {
            return Ok(());
        }
        crate::failpoint!("ack_before_checkpoint");
        self.write(&mut saved, mark)
    }

    /// Writes `mark` at once, whatever the watermark says (start points that must be durable first).
    pub(crate) fn save_now(&self, mark: Mark) -> Result<()> {
        let mut saved = self.lock();
        self.write(&mut saved, mark)
    }

    fn check_forward(&self, saved: Option<&Mark>, mark: &Mark) -> Result<()> {
        match saved.filter(|previous| !is_forward(previous, mark)) {
            Some(previous) => Err(Error::definite(format!(
                "refusing to move the checkpoint backwards, from {}{} to {}{}: this is a bug in outbox-cdc, \
                 please report it with the log; the stored checkpoint stays where it was",
                previous.position,
                inside_text(previous),
                mark.position,
                inside_text(mark)
            ))),
            None => Ok(()),
        }
    }

    fn checkpoint_of(&self, mark: &Mark) -> Checkpoint {
        Checkpoint {
            version: CHECKPOINT_VERSION,
            position: mark.position.clone(),
            server: self.server.clone(),
            source_timestamp: mark.timestamp,
            end_event: mark.end_event,
            written_at_ms: now_ms(),
            snapshot: mark.snapshot.as_deref().cloned(),
            inside: mark.inside.clone(),
            on_demand: mark.on_demand.as_deref().cloned(),
            tables: self.tables.clone(),
        }
    }

    fn write(&self, saved: &mut Option<Mark>, mark: Mark) -> Result<()> {
        self.check_forward(saved.as_ref(), &mark)?;
        self.store.save(&self.checkpoint_of(&mark))?;
        tracing::debug!(position = %mark.position, "checkpoint written");
        metrics().checkpoint_written(mark.timestamp);
        *saved = Some(mark);
        Ok(())
    }

    /// Flushes `watermark` every `interval` on the blocking pool until the returned handle is dropped.
    pub(crate) fn every(self: &Arc<Self>, watermark: Arc<Watermark>, interval: Duration) -> Periodic {
        let task = tokio::spawn(flush_every(self.clone(), watermark, interval));
        Periodic { task: Some(task) }
    }
}

/// Whether `mark` holds everything `previous` held: every transaction, and inside the same position no fewer
/// rows of the same partly published transaction (a mark at the position with nothing inside it holds none).
fn is_forward(previous: &Mark, mark: &Mark) -> bool {
    if !mark.position.holds_all_of(&previous.position) {
        return false;
    }
    match (&previous.inside, &mark.inside) {
        (Some(before), Some(now)) if previous.position == mark.position && before.is_same_tx(now) => {
            now.rows >= before.rows
        }
        (Some(_), None) => previous.position != mark.position,
        _ => true,
    }
}

/// ` and the first N outbox rows of …` for a mark inside a transaction, nothing otherwise.
fn inside_text(mark: &Mark) -> String {
    mark.inside.as_ref().map(|inside| format!(" and {inside}")).unwrap_or_default()
}

/// How often the periodic writer looks for the run's first acknowledged transaction, which it writes at once.
const FIRST_CHECK: Duration = Duration::from_millis(20);

/// Returns only when a write failed.
///
/// The first acknowledged transaction after a start is written as soon as it is acknowledged, not an
/// interval later: a connector that dies within an interval of every start (OOM-killed, a liveness probe
/// too tight) would otherwise never move its checkpoint, and every restart would publish everything
/// since the last one again. Each start so makes progress.
async fn flush_every(checkpointer: Arc<Checkpointer>, watermark: Arc<Watermark>, interval: Duration) -> Result<()> {
    let flush = |checkpointer: &Arc<Checkpointer>, watermark: &Arc<Watermark>| {
        let (checkpointer, watermark) = (checkpointer.clone(), watermark.clone());
        async move {
            tokio::task::spawn_blocking(move || checkpointer.flush(&watermark))
                .await
                .map_err(|e| Error::transient(format!("the checkpoint writer failed: {e}")))?
        }
    };
    let mut first = tokio::time::interval(FIRST_CHECK.min(interval));
    loop {
        first.tick().await;
        let (mark, saved) = (watermark.mark(), checkpointer.saved());
        if mark.is_some() && saved.is_some() && mark != saved {
            flush(&checkpointer, &watermark).await?;
            break;
        }
    }
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await; // the first tick is immediate
    loop {
        tick.tick().await;
        flush(&checkpointer, &watermark).await?;
    }
}

/// The periodic checkpoint writer of a run; stops when dropped (a write in progress completes).
pub(crate) struct Periodic {
    task: Option<JoinHandle<Result<()>>>,
}

impl Periodic {
    /// The error that stopped the writer, once (a failed write ends the run: restarting from the last
    /// stored checkpoint is safe, running on with checkpoints silently stale is not).
    pub(crate) fn failure(&mut self) -> Option<Error> {
        if !self.task.as_ref()?.is_finished() {
            return None;
        }
        let result = self.task.take()?.now_or_never()?;
        match result {
            Ok(Ok(())) => None,
            Ok(Err(error)) => Some(error),
            Err(join) => Some(Error::transient(format!("the checkpoint writer failed: {join}"))),
        }
    }
}

impl Drop for Periodic {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::position::{BinlogCoord, Flavor, Gtids, Position, TxProgress};

    fn mark(gtids: &str, pos: u64) -> Mark {
        Mark::boundary(
            Position {
                gtids: Gtids::MariaDb(gtids.parse().unwrap()),
                coord: BinlogCoord { file: "b.000001".into(), pos },
            },
            None,
        )
    }

    fn server() -> ServerIdentity {
        ServerIdentity { flavor: Flavor::MariaDb, server_id: 1, server_uuid: None, binlog_files: false }
    }

    /// Guards the sealed checkpoint's promise: within a run a save never moves the stored position
    /// backwards, whatever a caller hands it; the refused write stores nothing.
    #[test]
    fn a_save_only_moves_forward_within_a_run() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path()).unwrap());
        let checkpointer = Checkpointer::new(store.clone(), server(), Vec::new());
        checkpointer.save_now(mark("0-1-10", 900)).unwrap();
        checkpointer.save_now(mark("0-1-10", 900)).expect("the same position again is not backwards");
        let err = checkpointer.save_now(mark("0-1-9", 800)).unwrap_err();
        assert!(err.is_definite() && err.to_string().contains("backwards"), "{err}");
        assert_eq!(store.load().unwrap().unwrap().position(), &mark("0-1-10", 900).position);
        let err = checkpointer.save_now(mark("1-1-1", 950)).unwrap_err();
        assert!(err.to_string().contains("backwards"), "another domain without this one's: {err}");
        checkpointer.save_now(mark("0-1-11,1-1-1", 1000)).unwrap();

        // A run declares where it resumes; its writes move forward from there.
        let next_run = Checkpointer::new(store.clone(), server(), Vec::new());
        next_run.already_saved(mark("0-1-20", 2000));
        assert!(next_run.save_now(mark("0-1-19", 1900)).is_err());
        // A new run that declares nothing (a new snapshot after an unresumable checkpoint) starts anew.
        let fresh = Checkpointer::new(store.clone(), server(), Vec::new());
        fresh.save_now(mark("0-1-2", 300)).unwrap();
        assert_eq!(store.load().unwrap().unwrap().position(), &mark("0-1-2", 300).position);
    }

    /// Inside one position, a mark counts the rows of the transaction after it: more rows of the same one are
    /// forward, fewer or none at all are backwards, and the transaction's end is forward of any of them. The
    /// count is stored with the position and comes back as the resume point's.
    #[test]
    fn rows_inside_a_transaction_only_grow() {
        let inside = |rows| {
            let progress = TxProgress { gtid: Some("0-1-11".into()), file: "b.000001".into(), pos: 950, rows };
            Mark { inside: Some(progress), ..mark("0-1-10", 900) }
        };
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path()).unwrap());
        let checkpointer = Checkpointer::new(store.clone(), server(), Vec::new());
        checkpointer.save_now(mark("0-1-10", 900)).unwrap();
        checkpointer.save_now(inside(500)).unwrap();
        checkpointer.save_now(inside(500)).expect("the same count again is not backwards");
        let err = checkpointer.save_now(inside(499)).unwrap_err();
        assert!(err.to_string().contains("the first 500 outbox rows of gtid 0-1-11"), "{err}");
        assert!(checkpointer.save_now(mark("0-1-10", 900)).is_err(), "the position without its rows");
        assert_eq!(store.load().unwrap().unwrap().into_mark(), inside(500));
        checkpointer.save_now(inside(1000)).unwrap();
        checkpointer.save_now(mark("0-1-11", 2000)).expect("the transaction's end");
        assert_eq!(store.load().unwrap().unwrap().inside(), None);
    }
}
