//! The vocabulary of poison rows: why a row is poison ([`PoisonKind`], [`Poison`]), where a row was read
//! ([`Origin`]), an aggregate on hold ([`Hold`]) and an event the broker refused for good ([`KnownPoison`]).
//! [`Hold`] and [`KnownPoison`] are stored records (`checkpoint::store`); their JSON must not change.
//! The machinery that uses them (dead letters, the quarantine of a run) is in [`crate::quarantine`].
//!
//! Floor 0, the ground floor (docs/ARCHITECTURE.md): imports nothing of ours but other ground-floor modules.
//!
//! # The start of a hold, across restarts
//! The reader reads in source order, so "at or after the start" is decided by *what this run has read*, not
//! by comparing positions row by row (binlog positions of different transactions are only partially
//! ordered across GTID domains and servers; a snapshot's scan index shifts when rows are inserted into a
//! range it resumes in). When a run begins, each hold is either
//! - **passed**: the run starts after the hold's first event (the resume point contains its transaction,
//!   or the snapshot's acknowledged rows include its scan index): every event of the aggregate this run
//!   reads is later than the start, and is diverted; or
//! - **ahead**: the run reads the first event again. Until it does, the aggregate's events are earlier than
//!   the start and go to their normal topic (they were read before the poison row, and a crash re-reads
//!   them: they are at-least-once duplicates of events that went, or were going, there). The hold is
//!   passed from the first event read that is *at or after the start*:
//!
//! | read now | hold started in | at or after the start when |
//! | --- | --- | --- |
//! | a streamed row | the same transaction (same GTID, or same file and position without GTIDs) | its index among the transaction's outbox rows is ≥ the start's |
//! | a streamed row | another transaction | never while ahead (the run reads the start's transaction later) |
//! | a snapshot row | the snapshot | it is the first event (same id; without an id: scan index ≥ the start's) |
//! | any row | (any) | it is itself poison: the hold starts over there, since it cannot reach the normal topic |
//!
//! Which runs read the first event again: a stream resuming at a position that does not contain the
//! start's transaction ([`Position::holds`], the one answer to "does this position
//! hold that transaction"); a snapshot resuming with fewer acknowledged rows than the start's scan index
//! plus one (progress is stored per chunk, so it is either before the chunk that held the first event or
//! after all of it). A stream never reads a snapshot row again, and a snapshot never reads the stream.
//!
//! A hold stored before holds had a start (no `start` in its record) is *passed* in every run, which is the
//! old behaviour: everything of the aggregate read after it is diverted.

use serde::{Deserialize, Serialize};

use crate::position::{BinlogCoord, Gtids, Position, TxGtid, TxStart};
use crate::time::now_ms;

/// Why a row is poison.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PoisonKind {
    /// A column value could not be decoded (NULL, wrong type, invalid UTF-8).
    Undecodable,
    /// `aggregate_id` is empty.
    EmptyAggregateId,
    /// The routed topic is not a legal Kafka topic name.
    IllegalTopic,
    /// `payload` is not valid JSON.
    InvalidPayload,
    /// `headers` is not a JSON object.
    InvalidHeaders,
    /// The record is larger than `kafka.max_record_bytes`.
    TooLarge,
    /// The broker refused the record for a non-retryable reason.
    RejectedByBroker,
    /// The payload does not fit its registered schema (the reason names the field path).
    SchemaMismatch,
    /// The registry has no such subject or version (or no `schema_version` names one): never published
    /// without its schema; released once the schema is registered.
    SchemaMissing,
    /// Not poison itself: a later event of an aggregate on hold.
    Quarantined,
}

impl PoisonKind {
    /// Every kind.
    pub const ALL: [PoisonKind; 10] = [
        PoisonKind::Undecodable,
        PoisonKind::EmptyAggregateId,
        PoisonKind::IllegalTopic,
        PoisonKind::InvalidPayload,
        PoisonKind::InvalidHeaders,
        PoisonKind::TooLarge,
        PoisonKind::RejectedByBroker,
        PoisonKind::SchemaMismatch,
        PoisonKind::SchemaMissing,
        PoisonKind::Quarantined,
    ];

