//! MySQL GTID sets, including the tagged GTIDs of MySQL 8.4+.
//!
//! Floor 0, the ground floor (docs/ARCHITECTURE.md): imports nothing of ours but other ground-floor modules.
//!
//! A MySQL GTID is `uuid:gno`: the UUID of the server that committed the transaction and a
//! transaction number (GNO) that the server counts up from 1. MySQL 8.4 adds an optional tag,
//! `uuid:tag:gno`, and each (uuid, tag) pair numbers its transactions independently. A server's
//! state is the *set* of GTIDs it has executed, printed by `@@gtid_executed` and
//! `SHOW BINARY LOG STATUS` as
//!
//! ```text
//! 3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5:11:domain_1:1-3:7,
//! 4c2ad77f-697e-11e3-b2e2-c80aa9429562:1-9
//! ```
//!
//! Elements are separated by commas (MySQL adds a newline after each). In an element, the UUID
//! is followed by a `:`-separated list in which an interval (`a-b` or `n`) applies to the
//! current tag and a tag token switches the current tag; intervals before the first tag are
//! untagged. The example holds untagged 1-5 and 11, and tag `domain_1` 1-3 and 7.
//!
//! Sets have gaps (a replica that skipped transactions, a purged and re-applied range), which
//! is why a set and not a high-water mark is the resume point: `COM_BINLOG_DUMP_GTID` sends
//! the set, and the server streams every transaction not in it.
//!
//! # Invariants
//!
//! * [`GtidSet`] is canonical: per UUID, per tag (untagged first, then tags in byte order),
//!   GNO ranges are sorted, non-empty, disjoint and non-adjacent (`1-3` and `4-6` are stored
//!   as `1-6`). Empty tags and UUIDs are removed, so `==` is set equality.
//! * GNOs are in `1..=`[`MAX_GNO`].
//! * Ranges are stored **half-open**, `start..end` with `end` exclusive, like MySQL's own
//!   `Gtid_set::Interval` and the wire's `GnoInterval`. The text form is closed (`1-5` means
//!   1 to 5 inclusive); the conversion between the two lives in one place, next to a
//!   `// NOTE:`, and nothing else adds or subtracts one.
//! * Tags are stored lower-cased; MySQL treats `Domain_1` and `domain_1` as one tag.
//!
//! # Why not …
//!
//! * *A high-water GNO per UUID*: it cannot represent gaps, and a resume request that claims
//!   a gap as executed makes the server skip those transactions for good.
//! * *Guessing an order for incomparable sets*: [`GtidSet::compare`] answers `None` instead;
//!   two sets that each hold a transaction the other lacks come from diverged histories, and
//!   only the operator can say which one the stream should follow.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::str::FromStr;

use super::{parse_decimal, PositionParseError};

/// The largest GNO MySQL generates or accepts: `2^63 - 2`.
///
/// MySQL stores intervals half-open in signed 64-bit integers, so the exclusive end of the
/// last possible interval, `MAX_GNO + 1`, must still fit in an `i64` on the wire; its parser
/// rejects `2^63 - 1` for that reason.
pub const MAX_GNO: u64 = i64::MAX as u64 - 1;

/// Sorted, disjoint, non-adjacent, non-empty half-open GNO ranges.
type Intervals = Vec<Range<u64>>;

// NOTE: The closed-vs-half-open trap lives here and nowhere else. MySQL's text form is closed
// (`1-5` is 1..=5, `7` is 7..=7); its wire form (`GnoInterval`, PREVIOUS_GTIDS) and this
// module's storage are half-open (1..6, 7..8). Parsing, printing and single-GTID inserts go
// through these two functions; every other function reasons in half-open ranges only.
// `last + 1` cannot overflow because `last <= MAX_GNO < u64::MAX`.
fn from_closed(first: u64, last: u64) -> Range<u64> {
    first..last + 1
}

fn to_closed(range: &Range<u64>) -> (u64, u64) {
    (range.start, range.end - 1)
}

