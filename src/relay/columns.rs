//! The relay's columns and indexes: what it needs of an outbox table, what `check` reports and proposes to
//! add (`ALTER TABLE`), and how a table's events are ordered.
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2 (vocabulary, error, metrics, config).

use mysql_async::prelude::Queryable;
use mysql_async::Conn;

use crate::config::{ColumnNames, PollOrder, PollProgress};
use crate::error::{classify_mysql, Result};
use crate::outbox::{quote_ident, TableName};

/// The relay's columns, as the reference schema names them: `published_at`, `attempts`,
/// `next_attempt_at`, `last_error`. (`locked_at` and `locked_by`, which earlier relays leased rows
/// with, are no longer read or written.)
pub const POLL_COLUMNS: [&str; 4] = ["published_at", "attempts", "next_attempt_at", "last_error"];

/// The relay's columns as `check` proposes to add them ([`poll_columns_ddl`]), in [`POLL_COLUMNS`] order.
pub const POLL_COLUMN_DEFINITIONS: [&str; 4] = [
    "DATETIME(6) NULL",
    "INT UNSIGNED NOT NULL DEFAULT 0",
    "DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)",
    "VARCHAR(1000) NULL",
];

/// The sequence column `check` proposes to add, and the index the relay reads along.
pub const SEQUENCE_COLUMN: &str = "seq";

/// `next_attempt_at` of a dead-lettered (parked) row. Outside `TIMESTAMP`'s range, so the column must be a
/// `DATETIME` ([`poll_column_problems`]).
pub const PARKED_UNTIL: &str = "9999-12-31 23:59:59";

/// How an aggregate's events are ordered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OrderKey {
    /// The table's `AUTO_INCREMENT` column: insertion order.
    Sequence(String),
    /// `occurred_at`, then the event id (`poll.order = "occurred_at"`).
    OccurredAtThenId,
}

/// The types the relay can use for each of its columns, in [`POLL_COLUMNS`] order. `next_attempt_at` holds
/// [`PARKED_UNTIL`], which a `TIMESTAMP` cannot (strict mode refuses the write, others store a zero date).
const POLL_COLUMN_TYPES: [&[&str]; 4] = [
    &["datetime", "timestamp"],
    &["tinyint", "smallint", "mediumint", "int", "bigint"],
    &["datetime"],
    &["varchar", "char", "text", "tinytext", "mediumtext", "longtext"],
];

/// The types relay column `i` ([`POLL_COLUMNS`] order) may have under `progress`. With a progress table
/// `published_at` holds `HELD_AT`, outside `TIMESTAMP`'s range, so it must be a `DATETIME` too.
fn poll_column_types(i: usize, progress: &PollProgress) -> &'static [&'static str] {
    match progress {
        PollProgress::Table(_) if i == 0 => &["datetime"],
        _ => POLL_COLUMN_TYPES[i],
    }
}

/// Each relay column of a table ([`POLL_COLUMNS`] order): `None` when usable, else `Some(None)` when it is
/// missing, `Some(Some(type))` when it has a type the relay cannot use.
fn poll_column_faults(found: &[(String, String, String)], progress: &PollProgress) -> [Option<Option<String>>; 4] {
    std::array::from_fn(|i| match found.iter().find(|c| c.0.eq_ignore_ascii_case(POLL_COLUMNS[i])) {
        None => Some(None),
        Some((_, data_type, _))
            if !poll_column_types(i, progress).contains(&data_type.to_ascii_lowercase().as_str()) =>
        {
            Some(Some(data_type.clone()))
        }
        Some(_) => None,
    })
}

/// What is wrong with the relay's columns of a table (missing, or of a type the relay cannot use), one
/// finding each; empty when they are usable. Also what `check` reports. `progress`: `[poll]
/// progress_table`.
pub fn poll_column_problems(
    table: &TableName,
    found: &[(String, String, String)],
    progress: &PollProgress,
) -> Vec<String> {
    POLL_COLUMNS
        .iter()
        .zip(poll_column_faults(found, progress))
        .enumerate()
        .filter_map(|(i, (name, fault))| match fault? {
            None => Some(format!(
                "{table} has no `{name}` column, which the polling relay needs (the relay's column names are fixed)"
            )),
            Some(data_type) => {
                let types = poll_column_types(i, progress);
                let why = if types == POLL_COLUMN_TYPES[i] {
                    ""
                } else {
                    " ([poll] progress_table: rows it passes unpublished are marked 1000-01-01, outside TIMESTAMP's range)"
                };
                Some(format!("{table}.{name} is {data_type}; the polling relay needs one of {}{why}", types.join(", ")))
            }
        })
        .collect()
}

