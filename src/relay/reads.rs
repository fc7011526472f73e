//! The relay's reads: unpublished rows in order after a cursor, in the gaps a read passed, by key, of one
//! aggregate; and the sweeps that glimpse (key, aggregate, position only) the unpublished rows below the
//! cursor. Each read names the table's read index where it goes along the order.
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2 (vocabulary, error, metrics, config).

use std::sync::Arc;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row, Value};

use super::columns::{OrderKey, PARKED_UNTIL};
use super::progress::HELD_AT;
use super::table::{key_bytes, sequence_value, Aggregate, Glimpse, Polled, Position, Relay, SWEEP_PAGE};
use crate::error::{classify_mysql, Result};
use crate::metrics::{metrics, PollQuery};
use crate::outbox::{quote_ident, TableName};
use crate::source::decode::Undecodable;

impl Relay {
    /// The order columns of table `t`, quoted.
    pub(super) fn order_columns(&self, t: usize) -> Vec<String> {
        match &self.tables[t].order {
            OrderKey::Sequence(c) => vec![quote_ident(c)],
            OrderKey::OccurredAtThenId => {
                vec![quote_ident(&self.columns.occurred_at), quote_ident(&self.columns.id)]
            }
        }
    }

    /// `position > ?` (`after`) or `position <= ?` (`!after`) for table `t`, with its parameters.
    fn compare(&self, t: usize, after: bool, position: &Position) -> (String, Vec<Value>) {
        let cols = self.order_columns(t);
        let (strict, last) = if after { (">", ">") } else { ("<", "<=") };
        match cols.as_slice() {
            [c] => (format!("{c} {last} ?"), position.clone()),
            [a, b] => (
                format!("({a} {strict} ? OR ({a} = ? AND {b} {last} ?))"),
                vec![position[0].clone(), position[0].clone(), position[1].clone()],
            ),
            _ => unreachable!("one or two order columns"),
        }
    }

    /// The columns of a full read: roles, key, flags (1: parked, 2: `published_at` = [`HELD_AT`]), the
    /// order columns, then the `[outbox] additional_placement` columns ([`Relay::polled`] reads them back).
    fn full_columns(&self, t: usize) -> String {
        let pt = &self.tables[t];
        let roles: Vec<String> = (self.columns.required().iter().zip(pt.present))
            .map(|((name, _), present)| if present { quote_ident(name) } else { "NULL".into() })
            .collect();
        format!(
            "{roles}, {id}, (next_attempt_at = '{PARKED_UNTIL}') | (COALESCE(published_at = '{HELD_AT}', 0) << 1), \
             {order}{additional}",
            roles = roles.join(", "),
            id = quote_ident(&self.columns.id),
            order = self.order_columns(t).join(", "),
            additional = self.columns.additional().iter().map(|c| format!(", {}", quote_ident(c))).collect::<String>(),
        )
    }

    /// `table` of table `t` in a statement's `FROM`, naming its read index when the statement reads `along`
    /// the order ([`super::table::PollTable`]'s `read_index`).
    pub(super) fn from(&self, t: usize, along: bool) -> String {
        let pt = &self.tables[t];
        match along {
            true => format!("{} FORCE INDEX ({})", pt.table.quoted(), quote_ident(&pt.read_index)),
            false => pt.table.quoted(),
        }
    }

    /// The rows of table `t` still due (`published_at IS NULL`; with a progress table, above its number:
    /// [`super::progress::Progress::due`]) that meet `condition`, in order, up to `limit`; `along`: the
    /// condition is a range of the order columns.
    async fn read_full(
        &self,
        conn: &mut Conn,
        t: usize,
        along: bool,
        (condition, params): (&str, Vec<Value>),
        limit: usize,
    ) -> Result<Vec<Polled>> {
        let due = self.progress.due(t, &self.tables[t].order);
        self.read_full_where(conn, t, along, &due, (condition, params), limit).await
    }

    /// [`Relay::read_full`] of the rows that meet `unpublished` instead.
    async fn read_full_where(
        &self,
        conn: &mut Conn,
        t: usize,
        along: bool,
        unpublished: &str,
        (condition, params): (&str, Vec<Value>),
        limit: usize,
    ) -> Result<Vec<Polled>> {
        let sql = format!(
            "SELECT {columns} FROM {from} WHERE {unpublished} AND {condition} ORDER BY {order} LIMIT {limit}",
            columns = self.full_columns(t),
            from = self.from(t, along),
            order = self.order_columns(t).join(", "),
        );
        let rows: Vec<Row> = conn.exec(sql, params).await.map_err(|e| {
            classify_mysql(&e).context(format_args!("poll: reading unpublished rows of {}", self.tables[t].table))
        })?;
        metrics().poll_queries(PollQuery::Claim, 1);
        Ok(rows.into_iter().map(|row| self.polled(t, row)).collect())
    }

