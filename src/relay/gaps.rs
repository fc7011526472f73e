//! Rows a read in order can miss, found again: the sequence numbers a read passed without a row (*gaps*,
//! read again until they fill or [`GAP_GRACE`] passes), the sweep of every unpublished row below the
//! cursor, and (`[poll] progress_table`) the proof that a gap holds what it will ever hold.
//!
//! Floor 5 (docs/ARCHITECTURE.md): imports floors 0-4 (its methods are the run's, [`PollRun`]).

use std::time::{Duration, Instant};

use rangemap::RangeInclusiveSet;

use super::progress::open_transactions;
use super::ranges::{fill_gap, take_range};
use super::run::{PollRun, Proof};
use super::table::{key_bytes, sequence_value, Polled, Position, GAP_GRACE, SWEEP_PAGE};
use crate::error::Result;

/// The most gap ranges one read names; more are read as the one range that spans them.
const MAX_GAP_RANGES: usize = 64;

/// The most gap ranges remembered per table; past it the lowest are dropped (the full sweep still finds
/// their rows).
const MAX_GAPS_KEPT: usize = 10_000;

/// `[poll] progress_table`: how long after a read passed a sequence number the open transactions are
/// listed to prove it free. `information_schema.INNODB_TRX` is a copy refreshed at most every 100 ms: a
/// list read sooner could predate the transaction that took the number.
const PROOF_LAG: Duration = Duration::from_millis(250);

/// `[poll] progress_table`: the most ranges of numbers not yet proven free kept per table; past it the
/// lowest two are joined (the rows between them are looked at again when the joined range is proven).
const MAX_UNPROVEN: usize = 10_000;

impl PollRun<'_> {
    /// Records the sequence numbers a read in order passed without a row: taken by a transaction not yet
    /// committed, or rolled back.
    pub(super) fn note_gaps(&mut self, t: usize, rows: &[Polled]) {
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
    pub(super) async fn prove_gaps(&mut self) -> Result<()> {
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
            let open = open_transactions(&mut self.conn).await?;
            self.proof = Some(Proof { open, ranges, listed: Instant::now() });
            return Ok(());
        };
        let open = open_transactions(&mut self.conn).await?;
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
    pub(super) async fn read_proven(&mut self, t: usize) -> Result<Vec<Polled>> {
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

    /// All unpublished rows below the cursor that are neither in flight nor held: rows committed long
    /// after their place in the order was read (light columns first; the few new ones in full).
    pub(super) async fn sweep(&mut self, t: usize) -> Result<Vec<Polled>> {
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
}
