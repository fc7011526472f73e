//! Outbox rows, business transactions (one `orders` row + one outbox row, one transaction) and a
//! concurrent [`Writer`] that records what it committed, per aggregate, in commit order; and a
//! [`PatternWriter`] for the write patterns of `tests/relay_patterns.rs` (shared aggregates serialized by
//! their row lock, rollbacks, `INSERT IGNORE` duplicates, bulk inserts).
//!
//! # Invariants
//! - Each aggregate of a [`Writer`] is written by exactly one writer task, one transaction at a time, so
//!   "the order in which its commits returned" is a total order: the order the connector must keep.
//! - A [`PatternWriter`]'s aggregates are shared by its tasks; each transaction first locks its aggregate's
//!   row in `shop.aggregates` and bumps its version, so an aggregate's events are ordered by that version.
//! - A transaction whose `COMMIT` failed (e.g. the server was killed) may or may not be committed:
//!   its id stays in the order at the position it was attempted and is marked *uncertain*; resolve it
//!   against the database after a restart with [`Written::resolve_uncertain`].

use super::audit::Expected;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, TxOpts};
use rand::Rng;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::task::JoinHandle;

/// A random UUID-v4-shaped id (36 chars), as applications put in `outbox_events.id`.
pub fn new_event_id() -> String {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

/// The current UTC time as a `DATETIME(6)` literal, e.g. `2026-03-01 12:34:56.123456`.
pub fn now_datetime6() -> String {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock after 1970");
    let secs = since.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil-from-days (H. Hinnant), valid for all dates after 1970.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}.{:06}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        since.subsec_micros()
    )
}

/// One row of `shop.outbox_events`, with defaults for everything but the aggregate id.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxRow {
    /// Primary key and event id (header `id` on the Kafka record); default: random UUID-shaped.
    pub id: String,
    /// Routes the topic (`outbox.event.${aggregate_type}`); default `order`.
    pub aggregate_type: String,
    /// Kafka key and ordering unit.
    pub aggregate_id: String,
    /// Default `OrderCreated`.
    pub event_type: String,
    /// Default 1.
    pub schema_version: u16,
    /// JSON payload; default `{"aggregate_id": …}` ([`business_tx`] adds the order id).
    pub payload: Value,
    /// Optional JSON object of extra headers; default `None` (SQL NULL).
    pub headers: Option<Value>,
    /// `DATETIME(6)` literal; default now (UTC) with microseconds.
    pub occurred_at: String,
    /// `DATETIME(6)` literal; default = `occurred_at`.
    pub next_attempt_at: String,
}

impl OutboxRow {
    /// A row for `aggregate_id` with all defaults.
    pub fn new(aggregate_id: impl Into<String>) -> Self {
        let aggregate_id = aggregate_id.into();
        let now = now_datetime6();
        OutboxRow {
            id: new_event_id(),
            aggregate_type: "order".to_owned(),
            payload: json!({ "aggregate_id": aggregate_id }),
            aggregate_id,
            event_type: "OrderCreated".to_owned(),
            schema_version: 1,
            headers: None,
            occurred_at: now.clone(),
            next_attempt_at: now,
        }
    }
    /// Sets the id.
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = id.into();
        self
    }
    /// Sets the aggregate type.
    pub fn aggregate_type(mut self, t: impl Into<String>) -> Self {
        self.aggregate_type = t.into();
        self
    }
    /// Sets the event type.
    pub fn event_type(mut self, t: impl Into<String>) -> Self {
        self.event_type = t.into();
        self
    }
    /// Sets the schema version.
    pub fn schema_version(mut self, v: u16) -> Self {
        self.schema_version = v;
        self
    }
    /// Sets the payload.
    pub fn payload(mut self, p: Value) -> Self {
        self.payload = p;
        self
    }
    /// Sets the headers JSON (`None` = SQL NULL).
    pub fn headers(mut self, h: Option<Value>) -> Self {
        self.headers = h;
        self
    }
    /// Sets `occurred_at` (a `DATETIME(6)` literal).
    pub fn occurred_at(mut self, t: impl Into<String>) -> Self {
        self.occurred_at = t.into();
        self
    }
}

