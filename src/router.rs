//! Pure routing: one outbox row becomes one Kafka record (topic, key, value, headers), following the
//! Debezium Outbox Event Router conventions so that users migrating from Debezium feel at home.
//!
//! - Topic: a template (default `outbox.event.${aggregate_type}`), checked against Kafka's topic-name rules.
//! - Key: the aggregate id. The producer partitions with murmur2 (the Java client's default), so every
//!   producer and consumer of the topic agrees on which partition holds an aggregate.
//! - Value: an envelope with the payload embedded as JSON (not as an escaped string), or the payload alone.
//! - Headers: `id`, `event_type`, `aggregate_type`, `schema_version`, `source: snapshot` for rows read by the
//!   initial snapshot, then each top-level string entry of the row's `headers` JSON object (e.g. `traceparent`).

use serde::Serialize;
use serde_json::value::RawValue;

use crate::config::{TableName, ValueFormat};
use crate::error::{Error, Result};
use crate::quarantine::{Poison, PoisonKind};
use crate::source::OutboxRow;

/// A header name: the connector's own are static (no allocation per record).
pub type HeaderName = std::borrow::Cow<'static, str>;

/// A record ready for the producer.
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// One piece of a topic template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    AggregateType,
    EventType,
    Database,
    Table,
}

/// A parsed topic template such as `outbox.event.${aggregate_type}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicTemplate {
    segments: Vec<Segment>,
}

impl TopicTemplate {
    /// Parses a template.
    ///
    /// # Errors
    /// A definite error for an unknown or unterminated placeholder, or an empty template.
    pub fn parse(template: &str) -> Result<Self> {
        let mut segments = Vec::new();
        let mut rest = template;
        while let Some(start) = rest.find("${") {
            if start > 0 {
                segments.push(Segment::Literal(rest[..start].to_string()));
            }
            let after = &rest[start + 2..];
            let end = after
                .find('}')
                .ok_or_else(|| Error::definite(format!("kafka.topic {template:?}: unterminated placeholder")))?;
            segments.push(match &after[..end] {
                "aggregate_type" => Segment::AggregateType,
                "event_type" => Segment::EventType,
                "database" => Segment::Database,
                "table" => Segment::Table,
                other => {
                    return Err(Error::definite(format!(
                        "kafka.topic {template:?}: unknown placeholder ${{{other}}}; known: \
                         ${{aggregate_type}}, ${{event_type}}, ${{database}}, ${{table}}"
                    )))
                }
            });
            rest = &after[end + 1..];
        }
        if !rest.is_empty() {
            segments.push(Segment::Literal(rest.to_string()));
        }
        if segments.is_empty() {
            return Err(Error::definite("kafka.topic must not be empty"));
        }
        Ok(TopicTemplate { segments })
    }

    /// The topic for a row.
    fn render(&self, row: &OutboxRow) -> String {
        self.render_parts(&row.table, &row.aggregate_type, &row.event_type)
    }

    /// The topic for a row of `table` with these column values (what `outbox-cdc audit` uses to find the
    /// topics the routing can produce to).
    pub fn render_parts(&self, table: &TableName, aggregate_type: &str, event_type: &str) -> String {
        let mut topic = String::with_capacity(64);
        for segment in &self.segments {
            topic.push_str(match segment {
                Segment::Literal(s) => s,
                Segment::AggregateType => aggregate_type,
                Segment::EventType => event_type,
                Segment::Database => &table.database,
                Segment::Table => &table.table,
            });
        }
        topic
    }

    /// Whether the topic depends on the row's `aggregate_type` and on its `event_type`.
    pub fn uses_columns(&self) -> (bool, bool) {
        (self.segments.contains(&Segment::AggregateType), self.segments.contains(&Segment::EventType))
    }
}

