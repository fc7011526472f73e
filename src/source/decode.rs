//! Pure decoding: a TABLE_MAP event of an outbox table plus its row images become [`OutboxRow`]s.
//!
//! Column names come from the TABLE_MAP's optional metadata, which servers write only with
//! `binlog_row_metadata=FULL`. Without it a row is a list of anonymous values, and mapping them to names by
//! position would silently break the day someone adds or reorders a column: we refuse instead, with the fix
//! (the preflight check reports the same before streaming starts).
//!
//! Values are decoded exactly: strings must be valid UTF-8 (utf8mb4 columns), `DATETIME(n)` keeps its
//! `n` fractional digits and is never shifted by a time zone, MySQL's binary JSON is converted to JSON text
//! and MariaDB's JSON (a LONGTEXT) is taken verbatim and validated by the router.
//!
//! # Binary JSON text
//! MySQL's binary JSON is rendered the way MySQL itself prints it (what a `SELECT payload` and so the
//! snapshot return), not the way mysql_common's `serde_json` conversion does: that conversion refuses
//! *opaque* scalars (a DECIMAL, DATE, TIME or DATETIME stored inside JSON, e.g. by
//! `JSON_OBJECT('amount', price)`), and its structured form prints DECIMAL as a string. Here DECIMAL is a
//! JSON number with its exact digits (`9.00` stays `9.00`), dates and times are strings (`"2012-03-18"`,
//! `"87:31:46.654321"`, `"2012-03-18 11:30:45.000000"`), other opaque values `"base64:type<N>:<data>"`.
//! Object members come out sorted by key; JSON objects are unordered.

use std::sync::Arc;

use mysql_common::binlog::events::{OptionalMetaExtractor, TableMapEvent};
use mysql_common::binlog::jsonb::{JsonContainer, JsonDom, JsonNumber, JsonScalar};
use mysql_common::binlog::row::BinlogRow;
use mysql_common::binlog::value::BinlogValue;
use mysql_common::constants::ColumnType;
use mysql_common::value::Value;

use crate::config::{ColumnNames, TableName};
use crate::error::{Error, Result};

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
    /// Event type.
    pub event_type: String,
    /// Payload schema version.
    pub schema_version: u16,
    /// Payload as JSON text.
    pub payload: String,
    /// `headers` column as JSON text, if present and not NULL.
    pub headers: Option<String>,
    /// `occurred_at` as ISO-8601 (`YYYY-MM-DDTHH:MM:SS[.ffffff]`, the column's own precision, no zone).
    pub occurred_at: String,
    /// Read by the initial snapshot rather than from the binlog.
    pub from_snapshot: bool,
}

/// Where each needed column sits in the table, learned from a TABLE_MAP event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxTable {
    /// Table name.
    pub name: Arc<TableName>,
    id: usize,
    aggregate_type: usize,
    aggregate_id: usize,
    event_type: usize,
    schema_version: usize,
    payload: usize,
    headers: Option<usize>,
    occurred_at: usize,
    /// Fractional-second digits of `occurred_at` (DATETIME(n)).
    occurred_at_fsp: u8,
}

