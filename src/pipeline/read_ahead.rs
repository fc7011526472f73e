//! Reading ahead: the source reader and decoder run on a task of their own and hand changes to the
//! pipeline in batches, so that decoding one transaction overlaps with routing and producing the previous
//! ones (two stages on two cores instead of one chain on one).
//!
//! Floor 5 (docs/ARCHITECTURE.md): imports floors 0-4.
//!
//! ```text
//!  reader task: SourceReader::next ─► batch (≤ BATCH_CHANGES, ≤ BATCH_BYTES) ─► acquire budget ─► channel
//!  pipeline:    ReadAhead::next ◄─ one change at a time ◄─ channel;  budget released once a batch is used up
//! ```
//!
//! # Invariants
//! - Order: changes come out exactly in the order the reader yielded them.
//! - Memory: the batches sent and not yet used up hold at most `budget_bytes` (a single larger batch may
//!   still pass alone), plus the one batch the reader is filling. Back-pressure from Kafka stops the
//!   pipeline, the budget runs out, and the reader stops reading the socket.
//! - Failure: a reader error is delivered after every change read before it, then the reader stops.
//!   Dropping the [`ReadAhead`] stops the reader task (and closes its connection).
//!
//! # Why rows go back to the reader
//! A row's strings are allocated by the reader's thread. Freed on the pipeline's thread, every one of them
//! is a cross-thread free, which the allocator settles later on the allocating thread: in a catch-up
//! profile that bookkeeping, and growing a fresh batch vector per batch, cost the reader a tenth of its
//! time. So the pipeline hands each row it is done with back ([`ReadAhead::recycle`]) into the free end of
//! the batch's ring buffer, and a used-up batch returns to the reader task, which drops the rows and reuses
//! the buffer. Spent rows are dropped before the reader reads on, so besides the budget at most the
//! batches used up since the reader last looked are alive.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;

use futures_util::FutureExt;
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinHandle;

use crate::error::{Error, Result};
use crate::source::binlog::Change;
use crate::source::SourceReader;

/// A batch closes at this many changes...
const BATCH_CHANGES: usize = 1024;
/// ...or at this many bytes.
const BATCH_BYTES: usize = 256 * 1024;
/// Bytes counted for a change besides its strings (the enum, positions, allocation headers).
const CHANGE_OVERHEAD_BYTES: usize = 192;
/// Used-up batch buffers the reader keeps for reuse; more are freed.
const POOLED_BATCHES: usize = 4;

/// Where changes come from: the source reader (or a script, in tests).
pub(super) trait Changes: Send + 'static {
    /// The next change; `None` when the source is exhausted. Must be cancel-safe.
    fn next(&mut self) -> impl Future<Output = Result<Option<Change>>> + Send;
}

impl Changes for SourceReader {
    fn next(&mut self) -> impl Future<Output = Result<Option<Change>>> + Send {
        SourceReader::next(self)
    }
}

/// What the reader task sends.
enum Item {
    Batch {
        changes: VecDeque<Change>,
        permits: u32,
    },
    /// The source is exhausted (binlog files only).
    End,
    Failed(Error),
}

/// The pipeline's end of the reader task.
pub(super) struct ReadAhead {
    rx: mpsc::Receiver<Item>,
    budget: Arc<Semaphore>,
    /// The batch being used: its first `unread` changes are still to come, then the recycled ones.
    current: VecDeque<Change>,
    unread: usize,
    /// Permits of the batch in `current`, released when it is used up.
    held: u32,
    /// Used-up batches back to the reader task.
    spent: mpsc::UnboundedSender<VecDeque<Change>>,
    task: JoinHandle<()>,
}