/// The `ALTER TABLE` that gives a table the relay's columns it lacks (`ADD COLUMN`) or has with a type the
/// relay cannot use (`MODIFY COLUMN`: check what the column holds first); `None` when they are all usable.
pub fn poll_columns_ddl(
    table: &TableName,
    found: &[(String, String, String)],
    progress: &PollProgress,
) -> Option<String> {
    let clauses: Vec<String> = POLL_COLUMNS
        .iter()
        .zip(POLL_COLUMN_DEFINITIONS)
        .zip(poll_column_faults(found, progress))
        .filter_map(|((name, definition), fault)| {
            let verb = if fault?.is_some() { "MODIFY" } else { "ADD" };
            Some(format!("{verb} COLUMN {} {definition}", quote_ident(name)))
        })
        .collect();
    (!clauses.is_empty()).then(|| format!("ALTER TABLE {} {}", table.quoted(), clauses.join(", ")))
}

/// The `ALTER TABLE` that gives a table the sequence column and the index the relay reads along. Rows
/// already in the table are numbered in primary-key order.
pub fn sequence_ddl(table: &TableName) -> String {
    format!(
        "ALTER TABLE {} ADD COLUMN `{SEQUENCE_COLUMN}` BIGINT UNSIGNED NOT NULL AUTO_INCREMENT UNIQUE, \
         ADD INDEX idx_unpublished (`published_at`, `{SEQUENCE_COLUMN}`)",
        table.quoted()
    )
}

/// The ordering key of a table under `order`: its auto-increment column; or, when the user chose
/// `occurred_at`, `(occurred_at, id)` if it has an `occurred_at` column. `None` when there is none.
pub fn order_key(found: &[(String, String, String)], columns: &ColumnNames, order: PollOrder) -> Option<OrderKey> {
    match order {
        PollOrder::Sequence => found
            .iter()
            .find(|c| c.2.to_ascii_lowercase().contains("auto_increment"))
            .map(|(name, _, _)| OrderKey::Sequence(name.clone())),
        PollOrder::OccurredAt => {
            found.iter().any(|c| c.0.eq_ignore_ascii_case(&columns.occurred_at)).then_some(OrderKey::OccurredAtThenId)
        }
    }
}

/// Why a table has no order key under `order`, with the fix.
pub fn no_order_key(table: &TableName, columns: &ColumnNames, order: PollOrder) -> String {
    match order {
        PollOrder::Sequence => format!(
            "{table} has no AUTO_INCREMENT column: the polling relay publishes each aggregate's events in \
             insertion order, which only a sequence column records (occurred_at ties and writers' clocks \
             reorder them). Add one: {}. Or set [poll] order = \"occurred_at\" to order by ({}, {}) instead, \
             which reverses events that share a timestamp",
            sequence_ddl(table),
            columns.occurred_at,
            columns.id
        ),
        PollOrder::OccurredAt => format!(
            "{table} has no `{}` column for [poll] order = \"occurred_at\": map the column that says when each \
             event was written as occurred_at in [outbox.columns], or add a sequence column and remove \
             [poll] order: {}",
            columns.occurred_at,
            sequence_ddl(table)
        ),
    }
}

/// `last_error`'s declared length in characters (`TEXT` types: their byte limit).
pub(super) async fn last_error_chars(conn: &mut Conn, table: &TableName) -> Result<u64> {
    let chars: Option<Option<u64>> = conn
        .exec_first(
            "SELECT CHARACTER_MAXIMUM_LENGTH FROM information_schema.COLUMNS \
             WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? AND COLUMN_NAME = 'last_error'",
            (&table.database, &table.table),
        )
        .await
        .map_err(|e| classify_mysql(&e).context(format_args!("reading the columns of {table}")))?;
    Ok(chars.flatten().unwrap_or(1000).clamp(1, 65_535))
}

/// What `information_schema` says about a table's columns: name, data type, extra.
pub async fn columns_of(conn: &mut Conn, table: &TableName) -> Result<Vec<(String, String, String)>> {
    conn.exec(
        "SELECT COLUMN_NAME, DATA_TYPE, EXTRA FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
        (&table.database, &table.table),
    )
    .await
    .map_err(|e| classify_mysql(&e).context(format_args!("reading the columns of {table}")))
}

/// The columns the relay's read index starts with under `order`.
pub fn read_index_columns<'a>(order: &'a OrderKey, columns: &'a ColumnNames) -> Vec<&'a str> {
    match order {
        OrderKey::Sequence(c) => vec!["published_at", c.as_str()],
        OrderKey::OccurredAtThenId => vec!["published_at", columns.occurred_at.as_str()],
    }
}

