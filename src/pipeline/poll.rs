//! One run of the polling relay (`source.kind = "poll"`): read unpublished rows in order, publish them,
//! and mark each batch published once Kafka acknowledged all of it, while the next batches are read and
//! produced.
//!
//! Floor 5 (docs/ARCHITECTURE.md): imports floors 0-4.
//!
//! The reads, the order and the gaps are in [`crate::source::poll`]; rows become records through the same
//! [`Publisher`] (router, dead letters) and [`KafkaSink`] as the binlog source's. There is no checkpoint:
//! `published_at` is the relay's progress, written only after every record of the batch (and of every
//! batch before it) was acknowledged. A run starts reading from the first unpublished row, so a crash
//! republishes at most what was acknowledged and not yet marked: the batches in flight.
//!
//! # Who publishes
//! Only the holder of the lease ([`crate::lease`], taken in [`crate::app`]): the sink refuses every record
//! once the lease is not provably held, and the app stops the run when it is lost. Like the binlog sink's,
//! the producer never gives up on a record (`message.timeout.ms = 0`): a record given up while later ones
//! of its partition land would come back after them on the retry, out of order. So records a paused relay
//! had handed over and not yet sent can still land after its successor's when it resumes: duplicates of
//! its last batches, each a step back for a consumer that applies events in order.
//!
//! `poll.transactional` closes that gap with Kafka's own fencing. The relays of a connector share one
//! `transactional.id`; the run's producer starts with `init_transactions`, which aborts the transaction
//! the relay before it left open and fences that relay's producer, so nothing it sends after the
//! takeover is written. Its records are produced in transactions that commit back to back (each holds
//! what was produced while the one before committed, [`PollRun::commit`]), and a batch is marked only once
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
//! Per batch: the read, the read of the sequence gaps when there are any, and one `UPDATE` marking every
//! batch acknowledged since the last one, as ranges of sequence numbers. The marks go through a second
//! connection ([`marker`]), so reading and producing never wait for them; a row stays in flight (and no
//! read takes it for a new one) until its mark returned. Idle: one read per `poll.poll_interval_ms`; every
//! [`FULL_SWEEP_EVERY`] a sweep of the unpublished rows' keys; with parked rows, one read of them every
//! [`BACKLOG_EVERY`]. `outbox_cdc_poll_queries_total` counts them by kind.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mysql_async::{Conn, Value};
use rangemap::RangeInclusiveSet;

use super::shutdown::{Shutdown, SHUTDOWN_GRACE};
use crate::checkpoint::{Store, TxId, Watermark};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::health::health;
use crate::lease::Holding;
use crate::metrics::metrics;
use crate::publish::{Publisher, SourceRow};
use crate::quarantine::headers;
use crate::router::Router;
use crate::sink::{KafkaSink, Transactional};
use crate::source::poll::{
    key_bytes, sequence_value, Aggregate, Glimpse, OrderKey, Polled, Position, Relay, FULL_SWEEP_EVERY, GAP_GRACE,
    SWEEP_PAGE,
};
use crate::source::SourceConn;

/// How often the relay counts its backlog (`outbox_cdc_poll_backlog_rows`) while it is busy, and reads
/// which aggregates are parked while some are (a `quarantine release` lifts a hold that way).
pub const BACKLOG_EVERY: Duration = Duration::from_secs(10);

/// Batches produced and not yet marked, at most; past it the relay waits for acknowledgements.
const MAX_PENDING_BATCHES: usize = 32;

/// The most gap ranges one read names; more are read as the one range that spans them.
const MAX_GAP_RANGES: usize = 64;

/// `[poll] progress_table`: how long an acknowledged row above the frontier waits for the frontier to
/// pass it before it is marked on its own (a crash in between publishes it again).
const MARK_DELAY: Duration = Duration::from_secs(1);

/// `[poll] progress_table`: how long after a read passed a sequence number the open transactions are
/// listed to prove it free. `information_schema.INNODB_TRX` is a copy refreshed at most every 100 ms: a
/// list read sooner could predate the transaction that took the number.
const PROOF_LAG: Duration = Duration::from_millis(250);

/// `[poll] progress_table`: the most ranges of numbers not yet proven free kept per table; past it the
/// lowest two are joined (the rows between them are looked at again when the joined range is proven).
const MAX_UNPROVEN: usize = 10_000;

/// A row handed to the producer.
struct Sent {
    key: Value,
    key_bytes: Vec<u8>,
    seq: Option<u64>,
    event_id: Option<String>,
    aggregate: Aggregate,
    /// Why it was dead-lettered, when it was: parked once acknowledged.
    dead: Option<String>,
    /// `[poll] progress_table`: its `published_at` is (or is about to be) `HELD_AT`, so it is marked on
    /// its own once acknowledged, wherever the number is.
    held_at: bool,
}

/// The rows of one table produced together.
struct Batch {
    tx: TxId,
    t: usize,
    rows: Vec<Sent>,
}

