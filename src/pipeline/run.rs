//! The moving parts of one run ([`Run`]: sink, publisher, watermark, checkpointer and its periodic writer)
//! and its phases: [`Run::snapshot`], [`Run::stream`] (the one stream phase of live and binlog-file runs)
//! and [`Run::settle`], which ends each of them.
//!
//! Floor 5 (docs/ARCHITECTURE.md): imports floors 0-4.

use std::future::Future;
use std::sync::Arc;

use super::commit::Commit;
use super::on_demand::OnDemand;
use super::plan::SnapshotPlan;
use super::read_ahead::ReadAhead;
use super::shutdown::Shutdown;
use crate::checkpoint::checkpointer::{Checkpointer, Periodic};
use crate::checkpoint::{Mark, TxId, Watermark};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::health::health;
use crate::metrics::metrics;
use crate::poison::{Origin, ResumePoint};
use crate::position::on_demand::OnDemandProgress;
use crate::position::server::EndEvent;
use crate::position::snapshot::{Segment, SnapshotState};
use crate::position::{Position, TxProgress, TxStart};
use crate::publish::{Publisher, SourceRow};
use crate::router::Router;
use crate::sink::KafkaSink;
use crate::source::binlog::Change;
use crate::source::overlap::Overlap;
use crate::source::{snapshot, ServerInfo, SourceConn, SourceReader};

/// Everything one run builds, owned for the run and handed to each phase.
pub(super) struct Run<'a> {
    config: &'a Config,
    /// The producer; mints the delivery proofs.
    sink: KafkaSink,
    /// Row to record, with the quarantine of poison rows.
    publisher: Publisher,
    /// Turns delivery proofs, in source order, into the acknowledged mark.
    watermark: Arc<Watermark>,
    /// Writes the mark to the store.
    checkpointer: Arc<Checkpointer>,
    /// Writes it every `checkpoint_interval_ms`, off the run's task.
    periodic: Periodic,
    shutdown: &'a Shutdown,
    /// The delivery guarantee: how checkpoints become durable, and when.
    commit: Commit,
}

