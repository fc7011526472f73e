//! The SQL types an outbox column may have: exactly those the binlog stream and the snapshot's `SELECT`
//! read alike, each for the columns it makes sense for. One table ([`ACCEPTED`]) serves preflight, which
//! classifies `information_schema.COLUMNS` ([`TypeFamily::of_sql`]), and the stream, which classifies each
//! TABLE_MAP ([`TypeFamily::of_binlog`]); `tests::sql_and_binlog_types_agree` keeps the two
//! classifications the same. How the binlog's different representations are read is in
//! [`super::decode`].
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2 (vocabulary, error, metrics, config).

use mysql_common::constants::ColumnType;

use crate::outbox::{TableName, SLOT_NAMES};

/// The SQL types an outbox column can have that the stream and the snapshot read alike. Preflight
/// ([`column_type_problem`] over `information_schema`) and the stream (over each TABLE_MAP) accept exactly
/// these, each for the columns [`accepted_families`] names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TypeFamily {
    /// CHAR, VARCHAR and the TEXT types in a UTF-8 character set (MariaDB's JSON is a LONGTEXT), and
    /// VARBINARY and the BLOB types: text, whose bytes must be UTF-8 (a row whose are not is undecodable).
    Text,
    /// TINYINT … BIGINT, signed or not: decimal digits.
    Integer,
    /// ENUM: the binlog carries the label's 1-based index; its text comes from the TABLE_MAP's labels.
    Enum,
    /// SET: the binlog carries a bitmask; its text is the labels of the set bits, comma-separated in
    /// definition order (as a `SELECT` prints it).
    Set,
    /// MySQL's binary JSON.
    Json,
    /// DATETIME(n): a wall-clock time without zone, written as it is.
    Datetime,
    /// TIMESTAMP(n): the binlog carries seconds since the epoch; written as UTC (the snapshot reads it in
    /// a session whose `time_zone` is `+00:00`, see [`super::SourceConn`]).
    Timestamp,
}

impl TypeFamily {
    /// The family of a column as `information_schema.COLUMNS` shows it: `DATA_TYPE` and
    /// `CHARACTER_SET_NAME`. `Err` says why the type is not read.
    ///
    /// # Errors
    /// A column type the decoder does not read, with the reason.
    pub fn of_sql(data_type: &str, charset: Option<&str>) -> std::result::Result<Self, String> {
        let family = match data_type.to_ascii_lowercase().as_str() {
            "char" | "varchar" | "tinytext" | "text" | "mediumtext" | "longtext" => {
                let charset = charset.unwrap_or("binary");
                let utf8 = ["utf8mb4", "utf8mb3", "utf8", "ascii"].iter().any(|c| charset.eq_ignore_ascii_case(c));
                if !utf8 {
                    return Err(format!(
                        "character set {charset}: the binlog carries its bytes, which the connector reads as UTF-8"
                    ));
                }
                TypeFamily::Text
            }
            "varbinary" | "tinyblob" | "blob" | "mediumblob" | "longblob" => TypeFamily::Text,
            "binary" => return Err(FIXED_BINARY.into()),
            "tinyint" | "smallint" | "mediumint" | "int" | "integer" | "bigint" => TypeFamily::Integer,
            "enum" => TypeFamily::Enum,
            "set" => TypeFamily::Set,
            "json" => TypeFamily::Json,
            "datetime" => TypeFamily::Datetime,
            "timestamp" => TypeFamily::Timestamp,
            other => return Err(format!("type {other} is not read by the connector")),
        };
        Ok(family)
    }

    /// The family of a column as a TABLE_MAP describes it: its real type and, for character columns, its
    /// collation id when the optional metadata carries one.
    pub(super) fn of_binlog(ty: ColumnType, collation: Option<u16>) -> std::result::Result<Self, String> {
        use ColumnType as T;
        let family = match ty {
            T::MYSQL_TYPE_STRING if collation == Some(BINARY_COLLATION) => return Err(FIXED_BINARY.into()),
            T::MYSQL_TYPE_STRING | T::MYSQL_TYPE_VARCHAR | T::MYSQL_TYPE_VAR_STRING | T::MYSQL_TYPE_BLOB => {
                TypeFamily::Text
            }
            T::MYSQL_TYPE_TINY
            | T::MYSQL_TYPE_SHORT
            | T::MYSQL_TYPE_INT24
            | T::MYSQL_TYPE_LONG
            | T::MYSQL_TYPE_LONGLONG => TypeFamily::Integer,
            T::MYSQL_TYPE_ENUM => TypeFamily::Enum,
            T::MYSQL_TYPE_SET => TypeFamily::Set,
            T::MYSQL_TYPE_JSON => TypeFamily::Json,
            T::MYSQL_TYPE_DATETIME | T::MYSQL_TYPE_DATETIME2 => TypeFamily::Datetime,
            T::MYSQL_TYPE_TIMESTAMP | T::MYSQL_TYPE_TIMESTAMP2 => TypeFamily::Timestamp,
            other => return Err(format!("binlog column type {other:?} is not read by the connector")),
        };
        Ok(family)
    }
}

