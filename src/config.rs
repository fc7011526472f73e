//! `connector.toml`: the one configuration file.
//!
//! Floor 2 (docs/ARCHITECTURE.md): imports floors 0-1 (vocabulary, error, metrics).
//!
//! The serde structs below are the user-facing reference (their `///` comments are the docs); unknown keys
//! are rejected. [`Config::load`] parses and validates, so the rest of the program only sees settings that
//! make sense together. Secrets can be written in the file, or come from the environment (`password_env`,
//! `[kafka] properties_env`) or from files (`password_file`, `[kafka] properties_file`: a Kubernetes or
//! Docker secret mounted as a volume). The environment and the files are read when a command connects
//! ([`Config::source_password`], [`KafkaConfig::resolved_properties`]), not when the config is loaded, so
//! `status` works without them. Secrets are never logged: [`Secret`] and [`Properties`] redact themselves
//! in `Debug`, and a TOML error never quotes the file (see [`crate::secret`]).

use std::collections::BTreeMap;

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::{Error, Result};
use crate::outbox::TableName;
pub use crate::secret::{Properties, Secret};
use crate::topic::TopicTemplate;

/// The whole configuration file, as written. Only [`Config::parse`] reads one: it validates it into a
/// [`Config`].
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    /// The MySQL/MariaDB server to replicate from.
    pub source: SourceConfig,
    /// Which table(s) hold the outbox and how its columns are named.
    pub outbox: OutboxConfig,
    /// Where events go.
    pub kafka: KafkaConfig,
    /// Where the checkpoint lives.
    #[serde(default)]
    pub state: StateConfig,
    /// The initial snapshot of rows already in the outbox.
    #[serde(default)]
    pub snapshot: SnapshotConfig,
    /// The operations endpoint (`/metrics`, `/healthz`, `/readyz`) and purge-risk monitoring.
    #[serde(default)]
    pub metrics: MetricsConfig,
    /// `outbox-cdc prune`: deleting published outbox rows.
    #[serde(default)]
    pub prune: PruneConfig,
    /// The polling relay (`source.kind = "poll"`).
    #[serde(default)]
    pub poll: PollConfig,
    /// The delivery guarantee, and taking over from another instance.
    #[serde(default)]
    pub delivery: DeliveryConfig,
    /// The Schema Registry of `kafka.value_format = "avro" | "json_schema" | "protobuf"` and
    /// `kafka.key_format = "avro"`.
    pub schema_registry: Option<SchemaRegistryConfig>,
}

/// The validated configuration: every setting of the file, checked to make sense together, with what is
/// derived from them parsed once ([`Config::tables`], [`Config::topic`]).
#[derive(Debug, Clone)]
pub struct Config {
    /// The MySQL/MariaDB server to replicate from.
    pub source: SourceConfig,
    /// Which table(s) hold the outbox and how its columns are named.
    pub outbox: OutboxConfig,
    /// Where events go.
    pub kafka: KafkaConfig,
    /// Where the checkpoint lives.
    pub state: StateConfig,
    /// The initial snapshot of rows already in the outbox.
    pub snapshot: SnapshotConfig,
    /// The operations endpoint (`/metrics`, `/healthz`, `/readyz`) and purge-risk monitoring.
    pub metrics: MetricsConfig,
    /// `outbox-cdc prune`: deleting published outbox rows.
    pub prune: PruneConfig,
    /// The polling relay (`source.kind = "poll"`).
    pub poll: PollConfig,
    /// The delivery guarantee, and taking over from another instance.
    pub delivery: DeliveryConfig,
    /// The Schema Registry, where a value or key format needs one (validation requires it then, and refuses
    /// it otherwise).
    pub schema_registry: Option<SchemaRegistryConfig>,
    /// The outbox tables, parsed, sorted, without duplicates; never empty.
    tables: Vec<TableName>,
    /// `kafka.topic`, parsed.
    topic: TopicTemplate,
    /// `outbox.additional_placement`, parsed.
    placements: Vec<Placement>,
}

/// `[metrics]`: the HTTP operations endpoint and purge-risk monitoring.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// Serve `/metrics` (Prometheus/OpenMetrics text), `/healthz` and `/readyz`.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Address of the endpoint. Keep it on loopback or a private network: it has no authentication.
    #[serde(default = "default_metrics_listen")]
    pub listen: std::net::SocketAddr,
    /// How often the server's binlog list and retention are read to measure the purge risk.
    #[serde(default = "default_purge_check_interval_ms")]
    pub purge_check_interval_ms: u64,
    /// Log a warning when the oldest binlog the connector still needs has used this fraction of the
    /// server's retention (`binlog_expire_logs_seconds`): at 1.0 the server may delete it, and resuming
    /// then needs a new snapshot.
    #[serde(default = "default_purge_warn_ratio")]
    pub purge_warn_ratio: f64,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            enabled: true,
            listen: default_metrics_listen(),
            purge_check_interval_ms: default_purge_check_interval_ms(),
            purge_warn_ratio: default_purge_warn_ratio(),
        }
    }
}

fn default_metrics_listen() -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], 9187))
}

fn default_purge_check_interval_ms() -> u64 {
    60_000
}

fn default_purge_warn_ratio() -> f64 {
    0.5
}

/// `[prune]`: how `outbox-cdc prune` deletes rows whose events the connector has checkpointed.
///
/// The proof that a row was delivered is read through the `[source]` connection (the replication user
/// has what it needs); only the `DELETE`s use these credentials, so the replication user never needs
/// `DELETE` on the outbox table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PruneConfig {
    /// Server to delete on. Default: `source.host`. Set it to the primary when `[source]` is a replica
    /// (deletes on a replica would make it diverge, or fail on a `read_only` server).
    #[serde(default)]
    pub host: Option<String>,
    /// TCP port of `host`. Default: `source.port`.
    #[serde(default)]
    pub port: Option<u16>,
    /// User with `DELETE` (and `SELECT`) on the outbox table(s). Default: `source.user` with the source
    /// password; when set, its password is one of `password`, `password_env` or `password_file` (none:
    /// no password).
    #[serde(default)]
    pub user: Option<String>,
    /// Password of `user` in clear. Prefer `password_file` or `password_env`.
    #[serde(default)]
    pub password: Option<Secret>,
    /// Name of an environment variable holding the password of `user`; an error if named but not set.
    #[serde(default)]
    pub password_env: Option<String>,
    /// File holding the password of `user`, as `source.password_file` reads it.
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// Rows deleted per `DELETE` statement (one short transaction each). Small batches keep row locks,
    /// undo and binlog events small and let replicas keep up. Between 1 and 100000.
    #[serde(default = "default_prune_batch_rows")]
    pub batch_rows: usize,
    /// Pause after each batch, in milliseconds, so that the server, its replicas and the connector (which
    /// reads every DELETE from the binlog and ignores it) are not flooded. 0 = no pause.
    #[serde(default = "default_prune_pause_ms")]
    pub pause_ms: u64,
}

impl Default for PruneConfig {
    fn default() -> Self {
        PruneConfig {
            host: None,
            port: None,
            user: None,
            password: None,
            password_env: None,
            password_file: None,
            batch_rows: default_prune_batch_rows(),
            pause_ms: default_prune_pause_ms(),
        }
    }
}

/// `[poll]`: the polling relay (`source.kind = "poll"`), for servers whose binlog the connector may not read.
///
/// One relay of a connector (`[state] name`) is active at a time, holding the lease on the source server
/// that the binlog source's standby uses ([`crate::lease`]); the others wait and take over within
/// `[delivery] failover_timeout_ms`. The active relay reads unpublished rows (`published_at IS NULL`) in the
/// order of the table's sequence column, publishes them, and once Kafka acknowledged them sets
/// `published_at`, one statement per batch (see `source::poll`).
#[derive(Debug, Clone, Deserialize)]
#[serde(from = "PollConfigToml")]
pub struct PollConfig {
    /// How an aggregate's events are ordered: "sequence" (default: the table's `AUTO_INCREMENT` column,
    /// insertion order; a table without one is refused with the `ALTER TABLE` that adds it) or
    /// "occurred_at" (`occurred_at`, then `id`: events that share a timestamp come out in id order, and
    /// writers with skewed clocks reorder an aggregate's events; every read also looks again at all
    /// unpublished rows, which costs more with many parked rows).
    pub order: PollOrder,
    /// The longest pause between reads while the table has nothing unpublished, in milliseconds: after an
    /// empty read the relay waits a sixteenth of it, doubling up to it, so an idle relay costs the
    /// database one statement per interval, and the first event after a quiet spell waits at most one
    /// interval. While rows keep coming, reads follow each other without pause. Between 16 and 3600000;
    /// default 1000.
    pub poll_interval_ms: u64,
    /// Rows read per statement, and the most marked published by one statement. Between 1 and 10000;
    /// default 1000.
    pub batch_rows: usize,
    /// No longer used: the relay takes over from a dead one after `[delivery] failover_timeout_ms`, and
    /// leases no rows. Accepted so that older files still load.
    pub lease_ms: Option<u64>,
    /// No longer used: a record the broker refuses for good is dead-lettered at once, as with the binlog
    /// source (its row's `attempts` counts the refusal), and an unreachable or slow broker is waited out,
    /// never counted. Accepted so that older files still load.
    pub max_attempts: Option<u32>,
    /// This relay's name in logs and in the lease (who holds it). Default: the host name and the process id
    /// (`host:pid`). Up to 128 characters.
    pub relay_id: Option<String>,
    /// Publish in Kafka transactions (default false), so that a relay that lost its lease is fenced at the
    /// broker: the producer's `transactional.id` is `[delivery] transactional_id` (default `[state] name`),
    /// shared by the relays of one connector, and the one that takes over fences the one before, whose
    /// open transaction is aborted and whose later records are refused. Without it, a relay paused past
    /// its lease (a VM freeze) can still send the records it had handed to its producer after its
    /// successor's: late duplicates that consumers applying events in order see as a step back. Needs a
    /// broker with transactions, and consumers reading with `isolation.level = read_committed` (the
    /// default of librdkafka and of the Java client's Kafka Streams with exactly-once; the Java consumer's
    /// default is `read_uncommitted`). Rows are marked published once their transaction committed.
    pub transactional: bool,
    /// Whether the file has a `[poll]` table (only meaningful with `source.kind = "poll"`).
    set: bool,
}

/// `[poll] order`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PollOrder {
    /// The table's `AUTO_INCREMENT` column: insertion order.
    #[default]
    Sequence,
    /// `occurred_at`, then the event id.
    OccurredAt,
}

/// `[poll]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PollConfigToml {
    #[serde(default)]
    order: PollOrder,
    #[serde(default = "default_poll_interval_ms")]
    poll_interval_ms: u64,
    #[serde(default = "default_poll_batch_rows")]
    batch_rows: usize,
    #[serde(default)]
    lease_ms: Option<u64>,
    #[serde(default)]
    max_attempts: Option<u32>,
    #[serde(default)]
    relay_id: Option<String>,
    #[serde(default)]
    transactional: bool,
}

impl From<PollConfigToml> for PollConfig {
    fn from(t: PollConfigToml) -> Self {
        PollConfig {
            order: t.order,
            poll_interval_ms: t.poll_interval_ms,
            batch_rows: t.batch_rows,
            lease_ms: t.lease_ms,
            max_attempts: t.max_attempts,
            relay_id: t.relay_id,
            transactional: t.transactional,
            set: true,
        }
    }
}

impl Default for PollConfig {
    fn default() -> Self {
        PollConfig {
            order: PollOrder::default(),
            poll_interval_ms: default_poll_interval_ms(),
            batch_rows: default_poll_batch_rows(),
            lease_ms: None,
            max_attempts: None,
            relay_id: None,
            transactional: false,
            set: false,
        }
    }
}

impl PollConfig {
    /// `relay_id`, or `host:pid` (the host name from the kernel, `HOSTNAME`, else `localhost`).
    pub fn relay_id(&self) -> String {
        if let Some(id) = &self.relay_id {
            return id.clone();
        }
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "localhost".into());
        let pid = std::process::id().to_string();
        let host: String = host.chars().take(127 - pid.len()).collect();
        format!("{host}:{pid}")
    }

    /// The keys this file sets that no longer do anything, for a warning at start.
    pub fn ignored_keys(&self) -> Vec<&'static str> {
        [("lease_ms", self.lease_ms.is_some()), ("max_attempts", self.max_attempts.is_some())]
            .into_iter()
            .filter_map(|(key, set)| set.then_some(key))
            .collect()
    }
}

fn default_poll_interval_ms() -> u64 {
    1_000
}
fn default_poll_batch_rows() -> usize {
    1_000
}

/// `[snapshot]`: rows that exist before the connector's first start.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotConfig {
    /// "initial" (default: snapshot when there is no checkpoint, then stream), "never" (stream only, from
    /// `source.start_from`), "initial_only" (snapshot, checkpoint, exit 0) or "when_needed" (like initial,
    /// and also re-snapshot when the checkpoint's position was purged from the server's binlogs).
    #[serde(default)]
    pub mode: SnapshotMode,
    /// Optional SQL condition restricting the snapshot, e.g. `published_at IS NULL`.
    #[serde(default)]
    pub r#where: Option<String>,
    /// Rows per chunk of the snapshot's streamed scan, and so per snapshot checkpoint (one chunk is read
    /// ahead while the previous one is produced: at most three are in memory).
    #[serde(default = "default_chunk_rows")]
    pub chunk_rows: usize,
    /// MySQL only: the brief lock that makes the snapshot's GTID read exact. "tables" (default,
    /// `LOCK TABLES … READ` on the outbox tables; needs the LOCK TABLES privilege) or "global"
    /// (`FLUSH TABLES WITH READ LOCK`; needs RELOAD, not allowed on most managed services). MariaDB needs
    /// no lock.
    #[serde(default)]
    pub lock: SnapshotLock,
    /// MySQL only: how long (seconds, at least 1) the snapshot's lock may wait behind an open transaction
    /// on the outbox tables. While it waits, the application's new outbox inserts wait behind it; when the
    /// time is up the connector gives up, logs why, and retries with back-off. Default 10.
    #[serde(default = "default_lock_wait_timeout_s")]
    pub lock_wait_timeout_s: u32,
}