impl<'a> Run<'a> {
    /// Builds the run's producer, publisher and watermark, and starts the periodic checkpoint writer.
    /// With `exactly_once` the producer is transactional (its start fences any older one) and checkpoints
    /// are written into its transactions instead ([`Commit`]).
    ///
    /// # Errors
    /// A definite error when the producer cannot be configured or the store cannot be read; transient when
    /// the transactional producer cannot start.
    pub(super) async fn new(
        config: &'a Config,
        router: Router,
        checkpointer: Arc<Checkpointer>,
        shutdown: &'a Shutdown,
    ) -> Result<Run<'a>> {
        let watermark = Arc::new(Watermark::new(None));
        let (commit, sink) = Commit::start(config, &checkpointer, watermark.clone(), shutdown.kafka_deadline()).await?;
        let publisher = Publisher::new(config, router, checkpointer.store().clone())?;
        let periodic = checkpointer.every(watermark.clone(), commit.interval());
        Ok(Run { config, sink, publisher, watermark, checkpointer, periodic, shutdown, commit })
    }

    /// Hands no record to the producer once `lease` is no longer provably held.
    pub(super) fn publish_while(&mut self, lease: crate::lease::Holding) {
        self.sink.publish_while(lease);
    }

    /// Declares `start` (durable already) as where the stream phase begins.
    pub(super) fn begin_stream(&mut self, start: &Mark) {
        self.watermark.reset(start.clone());
        self.checkpointer.already_saved(start.clone());
        self.commit.begin_at(start);
    }

    /// The stream phase: reads `reader` from `start` (declared with [`Run::begin_stream`]) until shutdown,
    /// the end of binlog files or the first error, then settles.
    ///
    /// # Errors
    /// The error that ended the phase, or a failed final checkpoint.
    pub(super) async fn stream(
        &mut self,
        start: &Mark,
        reader: SourceReader,
        overlap: Option<Overlap>,
        mut on_demand: OnDemand<'_>,
    ) -> Result<()> {
        let mut reader = ReadAhead::spawn(reader, self.config.source.read_ahead_bytes);
        health().set_source_connected(true);
        self.publisher.resume(ResumePoint::Stream(&start.position));
        let mut stream = StreamState {
            current: None,
            start: None,
            overlap,
            row_index: 0,
            published: start.inside.clone(),
            skip_rows: 0,
            split: false,
        };
        let result = self.read_and_produce(&mut reader, &mut stream, &mut on_demand).await;
        drop(reader);
        if let Some(tx) = stream.current.take() {
            self.watermark.abandon(tx);
            self.commit.cut_off();
        }
        self.settle(result).await.map(|_| ())
    }

    /// Records produced and not yet acknowledged.
    pub(super) fn unsettled(&self) -> u64 {
        self.watermark.unsettled()
    }

    /// After a phase: waits for acknowledgements (briefly after a failure), makes the last checkpoint
    /// durable, and returns its mark ([`Commit::settle`]).
    pub(super) async fn settle(&mut self, result: Result<()>) -> Result<Option<Mark>> {
        self.commit.settle(&mut self.sink, &self.watermark, &self.checkpointer, result).await
    }

    /// Scans the plan's outbox tables in one consistent view and produces every row; ends with the
    /// watermark's last mark saying `done` once everything is acknowledged (see
    /// [`crate::source::snapshot`]). The marks are at the cut for the initial snapshot, and at the
    /// checkpoint the stream resumes from for tables added later ([`SnapshotPlan::added_at`]).
    pub(super) async fn snapshot(&mut self, source: &SourceConn, info: &ServerInfo, plan: SnapshotPlan) -> Result<()> {
        let Run { config, sink, publisher, watermark, checkpointer, periodic, shutdown, commit } = self;
        let SnapshotPlan { tables, progress, added_at } = plan;
        if let Some(progress) = &progress {
            progress.check_tables(config.tables()).map_err(Error::definite)?;
        }
        let after = progress.as_ref().and_then(|p| p.last_key.clone());
        let (mut scanner, view) = snapshot::open(source, info, config, &tables, after.clone()).await?;
        health().set_source_connected(true);
        let mut state = match progress {
            Some(mut state) => {
                tracing::info!(
                    rows_done = state.rows_done,
                    view = %view,
                    cut = %state.cut(),
                    "resuming the snapshot after the last acknowledged key in a new read view"
                );
                state.segments.push(Segment { view: view.clone(), after });
                state
            }
            None => {
                let rows_estimate = scanner.estimate_rows().await?;
                tracing::info!(cut = %view, rows_estimate, "snapshot: consistent read view opened");
                SnapshotState {
                    segments: vec![Segment { view: view.clone(), after: None }],
                    last_key: None,
                    rows_done: 0,
                    rows_estimate,
                    done: false,
                    tables: tables.iter().map(ToString::to_string).collect(),
                    added: added_at.is_some(),
                }
            }
        };
        let cut = state.cut().clone();
        // Where the marks are: the initial snapshot's at its cut, where its stream starts; an added table's at
        // the checkpoint, where the stream resumes (the other tables' events after it are still to come).
        let mark_of = |state: &SnapshotState| match &added_at {
            Some(at) => Mark { snapshot: Some(Arc::new(state.clone())), ..at.clone() },
            None => Mark::boundary(cut.clone(), Some(Arc::new(state.clone()))),
        };
        publisher.resume(ResumePoint::Snapshot { rows_done: state.rows_done });
        // The new segment must be durable before any of its rows is produced: a crash must not resume
        // with a segment list that misses the view those rows came from.
        checkpointer.save_now(mark_of(&state))?;
        watermark.reset(checkpointer.saved().expect("just saved"));

        let progress_bar = crate::progress::Progress::new(state.rows_estimate, state.rows_done);
        let mut scanner = scanner.prefetch();
        let mut grace = std::pin::pin!(shutdown.grace_expired());
        loop {
            if let Some(error) = watermark.take_failure().or_else(|| periodic.failure()) {
                return Err(error);
            }
            if shutdown.is_requested() {
                tracing::info!(rows_done = state.rows_done, "stopping the snapshot; it resumes from here");
                return Ok(());
            }
            let Some(chunk) = scanner.next_chunk().await? else {
                break;
            };
            let tx = watermark.open();
            for (index, row) in chunk.rows.iter().enumerate() {
                let origin = || Origin {
                    snapshot: true,
                    gtid: Some(cut.gtids.to_string()).filter(|g| !g.is_empty()),
                    file: cut.coord.file.clone(),
                    position: cut.coord.pos,
                    row_index: state.rows_done + index as u64,
                };
                let prepared = publisher.prepare(SourceRow::Decoded(row), origin, |r| sink.fits(r))?;
                tokio::select! {
                    biased;
                    sent = sink.send(tx, prepared.record, prepared.occurred_at_ms) => sent?,
                    _ = &mut grace => {
                        commit.cut_off();
                        return Ok(());
                    }
                }
                crate::failpoint!("snapshot_row");
            }
            state.rows_done += chunk.rows.len() as u64;
            state.last_key = Some(chunk.last_key);
            progress_bar.set(state.rows_done);
            metrics().snapshot_progress(state.rows_done, state.rows_estimate);
            commit.closed(sink, watermark, tx, mark_of(&state)).await?;
        }
        state.done = true;
        let tx = watermark.open();
        commit.closed(sink, watermark, tx, mark_of(&state)).await?;
        progress_bar.finish(state.rows_done);
        tracing::info!(rows = state.rows_done, "snapshot read; waiting for the last acknowledgements");
        Ok(())
    }

    /// Reads changes and produces their rows until shutdown (between source transactions), the end of
    /// binlog files or the first error; what a closed transaction, a due commit or a returned one means is
    /// [`Commit`]'s.
    async fn read_and_produce(
        &mut self,
        reader: &mut ReadAhead,
        stream: &mut StreamState,
        on_demand: &mut OnDemand<'_>,
    ) -> Result<()> {
        let Run { sink, publisher, watermark, checkpointer, periodic, shutdown, commit, .. } = self;
        // Made once and polled by reference: a fresh shutdown future per change was measurable at 100k/s.
        let mut requested = std::pin::pin!(shutdown.requested());
        let mut grace = std::pin::pin!(shutdown.grace_expired());
        // A failed delivery ends the run at once, also while the source is idle.
        let delivery_failed = sink.failure_notice();
        // A snapshot on demand asked, paused or cancelled.
        let requests = on_demand.changed();
        let mut requested_snapshot = std::pin::pin!(requests.notified());
        loop {
            if let Some(error) = watermark.take_failure().or_else(|| periodic.failure()) {
                return Err(error);
            }
            // A snapshot on demand's chunk goes between source transactions, once the one before it is
            // acknowledged; a chunk read already goes at once, also while the binlog keeps the loop busy.
            if stream.current.is_none() && !shutdown.is_requested() {
                if on_demand.settling() {
                    on_demand.settle(checkpointer).await?;
                }
                if on_demand.ready(watermark) {
                    if let Some(chunk) = on_demand.try_chunk() {
                        if produce_chunk(chunk?, sink, publisher, watermark, commit, on_demand, &mut grace).await? {
                            return Ok(());
                        }
                    }
                }
            }
            // A long source transaction commits inside itself: its Kafka transaction would otherwise stay
            // open past `transaction.timeout.ms`, and the broker would abort it at every try.
            if stream.current.is_some() && commit.due_inside(sink, stream.split) {
                if let Some(progress) = stream.progress() {
                    if !stream.split {
                        tracing::info!(
                            inside = %progress,
                            open_s = commit.split_after().unwrap_or_default().as_secs_f32(),
                            "a source transaction kept its Kafka transaction open for half of transaction.timeout.ms: \
                             committing it in parts from now on (read_committed consumers see its rows in several commits)"
                        );
                        stream.split = true;
                    }
                    commit.inside(sink, progress).await?;
                }
            }
            let stopping = shutdown.is_requested();
            if stopping && stream.current.is_none() {
                // Between transactions (also when requested before this loop first ran, e.g. during the
                // snapshot): nothing to finish.
                return Ok(());
            }
            // A commit is due by time only between source transactions, also while the source is idle.
            let commit_at = stream.current.is_none().then(|| commit.due_at(sink)).flatten();
            Commit::finish_returned(sink).await?;
            tokio::select! {
                // Changes before the shutdown notice: while changes flow, the check above sees a shutdown
                // on the next turn; the notice only wakes a loop that waits for the source.
                biased;
                _ = &mut grace, if stopping => {
                    tracing::warn!("the current source transaction did not finish within the shutdown grace period; it will be read again after restart");
                    return Ok(());
                }
                change = reader.next() => match change? {
                    None => {
                        tracing::info!("end of the binlog files: waiting for the last acknowledgements, then exiting");
                        return Ok(());
                    }
                    Some(Change::Begin(start)) => {
                        if let Some(tx) = stream.current {
                            commit.restarted(watermark, tx)?;
                        }
                        stream.current = Some(watermark.open());
                        stream.begin(start)?;
                    }
                    Some(change @ (Change::Row(_) | Change::Undecodable(_))) => {
                        match stream.produce(&change, sink, publisher, watermark, &mut grace).await? {
                            Produced::Sent => reader.recycle(change),
                            Produced::Skipped => {}
                            Produced::Stopped => return Ok(()),
                        }
                    }
                    Some(Change::Signal(signal)) => on_demand.signal(&signal).await?,
                    Some(Change::Commit { position, timestamp, end_event }) => {
                        let (tx, mark) = stream.close(watermark, position, timestamp, end_event, on_demand.progress());
                        commit.closed(sink, watermark, tx, mark).await?;
                        if stopping {
                            return Ok(());
                        }
                    }
                },
                wake = Commit::wait(sink, commit_at) => commit.woke(sink, wake).await?,
                chunk = on_demand.next_chunk(), if stream.current.is_none() && !stopping && on_demand.ready(watermark) =>
                {
                    if produce_chunk(chunk?, sink, publisher, watermark, commit, on_demand, &mut grace).await? {
                        return Ok(());
                    }
                }
                // A chunk's acknowledgement, or the checkpoint of the last one, is looked for again shortly.
                () = tokio::time::sleep(ON_DEMAND_LOOK), if on_demand.waiting(watermark) || on_demand.settling() => {}
                () = &mut requested_snapshot => {
                    requested_snapshot.set(requests.notified());
                    on_demand.reload().await?;
                }
                _ = &mut requested, if !stopping => if stream.current.is_some() {
                    tracing::info!("stopping after the current source transaction");
                },
                _ = delivery_failed.notified() => {}
            }
        }
    }
}

