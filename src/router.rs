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
//!   initial snapshot, then each top-level string entry of the row's `headers` JSON object (e.g. `traceparent`).

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::value::RawValue;

use crate::config::ValueFormat;
use crate::error::Result;
use crate::outbox::OutboxRow;
use crate::poison::{Poison, PoisonKind};
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
    /// Partitioning key: the aggregate id.
    pub key: String,
    /// Serialized value.
    pub value: Vec<u8>,
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
}

/// The envelope value. A field whose column the table does not have (`type`, `version`, `occurred_at`)
/// is left out, not written as `null`: the reference schema's envelope is unchanged byte for byte.
#[derive(Serialize)]
struct Envelope<'a> {
    event_id: &'a str,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    event_type: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    version: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    occurred_at: Option<&'a str>,
    aggregate_type: &'a str,
    aggregate_id: &'a str,
    data: &'a RawValue,
}

impl Router {
    /// A router for a topic template and value format.
    pub fn new(template: TopicTemplate, value_format: ValueFormat) -> Self {
        Router { template, value_format }
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
        let payload: &RawValue = serde_json::from_str(&row.payload)
            .map_err(|e| poison(PoisonKind::InvalidPayload, format!("payload is not valid JSON: {e}")))?;
        let extra = match &row.headers {
            Some(text) => extra_headers(text).map_err(|what| poison(PoisonKind::InvalidHeaders, what))?,
            None => Vec::new(),
        };
        record.key.clear();
        record.key.push_str(&row.aggregate_id);
        record.value.clear();
        match self.value_format {
            ValueFormat::Envelope => {
                // The envelope is the payload plus a few short fields.
                record.value.reserve(row.payload.len() + 192 + row.id.len() + row.aggregate_id.len());
                serde_json::to_writer(
                    &mut record.value,
                    &Envelope {
                        event_id: &row.id,
                        event_type: row.event_type.as_deref(),
                        version: row.schema_version,
                        occurred_at: row.occurred_at.as_deref(),
                        aggregate_type: &row.aggregate_type,
                        aggregate_id: &row.aggregate_id,
                        data: payload,
                    },
                )
                .expect("serializing strings and raw JSON cannot fail");
            }
            ValueFormat::Payload => record.value.extend_from_slice(payload.get().as_bytes()),
        }
        let mut headers = HeaderWriter { headers: &mut record.headers, len: 0 };
        headers.put_static("id", row.id.as_bytes());
        // Headers of absent columns are left out; the others keep their order.
        if let Some(event_type) = &row.event_type {
            headers.put_static("event_type", event_type.as_bytes());
        }
        headers.put_static("aggregate_type", row.aggregate_type.as_bytes());
        if let Some(version) = row.schema_version {
            headers.put_static("schema_version", itoa_u16(version, &mut [0; 5]));
        }
        if row.from_snapshot {
            headers.put_static("source", b"snapshot");
        }
        for (name, value) in &extra {
            headers.put(name, value.as_bytes());
        }
        headers.finish();
        Ok(())
    }
}

/// `n` in decimal, written into `buf`.
fn itoa_u16(mut n: u16, buf: &mut [u8; 5]) -> &[u8] {
    let mut start = buf.len();
    loop {
        start -= 1;
        buf[start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[start..];
        }
    }
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
            schema_version: Some(3),
            payload: r#"{"total": 12.5, "note": "订单 🚀"}"#.into(),
            headers: Some(r#"{"traceparent": "00-abc-01", "n": 5}"#.into()),
            occurred_at: Some("2026-11-30T12:34:56.123456".into()),
            from_snapshot: false,
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

    #[test]
    fn envelope_embeds_payload_as_json() {
        let rec = router("outbox.event.${aggregate_type}", ValueFormat::Envelope).route(&row()).unwrap();
        assert_eq!(rec.topic, "outbox.event.order");
        assert_eq!(rec.key, "A-1");
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
        big.payload = format!(r#"{{"pad": "{}"}}"#, "x".repeat(1000));
        let mut small = row();
        small.aggregate_type = "o".into();
        small.aggregate_id = "B".into();
        small.schema_version = Some(12);
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
