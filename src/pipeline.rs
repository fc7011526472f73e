//! One run of the streaming pipeline: from the last checkpoint until shutdown or the first error.
//!
//! ```text
//!  binlog ─► BinlogReader ─► ReadAhead ═batches═► Router ─► KafkaSink ─► librdkafka ─► broker
//!       (own task: read, decode)   │ Begin/Commit         │ register        │ ack
//!                                  └─────────────► Watermark ◄─┘◄── Delivered ─┘
//!                                                      │ every checkpoint_interval_ms
//!                                                      ▼
//!                                   Checkpointer (blocking pool) ─► Store (redb, fsync)
//! ```
//!
//! Two stages on two tasks: the reader decodes ahead into batches bounded in bytes
//! ([`read_ahead`]), the pipeline's task routes and produces. The sink's byte budget is the one place that
//! waits, and the read-ahead budget passes that back-pressure on to the binlog socket. Checkpoints are
//! written off both tasks ([`checkpointer`]), so neither ever waits for an fsync. librdkafka's threads do
//! the network I/O and call back with acknowledgements. The reader is the critical stage of a catch-up, so
//! the pipeline's thread and librdkafka's do not preempt it when they wake ([`crate::scheduling`]).
//!
//! # Error handling
//! Any error ends the run. The transaction being read is abandoned (it will be read again), in-flight
//! records get a short chance to be acknowledged, and the watermark is checkpointed: it never includes
//! anything unacknowledged, so restarting from it loses nothing. Transient errors are retried by
//! [`crate::app`]; definite ones stop the process.
//!
//! # Graceful shutdown
//! On SIGINT/SIGTERM the reader stops at the next transaction boundary (finishing the current transaction
//! for up to [`SHUTDOWN_GRACE`]), waits for every record to be acknowledged, writes a final checkpoint and
//! returns: a restart then neither loses nor repeats an event.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::checkpoint::{Mark, Store, TxId, Watermark};
use crate::config::Config;
use crate::config::{SnapshotMode, SourceKind};
use crate::error::{Error, Result};
use crate::health::health;
use crate::metrics::metrics;
use crate::poison::{Origin, ResumePoint};
use crate::position::snapshot::{Segment, SnapshotState};
use crate::position::TxStart;
use crate::publish::{Publisher, SourceRow};
use crate::router::Router;
use crate::sink::KafkaSink;
use crate::source::binlog::{BinlogReader, Change, ReaderSettings};
use crate::source::overlap::Overlap;
use crate::source::snapshot;
use crate::source::{preflight, server_info, start_position, SourceConn, SourceReader};

mod files;
mod read_ahead;

use crate::checkpoint::checkpointer::{self, Checkpointer};
use read_ahead::ReadAhead;

/// How long a graceful stop waits for the current transaction to finish and for acknowledgements.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
/// How long a failed run waits for in-flight acknowledgements before giving up on them.
const FAILURE_DRAIN: Duration = Duration::from_secs(5);

/// A shutdown signal: when it was requested, if it was.
#[derive(Debug, Clone)]
pub struct Shutdown {
    rx: watch::Receiver<Option<Instant>>,
    /// Set with the watch value: polled per change without the watch's lock.
    requested: Arc<AtomicBool>,
}

/// Triggers a [`Shutdown`].
#[derive(Debug)]
pub struct ShutdownTrigger {
    tx: watch::Sender<Option<Instant>>,
    requested: Arc<AtomicBool>,
}

impl ShutdownTrigger {
    /// Requests shutdown (idempotent).
    pub fn trigger(&self) {
        self.requested.store(true, Ordering::Release);
        self.tx.send_if_modified(|at| {
            if at.is_none() {
                *at = Some(Instant::now());
                true
            } else {
                false
            }
        });
    }
}

impl Shutdown {
    /// A new signal and its trigger.
    pub fn new() -> (ShutdownTrigger, Shutdown) {
        let (tx, rx) = watch::channel(None);
        let requested = Arc::new(AtomicBool::new(false));
        (ShutdownTrigger { tx, requested: requested.clone() }, Shutdown { rx, requested })
    }