/// How soon the stream looks again for a chunk's acknowledgement while nothing else wakes it.
const ON_DEMAND_LOOK: std::time::Duration = std::time::Duration::from_millis(5);

/// Produces `chunk` of the snapshot on demand (`None`: the end of its slice, a mark with no rows) as one
/// entry of the watermark, closed at once with the last closed mark and the snapshot's progress. Returns
/// `true` when the shutdown grace period expired first (the chunk is abandoned: it is read again).
///
/// # Errors
/// As [`Publisher::prepare`] and [`KafkaSink::send`].
async fn produce_chunk(
    chunk: Option<snapshot::Chunk>,
    sink: &mut KafkaSink,
    publisher: &mut Publisher,
    watermark: &Watermark,
    commit: &mut Commit,
    on_demand: &mut OnDemand<'_>,
    grace: &mut (impl Future<Output = ()> + Unpin),
) -> Result<bool> {
    // A definite scan error ended the snapshot (failed): nothing to produce.
    let Some((id, rows_before)) = on_demand.current() else { return Ok(false) };
    let Some(last) = watermark.last_closed() else { return Ok(false) };
    let tx = watermark.open();
    let (rows, last_key) = match chunk {
        Some(chunk) => {
            let rows = chunk.rows.len() as u64;
            for (index, mut row) in chunk.rows.into_iter().enumerate() {
                row.snapshot_id = Some(id.clone());
                let origin = || Origin {
                    snapshot: true,
                    gtid: None,
                    file: String::new(),
                    position: 0,
                    row_index: rows_before + index as u64,
                };
                let prepared = publisher.prepare(SourceRow::Decoded(&row), origin, |r| sink.fits(r))?;
                tokio::select! {
                    biased;
                    sent = sink.send(tx, prepared.record, prepared.occurred_at_ms) => sent?,
                    () = &mut *grace => {
                        watermark.abandon(tx);
                        commit.cut_off();
                        return Ok(true);
                    }
                }
                crate::failpoint!("on_demand_row");
            }
            (rows, Some(chunk.last_key))
        }
        None => (0, None),
    };
    let mark = on_demand.produced(tx, rows, last_key, last, watermark.settled_before()).expect("a snapshot is active");
    commit.closed(sink, watermark, tx, mark).await?;
    Ok(false)
}

