//! How the server orders snapshot keys: each key column compared in its own type and collation.
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2 (vocabulary, error, metrics, config).
//!
//! The snapshot scans in keyset order `(aggregate_type, aggregate_id, occurred_at, id)` and stores the
//! last acknowledged key as text. Two places compare keys afterwards: the scan's `WHERE key > after`
//! (continuing a table, or resuming after a crash) and the stream's overlap rule ([`super::overlap`]),
//! which decides whether a streamed row was already emitted by a resumed snapshot segment. Both must agree
//! with the scan's `ORDER BY`, or rows fall between them: with `aggregate_id BIGINT`, the text `"20"` sorts
//! after `"100"` while the scan put 20 first.
//!
//! # Invariants
//! - A key value is compared only through [`KeyType::param_sql`]: a parameter carrying the stored text,
//!   typed as the column is (`CAST(? AS SIGNED)` for a signed integer, the column's charset and collation
//!   for text, the label's index for an ENUM). The scan's `WHERE` and the overlap's comparison use the
//!   same expression, so they cannot disagree with each other, and both agree with `ORDER BY` because
//!   the server compares a column with a value of the column's own type exactly as it sorts it.
//! - A column type whose order we cannot reproduce from its text (SET, BIT, JSON, spatial) is refused
//!   when the snapshot opens, with the fix; it is never compared as text.
//!
//! # Why not compare in Rust
//! Integers could be, collations cannot: `utf8mb4_general_ci`, `utf8mb4_0900_ai_ci` and `latin1_swedish_ci`
//! each define their own order, and only the server knows them all. One mechanism for every type keeps
//! the rule checkable in one place; the overlap rule asks once per aggregate and caches the answer.

use std::cmp::Ordering;

use mysql_async::prelude::Queryable;
use mysql_async::Conn;

use super::{MARIADB_GTID_EXAMPLE, MYSQL_GTID_EXAMPLE};
use crate::config::ColumnNames;
use crate::error::{classify_mysql, Error, Result};
use crate::outbox::TableName;

/// A key column's type, as far as ordering is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyType {
    /// TINYINT … BIGINT, signed.
    Signed,
    /// TINYINT … BIGINT UNSIGNED.
    Unsigned,
    /// DECIMAL / NUMERIC.
    Decimal,
    /// FLOAT / DOUBLE.
    Float,
    /// CHAR, VARCHAR, TEXT in a character set, ordered by `collation`.
    Text {
        /// `CHARACTER_SET_NAME`.
        charset: String,
        /// `COLLATION_NAME`.
        collation: String,
    },
    /// BINARY, VARBINARY, BLOB: bytes.
    Binary,
    /// BINARY(16): a UUID's bytes, stored in a key as its canonical text and compared as the bytes again.
    Uuid,
    /// DATETIME and TIMESTAMP (both compared as the server prints them in the session time zone).
    DateTime,
    /// DATE.
    Date,
    /// TIME.
    Time,
    /// YEAR.
    Year,
    /// ENUM: ordered by the index of its label (1-based, in declaration order), not by the label's text.
    Enum {
        /// Labels in declaration order.
        labels: Vec<String>,
    },
}

impl KeyType {
    /// The type of a column from `information_schema.COLUMNS` (`DATA_TYPE`, `COLUMN_TYPE`,
    /// `CHARACTER_SET_NAME`, `COLLATION_NAME`).
    ///
    /// # Errors
    /// A definite error for a type whose order cannot be reproduced from its text.
    pub fn from_schema(
        column: &str,
        data_type: &str,
        column_type: &str,
        charset: Option<&str>,
        collation: Option<&str>,
    ) -> Result<KeyType> {
        let data_type = data_type.to_ascii_lowercase();
        let unsigned = column_type.to_ascii_lowercase().contains("unsigned");
        Ok(match data_type.as_str() {
            "tinyint" | "smallint" | "mediumint" | "int" | "integer" | "bigint" if unsigned => KeyType::Unsigned,
            "tinyint" | "smallint" | "mediumint" | "int" | "integer" | "bigint" => KeyType::Signed,
            "decimal" | "numeric" => KeyType::Decimal,
            "float" | "double" | "real" => KeyType::Float,
            "char" | "varchar" | "tinytext" | "text" | "mediumtext" | "longtext" => match (charset, collation) {
                (Some(charset), Some(collation)) if charset != "binary" => {
                    KeyType::Text { charset: charset.to_string(), collation: collation.to_string() }
                }
                _ => KeyType::Binary,
            },
            "binary" if column_type.eq_ignore_ascii_case("binary(16)") => KeyType::Uuid,
            "binary" | "varbinary" | "tinyblob" | "blob" | "mediumblob" | "longblob" => KeyType::Binary,
            "datetime" | "timestamp" => KeyType::DateTime,
            "date" => KeyType::Date,
            "time" => KeyType::Time,
            "year" => KeyType::Year,
            "enum" => KeyType::Enum { labels: enum_labels(column_type).ok_or_else(|| unordered(column, column_type))? },
            _ => return Err(unordered(column, column_type)),
        })
    }

