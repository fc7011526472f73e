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
    pub schema_version: Option<u16>,
    /// Payload as JSON text.
    pub payload: String,
    /// `headers` column as JSON text, if present and not NULL.
    pub headers: Option<String>,
    /// `occurred_at` as ISO-8601 (`YYYY-MM-DDTHH:MM:SS[.ffffff]`, the column's own precision, no zone;
    /// TIMESTAMP columns in UTC); `None` when the table has no `occurred_at` column.
    pub occurred_at: Option<String>,
    /// Read by the initial snapshot rather than from the binlog.
    pub from_snapshot: bool,
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