/// A server UUID (`server_uuid`), the source half of a MySQL GTID.
///
/// Parsed case-insensitively from the hyphenated 8-4-4-4-12 form, printed lower-case. Orders
/// by bytes, which is the order MySQL prints UUIDs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Uuid([u8; 16]);

impl Uuid {
    /// The UUID with these 16 bytes, as they appear in binlog events and dump requests.
    pub const fn from_bytes(bytes: [u8; 16]) -> Self {
        Uuid(bytes)
    }

    /// The 16 bytes, as binlog events and `COM_BINLOG_DUMP_GTID` carry them.
    pub const fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

impl FromStr for Uuid {
    type Err = PositionParseError;

    /// # Errors
    ///
    /// [`PositionParseError::Uuid`] unless the text is exactly 32 hex digits grouped
    /// 8-4-4-4-12 (no braces, no surrounding whitespace).
    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let error = || PositionParseError::Uuid { input: input.to_owned() };
        if input.len() != 36 {
            return Err(error());
        }
        let mut bytes = [0u8; 16];
        let mut nibble_index = 0;
        for (i, c) in input.bytes().enumerate() {
            if matches!(i, 8 | 13 | 18 | 23) {
                if c != b'-' {
                    return Err(error());
                }
                continue;
            }
            let nibble = char::from(c).to_digit(16).ok_or_else(error)? as u8;
            let shift = if nibble_index % 2 == 0 { 4 } else { 0 };
            bytes[nibble_index / 2] |= nibble << shift;
            nibble_index += 1;
        }
        Ok(Uuid(bytes))
    }
}

impl fmt::Display for Uuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, byte) in self.0.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                f.write_str("-")?;
            }
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

/// A MySQL 8.4 GTID tag: 1 to 32 characters, `[a-z_][a-z0-9_]*` case-insensitively, stored
/// lower-case. Untagged GTIDs have no `Tag` at all (`Option<Tag>` is `None`), never an empty
/// one.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Tag(String);

impl Tag {
    /// The longest tag MySQL accepts, in characters.
    pub const MAX_LEN: usize = 32;

    /// Validates `input` and lower-cases it.
    ///
    /// # Errors
    ///
    /// [`PositionParseError::Tag`] when `input` is empty, longer than [`Tag::MAX_LEN`], does
    /// not start with a letter or `_`, or contains anything but letters, digits and `_`.
    pub fn new(input: &str) -> Result<Self, PositionParseError> {
        let starts_well = input.bytes().next().is_some_and(|c| c.is_ascii_alphabetic() || c == b'_');
        let reason = if input.is_empty() {
            "a tag has 1 to 32 characters; an untagged GTID has no tag at all"
        } else if !input.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_') {
            "a tag may contain only ASCII letters, digits and `_`"
        } else if !starts_well {
            "a tag must start with a letter or `_`"
        } else if input.len() > Self::MAX_LEN {
            "a tag has at most 32 characters"
        } else {
            return Ok(Tag(input.to_ascii_lowercase()));
        };
        Err(PositionParseError::Tag { input: input.to_owned(), reason })
    }

    /// The tag, lower-case.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for Tag {
    type Err = PositionParseError;

    /// Same as [`Tag::new`].
    ///
    /// # Errors
    ///
    /// See [`Tag::new`].
    fn from_str(input: &str) -> Result<Self, Self::Err> {
        Tag::new(input)
    }
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One MySQL transaction identifier: `uuid:gno`, or `uuid:tag:gno` on 8.4+.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Gtid {
    /// The server that committed the transaction.
    pub uuid: Uuid,
    /// The tag, `None` for untagged transactions.
    pub tag: Option<Tag>,
    /// The transaction number, in `1..=`[`MAX_GNO`].
    pub gno: u64,
}

