//! Pure routing: one outbox row becomes one Kafka record (topic, key, value, headers), following the
//! Debezium Outbox Event Router conventions so that users migrating from Debezium feel at home.
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2 (vocabulary, error, metrics, config).
//!
//! - Topic: a template (default `outbox.event.${aggregate_type}`), checked against Kafka's topic-name rules.
//! - Key: the aggregate id. The producer partitions with murmur2 (the Java client's default), so every
//!   producer and consumer of the topic agrees on which partition holds an aggregate.
//! - Value: an envelope with the payload embedded as JSON (not as an escaped string), or the payload alone.
//! - Headers: `id`, `event_type`, `aggregate_type`, `schema_version`, `source: snapshot` for rows read by the
//!   initial snapshot or a snapshot on demand (and then `snapshot_id`, its id), then each top-level string
//!   entry of the row's `headers` JSON object (e.g. `traceparent`).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;
use serde_json::value::RawValue;

use crate::config::{Config, KeyFormat, Placement, PlacementTarget, RecordTimestamp, ValueFormat};
use crate::outbox::{ColumnValue, OutboxRow, Payload, SchemaVersion};
use crate::poison::{Poison, PoisonKind};
use crate::schema::{key_subject, Cached, Schemas};
use crate::time::parse_occurred_at_ms;
use crate::topic::{is_legal_topic, TopicTemplate};

/// Where a routed record's `aggregate_type` header is when the table has an `event_type` column: the sink's
/// delivery callback looks there first (and searches by name otherwise).
pub const AGGREGATE_TYPE_HEADER_INDEX: usize = 2;

/// A header name: the connector's own are static (no allocation per record).
pub type HeaderName = Cow<'static, str>;

/// A record ready for the producer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KafkaRecord {
    /// Destination topic.
    pub topic: String,
    /// Partitioning key: the aggregate id (`kafka.key_format`): its text, or Confluent-framed Avro bytes.
    pub key: Vec<u8>,
    /// Serialized value; empty and unused for a tombstone.
    pub value: Vec<u8>,
    /// A tombstone: the value is null (`outbox.tombstone_on_empty_payload`).
    pub tombstone: bool,
    /// The record timestamp (ms since the epoch); `None` lets the producer stamp it.
    pub timestamp_ms: Option<i64>,
    /// Headers in order.
    pub headers: Vec<(HeaderName, Vec<u8>)>,
}

impl KafkaRecord {
    /// Bytes this record occupies in the producer: what the in-flight budget counts.
    pub fn size_bytes(&self) -> usize {
        self.topic.len()
            + self.key.len()
            + self.value.len()
            + self.headers.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>()
    }
}

/// Turns outbox rows into Kafka records.
#[derive(Debug, Clone)]
pub struct Router {
    template: TopicTemplate,
    value_format: ValueFormat,
    key_format: KeyFormat,
    record_timestamp: RecordTimestamp,
    /// `outbox.tombstone_on_empty_payload`.
    tombstones: bool,
    /// `outbox.additional_placement`, each with where its value is in the row.
    placements: Vec<(Placement, Placed)>,
    /// The registry's schemas, for `value_format = "avro"` and the like, and `key_format = "avro"`.
    schemas: Option<Arc<Schemas>>,
}

/// Where a placed column's value is in an [`OutboxRow`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Placed {
    /// A role's column (slot in [`crate::outbox::SLOT_NAMES`] order), e.g. `type` placed as `eventType`.
    Role(usize),
    /// Another column: this index in [`OutboxRow::additional`].
    Additional(usize),
}

/// The envelope value. A field whose column the table does not have (`type`, `version`, `occurred_at`)
/// is left out, not written as `null`: the reference schema's envelope is unchanged byte for byte.
#[derive(Serialize)]
struct Envelope<'a> {
    event_id: &'a str,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    event_type: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    version: Option<&'a SchemaVersion>,
    #[serde(skip_serializing_if = "Option::is_none")]
    occurred_at: Option<&'a str>,
    aggregate_type: &'a str,
    aggregate_id: &'a str,
    data: &'a RawValue,
}

/// A structured-mode JSON CloudEvent 1.0 (`kafka.value_format = "cloudevents"`).
#[derive(Serialize)]
struct CloudEvent<'a> {
    specversion: &'static str,
    id: &'a str,
    /// `/<database>/<table>`: the outbox table, a URI reference.
    source: &'a str,
    /// The event type; the aggregate type where the table has no `event_type` column (the attribute is
    /// required).
    #[serde(rename = "type")]
    event_type: &'a str,
    subject: &'a str,
    /// RFC 3339 in UTC (`occurred_at` with `Z`); absent where the table has no `occurred_at` column.
    #[serde(skip_serializing_if = "Option::is_none")]
    time: Option<&'a str>,
    datacontenttype: &'static str,
    /// Extension attribute: the aggregate type.
    aggregatetype: &'a str,
    /// Extension attribute: the schema version, where the table has the column.
    #[serde(skip_serializing_if = "Option::is_none")]
    schemaversion: Option<&'a SchemaVersion>,
    data: &'a RawValue,
}

impl Router {
    /// A router for a topic template and value format, with the default key, timestamp and payload
    /// handling and no additional placements.
    pub fn new(template: TopicTemplate, value_format: ValueFormat) -> Self {
        Router {
            template,
            value_format,
            key_format: KeyFormat::String,
            record_timestamp: RecordTimestamp::Produced,
            tombstones: false,
            placements: Vec::new(),
            schemas: None,
        }
    }

