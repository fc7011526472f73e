//! Topic names: the `kafka.topic` template (`outbox.event.${aggregate_type}`) parsed once, and Kafka's rule
//! for a legal topic name. Config validation and the router both use them.
//!
//! Floor 2 (docs/ARCHITECTURE.md): imports floors 0-1 (vocabulary, error, metrics).

use crate::error::{Error, Result};
use crate::outbox::TableName;

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

    /// The topic for a row of `table` with these column values (what `outbox-cdc audit` uses to find the
    /// topics the routing can produce to).
    pub fn render_parts(&self, table: &TableName, aggregate_type: &str, event_type: &str) -> String {
        let mut topic = String::with_capacity(64);
        self.render_into(&mut topic, table, aggregate_type, event_type);
        topic
    }

    /// Renders the topic into `topic`, replacing its contents.
    pub(crate) fn render_into(&self, topic: &mut String, table: &TableName, aggregate_type: &str, event_type: &str) {
        topic.clear();
        for segment in &self.segments {
            topic.push_str(match segment {
                Segment::Literal(s) => s,
                Segment::AggregateType => aggregate_type,
                Segment::EventType => event_type,
                Segment::Database => &table.database,
                Segment::Table => &table.table,
            });
        }
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