impl Default for SnapshotConfig {
    fn default() -> Self {
        SnapshotConfig {
            mode: SnapshotMode::default(),
            r#where: None,
            chunk_rows: default_chunk_rows(),
            lock: SnapshotLock::default(),
            lock_wait_timeout_s: default_lock_wait_timeout_s(),
        }
    }
}

/// When to snapshot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotMode {
    /// Snapshot when there is no checkpoint, then stream.
    #[default]
    Initial,
    /// Never snapshot.
    Never,
    /// Snapshot, checkpoint, exit.
    InitialOnly,
    /// Like `initial`, and re-snapshot when the checkpoint's position was purged.
    WhenNeeded,
}

/// MySQL snapshot lock.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotLock {
    /// `LOCK TABLES … READ` on the outbox tables.
    #[default]
    Tables,
    /// `FLUSH TABLES WITH READ LOCK`.
    Global,
}

/// `[source]`: the database server, ideally a replica — or binlog files on disk.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceConfig {
    /// "server" (default: stream from a live server over the replication protocol), "files" (read binlog
    /// files from disk — `binlog_dir` or `binlog_files` — publish what they hold after the checkpoint or
    /// `start_after`, then exit 0 once everything is acknowledged and checkpointed) or "poll" (the polling
    /// relay, `[poll]`: claim unpublished rows of the table, publish them, set `published_at`; no binlog
    /// access needed, `SELECT, UPDATE` on the outbox table suffice). With "files" the connection settings
    /// (`host`, `user`, `server_id`, …) are not used; with "poll" they are, except `server_id`, which must
    /// not be set. Both need `[snapshot] mode = "never"`.
    #[serde(default)]
    pub kind: SourceKind,
    /// `kind = "files"`: a directory; every file in it that starts with the binlog magic bytes is read, in
    /// binlog index order (`mysql-bin.000009` before `mysql-bin.000010`). Other files (the `.index`) are
    /// ignored.
    #[serde(default)]
    pub binlog_dir: Option<PathBuf>,
    /// `kind = "files"`: the binlog files to read (instead of `binlog_dir`); read in binlog index order
    /// whatever order they are listed in. A file that is not a binlog is an error.
    #[serde(default)]
    pub binlog_files: Vec<PathBuf>,
    /// First run only (a checkpoint takes precedence): transactions already published, which are skipped
    /// — a MySQL GTID set (`uuid:1-100`) or a MariaDB GTID position (`0-1-100`), the way a replica's
    /// `gtid_executed` / `gtid_slave_pos` reads. With `kind = "files"` the default is everything after the
    /// first file's PREVIOUS_GTIDS / GTID_LIST. With `kind = "server"` (needs `snapshot.mode = "never"`
    /// and `resume_by = "gtid"`) the stream starts right after these GTIDs instead of at `start_from`: the
    /// way to take over from Debezium, whose offsets hold the GTIDs it published
    /// (docs/MIGRATING-FROM-DEBEZIUM.md). The server must still hold the binlogs after them, and must
    /// have executed them.
    #[serde(default)]
    pub start_after: Option<String>,
    /// Host name or IP address of the server. Required with `kind = "server"` and `kind = "poll"`.
    #[serde(default)]
    pub host: String,
    /// TCP port. Default 3306.
    #[serde(default = "default_port")]
    pub port: u16,
    /// User with REPLICATION SLAVE, REPLICATION CLIENT (MariaDB: BINLOG MONITOR) and SELECT on the outbox;
    /// with `kind = "poll"`, SELECT and UPDATE on the outbox table only. Required with `kind = "server"` and
    /// `kind = "poll"`.
    #[serde(default)]
    pub user: String,
    /// Password in clear. Prefer `password_file` or `password_env`. At most one of the three is set;
    /// none means no password.
    #[serde(default)]
    pub password: Option<Secret>,
    /// Name of an environment variable holding the password, read when the connector connects; it is an
    /// error if the variable is not set then.
    #[serde(default)]
    pub password_env: Option<String>,
    /// File holding the password (a Kubernetes Secret mounted as a volume, a Docker secret), read when the
    /// connector connects. One trailing line break is not part of the password; an empty or unreadable
    /// file is an error naming the path.
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// Replication client id; must be unique among all replicas and CDC clients of the server
    /// (a duplicate makes the server disconnect the older client). Required with `kind = "server"`, refused
    /// with `kind = "poll"`.
    #[serde(default)]
    pub server_id: u32,
    /// TLS to the server: "disabled", "required" (encrypt, do not verify) or "verify_identity".
    #[serde(default)]
    pub tls: TlsMode,
    /// PEM file with the CA certificate(s) that signed the server's certificate (for "verify_identity"). When
    /// set, only these CAs are trusted; without it, the public CAs compiled into the binary (not the system
    /// trust store).
    #[serde(default)]
    pub tls_ca_file: Option<PathBuf>,
    /// How the stream resumes: "gtid" (default; requires GTIDs on MySQL) or "file" (binlog file + position,
    /// for MySQL servers with gtid_mode=OFF; positions are then only valid on this one server, so a
    /// failover needs a new snapshot).
    #[serde(default)]
    pub resume_by: ResumeBy,
    /// Where to start when there is no checkpoint: "current" (events committed from now on) or "earliest"
    /// (the oldest binlog the server still has).
    #[serde(default)]
    pub start_from: StartFrom,
    /// Heartbeat period the server is asked to keep on an idle replication connection. A connection that
    /// stays silent for three periods is considered dead and is reconnected.
    #[serde(default = "default_heartbeat_ms")]
    pub heartbeat_interval_ms: u64,
    /// Timeout for establishing a connection.
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// First back-off ceiling before reconnecting after a transient failure; the ceiling doubles up to
    /// `reconnect_max_backoff_ms`, and each delay is drawn from [ceiling/2, ceiling] (see `app::backoff::Backoff`).
    #[serde(default = "default_backoff_initial_ms")]
    pub reconnect_initial_backoff_ms: u64,
    /// Upper bound of the reconnect delay.
    #[serde(default = "default_backoff_max_ms")]
    pub reconnect_max_backoff_ms: u64,
    /// Bytes of decoded changes the binlog reader may hold ahead of the producer (it reads and decodes on a
    /// task of its own). Counts towards the memory bound together with `kafka.max_in_flight_bytes`.
    #[serde(default = "default_read_ahead_bytes")]
    pub read_ahead_bytes: usize,
}

/// Where change events come from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceKind {
    /// A live server, over the replication protocol.
    #[default]
    Server,
    /// Binlog files on disk.
    Files,
    /// The outbox table itself, polled (`[poll]`): for servers whose binlog the connector may not read.
    Poll,
}

/// TLS mode of the database connection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TlsMode {
    /// Plain TCP.
    #[default]
    Disabled,
    /// Encrypted, server certificate not verified.
    Required,
    /// Encrypted, certificate and host name verified.
    VerifyIdentity,
}

/// How positions are stored and streams resumed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResumeBy {
    /// GTID set (MySQL) or GTID position (MariaDB): survives failover to another server of the topology.
    #[default]
    Gtid,
    /// Binlog file name and byte offset: explicit opt-in for MySQL with gtid_mode=OFF.
    File,
}

/// Start point when no checkpoint exists.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StartFrom {
    /// The server's current position: only transactions committed after start-up.
    #[default]
    Current,
    /// The oldest binlog the server still holds.
    Earliest,
}

/// `[outbox]`: the outbox table(s).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutboxConfig {
    /// One outbox table as `database.table`.
    #[serde(default)]
    pub table: Option<String>,
    /// Several outbox tables (same column layout), as `database.table`.
    #[serde(default)]
    pub tables: Vec<String>,
    /// What an UPDATE or DELETE on an outbox table does: "ignore" (default), "warn" or "fail".
    /// (Debezium: `table.op.invalid.behavior`.) Outbox rows are immutable facts; relays that mark rows as
    /// published update them, which is harmless.
    #[serde(default)]
    pub on_update: OnUpdate,
    /// Column names, if they differ from the default schema.
    #[serde(default)]
    pub columns: ColumnNames,
    /// What a row that cannot become a valid Kafka record does (undecodable value, empty aggregate id,
    /// illegal routed topic name, record over `kafka.max_record_bytes`, or refused by the broker for a
    /// non-retryable reason): "dead_letter" (default) sends it to `kafka.dead_letter_topic` and holds its
    /// aggregate in quarantine (later events of that aggregate follow it there, in order, until
    /// `outbox-cdc quarantine release`), while other aggregates flow on; "fail" stops with a definite error.
    #[serde(default)]
    pub on_poison: OnPoison,
    /// How the payload column is read: "json" (default: JSON, or text holding JSON, embedded in the
    /// envelope) or "bytes" (BLOB/VARBINARY: Avro, Protobuf…; the column's bytes become the record value
    /// unchanged, never parsed; needs `kafka.value_format = "payload"`).
    #[serde(default)]
    pub payload_encoding: PayloadEncoding,
    /// A NULL or empty payload publishes a tombstone (same key and headers, null value) instead of a dead
    /// letter. (Debezium: `route.tombstone.on.empty.payload`.)
    #[serde(default)]
    pub tombstone_on_empty_payload: bool,
    /// More columns to publish, each `"column:header[:name]"` (a Kafka header) or
    /// `"column:envelope[:name]"` (an envelope field), `name` defaulting to the column's.
    /// (Debezium: `table.fields.additional.placement`, same syntax.)
    #[serde(default)]
    pub additional_placement: Vec<String>,
}

/// Headers the connector writes itself: an additional placement may not take their names.
const RESERVED_HEADERS: &[&str] =
    &["id", "event_type", "aggregate_type", "schema_version", "source", "replay", "replayed_at", "released_from_hold"];

/// Envelope fields the connector writes itself.
const RESERVED_ENVELOPE_FIELDS: &[&str] =
    &["event_id", "type", "version", "occurred_at", "aggregate_type", "aggregate_id", "data"];

/// How the payload column is read (`[outbox] payload_encoding`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PayloadEncoding {
    /// JSON, or text holding JSON.
    #[default]
    Json,
    /// Bytes published unchanged.
    Bytes,
}

/// One `[outbox] additional_placement` entry, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The table's column.
    pub column: String,
    /// Where its value goes.
    pub target: PlacementTarget,
    /// The header's or envelope field's name.
    pub name: String,
}

/// Where an additional column is placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlacementTarget {
    /// A Kafka header holding the value's text.
    Header,
    /// A field of the envelope.
    Envelope,
}

impl Placement {
    /// `column:header[:name]` or `column:envelope[:name]`.
    ///
    /// # Errors
    /// What is wrong with `entry`, for the operator.
    pub fn parse(entry: &str) -> std::result::Result<Self, String> {
        let parts: Vec<&str> = entry.split(':').collect();
        let target = match parts.get(1) {
            Some(&"header") => PlacementTarget::Header,
            Some(&"envelope") => PlacementTarget::Envelope,
            _ => {
                return Err(format!(
                    "outbox.additional_placement entry {entry:?} must be \"column:header[:name]\" or \
                     \"column:envelope[:name]\""
                ))
            }
        };
        if parts.len() > 3 || parts.iter().any(|p| p.is_empty()) {
            return Err(format!(
                "outbox.additional_placement entry {entry:?} must be \"column:header[:name]\" or \
                 \"column:envelope[:name]\" (no empty part)"
            ));
        }
        Ok(Placement { column: parts[0].into(), target, name: parts.get(2).unwrap_or(&parts[0]).to_string() })
    }
}

/// Behaviour on poison rows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnPoison {
    /// Dead-letter the row and quarantine its aggregate.
    #[default]
    DeadLetter,
    /// Stop with a definite error naming the row.
    Fail,
}

/// Behaviour on UPDATE/DELETE of outbox rows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnUpdate {
    /// Skip silently (they are not events).
    #[default]
    Ignore,
    /// Skip with a warning.
    Warn,
    /// Stop with a definite error.
    Fail,
}

/// `[outbox.columns]`: column names (Debezium: `table.field.event.*`).
///
/// `id`, `aggregate_type`, `aggregate_id` and `payload` must exist under their (default or configured)
/// names. `event_type`, `schema_version`, `occurred_at` and `headers` are optional: a table without a
/// column of the *default* name simply publishes records without that field; a name *set* here must exist,
/// so that a typo is a definite error naming it instead of a silently dropped field.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(from = "ColumnNamesToml")]
pub struct ColumnNames {
    /// Stable event id, sent as the `id` header and `event_id` field.
    pub id: String,
    /// Aggregate type: routes to the topic.
    pub aggregate_type: String,
    /// Aggregate id: the Kafka key.
    pub aggregate_id: String,
    /// Event type (optional column).
    pub event_type: String,
    /// Schema version of the payload (optional column).
    pub schema_version: String,
    /// JSON payload.
    pub payload: String,
    /// JSON object whose top-level string entries become Kafka headers (optional column).
    pub headers: String,
    /// When the event occurred: DATETIME(n) or TIMESTAMP(n) (optional column).
    pub occurred_at: String,
    /// Which names were set in `[outbox.columns]`, in [`crate::outbox::SLOT_NAMES`] order.
    set: [bool; 8],
    /// The `[outbox] additional_placement` columns, each once, in its order (filled in by validation):
    /// every decoder reads them after the eight roles.
    additional: Vec<String>,
    /// `[outbox] payload_encoding` (filled in by validation): how decoders read the payload column.
    payload_encoding: PayloadEncoding,
}