    /// The router `config` describes: topic template, value and key formats, record timestamp,
    /// tombstones and additional placements.
    pub fn for_config(config: &Config) -> Self {
        Router {
            template: config.topic().clone(),
            value_format: config.kafka.value_format,
            key_format: config.kafka.key_format,
            record_timestamp: config.kafka.record_timestamp,
            tombstones: config.outbox.tombstone_on_empty_payload,
            placements: (config.placements().iter())
                .map(|p| {
                    let columns = &config.outbox.columns;
                    let additional = columns.additional().iter().position(|c| c.eq_ignore_ascii_case(&p.column));
                    let placed = match (columns.role_of(&p.column), additional) {
                        (Some(slot), _) => Placed::Role(slot),
                        (None, Some(index)) => Placed::Additional(index),
                        (None, None) => unreachable!("validation lists every placed column"),
                    };
                    (p.clone(), placed)
                })
                .collect(),
            schemas: Schemas::for_config(config),
        }
    }

    /// Makes sure the schemas `row` is encoded with are known (a registry lookup the first time a subject
    /// and version is needed, none after). Call before [`Router::route_into`] with a registry format; a row
    /// that names no schema, or one the registry does not have, is left for routing to call poison.
    ///
    /// # Errors
    /// Transient when the registry cannot be reached, definite when it refuses the credentials.
    pub fn resolve(&self, row: &OutboxRow) -> crate::error::Result<()> {
        let Some(schemas) = &self.schemas else { return Ok(()) };
        let event_type = row.event_type.as_deref().unwrap_or_default();
        let mut topic = String::new();
        self.template.render_into(&mut topic, &row.table, &row.aggregate_type, event_type);
        if !is_legal_topic(&topic) {
            return Ok(());
        }
        if schemas.encodes_values() {
            if let Ok(version) = schemas.version_of(row) {
                schemas.resolve(&schemas.value_subject(&topic, &row.aggregate_type, event_type), version)?;
            }
        }
        if schemas.encodes_keys() {
            schemas.resolve_key(&topic)?;
        }
        Ok(())
    }

    /// Routes one row.
    ///
    /// # Errors
    /// A [`Poison`] verdict naming the row's id when the routed topic is not a legal Kafka topic name, the
    /// aggregate id is empty, or the payload/headers are not valid JSON.
    pub fn route(&self, row: &OutboxRow) -> Result<KafkaRecord, Poison> {
        let mut record = KafkaRecord::default();
        self.route_into(row, &mut record)?;
        Ok(record)
    }