/// Collation id of the `binary` character set.
const BINARY_COLLATION: u16 = 63;

/// Why BINARY(n) is refused. The binlog leaves out the trailing zero bytes a `SELECT` pads it with, so the
/// stream and the snapshot would disagree; and a BINARY(16) UUID is bytes that are not text.
const FIXED_BINARY: &str =
    "a fixed-length binary string: the binlog drops the zero bytes a SELECT pads it with, and its bytes are not text";

/// The families each outbox column (in [`SLOT_NAMES`] order) may have, and the types to suggest.
const ACCEPTED: [(&[TypeFamily], &str); 8] = {
    use TypeFamily::*;
    const KEY: (&[TypeFamily], &str) = (
        &[Text, Integer, Enum, Set],
        "CHAR/VARCHAR/TEXT in utf8mb4 (a UUID as CHAR(36)), an integer type, ENUM or SET",
    );
    const BODY: (&[TypeFamily], &str) = (&[Json, Text], "JSON, or TEXT/LONGTEXT in utf8mb4");
    [
        KEY,
        KEY,
        KEY,
        KEY,
        (&[Integer], "an integer type (SMALLINT UNSIGNED)"),
        BODY,
        BODY,
        (&[Datetime, Timestamp], "DATETIME(6) or TIMESTAMP(6)"),
    ]
};

/// The families an outbox column may have; `role` is its name in the default schema (`id`, `payload`,
/// …, as in `[outbox.columns]`).
pub fn accepted_families(role: &str) -> &'static [TypeFamily] {
    SLOT_NAMES.iter().position(|n| *n == role).map_or(&[], |slot| ACCEPTED[slot].0)
}