/// `[outbox.columns]` as written: `None` where the default name applies.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ColumnNamesToml {
    id: Option<String>,
    aggregate_type: Option<String>,
    aggregate_id: Option<String>,
    event_type: Option<String>,
    schema_version: Option<String>,
    payload: Option<String>,
    headers: Option<String>,
    occurred_at: Option<String>,
}

impl From<ColumnNamesToml> for ColumnNames {
    fn from(t: ColumnNamesToml) -> Self {
        let set = [
            t.id.is_some(),
            t.aggregate_type.is_some(),
            t.aggregate_id.is_some(),
            t.event_type.is_some(),
            t.schema_version.is_some(),
            t.payload.is_some(),
            t.headers.is_some(),
            t.occurred_at.is_some(),
        ];
        let [id, aggregate_type, aggregate_id, event_type, schema_version, payload, headers, occurred_at] =
            crate::outbox::SLOT_NAMES;
        ColumnNames {
            id: t.id.unwrap_or_else(|| id.into()),
            aggregate_type: t.aggregate_type.unwrap_or_else(|| aggregate_type.into()),
            aggregate_id: t.aggregate_id.unwrap_or_else(|| aggregate_id.into()),
            event_type: t.event_type.unwrap_or_else(|| event_type.into()),
            schema_version: t.schema_version.unwrap_or_else(|| schema_version.into()),
            payload: t.payload.unwrap_or_else(|| payload.into()),
            headers: t.headers.unwrap_or_else(|| headers.into()),
            occurred_at: t.occurred_at.unwrap_or_else(|| occurred_at.into()),
            set,
            additional: Vec::new(),
            payload_encoding: PayloadEncoding::Json,
        }
    }
}

impl Default for ColumnNames {
    fn default() -> Self {
        ColumnNamesToml::default().into()
    }
}

/// Roles the table must have whatever `[outbox.columns]` says, in [`crate::outbox::SLOT_NAMES`] order.
const ALWAYS_REQUIRED: [bool; 8] = [true, true, true, false, false, true, false, false];

impl ColumnNames {
    /// The mapped columns in [`crate::outbox::SLOT_NAMES`] order, each with whether the table must have
    /// it: the four required roles always, an optional role when its name was set in `[outbox.columns]`.
    pub fn required(&self) -> [(&str, bool); 8] {
        let names = [
            &self.id,
            &self.aggregate_type,
            &self.aggregate_id,
            &self.event_type,
            &self.schema_version,
            &self.payload,
            &self.headers,
            &self.occurred_at,
        ];
        std::array::from_fn(|slot| (names[slot].as_str(), ALWAYS_REQUIRED[slot] || self.set[slot]))
    }

    /// Whether the column of role `slot` ([`crate::outbox::SLOT_NAMES`] order) must exist in the table.
    pub fn must_exist(&self, slot: usize) -> bool {
        ALWAYS_REQUIRED[slot] || self.set[slot]
    }

    /// The role ([`crate::outbox::SLOT_NAMES`] slot) whose column is `column`, if any.
    pub fn role_of(&self, column: &str) -> Option<usize> {
        self.required().iter().position(|(name, _)| name.eq_ignore_ascii_case(column))
    }

    /// The `[outbox] additional_placement` columns that are not a role's, each once, in its order: read
    /// after the eight roles.
    pub fn additional(&self) -> &[String] {
        &self.additional
    }

    /// How the payload column is read (`[outbox] payload_encoding`).
    pub fn payload_encoding(&self) -> PayloadEncoding {
        self.payload_encoding
    }

    /// The names with these additional columns and payload encoding, for tests and programmatic configs.
    #[must_use]
    pub fn reading(mut self, additional: Vec<String>, payload_encoding: PayloadEncoding) -> Self {
        (self.additional, self.payload_encoding) = (additional, payload_encoding);
        self
    }

    /// The names with `role` set explicitly to `name`, for tests and programmatic configs.
    #[must_use]
    pub fn with(mut self, role: &str, name: &str) -> Self {
        let slot = crate::outbox::SLOT_NAMES.iter().position(|r| *r == role).expect("a role of SLOT_NAMES");
        let field = match slot {
            0 => &mut self.id,
            1 => &mut self.aggregate_type,
            2 => &mut self.aggregate_id,
            3 => &mut self.event_type,
            4 => &mut self.schema_version,
            5 => &mut self.payload,
            6 => &mut self.headers,
            _ => &mut self.occurred_at,
        };
        *field = name.to_string();
        self.set[slot] = true;
        self
    }
}

/// `[kafka]`: the destination cluster.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaConfig {
    /// Comma-separated `host:port` list.
    pub bootstrap_servers: String,
    /// Topic template. Placeholders: `${aggregate_type}`, `${event_type}`, `${database}`, `${table}`.
    #[serde(default = "default_topic")]
    pub topic: String,
    /// "envelope" (default: event metadata + `data`), "payload" (the payload only), "cloudevents"
    /// (structured JSON CloudEvents 1.0), or the payload with its schema from `[schema_registry]` in the
    /// Confluent wire format: "avro" (an Avro datum), "json_schema" (the JSON, validated) or "protobuf"
    /// (the payload as Protobuf's canonical JSON, written as the schema's top-level message named like the
    /// row's `event_type`, else its first).
    #[serde(default)]
    pub value_format: ValueFormat,
    /// "string" (default: the aggregate id's bytes), "json" (the aggregate id as a JSON string, what
    /// Debezium with JsonConverter wrote: a migrated topic keeps its partitions) or "avro" (the aggregate id
    /// as an Avro `string` under the subject `<topic>-key`, Confluent wire format, as Debezium's
    /// AvroConverter wrote string keys).
    #[serde(default)]
    pub key_format: KeyFormat,
    /// The record timestamp: "produced" (default: when the connector produced it) or "occurred_at" (the
    /// row's `occurred_at` in ms, UTC, where the table has the column; Debezium:
    /// `table.field.event.timestamp`). Broker retention counts from this timestamp.
    #[serde(default)]
    pub record_timestamp: RecordTimestamp,
    /// Compression codec: "none", "gzip", "snappy", "lz4" (default) or "zstd".
    #[serde(default = "default_compression")]
    pub compression: String,
    /// Create routed topics that do not exist yet through the Admin API. When false, a missing topic is a
    /// definite error naming it.
    #[serde(default = "default_true")]
    pub create_topics: bool,
    /// Partitions of created topics; with `create_topics = false`, the fewest partitions `check` accepts of
    /// an existing routed or dead-letter topic.
    #[serde(default = "default_partitions")]
    pub topic_partitions: i32,
    /// Replication factor of created topics; -1 lets the broker decide (`default.replication.factor`).
    #[serde(default = "default_replication_factor")]
    pub topic_replication_factor: i32,
    /// Topic-level configs for created topics, e.g. `{ "min.insync.replicas" = "2" }`.
    #[serde(default)]
    pub topic_config: BTreeMap<String, String>,
    /// Upper bound, in bytes, of records handed to the producer and not yet acknowledged, each counted with
    /// ~1 KB for librdkafka's own bookkeeping of it. When reached, the binlog reader waits: a slow broker
    /// slows the reader instead of growing memory.
    #[serde(default = "default_max_in_flight_bytes")]
    pub max_in_flight_bytes: usize,
    /// Largest record the connector produces, in bytes (librdkafka `message.max.bytes`); also set as
    /// `max.message.bytes` on topics it creates. Outbox payloads of several MB need more than Kafka's
    /// 1 MB default. A larger record is refused by the producer with a definite error naming it.
    #[serde(default = "default_max_record_bytes")]
    pub max_record_bytes: usize,
    /// librdkafka properties passed through (TLS, SASL, `linger.ms`, `batch.size`, ...). The ones the
    /// delivery guarantee depends on are outbox-cdc's: `enable.idempotence` and `enable.gapless.guarantee`
    /// (true), `acks` (all), `message.timeout.ms`/`delivery.timeout.ms` (0: a record never times out),
    /// `retries` (unlimited), `max.in.flight.requests.per.connection` (at most 5), `queuing.strategy`,
    /// `partitioner` and `transactional.id`; another value is rejected, saying why.
    /// `Debug` masks secret-looking values.
    #[serde(default)]
    pub properties: Properties,
    /// librdkafka properties whose values come from environment variables, read when a command connects:
    /// `{ "sasl.password" = "KAFKA_PASSWORD" }`. Only for secrets (keys such as `sasl.username`,
    /// `sasl.password`, `sasl.oauthbearer.client.secret`, `ssl.key.password`, whose values no message ever
    /// shows); other properties belong in `properties`. A variable that is not set, or set to nothing, is
    /// an error naming it. A key may be set in only one of `properties`, `properties_env` and
    /// `properties_file`.
    #[serde(default)]
    pub properties_env: BTreeMap<String, String>,
    /// librdkafka properties whose values are the contents of files (a Kubernetes Secret mounted as a
    /// volume), read when a command connects: `{ "sasl.password" = "/run/secrets/kafka/password" }`.
    /// Same keys as `properties_env`; a file loses one trailing line break, and an empty or unreadable
    /// file is an error naming the path. (Certificates and keys librdkafka reads from a path itself go in
    /// `properties`: `ssl.ca.location`, `ssl.key.location`.)
    #[serde(default)]
    pub properties_file: BTreeMap<String, PathBuf>,
    /// Topic for poison rows and the held events of quarantined aggregates (see `outbox.on_poison`).
    /// Created like routed topics. Keyed by aggregate id, so each aggregate's held events stay in order.
    #[serde(default = "default_dead_letter_topic")]
    pub dead_letter_topic: String,
}

fn default_dead_letter_topic() -> String {
    "outbox-cdc.dead-letter".to_string()
}

/// Shape of the Kafka record value.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ValueFormat {
    /// `{"event_id","type","version","occurred_at","aggregate_type","aggregate_id","data"}`.
    #[default]
    Envelope,
    /// The payload only (Debezium's expanded payload): its JSON, or with `payload_encoding = "bytes"` its
    /// bytes.
    Payload,
    /// Structured JSON CloudEvents 1.0 (`specversion`, `id`, `source`, `type`, `subject`, `time`,
    /// `datacontenttype`, `data`).
    #[serde(rename = "cloudevents")]
    CloudEvents,
    /// The payload as an Avro datum of its registered schema, Confluent framed.
    Avro,
    /// The payload, validated against its registered JSON Schema, Confluent framed.
    JsonSchema,
    /// The payload (Protobuf's canonical JSON) as the registered schema's top-level message named like the
    /// row's `event_type` (else its first), Confluent framed with the message-index array.
    Protobuf,
}

impl ValueFormat {
    /// Whether the value is encoded with a schema from the registry.
    pub fn uses_registry(self) -> bool {
        matches!(self, ValueFormat::Avro | ValueFormat::JsonSchema | ValueFormat::Protobuf)
    }
}

/// Shape of the Kafka record key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyFormat {
    /// The aggregate id's UTF-8 bytes.
    #[default]
    String,
    /// The aggregate id as a JSON string (with quotes).
    Json,
    /// The aggregate id as an Avro `string` of the subject `<topic>-key`, Confluent framed.
    Avro,
}

/// `[schema_registry]`: a Confluent-compatible Schema Registry (Confluent, Apicurio's `ccompat` API,
/// Karapace, Redpanda) holding the schemas of the payloads.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchemaRegistryConfig {
    /// Base URL, or several tried in order while one cannot be reached: `"https://registry:8081"`.
    #[serde(deserialize_with = "one_or_many")]
    pub url: Vec<String>,
    /// The subject of a row's schema: a preset or a template. "topic_name" (default, Confluent's
    /// TopicNameStrategy: `${topic}-value`), "record_name" (RecordNameStrategy: `${event_type}`, so the
    /// event type is the record's full name), "topic_record_name" (`${topic}-${event_type}`), or a template
    /// with `${topic}`, `${aggregate_type}`, `${event_type}`.
    #[serde(default = "default_subject")]
    pub subject: String,
    /// Which version of the subject: "schema_version" (default: the row's `schema_version` is the
    /// subject's version number, so the table must have the column) or "latest" (the subject's latest
    /// version, looked up again every `latest_refresh_ms`).
    #[serde(default)]
    pub version: RegistryVersion,
    /// Register what is missing instead of dead-lettering: only the key schema (`"string"` under
    /// `<topic>-key`, with `key_format = "avro"`). Value schemas are never registered by the connector:
    /// they are the application's contract, written by its CI. Default false.
    #[serde(default)]
    pub auto_register: bool,
    /// HTTP basic auth user (Confluent Cloud: the API key). Needs a password.
    pub username: Option<String>,
    /// Basic auth password (Confluent Cloud: the API secret). Better `password_env` or `password_file`.
    pub password: Option<Secret>,
    /// Environment variable holding the basic auth password, read when a command connects.
    pub password_env: Option<String>,
    /// File holding the basic auth password (a mounted secret), read when a command connects.
    pub password_file: Option<PathBuf>,
    /// Bearer token (`Authorization: Bearer …`), instead of basic auth. Better `bearer_token_env` or
    /// `bearer_token_file`.
    pub bearer_token: Option<Secret>,
    /// Environment variable holding the bearer token.
    pub bearer_token_env: Option<String>,
    /// File holding the bearer token (re-read at each connection, so a rotated token is picked up on restart).
    pub bearer_token_file: Option<PathBuf>,
    /// PEM file of the CA certificates that sign the registry's certificate; default: the Mozilla roots
    /// built into the connector.
    pub tls_ca_file: Option<PathBuf>,
    /// Time limit of one registry request; a registry that does not answer in time is unreachable
    /// (transient: the run waits and starts again).
    #[serde(default = "default_registry_timeout_ms")]
    pub timeout_ms: u64,
    /// With `version = "latest"`: how old a subject's latest version may be before it is looked up again.
    #[serde(default = "default_latest_refresh_ms")]
    pub latest_refresh_ms: u64,
}