    /// Routes one row into `record`, reusing its buffers: the streaming path routes every row into the same
    /// record, which librdkafka copies, so a row costs no allocation here once the buffers have grown.
    ///
    /// # Errors
    /// As [`Router::route`]; `record` then holds a partial result.
    pub fn route_into(&self, row: &OutboxRow, record: &mut KafkaRecord) -> Result<(), Poison> {
        let poison = |kind: PoisonKind, what: String| {
            Poison::new(kind, format!("outbox row id={} in {} cannot become a Kafka record: {what}", row.id, row.table))
        };
        if row.event_type.is_none() && self.template.uses_columns().1 {
            // Preflight refuses this configuration; a table altered while running still gets a diagnosis.
            return Err(poison(
                PoisonKind::IllegalTopic,
                "kafka.topic uses ${event_type} but the table has no event_type column".into(),
            ));
        }
        let event_type = row.event_type.as_deref().unwrap_or_default();
        self.template.render_into(&mut record.topic, &row.table, &row.aggregate_type, event_type);
        if !is_legal_topic(&record.topic) {
            return Err(poison(
                PoisonKind::IllegalTopic,
                format!("routed topic {:?} is not a legal Kafka topic name (1-249 of [a-zA-Z0-9._-])", record.topic),
            ));
        }
        if row.aggregate_id.is_empty() {
            return Err(poison(PoisonKind::EmptyAggregateId, "aggregate_id is empty".into()));
        }
        record.tombstone = self.tombstones && row.payload.is_empty();
        let payload: Option<&RawValue> = match &row.payload {
            _ if record.tombstone => None,
            // Parsed once, as a tree, by the schema encoder below.
            Payload::Json(_) if self.value_format.uses_registry() => None,
            Payload::Json(text) => Some(
                serde_json::from_str(text)
                    .map_err(|e| poison(PoisonKind::InvalidPayload, format!("payload is not valid JSON: {e}")))?,
            ),
            Payload::Bytes(_) if self.value_format == ValueFormat::Payload => None,
            Payload::Bytes(_) => {
                // Configuration validation refuses this; a router built by hand still gets a diagnosis.
                return Err(poison(
                    PoisonKind::InvalidPayload,
                    "a bytes payload (outbox.payload_encoding = \"bytes\") needs kafka.value_format = \"payload\""
                        .into(),
                ));
            }
            Payload::Null => {
                return Err(poison(
                    PoisonKind::InvalidPayload,
                    "payload is NULL (outbox.tombstone_on_empty_payload = true publishes a tombstone instead)".into(),
                ))
            }
        };
        let extra = match &row.headers {
            Some(text) => extra_headers(text).map_err(|what| poison(PoisonKind::InvalidHeaders, what))?,
            None => Vec::new(),
        };
        let missing = |placed: &Placed| matches!(placed, Placed::Additional(i) if *i >= row.additional.len());
        if let Some((placement, _)) = self.placements.iter().find(|(_, placed)| missing(placed)) {
            return Err(poison(
                PoisonKind::Undecodable,
                format!("the row carries no value of column `{}` (outbox.additional_placement)", placement.column),
            ));
        }
        record.key.clear();
        match self.key_format {
            KeyFormat::String => record.key.extend_from_slice(row.aggregate_id.as_bytes()),
            KeyFormat::Json => {
                serde_json::to_writer(&mut record.key, &row.aggregate_id).expect("serializing a string cannot fail")
            }
            KeyFormat::Avro => {
                let schema = self.schema(key_subject(&record.topic), None, row, &poison)?;
                let id = serde_json::Value::String(row.aggregate_id.clone());
                schema.encode(&id, "", "", &mut record.key).expect("a string fits the string schema");
            }
        }
        record.timestamp_ms = match self.record_timestamp {
            RecordTimestamp::Produced => None,
            RecordTimestamp::OccurredAt => row.occurred_at.as_deref().and_then(parse_occurred_at_ms),
        };
        record.value.clear();
        match (self.value_format, payload) {
            (_, None) if record.tombstone => {}
            (ValueFormat::Payload, None) => record.value.extend_from_slice(row.payload.as_bytes()),
            (ValueFormat::Payload, Some(payload)) => record.value.extend_from_slice(payload.get().as_bytes()),
            (ValueFormat::Envelope, Some(payload)) => {
                // The envelope is the payload plus a few short fields.
                record.value.reserve(row.payload.len() + 192 + row.id.len() + row.aggregate_id.len());
                serde_json::to_writer(
                    &mut record.value,
                    &Envelope {
                        event_id: &row.id,
                        event_type: row.event_type.as_deref(),
                        version: row.schema_version.as_ref(),
                        occurred_at: row.occurred_at.as_deref(),
                        aggregate_type: &row.aggregate_type,
                        aggregate_id: &row.aggregate_id,
                        data: payload,
                    },
                )
                .expect("serializing strings and raw JSON cannot fail");
                self.append_envelope_fields(row, &mut record.value);
            }
            (ValueFormat::CloudEvents, Some(payload)) => {
                let source = format!("/{}/{}", row.table.database, row.table.table);
                let time = row.occurred_at.as_deref().map(|at| format!("{at}Z"));
                record.value.reserve(row.payload.len() + 256 + row.id.len() + row.aggregate_id.len());
                serde_json::to_writer(
                    &mut record.value,
                    &CloudEvent {
                        specversion: "1.0",
                        id: &row.id,
                        source: &source,
                        event_type: row.event_type.as_deref().unwrap_or(&row.aggregate_type),
                        subject: &row.aggregate_id,
                        time: time.as_deref(),
                        datacontenttype: "application/json",
                        aggregatetype: &row.aggregate_type,
                        schemaversion: row.schema_version.as_ref(),
                        data: payload,
                    },
                )
                .expect("serializing strings and raw JSON cannot fail");
            }
            (ValueFormat::Avro | ValueFormat::JsonSchema | ValueFormat::Protobuf, _) => {
                let schemas = self.schemas.as_ref().expect("validation requires [schema_registry]");
                let version = schemas.version_of(row).map_err(|why| poison(PoisonKind::SchemaMissing, why))?;
                let subject = schemas.value_subject(&record.topic, &row.aggregate_type, event_type);
                let schema = self.schema(subject, version, row, &poison)?;
                let Payload::Json(text) = &row.payload else {
                    unreachable!("validation refuses bytes payloads, NULL ones are refused above")
                };
                let payload: serde_json::Value = serde_json::from_str(text)
                    .map_err(|e| poison(PoisonKind::InvalidPayload, format!("payload is not valid JSON: {e}")))?;
                schema.encode(&payload, text, event_type, &mut record.value).map_err(|mismatch| {
                    poison(
                        PoisonKind::SchemaMismatch,
                        format!(
                            "the payload does not fit subject {:?} version {} (schema id {}) at {}: {}",
                            schema.subject,
                            schema.version,
                            schema.id,
                            mismatch.path(),
                            mismatch.reason()
                        ),
                    )
                })?;
            }
            (ValueFormat::Envelope | ValueFormat::CloudEvents, None) => {
                unreachable!("bytes payloads are refused above")
            }
        }
        let mut headers = HeaderWriter { headers: &mut record.headers, len: 0 };
        headers.put_static("id", row.id.as_bytes());
        // Headers of absent columns are left out; the others keep their order.
        if let Some(event_type) = &row.event_type {
            headers.put_static("event_type", event_type.as_bytes());
        }
        headers.put_static("aggregate_type", row.aggregate_type.as_bytes());
        match &row.schema_version {
            Some(SchemaVersion::Integer(n)) => headers.put_static("schema_version", itoa(*n, &mut [0; 40])),
            Some(SchemaVersion::Text(text)) => headers.put_static("schema_version", text.as_bytes()),
            None => {}
        }
        if row.from_snapshot {
            headers.put_static("source", b"snapshot");
        }
        if let Some(id) = &row.snapshot_id {
            headers.put_static("snapshot_id", id.as_bytes());
        }
        for (placement, placed) in &self.placements {
            if placement.target != PlacementTarget::Header {
                continue;
            }
            match placed_value(row, *placed) {
                Value::Null => {}
                Value::Text(text) | Value::Json(text) => headers.put(&placement.name, text.as_bytes()),
                Value::Integer(n) => headers.put(&placement.name, itoa(n, &mut [0; 40])),
                Value::Bytes(bytes) => headers.put(&placement.name, bytes),
            }
        }
        for (name, value) in &extra {
            headers.put(name, value.as_bytes());
        }
        headers.finish();
        Ok(())
    }

