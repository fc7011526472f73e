//! Positions in a binlog: what a stream has seen, and where it resumes.
//!
//! Floor 0, the ground floor (docs/ARCHITECTURE.md): imports nothing of ours but other ground-floor modules.
//!
//! A [`Position`] is the transaction boundary after which a stream resumes. It pairs the GTID
//! state at that boundary ([`Gtids`]) with the binlog file and byte offset ([`BinlogCoord`]) that
//! the server reported for it. Which half is authoritative depends on the server:
//!
//! * MySQL with `gtid_mode=ON`: the [`mysql::GtidSet`] of every transaction already seen. A
//!   stream resumes with `COM_BINLOG_DUMP_GTID`, and the server skips exactly that set, so a
//!   resume never depends on file names that differ between a primary and its replicas.
//! * MariaDB: the [`mariadb::GtidPos`], one last-seen GTID per replication domain, sent as
//!   `@slave_connect_state`.
//! * MySQL with `gtid_mode=OFF` ([`Gtids::None`]): only the file and byte offset exist, and they
//!   are only meaningful on the server that wrote them.
//!
//! The coordinate travels with GTID positions anyway, because operators read file and offset in
//! `SHOW BINARY LOG STATUS` and in `mysqlbinlog`, and a message that names both lets them find
//! the spot.
//!
//! # Invariants
//!
//! * Every value is stored in one canonical form, so `==` means "same canonical text" and
//!   `parse(display(x)) == x`. `compare` may be coarser than `==` (MariaDB's `0-1-0` holds no
//!   transaction and compares `Equal` to the empty position), never finer.
//! * GTID state is partially ordered. `compare` answers `None` for incomparable states (two
//!   histories that each saw something the other did not) and never picks a winner: a resume
//!   point chosen by guessing is how a connector skips or replays transactions silently.
//! * Parsing is strict. A checkpoint that does not parse cleanly is a definite error for the
//!   operator, never a value we repair, because a repaired position silently moves the stream.
//!
//! # Error handling
//!
//! Every parser returns [`PositionParseError`]; each variant names the offending token, and the
//! caller adds where it came from (server variable, checkpoint record). These errors are
//! definite: retrying the same text cannot succeed.
//!
//! # Why not strings, or `mysql_common`'s types
//!
//! A GTID set kept as a string cannot answer "is this transaction already delivered?" and two
//! spellings of one set compare unequal. `mysql_common` has wire structs (`Sid`, `GnoInterval`)
//! but no set algebra and no MariaDB positions; those wire structs are built from
//! [`mysql::GtidSet::iter`], whose half-open ranges map onto `GnoInterval` one to one.
//!
//! # Serialized form
//!
//! Checkpoint records are human-readable JSON, so every GTID type serializes as its `Display`
//! string, and a [`Position`] as an object:
//! `{"flavor":"mariadb","gtids":"0-1-42","file":"mysql-bin.000003","pos":1234}`, with `"flavor"`
//! one of `"mysql"`, `"mariadb"`, `"none"` (and `"gtids"` absent for `"none"`). Unknown fields
//! are rejected: a field we do not understand in a position could change where we resume.

use std::cmp::Ordering;
use std::fmt;

use serde::{Deserialize, Serialize};

/// Serializes a type as its `Display` string and deserializes it through `FromStr`, so that
/// checkpoint records show GTIDs the way MySQL and MariaDB print them.
macro_rules! serde_as_string {
    ($($ty:ty),* $(,)?) => {$(
        impl Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }

        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                String::deserialize(deserializer)?
                    .parse()
                    .map_err(serde::de::Error::custom)
            }
        }
    )*};
}

pub mod mariadb;
pub mod mysql;
pub mod on_demand;
pub mod server;
pub mod snapshot;
pub mod tx;

pub use server::{EndEvent, ServerIdentity, EVENT_HEADER_LEN};
pub use tx::{TxGtid, TxProgress, TxStart};

serde_as_string!(mysql::Uuid, mysql::Tag, mysql::Gtid, mysql::GtidSet, mariadb::MariaGtid, mariadb::GtidPos,);

