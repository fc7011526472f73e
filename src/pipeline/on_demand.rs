//! Snapshots on demand, read while the stream runs ([`OnDemand`]): an operator asks for one outbox table,
//! or a slice of it ([`SnapshotRequest`], stored in the state store's notes by the control API, the CLI or
//! a signal), and the stream phase publishes its rows again, in chunks, between source transactions.
//!
//! Floor 5 (docs/ARCHITECTURE.md): imports floors 0-4.
//!
//! # Order
//! A chunk is produced by the stream's own task, between two source transactions, as one entry of the
//! watermark; at most [`CHUNKS_IN_FLIGHT`] of them wait for Kafka's acknowledgement at a time. The
//! producer keeps each partition in the order records are handed to it (idempotent, so also across its
//! retries), and a failed delivery ends the run: so a stream event of an aggregate handed over after its
//! chunk lands after the whole chunk, and before the next one. A consumer sees each aggregate's snapshot
//! rows in `occurred_at` order (the scan's key order, as the initial snapshot's), each in one piece per
//! chunk, and the stream's events in commit order; the stream waits for no chunk longer than the time its
//! rows take to be handed over.
//!
//! # Progress
//! Each chunk's mark is the last mark the stream closed, with the snapshot's progress (the last key and
//! the rows produced): the checkpoint records it when Kafka acknowledged the chunk and everything before
//! it, and with `exactly_once` it is committed in the same Kafka transaction as the chunk's records. A
//! restart (a kill -9 too) resumes the scan after the last checkpointed key, in a new read view: rows of
//! chunks not checkpointed are published again. Once the last chunk's mark (`done`) is durable, the
//! request is stored as done and the next marks carry nothing.

use std::sync::Arc;

use tokio::sync::Notify;

use crate::checkpoint::checkpointer::Checkpointer;
use crate::checkpoint::store::{RequestState, SnapshotRequest, SIGNAL_BY};
use crate::checkpoint::{Mark, Store, TxId, Watermark};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::metrics::metrics;
use crate::outbox::TableName;
use crate::position::on_demand::{OnDemandProgress, Slice};
use crate::position::snapshot::SnapshotKey;
use crate::source::binlog::Signal;
use crate::source::snapshot::{self, Chunk, Prefetch};
use crate::source::SourceConn;

use super::signals::SignalledPause;

/// Chunks of a snapshot on demand produced and not yet acknowledged, at most: enough to keep the producer
/// busy between acknowledgements (one at a time, a 1M-row snapshot read 17,400 rows/s beside a 5,000/s
/// stream), few enough that the stream's records never wait behind more than these in the producer.
const CHUNKS_IN_FLIGHT: usize = 4;

/// The snapshots on demand of one run.
pub(crate) struct OnDemand<'a> {
    config: &'a Config,
    /// `None` where there is no table to read (binlog files).
    source: Option<SourceConn>,
    store: Arc<Store>,
    /// Woken when a request was stored or changed.
    changed: Arc<Notify>,
    /// Where a `pause` signal is carried out.
    pause: SignalledPause,
    active: Option<Active>,
    /// A snapshot failed since the requests were last read: the next one asked is to be taken
    /// ([`OnDemand::settle`]).
    stale: bool,
}

/// The snapshot being read.
struct Active {
    request: SnapshotRequest,
    table: TableName,
    /// Its id, as every record of it carries it.
    id: Arc<str>,
    /// What the marks carry: the last chunk produced.
    progress: Arc<OnDemandProgress>,
    /// The scan, while reading; `None` while paused and after the last chunk.
    scan: Option<Prefetch>,
    /// The chunks produced and not yet passed by the watermark, oldest first: at most [`CHUNKS_IN_FLIGHT`].
    in_flight: std::collections::VecDeque<TxId>,
}

