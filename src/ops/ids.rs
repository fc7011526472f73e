//! Ids as the connector publishes them, turned back into their columns' own values: the one place the
//! operator commands compare an outbox column with an id an operator typed or a record carried.
//!
//! Floor 6, the top (docs/ARCHITECTURE.md): may import anything below; nothing imports it but `ops`.
//!
//! A BINARY(16) id is published as UUID text and an integer id in decimal
//! ([`crate::source::column_types::rendering`]); `replay --aggregate-id`, prune's held aggregates, release's
//! dead-letter lookups and audit's id lookups all start from that text. Compared with the column as text,
//! a BINARY(16) value never matches (its 16 bytes are not its 36 characters of text), and an integer column
//! converts the text to a number however it can (`o-1` is 0, and matches aggregate 0). So the text is
//! parsed for the column's type ([`ColumnValue::parse`]) and compared as that type: the UUID's bytes, the
//! integer itself, or text in the column's collation. A text that cannot be a value of the column is an error for the
//! caller to report (an operator's typo), or proof that no row of the table holds it (a record's id).

use std::fmt::Write as _;

use mysql_async::{Conn, Value};

use crate::error::{Error, Result};
use crate::outbox::{quote_ident, TableName};
use crate::source::column_types::TypeFamily;

/// An outbox column that holds ids (or aggregate types), with what is needed to compare it with published
/// text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdColumn {
    /// The column's name.
    pub name: String,
    /// Its type family; `None` for a type the connector does not read (compared as text).
    pub family: Option<TypeFamily>,
    /// Its `COLUMN_TYPE` as the server prints it (`binary(16)`, `bigint(20) unsigned`), for messages.
    pub sql_type: String,
}

impl IdColumn {
    /// Reads the type of column `name` of `table` from `information_schema`; `None` when the table has no
    /// such column.
    ///
    /// # Errors
    /// Classified query errors.
    pub async fn load(conn: &mut Conn, table: &TableName, name: &str) -> Result<Option<IdColumn>> {
        let found = crate::source::snapshot::column_types_of(conn, table).await?;
        Ok(found.into_iter().find(|c| c.0.eq_ignore_ascii_case(name)).map(|(name, data_type, column_type, charset)| {
            IdColumn {
                family: TypeFamily::of_sql(&data_type, &column_type, charset.as_deref()).ok(),
                name,
                sql_type: column_type,
            }
        }))
    }

    /// Like [`IdColumn::load`], for a column the table must have.
    ///
    /// # Errors
    /// A definite error when the table has no such column; classified query errors.
    pub async fn require(conn: &mut Conn, table: &TableName, name: &str) -> Result<IdColumn> {
        Self::load(conn, table, name).await?.ok_or_else(|| {
            Error::definite(format!("outbox table {table} has no column `{name}`; fix [outbox.columns] or the table"))
        })
    }

    /// `text`, as published, as a value of this column.
    ///
    /// # Errors
    /// Why `text` cannot be a value of this column ([`ColumnValue::parse`]).
    pub fn value(&self, text: &str) -> std::result::Result<ColumnValue, String> {
        ColumnValue::parse(self.family, text)
    }

    /// `text` given with the command-line flag `flag` (`--aggregate-id`), as a value of this column of
    /// `table`.
    ///
    /// # Errors
    /// A definite error naming the flag, the column and its type, and how its values are written.
    pub fn flag_value(&self, flag: &str, text: &str, table: &TableName) -> Result<ColumnValue> {
        self.value(text).map_err(|why| {
            Error::definite(format!(
                "{flag} {text:?}: column `{}` of {table} is {}, so its values are written as {}, and {why}",
                self.name,
                self.sql_type,
                written_as(self.family)
            ))
        })
    }

    /// `column = value` in SQL with `value` as a literal (for conditions that travel as text).
    pub fn equals_literal(&self, value: &ColumnValue) -> String {
        format!("{} = {}", quote_ident(&self.name), value.sql_literal())
    }
}

/// How the connector writes a value of `family` (the form an operator types).
fn written_as(family: Option<TypeFamily>) -> &'static str {
    match family {
        Some(TypeFamily::Uuid) => "canonical UUID text (8-4-4-4-12 hex digits)",
        Some(TypeFamily::Integer) => "decimal digits",
        _ => "their text",
    }
}