    /// SQL for one parameter carrying a stored key value, typed as this column: comparing the column (or
    /// another such parameter) with it orders exactly as the scan's `ORDER BY` does.
    pub fn param_sql(&self) -> String {
        match self {
            KeyType::Signed => "CAST(? AS SIGNED)".into(),
            KeyType::Unsigned | KeyType::Enum { .. } => "CAST(? AS UNSIGNED)".into(),
            KeyType::Decimal => "CAST(? AS DECIMAL(65,30))".into(),
            KeyType::Float => "CAST(? AS DOUBLE)".into(),
            KeyType::Text { charset, collation } => format!("CONVERT(? USING {charset}) COLLATE {collation}"),
            KeyType::Binary => "CAST(? AS BINARY)".into(),
            // The stored text is `column_types::uuid_text` of the bytes: its hex digits are the bytes.
            KeyType::Uuid => "UNHEX(REPLACE(?, '-', ''))".into(),
            KeyType::DateTime => "CAST(? AS DATETIME(6))".into(),
            KeyType::Date => "CAST(? AS DATE)".into(),
            KeyType::Time => "CAST(? AS TIME(6))".into(),
            KeyType::Year => "CAST(? AS UNSIGNED)".into(),
        }
    }

    /// The parameter value for a stored key value: the text itself, or an ENUM label's index.
    ///
    /// # Errors
    /// A definite error for an ENUM value that is not one of the column's labels (the table was altered
    /// since the key was stored).
    pub fn param_value(&self, column: &str, text: &str) -> Result<mysql_async::Value> {
        match self {
            KeyType::Enum { labels } => match labels.iter().position(|l| l == text) {
                Some(i) => Ok(mysql_async::Value::UInt(i as u64 + 1)),
                // MySQL stores an invalid value as the empty string with index 0.
                None if text.is_empty() => Ok(mysql_async::Value::UInt(0)),
                None => Err(Error::definite(format!(
                    "snapshot key: {text:?} is not a label of the ENUM column {column} ({}); was the column \
                     altered during the snapshot? Restore the label, or delete the state directory to snapshot again",
                    labels.join(", ")
                ))),
            },
            _ => Ok(text.into()),
        }
    }
}

fn unordered(column: &str, column_type: &str) -> Error {
    Error::definite(format!(
        "the snapshot scans in order of column {column}, whose type {column_type} it cannot order outside the \
         server (SET, BIT, JSON and spatial types): map a column of a plain type (integer, decimal, text, \
         binary, date/time, ENUM) in [outbox.columns], or snapshot with snapshot.mode = \"never\""
    ))
}

/// The labels of an `enum('a','b''c')` column type, unquoted.
fn enum_labels(column_type: &str) -> Option<Vec<String>> {
    let inner = column_type.trim().strip_prefix("enum(").or_else(|| column_type.trim().strip_prefix("ENUM("))?;
    let inner = inner.strip_suffix(')')?;
    let mut labels = Vec::new();
    let mut chars = inner.chars().peekable();
    loop {
        if chars.next()? != '\'' {
            return None;
        }
        let mut label = String::new();
        loop {
            match chars.next()? {
                '\'' if chars.peek() == Some(&'\'') => {
                    chars.next();
                    label.push('\'');
                }
                '\'' => break,
                '\\' => label.push(chars.next()?),
                c => label.push(c),
            }
        }
        labels.push(label);
        match chars.next() {
            None => return Some(labels),
            Some(',') => {}
            Some(_) => return None,
        }
    }
}