    /// The snake_case name used in headers, metrics and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            PoisonKind::Undecodable => "undecodable",
            PoisonKind::EmptyAggregateId => "empty_aggregate_id",
            PoisonKind::IllegalTopic => "illegal_topic",
            PoisonKind::InvalidPayload => "invalid_payload",
            PoisonKind::InvalidHeaders => "invalid_headers",
            PoisonKind::TooLarge => "too_large",
            PoisonKind::RejectedByBroker => "rejected_by_broker",
            PoisonKind::SchemaMismatch => "schema_mismatch",
            PoisonKind::SchemaMissing => "schema_missing",
            PoisonKind::Quarantined => "quarantined",
        }
    }
}

/// A row that cannot become a record: what and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Poison {
    /// The class of problem.
    pub kind: PoisonKind,
    /// What is wrong, for the operator.
    pub message: String,
}

impl Poison {
    /// A poison verdict.
    pub fn new(kind: PoisonKind, message: impl Into<String>) -> Self {
        Poison { kind, message: message.into() }
    }
}

impl std::fmt::Display for Poison {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.kind.as_str())
    }
}

/// An aggregate on hold, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hold {
    /// Aggregate type of the held aggregate.
    pub aggregate_type: String,
    /// Aggregate id of the held aggregate.
    pub aggregate_id: String,
    /// Identifies this hold's dead-letter records: the first poison event's id and the hold's time.
    pub hold_id: String,
    /// Why the first event was poison.
    pub kind: PoisonKind,
    /// The first poison event's error message.
    pub reason: String,
    /// Where the first poison event was read.
    pub origin: String,
    /// When the hold was placed (Unix ms).
    pub held_at_ms: u64,
    /// The first event's id (`None` for a row whose id did not decode). Records stored before this field
    /// existed have it as the part of `hold_id` before its last `@` ([`Hold::first_event`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_event: Option<String>,
    /// Where the first event was read: the hold's start (see the module doc). `None` in records stored
    /// before holds had a start: such a hold diverts every event of its aggregate read after it was loaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<Origin>,
}

impl Hold {
    /// The first event's id: stored, or (records from before it was stored) the `hold_id` up to its last `@`.
    pub fn first_event(&self) -> Option<&str> {
        match &self.first_event {
            Some(id) => Some(id.as_str()),
            None => self.hold_id.rsplit_once('@').map(|(id, _)| id).filter(|id| *id != UNKNOWN_ID),
        }
    }

    /// Whether a run resuming at `resume` reads this hold's first event again (the hold is *ahead*).
    pub fn is_ahead_of(&self, resume: &ResumePoint<'_>) -> bool {
        let Some(start) = &self.start else { return false };
        match (resume, start.snapshot) {
            // Snapshot progress is stored per chunk: either before the chunk that held the first event
            // (which is then scanned again) or past all of it.
            (ResumePoint::Snapshot { rows_done }, true) => *rows_done <= start.row_index,
            (ResumePoint::Stream(position), false) => match start.tx_start(&position.gtids) {
                Some(tx) => !position.holds(&tx),
                // A GTID that does not parse as the server's kind: not comparable, keep diverting.
                None => false,
            },
            _ => false,
        }
    }

    /// Whether a row read at `origin` with event id `id` is at or after this hold's start (table in the
    /// module doc). Only asked while the hold is ahead.
    pub fn covers(&self, origin: &Origin, id: Option<&str>) -> bool {
        let Some(start) = &self.start else { return true };
        match (start.snapshot, origin.snapshot) {
            (true, true) => match self.first_event() {
                Some(first) => id == Some(first),
                None => origin.row_index >= start.row_index,
            },
            (false, false) => start.same_transaction(origin) && origin.row_index >= start.row_index,
            _ => false,
        }
    }
}