    /// The cached schema of `subject` at `version` (`None`: latest), or the poison verdict of a row whose
    /// schema is missing.
    fn schema(
        &self,
        subject: String,
        version: Option<i64>,
        row: &OutboxRow,
        poison: &impl Fn(PoisonKind, String) -> Poison,
    ) -> Result<Arc<crate::schema::Resolved>, Poison> {
        let schemas = self.schemas.as_ref().expect("validation requires [schema_registry]");
        match schemas.cached(&subject, version) {
            Cached::Known(schema) => Ok(schema),
            Cached::Missing(why) => Err(poison(PoisonKind::SchemaMissing, why)),
            Cached::Unknown => Err(poison(
                PoisonKind::SchemaMissing,
                format!(
                    "subject {subject:?} was not looked up before routing event {} (a bug: Router::resolve first)",
                    row.id
                ),
            )),
        }
    }

    /// Appends the `envelope` placements' fields to a serialized envelope (`{…}`), after `data`.
    fn append_envelope_fields(&self, row: &OutboxRow, value: &mut Vec<u8>) {
        let mut fields = (self.placements.iter())
            .filter(|(p, _)| p.target == PlacementTarget::Envelope)
            .map(|(p, placed)| (p, placed_value(row, *placed)));
        let Some(first) = fields.next() else { return };
        value.pop(); // the closing brace
        for (placement, column) in std::iter::once(first).chain(fields) {
            value.push(b',');
            serde_json::to_writer(&mut *value, &placement.name).expect("a string serializes");
            value.push(b':');
            match column {
                Value::Null => value.extend_from_slice(b"null"),
                Value::Text(text) => serde_json::to_writer(&mut *value, text).expect("a string serializes"),
                Value::Integer(n) => value.extend_from_slice(itoa(n, &mut [0; 40])),
                // Checked JSON embeds as JSON; a JSON column holding something else is published as its text.
                Value::Json(text) => match serde_json::from_str::<&RawValue>(text) {
                    Ok(json) => value.extend_from_slice(json.get().as_bytes()),
                    Err(_) => serde_json::to_writer(&mut *value, text).expect("a string serializes"),
                },
                // Only a bytes payload placed in the envelope, which validation refuses (it needs
                // value_format = "payload", which has no envelope).
                Value::Bytes(_) => value.extend_from_slice(b"null"),
            }
        }
        value.push(b'}');
    }
}

/// A placed column's value, borrowed from the row.
enum Value<'r> {
    Null,
    Text(&'r str),
    Integer(i128),
    Json(&'r str),
    Bytes(&'r [u8]),
}

/// The value of the column placed at `placed`.
fn placed_value(row: &OutboxRow, placed: Placed) -> Value<'_> {
    fn text(text: Option<&str>) -> Value<'_> {
        text.map_or(Value::Null, Value::Text)
    }
    match placed {
        Placed::Role(0) => Value::Text(&row.id),
        Placed::Role(1) => Value::Text(&row.aggregate_type),
        Placed::Role(2) => Value::Text(&row.aggregate_id),
        Placed::Role(3) => text(row.event_type.as_deref()),
        Placed::Role(4) => match &row.schema_version {
            Some(SchemaVersion::Integer(n)) => Value::Integer(*n),
            Some(SchemaVersion::Text(version)) => Value::Text(version),
            None => Value::Null,
        },
        Placed::Role(5) => match &row.payload {
            Payload::Json(json) => Value::Json(json),
            Payload::Bytes(bytes) => Value::Bytes(bytes),
            Payload::Null => Value::Null,
        },
        Placed::Role(6) => row.headers.as_deref().map_or(Value::Null, Value::Json),
        Placed::Role(_) => text(row.occurred_at.as_deref()),
        Placed::Additional(index) => match &row.additional[index] {
            ColumnValue::Null => Value::Null,
            ColumnValue::Text(text) => Value::Text(text),
            ColumnValue::Integer(n) => Value::Integer(*n),
            ColumnValue::Json(json) => Value::Json(json),
        },
    }
}

/// `n` in decimal, written into `buf` (39 digits and a sign hold any `i128`).
fn itoa(n: i128, buf: &mut [u8; 40]) -> &[u8] {
    let mut start = buf.len();
    let mut rest = n.unsigned_abs();
    loop {
        start -= 1;
        buf[start] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    if n < 0 {
        start -= 1;
        buf[start] = b'-';
    }
    &buf[start..]
}

/// Writes a record's headers over the previous record's, reusing their buffers.
struct HeaderWriter<'a> {
    headers: &'a mut Vec<(HeaderName, Vec<u8>)>,
    /// Headers written so far.
    len: usize,
}

impl HeaderWriter<'_> {
    fn next_slot(&mut self) -> &mut (HeaderName, Vec<u8>) {
        if self.len == self.headers.len() {
            self.headers.push((HeaderName::Borrowed(""), Vec::new()));
        }
        self.len += 1;
        &mut self.headers[self.len - 1]
    }

    fn put_static(&mut self, name: &'static str, value: &[u8]) {
        let (slot_name, slot_value) = self.next_slot();
        *slot_name = HeaderName::Borrowed(name);
        slot_value.clear();
        slot_value.extend_from_slice(value);
    }

    fn put(&mut self, name: &str, value: &[u8]) {
        let (slot_name, slot_value) = self.next_slot();
        match slot_name {
            HeaderName::Owned(owned) => {
                owned.clear();
                owned.push_str(name);
            }
            HeaderName::Borrowed(_) => *slot_name = HeaderName::Owned(name.to_owned()),
        }
        slot_value.clear();
        slot_value.extend_from_slice(value);
    }

    /// Drops the previous record's headers beyond this one's.
    fn finish(self) {
        self.headers.truncate(self.len);
    }
}