/// What a run knows of one table.
#[derive(Default)]
struct TableState {
    /// The position of the last row read in order; `None` before the first.
    cursor: Option<Position>,
    /// Sequence ranges (inclusive) a read skipped, by first number: their last number and when they were
    /// seen first (sequence order only).
    gaps: BTreeMap<u64, (u64, Instant)>,
    /// Aggregates a parked row holds, or a dead letter in flight.
    held: HashSet<Aggregate>,
    /// Of those, the ones whose dead letter is not yet acknowledged (and so not yet parked).
    parking: HashSet<Aggregate>,
    /// Keys of the rows produced and not yet marked.
    in_flight: HashSet<Vec<u8>>,
    /// When all unpublished rows below the cursor were last looked at.
    swept_at: Option<Instant>,
    /// `[poll] progress_table` (the rest of these fields too): the frontier as last handed to the marker,
    /// which writes it once the marks handed before it are written.
    frontier: u64,
    /// Sequence numbers above the frontier known published (acknowledged; marked or not) or free (no
    /// row, and no transaction left that could commit one): the frontier moves through them.
    covered: RangeInclusiveSet<u64>,
    /// Sequence numbers a read passed without a row, not yet proven free, by first number: the last
    /// number and when they were passed. Never given up: the frontier waits for them.
    unproven: BTreeMap<u64, (u64, Instant)>,
    /// Ranges no open transaction can commit a row in any more: read once more, then covered except the
    /// rows found there.
    proven: Vec<(u64, u64)>,
    /// The sequence numbers of parked rows, by aggregate: looked at again when the hold lifts (the
    /// parked row is published then, by `quarantine release`).
    parked_seqs: HashMap<Aggregate, Vec<u64>>,
    /// Acknowledged rows above the frontier, waiting up to [`MARK_DELAY`] for it to pass them.
    unmarked: VecDeque<Unmarked>,
    /// Sequence numbers of rows of held aggregates (parked rows among them) to mark `HELD_AT`: covered
    /// once handed to the marker, which writes them before the frontier that passes them.
    to_hold: Vec<u64>,
    /// Keys of the rows marked (or handed to the marker to mark) `HELD_AT` in this run.
    hold_marked: HashSet<Vec<u8>>,
}

/// An acknowledged row above the frontier (`[poll] progress_table`).
struct Unmarked {
    acknowledged: Instant,
    key: Value,
    key_bytes: Vec<u8>,
    seq: u64,
}

/// `[poll] progress_table`: ranges of sequence numbers a read passed without a row, waiting for every
/// transaction that was open after they were passed to end.
struct Proof {
    /// Those transactions (connection id, start time) still open when last looked.
    open: HashSet<(u64, String)>,
    /// The ranges (table, first, last).
    ranges: Vec<(usize, u64, u64)>,
    /// When the transactions were last listed.
    listed: Instant,
}

/// Rows of one table acknowledged by Kafka, for the marker task ([`marker`]) to mark published.
#[derive(Default)]
struct MarkRequest {
    t: usize,
    keys: Vec<Value>,
    seqs: Vec<u64>,
    /// Their keys as bytes, sent back once marked (the run keeps them in flight until then, so that no
    /// read takes an acknowledged row that is not marked yet for a new one).
    done: Vec<Vec<u8>>,
    /// `[poll] progress_table`: the new frontier, written after the marks; the rows of `done` not in
    /// `keys` are published by it.
    frontier: Option<u64>,
    /// `[poll] progress_table`: rows of held aggregates to mark `HELD_AT` (by sequence number), first.
    held: Vec<u64>,
    /// How many rows of `done` the frontier publishes.
    by_frontier: u64,
}

impl MarkRequest {
    fn new(t: usize) -> MarkRequest {
        MarkRequest { t, ..MarkRequest::default() }
    }
}

impl TableState {
    /// Sorts rows a sweep or a gap's proof glimpsed: each one's number goes to `found`; a row in flight
    /// is left to its acknowledgement; a held aggregate's row is held (`progress`: [`TableState::hold`]);
    /// any other's key goes to `new`, to be read in full.
    fn sort_glimpsed(&mut self, page: &[Glimpse], progress: bool, found: &mut Vec<u64>, new: &mut Vec<Value>) {
        for g in page {
            let seq = g.position.first().and_then(sequence_value);
            found.extend(seq);
            let key = key_bytes(&g.key);
            if self.in_flight.contains(&key) {
                continue;
            }
            match self.held.contains(&g.aggregate) {
                true if progress => self.hold(seq, &key),
                true => {}
                false => new.push(g.key.clone()),
            }
        }
    }

    /// `[poll] progress_table`: a row of a held aggregate, found by a read: marked `HELD_AT` (once), so
    /// that the frontier may pass it.
    fn hold(&mut self, seq: Option<u64>, key_bytes: &[u8]) {
        let Some(seq) = seq.filter(|s| *s > self.frontier) else { return };
        if self.hold_marked.insert(key_bytes.to_vec()) {
            self.to_hold.push(seq);
        }
    }

