//! Pure decoding: a TABLE_MAP event of an outbox table plus its row images become [`OutboxRow`]s.
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2 (vocabulary, error, metrics, config).
//!
//! Column names come from the TABLE_MAP's optional metadata, which servers write only with
//! `binlog_row_metadata=FULL`. Without it a row is a list of anonymous values, and mapping them to names by
//! position would silently break the day someone adds or reorders a column: we refuse instead, with the fix
//! (the preflight check reports the same before streaming starts).
//!
//! Values are decoded exactly: text in a legacy character set becomes UTF-8 ([`super::charset`]; binary
//! strings and UTF-8 columns must be valid UTF-8), `DATETIME(n)` keeps its
//! `n` fractional digits and is never shifted by a time zone, MySQL's binary JSON is converted to JSON text
//! and MariaDB's JSON (a LONGTEXT) is taken verbatim and validated by the router.
//!
//! # Types the binlog gives differently than SQL
//! The snapshot reads the same rows with `SELECT`, and an event must not depend on which of the two read
//! it. Four kinds of value arrive in the binlog as something other than what a `SELECT` prints:
//! - Text in a character set other than UTF-8 (latin1, gbk, big5, …) arrives as the column's own bytes;
//!   it is decoded with the character set of the TABLE_MAP's optional metadata (`COLUMN_CHARSET` /
//!   `DEFAULT_CHARSET`) to the UTF-8 the snapshot's utf8mb4 session receives. ENUM and SET labels
//!   likewise, with `ENUM_AND_SET_*_CHARSET`.
//! - `TIMESTAMP(n)` arrives as seconds since the epoch; it is written as UTC, with `n` digits. The
//!   snapshot's session runs with `time_zone = '+00:00'`, so it prints the same text.
//! - `ENUM` arrives as the 1-based index of its label, `SET` as a bitmask; both are written as their
//!   labels (a SET's comma-separated in definition order), taken from the TABLE_MAP's `ENUM_STR_VALUE` /
//!   `SET_STR_VALUE` metadata (`binlog_row_metadata=FULL`).
//!
//! Every other type an outbox column may have ([`TypeFamily`], by column: [`column_type_problem`])
//! arrives as the `SELECT` prints it. Preflight refuses a mapped column of any other type, with the fix;
//! if one appears in the binlog anyway (an `ALTER TABLE` while running), every row of that table map is
//! undecodable with the same message (dead-lettered or stopping, by `outbox.on_poison`): never a row
//! of guesses.
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

use super::charset::Charset;
use super::column_types::{bytes_payload_problem, column_type_problem, uuid_text, TypeFamily};
use super::rows::{AfterImages, RowLayout, Slots};
use crate::config::{ColumnNames, PayloadEncoding};
use crate::error::{Error, Result};
use crate::outbox::{ColumnValue, OutboxRow, Payload, SchemaVersion, TableName, SLOT_NAMES};

/// Where each needed column sits in the table, learned from a TABLE_MAP event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxTable {
    /// Table name.
    pub name: Arc<TableName>,
    /// Which roles the table has a column for, in [`SLOT_NAMES`] order (optional ones may be absent).
    present: [bool; 8],
    /// Where the needed columns are; slots in [`SLOT_NAMES`] order, then the additional columns.
    layout: RowLayout,
    /// How each slot's value is read, in the layout's slot order.
    kinds: Vec<ColumnKind>,
    /// Fractional-second digits of each slot's column (DATETIME(n) or TIMESTAMP(n); 0 for others).
    fsp: Vec<u8>,
    /// Names of the slots: the roles', then the additional columns' (for messages and dead letters).
    slot_names: Vec<String>,
    /// `[outbox] payload_encoding`.
    payload_encoding: PayloadEncoding,
}

/// Slots of the optional roles (`event_type`, `schema_version`, `headers`, `occurred_at`).
const OPTIONAL_SLOTS: [usize; 4] = [3, 4, 6, 7];

/// How the decoder reads one outbox column, beyond what its value says by itself.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ColumnKind {
    /// As it arrives: text, an integer, JSON, a DATETIME.
    Plain,
    /// ENUM: an index into these labels (1-based; 0 is the empty string MySQL stores for an invalid value).
    Enum(Vec<String>),
    /// SET: a bitmask over these labels.
    Set(Vec<String>),
    /// TIMESTAMP: seconds since the epoch, written as UTC.
    Timestamp,
    /// BINARY(16): a UUID, written as its canonical text ([`uuid_text`]).
    Uuid,
    /// Text in a character set other than UTF-8: its bytes, decoded to the text a `SELECT` returns.
    Decoded(Charset),
    /// A type the decoder does not read: every row of the table is undecodable, with this reason and fix.
    Refused(String),
}