impl<'a> OnDemand<'a> {
    /// None: a run over binlog files reads no table.
    pub(crate) fn none(config: &'a Config, store: Arc<Store>) -> OnDemand<'a> {
        let (changed, pause) = (Arc::new(Notify::new()), SignalledPause::default());
        OnDemand { config, source: None, store, changed, pause, active: None, stale: false }
    }

    /// The snapshots on demand of a run whose stream starts at `start`: the one its checkpoint was reading,
    /// else the first one asked and not ended.
    ///
    /// # Errors
    /// A definite error when the store cannot be read or written; the scan's errors.
    pub(crate) async fn start(
        config: &'a Config,
        source: SourceConn,
        store: Arc<Store>,
        (changed, pause): (Arc<Notify>, SignalledPause),
        start: &Mark,
    ) -> Result<OnDemand<'a>> {
        let mut on_demand =
            OnDemand { config, source: Some(source), store, changed, pause, active: None, stale: false };
        let requests = on_demand.store.snapshots()?;
        if let Some(progress) = &start.on_demand {
            match requests.iter().find(|r| r.id == progress.id) {
                Some(request) if request.state == RequestState::Queued && progress.done => {
                    on_demand.store.put_snapshot(&finished(request, progress))?;
                    tracing::info!(id = %request.id, rows = progress.rows_done, "snapshot on demand done");
                }
                Some(request) if !request.state.is_final() => {
                    on_demand.activate(request.clone(), (**progress).clone())?;
                }
                // Cancelled or ended while the connector was stopped: its progress is dropped.
                _ => {}
            }
        }
        on_demand.reload_from(requests).await?;
        Ok(on_demand)
    }

    /// The waker of [`OnDemand::reload`].
    pub(crate) fn changed(&self) -> Arc<Notify> {
        self.changed.clone()
    }

    /// Reads the requests again (one was asked, paused, resumed or cancelled).
    ///
    /// # Errors
    /// As [`OnDemand::start`].
    pub(crate) async fn reload(&mut self) -> Result<()> {
        let requests = self.store.snapshots()?;
        self.reload_from(requests).await
    }

    async fn reload_from(&mut self, requests: Vec<SnapshotRequest>) -> Result<()> {
        if self.source.is_none() {
            return Ok(());
        }
        if let Some(active) = &mut self.active {
            let now = requests.iter().find(|r| r.id == active.request.id).map_or(RequestState::Cancelled, |r| r.state);
            match now {
                RequestState::Queued => {}
                RequestState::Paused => {
                    if active.scan.take().is_some() {
                        tracing::info!(id = %active.id, rows = active.progress.rows_done, "snapshot on demand paused");
                    }
                }
                _ => {
                    let rows = active.progress.rows_done;
                    tracing::info!(id = %active.id, rows, state = ?now, "snapshot on demand ended by an operator");
                    self.active = None;
                }
            }
            if let Some(active) = &mut self.active {
                active.request.state = now;
            }
        }
        if self.active.is_none() {
            if let Some(next) = requests.into_iter().find(|r| !r.state.is_final()) {
                let progress = OnDemandProgress { id: next.id.clone(), last_key: None, rows_done: 0, done: false };
                self.activate(next, progress)?;
            }
        }
        self.open_scan().await?;
        metrics().on_demand_progress(self.active.as_ref().map(|a| a.progress.rows_done));
        Ok(())
    }

    /// Makes `request` the active one at `progress`.
    fn activate(&mut self, request: SnapshotRequest, progress: OnDemandProgress) -> Result<()> {
        let table = TableName::parse(&request.table).map_err(Error::definite)?;
        let (id, rows_done) = (&request.id, progress.rows_done);
        tracing::info!(%id, table = %request.table, slice = ?request.slice, rows_done, "snapshot on demand: reading");
        self.active = Some(Active {
            id: request.id.as_str().into(),
            request,
            table,
            progress: Arc::new(progress),
            scan: None,
            in_flight: std::collections::VecDeque::new(),
        });
        Ok(())
    }

    /// Opens the active snapshot's scan when it should read and has none.
    async fn open_scan(&mut self) -> Result<()> {
        let (Some(active), Some(source)) = (&mut self.active, &self.source) else { return Ok(()) };
        if active.scan.is_some() || active.progress.done || active.request.state != RequestState::Queued {
            return Ok(());
        }
        let after = active.progress.last_key.clone();
        match snapshot::open_slice(source, self.config, &active.table, &active.request.slice, after).await {
            Ok(scanner) => {
                active.scan = Some(scanner.prefetch());
                Ok(())
            }
            Err(error) => self.failed(error),
        }
    }