    /// Whether shutdown was requested (cheap).
    pub fn is_requested(&self) -> bool {
        self.requested.load(Ordering::Acquire)
    }

    /// When shutdown was requested.
    pub fn requested_at(&self) -> Option<Instant> {
        *self.rx.borrow()
    }

    /// Resolves once shutdown is requested.
    pub async fn requested(&self) {
        let mut rx = self.rx.clone();
        let _ = rx.wait_for(Option::is_some).await;
    }

    /// Resolves [`SHUTDOWN_GRACE`] after shutdown was requested.
    pub async fn grace_expired(&self) {
        self.requested().await;
        let at = self.requested_at().expect("requested");
        tokio::time::sleep_until((at + SHUTDOWN_GRACE).into()).await;
    }
}

/// Everything a run needs that outlives it.
pub struct Pipeline {
    /// Validated configuration.
    pub config: Arc<Config>,
    /// How to reach the source.
    pub source: SourceConn,
    /// Row → record.
    pub router: Router,
    /// Reader settings.
    pub reader: Arc<ReaderSettings>,
    /// Checkpoint store.
    pub store: Arc<Store>,
    /// Resume even when the checkpoint belongs to another server (`--accept-new-server`).
    pub accept_new_server: bool,
}

/// What the stream starts from.
enum Plan {
    /// Resume or begin the snapshot (progress so far), then stream from its cut.
    Snapshot(Option<SnapshotState>),
    /// Stream from a position, with a finished snapshot's overlap rule if still in force.
    Stream(Mark),
}

impl Pipeline {
    /// Runs until shutdown (Ok) or the first error.
    ///
    /// # Errors
    /// Transient errors are worth a retry; definite ones are not.
    pub async fn run(&self, shutdown: &Shutdown) -> Result<()> {
        let result = self.run_once(shutdown).await;
        if let Err(error) = &result {
            health().pipeline_failed(error);
            if let Err(e) = self.store.set_last_error(error) {
                tracing::warn!(error = %e, "cannot record the last error in the state store");
            }
            if let Some(refused) = error.refused() {
                // Remembered durably: after the restart this event takes the dead-letter path.
                self.store.add_known_poison(refused)?;
            }
        }
        result
    }

