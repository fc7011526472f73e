//! Poison rows and quarantine: isolate, never block, never reorder.
//!
//! Floor 4 (docs/ARCHITECTURE.md): imports floors 0-3.
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
//! - A hold has a **start**: the source position of its first event ([`Hold::start`], an [`Origin`];
//!   the rule is in [`crate::poison`]).
//!   Exactly the aggregate's events at or after the start go to the dead-letter topic; the ones before it go
//!   to their normal topic, also when a restart reads them again after the hold was placed (below).
//! - Release republishes only what it can prove is the whole hold (see [`crate::ops::release`]), and the table
//!   keeps every row of a held aggregate (`prune` skips them), so a dead letter whose payload had to be cut
//!   is republished from the table.
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

use crate::checkpoint::Store;
use crate::config::PayloadEncoding;
use crate::error::Result;
use crate::outbox::{ColumnValue, OutboxRow, Payload, SchemaVersion};
use crate::poison::{Hold, KnownPoison, Origin, PoisonKind, ResumePoint};
use crate::router::KafkaRecord;
use crate::source::decode::Undecodable;

/// The row as stored in a dead-letter record: the outbox columns by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadRow {
    /// `database.table`.
    pub table: String,
    /// The outbox columns; JSON columns as their JSON text.
    pub columns: serde_json::Map<String, serde_json::Value>,
}

impl DeadRow {
    /// A decoded row. A bytes payload is written as `{"hex": …}`, like an undecodable image's binary
    /// values; the additional placements' values go under `additional`, in their order (a JSON column's
    /// as `{"json": text}`).
    pub fn from_row(row: &OutboxRow) -> Self {
        use serde_json::Value as J;
        let mut columns = serde_json::Map::new();
        columns.insert("id".into(), row.id.clone().into());
        columns.insert("aggregate_type".into(), row.aggregate_type.clone().into());
        columns.insert("aggregate_id".into(), row.aggregate_id.clone().into());
        columns.insert("event_type".into(), row.event_type.clone().into());
        columns.insert("schema_version".into(), serde_json::to_value(&row.schema_version).expect("serializes"));
        let payload = match &row.payload {
            Payload::Json(text) => J::String(text.clone()),
            Payload::Bytes(bytes) => serde_json::json!({ "hex": hex(bytes) }),
            Payload::Null => J::Null,
        };
        columns.insert("payload".into(), payload);
        columns.insert("headers".into(), row.headers.clone().map_or(J::Null, Into::into));
        columns.insert("occurred_at".into(), row.occurred_at.clone().into());
        if !row.additional.is_empty() {
            let values = (row.additional.iter()).map(|value| match value {
                ColumnValue::Null => J::Null,
                ColumnValue::Text(text) => J::String(text.clone()),
                ColumnValue::Integer(n) => match i64::try_from(*n) {
                    Ok(n) => n.into(),
                    Err(_) => u64::try_from(*n).map_or_else(|_| J::String(n.to_string()), Into::into),
                },
                ColumnValue::Json(text) => serde_json::json!({ "json": text }),
            });
            columns.insert("additional".into(), J::Array(values.collect()));
        }
        DeadRow { table: row.table.to_string(), columns }
    }

    /// An undecodable row.
    pub fn from_undecodable(row: &Undecodable) -> Self {
        DeadRow { table: row.table.to_string(), columns: row.image.clone() }
    }

    /// The decoded row again, when every column is there (release of held events). A payload of
    /// `{"hex": …}` is whole only with `payload_encoding = "bytes"`; with "json" it is an undecodable
    /// image's.
    pub fn to_row(&self, from_snapshot: bool, encoding: PayloadEncoding) -> Option<OutboxRow> {
        use serde_json::Value as J;
        let s = |name: &str| self.columns.get(name).and_then(|v| v.as_str()).map(String::from);
        // An optional column: absent from the table (JSON null, or no entry) is `None`; any other value
        // that is not text (an undecodable image's `{"hex": …}`) means the row is not whole.
        let optional = |name: &str| match self.columns.get(name) {
            None | Some(J::Null) => Some(None),
            Some(J::String(text)) => Some(Some(text.clone())),
            Some(_) => None,
        };
        let payload = match (self.columns.get("payload")?, encoding) {
            (J::Null, _) => Payload::Null,
            (J::String(text), PayloadEncoding::Json) => Payload::Json(text.clone()),
            (J::Object(hex), PayloadEncoding::Bytes) => Payload::Bytes(unhex(hex.get("hex")?.as_str()?)?),
            _ => return None,
        };
        // A number is an integer column's, text a text column's; absent is null.
        let schema_version = match self.columns.get("schema_version") {
            None | Some(J::Null) => None,
            Some(J::String(text)) => Some(SchemaVersion::Text(text.clone())),
            Some(J::Number(n)) => {
                Some(SchemaVersion::Integer(n.as_i64().map(i128::from).or(n.as_u64().map(i128::from))?))
            }
            Some(_) => return None,
        };
        let additional = match self.columns.get("additional") {
            None => Vec::new(),
            Some(J::Array(values)) => (values.iter())
                .map(|value| match value {
                    J::Null => Some(ColumnValue::Null),
                    J::String(text) => Some(ColumnValue::Text(text.clone())),
                    J::Number(n) => n.as_i64().map(i128::from).or(n.as_u64().map(i128::from)).map(ColumnValue::Integer),
                    J::Object(json) => Some(ColumnValue::Json(json.get("json")?.as_str()?.to_string())),
                    _ => None,
                })
                .collect::<Option<Vec<_>>>()?,
            Some(_) => return None,
        };
        let (database, table) = self.table.split_once('.')?;
        Some(OutboxRow {
            table: Arc::new(crate::outbox::TableName { database: database.into(), table: table.into() }),
            id: s("id")?,
            aggregate_type: s("aggregate_type")?,
            aggregate_id: s("aggregate_id")?,
            event_type: optional("event_type")?,
            schema_version,
            payload,
            headers: s("headers"),
            occurred_at: optional("occurred_at")?,
            additional,
            from_snapshot,
            snapshot_id: None,
        })
    }
}