    /// `[poll] progress_table`: moves the frontier through the covered numbers after it (the held rows
    /// to mark `HELD_AT` among them, handed over in `request` first), and adds to `request` the new
    /// frontier, the acknowledged rows it publishes, and those that waited `delay` for it in vain (marked
    /// on their own).
    fn advance(&mut self, request: &mut MarkRequest, delay: Duration, now: Instant) {
        for seq in self.to_hold.drain(..) {
            if seq > self.frontier {
                self.covered.insert(seq..=seq);
            }
            request.held.push(seq);
        }
        let through = match self.covered.get(&(self.frontier + 1)) {
            Some(range) => *range.end(),
            None => self.frontier,
        };
        if through > self.frontier {
            self.covered.remove(0..=through);
            self.frontier = through;
            request.frontier = Some(through);
        }
        while let Some(row) = self.unmarked.front() {
            if row.seq > self.frontier && now.duration_since(row.acknowledged) < delay {
                break;
            }
            let row = self.unmarked.pop_front().expect("front exists");
            if row.seq <= self.frontier {
                request.by_frontier += 1;
            } else {
                request.keys.push(row.key);
                request.seqs.push(row.seq);
            }
            request.done.push(row.key_bytes);
        }
        if request.frontier.is_none() {
            return;
        }
        // Rows behind the first that still waits: published by the frontier, or waiting less long.
        let frontier = self.frontier;
        let mut kept = VecDeque::with_capacity(self.unmarked.len());
        for row in self.unmarked.drain(..) {
            match row.seq <= frontier {
                true => {
                    request.by_frontier += 1;
                    request.done.push(row.key_bytes);
                }
                false => kept.push_back(row),
            }
        }
        self.unmarked = kept;
    }
}

/// The parts of a relay run.
struct PollRun<'a> {
    config: &'a Config,
    router: Router,
    store: Arc<Store>,
    relay: Arc<Relay>,
    conn: Conn,
    /// To the marker task; `None` once the run closed it.
    marks: Option<tokio::sync::mpsc::Sender<MarkRequest>>,
    /// From the marker task: the rows it marked.
    marked: tokio::sync::mpsc::UnboundedReceiver<(usize, Vec<Vec<u8>>)>,
    marker: tokio::task::JoinHandle<Result<()>>,
    sink: KafkaSink,
    publisher: Publisher,
    watermark: Arc<Watermark>,
    shutdown: &'a Shutdown,
    tables: Vec<TableState>,
    pending: VecDeque<Batch>,
    /// `poll.transactional`: batches before this transaction id are in committed Kafka transactions (set
    /// by each commit's callback). `None`: records count once Kafka acknowledged them.
    committed: Option<Arc<AtomicU64>>,
    /// `[poll] progress_table`: the gaps being proven free.
    proof: Option<Proof>,
}

