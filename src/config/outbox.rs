//! `[outbox]`: the outbox table(s), their column names, and the columns placed in records.
//!
//! Floor 2 (docs/ARCHITECTURE.md): imports floors 0-1 (vocabulary, error, metrics).

use serde::Deserialize;

use super::ValueFormat;
use crate::error::{Error, Result};
use crate::outbox::TableName;

/// `[outbox]`: the outbox table(s).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutboxConfig {
    /// One outbox table as `database.table`.
    #[serde(default)]
    pub table: Option<String>,
    /// Several outbox tables (same column layout), as `database.table`.
    #[serde(default)]
    pub tables: Vec<String>,
    /// What an UPDATE or DELETE on an outbox table does: "ignore" (default), "warn" or "fail".
    /// (Debezium: `table.op.invalid.behavior`.) Outbox rows are immutable facts; relays that mark rows as
    /// published update them, which is harmless.
    #[serde(default)]
    pub on_update: OnUpdate,
    /// Column names, if they differ from the default schema.
    #[serde(default)]
    pub columns: ColumnNames,
    /// What a row that cannot become a valid Kafka record does (undecodable value, empty aggregate id,
    /// illegal routed topic name, record over `kafka.max_record_bytes`, or refused by the broker for a
    /// non-retryable reason): "dead_letter" (default) sends it to `kafka.dead_letter_topic` and holds its
    /// aggregate in quarantine (later events of that aggregate follow it there, in order, until
    /// `outbox-cdc quarantine release`), while other aggregates flow on; "fail" stops with a definite error.
    #[serde(default)]
    pub on_poison: OnPoison,
    /// How the payload column is read: "json" (default: JSON, or text holding JSON, embedded in the
    /// envelope) or "bytes" (BLOB/VARBINARY: Avro, Protobuf…; the column's bytes become the record value
    /// unchanged, never parsed; needs `kafka.value_format = "payload"`).
    #[serde(default)]
    pub payload_encoding: PayloadEncoding,
    /// A NULL or empty payload publishes a tombstone (same key and headers, null value) instead of a dead
    /// letter. (Debezium: `route.tombstone.on.empty.payload`.)
    #[serde(default)]
    pub tombstone_on_empty_payload: bool,
    /// More columns to publish, each `"column:header[:name]"` (a Kafka header) or
    /// `"column:envelope[:name]"` (an envelope field), `name` defaulting to the column's.
    /// (Debezium: `table.fields.additional.placement`, same syntax.)
    #[serde(default)]
    pub additional_placement: Vec<String>,
    /// A signal table in Debezium's layout (`id`, `type`, `data`, in that order), as `database.table`: its
    /// inserts, read from the binlog, ask for snapshots on demand and pause, resume or stop them
    /// (`execute-snapshot`, `pause-snapshot`, `resume-snapshot`, `stop-snapshot`). (Debezium:
    /// `signal.data.collection`.) Off by default.
    #[serde(default)]
    pub signal_table: Option<String>,
}

/// Headers the connector writes itself: an additional placement may not take their names.
const RESERVED_HEADERS: &[&str] = &[
    "id",
    "event_type",
    "aggregate_type",
    "schema_version",
    "source",
    "snapshot_id",
    "replay",
    "replayed_at",
    "released_from_hold",
];

/// Envelope fields the connector writes itself.
const RESERVED_ENVELOPE_FIELDS: &[&str] =
    &["event_id", "type", "version", "occurred_at", "aggregate_type", "aggregate_id", "data"];

/// How the payload column is read (`[outbox] payload_encoding`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PayloadEncoding {
    /// JSON, or text holding JSON.
    #[default]
    Json,
    /// Bytes published unchanged.
    Bytes,
}

/// One `[outbox] additional_placement` entry, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The table's column.
    pub column: String,
    /// Where its value goes.
    pub target: PlacementTarget,
    /// The header's or envelope field's name.
    pub name: String,
}

/// Where an additional column is placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlacementTarget {
    /// A Kafka header holding the value's text.
    Header,
    /// A field of the envelope.
    Envelope,
}

