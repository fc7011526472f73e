//! The overlap rule: which streamed rows a resumed snapshot already emitted.
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2 (vocabulary, error, metrics, config).
//!
//! After a crash mid-snapshot the scan resumes in a new read view, so the snapshot is a list of
//! *segments* ([`SnapshotState::segments`]): segment `i` covers the keys after `after_i` (up to the next
//! segment's start), as seen in view `V_i`. The stream starts at the first view, the cut. For a streamed
//! outbox row with key `k` in the transaction at `p`:
//!
//! > the row was already emitted iff `k` lies in a resumed segment (not the first) whose view holds `p`.
//!
//! The first segment of the initial snapshot needs no rule: the stream starts at its view, so it never reads
//! a transaction that view holds. A snapshot of tables added later ([`SnapshotState::added`]) is different:
//! its stream resumes at the checkpoint, before the first view, so the rule holds for every segment, and
//! only for the rows of those tables (the others were never scanned).
//!
//! # Invariants
//! - "Which segment holds `k`" is [`segment_holding`]: the last segment whose range starts before `k`. A
//!   segment that starts from the beginning (`after = None`: the crash came before the first acknowledged
//!   key) starts before every key.
//! - "Does `k` come after a segment's start" compares, in this order, the table's place in the snapshot's
//!   table list, then the four key columns in their own types and collations ([`KeyColumns::compare`]):
//!   the same order as the scan, so a row the scan skipped is never taken for one it emitted.
//! - Answers are cached per aggregate only when no segment starts inside that aggregate; otherwise every
//!   row of it is asked.
//!
//! # Error handling
//! Comparison queries fail transiently (retry from the checkpoint, where the rule is rebuilt); a stored key
//! the server cannot read in its column's type is definite.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::Arc;

use mysql_async::Conn;

use super::key_order::KeyColumns;
use super::SourceConn;
use crate::config::ColumnNames;
use crate::error::{Error, Result};
use crate::outbox::{OutboxRow, TableName};
use crate::position::snapshot::{SnapshotKey, SnapshotState};
use crate::position::{Position, TxStart};

/// Where a segment starts, relative to one row's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegmentStart {
    /// The segment covers every key (the first segment, or a resume before any acknowledged key).
    FromTheBeginning,
    /// The segment covers the keys after its boundary; this is how the row's key compares with it.
    After(Ordering),
}

/// Index of the segment whose key range holds a key, given where each segment starts relative to it (the
/// first entry is the first segment, which always starts from the beginning).
pub fn segment_holding(starts: &[SegmentStart]) -> usize {
    starts
        .iter()
        .rposition(|s| matches!(s, SegmentStart::FromTheBeginning | SegmentStart::After(Ordering::Greater)))
        .unwrap_or(0)
}

/// Compares a row's key with a segment boundary: table first (by its place in the snapshot's table list),
/// then the four key columns lexicographically.
fn key_ordering(table: Ordering, columns: [Ordering; 4]) -> Ordering {
    columns.into_iter().fold(table, Ordering::then)
}

/// The overlap rule for the stream after a resumed snapshot.
pub struct Overlap {
    state: Arc<SnapshotState>,
    conn: Conn,
    /// The snapshot's tables, in scan order; a row's place in this list is the first key component.
    tables: Vec<TableName>,
    /// Per table (same order), the key columns' types.
    keys: Vec<KeyColumns>,
    /// Cache: (table, aggregate_type, aggregate_id) -> segment, for aggregates no segment starts inside.
    by_aggregate: HashMap<(usize, String, String), usize>,
}

impl Overlap {
    /// The rule for a completed snapshot; `None` when it can never skip (a single segment of the initial
    /// snapshot).
    ///
    /// # Errors
    /// Connection errors; definite errors for key columns that cannot be ordered.
    pub async fn new(
        state: Arc<SnapshotState>,
        source: &SourceConn,
        tables: Vec<TableName>,
        columns: &ColumnNames,
    ) -> Result<Option<Self>> {
        if state.segments.len() < 2 && !state.added {
            return Ok(None);
        }
        let tables = state.tables_or(tables);
        let mut conn = source.connect().await?;
        let mut keys = Vec::with_capacity(tables.len());
        for t in &tables {
            keys.push(KeyColumns::load(&mut conn, t, columns).await?);
        }
        Ok(Some(Overlap { state, conn, tables, keys, by_aggregate: HashMap::new() }))
    }

    /// The state to keep in checkpoints while the rule is in force.
    pub fn state(&self) -> &Arc<SnapshotState> {
        &self.state
    }

