//! The signal table read by SQL (`[outbox] signal_table`), where no binlog carries its inserts: the polling
//! relay's signals, and a paused relay's wait for its `resume`. The binlog source decodes the same rows
//! from the stream instead ([`super::change`]), in commit order.
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2.
//!
//! A table has no order of insertion a reader could ask for (Debezium's layout has no sequence column), so
//! the rows come in the order of their first column, `id`: signals written between two reads are carried
//! out in that order.

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Value};

use super::change::Signal;
use crate::error::{classify_mysql, Error, Result};
use crate::outbox::TableName;

/// Every row of `table`, as signals, in the order of `id`. The first three columns are `id`, `type` and
/// `data`, whatever their names, as the binlog reader takes them.
///
/// # Errors
/// Classified query errors; a definite error when a row does not fit Debezium's layout.
pub async fn read_signals(conn: &mut Conn, table: &TableName) -> Result<Vec<Signal>> {
    let sql = format!("SELECT * FROM {} ORDER BY 1", table.quoted());
    let rows: Vec<mysql_async::Row> = conn.query(sql).await.map_err(|e| classify_mysql(&e))?;
    rows.into_iter().map(|row| signal_of(table, row.unwrap())).collect()
}

/// One row's first three values as a signal.
fn signal_of(table: &TableName, values: Vec<Value>) -> Result<Signal> {
    let text = |n: usize| match values.get(n) {
        Some(Value::Bytes(b)) => Ok(Some(String::from_utf8_lossy(b).into_owned())),
        Some(Value::NULL) | None => Ok(None),
        Some(other) => Err(Error::definite(format!(
            "the signal table {table}'s first three columns must be texts in Debezium's layout (id, type, data); \
             read {other:?}"
        ))),
    };
    let (Some(id), Some(kind), data) = (text(0)?, text(1)?, text(2)?) else {
        return Err(Error::definite(format!(
            "a signal of {table} without an id or a type: the first two columns are NOT NULL in Debezium's layout"
        )));
    };
    Ok(Signal { id, kind, data })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> TableName {
        TableName::parse("app.signals").unwrap()
    }

    /// Texts become the signal; a NULL `data` is none; a number where a text belongs, or a missing
    /// `type`, is refused saying what the layout is.
    #[test]
    fn a_row_is_a_signal_in_debeziums_layout() {
        let row = vec![Value::Bytes(b"s-1".to_vec()), Value::Bytes(b"pause".to_vec()), Value::NULL];
        assert_eq!(signal_of(&table(), row).unwrap(), Signal { id: "s-1".into(), kind: "pause".into(), data: None });
        let row = vec![Value::Bytes(b"s-2".to_vec()), Value::Int(1), Value::NULL];
        let error = signal_of(&table(), row).unwrap_err().to_string();
        assert!(error.contains("Debezium's layout (id, type, data)"), "{error}");
        let row = vec![Value::Bytes(b"s-3".to_vec())];
        let error = signal_of(&table(), row).unwrap_err().to_string();
        assert!(error.contains("without an id or a type"), "{error}");
    }
}