    /// The active snapshot cannot be read: a definite error ends it as failed (the stream goes on); a
    /// transient one ends the run, which resumes it.
    fn failed(&mut self, error: Error) -> Result<()> {
        if !error.is_definite() {
            return Err(error);
        }
        let Some(active) = self.active.take() else { return Err(error) };
        tracing::error!(id = %active.id, %error, "snapshot on demand failed; the stream goes on");
        self.stale = true;
        let rows = active.progress.rows_done;
        self.store.put_snapshot(&active.request.finished(
            RequestState::Failed,
            crate::time::now_ms(),
            rows,
            Some(error.to_string()),
        ))?;
        metrics().on_demand_progress(None);
        Ok(())
    }

    /// What every mark carries now.
    pub(crate) fn progress(&self) -> Option<Arc<OnDemandProgress>> {
        self.active.as_ref().map(|a| a.progress.clone())
    }

    /// Whether a chunk may be read now: a snapshot reads, and fewer than [`CHUNKS_IN_FLIGHT`] of its chunks
    /// wait for Kafka's acknowledgement (of them and of everything before them).
    pub(crate) fn ready(&self, watermark: &Watermark) -> bool {
        match &self.active {
            Some(Active { scan: Some(_), in_flight, .. }) => {
                in_flight.len() < CHUNKS_IN_FLIGHT
                    || in_flight.front().is_some_and(|tx| watermark.settled_before() > *tx)
            }
            _ => false,
        }
    }

    /// Whether a chunk waits for its acknowledgement (the stream looks again shortly).
    pub(crate) fn waiting(&self, watermark: &Watermark) -> bool {
        matches!(&self.active, Some(Active { scan: Some(_), .. })) && !self.ready(watermark)
    }

    /// The next chunk, once [`OnDemand::ready`]; `None` at the end of the slice (then the snapshot's last
    /// mark is [`OnDemand::produced`] with no rows). Cancel-safe.
    ///
    /// # Errors
    /// A transient scan error (a definite one ends the snapshot as failed and returns `Ok(None)` with no
    /// snapshot active).
    pub(crate) async fn next_chunk(&mut self) -> Result<Option<Chunk>> {
        let Some(scan) = self.active.as_mut().and_then(|a| a.scan.as_mut()) else {
            return std::future::pending().await;
        };
        let next = scan.next_chunk().await;
        self.chunk_or_failure(next)
    }

    /// [`OnDemand::next_chunk`] if one is read already.
    pub(crate) fn try_chunk(&mut self) -> Option<Result<Option<Chunk>>> {
        let next = self.active.as_mut().and_then(|a| a.scan.as_mut())?.try_next_chunk()?;
        Some(self.chunk_or_failure(next))
    }

    fn chunk_or_failure(&mut self, next: Result<Option<Chunk>>) -> Result<Option<Chunk>> {
        match next {
            Ok(chunk) => Ok(chunk),
            Err(error) => self.failed(error).map(|()| None),
        }
    }

    /// The id the active snapshot's records carry, and the rows it produced before this chunk.
    pub(crate) fn current(&self) -> Option<(Arc<str>, u64)> {
        self.active.as_ref().map(|a| (a.id.clone(), a.progress.rows_done))
    }

    /// The chunk registered as `tx` was produced: `rows` rows up to `last_key`, or the end of the slice
    /// (`None`). Returns the chunk's mark: `last`, the last mark the stream closed before it, with the
    /// snapshot's progress (the position stays: the checkpoint never moves backwards).
    pub(crate) fn produced(
        &mut self,
        tx: TxId,
        rows: u64,
        last_key: Option<SnapshotKey>,
        last: Mark,
        settled_before: TxId,
    ) -> Option<Mark> {
        let active = self.active.as_mut()?;
        let mut progress = (*active.progress).clone();
        progress.rows_done += rows;
        match last_key {
            Some(key) => progress.last_key = Some(key),
            None => {
                progress.done = true;
                active.scan = None;
                let rows = progress.rows_done;
                tracing::info!(id = %active.id, rows, "snapshot on demand read; waiting for its acknowledgements");
            }
        }
        active.progress = Arc::new(progress);
        while active.in_flight.front().is_some_and(|chunk| *chunk < settled_before) {
            active.in_flight.pop_front();
        }
        active.in_flight.push_back(tx);
        metrics().on_demand_progress(Some(active.progress.rows_done));
        Some(Mark { on_demand: Some(active.progress.clone()), ..last })
    }

