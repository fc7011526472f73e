//! Telemetry as a contract: every metric name is a constant in [`names`], documented in the README, and
//! `tests/operate.rs` asserts that `/metrics` exposes each of them.
//!
//! Floor 1 (docs/ARCHITECTURE.md): imports only the ground floor.
//!
//! One process-wide [`Metrics`] ([`metrics()`]) is updated where things happen (reader, router, sink
//! callbacks, checkpointer) and rendered by the HTTP endpoint ([`crate::http`]). Updates are atomics; a
//! labelled series is found through a read-locked `&str` map, so the per-event path does not allocate.
//!
//! # Labels
//! `topic`, `partition`, `aggregate_type` and error `kind` only: all bounded by configuration and schema.
//! Never an aggregate id or an event id (unbounded cardinality).
//!
//! # Time-derived gauges
//! Lag and age gauges are computed when scraped from the timestamps recorded here, so they keep growing
//! while the pipeline is stuck instead of freezing at the last value it reported.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{OnceLock, RwLock};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::health::health;
use crate::time::now_ms;

/// Metric names as exposed (counters get the `_total` suffix from the encoder).
pub mod names {
    /// Gauge: seconds between now and the commit time of the last source transaction read; 0 when the
    /// reader is at the end of the server's binlog (a heartbeat arrived after the last transaction).
    pub const SOURCE_SECONDS_BEHIND: &str = "outbox_cdc_source_seconds_behind";
    /// Gauge: commit time of the last transaction read minus that of the checkpointed one, in seconds.
    pub const CHECKPOINT_LAG_SECONDS: &str = "outbox_cdc_checkpoint_lag_seconds";
    /// Gauge: seconds since the checkpoint was last written.
    pub const CHECKPOINT_AGE_SECONDS: &str = "outbox_cdc_checkpoint_age_seconds";
    /// Counter by `topic`: outbox events read from the source (binlog or snapshot).
    pub const EVENTS_READ: &str = "outbox_cdc_events_read";
    /// Counter by `topic`: records handed to the producer.
    pub const EVENTS_PRODUCED: &str = "outbox_cdc_events_produced";
    /// Counter by `topic`: records acknowledged by Kafka.
    pub const EVENTS_ACKNOWLEDGED: &str = "outbox_cdc_events_acknowledged";
    /// Counter by `topic` and `partition`: acknowledged records per partition (hot partitions).
    pub const PARTITION_EVENTS: &str = "outbox_cdc_partition_events";
    /// Counter by `kind` (librdkafka error code name): failed deliveries.
    pub const PRODUCE_ERRORS: &str = "outbox_cdc_produce_errors";
    /// Counter: produce requests librdkafka retried (from its statistics).
    pub const PRODUCE_RETRIES: &str = "outbox_cdc_produce_retries";
    /// Counter by `class` (transient): pipeline restarts, each a reconnect to source and broker.
    pub const RECONNECTS: &str = "outbox_cdc_reconnects";
    /// Histogram by `aggregate_type`: seconds from the row's `occurred_at` (read as UTC) to Kafka's
    /// acknowledgement. Streamed rows only: snapshot rows are old by nature.
    pub const END_TO_END_LATENCY_SECONDS: &str = "outbox_cdc_end_to_end_latency_seconds";
    /// Gauge: bytes of records handed to the producer and not yet acknowledged, as the in-flight budget
    /// counts them (each record's bytes plus ~1 KB of librdkafka's overhead).
    pub const IN_FLIGHT_BYTES: &str = "outbox_cdc_in_flight_bytes";
    /// Deprecated: [`IN_FLIGHT_BYTES`] under its name before the unit-suffix convention, exposed with the
    /// same value for one release (see [`DEPRECATED`]).
    pub const BYTES_IN_FLIGHT: &str = "outbox_cdc_bytes_in_flight";
    /// Gauge: records handed to the producer and not yet acknowledged (queue depth).
    pub const RECORDS_IN_FLIGHT: &str = "outbox_cdc_records_in_flight";
    /// Gauge: rows the initial snapshot has produced.
    pub const SNAPSHOT_ROWS_DONE: &str = "outbox_cdc_snapshot_rows_done";
    /// Gauge: the snapshot's row estimate.
    pub const SNAPSHOT_ROWS_TOTAL: &str = "outbox_cdc_snapshot_rows_total";
    /// Gauge: 1 while a snapshot on demand is being read, else 0.
    pub const SNAPSHOT_ON_DEMAND_ACTIVE: &str = "outbox_cdc_snapshot_on_demand_active";
    /// Gauge: rows the snapshot on demand being read has produced.
    pub const SNAPSHOT_ON_DEMAND_ROWS: &str = "outbox_cdc_snapshot_on_demand_rows";
    /// Counter by `kind`: records sent to the dead-letter topic.
    pub const DEAD_LETTERS: &str = "outbox_cdc_dead_letters";
    /// Gauge: aggregates held in quarantine.
    pub const QUARANTINED_AGGREGATES: &str = "outbox_cdc_quarantined_aggregates";
    /// Gauge: seconds since the commit of the checkpointed transaction, 0 while that transaction is in the
    /// server's active binlog: an upper bound of how long ago the oldest binlog file the connector still
    /// needs was last written (that file was written at the commit or later), which is what binlog expiry
    /// compares with the retention (`crate::source::purge`).
    pub const BINLOG_NEEDED_AGE_SECONDS: &str = "outbox_cdc_binlog_needed_age_seconds";
    /// Gauge: bytes of the server's binlog files from the one holding the checkpoint to the newest.
    pub const BINLOG_NEEDED_BYTES: &str = "outbox_cdc_binlog_needed_bytes";
    /// Gauge: the server's binlog retention in seconds as its provider applies it (`binlog_expire_logs_seconds`
    /// / `expire_logs_days`; RDS and Aurora: `binlog retention hours`); 0 = never expires, 1 = purged as soon
    /// as possible (or a managed service's retention that could not be read).
    pub const BINLOG_RETENTION_SECONDS: &str = "outbox_cdc_binlog_retention_seconds";
    /// Gauge: needed age / retention; at 1 the server may purge what the connector still needs.
    pub const PURGE_RISK_RATIO: &str = "outbox_cdc_purge_risk_ratio";
    /// Gauge: 1 when connected to source and broker and not failed, else 0 (what `/readyz` reports).
    pub const READY: &str = "outbox_cdc_ready";
    /// Gauge, always 1, labelled `version` (the crate's) and `commit` (the git commit built, `unknown`
    /// when the build did not know it): which build runs where, e.g. `count by (version)`.
    pub const BUILD_INFO: &str = "outbox_cdc_build_info";
    /// Counter by `outcome` (`committed`, `aborted`): Kafka transactions of `exactly_once`, each holding
    /// whole source transactions and the checkpoint that covers them.
    pub const KAFKA_TRANSACTIONS: &str = "outbox_cdc_kafka_transactions";
    /// Histogram: seconds a Kafka transaction's commit took (`exactly_once`). The run reads on during the
    /// commit; the records it sends meanwhile are held (within `kafka.max_in_flight_bytes`) for the next
    /// transaction.
    pub const KAFKA_TRANSACTION_COMMIT_SECONDS: &str = "outbox_cdc_kafka_transaction_commit_seconds";
    /// Gauge: 1 while this instance holds its lease on the source server (the active one of an
    /// active/standby pair, see `crate::lease`), else 0.
    pub const LEASE_HELD: &str = "outbox_cdc_lease_held";
    /// Gauge: 1 while this instance waits as a standby for the lease (`[state] backend = "kafka"`): it is
    /// not ready by design, and healthy. 0 otherwise, also with the local backend, which has no lease.
    /// With [`LEASE_HELD`] it tells a standby from an instance that is not ready for a reason to act on.
    pub const STANDBY: &str = "outbox_cdc_standby";
    /// Gauge: 1 while an operator has paused the connector (`POST /v1/pause`, `outbox-cdc pause`): it reads
    /// and publishes nothing until resumed, by design; lag and readiness alerts leave it alone.
    pub const PAUSED: &str = "outbox_cdc_paused";

