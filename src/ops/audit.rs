//! `outbox-cdc audit`: compares the outbox table with what Kafka holds, after an incident or at any time.
//!
//! Floor 6, the top (docs/ARCHITECTURE.md): may import anything below; nothing imports it but `main.rs`.
//!
//! # What it reports
//! - **missing**: rows of the audited window whose id is in no record of the routed topics (the promise is
//!   broken: exit status 1);
//! - **order violations**: within one aggregate (topic, aggregate type, aggregate id), the *first*
//!   occurrence of an event comes, in partition offset order, after the first occurrence of an event with a
//!   later `occurred_at` (exit status 1). A record seen again later (a redelivery after a crash) is a
//!   duplicate, never an order violation; equal `occurred_at` values cannot be ordered and are accepted.
//!   A table without `occurred_at` is ordered as its snapshot orders it: by its id when that is an integer
//!   (a larger id is a later event), and not at all otherwise: its events are then accepted in any order,
//!   and the report lists the table under **order not checked** with the reason (the verdict says so too;
//!   the exit status is 0 when nothing else is wrong);
//! - **split aggregates**: one aggregate's records on more than one partition (exit status 1: per-aggregate
//!   order cannot hold across partitions);
//! - **duplicates**: ids present more than once, with counts. At-least-once allows them (exit status 0);
//!   the connector's promise bounds them to events after the last checkpoint at each crash;
//! - records whose id is in the table but **outside the window** (`--since`, `--until`, `--where`, or
//!   committed after the audit's read view), and records whose id the table does **not have** (rows pruned
//!   by a cleanup job, or records another producer wrote). Reported, not errors.
//!
//! # How: bounded memory
//! 1. The table is read in one consistent read view (`START TRANSACTION WITH CONSISTENT SNAPSHOT`), in
//!    primary-key keyset chunks, and every row of the window is spilled to a temporary redb file:
//!    `id -> (aggregate, occurred_at, times seen)`. Reading the table *first* means every row in the view
//!    was committed before Kafka is read, so a caught-up connector has produced all of them.
//! 2. Every partition of every routed topic is read from the beginning with `isolation.level =
//!    read_committed`, by a group-less consumer (manual assignment, nothing committed), until it reached
//!    the high watermark taken at the start and then stayed quiet for `quiet_ms`. Each record looks its id
//!    up in the spill file; the per-aggregate order check keeps `aggregate -> last first-occurrence` in the
//!    spill file too. Ids not in the window go to a third spill table.
//! 3. One pass over the spill file yields missing and duplicated ids; the out-of-window ids are looked up
//!    in the table in batches to tell "outside the window" from "not in the table".
//!
//! Memory is the redb page cache (64 MiB), librdkafka's capped prefetch queue (8 MiB per partition), one
//! spill transaction of [`KAFKA_BATCH`] records and one chunk of rows or batch of ids; it does not grow with
//! the table (measured, debug build: peak RSS 185 MB at 200k rows and 240 MB at 1M rows, the difference
//! being the page cache filling up; 1M rows and records audited in 68 s on 2 idle cores). Disk use is about 150 bytes per row; the spill
//! directory is deleted at the end.
//!
//! # Which topics
//! Those the routing can produce to: the topic template rendered for every distinct `aggregate_type`
//! (and `event_type`, if the template uses it) in the table, or the topics given with `--topic`.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use rdkafka::config::ClientConfig;
use rdkafka::message::{Headers, Message};
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

use crate::config::{Config, KafkaConfig};
use crate::error::{classify_mysql, Error, Result};
use crate::kafka::identity::Context;
use crate::kafka::read::{Starts, ToEnd, Until};
use crate::ops::ids::IdColumn;
use crate::outbox::{quote_ident, TableName};
use crate::source::column_types::{text_sql, TypeFamily};
use crate::source::SourceConn;
use crate::topic::is_legal_topic;

/// Exit status of `outbox-cdc audit` when something is missing, out of order or split.
pub const EXIT_AUDIT_FAILED: i32 = 1;

/// Spilled table rows of the window: id -> [`RowEntry`].
const ROWS: TableDefinition<&str, &[u8]> = TableDefinition::new("rows");
/// Kafka ids not in the window: id -> [`ExtraEntry`].
const EXTRA: TableDefinition<&str, &[u8]> = TableDefinition::new("extra");
/// Per aggregate, the latest first occurrence so far: aggregate key -> [`LastEntry`].
const LAST: TableDefinition<&str, &[u8]> = TableDefinition::new("last");