/// Inserts `row` into `shop.outbox_events` on a connection or inside a transaction.
///
/// # Errors
/// The server's or the connection's error.
pub async fn insert_event<C: Queryable + Send>(conn: &mut C, row: &OutboxRow) -> Result<(), mysql_async::Error> {
    let params: Vec<mysql_async::Value> = vec![
        row.id.clone().into(),
        row.aggregate_type.clone().into(),
        row.aggregate_id.clone().into(),
        row.event_type.clone().into(),
        row.schema_version.into(),
        row.payload.to_string().into(),
        row.headers.as_ref().map(Value::to_string).into(),
        row.occurred_at.clone().into(),
        row.next_attempt_at.clone().into(),
    ];
    conn.exec_drop(
        "INSERT INTO shop.outbox_events (id, aggregate_type, aggregate_id, event_type, schema_version, \
         payload, headers, occurred_at, next_attempt_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        params,
    )
    .await
}

/// Why a business transaction failed, and whether it may nevertheless be committed.
#[derive(Debug)]
pub struct TxError {
    /// The event id that was being written.
    pub id: String,
    /// True when `COMMIT` itself failed: the outcome is unknown (check the table after a restart).
    /// False: the transaction was certainly rolled back.
    pub at_commit: bool,
    /// The underlying error.
    pub error: mysql_async::Error,
}

impl std::fmt::Display for TxError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let stage = if self.at_commit { "at COMMIT (outcome unknown)" } else { "before COMMIT" };
        write!(f, "business tx {} failed {stage}: {}", self.id, self.error)
    }
}

impl std::error::Error for TxError {}

/// One `orders` row plus `row` in the outbox, in one transaction. When `row.payload` is still the
/// default, it becomes `{"order_id", "customer", "amount", "aggregate_id"}` with the new order's id.
///
/// # Errors
/// [`TxError`], telling whether the failure happened at `COMMIT` (outcome unknown).
pub async fn business_tx_row(conn: &mut Conn, mut row: OutboxRow) -> Result<String, TxError> {
    let id = row.id.clone();
    let before = |error| TxError { id: id.clone(), at_commit: false, error };
    let mut tx = conn.start_transaction(TxOpts::default()).await.map_err(before)?;
    let (customer, cents) = {
        let mut rng = rand::rng();
        (format!("customer-{}", rng.random_range(0..10_000)), rng.random_range(100..1_000_000u32))
    };
    let amount = format!("{}.{:02}", cents / 100, cents % 100);
    tx.exec_drop(
        "INSERT INTO shop.orders (customer, amount, created_at) VALUES (?, ?, ?)",
        (&customer, &amount, &row.occurred_at),
    )
    .await
    .map_err(before)?;
    let order_id = tx.last_insert_id().unwrap_or_default();
    if row.payload == json!({ "aggregate_id": row.aggregate_id }) {
        row.payload = json!({
            "order_id": order_id, "customer": customer, "amount": amount, "aggregate_id": row.aggregate_id
        });
    }
    insert_event(&mut tx, &row).await.map_err(before)?;
    tx.commit().await.map_err(|error| TxError { id: id.clone(), at_commit: true, error })?;
    Ok(id)
}

/// One business transaction for `aggregate_id` with a default outbox row; returns the event id.
///
/// # Errors
/// [`TxError`] (see [`business_tx_row`]).
pub async fn business_tx(conn: &mut Conn, aggregate_id: &str) -> Result<String, TxError> {
    business_tx_row(conn, OutboxRow::new(aggregate_id)).await
}

/// What a [`Writer`] runs.
#[derive(Debug, Clone)]
pub struct WriterConfig {
    /// Concurrent tasks, each with its own connection and its own aggregates. Default 4.
    pub tasks: usize,
    /// Aggregates per task, written round-robin. Default 8.
    pub aggregates_per_task: usize,
    /// Stop after this many commits in total (uncertain ones included). Default 1000.
    pub max_events: usize,
    /// `aggregate_type` of every row (the topic is `outbox.event.<this>`). Default `order`.
    pub aggregate_type: String,
    /// Pause after each transaction, per task, to spread a workload over time. Default 0.
    pub pause: Duration,
    /// A task gives up (recording an error) when it cannot reconnect for this long. Default 120 s.
    pub reconnect_timeout: Duration,
    /// After each successful `COMMIT`, read `@@last_gtid` on the same connection and record it in
    /// [`Written::gtids`] (one extra round trip per transaction). Default false.
    pub record_gtids: bool,
}

