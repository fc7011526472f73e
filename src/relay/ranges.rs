//! Ranges of sequence numbers, the relay's arithmetic: numbers marked together (as ranges, in one
//! statement), gaps a read passed (a number filled splits its range; [`Gaps`], each with when it was passed
//! and whether it is proven), numbers taken out of the ranges kept, and the cut of the proof under way
//! ([`GapProof`]; the listings themselves are `relay::proof`'s, read by `relay::gaps`). Pure: no statement,
//! no clock read (times are given).
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports nothing of ours.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// `seqs` as ranges of consecutive numbers (inclusive), in order.
pub(super) fn sequence_ranges(seqs: &[u64]) -> Vec<(u64, u64)> {
    let mut sorted = seqs.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    for seq in sorted {
        match ranges.last_mut() {
            Some((_, hi)) if *hi + 1 == seq => *hi = seq,
            _ => ranges.push((seq, seq)),
        }
    }
    ranges
}

/// Removes the numbers from `lo` to `hi` from the ranges of `map` (first number → last number, and what is
/// kept of the range, which the parts left keep), and returns the ranges removed.
pub(super) fn take_range<V: Copy>(map: &mut BTreeMap<u64, (u64, V)>, lo: u64, hi: u64) -> Vec<(u64, u64)> {
    let overlapping: Vec<(u64, (u64, V))> =
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

/// Removes `seq` from the range of `gaps` (first number → last number, and what is kept of the range)
/// that contains it, splitting the range.
pub(super) fn fill_gap<V: Copy>(gaps: &mut BTreeMap<u64, (u64, V)>, seq: u64) {
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

/// The most gap ranges kept per table; past it the lowest two are joined (the rows between them, published
/// or in flight, are read again with them and left alone).
const MAX_GAPS_KEPT: usize = 10_000;

/// The gaps of one table: ranges of sequence numbers (inclusive) by first number, with their last number.
#[derive(Default)]
pub(super) struct Gaps(BTreeMap<u64, (u64, Gap)>);

/// What is known of one gap range.
#[derive(Debug, Clone, Copy)]
struct Gap {
    /// When a read passed it (the latest of joined ranges).
    passed: Instant,
    /// No transaction that could still commit a row in it is open: read once more, then forgotten.
    proven: bool,
}

impl Gaps {
    /// A read passed `lo..=hi` without a row, `now`.
    pub(super) fn pass(&mut self, lo: u64, hi: u64, now: Instant) {
        self.0.insert(lo, (hi, Gap { passed: now, proven: false }));
        while self.0.len() > MAX_GAPS_KEPT {
            let (Some((lo, (_, a))), Some((_, (hi, b)))) = (self.0.pop_first(), self.0.pop_first()) else {
                break;
            };
            self.0.insert(lo, (hi, Gap { passed: a.passed.max(b.passed), proven: a.proven && b.proven }));
        }
    }

    /// A row with sequence number `seq` was read: not a gap.
    pub(super) fn fill(&mut self, seq: u64) {
        fill_gap(&mut self.0, seq);
    }

    /// Whether some gap is not proven yet.
    pub(super) fn waiting(&self) -> bool {
        self.0.values().any(|(_, gap)| !gap.proven)
    }

    /// Every gap passed at or before `cutoff` is proven.
    pub(super) fn prove(&mut self, cutoff: Instant) {
        for (_, gap) in self.0.values_mut() {
            gap.proven |= gap.passed <= cutoff;
        }
    }

    /// The gap ranges, in order, each with whether it is proven.
    pub(super) fn listed(&self) -> Vec<(u64, u64, bool)> {
        self.0.iter().map(|(lo, (hi, gap))| (*lo, *hi, gap.proven)).collect()
    }

    /// Forgets the gaps from `lo` to `hi`; returns the ranges forgotten.
    pub(super) fn forget(&mut self, lo: u64, hi: u64) -> Vec<(u64, u64)> {
        take_range(&mut self.0, lo, hi)
    }

    /// Forgets the gaps above `seq` (passed by a read in order the run did not take).
    pub(super) fn forget_above(&mut self, seq: u64) {
        if seq < u64::MAX {
            take_range(&mut self.0, seq + 1, u64::MAX);
        }
    }

    /// Forgets every gap (the sequence started again).
    pub(super) fn clear(&mut self) {
        self.0.clear();
    }

    /// The gap ranges, in order.
    pub(super) fn ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.0.iter().map(|(lo, (hi, _))| (*lo, *hi))
    }
}

/// The proof under way, for every table of a run: the cut a listing of the open writers started.
#[derive(Default)]
pub(super) struct GapProof {
    /// The newest writer a listing saw open, and when that listing was sent: every gap passed `lag` before
    /// then is proven once no writer up to it is open.
    cut: Option<(u64, Instant)>,
    /// When the last listing was sent.
    listed: Option<Instant>,
    /// Since when every listing came back stale, and when that was last said.
    stale: Option<(Instant, Instant)>,
}

impl GapProof {
    /// Whether a listing is due at `now`: gaps wait (`waiting`) or a cut is under way, and the last
    /// listing was sent `every` ago or more.
    pub(super) fn due(&self, waiting: bool, now: Instant, every: Duration) -> bool {
        (waiting || self.cut.is_some()) && self.listed.is_none_or(|at| now.saturating_duration_since(at) >= every)
    }

    /// A fresh listing sent at `sent` saw the open writers `oldest..=newest` (`None`: none): ends the cut
    /// under way if every writer it saw has ended, starts the next one. Returns the cutoff: every gap
    /// passed `lag` or more before the listing that started the cut ended is proven.
    pub(super) fn listed(
        &mut self,
        sent: Instant,
        (oldest, newest): (Option<u64>, Option<u64>),
        lag: Duration,
    ) -> Option<Instant> {
        self.listed = Some(sent);
        self.stale = None;
        let mut cutoff = None;
        if let Some((seen, at)) = self.cut {
            if oldest.is_none_or(|oldest| oldest > seen) {
                cutoff = at.checked_sub(lag);
                self.cut = None;
            }
        }
        if self.cut.is_none() {
            match newest {
                None => cutoff = sent.checked_sub(lag),
                Some(newest) => self.cut = Some((newest, sent)),
            }
        }
        cutoff
    }

    /// A stale listing sent at `sent`: proves nothing. Returns how long listings have been stale when that
    /// is to be said (the first time after `say_every`, then every `say_every`).
    pub(super) fn stale(&mut self, sent: Instant, say_every: Duration) -> Option<Duration> {
        self.listed = Some(sent);
        let (since, said) = self.stale.get_or_insert((sent, sent));
        if sent.saturating_duration_since(*said) < say_every {
            return None;
        }
        *said = sent;
        Some(sent.saturating_duration_since(*since))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    /// Consecutive numbers become one range; a number missing between two splits them.
    #[test]
    fn marked_numbers_become_exact_ranges() {
        assert_eq!(sequence_ranges(&[7, 3, 4, 5, 9, 10, 12, 4]), [(3, 5), (7, 7), (9, 10), (12, 12)]);
        assert!(sequence_ranges(&[]).is_empty());
    }

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

    fn ranges(gaps: &Gaps) -> Vec<(u64, u64, bool)> {
        gaps.0.iter().map(|(lo, (hi, gap))| (*lo, *hi, gap.proven)).collect()
    }

    /// Gaps passed at or before the cutoff are proven, later ones wait; a filled number splits its range
    /// and the parts keep what was known of it.
    #[test]
    fn gaps_are_proven_by_when_they_were_passed() {
        let start = Instant::now();
        let mut gaps = Gaps::default();
        gaps.pass(3, 5, start);
        gaps.pass(9, 9, start + Duration::from_secs(1));
        gaps.prove(start);
        gaps.fill(4);
        assert_eq!(ranges(&gaps), [(3, 3, true), (5, 5, true), (9, 9, false)]);
        assert!(gaps.waiting());
        gaps.prove(start + Duration::from_secs(1));
        assert!(!gaps.waiting());
    }

    /// Past the most ranges kept, the lowest two are joined: proven only if both were, passed when the
    /// later was.
    #[test]
    fn the_lowest_ranges_are_joined_past_the_limit() {
        let start = Instant::now();
        let mut gaps = Gaps::default();
        for i in 0..=MAX_GAPS_KEPT as u64 {
            gaps.pass(10 * i + 1, 10 * i + 2, start + Duration::from_millis(i));
        }
        gaps.0.get_mut(&1).expect("first").1.proven = true;
        gaps.pass(u64::MAX - 1, u64::MAX - 1, start);
        assert_eq!(gaps.0.len(), MAX_GAPS_KEPT);
        let (lo, (hi, gap)) = gaps.0.iter().next().map(|(lo, v)| (*lo, *v)).expect("first");
        assert_eq!((lo, hi), (1, 22), "the three lowest, joined twice");
        assert!(!gap.proven);
        assert_eq!(gap.passed, start + Duration::from_millis(2));
    }

    /// A cut ends when the oldest open writer is newer than the newest it saw, proving the gaps passed
    /// `lag` before the listing that started it; with no writer open, a listing proves at once.
    #[test]
    fn a_cut_ends_when_every_writer_it_saw_has_ended() {
        let (start, lag) = (Instant::now(), Duration::from_millis(250));
        let second = Duration::from_secs(1);
        let mut proof = GapProof::default();
        assert!(proof.due(true, start, lag) && !proof.due(false, start, lag));
        assert_eq!(proof.listed(start + second, (Some(5), Some(9)), lag), None, "a cut at 9 starts");
        assert!(!proof.due(true, start + second, lag), "listed just now");
        assert_eq!(proof.listed(start + 2 * second, (Some(9), Some(12)), lag), None, "9 is still open");
        let ended = proof.listed(start + 3 * second, (Some(10), Some(12)), lag);
        assert_eq!(ended, Some(start + second - lag), "every writer up to 9 ended");
        assert_eq!(proof.cut.map(|(newest, _)| newest), Some(12), "the next cut starts at once");
        let mut idle = GapProof::default();
        assert_eq!(idle.listed(start + second, (None, None), lag), Some(start + second - lag));
        assert!(!idle.due(false, start + 2 * second, lag), "nothing waits, no cut");
    }

    /// A stale listing is said after the period, then once per period.
    #[test]
    fn stale_listings_are_said_once_per_period() {
        let (start, every) = (Instant::now(), Duration::from_secs(30));
        let mut proof = GapProof::default();
        assert_eq!(proof.stale(start, every), None);
        assert_eq!(proof.stale(start + Duration::from_secs(31), every), Some(Duration::from_secs(31)));
        assert_eq!(proof.stale(start + Duration::from_secs(40), every), None);
        proof.listed(start + Duration::from_secs(41), (None, None), Duration::ZERO);
        assert_eq!(proof.stale(start + Duration::from_secs(42), every), None, "fresh again in between");
    }
}