    async fn run_once(&self, shutdown: &Shutdown) -> Result<()> {
        let config = &self.config;
        if config.source.kind == SourceKind::Files {
            return self.run_files(shutdown).await;
        }
        let mut conn = self.source.connect().await?;
        let info = server_info(&mut conn).await?;
        let stored = self.store.load()?;
        let mut checked = None;
        if let Some(cp) = &stored {
            if *cp.server() != info.identity && self.accept_new_server {
                tracing::warn!(
                    checkpoint_server = %preflight::describe_identity(&cp.server()),
                    server = %preflight::describe_identity(&info.identity),
                    "resuming a checkpoint of another server (--accept-new-server)"
                );
            }
            let resume = preflight::Resume {
                server: if self.accept_new_server { &info.identity } else { &cp.server() },
                position: &cp.position(),
                // Another server's files are its own: nothing there to compare the checkpoint's last event with.
                end_event: cp.end_event().filter(|_| *cp.server() == info.identity),
            };
            checked = Some(preflight::ResumeCheck::run(&mut conn, &info, config, resume).await?);
        }
        let mut snapshot_again = false;
        if let (Some(checked), SnapshotMode::WhenNeeded) = (&checked, config.snapshot.mode) {
            if let Some(e) = checked.unresumable()? {
                tracing::error!(
                    error = %e,
                    "the checkpoint cannot be resumed on this server; taking a new snapshot \
                     (snapshot.mode = \"when_needed\"). Events committed since the checkpoint are recovered \
                     from the table; rows already deleted from it are not"
                );
                snapshot_again = true;
            }
        }
        let checked = checked.filter(|_| !snapshot_again);
        let report = preflight::check(&mut conn, &info, config, checked.as_ref()).await?;
        for finding in report.findings.iter().filter(|f| f.status == preflight::Status::Warn) {
            tracing::warn!(setting = %finding.setting, actual = %finding.actual, fix = %finding.fix, "preflight warning");
        }
        report.into_result()?;
        let stored = stored.filter(|_| !snapshot_again);

        let checkpointer = Checkpointer::new(self.store.clone(), info.identity.clone());
        let plan = match stored {
            Some(cp) => match cp.snapshot() {
                Some(state) if !state.done => Plan::Snapshot(Some(state.clone())),
                _ => Plan::Stream(cp.into_mark()),
            },
            None if config.snapshot.mode == SnapshotMode::Never => {
                let position = start_position(&mut conn, &info, config).await?;
                tracing::info!(%position, start_from = ?config.source.start_from, "no checkpoint: starting fresh");
                // Store the start point at once: a crash before the first acknowledgement must resume
                // here, not at a later "current" position that would skip what was committed meanwhile.
                let mark = Mark::boundary(position, None);
                checkpointer.save_now(mark.clone())?;
                Plan::Stream(mark)
            }
            None => Plan::Snapshot(None),
        };
        drop(conn);

        let watermark = Arc::new(Watermark::new(None));
        let mut sink = KafkaSink::new(&config.kafka, watermark.clone())?;
        let mut publisher = Publisher::new(config, self.router.clone(), self.store.clone())?;
        let mut periodic = checkpointer.every(watermark.clone(), self.checkpoint_interval());
        let start = match plan {
            Plan::Stream(mark) => Some(mark),
            Plan::Snapshot(progress) => {
                let result = self
                    .snapshot(
                        &info,
                        progress,
                        &mut sink,
                        &mut publisher,
                        &watermark,
                        &checkpointer,
                        &mut periodic,
                        shutdown,
                    )
                    .await;
                let done = self.settle(result, &sink, &watermark, &checkpointer).await?;
                match done {
                    Some(mark) if config.snapshot.mode != SnapshotMode::InitialOnly => Some(mark),
                    Some(_) => {
                        tracing::info!("snapshot complete (snapshot.mode = \"initial_only\"): exiting");
                        None
                    }
                    None if shutdown.requested_at().is_some() => None,
                    None => {
                        return Err(Error::transient(
                            "the snapshot's last records were not acknowledged in time; resuming it",
                        ))
                    }
                }
            }
        };
        let Some(start) = start else { return Ok(()) };
        if config.snapshot.mode == SnapshotMode::InitialOnly && start.snapshot.as_ref().is_none_or(|s| s.done) {
            tracing::info!("snapshot already complete (snapshot.mode = \"initial_only\"): nothing to do");
            return Ok(());
        }

        watermark.reset(start.clone());
        checkpointer.already_saved(start.clone());
        let overlap = match &start.snapshot {
            Some(state) => {
                Overlap::new(state.clone(), &self.source, config.tables().to_vec(), &config.outbox.columns).await?
            }
            None => None,
        };
        let reader = SourceReader::Live(
            BinlogReader::start(&self.source, &info, self.reader.clone(), start.position.clone()).await?,
        );
        let mut reader = ReadAhead::spawn(reader, config.source.read_ahead_bytes);
        health().set_source_connected(true);
        tracing::info!(
            position = %start.position,
            server = %preflight::describe_identity(&info.identity),
            version = %info.version,
            "streaming"
        );
        publisher.resume(ResumePoint::Stream(&start.position));
        let mut stream = StreamState { current: None, start: None, overlap, row_index: 0 };
        let result =
            self.stream(&mut reader, &mut sink, &mut publisher, &watermark, &mut periodic, &mut stream, shutdown).await;
        drop(reader);
        if let Some(tx) = stream.current.take() {
            watermark.abandon(tx);
        }
        self.settle(result, &sink, &watermark, &checkpointer).await.map(|_| ())
    }