/// Why a GTID, GTID set, GTID position or position record could not be parsed.
///
/// Each variant names the offending token; callers add where the text came from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PositionParseError {
    /// A MySQL server UUID was not 32 hex digits grouped 8-4-4-4-12.
    #[error("invalid server UUID {input:?}: expected 32 hex digits grouped 8-4-4-4-12")]
    Uuid {
        /// The rejected text.
        input: String,
    },
    /// A MySQL 8.4 GTID tag broke the tag rules.
    #[error("invalid GTID tag {input:?}: {reason}")]
    Tag {
        /// The rejected text.
        input: String,
        /// Which rule it broke.
        reason: &'static str,
    },
    /// A number was not plain decimal, or was outside its range.
    #[error(
        "invalid {what} {input:?}: expected a decimal integer in {min}..={max}, \
         without sign or leading zeros"
    )]
    Number {
        /// Which number: "GNO", "domain id", …
        what: &'static str,
        /// The rejected text.
        input: String,
        /// Smallest accepted value.
        min: u64,
        /// Largest accepted value.
        max: u64,
    },
    /// A GTID interval `a-b` with `b < a`, or an empty wire range.
    #[error("invalid GTID interval {input:?}: it ends before it starts")]
    ReversedInterval {
        /// The rejected interval.
        input: String,
    },
    /// A server UUID or tag in a GTID set with no interval after it.
    #[error(
        "GTID set element {input:?} names a server UUID or tag without any interval; \
         the text looks truncated"
    )]
    NoIntervals {
        /// The element (one comma-separated part of the set).
        input: String,
    },
    /// The text does not have the shape of what was being parsed.
    #[error("malformed {what} {input:?}: expected {expected}")]
    Syntax {
        /// What was being parsed.
        what: &'static str,
        /// The rejected text.
        input: String,
        /// The shape that was expected.
        expected: &'static str,
    },
    /// A MariaDB GTID position listed the same domain twice.
    #[error(
        "GTID position lists domain {domain} twice ({first} and {second}); a position holds \
         one GTID per domain (did this come from @@gtid_binlog_state?)"
    )]
    DuplicateDomain {
        /// The repeated domain.
        domain: u32,
        /// The first GTID seen for it.
        first: String,
        /// The second GTID seen for it.
        second: String,
    },
    /// A stored position record whose `flavor` and `gtids` disagree.
    #[error("invalid position record: flavor {flavor:?} {problem}")]
    Record {
        /// The record's flavor.
        flavor: &'static str,
        /// What is inconsistent.
        problem: &'static str,
    },
}

/// Parses an unsigned decimal in `min..=max`.
///
/// Signs, whitespace and leading zeros are refused: MySQL reads GNOs with `strtoll(…, 0)`, so
/// `010` means 8 to the server, and accepting it here would silently disagree with it.
fn parse_decimal(input: &str, what: &'static str, min: u64, max: u64) -> Result<u64, PositionParseError> {
    let error = || PositionParseError::Number { what, input: input.to_owned(), min, max };
    let canonical =
        !input.is_empty() && input.bytes().all(|b| b.is_ascii_digit()) && (input == "0" || !input.starts_with('0'));
    if !canonical {
        return Err(error());
    }
    match input.parse::<u64>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(error()),
    }
}

/// Which server family wrote the binlog.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Flavor {
    /// Oracle MySQL (and Percona Server): GTID sets of `uuid:intervals`.
    MySql,
    /// MariaDB: one `domain-server-seq` GTID per replication domain.
    MariaDb,
}

impl fmt::Display for Flavor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Flavor::MySql => "mysql",
            Flavor::MariaDb => "mariadb",
        })
    }
}

/// A binlog file + byte offset. For display, and the resume point for MySQL servers with
/// `gtid_mode=OFF`.
///
/// Coordinates are only comparable on the server that wrote them; a replica numbers its own
/// binlog files.
///
/// # Ordering
///
/// Ordered by file, then `pos`. Servers name files `<basename>.<NNNNNN>` with a zero-padded
/// suffix, so names of one server sort lexicographically in write order up to `.999999`; the
/// suffix then grows to seven digits (`.1000000`), which sorts *before* `.999999` as a string.
/// Servers that run `FLUSH BINARY LOGS` every few minutes reach that in a few years, so the
/// numeric suffix of two files with the same basename is compared as a number, and only then
/// as a string (which keeps the order total and consistent with `==`). Files with different
/// basenames compare by basename, which has no meaning beyond being deterministic.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BinlogCoord {
    /// Binlog file name as the server reports it, e.g. `mysql-bin.000003` (no directory).
    pub file: String,
    /// Byte offset inside `file`, as `SHOW BINARY LOG STATUS` and event headers report it.
    pub pos: u64,
}