/// Rows per keyset chunk of the table scan.
const SCAN_CHUNK: usize = 10_000;
/// Kafka records per spill-file transaction.
const KAFKA_BATCH: usize = 20_000;
/// Ids per point-lookup query for out-of-window records.
const LOOKUP_BATCH: usize = 500;
/// The spill file's page cache.
const CACHE_BYTES: usize = 64 * 1024 * 1024;
/// A partition below its high watermark that yields nothing for this long fails the audit (transient).
const STALL: Duration = Duration::from_secs(60);

/// What to audit.
#[derive(Debug, Clone)]
pub struct AuditOptions {
    /// Only rows with `occurred_at >= since` (a `DATETIME` literal such as `2026-11-30 10:00:00`).
    pub since: Option<String>,
    /// Only rows with `occurred_at < until`.
    pub until: Option<String>,
    /// Only rows matching this SQL condition.
    pub r#where: Option<String>,
    /// Read these topics instead of the ones the routing would use.
    pub topics: Vec<String>,
    /// At most this many ids/descriptions in each list of the report (counts are always complete).
    pub list_limit: usize,
    /// After reaching the high watermarks, the reading ends once no record arrived for this long.
    pub quiet_ms: u64,
    /// Directory for the temporary spill file (default: the system's temp directory).
    pub work_dir: Option<PathBuf>,
}

impl Default for AuditOptions {
    fn default() -> Self {
        AuditOptions {
            since: None,
            until: None,
            r#where: None,
            topics: Vec::new(),
            list_limit: 100,
            quiet_ms: 2_000,
            work_dir: None,
        }
    }
}

/// An id delivered more than once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Duplicate {
    /// Event id.
    pub id: String,
    /// Times it is in the topics.
    pub count: u32,
}

/// The result of an audit. Counts are complete; the lists stop at `list_limit` entries.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditReport {
    /// Topics read.
    pub topics: Vec<String>,
    /// Outbox tables scanned.
    pub tables: Vec<String>,
    /// The window, as given (`all rows` when none).
    pub window: String,
    /// Rows of the window in the table.
    pub table_rows: u64,
    /// Records read from Kafka.
    pub kafka_records: u64,
    /// Rows of the window whose id is in no record.
    pub missing: u64,
    /// Some of the missing ids.
    pub missing_ids: Vec<String>,
    /// Ids present more than once.
    pub duplicated_ids: u64,
    /// Records beyond the first of each id (the re-published ones).
    pub duplicate_records: u64,
    /// Some of the duplicated ids with their counts.
    pub duplicates: Vec<Duplicate>,
    /// First occurrences that came after a later event of the same aggregate.
    pub order_violations: u64,
    /// Some of them, described.
    pub order_violation_samples: Vec<String>,
    /// Tables without `occurred_at` whose events' order was checked by their integer id.
    #[serde(default)]
    pub order_by_id: Vec<String>,
    /// Tables whose events' order could not be checked (no `occurred_at`, no integer id), each with why.
    /// Their events count as in order: the audit passes without having checked it, and says so.
    #[serde(default)]
    pub order_not_checked: Vec<String>,
    /// Aggregates whose records are on more than one partition.
    pub split_aggregates: u64,
    /// Some of them, described.
    pub split_aggregate_samples: Vec<String>,
    /// Ids in Kafka and in the table, but outside the window (or committed after the audit's read view).
    pub outside_window: u64,
    /// Ids in Kafka that the table does not have (pruned rows, or records of another producer).
    pub not_in_table: u64,
    /// Some of them.
    pub not_in_table_ids: Vec<String>,
    /// Records without a UTF-8 `id` header.
    pub without_id: u64,
    /// How long the audit took.
    pub elapsed_ms: u64,
}

impl AuditReport {
    /// Nothing missing, nothing out of order, no aggregate split (duplicates are allowed).
    pub fn passed(&self) -> bool {
        self.missing == 0 && self.order_violations == 0 && self.split_aggregates == 0
    }
}