/// A value of an id column, parsed from the text the connector publishes for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ColumnValue {
    /// A text, ENUM or SET column's value: compared as text in the column's collation.
    Text(String),
    /// An integer column's value (any of TINYINT … BIGINT UNSIGNED).
    Integer(i128),
    /// A BINARY(16) column's value: the UUID's 16 bytes.
    Uuid([u8; 16]),
}

/// The smallest and largest value of any integer column (BIGINT, BIGINT UNSIGNED).
const INTEGER_RANGE: std::ops::RangeInclusive<i128> = (i64::MIN as i128)..=(u64::MAX as i128);

impl ColumnValue {
    /// Parses `text` as the connector publishes a value of `family`: a UUID as 32 hex digits in groups
    /// 8-4-4-4-12 (either case), an integer as decimal digits with an optional sign, anything else as it is.
    ///
    /// # Errors
    /// Why `text` is not such a value.
    pub fn parse(family: Option<TypeFamily>, text: &str) -> std::result::Result<Self, String> {
        match family {
            Some(TypeFamily::Uuid) => parse_uuid(text).map(ColumnValue::Uuid).ok_or_else(|| {
                "that is not one (a UUID is 32 hex digits in groups of 8-4-4-4-12, e.g. \
                 0f8fad5b-d9cb-469f-a165-70867728950e)"
                    .to_string()
            }),
            Some(TypeFamily::Integer) => {
                let digits = text.strip_prefix(['-', '+']).unwrap_or(text);
                if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                    return Err("that is not an integer".into());
                }
                match text.parse::<i128>() {
                    Ok(n) if INTEGER_RANGE.contains(&n) => Ok(ColumnValue::Integer(n)),
                    _ => Err(format!(
                        "that is outside the range of any integer column ({} to {})",
                        INTEGER_RANGE.start(),
                        INTEGER_RANGE.end()
                    )),
                }
            }
            _ => Ok(ColumnValue::Text(text.to_string())),
        }
    }

    /// The value as an SQL literal of its column's type that cannot break out of the SQL: a UUID as
    /// `X'…'` (binary), an integer as its digits, text as `_utf8mb4 X'…'` (the introducer makes it text
    /// that takes the column's collation).
    pub fn sql_literal(&self) -> String {
        match self {
            ColumnValue::Text(text) => format!("_utf8mb4 {}", hex_literal(text.as_bytes())),
            ColumnValue::Integer(n) => n.to_string(),
            ColumnValue::Uuid(bytes) => hex_literal(bytes),
        }
    }

    /// The value as a statement parameter of its column's type.
    pub fn param(&self) -> Value {
        match self {
            ColumnValue::Text(text) => Value::from(text.as_str()),
            ColumnValue::Integer(n) => match i64::try_from(*n) {
                Ok(n) => Value::Int(n),
                Err(_) => Value::UInt(u64::try_from(*n).expect("parse keeps integers in BIGINT UNSIGNED's range")),
            },
            ColumnValue::Uuid(bytes) => Value::Bytes(bytes.to_vec()),
        }
    }
}

/// `X'…'` for `bytes`.
fn hex_literal(bytes: &[u8]) -> String {
    let mut hex = String::with_capacity(bytes.len() * 2 + 3);
    hex.push_str("X'");
    for b in bytes {
        let _ = write!(hex, "{b:02X}");
    }
    hex.push('\'');
    hex
}