impl BinlogCoord {
    /// The key that orders file names: basename, then the numeric suffix as a number, then
    /// the full name as a tie-break for suffixes such as `007` and `7`.
    fn file_order_key(&self) -> (&str, Option<u64>, &str) {
        match self.file.rsplit_once('.') {
            Some((stem, suffix)) if !suffix.is_empty() && suffix.bytes().all(|b| b.is_ascii_digit()) => {
                (stem, suffix.parse().ok(), &self.file)
            }
            _ => (&self.file, None, &self.file),
        }
    }
}

impl Ord for BinlogCoord {
    fn cmp(&self, other: &Self) -> Ordering {
        self.file_order_key().cmp(&other.file_order_key()).then(self.pos.cmp(&other.pos))
    }
}

impl PartialOrd for BinlogCoord {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for BinlogCoord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file, self.pos)
    }
}

/// The GTID state at a point in the binlog.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Gtids {
    /// MySQL with `gtid_mode=ON`: every transaction seen so far.
    MySql(mysql::GtidSet),
    /// MariaDB: the last GTID seen in each replication domain.
    MariaDb(mariadb::GtidPos),
    /// No GTIDs (MySQL with `gtid_mode=OFF`): the file coordinate is the only position.
    None,
}

impl Gtids {
    /// True when no transaction is recorded: an empty set or position, or no GTIDs at all.
    pub fn is_empty(&self) -> bool {
        match self {
            Gtids::MySql(set) => set.is_empty(),
            Gtids::MariaDb(pos) => pos.is_empty(),
            Gtids::None => true,
        }
    }

    /// Whether every transaction recorded here is also recorded in `other`; `None` when the two cannot be
    /// compared by GTIDs (different server families, or no GTIDs: compare file coordinates then).
    pub fn is_within(&self, other: &Gtids) -> Option<bool> {
        let order = match (self, other) {
            (Gtids::MySql(a), Gtids::MySql(b)) => a.compare(b),
            (Gtids::MariaDb(a), Gtids::MariaDb(b)) => a.compare(b),
            _ => return None,
        };
        // Incomparable states (`None`: each holds a transaction the other lacks) are not within.
        Some(matches!(order, Some(Ordering::Less | Ordering::Equal)))
    }

    /// The server family these GTIDs belong to; `None` when there are no GTIDs.
    pub fn flavor(&self) -> Option<Flavor> {
        match self {
            Gtids::MySql(_) => Some(Flavor::MySql),
            Gtids::MariaDb(_) => Some(Flavor::MariaDb),
            Gtids::None => None,
        }
    }
}

/// A point in the binlog: the transaction boundary after which a stream resumes.
///
/// Serializes as `{"flavor":"mysql"|"mariadb"|"none","gtids":"<text>","file":"…","pos":N}`;
/// `gtids` is omitted for `"none"` (and may be `null` on input).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "PositionRecord", into = "PositionRecord")]
pub struct Position {
    /// GTID state after the last transaction before this point.
    pub gtids: Gtids,
    /// Where that boundary is in the server's binlog files.
    pub coord: BinlogCoord,
}

impl fmt::Display for Gtids {
    /// The GTID state in the server's own notation; empty without GTIDs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Gtids::MySql(set) => write!(f, "{set}"),
            Gtids::MariaDb(pos) => write!(f, "{pos}"),
            Gtids::None => Ok(()),
        }
    }
}

impl fmt::Display for Position {
    /// `gtid 0-1-42 (mysql-bin.000003:1234)`, `gtid <empty> (…)` for an empty GTID state, and
    /// `mysql-bin.000003:1234 (no GTIDs)` without GTIDs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.gtids {
            Gtids::None => write!(f, "{} (no GTIDs)", self.coord),
            gtids if gtids.is_empty() => write!(f, "gtid <empty> ({})", self.coord),
            Gtids::MySql(set) => write!(f, "gtid {set} ({})", self.coord),
            Gtids::MariaDb(pos) => write!(f, "gtid {pos} ({})", self.coord),
        }
    }
}

