//! The moving parts of one run ([`Run`]: sink, publisher, watermark, checkpointer and its periodic writer)
//! and its phases: [`Run::snapshot`], [`Run::stream`] (the one stream phase of live and binlog-file runs)
//! and [`Run::settle`], which ends each of them.
//!
//! Floor 5 (docs/ARCHITECTURE.md): imports floors 0-4.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::read_ahead::ReadAhead;
use super::shutdown::{Shutdown, FAILURE_DRAIN, SHUTDOWN_GRACE};
use crate::checkpoint::checkpointer::{Checkpointer, Periodic};
use crate::checkpoint::{Mark, TxId, Watermark};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::health::health;
use crate::metrics::metrics;
use crate::poison::{Origin, ResumePoint};
use crate::position::snapshot::{Segment, SnapshotState};
use crate::position::TxStart;
use crate::publish::{Publisher, SourceRow};
use crate::router::Router;
use crate::sink::kafka::Transactional;
use crate::sink::KafkaSink;
use crate::source::binlog::Change;
use crate::source::overlap::Overlap;
use crate::source::{snapshot, ServerInfo, SourceConn, SourceReader};

/// Everything one run builds, owned for the run and handed to each phase.
pub(super) struct Run<'a> {
    config: &'a Config,
    /// Where the snapshot reads.
    source: &'a SourceConn,
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
    /// `exactly_once`: the mark of the last source transaction (or snapshot chunk) whose records are all
    /// produced; the next Kafka commit carries it.
    closed: Option<Mark>,
    /// `exactly_once`: records of a transaction or chunk that did not close are in the Kafka transaction;
    /// it must be aborted, not committed.
    partial: bool,
}

