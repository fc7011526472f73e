//! A source transaction's identity, and the one answer to "does this position hold that transaction".
//!
//! Floor 0, the ground floor (docs/ARCHITECTURE.md): imports nothing of ours but other ground-floor modules.
//!
//! # Without comparable GTIDs
//! GTIDs answer exactly, across servers and failovers. When the position or the transaction has none (MySQL
//! with `gtid_mode=OFF`, an anonymous transaction, binlog files of such a server), only the binlog
//! coordinate can say: a transaction that starts before the position's coordinate was read before it.
//! That is sound within one server's binlog, which is the only place coordinates come from (a server
//! identity check precedes every resume).

use super::mariadb::MariaGtid;
use super::mysql::Gtid;
use super::{BinlogCoord, Gtids, Position};

/// The GTID of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxGtid {
    /// MySQL `uuid[:tag]:gno`.
    MySql(Gtid),
    /// MariaDB `domain-server-seq`.
    MariaDb(MariaGtid),
}

impl std::fmt::Display for TxGtid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TxGtid::MySql(gtid) => write!(f, "{gtid}"),
            TxGtid::MariaDb(gtid) => write!(f, "{gtid}"),
        }
    }
}

/// Where a transaction starts: its GTID (if the server has them) and the coordinate of its first event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxStart {
    /// The transaction's GTID.
    pub gtid: Option<TxGtid>,
    /// Binlog coordinate at the end of its first (GTID or BEGIN) event.
    pub coord: BinlogCoord,
}

/// How far into the source transaction that follows a position its outbox rows are published: the first
/// `rows` of them (`exactly_once` commits inside a source transaction that would otherwise keep its Kafka
/// transaction open past `transaction.timeout.ms`).
///
/// The transaction is named by its GTID when it has one (a resume on another server meets it by GTID), else
/// by the coordinate of its first event (a resume without GTIDs starts at the position, on the same server,
/// so it is the first transaction read). A transaction's rows are read in the same order every time: its
/// binlog events do not change, so "the first `rows`" names the same rows after a restart.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TxProgress {
    /// The transaction's GTID, in the server's notation; `None` without GTIDs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gtid: Option<String>,
    /// Where its first event ends ([`TxStart::coord`]).
    pub file: String,
    /// The byte offset in `file`.
    pub pos: u64,
    /// Outbox rows of it already published, counted in binlog order.
    pub rows: u64,
}

impl TxProgress {
    /// The first `rows` outbox rows of the transaction starting at `start` are published.
    pub fn of(start: &TxStart, rows: u64) -> TxProgress {
        TxProgress {
            gtid: start.gtid.as_ref().map(ToString::to_string),
            file: start.coord.file.clone(),
            pos: start.coord.pos,
            rows,
        }
    }

    /// Whether `other` is progress in the same transaction.
    pub fn is_same_tx(&self, other: &TxProgress) -> bool {
        (&self.gtid, &self.file, self.pos) == (&other.gtid, &other.file, other.pos)
    }

    /// Whether `start` is the transaction this progress is about: the same GTID when this has one, else the
    /// same coordinate.
    pub fn is_for(&self, start: &TxStart) -> bool {
        match &self.gtid {
            Some(gtid) => start.gtid.as_ref().is_some_and(|g| g.to_string() == *gtid),
            None => start.coord.file == self.file && start.coord.pos == self.pos,
        }
    }
}

impl std::fmt::Display for TxProgress {
    /// `the first 1200 outbox rows of gtid 0-1-42 (mysql-bin.000003:1234)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the first {} outbox rows of ", self.rows)?;
        match &self.gtid {
            Some(gtid) => write!(f, "gtid {gtid} ({}:{})", self.file, self.pos),
            None => write!(f, "the transaction at {}:{}", self.file, self.pos),
        }
    }
}

impl Position {
    /// Whether this position holds the transaction starting at `tx`: a stream resuming here has read it.
    pub fn holds(&self, tx: &TxStart) -> bool {
        match (&self.gtids, &tx.gtid) {
            (Gtids::MySql(set), Some(TxGtid::MySql(gtid))) => set.contains(gtid),
            (Gtids::MariaDb(pos), Some(TxGtid::MariaDb(gtid))) => pos.contains(gtid),
            // NOTE: `self.coord` is the end of the last transaction held, and `tx.coord` the end of the
            // transaction's first event, so a held transaction starts strictly before it.
            _ => tx.coord < self.coord,
        }
    }