/// A payload column's bytes as a dead row holds them: JSON text as a string, a bytes payload as
/// `{"hex": …}`; `None` for a JSON payload that is not UTF-8.
pub fn payload_value(bytes: Vec<u8>, encoding: PayloadEncoding) -> Option<serde_json::Value> {
    match encoding {
        PayloadEncoding::Json => String::from_utf8(bytes).ok().map(Into::into),
        PayloadEncoding::Bytes => Some(serde_json::json!({ "hex": hex(&bytes) })),
    }
}

/// Bytes as lower-case hex.
fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

/// Hex text back to bytes; `None` when it is not hex.
fn unhex(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
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
    KafkaRecord {
        topic: topic.to_string(),
        key: key.as_bytes().to_vec(),
        value,
        headers: hdrs,
        ..KafkaRecord::default()
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbox::TableName;

    fn row() -> OutboxRow {
        OutboxRow {
            table: Arc::new(TableName { database: "shop".into(), table: "outbox_events".into() }),
            id: "e-1".into(),
            aggregate_type: "order".into(),
            aggregate_id: "A-1".into(),
            event_type: Some("OrderCreated".into()),
            schema_version: Some(crate::outbox::SchemaVersion::Integer(2)),
            payload: r#"{"a":"订单"}"#.into(),
            headers: None,
            occurred_at: Some("2026-11-30T01:02:03.000004".into()),
            additional: Vec::new(),
            from_snapshot: false,
            snapshot_id: None,
        }
    }

    #[test]
    fn dead_row_round_trips_a_decoded_row() {
        let dead = DeadRow::from_row(&row());
        assert_eq!(dead.to_row(false, PayloadEncoding::Json), Some(row()));
        let json = serde_json::to_string(&dead).unwrap();
        let back: DeadRow = serde_json::from_str(&json).unwrap();
        assert_eq!(back.to_row(false, PayloadEncoding::Json), Some(row()));
    }

    /// A decoded row of a table without the optional columns round-trips with them absent; an
    /// undecodable image (an optional column that is `{"hex": …}`) is never taken for a whole row.
    /// Regression: with optional columns read leniently, `quarantine release` republished an undecodable
    /// row (invalid UTF-8 in event_type) as if it had no event_type.
    #[test]
    fn absent_optional_columns_round_trip_and_undecodable_ones_do_not() {
        let mut sparse = row();
        (sparse.event_type, sparse.schema_version, sparse.occurred_at, sparse.headers) = (None, None, None, None);
        assert_eq!(DeadRow::from_row(&sparse).to_row(false, PayloadEncoding::Json), Some(sparse));
        for (column, value) in [
            ("event_type", serde_json::json!({"hex": "fffe"})),
            ("occurred_at", serde_json::json!(5)),
            ("schema_version", serde_json::json!({"hex": "ff"})),
            ("schema_version", serde_json::json!(1.5)),
            ("payload", serde_json::json!({"hex": "ff"})),
            ("additional", serde_json::json!("tenant")),
        ] {
            let mut dead = DeadRow::from_row(&row());
            dead.columns.insert(column.into(), value.clone());
            assert_eq!(dead.to_row(false, PayloadEncoding::Json), None, "{column} = {value}");
        }
    }

    /// What issue 18 added to a row round-trips through a dead letter: a bytes payload (as hex, whole only
    /// with `payload_encoding = "bytes"`), a NULL payload, text and wide schema versions, and additional
    /// column values of every kind.
    #[test]
    fn bytes_payloads_versions_and_additional_values_round_trip() {
        let mut r = row();
        r.payload = Payload::Bytes(vec![0x00, 0xff, 0x7b]);
        r.schema_version = Some(SchemaVersion::Text("v2.1".into()));
        r.additional = vec![
            ColumnValue::Null,
            ColumnValue::Text("acme 🚀".into()),
            ColumnValue::Integer(-42),
            ColumnValue::Integer(u64::MAX.into()),
            ColumnValue::Json(r#"{"a":1}"#.into()),
        ];
        let back: DeadRow = serde_json::from_str(&serde_json::to_string(&DeadRow::from_row(&r)).unwrap()).unwrap();
        assert_eq!(back.columns["payload"], serde_json::json!({"hex": "00ff7b"}));
        assert_eq!(back.to_row(false, PayloadEncoding::Bytes), Some(r.clone()));
        assert_eq!(back.to_row(false, PayloadEncoding::Json), None, "hex is an undecodable image's with json");
        r.payload = Payload::Null;
        r.schema_version = Some(SchemaVersion::Integer(70_000));
        assert_eq!(
            DeadRow::from_row(&r).to_row(true, PayloadEncoding::Json),
            Some(OutboxRow { from_snapshot: true, ..r })
        );
        assert_eq!(payload_value(vec![0xff], PayloadEncoding::Json), None);
        assert_eq!(payload_value(b"{}".to_vec(), PayloadEncoding::Json), Some("{}".into()));
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
        assert_eq!(back.row.to_row(false, PayloadEncoding::Json), Some(row()));
    }

    #[test]
    fn oversized_dead_letter_drops_the_payload_only() {
        let mut big = row();
        big.payload = format!("\"{}\"", "x".repeat(10_000)).into();
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