/// The third key column of a table without `occurred_at`: the `id` column again, when its order is the
/// order of insertion (an integer, i.e. an AUTO_INCREMENT or sequence-fed key), so the key is in effect
/// `(aggregate_type, aggregate_id, id)`. A text or binary id (a UUID) says nothing about when the row was
/// written: the snapshot cannot order one aggregate's rows by it and refuses, with the fix.
///
/// # Errors
/// A definite error with the fix when the id is not an integer.
///
/// # The limit
/// Both `occurred_at` and an AUTO_INCREMENT id are assigned when a row is *inserted*, not when its
/// transaction commits: two transactions that insert events of the same aggregate concurrently can commit
/// in the other order. Per-aggregate order in the snapshot is commit order exactly when the writers of one
/// aggregate are serialized (they update or lock the aggregate's row in the same transaction, as the
/// outbox pattern usually does); the binlog stream is in commit order regardless.
pub fn order_without_occurred_at(table: &TableName, id: &(String, KeyType)) -> Result<(String, KeyType)> {
    match id.1 {
        KeyType::Signed | KeyType::Unsigned => Ok(id.clone()),
        _ => Err(Error::definite(format!(
            "outbox table {table} has no occurred_at column and its id column {} is not an integer, so nothing \
             in a row says in which order one aggregate's events were written: the snapshot (taken by \
             snapshot.mode \"initial\", the default, and by \"initial_only\" and \"when_needed\") cannot publish \
             them in order. Either setting makes it work: map a DATETIME/TIMESTAMP column that records when \
             each event was written, `[outbox.columns] occurred_at = \"created_at\"`; or `[snapshot] mode = \
             \"never\"`, no snapshot: the stream starts now (`[source] start_from = \"current\"`, the default) \
             or, taking over from Debezium, right after the GTIDs of its last committed offset, `[source] \
             start_after = \"{MYSQL_GTID_EXAMPLE}\"` on MySQL, `\"{MARIADB_GTID_EXAMPLE}\"` on MariaDB \
             (docs/MIGRATING-FROM-DEBEZIUM.md). A time column added now does not order the rows already there: \
             they would share one time, and their order would be the id's again",
            id.0
        ))),
    }
}

/// The columns an index must start with for reading it to walk the snapshot's key order: the first three
/// key columns, or the first two when the third is the id itself (a table without `occurred_at`). InnoDB
/// appends the primary key to every secondary index, which orders the ties by id.
pub fn index_prefix(key: [&str; 4]) -> Vec<&str> {
    match key[2] == key[3] {
        true => key[..2].to_vec(),
        false => key[..3].to_vec(),
    }
}

/// The name of an index of `table` whose columns start with `prefix` (see [`index_prefix`]), if any.
///
/// # Errors
/// Classified query errors.
pub async fn index_in_key_order(conn: &mut Conn, table: &TableName, prefix: &[&str]) -> Result<Option<String>> {
    let indexes = index_columns(conn, table).await?;
    Ok(indexes.into_iter().find_map(|(name, cols)| {
        let starts = cols.len() >= prefix.len() && cols.iter().zip(prefix).all(|(c, w)| c.eq_ignore_ascii_case(w));
        starts.then_some(name)
    }))
}

/// The indexes of `table` as (name, columns in index order).
///
/// # Errors
/// Classified query errors.
pub async fn index_columns(conn: &mut Conn, table: &TableName) -> Result<Vec<(String, Vec<String>)>> {
    let columns: Vec<(String, String)> = conn
        .exec(
            "SELECT INDEX_NAME, COLUMN_NAME FROM information_schema.STATISTICS \
             WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY INDEX_NAME, SEQ_IN_INDEX",
            (&table.database, &table.table),
        )
        .await
        .map_err(|e| classify_mysql(&e))?;
    let mut indexes: Vec<(String, Vec<String>)> = Vec::new();
    for (index, column) in columns {
        match indexes.last_mut() {
            Some((name, cols)) if *name == index => cols.push(column),
            _ => indexes.push((index, vec![column])),
        }
    }
    Ok(indexes)
}

/// The four key columns of one table, in scan order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyColumns {
    /// `(name, type)` of aggregate_type, aggregate_id, occurred_at, id; a table without `occurred_at` has
    /// its integer id in third place too ([`order_without_occurred_at`]).
    pub columns: [(String, KeyType); 4],
}