impl fmt::Display for AuditReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn more(shown: usize, total: u64) -> String {
            if total > shown as u64 {
                format!(" (first {shown} shown)")
            } else {
                String::new()
            }
        }
        writeln!(f, "audit of {} ({}) against {}", self.tables.join(", "), self.window, self.topics.join(", "))?;
        writeln!(f, "  table rows audited:            {}", self.table_rows)?;
        writeln!(f, "  kafka records read:            {}", self.kafka_records)?;
        writeln!(f, "  missing from kafka:            {}", self.missing)?;
        for id in &self.missing_ids {
            writeln!(f, "    missing {id}")?;
        }
        writeln!(
            f,
            "  duplicated ids:                {} ({} extra records; allowed: at-least-once){}",
            self.duplicated_ids,
            self.duplicate_records,
            more(self.duplicates.len(), self.duplicated_ids)
        )?;
        writeln!(f, "  per-aggregate order violations: {}", self.order_violations)?;
        for v in &self.order_violation_samples {
            writeln!(f, "    {v}")?;
        }
        for t in &self.order_by_id {
            writeln!(f, "    order in {t} checked by id (it has no occurred_at)")?;
        }
        for why in &self.order_not_checked {
            writeln!(f, "    order NOT CHECKED in {why}")?;
        }
        writeln!(f, "  aggregates split over partitions: {}", self.split_aggregates)?;
        for v in &self.split_aggregate_samples {
            writeln!(f, "    {v}")?;
        }
        writeln!(f, "  in kafka, outside the window:  {}", self.outside_window)?;
        writeln!(f, "  in kafka, not in the table:    {} (pruned rows or other producers)", self.not_in_table)?;
        if self.without_id > 0 {
            writeln!(f, "  records without an id header:  {}", self.without_id)?;
        }
        let verdict = if self.passed() { "PASSED" } else { "FAILED" };
        let unchecked = match self.order_not_checked.len() {
            0 => "",
            _ => " (per-aggregate order not checked in every table, see above)",
        };
        write!(f, "{verdict}{unchecked} in {:.1} s", self.elapsed_ms as f64 / 1000.0)
    }
}

/// A table row of the window, spilled.
#[derive(Debug, Serialize, Deserialize)]
struct RowEntry {
    /// Aggregate key (`aggregate_type` NUL `aggregate_id`).
    a: String,
    /// Where the row's event belongs in its aggregate's order, as text that sorts in that order
    /// ([`RowOrder`]): `occurred_at` as `YYYY-MM-DD HH:MM:SS.ffffff`, or an [`id_order_key`], or empty
    /// when the table says nothing about order.
    t: String,
    /// Times seen in Kafka.
    n: u32,
}

/// What orders one aggregate's events in a table's rows (the same rule as the snapshot's).
#[derive(Debug, Clone, PartialEq, Eq)]
enum RowOrder {
    /// The polling relay's sequence column (`source.kind = "poll"`, `[poll] order = "sequence"`): the order
    /// the relay promises, insertion order.
    Sequence(String),
    /// `occurred_at`.
    OccurredAt,
    /// No `occurred_at`, an integer id: the id.
    Id,
    /// Neither: the order is not checked, and the report says so.
    None,
}

/// Prefix of an [`id_order_key`]: no `occurred_at` text starts with it, so the two never compare.
const ID_ORDER_PREFIX: char = '#';

/// An integer id (as published, in decimal) as text that sorts in the integers' order: [`ID_ORDER_PREFIX`]
/// and the id's distance from BIGINT's minimum in 20 digits (which hold BIGINT UNSIGNED's maximum plus that
/// distance). `None` for text that is not such an integer.
fn id_order_key(id: &str) -> Option<String> {
    let n: i128 = id.parse().ok()?;
    let shifted = n - i128::from(i64::MIN);
    if !(0..=i128::from(u64::MAX) - i128::from(i64::MIN)).contains(&shifted) {
        return None;
    }
    Some(format!("{ID_ORDER_PREFIX}{shifted:020}"))
}

/// Whether the event at order key `key` belongs before the one at `earlier` in their aggregate. Keys of
/// different kinds (an `occurred_at` and an id, rows of two tables routed to one topic), and empty keys,
/// cannot be ordered and never are.
fn belongs_before(key: &str, earlier: &str) -> bool {
    let kind = |k: &str| k.chars().next().map(|c| c == ID_ORDER_PREFIX);
    kind(key).is_some() && kind(key) == kind(earlier) && key < earlier
}

/// How an order key reads in a report.
fn describe_order_key(key: &str) -> String {
    match key.strip_prefix(ID_ORDER_PREFIX) {
        Some(_) => "ordered by id: its table has no occurred_at".to_string(),
        None => format!("occurred_at {key}"),
    }
}

/// An out-of-window Kafka id, spilled.
#[derive(Debug, Serialize, Deserialize)]
struct ExtraEntry {
    n: u32,
}

/// The latest first occurrence of an aggregate so far.
#[derive(Debug, Serialize, Deserialize)]
struct LastEntry {
    t: String,
    id: String,
    p: i32,
    o: i64,
    /// The aggregate was already reported as split over partitions.
    #[serde(default)]
    s: bool,
}