impl<'a> Run<'a> {
    /// Builds the run's producer, publisher and watermark, and starts the periodic checkpoint writer.
    /// With `exactly_once` the producer is transactional (its start fences any older one) and checkpoints
    /// are written into its transactions instead ([`commit`]).
    ///
    /// # Errors
    /// A definite error when the producer cannot be configured or the store cannot be read; transient when
    /// the transactional producer cannot start.
    pub(super) async fn new(
        config: &'a Config,
        source: &'a SourceConn,
        router: Router,
        checkpointer: Arc<Checkpointer>,
        shutdown: &'a Shutdown,
    ) -> Result<Run<'a>> {
        let watermark = Arc::new(Watermark::new(None));
        let sink = match (config.exactly_once(), checkpointer.store().kafka()) {
            (false, _) => KafkaSink::new(&config.kafka, watermark.clone())?,
            (true, Some(state)) => {
                let settings = Transactional {
                    id: config.transactional_id().to_string(),
                    state_topic: state.topic().to_string(),
                    checkpoint_key: state.checkpoint_key(),
                    max_bytes: config.delivery.transaction_max_bytes,
                };
                checkpointer.write_in_transactions();
                let sink = KafkaSink::transactional(&config.kafka, watermark.clone(), settings).await?;
                // The producer that commits has fenced now: what was read before it did may be stale.
                state.catch_up(config).await?;
                sink
            }
            (true, None) => {
                return Err(Error::definite("delivery.guarantee = \"exactly_once\" needs [state] backend = \"kafka\""))
            }
        };
        let publisher = Publisher::new(config, router, checkpointer.store().clone())?;
        let periodic = checkpointer.every(watermark.clone(), checkpoint_interval(config));
        Ok(Run {
            config,
            source,
            sink,
            publisher,
            watermark,
            checkpointer,
            periodic,
            shutdown,
            closed: None,
            partial: false,
        })
    }

    /// Hands no record to the producer once `lease` is no longer provably held.
    pub(super) fn publish_while(&mut self, lease: crate::lease::Holding) {
        self.sink.publish_while(lease);
    }

    /// Declares `start` (durable already) as where the stream phase begins.
    pub(super) fn begin_stream(&self, start: &Mark) {
        self.watermark.reset(start.clone());
        self.checkpointer.already_saved(start.clone());
    }

    /// The stream phase: reads `reader` from `start` (declared with [`Run::begin_stream`]) until shutdown,
    /// the end of binlog files or the first error, then settles.
    ///
    /// # Errors
    /// The error that ended the phase, or a failed final checkpoint.
    pub(super) async fn stream(&mut self, start: &Mark, reader: SourceReader, overlap: Option<Overlap>) -> Result<()> {
        let mut reader = ReadAhead::spawn(reader, self.config.source.read_ahead_bytes);
        health().set_source_connected(true);
        self.publisher.resume(ResumePoint::Stream(&start.position));
        let mut stream = StreamState { current: None, start: None, overlap, row_index: 0 };
        let result = self.read_and_produce(&mut reader, &mut stream).await;
        drop(reader);
        if let Some(tx) = stream.current.take() {
            self.watermark.abandon(tx);
            self.partial = true;
        }
        self.settle(result).await.map(|_| ())
    }

    /// Records produced and not yet acknowledged.
    pub(super) fn unsettled(&self) -> u64 {
        self.watermark.unsettled()
    }

    /// After a phase: waits for acknowledgements (briefly after a failure), writes the final checkpoint,
    /// and returns the watermark's mark.
    pub(super) async fn settle(&mut self, result: Result<()>) -> Result<Option<Mark>> {
        if self.sink.is_transactional() {
            return self.settle_transaction(result).await;
        }
        let (sink, watermark, checkpointer) = (&self.sink, &self.watermark, &self.checkpointer);
        let limit = if result.is_ok() { SHUTDOWN_GRACE } else { FAILURE_DRAIN };
        let deadline = Instant::now() + limit;
        let step = checkpoint_interval(self.config);
        // Keep checkpointing while acknowledgements arrive: a crash during a long drain keeps its progress.
        let drained = loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if sink.drain(step.min(remaining)).await {
                break true;
            }
            checkpointer.flush(watermark)?;
            if remaining.is_zero() || watermark.failed() {
                break false;
            }
        };
        if !drained {
            tracing::warn!(
                unsettled = watermark.unsettled(),
                "records not acknowledged in time; they will be produced again after restart"
            );
            sink.abort();
        }
        crate::failpoint!("shutdown_drained");
        let flushed = checkpointer.flush(watermark);
        let mark = watermark.mark();
        if let Some(mark) = &mark {
            tracing::info!(position = %mark.position, "checkpoint");
        }
        result.and(flushed)?;
        if let Some(error) = watermark.take_failure() {
            return Err(error);
        }
        // A snapshot stopped early (shutdown) is not done: report it as not finished.
        Ok(mark.filter(|m| m.snapshot.as_ref().is_none_or(|s| s.done)))
    }

    /// [`Run::settle`] with `exactly_once`: commits the open Kafka transaction with the last closed mark
    /// after a phase that ended well, aborts it after a failure or when it holds records of a transaction
    /// that did not close (none of them becomes visible; they are read again after the restart). Returns
    /// the committed mark.
    async fn settle_transaction(&mut self, result: Result<()>) -> Result<Option<Mark>> {
        let commit_now = result.is_ok() && !self.watermark.failed() && !self.partial;
        let mut committed = Ok(());
        match (commit_now, self.closed.take()) {
            (true, Some(mark)) => committed = commit(&mut self.sink, &self.checkpointer, &mark).await,
            (true, None) => committed = self.sink.finish_commit().await,
            (false, _) => {
                if self.partial && result.is_ok() {
                    tracing::info!("aborting the Kafka transaction: it holds part of a source transaction; both are read again after restart");
                }
                self.sink.abort_transaction().await;
            }
        }
        self.partial = false;
        crate::failpoint!("shutdown_drained");
        // A failed commit aborted its transaction already (`KafkaSink::commit`).
        let mark = self.checkpointer.saved();
        if let Some(mark) = &mark {
            tracing::info!(position = %mark.position, "checkpoint (committed with its events)");
        }
        result.and(committed)?;
        if let Some(error) = self.watermark.take_failure() {
            return Err(error);
        }
        Ok(mark.filter(|m| m.snapshot.as_ref().is_none_or(|s| s.done)))
    }

    /// Scans the outbox tables in one consistent view and produces every row; ends with the watermark's
    /// last mark saying `done` once everything is acknowledged (see [`crate::source::snapshot`]).
    pub(super) async fn snapshot(&mut self, info: &ServerInfo, progress: Option<SnapshotState>) -> Result<()> {
        let Run { config, source, sink, publisher, watermark, checkpointer, periodic, shutdown, closed, partial } =
            self;
        let tables = config.tables().to_vec();
        if let Some(progress) = &progress {
            progress.check_tables(&tables).map_err(Error::definite)?;
        }
        let after = progress.as_ref().and_then(|p| p.last_key.clone());
        let (mut scanner, view) = snapshot::open(source, info, config, after.clone()).await?;
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
                }
            }
        };
        let cut = state.cut().clone();
        publisher.resume(ResumePoint::Snapshot { rows_done: state.rows_done });
        // The new segment must be durable before any of its rows is produced: a crash must not resume
        // with a segment list that misses the view those rows came from.
        checkpointer.save_now(Mark::boundary(cut.clone(), Some(Arc::new(state.clone()))))?;
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
                        *partial = true;
                        return Ok(());
                    }
                }
                crate::failpoint!("snapshot_row");
            }
            state.rows_done += chunk.rows.len() as u64;
            state.last_key = Some(chunk.last_key);
            progress_bar.set(state.rows_done);
            metrics().snapshot_progress(state.rows_done, state.rows_estimate);
            let mark = Mark::boundary(cut.clone(), Some(Arc::new(state.clone())));
            watermark.close(tx, mark.clone());
            if sink.is_transactional() {
                if sink.commit_due(checkpoint_interval(config)) {
                    start_commit(sink, checkpointer, &mark).await?;
                    *closed = None;
                } else {
                    *closed = Some(mark);
                }
            }
        }
        state.done = true;
        let tx = watermark.open();
        let mark = Mark::boundary(cut, Some(Arc::new(state.clone())));
        watermark.close(tx, mark.clone());
        if sink.is_transactional() {
            *closed = Some(mark);
        }
        progress_bar.finish(state.rows_done);
        tracing::info!(rows = state.rows_done, "snapshot read; waiting for the last acknowledgements");
        Ok(())
    }

    async fn read_and_produce(&mut self, reader: &mut ReadAhead, stream: &mut StreamState) -> Result<()> {
        let Run { config, sink, publisher, watermark, checkpointer, periodic, shutdown, closed, .. } = self;
        let interval = checkpoint_interval(config);
        // Made once and polled by reference: a fresh shutdown future per change was measurable at 100k/s.
        let mut requested = std::pin::pin!(shutdown.requested());
        let mut grace = std::pin::pin!(shutdown.grace_expired());
        // A failed delivery ends the run at once, also while the source is idle.
        let delivery_failed = sink.failure_notice();
        loop {
            if let Some(error) = watermark.take_failure().or_else(|| periodic.failure()) {
                return Err(error);
            }
            let stopping = shutdown.is_requested();
            if stopping && stream.current.is_none() {
                // Between transactions (also when requested before this loop first ran, e.g. during the
                // snapshot): nothing to finish.
                return Ok(());
            }
            // exactly_once: records wait in an open Kafka transaction; commit it once due, also while the
            // source is idle (between source transactions only).
            let commit_at = match stream.current {
                None => sink.open_transaction_due_at(interval),
                Some(_) => None,
            };
            // A commit that returned is finished here too: while changes flow, the biased select below
            // may not poll its branch (a stream of transactions without outbox rows sends nothing).
            if sink.commit_has_returned() {
                sink.finish_commit().await?;
            }
            let committing = sink.is_committing();
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
                        if sink.is_transactional() && stream.current.is_some() {
                            // Its records are in the open Kafka transaction: abort it, restart from the commit.
                            return Err(Error::transient(
                                "a source transaction was cut off and begins again: the Kafka transaction holding \
                                 its first records is aborted and the run restarts from the last commit",
                            ));
                        }
                        if let Some(tx) = stream.current.replace(watermark.open()) {
                            watermark.abandon(tx);
                        }
                        stream.start = Some(start);
                        stream.row_index = 0;
                    }
                    Some(change @ (Change::Row(_) | Change::Undecodable(_))) => {
                        if let (Change::Row(row), Some(overlap), Some(start)) =
                            (&change, stream.overlap.as_mut(), stream.start.as_ref())
                        {
                            if overlap.emitted_by_snapshot(row, start).await? {
                                tracing::debug!(id = %row.id, "already emitted by the snapshot");
                                continue;
                            }
                        }
                        crate::failpoint!("before_produce");
                        let tx = *stream.current.get_or_insert_with(|| watermark.open());
                        let origin = || stream.origin();
                        let row = match &change {
                            Change::Row(row) => SourceRow::Decoded(row),
                            Change::Undecodable(bad) => SourceRow::Undecodable(bad),
                            _ => unreachable!("matched above"),
                        };
                        let prepared = publisher.prepare(row, origin, |r| sink.fits(r))?;
                        stream.row_index += 1;
                        tokio::select! {
                            sent = sink.send(tx, prepared.record, prepared.occurred_at_ms) => sent?,
                            _ = &mut grace => {
                                tracing::warn!("Kafka did not accept records within the shutdown grace period");
                                return Ok(());
                            }
                        }
                        crate::failpoint!("row_produced");
                        reader.recycle(change);
                    }
                    Some(Change::Commit { position, timestamp, end_event }) => {
                        metrics().transaction_read(timestamp);
                        let tx = stream.current.take().unwrap_or_else(|| watermark.open());
                        if stream.overlap.as_ref().is_some_and(|o| o.expired(&position)) {
                            tracing::info!("stream is past every snapshot view: overlap rule retired");
                            stream.overlap = None;
                        }
                        let snapshot = stream.overlap.as_ref().map(|o| o.state().clone());
                        let timestamp = (timestamp != 0).then_some(timestamp);
                        let mark = Mark { position, timestamp, end_event, snapshot };
                        if sink.is_transactional() {
                            watermark.close(tx, mark.clone());
                            if sink.commit_due(interval) {
                                start_commit(sink, checkpointer, &mark).await?;
                                *closed = None;
                            } else {
                                *closed = Some(mark);
                            }
                        } else {
                            watermark.close(tx, mark);
                        }
                        if stopping {
                            return Ok(());
                        }
                    }
                },
                _ = sleep_until(commit_at), if commit_at.is_some() => {
                    if let Some(mark) = closed.take() {
                        start_commit(sink, checkpointer, &mark).await?;
                    }
                }
                // The commit started above returned: its checkpoint is saved, and records held meanwhile
                // go into the next transaction.
                _ = sink.commit_returned(), if committing => sink.finish_commit().await?,
                _ = &mut requested, if !stopping => if stream.current.is_some() {
                    tracing::info!("stopping after the current source transaction");
                },
                _ = delivery_failed.notified() => {}
            }
        }
    }
}