    /// Up to `poll.batch_rows` unpublished rows of table `t` after `cursor` (from the start for `None`), in
    /// order. Parked rows are among them (the caller holds their aggregates).
    ///
    /// # Errors
    /// Classified query errors.
    pub async fn read_after(&self, conn: &mut Conn, t: usize, cursor: Option<&Position>) -> Result<Vec<Polled>> {
        let (condition, params) = match cursor {
            Some(position) => self.compare(t, true, position),
            None => ("TRUE".to_string(), Vec::new()),
        };
        self.read_full(conn, t, true, (&condition, params), self.batch_rows).await
    }

    /// Up to `limit` rows of table `t` still due in the sequence ranges `gaps` (inclusive), after `after`,
    /// in order: rows committed after the read that passed their numbers.
    ///
    /// # Errors
    /// Classified query errors.
    pub async fn read_gaps(
        &self,
        conn: &mut Conn,
        t: usize,
        gaps: &[(u64, u64)],
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<Polled>> {
        let OrderKey::Sequence(c) = &self.tables[t].order else { return Ok(Vec::new()) };
        if gaps.is_empty() {
            return Ok(Vec::new());
        }
        let c = quote_ident(c);
        let mut condition = format!("({})", vec![format!("{c} BETWEEN ? AND ?"); gaps.len()].join(" OR "));
        let mut params: Vec<Value> = gaps.iter().flat_map(|(lo, hi)| [Value::from(*lo), Value::from(*hi)]).collect();
        if let Some(after) = after {
            condition.push_str(&format!(" AND {c} > ?"));
            params.push(Value::from(after));
        }
        self.read_full(conn, t, true, (&condition, params), limit).await
    }

    /// The position of the frontier of table `t` (`[poll] progress_table`), when it is above 0: nothing
    /// at or before it is unpublished.
    fn frontier_position(&self, t: usize) -> Option<Position> {
        let frontier = self.frontier(t);
        (frontier > 0).then(|| vec![Value::UInt(frontier)])
    }

    /// `after`, or the frontier of table `t` when that is further.
    fn after_frontier(&self, t: usize, after: Option<&Position>) -> Option<Position> {
        let frontier = self.frontier_position(t);
        match (after, frontier) {
            (Some(a), Some(f)) if a.first().and_then(sequence_value) < f.first().and_then(sequence_value) => Some(f),
            (Some(a), _) => Some(a.clone()),
            (None, f) => f,
        }
    }

    /// A page of the unpublished rows of table `t` up to `upto` and after `after` (and after the
    /// frontier), light columns only.
    ///
    /// # Errors
    /// Classified query errors.
    pub async fn sweep(
        &self,
        conn: &mut Conn,
        t: usize,
        after: Option<&Position>,
        upto: &Position,
    ) -> Result<Vec<Glimpse>> {
        let (mut condition, mut params) = self.compare(t, false, upto);
        if let Some(after) = self.after_frontier(t, after) {
            let (c, p) = self.compare(t, true, &after);
            condition = format!("{condition} AND {c}");
            params.extend(p);
        }
        self.glimpse(t, conn, (condition, params)).await
    }

    /// Up to [`SWEEP_PAGE`] unpublished rows of table `t` that meet `condition` (a range of the order
    /// columns), in order, light columns only.
    async fn glimpse(
        &self,
        t: usize,
        conn: &mut Conn,
        (condition, params): (String, Vec<Value>),
    ) -> Result<Vec<Glimpse>> {
        let order = self.order_columns(t);
        let sql = format!(
            "SELECT {id}, {at}, {ai}, {cols} FROM {from} WHERE published_at IS NULL AND {condition} \
             ORDER BY {cols} LIMIT {SWEEP_PAGE}",
            id = quote_ident(&self.columns.id),
            at = quote_ident(&self.columns.aggregate_type),
            ai = quote_ident(&self.columns.aggregate_id),
            cols = order.join(", "),
            from = self.from(t, true),
        );
        let rows: Vec<Row> = conn.exec(sql, params).await.map_err(|e| {
            classify_mysql(&e).context(format_args!("poll: sweeping unpublished rows of {}", self.tables[t].table))
        })?;
        metrics().poll_queries(PollQuery::Claim, 1);
        Ok(rows
            .into_iter()
            .map(|mut row| {
                let mut take = |i: usize| row.take::<Value, _>(i).unwrap_or(Value::NULL);
                let key = take(0);
                let aggregate = (key_bytes(&take(1)), key_bytes(&take(2)));
                let position = (3..3 + order.len()).map(take).collect();
                Glimpse { key, aggregate, position }
            })
            .collect())
    }

    /// The unpublished rows of table `t` with primary keys `keys`, in order.
    ///
    /// # Errors
    /// Classified query errors.
    pub async fn read_keys(&self, conn: &mut Conn, t: usize, keys: &[Value]) -> Result<Vec<Polled>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let condition = format!("{} IN ({})", quote_ident(&self.columns.id), vec!["?"; keys.len()].join(", "));
        self.read_full(conn, t, false, (&condition, keys.to_vec()), keys.len()).await
    }

