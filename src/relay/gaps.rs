//! Rows a read in order can miss, found again: the sequence numbers a read passed without a row (*gaps*),
//! read again on every poll until a row fills them or they are proven to hold what they will ever hold
//! ([`super::ranges::GapProof`]), then read once more and forgotten; the sweep of every unpublished row below
//! the cursor; and rows numbered again below the cursor by a sequence that started again
//! ([`PollRun::check_counters`]).
//!
//! Floor 5 (docs/ARCHITECTURE.md): imports floors 0-4 (its methods are the run's, [`PollRun`]).
//!
//! # Order
//! A gap's row commits after rows with higher numbers were read: its transaction took the number first.
//! A later row of its aggregate (a writer queued on the aggregate's lock) commits after it, so it is read
//! in order by a read that comes after the gap's row committed: each poll reads the gaps after the read in
//! order, and produces the rows found there (sorted) before the rows read in order. A gap is read on every
//! poll until it is filled or proven, never on a timer: a transaction open for minutes keeps its number
//! read again for minutes.
//!
//! # Bounds
//! A gap read names the gap ranges themselves (up to [`MAX_GAP_RANGES`] to a statement, never one range
//! spanning them), reads in pages along the sequence, and is bounded by the number (`[poll]
//! progress_table`: rows at or below it are published). When the rows found do not fit in the run's room
//! (what a crash would publish again, `relay::run`), they are produced and the read in order is not: it is
//! read again by the next poll, so no later row overtakes a gap's row.
//!
//! # The proof
//! Every [`PROOF_LAG`] while gaps wait, one listing of the open writers ([`open_transactions`]): a listing
//! that finds every writer the listing before saw ended (the oldest open writer is newer than the newest
//! one seen then) proves every gap passed [`PROOF_LAG`] before that listing, and starts the next cut. A
//! transaction that took a gap's number has written by the time it was passed, so it was open at the
//! first listing, or had ended. A stale listing (`information_schema.INNODB_TRX` is a copy that another
//! client reading it often keeps from refreshing) proves nothing: the gaps wait for a fresh one, and the log
//! says so after [`STALE_WARN`]. [`PROOF_LAG`]: the insert that takes a number makes its transaction a
//! writer a moment after the number is taken.

use std::time::{Duration, Instant};

use mysql_async::Value;

use super::ledger::Ledger;
use super::proof::open_transactions;
use super::run::{PollRun, TableState};
use super::table::{key_bytes, sequence_value, Glimpse, Polled, Position, SWEEP_PAGE};
use crate::error::Result;

/// The most gap ranges one read names; more are read by more statements.
const MAX_GAP_RANGES: usize = 500;

/// How long after a read passed a sequence number a listing of the open writers can prove it, and how
/// often the writers are listed while gaps wait.
pub(super) const PROOF_LAG: Duration = Duration::from_millis(250);

/// How long listings may come back stale before the log says so (and again every such period).
const STALE_WARN: Duration = Duration::from_secs(30);