    // The polling relay (`source.kind = "poll"`); 0 (or absent labels) under the binlog source.
    /// Counter by `kind` (claim, mark, fail, park, renew, backlog): SQL statements the relay sent to the
    /// source database. `claim`: reads of unpublished rows (in order, of the sequence gaps, sweeps); `mark`:
    /// the `published_at` updates; `fail`: refused records counted in their rows; `park`; `backlog`: the
    /// backlog count and the read of parked rows. `renew` stays 0 (earlier relays leased rows).
    pub const POLL_QUERIES: &str = "outbox_cdc_poll_queries";
    /// Counter: rows the relay read and handed to the producer.
    pub const POLL_ROWS_CLAIMED: &str = "outbox_cdc_poll_rows_claimed";
    /// Counter: rows the relay marked `published_at` after Kafka acknowledged them.
    pub const POLL_ROWS_PUBLISHED: &str = "outbox_cdc_poll_rows_published";
    /// Counter: rows whose record the broker refused for good (`attempts + 1`; dead-lettered next).
    pub const POLL_ROWS_FAILED: &str = "outbox_cdc_poll_rows_failed";
    /// Counter: rows parked after going to the dead-letter topic (they hold their aggregate).
    pub const POLL_ROWS_PARKED: &str = "outbox_cdc_poll_rows_parked";
    /// Counter: stays 0 (earlier relays leased rows; the relay now holds the connector's lease).
    pub const POLL_LEASE_TAKEOVERS: &str = "outbox_cdc_poll_lease_takeovers";
    /// Counter: stays 0 (earlier relays leased rows; a lost lease now shows in [`LEASE_HELD`]).
    pub const POLL_LEASES_LOST: &str = "outbox_cdc_poll_leases_lost";
    /// Counter: reads that found nothing in any table (each followed by a pause of up to
    /// `poll.poll_interval_ms`).
    pub const POLL_IDLE_POLLS: &str = "outbox_cdc_poll_idle_polls";
    /// Gauge: unpublished rows that are not parked (held ones included), counted every 10 s while the relay
    /// is busy or holds an aggregate (0 when idle), capped at [`crate::metrics::POLL_BACKLOG_CAP`] (a count
    /// reads every row it counts).
    pub const POLL_BACKLOG_ROWS: &str = "outbox_cdc_poll_backlog_rows";
    /// Gauge: the age of the first unpublished, not parked row in the table's order, by its `occurred_at`
    /// (UTC): the relay's lag; 0 when there is none. Read with the backlog.
    pub const POLL_OLDEST_DUE_SECONDS: &str = "outbox_cdc_poll_oldest_due_seconds";