fn spill_error(e: impl fmt::Display) -> Error {
    Error::definite(format!("audit spill file: {e} (is the temp directory full? see --work-dir)"))
}

fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).expect("spill entries serialize")
}

fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(spill_error)
}

/// Runs an audit.
///
/// # Errors
/// Classified database and Kafka errors (a broker or server that goes away mid-audit is transient: run it
/// again); a definite error when the spill file cannot be written.
pub async fn run(config: &Config, opts: &AuditOptions) -> Result<AuditReport> {
    let started = Instant::now();
    let tables = config.tables().to_vec();
    let source = SourceConn::from_config(config)?;
    let mut conn = source.connect().await?;
    let topics =
        if opts.topics.is_empty() { routed_topics(config, &tables, &mut conn).await? } else { opts.topics.clone() };
    let dir = match &opts.work_dir {
        Some(d) => tempfile::Builder::new().prefix("outbox-cdc-audit-").tempdir_in(d),
        None => tempfile::Builder::new().prefix("outbox-cdc-audit-").tempdir(),
    }
    .map_err(spill_error)?;
    let db = Arc::new(
        Database::builder().set_cache_size(CACHE_BYTES).create(dir.path().join("audit.redb")).map_err(spill_error)?,
    );
    let tx = db.begin_write().map_err(spill_error)?;
    for table in [ROWS, EXTRA, LAST] {
        tx.open_table(table).map_err(spill_error)?;
    }
    tx.commit().map_err(spill_error)?;
    let mut report = AuditReport {
        topics: topics.clone(),
        tables: tables.iter().map(ToString::to_string).collect(),
        window: describe_window(opts),
        ..AuditReport::default()
    };
    tracing::info!(tables = ?report.tables, topics = ?topics, window = %report.window, "audit: scanning the table");
    // Before the scan: a missing secret is found before the table is read.
    let consumer_config = consumer_config(&config.kafka)?;
    let context = Context::of(&config.kafka)?;
    report.table_rows = scan_table(config, opts, &tables, &mut conn, &db, &mut report).await?;

    tracing::info!(rows = report.table_rows, "audit: reading Kafka");
    let (db2, limit, quiet) = (db.clone(), opts.list_limit, Duration::from_millis(opts.quiet_ms));
    let mut kafka =
        tokio::task::spawn_blocking(move || read_kafka(&consumer_config, context, &topics, &db2, limit, quiet))
            .await
            .map_err(|e| Error::definite(format!("audit Kafka reader panicked: {e}")))??;
    report.kafka_records = kafka.records;
    report.order_violations = kafka.order_violations;
    report.order_violation_samples = std::mem::take(&mut kafka.order_samples);
    report.split_aggregates = kafka.split;
    report.split_aggregate_samples = std::mem::take(&mut kafka.split_samples);
    report.without_id = kafka.without_id;

    tracing::info!(records = report.kafka_records, "audit: comparing");
    tally_rows(&db, opts.list_limit, &mut report)?;
    classify_extras(opts, &tables, &config.outbox.columns.id, &mut conn, &db, &mut report).await?;
    let _ = conn.disconnect().await;
    drop(db);
    report.elapsed_ms = started.elapsed().as_millis() as u64;
    Ok(report)
}

fn describe_window(opts: &AuditOptions) -> String {
    let mut parts = Vec::new();
    if let Some(s) = &opts.since {
        parts.push(format!("occurred_at >= {s}"));
    }
    if let Some(u) = &opts.until {
        parts.push(format!("occurred_at < {u}"));
    }
    if let Some(w) = &opts.r#where {
        parts.push(format!("({w})"));
    }
    if parts.is_empty() {
        "all rows".into()
    } else {
        parts.join(" AND ")
    }
}

/// The topics the routing produces to for the rows in the table.
pub async fn routed_topics(config: &Config, tables: &[TableName], conn: &mut Conn) -> Result<Vec<String>> {
    let template = config.topic().clone();
    let c = &config.outbox.columns;
    let (by_type, by_event) = template.uses_columns();
    let mut topics = std::collections::BTreeSet::new();
    for t in tables {
        let pairs: Vec<(String, String)> = match (by_type, by_event) {
            (_, true) => {
                let sql = format!(
                    "SELECT DISTINCT {}, {} FROM {}",
                    quote_ident(&c.aggregate_type),
                    quote_ident(&c.event_type),
                    t.quoted()
                );
                conn.query(sql).await
            }
            (true, false) => {
                let sql = format!("SELECT DISTINCT {}, '' FROM {}", quote_ident(&c.aggregate_type), t.quoted());
                conn.query(sql).await
            }
            (false, false) => Ok(vec![(String::new(), String::new())]),
        }
        .map_err(|e| classify_mysql(&e).context(format_args!("listing the routed topics of {t}")))?;
        for (aggregate_type, event_type) in pairs {
            let topic = template.render_parts(t, &aggregate_type, &event_type);
            if is_legal_topic(&topic) {
                topics.insert(topic);
            }
        }
    }
    Ok(topics.into_iter().collect())
}