/// Where a run begins reading, for deciding which holds it reads the start of again.
#[derive(Debug, Clone, Copy)]
pub enum ResumePoint<'a> {
    /// A snapshot (fresh or resumed) with this many rows acknowledged.
    Snapshot {
        /// Rows acknowledged before this run.
        rows_done: u64,
    },
    /// The binlog stream, after this position.
    Stream(&'a Position),
}

/// A broker-refused event remembered across the restart that follows the refusal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KnownPoison {
    /// The event id.
    pub id: String,
    /// The broker's reason.
    pub message: String,
}

/// Where a row was read, for the dead-letter record and a hold's start.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Origin {
    /// Read by the initial snapshot (then `gtid`/`file`/`position` describe its read view).
    #[serde(default)]
    pub snapshot: bool,
    /// GTID of the source transaction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gtid: Option<String>,
    /// Binlog file.
    pub file: String,
    /// Position in the binlog file (of the transaction's first event).
    pub position: u64,
    /// Index of the row among the outbox rows of its transaction (snapshot: among the rows of the scan).
    pub row_index: u64,
}

impl Origin {
    /// Whether two streamed rows were read in one source transaction.
    fn same_transaction(&self, other: &Origin) -> bool {
        match (&self.gtid, &other.gtid) {
            (Some(a), Some(b)) => a == b,
            (None, None) => self.file == other.file && self.position == other.position,
            _ => false,
        }
    }

    /// The streamed transaction this origin names, with its GTID parsed as the kind `like` holds.
    fn tx_start(&self, like: &Gtids) -> Option<TxStart> {
        let gtid = match (like, &self.gtid) {
            (Gtids::MySql(_), Some(text)) => Some(TxGtid::MySql(text.parse().ok()?)),
            (Gtids::MariaDb(_), Some(text)) => Some(TxGtid::MariaDb(text.parse().ok()?)),
            (Gtids::None, None) => None,
            _ => return None,
        };
        Some(TxStart { gtid, coord: BinlogCoord { file: self.file.clone(), pos: self.position } })
    }
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.snapshot {
            write!(f, "snapshot view at ")?;
        }
        if let Some(gtid) = &self.gtid {
            write!(f, "gtid {gtid} ")?;
        }
        write!(f, "{}:{} row {}", self.file, self.position, self.row_index)
    }
}

/// What a hold id starts with when the poison row's id did not decode.
const UNKNOWN_ID: &str = "unknown";