/// The 16 bytes of a UUID written 8-4-4-4-12 (the form [`crate::source::column_types::uuid_text`] writes,
/// in either case).
fn parse_uuid(text: &str) -> Option<[u8; 16]> {
    let bytes = text.as_bytes();
    if bytes.len() != 36 {
        return None;
    }
    let mut out = [0u8; 16];
    let mut digits = bytes.iter().enumerate().filter(|(i, _)| !matches!(i, 8 | 13 | 18 | 23)).map(|(_, b)| *b);
    if [8, 13, 18, 23].iter().any(|&i| bytes[i] != b'-') {
        return None;
    }
    for byte in &mut out {
        let (high, low) = (digits.next()?, digits.next()?);
        *byte = u8::try_from((char::from(high).to_digit(16)? << 4) | char::from(low).to_digit(16)?).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::column_types::uuid_text;

    #[test]
    fn uuids_parse_back_to_the_bytes_they_were_published_from() {
        let bytes = [0x00, 0xff, 0x00, 0x01, 0, 0, 0x40, 0, 0x80, 0, 0, 0, 0, 0, 0, 0];
        let text = uuid_text(&bytes).unwrap();
        assert_eq!(ColumnValue::parse(Some(TypeFamily::Uuid), &text), Ok(ColumnValue::Uuid(bytes)));
        assert_eq!(
            ColumnValue::parse(Some(TypeFamily::Uuid), &text.to_uppercase()),
            Ok(ColumnValue::Uuid(bytes)),
            "upper case is the same UUID"
        );
        assert_eq!(ColumnValue::Uuid(bytes).sql_literal(), "X'00FF0001000040008000000000000000'");
        assert_eq!(ColumnValue::Uuid(bytes).param(), Value::Bytes(bytes.to_vec()));
    }

    #[test]
    fn malformed_uuids_are_refused() {
        for text in [
            "",
            "not-a-uuid",
            "00ff0001000040008000000000000000",          // no dashes
            "00ff0001-0000-4000-8000-00000000000",       // a digit short
            "00ff0001-0000-4000-8000-0000000000000",     // a digit long
            "00ff000-10000-4000-8000-000000000000",      // dash misplaced
            "00ff0001-0000-4000-8000-00000000000g",      // not hex
            "00ff0001-0000-4000-8000-00000000000\u{e9}", // not ASCII, 36 bytes
        ] {
            let parsed = ColumnValue::parse(Some(TypeFamily::Uuid), text);
            assert!(parsed.as_ref().is_err_and(|e| e.contains("8-4-4-4-12")), "{text:?}: {parsed:?}");
        }
    }

    #[test]
    fn integers_parse_in_the_range_of_any_integer_column() {
        let int = |t: &str| ColumnValue::parse(Some(TypeFamily::Integer), t);
        assert_eq!(int("20"), Ok(ColumnValue::Integer(20)));
        assert_eq!(int("-7"), Ok(ColumnValue::Integer(-7)));
        assert_eq!(int("18446744073709551615"), Ok(ColumnValue::Integer(u64::MAX.into())));
        assert_eq!(int("-9223372036854775808"), Ok(ColumnValue::Integer(i64::MIN.into())));
        for bad in ["", "-", "1.5", "1e3", " 1", "0x10", "abc", "--1"] {
            assert!(int(bad).is_err_and(|e| e.contains("not an integer")), "{bad:?}");
        }
        for big in ["18446744073709551616", "-9223372036854775809", "99999999999999999999999999999999999999999"] {
            assert!(int(big).is_err_and(|e| e.contains("outside the range")), "{big:?}");
        }
        assert_eq!(ColumnValue::Integer(-7).sql_literal(), "-7");
        assert_eq!(ColumnValue::Integer(-7).param(), Value::Int(-7));
        assert_eq!(ColumnValue::Integer(u64::MAX.into()).param(), Value::UInt(u64::MAX));
        // 2^53 + 1: a DOUBLE comparison would not tell it from 2^53.
        assert_eq!(ColumnValue::Integer(9_007_199_254_740_993).param(), Value::Int(9_007_199_254_740_993));
    }

    #[test]
    fn text_is_taken_as_it_is_and_written_as_hex_text() {
        for family in [None, Some(TypeFamily::Text), Some(TypeFamily::Enum), Some(TypeFamily::Set)] {
            assert_eq!(ColumnValue::parse(family, "a'b"), Ok(ColumnValue::Text("a'b".into())));
        }
        assert_eq!(ColumnValue::Text(String::new()).sql_literal(), "_utf8mb4 X''");
        assert_eq!(ColumnValue::Text("a'b".into()).sql_literal(), "_utf8mb4 X'612762'");
        assert_eq!(ColumnValue::Text("é".into()).sql_literal(), "_utf8mb4 X'C3A9'");
    }

    #[test]
    fn a_flag_value_that_cannot_be_in_the_column_names_the_flag_and_the_type() {
        let column =
            IdColumn { name: "aggregateid".into(), family: Some(TypeFamily::Integer), sql_type: "bigint(20)".into() };
        let table = TableName { database: "shop".into(), table: "outbox".into() };
        let err = column.flag_value("--aggregate-id", "o-1", &table).unwrap_err();
        assert_eq!(err.exit_code(), crate::error::EXIT_DEFINITE);
        let text = err.to_string();
        for part in ["--aggregate-id \"o-1\"", "`aggregateid`", "shop.outbox", "bigint(20)", "decimal digits"] {
            assert!(text.contains(part), "{part}: {text}");
        }
        assert_eq!(column.flag_value("--aggregate-id", "42", &table).unwrap(), ColumnValue::Integer(42));
        assert_eq!(column.equals_literal(&ColumnValue::Integer(42)), "`aggregateid` = 42");
    }
}