/// What is wrong with an outbox column's type, with the fix, or `None` when the connector reads it.
/// `role` is the column's role (`occurred_at`, …), `column` its configured name, `shown` its type as the
/// operator wrote it (`COLUMN_TYPE`), `family` what [`TypeFamily::of_sql`] made of it.
pub fn column_type_problem(
    table: &TableName,
    role: &str,
    column: &str,
    shown: &str,
    family: std::result::Result<TypeFamily, String>,
) -> Option<String> {
    let slot = SLOT_NAMES.iter().position(|n| *n == role)?;
    let (accepted, suggestion) = ACCEPTED[slot];
    let why = match family {
        Ok(family) if accepted.contains(&family) => return None,
        Ok(_) => format!("not a type the {role} column can have"),
        Err(why) => why,
    };
    Some(format!(
        "column `{column}` ({role}) of {table} is {shown} ({why}); change it to {suggestion}: \
         ALTER TABLE {table} MODIFY `{column}` <type> (keeping its NULL/DEFAULT), or map another column in \
         [outbox.columns]"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Preflight (`information_schema`) and the stream (TABLE_MAP) classify each type the same way:
    /// what one accepts the other accepts, so `outbox-cdc check` refuses exactly what the stream would.
    #[test]
    fn sql_and_binlog_types_agree() {
        use ColumnType as T;
        use TypeFamily::*;
        const UTF8MB4: Option<u16> = Some(45);
        /// `DATA_TYPE` and character set, the TABLE_MAP's type and collation id, the family both must give.
        type Case = (&'static str, Option<&'static str>, ColumnType, Option<u16>, Option<TypeFamily>);
        let cases: &[Case] = &[
            ("char", Some("utf8mb4"), T::MYSQL_TYPE_STRING, UTF8MB4, Some(Text)),
            ("varchar", Some("utf8mb4"), T::MYSQL_TYPE_VARCHAR, UTF8MB4, Some(Text)),
            ("varchar", Some("utf8mb3"), T::MYSQL_TYPE_VARCHAR, Some(33), Some(Text)),
            ("text", Some("utf8mb4"), T::MYSQL_TYPE_BLOB, UTF8MB4, Some(Text)),
            ("longtext", Some("utf8mb4"), T::MYSQL_TYPE_BLOB, None, Some(Text)),
            ("binary", None, T::MYSQL_TYPE_STRING, Some(63), None),
            ("varbinary", None, T::MYSQL_TYPE_VARCHAR, Some(63), Some(Text)),
            ("blob", None, T::MYSQL_TYPE_BLOB, Some(63), Some(Text)),
            ("tinyint", None, T::MYSQL_TYPE_TINY, None, Some(Integer)),
            ("smallint", None, T::MYSQL_TYPE_SHORT, None, Some(Integer)),
            ("mediumint", None, T::MYSQL_TYPE_INT24, None, Some(Integer)),
            ("int", None, T::MYSQL_TYPE_LONG, None, Some(Integer)),
            ("bigint", None, T::MYSQL_TYPE_LONGLONG, None, Some(Integer)),
            ("enum", Some("utf8mb4"), T::MYSQL_TYPE_ENUM, None, Some(Enum)),
            ("set", Some("utf8mb4"), T::MYSQL_TYPE_SET, None, Some(Set)),
            ("json", None, T::MYSQL_TYPE_JSON, None, Some(Json)),
            ("datetime", None, T::MYSQL_TYPE_DATETIME2, None, Some(Datetime)),
            ("timestamp", None, T::MYSQL_TYPE_TIMESTAMP2, None, Some(Timestamp)),
            ("decimal", None, T::MYSQL_TYPE_NEWDECIMAL, None, None),
            ("double", None, T::MYSQL_TYPE_DOUBLE, None, None),
            ("date", None, T::MYSQL_TYPE_NEWDATE, None, None),
            ("time", None, T::MYSQL_TYPE_TIME2, None, None),
            ("year", None, T::MYSQL_TYPE_YEAR, None, None),
            ("bit", None, T::MYSQL_TYPE_BIT, None, None),
        ];
        for (data_type, charset, ty, collation, expected) in cases {
            let sql = TypeFamily::of_sql(data_type, *charset).ok();
            let binlog = TypeFamily::of_binlog(*ty, *collation).ok();
            assert_eq!((sql, binlog), (*expected, *expected), "{data_type} / {ty:?}");
        }
        // A character set other than UTF-8 arrives as its own bytes in the binlog, converted in a SELECT.
        assert!(TypeFamily::of_sql("varchar", Some("latin1")).unwrap_err().contains("character set latin1"));
    }

    /// One rule per outbox column: the types it may have, and the fix naming the column when it has
    /// another.
    #[test]
    fn each_column_accepts_its_types() {
        use TypeFamily::*;
        let table = TableName { database: "shop".into(), table: "outbox_events".into() };
        let all = [Text, Integer, Enum, Set, Json, Datetime, Timestamp];
        let cases: &[(&str, &[TypeFamily])] = &[
            ("id", &[Text, Integer, Enum, Set]),
            ("aggregate_type", &[Text, Integer, Enum, Set]),
            ("aggregate_id", &[Text, Integer, Enum, Set]),
            ("event_type", &[Text, Integer, Enum, Set]),
            ("schema_version", &[Integer]),
            ("payload", &[Json, Text]),
            ("headers", &[Json, Text]),
            ("occurred_at", &[Datetime, Timestamp]),
        ];
        for (role, accepted) in cases {
            assert_eq!(accepted_families(role), *accepted, "{role}");
            for family in all {
                let problem = column_type_problem(&table, role, "col", "a type", Ok(family));
                assert_eq!(problem.is_none(), accepted.contains(&family), "{role} as {family:?}: {problem:?}");
            }
        }
        let problem =
            column_type_problem(&table, "occurred_at", "created", "date", TypeFamily::of_sql("date", None)).unwrap();
        assert!(problem.contains("column `created` (occurred_at) of shop.outbox_events is date"), "{problem}");
        assert!(problem.contains("DATETIME(6) or TIMESTAMP(6)"), "{problem}");
        let problem =
            column_type_problem(&table, "id", "id", "binary(16)", TypeFamily::of_sql("binary", None)).unwrap();
        assert!(problem.contains("fixed-length binary string") && problem.contains("a UUID as CHAR(36)"), "{problem}");
    }
}