impl Placement {
    /// `column:header[:name]` or `column:envelope[:name]`.
    ///
    /// # Errors
    /// What is wrong with `entry`, for the operator.
    pub fn parse(entry: &str) -> std::result::Result<Self, String> {
        let parts: Vec<&str> = entry.split(':').collect();
        let target = match parts.get(1) {
            Some(&"header") => PlacementTarget::Header,
            Some(&"envelope") => PlacementTarget::Envelope,
            _ => {
                return Err(format!(
                    "outbox.additional_placement entry {entry:?} must be \"column:header[:name]\" or \
                     \"column:envelope[:name]\""
                ))
            }
        };
        if parts.len() > 3 || parts.iter().any(|p| p.is_empty()) {
            return Err(format!(
                "outbox.additional_placement entry {entry:?} must be \"column:header[:name]\" or \
                 \"column:envelope[:name]\" (no empty part)"
            ));
        }
        Ok(Placement { column: parts[0].into(), target, name: parts.get(2).unwrap_or(&parts[0]).to_string() })
    }
}

/// Behaviour on poison rows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnPoison {
    /// Dead-letter the row and quarantine its aggregate.
    #[default]
    DeadLetter,
    /// Stop with a definite error naming the row.
    Fail,
}

/// Behaviour on UPDATE/DELETE of outbox rows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnUpdate {
    /// Skip silently (they are not events).
    #[default]
    Ignore,
    /// Skip with a warning.
    Warn,
    /// Stop with a definite error.
    Fail,
}

/// `[outbox.columns]`: column names (Debezium: `table.field.event.*`).
///
/// `id`, `aggregate_type`, `aggregate_id` and `payload` must exist under their (default or configured)
/// names. `event_type`, `schema_version`, `occurred_at` and `headers` are optional: a table without a
/// column of the *default* name simply publishes records without that field; a name *set* here must exist,
/// so that a typo is a definite error naming it instead of a silently dropped field.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(from = "ColumnNamesToml")]
pub struct ColumnNames {
    /// Stable event id, sent as the `id` header and `event_id` field.
    pub id: String,
    /// Aggregate type: routes to the topic.
    pub aggregate_type: String,
    /// Aggregate id: the Kafka key.
    pub aggregate_id: String,
    /// Event type (optional column).
    pub event_type: String,
    /// Schema version of the payload (optional column).
    pub schema_version: String,
    /// JSON payload.
    pub payload: String,
    /// JSON object whose top-level string entries become Kafka headers (optional column).
    pub headers: String,
    /// When the event occurred: DATETIME(n) or TIMESTAMP(n) (optional column).
    pub occurred_at: String,
    /// Which names were set in `[outbox.columns]`, in [`crate::outbox::SLOT_NAMES`] order.
    pub(super) set: [bool; 8],
    /// The `[outbox] additional_placement` columns, each once, in its order (filled in by validation):
    /// every decoder reads them after the eight roles.
    additional: Vec<String>,
    /// `[outbox] payload_encoding` (filled in by validation): how decoders read the payload column.
    payload_encoding: PayloadEncoding,
}

/// `[outbox.columns]` as written: `None` where the default name applies.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ColumnNamesToml {
    id: Option<String>,
    aggregate_type: Option<String>,
    aggregate_id: Option<String>,
    event_type: Option<String>,
    schema_version: Option<String>,
    payload: Option<String>,
    headers: Option<String>,
    occurred_at: Option<String>,
}

impl From<ColumnNamesToml> for ColumnNames {
    fn from(t: ColumnNamesToml) -> Self {
        let set = [
            t.id.is_some(),
            t.aggregate_type.is_some(),
            t.aggregate_id.is_some(),
            t.event_type.is_some(),
            t.schema_version.is_some(),
            t.payload.is_some(),
            t.headers.is_some(),
            t.occurred_at.is_some(),
        ];
        let [id, aggregate_type, aggregate_id, event_type, schema_version, payload, headers, occurred_at] =
            crate::outbox::SLOT_NAMES;
        ColumnNames {
            id: t.id.unwrap_or_else(|| id.into()),
            aggregate_type: t.aggregate_type.unwrap_or_else(|| aggregate_type.into()),
            aggregate_id: t.aggregate_id.unwrap_or_else(|| aggregate_id.into()),
            event_type: t.event_type.unwrap_or_else(|| event_type.into()),
            schema_version: t.schema_version.unwrap_or_else(|| schema_version.into()),
            payload: t.payload.unwrap_or_else(|| payload.into()),
            headers: t.headers.unwrap_or_else(|| headers.into()),
            occurred_at: t.occurred_at.unwrap_or_else(|| occurred_at.into()),
            set,
            additional: Vec::new(),
            payload_encoding: PayloadEncoding::Json,
        }
    }
}

