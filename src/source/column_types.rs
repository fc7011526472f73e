//! The SQL types an outbox column may have: exactly those the binlog stream and the snapshot's `SELECT`
//! read alike, each for the columns it makes sense for. One table ([`ACCEPTED`]) serves preflight, which
//! classifies `information_schema.COLUMNS` ([`TypeFamily::of_sql`]), and the stream, which classifies each
//! TABLE_MAP ([`TypeFamily::of_binlog`]); `tests::sql_and_binlog_types_agree` keeps the two
//! classifications the same. How the binlog's different representations are read is in
//! [`super::decode`].
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2 (vocabulary, error, metrics, config).

use mysql_common::constants::ColumnType;

use super::charset::Charset;
use crate::outbox::{TableName, SLOT_NAMES};

/// The SQL types an outbox column can have that the stream and the snapshot read alike. Preflight
/// ([`column_type_problem`] over `information_schema`) and the stream (over each TABLE_MAP) accept exactly
/// these, each for the columns [`accepted_families`] names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TypeFamily {
    /// CHAR, VARCHAR and the TEXT types in any character set the connector decodes ([`Charset`]; MariaDB's
    /// JSON is a LONGTEXT), and VARBINARY and the BLOB types, whose bytes must be UTF-8: text (a row whose
    /// value is not well-formed in its character set is undecodable).
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
    /// BINARY(16): a UUID's 16 bytes, written as canonical lower-case UUID text (8-4-4-4-12) by
    /// [`uuid_text`], whoever read them. The binlog leaves out trailing zero bytes, which `uuid_text` puts
    /// back; a `SELECT` returns all 16.
    Uuid,
}