impl Gtid {
    /// A GTID whose GNO has been checked.
    ///
    /// # Errors
    ///
    /// [`PositionParseError::Number`] when `gno` is not in `1..=`[`MAX_GNO`].
    pub fn new(uuid: Uuid, tag: Option<Tag>, gno: u64) -> Result<Self, PositionParseError> {
        Ok(Gtid { uuid, tag, gno: check_gno(gno)? })
    }
}

impl FromStr for Gtid {
    type Err = PositionParseError;

    /// Parses `uuid:gno` or `uuid:tag:gno`, the form of `gtid_next` and of GTIDs in logs.
    ///
    /// # Errors
    ///
    /// [`PositionParseError::Syntax`] for any other shape, or the error of the part that is
    /// invalid.
    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let mut parts = input.trim().split(':').map(str::trim);
        let (uuid, tag, gno) = match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some(uuid), Some(gno), None, _) => (uuid, None, gno),
            (Some(uuid), Some(tag), Some(gno), None) => (uuid, Some(Tag::new(tag)?), gno),
            _ => {
                return Err(PositionParseError::Syntax {
                    what: "GTID",
                    input: input.to_owned(),
                    expected: "`uuid:gno` or `uuid:tag:gno`",
                })
            }
        };
        Ok(Gtid { uuid: uuid.parse()?, tag, gno: parse_gno(gno)? })
    }
}

impl fmt::Display for Gtid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:", self.uuid)?;
        if let Some(tag) = &self.tag {
            write!(f, "{tag}:")?;
        }
        write!(f, "{}", self.gno)
    }
}

/// A set of MySQL GTIDs, such as `@@gtid_executed`: the transactions a stream has seen.
///
/// See the module documentation for the text form and the invariants.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct GtidSet {
    /// Per UUID, per tag (`None` sorts first, as MySQL prints untagged intervals first).
    /// Neither map nor any interval list is ever empty.
    sets: BTreeMap<Uuid, BTreeMap<Option<Tag>, Intervals>>,
}

impl GtidSet {
    /// The empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// True when the set holds no GTID.
    pub fn is_empty(&self) -> bool {
        self.sets.is_empty()
    }

    /// True when `gtid` is in the set.
    pub fn contains(&self, gtid: &Gtid) -> bool {
        self.intervals(&gtid.uuid, &gtid.tag).is_some_and(|ranges| {
            let i = ranges.partition_point(|r| r.end <= gtid.gno);
            ranges.get(i).is_some_and(|r| r.start <= gtid.gno)
        })
    }

    /// Adds `gtid`, merging it with the ranges it touches. Returns whether it was new.
    ///
    /// # Panics
    ///
    /// When `gtid.gno` is outside `1..=`[`MAX_GNO`]; servers never write such a GNO, and
    /// [`Gtid::new`] and parsing refuse it, so this is a bug in the caller.
    pub fn insert(&mut self, gtid: &Gtid) -> bool {
        assert!(
            (1..=MAX_GNO).contains(&gtid.gno),
            "GTID {gtid} has a GNO outside 1..={MAX_GNO}; build GTIDs with Gtid::new"
        );
        self.add(gtid.uuid, &gtid.tag, from_closed(gtid.gno, gtid.gno))
    }

    /// Adds the half-open range `range` (`end` exclusive) of GNOs for `uuid` and `tag`, as a
    /// PREVIOUS_GTIDS event or `GnoInterval` carries it. Returns whether anything was new.
    ///
    /// # Errors
    ///
    /// [`PositionParseError::ReversedInterval`] for an empty range and
    /// [`PositionParseError::Number`] when it reaches outside `1..=`[`MAX_GNO`]; the set is
    /// unchanged.
    pub fn insert_range(
        &mut self,
        uuid: Uuid,
        tag: Option<Tag>,
        range: Range<u64>,
    ) -> Result<bool, PositionParseError> {
        if range.start >= range.end {
            return Err(PositionParseError::ReversedInterval { input: format!("[{}, {})", range.start, range.end) });
        }
        check_gno(range.start)?;
        check_gno(range.end - 1)?;
        Ok(self.add(uuid, &tag, range))
    }