impl PollRun<'_> {
    /// Records the sequence numbers a read in order passed without a row: taken by a transaction not yet
    /// committed, or rolled back.
    pub(super) fn note_gaps(&mut self, t: usize, rows: &[Polled]) {
        let state = &mut self.tables[t];
        let now = Instant::now();
        let cursor = state.cursor.as_ref().and_then(|p| p.first()).and_then(sequence_value).unwrap_or(0);
        let mut previous = cursor.max(self.relay.frontier(t));
        for seq in rows.iter().filter_map(Polled::seq) {
            if seq > previous + 1 {
                state.gaps.pass(previous + 1, seq - 1, now);
            }
            previous = previous.max(seq);
        }
    }

    /// Reads the gaps of table `t` once: the rows found fill them; proven gaps are forgotten once read
    /// (their numbers without a row are free: [`Ledger::free`]). Returns the rows neither in flight nor
    /// held, in order, and whether every gap was read: at most `room` rows are (in pages of
    /// `poll.batch_rows`), and what did not fit is read by the next poll.
    pub(super) async fn read_gaps(&mut self, t: usize, room: usize) -> Result<(Vec<Polled>, bool)> {
        let ranges = self.tables[t].gaps.listed();
        let (mut rows, mut complete, mut read) = (Vec::new(), true, 0);
        let page = self.config.poll.batch_rows;
        'chunks: for chunk in ranges.chunks(MAX_GAP_RANGES) {
            let spans: Vec<(u64, u64)> = chunk.iter().map(|(lo, hi, _)| (*lo, *hi)).collect();
            let mut after = None;
            loop {
                if rows.len() >= room {
                    complete = false;
                    break 'chunks;
                }
                let found = self.relay.read_gaps(&mut self.conn, t, &spans, after, page).await?;
                let full = found.len() >= page;
                after = found.last().and_then(Polled::seq).or(after);
                rows.extend(found);
                if !full {
                    break;
                }
            }
            read += chunk.len();
        }
        let state = &mut self.tables[t];
        for seq in rows.iter().filter_map(Polled::seq) {
            state.gaps.fill(seq);
        }
        let mut free = Vec::new();
        for (lo, hi, _) in ranges[..read].iter().filter(|(_, _, proven)| *proven) {
            free.extend(state.gaps.forget(*lo, *hi));
        }
        self.ledger.free(t, free);
        rows.retain(|r| !state.in_flight.contains(&key_bytes(&r.key)));
        Ok((rows, complete))
    }

    /// Lists the open writers when gaps wait to be proven, at most every [`PROOF_LAG`]; a cut the listing
    /// finds ended proves the gaps passed [`PROOF_LAG`] before it ([`super::ranges::GapProof`]).
    ///
    /// # Errors
    /// As [`open_transactions`] (transient when the listing is not from the lease's server).
    pub(super) async fn prove_gaps(&mut self) -> Result<()> {
        let waiting = self.tables.iter().any(|s| s.gaps.waiting());
        let sent = Instant::now();
        if !self.proof.due(waiting, sent, PROOF_LAG) {
            return Ok(());
        }
        let writers = open_transactions(&mut self.conn, &self.relay.fence).await?;
        if !writers.fresh {
            if let Some(stale_for) = self.proof.stale(sent, STALE_WARN) {
                tracing::warn!(
                    stale_for_s = stale_for.as_secs(),
                    "information_schema.INNODB_TRX is not refreshed: another client reads it more often than \
                     every 100 ms, which keeps the server's copy as it was. Sequence numbers passed without a \
                     row wait (read again on every poll; with a progress table the number waits) until a \
                     listing is fresh: find the client in the process list and slow it down"
                );
            }
            return Ok(());
        }
        if let Some(cutoff) = self.proof.listed(sent, (writers.oldest, writers.newest), PROOF_LAG) {
            for state in &mut self.tables {
                state.gaps.prove(cutoff);
            }
        }
        Ok(())
    }

    /// Reads each table's sequence counter ([`super::table::Relay::counter_started_again`]), in a statement
    /// that also proves the reading connection's server again ([`super::server`]). A sequence that started
    /// again below the cursor (the table was truncated, re-created or restored) has its new rows below it,
    /// where only the sweep would find them: the table is read again from its first unpublished row. With a
    /// progress table the run ends instead, refused: they are below the number too.
    ///
    /// # Errors
    /// The refusals (definite); transient when the lease turns out lost; classified query errors.
    pub(super) async fn check_counters(&mut self) -> Result<()> {
        for t in 0..self.tables.len() {
            let cursor = self.tables[t].cursor.as_ref().and_then(|p| p.first()).and_then(sequence_value);
            if self.relay.counter_started_again(&mut self.conn, t, cursor).await? {
                tracing::warn!(
                    table = %self.relay.tables()[t].table,
                    cursor = cursor.unwrap_or(0),
                    "the table's sequence started again below the last row read (truncated, re-created or \
                     restored): reading it again from its first unpublished row"
                );
                let state = &mut self.tables[t];
                state.cursor = None;
                state.gaps.clear();
            }
        }
        Ok(())
    }

    /// All unpublished rows below the cursor that are neither in flight nor held, up to `room` of them:
    /// rows no gap led to (light columns first; the few new ones in full). Returns them in order, and
    /// whether all fit.
    pub(super) async fn sweep(&mut self, t: usize, room: usize) -> Result<(Vec<Polled>, bool)> {
        let Some(upto) = self.tables[t].cursor.clone() else { return Ok((Vec::new(), true)) };
        let frontier = self.relay.frontier(t);
        let mut after: Option<Position> = None;
        let mut new = Vec::new();
        let mut found: Vec<u64> = Vec::new();
        loop {
            let page = self.relay.sweep(&mut self.conn, t, after.as_ref(), &upto).await?;
            sort_glimpsed(&self.tables[t], &mut self.ledger, t, &page, (&mut found, &mut new));
            match page.last() {
                Some(last) if page.len() >= SWEEP_PAGE => after = Some(last.position.clone()),
                _ => break,
            }
        }
        self.ledger.swept(t, frontier, &upto, found, &self.tables[t].gaps);
        let complete = new.len() <= room;
        new.truncate(room);
        let mut rows = Vec::new();
        for keys in new.chunks(self.config.poll.batch_rows) {
            rows.extend(self.relay.read_keys(&mut self.conn, t, keys).await?);
        }
        if let Some(first) = rows.first() {
            tracing::warn!(
                table = %self.relay.tables()[t].table,
                rows = rows.len(),
                first = ?first.position,
                "the sweep found unpublished rows below the last row read that no gap led to (a row numbered by \
                 hand, or marked unpublished again): publishing them now, after later rows"
            );
        }
        Ok((rows, complete))
    }
}

/// Sorts rows of table `t` a sweep glimpsed: each one's number goes to `found`; a row in flight is left to
/// its acknowledgement; a held aggregate's row is held ([`Ledger::hold`]); any other's key goes to `new`,
/// to be read in full.
fn sort_glimpsed(
    state: &TableState,
    ledger: &mut Ledger,
    t: usize,
    page: &[Glimpse],
    (found, new): (&mut Vec<u64>, &mut Vec<Value>),
) {
    for g in page {
        let seq = g.position.first().and_then(sequence_value);
        found.extend(seq);
        let key = key_bytes(&g.key);
        if state.in_flight.contains(&key) {
            continue;
        }
        match state.held.contains(&g.aggregate) {
            true => ledger.hold(t, seq, &key),
            false => new.push(g.key.clone()),
        }
    }
}