impl Default for WriterConfig {
    fn default() -> Self {
        WriterConfig {
            tasks: 4,
            aggregates_per_task: 8,
            max_events: 1000,
            aggregate_type: "order".to_owned(),
            pause: Duration::ZERO,
            reconnect_timeout: Duration::from_secs(120),
            record_gtids: false,
        }
    }
}

/// What a [`Writer`] committed.
#[derive(Debug, Clone, Default)]
pub struct Written {
    /// Ids per aggregate in commit order, and ids whose commit outcome is unknown.
    pub expected: Expected,
    /// Errors seen (reconnects, rolled-back transactions, giving up), for diagnosis.
    pub errors: Vec<String>,
    /// Event id -> MariaDB GTID of its transaction (`domain-server-seq`, from `@@last_gtid`), only with
    /// [`WriterConfig::record_gtids`]. An id is absent when its commit was uncertain or the connection
    /// failed between `COMMIT` and the `SELECT`.
    pub gtids: HashMap<String, String>,
}

impl Written {
    /// Number of ids (uncertain ones included).
    pub fn len(&self) -> usize {
        self.expected.per_aggregate.values().map(Vec::len).sum()
    }

    /// True when nothing was written.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every id, uncertain ones included.
    pub fn ids(&self) -> Vec<String> {
        self.expected.per_aggregate.values().flatten().cloned().collect()
    }

    /// Looks the uncertain ids up in `shop.outbox_events`: present ones become certain, absent ones
    /// are removed. Afterwards `expected.uncertain` is empty.
    ///
    /// # Errors
    /// The query's error.
    pub async fn resolve_uncertain(&mut self, conn: &mut Conn) -> Result<(), mysql_async::Error> {
        let uncertain: Vec<String> = self.expected.uncertain.drain().collect();
        if uncertain.is_empty() {
            return Ok(());
        }
        let marks = vec!["?"; uncertain.len()].join(",");
        let present: HashSet<String> = conn
            .exec::<String, _, _>(format!("SELECT id FROM shop.outbox_events WHERE id IN ({marks})"), uncertain.clone())
            .await?
            .into_iter()
            .collect();
        let absent: HashSet<&String> = uncertain.iter().filter(|id| !present.contains(*id)).collect();
        for ids in self.expected.per_aggregate.values_mut() {
            ids.retain(|id| !absent.contains(id));
        }
        Ok(())
    }
}

/// Concurrent business transactions until stopped or `max_events` commits; see the module docs.
pub struct Writer {
    /// Set to stop the tasks after their current transaction.
    stop: Arc<AtomicBool>,
    /// Commits so far (uncertain ones included).
    committed: Arc<AtomicUsize>,
    /// One per task.
    handles: Vec<JoinHandle<Written>>,
}

impl Writer {
    /// Spawns the tasks on the current tokio runtime, connecting with `opts`
    /// (e.g. [`super::MariaDb::opts_root`]).
    pub fn start(opts: Opts, cfg: WriterConfig) -> Writer {
        assert!(cfg.tasks > 0 && cfg.aggregates_per_task > 0, "a Writer needs tasks and aggregates");
        let stop = Arc::new(AtomicBool::new(false));
        let committed = Arc::new(AtomicUsize::new(0));
        let claimed = Arc::new(AtomicUsize::new(0));
        let run: String = format!("{:06x}", rand::rng().random_range(0..0x100_0000u32));
        let handles = (0..cfg.tasks)
            .map(|t| {
                let aggregates: Vec<String> =
                    (0..cfg.aggregates_per_task).map(|a| format!("{run}-t{t}-a{a}")).collect();
                let task = WriterTask {
                    opts: opts.clone(),
                    cfg: cfg.clone(),
                    aggregates,
                    stop: stop.clone(),
                    committed: committed.clone(),
                    claimed: claimed.clone(),
                };
                tokio::spawn(task.run())
            })
            .collect();
        Writer { stop, committed, handles }
    }

    /// Commits so far (uncertain ones included).
    pub fn committed(&self) -> usize {
        self.committed.load(Ordering::SeqCst)
    }