/// The string entries of a row's `headers` JSON object, in key order (a repeated key counts once, with its
/// last value, as in a JSON object); entries of other types are left out. `null` has none.
///
/// Names and values borrow from `text` unless escaped; only the map's node is allocated.
///
/// # Errors
/// What is wrong with `text`, when it is not a JSON object or `null`.
fn extra_headers(text: &str) -> Result<Vec<TextEntry<'_>>, String> {
    let object: Option<BTreeMap<BorrowedStr<'_>, &RawValue>> = match serde_json::from_str(text) {
        Ok(object) => object,
        // Cold path: the strict parse above says only that it failed; this one says why.
        Err(_) => {
            return Err(match serde_json::from_str::<serde_json::Value>(text) {
                Ok(other) => format!("headers must be a JSON object, found {other}"),
                Err(e) => format!("headers is not valid JSON: {e}"),
            })
        }
    };
    let mut strings = Vec::new();
    for (BorrowedStr(name), value) in object.into_iter().flatten() {
        if value.get().starts_with('"') {
            let BorrowedStr(value) = serde_json::from_str(value.get()).map_err(|e| e.to_string())?;
            strings.push((name, value));
        }
    }
    Ok(strings)
}

/// A header name and text value from the `headers` column.
type TextEntry<'a> = (Cow<'a, str>, Cow<'a, str>);