    /// Up to `poll.batch_rows` unpublished rows of `aggregate` in table `t`, after `after`, in order: the
    /// rows a lifted hold left behind, wherever they are (above the last row read too: a run that started
    /// again reads from the number, which may be behind them), those the progress table's number passed
    /// ([`HELD_AT`]) among them. Along the `(aggregate_type, aggregate_id, ...)` index.
    ///
    /// # Errors
    /// Classified query errors.
    pub async fn read_aggregate(
        &self,
        conn: &mut Conn,
        t: usize,
        aggregate: &Aggregate,
        after: Option<&Position>,
    ) -> Result<Vec<Polled>> {
        let mut condition = format!(
            "{} = ? AND {} = ?",
            quote_ident(&self.columns.aggregate_type),
            quote_ident(&self.columns.aggregate_id)
        );
        let mut params = vec![Value::Bytes(aggregate.0.clone()), Value::Bytes(aggregate.1.clone())];
        if let Some(after) = after {
            let (c, p) = self.compare(t, true, after);
            condition = format!("{condition} AND {c}");
            params.extend(p);
        }
        let unpublished = self.unpublished(t);
        self.read_full_where(conn, t, false, &unpublished, (&condition, params), self.batch_rows).await
    }

    /// A row of a full read as [`Polled`].
    fn polled(&self, t: usize, mut row: Row) -> Polled {
        let pt = &self.tables[t];
        let width = self.order_columns(t).len();
        let key = row.take::<Value, _>(8).unwrap_or(Value::NULL);
        let flags = row.get::<Option<u64>, _>(9).flatten().unwrap_or(0);
        let (parked, held_at) = (flags & 1 != 0, flags & 2 != 0);
        let position: Position = (10..10 + width).map(|i| row.as_ref(i).cloned().unwrap_or(Value::NULL)).collect();
        let part = |i: usize| key_bytes(row.as_ref(i).unwrap_or(&Value::NULL));
        let aggregate = (part(1), part(2));
        let image = row.clone();
        let decoded =
            crate::source::snapshot::decode(&pt.table, pt.present, self.columns.payload_encoding(), 10 + width, row)
                .map(|mut r| {
                    r.from_snapshot = false;
                    r
                });
        let row = decoded.map_err(|e| undecodable(&pt.table, &image, e.to_string()));
        Polled { row, key, aggregate, position, parked, held_at }
    }
}

/// A row that does not decode, with its columns rendered as far as possible.
fn undecodable(table: &Arc<TableName>, row: &Row, message: String) -> Undecodable {
    let render = |i: usize| -> serde_json::Value {
        match row.as_ref(i) {
            None | Some(Value::NULL) => serde_json::Value::Null,
            Some(Value::Bytes(b)) => match std::str::from_utf8(b) {
                Ok(s) => s.into(),
                Err(_) => serde_json::json!({ "hex": b.iter().map(|x| format!("{x:02x}")).collect::<String>() }),
            },
            Some(other) => other.as_sql(true).trim_matches('\'').into(),
        }
    };
    let text = |i: usize| render(i).as_str().map(String::from);
    let image = crate::outbox::SLOT_NAMES.iter().enumerate().map(|(i, name)| (name.to_string(), render(i))).collect();
    Undecodable {
        table: table.clone(),
        id: text(0),
        aggregate_type: text(1),
        aggregate_id: text(2),
        image,
        message: format!("outbox row in {table}: {message}"),
    }
}