/// The stored shape of a [`Position`]; kept private so the JSON layout is decided here only.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PositionRecord {
    flavor: RecordFlavor,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gtids: Option<String>,
    file: String,
    pos: u64,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum RecordFlavor {
    MySql,
    MariaDb,
    None,
}

impl From<Position> for PositionRecord {
    fn from(position: Position) -> Self {
        let (flavor, gtids) = match &position.gtids {
            Gtids::MySql(set) => (RecordFlavor::MySql, Some(set.to_string())),
            Gtids::MariaDb(pos) => (RecordFlavor::MariaDb, Some(pos.to_string())),
            Gtids::None => (RecordFlavor::None, None),
        };
        PositionRecord { flavor, gtids, file: position.coord.file, pos: position.coord.pos }
    }
}

impl TryFrom<PositionRecord> for Position {
    type Error = PositionParseError;

    fn try_from(record: PositionRecord) -> Result<Self, Self::Error> {
        let missing = |flavor| PositionParseError::Record {
            flavor,
            problem: "needs a \"gtids\" string (\"\" for an empty GTID state)",
        };
        let gtids = match (record.flavor, record.gtids) {
            (RecordFlavor::MySql, Some(text)) => Gtids::MySql(text.parse()?),
            (RecordFlavor::MariaDb, Some(text)) => Gtids::MariaDb(text.parse()?),
            (RecordFlavor::None, None) => Gtids::None,
            (RecordFlavor::MySql, None) => return Err(missing("mysql")),
            (RecordFlavor::MariaDb, None) => return Err(missing("mariadb")),
            (RecordFlavor::None, Some(_)) => {
                return Err(PositionParseError::Record {
                    flavor: "none",
                    problem: "must not carry \"gtids\"; set flavor to \"mysql\" or \"mariadb\"",
                })
            }
        };
        Ok(Position { gtids, coord: BinlogCoord { file: record.file, pos: record.pos } })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn coord(file: &str, pos: u64) -> BinlogCoord {
        BinlogCoord { file: file.to_owned(), pos }
    }

    fn position(gtids: Gtids) -> Position {
        Position { gtids, coord: coord("mysql-bin.000003", 1234) }
    }

    #[test]
    fn decimal_parsing_is_strict() {
        let cases: &[(&str, Option<u64>)] = &[
            ("0", Some(0)),
            ("42", Some(42)),
            ("18446744073709551615", Some(u64::MAX)),
            ("18446744073709551616", None),
            ("", None),
            ("+1", None),
            ("-1", None),
            (" 1", None),
            ("010", None),
            ("0x10", None),
            ("1e3", None),
        ];
        for &(input, expected) in cases {
            assert_eq!(parse_decimal(input, "n", 0, u64::MAX).ok(), expected, "{input:?}");
        }
        assert!(parse_decimal("5", "n", 6, 9).is_err());
    }

    #[test]
    fn binlog_coords_order_by_file_then_pos() {
        let ordered = [
            coord("mysql-bin.000002", 999_999),
            coord("mysql-bin.000003", 4),
            coord("mysql-bin.000003", 1234),
            coord("mysql-bin.999999", 4),
            // The seven-digit suffix after rollover sorts after `.999999`, unlike the strings.
            coord("mysql-bin.1000000", 4),
        ];
        for pair in ordered.windows(2) {
            assert!(pair[0] < pair[1], "{} < {}", pair[0], pair[1]);
        }
        // Same number, different spelling: distinct, ordered, never equal.
        assert_ne!(coord("b.007", 1).cmp(&coord("b.7", 1)), Ordering::Equal, "order must agree with ==");
        assert!(coord("a.000009", 1) < coord("b.000001", 1));
    }

    #[test]
    fn position_serializes_as_flat_json() {
        let cases = [
            (
                position(Gtids::MariaDb("0-1-42".parse().unwrap())),
                r#"{"flavor":"mariadb","gtids":"0-1-42","file":"mysql-bin.000003","pos":1234}"#,
            ),
            (
                position(Gtids::MySql("3E11FA47-71CA-11E1-9E33-C80AA9429562:1-5".parse().unwrap())),
                r#"{"flavor":"mysql","gtids":"3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5","file":"mysql-bin.000003","pos":1234}"#,
            ),
            (
                position(Gtids::MySql(mysql::GtidSet::new())),
                r#"{"flavor":"mysql","gtids":"","file":"mysql-bin.000003","pos":1234}"#,
            ),
            (position(Gtids::None), r#"{"flavor":"none","file":"mysql-bin.000003","pos":1234}"#),
        ];
        for (value, json) in cases {
            assert_eq!(serde_json::to_string(&value).unwrap(), json);
            assert_eq!(serde_json::from_str::<Position>(json).unwrap(), value);
        }
    }

    #[test]
    fn position_records_that_disagree_are_rejected() {
        let cases = [
            (r#"{"flavor":"none","gtids":null,"file":"f.000001","pos":4}"#, None),
            (r#"{"flavor":"none","gtids":"0-1-2","file":"f.000001","pos":4}"#, Some("must not carry")),
            (r#"{"flavor":"mysql","file":"f.000001","pos":4}"#, Some(r#"needs a "gtids""#)),
            (r#"{"flavor":"mariadb","gtids":"0-1-2,0-2-3","file":"f.000001","pos":4}"#, Some("domain 0 twice")),
            (r#"{"flavor":"mysql","gtids":"0-1-2","file":"f.000001","pos":4}"#, Some("invalid server UUID")),
            (r#"{"flavor":"postgres","gtids":"","file":"f.000001","pos":4}"#, Some("unknown variant")),
            (r#"{"flavor":"none","file":"f.000001","pos":4,"extra":1}"#, Some("unknown field")),
        ];
        for (json, error) in cases {
            let result = serde_json::from_str::<Position>(json);
            match error {
                None => assert_eq!(result.unwrap().gtids, Gtids::None, "{json}"),
                Some(needle) => {
                    let message = result.unwrap_err().to_string();
                    assert!(message.contains(needle), "{json}: {message}");
                }
            }
        }
    }

    #[test]
    fn gtid_types_serialize_as_strings() {
        let gtid: mysql::Gtid = "3e11fa47-71ca-11e1-9e33-c80aa9429562:domain_1:7".parse().unwrap();
        let json = serde_json::to_string(&gtid).unwrap();
        assert_eq!(json, r#""3e11fa47-71ca-11e1-9e33-c80aa9429562:domain_1:7""#);
        assert_eq!(serde_json::from_str::<mysql::Gtid>(&json).unwrap(), gtid);

        let maria: mariadb::MariaGtid = serde_json::from_str(r#""1-10-12""#).unwrap();
        assert_eq!(maria.seq_no, 12);
        assert!(serde_json::from_str::<mariadb::GtidPos>(r#""0-1""#).is_err());
    }

    #[test]
    fn position_display_names_gtids_and_coordinate() {
        let cases = [
            (position(Gtids::MariaDb("0-1-42".parse().unwrap())), "gtid 0-1-42 (mysql-bin.000003:1234)"),
            (position(Gtids::MySql(mysql::GtidSet::new())), "gtid <empty> (mysql-bin.000003:1234)"),
            (position(Gtids::None), "mysql-bin.000003:1234 (no GTIDs)"),
        ];
        for (value, text) in cases {
            assert_eq!(value.to_string(), text);
        }
    }

    #[test]
    fn gtids_report_emptiness_and_flavor() {
        let cases = [
            (Gtids::None, true, None),
            (Gtids::MySql(mysql::GtidSet::new()), true, Some(Flavor::MySql)),
            (Gtids::MariaDb("0-1-1".parse().unwrap()), false, Some(Flavor::MariaDb)),
        ];
        for (gtids, empty, flavor) in cases {
            assert_eq!(gtids.is_empty(), empty, "{gtids:?}");
            assert_eq!(gtids.flavor(), flavor, "{gtids:?}");
        }
        assert_eq!(serde_json::to_string(&Flavor::MariaDb).unwrap(), r#""mariadb""#);
        assert_eq!(serde_json::to_string(&Flavor::MySql).unwrap(), r#""mysql""#);
    }
}
