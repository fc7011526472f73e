//! Checks a topic against what was committed: nothing lost, per-aggregate order kept, every
//! aggregate on one partition, duplicates counted.
//!
//! # Rules
//! - Records are read partition by partition in offset order; the event id is header `id`.
//! - Only the *first* occurrence of an id counts for order. A redelivery after a crash (an id seen
//!   again later) is a duplicate, never an order violation; a first occurrence of a later event of an
//!   aggregate before an earlier one is a violation.
//! - An uncertain id (its `COMMIT` failed, outcome unknown) may be absent; if present it must be in
//!   order like any other.

use super::broker::Received;
use std::collections::{BTreeMap, HashMap, HashSet};

/// What the topic must contain.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Expected {
    /// Event ids per aggregate id, in commit order.
    pub per_aggregate: BTreeMap<String, Vec<String>>,
    /// Ids whose commit outcome is unknown: not reported missing when absent.
    pub uncertain: HashSet<String>,
}

impl Expected {
    /// Builds the expectation from `(aggregate, ids in commit order)` pairs, none uncertain.
    pub fn from_orders<A, I, S>(orders: impl IntoIterator<Item = (A, I)>) -> Expected
    where
        A: Into<String>,
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Expected {
            per_aggregate: orders
                .into_iter()
                .map(|(a, ids)| (a.into(), ids.into_iter().map(Into::into).collect()))
                .collect(),
            uncertain: HashSet::new(),
        }
    }

    /// This expectation, then `later`'s: each aggregate's ids of `later` after its own.
    pub fn merged(&self, later: &Expected) -> Expected {
        let mut merged = self.clone();
        for (aggregate, ids) in &later.per_aggregate {
            merged.per_aggregate.entry(aggregate.clone()).or_default().extend(ids.iter().cloned());
        }
        merged.uncertain.extend(later.uncertain.iter().cloned());
        merged
    }

    /// Number of expected ids (uncertain ones included).
    pub fn len(&self) -> usize {
        self.per_aggregate.values().map(Vec::len).sum()
    }

    /// True when no id is expected.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The outcome of [`audit`]. `is_clean()` is the usual assertion; `duplicates` is allowed by an
/// at-least-once guarantee and checked separately by the tests that claim less.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AuditReport {
    /// Expected (certain) ids never received, sorted.
    pub missing: Vec<String>,
    /// Records whose id had been received before.
    pub duplicates: usize,
    /// One line per first occurrence that came before an earlier event of the same aggregate.
    pub order_violations: Vec<String>,
    /// One line per record without a usable `id` header or with an id nobody wrote.
    pub unexpected: Vec<String>,
    /// One line per aggregate whose records landed on more than one partition.
    pub split_aggregates: Vec<String>,
    /// One line per aggregate whose last record is not its last event: a late duplicate (a paused
    /// publisher's, sent after its successor's) that a consumer keeping the latest event per key ends on.
    /// Not part of [`AuditReport::is_clean`]; asserted by the scenarios that promise it.
    pub stale_tails: Vec<String>,
    /// Number of records audited.
    pub records: usize,
}

impl AuditReport {
    /// No loss, no reorder, nothing unexpected, no aggregate split across partitions (duplicates
    /// allowed).
    pub fn is_clean(&self) -> bool {
        self.missing.is_empty()
            && self.order_violations.is_empty()
            && self.unexpected.is_empty()
            && self.split_aggregates.is_empty()
    }

    /// A short human summary (first few entries of each list), for assertion messages.
    pub fn summary(&self) -> String {
        fn head(v: &[String]) -> String {
            let shown: Vec<&str> = v.iter().take(5).map(String::as_str).collect();
            let more = v.len().saturating_sub(5);
            if more > 0 {
                format!("{shown:?} (+{more} more)")
            } else {
                format!("{shown:?}")
            }
        }
        format!(
            "records={} missing={} {} duplicates={} order_violations={} {} unexpected={} {} split_aggregates={} {} \
             stale_tails={} {}",
            self.records,
            self.missing.len(),
            head(&self.missing),
            self.duplicates,
            self.order_violations.len(),
            head(&self.order_violations),
            self.unexpected.len(),
            head(&self.unexpected),
            self.split_aggregates.len(),
            head(&self.split_aggregates),
            self.stale_tails.len(),
            head(&self.stale_tails),
        )
    }
}

/// Audits `received` (any order; sorted here by partition, offset) against `expected`.
pub fn audit(expected: &Expected, received: &[Received]) -> AuditReport {
    // id -> (aggregate, position in the aggregate's commit order)
    let mut index: HashMap<&str, (&str, usize)> = HashMap::new();
    for (aggregate, ids) in &expected.per_aggregate {
        for (i, id) in ids.iter().enumerate() {
            index.insert(id.as_str(), (aggregate.as_str(), i));
        }
    }
    let mut records: Vec<&Received> = received.iter().collect();
    records.sort_by_key(|r| (r.partition, r.offset));

    let mut report = AuditReport { records: records.len(), ..AuditReport::default() };
    let mut seen: HashSet<&str> = HashSet::new();
    // aggregate -> (position, id, partition:offset) of the latest first occurrence, in commit order.
    let mut last: HashMap<&str, (usize, &str, String)> = HashMap::new();
    let mut partitions: BTreeMap<&str, std::collections::BTreeSet<i32>> = BTreeMap::new();
    // aggregate -> (position, partition:offset) of its last record, duplicates included.
    let mut tails: HashMap<&str, (usize, String)> = HashMap::new();

    for r in records {
        let at = format!("{}:{}", r.partition, r.offset);
        let Some(id) = r.header("id").and_then(|v| std::str::from_utf8(v).ok()) else {
            report.unexpected.push(format!("{at}: no utf-8 `id` header"));
            continue;
        };
        let Some(&(aggregate, pos)) = index.get(id) else {
            report.unexpected.push(format!("{at}: id {id} was never written"));
            continue;
        };
        partitions.entry(aggregate).or_default().insert(r.partition);
        tails.insert(aggregate, (pos, at.clone()));
        if !seen.insert(id) {
            report.duplicates += 1;
            continue;
        }
        match last.get(aggregate) {
            Some((prev_pos, prev_id, prev_at)) if *prev_pos > pos => {
                report.order_violations.push(format!(
                    "aggregate {aggregate}: event #{pos} ({id}) first seen at {at}, after event #{prev_pos} ({prev_id}) at {prev_at}"
                ));
            }
            _ => {
                last.insert(aggregate, (pos, id, at));
            }
        }
    }

    for (aggregate, ids) in &expected.per_aggregate {
        for id in ids {
            if !seen.contains(id.as_str()) && !expected.uncertain.contains(id) {
                report.missing.push(id.clone());
            }
        }
        if let Some(p) = partitions.get(aggregate.as_str()).filter(|p| p.len() > 1) {
            report.split_aggregates.push(format!("aggregate {aggregate} on partitions {p:?}"));
        }
        let last = ids.iter().rposition(|id| !expected.uncertain.contains(id));
        if let (Some(last), Some((pos, at))) = (last, tails.get(aggregate.as_str())) {
            if *pos < last {
                report
                    .stale_tails
                    .push(format!("aggregate {aggregate}: last record {at} is event #{pos}, not #{last}"));
            }
        }
    }
    report.missing.sort();
    report
}