    /// Stores the active snapshot as done once its last mark is durable, or takes the requests again after
    /// one failed; the next snapshot asked, if any, starts.
    ///
    /// # Errors
    /// As [`OnDemand::start`].
    pub(crate) async fn settle(&mut self, checkpointer: &Checkpointer) -> Result<()> {
        if std::mem::take(&mut self.stale) {
            return self.reload().await;
        }
        let Some(active) = self.active.as_ref().filter(|a| a.progress.done) else { return Ok(()) };
        if checkpointer.saved().and_then(|m| m.on_demand).as_ref() != Some(&active.progress) {
            return Ok(());
        }
        let request = finished(&active.request, &active.progress);
        self.store.put_snapshot(&request)?;
        tracing::info!(id = %request.id, rows = request.rows, "snapshot on demand done");
        self.active = None;
        metrics().on_demand_progress(None);
        let requests = self.store.snapshots()?;
        self.reload_from(requests).await
    }

    /// Whether [`OnDemand::settle`] has work: the done snapshot waits for its checkpoint, or one failed and
    /// the next is to be taken.
    pub(crate) fn settling(&self) -> bool {
        self.stale || self.active.as_ref().is_some_and(|a| a.progress.done)
    }
}

impl OnDemand<'_> {
    /// Carries out a signal of `[outbox] signal_table` (Debezium's layout and types), once per signal id:
    /// `execute-snapshot` asks for a snapshot of each of its `data-collections` (with its
    /// `additional-conditions` filter as the slice's `where`); `pause-snapshot`, `resume-snapshot` and
    /// `stop-snapshot` pause, resume or cancel the snapshots not ended (`stop-snapshot` those of its
    /// `data-collections` when it names any); `pause` pauses the connector (`super::signals`), `resume`
    /// of a connector that runs does nothing. A request the connector cannot carry out is stored as
    /// failed, saying why; a type it does not take is logged and recorded. Signals read again after a
    /// restart (their transaction not checkpointed yet) are recognised by id and skipped.
    ///
    /// # Errors
    /// The store's; a transient error when the server cannot be asked whether a slice reads.
    pub(crate) async fn signal(&mut self, signal: &Signal) -> Result<()> {
        let Some(source) = self.source.clone() else { return Ok(()) };
        if self.store.signal_carried_out(&signal.id)? {
            tracing::debug!(id = %signal.id, kind = %signal.kind, "signal carried out before: skipped");
            return Ok(());
        }
        let by = format!("{SIGNAL_BY}{}", signal.id);
        let requests = self.store.snapshots()?;
        let data: serde_json::Value = match signal.data.as_deref().map(serde_json::from_str).transpose() {
            Ok(data) => data.unwrap_or(serde_json::Value::Null),
            Err(e) => serde_json::json!({ "unreadable": e.to_string() }),
        };
        let collections: Vec<String> = data["data-collections"]
            .as_array()
            .map(|list| list.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
            .unwrap_or_default();
        let outcome = match signal.kind.as_str() {
            "execute-snapshot" if requests.iter().any(|r| r.by == by) => "asked before".to_string(),
            "execute-snapshot" if collections.is_empty() => {
                let (id, data) = (&signal.id, &signal.data);
                tracing::error!(%id, ?data, "execute-snapshot signal without data-collections: nothing asked");
                "refused: no data-collections".to_string()
            }
            "execute-snapshot" => {
                let mut asked = Vec::new();
                for (n, collection) in collections.iter().enumerate() {
                    let request = self.signalled_request(&source, collection, &data, &by, n).await?;
                    self.store.put_snapshot(&request)?;
                    let (state, error) = (request.state, &request.error);
                    tracing::info!(signal = %signal.id, id = %request.id, table = %collection, ?state, ?error,
                        "snapshot on demand asked by a signal");
                    asked.push(request.id);
                }
                format!("asked {}", asked.join(", "))
            }
            "pause-snapshot" => self.change_all(&requests, &[], RequestState::Queued, RequestState::Paused)?,
            "resume-snapshot" => self.change_all(&requests, &[], RequestState::Paused, RequestState::Queued)?,
            "stop-snapshot" => self.cancel_all(&requests, &collections)?,
            "pause" => return self.pause.carry_out(&self.store, &signal.id),
            "resume" => "not paused: nothing to do".to_string(),
            other => {
                tracing::warn!(
                    id = %signal.id,
                    kind = other,
                    "signal of a type outbox-cdc does not take: ignored (it takes execute-snapshot, pause-snapshot, \
                     resume-snapshot, stop-snapshot, pause and resume)"
                );
                "ignored: unknown type".to_string()
            }
        };
        super::signals::note(&self.store, &signal.id, &signal.kind, &outcome)?;
        self.reload().await
    }

    /// The request an `execute-snapshot` signal asks for `collection`: queued, or failed with the reason
    /// when the table is not an outbox table or the server refuses its filter.
    async fn signalled_request(
        &self,
        source: &SourceConn,
        collection: &str,
        data: &serde_json::Value,
        by: &str,
        n: usize,
    ) -> Result<SnapshotRequest> {
        // Debezium's `additional-conditions` (a filter per collection), and the older single `additional-condition`.
        let filter = data["additional-conditions"]
            .as_array()
            .and_then(|list| list.iter().find(|c| c["data-collection"].as_str() == Some(collection)))
            .and_then(|c| c["filter"].as_str())
            .or_else(|| data["additional-condition"].as_str())
            .filter(|f| !f.trim().is_empty())
            .map(str::to_string);
        let slice = Slice { condition: filter, ..Slice::default() };
        let request = SnapshotRequest::asked(collection.to_string(), slice, by, n as u16);
        match snapshot::check_request(source, self.config, &request).await {
            Ok(()) => Ok(request),
            // Stored as failed, saying why: the signal is carried out, and its failure shows in `status`.
            Err(e) if e.is_definite() => {
                Ok(request.finished(RequestState::Failed, crate::time::now_ms(), 0, Some(e.to_string())))
            }
            Err(e) => Err(e),
        }
    }

    /// Moves every request in `from` (of `tables`, or all when empty) to `to`; says how many.
    fn change_all(
        &self,
        requests: &[SnapshotRequest],
        tables: &[String],
        from: RequestState,
        to: RequestState,
    ) -> Result<String> {
        let mut changed = 0;
        for request in requests.iter().filter(|r| r.state == from && (tables.is_empty() || tables.contains(&r.table))) {
            self.store.put_snapshot(&SnapshotRequest { state: to, ..request.clone() })?;
            changed += 1;
        }
        Ok(format!("{changed} snapshot(s) now {to:?}").to_lowercase())
    }

    /// Cancels every snapshot not ended (of `tables`, or all when empty); says how many.
    fn cancel_all(&self, requests: &[SnapshotRequest], tables: &[String]) -> Result<String> {
        let mut cancelled = 0;
        let now = crate::time::now_ms();
        for request in
            requests.iter().filter(|r| !r.state.is_final() && (tables.is_empty() || tables.contains(&r.table)))
        {
            let rows = self.active.as_ref().filter(|a| a.id.as_ref() == request.id).map_or(0, |a| a.progress.rows_done);
            self.store.put_snapshot(&request.clone().finished(RequestState::Cancelled, now, rows, None))?;
            cancelled += 1;
        }
        Ok(format!("{cancelled} snapshot(s) cancelled"))
    }
}

/// `request`, done with `progress`'s rows.
fn finished(request: &SnapshotRequest, progress: &OnDemandProgress) -> SnapshotRequest {
    request.clone().finished(RequestState::Done, crate::time::now_ms(), progress.rows_done, None)
}