/// Per-run state of the stream phase.
struct StreamState {
    /// The transaction being read, registered with the watermark.
    current: Option<TxId>,
    /// Where it started.
    start: Option<TxStart>,
    /// The snapshot's overlap rule, while it can still skip rows.
    overlap: Option<Overlap>,
    /// Index of the next outbox row within the current transaction.
    row_index: u64,
    /// Rows of a transaction published before this run (the start mark's `inside`), until it closes.
    published: Option<TxProgress>,
    /// Outbox rows at the head of the current transaction published before this run: counted, not produced.
    skip_rows: u64,
    /// Whether the current transaction committed inside itself, in this run or before it: it commits in parts
    /// from then on ([`Commit::due_inside`]).
    split: bool,
}

impl StreamState {
    /// A transaction begins at `start`: the rows of it published before this run, if any, are skipped.
    ///
    /// # Errors
    /// Definite when the run resumes inside a transaction without a GTID and reads another one first: its
    /// position is not where that transaction was read before (the binlog changed under the checkpoint).
    fn begin(&mut self, start: TxStart) -> Result<()> {
        self.skip_rows = 0;
        self.split = false;
        if let Some(published) = &self.published {
            if published.is_for(&start) {
                tracing::info!(%published, "resuming inside a source transaction: its rows published before are skipped");
                self.skip_rows = published.rows;
                self.split = true;
            } else if published.gtid.is_none() {
                return Err(Error::definite(format!(
                    "the checkpoint says {published} are published, but the first transaction read after its \
                     position starts at {}: the binlog is not the one the checkpoint was taken on. Check the \
                     source server (`outbox-cdc status`, `outbox-cdc check`)",
                    start.coord
                )));
            }
        }
        self.start = Some(start);
        self.row_index = 0;
        Ok(())
    }