impl Default for ColumnNames {
    fn default() -> Self {
        ColumnNamesToml::default().into()
    }
}

/// Roles the table must have whatever `[outbox.columns]` says, in [`crate::outbox::SLOT_NAMES`] order.
const ALWAYS_REQUIRED: [bool; 8] = [true, true, true, false, false, true, false, false];

impl ColumnNames {
    /// The mapped columns in [`crate::outbox::SLOT_NAMES`] order, each with whether the table must have
    /// it: the four required roles always, an optional role when its name was set in `[outbox.columns]`.
    pub fn required(&self) -> [(&str, bool); 8] {
        let names = [
            &self.id,
            &self.aggregate_type,
            &self.aggregate_id,
            &self.event_type,
            &self.schema_version,
            &self.payload,
            &self.headers,
            &self.occurred_at,
        ];
        std::array::from_fn(|slot| (names[slot].as_str(), ALWAYS_REQUIRED[slot] || self.set[slot]))
    }

    /// Whether the column of role `slot` ([`crate::outbox::SLOT_NAMES`] order) must exist in the table.
    pub fn must_exist(&self, slot: usize) -> bool {
        ALWAYS_REQUIRED[slot] || self.set[slot]
    }

    /// The role ([`crate::outbox::SLOT_NAMES`] slot) whose column is `column`, if any.
    pub fn role_of(&self, column: &str) -> Option<usize> {
        self.required().iter().position(|(name, _)| name.eq_ignore_ascii_case(column))
    }

    /// The `[outbox] additional_placement` columns that are not a role's, each once, in its order: read
    /// after the eight roles.
    pub fn additional(&self) -> &[String] {
        &self.additional
    }

    /// How the payload column is read (`[outbox] payload_encoding`).
    pub fn payload_encoding(&self) -> PayloadEncoding {
        self.payload_encoding
    }

    /// The names with these additional columns and payload encoding, for tests and programmatic configs.
    #[must_use]
    pub fn reading(mut self, additional: Vec<String>, payload_encoding: PayloadEncoding) -> Self {
        (self.additional, self.payload_encoding) = (additional, payload_encoding);
        self
    }

    /// The names with `role` set explicitly to `name`, for tests and programmatic configs.
    #[must_use]
    pub fn with(mut self, role: &str, name: &str) -> Self {
        let slot = crate::outbox::SLOT_NAMES.iter().position(|r| *r == role).expect("a role of SLOT_NAMES");
        let field = match slot {
            0 => &mut self.id,
            1 => &mut self.aggregate_type,
            2 => &mut self.aggregate_id,
            3 => &mut self.event_type,
            4 => &mut self.schema_version,
            5 => &mut self.payload,
            6 => &mut self.headers,
            _ => &mut self.occurred_at,
        };
        *field = name.to_string();
        self.set[slot] = true;
        self
    }
}

impl OutboxConfig {
    /// The configured outbox tables, parsed, sorted and without duplicates.
    ///
    /// # Errors
    /// A definite error when none (or a malformed one) is configured.
    pub(super) fn tables(&self) -> Result<Vec<TableName>> {
        let mut names: Vec<TableName> = self
            .table
            .iter()
            .chain(self.tables.iter())
            .map(|s| TableName::parse(s).map_err(Error::definite))
            .collect::<Result<_>>()?;
        names.sort();
        names.dedup();
        if names.is_empty() {
            return Err(Error::definite("configure the outbox table: [outbox] table = \"database.table\""));
        }
        Ok(names)
    }

    /// `signal_table`, parsed: never one of the outbox `tables`, and only where a server is read (the
    /// binlog source reads it from the binlog, the polling relay polls it).
    ///
    /// # Errors
    /// A definite error for a name that does not parse, an outbox table, or binlog files.
    pub(super) fn signal_table(&self, tables: &[TableName], kind: super::SourceKind) -> Result<Option<TableName>> {
        let Some(name) = &self.signal_table else { return Ok(None) };
        let table = TableName::parse(name).map_err(|e| Error::definite(format!("outbox.signal_table: {e}")))?;
        if tables.contains(&table) {
            return Err(Error::definite(format!(
                "outbox.signal_table = {name:?} is an outbox table: signals go to a table of their own"
            )));
        }
        if kind == super::SourceKind::Files {
            return Err(Error::definite(
                "outbox.signal_table is read from a server: binlog files have no table to read it from, and no \
                 snapshots on demand or pause to ask for",
            ));
        }
        Ok(Some(table))
    }