impl OutboxTable {
    /// Learns the column layout from a TABLE_MAP event.
    ///
    /// # Errors
    /// A definite error when the event carries no column names (`binlog_row_metadata` is not FULL) or a
    /// configured column is missing.
    pub fn from_table_map(name: Arc<TableName>, tme: &TableMapEvent<'_>, columns: &ColumnNames) -> Result<Self> {
        let names = column_names(tme)
            .map_err(|e| Error::definite(format!("cannot read column metadata of {name} from the binlog: {e}")))?;
        if names.is_empty() {
            return Err(Error::definite(format!(
                "the binlog's TABLE_MAP event for {name} carries no column names: the server runs with \
                 binlog_row_metadata other than FULL. Run `SET GLOBAL binlog_row_metadata = 'FULL'` and add \
                 binlog_row_metadata=FULL to the server's configuration (it affects only transactions \
                 written afterwards)"
            )));
        }
        let find = |column: &str, required: bool| -> Result<Option<usize>> {
            match names.iter().position(|n| n.eq_ignore_ascii_case(column)) {
                Some(i) => Ok(Some(i)),
                None if !required => Ok(None),
                None => Err(Error::definite(format!(
                    "outbox table {name} has no column `{column}` (columns in the binlog: {}); fix \
                     [outbox.columns] or the table",
                    names.join(", ")
                ))),
            }
        };
        let need = |column: &str| -> Result<usize> { Ok(find(column, true)?.expect("required")) };
        let occurred_at = need(&columns.occurred_at)?;
        let occurred_at_fsp = match tme.get_column_type(occurred_at) {
            Ok(Some(ColumnType::MYSQL_TYPE_DATETIME2)) | Ok(Some(ColumnType::MYSQL_TYPE_TIMESTAMP2)) => {
                tme.get_column_metadata(occurred_at).and_then(|m| m.first().copied()).unwrap_or(0)
            }
            _ => 0,
        };
        Ok(OutboxTable {
            id: need(&columns.id)?,
            aggregate_type: need(&columns.aggregate_type)?,
            aggregate_id: need(&columns.aggregate_id)?,
            event_type: need(&columns.event_type)?,
            schema_version: need(&columns.schema_version)?,
            payload: need(&columns.payload)?,
            headers: find(&columns.headers, false)?,
            occurred_at,
            occurred_at_fsp,
            name,
        })
    }

    /// Decodes the after-image of an inserted row.
    ///
    /// # Errors
    /// A definite error naming the column when a value has an unexpected type or is not valid UTF-8.
    pub fn decode_row(&self, mut row: BinlogRow) -> Result<OutboxRow> {
        let id = text(&mut row, self.id, "id")?;
        let fail = |e: Error| e.context(format_args!("outbox row id={id} in {}", self.name));
        Ok(OutboxRow {
            aggregate_type: text(&mut row, self.aggregate_type, "aggregate_type").map_err(fail)?,
            aggregate_id: text(&mut row, self.aggregate_id, "aggregate_id").map_err(fail)?,
            event_type: text(&mut row, self.event_type, "event_type").map_err(fail)?,
            schema_version: small_uint(&mut row, self.schema_version, "schema_version").map_err(fail)?,
            payload: json(&mut row, self.payload, "payload")
                .map_err(fail)?
                .ok_or_else(|| fail(Error::definite("payload is NULL")))?,
            headers: match self.headers {
                Some(i) => json(&mut row, i, "headers").map_err(fail)?,
                None => None,
            },
            occurred_at: datetime(&mut row, self.occurred_at, self.occurred_at_fsp, "occurred_at").map_err(fail)?,
            table: self.name.clone(),
            id,
            from_snapshot: false,
        })
    }
}

fn column_names(tme: &TableMapEvent<'_>) -> std::io::Result<Vec<String>> {
    let meta = OptionalMetaExtractor::new(tme.iter_optional_meta())?;
    meta.iter_column_name().map(|n| n.map(|n| n.name().into_owned())).collect()
}

fn take<'r>(row: &'r mut BinlogRow, index: usize, column: &str) -> Result<BinlogValue<'r>> {
    row.take(index).ok_or_else(|| {
        Error::definite(format!("column {column} is missing from the row image (binlog_row_image must be FULL)"))
    })
}

fn text(row: &mut BinlogRow, index: usize, column: &str) -> Result<String> {
    match take(row, index, column)? {
        BinlogValue::Value(Value::Bytes(bytes)) => String::from_utf8(bytes)
            .map_err(|_| Error::definite(format!("column {column} is not valid UTF-8 (use a utf8mb4 column)"))),
        BinlogValue::Value(Value::Int(i)) => Ok(i.to_string()),
        BinlogValue::Value(Value::UInt(u)) => Ok(u.to_string()),
        BinlogValue::Value(Value::NULL) => Err(Error::definite(format!("column {column} is NULL"))),
        other => Err(Error::definite(format!("column {column} has an unexpected type: {other:?}"))),
    }
}