/// Which version of a subject a row is encoded with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RegistryVersion {
    /// The row's `schema_version`.
    #[default]
    SchemaVersion,
    /// The subject's latest version.
    Latest,
}

/// An authentication secret of the registry, as configured (read by [`SchemaRegistryConfig::auth`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegistryAuth {
    /// No credentials.
    None,
    /// HTTP basic auth.
    Basic {
        /// The user.
        username: String,
        /// The password.
        password: Secret,
    },
    /// `Authorization: Bearer`.
    Bearer(Secret),
}

impl SchemaRegistryConfig {
    /// The subject template, presets expanded.
    pub fn subject_template(&self) -> &str {
        match self.subject.as_str() {
            "topic_name" => "${topic}-value",
            "record_name" => "${event_type}",
            "topic_record_name" => "${topic}-${event_type}",
            template => template,
        }
    }

    /// The credentials, read from the environment or files where configured so.
    ///
    /// # Errors
    /// A definite error naming an unset variable or an unreadable or empty file.
    pub fn auth(&self) -> Result<RegistryAuth> {
        let password = match (&self.password, &self.password_env, &self.password_file) {
            (_, Some(var), _) => Some(from_env("schema_registry.password_env", var)?),
            (_, None, Some(path)) => Some(from_file("schema_registry.password_file", path)?),
            (password, None, None) => password.clone(),
        };
        let token = match (&self.bearer_token, &self.bearer_token_env, &self.bearer_token_file) {
            (_, Some(var), _) => Some(from_env("schema_registry.bearer_token_env", var)?),
            (_, None, Some(path)) => Some(from_file("schema_registry.bearer_token_file", path)?),
            (token, None, None) => token.clone(),
        };
        Ok(match (&self.username, password, token) {
            (Some(username), Some(password), _) => RegistryAuth::Basic { username: username.clone(), password },
            (_, _, Some(token)) => RegistryAuth::Bearer(token),
            _ => RegistryAuth::None,
        })
    }

    /// Checks the section on its own: URLs, one way to authenticate, the subject template.
    fn validate(&self) -> Result<()> {
        if self.url.is_empty() {
            return Err(Error::definite("schema_registry.url needs at least one URL"));
        }
        for url in &self.url {
            if !(url.starts_with("http://") || url.starts_with("https://")) || url.contains(['?', '#']) {
                return Err(Error::definite(format!(
                    "schema_registry.url {url:?} must be an http:// or https:// base URL (no query)"
                )));
            }
        }
        one_password(
            "schema_registry",
            self.password.is_some(),
            self.password_env.is_some(),
            self.password_file.is_some(),
        )?;
        let token = [self.bearer_token.is_some(), self.bearer_token_env.is_some(), self.bearer_token_file.is_some()];
        if token.iter().filter(|t| **t).count() > 1 {
            return Err(Error::definite(
                "schema_registry: set only one of bearer_token, bearer_token_env and bearer_token_file",
            ));
        }
        let password = self.password.is_some() || self.password_env.is_some() || self.password_file.is_some();
        if self.username.is_some() != password {
            return Err(Error::definite("schema_registry: basic auth needs both username and a password"));
        }
        if password && token.contains(&true) {
            return Err(Error::definite("schema_registry: choose basic auth (username, password) or a bearer token"));
        }
        if self.timeout_ms == 0 {
            return Err(Error::definite("schema_registry.timeout_ms must be at least 1"));
        }
        let template = self.subject_template();
        let mut rest = template;
        while let Some(start) = rest.find("${") {
            let end = rest[start..].find('}').map(|e| start + e).ok_or_else(|| {
                Error::definite(format!("schema_registry.subject {:?}: an unclosed ${{", self.subject))
            })?;
            let name = &rest[start + 2..end];
            if !["topic", "aggregate_type", "event_type"].contains(&name) {
                return Err(Error::definite(format!(
                    "schema_registry.subject {:?}: unknown placeholder ${{{name}}} (use ${{topic}},                      ${{aggregate_type}}, ${{event_type}}, or a preset: topic_name, record_name, topic_record_name)",
                    self.subject
                )));
            }
            rest = &rest[end + 1..];
        }
        if template.is_empty() {
            return Err(Error::definite("schema_registry.subject must not be empty"));
        }
        Ok(())
    }
}

fn one_or_many<'de, D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(deserializer)? {
        OneOrMany::One(url) => vec![url],
        OneOrMany::Many(urls) => urls,
    })
    .map(|urls| urls.into_iter().map(|u| u.trim_end_matches('/').to_string()).collect())
}

fn default_subject() -> String {
    "topic_name".into()
}

fn default_registry_timeout_ms() -> u64 {
    10_000
}

fn default_latest_refresh_ms() -> u64 {
    300_000
}

/// Which time the Kafka record carries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordTimestamp {
    /// When the connector produced the record (the producer's clock).
    #[default]
    Produced,
    /// The row's `occurred_at` (ms, UTC), where the table has the column.
    OccurredAt,
}

/// `[state]`: where the checkpoint, the snapshot's progress, holds and known poison live.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateConfig {
    /// "local" (default): an embedded store in `dir`, on this host's disk. "kafka": a compacted topic
    /// (`topic`), so that the process keeps nothing on disk: a pod without a volume, moved to another node,
    /// or a standby on another host resumes exactly. With "kafka" two instances of one connector (`name`)
    /// never publish at the same time: the one holding a lease on the source server publishes, the other
    /// waits (`[delivery] failover_timeout_ms`).
    #[serde(default)]
    pub backend: StateBackend,
    /// Directory of the embedded checkpoint store (created if missing); `backend = "local"` only.
    #[serde(default = "default_state_dir")]
    pub dir: PathBuf,
    /// The compacted topic of `backend = "kafka"` (created with `cleanup.policy=compact`, `retention.ms=-1`
    /// and one partition if missing). Several connectors may share it: their records are keyed by `name`.
    #[serde(default = "default_state_topic")]
    pub topic: String,
    /// This connector's name: the key of its records in the state topic, its lease on the source server,
    /// and the default `[delivery] transactional_id`. Connectors that share a state topic or a source
    /// server need different names; a standby has the same. 1-100 characters of `[A-Za-z0-9._-]`.
    #[serde(default = "default_connector_name")]
    pub name: String,
    /// The acknowledged watermark is written at most this often (and on graceful shutdown). Lower means a
    /// smaller duplicate window after a crash, at one fsync per write. With `[delivery] guarantee =
    /// "exactly_once"`, it is how often the Kafka transaction commits: the latency consumers with
    /// `read_committed` see, up to this interval.
    #[serde(default = "default_checkpoint_interval_ms")]
    pub checkpoint_interval_ms: u64,
}

impl Default for StateConfig {
    fn default() -> Self {
        StateConfig {
            backend: StateBackend::default(),
            dir: default_state_dir(),
            topic: default_state_topic(),
            name: default_connector_name(),
            checkpoint_interval_ms: default_checkpoint_interval_ms(),
        }
    }
}

/// `state.backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StateBackend {
    /// The embedded store under `state.dir`.
    #[default]
    Local,
    /// The compacted topic `state.topic`.
    Kafka,
}

/// `[delivery]`: what consumers can count on, and taking over from another instance.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeliveryConfig {
    /// "at_least_once" (default): after a crash, events not yet checkpointed are published again (same `id`
    /// header). "exactly_once": events and the checkpoint that covers them are written in one Kafka
    /// transaction, so consumers with `isolation.level=read_committed` see every event once across crashes
    /// and failovers (exceptions: docs/CONTRACT.md). Needs `[state] backend = "kafka"`.
    #[serde(default)]
    pub guarantee: Guarantee,
    /// The producer's `transactional.id` (`exactly_once`): stable across restarts and shared by a standby,
    /// so that a new instance fences an old one that is still alive. Default: `state.name`.
    #[serde(default)]
    pub transactional_id: Option<String>,
    /// With `exactly_once`, a transaction commits when it holds this many bytes of records, at the end of
    /// the source transaction that crossed it (or every `state.checkpoint_interval_ms`). A larger source
    /// transaction still commits whole: see docs/CONTRACT.md. Between 1 MiB and 1 GiB; default 64 MiB.
    #[serde(default = "default_transaction_max_bytes")]
    pub transaction_max_bytes: usize,
    /// With `[state] backend = "kafka"`: how soon a standby takes over after the active instance dies (kill,
    /// host loss, network cut), in milliseconds. The active instance stops publishing when it cannot renew
    /// its lease within half of this. Between 2000 and 600000; default 30000.
    #[serde(default = "default_failover_timeout_ms")]
    pub failover_timeout_ms: u64,
}

impl Default for DeliveryConfig {
    fn default() -> Self {
        DeliveryConfig {
            guarantee: Guarantee::default(),
            transactional_id: None,
            transaction_max_bytes: default_transaction_max_bytes(),
            failover_timeout_ms: default_failover_timeout_ms(),
        }
    }
}

/// `delivery.guarantee`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Guarantee {
    /// Every event at least once; a crash republishes what was not checkpointed.
    #[default]
    AtLeastOnce,
    /// Every event once to `read_committed` consumers: events and checkpoint in one Kafka transaction.
    ExactlyOnce,
}

impl Config {
    /// What makes two connectors of one `state.name` the same connector: the outbox tables, the topic
    /// template, the broker and the state topic. The lease's holder announces it
    /// ([`crate::lease::Lease::acquire_as`]) so that a standby of another connector can tell.
    pub fn fingerprint(&self) -> u32 {
        let tables: Vec<String> = self.tables().iter().map(ToString::to_string).collect();
        let text = format!(
            "{}\n{}\n{}\n{}",
            tables.join(","),
            self.kafka.topic,
            self.kafka.bootstrap_servers,
            self.state.topic
        );
        crc32fast::hash(text.as_bytes())
    }

    /// `delivery.transactional_id`, or `state.name`.
    pub fn transactional_id(&self) -> &str {
        self.delivery.transactional_id.as_deref().unwrap_or(&self.state.name)
    }

    /// Where the state lives, for messages: the state directory, or the state topic and connector name.
    pub fn state_location(&self) -> String {
        match self.state.backend {
            StateBackend::Local => self.state.dir.display().to_string(),
            StateBackend::Kafka => format!("Kafka topic {} (connector {})", self.state.topic, self.state.name),
        }
    }

    /// Whether this run writes events and checkpoints in Kafka transactions.
    pub fn exactly_once(&self) -> bool {
        self.delivery.guarantee == Guarantee::ExactlyOnce
    }
}

fn default_state_topic() -> String {
    "outbox-cdc.state".into()
}
fn default_connector_name() -> String {
    "outbox-cdc".into()
}
fn default_transaction_max_bytes() -> usize {
    64 * 1024 * 1024
}
fn default_failover_timeout_ms() -> u64 {
    30_000
}

fn default_port() -> u16 {
    3306
}
fn default_heartbeat_ms() -> u64 {
    5_000
}
fn default_connect_timeout_ms() -> u64 {
    10_000
}
fn default_backoff_initial_ms() -> u64 {
    250
}
fn default_backoff_max_ms() -> u64 {
    30_000
}
fn default_topic() -> String {
    "outbox.event.${aggregate_type}".into()
}
fn default_compression() -> String {
    "lz4".into()
}
fn default_true() -> bool {
    true
}
fn default_partitions() -> i32 {
    12
}
fn default_replication_factor() -> i32 {
    -1
}
fn default_max_in_flight_bytes() -> usize {
    16 * 1024 * 1024
}
fn default_read_ahead_bytes() -> usize {
    1024 * 1024
}
fn default_lock_wait_timeout_s() -> u32 {
    10
}

fn default_chunk_rows() -> usize {
    2_000
}
fn default_max_record_bytes() -> usize {
    16 * 1024 * 1024
}
fn default_state_dir() -> PathBuf {
    PathBuf::from("state")
}
fn default_checkpoint_interval_ms() -> u64 {
    1_000
}
fn default_prune_batch_rows() -> usize {
    1_000
}
fn default_prune_pause_ms() -> u64 {
    100
}

/// A librdkafka property the delivery guarantee depends on: the values that keep it (compared without
/// case), and why no other value may.
struct OwnedProperty {
    keys: &'static [&'static str],
    allowed: fn(&str) -> bool,
    why: &'static str,
}