fn window_conditions(opts: &AuditOptions, occurred_at: &str) -> (Vec<String>, Vec<mysql_async::Value>) {
    let mut conditions = Vec::new();
    let mut params: Vec<mysql_async::Value> = Vec::new();
    if let Some(s) = &opts.since {
        conditions.push(format!("{occurred_at} >= ?"));
        params.push(s.clone().into());
    }
    if let Some(u) = &opts.until {
        conditions.push(format!("{occurred_at} < ?"));
        params.push(u.clone().into());
    }
    if let Some(w) = &opts.r#where {
        conditions.push(format!("({w})"));
    }
    (conditions, params)
}

/// Phase 1: the window's rows into the spill file, in one read view. Returns the row count.
async fn scan_table(
    config: &Config,
    opts: &AuditOptions,
    tables: &[TableName],
    conn: &mut Conn,
    db: &Database,
    report: &mut AuditReport,
) -> Result<u64> {
    let c = &config.outbox.columns;
    let q = |e: mysql_async::Error| classify_mysql(&e).context("audit table scan");
    conn.query_drop("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ").await.map_err(q)?;
    conn.query_drop("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY").await.map_err(q)?;
    let mut estimate = 0;
    for t in tables {
        let rows: Option<Option<u64>> = conn
            .exec_first(
                "SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
                (&t.database, &t.table),
            )
            .await
            .map_err(q)?;
        estimate += rows.flatten().unwrap_or(0);
    }
    let progress = crate::progress::Progress::labelled("audit: table", "rows", estimate, 0);
    let (id, at) = (quote_ident(&c.id), quote_ident(&c.occurred_at));
    let mut total = 0u64;
    for t in tables {
        // A table without occurred_at (an optional column) has no time to window on (--since/--until are
        // refused) nor to order by: its events are ordered by an integer id, as its snapshot orders them,
        // and not at all otherwise, which the report says (see the module documentation).
        let roles = crate::source::snapshot::role_columns(conn, t, c).await?;
        let has_occurred_at = roles[7].is_some();
        let id_column = IdColumn::require(conn, t, &c.id).await?;
        let sequence = match (&config.source.kind, config.poll.order) {
            (crate::config::Source::Poll(_), crate::config::PollOrder::Sequence) => {
                let found = crate::relay::columns_of(conn, t).await?;
                match crate::relay::order_key(&found, c, config.poll.order) {
                    Some(crate::relay::OrderKey::Sequence(column)) => Some(column),
                    _ => None,
                }
            }
            _ => None,
        };
        let order = match (sequence, has_occurred_at, id_column.family) {
            (Some(column), _, _) => RowOrder::Sequence(column),
            (None, true, _) => RowOrder::OccurredAt,
            (None, false, Some(TypeFamily::Integer)) => {
                report.order_by_id.push(t.to_string());
                RowOrder::Id
            }
            (None, false, _) => {
                report.order_not_checked.push(format!(
                    "{t}: it has no `{}` column and its id `{}` is {}, not an integer, so nothing in a row says \
                     in which order its aggregate's events were written",
                    c.occurred_at, id_column.name, id_column.sql_type
                ));
                RowOrder::None
            }
        };
        // Ids as the connector publishes them (a BINARY(16) as UUID text, an integer as digits).
        let text_of = |slot: usize, name: &str| match roles[slot].flatten() {
            Some(family) => text_sql(family, &quote_ident(name)),
            None => quote_ident(name),
        };
        let (id_text, aggregate_id_text) = (text_of(0, &c.id), text_of(2, &c.aggregate_id));
        if !has_occurred_at && (opts.since.is_some() || opts.until.is_some()) {
            return Err(Error::definite(format!(
                "--since/--until select rows by occurred_at, and {t} has no `{}` column; select with --where",
                c.occurred_at
            )));
        }
        // The order key as text that sorts like it: a sequence number zero-padded to 20 digits.
        let at_text = match (&order, has_occurred_at) {
            (RowOrder::Sequence(column), _) => format!("LPAD(CAST({} AS CHAR), 20, '0')", quote_ident(column)),
            (_, true) => format!("DATE_FORMAT({at}, '%Y-%m-%d %H:%i:%s.%f')"),
            (_, false) => "NULL".to_string(),
        };
        let mut after: Option<String> = None;
        loop {
            let (mut conditions, mut params) = window_conditions(opts, &at);
            if let Some(a) = &after {
                // The keyset continues after the last id in the column's own order (ORDER BY {id}): its
                // text back to the column's value.
                let value = id_column.value(a).map_err(|why| {
                    Error::definite(format!("audit scan of {t}: the id {a:?} the server printed: {why}"))
                })?;
                conditions.push(format!("{id} > ?"));
                params.push(value.param());
            }
            let filter =
                if conditions.is_empty() { String::new() } else { format!(" WHERE {}", conditions.join(" AND ")) };
            let sql = format!(
                "SELECT {id_text}, {}, {aggregate_id_text}, {at_text} FROM {}{filter} ORDER BY {id} LIMIT {SCAN_CHUNK}",
                quote_ident(&c.aggregate_type),
                t.quoted()
            );
            let rows: Vec<(String, String, String, Option<String>)> = conn
                .exec(sql, params)
                .await
                .map_err(|e| classify_mysql(&e).context(format_args!("audit scan of {t}")))?;
            let Some(last) = rows.last() else { break };
            after = Some(last.0.clone());
            let mut tx = db.begin_write().map_err(spill_error)?;
            tx.set_durability(Durability::None).map_err(spill_error)?;
            {
                let mut table = tx.open_table(ROWS).map_err(spill_error)?;
                for (id, aggregate_type, aggregate_id, occurred_at) in &rows {
                    let t = match &order {
                        RowOrder::Sequence(_) | RowOrder::OccurredAt => occurred_at.clone().unwrap_or_default(),
                        RowOrder::Id => id_order_key(id).unwrap_or_default(),
                        RowOrder::None => String::new(),
                    };
                    let entry = RowEntry { a: format!("{aggregate_type}\u{0}{aggregate_id}"), t, n: 0 };
                    table.insert(id.as_str(), encode(&entry).as_slice()).map_err(spill_error)?;
                }
            }
            tx.commit().map_err(spill_error)?;
            total += rows.len() as u64;
            progress.set(total);
            if rows.len() < SCAN_CHUNK {
                break;
            }
        }
    }
    progress.finish(total);
    conn.query_drop("COMMIT").await.map_err(q)?;
    Ok(total)
}

