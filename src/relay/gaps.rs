//! Rows a read in order can miss, found again: the sequence numbers a read passed without a row (*gaps*,
//! read again until they fill or [`GAP_GRACE`] passes), the sweep of every unpublished row below the
//! cursor, (`[poll] progress_table`) the gaps the ledger proved to hold what they will ever hold, and rows
//! numbered again below the cursor by a sequence that started again ([`PollRun::check_counters`]).
//!
//! Floor 5 (docs/ARCHITECTURE.md): imports floors 0-4 (its methods are the run's, [`PollRun`]).

use std::time::Instant;

use mysql_async::Value;

use super::ledger::Ledger;
use super::ranges::fill_gap;
use super::run::{PollRun, TableState};
use super::table::{key_bytes, sequence_value, Glimpse, Polled, Position, GAP_GRACE, SWEEP_PAGE};
use crate::error::Result;

/// The most gap ranges one read names; more are read as the one range that spans them.
const MAX_GAP_RANGES: usize = 64;

/// The most gap ranges remembered per table; past it the lowest are dropped (the full sweep still finds
/// their rows).
const MAX_GAPS_KEPT: usize = 10_000;

impl PollRun<'_> {
    /// Records the sequence numbers a read in order passed without a row: taken by a transaction not yet
    /// committed, or rolled back.
    pub(super) fn note_gaps(&mut self, t: usize, rows: &[Polled]) {
        let state = &mut self.tables[t];
        let now = Instant::now();
        let mut previous = state.cursor.as_ref().and_then(|p| p.first()).and_then(sequence_value).unwrap_or(0);
        let mut passed = Vec::new();
        for seq in rows.iter().filter_map(Polled::seq) {
            if seq > previous + 1 {
                state.gaps.insert(previous + 1, (seq - 1, now));
                passed.push((previous + 1, seq - 1));
            }
            previous = previous.max(seq);
        }
        while state.gaps.len() > MAX_GAPS_KEPT {
            state.gaps.pop_first();
        }
        self.ledger.passed(t, &passed, now);
    }

    /// `[poll] progress_table`: reads the gaps the ledger proved ([`Ledger::prove`]) once more (light
    /// columns, in pages): their numbers without an unpublished row are covered; the rows found that are
    /// neither in flight nor held are returned in full, to be published.
    pub(super) async fn read_proven(&mut self, t: usize) -> Result<Vec<Polled>> {
        let ranges = self.ledger.take_proven(t);
        if ranges.is_empty() {
            return Ok(Vec::new());
        }
        let (mut found, mut new) = (Vec::new(), Vec::new());
        for chunk in ranges.chunks(MAX_GAP_RANGES) {
            let mut after = None;
            loop {
                let page = self.relay.glimpse_ranges(&mut self.conn, t, chunk, after).await?;
                sort_glimpsed(&self.tables[t], &mut self.ledger, t, &page, (&mut found, &mut new));
                match page.last().and_then(|g| g.position.first()).and_then(sequence_value) {
                    Some(last) if page.len() >= SWEEP_PAGE => after = Some(last),
                    _ => break,
                }
            }
        }
        self.ledger.proven_read(t, ranges, found);
        let mut rows = Vec::new();
        for keys in new.chunks(self.config.poll.batch_rows) {
            rows.extend(self.relay.read_keys(&mut self.conn, t, keys).await?);
        }
        Ok(rows)
    }

    /// The rows that filled gaps since they were seen (committed late), in order; gaps older than
    /// [`GAP_GRACE`] are given up (the full sweep still finds a row committed later still).
    pub(super) async fn read_gaps(&mut self, t: usize) -> Result<Vec<Polled>> {
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

    /// All unpublished rows below the cursor that are neither in flight nor held: rows committed long
    /// after their place in the order was read (light columns first; the few new ones in full).
    pub(super) async fn sweep(&mut self, t: usize) -> Result<Vec<Polled>> {
        let Some(upto) = self.tables[t].cursor.clone() else { return Ok(Vec::new()) };
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
        self.ledger.swept(t, frontier, &upto, found);
        let mut rows = Vec::new();
        for keys in new.chunks(self.config.poll.batch_rows) {
            rows.extend(self.relay.read_keys(&mut self.conn, t, keys).await?);
        }
        Ok(rows)
    }
}

/// Sorts rows of table `t` a sweep or a gap's proof glimpsed: each one's number goes to `found`; a row in
/// flight is left to its acknowledgement; a held aggregate's row is held ([`Ledger::hold`]); any other's
/// key goes to `new`, to be read in full.
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