    /// Adds every GTID of `other`.
    pub fn union(&mut self, other: &GtidSet) {
        for (uuid, tag, ranges) in other.iter() {
            let tag = tag.cloned();
            for range in ranges {
                self.add(*uuid, &tag, range.clone());
            }
        }
    }

    /// True when every GTID of `self` is in `other`.
    pub fn is_subset(&self, other: &GtidSet) -> bool {
        self.iter().all(|(uuid, tag, ranges)| {
            other
                .sets
                .get(uuid)
                .and_then(|tags| tags.get(&tag.cloned()))
                .is_some_and(|theirs| ranges.iter().all(|r| covers(theirs, r)))
        })
    }

    /// How `self` relates to `other` as sets: `Equal`, `Less` (strict subset), `Greater`
    /// (strict superset), or `None` when each holds a GTID the other lacks. `None` is a real
    /// answer, never a failure to decide: the two sets describe diverged histories.
    pub fn compare(&self, other: &GtidSet) -> Option<Ordering> {
        match (self.is_subset(other), other.is_subset(self)) {
            (true, true) => Some(Ordering::Equal),
            (true, false) => Some(Ordering::Less),
            (false, true) => Some(Ordering::Greater),
            (false, false) => None,
        }
    }

    /// Every (uuid, tag, ranges) group in canonical order: UUIDs ascending, untagged before
    /// tags, tags ascending. Each range is **half-open**, `start..end` with `end` exclusive,
    /// which is what `COM_BINLOG_DUMP_GTID` (`mysql_common`'s `GnoInterval::new(start, end)`)
    /// expects; ranges are sorted, non-empty, and never touch.
    pub fn iter(&self) -> impl Iterator<Item = (&Uuid, Option<&Tag>, &[Range<u64>])> + '_ {
        self.sets
            .iter()
            .flat_map(|(uuid, tags)| tags.iter().map(move |(tag, ranges)| (uuid, tag.as_ref(), ranges.as_slice())))
    }

    fn intervals(&self, uuid: &Uuid, tag: &Option<Tag>) -> Option<&Intervals> {
        self.sets.get(uuid)?.get(tag)
    }

    fn add(&mut self, uuid: Uuid, tag: &Option<Tag>, range: Range<u64>) -> bool {
        let ranges = self.sets.entry(uuid).or_default().entry(tag.clone()).or_default();
        add_range(ranges, range)
    }

    /// Adds one comma-separated element: `uuid(:interval|:tag)*`.
    fn add_element(&mut self, element: &str) -> Result<(), PositionParseError> {
        let no_intervals = || PositionParseError::NoIntervals { input: element.to_owned() };
        let mut tokens = element.split(':').map(str::trim);
        let uuid: Uuid = tokens.next().unwrap_or_default().parse()?;
        let mut tag = None;
        // A tag may follow the UUID or an interval. A tag followed by a tag, or nothing after
        // the last UUID or tag, is what truncated text looks like, so it is refused.
        let mut just_after_uuid = true;
        let mut current_has_interval = false;
        for token in tokens {
            if token.starts_with(|c: char| c.is_ascii_digit()) {
                self.add(uuid, &tag, parse_interval(token)?);
                current_has_interval = true;
            } else if token.is_empty() {
                return Err(PositionParseError::Syntax {
                    what: "GTID set element",
                    input: element.to_owned(),
                    expected: "a tag or an interval between each pair of `:`",
                });
            } else {
                let next = Tag::new(token)?;
                if !just_after_uuid && !current_has_interval {
                    return Err(no_intervals());
                }
                tag = Some(next);
                current_has_interval = false;
            }
            just_after_uuid = false;
        }
        if !current_has_interval {
            return Err(no_intervals());
        }
        Ok(())
    }
}

impl FromStr for GtidSet {
    type Err = PositionParseError;