    /// Deprecated names, each with its replacement: exposed with the replacement's value for one release
    /// after the rename, then removed.
    pub const DEPRECATED: &[(&str, &str)] = &[(BYTES_IN_FLIGHT, IN_FLIGHT_BYTES)];

    /// Every name, for the README and the contract test (deprecated ones too, while they are exposed).
    pub const ALL: &[&str] = &[
        SOURCE_SECONDS_BEHIND,
        CHECKPOINT_LAG_SECONDS,
        CHECKPOINT_AGE_SECONDS,
        EVENTS_READ,
        EVENTS_PRODUCED,
        EVENTS_ACKNOWLEDGED,
        PARTITION_EVENTS,
        PRODUCE_ERRORS,
        PRODUCE_RETRIES,
        RECONNECTS,
        END_TO_END_LATENCY_SECONDS,
        IN_FLIGHT_BYTES,
        BYTES_IN_FLIGHT,
        RECORDS_IN_FLIGHT,
        SNAPSHOT_ROWS_DONE,
        SNAPSHOT_ROWS_TOTAL,
        DEAD_LETTERS,
        QUARANTINED_AGGREGATES,
        BINLOG_NEEDED_AGE_SECONDS,
        BINLOG_NEEDED_BYTES,
        BINLOG_RETENTION_SECONDS,
        PURGE_RISK_RATIO,
        READY,
        BUILD_INFO,
        KAFKA_TRANSACTIONS,
        KAFKA_TRANSACTION_COMMIT_SECONDS,
        LEASE_HELD,
        STANDBY,
        POLL_QUERIES,
        POLL_ROWS_CLAIMED,
        POLL_ROWS_PUBLISHED,
        POLL_ROWS_FAILED,
        POLL_ROWS_PARKED,
        POLL_LEASE_TAKEOVERS,
        POLL_LEASES_LOST,
        POLL_IDLE_POLLS,
        POLL_BACKLOG_ROWS,
        POLL_OLDEST_DUE_SECONDS,
    ];
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TopicLabel {
    topic: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PartitionLabel {
    topic: String,
    partition: i32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassLabel {
    class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AggregateTypeLabel {
    aggregate_type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabel {
    version: String,
    commit: String,
}

/// The crate's version, as `outbox_cdc_build_info` labels it.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The git commit this binary was built from (see `build.rs`), or `unknown`.
pub const COMMIT: &str = match option_env!("OUTBOX_CDC_COMMIT") {
    Some(commit) if !commit.is_empty() => commit,
    _ => "unknown",
};

type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;

/// The process's metrics and health state.
pub struct Metrics {
    registry: Registry,
    events_read: Family<TopicLabel, Counter>,
    events_produced: Family<TopicLabel, Counter>,
    events_acknowledged: Family<TopicLabel, Counter>,
    partition_events: Family<PartitionLabel, Counter>,
    produce_errors: Family<KindLabel, Counter>,
    produce_retries: Counter,
    reconnects: Family<ClassLabel, Counter>,
    latency: Family<AggregateTypeLabel, Histogram>,
    /// Registered under [`names::IN_FLIGHT_BYTES`] and, deprecated, [`names::BYTES_IN_FLIGHT`]: one value.
    in_flight_bytes: Gauge,
    records_in_flight: Gauge,
    snapshot_rows_done: Gauge,
    snapshot_rows_total: Gauge,
    on_demand_active: Gauge,
    on_demand_rows: Gauge,
    dead_letters: Family<KindLabel, Counter>,
    quarantined: Gauge,
    source_seconds_behind: FloatGauge,
    checkpoint_lag_seconds: FloatGauge,
    checkpoint_age_seconds: FloatGauge,
    binlog_needed_age_seconds: FloatGauge,
    binlog_needed_bytes: Gauge,
    binlog_retention_seconds: Gauge,
    purge_risk_ratio: FloatGauge,
    ready_gauge: Gauge,
    build_info: Family<BuildLabel, Gauge>,
    kafka_transactions: Family<OutcomeLabel, Counter>,
    kafka_transaction_commit_seconds: Histogram,
    lease_held: Gauge,
    standby: Gauge,
    paused: Gauge,
    /// The polling relay's.
    poll: PollMetrics,
    /// Commit time (Unix seconds) of the last transaction read; 0 = none yet.
    last_read_commit_s: AtomicU64,
    /// Whether a heartbeat arrived after that transaction (the reader is at the end of the binlog).
    caught_up: AtomicBool,
    /// Commit time of the checkpointed transaction; 0 = unknown.
    checkpoint_commit_s: AtomicU64,
    /// When the checkpoint was last written (Unix ms); 0 = not yet.
    checkpoint_written_ms: AtomicU64,
    /// Last produce-retry total seen in librdkafka's statistics (they report running totals).
    retries_seen: AtomicU64,
    /// Per-topic handles, looked up by `&str` so the per-event path allocates nothing.
    topics: Handles<TopicHandles>,
    /// Per-aggregate-type latency histograms, likewise.
    latencies: Handles<Histogram>,
}

/// The gauges that say how far behind the connector is ([`Metrics::lag`]), each as on `/metrics`.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Lag {
    /// [`names::SOURCE_SECONDS_BEHIND`].
    pub source_seconds_behind: f64,
    /// [`names::CHECKPOINT_LAG_SECONDS`].
    pub checkpoint_lag_seconds: f64,
    /// [`names::CHECKPOINT_AGE_SECONDS`].
    pub checkpoint_age_seconds: f64,
    /// [`names::RECORDS_IN_FLIGHT`].
    pub records_in_flight: i64,
    /// [`names::POLL_BACKLOG_ROWS`] (the polling relay).
    pub poll_backlog_rows: i64,
    /// [`names::POLL_OLDEST_DUE_SECONDS`] (the polling relay).
    pub poll_oldest_due_seconds: f64,
}

/// End-to-end latency buckets: fine where latency targets live (1-100 ms), coarse out to minutes (a
/// connector catching up after an outage).
const LATENCY_BUCKETS_SECONDS: [f64; 26] = [
    0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.0175, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15,
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// Handles of one topic's series.
#[derive(Clone)]
struct TopicHandles {
    read: Counter,
    produced: Counter,
    acknowledged: Counter,
}

/// What the delivery-callback thread last counted: acknowledgements come in runs of one topic and one
/// aggregate type, and this skips the family lookups (a lock and a hash each) for them.
#[derive(Default)]
struct AckCache {
    topic: String,
    /// The topic's acknowledged-events counter.
    acknowledged: Option<Counter>,
    /// The topic's per-partition counters, by partition number.
    partitions: Vec<Option<Counter>>,
    aggregate_type: String,
    latency: Option<Histogram>,
}

/// Metric handles by label value: a read lock and a `&str` lookup on the hot path; the family lookup (which
/// allocates the label) happens once per label value.
struct Handles<T>(RwLock<HashMap<String, T>>);

impl<T: Clone> Handles<T> {
    fn new() -> Self {
        Handles(RwLock::new(HashMap::new()))
    }

    fn get(&self, key: &str, create: impl FnOnce() -> T) -> T {
        if let Some(h) = self.0.read().unwrap_or_else(|p| p.into_inner()).get(key) {
            return h.clone();
        }
        let mut map = self.0.write().unwrap_or_else(|p| p.into_inner());
        map.entry(key.to_string()).or_insert_with(create).clone()
    }
}

static METRICS: OnceLock<Metrics> = OnceLock::new();

/// The process-wide metrics.
pub fn metrics() -> &'static Metrics {
    METRICS.get_or_init(Metrics::new)
}

impl Metrics {
    fn new() -> Self {
        let metrics = Metrics::register();
        // Zero series for the labels known in advance, so dashboards and alerts see 0, not "no data".
        for kind in crate::poison::PoisonKind::ALL {
            drop(metrics.dead_letters.get_or_create(&KindLabel { kind: kind.as_str().to_string() }));
        }
        drop(metrics.reconnects.get_or_create(&ClassLabel { class: "transient".into() }));
        drop(metrics.produce_errors.get_or_create(&KindLabel { kind: "MessageTimedOut".into() }));
        for outcome in ["committed", "aborted"] {
            drop(metrics.kafka_transactions.get_or_create(&OutcomeLabel { outcome }));
        }
        for kind in PollQuery::ALL {
            drop(metrics.poll.queries.get_or_create(&KindLabel { kind: kind.as_str().into() }));
        }
        metrics.build_info.get_or_create(&BuildLabel { version: VERSION.into(), commit: COMMIT.into() }).set(1);
        metrics
    }

    fn register() -> Self {
        let mut registry = Registry::default();
        macro_rules! reg {
            ($name:expr, $metric:expr) => {{
                let metric = $metric;
                registry.register($name, help($name), metric.clone());
                metric
            }};
        }
        Metrics {
            events_read: reg!(names::EVENTS_READ, Family::default()),
            events_produced: reg!(names::EVENTS_PRODUCED, Family::default()),
            events_acknowledged: reg!(names::EVENTS_ACKNOWLEDGED, Family::default()),
            partition_events: reg!(names::PARTITION_EVENTS, Family::default()),
            produce_errors: reg!(names::PRODUCE_ERRORS, Family::default()),
            produce_retries: reg!(names::PRODUCE_RETRIES, Counter::default()),
            reconnects: reg!(names::RECONNECTS, Family::default()),
            latency: reg!(
                names::END_TO_END_LATENCY_SECONDS,
                Family::<AggregateTypeLabel, Histogram>::new_with_constructor(|| {
                    Histogram::new(LATENCY_BUCKETS_SECONDS.iter().copied())
                })
            ),
            in_flight_bytes: {
                let gauge = reg!(names::IN_FLIGHT_BYTES, Gauge::default());
                registry.register(names::BYTES_IN_FLIGHT, help(names::BYTES_IN_FLIGHT), gauge.clone());
                gauge
            },
            records_in_flight: reg!(names::RECORDS_IN_FLIGHT, Gauge::default()),
            snapshot_rows_done: reg!(names::SNAPSHOT_ROWS_DONE, Gauge::default()),
            snapshot_rows_total: reg!(names::SNAPSHOT_ROWS_TOTAL, Gauge::default()),
            on_demand_active: reg!(names::SNAPSHOT_ON_DEMAND_ACTIVE, Gauge::default()),
            on_demand_rows: reg!(names::SNAPSHOT_ON_DEMAND_ROWS, Gauge::default()),
            dead_letters: reg!(names::DEAD_LETTERS, Family::default()),
            quarantined: reg!(names::QUARANTINED_AGGREGATES, Gauge::default()),
            source_seconds_behind: reg!(names::SOURCE_SECONDS_BEHIND, FloatGauge::default()),
            checkpoint_lag_seconds: reg!(names::CHECKPOINT_LAG_SECONDS, FloatGauge::default()),
            checkpoint_age_seconds: reg!(names::CHECKPOINT_AGE_SECONDS, FloatGauge::default()),
            binlog_needed_age_seconds: reg!(names::BINLOG_NEEDED_AGE_SECONDS, FloatGauge::default()),
            binlog_needed_bytes: reg!(names::BINLOG_NEEDED_BYTES, Gauge::default()),
            binlog_retention_seconds: reg!(names::BINLOG_RETENTION_SECONDS, Gauge::default()),
            purge_risk_ratio: reg!(names::PURGE_RISK_RATIO, FloatGauge::default()),
            ready_gauge: reg!(names::READY, Gauge::default()),
            build_info: reg!(names::BUILD_INFO, Family::default()),
            kafka_transactions: reg!(names::KAFKA_TRANSACTIONS, Family::default()),
            kafka_transaction_commit_seconds: reg!(
                names::KAFKA_TRANSACTION_COMMIT_SECONDS,
                Histogram::new(LATENCY_BUCKETS_SECONDS.iter().copied())
            ),
            lease_held: reg!(names::LEASE_HELD, Gauge::default()),
            standby: reg!(names::STANDBY, Gauge::default()),
            paused: reg!(names::PAUSED, Gauge::default()),
            poll: PollMetrics {
                queries: reg!(names::POLL_QUERIES, Family::default()),
                rows_claimed: reg!(names::POLL_ROWS_CLAIMED, Counter::default()),
                rows_published: reg!(names::POLL_ROWS_PUBLISHED, Counter::default()),
                rows_failed: reg!(names::POLL_ROWS_FAILED, Counter::default()),
                rows_parked: reg!(names::POLL_ROWS_PARKED, Counter::default()),
                lease_takeovers: reg!(names::POLL_LEASE_TAKEOVERS, Counter::default()),
                leases_lost: reg!(names::POLL_LEASES_LOST, Counter::default()),
                idle_polls: reg!(names::POLL_IDLE_POLLS, Counter::default()),
                backlog_rows: reg!(names::POLL_BACKLOG_ROWS, Gauge::default()),
                oldest_due_seconds: reg!(names::POLL_OLDEST_DUE_SECONDS, FloatGauge::default()),
            },
            registry,
            last_read_commit_s: AtomicU64::new(0),
            caught_up: AtomicBool::new(false),
            checkpoint_commit_s: AtomicU64::new(0),
            checkpoint_written_ms: AtomicU64::new(0),
            retries_seen: AtomicU64::new(0),
            topics: Handles::new(),
            latencies: Handles::new(),
        }
    }

    /// Renders every metric in the OpenMetrics text format, refreshing the time-derived gauges first.
    pub fn render(&self) -> String {
        self.refresh();
        let mut out = String::with_capacity(8 * 1024);
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("writing to a String");
        out
    }

    /// How far behind the connector is, as `/metrics` would say now (the control API's status).
    pub fn lag(&self) -> Lag {
        self.refresh();
        Lag {
            source_seconds_behind: self.source_seconds_behind.get(),
            checkpoint_lag_seconds: self.checkpoint_lag_seconds.get(),
            checkpoint_age_seconds: self.checkpoint_age_seconds.get(),
            records_in_flight: self.records_in_flight.get(),
            poll_backlog_rows: self.poll.backlog_rows.get(),
            poll_oldest_due_seconds: self.poll.oldest_due_seconds.get(),
        }
    }

    /// Sets the gauges derived from the time: lag, checkpoint age, readiness.
    fn refresh(&self) {
        let now_s = now_ms() as f64 / 1000.0;
        let read = self.last_read_commit_s.load(Ordering::Relaxed);
        let behind = if read == 0 || self.caught_up.load(Ordering::Relaxed) { 0.0 } else { now_s - read as f64 };
        self.source_seconds_behind.set(behind.max(0.0));
        let checkpointed = self.checkpoint_commit_s.load(Ordering::Relaxed);
        let lag = if read == 0 || checkpointed == 0 { 0.0 } else { read.saturating_sub(checkpointed) as f64 };
        self.checkpoint_lag_seconds.set(lag);
        let written = self.checkpoint_written_ms.load(Ordering::Relaxed);
        let age = if written == 0 { 0.0 } else { now_ms().saturating_sub(written) as f64 / 1000.0 };
        self.checkpoint_age_seconds.set(age);
        self.ready_gauge.set(i64::from(health().ready()));
    }

    /// One event read from the source, routed to `topic`.
    pub fn event_read(&self, topic: &str) {
        self.with_topic(topic, |h| h.read.inc());
    }

    /// Runs `f` on `topic`'s handles.
    fn with_topic<R>(&self, topic: &str, f: impl FnOnce(&TopicHandles) -> R) -> R {
        thread_local! {
            // The last topic this thread counted: events come in runs of one topic, and this skips the
            // lock, the hash and the reference counts for them.
            static LAST: std::cell::RefCell<Option<(String, TopicHandles)>> = const { std::cell::RefCell::new(None) };
        }
        LAST.with_borrow_mut(|last| {
            if last.as_ref().is_none_or(|(name, _)| name != topic) {
                *last = Some((topic.to_string(), self.lookup_topic(topic)));
            }
            f(&last.as_ref().expect("set above").1)
        })
    }

    fn lookup_topic(&self, topic: &str) -> TopicHandles {
        self.topics.get(topic, || {
            let label = TopicLabel { topic: topic.to_string() };
            TopicHandles {
                read: self.events_read.get_or_create_owned(&label),
                produced: self.events_produced.get_or_create_owned(&label),
                acknowledged: self.events_acknowledged.get_or_create_owned(&label),
            }
        })
    }

    /// One record handed to the producer.
    pub fn event_produced(&self, topic: &str, bytes: usize) {
        self.with_topic(topic, |h| h.produced.inc());
        self.in_flight_bytes.inc_by(bytes as i64);
        self.records_in_flight.inc();
    }

    /// One record settled (acknowledged or failed): no longer in flight.
    pub fn record_settled(&self, bytes: usize) {
        self.in_flight_bytes.dec_by(bytes as i64);
        self.records_in_flight.dec();
    }

    /// Kafka acknowledged one record; `occurred_at_ms` is the row's `occurred_at` for streamed rows.
    pub fn event_acknowledged(&self, topic: &str, partition: i32, aggregate_type: &str, occurred_at_ms: Option<i64>) {
        thread_local! {
            static ACK: std::cell::RefCell<AckCache> = std::cell::RefCell::new(AckCache::default());
        }
        ACK.with_borrow_mut(|cache| {
            if cache.acknowledged.is_none() || cache.topic != topic {
                topic.clone_into(&mut cache.topic);
                cache.acknowledged = Some(self.lookup_topic(topic).acknowledged);
                cache.partitions.clear();
            }
            cache.acknowledged.as_ref().expect("set above").inc();
            if let Ok(index) = usize::try_from(partition) {
                if cache.partitions.len() <= index {
                    cache.partitions.resize(index + 1, None);
                }
                cache.partitions[index]
                    .get_or_insert_with(|| {
                        self.partition_events
                            .get_or_create_owned(&PartitionLabel { topic: topic.to_string(), partition })
                    })
                    .inc();
            }
            if let Some(at) = occurred_at_ms {
                if cache.latency.is_none() || cache.aggregate_type != aggregate_type {
                    aggregate_type.clone_into(&mut cache.aggregate_type);
                    cache.latency = Some(self.latencies.get(aggregate_type, || {
                        self.latency
                            .get_or_create_owned(&AggregateTypeLabel { aggregate_type: aggregate_type.to_string() })
                    }));
                }
                let seconds = (now_ms() as i64 - at).max(0) as f64 / 1000.0;
                cache.latency.as_ref().expect("set above").observe(seconds);
            }
        });
    }

    /// A delivery failed with librdkafka error `kind`.
    pub fn produce_error(&self, kind: &str) {
        self.produce_errors.get_or_create(&KindLabel { kind: kind.to_string() }).inc();
    }

    /// librdkafka's running total of retried produce requests.
    pub fn produce_retries_total(&self, total: u64) {
        let before = self.retries_seen.swap(total, Ordering::Relaxed);
        if total > before {
            self.produce_retries.inc_by(total - before);
        }
    }

    /// The pipeline restarts after a transient failure.
    pub fn reconnect(&self) {
        self.reconnects.get_or_create(&ClassLabel { class: "transient".into() }).inc();
    }

    /// A source transaction committed at `commit_s` (Unix seconds) was read.
    pub fn transaction_read(&self, commit_s: u32) {
        if commit_s != 0 {
            self.last_read_commit_s.store(u64::from(commit_s), Ordering::Relaxed);
            self.caught_up.store(false, Ordering::Relaxed);
        }
    }

    /// The server sent a heartbeat: nothing newer to read.
    pub fn heartbeat(&self) {
        self.caught_up.store(true, Ordering::Relaxed);
    }

    /// The checkpoint was written; `commit_s` is the checkpointed transaction's commit time if known.
    pub fn checkpoint_written(&self, commit_s: Option<u32>) {
        if let Some(ts) = commit_s {
            self.checkpoint_commit_s.store(u64::from(ts), Ordering::Relaxed);
        }
        self.checkpoint_written_ms.store(now_ms(), Ordering::Relaxed);
    }

    /// A Kafka transaction committed after `took`.
    pub fn transaction_committed(&self, took: std::time::Duration) {
        self.kafka_transactions.get_or_create(&OutcomeLabel { outcome: "committed" }).inc();
        self.kafka_transaction_commit_seconds.observe(took.as_secs_f64());
    }

    /// A Kafka transaction was aborted.
    pub fn transaction_aborted(&self) {
        self.kafka_transactions.get_or_create(&OutcomeLabel { outcome: "aborted" }).inc();
    }

    /// Snapshot progress.
    pub fn snapshot_progress(&self, done: u64, total: u64) {
        self.snapshot_rows_done.set(done as i64);
        self.snapshot_rows_total.set(total.max(done) as i64);
    }

    /// A snapshot on demand's progress: `None` when none is being read.
    pub fn on_demand_progress(&self, rows: Option<u64>) {
        self.on_demand_active.set(i64::from(rows.is_some()));
        self.on_demand_rows.set(rows.unwrap_or(0) as i64);
    }

    /// A record went to the dead-letter topic.
    pub fn dead_letter(&self, kind: &str) {
        self.dead_letters.get_or_create(&KindLabel { kind: kind.to_string() }).inc();
    }

    /// Number of aggregates currently held.
    pub fn quarantined_aggregates(&self, count: usize) {
        self.quarantined.set(count as i64);
    }

    /// Whether this instance holds its lease on the source server.
    pub fn lease_held(&self, held: bool) {
        self.lease_held.set(i64::from(held));
    }

    /// Whether this instance waits as a standby for its lease.
    pub fn standby(&self, waiting: bool) {
        self.standby.set(i64::from(waiting));
    }

    /// Whether an operator paused the connector.
    pub fn paused(&self, paused: bool) {
        self.paused.set(i64::from(paused));
    }

    /// The latest purge-risk reading.
    pub fn purge_risk(&self, needed_age_seconds: u64, needed_bytes: u64, retention_seconds: u64, ratio: f64) {
        self.binlog_needed_age_seconds.set(needed_age_seconds as f64);
        self.binlog_needed_bytes.set(needed_bytes as i64);
        self.binlog_retention_seconds.set(retention_seconds as i64);
        self.purge_risk_ratio.set(ratio);
    }
}

/// The polling relay's series ([`names::POLL_QUERIES`] and the ones after it).
struct PollMetrics {
    queries: Family<KindLabel, Counter>,
    rows_claimed: Counter,
    rows_published: Counter,
    rows_failed: Counter,
    rows_parked: Counter,
    lease_takeovers: Counter,
    leases_lost: Counter,
    idle_polls: Counter,
    backlog_rows: Gauge,
    oldest_due_seconds: FloatGauge,
}

/// The most due rows [`names::POLL_BACKLOG_ROWS`] counts.
pub const POLL_BACKLOG_CAP: u64 = 100_000;

/// What a polling relay's statement was for ([`names::POLL_QUERIES`]' `kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PollQuery {
    /// Reading unpublished rows: in order, the sequence gaps, the sweeps.
    Claim,
    /// Marking a batch published (its rows, or with `[poll] progress_table` the number it is published
    /// through).
    Mark,
    /// Recording a record the broker refused.
    Fail,
    /// Parking a dead-lettered row.
    Park,
    /// Renewing a row lease: no longer sent (earlier relays leased rows); kept so the series stays.
    Renew,
    /// Counting the backlog, reading the parked rows.
    Backlog,
    /// Reading the server's open transactions (in either mode: whether a skipped sequence number can still
    /// be committed).
    Transactions,
}

impl PollQuery {
    /// Every kind, for the zero series.
    pub const ALL: [PollQuery; 7] = [
        PollQuery::Claim,
        PollQuery::Mark,
        PollQuery::Fail,
        PollQuery::Park,
        PollQuery::Renew,
        PollQuery::Backlog,
        PollQuery::Transactions,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            PollQuery::Claim => "claim",
            PollQuery::Mark => "mark",
            PollQuery::Fail => "fail",
            PollQuery::Park => "park",
            PollQuery::Renew => "renew",
            PollQuery::Backlog => "backlog",
            PollQuery::Transactions => "transactions",
        }
    }
}

impl Metrics {
    /// The polling relay sent `n` statements of `kind`.
    pub fn poll_queries(&self, kind: PollQuery, n: u64) {
        self.poll.queries.get_or_create(&KindLabel { kind: kind.as_str().into() }).inc_by(n);
    }

    /// The polling relay claimed `rows`, `taken_over` of them from an expired lease of another relay.
    pub fn poll_claimed(&self, rows: u64, taken_over: u64) {
        self.poll.rows_claimed.inc_by(rows);
        self.poll.lease_takeovers.inc_by(taken_over);
    }

    /// The polling relay marked `rows` published.
    pub fn poll_published(&self, rows: u64) {
        self.poll.rows_published.inc_by(rows);
    }

    /// The polling relay recorded a failed delivery of `rows`.
    pub fn poll_failed(&self, rows: u64) {
        self.poll.rows_failed.inc_by(rows);
    }

    /// The polling relay parked a dead-lettered row.
    pub fn poll_parked(&self) {
        self.poll.rows_parked.inc();
    }

    /// The polling relay gave up a batch whose lease another relay took over.
    pub fn poll_lease_lost(&self) {
        self.poll.leases_lost.inc();
    }

    /// The polling relay found nothing to claim.
    pub fn poll_idle(&self) {
        self.poll.idle_polls.inc();
    }

    /// The polling relay's backlog: `due_rows` (capped) and the seconds the oldest of them waited.
    pub fn poll_backlog(&self, due_rows: u64, oldest_due_seconds: f64) {
        self.poll.backlog_rows.set(due_rows as i64);
        self.poll.oldest_due_seconds.set(oldest_due_seconds.max(0.0));
    }
}

fn help(name: &str) -> &'static str {
    match name {
        names::SOURCE_SECONDS_BEHIND => "Seconds between now and the commit of the last source transaction read",
        names::CHECKPOINT_LAG_SECONDS => "Commit-time distance from the checkpointed transaction to the last read",
        names::CHECKPOINT_AGE_SECONDS => "Seconds since the checkpoint was last written",
        names::EVENTS_READ => "Outbox events read from the source",
        names::EVENTS_PRODUCED => "Records handed to the Kafka producer",
        names::EVENTS_ACKNOWLEDGED => "Records acknowledged by Kafka",
        names::PARTITION_EVENTS => "Acknowledged records per partition",
        names::PRODUCE_ERRORS => "Failed deliveries by error kind",
        names::PRODUCE_RETRIES => "Produce requests retried by librdkafka",
        names::RECONNECTS => "Pipeline restarts after transient failures",
        names::END_TO_END_LATENCY_SECONDS => "Seconds from occurred_at to Kafka acknowledgement",
        names::IN_FLIGHT_BYTES => {
            "Bytes of records not yet acknowledged (record + ~1 KB each, as the in-flight budget counts them)"
        }
        names::BYTES_IN_FLIGHT => "Deprecated: use outbox_cdc_in_flight_bytes, removed in the next release",
        names::RECORDS_IN_FLIGHT => "Records not yet acknowledged",
        names::SNAPSHOT_ROWS_DONE => "Rows produced by the initial snapshot",
        names::SNAPSHOT_ROWS_TOTAL => "Estimated rows of the initial snapshot",
        names::SNAPSHOT_ON_DEMAND_ACTIVE => "1 while a snapshot on demand is being read",
        names::SNAPSHOT_ON_DEMAND_ROWS => "Rows produced by the snapshot on demand being read",
        names::DEAD_LETTERS => "Records sent to the dead-letter topic",
        names::QUARANTINED_AGGREGATES => "Aggregates held in quarantine",
        names::BINLOG_NEEDED_AGE_SECONDS => "Age of the checkpointed transaction (oldest binlog still needed)",
        names::BINLOG_NEEDED_BYTES => "Bytes of binlog files from the checkpoint's file to the newest",
        names::BINLOG_RETENTION_SECONDS => {
            "Server binlog retention in seconds (0 = never expires, 1 = purged as soon as possible)"
        }
        names::PURGE_RISK_RATIO => "Needed binlog age divided by retention; 1 = may be purged",
        names::READY => "1 when connected to source and broker and not failed",
        names::BUILD_INFO => "Always 1; labels: the connector's version and the git commit it was built from",
        names::KAFKA_TRANSACTIONS => "Kafka transactions (exactly_once) by outcome: committed or aborted",
        names::KAFKA_TRANSACTION_COMMIT_SECONDS => "Seconds each Kafka transaction's commit took (exactly_once)",
        names::LEASE_HELD => "1 while this instance holds its lease on the source server (active), else 0",
        names::STANDBY => "1 while this instance waits as a standby for the lease (not ready by design), else 0",
        names::PAUSED => {
            "1 while an operator has paused the connector (nothing read or published until resumed), else 0"
        }
        names::POLL_QUERIES => "Polling relay: SQL statements sent to the source database, by kind",
        names::POLL_ROWS_CLAIMED => "Polling relay: rows claimed",
        names::POLL_ROWS_PUBLISHED => "Polling relay: rows marked published after Kafka acknowledged them",
        names::POLL_ROWS_FAILED => "Polling relay: rows whose delivery failed (retried later)",
        names::POLL_ROWS_PARKED => "Polling relay: dead-lettered rows parked (they hold their aggregate)",
        names::POLL_LEASE_TAKEOVERS => "Polling relay: rows claimed from another relay's expired lease",
        names::POLL_LEASES_LOST => "Polling relay: batches given up because another relay took over their lease",
        names::POLL_IDLE_POLLS => "Polling relay: polls that found nothing to claim",
        names::POLL_BACKLOG_ROWS => "Polling relay: due unpublished rows (counted every 5 s, capped)",
        names::POLL_OLDEST_DUE_SECONDS => "Polling relay: seconds since the oldest due unpublished row became due",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every documented name is exposed, once labels have been seen.
    #[test]
    fn render_exposes_every_name() {
        let m = metrics();
        m.event_read("t");
        m.event_produced("t", 10);
        m.event_acknowledged("t", 0, "Order", Some(0));
        m.record_settled(10);
        m.produce_error("MsgTimedOut");
        m.reconnect();
        m.dead_letter("too_large");
        let text = m.render();
        for name in names::ALL {
            assert!(text.contains(&format!("# TYPE {name} ")), "{name} missing from:\n{text}");
        }
        assert!(text.contains("outbox_cdc_events_read_total{topic=\"t\"} 1"), "{text}");
    }

    /// The value of the unlabelled series `name` on a rendered page.
    fn sample(text: &str, name: &str) -> Option<f64> {
        text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
    }

    /// Regression guard for the rename of `outbox_cdc_bytes_in_flight`: for one release dashboards and alerts
    /// on the old name keep working, so it shows the new name's value, and its help says what replaces it.
    #[test]
    fn a_deprecated_name_shows_its_replacements_value() {
        let m = Metrics::register();
        m.event_produced("t", 1500);
        m.event_produced("t", 700);
        m.record_settled(700);
        let text = m.render();
        for (old, new) in names::DEPRECATED {
            assert_eq!(sample(&text, new), Some(1500.0), "{text}");
            assert_eq!(sample(&text, old), sample(&text, new), "{old} and {new} differ:\n{text}");
            assert!(
                text.contains(&format!("# HELP {old} Deprecated: use {new}, removed in the next release")),
                "{text}"
            );
            assert!(names::ALL.contains(old) && names::ALL.contains(new), "{old}, {new}");
        }
    }

    /// `outbox_cdc_build_info` is one series at 1, labelled with this build's version and commit.
    #[test]
    fn build_info_names_the_version_and_commit() {
        let text = metrics().render();
        let line = format!("{}{{version=\"{VERSION}\",commit=\"{COMMIT}\"}} 1", names::BUILD_INFO);
        assert!(text.lines().any(|l| l == line), "no {line:?} in:\n{text}");
        assert_eq!(text.lines().filter(|l| l.starts_with(names::BUILD_INFO)).count(), 1, "{text}");
        assert!(!COMMIT.is_empty() && VERSION == env!("CARGO_PKG_VERSION"));
    }
}