    /// After a phase: waits for acknowledgements (briefly after a failure), writes the final checkpoint,
    /// and returns the watermark's mark.
    async fn settle(
        &self,
        result: Result<()>,
        sink: &KafkaSink,
        watermark: &Watermark,
        checkpointer: &Checkpointer,
    ) -> Result<Option<Mark>> {
        let limit = if result.is_ok() { SHUTDOWN_GRACE } else { FAILURE_DRAIN };
        let deadline = Instant::now() + limit;
        let step = self.checkpoint_interval();
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

    /// Scans the outbox tables in one consistent view and produces every row; ends with the watermark's
    /// last mark saying `done` once everything is acknowledged (see [`crate::source::snapshot`]).
    #[allow(clippy::too_many_arguments)] // the run's moving parts, each borrowed for the phase
    async fn snapshot(
        &self,
        info: &crate::source::ServerInfo,
        progress: Option<SnapshotState>,
        sink: &mut KafkaSink,
        publisher: &mut Publisher,
        watermark: &Watermark,
        checkpointer: &Checkpointer,
        periodic: &mut checkpointer::Periodic,
        shutdown: &Shutdown,
    ) -> Result<()> {
        let config = &self.config;
        let tables = config.tables().to_vec();
        if let Some(progress) = &progress {
            progress.check_tables(&tables).map_err(Error::definite)?;
        }
        let after = progress.as_ref().and_then(|p| p.last_key.clone());
        let (mut scanner, view) = snapshot::open(&self.source, info, config, after.clone()).await?;
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
                    _ = &mut grace => return Ok(()),
                }
                crate::failpoint!("snapshot_row");
            }
            state.rows_done += chunk.rows.len() as u64;
            state.last_key = Some(chunk.last_key);
            progress_bar.set(state.rows_done);
            metrics().snapshot_progress(state.rows_done, state.rows_estimate);
            watermark.close(tx, Mark::boundary(cut.clone(), Some(Arc::new(state.clone()))));
        }
        state.done = true;
        let tx = watermark.open();
        watermark.close(tx, Mark::boundary(cut, Some(Arc::new(state.clone()))));
        progress_bar.finish(state.rows_done);
        tracing::info!(rows = state.rows_done, "snapshot read; waiting for the last acknowledgements");
        Ok(())
    }

    #[allow(clippy::too_many_arguments)] // the run's moving parts, each borrowed for the phase
    async fn stream(
        &self,
        reader: &mut ReadAhead,
        sink: &mut KafkaSink,
        publisher: &mut Publisher,
        watermark: &Watermark,
        periodic: &mut checkpointer::Periodic,
        stream: &mut StreamState,
        shutdown: &Shutdown,
    ) -> Result<()> {
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
                        watermark.close(tx, Mark { position, timestamp, end_event, snapshot });
                        if stopping {
                            return Ok(());
                        }
                    }
                },
                _ = &mut requested, if !stopping => if stream.current.is_some() {
                    tracing::info!("stopping after the current source transaction");
                },
                _ = delivery_failed.notified() => {}
            }
        }
    }
}

impl Pipeline {
    fn checkpoint_interval(&self) -> Duration {
        Duration::from_millis(self.config.state.checkpoint_interval_ms)
    }
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

/// Exponential back-off between transient failures, capped, reset after a healthy run.
#[derive(Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    current: Duration,
}

impl Backoff {
    /// A back-off starting at `initial` and doubling up to `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Backoff { initial, max, current: initial }
    }

    /// The next delay.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.current;
        self.current = (self.current * 2).min(self.max);
        delay
    }

    /// Back to the initial delay.
    pub fn reset(&mut self) {
        self.current = self.initial;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_caps_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(350));
        let seq: Vec<u128> = (0..4).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(seq, [100, 200, 350, 350]);
        b.reset();
        assert_eq!(b.next_delay().as_millis(), 100);
    }
}
