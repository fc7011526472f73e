//! The run's side of how the relay records what it published ([`super::progress::Progress`]), as one type
//! with the behaviour inside: [`Ledger::Marking`] keeps nothing (each acknowledged row is marked), and
//! [`Ledger::Numbers`] (`[poll] progress_table`) keeps, per table, what the number may pass and moves it.
//! The run tells it what happened (gap numbers proven free, a row acknowledged, parked, held, a sweep) and
//! never asks which it is.
//!
//! Floor 5 (docs/ARCHITECTURE.md): imports floors 0-4 (what it hands the marker is the run's
//! [`MarkRequest`]).
//!
//! # Invariants (`[poll] progress_table`)
//! - The number moves only through *covered* numbers: acknowledged rows (marked or not), rows marked
//!   `HELD_AT` (handed to the marker before the number that passes them), and numbers *proven free* (no
//!   row, and no transaction left open that was open when a read passed them: `relay::gaps`).
//! - A number a read passed without a row is never given up: the number waits for its proof.
//! - An acknowledged row above the number waits up to [`MARK_DELAY`] for the number to pass it, then is
//!   marked on its own (at once at shutdown).

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use mysql_async::Value;
use rangemap::RangeInclusiveSet;

use super::marker::MarkRequest;
use super::progress::Progress;
use super::ranges::Gaps;
use super::table::{sequence_value, Position, Relay};

/// `[poll] progress_table`: how long an acknowledged row above the frontier waits for the frontier to
/// pass it before it is marked on its own (a crash in between publishes it again).
const MARK_DELAY: Duration = Duration::from_secs(1);

/// What a run keeps of what is published beyond each row's mark.
pub(super) enum Ledger {
    /// Each acknowledged row is marked published: nothing to keep.
    Marking,
    /// `[poll] progress_table`: the numbers, per table (the relay's order).
    Numbers(Vec<Numbered>),
}

/// `[poll] progress_table`: what a run knows of one table's number.
#[derive(Default)]
pub(super) struct Numbered {
    /// The frontier as last handed to the marker, which writes it once the marks handed before it are
    /// written.
    frontier: u64,
    /// Sequence numbers above the frontier known published (acknowledged; marked or not) or free (no
    /// row, and no transaction left that could commit one): the frontier moves through them.
    covered: RangeInclusiveSet<u64>,
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

impl Ledger {
    /// The ledger of `relay`'s progress, each table's number as last written.
    pub(super) fn of(relay: &Relay) -> Ledger {
        match relay.progress() {
            Progress::Marking => Ledger::Marking,
            Progress::Table(_) => Ledger::Numbers(
                (0..relay.tables().len())
                    .map(|t| Numbered { frontier: relay.frontier(t), ..Numbered::default() })
                    .collect(),
            ),
        }
    }

    /// Numbers of table `t` in `ranges` (inclusive) hold no row and never will (proven gaps read once
    /// more, without their rows' numbers): covered. A row found there in flight is covered when it is
    /// acknowledged (or was already).
    pub(super) fn free(&mut self, t: usize, ranges: Vec<(u64, u64)>) {
        let Ledger::Numbers(tables) = self else { return };
        for (lo, hi) in ranges {
            tables[t].covered.insert(lo..=hi);
        }
    }

    /// A sweep of table `t` up to `upto`, which started with the number written at `frontier`, found
    /// unpublished rows at `found`. Every number up to the cursor that has no unpublished row and is not
    /// one of the table's `gaps` (still to be read) is published or free: a row the relay saw but could not
    /// publish by number (a lifted hold's parked row, a row another relay marked) does not hold the
    /// frontier back for ever.
    pub(super) fn swept(&mut self, t: usize, frontier: u64, upto: &Position, found: Vec<u64>, gaps: &Gaps) {
        let Ledger::Numbers(tables) = self else { return };
        if let Some(upto) = upto.first().and_then(sequence_value).filter(|u| *u > frontier) {
            let mut settled = RangeInclusiveSet::new();
            settled.insert(frontier + 1..=upto);
            for seq in found {
                settled.remove(seq..=seq);
            }
            for (lo, hi) in gaps.ranges() {
                settled.remove(lo..=hi);
            }
            tables[t].covered.extend(settled);
        }
    }