    /// Waits until at least `n` commits happened; false on timeout or when all tasks ended first.
    pub async fn wait_committed(&self, n: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while self.committed() < n {
            if Instant::now() >= deadline || self.handles.iter().all(JoinHandle::is_finished) {
                return self.committed() >= n;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    }

    /// Asks the tasks to stop after their current transaction (does not wait).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// Waits until the tasks end by themselves (`max_events` reached, or given up), then merges.
    pub async fn join(mut self) -> Written {
        let mut all = Written::default();
        for h in std::mem::take(&mut self.handles) {
            let w = h.await.expect("writer task panicked");
            all.expected.per_aggregate.extend(w.expected.per_aggregate);
            all.expected.uncertain.extend(w.expected.uncertain);
            all.errors.extend(w.errors);
            all.gtids.extend(w.gtids);
        }
        all
    }

    /// [`Writer::stop`] then [`Writer::join`].
    pub async fn finish(self) -> Written {
        self.stop();
        self.join().await
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

struct WriterTask {
    opts: Opts,
    cfg: WriterConfig,
    aggregates: Vec<String>,
    stop: Arc<AtomicBool>,
    committed: Arc<AtomicUsize>,
    claimed: Arc<AtomicUsize>,
}

impl WriterTask {
    async fn run(self) -> Written {
        let mut out = Written::default();
        for a in &self.aggregates {
            out.expected.per_aggregate.insert(a.clone(), Vec::new());
        }
        let mut conn: Option<Conn> = None;
        let mut next = 0usize;
        while !self.stop.load(Ordering::SeqCst) {
            let max = self.cfg.max_events;
            if self.claimed.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |c| (c < max).then_some(c + 1)).is_err() {
                break;
            }
            if conn.is_none() {
                conn = self.connect(&mut out).await;
            }
            let Some(c) = conn.as_mut() else {
                self.claimed.fetch_sub(1, Ordering::SeqCst);
                break; // stopped or gave up while reconnecting
            };
            let aggregate = &self.aggregates[next % self.aggregates.len()];
            let row = OutboxRow::new(aggregate.as_str()).aggregate_type(self.cfg.aggregate_type.as_str());
            match business_tx_row(c, row).await {
                Ok(id) => {
                    if self.cfg.record_gtids {
                        // A session variable: the GTID of this connection's last transaction.
                        match c.query_first::<String, _>("SELECT @@last_gtid").await {
                            Ok(Some(gtid)) => {
                                out.gtids.insert(id.clone(), gtid);
                            }
                            Ok(None) => out.errors.push(format!("no @@last_gtid after {id}")),
                            Err(e) => {
                                out.errors.push(format!("reading @@last_gtid after {id}: {e}"));
                                conn = None;
                            }
                        }
                    }
                    out.expected.per_aggregate.get_mut(aggregate).expect("own aggregate").push(id);
                    self.committed.fetch_add(1, Ordering::SeqCst);
                    next += 1;
                }
                Err(e) if e.at_commit => {
                    out.errors.push(e.to_string());
                    out.expected.per_aggregate.get_mut(aggregate).expect("own aggregate").push(e.id.clone());
                    out.expected.uncertain.insert(e.id);
                    self.committed.fetch_add(1, Ordering::SeqCst);
                    next += 1;
                    conn = None;
                }
                Err(e) => {
                    out.errors.push(e.to_string());
                    self.claimed.fetch_sub(1, Ordering::SeqCst);
                    conn = None;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            if !self.cfg.pause.is_zero() {
                tokio::time::sleep(self.cfg.pause).await;
            }
        }
        if let Some(c) = conn {
            let _ = c.disconnect().await;
        }
        out
    }

    /// Connects, retrying every 100 ms; `None` when stopped or after `reconnect_timeout`.
    async fn connect(&self, out: &mut Written) -> Option<Conn> {
        let started = Instant::now();
        loop {
            match Conn::new(self.opts.clone()).await {
                Ok(c) => return Some(c),
                Err(e) if started.elapsed() >= self.cfg.reconnect_timeout => {
                    out.errors.push(format!("writer gave up reconnecting after {:?}: {e}", started.elapsed()));
                    return None;
                }
                Err(_) => {}
            }
            if self.stop.load(Ordering::SeqCst) {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// How a [`PatternWriter`] transaction writes its events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InsertShape {
    /// One `INSERT` per event.
    OneByOne,
    /// Bulk inserts, each transaction at random: one multi-row `INSERT … VALUES` of all its events, or one
    /// `INSERT … SELECT` from MariaDB's `seq_1_to_<n>` (a statement whose row count InnoDB does not know in
    /// advance: it reserves sequence numbers in growing chunks and loses the ones it did not use).
    Bulk,
}

/// What a [`PatternWriter`] runs: transactions on a shared pool of aggregates, each serialized by its
/// aggregate's row lock, as applications write them.
#[derive(Debug, Clone)]
pub struct PatternConfig {
    /// Concurrent tasks, each with its own connection. Default 4.
    pub tasks: usize,
    /// Aggregates in the pool (every task picks one at random per transaction, so several tasks write each
    /// aggregate). Default 64.
    pub aggregates: usize,
    /// Prefix of the aggregate ids (`<prefix><n>`); default a random run id and `-a`.
    pub aggregate_prefix: String,
    /// Stop after this many committed transactions in total. Default 1000.
    pub max_transactions: usize,
    /// Pause after each transaction, per task. Default 0.
    pub pause: Duration,
    /// Percentage of transactions rolled back after their outbox insert. Default 0.
    pub rollback_percent: u32,
    /// Percentage of transactions that, after their own events, `INSERT IGNORE` an event id already in the
    /// table (their own first one, or one committed before): ignored, it burns a sequence number. With it,
    /// every event insert is an `INSERT IGNORE`. Default 0.
    pub duplicate_percent: u32,
    /// Events per transaction, all of its aggregate. Default 1.
    pub events_per_tx: usize,
    /// How the events are inserted. Default [`InsertShape::OneByOne`].
    pub shape: InsertShape,
}

impl Default for PatternConfig {
    fn default() -> Self {
        PatternConfig {
            tasks: 4,
            aggregates: 64,
            aggregate_prefix: format!("{:06x}-a", rand::rng().random_range(0..0x100_0000u32)),
            max_transactions: 1000,
            pause: Duration::ZERO,
            rollback_percent: 0,
            duplicate_percent: 0,
            events_per_tx: 1,
            shape: InsertShape::OneByOne,
        }
    }
}

/// What a [`PatternWriter`] did.
#[derive(Debug, Clone, Default)]
pub struct Patterned {
    /// Per aggregate: each committed transaction's version of the aggregate row and its event ids, in
    /// the order the transaction inserted them.
    pub committed: BTreeMap<String, Vec<(u64, Vec<String>)>>,
    /// Event ids whose transaction rolled back: on purpose, or by an error before `COMMIT` (a deadlock).
    pub rolled_back: Vec<String>,
    /// `INSERT IGNORE`s of an id already in the table that the server ignored.
    pub ignored_duplicates: usize,
    /// Errors before `COMMIT` (the transaction rolled back), for diagnosis.
    pub errors: Vec<String>,
    /// Event ids whose `COMMIT` failed (outcome unknown).
    pub uncertain: Vec<String>,
}

impl Patterned {
    /// Committed transactions.
    pub fn transactions(&self) -> usize {
        self.committed.values().map(Vec::len).sum()
    }

    /// Committed events.
    pub fn events(&self) -> usize {
        self.committed.values().flatten().map(|(_, ids)| ids.len()).sum()
    }

    /// The committed events per aggregate in the order the aggregate's row lock gave them (by version):
    /// the order the relay must keep.
    pub fn expected(&self) -> Expected {
        let mut expected = Expected::default();
        for (aggregate, txs) in &self.committed {
            let mut txs = txs.clone();
            txs.sort_by_key(|(version, _)| *version);
            expected.per_aggregate.insert(aggregate.clone(), txs.into_iter().flat_map(|(_, ids)| ids).collect());
        }
        expected.uncertain.extend(self.uncertain.iter().cloned());
        expected
    }

    /// Merges another writer's record (distinct aggregates, or later transactions of the same ones).
    pub fn merge(&mut self, other: Patterned) {
        for (aggregate, txs) in other.committed {
            self.committed.entry(aggregate).or_default().extend(txs);
        }
        self.rolled_back.extend(other.rolled_back);
        self.ignored_duplicates += other.ignored_duplicates;
        self.errors.extend(other.errors);
        self.uncertain.extend(other.uncertain);
    }
}

/// The business table whose row each [`PatternWriter`] transaction locks first (`UPDATE … SET version =
/// version + 1`): writers of one aggregate are serialized by it, as an application's are by its
/// aggregate's row, so an aggregate's sequence numbers follow its versions.
pub const AGGREGATES_DDL: &str = "CREATE TABLE IF NOT EXISTS shop.aggregates (
 id VARCHAR(128) NOT NULL PRIMARY KEY, version BIGINT UNSIGNED NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4";

/// Creates [`AGGREGATES_DDL`] and a row for each of `ids` (version 0; existing rows kept).
///
/// # Errors
/// The server's error.
pub async fn create_aggregates(conn: &mut Conn, ids: &[String]) -> Result<(), mysql_async::Error> {
    conn.query_drop(AGGREGATES_DDL).await?;
    for chunk in ids.chunks(500) {
        let values = vec!["(?, 0)"; chunk.len()].join(", ");
        conn.exec_drop(format!("INSERT IGNORE INTO shop.aggregates (id, version) VALUES {values}"), chunk.to_vec())
            .await?;
    }
    Ok(())
}

/// Locks `aggregate`'s business row (waiting behind any transaction that holds it) and returns its new
/// version.
///
/// # Errors
/// The server's error.
pub async fn lock_aggregate<C: Queryable + Send>(conn: &mut C, aggregate: &str) -> Result<u64, mysql_async::Error> {
    conn.exec_drop("UPDATE shop.aggregates SET version = version + 1 WHERE id = ?", (aggregate,)).await?;
    let version: Option<u64> =
        conn.exec_first("SELECT version FROM shop.aggregates WHERE id = ?", (aggregate,)).await?;
    Ok(version.unwrap_or_else(|| panic!("no row for aggregate {aggregate} in shop.aggregates")))
}

/// Inserts `rows` with one multi-row `INSERT` (`INSERT IGNORE` with `ignore`); returns the rows inserted.
///
/// # Errors
/// The server's error.
pub async fn insert_events<C: Queryable + Send>(
    conn: &mut C,
    rows: &[OutboxRow],
    ignore: bool,
) -> Result<u64, mysql_async::Error> {
    let mut params: Vec<mysql_async::Value> = Vec::with_capacity(rows.len() * 9);
    for row in rows {
        params.extend([
            row.id.clone().into(),
            row.aggregate_type.clone().into(),
            row.aggregate_id.clone().into(),
            row.event_type.clone().into(),
            row.schema_version.into(),
            row.payload.to_string().into(),
            row.headers.as_ref().map(Value::to_string).into(),
            row.occurred_at.clone().into(),
            row.next_attempt_at.clone().into(),
        ]);
    }
    let values = vec!["(?, ?, ?, ?, ?, ?, ?, ?, ?)"; rows.len()].join(", ");
    let result = conn
        .exec_iter(
            format!(
                "INSERT {}INTO shop.outbox_events (id, aggregate_type, aggregate_id, event_type, schema_version, \
                 payload, headers, occurred_at, next_attempt_at) VALUES {values}",
                if ignore { "IGNORE " } else { "" }
            ),
            params,
        )
        .await?;
    let inserted = result.affected_rows();
    result.drop_result().await?;
    Ok(inserted)
}

/// Inserts `n` events of `aggregate` with one `INSERT … SELECT … FROM seq_1_to_<n>`, ids `<prefix><NNNN>`
/// (`prefix` 32 characters, so each id is 36), in that order; returns the ids.
///
/// # Errors
/// The server's error.
pub async fn insert_events_selected<C: Queryable + Send>(
    conn: &mut C,
    aggregate: &str,
    version: u64,
    n: usize,
    ignore: bool,
) -> Result<Vec<String>, mysql_async::Error> {
    assert!((1..10_000).contains(&n), "1 to 9999 events per INSERT … SELECT");
    let prefix: String = new_event_id().chars().take(32).collect();
    let now = now_datetime6();
    conn.exec_drop(
        format!(
            "INSERT {}INTO shop.outbox_events (id, aggregate_type, aggregate_id, event_type, schema_version, \
             payload, headers, occurred_at, next_attempt_at) \
             SELECT CONCAT(?, LPAD(s.seq, 4, '0')), 'order', ?, 'OrderCreated', 1, \
             JSON_OBJECT('aggregate_id', ?, 'version', ?, 'n', s.seq), NULL, ?, ? FROM seq_1_to_{n} s ORDER BY s.seq",
            if ignore { "IGNORE " } else { "" }
        ),
        (&prefix, aggregate, aggregate, version, &now, &now),
    )
    .await?;
    Ok((1..=n).map(|i| format!("{prefix}{i:04}")).collect())
}

/// Concurrent transactions on shared aggregates, each serialized by its aggregate's row lock, with
/// rollbacks, duplicate `INSERT IGNORE`s and bulk inserts as [`PatternConfig`] asks; until stopped or
/// `max_transactions` committed. The order of an aggregate's events is its row's version order
/// ([`Patterned::expected`]), whatever order the commits returned in.
pub struct PatternWriter {
    /// Set to stop the tasks after their current transaction.
    stop: Arc<AtomicBool>,
    /// Committed transactions so far.
    committed: Arc<AtomicUsize>,
    /// One per task.
    handles: Vec<JoinHandle<Patterned>>,
    /// The aggregate ids of the pool.
    aggregates: Vec<String>,
}

impl PatternWriter {
    /// Creates the aggregates' business rows ([`create_aggregates`]), then spawns the tasks on the current
    /// tokio runtime, connecting with `opts`.
    ///
    /// # Panics
    /// When the business rows cannot be created.
    pub async fn start(opts: Opts, cfg: PatternConfig) -> PatternWriter {
        assert!(cfg.tasks > 0 && cfg.aggregates > 0 && cfg.events_per_tx > 0, "a PatternWriter needs work");
        let aggregates: Vec<String> = (0..cfg.aggregates).map(|a| format!("{}{a}", cfg.aggregate_prefix)).collect();
        let mut conn = Conn::new(opts.clone()).await.expect("connect to create the aggregates");
        create_aggregates(&mut conn, &aggregates).await.expect("create the aggregates' business rows");
        let _ = conn.disconnect().await;
        let stop = Arc::new(AtomicBool::new(false));
        let committed = Arc::new(AtomicUsize::new(0));
        let handles = (0..cfg.tasks)
            .map(|_| {
                let task = PatternTask {
                    opts: opts.clone(),
                    cfg: cfg.clone(),
                    aggregates: aggregates.clone(),
                    stop: stop.clone(),
                    committed: committed.clone(),
                };
                tokio::spawn(task.run())
            })
            .collect();
        PatternWriter { stop, committed, handles, aggregates }
    }

    /// The aggregate ids of the pool.
    pub fn aggregates(&self) -> &[String] {
        &self.aggregates
    }

    /// Committed transactions so far.
    pub fn committed(&self) -> usize {
        self.committed.load(Ordering::SeqCst)
    }

    /// Waits until at least `n` transactions committed; false on timeout or when all tasks ended first.
    pub async fn wait_committed(&self, n: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while self.committed() < n {
            if Instant::now() >= deadline || self.handles.iter().all(JoinHandle::is_finished) {
                return self.committed() >= n;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    }

    /// Asks the tasks to stop after their current transaction (does not wait).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// Waits until the tasks end by themselves (`max_transactions` reached), then merges.
    pub async fn join(mut self) -> Patterned {
        let mut all = Patterned::default();
        for h in std::mem::take(&mut self.handles) {
            all.merge(h.await.expect("pattern writer task panicked"));
        }
        all
    }

    /// [`PatternWriter::stop`] then [`PatternWriter::join`].
    pub async fn finish(self) -> Patterned {
        self.stop();
        self.join().await
    }
}

impl Drop for PatternWriter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

struct PatternTask {
    opts: Opts,
    cfg: PatternConfig,
    aggregates: Vec<String>,
    stop: Arc<AtomicBool>,
    committed: Arc<AtomicUsize>,
}

/// What one [`PatternTask`] transaction left behind.
enum Outcome {
    Committed { version: u64, ids: Vec<String> },
    RolledBack(Vec<String>),
}

impl PatternTask {
    async fn run(self) -> Patterned {
        let mut out = Patterned::default();
        let mut conn: Option<Conn> = None;
        // Ids this task committed, for duplicates of earlier events.
        let mut earlier: Vec<(String, String)> = Vec::new();
        while !self.stop.load(Ordering::SeqCst) && self.committed.load(Ordering::SeqCst) < self.cfg.max_transactions {
            if conn.is_none() {
                match Conn::new(self.opts.clone()).await {
                    Ok(c) => conn = Some(c),
                    Err(e) => {
                        out.errors.push(format!("connect: {e}"));
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                }
            }
            let c = conn.as_mut().expect("connected above");
            let (aggregate, roll_back, duplicate, bulk_select) = {
                let mut rng = rand::rng();
                (
                    self.aggregates[rng.random_range(0..self.aggregates.len())].clone(),
                    rng.random_range(0..100) < self.cfg.rollback_percent,
                    rng.random_range(0..100) < self.cfg.duplicate_percent,
                    rng.random_bool(0.5),
                )
            };
            let duplicate_of = match duplicate {
                true => earlier.iter().rev().find(|(a, _)| *a == aggregate).map(|(_, id)| id.clone()),
                false => None,
            };
            let attempt = self.transaction(c, &aggregate, roll_back, (duplicate, duplicate_of), bulk_select, &mut out);
            match attempt.await {
                Ok(Outcome::Committed { version, ids }) => {
                    earlier.extend(ids.iter().map(|id| (aggregate.clone(), id.clone())));
                    if earlier.len() > 1_000 {
                        earlier.drain(..500);
                    }
                    out.committed.entry(aggregate).or_default().push((version, ids));
                    self.committed.fetch_add(1, Ordering::SeqCst);
                }
                Ok(Outcome::RolledBack(ids)) => out.rolled_back.extend(ids),
                Err((ids, at_commit, e)) => {
                    match at_commit {
                        true => out.uncertain.extend(ids),
                        false => out.rolled_back.extend(ids),
                    }
                    out.errors.push(format!(
                        "{} transaction of {aggregate}: {e}",
                        if at_commit { "COMMIT of a" } else { "a" }
                    ));
                    conn = None;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            if !self.cfg.pause.is_zero() {
                tokio::time::sleep(self.cfg.pause).await;
            }
        }
        if let Some(c) = conn {
            let _ = c.disconnect().await;
        }
        out
    }

    /// One transaction: lock the aggregate's row, insert its events (and a duplicate), commit or roll back.
    /// An error returns the ids it was writing, whether it happened at `COMMIT`, and the error.
    async fn transaction(
        &self,
        conn: &mut Conn,
        aggregate: &str,
        roll_back: bool,
        (duplicate, duplicate_of): (bool, Option<String>),
        bulk_select: bool,
        out: &mut Patterned,
    ) -> Result<Outcome, (Vec<String>, bool, mysql_async::Error)> {
        let ignore = self.cfg.duplicate_percent > 0;
        let mut ids: Vec<String> = Vec::new();
        let mut tx = conn.start_transaction(TxOpts::default()).await.map_err(|e| (Vec::new(), false, e))?;
        let version = lock_aggregate(&mut tx, aggregate).await.map_err(|e| (Vec::new(), false, e))?;
        let n = self.cfg.events_per_tx;
        let rows: Vec<OutboxRow> = (0..n)
            .map(|i| {
                OutboxRow::new(aggregate).payload(json!({ "aggregate_id": aggregate, "version": version, "n": i + 1 }))
            })
            .collect();
        let inserted = match (self.cfg.shape, bulk_select) {
            (InsertShape::Bulk, true) => {
                insert_events_selected(&mut tx, aggregate, version, n, ignore).await.map(|s| {
                    ids = s;
                })
            }
            (InsertShape::Bulk, false) => {
                ids = rows.iter().map(|r| r.id.clone()).collect();
                insert_events(&mut tx, &rows, ignore).await.map(drop)
            }
            (InsertShape::OneByOne, _) => {
                let mut result = Ok(());
                for row in &rows {
                    ids.push(row.id.clone());
                    if let Err(e) = insert_events(&mut tx, std::slice::from_ref(row), ignore).await {
                        result = Err(e);
                        break;
                    }
                }
                result
            }
        };
        inserted.map_err(|e| (ids.clone(), false, e))?;
        if duplicate {
            // A retried command: its event id again (one committed before, else this transaction's first).
            let id = duplicate_of.unwrap_or_else(|| ids[0].clone());
            let again = OutboxRow::new(aggregate).id(id);
            let inserted = insert_events(&mut tx, &[again], true).await.map_err(|e| (ids.clone(), false, e))?;
            assert_eq!(inserted, 0, "INSERT IGNORE of an id already in the table inserted a row");
            out.ignored_duplicates += 1;
        }
        if roll_back {
            tx.rollback().await.map_err(|e| (ids.clone(), false, e))?;
            return Ok(Outcome::RolledBack(ids));
        }
        tx.commit().await.map_err(|e| (ids.clone(), true, e))?;
        Ok(Outcome::Committed { version, ids })
    }
}
