//! Ranges of sequence numbers, the relay's arithmetic: numbers marked together (as ranges, in one
//! statement), gaps a read passed (a number filled splits its range), numbers taken out of the ranges kept.
//! Pure: no statement, no clock read.
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports nothing of ours.

use std::collections::BTreeMap;
use std::time::Instant;

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

/// Removes the numbers from `lo` to `hi` from the ranges of `map` (first number → last number, when
/// seen), and returns the ranges removed.
pub(super) fn take_range(map: &mut BTreeMap<u64, (u64, Instant)>, lo: u64, hi: u64) -> Vec<(u64, u64)> {
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

/// Removes `seq` from the gap range that contains it, splitting the range.
pub(super) fn fill_gap(gaps: &mut BTreeMap<u64, (u64, Instant)>, seq: u64) {
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
}
