//! One run of the polling relay (`source.kind = "poll"`): read unpublished rows in order, publish them,
//! and mark each batch published once Kafka acknowledged all of it, while the next batches are read and
//! produced.
//!
//! Floor 5 (docs/ARCHITECTURE.md): imports floors 0-4, and the pipeline's shutdown and signals.
//!
//! The reads, the order and the gaps are in [`super::reads`] and [`super::gaps`]; rows become records
//! through the same [`Publisher`] (router, dead letters) and [`KafkaSink`] as the binlog source's. There is
//! no checkpoint: `published_at` is the relay's progress, written only after every record of the batch (and
//! of every batch before it) was acknowledged. A run starts reading from the first unpublished row, so a
//! crash republishes what was produced and not yet marked: the rows in flight, which the run keeps at or
//! below [`UNMARKED_READS`] reads' worth (`poll.batch_rows` each; 32,000 rows by default) by reading nothing
//! more until marks come back ([`PollRun::room`]).
//!
//! # Who publishes
//! Only the holder of the lease ([`crate::lease`], taken in [`crate::app`]): the sink refuses every record
//! once the lease is not provably held, and the app stops the run when it is lost. Every write into the
//! tables checks the lease too, on the server, row by row ([`super::fence`]), and the marker task ends with
//! the run: a relay that lost its lease writes nothing its successor could have to undo. Like the binlog
//! sink's, the producer never gives up on a record (`message.timeout.ms = 0`): a record given up while later
//! ones of its partition land would come back after them on the retry, out of order. So records a paused
//! relay had handed over and not yet sent can still land after its successor's when it resumes: duplicates of
//! its last batches, each a step back for a consumer that applies events in order.
//!
//! `poll.transactional` closes that gap with Kafka's own fencing. The relays of a connector share one
//! `transactional.id`; the run's producer starts with `init_transactions`, which aborts the transaction
//! the relay before it left open and fences that relay's producer, so nothing it sends after the
//! takeover is written. Its records are produced in transactions that commit back to back (each holds
//! what was produced while the one before committed, [`super::commit`]), and a batch is marked only once
//! the transaction holding it committed: a `read_committed` consumer sees each row's record once the row
//! is, or is about to be, marked, and never a fenced relay's.
//!
//! # Errors
//! - A delivery failure ends the run; nothing is written for it (an outage, a timeout, a restart never
//!   counts against a row). The next run reads again from the first unpublished row.
//! - A record the broker refused for good (`Error::refused_record`) also ends the run: its row's `attempts`
//!   and `last_error` record the refusal, and the pipeline remembers the event as poison, so the next run
//!   dead-letters it, parks its row and holds its aggregate.
//!
//! # Load on the database
//! Per batch: the read, the read of the sequence gaps when there are any (and, while some wait for their
//! proof, a listing of the open writers at most every 250 ms: [`super::gaps`]), and one `UPDATE` marking
//! every batch acknowledged since the last one, as ranges of sequence numbers. Every [`COUNTER_CHECK_EVERY`]
//! a read of each table's sequence counter ([`super::counter`]) and the proof of the reading connection's
//! server ([`super::server`]). The marks go through a second connection ([`super::marker`]), so reading and
//! producing never wait for them; a row stays in flight (and no read takes it for a new one) until its mark
//! returned. Idle: one read per `poll.poll_interval_ms`; every [`FULL_SWEEP_EVERY`] a sweep of the
//! unpublished rows' keys; with parked rows, one read of them every [`BACKLOG_EVERY`].
//! `outbox_cdc_poll_queries_total` counts them by kind.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mysql_async::{Conn, Value};