    /// Whether this position holds every transaction `other` holds (a stream here is past `other`).
    pub fn holds_all_of(&self, other: &Position) -> bool {
        other.gtids.is_within(&self.gtids).unwrap_or(other.coord <= self.coord)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(gtids: &str, file: &str, pos: u64) -> Position {
        let gtids = match gtids {
            "" => Gtids::None,
            g if g.contains(':') => Gtids::MySql(g.parse().unwrap()),
            g => Gtids::MariaDb(g.parse().unwrap()),
        };
        Position { gtids, coord: BinlogCoord { file: file.into(), pos } }
    }

    fn tx(gtid: &str, file: &str, pos: u64) -> TxStart {
        let gtid = match gtid {
            "" => None,
            g if g.contains(':') => Some(TxGtid::MySql(g.parse().unwrap())),
            g => Some(TxGtid::MariaDb(g.parse().unwrap())),
        };
        TxStart { gtid, coord: BinlogCoord { file: file.into(), pos } }
    }

    const UUID: &str = "3e11fa47-71ca-11e1-9e33-c80aa9429562";

    /// One row per rule: GTIDs decide when both sides have them (coordinates are then ignored, even when
    /// they disagree, as after a failover); otherwise the coordinate does.
    #[test]
    fn holds_by_gtid_else_by_coordinate() {
        let mysql = |s: &str| s.replace('U', UUID);
        let cases = [
            // (position, transaction, held)
            (at(&mysql("U:1-10"), "b.000002", 500), tx(&mysql("U:10"), "b.000009", 9), true),
            (at(&mysql("U:1-10"), "b.000002", 500), tx(&mysql("U:11"), "b.000001", 4), false),
            (at(&mysql("U:1-5:7"), "b.000002", 500), tx(&mysql("U:6"), "b.000001", 4), false),
            (at("0-1-42", "b.000002", 500), tx("0-1-42", "b.000009", 9), true),
            (at("0-1-42", "b.000002", 500), tx("0-2-43", "b.000001", 4), false),
            (at("0-1-42", "b.000002", 500), tx("1-1-1", "b.000001", 4), false),
            // No GTIDs on either side: the coordinate, numerically across the 6-to-7 digit file suffix.
            (at("", "b.000002", 500), tx("", "b.000002", 499), true),
            (at("", "b.000002", 500), tx("", "b.000002", 500), false),
            (at("", "b.000002", 500), tx("", "b.000001", 900), true),
            (at("", "b.999999", 500), tx("", "b.1000000", 4), false),
            // GTIDs on one side only (GTIDs switched on or off, an anonymous transaction): the coordinate.
            (at("", "b.000002", 500), tx("0-1-1", "b.000002", 120), true),
            (at(&mysql("U:1-10"), "b.000002", 500), tx("", "b.000002", 120), true),
            (at(&mysql("U:1-10"), "b.000002", 500), tx("", "b.000003", 120), false),
        ];
        for (position, tx, held) in cases {
            assert_eq!(position.holds(&tx), held, "{position} holds {tx:?}");
        }
    }

    /// A transaction is named by its GTID when the progress has one (its coordinate may differ on another
    /// server), else by the coordinate of its first event.
    #[test]
    fn progress_names_its_transaction_by_gtid_else_by_coordinate() {
        let by_gtid = TxProgress::of(&tx("0-1-42", "b.000002", 500), 7);
        assert!(by_gtid.is_for(&tx("0-1-42", "b.000009", 4)), "another server's coordinate");
        assert!(!by_gtid.is_for(&tx("0-1-43", "b.000002", 500)), "another GTID at the same coordinate");
        assert!(!by_gtid.is_for(&tx("", "b.000002", 500)), "no GTID");
        let by_coord = TxProgress::of(&tx("", "b.000002", 500), 7);
        assert!(by_coord.is_for(&tx("", "b.000002", 500)));
        assert!(!by_coord.is_for(&tx("", "b.000002", 501)));
        let json = serde_json::to_string(&by_gtid).unwrap();
        assert_eq!(json, r#"{"gtid":"0-1-42","file":"b.000002","pos":500,"rows":7}"#);
        assert_eq!(serde_json::from_str::<TxProgress>(&json).unwrap(), by_gtid);
        assert_eq!(by_gtid.to_string(), "the first 7 outbox rows of gtid 0-1-42 (b.000002:500)");
    }

    #[test]
    fn holds_all_of_by_gtid_set_else_by_coordinate() {
        let u = |s: &str| s.replace('U', UUID);
        let cases = [
            (at(&u("U:1-10"), "b.000001", 4), at(&u("U:1-9"), "b.000002", 9), true),
            (at(&u("U:1-10"), "b.000002", 9), at(&u("U:1-11"), "b.000001", 4), false),
            (at("0-1-42,1-1-3", "b.000001", 4), at("0-1-40", "b.000002", 9), true),
            (at("0-1-42", "b.000001", 4), at("0-1-40,1-1-3", "b.000001", 4), false),
            (at("", "b.000002", 9), at("", "b.000002", 9), true),
            (at("", "b.000002", 9), at("", "b.000003", 4), false),
        ];
        for (position, other, expected) in cases {
            assert_eq!(position.holds_all_of(&other), expected, "{position} holds all of {other}");
        }
    }
}
