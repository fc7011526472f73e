//! The outbox row and the names around it: [`OutboxRow`] (one decoded row, what the router needs),
//! [`TableName`], the columns' roles ([`SLOT_NAMES`]) and [`quote_ident`], the one way an identifier is
//! quoted for SQL.
//!
//! Floor 0, the ground floor (docs/ARCHITECTURE.md): imports nothing of ours but other ground-floor modules.

use std::fmt;
use std::sync::Arc;

/// One outbox row, decoded: what the router needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxRow {
    /// The outbox table the row was inserted into.
    pub table: Arc<TableName>,
    /// Stable event id.
    pub id: String,
    /// Aggregate type (routes to a topic).
    pub aggregate_type: String,
    /// Aggregate id (the Kafka key).
    pub aggregate_id: String,
    /// Event type; `None` when the table has no `event_type` column (and then only then: a NULL in an
    /// existing column is undecodable).
    pub event_type: Option<String>,
    /// Payload schema version; `None` when the table has no `schema_version` column.
    pub schema_version: Option<SchemaVersion>,
    /// The payload, as `[outbox] payload_encoding` reads it.
    pub payload: Payload,
    /// `headers` column as JSON text, if present and not NULL.
    pub headers: Option<String>,
    /// `occurred_at` as ISO-8601 (`YYYY-MM-DDTHH:MM:SS[.ffffff]`, the column's own precision, no zone;
    /// TIMESTAMP columns in UTC); `None` when the table has no `occurred_at` column.
    pub occurred_at: Option<String>,
    /// Values of the `[outbox] additional_placement` columns, in that list's order.
    pub additional: Vec<ColumnValue>,
    /// Read by the initial snapshot rather than from the binlog.
    pub from_snapshot: bool,
    /// The snapshot on demand that read it (its `snapshot_id` header), when one did.
    pub snapshot_id: Option<std::sync::Arc<str>>,
}

/// The value of an additionally placed column (`[outbox] additional_placement`), as its type reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ColumnValue {
    /// SQL NULL: no header; `null` in the envelope.
    Null,
    /// Text, an ENUM's label, a UUID's or a date-time's text: a JSON string in the envelope.
    Text(String),
    /// An integer column: a JSON number in the envelope, its digits in a header.
    Integer(i128),
    /// A JSON column: embedded as JSON in the envelope, its text in a header.
    Json(String),
}

/// The `payload` column's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    /// `payload_encoding = "json"`: JSON text (the router validates it).
    Json(String),
    /// `payload_encoding = "bytes"`: the column's bytes, published unchanged and never parsed.
    Bytes(Vec<u8>),
    /// SQL NULL: a tombstone with `tombstone_on_empty_payload`, poison otherwise.
    Null,
}

impl Payload {
    /// The bytes the value holds (none for NULL).
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            Payload::Json(text) => text.as_bytes(),
            Payload::Bytes(bytes) => bytes,
            Payload::Null => &[],
        }
    }

    /// Bytes held, for memory accounting.
    pub fn len(&self) -> usize {
        self.as_bytes().len()
    }

    /// NULL, or no bytes: what `tombstone_on_empty_payload` turns into a tombstone.
    pub fn is_empty(&self) -> bool {
        self.as_bytes().is_empty()
    }
}

impl From<&str> for Payload {
    fn from(text: &str) -> Self {
        Payload::Json(text.to_string())
    }
}

impl From<String> for Payload {
    fn from(text: String) -> Self {
        Payload::Json(text)
    }
}

/// The `schema_version` column's value: an integer column's number, or a text column's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SchemaVersion {
    /// An integer column (any width, signed or not): a JSON number in the envelope.
    Integer(i128),
    /// A text column (`"2.1"`, `"v3"`): a JSON string in the envelope.
    Text(String),
}

impl From<u16> for SchemaVersion {
    fn from(n: u16) -> Self {
        SchemaVersion::Integer(n.into())
    }
}

impl serde::Serialize for SchemaVersion {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            SchemaVersion::Integer(n) => match i64::try_from(*n) {
                Ok(n) => s.serialize_i64(n),
                Err(_) => s.serialize_u64(u64::try_from(*n).map_err(serde::ser::Error::custom)?),
            },
            SchemaVersion::Text(text) => s.serialize_str(text),
        }
    }
}

/// A table as `database.table`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TableName {
    /// Database (schema) name.
    pub database: String,
    /// Table name.
    pub table: String,
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.database, self.table)
    }
}

impl TableName {
    /// `database.table`.
    ///
    /// # Errors
    /// What is wrong with `s`, for the operator.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.split_once('.') {
            Some((db, t)) if !db.is_empty() && !t.is_empty() && !t.contains('.') => {
                Ok(TableName { database: db.to_string(), table: t.to_string() })
            }
            _ => Err(format!("outbox table {s:?} must be written as \"database.table\"")),
        }
    }

    /// The name quoted for SQL: `` `database`.`table` ``.
    pub fn quoted(&self) -> String {
        format!("{}.{}", quote_ident(&self.database), quote_ident(&self.table))
    }
}

/// The outbox columns' roles in the order decoders hold their values (slots), named as in
/// `[outbox.columns]`. The first three and `payload` every table has; `event_type`, `schema_version`,
/// `headers` and `occurred_at` are optional (see `ColumnNames` in the config).
pub const SLOT_NAMES: [&str; 8] =
    ["id", "aggregate_type", "aggregate_id", "event_type", "schema_version", "payload", "headers", "occurred_at"];

/// `name` quoted as a MySQL identifier: in backquotes, a backquote inside doubled.
pub fn quote_ident(name: &str) -> String {
    format!("`{}`", name.replace('`', "``"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_quoted_with_backquotes_doubled() {
        assert_eq!(quote_ident("payload"), "`payload`");
        assert_eq!(quote_ident("we`ird"), "`we``ird`");
        let table = TableName::parse("shop.outbox`events").unwrap();
        assert_eq!(table.quoted(), "`shop`.`outbox``events`");
        assert!(TableName::parse("outbox_events").is_err());
        assert!(TableName::parse("a.b.c").is_err());
    }
}