/// The reader's librdkafka settings: the connector's connection and security properties (its secrets
/// read as `run` reads them), no group offsets, only committed records.
///
/// # Errors
/// A definite error when a secret's variable or file is missing.
fn consumer_config(kafka: &KafkaConfig) -> Result<ClientConfig> {
    let mut cfg = ClientConfig::new();
    for (k, v) in &kafka.resolved_properties()? {
        let connection =
            ["security.", "ssl.", "sasl.", "socket.", "client.", "broker."].iter().any(|p| k.starts_with(p));
        if connection {
            cfg.set(k, v);
        }
    }
    cfg.set("bootstrap.servers", &kafka.bootstrap_servers)
        .set("group.id", format!("outbox-cdc-audit-{}", std::process::id()))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "false")
        .set("fetch.wait.max.ms", "50")
        // librdkafka prefetches up to 64 MiB and 100k records per partition by default: cap it, so memory
        // does not grow with the number of partitions.
        .set("queued.max.messages.kbytes", "8192")
        .set("queued.min.messages", "2000");
    Ok(cfg)
}

/// What the Kafka pass found.
#[derive(Debug, Default)]
struct KafkaPass {
    records: u64,
    without_id: u64,
    order_violations: u64,
    order_samples: Vec<String>,
    split: u64,
    split_samples: Vec<String>,
}