/// librdkafka properties outbox-cdc sets itself (aliases included). A record that fails for good while a
/// later record of its partition gets through is written *after* that later record once the run restarts
/// from the checkpoint (A2, A1, A2): so no record may time out or run out of retries, and a batch that
/// fails for good must stop the producer (gap-less idempotence) rather than let the next batch through.
const OWNED_PROPERTIES: &[OwnedProperty] = &[
    OwnedProperty {
        keys: &["enable.idempotence"],
        allowed: |v| v.eq_ignore_ascii_case("true"),
        why: "the idempotent producer keeps each partition's records in order across retries and reconnects; \
              outbox-cdc always sets it to true",
    },
    OwnedProperty {
        keys: &["enable.gapless.guarantee"],
        allowed: |v| v.eq_ignore_ascii_case("true"),
        why: "without it a batch that fails for good lets the next batches of its partition through, and \
              the restart writes the failed records after them; outbox-cdc always sets it to true",
    },
    OwnedProperty {
        keys: &["acks", "request.required.acks"],
        allowed: |v| v.eq_ignore_ascii_case("all") || v == "-1",
        why: "only acks=all keeps an acknowledged record when a partition leader fails; outbox-cdc always \
              uses acks=all",
    },
    OwnedProperty {
        keys: &["message.timeout.ms", "delivery.timeout.ms"],
        allowed: |v| v == "0",
        why: "a record that times out lets later records of its partition through, and the restart writes it \
              after them. outbox-cdc never times a record out: while the broker is unreachable it waits \
              (logged, and outbox_cdc_ready = 0) and nothing unacknowledged is checkpointed",
    },
    OwnedProperty {
        keys: &["retries", "message.send.max.retries"],
        allowed: |v| v == "2147483647",
        why: "a record that runs out of retries fails while later records of its partition get through; \
              outbox-cdc retries without limit",
    },
    OwnedProperty {
        keys: &["max.in.flight.requests.per.connection", "max.in.flight"],
        allowed: |v| v.parse::<u32>().is_ok_and(|n| (1..=5).contains(&n)),
        why: "the idempotent producer keeps order with at most 5 requests in flight per connection",
    },
    OwnedProperty {
        keys: &["queuing.strategy"],
        allowed: |v| v.eq_ignore_ascii_case("fifo"),
        why: "records must leave in the order they were produced",
    },
    OwnedProperty {
        keys: &["partitioner"],
        allowed: |v| v == "murmur2_random",
        why: "outbox-cdc places each aggregate with murmur2 (the Java client's partitioner), so that every \
              client agrees on an aggregate's partition",
    },
    OwnedProperty {
        keys: &["transactional.id"],
        allowed: |_| false,
        why: "outbox-cdc sets it from [delivery] transactional_id with guarantee = \"exactly_once\" (the polling \
              relay: [poll] transactional = true)",
    },
];

/// librdkafka properties that have their own `[kafka]` setting.
const DEDICATED_PROPERTIES: &[&str] =
    &["bootstrap.servers", "compression.type", "compression.codec", "message.max.bytes"];

/// Refuses a `section` with more than one of `password`, `password_env` and `password_file`.
fn one_password(section: &str, literal: bool, env: bool, file: bool) -> Result<()> {
    match [literal, env, file].iter().filter(|set| **set).count() {
        0 | 1 => Ok(()),
        _ => Err(Error::definite(format!(
            "set at most one of {section}.password, {section}.password_env and {section}.password_file"
        ))),
    }
}

/// Refuses a `properties_env` or `properties_file` key that is set elsewhere too, that outbox-cdc owns or
/// has a dedicated setting for, or that is not a secret: only the values of secret-looking keys are kept
/// out of every message ([`crate::secret::is_secret_key`]), and these tables hold secrets.
fn validate_secret_properties(kafka: &KafkaConfig) -> Result<()> {
    let env = kafka.properties_env.iter().map(|(k, v)| ("properties_env", k, v.is_empty()));
    let file = kafka.properties_file.iter().map(|(k, v)| ("properties_file", k, v.as_os_str().is_empty()));
    for (table, key, empty) in env.chain(file) {
        let elsewhere = [
            ("properties", kafka.properties.contains_key(key)),
            ("properties_env", kafka.properties_env.contains_key(key)),
            ("properties_file", kafka.properties_file.contains_key(key)),
        ];
        if let Some((other, _)) = elsewhere.iter().find(|(other, set)| *set && *other != table) {
            return Err(Error::definite(format!(
                "kafka.{table}.\"{key}\" is set in kafka.{other} too: set each property in one place"
            )));
        }
        if empty {
            return Err(Error::definite(format!("kafka.{table}.\"{key}\" names nothing: name a variable or a file")));
        }
        if OWNED_PROPERTIES.iter().any(|o| o.keys.contains(&key.as_str())) {
            return Err(Error::definite(format!(
                "kafka.{table}.\"{key}\": outbox-cdc sets {key} itself (the delivery guarantee depends on it); \
                 remove it"
            )));
        }
        if DEDICATED_PROPERTIES.contains(&key.as_str()) {
            return Err(Error::definite(format!("kafka.{table}.\"{key}\": use the dedicated [kafka] setting instead")));
        }
        if !crate::secret::is_secret_key(key) {
            return Err(Error::definite(format!(
                "kafka.{table}.\"{key}\": {table} is for secrets (sasl.username, sasl.password, \
                 sasl.oauthbearer.client.secret, ssl.key.password, ...), whose values no message shows; \
                 {key} is not one, set it in [kafka.properties]"
            )));
        }
    }
    Ok(())
}

/// Refuses librdkafka properties that would weaken the delivery guarantee, saying why and what to do.
fn validate_kafka_properties(properties: &BTreeMap<String, String>) -> Result<()> {
    for (key, value) in properties {
        let Some(owned) = OWNED_PROPERTIES.iter().find(|o| o.keys.contains(&key.as_str())) else {
            continue;
        };
        if !(owned.allowed)(value.trim()) {
            return Err(Error::definite(format!(
                "kafka.properties.\"{key}\" = {value:?} would weaken the delivery guarantee: {}. Remove it from \
                 [kafka.properties]",
                owned.why
            )));
        }
    }
    Ok(())
}

impl Config {
    /// Reads, parses and validates a config file.
    ///
    /// # Errors
    /// Definite errors for an unreadable file, unknown keys, or inconsistent settings.
    pub fn load(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::definite(format!("cannot read config file {}: {e}", path.display())))?;
        Self::parse(&text).map_err(|e| e.context(format_args!("config file {}", path.display())))
    }

    /// Parses and validates config text.
    ///
    /// # Errors
    /// Definite errors for unknown keys or inconsistent settings.
    pub fn parse(text: &str) -> Result<Config> {
        let file: ConfigFile = toml::from_str(text).map_err(|e| toml_error(text, &e))?;
        file.validate()
    }

    /// The outbox tables, parsed, sorted, without duplicates; never empty.
    pub fn tables(&self) -> &[TableName] {
        &self.tables
    }

    /// `outbox.additional_placement`, parsed: more columns to publish as headers or envelope fields.
    pub fn placements(&self) -> &[Placement] {
        &self.placements
    }

    /// The topic template (`kafka.topic`), parsed.
    pub fn topic(&self) -> &TopicTemplate {
        &self.topic
    }

    /// The database password, read from the environment or a file if configured so.
    ///
    /// # Errors
    /// A definite error when `password_env` names a variable that is not set, or `password_file` a file
    /// that cannot be read or is empty.
    pub fn source_password(&self) -> Result<Option<Secret>> {
        match (&self.source.password_env, &self.source.password_file) {
            (Some(var), _) => from_env("source.password_env", var).map(Some),
            (None, Some(path)) => from_file("source.password_file", path).map(Some),
            (None, None) => Ok(self.source.password.clone()),
        }
    }
}

/// `transaction.timeout.ms` unless configured: how long a Kafka transaction may stay open (the broker's
/// `transaction.max.timeout.ms`, 15 minutes by default, caps it).
pub const DEFAULT_TRANSACTION_TIMEOUT_MS: u64 = 60_000;

impl KafkaConfig {
    /// The event producer's `transaction.timeout.ms` (`exactly_once`): `properties."transaction.timeout.ms"`,
    /// else [`DEFAULT_TRANSACTION_TIMEOUT_MS`].
    ///
    /// # Errors
    /// A definite error when the property is not a number.
    pub fn transaction_timeout_ms(&self) -> Result<u64> {
        match self.properties.get("transaction.timeout.ms") {
            Some(v) => v.trim().parse::<u64>().map_err(|_| {
                Error::definite(format!("kafka.properties.\"transaction.timeout.ms\" = {v:?} is not a number"))
            }),
            None => Ok(DEFAULT_TRANSACTION_TIMEOUT_MS),
        }
    }

    /// The librdkafka configuration every Kafka client starts from: the producer, the admin client, the
    /// state store's clients, and the consumers of `audit` and `quarantine release`; with the secrets of
    /// `properties_env` and `properties_file` read ([`KafkaConfig::resolved_properties`]).
    ///
    /// # Errors
    /// A definite error when a secret's variable or file is missing.
    pub fn client_config(&self) -> Result<rdkafka::config::ClientConfig> {
        let mut cc = rdkafka::config::ClientConfig::new();
        cc.set("bootstrap.servers", &self.bootstrap_servers).set("client.id", "outbox-cdc");
        for (k, v) in &self.resolved_properties()? {
            cc.set(k, v);
        }
        Ok(cc)
    }

    /// `properties` with the secrets of `properties_env` and `properties_file` added: what every Kafka
    /// client of every command (`run`, `check`, `audit`, `replay`, `quarantine release`) is configured with.
    ///
    /// # Errors
    /// A definite error naming the variable that is not set (or empty), or the file that cannot be read or
    /// is empty; never with a secret's value.
    pub fn resolved_properties(&self) -> Result<Properties> {
        let mut resolved: BTreeMap<String, String> =
            self.properties.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        for (key, var) in &self.properties_env {
            let secret = from_env(&format!("kafka.properties_env (for {key})"), var)?;
            if secret.expose().is_empty() {
                return Err(Error::definite(format!(
                    "kafka.properties_env (for {key}) names {var}, but that environment variable is empty"
                )));
            }
            resolved.insert(key.clone(), secret.expose().to_string());
        }
        for (key, path) in &self.properties_file {
            let secret = from_file(&format!("kafka.properties_file (for {key})"), path)?;
            resolved.insert(key.clone(), secret.expose().to_string());
        }
        Ok(resolved.into_iter().collect())
    }
}

/// The secret in environment variable `var`, which `setting` names.
fn from_env(setting: &str, var: &str) -> Result<Secret> {
    match std::env::var(var) {
        Ok(value) => Ok(Secret::new(value)),
        Err(std::env::VarError::NotPresent) => {
            Err(Error::definite(format!("{setting} names {var}, but that environment variable is not set")))
        }
        Err(std::env::VarError::NotUnicode(_)) => {
            Err(Error::definite(format!("{setting} names {var}, but that environment variable is not UTF-8 text")))
        }
    }
}

/// The secret in the file at `path`, which `setting` names ([`crate::secret::read_file`]).
fn from_file(setting: &str, path: &Path) -> Result<Secret> {
    crate::secret::read_file(path).map_err(|e| {
        let fix = match e {
            crate::secret::FileSecretError::Unreadable(_) => {
                "; mount the secret there, readable by the connector's user"
            }
            _ => "",
        };
        Error::definite(format!("{setting} names the file {}, but {e}{fix}", path.display()))
    })
}