/// A JSON string, borrowed from the input unless it has escapes.
#[derive(serde::Deserialize, PartialEq, Eq, PartialOrd, Ord)]
struct BorrowedStr<'a>(#[serde(borrow)] Cow<'a, str>);

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::outbox::TableName;

    fn row() -> OutboxRow {
        OutboxRow {
            table: Arc::new(TableName { database: "shop".into(), table: "outbox_events".into() }),
            id: "0b0e1c9e-8d2f-4f7e-9c1a-2a2b3c4d5e6f".into(),
            aggregate_type: "order".into(),
            aggregate_id: "A-1".into(),
            event_type: Some("OrderCreated".into()),
            schema_version: Some(crate::outbox::SchemaVersion::Integer(3)),
            payload: r#"{"total": 12.5, "note": "订单 🚀"}"#.into(),
            headers: Some(r#"{"traceparent": "00-abc-01", "n": 5}"#.into()),
            occurred_at: Some("2026-11-30T12:34:56.123456".into()),
            additional: Vec::new(),
            from_snapshot: false,
            snapshot_id: None,
        }
    }

    /// A table without the optional columns (`event_type`, `schema_version`, `occurred_at`, `headers`):
    /// the envelope leaves out `type`, `version` and `occurred_at` (never `null`), the headers leave out
    /// `event_type` and `schema_version`; everything else is as for the reference schema.
    #[test]
    fn absent_optional_columns_leave_their_fields_out() {
        let mut r = row();
        (r.event_type, r.schema_version, r.occurred_at, r.headers) = (None, None, None, None);
        let rec = router("outbox.event.${aggregate_type}", ValueFormat::Envelope).route(&r).unwrap();
        assert_eq!(
            std::str::from_utf8(&rec.value).unwrap(),
            r#"{"event_id":"0b0e1c9e-8d2f-4f7e-9c1a-2a2b3c4d5e6f","aggregate_type":"order","aggregate_id":"A-1","data":{"total": 12.5, "note": "订单 🚀"}}"#
        );
        let names: Vec<&str> = rec.headers.iter().map(|(k, _)| k.as_ref()).collect();
        assert_eq!(names, ["id", "aggregate_type"]);
        let payload_only = router("t", ValueFormat::Payload).route(&r).unwrap();
        assert_eq!(payload_only.value, r.payload.as_bytes());
        // A topic template that needs the absent column is a poison verdict naming it, never a topic with a
        // hole in it.
        let err = router("outbox.${event_type}", ValueFormat::Envelope).route(&r).unwrap_err();
        assert!(err.to_string().contains("no event_type column"), "{err}");
    }

    /// Regression guard for the reference schema: its envelope stays byte for byte what it was before the
    /// optional columns (field order and spelling included).
    #[test]
    fn reference_envelope_is_unchanged() {
        let rec = router("t", ValueFormat::Envelope).route(&row()).unwrap();
        assert_eq!(
            std::str::from_utf8(&rec.value).unwrap(),
            r#"{"event_id":"0b0e1c9e-8d2f-4f7e-9c1a-2a2b3c4d5e6f","type":"OrderCreated","version":3,"occurred_at":"2026-11-30T12:34:56.123456","aggregate_type":"order","aggregate_id":"A-1","data":{"total": 12.5, "note": "订单 🚀"}}"#
        );
    }

    fn router(template: &str, format: ValueFormat) -> Router {
        Router::new(TopicTemplate::parse(template).unwrap(), format)
    }

    /// The router of a `connector.toml` whose `[outbox]` and `[kafka]` sections end with `outbox` and
    /// `kafka`.
    fn configured(outbox: &str, kafka: &str) -> Router {
        let toml = format!(
            "[source]\nhost = \"h\"\nuser = \"u\"\nserver_id = 1\n[outbox]\ntable = \"shop.outbox_events\"\n{outbox}\n\
             [kafka]\nbootstrap_servers = \"k:9092\"\ntopic = \"t\"\n{kafka}\n"
        );
        Router::for_config(&Config::parse(&toml).unwrap())
    }

    fn header<'r>(rec: &'r KafkaRecord, name: &str) -> Option<&'r [u8]> {
        rec.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_slice())
    }

    /// `key_format = "json"` writes the key as Debezium's JsonConverter did (a JSON string, escapes
    /// included), so a migrated topic's keys, and so partitions, stay the same.
    #[test]
    fn json_keys_are_json_strings() {
        let router = configured("", "key_format = \"json\"");
        let mut r = row();
        assert_eq!(router.route(&r).unwrap().key, br#""A-1""#);
        r.aggregate_id = "say \"hi\" \u{1F680}".into();
        assert_eq!(router.route(&r).unwrap().key, r#""say \"hi\" 🚀""#.as_bytes());
        assert_eq!(configured("", "").route(&r).unwrap().key, r.aggregate_id.as_bytes());
    }

    /// `record_timestamp = "occurred_at"`: the record carries occurred_at in ms (UTC); without the column,
    /// or by default, the producer stamps it.
    #[test]
    fn record_timestamp_is_occurred_at_when_asked() {
        let router = configured("", "record_timestamp = \"occurred_at\"");
        // 2026-11-30T12:34:56.123456 UTC
        assert_eq!(router.route(&row()).unwrap().timestamp_ms, Some(1_796_042_096_123));
        let mut r = row();
        r.occurred_at = Some("1970-01-01T00:00:00".into());
        assert_eq!(router.route(&r).unwrap().timestamp_ms, Some(0));
        r.occurred_at = None;
        assert_eq!(router.route(&r).unwrap().timestamp_ms, None);
        assert_eq!(configured("", "").route(&row()).unwrap().timestamp_ms, None);
    }

    /// A NULL or empty payload is a tombstone with `tombstone_on_empty_payload` (key and headers kept,
    /// value null), and poison without it.
    #[test]
    fn empty_payloads_are_tombstones_only_when_asked() {
        let tombstones = configured("tombstone_on_empty_payload = true", "");
        for payload in [Payload::Null, Payload::Json(String::new())] {
            let mut r = row();
            r.payload = payload.clone();
            let rec = tombstones.route(&r).unwrap();
            assert!(rec.tombstone && rec.value.is_empty(), "{payload:?}");
            assert_eq!((rec.key.as_slice(), header(&rec, "id")), (&b"A-1"[..], Some(r.id.as_bytes())));
            let err = configured("", "").route(&r).unwrap_err();
            assert_eq!(err.kind, PoisonKind::InvalidPayload, "{payload:?}");
        }
        let mut r = row();
        r.payload = Payload::Null;
        assert!(configured("", "").route(&r).unwrap_err().to_string().contains("tombstone_on_empty_payload"));
        // A payload that is there is never a tombstone, and the record after a tombstone is whole again.
        let mut record = KafkaRecord::default();
        tombstones.route_into(&r, &mut record).unwrap();
        tombstones.route_into(&row(), &mut record).unwrap();
        assert!(!record.tombstone && !record.value.is_empty());
    }

    /// `payload_encoding = "bytes"`: the column's bytes are the value, unchanged (not UTF-8, not JSON).
    #[test]
    fn bytes_payloads_are_the_value_unchanged() {
        let bytes = configured("payload_encoding = \"bytes\"", "value_format = \"payload\"");
        let mut r = row();
        r.payload = Payload::Bytes(vec![0x00, 0xff, 0xc3, 0x28, b'{']);
        assert_eq!(bytes.route(&r).unwrap().value, [0x00, 0xff, 0xc3, 0x28, b'{']);
        r.payload = Payload::Bytes(Vec::new());
        let empty = bytes.route(&r).unwrap();
        assert!(empty.value.is_empty() && !empty.tombstone, "an empty value, not a tombstone");
        let err = router("t", ValueFormat::Envelope).route(&row_with(Payload::Bytes(vec![1]))).unwrap_err();
        assert_eq!(err.kind, PoisonKind::InvalidPayload);
    }

    fn row_with(payload: Payload) -> OutboxRow {
        OutboxRow { payload, ..row() }
    }

    /// Structured CloudEvents 1.0: the required attributes, `subject` = aggregate id, `time` in UTC, the
    /// payload embedded as JSON; `type` falls back to the aggregate type without an event_type column.
    #[test]
    fn cloudevents_are_structured_json() {
        let router = configured("", "value_format = \"cloudevents\"");
        let v: serde_json::Value = serde_json::from_slice(&router.route(&row()).unwrap().value).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "specversion": "1.0",
                "id": "0b0e1c9e-8d2f-4f7e-9c1a-2a2b3c4d5e6f",
                "source": "/shop/outbox_events",
                "type": "OrderCreated",
                "subject": "A-1",
                "time": "2026-11-30T12:34:56.123456Z",
                "datacontenttype": "application/json",
                "aggregatetype": "order",
                "schemaversion": 3,
                "data": {"total": 12.5, "note": "订单 🚀"},
            })
        );
        let mut r = row();
        (r.event_type, r.schema_version, r.occurred_at) = (None, None, None);
        let v: serde_json::Value = serde_json::from_slice(&router.route(&r).unwrap().value).unwrap();
        assert_eq!(v["type"], "order");
        assert!(v.get("time").is_none() && v.get("schemaversion").is_none(), "{v}");
    }

    /// A text schema_version is a JSON string in the envelope and its text in the header; an integer one
    /// of any width its digits.
    #[test]
    fn schema_versions_of_any_integer_or_text() {
        let mut r = row();
        for (version, envelope, header_text) in [
            (SchemaVersion::Text("2.1".into()), serde_json::json!("2.1"), "2.1"),
            (SchemaVersion::Integer(-5), serde_json::json!(-5), "-5"),
            (SchemaVersion::Integer(u64::MAX.into()), serde_json::json!(u64::MAX), "18446744073709551615"),
        ] {
            r.schema_version = Some(version);
            let rec = router("t", ValueFormat::Envelope).route(&r).unwrap();
            let v: serde_json::Value = serde_json::from_slice(&rec.value).unwrap();
            assert_eq!(
                (v["version"].clone(), header(&rec, "schema_version")),
                (envelope, Some(header_text.as_bytes()))
            );
        }
    }

    /// `additional_placement`: a header holds the value's text (none for NULL), an envelope field its JSON
    /// (a number for an integer, embedded JSON for a JSON column), after `data`; one column may be placed
    /// twice.
    #[test]
    fn additional_columns_become_headers_and_envelope_fields() {
        let router = configured(
            r#"additional_placement = ["tenant:header", "type:header:eventType", "tenant:envelope:tenantId", "n:envelope", "meta:envelope", "gone:header", "gone:envelope"]"#,
            "",
        );
        let mut r = row();
        r.additional = vec![
            ColumnValue::Text("acme".into()),
            ColumnValue::Text("OrderCreated".into()),
            ColumnValue::Integer(-42),
            ColumnValue::Json(r#"{"a": [1]}"#.into()),
            ColumnValue::Null,
        ];
        let rec = router.route(&r).unwrap();
        assert_eq!(header(&rec, "tenant"), Some(&b"acme"[..]));
        assert_eq!(header(&rec, "eventType"), Some(&b"OrderCreated"[..]));
        assert_eq!(header(&rec, "gone"), None);
        let text = std::str::from_utf8(&rec.value).unwrap();
        assert!(
            text.ends_with(
                r#","data":{"total": 12.5, "note": "订单 🚀"},"tenantId":"acme","n":-42,"meta":{"a": [1]},"gone":null}"#
            ),
            "{text}"
        );
        serde_json::from_str::<serde_json::Value>(text).unwrap();
        // A role's own column is placed with the role's value (Debezium's `type:header:eventType`), and
        // must then exist even if optional.
        let roles = configured(
            "additional_placement = [\"type:header:eventType\", \"schema_version:envelope:v\", \"id:envelope:eventId\"]\n\
             [outbox.columns]\nevent_type = \"type\"",
            "",
        );
        let rec = roles.route(&row()).unwrap();
        assert_eq!(header(&rec, "eventType"), Some(&b"OrderCreated"[..]));
        let v: serde_json::Value = serde_json::from_slice(&rec.value).unwrap();
        assert_eq!((&v["v"], &v["eventId"]), (&serde_json::json!(3), &serde_json::json!(row().id)));
        let config = Config::parse(
            "[source]\nhost = \"h\"\nuser = \"u\"\nserver_id = 1\n[outbox]\ntable = \"s.t\"\n\
             additional_placement = [\"headers:header:h\"]\n[kafka]\nbootstrap_servers = \"k:9092\"\n",
        )
        .unwrap();
        assert!(config.outbox.columns.must_exist(6) && config.outbox.columns.additional().is_empty());
        // A row without the values (a table altered under the connector) is a diagnosis, not a panic.
        r.additional.clear();
        assert_eq!(router.route(&r).unwrap_err().kind, PoisonKind::Undecodable);
    }

    #[test]
    fn envelope_embeds_payload_as_json() {
        let rec = router("outbox.event.${aggregate_type}", ValueFormat::Envelope).route(&row()).unwrap();
        assert_eq!(rec.topic, "outbox.event.order");
        assert_eq!(rec.key, b"A-1");
        let v: serde_json::Value = serde_json::from_slice(&rec.value).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "event_id": "0b0e1c9e-8d2f-4f7e-9c1a-2a2b3c4d5e6f",
                "type": "OrderCreated",
                "version": 3,
                "occurred_at": "2026-11-30T12:34:56.123456",
                "aggregate_type": "order",
                "aggregate_id": "A-1",
                "data": {"total": 12.5, "note": "订单 🚀"},
            })
        );
    }

    #[test]
    fn payload_format_is_the_payload_verbatim() {
        let rec = router("t", ValueFormat::Payload).route(&row()).unwrap();
        assert_eq!(rec.value, row().payload.as_bytes());
    }

    #[test]
    fn headers_carry_metadata_and_string_entries_only() {
        let rec = router("t", ValueFormat::Envelope).route(&row()).unwrap();
        let names: Vec<&str> = rec.headers.iter().map(|(k, _)| k.as_ref()).collect();
        assert_eq!(names, ["id", "event_type", "aggregate_type", "schema_version", "traceparent"]);
        assert_eq!(names[AGGREGATE_TYPE_HEADER_INDEX], "aggregate_type");
        assert_eq!(rec.headers[3].1, b"3");
        assert_eq!(rec.headers[4].1, b"00-abc-01");
    }

    /// The `headers` column is read as a JSON object would be: key order, the last of repeated keys, escapes
    /// decoded, only string values; nested values and `null` add nothing.
    #[test]
    fn header_column_entries() {
        let cases: [(&str, &[(&str, &str)]); 6] = [
            (r#"{"b": "2", "a": "1"}"#, &[("a", "1"), ("b", "2")]),
            (r#"{"a": "1", "a": 5}"#, &[]),
            (r#"{"a": 5, "a": "x"}"#, &[("a", "x")]),
            (
                r#"{"t\u00e9": "line\nbreak \"q\"", "n": null, "o": {"x": "y"}, "l": ["z"]}"#,
                &[("té", "line\nbreak \"q\"")],
            ),
            ("null", &[]),
            ("{}", &[]),
        ];
        for (text, want) in cases {
            let mut r = row();
            r.headers = Some(text.into());
            let rec = router("t", ValueFormat::Envelope).route(&r).unwrap();
            let extra: Vec<(&str, &str)> =
                rec.headers[4..].iter().map(|(k, v)| (k.as_ref(), std::str::from_utf8(v).unwrap())).collect();
            assert_eq!(extra, want, "{text}");
        }
    }

    /// Unescaped names and values are borrowed from the column's text, not copied: why it is not read into a
    /// `serde_json::Map`.
    #[test]
    fn header_column_entries_borrow_unless_escaped() {
        let entries = extra_headers(r#"{"plain": "x", "esc\u0061ped": "y\n"}"#).unwrap();
        let borrowed: Vec<(bool, bool)> =
            entries.iter().map(|(k, v)| (matches!(k, Cow::Borrowed(_)), matches!(v, Cow::Borrowed(_)))).collect();
        assert_eq!(borrowed, [(false, false), (true, true)]);
    }

    /// Routing into a record that held a previous row's record leaves nothing of it behind.
    #[test]
    fn route_into_reuses_without_leftovers() {
        let router = router("${aggregate_type}.${event_type}", ValueFormat::Envelope);
        let mut big = row();
        big.from_snapshot = true;
        big.headers = Some(r#"{"traceparent": "00-abc-01", "tenant": "t-1", "z": "last"}"#.into());
        big.payload = format!(r#"{{"pad": "{}"}}"#, "x".repeat(1000)).into();
        let mut small = row();
        small.aggregate_type = "o".into();
        small.aggregate_id = "B".into();
        small.schema_version = Some(SchemaVersion::Integer(12));
        small.headers = Some(r#"{"a": "1"}"#.into());
        let mut reused = KafkaRecord::default();
        for r in [&big, &small, &big, &row(), &small] {
            router.route_into(r, &mut reused).unwrap();
            assert_eq!(reused, router.route(r).unwrap());
        }
        assert_eq!(std::str::from_utf8(&reused.headers[3].1), Ok("12"));
    }

    #[test]
    fn snapshot_rows_are_marked() {
        let mut r = row();
        r.from_snapshot = true;
        let rec = router("t", ValueFormat::Envelope).route(&r).unwrap();
        assert_eq!(rec.headers[4], ("source".into(), b"snapshot".to_vec()));
        assert_eq!(rec.value, router("t", ValueFormat::Envelope).route(&row()).unwrap().value);
    }

    #[test]
    fn null_headers_column_adds_nothing() {
        let mut r = row();
        r.headers = None;
        assert_eq!(router("t", ValueFormat::Envelope).route(&r).unwrap().headers.len(), 4);
    }

    #[test]
    fn template_placeholders_render() {
        let rec = router("${database}.${table}.${aggregate_type}.${event_type}", ValueFormat::Envelope)
            .route(&row())
            .unwrap();
        assert_eq!(rec.topic, "shop.outbox_events.order.OrderCreated");
    }

    #[test]
    fn template_errors_are_definite() {
        for bad in ["x.${nope}", "x.${aggregate_type", ""] {
            assert!(TopicTemplate::parse(bad).unwrap_err().is_definite(), "{bad}");
        }
    }

    #[test]
    fn illegal_topic_names_the_row() {
        let mut r = row();
        r.aggregate_type = "bad type/with slash".into();
        let err = router("outbox.${aggregate_type}", ValueFormat::Envelope).route(&r).unwrap_err();
        assert!(err.to_string().contains(&r.id), "{err}");
        assert_eq!(err.kind, PoisonKind::IllegalTopic);
    }

    #[test]
    fn legal_topic_rules() {
        assert!(is_legal_topic("outbox.event.order_v2-x"));
        for bad in ["", ".", "..", "a b", "订单", &"x".repeat(250)] {
            assert!(!is_legal_topic(bad), "{bad}");
        }
        assert!(is_legal_topic(&"x".repeat(249)));
    }

    #[test]
    fn invalid_payload_and_empty_key_are_poison() {
        let mut r = row();
        r.payload = "{not json".into();
        assert_eq!(router("t", ValueFormat::Envelope).route(&r).unwrap_err().kind, PoisonKind::InvalidPayload);
        let mut r = row();
        r.aggregate_id.clear();
        assert_eq!(router("t", ValueFormat::Envelope).route(&r).unwrap_err().kind, PoisonKind::EmptyAggregateId);
        let mut r = row();
        r.headers = Some("[1]".into());
        assert_eq!(router("t", ValueFormat::Envelope).route(&r).unwrap_err().kind, PoisonKind::InvalidHeaders);
    }
}