/// Phase 2: every record of `topics`, partition offset order, checked against the spilled rows.
fn read_kafka(
    config: &ClientConfig,
    context: Context,
    topics: &[String],
    db: &Database,
    limit: usize,
    quiet: Duration,
) -> Result<KafkaPass> {
    let until = Until { quiet, stall: STALL };
    let reader = ToEnd::start(config, context, topics, &Starts::new(), until, "the routed topics")?;
    let mut reader = reader.if_lost(
        "the audit cannot judge what it did not read. Run it again: it reads what the topics still hold (rows \
         whose records retention removed are then reported missing; narrow the audit with --since)",
    );
    for topic in reader.missing() {
        tracing::warn!(topic, "topic does not exist: every row routed to it is missing");
    }
    let mut pass = KafkaPass::default();
    let progress = crate::progress::Progress::labelled("audit: kafka", "records", reader.estimate(), 0);
    let topic_index: HashMap<&str, usize> = topics.iter().enumerate().map(|(i, t)| (t.as_str(), i)).collect();
    let mut done = false;
    while !done {
        let mut tx = db.begin_write().map_err(spill_error)?;
        tx.set_durability(Durability::None).map_err(spill_error)?;
        {
            let mut rows = tx.open_table(ROWS).map_err(spill_error)?;
            let mut extra = tx.open_table(EXTRA).map_err(spill_error)?;
            let mut last = tx.open_table(LAST).map_err(spill_error)?;
            let mut in_batch = 0;
            while in_batch < KAFKA_BATCH {
                match reader.next_record()? {
                    Some(m) => {
                        in_batch += 1;
                        pass.records += 1;
                        let id = m.headers().and_then(|h| {
                            h.iter()
                                .find(|h| h.key == "id")
                                .and_then(|h| h.value)
                                .and_then(|v| std::str::from_utf8(v).ok())
                        });
                        let Some(id) = id else {
                            pass.without_id += 1;
                            continue;
                        };
                        let topic = topic_index.get(m.topic()).copied().unwrap_or(usize::MAX);
                        let found = rows.get(id).map_err(spill_error)?.map(|g| g.value().to_vec());
                        let Some(bytes) = found else {
                            let n = match extra.get(id).map_err(spill_error)? {
                                Some(g) => decode::<ExtraEntry>(g.value())?.n + 1,
                                None => 1,
                            };
                            extra.insert(id, encode(&ExtraEntry { n }).as_slice()).map_err(spill_error)?;
                            continue;
                        };
                        let mut entry: RowEntry = decode(&bytes)?;
                        entry.n += 1;
                        rows.insert(id, encode(&entry).as_slice()).map_err(spill_error)?;
                        if entry.n > 1 {
                            continue; // a redelivery: a duplicate, never an order violation
                        }
                        let key = format!("{topic}\u{0}{}", entry.a);
                        let previous = last.get(key.as_str()).map_err(spill_error)?.map(|g| g.value().to_vec());
                        let (partition, offset) = (m.partition(), m.offset());
                        let aggregate = entry.a.replace('\u{0}', "/");
                        let mut split = false;
                        if let Some(prev) = previous {
                            let mut prev: LastEntry = decode(&prev)?;
                            if prev.p != partition {
                                // Order across partitions is undefined: the split itself is the finding,
                                // reported once per aggregate.
                                if !prev.s {
                                    pass.split += 1;
                                    if pass.split_samples.len() < limit {
                                        pass.split_samples.push(format!(
                                            "aggregate {aggregate} in {}: {id} at partition {partition}, {} at partition {}",
                                            m.topic(),
                                            prev.id,
                                            prev.p
                                        ));
                                    }
                                    prev.s = true;
                                    last.insert(key.as_str(), encode(&prev).as_slice()).map_err(spill_error)?;
                                }
                                continue;
                            }
                            if belongs_before(&entry.t, &prev.t) {
                                pass.order_violations += 1;
                                if pass.order_samples.len() < limit {
                                    pass.order_samples.push(format!(
                                        "aggregate {aggregate} in {}: {id} ({}) first at {partition}:{offset}, \
                                         after {} ({}) at {}:{}",
                                        m.topic(),
                                        describe_order_key(&entry.t),
                                        prev.id,
                                        describe_order_key(&prev.t),
                                        prev.p,
                                        prev.o
                                    ));
                                }
                                continue;
                            }
                            split = prev.s;
                        }
                        let value = LastEntry { t: entry.t, id: id.to_string(), p: partition, o: offset, s: split };
                        last.insert(key.as_str(), encode(&value).as_slice()).map_err(spill_error)?;
                    }
                    None => {
                        done = true;
                        break;
                    }
                }
            }
        }
        tx.commit().map_err(spill_error)?;
        progress.set(pass.records);
    }
    progress.finish(pass.records);
    Ok(pass)
}

/// Phase 3: missing and duplicated ids of the window.
fn tally_rows(db: &Database, limit: usize, report: &mut AuditReport) -> Result<()> {
    let tx = db.begin_read().map_err(spill_error)?;
    let rows = tx.open_table(ROWS).map_err(spill_error)?;
    for item in rows.iter().map_err(spill_error)? {
        let (id, value) = item.map_err(spill_error)?;
        let entry: RowEntry = decode(value.value())?;
        match entry.n {
            0 => {
                report.missing += 1;
                if report.missing_ids.len() < limit {
                    report.missing_ids.push(id.value().to_string());
                }
            }
            1 => {}
            n => {
                report.duplicated_ids += 1;
                report.duplicate_records += u64::from(n - 1);
                if report.duplicates.len() < limit {
                    report.duplicates.push(Duplicate { id: id.value().to_string(), count: n });
                }
            }
        }
    }
    Ok(())
}