impl ConfigFile {
    /// Checks that the settings make sense together and parses what is derived from them.
    ///
    /// # Errors
    /// A definite error naming the first setting that does not.
    fn validate(mut self) -> Result<Config> {
        let tables = self.outbox_tables()?;
        let source = &self.source;
        one_password(
            "source",
            source.password.is_some(),
            source.password_env.is_some(),
            source.password_file.is_some(),
        )?;
        self.validate_source_kind()?;
        self.validate_poll()?;
        self.validate_delivery()?;
        if self.source.kind == SourceKind::Server && self.source.server_id == 0 {
            return Err(Error::definite("source.server_id must be a non-zero id unique among the server's replicas"));
        }
        if self.source.tls != TlsMode::VerifyIdentity && self.source.tls_ca_file.is_some() {
            return Err(Error::definite("source.tls_ca_file only applies with source.tls = \"verify_identity\""));
        }
        let topic = TopicTemplate::parse(&self.kafka.topic)?;
        if !crate::topic::is_legal_topic(&self.kafka.dead_letter_topic) {
            return Err(Error::definite(format!(
                "kafka.dead_letter_topic {:?} is not a legal Kafka topic name (1-249 of [a-zA-Z0-9._-])",
                self.kafka.dead_letter_topic
            )));
        }
        if self.metrics.purge_warn_ratio.is_nan() || self.metrics.purge_warn_ratio <= 0.0 {
            return Err(Error::definite("metrics.purge_warn_ratio must be > 0 (e.g. 0.5)"));
        }
        validate_kafka_properties(&self.kafka.properties)?;
        for key in DEDICATED_PROPERTIES {
            if self.kafka.properties.contains_key(*key) {
                return Err(Error::definite(format!(
                    "kafka.properties.{key}: use the dedicated [kafka] setting instead"
                )));
            }
        }
        validate_secret_properties(&self.kafka)?;
        if !(1..=1_000_000).contains(&self.snapshot.chunk_rows) {
            return Err(Error::definite("snapshot.chunk_rows must be between 1 and 1000000"));
        }
        if self.snapshot.r#where.as_deref().is_some_and(|w| w.contains(';')) {
            return Err(Error::definite("snapshot.where must be one SQL condition (no `;`)"));
        }
        if self.kafka.topic_partitions < 1 {
            return Err(Error::definite("kafka.topic_partitions must be at least 1"));
        }
        if !(256 * 1024..=1024 * 1024 * 1024).contains(&self.source.read_ahead_bytes) {
            return Err(Error::definite("source.read_ahead_bytes must be between 256 KiB and 1 GiB"));
        }
        if self.kafka.max_in_flight_bytes < 1024 * 1024 {
            return Err(Error::definite("kafka.max_in_flight_bytes must be at least 1 MiB"));
        }
        if !(1024..=1_000_000_000).contains(&self.kafka.max_record_bytes) {
            return Err(Error::definite("kafka.max_record_bytes must be between 1024 and 1000000000"));
        }
        if !["none", "gzip", "snappy", "lz4", "zstd"].contains(&self.kafka.compression.as_str()) {
            return Err(Error::definite(format!(
                "kafka.compression = {:?}: expected none, gzip, snappy, lz4 or zstd",
                self.kafka.compression
            )));
        }
        if self.source.heartbeat_interval_ms == 0 || self.source.heartbeat_interval_ms > 4_294_967 {
            return Err(Error::definite("source.heartbeat_interval_ms must be between 1 and 4294967"));
        }
        if !(1..=100_000).contains(&self.prune.batch_rows) {
            return Err(Error::definite("prune.batch_rows must be between 1 and 100000"));
        }
        let prune = &self.prune;
        let prune_passwords = [prune.password.is_some(), prune.password_env.is_some(), prune.password_file.is_some()];
        one_password("prune", prune_passwords[0], prune_passwords[1], prune_passwords[2])?;
        if prune.user.is_none() && prune_passwords.contains(&true) {
            return Err(Error::definite(
                "prune.password/password_env/password_file need prune.user (the default is the source user)",
            ));
        }
        let placements = self.validate_shape()?;
        self.validate_registry()?;
        // Each column once, though it may be placed twice (as a header and in the envelope). A role's own
        // column (`type` placed as the header `eventType`) is read as that role, and must then exist.
        let mut additional: Vec<String> = Vec::new();
        for placement in &placements {
            match self.outbox.columns.role_of(&placement.column) {
                Some(slot) => self.outbox.columns.set[slot] = true,
                None if additional.iter().any(|c| c.eq_ignore_ascii_case(&placement.column)) => {}
                None => additional.push(placement.column.clone()),
            }
        }
        self.outbox.columns = self.outbox.columns.reading(additional, self.outbox.payload_encoding);
        Ok(Config {
            source: self.source,
            outbox: self.outbox,
            kafka: self.kafka,
            state: self.state,
            snapshot: self.snapshot,
            metrics: self.metrics,
            prune: self.prune,
            poll: self.poll,
            delivery: self.delivery,
            schema_registry: self.schema_registry,
            tables,
            topic,
            placements,
        })
    }

    /// The record's shape: payload encoding, value and key formats, additional placements.
    fn validate_shape(&self) -> Result<Vec<Placement>> {
        let (outbox, kafka) = (&self.outbox, &self.kafka);
        if outbox.payload_encoding == PayloadEncoding::Bytes && kafka.value_format != ValueFormat::Payload {
            return Err(Error::definite(
                "outbox.payload_encoding = \"bytes\" needs kafka.value_format = \"payload\": bytes (Avro, \
                 Protobuf…) cannot be embedded in a JSON envelope",
            ));
        }
        let mut placements = Vec::with_capacity(outbox.additional_placement.len());
        for entry in &outbox.additional_placement {
            let placement = Placement::parse(entry).map_err(Error::definite)?;
            if placement.target == PlacementTarget::Envelope && kafka.value_format != ValueFormat::Envelope {
                return Err(Error::definite(format!(
                    "outbox.additional_placement {entry:?} places a column in the envelope, and \
                     kafka.value_format = {:?} has none: place it as a header, or use value_format = \"envelope\"",
                    kafka.value_format
                )));
            }
            let clash = placements.iter().any(|p: &Placement| p.target == placement.target && p.name == placement.name);
            let reserved = match placement.target {
                PlacementTarget::Header => RESERVED_HEADERS.contains(&placement.name.as_str()),
                PlacementTarget::Envelope => RESERVED_ENVELOPE_FIELDS.contains(&placement.name.as_str()),
            };
            if clash || reserved {
                return Err(Error::definite(format!(
                    "outbox.additional_placement {entry:?}: the name `{}` is {}; give it another with \
                     \"column:{}:other_name\"",
                    placement.name,
                    if clash { "placed twice" } else { "one the connector writes itself" },
                    if placement.target == PlacementTarget::Header { "header" } else { "envelope" },
                )));
            }
            placements.push(placement);
        }
        Ok(placements)
    }

    /// `[schema_registry]`: present exactly when a format needs it; the columns its subject and version
    /// read become required.
    fn validate_registry(&mut self) -> Result<()> {
        let needs = self.kafka.value_format.uses_registry() || self.kafka.key_format == KeyFormat::Avro;
        let Some(registry) = &self.schema_registry else {
            return match needs {
                true => Err(Error::definite(format!(
                    "kafka.value_format = {:?} / key_format = {:?} needs a [schema_registry] section (url, \
                     credentials) to read the schemas from",
                    self.kafka.value_format, self.kafka.key_format
                ))),
                false => Ok(()),
            };
        };
        if !needs {
            return Err(Error::definite(
                "[schema_registry] is set, but no format uses it: set kafka.value_format = \"avro\", \"json_schema\" \\
                 or \"protobuf\" (or key_format = \"avro\"), or remove the section",
            ));
        }
        registry.validate()?;
        if self.kafka.value_format.uses_registry() {
            // The subject and version are read from these columns: the table must have them.
            if registry.subject_template().contains("${event_type}") {
                self.outbox.columns.set[3] = true;
            }
            if registry.version == RegistryVersion::SchemaVersion {
                self.outbox.columns.set[4] = true;
            }
        }
        Ok(())
    }

    /// `[state]` and `[delivery]`: exactly-once needs the Kafka backend, and names that Kafka and the lease
    /// accept.
    fn validate_delivery(&self) -> Result<()> {
        let (state, delivery) = (&self.state, &self.delivery);
        let legal_name = |n: &str| {
            (1..=100).contains(&n.len()) && n.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        };
        if !legal_name(&state.name) {
            return Err(Error::definite(format!(
                "state.name {:?} must be 1-100 characters of [A-Za-z0-9._-]",
                state.name
            )));
        }
        if !crate::topic::is_legal_topic(&state.topic) {
            return Err(Error::definite(format!(
                "state.topic {:?} is not a legal Kafka topic name (1-249 of [a-zA-Z0-9._-])",
                state.topic
            )));
        }
        if delivery.transactional_id.as_deref().is_some_and(|id| id.is_empty() || id.len() > 249) {
            return Err(Error::definite("delivery.transactional_id must be 1 to 249 characters"));
        }
        if state.checkpoint_interval_ms == 0 {
            return Err(Error::definite(
                "state.checkpoint_interval_ms must be at least 1: it is the period of the checkpoint writer (with \
                 exactly_once, of the Kafka commits)",
            ));
        }
        if !(2_000..=600_000).contains(&delivery.failover_timeout_ms) {
            return Err(Error::definite("delivery.failover_timeout_ms must be between 2000 and 600000"));
        }
        if !(1024 * 1024..=1024 * 1024 * 1024).contains(&delivery.transaction_max_bytes) {
            return Err(Error::definite("delivery.transaction_max_bytes must be between 1 MiB and 1 GiB"));
        }
        if state.backend == StateBackend::Kafka && self.source.kind == SourceKind::Poll {
            return Err(Error::definite(
                "state.backend = \"kafka\" does not apply to the polling relay: its state is the outbox table \
                 itself (published_at, parked rows), and its standbys share it through the source server's \
                 lease; remove it",
            ));
        }
        if state.backend == StateBackend::Kafka && self.source.kind == SourceKind::Files {
            return Err(Error::definite(
                "state.backend = \"kafka\" needs a source server: its lease (which keeps two instances from \
                 publishing at once) is held there, and source.kind = \"files\" has none; use the local backend",
            ));
        }
        if delivery.guarantee == Guarantee::ExactlyOnce {
            if self.source.kind == SourceKind::Poll {
                return Err(Error::definite(
                    "delivery.guarantee = \"exactly_once\" needs the binlog: the polling relay marks rows \
                     published in the database after Kafka acknowledged them, and no transaction spans both; use \
                     \"at_least_once\" (each event keeps its `id` header for consumers to deduplicate)",
                ));
            }
            if state.backend != StateBackend::Kafka {
                return Err(Error::definite(
                    "delivery.guarantee = \"exactly_once\" needs [state] backend = \"kafka\": the checkpoint is \
                     written in the same Kafka transaction as the events it covers",
                ));
            }
            let timeout_ms = self.kafka.transaction_timeout_ms()?;
            if state.checkpoint_interval_ms.saturating_mul(2) > timeout_ms {
                return Err(Error::definite(format!(
                    "state.checkpoint_interval_ms = {} is more than half of kafka.properties.\"transaction.timeout.ms\" \
                     = {timeout_ms}: a transaction stays open about one interval and then commits, and the broker \
                     aborts one that stays open longer than that timeout, so the commits would fail (at or above \
                     it, none would ever succeed). Lower the interval, or raise the timeout (at most the broker's \
                     transaction.max.timeout.ms, 15 minutes by default)",
                    state.checkpoint_interval_ms
                )));
            }
        }
        Ok(())
    }

    /// `[poll]`: only with `source.kind = "poll"` (a `[poll]` table elsewhere is a misunderstanding), and
    /// with bounds that keep the relay's load and its lease meaningful.
    fn validate_poll(&self) -> Result<()> {
        let poll = &self.poll;
        if self.source.kind != SourceKind::Poll {
            if poll.set {
                return Err(Error::definite("[poll] applies only with source.kind = \"poll\""));
            }
            return Ok(());
        }
        if !(1..=10_000).contains(&poll.batch_rows) {
            return Err(Error::definite("poll.batch_rows must be between 1 and 10000"));
        }
        if !(16..=3_600_000).contains(&poll.poll_interval_ms) {
            return Err(Error::definite("poll.poll_interval_ms must be between 16 and 3600000"));
        }
        if poll.transactional {
            // The relay's transactions commit back to back; only the timeout's bounds apply.
            self.kafka.transaction_timeout_ms()?;
        }
        match &poll.relay_id {
            Some(id) if id.is_empty() || id.len() > 128 => {
                Err(Error::definite("poll.relay_id must be 1 to 128 characters"))
            }
            _ => Ok(()),
        }
    }

    fn validate_source_kind(&self) -> Result<()> {
        let source = &self.source;
        match source.kind {
            SourceKind::Server => {
                if source.binlog_dir.is_some() || !source.binlog_files.is_empty() {
                    return Err(Error::definite(
                        "source.binlog_dir and source.binlog_files apply only with source.kind = \"files\"",
                    ));
                }
                if source.start_after.is_some() && self.snapshot.mode != SnapshotMode::Never {
                    return Err(Error::definite(
                        "source.start_after starts streaming after GTIDs already published (e.g. by Debezium), \
                         without a snapshot: set [snapshot] mode = \"never\"",
                    ));
                }
                if source.start_after.is_some() && source.resume_by != ResumeBy::Gtid {
                    return Err(Error::definite(
                        "source.start_after is a GTID position: it needs source.resume_by = \"gtid\"",
                    ));
                }
                if source.host.is_empty() || source.user.is_empty() {
                    return Err(Error::definite("source.host and source.user are required (source.kind = \"server\")"));
                }
            }
            SourceKind::Poll => {
                if source.binlog_dir.is_some() || !source.binlog_files.is_empty() || source.start_after.is_some() {
                    return Err(Error::definite(
                        "source.binlog_dir, source.binlog_files and source.start_after apply only with \
                         source.kind = \"files\"",
                    ));
                }
                if source.host.is_empty() || source.user.is_empty() {
                    return Err(Error::definite("source.host and source.user are required (source.kind = \"poll\")"));
                }
                if source.server_id != 0 {
                    return Err(Error::definite(
                        "source.server_id is the binlog client's id; the polling relay (source.kind = \"poll\") \
                         reads no binlog: remove it",
                    ));
                }
                // The relay publishes every unpublished row (published_at IS NULL) whatever the mode:
                // "initial" (the default) and "never" both fit it; the modes that promise more do not.
                if matches!(self.snapshot.mode, SnapshotMode::InitialOnly | SnapshotMode::WhenNeeded) {
                    return Err(Error::definite(
                        "source.kind = \"poll\" publishes every unpublished row of the table (published_at IS \
                         NULL) and reads no binlog, so [snapshot] mode = \"initial_only\" or \"when_needed\" \
                         has nothing to do: remove [snapshot] mode",
                    ));
                }
            }
            SourceKind::Files => {
                if source.binlog_dir.is_some() != source.binlog_files.is_empty() {
                    return Err(Error::definite(
                        "source.kind = \"files\" needs exactly one of source.binlog_dir (a directory) or \
                         source.binlog_files (a list of files)",
                    ));
                }
                if self.snapshot.mode != SnapshotMode::Never {
                    return Err(Error::definite(
                        "source.kind = \"files\" reads only what the binlog files hold; there is no table to \
                         snapshot. Set [snapshot] mode = \"never\"",
                    ));
                }
            }
        }
        if let Some(after) = &source.start_after {
            let mysql = after.parse::<crate::position::mysql::GtidSet>();
            let mariadb = after.parse::<crate::position::mariadb::GtidPos>();
            if let (Err(a), Err(b)) = (mysql, mariadb) {
                return Err(Error::definite(format!(
                    "source.start_after = {after:?} is neither a MySQL GTID set ({a}) nor a MariaDB GTID \
                     position ({b})"
                )));
            }
        }
        Ok(())
    }

    /// The configured outbox tables, parsed, sorted and without duplicates.
    ///
    /// # Errors
    /// A definite error when none (or a malformed one) is configured.
    fn outbox_tables(&self) -> Result<Vec<TableName>> {
        let mut names: Vec<TableName> = self
            .outbox
            .table
            .iter()
            .chain(self.outbox.tables.iter())
            .map(|s| TableName::parse(s).map_err(Error::definite))
            .collect::<Result<_>>()?;
        names.sort();
        names.dedup();
        if names.is_empty() {
            return Err(Error::definite("configure the outbox table: [outbox] table = \"database.table\""));
        }
        Ok(names)
    }
}