/// Kafka's legal topic names: 1..=249 characters of `[a-zA-Z0-9._-]`, not `.` or `..`.
pub fn is_legal_topic(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 249
        && name != "."
        && name != ".."
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

/// Turns outbox rows into Kafka records.
#[derive(Debug, Clone)]
pub struct Router {
    template: TopicTemplate,
    value_format: ValueFormat,
}

#[derive(Serialize)]
struct Envelope<'a> {
    event_id: &'a str,
    #[serde(rename = "type")]
    event_type: &'a str,
    version: u16,
    occurred_at: &'a str,
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
        let poison = |kind: PoisonKind, what: String| {
            Poison::new(kind, format!("outbox row id={} in {} cannot become a Kafka record: {what}", row.id, row.table))
        };
        let topic = self.template.render(row);
        if !is_legal_topic(&topic) {
            return Err(poison(
                PoisonKind::IllegalTopic,
                format!("routed topic {topic:?} is not a legal Kafka topic name (1-249 of [a-zA-Z0-9._-])"),
            ));
        }
        if row.aggregate_id.is_empty() {
            return Err(poison(PoisonKind::EmptyAggregateId, "aggregate_id is empty".into()));
        }
        let payload: &RawValue = serde_json::from_str(&row.payload)
            .map_err(|e| poison(PoisonKind::InvalidPayload, format!("payload is not valid JSON: {e}")))?;
        let value = match self.value_format {
            ValueFormat::Envelope => {
                // Sized once: the envelope is the payload plus a few short fields.
                let mut value = Vec::with_capacity(row.payload.len() + 192 + row.id.len() + row.aggregate_id.len());
                serde_json::to_writer(
                    &mut value,
                    &Envelope {
                        event_id: &row.id,
                        event_type: &row.event_type,
                        version: row.schema_version,
                        occurred_at: &row.occurred_at,
                        aggregate_type: &row.aggregate_type,
                        aggregate_id: &row.aggregate_id,
                        data: payload,
                    },
                )
                .expect("serializing strings and raw JSON cannot fail");
                value
            }
            ValueFormat::Payload => payload.get().as_bytes().to_vec(),
        };
        let mut headers: Vec<(HeaderName, Vec<u8>)> = Vec::with_capacity(6);
        headers.push(("id".into(), row.id.as_bytes().to_vec()));
        headers.push(("event_type".into(), row.event_type.as_bytes().to_vec()));
        headers.push(("aggregate_type".into(), row.aggregate_type.as_bytes().to_vec()));
        headers.push(("schema_version".into(), row.schema_version.to_string().into_bytes()));
        if row.from_snapshot {
            headers.push(("source".into(), b"snapshot".to_vec()));
        }
        if let Some(extra) = &row.headers {
            let object: serde_json::Map<String, serde_json::Value> = match serde_json::from_str(extra) {
                Ok(serde_json::Value::Object(map)) => map,
                Ok(serde_json::Value::Null) => serde_json::Map::new(),
                Ok(other) => {
                    return Err(poison(
                        PoisonKind::InvalidHeaders,
                        format!("headers must be a JSON object, found {other}"),
                    ))
                }
                Err(e) => return Err(poison(PoisonKind::InvalidHeaders, format!("headers is not valid JSON: {e}"))),
            };
            for (name, value) in object {
                if let serde_json::Value::String(s) = value {
                    headers.push((name.into(), s.into_bytes()));
                }
            }
        }
        Ok(KafkaRecord { topic, key: row.aggregate_id.clone(), value, headers })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn row() -> OutboxRow {
        OutboxRow {
            table: Arc::new(TableName { database: "shop".into(), table: "outbox_events".into() }),
            id: "0b0e1c9e-8d2f-4f7e-9c1a-2a2b3c4d5e6f".into(),
            aggregate_type: "order".into(),
            aggregate_id: "A-1".into(),
            event_type: "OrderCreated".into(),
            schema_version: 3,
            payload: r#"{"total": 12.5, "note": "订单 🚀"}"#.into(),
            headers: Some(r#"{"traceparent": "00-abc-01", "n": 5}"#.into()),
            occurred_at: "2026-11-30T12:34:56.123456".into(),
            from_snapshot: false,
        }
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
        assert_eq!(rec.headers[3].1, b"3");
        assert_eq!(rec.headers[4].1, b"00-abc-01");
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