use super::columns::OrderKey;
use super::commit::RelayCommit;
use super::counter::{fresh_counters, COUNTER_CHECK_EVERY};
use super::fence::Fence;
use super::ledger::Ledger;
use super::marker::{MarkRequest, MarkerTask};
use super::proof::require_listing;
use super::ranges::{GapProof, Gaps};
use super::server;
use super::table::{key_bytes, sequence_value, Aggregate, Polled, Position, Relay, FULL_SWEEP_EVERY};
use crate::checkpoint::{Store, TxId, Watermark};
use crate::config::Config;
use crate::error::{Error, Kind, Result};
use crate::health::health;
use crate::lease::Holding;
use crate::metrics::metrics;
use crate::pipeline::signals::{poll_running, SignalledPause, SIGNAL_POLL_EVERY};
use crate::pipeline::Shutdown;
use crate::publish::{Publisher, SourceRow};
use crate::quarantine::headers;
use crate::router::Router;
use crate::sink::KafkaSink;
use crate::source::SourceConn;

/// How often the relay counts its backlog (`outbox_cdc_poll_backlog_rows`) while it is busy, and reads
/// which aggregates are parked while some are (a `quarantine release` lifts a hold that way).
pub const BACKLOG_EVERY: Duration = Duration::from_secs(10);

/// Batches produced and not yet acknowledged, at most; past it the relay waits for acknowledgements.
const MAX_PENDING_BATCHES: usize = 32;

/// Rows produced and not yet marked (or passed by the number), at most, in reads' worth (`poll.batch_rows`):
/// what a crash publishes again. Past it the relay reads nothing until marks come back.
pub const UNMARKED_READS: usize = 32;

/// A row handed to the producer.
pub(super) struct Sent {
    pub(super) key: Value,
    pub(super) key_bytes: Vec<u8>,
    pub(super) seq: Option<u64>,
    pub(super) event_id: Option<String>,
    pub(super) aggregate: Aggregate,
    /// Why it was dead-lettered, when it was: parked once acknowledged.
    pub(super) dead: Option<String>,
    /// `[poll] progress_table`: its `published_at` is (or is about to be) `HELD_AT`, so it is marked on
    /// its own once acknowledged, wherever the number is.
    pub(super) held_at: bool,
}

/// The rows of one table produced together.
pub(super) struct Batch {
    pub(super) tx: TxId,
    pub(super) t: usize,
    pub(super) rows: Vec<Sent>,
}

/// What a run knows of one table.
#[derive(Default)]
pub(super) struct TableState {
    /// The position of the last row read in order; `None` before the first.
    pub(super) cursor: Option<Position>,
    /// Sequence numbers a read passed without a row (sequence order only), read again until filled or
    /// proven ([`super::gaps`]).
    pub(super) gaps: Gaps,
    /// Aggregates a parked row holds, or a dead letter in flight.
    pub(super) held: HashSet<Aggregate>,
    /// Of those, the ones whose dead letter is not yet acknowledged (and so not yet parked).
    pub(super) parking: HashSet<Aggregate>,
    /// Keys of the rows produced and not yet marked.
    pub(super) in_flight: HashSet<Vec<u8>>,
    /// When all unpublished rows below the cursor were last looked at.
    pub(super) swept_at: Option<Instant>,
}

/// The parts of a relay run.
pub(super) struct PollRun<'a> {
    pub(super) config: &'a Config,
    pub(super) router: Router,
    pub(super) store: Arc<Store>,
    pub(super) relay: Arc<Relay>,
    pub(super) conn: Conn,
    /// To the marker task; `None` once the run closed it.
    pub(super) marks: Option<tokio::sync::mpsc::Sender<MarkRequest>>,
    /// From the marker task: the rows it marked.
    pub(super) marked: tokio::sync::mpsc::UnboundedReceiver<(usize, Vec<Vec<u8>>)>,
    pub(super) marker: MarkerTask,
    pub(super) sink: KafkaSink,
    pub(super) publisher: Publisher,
    pub(super) watermark: Arc<Watermark>,
    pub(super) shutdown: &'a Shutdown,
    pub(super) tables: Vec<TableState>,
    pub(super) pending: VecDeque<Batch>,
    /// When its records count as published: acknowledged, or (`poll.transactional`) committed.
    pub(super) commits: RelayCommit,
    /// What is published beyond each row's mark (`[poll] progress_table`).
    pub(super) ledger: Ledger,
    /// The proof under way that gaps hold what they will ever hold.
    pub(super) proof: GapProof,
}

