//! Snapshots on demand, as stored: what an operator asked ([`SnapshotRequest`], with its [`Slice`] of an
//! outbox table), kept in the state store's notes, and how far the running one got ([`OnDemandProgress`]),
//! kept in the checkpoint so that it moves only with the acknowledgements of the rows before it. The
//! snapshot itself is `pipeline::on_demand`'s.
//!
//! Floor 0, the ground floor (docs/ARCHITECTURE.md): imports nothing of ours but other ground-floor modules.

use serde::{Deserialize, Serialize};

use super::snapshot::SnapshotKey;

/// Which rows of the table a snapshot on demand reads: every condition given, together.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Slice {
    /// Rows of this aggregate type only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aggregate_type: Option<String>,
    /// Rows of this aggregate id only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aggregate_id: Option<String>,
    /// Rows whose `occurred_at` is at or after this (`YYYY-MM-DD HH:MM:SS[.ffffff]`, the column's zone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub occurred_from: Option<String>,
    /// Rows whose `occurred_at` is before this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub occurred_before: Option<String>,
    /// A condition on the outbox table's columns, as SQL (`status = 'paid'`): Debezium's
    /// `additional-conditions`.
    #[serde(default, rename = "where", skip_serializing_if = "Option::is_none")]
    pub condition: Option<String>,
}

impl Slice {
    /// Whether it selects the whole table.
    pub fn is_whole(&self) -> bool {
        self == &Slice::default()
    }
}

/// Where an operator's snapshot is. Running is not stored: it is the first queued one, in id order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RequestState {
    /// Waiting for its turn, or being read.
    Queued,
    /// Paused by an operator (`pause-snapshot`): resumes from its last acknowledged key.
    Paused,
    /// Cancelled by an operator: nothing more of it is read.
    Cancelled,
    /// Every row of its slice was published and acknowledged.
    Done,
    /// It could not be read (its condition no longer parses, the table is gone): `error` says why.
    Failed,
}

impl RequestState {
    /// Whether nothing more will be read for it.
    pub fn is_final(self) -> bool {
        matches!(self, RequestState::Cancelled | RequestState::Done | RequestState::Failed)
    }
}

/// An operator's snapshot on demand of one outbox table, or a slice of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRequest {
    /// `snap-<Unix ms, 13 digits>-<4 hex>`: ids sort in the order they were asked.
    pub id: String,
    /// The outbox table, `database.table`.
    pub table: String,
    /// Which rows.
    #[serde(default, skip_serializing_if = "Slice::is_whole")]
    pub slice: Slice,
    /// When it was asked (Unix ms).
    pub requested_at_ms: u64,
    /// What asked: `api`, `cli`, or `signal <its id>`.
    pub by: String,
    /// Where it is.
    pub state: RequestState,
    /// When it ended (done, cancelled, failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at_ms: Option<u64>,
    /// Rows published when it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<u64>,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl SnapshotRequest {
    /// A new request, queued, with an id made from `now_ms` and `salt` (any 16 bits).
    pub fn new(table: String, slice: Slice, by: &str, now_ms: u64, salt: u16) -> SnapshotRequest {
        SnapshotRequest {
            id: format!("snap-{now_ms:013}-{salt:04x}"),
            table,
            slice,
            requested_at_ms: now_ms,
            by: by.to_string(),
            state: RequestState::Queued,
            finished_at_ms: None,
            rows: None,
            error: None,
        }
    }

    /// A new request asked now, its id's salt from the time, this process and `n` (which tells apart the
    /// requests one caller makes in one millisecond).
    pub fn asked(table: String, slice: Slice, by: &str, n: u16) -> SnapshotRequest {
        let now = crate::time::now_ms();
        let salt = (now as u16).wrapping_add(n).rotate_left(5) ^ (std::process::id() as u16);
        SnapshotRequest::new(table, slice, by, now, salt)
    }

    /// Whether `id` is shaped like the ids [`SnapshotRequest::new`] makes (what a store key may hold).
    pub fn is_id(id: &str) -> bool {
        let Some(rest) = id.strip_prefix("snap-") else { return false };
        let Some((ms, salt)) = rest.split_once('-') else { return false };
        ms.len() == 13
            && ms.bytes().all(|b| b.is_ascii_digit())
            && salt.len() == 4
            && salt.bytes().all(|b| b.is_ascii_hexdigit())
    }

    /// It ended as `state` at `now_ms`, with `rows` published.
    pub fn finished(mut self, state: RequestState, now_ms: u64, rows: u64, error: Option<String>) -> SnapshotRequest {
        self.state = state;
        self.finished_at_ms = Some(now_ms);
        self.rows = Some(rows);
        self.error = error;
        self
    }
}

/// How far the snapshot on demand being read got, stored with the checkpoint: the key of the last row
/// whose chunk (and everything before it) Kafka acknowledged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OnDemandProgress {
    /// The request's id.
    pub id: String,
    /// The last acknowledged key; `None` before the first chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_key: Option<SnapshotKey>,
    /// Rows published so far.
    pub rows_done: u64,
    /// Every row of the slice is published (the request is marked done next).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub done: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ids sort as they were made, and only such ids are taken from a URL or a store key.
    #[test]
    fn ids_sort_by_time_and_are_recognised() {
        let a = SnapshotRequest::new("shop.outbox".into(), Slice::default(), "api", 1_765_000_000_000, 0xffff);
        let b = SnapshotRequest::new("shop.outbox".into(), Slice::default(), "api", 1_765_000_000_001, 0);
        assert!(a.id < b.id, "{} < {}", a.id, b.id);
        assert!(SnapshotRequest::is_id(&a.id), "{}", a.id);
        for bad in ["", "snap-", "snap-1-0000", "snap-176500000000x-0000", "snap-1765000000000-00g0", "x/../y"] {
            assert!(!SnapshotRequest::is_id(bad), "{bad}");
        }
    }

    /// The stored form: a whole-table slice is left out, `where` is the condition's name, unknown slice
    /// fields are refused (a misspelt `aggregate_typ` must not widen a slice to the whole table).
    #[test]
    fn the_stored_form() {
        let request = SnapshotRequest::new("shop.outbox".into(), Slice::default(), "cli", 1_765_000_000_000, 1);
        let json = serde_json::to_string(&request).unwrap();
        assert_eq!(
            json,
            r#"{"id":"snap-1765000000000-0001","table":"shop.outbox","requested_at_ms":1765000000000,"by":"cli","state":"queued"}"#
        );
        let slice: Slice = serde_json::from_str(r#"{"aggregate_type":"order","where":"total > 10"}"#).unwrap();
        assert_eq!(slice.condition.as_deref(), Some("total > 10"));
        assert!(serde_json::from_str::<Slice>(r#"{"aggregate_typ":"order"}"#).is_err());
    }
}