/// Phase 4: Kafka ids outside the window: in the table after all, or not there.
async fn classify_extras(
    opts: &AuditOptions,
    tables: &[TableName],
    id_column: &str,
    conn: &mut Conn,
    db: &Database,
    report: &mut AuditReport,
) -> Result<()> {
    let mut id_columns = Vec::with_capacity(tables.len());
    for t in tables {
        id_columns.push(IdColumn::require(conn, t, id_column).await?);
    }
    let mut after: Option<String> = None;
    loop {
        let batch: Vec<(String, u32)> = {
            let tx = db.begin_read().map_err(spill_error)?;
            let extra = tx.open_table(EXTRA).map_err(spill_error)?;
            let range = match &after {
                Some(a) => extra.range::<&str>((std::ops::Bound::Excluded(a.as_str()), std::ops::Bound::Unbounded)),
                None => extra.range::<&str>(..),
            }
            .map_err(spill_error)?;
            let mut batch = Vec::with_capacity(LOOKUP_BATCH);
            for item in range.take(LOOKUP_BATCH) {
                let (id, value) = item.map_err(spill_error)?;
                batch.push((id.value().to_string(), decode::<ExtraEntry>(value.value())?.n));
            }
            batch
        };
        let Some(last) = batch.last() else { return Ok(()) };
        after = Some(last.0.clone());
        let mut present = std::collections::HashSet::new();
        for (t, column) in tables.iter().zip(&id_columns) {
            // Each id as the column's value (a UUID's bytes, an integer); one the column cannot hold is not
            // in this table. The ids come back as published.
            let values: Vec<mysql_async::Value> =
                batch.iter().filter_map(|(id, _)| column.value(id).ok()).map(|v| v.param()).collect();
            if values.is_empty() {
                continue;
            }
            let id = quote_ident(&column.name);
            let published = column.family.map_or_else(|| id.clone(), |family| text_sql(family, &id));
            let marks = vec!["?"; values.len()].join(",");
            let sql = format!("SELECT {published} FROM {} WHERE {id} IN ({marks})", t.quoted());
            let ids: Vec<String> = conn
                .exec(sql, values)
                .await
                .map_err(|e| classify_mysql(&e).context("audit: looking up ids outside the window"))?;
            present.extend(ids);
        }
        for (id, n) in batch {
            if n > 1 {
                report.duplicated_ids += 1;
                report.duplicate_records += u64::from(n - 1);
                if report.duplicates.len() < opts.list_limit {
                    report.duplicates.push(Duplicate { id: id.clone(), count: n });
                }
            }
            if present.contains(&id) {
                report.outside_window += 1;
            } else {
                report.not_in_table += 1;
                if report.not_in_table_ids.len() < opts.list_limit {
                    report.not_in_table_ids.push(id);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_order_keys_sort_as_the_integers_do() {
        let ids = ["-9223372036854775808", "-7", "0", "9", "10", "100", "9007199254740993", "18446744073709551615"];
        let keys: Vec<String> = ids.iter().map(|id| id_order_key(id).expect("an integer")).collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "{keys:?}");
        assert!(keys.iter().all(|k| k.len() == 21 && k.starts_with(ID_ORDER_PREFIX)), "{keys:?}");
        for not_an_id in ["", "a-1", "1.5", "18446744073709551616", "-9223372036854775809"] {
            assert_eq!(id_order_key(not_an_id), None, "{not_an_id:?}");
        }
    }

    #[test]
    fn only_keys_of_one_kind_are_ordered() {
        let (id9, id10) = (id_order_key("9").unwrap(), id_order_key("10").unwrap());
        assert!(belongs_before(&id9, &id10), "9 before 10, not as text");
        assert!(!belongs_before(&id10, &id9));
        let (early, late) = ("2026-11-30 10:00:00.000000", "2026-11-30 10:00:01.000000");
        assert!(belongs_before(early, late));
        assert!(!belongs_before(late, early));
        assert!(!belongs_before(early, early), "equal times cannot be ordered");
        assert!(!belongs_before(&id9, late) && !belongs_before(early, &id10), "a time and an id never compare");
        assert!(!belongs_before("", late) && !belongs_before(early, ""), "an unordered row never compares");
    }
}
