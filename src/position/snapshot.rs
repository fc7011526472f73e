//! Snapshot progress as stored with the checkpoint: the key a scan reached ([`SnapshotKey`]), the key ranges
//! and the read view each was scanned in ([`Segment`]), and the whole state ([`SnapshotState`]). Their JSON is
//! part of the checkpoint record and must not change. The snapshot itself, and why the state looks like
//! this, is in `source::snapshot`; the overlap rule that reads it in `source::overlap`.
//!
//! Floor 0, the ground floor (docs/ARCHITECTURE.md): imports nothing of ours but other ground-floor modules.

use serde::{Deserialize, Serialize};

use super::Position;
use crate::outbox::{OutboxRow, TableName};

/// A row's place in the scan order.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SnapshotKey {
    /// The table being scanned.
    pub table: KeyTable,
    /// `aggregate_type`.
    pub aggregate_type: String,
    /// `aggregate_id`.
    pub aggregate_id: String,
    /// `occurred_at` as the server prints it (`YYYY-MM-DD HH:MM:SS[.ffffff]`).
    pub occurred_at: String,
    /// Event id.
    pub id: String,
}

impl SnapshotKey {
    /// The key of `row` of `table`.
    pub fn of(table: &TableName, row: &OutboxRow) -> SnapshotKey {
        SnapshotKey {
            table: KeyTable::of(table),
            aggregate_type: row.aggregate_type.clone(),
            aggregate_id: row.aggregate_id.clone(),
            // Back to the server's text: decoding turned its one space into the ISO `T`. A table without
            // occurred_at orders by its integer id in this place (source::key_order).
            occurred_at: row.occurred_at.as_ref().map_or_else(|| row.id.clone(), |o| o.replacen('T', " ", 1)),
            id: row.id.clone(),
        }
    }

    /// The four key columns' values, in scan order.
    pub fn columns(&self) -> [&str; 4] {
        [&self.aggregate_type, &self.aggregate_id, &self.occurred_at, &self.id]
    }
}

/// Which table a [`SnapshotKey`] belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum KeyTable {
    /// `database.table`, as the snapshot scanned it.
    Name(String),
    /// Written by earlier versions: the table's place in the configured (sorted) table list, which shifts
    /// when a table is added or removed. Accepted only while exactly one table is configured
    /// ([`SnapshotState::check_tables`]).
    Index(usize),
}

impl KeyTable {
    /// The key's table for `table`.
    pub fn of(table: &TableName) -> KeyTable {
        KeyTable::Name(table.to_string())
    }

    /// The table's place in `tables`.
    ///
    /// # Errors
    /// The message of a definite error (what to do) when the table is not among them.
    pub fn index_in<T: std::borrow::Borrow<TableName>>(&self, tables: &[T]) -> Result<usize, String> {
        let found = match self {
            KeyTable::Name(name) => tables.iter().position(|t| t.borrow().to_string() == *name),
            KeyTable::Index(i) => Some(*i).filter(|i| *i < tables.len()),
        };
        found.ok_or_else(|| {
            format!(
                "the unfinished snapshot was scanning outbox table {self}, which is no longer configured: put it \
                 back in [outbox] until the snapshot is done, or delete the state directory to snapshot again"
            )
        })
    }
}

impl std::fmt::Display for KeyTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyTable::Name(name) => f.write_str(name),
            KeyTable::Index(i) => write!(f, "number {i} (a checkpoint of an earlier version)"),
        }
    }
}

/// A range of keys scanned in one read view.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    /// Position consistent with the read view.
    pub view: Position,
    /// The segment covers keys after this one (`None`: from the start).
    pub after: Option<SnapshotKey>,
}

/// Snapshot progress, stored with the checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotState {
    /// Segments in key order; the first one's view is the cut where the stream starts.
    pub segments: Vec<Segment>,
    /// Last key whose row (and every earlier one) Kafka acknowledged.
    pub last_key: Option<SnapshotKey>,
    /// Rows acknowledged so far.
    pub rows_done: u64,
    /// Estimated rows in total (from the server's statistics at the start).
    pub rows_estimate: u64,
    /// Every row was scanned and acknowledged; only the overlap rule is still in force.
    pub done: bool,
    /// The outbox tables as `database.table`, in scan order. Empty in checkpoints of earlier versions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tables: Vec<String>,
    /// Tables added to `[outbox]` of a connector that streamed already: its stream resumes at the
    /// checkpoint's position, before the cut, and skips the rows of these tables that a segment's view
    /// holds, the first segment's included (`source::overlap`). `false` for the initial snapshot, whose
    /// stream starts at the cut.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub added: bool,
}

impl SnapshotState {
    /// The cut: where the stream starts.
    pub fn cut(&self) -> &Position {
        &self.segments[0].view
    }