impl KeyColumns {
    /// Reads the key columns' types from `information_schema`.
    ///
    /// # Errors
    /// Classified query errors; a definite error for a missing column or a type that cannot be ordered.
    pub async fn load(conn: &mut Conn, table: &TableName, names: &ColumnNames) -> Result<KeyColumns> {
        let mut load = async |name: &String, required: bool| -> Result<Option<(String, KeyType)>> {
            type Info = (String, String, Option<String>, Option<String>);
            let info: Option<Info> = conn
                .exec_first(
                    "SELECT DATA_TYPE, COLUMN_TYPE, CHARACTER_SET_NAME, COLLATION_NAME FROM information_schema.COLUMNS \
                     WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? AND COLUMN_NAME = ?",
                    (&table.database, &table.table, name),
                )
                .await
                .map_err(|e| classify_mysql(&e).context(format_args!("reading the type of {table}.{name}")))?;
            let Some((data_type, column_type, charset, collation)) = info else {
                return match required {
                    true => Err(Error::definite(format!(
                        "outbox table {table} has no column {name} (see [outbox.columns])"
                    ))),
                    false => Ok(None),
                };
            };
            let key = KeyType::from_schema(name, &data_type, &column_type, charset.as_deref(), collation.as_deref())?;
            Ok(Some((name.clone(), key)))
        };
        let required = |slot| names.must_exist(slot);
        let aggregate_type = load(&names.aggregate_type, true).await?.expect("required");
        let aggregate_id = load(&names.aggregate_id, true).await?.expect("required");
        let id = load(&names.id, true).await?.expect("required");
        let occurred_at = match load(&names.occurred_at, required(7)).await? {
            Some(occurred_at) => occurred_at,
            None => order_without_occurred_at(table, &id)?,
        };
        Ok(KeyColumns { columns: [aggregate_type, aggregate_id, occurred_at, id] })
    }

    /// The parameter values of a stored key, in column order.
    ///
    /// # Errors
    /// As [`KeyType::param_value`].
    pub fn params(&self, key: [&str; 4]) -> Result<[mysql_async::Value; 4]> {
        let [a, b, c, d] = &self.columns;
        Ok([
            a.1.param_value(&a.0, key[0])?,
            b.1.param_value(&b.0, key[1])?,
            c.1.param_value(&c.0, key[2])?,
            d.1.param_value(&d.0, key[3])?,
        ])
    }