/// Runs the relay until shutdown (Ok) or the first error.
///
/// # Errors
/// Transient errors are worth a retry; definite ones are not.
pub(super) async fn run(
    config: &Config,
    source: &SourceConn,
    router: Router,
    store: Arc<Store>,
    lease: Option<Holding>,
    shutdown: &Shutdown,
) -> Result<()> {
    let ignored = config.poll.ignored_keys();
    if !ignored.is_empty() {
        tracing::warn!(keys = ?ignored, "[poll] keys that no longer do anything (see README, the polling relay): remove them");
    }
    let mut conn = source.connect().await?;
    let relay = Arc::new(Relay::load(&mut conn, config).await?);
    // The marks go through a connection of their own, so that reading and producing never wait for them.
    let (marks, requests) = tokio::sync::mpsc::channel(MAX_PENDING_BATCHES);
    let (done, marked) = tokio::sync::mpsc::unbounded_channel();
    // It ends when the run drops `marks`; marking rows Kafka acknowledged is right whenever it happens.
    let mut marker_conn = source.connect().await?;
    Relay::ready_marker(&mut marker_conn).await?;
    let marker = tokio::spawn(marker(relay.clone(), marker_conn, requests, done));
    let watermark = Arc::new(Watermark::new(None));
    let (mut sink, committed) = if config.poll.transactional {
        // Its start fences the producer of the relay before, and aborts what that one left open.
        let settings = Transactional { id: config.transactional_id().to_string(), checkpoint: None };
        let sink = KafkaSink::transactional(&config.kafka, watermark.clone(), settings).await?;
        (sink, Some(Arc::new(AtomicU64::new(0))))
    } else {
        (KafkaSink::new(&config.kafka, watermark.clone())?, None)
    };
    if let Some(lease) = lease {
        sink.publish_while(lease);
    }
    let mut tables: Vec<TableState> = Vec::new();
    for t in 0..relay.tables().len() {
        let frontier = relay.frontier(t);
        let mut state = TableState { frontier, ..TableState::default() };
        if frontier > 0 {
            // Everything up to it is published: the reads start after it.
            state.cursor = Some(vec![Value::UInt(frontier)]);
        }
        for (aggregate, seq) in relay.parked_rows(&mut conn, t, None).await? {
            state.parked_seqs.entry(aggregate.clone()).or_default().extend(seq);
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
        committed,
        proof: None,
    };
    let interval = config.poll.poll_interval;
    let mut idle_wait = interval / 16;
    let mut backlog_due = Instant::now();
    let requested = shutdown.requested();
    tokio::pin!(requested);
    loop {
        if shutdown.is_requested() {
            return run.finish().await;
        }
        run.commit().await?;
        run.settle().await?;
        let mut busy = false;
        for t in 0..run.tables.len() {
            busy |= run.poll_table(t).await?;
        }
        run.prove_gaps().await?;
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
                run.wait_in_flight(Duration::from_millis(100)).await;
            }
            continue;
        }
        metrics().poll_idle();
        if !run.pending.is_empty() {
            // Nothing new: wait for what is in flight, then mark it.
            run.wait_in_flight(idle_wait).await;
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
fn forget_lifted_holds(store: &Store, tables: &[TableState]) -> Result<bool> {
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
    /// One read of table `t` (and of its gaps, and a sweep when due), and the rows it found produced.
    /// Returns whether it found any.
    async fn poll_table(&mut self, t: usize) -> Result<bool> {
        let fast = self.relay.read_after(&mut self.conn, t, self.tables[t].cursor.as_ref()).await?;
        let sequence = matches!(self.relay.tables()[t].order, OrderKey::Sequence(_));
        if sequence {
            self.note_gaps(t, &fast);
        }
        // After the read in order, not before: a row whose transaction committed before that read's
        // snapshot is seen by these later statements (module doc of `source::poll`).
        let mut late = if sequence { self.read_gaps(t).await? } else { Vec::new() };
        late.extend(self.read_proven(t).await?);
        let sweep_due = !sequence || self.tables[t].swept_at.is_none_or(|at| at.elapsed() >= FULL_SWEEP_EVERY);
        if sweep_due && self.tables[t].cursor.is_some() {
            late.extend(self.sweep(t).await?);
            self.tables[t].swept_at = Some(Instant::now());
        }
        if let Some(last) = fast.last() {
            self.tables[t].cursor = Some(last.position.clone());
        }
        if late.is_empty() && fast.is_empty() {
            return Ok(false);
        }
        self.produce(t, late.into_iter().chain(fast)).await?;
        Ok(true)
    }

    /// Records the sequence numbers a read in order passed without a row: taken by a transaction not yet
    /// committed, or rolled back.
    fn note_gaps(&mut self, t: usize, rows: &[Polled]) {
        let state = &mut self.tables[t];
        let now = Instant::now();
        let mut previous = state.cursor.as_ref().and_then(|p| p.first()).and_then(sequence_value).unwrap_or(0);
        let progress = self.relay.has_progress_table();
        for seq in rows.iter().filter_map(Polled::seq) {
            if seq > previous + 1 {
                state.gaps.insert(previous + 1, (seq - 1, now));
                if progress {
                    state.unproven.insert(previous + 1, (seq - 1, now));
                }
            }
            previous = previous.max(seq);
        }
        while state.gaps.len() > MAX_GAPS_KEPT {
            state.gaps.pop_first();
        }
        while state.unproven.len() > MAX_UNPROVEN {
            let (Some((lo, (_, a))), Some((_, (hi, b)))) = (state.unproven.pop_first(), state.unproven.pop_first())
            else {
                break;
            };
            state.unproven.insert(lo, (hi, a.max(b)));
        }
    }

    /// `[poll] progress_table`: lists the open transactions to prove gaps free. Gaps passed at least
    /// [`PROOF_LAG`] before a list was read can only be filled by a transaction on it (the number was
    /// taken before a higher one was committed and read); once none of those is open any more, each of
    /// these gaps holds what it will ever hold, and is read once more ([`PollRun::read_proven`]).
    async fn prove_gaps(&mut self) -> Result<()> {
        if !self.relay.has_progress_table() {
            return Ok(());
        }
        let now = Instant::now();
        if self.proof.as_ref().is_some_and(|p| now.duration_since(p.listed) < PROOF_LAG) {
            return Ok(());
        }
        let Some(proof) = &mut self.proof else {
            let Some(cutoff) = now.checked_sub(PROOF_LAG) else { return Ok(()) };
            let ranges: Vec<(usize, u64, u64)> = (self.tables.iter().enumerate())
                .flat_map(|(t, s)| {
                    s.unproven.iter().filter(|(_, (_, seen))| *seen <= cutoff).map(move |(lo, (hi, _))| (t, *lo, *hi))
                })
                .collect();
            if ranges.is_empty() {
                return Ok(());
            }
            let open = Relay::open_transactions(&mut self.conn).await?;
            self.proof = Some(Proof { open, ranges, listed: Instant::now() });
            return Ok(());
        };
        let open = Relay::open_transactions(&mut self.conn).await?;
        proof.open.retain(|trx| open.contains(trx));
        proof.listed = Instant::now();
        if !proof.open.is_empty() {
            return Ok(());
        }
        let proof = self.proof.take().expect("checked above");
        for (t, lo, hi) in proof.ranges {
            let state = &mut self.tables[t];
            let taken = take_range(&mut state.unproven, lo, hi);
            state.proven.extend(taken);
        }
        Ok(())
    }

    /// `[poll] progress_table`: reads the proven gaps once more (light columns, in pages): their numbers
    /// without an unpublished row are covered; the rows found that are neither in flight nor held are
    /// returned in full, to be published.
    async fn read_proven(&mut self, t: usize) -> Result<Vec<Polled>> {
        let ranges = std::mem::take(&mut self.tables[t].proven);
        if ranges.is_empty() {
            return Ok(Vec::new());
        }
        let (mut found, mut new) = (Vec::new(), Vec::new());
        for chunk in ranges.chunks(MAX_GAP_RANGES) {
            let mut after = None;
            loop {
                let page = self.relay.glimpse_ranges(&mut self.conn, t, chunk, after).await?;
                self.tables[t].sort_glimpsed(&page, true, &mut found, &mut new);
                match page.last().and_then(|g| g.position.first()).and_then(sequence_value) {
                    Some(last) if page.len() >= SWEEP_PAGE => after = Some(last),
                    _ => break,
                }
            }
        }
        // Added, never removed: a row found in flight may be acknowledged (and covered) already; one
        // not yet acknowledged is covered when it is.
        let mut free = RangeInclusiveSet::new();
        for (lo, hi) in ranges {
            free.insert(lo..=hi);
        }
        for seq in found {
            free.remove(seq..=seq);
        }
        self.tables[t].covered.extend(free);
        let mut rows = Vec::new();
        for keys in new.chunks(self.config.poll.batch_rows) {
            rows.extend(self.relay.read_keys(&mut self.conn, t, keys).await?);
        }
        Ok(rows)
    }

    /// The rows that filled gaps since they were seen (committed late), in order; gaps older than
    /// [`GAP_GRACE`] are given up (the full sweep still finds a row committed later still).
    async fn read_gaps(&mut self, t: usize) -> Result<Vec<Polled>> {
        let state = &mut self.tables[t];
        state.gaps.retain(|_, (_, seen)| seen.elapsed() < GAP_GRACE);
        if state.gaps.is_empty() {
            return Ok(Vec::new());
        }
        let ranges: Vec<(u64, u64)> = if state.gaps.len() <= MAX_GAP_RANGES {
            state.gaps.iter().map(|(lo, (hi, _))| (*lo, *hi)).collect()
        } else {
            let lo = *state.gaps.keys().next().expect("not empty");
            let hi = state.gaps.values().map(|(hi, _)| *hi).max().expect("not empty");
            vec![(lo, hi)]
        };
        let rows = self.relay.read_gaps(&mut self.conn, t, &ranges).await?;
        let state = &mut self.tables[t];
        for seq in rows.iter().filter_map(Polled::seq) {
            fill_gap(&mut state.gaps, seq);
        }
        Ok(rows.into_iter().filter(|r| !state.in_flight.contains(&key_bytes(&r.key))).collect())
    }

    /// All unpublished rows below the cursor that are neither in flight nor held: rows committed long
    /// after their place in the order was read (light columns first; the few new ones in full).
    async fn sweep(&mut self, t: usize) -> Result<Vec<Polled>> {
        let Some(upto) = self.tables[t].cursor.clone() else { return Ok(Vec::new()) };
        let frontier = self.relay.frontier(t);
        let mut after: Option<Position> = None;
        let mut new = Vec::new();
        let mut found: Vec<u64> = Vec::new();
        let progress = self.relay.has_progress_table();
        loop {
            let page = self.relay.sweep(&mut self.conn, t, after.as_ref(), &upto).await?;
            self.tables[t].sort_glimpsed(&page, progress, &mut found, &mut new);
            match page.last() {
                Some(last) if page.len() >= SWEEP_PAGE => after = Some(last.position.clone()),
                _ => break,
            }
        }
        if progress {
            // Every number up to the cursor that has no unpublished row and is not a gap still to be
            // proven is published or free: a row the relay saw but could not publish by number (a lifted
            // hold's parked row, a row another relay marked) does not hold the frontier back for ever.
            if let Some(upto) = upto.first().and_then(sequence_value).filter(|u| *u > frontier) {
                let state = &mut self.tables[t];
                let mut settled = RangeInclusiveSet::new();
                settled.insert(frontier + 1..=upto);
                for seq in found {
                    settled.remove(seq..=seq);
                }
                for (lo, (hi, _)) in &state.unproven {
                    settled.remove(*lo..=*hi);
                }
                for (lo, hi) in &state.proven {
                    settled.remove(*lo..=*hi);
                }
                state.covered.extend(settled);
            }
        }
        let mut rows = Vec::new();
        for keys in new.chunks(self.config.poll.batch_rows) {
            rows.extend(self.relay.read_keys(&mut self.conn, t, keys).await?);
        }
        Ok(rows)
    }

    /// Produces `rows` of table `t` in order as one batch: rows of held aggregates and parked rows are left
    /// in the table; a row that becomes a dead letter holds its aggregate from there on.
    async fn produce(&mut self, t: usize, rows: impl Iterator<Item = Polled>) -> Result<()> {
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
        let progress = self.relay.has_progress_table();
        for polled in rows {
            let state = &mut self.tables[t];
            if let Some(seq) = polled.seq() {
                fill_gap(&mut state.unproven, seq);
            }
            let key_bytes = key_bytes(&polled.key);
            if polled.parked {
                let parked = state.parked_seqs.entry(polled.aggregate.clone()).or_default();
                if let Some(seq) = polled.seq().filter(|s| !parked.contains(s)) {
                    parked.push(seq);
                }
                state.held.insert(polled.aggregate.clone());
            }
            // A row produced before its aggregate became held is in flight, published once acknowledged.
            if state.in_flight.contains(&key_bytes) {
                continue;
            }
            if state.held.contains(&polled.aggregate) {
                if progress && !polled.held_at {
                    state.hold(polled.seq(), &key_bytes);
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
            let held_at = polled.held_at || state.hold_marked.remove(&key_bytes);
            let (event_id, seq) = (polled.id().map(String::from), polled.seq());
            let aggregate = polled.aggregate;
            batch.rows.push(Sent { key: polled.key, key_bytes, seq, event_id, aggregate, dead, held_at });
        }
        Ok(())
    }

    /// Hands every batch Kafka acknowledged (with all before it) to the marker task, parks its
    /// dead-lettered rows, and takes back the rows the marker task marked; ends the run on a delivery
    /// failure or when the marker task failed.
    async fn settle(&mut self) -> Result<()> {
        self.settle_with(false).await
    }

    /// [`PollRun::settle`]; `flush`: rows acknowledged above the frontier are marked at once rather than
    /// after [`MARK_DELAY`] (at shutdown).
    async fn settle_with(&mut self, flush: bool) -> Result<()> {
        if let Some(error) = self.watermark.take_failure() {
            return Err(self.failed(error).await);
        }
        while let Ok((t, keys)) = self.marked.try_recv() {
            for key in keys {
                self.tables[t].in_flight.remove(&key);
            }
        }
        if self.marker.is_finished() {
            return Err(self.marker_ended().await);
        }
        let mut settled = self.watermark.settled_before();
        if let Some(committed) = &self.committed {
            settled = settled.min(TxId(committed.load(Ordering::Acquire)));
        }
        let mut done: Vec<Batch> = Vec::new();
        while self.pending.front().is_some_and(|b| b.tx < settled) {
            done.extend(self.pending.pop_front());
        }
        let progress = self.relay.has_progress_table();
        if done.is_empty() && !progress {
            return Ok(());
        }
        if !done.is_empty() {
            crate::failpoint!("poll_batch_acked");
        }
        let mut requests: BTreeMap<usize, MarkRequest> = BTreeMap::new();
        let now = Instant::now();
        for batch in &done {
            let request = requests.entry(batch.t).or_insert_with(|| MarkRequest::new(batch.t));
            for row in &batch.rows {
                match (&row.dead, row.seq) {
                    (None, Some(seq)) if progress && !row.held_at => {
                        let state = &mut self.tables[batch.t];
                        state.covered.insert(seq..=seq);
                        state.unmarked.push_back(Unmarked {
                            acknowledged: now,
                            key: row.key.clone(),
                            key_bytes: row.key_bytes.clone(),
                            seq,
                        });
                    }
                    (None, _) => {
                        request.keys.push(row.key.clone());
                        request.seqs.extend(row.seq);
                        request.done.push(row.key_bytes.clone());
                    }
                    (Some(reason), seq) => {
                        self.relay.park(&mut self.conn, batch.t, &row.key, reason).await?;
                        let state = &mut self.tables[batch.t];
                        state.parking.remove(&row.aggregate);
                        state.in_flight.remove(&row.key_bytes);
                        state.parked_seqs.entry(row.aggregate.clone()).or_default().extend(seq);
                        if let Some(seq) = seq.filter(|s| progress && *s > state.frontier) {
                            // Parked with `HELD_AT`: the frontier may pass it.
                            state.covered.insert(seq..=seq);
                        }
                    }
                }
            }
        }
        if progress {
            for t in 0..self.tables.len() {
                let request = requests.entry(t).or_insert_with(|| MarkRequest::new(t));
                self.tables[t].advance(request, if flush { Duration::ZERO } else { MARK_DELAY }, now);
            }
        }
        let Some(marks) = &self.marks else { return Ok(()) };
        for request in
            requests.into_values().filter(|r| !r.done.is_empty() || r.frontier.is_some() || !r.held.is_empty())
        {
            if marks.send(request).await.is_err() {
                return Err(self.marker_ended().await);
            }
        }
        Ok(())
    }

    /// `poll.transactional`: finishes a commit that returned, and starts the next one when records were
    /// produced since. Commits follow each other back to back, each holding what was produced while the
    /// one before ran, so a record waits about one commit to become readable, and an idle relay commits
    /// nothing. Its callback moves `committed` past the last batch produced before it started.
    ///
    /// # Errors
    /// A commit that failed, or a producer fenced by a newer relay's: the run ends, nothing of the
    /// transaction is marked.
    async fn commit(&mut self) -> Result<()> {
        let Some(committed) = &self.committed else { return Ok(()) };
        if self.sink.is_committing() {
            if !self.sink.commit_has_returned() {
                return Ok(());
            }
            self.sink.finish_commit().await?;
        }
        let (Some(last), Some(bytes)) = (self.pending.back(), self.sink.transaction_bytes()) else { return Ok(()) };
        if bytes == 0 {
            return Ok(());
        }
        let (committed, through) = (committed.clone(), last.tx.0 + 1);
        let on_commit = Box::new(move |_| {
            committed.fetch_max(through, Ordering::AcqRel);
        });
        self.sink.start_commit(None, on_commit).await
    }

    /// `poll.transactional`, at shutdown: finishes the running commit and commits what is open.
    async fn commit_all(&mut self) -> Result<()> {
        self.sink.finish_commit().await?;
        self.commit().await?;
        self.sink.finish_commit().await
    }

    /// Waits up to `timeout` for what is in flight: for its acknowledgements, or with `poll.transactional`
    /// for the running commit to return.
    async fn wait_in_flight(&mut self, timeout: Duration) {
        if self.committed.is_none() || !self.sink.is_committing() {
            self.sink.drain(timeout).await;
            return;
        }
        let _ = tokio::time::timeout(timeout, self.sink.commit_returned()).await;
    }

    /// The marker task's end, as the run's error.
    async fn marker_ended(&mut self) -> Error {
        self.marks = None;
        match (&mut self.marker).await {
            Ok(Err(error)) => error,
            Ok(Ok(())) => Error::transient("poll: the marker task ended"),
            Err(e) => Error::transient(format!("poll: the marker task failed: {e}")),
        }
    }

    /// A delivery failed: nothing is counted against the rows, except a record the broker refused for good
    /// (its row's `attempts` and `last_error`). What is in flight is purged; the run ends with the failure.
    async fn failed(&mut self, error: Error) -> Error {
        self.sink.abort();
        if let Some(refused) = error.refused() {
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

    /// Reads which aggregates are parked; a held aggregate that is not any more (a `quarantine release`
    /// marked its parked row published) has the rows it held read again and produced in order.
    async fn lift_released_holds(&mut self) -> Result<()> {
        for t in 0..self.tables.len() {
            if self.tables[t].held.is_empty() {
                continue;
            }
            // Only the held aggregates, in chunks, along the aggregate index: a scan of every unpublished
            // row each time cost the server more than the catch-up itself (bench, 10,000 held rows).
            let held: Vec<Aggregate> = self.tables[t].held.iter().cloned().collect();
            let mut parked: HashSet<Aggregate> = HashSet::new();
            for chunk in held.chunks(500) {
                let rows = self.relay.parked_rows(&mut self.conn, t, Some(chunk)).await?;
                parked.extend(rows.into_iter().map(|(aggregate, _)| aggregate));
            }
            let state = &mut self.tables[t];
            let lifted: Vec<Aggregate> =
                state.held.iter().filter(|a| !parked.contains(*a) && !state.parking.contains(*a)).cloned().collect();
            if lifted.is_empty() {
                continue;
            }
            for aggregate in &lifted {
                state.held.remove(aggregate);
                // Its parked rows are published now (or unparked by hand): looked at once more.
                let seqs = state.parked_seqs.remove(aggregate).unwrap_or_default();
                if self.relay.has_progress_table() {
                    state.proven.extend(seqs.into_iter().map(|seq| (seq, seq)));
                }
            }
            if forget_lifted_holds(&self.store, &self.tables)? {
                self.publisher = Publisher::new(self.config, self.router.clone(), self.store.clone())?;
            }
            let Some(upto) = self.tables[t].cursor.clone() else { continue };
            for aggregate in lifted {
                tracing::info!(
                    aggregate_type = %String::from_utf8_lossy(&aggregate.0),
                    aggregate_id = %String::from_utf8_lossy(&aggregate.1),
                    "hold lifted: publishing the aggregate's rows it held, in order"
                );
                let mut after: Option<Position> = None;
                loop {
                    let rows = self.relay.read_aggregate(&mut self.conn, t, &aggregate, after.as_ref(), &upto).await?;
                    let full = rows.len() >= self.config.poll.batch_rows;
                    after = rows.last().map(|r| r.position.clone());
                    self.produce(t, rows.into_iter()).await?;
                    if !full || self.tables[t].held.contains(&aggregate) {
                        break;
                    }
                }
            }
        }
        Ok(())
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

    /// Graceful shutdown: waits up to [`SHUTDOWN_GRACE`] for what is in flight, marks it, and returns.
    async fn finish(&mut self) -> Result<()> {
        let acknowledged = match self.committed.is_some() {
            false => self.sink.drain(SHUTDOWN_GRACE).await,
            true => tokio::time::timeout(SHUTDOWN_GRACE, self.commit_all()).await.is_ok_and(|c| c.is_ok()),
        };
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
        match (&mut self.marker).await {
            Ok(result) => result,
            Err(e) => Err(Error::transient(format!("poll: the marker task failed: {e}"))),
        }
    }
}

/// The marker task: marks the rows it is given published, on its own connection, one statement per table
/// for all the requests waiting, and sends their keys back.
///
/// # Errors
/// Classified query errors (the rows stay unpublished: the next run publishes them again).
async fn marker(
    relay: Arc<Relay>,
    mut conn: Conn,
    mut requests: tokio::sync::mpsc::Receiver<MarkRequest>,
    done: tokio::sync::mpsc::UnboundedSender<(usize, Vec<Vec<u8>>)>,
) -> Result<()> {
    while let Some(first) = requests.recv().await {
        let mut waiting = vec![first];
        while let Ok(more) = requests.try_recv() {
            waiting.push(more);
        }
        // One statement per table for all the requests waiting (their `done` stays with each request).
        let mut by_table: BTreeMap<usize, MarkRequest> = BTreeMap::new();
        for request in &waiting {
            let merged = by_table.entry(request.t).or_insert_with(|| MarkRequest::new(request.t));
            merged.keys.extend(request.keys.iter().cloned());
            merged.seqs.extend(&request.seqs);
            merged.frontier = merged.frontier.max(request.frontier);
            merged.held.extend(&request.held);
            merged.by_frontier += request.by_frontier;
        }
        for (t, merged) in by_table {
            // Held rows first: the frontier written below may pass them, and rows marked on their own
            // may be among them (released since).
            if !merged.held.is_empty() {
                relay.mark_held(&mut conn, t, &merged.held).await?;
            }
            if !merged.keys.is_empty() {
                relay.mark_published(&mut conn, t, &merged.keys, &merged.seqs).await?;
            }
            if let Some(frontier) = merged.frontier {
                relay.write_frontier(&mut conn, t, frontier).await?;
            }
            metrics().poll_published(merged.by_frontier);
        }
        for request in waiting {
            // The run may have ended meanwhile: nothing to tell then.
            let _ = done.send((request.t, request.done));
        }
    }
    let _ = conn.disconnect().await;
    Ok(())
}

/// Removes the numbers from `lo` to `hi` from the ranges of `map` (first number → last number, when
/// seen), and returns the ranges removed.
fn take_range(map: &mut BTreeMap<u64, (u64, Instant)>, lo: u64, hi: u64) -> Vec<(u64, u64)> {
    let overlapping: Vec<(u64, (u64, Instant))> =
        map.range(..=hi).filter(|(_, (last, _))| *last >= lo).map(|(f, v)| (*f, *v)).collect();
    let mut taken = Vec::new();
    for (first, (last, seen)) in overlapping {
        map.remove(&first);
        if first < lo {
            map.insert(first, (lo - 1, seen));
        }
        if last > hi {
            map.insert(hi + 1, (last, seen));
        }
        taken.push((first.max(lo), last.min(hi)));
    }
    taken
}

/// The most gap ranges remembered per table; past it the lowest are dropped (the full sweep still finds
/// their rows).
const MAX_GAPS_KEPT: usize = 10_000;

/// Removes `seq` from the gap range that contains it, splitting the range.
fn fill_gap(gaps: &mut BTreeMap<u64, (u64, Instant)>, seq: u64) {
    let Some((&lo, &(hi, seen))) = gaps.range(..=seq).next_back() else { return };
    if seq > hi {
        return;
    }
    gaps.remove(&lo);
    if lo < seq {
        gaps.insert(lo, (seq - 1, seen));
    }
    if seq < hi {
        gaps.insert(seq + 1, (hi, seen));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A filled number splits its gap range; numbers outside every range change nothing.
    #[test]
    fn a_filled_number_splits_its_gap() {
        let seen = Instant::now();
        let mut gaps = BTreeMap::from([(3, (3, seen)), (10, (20, seen))]);
        fill_gap(&mut gaps, 3);
        fill_gap(&mut gaps, 15);
        fill_gap(&mut gaps, 10);
        fill_gap(&mut gaps, 25);
        fill_gap(&mut gaps, 1);
        let ranges: Vec<(u64, u64)> = gaps.iter().map(|(lo, (hi, _))| (*lo, *hi)).collect();
        assert_eq!(ranges, [(11, 14), (16, 20)]);
    }

    /// Taking a range out splits the ranges it overlaps and returns exactly the numbers taken.
    #[test]
    fn a_taken_range_splits_what_it_overlaps() {
        let seen = Instant::now();
        let mut map = BTreeMap::from([(3, (5, seen)), (8, (12, seen)), (20, (20, seen))]);
        assert_eq!(take_range(&mut map, 4, 10), [(4, 5), (8, 10)]);
        let left: Vec<(u64, u64)> = map.iter().map(|(lo, (hi, _))| (*lo, *hi)).collect();
        assert_eq!(left, [(3, 3), (11, 12), (20, 20)]);
        assert!(take_range(&mut map, 13, 19).is_empty());
    }

    /// The frontier moves through covered numbers only up to the first that is not; the acknowledged rows
    /// it passes are done by number, those above it wait `delay`, then are marked on their own.
    #[test]
    fn the_frontier_moves_through_covered_numbers_only() {
        let now = Instant::now();
        let mut state = TableState { frontier: 10, ..TableState::default() };
        for seq in [11, 12, 14] {
            state.covered.insert(seq..=seq);
            let key = seq.to_string().into_bytes();
            state.unmarked.push_back(Unmarked { acknowledged: now, key: Value::from(seq), key_bytes: key, seq });
        }
        let mut request = MarkRequest::new(0);
        state.advance(&mut request, Duration::from_secs(1), now);
        assert_eq!((request.frontier, request.by_frontier, request.keys.len()), (Some(12), 2, 0));
        assert_eq!(state.unmarked.len(), 1, "14 waits for 13");
        let mut request = MarkRequest::new(0);
        state.advance(&mut request, Duration::from_secs(1), now + Duration::from_secs(2));
        assert_eq!((request.frontier, request.seqs.as_slice(), request.done.len()), (None, &[14][..], 1));
        state.covered.insert(13..=13);
        let mut request = MarkRequest::new(0);
        state.advance(&mut request, Duration::from_secs(1), now);
        assert_eq!((request.frontier, state.covered.iter().count()), (Some(14), 0));
    }

    /// Rows of held aggregates are handed to the marker to mark `HELD_AT` in the request whose frontier
    /// passes them (the marker writes them first); each is handed once, and none at or below the frontier.
    #[test]
    fn held_rows_are_marked_before_the_frontier_passes_them() {
        let now = Instant::now();
        let mut state = TableState { frontier: 10, ..TableState::default() };
        state.covered.insert(11..=11);
        for (seq, key) in [(12, "a"), (13, "b"), (12, "a"), (9, "c")] {
            state.hold(Some(seq), key.as_bytes());
        }
        assert_eq!(state.to_hold, [12, 13]);
        let mut request = MarkRequest::new(0);
        state.advance(&mut request, Duration::from_secs(1), now);
        assert_eq!((request.frontier, request.held.as_slice()), (Some(13), &[12, 13][..]));
        assert!(state.to_hold.is_empty() && state.hold_marked.len() == 2);
    }
}