    /// Parses what MySQL prints for `@@gtid_executed`, `@@gtid_purged` and
    /// `SHOW BINARY LOG STATUS`: comma-separated elements with any whitespace (MySQL puts a
    /// newline after each comma), UUIDs in either case, intervals in any order and possibly
    /// overlapping, a UUID possibly repeated, tags anywhere after the UUID. Empty or
    /// all-whitespace text is the empty set, and empty elements (`a,,b`) are skipped, as
    /// MySQL does.
    ///
    /// # Errors
    ///
    /// A malformed UUID, tag or GNO; GNO 0 or above [`MAX_GNO`]; an interval `a-b` with
    /// `b < a`; a UUID or tag without intervals. Decimal GNOs only: MySQL would read `010`
    /// as octal, so leading zeros are refused rather than guessed at.
    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let mut set = GtidSet::new();
        for element in input.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            set.add_element(element)?;
        }
        Ok(set)
    }
}

impl fmt::Display for GtidSet {
    /// The canonical form, MySQL's without the newlines: lower-case UUIDs ascending joined by
    /// `,`; per UUID the untagged intervals, then each tag with its intervals. The empty set
    /// prints as the empty string.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (uuid, tags)) in self.sets.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{uuid}")?;
            for (tag, ranges) in tags {
                if let Some(tag) = tag {
                    write!(f, ":{tag}")?;
                }
                for range in ranges {
                    match to_closed(range) {
                        (first, last) if first == last => write!(f, ":{first}")?,
                        (first, last) => write!(f, ":{first}-{last}")?,
                    }
                }
            }
        }
        Ok(())
    }
}

fn parse_gno(text: &str) -> Result<u64, PositionParseError> {
    parse_decimal(text, "GNO", 1, MAX_GNO)
}

fn check_gno(gno: u64) -> Result<u64, PositionParseError> {
    if (1..=MAX_GNO).contains(&gno) {
        Ok(gno)
    } else {
        Err(PositionParseError::Number { what: "GNO", input: gno.to_string(), min: 1, max: MAX_GNO })
    }
}

/// Parses a text interval, `a-b` or `n`, both ends inclusive.
fn parse_interval(token: &str) -> Result<Range<u64>, PositionParseError> {
    let (first, last) = match token.split_once('-') {
        Some((first, last)) => (parse_gno(first.trim())?, parse_gno(last.trim())?),
        None => {
            let gno = parse_gno(token)?;
            (gno, gno)
        }
    };
    if last < first {
        return Err(PositionParseError::ReversedInterval { input: token.to_owned() });
    }
    Ok(from_closed(first, last))
}

/// Adds non-empty `range` to canonical `ranges`, merging everything it overlaps or touches.
/// Returns whether any GNO was new.
fn add_range(ranges: &mut Intervals, range: Range<u64>) -> bool {
    // Ranges before `lo` end before `range` starts without touching it; ranges from `hi` on
    // start after it ends. Everything in between overlaps or touches and merges into one.
    let lo = ranges.partition_point(|r| r.end < range.start);
    let hi = ranges.partition_point(|r| r.start <= range.end);
    if lo == hi {
        ranges.insert(lo, range);
        return true;
    }
    let (first, last) = (&ranges[lo], &ranges[hi - 1]);
    if hi == lo + 1 && first.start <= range.start && range.end <= first.end {
        return false;
    }
    let merged = first.start.min(range.start)..last.end.max(range.end);
    ranges.splice(lo..hi, std::iter::once(merged));
    true
}

/// True when `range` lies inside one of canonical `ranges`. Canonical ranges never touch, so
/// a covered range is always inside a single one: the first that ends at or after it.
fn covers(ranges: &[Range<u64>], range: &Range<u64>) -> bool {
    let i = ranges.partition_point(|r| r.end < range.end);
    ranges.get(i).is_some_and(|r| r.start <= range.start)
}

#[cfg(test)]
mod tests;