/// The `ALTER TABLE` that adds the relay's read index under `order`, online.
pub fn read_index_ddl(table: &TableName, order: &OrderKey, columns: &ColumnNames) -> String {
    let indexed = match order {
        OrderKey::Sequence(c) => quote_ident(c),
        OrderKey::OccurredAtThenId => format!("{}, {}", quote_ident(&columns.occurred_at), quote_ident(&columns.id)),
    };
    format!(
        "ALTER TABLE {} ADD INDEX idx_unpublished (`published_at`, {indexed}), ALGORITHM=INPLACE, LOCK=NONE",
        table.quoted()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(name: &str, data_type: &str, extra: &str) -> (String, String, String) {
        (name.into(), data_type.into(), extra.into())
    }

    const MARKING: &PollProgress = &PollProgress::Marking;

    fn progress_table() -> PollProgress {
        PollProgress::Table(TableName { database: "shop".into(), table: "outbox_relay_progress".into() })
    }

    /// The reference schema passes; a missing or mistyped relay column is named, a TIMESTAMP
    /// next_attempt_at among them (it cannot hold the parked date); the order key is the auto-increment
    /// column, or (occurred_at, id) only when chosen, else none with the ALTER TABLE that adds one.
    #[test]
    fn poll_columns_and_order_key_follow_the_table() {
        let table = TableName { database: "shop".into(), table: "outbox_events".into() };
        let reference = vec![
            col("id", "char", ""),
            col("seq", "bigint", "auto_increment"),
            col("occurred_at", "datetime", ""),
            col("published_at", "datetime", ""),
            col("attempts", "int", ""),
            col("next_attempt_at", "datetime", ""),
            col("last_error", "varchar", ""),
        ];
        assert!(poll_column_problems(&table, &reference, MARKING).is_empty());
        assert!(poll_column_problems(&table, &reference, &progress_table()).is_empty());
        let columns = ColumnNames::default();
        assert_eq!(order_key(&reference, &columns, PollOrder::Sequence), Some(OrderKey::Sequence("seq".into())));
        assert_eq!(order_key(&reference, &columns, PollOrder::OccurredAt), Some(OrderKey::OccurredAtThenId));
        let no_seq: Vec<_> = reference.iter().filter(|c| c.0 != "seq").cloned().collect();
        assert_eq!(order_key(&no_seq, &columns, PollOrder::Sequence), None);
        let why = no_order_key(&table, &columns, PollOrder::Sequence);
        assert!(why.contains("ADD COLUMN `seq` BIGINT UNSIGNED NOT NULL AUTO_INCREMENT UNIQUE"), "{why}");
        assert!(why.contains("order = \"occurred_at\""), "{why}");

        let mut broken: Vec<_> = reference.iter().filter(|c| c.0 != "last_error").cloned().collect();
        broken.iter_mut().find(|c| c.0 == "next_attempt_at").unwrap().1 = "timestamp".into();
        let problems = poll_column_problems(&table, &broken, MARKING);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("next_attempt_at is timestamp"), "{problems:?}");
        assert!(problems[1].contains("no `last_error` column"), "{problems:?}");
        assert_eq!(
            poll_columns_ddl(&table, &broken, MARKING).as_deref(),
            Some(
                "ALTER TABLE `shop`.`outbox_events` MODIFY COLUMN `next_attempt_at` DATETIME(6) NOT NULL DEFAULT \
                 CURRENT_TIMESTAMP(6), ADD COLUMN `last_error` VARCHAR(1000) NULL"
            )
        );
        assert_eq!(poll_columns_ddl(&table, &reference, MARKING), None);

        // `published_at TIMESTAMP` serves without a progress table, not with one (HELD_AT is out of range).
        let mut stamped = reference.clone();
        stamped.iter_mut().find(|c| c.0 == "published_at").unwrap().1 = "timestamp".into();
        assert!(poll_column_problems(&table, &stamped, MARKING).is_empty());
        let problems = poll_column_problems(&table, &stamped, &progress_table());
        assert!(problems.len() == 1 && problems[0].contains("published_at is timestamp"), "{problems:?}");
        assert!(problems[0].contains("progress_table"), "{problems:?}");
        assert_eq!(
            poll_columns_ddl(&table, &stamped, &progress_table()).as_deref(),
            Some("ALTER TABLE `shop`.`outbox_events` MODIFY COLUMN `published_at` DATETIME(6) NULL")
        );
    }
}