    /// True once the stream is past every segment's view: the rule can never skip again.
    pub fn expired(&self, stream: &Position) -> bool {
        self.state.segments.iter().all(|s| stream.holds_all_of(&s.view))
    }

    /// Whether the snapshot already emitted `row`, read by the stream in the transaction at `start`.
    ///
    /// # Errors
    /// Classified query errors of the key comparison.
    pub async fn emitted_by_snapshot(&mut self, row: &OutboxRow, start: &TxStart) -> Result<bool> {
        let Some(table) = self.tables.iter().position(|t| *t == *row.table) else {
            return Ok(false);
        };
        let segment = self.segment_of(table, row).await?;
        Ok((segment > 0 || self.state.added) && self.state.segments[segment].view.holds(start))
    }

    /// Index of the segment whose key range holds the row's key.
    async fn segment_of(&mut self, table: usize, row: &OutboxRow) -> Result<usize> {
        let cache_key = (table, row.aggregate_type.clone(), row.aggregate_id.clone());
        if let Some(&i) = self.by_aggregate.get(&cache_key) {
            return Ok(i);
        }
        let row_key = SnapshotKey::of(&row.table, row);
        let key = row_key.columns();
        let state = self.state.clone();
        let mut starts = Vec::with_capacity(state.segments.len());
        let mut starts_inside_aggregate = false;
        for segment in &state.segments {
            let Some(after) = &segment.after else {
                starts.push(SegmentStart::FromTheBeginning);
                continue;
            };
            let after_table = after.table.index_in(&self.tables).map_err(Error::definite)?;
            let table_order = table.cmp(&after_table);
            let ordering = if table_order != Ordering::Equal {
                table_order
            } else {
                let columns = self.keys[table].compare(&mut self.conn, key, after.columns()).await?;
                starts_inside_aggregate |= columns[..2] == [Ordering::Equal, Ordering::Equal];
                key_ordering(table_order, columns)
            };
            starts.push(SegmentStart::After(ordering));
        }
        let segment = segment_holding(&starts);
        if !starts_inside_aggregate {
            self.by_aggregate.insert(cache_key, segment);
        }
        Ok(segment)
    }
}

#[cfg(test)]
mod tests {
    use super::SegmentStart::{After, FromTheBeginning};
    use super::*;

    /// The segment rule, one row per case. Guards against a key equal to a boundary (the boundary row
    /// itself, scanned by the earlier segment) being assigned to the later one, and against a resume from
    /// the beginning not superseding the segments before it.
    #[test]
    fn the_last_segment_starting_before_the_key_holds_it() {
        use Ordering::{Equal, Greater, Less};
        #[rustfmt::skip]
        let cases: [(&[SegmentStart], usize, &str); 8] = [
            (&[FromTheBeginning], 0, "one segment"),
            (&[FromTheBeginning, After(Less)], 0, "key before the resume point"),
            (&[FromTheBeginning, After(Equal)], 0, "the boundary row itself was scanned before the crash"),
            (&[FromTheBeginning, After(Greater)], 1, "key after the resume point"),
            (&[FromTheBeginning, After(Greater), After(Less)], 1, "between two resume points"),
            (&[FromTheBeginning, After(Greater), After(Greater)], 2, "after the last resume point"),
            (&[FromTheBeginning, After(Greater), FromTheBeginning], 2, "a resume from the start supersedes"),
            (&[FromTheBeginning, FromTheBeginning, After(Less)], 1, "before a resume after a restart from the start"),
        ];
        for (starts, expected, what) in cases {
            assert_eq!(segment_holding(starts), expected, "{what}");
        }
    }

    /// The table's place decides before the columns do; equal tables compare the columns in order.
    #[test]
    fn keys_compare_table_first_then_columns_in_order() {
        use Ordering::{Equal, Greater, Less};
        #[rustfmt::skip]
        let cases = [
            (Less, [Greater; 4], Less, "an earlier table"),
            (Greater, [Less; 4], Greater, "a later table"),
            (Equal, [Equal, Greater, Less, Less], Greater, "aggregate id decides"),
            (Equal, [Equal, Equal, Equal, Less], Less, "id breaks the tie"),
            (Equal, [Equal; 4], Equal, "the same key"),
            (Equal, [Less, Greater, Greater, Greater], Less, "aggregate type decides first"),
        ];
        for (table, columns, expected, what) in cases {
            assert_eq!(key_ordering(table, columns), expected, "{what}");
        }
    }
}