impl TypeFamily {
    /// The family of a column as `information_schema.COLUMNS` shows it: `DATA_TYPE`, `COLUMN_TYPE` and
    /// `CHARACTER_SET_NAME`. `Err` says why the type is not read.
    ///
    /// # Errors
    /// A column type the decoder does not read, with the reason.
    pub fn of_sql(data_type: &str, column_type: &str, charset: Option<&str>) -> std::result::Result<Self, String> {
        let family = match data_type.to_ascii_lowercase().as_str() {
            "char" | "varchar" | "tinytext" | "text" | "mediumtext" | "longtext" => {
                // The binlog carries the column's own bytes, which the stream decodes (`charset`).
                Charset::by_name(charset.unwrap_or("binary"))?;
                TypeFamily::Text
            }
            "varbinary" | "tinyblob" | "blob" | "mediumblob" | "longblob" => TypeFamily::Text,
            "binary" if column_type.eq_ignore_ascii_case("binary(16)") => TypeFamily::Uuid,
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

    /// The family of a column as a TABLE_MAP describes it: its real type, its metadata and, for character
    /// columns, its collation id when the optional metadata carries one.
    pub(super) fn of_binlog(ty: ColumnType, meta: &[u8], collation: Option<u16>) -> std::result::Result<Self, String> {
        use ColumnType as T;
        let family = match ty {
            // A CHAR/BINARY column's metadata is its real type and its length in bytes.
            T::MYSQL_TYPE_STRING if collation == Some(BINARY_COLLATION) && meta == [0xfe, 16] => TypeFamily::Uuid,
            T::MYSQL_TYPE_STRING if collation == Some(BINARY_COLLATION) => return Err(FIXED_BINARY.into()),
            T::MYSQL_TYPE_STRING | T::MYSQL_TYPE_VARCHAR | T::MYSQL_TYPE_VAR_STRING | T::MYSQL_TYPE_BLOB => {
                if let Some(collation) = collation {
                    Charset::by_collation(collation)?;
                }
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

/// Why BINARY(n) other than BINARY(16) is refused. The binlog leaves out the trailing zero bytes a `SELECT`
/// pads it with, and its bytes are not text; only a 16-byte UUID has one text form both agree on.
const FIXED_BINARY: &str = "a fixed-length binary string other than BINARY(16) (a UUID): its bytes are not text";

/// A BINARY(16) value as canonical lower-case UUID text (`8-4-4-4-12` hex digits): the one conversion the
/// stream (which reads the bytes without their trailing zeros) and the snapshot (all 16) share.
///
/// # Errors
/// More than 16 bytes (not a BINARY(16) value).
pub fn uuid_text(bytes: &[u8]) -> std::result::Result<String, String> {
    if bytes.len() > 16 {
        return Err(format!("{} bytes where a BINARY(16) UUID has 16", bytes.len()));
    }
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(36);
    for i in 0..16 {
        if matches!(i, 4 | 6 | 8 | 10) {
            text.push('-');
        }
        // The trailing zero bytes the binlog left out.
        let byte = bytes.get(i).copied().unwrap_or(0);
        text.push(char::from(HEX[usize::from(byte >> 4)]));
        text.push(char::from(HEX[usize::from(byte & 0xf)]));
    }
    Ok(text)
}

/// SQL for one parameter carrying an id as the connector published it (an id the connector itself read
/// from this table, such as a parked row's), equal to the column's value: a BINARY(16) UUID's text back to
/// its bytes; other types compare with their text as they are. Ids an operator types go through
/// `ops::ids`, which refuses text the column cannot hold.
pub fn id_param_sql(family: Option<TypeFamily>) -> &'static str {
    match family {
        Some(TypeFamily::Uuid) => "UNHEX(REPLACE(?, '-', ''))",
        _ => "?",
    }
}

/// SQL for `column` (quoted) as the text the connector publishes for it, for the commands that read ids
/// with their own queries (audit): a BINARY(16) as UUID text, an integer as its digits, others as they are.
pub fn text_sql(family: TypeFamily, column: &str) -> String {
    match family {
        TypeFamily::Uuid => format!(
            "LOWER(INSERT(INSERT(INSERT(INSERT(HEX({column}), 9, 0, '-'), 14, 0, '-'), 19, 0, '-'), 24, 0, '-'))"
        ),
        TypeFamily::Integer => format!("CAST({column} AS CHAR)"),
        _ => column.to_string(),
    }
}

/// The families each outbox column (in [`SLOT_NAMES`] order) may have, and the types to suggest.
const ACCEPTED: [(&[TypeFamily], &str); 8] = {
    use TypeFamily::*;
    const KEY: (&[TypeFamily], &str) = (
        &[Text, Integer, Enum, Set],
        "CHAR/VARCHAR/TEXT in utf8mb4 (a UUID as CHAR(36)), an integer type, ENUM or SET",
    );
    const ID: (&[TypeFamily], &str) =
        (&[Text, Integer, Uuid, Enum, Set], "CHAR/VARCHAR/TEXT in utf8mb4, BINARY(16) (a UUID) or an integer type");
    const BODY: (&[TypeFamily], &str) = (&[Json, Text], "JSON, or TEXT/LONGTEXT in utf8mb4");
    [
        ID,
        KEY,
        ID,
        KEY,
        (&[Integer, Text], "an integer type (SMALLINT UNSIGNED) or CHAR/VARCHAR in utf8mb4"),
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

/// What is wrong with a `payload_encoding = "bytes"` payload column's type, with the fix, or `None`
/// when its bytes can be published unchanged (BLOB, VARBINARY, or a text type's own bytes).
pub fn bytes_payload_problem(
    table: &TableName,
    column: &str,
    shown: &str,
    family: &std::result::Result<TypeFamily, String>,
) -> Option<String> {
    let why = match family {
        Ok(TypeFamily::Text) => return None,
        Ok(TypeFamily::Json) => "a JSON column's bytes are the server's internal format".to_string(),
        Ok(_) => "not a byte string".to_string(),
        Err(why) => why.clone(),
    };
    Some(format!(
        "column `{column}` (payload) of {table} is {shown} ({why}), and outbox.payload_encoding = \"bytes\" \
         publishes a column's bytes unchanged; change it to BLOB/LONGBLOB or VARBINARY, or set \
         outbox.payload_encoding = \"json\""
    ))
}

/// How a value of `family` is written in the record, for `outbox-cdc check`.
pub fn rendering(family: TypeFamily) -> &'static str {
    match family {
        TypeFamily::Text => "its text (UTF-8)",
        TypeFamily::Integer => "its decimal digits",
        TypeFamily::Enum => "its label (never its index)",
        TypeFamily::Set => "its labels, comma-separated in definition order",
        TypeFamily::Json => "its JSON text",
        TypeFamily::Datetime => "ISO-8601 as stored (no zone), with the column's fractional digits",
        TypeFamily::Timestamp => "ISO-8601 in UTC, with the column's fractional digits",
        TypeFamily::Uuid => "canonical lower-case UUID text (8-4-4-4-12)",
    }
}

/// Where the role in slot `slot` ([`SLOT_NAMES`] order) appears in the published record.
pub fn published_as(slot: usize) -> &'static str {
    [
        "the `id` header and the envelope's `event_id`",
        "the `aggregate_type` header and envelope field (and the topic, with ${aggregate_type})",
        "the Kafka key and the envelope's `aggregate_id`",
        "the envelope's `type` and the `event_type` header (and the topic, with ${event_type})",
        "the envelope's `version` and the `schema_version` header",
        "the envelope's `data`, or the whole value with kafka.value_format = \"payload\"",
        "its top-level string entries, as Kafka headers",
        "the envelope's `occurred_at` and the streamed record's timestamp",
    ][slot]
}

/// What records lack when the table has no column for the optional role in slot `slot`.
pub fn published_without(slot: usize) -> &'static str {
    match slot {
        3 => "records carry no envelope `type` and no `event_type` header",
        4 => "records carry no envelope `version` and no `schema_version` header",
        6 => "records carry only the connector's headers",
        7 => {
            "records carry no envelope `occurred_at`; their timestamp is the producer's; the snapshot orders \
              each aggregate's rows by an integer id"
        }
        _ => "required",
    }
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
            // Legacy character sets are decoded (`charset`); one without a decoder is refused by both.
            ("varchar", Some("latin1"), T::MYSQL_TYPE_VARCHAR, Some(8), Some(Text)),
            ("char", Some("gbk"), T::MYSQL_TYPE_STRING, Some(28), Some(Text)),
            ("text", Some("big5"), T::MYSQL_TYPE_BLOB, Some(1), Some(Text)),
            ("varchar", Some("swe7"), T::MYSQL_TYPE_VARCHAR, Some(10), None),
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
            let column_type = if *data_type == "binary" { "binary(8)" } else { data_type };
            let meta: &[u8] = if *data_type == "binary" { &[0xfe, 8] } else { &[] };
            let sql = TypeFamily::of_sql(data_type, column_type, *charset).ok();
            let binlog = TypeFamily::of_binlog(*ty, meta, *collation).ok();
            assert_eq!((sql, binlog), (*expected, *expected), "{data_type} / {ty:?}");
        }
        // BINARY(16), and only that length, is a UUID in both.
        assert_eq!(TypeFamily::of_sql("binary", "binary(16)", None), Ok(Uuid));
        assert_eq!(TypeFamily::of_binlog(T::MYSQL_TYPE_STRING, &[0xfe, 16], Some(63)), Ok(Uuid));
        assert!(TypeFamily::of_binlog(T::MYSQL_TYPE_STRING, &[0xfe, 16], UTF8MB4).is_ok_and(|f| f == Text));
        // A character set without a decoder says so, in both.
        let swe7 = TypeFamily::of_sql("varchar", "varchar(8)", Some("swe7")).unwrap_err();
        assert!(swe7.contains("character set swe7"), "{swe7}");
        let swe7 = TypeFamily::of_binlog(T::MYSQL_TYPE_VARCHAR, &[], Some(10)).unwrap_err();
        assert!(swe7.contains("character set swe7"), "{swe7}");
    }

    /// One rule per outbox column: the types it may have, and the fix naming the column when it has
    /// another.
    #[test]
    fn each_column_accepts_its_types() {
        use TypeFamily::*;
        let table = TableName { database: "shop".into(), table: "outbox_events".into() };
        let all = [Text, Integer, Enum, Set, Json, Datetime, Timestamp, Uuid];
        let cases: &[(&str, &[TypeFamily])] = &[
            ("id", &[Text, Integer, Uuid, Enum, Set]),
            ("aggregate_type", &[Text, Integer, Enum, Set]),
            ("aggregate_id", &[Text, Integer, Uuid, Enum, Set]),
            ("event_type", &[Text, Integer, Enum, Set]),
            ("schema_version", &[Integer, Text]),
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
        let date = TypeFamily::of_sql("date", "date", None);
        let problem = column_type_problem(&table, "occurred_at", "created", "date", date).unwrap();
        assert!(problem.contains("column `created` (occurred_at) of shop.outbox_events is date"), "{problem}");
        assert!(problem.contains("DATETIME(6) or TIMESTAMP(6)"), "{problem}");
        let binary8 = TypeFamily::of_sql("binary", "binary(8)", None);
        let problem = column_type_problem(&table, "id", "id", "binary(8)", binary8).unwrap();
        assert!(problem.contains("fixed-length binary string") && problem.contains("BINARY(16) (a UUID)"), "{problem}");
    }

    /// BINARY(16) ids become canonical lower-case UUID text, the same from the binlog's bytes (trailing
    /// zeros left out) and from a SELECT's (all 16): guards against the stream and the snapshot publishing
    /// different ids, or keys, for one row.
    #[test]
    fn binary_uuids_have_one_text() {
        let full: [u8; 16] = [0x00, 0xff, 0x10, 0x9a, 0, 0, 0x4b, 0xcd, 0x80, 0, 0, 0, 0, 0, 0, 0];
        let expected = "00ff109a-0000-4bcd-8000-000000000000";
        assert_eq!(uuid_text(&full).unwrap(), expected);
        assert_eq!(uuid_text(&full[..9]).unwrap(), expected, "the binlog's bytes without trailing zeros");
        assert_eq!(uuid_text(&[0xff; 16]).unwrap(), "ffffffff-ffff-ffff-ffff-ffffffffffff");
        assert_eq!(uuid_text(&[]).unwrap(), "00000000-0000-0000-0000-000000000000");
        assert!(uuid_text(&[0; 17]).unwrap_err().contains("17 bytes"));
    }
}

/// Values and the text each must become, shared by the stream decoder's tests ([`super::decode`]) and
/// the snapshot's ([`super::snapshot`]): the two paths are held to one table.
#[cfg(test)]
pub(crate) mod expectations {
    /// BINARY(16) values as a `SELECT` returns them (all 16 bytes) and their text. The stream's tests
    /// also feed them without their trailing zero bytes, as the binlog carries them.
    pub const BINARY16: &[([u8; 16], &str)] = &[
        ([0; 16], "00000000-0000-0000-0000-000000000000"),
        ([0xff; 16], "ffffffff-ffff-ffff-ffff-ffffffffffff"),
        (
            [0x00, 0xff, 0x00, 0xff, 0x12, 0x34, 0x4a, 0xbc, 0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00],
            "00ff00ff-1234-4abc-8000-000000000000",
        ),
        (
            [0x7c, 0x1f, 0x2b, 0x9e, 0x00, 0x00, 0x40, 0x00, 0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01],
            "7c1f2b9e-0000-4000-8000-000000000001",
        ),
    ];

    /// Integers (any width, signed or not) and their decimal text.
    pub const INTEGERS: &[(i128, &str)] = &[
        (0, "0"),
        (-7, "-7"),
        (20, "20"),
        (i64::MIN as i128, "-9223372036854775808"),
        (u64::MAX as i128, "18446744073709551615"),
    ];

    /// Texts that must arrive unchanged: empty, 4-byte UTF-8, quotes and backslashes.
    pub const TEXTS: &[&str] = &["", "order-42", "\u{1F680} 订单", "it's \"quoted\" \\ back"];
}
