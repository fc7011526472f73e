//! Poison rows and quarantine: isolate, never block, never reorder.
//!
//! A *poison row* is an outbox row that cannot become a valid Kafka record: it does not decode, its
//! aggregate id is empty, its routed topic name is illegal, its record exceeds `kafka.max_record_bytes`,
//! or the broker refused it for a reason retrying cannot cure. With `outbox.on_poison = "dead_letter"`:
//!
//! 1. the row goes to the dead-letter topic with everything needed to act on it: the row as read, its
//!    binlog coordinates (GTID, file, position, row index) or snapshot origin, the error kind and message;
//! 2. its aggregate is put on **hold**: the hold is written to the state store *before* the dead-letter
//!    record is produced, and every later event of that aggregate follows it to the dead-letter topic, in
//!    order, until an operator runs `outbox-cdc quarantine release`. Consumers of the normal topic thus
//!    never see an aggregate's event after one they did not get;
//! 3. other aggregates flow on.
//!
//! # Invariants
//! - Nothing is skipped: a poison row and each held event become exactly one dead-letter record, which
//!   settles its source transaction like any record, so the checkpoint moves only past acknowledged
//!   dead-letter records.
//! - A hold is durable before any record that depends on it is produced, so a crash cannot let a later
//!   event of a held aggregate reach the normal topic.
//! - Release republishes a hold's dead-lettered events in their dead-letter order (= source order: one key,
//!   one partition) and removes the hold only after Kafka acknowledged all of them. It runs while the
//!   connector is stopped (it needs the state store), so no newer event of the aggregate can overtake them.
//! - A hold has a **start**: the source position of its first event ([`Hold::start`], an [`Origin`]).
//!   Exactly the aggregate's events at or after the start go to the dead-letter topic; the ones before it go
//!   to their normal topic, also when a restart reads them again after the hold was placed (below).
//! - Release republishes only what it can prove is the whole hold (see [`crate::release`]), and the table
//!   keeps every row of a held aggregate (`prune` skips them), so a dead letter whose payload had to be cut
//!   is republished from the table.
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
//! start's transaction ([`crate::source::snapshot::view_contains`], the one answer to "does this position
//! hold that transaction"); a snapshot resuming with fewer acknowledged rows than the start's scan index
//! plus one (progress is stored per chunk, so it is either before the chunk that held the first event or
//! after all of it). A stream never reads a snapshot row again, and a snapshot never reads the stream.
//!
//! A hold stored before holds had a start (no `start` in its record) is *passed* in every run, which is the
//! old behaviour: everything of the aggregate read after it is diverted.
//!
//! # Broker refusals
//! A record the broker refuses for good (e.g. larger than the topic's `max.message.bytes`) is only known
//! as poison when its delivery fails, when later records may already be in flight. The failure stops the
//! pipeline like any delivery failure (the checkpoint stays before the record); the event id is remembered
//! in the store as *known poison*, and after the restart that row takes the dead-letter path above. Later
//! events of the same aggregate that were acknowledged before the failure surfaced stay in the normal
//! topic: the pre-check against `kafka.max_record_bytes` exists to make this rare.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::checkpoint::{now_ms, Store};
use crate::error::{Error, Result};
use crate::position::{Gtids, Position};
use crate::router::KafkaRecord;
use crate::source::binlog::{TxGtid, TxStart};
use crate::source::decode::Undecodable;
use crate::source::OutboxRow;

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
    /// Not poison itself: a later event of an aggregate on hold.
    Quarantined,
}