fn small_uint(row: &mut BinlogRow, index: usize, column: &str) -> Result<u16> {
    let out_of_range =
        |v: &dyn std::fmt::Display| Error::definite(format!("column {column} = {v} is not in 0..=65535"));
    match take(row, index, column)? {
        BinlogValue::Value(Value::Int(i)) => u16::try_from(i).map_err(|_| out_of_range(&i)),
        BinlogValue::Value(Value::UInt(u)) => u16::try_from(u).map_err(|_| out_of_range(&u)),
        BinlogValue::Value(Value::NULL) => Err(Error::definite(format!("column {column} is NULL"))),
        other => Err(Error::definite(format!("column {column} has an unexpected type: {other:?}"))),
    }
}

/// JSON text of a JSON column: MariaDB stores JSON as LONGTEXT, MySQL as binary JSON.
fn json(row: &mut BinlogRow, index: usize, column: &str) -> Result<Option<String>> {
    match take(row, index, column)? {
        BinlogValue::Value(Value::NULL) => Ok(None),
        BinlogValue::Value(Value::Bytes(bytes)) => String::from_utf8(bytes)
            .map(Some)
            .map_err(|_| Error::definite(format!("column {column} is not valid UTF-8"))),
        BinlogValue::Jsonb(value) => {
            let dom =
                value.parse().map_err(|e| Error::definite(format!("column {column}: cannot read binary JSON: {e}")))?;
            let mut out = String::new();
            json_text(&dom, &mut out);
            Ok(Some(out))
        }
        BinlogValue::JsonDiff(_) => Err(Error::definite(format!(
            "column {column} arrived as a partial JSON update; outbox rows must be inserted whole \
             (set binlog_row_value_options='')"
        ))),
        other => Err(Error::definite(format!("column {column} has an unexpected type: {other:?}"))),
    }
}

/// MySQL binary JSON as JSON text (see the module documentation).
pub fn json_text(dom: &JsonDom, out: &mut String) {
    let string = |s: &str, out: &mut String| out.push_str(&serde_json::Value::from(s).to_string());
    match dom {
        JsonDom::Container(JsonContainer::Array(items)) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                json_text(item, out);
            }
            out.push(']');
        }
        JsonDom::Container(JsonContainer::Object(members)) => {
            out.push('{');
            for (i, (key, value)) in members.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                string(key, out);
                out.push(':');
                json_text(value, out);
            }
            out.push('}');
        }
        JsonDom::Scalar(JsonScalar::Number(JsonNumber::Decimal(d))) => out.push_str(&d.to_string()),
        // Everything else (strings, dates, opaque values, other numbers) converts without loss.
        JsonDom::Scalar(scalar) => out.push_str(&serde_json::Value::from(scalar.clone()).to_string()),
    }
}

fn datetime(row: &mut BinlogRow, index: usize, fsp: u8, column: &str) -> Result<String> {
    match take(row, index, column)? {
        BinlogValue::Value(Value::Date(y, mo, d, h, mi, s, us)) => Ok(format_datetime(y, mo, d, h, mi, s, us, fsp)),
        BinlogValue::Value(Value::NULL) => Err(Error::definite(format!("column {column} is NULL"))),
        other => Err(Error::definite(format!("column {column} has an unexpected type: {other:?}"))),
    }
}

/// ISO-8601 without zone, with exactly `fsp` fractional digits (the column's declared precision).
#[allow(clippy::too_many_arguments)]
pub fn format_datetime(y: u16, mo: u8, d: u8, h: u8, mi: u8, s: u8, micros: u32, fsp: u8) -> String {
    let base = format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}");
    match fsp.min(6) {
        0 => base,
        n => {
            let frac = format!("{micros:06}");
            format!("{base}.{}", &frac[..n as usize])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datetime_keeps_declared_precision() {
        assert_eq!(format_datetime(2026, 1, 2, 3, 4, 5, 6, 6), "2026-01-02T03:04:05.000006");
        assert_eq!(format_datetime(2026, 12, 31, 23, 59, 59, 999_999, 6), "2026-12-31T23:59:59.999999");
        assert_eq!(format_datetime(2026, 1, 2, 3, 4, 5, 120_000, 3), "2026-01-02T03:04:05.120");
        assert_eq!(format_datetime(2026, 1, 2, 3, 4, 5, 0, 0), "2026-01-02T03:04:05");
        assert_eq!(format_datetime(1, 1, 1, 0, 0, 0, 0, 6), "0001-01-01T00:00:00.000000");
    }
}