/// `exactly_once`: writes the checkpoint at `mark` into the open Kafka transaction and commits it, so that
/// the events before `mark` and the checkpoint that passes them become visible together; returns once it
/// committed.
///
/// # Errors
/// A definite error for a mark behind the last checkpoint; transient for a failed commit (aborted).
async fn commit(sink: &mut KafkaSink, checkpointer: &Arc<Checkpointer>, mark: &Mark) -> Result<()> {
    start_commit(sink, checkpointer, mark).await?;
    sink.finish_commit().await
}

/// [`commit`] without waiting for the broker: the run reads on while Kafka commits; the checkpoint counts
/// as saved once the commit returns ([`KafkaSink::finish_commit`]).
///
/// # Errors
/// As [`commit`], for the commit still running before this one.
async fn start_commit(sink: &mut KafkaSink, checkpointer: &Arc<Checkpointer>, mark: &Mark) -> Result<()> {
    let checkpoint = checkpointer.record(mark)?;
    let record = serde_json::to_vec(&checkpoint).expect("checkpoint serializes");
    let (checkpointer, mark) = (checkpointer.clone(), mark.clone());
    sink.start_commit(record, Box::new(move || checkpointer.committed(mark, &checkpoint))).await
}

/// Sleeps until `at`; never returns for `None` (a disabled `select!` branch still builds its future).
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// How often the acknowledged mark is written.
fn checkpoint_interval(config: &Config) -> Duration {
    Duration::from_millis(config.state.checkpoint_interval_ms)
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
}

impl StreamState {
    /// Where the next row of the current transaction was read.
    fn origin(&self) -> Origin {
        let (gtid, file, position) = match &self.start {
            Some(start) => (start.gtid.as_ref().map(|g| g.to_string()), start.coord.file.clone(), start.coord.pos),
            None => (None, String::new(), 0),
        };
        Origin { snapshot: false, gtid, file, position, row_index: self.row_index }
    }
}