/// A TOML error as line, column and toml's message, without the source line toml's `Display` quotes
/// (`5 | pasword = "hunter2"` would print a misspelled password), and with the values of secret-looking
/// keys masked where the message quotes them (`invalid type: integer `1234``).
fn toml_error(text: &str, error: &toml::de::Error) -> Error {
    let message = error.message().trim().replace('\n', "; ");
    let message = crate::secret::mask_values(&message, &crate::secret::values_in_toml(text));
    match error.span() {
        Some(span) => {
            let before = text.get(..span.start).unwrap_or(text);
            let line = before.matches('\n').count() + 1;
            let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            Error::definite(format!("line {line}, column {column}: {message}"))
        }
        None => Error::definite(message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
        [source]
        host = "127.0.0.1"
        user = "cdc"
        password = "pw"
        server_id = 5401
        [outbox]
        table = "shop.outbox_events"
        [kafka]
        bootstrap_servers = "127.0.0.1:9092"
    "#;

    /// `[schema_registry]` exactly when a format needs it; one way to authenticate; presets expand; the
    /// columns the subject and version read become required.
    #[test]
    fn schema_registry_section_rules() {
        let with = |kafka: &str, section: &str| {
            Config::parse(&format!("{}\n{kafka}\n{section}", MINIMAL.trim_end())).map_err(|e| e.to_string())
        };
        let registry = "[schema_registry]\nurl = \"http://r:8081/\"";
        let err = with("value_format = \"avro\"", "").unwrap_err();
        assert!(err.contains("needs a [schema_registry] section"), "{err}");
        assert!(with("", registry).unwrap_err().contains("no format uses it"));
        let c = with("value_format = \"avro\"", registry).unwrap();
        let r = c.schema_registry.as_ref().unwrap();
        assert_eq!((r.url.clone(), r.subject_template()), (vec!["http://r:8081".to_string()], "${topic}-value"));
        assert_eq!(r.auth().unwrap(), RegistryAuth::None);
        assert!(c.outbox.columns.must_exist(4) && !c.outbox.columns.must_exist(3), "schema_version is read");
        let c =
            with("value_format = \"avro\"", &format!("{registry}\nsubject = \"record_name\"\nversion = \"latest\""))
                .unwrap();
        assert!(c.outbox.columns.must_exist(3) && !c.outbox.columns.must_exist(4), "event_type is read");
        assert!(with("key_format = \"avro\"", registry).is_ok());
        for (bad, why) in [
            ("subject = \"${topic}.${table}\"", "unknown placeholder ${table}"),
            ("username = \"u\"", "needs both username and a password"),
            ("username = \"u\"\npassword = \"p\"\nbearer_token = \"t\"", "or a bearer token"),
            ("bearer_token = \"t\"\nbearer_token_env = \"T\"", "only one of bearer_token"),
            ("timeout_ms = 0", "timeout_ms"),
        ] {
            let err = with("value_format = \"avro\"", &format!("{registry}\n{bad}")).unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
        }
        let err = with("value_format = \"avro\"", "[schema_registry]\nurl = [\"ftp://r\"]").unwrap_err();
        assert!(err.contains("http:// or https://"), "{err}");
        let basic =
            with("value_format = \"avro\"", &format!("{registry}\nusername = \"u\"\npassword = \"p\"")).unwrap();
        let auth = basic.schema_registry.unwrap().auth().unwrap();
        assert_eq!(auth, RegistryAuth::Basic { username: "u".into(), password: Secret::new("p") });
    }

    #[test]
    fn minimal_config_gets_defaults() {
        let c = Config::parse(MINIMAL).unwrap();
        assert_eq!(c.source.port, 3306);
        assert_eq!(c.kafka.topic, "outbox.event.${aggregate_type}");
        assert_eq!(c.kafka.value_format, ValueFormat::Envelope);
        assert_eq!(c.state.dir, PathBuf::from("state"));
        assert_eq!(c.outbox.on_update, OnUpdate::Ignore);
        assert_eq!(c.tables().to_vec(), vec![TableName { database: "shop".into(), table: "outbox_events".into() }]);
    }

    /// The optional roles may be absent from the table under their default names, never under a name set
    /// in `[outbox.columns]` (a typo must not drop a field silently); the required roles must always
    /// exist. Existing configs parse as before, unknown keys are still refused.
    #[test]
    fn column_names_know_which_were_set() {
        let c = Config::parse(MINIMAL).unwrap();
        let required: Vec<bool> = c.outbox.columns.required().iter().map(|(_, r)| *r).collect();
        assert_eq!(required, [true, true, true, false, false, true, false, false]);
        assert_eq!(c.outbox.columns, ColumnNames::default());

        let text = MINIMAL.replace(
            "table = \"shop.outbox_events\"",
            "table = \"shop.outbox_events\"\n[outbox.columns]\naggregate_type = \"aggregatetype\"\n\
             event_type = \"type\"\noccurred_at = \"event_type\"",
        );
        let columns = Config::parse(&text).unwrap().outbox.columns;
        let mapped: Vec<(&str, bool)> = columns.required().to_vec();
        assert_eq!(
            mapped,
            [
                ("id", true),
                ("aggregatetype", true),
                ("aggregate_id", true),
                ("type", true),
                ("schema_version", false),
                ("payload", true),
                ("headers", false),
                ("event_type", true),
            ]
        );
        assert_eq!(
            ColumnNames::default()
                .with("event_type", "type")
                .with("aggregate_type", "aggregatetype")
                .with("occurred_at", "event_type"),
            columns
        );

        let typo = MINIMAL.replace(
            "table = \"shop.outbox_events\"",
            "table = \"shop.outbox_events\"\n[outbox.columns]\noccured_at = \"t\"",
        );
        assert!(Config::parse(&typo).unwrap_err().to_string().contains("occured_at"));
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let text = MINIMAL.replace("server_id = 5401", "server_id = 5401\nserverid = 1");
        let err = Config::parse(&text).unwrap_err();
        assert!(err.to_string().contains("serverid"), "{err}");
    }

    /// Guards against a user-set `message.timeout.ms` (or a retry limit, or idempotence without the
    /// gap-less guarantee) letting later records of a partition overtake one that failed: the restart would
    /// then write A2, A1, A2. Each owned property (and its librdkafka alias) is refused with the reason, and
    /// the values that keep the guarantee are accepted.
    #[test]
    fn properties_that_weaken_the_delivery_guarantee_are_rejected() {
        let cases: &[(&str, &str, Option<&str>)] = &[
            ("enable.idempotence", "false", Some("in order across retries")),
            ("enable.idempotence", "TRUE", None),
            ("enable.gapless.guarantee", "false", Some("fails for good")),
            ("enable.gapless.guarantee", "true", None),
            ("acks", "1", Some("acks=all")),
            ("request.required.acks", "0", Some("acks=all")),
            ("acks", "all", None),
            ("acks", "-1", None),
            ("message.timeout.ms", "2000", Some("never times a record out")),
            ("delivery.timeout.ms", "300000", Some("never times a record out")),
            ("message.timeout.ms", "0", None),
            ("retries", "10", Some("retries without limit")),
            ("message.send.max.retries", "3", Some("retries without limit")),
            ("max.in.flight.requests.per.connection", "6", Some("at most 5")),
            ("max.in.flight", "0", Some("at most 5")),
            ("max.in.flight", "1", None),
            ("max.in.flight.requests.per.connection", "5", None),
            ("queuing.strategy", "lifo", Some("order they were produced")),
            ("partitioner", "consistent_random", Some("murmur2")),
            ("transactional.id", "outbox", Some("[delivery] transactional_id")),
            ("linger.ms", "20", None),
            ("batch.size", "65536", None),
        ];
        for (key, value, refusal) in cases {
            let text = format!("{MINIMAL}\n[kafka.properties]\n\"{key}\" = \"{value}\"\n");
            match (Config::parse(&text), refusal) {
                (Ok(_), None) => {}
                (Err(e), Some(why)) => {
                    let e = e.to_string();
                    assert!(e.contains(key) && e.contains(why) && e.contains("Remove it"), "{key}={value}: {e}");
                }
                (result, _) => panic!("{key}={value}: {:?}", result.map(|_| ())),
            }
        }
    }

    #[test]
    fn malformed_table_names_are_rejected() {
        for bad in ["outbox", ".t", "db.", "a.b.c"] {
            let text = MINIMAL.replace("shop.outbox_events", bad);
            assert!(Config::parse(&text).is_err(), "{bad}");
        }
    }

    #[test]
    fn password_env_must_exist() {
        let text = MINIMAL.replace("password = \"pw\"", "password_env = \"OUTBOX_CDC_TEST_UNSET_VAR\"");
        let c = Config::parse(&text).unwrap();
        assert!(c.source_password().unwrap_err().to_string().contains("OUTBOX_CDC_TEST_UNSET_VAR"));
    }

    #[test]
    fn secrets_are_redacted_in_debug() {
        let c = Config::parse(MINIMAL).unwrap();
        let dbg = format!("{c:?}");
        assert!(!dbg.contains("\"pw\""), "{dbg}");
    }

    /// Regression: `[kafka.properties]` printed every value in `Debug`, a SASL password (or a misspelled
    /// one) included.
    #[test]
    fn kafka_property_secrets_are_redacted_in_debug() {
        let text = format!(
            "{MINIMAL}\n[kafka.properties]\n\"sasl.password\" = \"hunter2\"\n\"sasl.pasword\" = \"hunter3\"\n\
             \"linger.ms\" = \"7\"\n[prune]\nuser = \"p\"\npassword = \"hunter4\"\n"
        );
        let c = Config::parse(&text).unwrap();
        let dbg = format!("{c:?}");
        for secret in ["hunter2", "hunter3", "hunter4"] {
            assert!(!dbg.contains(secret), "{secret} in {dbg}");
        }
        assert!(dbg.contains(r#""linger.ms": "7""#), "{dbg}");
        assert_eq!(c.kafka.properties.get("sasl.password").map(String::as_str), Some("hunter2"));
    }

    /// Regression: a TOML error quoted the offending line, so a misspelled `pasword = "hunter2"` printed
    /// the password; a type error quoted the value (`invalid type: integer `12345``). The error still says
    /// where and what is wrong.
    #[test]
    fn toml_errors_name_the_place_but_never_a_secret_value() {
        let cases: &[(&str, &str, &str)] = &[
            ("password = \"pw\"", "pasword = \"hunter2\"", "unknown field `pasword`"),
            ("password = \"pw\"", "password = 12345", "invalid type: integer `***`"),
            ("password = \"pw\"", "pasword = hunter2", "line 5, column"),
            ("password = \"pw\"", "password = \"hunter2", "line 5, column"),
        ];
        for (from, to, expected) in cases {
            let text = MINIMAL.replace(from, to);
            let err = Config::parse(&text).unwrap_err().to_string();
            assert!(err.contains(expected), "{to}: {err}");
            assert!(err.starts_with("line 5, column "), "{to}: {err}");
            for secret in ["hunter2", "12345"] {
                assert!(!err.contains(secret), "{to}: {err}");
            }
        }
    }

    #[test]
    fn bad_topic_template_is_rejected() {
        let text = format!("{}\ntopic = \"x.${{nope}}\"\n", MINIMAL.trim_end());
        assert!(Config::parse(&text).unwrap_err().to_string().contains("nope"));
    }

    const FILES: &str = r#"
        [source]
        kind = "files"
        binlog_dir = "/backup/binlogs"
        [outbox]
        table = "shop.outbox_events"
        [kafka]
        bootstrap_servers = "127.0.0.1:9092"
        [snapshot]
        mode = "never"
    "#;

    /// `kind = "files"` needs no connection settings, exactly one of binlog_dir/binlog_files, no snapshot, and
    /// a start_after of either GTID kind; the files keys are rejected with a live server.
    #[test]
    fn files_source_settings_are_validated() {
        let c = Config::parse(FILES).unwrap();
        assert_eq!(c.source.kind, SourceKind::Files);
        let cases: &[(&str, &str, Option<&str>)] = &[
            ("binlog_dir = \"/backup/binlogs\"", "binlog_files = [\"/b/mysql-bin.000001\"]", None),
            ("binlog_dir = \"/backup/binlogs\"", "", Some("exactly one of")),
            ("binlog_dir = \"/backup/binlogs\"", "binlog_dir = \"/b\"\nbinlog_files = [\"/b/x\"]", Some("exactly one")),
            ("mode = \"never\"", "mode = \"initial\"", Some("no table to snapshot")),
            ("kind = \"files\"", "kind = \"files\"\nstart_after = \"0-1-100\"", None),
            ("kind = \"files\"", "kind = \"files\"\nstart_after = \"3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5\"", None),
            ("kind = \"files\"", "kind = \"files\"\nstart_after = \"yesterday\"", Some("neither a MySQL GTID set")),
        ];
        for (from, to, error) in cases {
            let result = Config::parse(&FILES.replace(from, to));
            match error {
                None => assert!(result.is_ok(), "{to}: {result:?}"),
                Some(e) => assert!(result.unwrap_err().to_string().contains(e), "{to}"),
            }
        }
        let live = MINIMAL.replace("server_id = 5401", "server_id = 5401\nbinlog_dir = \"/b\"");
        assert!(Config::parse(&live).unwrap_err().to_string().contains("only with"));
        let no_host = MINIMAL.replace("host = \"127.0.0.1\"", "");
        assert!(Config::parse(&no_host).unwrap_err().to_string().contains("source.host"));
    }

    /// Where each secret can come from, one row per rule: at most one source per password; the Kafka
    /// secret tables take only secret-looking keys, set nowhere else, never one outbox-cdc owns.
    #[test]
    fn secret_sources_are_validated() {
        let source = |password: &str| MINIMAL.replace("password = \"pw\"", password);
        let kafka = |tables: &str| format!("{MINIMAL}\n{tables}\n");
        let cases: &[(String, Option<&str>)] = &[
            (source("password_file = \"/run/secrets/db\""), None),
            (source("password_env = \"PW\""), None),
            (source(""), None),
            (source("password = \"pw\"\npassword_file = \"/f\""), Some("at most one of source.password")),
            (source("password_env = \"PW\"\npassword_file = \"/f\""), Some("at most one of source.password")),
            (format!("{MINIMAL}\n[prune]\nuser = \"p\"\npassword_file = \"/f\"\n"), None),
            (format!("{MINIMAL}\n[prune]\npassword_file = \"/f\"\n"), Some("need prune.user")),
            (
                format!("{MINIMAL}\n[prune]\nuser = \"p\"\npassword_env = \"PW\"\npassword_file = \"/f\"\n"),
                Some("at most one of prune.password"),
            ),
            (kafka("[kafka.properties_env]\n\"sasl.password\" = \"KAFKA_PASSWORD\""), None),
            (kafka("[kafka.properties_file]\n\"sasl.username\" = \"/u\"\n\"sasl.password\" = \"/p\""), None),
            (kafka("[kafka.properties_file]\n\"sasl.oauthbearer.client.secret\" = \"/s\""), None),
            (
                kafka("[kafka.properties]\n\"sasl.password\" = \"x\"\n[kafka.properties_env]\n\"sasl.password\" = \"P\""),
                Some("kafka.properties_env.\"sasl.password\" is set in kafka.properties too"),
            ),
            (
                kafka("[kafka.properties_env]\n\"sasl.password\" = \"P\"\n[kafka.properties_file]\n\"sasl.password\" = \"/p\""),
                Some("is set in kafka.properties_file too"),
            ),
            (kafka("[kafka.properties_env]\n\"sasl.password\" = \"\""), Some("names nothing")),
            (kafka("[kafka.properties_file]\n\"sasl.password\" = \"\""), Some("names nothing")),
            (kafka("[kafka.properties_env]\n\"acks\" = \"ACKS\""), Some("outbox-cdc sets acks itself")),
            (kafka("[kafka.properties_file]\n\"enable.idempotence\" = \"/i\""), Some("sets enable.idempotence itself")),
            (kafka("[kafka.properties_env]\n\"bootstrap.servers\" = \"B\""), Some("use the dedicated [kafka] setting")),
            (
                kafka("[kafka.properties_env]\n\"sasl.mechanism\" = \"M\""),
                Some("sasl.mechanism is not one, set it in [kafka.properties]"),
            ),
            (kafka("[kafka.properties_file]\n\"sasl.oauthbearer.client.id\" = \"/id\""), Some("is not one")),
        ];
        for (text, refusal) in cases {
            match (Config::parse(text), refusal) {
                (Ok(_), None) => {}
                (Err(e), Some(expected)) => assert!(e.to_string().contains(expected), "{e}\n{text}"),
                (got, _) => panic!("{:?} for\n{text}", got.map(|_| "accepted")),
            }
        }
    }

    /// The secrets of `properties_env` and `properties_file` join the literal properties; a file loses
    /// its trailing newline. A missing variable or file is a definite error naming it and the setting.
    #[test]
    fn kafka_secrets_are_read_from_the_environment_and_files() {
        let dir = tempfile::tempdir().unwrap();
        let password = dir.path().join("kafka-password");
        std::fs::write(&password, "hunter2\n").unwrap();
        // PATH: a variable every test process has, so that the test sets none.
        let text = format!(
            "{MINIMAL}\n[kafka.properties]\n\"sasl.mechanism\" = \"SCRAM-SHA-512\"\n[kafka.properties_env]\n\
             \"sasl.username\" = \"PATH\"\n[kafka.properties_file]\n\"sasl.password\" = \"{}\"\n",
            password.display()
        );
        let config = Config::parse(&text).unwrap();
        let resolved = config.kafka.resolved_properties().unwrap();
        let get = |key: &str| resolved.get(key).map(String::as_str);
        assert_eq!(get("sasl.mechanism"), Some("SCRAM-SHA-512"));
        assert_eq!(get("sasl.password"), Some("hunter2"));
        assert_eq!(get("sasl.username"), std::env::var("PATH").ok().as_deref());
        assert!(!format!("{config:?}{resolved:?}").contains("hunter2"));

        std::fs::remove_file(&password).unwrap();
        let error = config.kafka.resolved_properties().unwrap_err();
        let text_of = error.to_string();
        assert!(error.is_definite(), "{text_of}");
        assert!(text_of.contains("kafka.properties_file (for sasl.password)"), "{text_of}");
        assert!(text_of.contains(&password.display().to_string()) && text_of.contains("No such file"), "{text_of}");

        std::fs::write(&password, "\n").unwrap();
        let error = config.kafka.resolved_properties().unwrap_err().to_string();
        assert!(error.contains("the file is empty") && error.contains("kafka-password"), "{error}");

        let unset = "OUTBOX_CDC_TEST_UNSET_KAFKA_VAR";
        let config =
            Config::parse(&format!("{MINIMAL}\n[kafka.properties_env]\n\"sasl.password\" = \"{unset}\"\n")).unwrap();
        let error = config.kafka.resolved_properties().unwrap_err();
        assert!(error.is_definite());
        assert!(error.to_string().contains(&format!("kafka.properties_env (for sasl.password) names {unset}")));
    }

    /// `source.password_file` (and so `prune.password_file`, which `prune` reads through the same
    /// settings): read when asked for, trailing newline trimmed, the path (never the content) in the error.
    #[test]
    fn database_passwords_are_read_from_files() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("db-password");
        std::fs::write(&file, "s3cret\r\n").unwrap();
        let text = MINIMAL.replace("password = \"pw\"", &format!("password_file = \"{}\"", file.display()));
        let config = Config::parse(&text).unwrap();
        assert_eq!(config.source_password().unwrap().unwrap().expose(), "s3cret");
        std::fs::write(&file, "").unwrap();
        let error = config.source_password().unwrap_err();
        let text = error.to_string();
        assert!(error.is_definite() && text.contains("db-password") && text.contains("empty"), "{text}");
        std::fs::remove_file(&file).unwrap();
        let error = config.source_password().unwrap_err().to_string();
        assert!(
            error.starts_with("source.password_file names the file ") && error.contains("mount the secret"),
            "{error}"
        );
    }

    #[test]
    fn prune_section_defaults_to_the_source_and_validates() {
        let c = Config::parse(MINIMAL).unwrap();
        assert_eq!((c.prune.batch_rows, c.prune.pause_ms, c.prune.user.as_deref()), (1_000, 100, None));
        let with = |section: &str| Config::parse(&format!("{MINIMAL}\n[prune]\n{section}\n"));
        let c = with("user = \"pruner\"\npassword_env = \"PW\"\nbatch_rows = 50\npause_ms = 0").unwrap();
        assert_eq!((c.prune.user.as_deref(), c.prune.batch_rows, c.prune.pause_ms), (Some("pruner"), 50, 0));
        for bad in ["batch_rows = 0", "password = \"x\"", "user = \"u\"\npassword = \"x\"\npassword_env = \"PW\""] {
            assert!(with(bad).is_err(), "{bad}");
        }
        assert!(with("bogus = 1").unwrap_err().to_string().contains("bogus"));
    }

    const POLL: &str = r#"
        [source]
        kind = "poll"
        host = "127.0.0.1"
        user = "relay"
        [outbox]
        table = "shop.outbox_events"
        [kafka]
        bootstrap_servers = "127.0.0.1:9092"
        [snapshot]
        mode = "never"
    "#;

    /// `kind = "poll"` takes the connection settings without `server_id`, `[poll]` gets defaults and
    /// bounds, and `[poll]` is refused with the binlog sources (a relay config pointed at the wrong kind).
    #[test]
    fn poll_source_settings_are_validated() {
        let c = Config::parse(POLL).unwrap();
        assert_eq!(c.source.kind, SourceKind::Poll);
        let p = &c.poll;
        assert_eq!((p.order, p.poll_interval_ms, p.batch_rows), (PollOrder::Sequence, 1_000, 1_000));
        assert!(p.ignored_keys().is_empty());
        let id = p.relay_id();
        assert!(id.ends_with(&format!(":{}", std::process::id())) && id.len() <= 128, "{id}");
        let with = |extra: &str| Config::parse(&format!("{POLL}\n[poll]\n{extra}\n"));
        let c = with(
            "order = \"occurred_at\"\npoll_interval_ms = 50\nbatch_rows = 20\nrelay_id = \"r1\"\nlease_ms = 5000\nmax_attempts = 3",
        )
        .unwrap();
        assert_eq!(
            (c.poll.order, c.poll.poll_interval_ms, c.poll.batch_rows, c.poll.relay_id()),
            (PollOrder::OccurredAt, 50, 20, "r1".to_string())
        );
        assert_eq!(c.poll.ignored_keys(), ["lease_ms", "max_attempts"], "older files load, with a warning");
        assert!(!p.transactional && with("transactional = true").unwrap().poll.transactional);
        let timeout = POLL.replace("[kafka]", "[kafka]\nproperties = { \"transaction.timeout.ms\" = \"soon\" }");
        let e = Config::parse(&format!("{timeout}\n[poll]\ntransactional = true\n")).unwrap_err().to_string();
        assert!(e.contains("\"transaction.timeout.ms\" = \"soon\" is not a number"), "{e}");
        let cases: &[(&str, &str)] = &[
            ("poll_interval_ms = 10", "poll.poll_interval_ms"),
            ("batch_rows = 0", "poll.batch_rows"),
            ("relay_id = \"\"", "poll.relay_id"),
            ("order = \"random\"", "unknown variant `random`"),
            ("lease = 5", "unknown field `lease`"),
        ];
        for (extra, expected) in cases {
            let e = with(extra).unwrap_err().to_string();
            assert!(e.contains(expected), "{extra}: {e}");
        }
        // The default snapshot mode fits the relay (it publishes every unpublished row); the modes that
        // promise more are refused.
        assert!(Config::parse(&POLL.replace("mode = \"never\"", "mode = \"initial\"")).is_ok());
        assert!(Config::parse(&POLL.replace("[snapshot]\n        mode = \"never\"", "")).is_ok());
        let refusals: &[(String, &str)] = &[
            (POLL.replace("user = \"relay\"", "user = \"relay\"\nserver_id = 7"), "remove it"),
            (POLL.replace("host = \"127.0.0.1\"", ""), "source.host and source.user are required"),
            (POLL.replace("mode = \"never\"", "mode = \"when_needed\""), "has nothing to do"),
            (POLL.replace("kind = \"poll\"", "kind = \"poll\"\nbinlog_dir = \"/b\""), "only with"),
            (format!("{MINIMAL}\n[poll]\nbatch_rows = 5\n"), "[poll] applies only with source.kind = \"poll\""),
        ];
        for (text, expected) in refusals {
            let e = Config::parse(text).unwrap_err().to_string();
            assert!(e.contains(expected), "{e}\n{text}");
        }
    }

    /// Exactly-once needs the Kafka state backend and the binlog; names must suit Kafka and the lease.
    #[test]
    fn delivery_and_state_settings_are_checked_together() {
        let c = Config::parse(MINIMAL).unwrap();
        assert_eq!((c.delivery.guarantee, c.state.backend), (Guarantee::AtLeastOnce, StateBackend::Local));
        assert_eq!(c.transactional_id(), "outbox-cdc");
        let with = |extra: &str| Config::parse(&format!("{MINIMAL}\n{extra}"));
        let err = with("[delivery]\nguarantee = \"exactly_once\"").unwrap_err().to_string();
        assert!(err.contains("backend = \"kafka\""), "{err}");
        let c = with("[delivery]\nguarantee = \"exactly_once\"\n[state]\nbackend = \"kafka\"\nname = \"orders-1\"")
            .unwrap();
        assert!(c.exactly_once());
        assert_eq!((c.transactional_id(), c.state.topic.as_str()), ("orders-1", "outbox-cdc.state"));
        assert!(with("[state]\nname = \"a b\"").unwrap_err().to_string().contains("state.name"));
        assert!(with("[state]\ntopic = \"a/b\"").unwrap_err().to_string().contains("state.topic"));
        assert!(with("[delivery]\nfailover_timeout_ms = 500").unwrap_err().to_string().contains("failover_timeout_ms"));
        let err = with("[kafka.properties]\n\"transactional.id\" = \"x\"").unwrap_err().to_string();
        assert!(err.contains("[delivery] transactional_id"), "{err}");
    }

    /// Settings that would silently break the commits: each refused with what to change.
    #[test]
    fn settings_that_break_the_commits_are_refused() {
        let eos = "[delivery]\nguarantee = \"exactly_once\"\n[state]\nbackend = \"kafka\"\n";
        let with = |extra: &str| Config::parse(&format!("{MINIMAL}\n{extra}"));
        let refusals: &[(String, &str)] = &[
            // The periodic writer's timer panicked on a zero period, and the run restarted for ever.
            ("[state]\ncheckpoint_interval_ms = 0".into(), "at least 1"),
            // At or above the transaction timeout nothing ever commits.
            (format!("{eos}checkpoint_interval_ms = 60000"), "more than half"),
            (
                format!(
                    "{eos}checkpoint_interval_ms = 2000\n[kafka.properties]\n\"transaction.timeout.ms\" = \"3000\""
                ),
                "more than half",
            ),
            (format!("{eos}[kafka.properties]\n\"transaction.timeout.ms\" = \"soon\""), "not a number"),
        ];
        for (extra, expected) in refusals {
            let err = with(extra).unwrap_err();
            assert!(err.is_definite() && err.to_string().contains(expected), "{extra}: {err}");
        }
        with(&format!("{eos}checkpoint_interval_ms = 30000")).expect("half of the default timeout");
        with("[state]\ncheckpoint_interval_ms = 60000").expect("at_least_once has no transaction timeout");
    }

    #[test]
    fn example_config_in_repo_is_valid() {
        let text = include_str!("../connector.toml");
        Config::parse(text).unwrap();
    }
}