    /// The record's shape, with the value format it is written in: payload encoding, additional
    /// placements; and the columns the decoders read (each placed column once).
    pub(super) fn validate(&mut self, value_format: ValueFormat) -> Result<Vec<Placement>> {
        let outbox = &*self;
        if outbox.payload_encoding == PayloadEncoding::Bytes && value_format != ValueFormat::Payload {
            return Err(Error::definite(
                "outbox.payload_encoding = \"bytes\" needs value_format = \"payload\": bytes (Avro, \
                 Protobuf…) cannot be embedded in a JSON envelope",
            ));
        }
        let mut placements = Vec::with_capacity(outbox.additional_placement.len());
        for entry in &outbox.additional_placement {
            let placement = Placement::parse(entry).map_err(Error::definite)?;
            if placement.target == PlacementTarget::Envelope && value_format != ValueFormat::Envelope {
                return Err(Error::definite(format!(
                    "outbox.additional_placement {entry:?} places a column in the envelope, and \
                     value_format = {:?} has none: place it as a header, or use value_format = \"envelope\"",
                    value_format
                )));
            }
            let clash = placements.iter().any(|p: &Placement| p.target == placement.target && p.name == placement.name);
            let reserved = match placement.target {
                PlacementTarget::Header => RESERVED_HEADERS.contains(&placement.name.as_str()),
                PlacementTarget::Envelope => RESERVED_ENVELOPE_FIELDS.contains(&placement.name.as_str()),
            };
            if clash || reserved {
                return Err(Error::definite(format!(
                    "outbox.additional_placement {entry:?}: the name `{}` is {}; give it another with \
                     \"column:{}:other_name\"",
                    placement.name,
                    if clash { "placed twice" } else { "one the connector writes itself" },
                    if placement.target == PlacementTarget::Header { "header" } else { "envelope" },
                )));
            }
            placements.push(placement);
        }
        // Each column once, though it may be placed twice (as a header and in the envelope). A role's own
        // column (`type` placed as the header `eventType`) is read as that role, and must then exist.
        let mut additional: Vec<String> = Vec::new();
        for placement in &placements {
            match self.columns.role_of(&placement.column) {
                Some(slot) => self.columns.set[slot] = true,
                None if additional.iter().any(|c| c.eq_ignore_ascii_case(&placement.column)) => {}
                None => additional.push(placement.column.clone()),
            }
        }
        self.columns = std::mem::take(&mut self.columns).reading(additional, self.payload_encoding);
        Ok(placements)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::MINIMAL;
    use crate::config::*;

    /// The optional roles may be absent from the table under their default names, never under a name set
    /// in `[outbox.columns]` (a typo must not drop a field silently); the required roles must always
    /// exist. Existing configs parse as before, unknown keys are still refused.
    #[test]
    fn column_names_know_which_were_set() {
        let c = Config::parse(MINIMAL).unwrap();
        let required: Vec<bool> = c.outbox.columns.required().iter().map(|(_, r)| *r).collect();
        assert_eq!(required, [true, true, true, false, false, true, false, false]);
        assert_eq!(c.outbox.columns, ColumnNames::default());

        let text = MINIMAL.replace(
            "table = \"shop.outbox_events\"",
            "table = \"shop.outbox_events\"\n[outbox.columns]\naggregate_type = \"aggregatetype\"\n\
             event_type = \"type\"\noccurred_at = \"event_type\"",
        );
        let columns = Config::parse(&text).unwrap().outbox.columns;
        let mapped: Vec<(&str, bool)> = columns.required().to_vec();
        assert_eq!(
            mapped,
            [
                ("id", true),
                ("aggregatetype", true),
                ("aggregate_id", true),
                ("type", true),
                ("schema_version", false),
                ("payload", true),
                ("headers", false),
                ("event_type", true),
            ]
        );
        assert_eq!(
            ColumnNames::default()
                .with("event_type", "type")
                .with("aggregate_type", "aggregatetype")
                .with("occurred_at", "event_type"),
            columns
        );

        let typo = MINIMAL.replace(
            "table = \"shop.outbox_events\"",
            "table = \"shop.outbox_events\"\n[outbox.columns]\noccured_at = \"t\"",
        );
        assert!(Config::parse(&typo).unwrap_err().to_string().contains("occured_at"));
    }
}