    /// How `key` compares with `other`, column by column, as the server orders them.
    ///
    /// # Errors
    /// Classified query errors; definite errors of [`KeyType::param_value`].
    pub async fn compare(&self, conn: &mut Conn, key: [&str; 4], other: [&str; 4]) -> Result<[Ordering; 4]> {
        let typed: Vec<String> = self.columns.iter().map(|(_, t)| t.param_sql()).collect();
        // A derived table types each parameter once; the outer query compares the pairs.
        let sql = format!(
            "SELECT (k0 > o0) - (k0 < o0), (k1 > o1) - (k1 < o1), (k2 > o2) - (k2 < o2), (k3 > o3) - (k3 < o3) \
             FROM (SELECT {0} AS k0, {0} AS o0, {1} AS k1, {1} AS o1, {2} AS k2, {2} AS o2, {3} AS k3, {3} AS o3) AS v",
            typed[0], typed[1], typed[2], typed[3]
        );
        let (k, o) = (self.params(key)?, self.params(other)?);
        let [k0, k1, k2, k3] = k;
        let [o0, o1, o2, o3] = o;
        /// `(k > o) - (k < o)` per column: -1, 0, 1, or NULL when a value is not of the column's type.
        type Signs = (Option<i64>, Option<i64>, Option<i64>, Option<i64>);
        let row: Option<Signs> = conn
            .exec_first(sql, vec![k0, o0, k1, o1, k2, o2, k3, o3])
            .await
            .map_err(|e| classify_mysql(&e).context("comparing snapshot keys"))?;
        let ordering = |v: Option<i64>, i: usize| match v {
            Some(v) => Ok(v.cmp(&0)),
            None => Err(Error::definite(format!(
                "snapshot keys {key:?} and {other:?} cannot be compared in column {} (a value the server reads \
                 as NULL in its type)",
                self.columns[i].0
            ))),
        };
        let row = row.ok_or_else(|| Error::transient("comparing snapshot keys returned no row"))?;
        Ok([ordering(row.0, 0)?, ordering(row.1, 1)?, ordering(row.2, 2)?, ordering(row.3, 3)?])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One rule per column type: which parameter SQL the comparisons use. Guards against comparing an
    /// integer column's values as text (`"20" > "100"`), which lost rows after a resumed snapshot.
    #[test]
    fn each_column_type_compares_in_its_own_type() {
        let text = |cs: &str, coll: &str| KeyType::Text { charset: cs.into(), collation: coll.into() };
        #[rustfmt::skip]
        /// DATA_TYPE, COLUMN_TYPE, CHARACTER_SET_NAME, COLLATION_NAME -> type and parameter SQL.
        type Case<'a> = (&'a str, &'a str, Option<&'a str>, Option<&'a str>, KeyType, &'a str);
        let cases: [Case; 15] = [
            ("int", "int(11)", None, None, KeyType::Signed, "CAST(? AS SIGNED)"),
            ("bigint", "bigint(20)", None, None, KeyType::Signed, "CAST(? AS SIGNED)"),
            ("bigint", "bigint(20) unsigned", None, None, KeyType::Unsigned, "CAST(? AS UNSIGNED)"),
            ("INT", "INT UNSIGNED", None, None, KeyType::Unsigned, "CAST(? AS UNSIGNED)"),
            ("decimal", "decimal(20,0)", None, None, KeyType::Decimal, "CAST(? AS DECIMAL(65,30))"),
            (
                "varchar",
                "varchar(128)",
                Some("utf8mb4"),
                Some("utf8mb4_general_ci"),
                text("utf8mb4", "utf8mb4_general_ci"),
                "CONVERT(? USING utf8mb4) COLLATE utf8mb4_general_ci",
            ),
            (
                "varchar",
                "varchar(128)",
                Some("utf8mb4"),
                Some("utf8mb4_bin"),
                text("utf8mb4", "utf8mb4_bin"),
                "CONVERT(? USING utf8mb4) COLLATE utf8mb4_bin",
            ),
            (
                "char",
                "char(36)",
                Some("latin1"),
                Some("latin1_swedish_ci"),
                text("latin1", "latin1_swedish_ci"),
                "CONVERT(? USING latin1) COLLATE latin1_swedish_ci",
            ),
            ("char", "char(36)", Some("binary"), Some("binary"), KeyType::Binary, "CAST(? AS BINARY)"),
            ("varbinary", "varbinary(16)", None, None, KeyType::Binary, "CAST(? AS BINARY)"),
            ("binary", "binary(16)", None, None, KeyType::Uuid, "UNHEX(REPLACE(?, '-', ''))"),
            ("datetime", "datetime(6)", None, None, KeyType::DateTime, "CAST(? AS DATETIME(6))"),
            ("timestamp", "timestamp(3)", None, None, KeyType::DateTime, "CAST(? AS DATETIME(6))"),
            (
                "enum",
                "enum('order','payment')",
                Some("utf8mb4"),
                Some("utf8mb4_general_ci"),
                KeyType::Enum { labels: vec!["order".into(), "payment".into()] },
                "CAST(? AS UNSIGNED)",
            ),
            ("year", "year(4)", None, None, KeyType::Year, "CAST(? AS UNSIGNED)"),
        ];
        for (data_type, column_type, charset, collation, expected, sql) in cases {
            let got = KeyType::from_schema("c", data_type, column_type, charset, collation).unwrap();
            assert_eq!(got, expected, "{column_type} {collation:?}");
            assert_eq!(got.param_sql(), sql, "{column_type} {collation:?}");
        }
    }

    #[test]
    fn types_without_a_reproducible_order_are_refused_with_the_fix() {
        for (data_type, column_type) in [("set", "set('a','b')"), ("bit", "bit(8)"), ("json", "json")] {
            let err = KeyType::from_schema("aggregate_type", data_type, column_type, None, None).unwrap_err();
            let text = err.to_string();
            assert!(text.contains(column_type) && text.contains("[outbox.columns]"), "{text}");
        }
    }

    #[test]
    fn enum_labels_are_unquoted_and_indexed_from_one() {
        let labels = enum_labels(r"enum('order','pay''ment','a,b','back\\slash')").unwrap();
        assert_eq!(labels, ["order", "pay'ment", "a,b", "back\\slash"]);
        let key = KeyType::Enum { labels };
        assert_eq!(key.param_value("t", "order").unwrap(), mysql_async::Value::UInt(1));
        assert_eq!(key.param_value("t", "a,b").unwrap(), mysql_async::Value::UInt(3));
        assert_eq!(key.param_value("t", "").unwrap(), mysql_async::Value::UInt(0));
        assert!(key.param_value("t", "refund").unwrap_err().to_string().contains("not a label"));
        assert_eq!(enum_labels("enum('a'"), None);
        assert_eq!(enum_labels("enum('a')x"), None);
    }
}