    /// How far into the current transaction its rows are produced, for a commit inside it. `None` before it
    /// passed the rows published before this run, and while another transaction's rows published before
    /// this run are still to be met (its GTID has not come yet).
    fn progress(&self) -> Option<TxProgress> {
        let start = self.start.as_ref()?;
        if self.row_index == 0 || self.row_index < self.skip_rows {
            return None;
        }
        if self.published.as_ref().is_some_and(|p| !p.is_for(start)) {
            return None;
        }
        Some(TxProgress::of(start, self.row_index))
    }

    /// Where the next row of the current transaction was read.
    fn origin(&self) -> Origin {
        let (gtid, file, position) = match &self.start {
            Some(start) => (start.gtid.as_ref().map(|g| g.to_string()), start.coord.file.clone(), start.coord.pos),
            None => (None, String::new(), 0),
        };
        Origin { snapshot: false, gtid, file, position, row_index: self.row_index }
    }

    /// Produces the row of `change` (a row or an undecodable one) in the current transaction, unless the
    /// snapshot emitted it already; gives up when the shutdown grace period (`grace`) expires first.
    ///
    /// # Errors
    /// As [`Publisher::prepare`] and [`KafkaSink::send`], and a failed overlap check.
    async fn produce(
        &mut self,
        change: &Change,
        sink: &mut KafkaSink,
        publisher: &mut Publisher,
        watermark: &Watermark,
        grace: &mut (impl Future<Output = ()> + Unpin),
    ) -> Result<Produced> {
        if let (Change::Row(row), Some(overlap), Some(start)) = (change, self.overlap.as_mut(), self.start.as_ref()) {
            if overlap.emitted_by_snapshot(row, start).await? {
                tracing::debug!(id = %row.id, "already emitted by the snapshot");
                return Ok(Produced::Skipped);
            }
        }
        if self.row_index < self.skip_rows {
            self.row_index += 1;
            return Ok(Produced::Skipped);
        }
        crate::failpoint!("before_produce");
        let tx = *self.current.get_or_insert_with(|| watermark.open());
        let row = match change {
            Change::Row(row) => SourceRow::Decoded(row),
            Change::Undecodable(bad) => SourceRow::Undecodable(bad),
            _ => unreachable!("only rows are produced"),
        };
        let prepared = publisher.prepare(row, || self.origin(), |r| sink.fits(r))?;
        tokio::select! {
            sent = sink.send(tx, prepared.record, prepared.occurred_at_ms) => sent?,
            _ = grace => {
                tracing::warn!("Kafka did not accept records within the shutdown grace period");
                return Ok(Produced::Stopped);
            }
        }
        // Counted once handed to the producer: a mark inside the transaction holds only rows it has.
        self.row_index += 1;
        crate::failpoint!("row_produced");
        Ok(Produced::Sent)
    }