/// Runs the relay until shutdown (Ok) or the first error.
///
/// # Errors
/// Transient errors are worth a retry; definite ones are not.
pub async fn run(
    config: &Config,
    source: &SourceConn,
    router: Router,
    store: Arc<Store>,
    lease: Option<Holding>,
    shutdown: &Shutdown,
    pause: &SignalledPause,
) -> Result<()> {
    let ignored = config.poll.ignored_keys();
    if !ignored.is_empty() {
        tracing::warn!(keys = ?ignored, "[poll] keys that no longer do anything (see README, the polling relay): remove them");
    }
    let mut conn = source.connect().await?;
    // Every connection of the run is proven to reach the lease's server before it reads or writes.
    let fence = Fence::for_run(&mut conn, lease.clone()).await?;
    let progress = config.poll.progress.table();
    server::prove(&mut conn, &fence, "reading", progress).await?;
    // What an earlier run left running marks its rows before anything is read, the number included.
    fence.drain(&mut conn, shutdown.requested()).await?;
    if shutdown.is_requested() {
        return Ok(());
    }
    fresh_counters(&mut conn).await?;
    require_listing(&mut conn).await?;
    let relay = Arc::new(Relay::load(&mut conn, config).await?.fenced(fence));
    // A sequence that started again below the progress table's number is refused before anything is read.
    for t in 0..relay.tables().len() {
        relay.counter_started_again(&mut conn, t, None).await?;
    }
    // The marks go through a connection of their own, so that reading and producing never wait for them.
    let (marks, requests) = tokio::sync::mpsc::channel(MAX_PENDING_BATCHES);
    let (done, marked) = tokio::sync::mpsc::unbounded_channel();
    // It ends when the run drops `marks`, and with the run; it writes only while the lease is this run's.
    let mut marker_conn = source.connect().await?;
    server::prove(&mut marker_conn, &relay.fence, "marking", progress).await?;
    relay.ready_marker(&mut marker_conn).await?;
    let marker = MarkerTask::spawn(relay.clone(), marker_conn, requests, done);
    let watermark = Arc::new(Watermark::new(None));
    let (commits, mut sink) = RelayCommit::start(config, &watermark, shutdown.kafka_deadline()).await?;
    if let Some(lease) = lease {
        sink.publish_while(lease);
    }
    let ledger = Ledger::of(&relay);
    let mut tables: Vec<TableState> = Vec::new();
    for t in 0..relay.tables().len() {
        let frontier = relay.frontier(t);
        let mut state = TableState::default();
        if frontier > 0 {
            // Everything up to it is published: the reads start after it.
            state.cursor = Some(vec![Value::UInt(frontier)]);
        }
        for (aggregate, _) in relay.parked_rows(&mut conn, t, None).await? {
            state.held.insert(aggregate);
        }
        // Rows the number passed while their aggregate was held: held until its parked rows are found
        // released (at once, when that happened while no relay ran).
        state.held.extend(relay.held_aggregates(&mut conn, t).await?);
        tables.push(state);
    }
    forget_lifted_holds(&store, &tables)?;
    let publisher = Publisher::new(config, router.clone(), store.clone())?;
    health().set_source_connected(true);
    tracing::info!(relay = relay.id(), tables = relay.tables().len(), "polling the outbox table");
    let mut run = PollRun {
        config,
        router,
        store,
        relay,
        conn,
        marks: Some(marks),
        marked,
        marker,
        sink,
        publisher,
        watermark,
        shutdown,
        tables,
        pending: VecDeque::new(),
        commits,
        ledger,
        proof: GapProof::default(),
    };
    let interval = config.poll.poll_interval;
    let mut idle_wait = interval / 16;
    let mut backlog_due = Instant::now();
    let mut counters_due = Instant::now() + COUNTER_CHECK_EVERY;
    let mut signals_due = Instant::now();
    let requested = shutdown.requested();
    tokio::pin!(requested);
    loop {
        if shutdown.is_requested() {
            return run.finish().await;
        }
        run.commits.commit(&mut run.sink, run.pending.back().map(|b| b.tx)).await?;
        run.settle().await?;
        if run.room() < 2 * config.poll.batch_rows {
            run.wait_for_room().await?;
            continue;
        }
        let mut busy = false;
        for t in 0..run.tables.len() {
            let room = run.room();
            busy |= run.poll_table(t, room).await?;
        }
        run.prove_gaps().await?;
        if Instant::now() >= counters_due {
            run.check_counters().await?;
            counters_due = Instant::now() + COUNTER_CHECK_EVERY;
        }
        if let Some(table) = config.signal_table().filter(|_| Instant::now() >= signals_due) {
            // A pause stops the run from the app (it waits for what is in flight, as a stop does).
            poll_running(&mut run.conn, table, &run.store, pause).await?;
            signals_due = Instant::now() + SIGNAL_POLL_EVERY;
        }
        if Instant::now() >= backlog_due {
            run.lift_released_holds().await?;
            // Idle with nothing held, nothing is unpublished: no statement needed to say so.
            if busy || run.tables.iter().any(|s| !s.held.is_empty()) {
                run.count_backlog().await?;
            } else {
                metrics().poll_backlog(0, 0.0);
            }
            backlog_due = Instant::now() + BACKLOG_EVERY;
        }
        if busy {
            idle_wait = interval / 16;
            if run.pending.len() >= MAX_PENDING_BATCHES {
                run.commits.wait_in_flight(&mut run.sink, Duration::from_millis(100)).await;
            }
            continue;
        }
        metrics().poll_idle();
        if !run.pending.is_empty() {
            // Nothing new: wait for what is in flight, then mark it.
            run.commits.wait_in_flight(&mut run.sink, idle_wait).await;
            continue;
        }
        tokio::select! {
            _ = tokio::time::sleep(idle_wait) => {}
            _ = &mut requested => return run.finish().await,
        }
        idle_wait = (idle_wait * 2).min(interval);
    }
}