impl ReadAhead {
    /// Starts reading `reader` on a task of its own, at most `budget_bytes` ahead of the pipeline.
    pub(super) fn spawn(reader: impl Changes, budget_bytes: usize) -> Self {
        let budget_bytes = budget_bytes.clamp(BATCH_BYTES, u32::MAX as usize);
        let budget = Arc::new(Semaphore::new(budget_bytes));
        // The budget bounds the bytes; the channel only needs room for as many batches as can fit.
        let (tx, rx) = mpsc::channel(budget_bytes / (BATCH_BYTES / 4) + 1);
        // Unbounded, yet bounded by construction: only batches that went through `tx` come back.
        let (spent, spent_rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(read(reader, tx, spent_rx, budget.clone(), budget_bytes));
        ReadAhead { rx, budget, current: VecDeque::new(), unread: 0, held: 0, spent, task }
    }

    /// Hands back a change the pipeline is done with, to be dropped by the reader task.
    pub(super) fn recycle(&mut self, change: Change) {
        // NOTE: a change taken from `current` left a free slot, so this never grows the buffer.
        if self.current.len() < self.current.capacity() {
            self.current.push_back(change);
        }
    }

    /// The next change; `None` when the source is exhausted. Cancel-safe.
    ///
    /// # Errors
    /// The reader's error, after every change read before it.
    pub(super) async fn next(&mut self) -> Result<Option<Change>> {
        loop {
            if self.unread > 0 {
                self.unread -= 1;
                return Ok(self.current.pop_front());
            }
            self.budget.add_permits(std::mem::take(&mut self.held) as usize);
            if self.current.capacity() > 0 {
                // The reader may be gone (it stopped after its last item): the batch is then dropped here.
                let _ = self.spent.send(std::mem::take(&mut self.current));
            }
            match self.rx.recv().await {
                Some(Item::Batch { changes, permits }) => {
                    self.unread = changes.len();
                    self.current = changes;
                    self.held = permits;
                }
                Some(Item::End) => return Ok(None),
                Some(Item::Failed(error)) => return Err(error),
                None => return Err(Error::transient("the binlog reader task stopped unexpectedly")),
            }
        }
    }
}

impl Drop for ReadAhead {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The reader task: batches what is ready, waits only when nothing is.
async fn read(
    mut reader: impl Changes,
    tx: mpsc::Sender<Item>,
    mut spent: mpsc::UnboundedReceiver<VecDeque<Change>>,
    budget: Arc<Semaphore>,
    budget_bytes: usize,
) {
    let mut pool = Vec::with_capacity(POOLED_BATCHES);
    loop {
        while let Ok(batch) = spent.try_recv() {
            collect(batch, &mut pool);
        }
        let mut changes = pool.pop().unwrap_or_default();
        let mut bytes = 0;
        // Wait for the first change, then take only what is ready without waiting: a quiet source sends
        // each transaction at once, a busy one sends full batches. Batches used up meanwhile are dropped
        // while waiting, so a quiet source does not keep them.
        let mut next = loop {
            tokio::select! {
                biased;
                Some(batch) = spent.recv() => collect(batch, &mut pool),
                next = reader.next() => break next,
            }
        };
        let last = loop {
            match next {
                Ok(Some(change)) => {
                    bytes += size_of_change(&change);
                    changes.push_back(change);
                }
                Ok(None) => break Some(Item::End),
                Err(error) => break Some(Item::Failed(error)),
            }
            if changes.len() >= BATCH_CHANGES || bytes >= BATCH_BYTES {
                break None;
            }
            match reader.next().now_or_never() {
                Some(result) => next = result,
                None => break None,
            }
        };
        if !changes.is_empty() {
            let permits = bytes.clamp(1, budget_bytes) as u32;
            let Ok(acquired) = budget.acquire_many(permits).await else { return };
            acquired.forget();
            if tx.send(Item::Batch { changes, permits }).await.is_err() {
                return;
            }
        }
        if let Some(item) = last {
            let _ = tx.send(item).await;
            return;
        }
    }
}

/// Drops a used-up batch's changes here, on the thread that allocated them, and keeps its buffer.
fn collect(mut batch: VecDeque<Change>, pool: &mut Vec<VecDeque<Change>>) {
    batch.clear();
    if pool.len() < POOLED_BATCHES {
        pool.push(batch);
    }
}

/// Bytes an additional column's value holds.
fn column_value_size(value: &crate::outbox::ColumnValue) -> usize {
    use crate::outbox::ColumnValue as V;
    std::mem::size_of::<V>()
        + match value {
            V::Text(text) | V::Json(text) => text.len(),
            V::Null | V::Integer(_) => 0,
        }
}

/// Bytes a change holds, for the read-ahead budget.
fn size_of_change(change: &Change) -> usize {
    CHANGE_OVERHEAD_BYTES
        + match change {
            Change::Row(row) => {
                row.id.len()
                    + row.aggregate_type.len()
                    + row.aggregate_id.len()
                    + row.event_type.as_ref().map_or(0, String::len)
                    + row.payload.len()
                    + row.headers.as_ref().map_or(0, String::len)
                    + row.occurred_at.as_ref().map_or(0, String::len)
                    + row.additional.iter().map(column_value_size).sum::<usize>()
            }
            Change::Undecodable(bad) => bad.message.len() + serde_json::to_vec(&bad.image).map_or(0, |json| json.len()),
            Change::Signal(signal) => signal.id.len() + signal.kind.len() + signal.data.as_ref().map_or(0, String::len),
            Change::Begin(start) => start.coord.file.len(),
            Change::Commit { .. } => 0,
        }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::position::TxStart;
    use crate::position::{BinlogCoord, Gtids, Position};

    /// Changes, then the end or an error; counts how many were taken.
    struct Script {
        items: VecDeque<Result<Change>>,
        taken: Arc<AtomicUsize>,
    }

    impl Changes for Script {
        async fn next(&mut self) -> Result<Option<Change>> {
            self.taken.fetch_add(1, Ordering::SeqCst);
            self.items.pop_front().transpose()
        }
    }

    fn script(changes: &[Change], error: Option<Error>) -> (Script, Arc<AtomicUsize>) {
        let taken = Arc::new(AtomicUsize::new(0));
        let items = changes.iter().cloned().map(Ok).chain(error.map(Err)).collect();
        (Script { items, taken: taken.clone() }, taken)
    }

    fn begin(pos: u64) -> Change {
        Change::Begin(TxStart { gtid: None, coord: BinlogCoord { file: "bin.000001".into(), pos } })
    }

    fn commit(pos: u64) -> Change {
        let coord = BinlogCoord { file: "bin.000001".into(), pos };
        Change::Commit { position: Position { gtids: Gtids::None, coord }, timestamp: 0, end_event: None }
    }

    fn row(n: usize, payload_bytes: usize) -> Change {
        Change::Row(crate::outbox::OutboxRow {
            table: Arc::new(crate::outbox::TableName { database: "db".into(), table: "outbox".into() }),
            id: format!("id-{n}"),
            aggregate_type: "order".into(),
            aggregate_id: format!("order-{}", n % 7),
            event_type: Some("Created".into()),
            schema_version: Some(crate::outbox::SchemaVersion::Integer(1)),
            payload: "x".repeat(payload_bytes).into(),
            headers: None,
            occurred_at: Some("2026-11-30T00:00:00".into()),
            additional: Vec::new(),
            from_snapshot: false,
            snapshot_id: None,
        })
    }

    #[tokio::test]
    async fn yields_every_change_in_order_then_the_end() {
        let changes: Vec<Change> =
            (0..5000).flat_map(|n| [begin(n as u64), row(n, 100), commit(n as u64 + 1)]).collect();
        let (source, _) = script(&changes, None);
        let mut ahead = ReadAhead::spawn(source, 64 * 1024);
        let mut got = Vec::new();
        while let Some(change) = ahead.next().await.unwrap() {
            got.push(change);
        }
        assert_eq!(got, changes);
    }

    /// Rows handed back are dropped by the reader task while it waits for a quiet source, not kept until the
    /// next change arrives; the ring-buffer reuse keeps the order.
    #[tokio::test]
    async fn recycled_rows_are_dropped_while_the_source_is_quiet() {
        struct ThenQuiet(VecDeque<Change>);
        impl Changes for ThenQuiet {
            async fn next(&mut self) -> Result<Option<Change>> {
                match self.0.pop_front() {
                    Some(change) => Ok(Some(change)),
                    None => std::future::pending().await,
                }
            }
        }
        let table = Arc::new(crate::outbox::TableName { database: "db".into(), table: "outbox".into() });
        let changes: Vec<Change> = (0..3000)
            .map(|n| match row(n, 100) {
                Change::Row(mut r) => {
                    r.table = table.clone();
                    Change::Row(r)
                }
                _ => unreachable!(),
            })
            .collect();
        let mut ahead = ReadAhead::spawn(ThenQuiet(changes.iter().cloned().collect()), 64 * 1024);
        for want in &changes {
            let got = ahead.next().await.unwrap().unwrap();
            assert_eq!(&got, want);
            ahead.recycle(got);
        }
        drop(changes);
        // The last batch goes back once the pipeline asks for more.
        assert!(tokio::time::timeout(Duration::from_millis(50), ahead.next()).await.is_err());
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(Arc::strong_count(&table), 1, "rows handed back are still alive");
    }

    #[tokio::test]
    async fn an_error_comes_after_the_changes_read_before_it() {
        let changes = [begin(1), row(1, 10)];
        let (source, _) = script(&changes, Some(Error::transient("connection lost")));
        let mut ahead = ReadAhead::spawn(source, 1024 * 1024);
        assert_eq!(ahead.next().await.unwrap().as_ref(), Some(&changes[0]));
        assert_eq!(ahead.next().await.unwrap().as_ref(), Some(&changes[1]));
        let error = ahead.next().await.unwrap_err();
        assert!(error.to_string().contains("connection lost"), "{error}");
    }

    #[tokio::test]
    async fn reads_no_further_ahead_than_the_budget() {
        // 1,000 rows of ~10 KB against a 256 KiB budget: one batch (~25 rows) may wait in the channel and
        // one more be built; the reader must stop there until the pipeline uses them up.
        let changes: Vec<Change> = (0..1000).map(|n| row(n, 10_000)).collect();
        let (source, taken) = script(&changes, None);
        let mut ahead = ReadAhead::spawn(source, BATCH_BYTES);
        assert!(ahead.next().await.unwrap().is_some());
        tokio::time::sleep(Duration::from_millis(100)).await;
        let ahead_by = taken.load(Ordering::SeqCst);
        assert!((20..=60).contains(&ahead_by), "read {ahead_by} rows ahead with budget for ~25");
        let mut count = 1;
        while ahead.next().await.unwrap().is_some() {
            count += 1;
        }
        assert_eq!(count, 1000);
    }

    #[tokio::test]
    async fn dropping_it_stops_the_reader() {
        struct Dropped(Arc<AtomicUsize>);
        impl Drop for Dropped {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        struct Held(Script, #[allow(dead_code)] Dropped);
        impl Changes for Held {
            fn next(&mut self) -> impl Future<Output = Result<Option<Change>>> + Send {
                self.0.next()
            }
        }
        let changes: Vec<Change> = (0..1000).map(|n| row(n, 10_000)).collect();
        let (source, _) = script(&changes, None);
        let dropped = Arc::new(AtomicUsize::new(0));
        let mut ahead = ReadAhead::spawn(Held(source, Dropped(dropped.clone())), BATCH_BYTES);
        assert!(ahead.next().await.unwrap().is_some());
        // The reader now waits for budget; dropping the pipeline's end must end it (and its connection).
        drop(ahead);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(dropped.load(Ordering::SeqCst), 1);
    }
}