    /// Refuses to resume an unfinished snapshot over other tables than it started with: a table added
    /// before the one being scanned would never be scanned, a removed one would shift the rest.
    ///
    /// # Errors
    /// The message of a definite error naming both lists and the fix.
    pub fn check_tables(&self, configured: &[TableName]) -> Result<(), String> {
        let configured: Vec<String> = configured.iter().map(ToString::to_string).collect();
        if self.added {
            // Tables added later are scanned alone: the others may change, these must stay.
            let gone: Vec<&String> = self.tables.iter().filter(|t| !configured.contains(t)).collect();
            if gone.is_empty() {
                return Ok(());
            }
            return Err(format!(
                "the unfinished snapshot of the tables added to [outbox] ({}) needs them configured, but [outbox] \
                 now configures {}: restore them until the snapshot is done (`outbox-cdc status` shows its \
                 progress)",
                self.tables.join(", "),
                configured.join(", ")
            ));
        }
        let legacy_single = self.tables.is_empty() && configured.len() == 1;
        if self.tables == configured || legacy_single {
            return Ok(());
        }
        let started = if self.tables.is_empty() {
            "an unknown list (the checkpoint was written by an earlier version, which did not store it)".to_string()
        } else {
            self.tables.join(", ")
        };
        Err(format!(
            "the unfinished snapshot started over the outbox tables {started}, but [outbox] now configures {}: \
             restore the configuration until the snapshot is done (`outbox-cdc status` shows its progress), or \
             delete the state directory to snapshot the new list from the start",
            configured.join(", ")
        ))
    }

    /// The tables the snapshot scanned, in scan order; `configured` for checkpoints that did not store them.
    pub fn tables_or(&self, configured: Vec<TableName>) -> Vec<TableName> {
        let stored: Option<Vec<TableName>> = self.tables.iter().map(|t| TableName::parse(t).ok()).collect();
        stored.filter(|t| !t.is_empty()).unwrap_or(configured)
    }
}

#[cfg(test)]
mod table_list_tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<TableName> {
        list.iter().map(|t| TableName::parse(t).unwrap()).collect()
    }

    fn state(tables: &[&str]) -> SnapshotState {
        SnapshotState {
            added: false,
            segments: Vec::new(),
            last_key: None,
            rows_done: 0,
            rows_estimate: 0,
            done: false,
            tables: tables.iter().map(ToString::to_string).collect(),
        }
    }

    /// Guards against resuming an unfinished snapshot by a table's place in a list that changed: a table
    /// added before the current one was never scanned, one removed shifted the rest.
    #[test]
    fn a_resumed_snapshot_needs_the_table_list_it_started_with() {
        #[rustfmt::skip]
        let cases: [(&[&str], &[&str], bool); 6] = [
            (&["shop.outbox"], &["shop.outbox"], true),
            (&["a.o", "b.o"], &["a.o", "b.o"], true),
            (&["b.o"], &["a.o", "b.o"], false),
            (&["a.o", "b.o"], &["b.o"], false),
            (&[], &["shop.outbox"], true),
            (&[], &["a.o", "b.o"], false),
        ];
        for (stored, configured, ok) in cases {
            let result = state(stored).check_tables(&names(configured));
            assert_eq!(result.is_ok(), ok, "{stored:?} -> {configured:?}: {result:?}");
            if let Err(e) = result {
                assert!(e.to_string().contains("restore the configuration"), "{e}");
            }
        }
    }

    /// Keys name their table; keys stored by earlier versions (an index) still load.
    #[test]
    fn key_tables_are_names_and_legacy_indexes_still_load() {
        let tables = names(&["a.o", "b.o"]);
        let named: SnapshotKey = serde_json::from_str(
            r#"{"table":"b.o","aggregate_type":"t","aggregate_id":"1","occurred_at":"x","id":"i"}"#,
        )
        .unwrap();
        assert_eq!(named.table.index_in(&tables).unwrap(), 1);
        let legacy: SnapshotKey =
            serde_json::from_str(r#"{"table":0,"aggregate_type":"t","aggregate_id":"1","occurred_at":"x","id":"i"}"#)
                .unwrap();
        assert_eq!(legacy.table, KeyTable::Index(0));
        assert_eq!(serde_json::to_value(&named.table).unwrap(), serde_json::json!("b.o"));
        let gone = KeyTable::Name("c.o".into()).index_in(&tables).unwrap_err();
        assert!(gone.to_string().contains("no longer configured"), "{gone}");
        let legacy_state: SnapshotState =
            serde_json::from_str(r#"{"segments":[],"last_key":null,"rows_done":0,"rows_estimate":0,"done":false}"#)
                .unwrap();
        assert!(legacy_state.tables.is_empty());
    }
}