/// Holds in the store whose aggregate no table parks any more were released by another relay (or its
/// rows were marked published by hand): removed, so that the publisher does not divert their rows.
pub(super) fn forget_lifted_holds(store: &Store, tables: &[TableState]) -> Result<bool> {
    let mut forgot = false;
    for hold in store.holds()? {
        let aggregate = (hold.aggregate_type.as_bytes().to_vec(), hold.aggregate_id.as_bytes().to_vec());
        if !tables.iter().any(|s| s.held.contains(&aggregate)) {
            store.remove_hold(&hold, &[])?;
            forgot = true;
        }
    }
    Ok(forgot)
}

impl PollRun<'_> {
    /// Rows this run may still produce before what a crash would publish again reaches its bound
    /// ([`UNMARKED_READS`] reads' worth): every row produced and not yet marked is in flight.
    pub(super) fn room(&self) -> usize {
        let in_flight: usize = self.tables.iter().map(|s| s.in_flight.len()).sum();
        (UNMARKED_READS * self.config.poll.batch_rows).saturating_sub(in_flight)
    }

    /// Waits a moment for room ([`PollRun::room`]): for Kafka's acknowledgements, then for the marker to
    /// return what it marked; acknowledged rows waiting for the number are marked on their own at once.
    ///
    /// # Errors
    /// As [`PollRun::settle`]; the marker task's end.
    pub(super) async fn wait_for_room(&mut self) -> Result<()> {
        if !self.pending.is_empty() {
            self.commits.commit(&mut self.sink, self.pending.back().map(|b| b.tx)).await?;
            self.commits.wait_in_flight(&mut self.sink, Duration::from_millis(100)).await;
        }
        self.settle_with(true).await?;
        if self.room() >= 2 * self.config.poll.batch_rows {
            return Ok(());
        }
        match tokio::time::timeout(Duration::from_millis(100), self.marked.recv()).await {
            Ok(Some((t, keys))) => {
                for key in keys {
                    self.tables[t].in_flight.remove(&key);
                }
                Ok(())
            }
            Ok(None) => Err(self.marker_ended().await),
            Err(_) => Ok(()),
        }
    }

    /// One read of table `t` in order, of its gaps, and a sweep when due, and the rows found produced, at
    /// most `room` of them. Returns whether it found any.
    async fn poll_table(&mut self, t: usize, room: usize) -> Result<bool> {
        let fast = self.relay.read_after(&mut self.conn, t, self.tables[t].cursor.as_ref()).await?;
        let sequence = matches!(self.relay.tables()[t].order, OrderKey::Sequence(_));
        let read = self.tables[t].cursor.as_ref().and_then(|p| p.first()).and_then(sequence_value);
        let read = read.unwrap_or(0).max(self.relay.frontier(t));
        if sequence {
            self.note_gaps(t, &fast);
        }
        // After the read in order, not before: a row whose transaction committed before that read's
        // snapshot is seen by these later statements (module doc of `relay::gaps`).
        let room = room.saturating_sub(fast.len());
        let (mut late, mut complete) = if sequence { self.read_gaps(t, room).await? } else { (Vec::new(), true) };
        let sweep_due = !sequence || self.tables[t].swept_at.is_none_or(|at| at.elapsed() >= FULL_SWEEP_EVERY);
        if complete && sweep_due && self.tables[t].cursor.is_some() {
            let (swept, all) = self.sweep(t, room.saturating_sub(late.len())).await?;
            late.extend(swept);
            complete = all;
            if all {
                self.tables[t].swept_at = Some(Instant::now());
            }
        }
        if !complete {
            // The rows read in order wait for the next poll, with the gaps this read passed and the rows
            // found in them: no row may overtake a row not yet read.
            self.tables[t].gaps.forget_above(read);
            late.retain(|r| r.seq().is_some_and(|seq| seq <= read));
            late.sort_by_key(Polled::seq);
            self.produce(t, late.into_iter()).await?;
            return Ok(true);
        }
        if let Some(last) = fast.last() {
            self.tables[t].cursor = Some(last.position.clone());
        }
        if late.is_empty() && fast.is_empty() {
            return Ok(false);
        }
        // In sequence order one order for all: the gaps' rows below the read in order, and those in the gaps
        // it passed between its rows (committed since), each in its place.
        let mut rows = late;
        rows.extend(fast);
        if sequence {
            rows.sort_by_key(Polled::seq);
        }
        self.produce(t, rows.into_iter()).await?;
        Ok(true)
    }

    /// Produces `rows` of table `t` in order as one batch: rows of held aggregates and parked rows are left
    /// in the table; a row that becomes a dead letter holds its aggregate from there on.
    pub(super) async fn produce(&mut self, t: usize, rows: impl Iterator<Item = Polled>) -> Result<()> {
        let tx = self.watermark.open();
        let mut batch = Batch { tx, t, rows: Vec::new() };
        let result = self.produce_rows(t, tx, rows, &mut batch).await;
        self.watermark.abandon(tx);
        metrics().poll_claimed(batch.rows.len() as u64, 0);
        self.pending.push_back(batch);
        result
    }

    async fn produce_rows(
        &mut self,
        t: usize,
        tx: TxId,
        rows: impl Iterator<Item = Polled>,
        batch: &mut Batch,
    ) -> Result<()> {
        for polled in rows {
            let state = &mut self.tables[t];
            let key_bytes = key_bytes(&polled.key);
            if polled.parked {
                state.held.insert(polled.aggregate.clone());
            }
            // A row produced before its aggregate became held is in flight, published once acknowledged.
            if state.in_flight.contains(&key_bytes) {
                continue;
            }
            if state.held.contains(&polled.aggregate) {
                if !polled.held_at {
                    self.ledger.hold(t, polled.seq(), &key_bytes);
                }
                continue;
            }
            let row = match &polled.row {
                Ok(row) => SourceRow::Decoded(row),
                Err(bad) => SourceRow::Undecodable(bad),
            };
            let relay = &self.relay;
            let sink = &mut self.sink;
            let prepared = self.publisher.prepare(row, || relay.origin(t), |r| sink.fits(r))?;
            let dead = (prepared.record.topic == self.config.kafka.dead_letter_topic).then(|| {
                let header = |name: &str| {
                    prepared.record.headers.iter().find(|(k, _)| k == name).map(|(_, v)| String::from_utf8_lossy(v))
                };
                format!(
                    "{}: {}",
                    header(headers::KIND).unwrap_or_default(),
                    header(headers::REASON).unwrap_or_default()
                )
            });
            let send = sink.send(tx, prepared.record, prepared.occurred_at_ms);
            // The sink waits for in-flight budget while the broker is slow or away: a shutdown ends the wait.
            tokio::select! {
                sent = send => sent?,
                _ = self.shutdown.requested() => return Ok(()),
            }
            crate::failpoint!("poll_row_produced");
            let state = &mut self.tables[t];
            if dead.is_some() {
                state.held.insert(polled.aggregate.clone());
                state.parking.insert(polled.aggregate.clone());
            }
            state.in_flight.insert(key_bytes.clone());
            let held_at = polled.held_at || self.ledger.unhold(t, &key_bytes);
            let (event_id, seq) = (polled.id().map(String::from), polled.seq());
            let aggregate = polled.aggregate;
            batch.rows.push(Sent { key: polled.key, key_bytes, seq, event_id, aggregate, dead, held_at });
        }
        Ok(())
    }

    /// The marker task's end, as the run's error.
    pub(super) async fn marker_ended(&mut self) -> Error {
        self.marks = None;
        match self.marker.join().await {
            Err(error) => error,
            Ok(()) => Error::transient("poll: the marker task ended"),
        }
    }

    /// A delivery failed: nothing is counted against the rows, except a record the broker refused for good
    /// (its row's `attempts` and `last_error`). What is in flight is purged; the run ends with the failure.
    pub(super) async fn failed(&mut self, error: Error) -> Error {
        self.sink.abort();
        if let Kind::RecordRefused(refused) = error.kind() {
            let row = self.pending.iter().find_map(|b| {
                b.rows.iter().find(|r| r.event_id.as_deref() == Some(refused.id.as_str())).map(|r| (b.t, r.key.clone()))
            });
            if let Some((t, key)) = row {
                if let Err(e) = self.relay.refused(&mut self.conn, t, &key, &refused.message).await {
                    tracing::warn!(error = %e, "cannot record the refused record in its row");
                }
            }
        }
        error
    }

    /// Counts the unpublished rows of every table that are not parked, and the age of the first
    /// (`outbox_cdc_poll_backlog_rows`, `outbox_cdc_poll_oldest_due_seconds`).
    async fn count_backlog(&mut self) -> Result<()> {
        let (mut due, mut waited_s) = (0, 0.0f64);
        for t in 0..self.tables.len() {
            let (rows, seconds) = self.relay.backlog(&mut self.conn, t).await?;
            due += rows;
            waited_s = waited_s.max(seconds);
        }
        metrics().poll_backlog(due, waited_s);
        Ok(())
    }

    /// Graceful shutdown: waits up to [`crate::pipeline::SHUTDOWN_GRACE`] for what is in flight ([`RelayCommit::finish`]), marks it, and returns.
    async fn finish(&mut self) -> Result<()> {
        let acknowledged = self.commits.finish(&mut self.sink, self.pending.back().map(|b| b.tx)).await;
        if !acknowledged {
            self.sink.abort();
            tracing::warn!("Kafka did not acknowledge everything within the shutdown grace period; the rows not marked are published again by the next run");
        }
        if let Some(error) = self.watermark.take_failure() {
            return Err(self.failed(error).await);
        }
        self.settle_with(true).await?;
        // Closing the channel ends the marker task once it marked what it was given.
        self.marks = None;
        self.marker.join().await
    }
}