    /// A row of a held aggregate of table `t`, found by a read: marked `HELD_AT` (once), so that the
    /// frontier may pass it ([`Numbered::hold`]). Nothing when marking: the row stays unpublished.
    pub(super) fn hold(&mut self, t: usize, seq: Option<u64>, key_bytes: &[u8]) {
        if let Ledger::Numbers(tables) = self {
            tables[t].hold(seq, key_bytes);
        }
    }

    /// A row of table `t` is produced after all: whether it was handed to the marker to mark `HELD_AT`
    /// in this run (then, once acknowledged, it is marked on its own).
    pub(super) fn unhold(&mut self, t: usize, key_bytes: &[u8]) -> bool {
        match self {
            Ledger::Marking => false,
            Ledger::Numbers(tables) => tables[t].hold_marked.remove(key_bytes),
        }
    }

    /// Kafka acknowledged a row of table `t` (not a dead letter): whether the ledger takes it (covered,
    /// published by the number or on its own after [`MARK_DELAY`]). When it does not (marking, a row
    /// without a sequence number, one marked `HELD_AT`), the caller hands it to the marker to mark.
    pub(super) fn acknowledged(
        &mut self,
        t: usize,
        seq: Option<u64>,
        held_at: bool,
        (key, key_bytes): (&Value, &[u8]),
        now: Instant,
    ) -> bool {
        let Ledger::Numbers(tables) = self else { return false };
        match seq {
            Some(seq) if !held_at => {
                let state = &mut tables[t];
                state.covered.insert(seq..=seq);
                state.unmarked.push_back(Unmarked {
                    acknowledged: now,
                    key: key.clone(),
                    key_bytes: key_bytes.to_vec(),
                    seq,
                });
                true
            }
            _ => false,
        }
    }

    /// A dead-lettered row of table `t` with sequence number `seq` was parked (with `HELD_AT`): the
    /// frontier may pass it.
    pub(super) fn parked(&mut self, t: usize, seq: u64) {
        let Ledger::Numbers(tables) = self else { return };
        let state = &mut tables[t];
        if seq > state.frontier {
            state.covered.insert(seq..=seq);
        }
    }

    /// Moves each table's frontier ([`Numbered::advance`]) into its request in `requests`, with the rows
    /// it publishes and those that waited for it in vain; `flush`: none waits (at shutdown, or when the run's
    /// room is short).
    pub(super) fn advance(&mut self, requests: &mut BTreeMap<usize, MarkRequest>, flush: bool, now: Instant) {
        let Ledger::Numbers(tables) = self else { return };
        for (t, state) in tables.iter_mut().enumerate() {
            let request = requests.entry(t).or_insert_with(|| MarkRequest::new(t));
            state.advance(request, if flush { Duration::ZERO } else { MARK_DELAY }, now);
        }
    }
}

impl Numbered {
    /// A row of a held aggregate, found by a read: marked `HELD_AT` (once), so that the frontier may pass
    /// it.
    fn hold(&mut self, seq: Option<u64>, key_bytes: &[u8]) {
        let Some(seq) = seq.filter(|s| *s > self.frontier) else { return };
        if self.hold_marked.insert(key_bytes.to_vec()) {
            self.to_hold.push(seq);
        }
    }

    /// Moves the frontier through the covered numbers after it (the held rows to mark `HELD_AT` among
    /// them, handed over in `request` first), and adds to `request` the new frontier, the acknowledged
    /// rows it publishes, and those that waited `delay` for it in vain (marked on their own).
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The frontier moves through covered numbers only up to the first that is not; the acknowledged rows
    /// it passes are done by number, those above it wait `delay`, then are marked on their own.
    #[test]
    fn the_frontier_moves_through_covered_numbers_only() {
        let now = Instant::now();
        let mut state = Numbered { frontier: 10, ..Numbered::default() };
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
        let mut state = Numbered { frontier: 10, ..Numbered::default() };
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