impl PoisonKind {
    /// Every kind.
    pub const ALL: [PoisonKind; 8] = [
        PoisonKind::Undecodable,
        PoisonKind::EmptyAggregateId,
        PoisonKind::IllegalTopic,
        PoisonKind::InvalidPayload,
        PoisonKind::InvalidHeaders,
        PoisonKind::TooLarge,
        PoisonKind::RejectedByBroker,
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

impl From<Poison> for Error {
    fn from(poison: Poison) -> Self {
        Error::definite(poison.to_string())
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
                Some(tx) => !crate::source::snapshot::view_contains(position, &tx),
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
        Some(TxStart { gtid, coord: crate::position::BinlogCoord { file: self.file.clone(), pos: self.position } })
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

/// The row as stored in a dead-letter record: the outbox columns by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadRow {
    /// `database.table`.
    pub table: String,
    /// The outbox columns; JSON columns as their JSON text.
    pub columns: serde_json::Map<String, serde_json::Value>,
}

impl DeadRow {
    /// A decoded row.
    pub fn from_row(row: &OutboxRow) -> Self {
        let mut columns = serde_json::Map::new();
        columns.insert("id".into(), row.id.clone().into());
        columns.insert("aggregate_type".into(), row.aggregate_type.clone().into());
        columns.insert("aggregate_id".into(), row.aggregate_id.clone().into());
        columns.insert("event_type".into(), row.event_type.clone().into());
        columns.insert("schema_version".into(), row.schema_version.into());
        columns.insert("payload".into(), row.payload.clone().into());
        columns.insert("headers".into(), row.headers.clone().map_or(serde_json::Value::Null, Into::into));
        columns.insert("occurred_at".into(), row.occurred_at.clone().into());
        DeadRow { table: row.table.to_string(), columns }
    }

    /// An undecodable row.
    pub fn from_undecodable(row: &Undecodable) -> Self {
        DeadRow { table: row.table.to_string(), columns: row.image.clone() }
    }

    /// The decoded row again, when every column is there (release of held events).
    pub fn to_row(&self, from_snapshot: bool) -> Option<OutboxRow> {
        let s = |name: &str| self.columns.get(name).and_then(|v| v.as_str()).map(String::from);
        let (database, table) = self.table.split_once('.')?;
        Some(OutboxRow {
            table: Arc::new(crate::config::TableName { database: database.into(), table: table.into() }),
            id: s("id")?,
            aggregate_type: s("aggregate_type")?,
            aggregate_id: s("aggregate_id")?,
            event_type: s("event_type")?,
            schema_version: u16::try_from(self.columns.get("schema_version")?.as_u64()?).ok()?,
            payload: s("payload")?,
            headers: s("headers"),
            occurred_at: s("occurred_at")?,
            from_snapshot,
        })
    }
}

/// Header names of dead-letter records.
pub mod headers {
    /// Event id (also on normal records).
    pub const ID: &str = "id";
    /// Aggregate type (also on normal records).
    pub const AGGREGATE_TYPE: &str = "aggregate_type";
    /// [`super::PoisonKind`] as snake_case.
    pub const KIND: &str = "dead_letter_kind";
    /// The error message.
    pub const REASON: &str = "dead_letter_reason";
    /// The hold this record belongs to (absent when the aggregate is unknown).
    pub const HOLD: &str = "dead_letter_hold";
    /// Where the row was read.
    pub const ORIGIN: &str = "dead_letter_origin";
    /// On records republished by `quarantine release`.
    pub const RELEASED_FROM: &str = "released_from_hold";
}

/// The value of a dead-letter record.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeadLetter {
    /// Why.
    pub kind: PoisonKind,
    /// The error message.
    pub reason: String,
    /// The hold, when the aggregate is known.
    pub hold_id: Option<String>,
    /// Where the row was read (rendered).
    pub origin: serde_json::Value,
    /// The row.
    pub row: DeadRow,
    /// The row's payload was left out to keep the record within `kafka.max_record_bytes`: release reads it
    /// from the table by id.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub payload_omitted: bool,
}

impl DeadLetter {
    /// Whether the row's payload is not in this record (also for records written before the flag existed,
    /// which carry only the placeholder text; a real payload is JSON, which never starts with `<`).
    pub fn lacks_payload(&self) -> bool {
        self.payload_omitted
            || self
                .row
                .columns
                .get("payload")
                .and_then(|v| v.as_str())
                .is_some_and(|p| p.starts_with('<') && p.ends_with(OMITTED_SUFFIX))
    }
}

/// The end of the placeholder that replaces an omitted payload.
const OMITTED_SUFFIX: &str = "bytes omitted: the record would exceed kafka.max_record_bytes>";

/// Most of a dead-letter reason that goes into a header.
const MAX_REASON_BYTES: usize = 1000;

/// Builds the dead-letter record. A row too large for a record keeps its columns but not its payload,
/// which `quarantine release` (and the operator) reads from the table by id.
pub fn dead_letter_record(
    topic: &str,
    key: &str,
    event_id: Option<&str>,
    aggregate_type: Option<&str>,
    letter: &DeadLetter,
    max_record_bytes: usize,
) -> KafkaRecord {
    let mut value = serde_json::to_vec(letter).expect("serializes");
    if value.len() + 4096 > max_record_bytes {
        let mut trimmed = letter.clone();
        if let Some(payload) = trimmed.row.columns.get_mut("payload") {
            let len = payload.as_str().map_or(0, str::len);
            *payload = format!("<{len} {OMITTED_SUFFIX}").into();
            trimmed.payload_omitted = true;
        }
        value = serde_json::to_vec(&trimmed).expect("serializes");
    }
    let mut reason = letter.reason.clone();
    if reason.len() > MAX_REASON_BYTES {
        let mut end = MAX_REASON_BYTES;
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        reason.truncate(end);
    }
    let mut hdrs = vec![(headers::KIND.into(), letter.kind.as_str().as_bytes().to_vec())];
    hdrs.push((headers::REASON.into(), reason.into_bytes()));
    if let Some(id) = event_id {
        hdrs.push((headers::ID.into(), id.as_bytes().to_vec()));
    }
    if let Some(t) = aggregate_type {
        hdrs.push((headers::AGGREGATE_TYPE.into(), t.as_bytes().to_vec()));
    }
    if let Some(hold) = &letter.hold_id {
        hdrs.push((headers::HOLD.into(), hold.as_bytes().to_vec()));
    }
    hdrs.push((headers::ORIGIN.into(), letter.origin.to_string().into_bytes()));
    KafkaRecord { topic: topic.to_string(), key: key.to_string(), value, headers: hdrs }
}

/// The holds and known-poison ids of a running pipeline, mirrored from the store.
#[derive(Debug, Default)]
pub struct Quarantine {
    /// aggregate_type → aggregate_id → hold.
    holds: HashMap<String, HashMap<String, Hold>>,
    known_poison: HashMap<String, KnownPoison>,
    /// Ids of the holds whose first event this run reads again (*ahead*, see the module doc).
    ahead: HashSet<String>,
}

impl Quarantine {
    /// Loads the holds and known-poison ids from the store.
    ///
    /// # Errors
    /// Store read errors.
    pub fn load(store: &Store) -> Result<Self> {
        let mut q = Quarantine::default();
        for hold in store.holds()? {
            q.holds.entry(hold.aggregate_type.clone()).or_default().insert(hold.aggregate_id.clone(), hold);
        }
        q.known_poison = store.known_poison()?.into_iter().map(|p| (p.id.clone(), p)).collect();
        crate::metrics::metrics().quarantined_aggregates(q.len());
        Ok(q)
    }

    /// Number of aggregates on hold.
    pub fn len(&self) -> usize {
        self.holds.values().map(HashMap::len).sum()
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.holds.is_empty()
    }

    /// The hold of an aggregate, if any.
    pub fn hold_of(&self, aggregate_type: &str, aggregate_id: &str) -> Option<&Hold> {
        if self.holds.is_empty() {
            return None;
        }
        self.holds.get(aggregate_type)?.get(aggregate_id)
    }

    /// A run begins reading at `resume`: decides which holds it reads the first event of again.
    pub fn resume(&mut self, resume: ResumePoint<'_>) {
        self.ahead = self
            .holds
            .values()
            .flat_map(HashMap::values)
            .filter(|h| h.is_ahead_of(&resume))
            .map(|h| h.hold_id.clone())
            .collect();
        for hold_id in &self.ahead {
            tracing::info!(hold = %hold_id, "this run reads the start of a hold again: the aggregate's events before it go to their normal topic");
        }
    }

    /// The hold that diverts a row of this aggregate read at `origin`, if any: the aggregate's hold, unless
    /// the row is before the hold's start (table in the module doc).
    pub fn divert(&mut self, aggregate_type: &str, aggregate_id: &str, id: &str, origin: &Origin) -> Option<&Hold> {
        let hold = self.holds.get(aggregate_type)?.get(aggregate_id)?;
        if !self.ahead.is_empty() && self.ahead.contains(&hold.hold_id) {
            if !hold.covers(origin, Some(id)) {
                return None;
            }
            self.ahead.remove(&hold.hold_id);
        }
        Some(hold)
    }

    /// The broker's earlier refusal of event `id`, if any.
    pub fn known_poison(&self, id: &str) -> Option<&KnownPoison> {
        if self.known_poison.is_empty() {
            return None;
        }
        self.known_poison.get(id)
    }

    /// Places a hold, durably, unless the aggregate already has one; returns the aggregate's hold.
    ///
    /// # Errors
    /// Store write errors (definite: the connector must not go on without the hold).
    pub fn hold(&mut self, store: &Store, hold: Hold) -> Result<Hold> {
        if let Some(existing) = self.hold_of(&hold.aggregate_type, &hold.aggregate_id).cloned() {
            // A poison row cannot reach the normal topic: the aggregate's later events must follow it.
            self.ahead.remove(&existing.hold_id);
            return Ok(existing);
        }
        store.put_hold(&hold)?;
        tracing::error!(
            aggregate_type = %hold.aggregate_type,
            aggregate_id = %hold.aggregate_id,
            hold = %hold.hold_id,
            kind = hold.kind.as_str(),
            reason = %hold.reason,
            "aggregate quarantined: its events go to the dead-letter topic until \
             `outbox-cdc quarantine release` (see the runbook)"
        );
        self.holds.entry(hold.aggregate_type.clone()).or_default().insert(hold.aggregate_id.clone(), hold.clone());
        crate::metrics::metrics().quarantined_aggregates(self.len());
        Ok(hold)
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
    use crate::config::TableName;

    fn row() -> OutboxRow {
        OutboxRow {
            table: Arc::new(TableName { database: "shop".into(), table: "outbox_events".into() }),
            id: "e-1".into(),
            aggregate_type: "order".into(),
            aggregate_id: "A-1".into(),
            event_type: "OrderCreated".into(),
            schema_version: 2,
            payload: r#"{"a":"订单"}"#.into(),
            headers: None,
            occurred_at: "2026-11-30T01:02:03.000004".into(),
            from_snapshot: false,
        }
    }

    #[test]
    fn dead_row_round_trips_a_decoded_row() {
        let dead = DeadRow::from_row(&row());
        assert_eq!(dead.to_row(false), Some(row()));
        let json = serde_json::to_string(&dead).unwrap();
        let back: DeadRow = serde_json::from_str(&json).unwrap();
        assert_eq!(back.to_row(false), Some(row()));
    }

    #[test]
    fn dead_letter_record_carries_kind_hold_and_origin() {
        let letter = DeadLetter {
            kind: PoisonKind::EmptyAggregateId,
            reason: "aggregate_id is empty".into(),
            hold_id: Some("e-1".into()),
            origin: serde_json::to_value(Origin { file: "bin.000001".into(), position: 4, ..Origin::default() })
                .unwrap(),
            row: DeadRow::from_row(&row()),
            payload_omitted: false,
        };
        let rec = dead_letter_record("dlq", "A-1", Some("e-1"), Some("order"), &letter, 1 << 20);
        let header = |name: &str| rec.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        assert_eq!(header(headers::KIND).unwrap(), b"empty_aggregate_id");
        assert_eq!(header(headers::HOLD).unwrap(), b"e-1");
        assert_eq!(header(headers::ID).unwrap(), b"e-1");
        let back: DeadLetter = serde_json::from_slice(&rec.value).unwrap();
        assert_eq!(back.row.to_row(false), Some(row()));
    }

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
            coord: crate::position::BinlogCoord { file: file.into(), pos },
        };
        let mysql = |gtids: &str| Position {
            gtids: Gtids::MySql(gtids.parse().unwrap()),
            coord: crate::position::BinlogCoord { file: "bin.000001".into(), pos: 4 },
        };
        let none = |file: &str, pos: u64| Position {
            gtids: Gtids::None,
            coord: crate::position::BinlogCoord { file: file.into(), pos },
        };
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

    #[test]
    fn oversized_dead_letter_drops_the_payload_only() {
        let mut big = row();
        big.payload = format!("\"{}\"", "x".repeat(10_000));
        let letter = DeadLetter {
            kind: PoisonKind::TooLarge,
            reason: "too large".into(),
            hold_id: None,
            origin: serde_json::Value::Null,
            row: DeadRow::from_row(&big),
            payload_omitted: false,
        };
        let rec = dead_letter_record("dlq", "A-1", None, None, &letter, 8_000);
        assert!(rec.value.len() < 8_000);
        let back: DeadLetter = serde_json::from_slice(&rec.value).unwrap();
        assert!(back.row.columns["payload"].as_str().unwrap().contains("10002 bytes omitted"));
        assert!(back.payload_omitted && back.lacks_payload());
        assert_eq!(back.row.columns["id"], "e-1");
        // Records written before the flag existed are recognized by the placeholder.
        let mut old: serde_json::Value = serde_json::from_slice(&rec.value).unwrap();
        old.as_object_mut().unwrap().remove("payload_omitted");
        let old: DeadLetter = serde_json::from_value(old).unwrap();
        assert!(!old.payload_omitted && old.lacks_payload());
        assert!(!letter.lacks_payload());
    }
}