    /// Ends the current transaction at its commit: its id (registered now if it produced nothing) and the
    /// mark after it.
    fn close(
        &mut self,
        watermark: &Watermark,
        position: Position,
        timestamp: u32,
        end_event: Option<EndEvent>,
        on_demand: Option<Arc<OnDemandProgress>>,
    ) -> (TxId, Mark) {
        metrics().transaction_read(timestamp);
        let tx = self.current.take().unwrap_or_else(|| watermark.open());
        if self.overlap.as_ref().is_some_and(|o| o.expired(&position)) {
            tracing::info!("stream is past every snapshot view: overlap rule retired");
            self.overlap = None;
        }
        let snapshot = self.overlap.as_ref().map(|o| o.state().clone());
        let timestamp = (timestamp != 0).then_some(timestamp);
        if let (Some(published), Some(start)) = (&self.published, &self.start) {
            if published.is_for(start) {
                self.published = None;
            }
        }
        // Rows of a transaction not met yet (another GTID came first) stay published in every mark until it is.
        let mark = Mark { position, timestamp, end_event, snapshot, inside: self.published.clone(), on_demand };
        self.skip_rows = 0;
        self.split = false;
        (tx, mark)
    }
}

/// What became of a row handed to [`StreamState::produce`].
enum Produced {
    /// Handed to the producer.
    Sent,
    /// The snapshot emitted it already.
    Skipped,
    /// The shutdown grace period expired first.
    Stopped,
}