/// A new hold for a poison row with event id `id`, read at `origin` (the hold's start).
pub fn new_hold(aggregate_type: &str, aggregate_id: &str, id: Option<&str>, poison: &Poison, origin: &Origin) -> Hold {
    Hold {
        aggregate_type: aggregate_type.to_string(),
        aggregate_id: aggregate_id.to_string(),
        // Unique per hold, so a later hold on the same aggregate never picks up this one's records.
        hold_id: format!("{}@{}", id.unwrap_or(UNKNOWN_ID), now_ms()),
        kind: poison.kind,
        reason: poison.message.clone(),
        origin: origin.to_string(),
        held_at_ms: now_ms(),
        first_event: id.map(String::from),
        start: Some(origin.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn streamed(gtid: Option<&str>, file: &str, position: u64, row_index: u64) -> Origin {
        Origin { snapshot: false, gtid: gtid.map(String::from), file: file.into(), position, row_index }
    }

    fn scanned(row_index: u64) -> Origin {
        Origin { snapshot: true, gtid: Some("0-1-3".into()), file: "bin.000001".into(), position: 4, row_index }
    }

    fn hold_at(first_event: Option<&str>, start: Option<Origin>) -> Hold {
        Hold {
            aggregate_type: "order".into(),
            aggregate_id: "A-1".into(),
            hold_id: format!("{}@1", first_event.unwrap_or(UNKNOWN_ID)),
            kind: PoisonKind::TooLarge,
            reason: "too large".into(),
            origin: String::new(),
            held_at_ms: 1,
            first_event: first_event.map(String::from),
            start,
        }
    }

    /// The rule of the module doc's table: which rows a hold that a run reads again diverts. Guards
    /// against a restart diverting the events read before the poison row to the dead-letter topic after
    /// it, where release republishes them after it (issue 16, item 5).
    #[test]
    fn a_row_is_at_or_after_the_start_of_a_hold_by_the_table() {
        let in_tx = hold_at(Some("e-2"), Some(streamed(Some("0-1-10"), "bin.000001", 500, 1)));
        let no_gtids = hold_at(Some("e-2"), Some(streamed(None, "bin.000001", 500, 1)));
        let scan = hold_at(Some("e-40"), Some(scanned(40)));
        let scan_no_id = hold_at(None, Some(scanned(40)));
        let old = hold_at(Some("e-2"), None);
        let cases: &[(&str, &Hold, Origin, Option<&str>, bool)] = &[
            (
                "earlier row of the same transaction",
                &in_tx,
                streamed(Some("0-1-10"), "bin.000001", 500, 0),
                Some("e-1"),
                false,
            ),
            ("the first event itself", &in_tx, streamed(Some("0-1-10"), "bin.000001", 500, 1), Some("e-2"), true),
            (
                "later row of the same transaction",
                &in_tx,
                streamed(Some("0-1-10"), "bin.000001", 500, 2),
                Some("e-3"),
                true,
            ),
            (
                "earlier transaction replayed after a crash",
                &in_tx,
                streamed(Some("0-1-9"), "bin.000001", 300, 5),
                Some("e-0"),
                false,
            ),
            (
                "same transaction read on another server",
                &in_tx,
                streamed(Some("0-1-10"), "other.000007", 9, 1),
                Some("e-2"),
                true,
            ),
            ("a snapshot row, stream hold", &in_tx, scanned(99), Some("e-9"), false),
            (
                "no GTIDs: same transaction, at the start",
                &no_gtids,
                streamed(None, "bin.000001", 500, 1),
                Some("e-2"),
                true,
            ),
            ("no GTIDs: same transaction, before", &no_gtids, streamed(None, "bin.000001", 500, 0), Some("e-1"), false),
            ("no GTIDs: another transaction", &no_gtids, streamed(None, "bin.000001", 200, 3), Some("e-0"), false),
            ("snapshot: the first event, at a shifted index", &scan, scanned(42), Some("e-40"), true),
            ("snapshot: an earlier row shifted past the index", &scan, scanned(41), Some("e-39"), false),
            ("snapshot: a streamed row", &scan, streamed(Some("0-1-10"), "bin.000001", 500, 0), Some("e-41"), false),
            ("snapshot, first id unknown: index at the start", &scan_no_id, scanned(40), None, true),
            ("snapshot, first id unknown: index before", &scan_no_id, scanned(39), Some("e-39"), false),
            ("a hold stored without a start", &old, streamed(Some("0-1-1"), "bin.000001", 4, 0), Some("e-0"), true),
        ];
        for (name, hold, origin, id, expected) in cases {
            assert_eq!(hold.covers(origin, *id), *expected, "{name}");
        }
    }

    /// Which holds a run reads the start of again (only those divert from their start on).
    #[test]
    fn a_run_reads_the_start_of_a_hold_again_only_from_before_it() {
        let maria = |gtids: &str, file: &str, pos: u64| Position {
            gtids: Gtids::MariaDb(gtids.parse().unwrap()),
            coord: BinlogCoord { file: file.into(), pos },
        };
        let mysql = |gtids: &str| Position {
            gtids: Gtids::MySql(gtids.parse().unwrap()),
            coord: BinlogCoord { file: "bin.000001".into(), pos: 4 },
        };
        let none =
            |file: &str, pos: u64| Position { gtids: Gtids::None, coord: BinlogCoord { file: file.into(), pos } };
        let uuid = "3e11fa47-71ca-11e1-9e33-c80aa9429562";
        let maria_hold = hold_at(Some("e"), Some(streamed(Some("0-1-10"), "bin.000001", 500, 1)));
        let mysql_hold = hold_at(Some("e"), Some(streamed(Some(&format!("{uuid}:10")), "bin.000001", 500, 1)));
        let no_gtid_hold = hold_at(Some("e"), Some(streamed(None, "bin.000001", 500, 1)));
        let scan_hold = hold_at(Some("e"), Some(scanned(40)));
        let old = hold_at(Some("e"), None);
        let (m9, m10, m12) =
            (maria("0-1-9", "bin.000001", 400), maria("0-1-10", "bin.000001", 600), maria("0-1-12", "bin.000002", 4));
        let other_domain = maria("1-1-50", "bin.000001", 100);
        let (y9, y10) = (mysql(&format!("{uuid}:1-9")), mysql(&format!("{uuid}:1-10")));
        let (n400, n600, n_next) = (none("bin.000001", 400), none("bin.000001", 600), none("bin.000002", 4));
        let cases: &[(&str, &Hold, ResumePoint<'_>, bool)] = &[
            ("MariaDB: resume before the transaction", &maria_hold, ResumePoint::Stream(&m9), true),
            ("MariaDB: resume after it", &maria_hold, ResumePoint::Stream(&m10), false),
            ("MariaDB: resume well after it", &maria_hold, ResumePoint::Stream(&m12), false),
            ("MariaDB: nothing of its domain seen yet", &maria_hold, ResumePoint::Stream(&other_domain), true),
            ("MySQL: resume before the transaction", &mysql_hold, ResumePoint::Stream(&y9), true),
            ("MySQL: resume after it", &mysql_hold, ResumePoint::Stream(&y10), false),
            ("MariaDB hold, MySQL resume: not comparable, divert", &maria_hold, ResumePoint::Stream(&y9), false),
            ("no GTIDs: resume before the transaction", &no_gtid_hold, ResumePoint::Stream(&n400), true),
            ("no GTIDs: resume after it", &no_gtid_hold, ResumePoint::Stream(&n600), false),
            ("no GTIDs: resume in a later file", &no_gtid_hold, ResumePoint::Stream(&n_next), false),
            ("stream hold, snapshot run", &maria_hold, ResumePoint::Snapshot { rows_done: 0 }, false),
            (
                "snapshot: resume before the chunk of the first event",
                &scan_hold,
                ResumePoint::Snapshot { rows_done: 40 },
                true,
            ),
            ("snapshot: fresh scan", &scan_hold, ResumePoint::Snapshot { rows_done: 0 }, true),
            ("snapshot: its chunk acknowledged", &scan_hold, ResumePoint::Snapshot { rows_done: 41 }, false),
            ("snapshot hold, stream run", &scan_hold, ResumePoint::Stream(&m9), false),
            ("a hold stored without a start", &old, ResumePoint::Stream(&m9), false),
        ];
        for (name, hold, resume, expected) in cases {
            assert_eq!(hold.is_ahead_of(resume), *expected, "{name}");
        }
    }

    /// A hold record written before holds had a first event and a start still loads, and means: every
    /// event of the aggregate read from now on is diverted.
    #[test]
    fn an_old_hold_record_loads() {
        let json = r#"{"aggregate_type":"order","aggregate_id":"A-1","hold_id":"e-7@1764547200000",
            "kind":"too_large","reason":"r","origin":"gtid 0-1-5 bin.000001:4 row 0","held_at_ms":1764547200000}"#;
        let hold: Hold = serde_json::from_str(json).unwrap();
        assert_eq!((hold.first_event(), hold.start.as_ref()), (Some("e-7"), None));
        assert!(hold.covers(&streamed(Some("0-1-1"), "bin.000001", 4, 0), None));
        let unknown: Hold = serde_json::from_str(&json.replace("e-7@", "unknown@")).unwrap();
        assert_eq!(unknown.first_event(), None);
        let new = hold_at(Some("e-7"), Some(streamed(Some("0-1-5"), "bin.000001", 4, 0)));
        assert_eq!(serde_json::from_str::<Hold>(&serde_json::to_string(&new).unwrap()).unwrap(), new);
    }
}