impl OutboxTable {
    /// Learns the column layout from a TABLE_MAP event.
    ///
    /// # Errors
    /// A definite error when the event carries no column names (`binlog_row_metadata` is not FULL) or a
    /// configured column is missing.
    pub fn from_table_map(name: Arc<TableName>, tme: &TableMapEvent<'_>, columns: &ColumnNames) -> Result<Self> {
        let facts = ColumnFacts::of(tme)
            .map_err(|e| Error::definite(format!("cannot read column metadata of {name} from the binlog: {e}")))?;
        let names = &facts.names;
        if names.is_empty() {
            return Err(Error::definite(format!(
                "the binlog's TABLE_MAP event for {name} carries no column names: the server runs with \
                 binlog_row_metadata other than FULL. Run `SET GLOBAL binlog_row_metadata = 'FULL'` and add \
                 binlog_row_metadata=FULL to the server's configuration (it affects only transactions \
                 written afterwards)"
            )));
        }
        // Each role's column index; `usize::MAX` for an optional role the table does not have (it then
        // matches no column of the layout). The additional columns follow, each required.
        let mut wanted = vec![usize::MAX; 8 + columns.additional().len()];
        let required = columns.required().into_iter().map(|(column, required)| (column, required, None));
        let additional = columns.additional().iter().map(|c| (c.as_str(), true, Some("outbox.additional_placement")));
        for (slot, (column, required, listed_in)) in required.chain(additional).enumerate() {
            match names.iter().position(|n| n.eq_ignore_ascii_case(column)) {
                Some(i) => wanted[slot] = i,
                None if !required => {}
                None => {
                    return Err(Error::definite(format!(
                        "outbox table {name} has no column `{column}` ({role}{set}; columns in the binlog: {}); \
                         fix {fix} or the table",
                        names.join(", "),
                        role = SLOT_NAMES.get(slot).copied().unwrap_or("listed in outbox.additional_placement"),
                        set = if OPTIONAL_SLOTS.contains(&slot) { ", named in [outbox.columns]" } else { "" },
                        fix = listed_in.unwrap_or("[outbox.columns]"),
                    )))
                }
            }
        }
        let present = std::array::from_fn(|slot| wanted[slot] != usize::MAX);
        let fsp = (wanted.iter())
            .map(|&column| match tme.get_column_type(column) {
                Ok(Some(ColumnType::MYSQL_TYPE_DATETIME2)) | Ok(Some(ColumnType::MYSQL_TYPE_TIMESTAMP2)) => {
                    tme.get_column_metadata(column).and_then(|m| m.first().copied()).unwrap_or(0)
                }
                _ => 0,
            })
            .collect();
        let payload_encoding = columns.payload_encoding();
        let mut kinds = Vec::with_capacity(wanted.len());
        for (slot, &column) in wanted.iter().enumerate() {
            if column == usize::MAX {
                kinds.push(ColumnKind::Plain);
                continue;
            }
            let (shown, family) = facts.family(tme, column);
            let problem = match SLOT_NAMES.get(slot) {
                Some(&"payload") if payload_encoding == PayloadEncoding::Bytes => {
                    bytes_payload_problem(&name, &names[column], &shown, &family)
                }
                Some(role) => column_type_problem(&name, role, &names[column], &shown, family.clone()),
                // An additional column of any type the connector reads.
                None => None,
            };
            let kind = match (problem, family) {
                (None, Ok(family)) => facts.read_as(family, column),
                (Some(problem), _) | (None, Err(problem)) => Err(problem),
            };
            // Not a definite error here: the binlog holds these rows whatever the table becomes later, so
            // each is undecodable (dead-lettered or stopping, by outbox.on_poison) rather than a guess.
            kinds.push(kind.unwrap_or_else(ColumnKind::Refused));
        }
        let layout = RowLayout::new(tme, &wanted)
            .map_err(|e| Error::definite(format!("cannot read the column layout of {name} from the binlog: {e}")))?;
        let slot_names = SLOT_NAMES.iter().map(|n| n.to_string()).chain(columns.additional().iter().cloned()).collect();
        Ok(OutboxTable { present, fsp, layout, kinds, slot_names, payload_encoding, name })
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
        let mut values: Vec<(&str, Slot)> = self.slot_names.iter().map(String::as_str).zip(slots).collect();
        match self.convert(&mut values) {
            Ok(decoded) => Ok(decoded),
            Err(error) => {
                let present = self.present.iter().copied().chain(std::iter::repeat(true));
                let image = (values.iter().zip(present))
                    .filter(|(_, present)| *present)
                    .map(|((name, value), _)| (name.to_string(), render(value.as_ref())))
                    .collect();
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
    fn convert(&self, v: &mut [(&str, Slot)]) -> Result<OutboxRow> {
        // Everything that can fail runs before a short column moves out of its slot; payload and headers
        // move while being validated and are put back if a later step fails. A failed row therefore
        // still renders whole, and a good one is converted without copying its values.
        let fail = |v: &[(&str, Slot)], e: Error| e.context(format_args!("id={}", id_of(v)));
        if let Some(problem) = self.kinds.iter().find_map(|k| match k {
            ColumnKind::Refused(problem) => Some(problem),
            _ => None,
        }) {
            return Err(fail(v, Error::definite(problem.clone())));
        }
        // Text in a legacy character set becomes the UTF-8 a `SELECT` returns, in place, before anything
        // reads it: every column, the payload and headers too (a text column's bytes are its text).
        for slot in 0..self.kinds.len() {
            let ColumnKind::Decoded(charset) = &self.kinds[slot] else { continue };
            let (name, value) = &mut v[slot];
            if let Err(e) = decode_text(value, charset, name) {
                return Err(if slot == 0 { e } else { fail(v, e) });
            }
        }
        // ENUM and SET values become their labels, BINARY(16) UUIDs their text, in place, so that a failed
        // row shows them so too: the short roles, then the additional columns.
        for slot in (0..4).chain(8..self.kinds.len()) {
            let kind = &self.kinds[slot];
            let (name, value) = &mut v[slot];
            let converted = match kind {
                ColumnKind::Enum(_) | ColumnKind::Set(_) => label(value, kind, name),
                ColumnKind::Uuid => uuid(value, name),
                _ => continue,
            };
            if let Err(e) = converted {
                return Err(if slot == 0 { e } else { fail(v, e) });
            }
        }
        check_text(&v[0].1, "id")?;
        check_text(&v[1].1, "aggregate_type").map_err(|e| fail(v, e))?;
        check_text(&v[2].1, "aggregate_id").map_err(|e| fail(v, e))?;
        if self.present[3] {
            check_text(&v[3].1, "event_type").map_err(|e| fail(v, e))?;
        }
        let schema_version = match self.present[4] {
            true => Some(schema_version(&v[4].1).map_err(|e| fail(v, e))?),
            false => None,
        };
        let occurred_at = match (self.present[7], &self.kinds[7]) {
            (false, _) => None,
            (true, ColumnKind::Timestamp) => Some(timestamp(&v[7].1, self.fsp[7], "occurred_at")),
            (true, _) => Some(datetime(&v[7].1, self.fsp[7], "occurred_at")),
        }
        .transpose()
        .map_err(|e| fail(v, e))?;
        let additional = (8..v.len())
            .map(|slot| additional_value(&v[slot].1, &self.kinds[slot], self.fsp[slot], v[slot].0))
            .collect::<Result<Vec<_>>>()
            .map_err(|e| fail(v, e))?;
        let payload = match self.payload_encoding {
            PayloadEncoding::Json => match json(&mut v[5].1, "payload").map_err(|e| fail(v, e))? {
                Some(text) => Payload::Json(text),
                None => Payload::Null,
            },
            PayloadEncoding::Bytes => bytes(&mut v[5].1, "payload").map_err(|e| fail(v, e))?,
        };
        let headers = match self.present[6] {
            true => match json(&mut v[6].1, "headers") {
                Ok(headers) => headers,
                Err(e) => {
                    v[5].1 = Some(BinlogValue::Value(match payload {
                        Payload::Json(text) => Value::Bytes(text.into_bytes()),
                        Payload::Bytes(bytes) => Value::Bytes(bytes),
                        Payload::Null => Value::NULL,
                    }));
                    return Err(fail(v, e));
                }
            },
            false => None,
        };
        let id = take_text(&mut v[0].1);
        let aggregate_type = take_text(&mut v[1].1);
        let aggregate_id = take_text(&mut v[2].1);
        let event_type = self.present[3].then(|| take_text(&mut v[3].1));
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
            additional,
            from_snapshot: false,
            snapshot_id: None,
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

/// What the TABLE_MAP's optional metadata says about each column, by column index.
struct ColumnFacts {
    /// Column names (empty without `binlog_row_metadata=FULL`).
    names: Vec<String>,
    /// Collation id of each character column, when the metadata carries charsets.
    collations: Vec<Option<u16>>,
    /// Labels of each ENUM column.
    enum_labels: Vec<Option<Vec<String>>>,
    /// Labels of each SET column.
    set_labels: Vec<Option<Vec<String>>>,
}

impl ColumnFacts {
    fn of(tme: &TableMapEvent<'_>) -> std::io::Result<Self> {
        use mysql_common::binlog::events::OptionalMetadataField as F;
        let count = tme.columns_count() as usize;
        let types: Vec<Option<ColumnType>> = (0..count).map(|i| tme.get_column_type(i).ok().flatten()).collect();
        let meta = OptionalMetaExtractor::new(tme.iter_optional_meta())?;
        let names = meta.iter_column_name().map(|n| n.map(|n| n.name().into_owned())).collect::<Result<_, _>>()?;
        // NOTE: charsets are listed per character column, labels per ENUM (or SET) column, in column order.
        let mut charsets = meta.iter_charset();
        let mut collations = vec![None; count];
        for (i, ty) in types.iter().enumerate() {
            if ty.is_some_and(|t| t.is_character_type()) {
                collations[i] = charsets.next().transpose()?;
            }
        }
        // Labels are in their column's character set, listed per ENUM or SET column, in column order.
        let mut label_charsets = vec![None; count];
        let mut enum_and_set = meta.iter_enum_and_set_charset();
        for (i, ty) in types.iter().enumerate() {
            if ty.is_some_and(|t| t.is_enum_or_set_type()) {
                label_charsets[i] = enum_and_set.next().transpose()?;
            }
        }
        let invalid = |why: String| std::io::Error::new(std::io::ErrorKind::InvalidData, why);
        let label_text = |i: usize, raw: &[u8]| {
            let charset = label_charsets[i].map(Charset::by_collation).transpose().map_err(invalid)?;
            (charset.unwrap_or(Charset::Utf8).decode(raw))
                .map(std::borrow::Cow::into_owned)
                .map_err(|why| invalid(format!("an ENUM/SET label of column {i}: {why}")))
        };
        let (mut enum_labels, mut set_labels) = (vec![None; count], vec![None; count]);
        for field in tme.iter_optional_meta() {
            match field? {
                F::EnumStrValue(values) => {
                    let columns = types.iter().enumerate().filter(|(_, t)| **t == Some(ColumnType::MYSQL_TYPE_ENUM));
                    for ((i, _), labels) in columns.zip(values.iter_values()) {
                        let labels = labels?;
                        let labels = labels.values().iter().map(|l| label_text(i, l.value_raw()));
                        enum_labels[i] = Some(labels.collect::<std::io::Result<_>>()?);
                    }
                }
                F::SetStrValue(values) => {
                    let columns = types.iter().enumerate().filter(|(_, t)| **t == Some(ColumnType::MYSQL_TYPE_SET));
                    for ((i, _), labels) in columns.zip(values.iter_values()) {
                        let labels = labels?;
                        let labels = labels.values().iter().map(|l| label_text(i, l.value_raw()));
                        set_labels[i] = Some(labels.collect::<std::io::Result<_>>()?);
                    }
                }
                _ => {}
            }
        }
        Ok(ColumnFacts { names, collations, enum_labels, set_labels })
    }

    /// The binlog type of column `i` (for messages) and its family.
    fn family(&self, tme: &TableMapEvent<'_>, i: usize) -> (String, std::result::Result<TypeFamily, String>) {
        match tme.get_column_type(i) {
            Ok(Some(ty)) => {
                let shown = format!("binlog type {}", format!("{ty:?}").trim_start_matches("MYSQL_TYPE_"));
                let meta = tme.get_column_metadata(i).unwrap_or(&[]);
                (shown, TypeFamily::of_binlog(ty, meta, self.collations[i]))
            }
            Ok(None) => ("no type".into(), Err("the TABLE_MAP does not describe it".into())),
            Err(e) => ("an unknown binlog type".into(), Err(e.to_string())),
        }
    }

    /// How to read column `i` of `family`; `Err` when the TABLE_MAP lacks what that takes.
    fn read_as(&self, family: TypeFamily, i: usize) -> std::result::Result<ColumnKind, String> {
        let no_labels = |what: &str| {
            format!(
                "the TABLE_MAP does not carry the labels of {what} column {} (binlog_row_metadata must be \
                 FULL: without them {what} values arrive as numbers)",
                self.names[i]
            )
        };
        Ok(match family {
            TypeFamily::Enum => ColumnKind::Enum(self.enum_labels[i].clone().ok_or_else(|| no_labels("ENUM"))?),
            TypeFamily::Set => ColumnKind::Set(self.set_labels[i].clone().ok_or_else(|| no_labels("SET"))?),
            TypeFamily::Timestamp => ColumnKind::Timestamp,
            TypeFamily::Uuid => ColumnKind::Uuid,
            TypeFamily::Text => match self.collations[i].map(Charset::by_collation).transpose()? {
                Some(charset) if !charset.is_utf8() => ColumnKind::Decoded(charset),
                _ => ColumnKind::Plain,
            },
            _ => ColumnKind::Plain,
        })
    }
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
fn id_of(v: &[(&str, Slot)]) -> String {
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

/// A text column's bytes in a legacy character set, replaced by their UTF-8 in place. The slot keeps the
/// original bytes when they are not well-formed, for the dead letter.
fn decode_text(slot: &mut Slot, charset: &Charset, column: &str) -> Result<()> {
    if let Some(BinlogValue::Value(Value::Bytes(bytes))) = slot {
        let text = charset.decode(bytes).map_err(|why| {
            Error::definite(format!("column {column} is in character set {}, and {why}", charset.name()))
        })?;
        if let std::borrow::Cow::Owned(text) = text {
            *bytes = text.into_bytes();
        }
    }
    Ok(())
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

/// `schema_version`: an integer column's number (any width, signed or not), or a text column's text.
fn schema_version(slot: &Slot) -> Result<SchemaVersion> {
    const COLUMN: &str = "schema_version";
    match slot.as_ref().ok_or_else(|| missing(COLUMN))? {
        BinlogValue::Value(Value::Int(i)) => Ok(SchemaVersion::Integer((*i).into())),
        BinlogValue::Value(Value::UInt(u)) => Ok(SchemaVersion::Integer((*u).into())),
        BinlogValue::Value(Value::Bytes(bytes)) => match std::str::from_utf8(bytes) {
            Ok(text) => Ok(SchemaVersion::Text(text.to_string())),
            Err(_) => Err(Error::definite(format!("column {COLUMN} is not valid UTF-8 (use a utf8mb4 column)"))),
        },
        BinlogValue::Value(Value::NULL) => Err(Error::definite(format!("column {COLUMN} is NULL"))),
        other => Err(unexpected(COLUMN, other)),
    }
}

/// A `payload_encoding = "bytes"` payload: the column's bytes, moved out of the slot, never parsed.
fn bytes(slot: &mut Slot, column: &str) -> Result<Payload> {
    match slot.as_ref().ok_or_else(|| missing(column))? {
        BinlogValue::Value(Value::NULL) => Ok(Payload::Null),
        BinlogValue::Value(Value::Bytes(_)) => match slot.take() {
            Some(BinlogValue::Value(Value::Bytes(bytes))) => Ok(Payload::Bytes(bytes)),
            _ => unreachable!("matched above"),
        },
        other => Err(unexpected(column, other)),
    }
}

/// The value of an additional column (ENUM/SET labels and UUIDs already converted to text in place).
fn additional_value(slot: &Slot, kind: &ColumnKind, fsp: u8, column: &str) -> Result<ColumnValue> {
    if *kind == ColumnKind::Timestamp {
        return match slot {
            Some(BinlogValue::Value(Value::NULL)) => Ok(ColumnValue::Null),
            _ => Ok(ColumnValue::Text(timestamp(slot, fsp, column)?)),
        };
    }
    Ok(match slot.as_ref().ok_or_else(|| missing(column))? {
        BinlogValue::Value(Value::NULL) => ColumnValue::Null,
        BinlogValue::Value(Value::Int(i)) => ColumnValue::Integer((*i).into()),
        BinlogValue::Value(Value::UInt(u)) => ColumnValue::Integer((*u).into()),
        BinlogValue::Value(Value::Date(..)) => ColumnValue::Text(datetime(slot, fsp, column)?),
        BinlogValue::Value(Value::Bytes(bytes)) => match std::str::from_utf8(bytes) {
            Ok(text) => ColumnValue::Text(text.to_string()),
            Err(_) => {
                return Err(Error::definite(format!("column {column} is not valid UTF-8 (use a utf8mb4 column)")))
            }
        },
        BinlogValue::Jsonb(_) => ColumnValue::Json(json(&mut slot.clone(), column)?.unwrap_or_default()),
        other => return Err(unexpected(column, other)),
    })
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

/// A TIMESTAMP column's value: seconds since the epoch, `sec` or `sec.micros` (TIMESTAMP2, MySQL 5.6+
/// and MariaDB 10.1+) or a plain integer (the pre-5.6 format).
fn timestamp(slot: &Slot, fsp: u8, column: &str) -> Result<String> {
    let bad = |text: &[u8]| {
        Error::definite(format!(
            "column {column}: TIMESTAMP value {:?} is not seconds since the epoch",
            text.escape_ascii().to_string()
        ))
    };
    let (secs, micros) = match slot.as_ref().ok_or_else(|| missing(column))? {
        BinlogValue::Value(Value::Bytes(text)) => {
            let s = std::str::from_utf8(text).map_err(|_| bad(text))?;
            // mysql_common writes the microseconds with six digits, and only when they are not zero.
            let (secs, fraction) = s.split_once('.').unwrap_or((s, "000000"));
            match (secs.parse::<u64>(), fraction.parse::<u32>()) {
                (Ok(secs), Ok(micros)) if fraction.len() == 6 => (secs, micros),
                _ => return Err(bad(text)),
            }
        }
        BinlogValue::Value(Value::Int(secs)) => {
            (u64::try_from(*secs).map_err(|_| bad(secs.to_string().as_bytes()))?, 0)
        }
        BinlogValue::Value(Value::NULL) => return Err(Error::definite(format!("column {column} is NULL"))),
        other => return Err(unexpected(column, other)),
    };
    Ok(format_timestamp(secs, micros, fsp))
}

/// A TIMESTAMP as UTC text, like [`format_datetime`]; 0 is MySQL's zero timestamp (`0000-00-00 00:00:00`,
/// what a `SELECT` returns for it: the epoch itself is outside TIMESTAMP's range).
pub fn format_timestamp(secs: u64, micros: u32, fsp: u8) -> String {
    if secs == 0 {
        return format_datetime(0, 0, 0, 0, 0, 0, micros, fsp);
    }
    let (days, second_of_day) = (secs / 86_400, (secs % 86_400) as u32);
    let (y, mo, d) = civil_from_days(days);
    let (h, mi, s) = (second_of_day / 3600, second_of_day / 60 % 60, second_of_day % 60);
    format_datetime(y, mo, d, h as u8, mi as u8, s as u8, micros, fsp)
}

/// The proleptic Gregorian date `days` after 1970-01-01 (Howard Hinnant's `civil_from_days`, for
/// non-negative days).
fn civil_from_days(days: u64) -> (u16, u8, u8) {
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z % 146_097;
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153; // March = 0
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 { shifted_month + 3 } else { shifted_month - 9 };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year as u16, month as u8, day as u8)
}

/// Replaces an ENUM index or a SET bitmask by its text, in place. A NULL is left for the caller.
fn label(slot: &mut Slot, kind: &ColumnKind, column: &str) -> Result<()> {
    let beyond = |what: &str, n: usize, labels: &[String]| {
        Error::definite(format!("column {column}: {what} {n} is beyond its {} labels", labels.len()))
    };
    let text = match (kind, slot.as_ref().ok_or_else(|| missing(column))?) {
        // 0 is the empty string MySQL stores for an invalid value in non-strict mode, as a SELECT shows it.
        (ColumnKind::Enum(_), BinlogValue::Value(Value::Int(0))) => String::new(),
        (ColumnKind::Enum(labels), BinlogValue::Value(Value::Int(index))) => {
            let n = usize::try_from(*index).unwrap_or(usize::MAX);
            labels.get(n.wrapping_sub(1)).cloned().ok_or_else(|| beyond("ENUM index", n, labels))?
        }
        (ColumnKind::Set(labels), BinlogValue::Value(Value::Bytes(mask))) => {
            // A little-endian bitmask; bit n is label n.
            let mut text = String::new();
            for n in (0..mask.len() * 8).filter(|n| mask[n / 8] & (1 << (n % 8)) != 0) {
                let label = labels.get(n).ok_or_else(|| beyond("SET bit", n, labels))?;
                if !text.is_empty() {
                    text.push(',');
                }
                text.push_str(label);
            }
            text
        }
        (_, BinlogValue::Value(Value::NULL)) => return Ok(()),
        (_, other) => return Err(unexpected(column, other)),
    };
    *slot = Some(BinlogValue::Value(Value::Bytes(text.into_bytes())));
    Ok(())
}

/// Replaces a BINARY(16) value by its UUID text ([`uuid_text`]), in place. A NULL is left for the caller.
fn uuid(slot: &mut Slot, column: &str) -> Result<()> {
    let text = match slot.as_ref().ok_or_else(|| missing(column))? {
        BinlogValue::Value(Value::Bytes(bytes)) => {
            uuid_text(bytes).map_err(|e| Error::definite(format!("column {column}: {e}")))?
        }
        BinlogValue::Value(Value::NULL) => return Ok(()),
        other => return Err(unexpected(column, other)),
    };
    *slot = Some(BinlogValue::Value(Value::Bytes(text.into_bytes())));
    Ok(())
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

    fn slot(value: Value) -> Slot {
        Some(BinlogValue::Value(value))
    }

    /// Regression: TIMESTAMP(n) arrives as seconds since the epoch (`sec[.micros]` text, or an integer in
    /// the pre-5.6 format) and made every streamed row poison ("unexpected type"). Written as UTC, with
    /// the column's digits, as a `SELECT` in a `+00:00` session prints it.
    #[test]
    fn timestamp_is_utc_with_declared_precision() {
        let bytes = |s: &str| slot(Value::Bytes(s.as_bytes().to_vec()));
        let cases: &[(Slot, u8, &str)] = &[
            (bytes("1"), 0, "1970-01-01T00:00:01"),
            (bytes("1700000000"), 0, "2023-11-14T22:13:20"),
            (bytes("1700000000.123456"), 6, "2023-11-14T22:13:20.123456"),
            (bytes("1700000000.120000"), 3, "2023-11-14T22:13:20.120"),
            (bytes("1700000000"), 6, "2023-11-14T22:13:20.000000"),
            (bytes("951782400"), 0, "2000-02-29T00:00:00"),
            (bytes("1709208000.000001"), 6, "2024-02-29T12:00:00.000001"),
            (bytes("951868799"), 0, "2000-02-29T23:59:59"),
            (bytes("2147483647"), 0, "2038-01-19T03:14:07"),
            (bytes("4294967295.999999"), 6, "2106-02-07T06:28:15.999999"),
            (bytes("1772368496.789012"), 6, "2026-03-01T12:34:56.789012"),
            // MySQL's zero timestamp; the epoch itself is outside TIMESTAMP's range.
            (bytes("0"), 0, "0000-00-00T00:00:00"),
            (bytes("0"), 6, "0000-00-00T00:00:00.000000"),
            // The pre-5.6 format (MYSQL_TYPE_TIMESTAMP): an integer, no fraction.
            (slot(Value::Int(1_700_000_000)), 0, "2023-11-14T22:13:20"),
        ];
        for (value, fsp, expected) in cases {
            assert_eq!(timestamp(value, *fsp, "occurred_at").unwrap(), *expected, "{value:?} fsp {fsp}");
        }
        let errors: &[(Slot, &str)] = &[
            (slot(Value::NULL), "occurred_at is NULL"),
            (bytes("12ab"), "not seconds since the epoch"),
            (bytes("1.1234567"), "not seconds since the epoch"),
            (bytes("1.5"), "not seconds since the epoch"),
            (slot(Value::Int(-1)), "not seconds since the epoch"),
            (slot(Value::Date(2026, 1, 2, 3, 4, 5, 0)), "unexpected type"),
            (None, "missing from the row image"),
        ];
        for (value, message) in errors {
            let err = timestamp(value, 6, "occurred_at").unwrap_err().to_string();
            assert!(err.contains(message), "{value:?}: {err}");
        }
    }

    /// On a real binlog (MySQL 8.0.28, `binlog_row_metadata=FULL`, `t(f1 CHAR(128), f2 VARCHAR(300),
    /// f3 ENUM('var1','variant2','foo'), f4 SET('one','two','three','four'), f5 TEXT)`): the labels come
    /// from the TABLE_MAP, the character columns are text, and the rows' ENUM/SET values become the labels
    /// the fixture's upstream asserts as indexes (insert: 1 and 0b101; update: 2 and 0b1010).
    #[test]
    fn enum_and_set_labels_from_a_real_table_map() {
        use mysql_common::binlog::consts::BinlogVersion;
        use mysql_common::binlog::events::EventData;
        use mysql_common::binlog::BinlogFile;

        let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../shared/fixtures/binlog/blackbeam-rust_mysql_common/mysql-enum-string-set.000001");
        let file = std::io::BufReader::new(std::fs::File::open(&path).expect("fixture"));
        let mut tme = None;
        let mut decoded = Vec::new();
        for event in BinlogFile::new(BinlogVersion::Version4, file).unwrap() {
            match event.unwrap().read_data().unwrap() {
                Some(EventData::TableMapEvent(t)) => tme = Some(t.into_owned()),
                Some(EventData::RowsEvent(rows)) => {
                    let tme = tme.as_ref().unwrap();
                    let facts = ColumnFacts::of(tme).unwrap();
                    assert_eq!(facts.names, ["f1", "f2", "f3", "f4", "f5"]);
                    let kinds: Vec<(TypeFamily, ColumnKind)> = (0..5)
                        .map(|i| {
                            let family = facts.family(tme, i).1.unwrap();
                            (family, facts.read_as(family, i).unwrap())
                        })
                        .collect();
                    let labels = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
                    assert_eq!(
                        kinds,
                        [
                            (TypeFamily::Text, ColumnKind::Plain),
                            (TypeFamily::Text, ColumnKind::Plain),
                            (TypeFamily::Enum, ColumnKind::Enum(labels(&["var1", "variant2", "foo"]))),
                            (TypeFamily::Set, ColumnKind::Set(labels(&["one", "two", "three", "four"]))),
                            (TypeFamily::Text, ColumnKind::Plain),
                        ]
                    );
                    if matches!(rows, RowsEventData::DeleteRowsEvent(_)) {
                        continue;
                    }
                    let layout = RowLayout::new(tme, &[2, 3]).unwrap();
                    for image in layout.after_images(&rows) {
                        let mut slots = image.unwrap();
                        label(&mut slots[0], &kinds[2].1, "f3").unwrap();
                        label(&mut slots[1], &kinds[3].1, "f4").unwrap();
                        decoded.push(slots);
                    }
                }
                _ => {}
            }
        }
        let text = |s: &str| slot(Value::Bytes(s.as_bytes().to_vec()));
        assert_eq!(decoded, [vec![text("var1"), text("one,three")], vec![text("variant2"), text("two,four")]]);
    }

    /// Every day from 1970 to 2200 converts like the inverse it must be (days since the epoch → date →
    /// days), and consecutive days are consecutive dates.
    #[test]
    fn civil_from_days_walks_the_calendar() {
        let days_in = |y: u16, m: u8| match m {
            2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
            2 => 28,
            4 | 6 | 9 | 11 => 30,
            _ => 31,
        };
        let mut expected = (1970u16, 1u8, 1u8);
        for days in 0..84_000u64 {
            assert_eq!(civil_from_days(days), expected, "day {days}");
            let (y, m, d) = expected;
            expected = if d < days_in(y, m) {
                (y, m, d + 1)
            } else if m < 12 {
                (y, m + 1, 1)
            } else {
                (y + 1, 1, 1)
            };
        }
    }

    /// Regression: ENUM arrives as the label's index and SET as a bitmask; with
    /// `aggregate_type ENUM('order','payment')` the stream routed to `outbox.event.1` while the snapshot
    /// routed to `outbox.event.order`. Both become their labels, as a `SELECT` prints them.
    #[test]
    fn enum_and_set_become_their_labels() {
        let labels = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let enum_kind = ColumnKind::Enum(labels(&["order", "payment"]));
        let set_kind = ColumnKind::Set(labels(&["a", "b", "c", "d", "e", "f", "g", "h", "i"]));
        let cases: &[(&ColumnKind, Value, &str)] = &[
            (&enum_kind, Value::Int(1), "order"),
            (&enum_kind, Value::Int(2), "payment"),
            // 0: the empty string stored for an invalid value in non-strict mode.
            (&enum_kind, Value::Int(0), ""),
            (&set_kind, Value::Bytes(vec![0b0000_0101, 0]), "a,c"),
            (&set_kind, Value::Bytes(vec![0b1000_0000, 0b1]), "h,i"),
            (&set_kind, Value::Bytes(vec![0, 0]), ""),
            (&set_kind, Value::Bytes(vec![0b1]), "a"),
        ];
        for (kind, value, expected) in cases {
            let mut value_slot = slot(value.clone());
            label(&mut value_slot, kind, "aggregate_type").unwrap();
            assert_eq!(value_slot, slot(Value::Bytes(expected.as_bytes().to_vec())), "{kind:?} {value:?}");
        }
        let errors: &[(&ColumnKind, Value, &str)] = &[
            (&enum_kind, Value::Int(3), "ENUM index 3 is beyond its 2 labels"),
            (&set_kind, Value::Bytes(vec![0, 0b10]), "SET bit 9 is beyond its 9 labels"),
            (&enum_kind, Value::Bytes(b"order".to_vec()), "unexpected type"),
            (&set_kind, Value::Int(1), "unexpected type"),
        ];
        for (kind, value, message) in errors {
            let err = label(&mut slot(value.clone()), kind, "aggregate_type").unwrap_err().to_string();
            assert!(err.contains(message), "{kind:?} {value:?}: {err}");
        }
        // NULL is left for the NULL check that follows.
        let mut null = slot(Value::NULL);
        label(&mut null, &enum_kind, "aggregate_type").unwrap();
        assert_eq!(null, slot(Value::NULL));
    }

    /// The stream's side of [`super::super::column_types::expectations`]: BINARY(16) ids become their UUID
    /// text whether the binlog kept their trailing zero bytes or not; integers their digits; texts (empty,
    /// 4-byte UTF-8) arrive unchanged; a NULL is left for the NULL check.
    #[test]
    fn ids_and_texts_as_the_expectations_say() {
        use crate::source::column_types::expectations::{BINARY16, INTEGERS, TEXTS};
        for (bytes, expected) in BINARY16 {
            let zeros = bytes.iter().rev().take_while(|b| **b == 0).count();
            for image in [&bytes[..], &bytes[..16 - zeros]] {
                let mut value = slot(Value::Bytes(image.to_vec()));
                uuid(&mut value, "id").unwrap();
                check_text(&value, "id").unwrap();
                assert_eq!(take_text(&mut value), *expected, "{image:02x?}");
            }
        }
        for (n, expected) in INTEGERS {
            let mut value = match i64::try_from(*n) {
                Ok(i) => slot(Value::Int(i)),
                Err(_) => slot(Value::UInt(u64::try_from(*n).unwrap())),
            };
            check_text(&value, "aggregate_id").unwrap();
            assert_eq!(take_text(&mut value), *expected);
        }
        for text in TEXTS {
            let mut value = slot(Value::Bytes(text.as_bytes().to_vec()));
            check_text(&value, "aggregate_id").unwrap();
            assert_eq!(take_text(&mut value), *text);
        }
        let mut null = slot(Value::NULL);
        uuid(&mut null, "id").unwrap();
        assert!(check_text(&null, "id").unwrap_err().to_string().contains("id is NULL"));
        let err = uuid(&mut slot(Value::Bytes(vec![1; 17])), "id").unwrap_err().to_string();
        assert!(err.contains("17 bytes"), "{err}");
        let err = check_text(&slot(Value::Bytes(vec![0xf0, 0x9f])), "aggregate_id").unwrap_err().to_string();
        assert!(err.contains("not valid UTF-8"), "{err}");
    }

    /// `payload_encoding = "bytes"`: any bytes move out unchanged (0x00, 0xFF, invalid UTF-8, empty); NULL
    /// is [`Payload::Null`] for the router to judge; a JSON payload's NULL likewise.
    #[test]
    fn bytes_payloads_move_unchanged_and_null_is_null() {
        for bytes in [vec![0x00, 0xff, 0xc3, 0x28], Vec::new(), "订单 🚀".as_bytes().to_vec()] {
            let mut value = slot(Value::Bytes(bytes.clone()));
            assert_eq!(super::bytes(&mut value, "payload").unwrap(), Payload::Bytes(bytes));
            assert_eq!(value, None, "moved, not copied");
        }
        assert_eq!(super::bytes(&mut slot(Value::NULL), "payload").unwrap(), Payload::Null);
        assert!(super::bytes(&mut None, "payload").unwrap_err().to_string().contains("missing from the row image"));
        assert_eq!(json(&mut slot(Value::NULL), "payload").unwrap(), None);
    }

    /// `schema_version` from any integer column (signed or not, any width) or text; NULL and invalid UTF-8
    /// are errors naming the column.
    #[test]
    fn schema_versions_of_integers_and_text() {
        assert_eq!(schema_version(&slot(Value::Int(-3))).unwrap(), SchemaVersion::Integer(-3));
        assert_eq!(schema_version(&slot(Value::UInt(u64::MAX))).unwrap(), SchemaVersion::Integer(u64::MAX.into()));
        assert_eq!(schema_version(&slot(Value::Int(70_000))).unwrap(), SchemaVersion::Integer(70_000));
        let text = schema_version(&slot(Value::Bytes(b"v2.1".to_vec()))).unwrap();
        assert_eq!(text, SchemaVersion::Text("v2.1".into()));
        assert_eq!(schema_version(&slot(Value::Bytes(Vec::new()))).unwrap(), SchemaVersion::Text(String::new()));
        assert!(schema_version(&slot(Value::NULL)).unwrap_err().to_string().contains("schema_version is NULL"));
        let err = schema_version(&slot(Value::Bytes(vec![0xff]))).unwrap_err().to_string();
        assert!(err.contains("not valid UTF-8"), "{err}");
    }

    /// Additional columns: text, integers, date-times with their precision, TIMESTAMPs as UTC, NULL.
    #[test]
    fn additional_values_read_as_their_types() {
        let plain = ColumnKind::Plain;
        let cases = [
            (
                slot(Value::Bytes("acme \u{1F680}".as_bytes().to_vec())),
                &plain,
                0,
                ColumnValue::Text("acme \u{1F680}".into()),
            ),
            (slot(Value::Int(-42)), &plain, 0, ColumnValue::Integer(-42)),
            (slot(Value::UInt(u64::MAX)), &plain, 0, ColumnValue::Integer(u64::MAX.into())),
            (slot(Value::NULL), &plain, 0, ColumnValue::Null),
            (
                slot(Value::Date(2026, 3, 29, 1, 0, 0, 1)),
                &plain,
                6,
                ColumnValue::Text("2026-03-29T01:00:00.000001".into()),
            ),
            (
                slot(Value::Bytes(b"1.500000".to_vec())),
                &ColumnKind::Timestamp,
                3,
                ColumnValue::Text("1970-01-01T00:00:01.500".into()),
            ),
            (slot(Value::NULL), &ColumnKind::Timestamp, 6, ColumnValue::Null),
        ];
        for (value, kind, fsp, expected) in cases {
            assert_eq!(additional_value(&value, kind, fsp, "c").unwrap(), expected, "{value:?}");
        }
        let err = additional_value(&slot(Value::Bytes(vec![0xff])), &plain, 0, "tenant").unwrap_err().to_string();
        assert!(err.contains("column tenant is not valid UTF-8"), "{err}");
    }

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
