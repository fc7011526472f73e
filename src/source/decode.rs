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

use mysql_common::binlog::events::{OptionalMetaExtractor, RowsEventData, TableMapEvent};
use mysql_common::binlog::jsonb::{JsonContainer, JsonDom, JsonNumber, JsonScalar};
use mysql_common::binlog::value::BinlogValue;
use mysql_common::constants::ColumnType;
use mysql_common::value::Value;

use super::rows::{AfterImages, RowLayout, Slots};
use crate::config::{ColumnNames, TableName};
use crate::error::{Error, Result};

/// The outbox columns in slot order (see [`OutboxTable::decode`]).
const SLOT_NAMES: [&str; 8] =
    ["id", "aggregate_type", "aggregate_id", "event_type", "schema_version", "payload", "headers", "occurred_at"];

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
    /// Whether the table has a `headers` column.
    has_headers: bool,
    /// Where the needed columns are; slots in [`SLOT_NAMES`] order.
    layout: RowLayout,
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
        let headers = find(&columns.headers, false)?;
        // Slot order is SLOT_NAMES, the order `decode` reads them in; an absent `headers` never matches.
        let wanted = [
            need(&columns.id)?,
            need(&columns.aggregate_type)?,
            need(&columns.aggregate_id)?,
            need(&columns.event_type)?,
            need(&columns.schema_version)?,
            need(&columns.payload)?,
            headers.unwrap_or(usize::MAX),
            occurred_at,
        ];
        let layout = RowLayout::new(tme, &wanted)
            .map_err(|e| Error::definite(format!("cannot read the column layout of {name} from the binlog: {e}")))?;
        Ok(OutboxTable { has_headers: headers.is_some(), occurred_at_fsp, layout, name })
    }

    /// The after-images of an outbox rows event, as value slots for [`OutboxTable::decode`].
    pub fn after_images<'a>(&'a self, event: &'a RowsEventData<'a>) -> AfterImages<'a> {
        self.layout.after_images(event)
    }

    /// Decodes the after-image of an inserted row (its slots from [`OutboxTable::after_images`]).
    ///
    /// # Errors
    /// [`Undecodable`] naming the column when a value is NULL where it must not be, has an unexpected type,
    /// or is not valid UTF-8; it carries the row's values as far as they can be rendered, for the
    /// dead-letter topic.
    pub fn decode(&self, slots: Slots) -> std::result::Result<OutboxRow, Box<Undecodable>> {
        let mut values: Vec<(&'static str, Slot)> = SLOT_NAMES.iter().copied().zip(slots).collect();
        match self.convert(&mut values) {
            Ok(decoded) => Ok(decoded),
            Err(error) => {
                let image = values.iter().map(|(name, value)| (name.to_string(), render(value.as_ref()))).collect();
                let text_of = |name: &str| match values.iter().find(|(n, _)| *n == name) {
                    Some((_, Some(BinlogValue::Value(Value::Bytes(b))))) => {
                        std::str::from_utf8(b).ok().map(String::from)
                    }
                    _ => None,
                };
                Err(Box::new(Undecodable {
                    table: self.name.clone(),
                    id: text_of("id"),
                    aggregate_type: text_of("aggregate_type"),
                    aggregate_id: text_of("aggregate_id"),
                    image,
                    message: format!("outbox row in {}: {error}", self.name),
                }))
            }
        }
    }

    /// Converts the taken values. Every check that can fail runs before a value is moved out of its slot
    /// (only `headers` and `payload` are moved, last and after validation), so a failed row still renders
    /// whole.
    fn convert(&self, v: &mut [(&'static str, Slot)]) -> Result<OutboxRow> {
        // Everything that can fail runs before a short column moves out of its slot; payload and headers
        // move while being validated and are put back if a later step fails. A failed row therefore
        // still renders whole, and a good one is converted without copying its values.
        check_text(&v[0].1, "id")?;
        let fail = |v: &[(&'static str, Slot)], e: Error| e.context(format_args!("id={}", id_of(v)));
        check_text(&v[1].1, "aggregate_type").map_err(|e| fail(v, e))?;
        check_text(&v[2].1, "aggregate_id").map_err(|e| fail(v, e))?;
        check_text(&v[3].1, "event_type").map_err(|e| fail(v, e))?;
        let schema_version = small_uint(&v[4].1, "schema_version").map_err(|e| fail(v, e))?;
        let occurred_at = datetime(&v[7].1, self.occurred_at_fsp, "occurred_at").map_err(|e| fail(v, e))?;
        if matches!(v[5].1, Some(BinlogValue::Value(Value::NULL))) {
            return Err(fail(v, Error::definite("payload is NULL")));
        }
        let payload = json(&mut v[5].1, "payload").map_err(|e| fail(v, e))?.expect("NULL checked above");
        let headers = match self.has_headers {
            true => match json(&mut v[6].1, "headers") {
                Ok(headers) => headers,
                Err(e) => {
                    v[5].1 = Some(BinlogValue::Value(Value::Bytes(payload.into_bytes())));
                    return Err(fail(v, e));
                }
            },
            false => None,
        };
        let id = take_text(&mut v[0].1);
        let aggregate_type = take_text(&mut v[1].1);
        let aggregate_id = take_text(&mut v[2].1);
        let event_type = take_text(&mut v[3].1);
        Ok(OutboxRow {
            table: self.name.clone(),
            id,
            aggregate_type,
            aggregate_id,
            event_type,
            schema_version,
            payload,
            headers,
            occurred_at,
            from_snapshot: false,
        })
    }
}

/// An outbox row that could not be decoded: what is known of it, for the dead-letter topic.
#[derive(Debug, Clone, PartialEq)]
pub struct Undecodable {
    /// The outbox table.
    pub table: Arc<TableName>,
    /// The event id, if that column decoded.
    pub id: Option<String>,
    /// The aggregate type, if that column decoded.
    pub aggregate_type: Option<String>,
    /// The aggregate id, if that column decoded.
    pub aggregate_id: Option<String>,
    /// Every outbox column, rendered as JSON as far as possible (binary values as `{"hex": …}`).
    pub image: serde_json::Map<String, serde_json::Value>,
    /// What is wrong.
    pub message: String,
}

/// A binlog value as JSON, for a human reading the dead-letter topic.
fn render(value: Option<&BinlogValue<'_>>) -> serde_json::Value {
    use serde_json::Value as J;
    match value {
        None => J::String("<missing from the row image>".into()),
        Some(BinlogValue::Value(Value::NULL)) => J::Null,
        Some(BinlogValue::Value(Value::Bytes(b))) => match std::str::from_utf8(b) {
            Ok(s) => J::String(s.to_string()),
            Err(_) => serde_json::json!({ "hex": b.iter().map(|x| format!("{x:02x}")).collect::<String>() }),
        },
        Some(BinlogValue::Value(Value::Int(i))) => J::from(*i),
        Some(BinlogValue::Value(Value::UInt(u))) => J::from(*u),
        Some(other) => J::String(format!("{other:?}")),
    }
}

fn column_names(tme: &TableMapEvent<'_>) -> std::io::Result<Vec<String>> {
    let meta = OptionalMetaExtractor::new(tme.iter_optional_meta())?;
    meta.iter_column_name().map(|n| n.map(|n| n.name().into_owned())).collect()
}

/// A value slot of a row: converters look at it by reference and move the value out only on success, so
/// that a failed row can still be rendered whole.
type Slot = Option<BinlogValue<'static>>;

fn missing(column: &str) -> Error {
    Error::definite(format!("column {column} is missing from the row image (binlog_row_image must be FULL)"))
}

fn unexpected(column: &str, value: &BinlogValue<'_>) -> Error {
    Error::definite(format!("column {column} has an unexpected type: {value:?}"))
}

/// A short text column, copied (the slot keeps its value for rendering).
/// The event id of a row being converted, for error messages.
fn id_of(v: &[(&'static str, Slot)]) -> String {
    match &v[0].1 {
        Some(BinlogValue::Value(Value::Bytes(b))) => String::from_utf8_lossy(b).into_owned(),
        Some(other) => format!("{other:?}"),
        None => "?".to_string(),
    }
}

/// Checks a short text column without moving it (see [`OutboxTable::convert`]).
fn check_text(slot: &Slot, column: &str) -> Result<()> {
    match slot.as_ref().ok_or_else(|| missing(column))? {
        BinlogValue::Value(Value::Bytes(bytes)) => std::str::from_utf8(bytes)
            .map(|_| ())
            .map_err(|_| Error::definite(format!("column {column} is not valid UTF-8 (use a utf8mb4 column)"))),
        BinlogValue::Value(Value::Int(_) | Value::UInt(_)) => Ok(()),
        BinlogValue::Value(Value::NULL) => Err(Error::definite(format!("column {column} is NULL"))),
        other => Err(unexpected(column, other)),
    }
}

/// Moves a column that [`check_text`] accepted out of its slot.
fn take_text(slot: &mut Slot) -> String {
    match slot.take() {
        Some(BinlogValue::Value(Value::Bytes(bytes))) => String::from_utf8(bytes).expect("checked by check_text"),
        Some(BinlogValue::Value(Value::Int(i))) => i.to_string(),
        Some(BinlogValue::Value(Value::UInt(u))) => u.to_string(),
        _ => unreachable!("checked by check_text"),
    }
}

fn small_uint(slot: &Slot, column: &str) -> Result<u16> {
    let out_of_range =
        |v: &dyn std::fmt::Display| Error::definite(format!("column {column} = {v} is not in 0..=65535"));
    match slot.as_ref().ok_or_else(|| missing(column))? {
        BinlogValue::Value(Value::Int(i)) => u16::try_from(*i).map_err(|_| out_of_range(i)),
        BinlogValue::Value(Value::UInt(u)) => u16::try_from(*u).map_err(|_| out_of_range(u)),
        BinlogValue::Value(Value::NULL) => Err(Error::definite(format!("column {column} is NULL"))),
        other => Err(unexpected(column, other)),
    }
}

/// JSON text of a JSON column: MariaDB stores JSON as LONGTEXT, MySQL as binary JSON. Text is moved out of
/// the slot (payloads can be megabytes), but only once it is known to be valid.
fn json(slot: &mut Slot, column: &str) -> Result<Option<String>> {
    match slot.as_ref().ok_or_else(|| missing(column))? {
        BinlogValue::Value(Value::NULL) => Ok(None),
        // Moved out and validated once; on failure the bytes go back into the slot for the dead letter.
        BinlogValue::Value(Value::Bytes(_)) => match slot.take() {
            Some(BinlogValue::Value(Value::Bytes(bytes))) => match String::from_utf8(bytes) {
                Ok(text) => Ok(Some(text)),
                Err(e) => {
                    *slot = Some(BinlogValue::Value(Value::Bytes(e.into_bytes())));
                    Err(Error::definite(format!("column {column} is not valid UTF-8")))
                }
            },
            _ => unreachable!("matched above"),
        },
        BinlogValue::Jsonb(value) => {
            let dom = value
                .clone()
                .parse()
                .map_err(|e| Error::definite(format!("column {column}: cannot read binary JSON: {e}")))?;
            let mut out = String::new();
            json_text(&dom, &mut out);
            Ok(Some(out))
        }
        BinlogValue::JsonDiff(_) => Err(Error::definite(format!(
            "column {column} arrived as a partial JSON update; outbox rows must be inserted whole \
             (set binlog_row_value_options='')"
        ))),
        other => Err(unexpected(column, other)),
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

fn datetime(slot: &Slot, fsp: u8, column: &str) -> Result<String> {
    match slot.as_ref().ok_or_else(|| missing(column))? {
        BinlogValue::Value(Value::Date(y, mo, d, h, mi, s, us)) => {
            Ok(format_datetime(*y, *mo, *d, *h, *mi, *s, *us, fsp))
        }
        BinlogValue::Value(Value::NULL) => Err(Error::definite(format!("column {column} is NULL"))),
        other => Err(unexpected(column, other)),
    }
}

/// ISO-8601 without zone, with exactly `fsp` fractional digits (the column's declared precision).
#[allow(clippy::too_many_arguments)]
pub fn format_datetime(y: u16, mo: u8, d: u8, h: u8, mi: u8, s: u8, micros: u32, fsp: u8) -> String {
    let digits = usize::from(fsp.min(6));
    if y > 9999 || mo > 99 || d > 99 || h > 99 || mi > 99 || s > 99 || micros > 999_999 {
        // Out of MySQL's range: still say what the binlog holds.
        use std::fmt::Write;
        let mut out = format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}");
        if digits > 0 {
            let _ = write!(out, ".{:0width$}", micros / 10u32.pow(6 - digits as u32), width = digits);
        }
        return out;
    }
    // By hand: `write!` was a measurable share of the decoder (one timestamp per event).
    let mut text = *b"0000-00-00T00:00:00.000000";
    let mut put = |at: usize, mut value: u32, width: usize| {
        for i in (0..width).rev() {
            text[at + i] = b'0' + (value % 10) as u8;
            value /= 10;
        }
    };
    put(0, y.into(), 4);
    put(5, mo.into(), 2);
    put(8, d.into(), 2);
    put(11, h.into(), 2);
    put(14, mi.into(), 2);
    put(17, s.into(), 2);
    put(20, micros, 6);
    let len = if digits == 0 { 19 } else { 20 + digits };
    text[..len].iter().map(|&b| char::from(b)).collect()
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
        assert_eq!(format_datetime(2026, 1, 2, 3, 4, 5, 987_654, 1), "2026-01-02T03:04:05.9");
        assert_eq!(format_datetime(2026, 1, 2, 3, 4, 5, 987_654, 4), "2026-01-02T03:04:05.9876");
        assert_eq!(format_datetime(10000, 1, 2, 3, 4, 5, 7, 6), "10000-01-02T03:04:05.000007");
    }
}
