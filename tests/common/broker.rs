//! A Kafka-protocol broker per test (Tansu 0.6, or noida-db 0.2.3 for transactions), and a group-less
//! reader for verification.
//!
//! Two brokers behind one [`Broker`] type, picked by [`Engine`]:
//! - Tansu (`Engine::Sqlite`, `Engine::Memory`): durable across its own kill -9 and restart (SQLite
//!   engine); no transactions (`EndTxn` unsupported). Every at-least-once test and every broker-restart
//!   scenario runs on it.
//! - noida-db (`Engine::Noida`, the Kafka service of the Python package `noida-db`, pinned to
//!   [`NOIDA_DB_VERSION`]): correct transactions (read_committed hides aborted records, zombie fencing,
//!   `send_offsets_to_transaction`), but **not durable** across its own restart: use it for tests where
//!   the connector crashes, never for a claim about the broker restarting. `tests/noida_smoke.rs` pins
//!   the transactional behaviour the tests rely on and fails if a different version behaves otherwise.
//!
//! # Isolation
//! librdkafka's consumers default to `isolation.level=read_committed`. Every reader here sets it
//! explicitly: [`Broker::read_all`] and [`Broker::read_committed`] read committed records only (on Tansu,
//! which has no transactions, that is every record); [`Broker::read_uncommitted`] also returns the
//! records of open and aborted transactions. Control records (commit/abort markers) take offsets but are
//! never returned, so offsets of a transactional topic have gaps.
//!
//! # noida-db, measured (2026-12-02, librdkafka 2.12.1 of the `rdkafka` crate, Debian 12)
//! - pip's `noida-db` command is a Python wrapper that runs the packaged binary as a subprocess and
//!   does not forward signals: killing the wrapper orphans the broker. [`noida_db_path`] asks Python
//!   for the packaged binary and the harness runs that directly.
//! - `noida_db.__version__` says 0.1.0 in 0.2.3; the package metadata and `noida-db version` say 0.2.3.
//!   The harness checks `noida-db version` once per test binary.
//! - The binary is linked against glibc 2.39 and prints a "weak version `GLIBC_2.39' not found" warning
//!   on Debian 12's glibc 2.36 at every start; it runs regardless (the warning lands in `broker.log`).
//! - Ready (answers metadata) ~60 ms after spawn; the first start in a test binary takes ~0.4 s more
//!   (locating the binary through Python, `noida-db version`). Besides the Kafka port it listens on a
//!   random loopback control port (written to `noida.control.json` in its data dir).
//! - SIGTERM: exits in 40–60 ms. Its whole state is snapshotted to `kafka.json` in the data dir (seen
//!   within 3 s of a write); 10 records survived a kill -9 and a SIGTERM restart in a probe, but under
//!   load restarts lost acknowledged records (`shared/notes/kafka-broker.md`): not durable.
//! - Produce to an unknown topic creates it with 1 partition.
//! - Fencing: once a producer with the same `transactional.id` ran `init_transactions`, the old
//!   producer's `commit_transaction` fails with librdkafka's fatal `RDKafkaErrorCode::Fenced`, and its
//!   open transaction is aborted (the abort marker moves the last stable offset to the high watermark).
//! - CreateTopics keeps the configs it is given; DescribeConfigs reports them next to Kafka's defaults
//!   (`cleanup.policy=delete`, `retention.ms=604800000` unless set). Whether it compacts was not measured.
//! - A subscribed consumer group (`session.timeout.ms=6000`) joins and reads within the ~3 s the whole
//!   `send_offsets_to_transaction` smoke test takes.
//! - The whole of `tests/noida_smoke.rs` (5 tests, 2 threads) runs in ~8 s.
//!
//! Tansu quirks this module handles (see `shared/notes/kafka-broker.md`):
//! - the listener defaults to 0.0.0.0:9092: always pass listener and advertised listener;
//! - `sqlite://` paths are relative to the working directory: the broker runs with its temp dir as cwd
//!   and `sqlite://tansu.db`;
//! - the SQLite engine does not create topics on produce: [`Broker::create_topic`] first;
//! - SIGTERM shutdown takes seconds: [`Broker::stop`] waits for the exit *and* a free port;
//! - consumer groups are flaky: [`Broker::read_all`] assigns every partition from the beginning.
//! - it loads a `.env` file from its cwd and reads `STORAGE_ENGINE`, `LISTENER_URL`, … from the
//!   environment; explicit flags win, and the cwd is a fresh temp dir.

use super::process;
use super::{free_port, port_accepts, port_is_free, tail_file, wait_until};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use tempfile::TempDir;

/// How long start-up may take before the test fails.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a SIGTERM shutdown may take (measured 1.5–7 s) before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// [`Broker::read_all`] stops once it has enough records and nothing new arrived for this long.
const QUIET_PERIOD: Duration = Duration::from_secs(1);

/// The pinned noida-db version (`scripts/provision.sh` installs it); [`Broker::start`] refuses another.
pub const NOIDA_DB_VERSION: &str = "0.2.3";

/// Which broker, and for Tansu its storage engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// `sqlite://tansu.db` in the broker's dir: durable across kill -9 and restart. Topics must be
    /// created explicitly.
    Sqlite,
    /// `memory://tansu/`: fast; everything is lost on restart (topics then come back with 4
    /// partitions on first use). Never use it for restart tests.
    Memory,
    /// noida-db's Kafka service (not Tansu): transactions work; state lives in memory and is
    /// snapshotted to its data dir now and then, so a restart can lose acknowledged records. Topics
    /// are auto-created on produce (1 partition), but create them first (as with SQLite) so that
    /// partitions and configs are what the test says.
    Noida,
}

impl Engine {
    /// Tansu's `--storage-engine` URL; `None` for noida-db.
    fn tansu_url(self) -> Option<&'static str> {
        match self {
            Engine::Sqlite => Some("sqlite://tansu.db"),
            Engine::Memory => Some("memory://tansu/"),
            Engine::Noida => None,
        }
    }

    /// The broker's name, for messages.
    fn broker_name(self) -> &'static str {
        match self {
            Engine::Sqlite | Engine::Memory => "tansu",
            Engine::Noida => "noida-db",
        }
    }
}

/// `isolation.level` of a reader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// Only records of committed transactions (and non-transactional records); a partition ends at
    /// its last stable offset (LSO), before the first record of a transaction still open.
    ReadCommitted,
    /// Every record, also of open and aborted transactions; a partition ends at its high watermark.
    ReadUncommitted,
}

impl Isolation {
    fn as_str(self) -> &'static str {
        match self {
            Isolation::ReadCommitted => "read_committed",
            Isolation::ReadUncommitted => "read_uncommitted",
        }
    }
}

/// One record as read back from the broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// Topic it was read from.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset in the partition.
    pub offset: i64,
    /// Key bytes (`None` = null key).
    pub key: Option<Vec<u8>>,
    /// Value bytes (`None` = tombstone).
    pub value: Option<Vec<u8>>,
    /// Headers in record order (a null header value reads as empty).
    pub headers: Vec<(String, Vec<u8>)>,
    /// The record timestamp in ms, when it has one.
    pub timestamp: Option<i64>,
}

/// Event ids (the `id` header) of one aggregate's records (`key`), in partition offset order.
pub fn ids_of_key(records: &[Received], key: &str) -> Vec<String> {
    let mut of_key: Vec<&Received> = records.iter().filter(|r| r.key_str() == Some(key)).collect();
    of_key.sort_by_key(|r| (r.partition, r.offset));
    of_key.iter().filter_map(|r| r.header_str("id").map(String::from)).collect()
}

impl Received {
    /// The first header named `name`.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_slice())
    }

    /// The first header named `name` as UTF-8 (`None` if absent or not UTF-8).
    pub fn header_str(&self, name: &str) -> Option<&str> {
        self.header(name).and_then(|v| std::str::from_utf8(v).ok())
    }

    /// The key as UTF-8.
    pub fn key_str(&self) -> Option<&str> {
        self.key.as_deref().and_then(|v| std::str::from_utf8(v).ok())
    }

    /// The value parsed as JSON.
    ///
    /// # Panics
    /// When the value is null or not JSON.
    pub fn value_json(&self) -> serde_json::Value {
        let v = self
            .value
            .as_deref()
            .unwrap_or_else(|| panic!("record {}:{} has a null value", self.partition, self.offset));
        serde_json::from_slice(v)
            .unwrap_or_else(|e| panic!("record {}:{} value is not JSON: {e}", self.partition, self.offset))
    }
}

/// A broker (Tansu or noida-db) in a temp dir on a free loopback port; killed and deleted on drop.
#[derive(Debug)]
pub struct Broker {
    /// The running broker; `None` after `kill`/`stop`.
    child: Option<Child>,
    /// Listener port on 127.0.0.1, kept across restarts.
    port: u16,
    /// Broker and storage engine, kept across restarts.
    engine: Engine,
    /// The port Tansu advertises when it is not `port` ([`Broker::start_behind`]).
    advertised: Option<u16>,
    /// Working dir: `tansu.db` (Tansu SQLite) or `noida/` (noida-db's data dir), and `broker.log`
    /// (appended across restarts). Declared last.
    dir: TempDir,
}

impl Broker {
    /// Starts a broker and waits until it answers a metadata request.
    ///
    /// # Panics
    /// When the broker cannot be started or is not ready within 30 s (message includes its log); for
    /// `Engine::Noida` also when noida-db is not installed or is not [`NOIDA_DB_VERSION`].
    pub fn start(engine: Engine) -> Broker {
        let dir = tempfile::Builder::new()
            .prefix(&format!("{}-", engine.broker_name()))
            .tempdir()
            .expect("create broker temp dir");
        let mut broker = Broker { child: None, port: free_port(), engine, advertised: None, dir };
        broker.spawn_and_wait();
        broker
    }

    /// A Tansu broker that advertises `advertised` (a proxy's port in front of it) as its address: clients
    /// that bootstrap anywhere connect to the proxy. [`Broker::advertise_itself`] undoes it.
    ///
    /// # Panics
    /// As [`Broker::start`]; for noida-db, which always advertises its own port.
    pub fn start_behind(engine: Engine, advertised: u16) -> Broker {
        assert!(engine.tansu_url().is_some(), "only Tansu advertises another address");
        let dir = tempfile::Builder::new()
            .prefix(&format!("{}-", engine.broker_name()))
            .tempdir()
            .expect("create broker temp dir");
        let mut broker = Broker { child: None, port: free_port(), engine, advertised: Some(advertised), dir };
        broker.spawn_and_wait();
        broker
    }

    /// Restarts the broker advertising its own port again, for clients that read it directly.
    pub fn advertise_itself(&mut self) {
        self.stop();
        self.advertised = None;
        self.spawn_and_wait();
    }

    /// `127.0.0.1:<port>`, for `bootstrap.servers`.
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Listener port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Storage engine.
    pub fn engine(&self) -> Engine {
        self.engine
    }

    /// The broker's working dir.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The broker's stdout/stderr log (all runs).
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("broker.log")
    }

    /// The last `lines` lines of the broker log.
    pub fn log_tail(&self, lines: usize) -> String {
        tail_file(&self.log_path(), lines)
    }

    /// Whether the broker process is running.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// SIGKILL (a crash), reap, and wait until the port is free.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            process::kill_now(&mut child);
            self.wait_port_free();
        }
    }

    /// SIGTERM, wait for the exit (up to 30 s, then SIGKILL) and for the port to be free.
    ///
    /// # Panics
    /// When the broker did not exit within 30 s of SIGTERM.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let (status, graceful) = process::terminate(&mut child, STOP_TIMEOUT);
            self.wait_port_free();
            let name = self.engine.broker_name();
            assert!(graceful, "{name} ignored SIGTERM for {STOP_TIMEOUT:?} ({status}):\n{}", self.log_tail(30));
        }
    }

    /// Stops the broker if it runs (gracefully), then starts it again with the same dir, port and
    /// engine, and waits until it is ready. (noida-db comes back from its SIGTERM snapshot, but has
    /// lost acknowledged records in measured restarts: never base a durability claim on it.)
    pub fn restart(&mut self) {
        self.stop();
        self.spawn_and_wait();
    }

    /// Starts the broker again after `kill`/`stop`.
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "broker on port {} is already running", self.port);
        self.spawn_and_wait();
    }

    /// A client config with `bootstrap.servers` set, for producers and consumers in tests.
    pub fn client_config(&self) -> ClientConfig {
        let mut cfg = ClientConfig::new();
        cfg.set("bootstrap.servers", self.bootstrap());
        cfg
    }

    /// Creates `topic` with `partitions` partitions (replication 1) through the Admin API and waits
    /// until metadata shows it. An already existing topic is accepted as is. Blocking; usable from
    /// sync tests and from the test thread of async tests.
    ///
    /// # Panics
    /// On any other admin error, or when the topic does not appear in metadata within 30 s.
    pub fn create_topic(&self, topic: &str, partitions: i32) {
        self.create_topic_with(topic, partitions, &[]);
    }

    /// [`Broker::create_topic`] with topic configs, e.g. `[("cleanup.policy", "compact"),
    /// ("retention.ms", "-1")]`. An already existing topic is accepted as is (its configs unchecked).
    /// A broker may accept a config it does not act on: [`Broker::topic_configs`] shows what it
    /// stored (`tests/noida_smoke.rs` checks noida-db's).
    ///
    /// # Panics
    /// As [`Broker::create_topic`]; also when the broker rejects a config.
    pub fn create_topic_with(&self, topic: &str, partitions: i32, configs: &[(&str, &str)]) {
        let admin = self.admin();
        let mut new_topic = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
        for (key, value) in configs {
            new_topic = new_topic.set(key, value);
        }
        let results = block_on_thread(admin.create_topics([&new_topic], &admin_options()))
            .unwrap_or_else(|e| panic!("CreateTopics {topic} on {}: {e}\n{}", self.bootstrap(), self.log_tail(20)));
        for result in results {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((name, code)) => panic!("CreateTopics {name} {configs:?}: {code}\n{}", self.log_tail(20)),
            }
        }
        let visible = wait_until(READY_TIMEOUT, || self.partition_count(topic) == Some(partitions as usize));
        assert!(visible, "topic {topic} with {partitions} partitions not in metadata after {READY_TIMEOUT:?}");
    }

    /// The configs of `topic` as DescribeConfigs reports them (name → value; entries without a value
    /// left out).
    ///
    /// # Panics
    /// When the request fails or the broker reports an error for the topic. (Tansu 0.6, memory and
    /// SQLite engines, and noida-db 0.2.3 both report the configs a topic was created with.)
    pub fn topic_configs(&self, topic: &str) -> BTreeMap<String, String> {
        let admin = self.admin();
        let resource = ResourceSpecifier::Topic(topic);
        let results = block_on_thread(admin.describe_configs([&resource], &admin_options()))
            .unwrap_or_else(|e| panic!("DescribeConfigs {topic} on {}: {e}\n{}", self.bootstrap(), self.log_tail(20)));
        let mut out = BTreeMap::new();
        for result in results {
            let resource =
                result.unwrap_or_else(|code| panic!("DescribeConfigs {topic}: {code}\n{}", self.log_tail(20)));
            for entry in resource.entries {
                if let Some(value) = entry.value {
                    out.insert(entry.name, value);
                }
            }
        }
        out
    }

    /// Number of partitions of `topic` according to metadata; `None` if the topic is unknown.
    pub fn partition_count(&self, topic: &str) -> Option<usize> {
        let consumer: BaseConsumer =
            self.reader_config(Isolation::ReadCommitted).create().expect("create metadata client");
        partition_count(&consumer, topic)
    }

    /// Reads every partition of `topic` from the beginning (no consumer group) until at least
    /// `expected_min` records were seen and nothing new arrived for 1 s, or `timeout` passed.
    /// Returns the records in arrival order (per partition: offset order). Returns what it has at the
    /// timeout, so the caller's assertion says what is missing. An unknown topic reads as empty.
    ///
    /// `isolation.level=read_committed` (librdkafka's default, which this reader always used; now set
    /// explicitly): the same as [`Broker::read_committed`].
    pub fn read_all(&self, topic: &str, expected_min: usize, timeout: Duration) -> Vec<Received> {
        self.read(topic, expected_min, timeout, Isolation::ReadCommitted)
    }

    /// [`Broker::read_all`] with `isolation.level=read_committed`, named for tests where that matters:
    /// records of aborted transactions are never returned, and a partition's records stop before the
    /// first record of a transaction that is still open (its last stable offset).
    pub fn read_committed(&self, topic: &str, expected_min: usize, timeout: Duration) -> Vec<Received> {
        self.read(topic, expected_min, timeout, Isolation::ReadCommitted)
    }

    /// [`Broker::read_all`] with `isolation.level=read_uncommitted`: also the records of open and
    /// aborted transactions (e.g. to show that records exist that a read_committed reader must not see).
    pub fn read_uncommitted(&self, topic: &str, expected_min: usize, timeout: Duration) -> Vec<Received> {
        self.read(topic, expected_min, timeout, Isolation::ReadUncommitted)
    }

    /// Reads every partition of `topic` from the beginning to its end as `isolation` sees it (the last
    /// stable offset for read_committed, the high watermark for read_uncommitted), then returns; what
    /// a connector does when it loads its state topic at start.
    ///
    /// # Panics
    /// When the end of some partition is not reached within `timeout` (for read_committed: a
    /// transaction stays open), or the topic is unknown.
    pub fn read_to_end(&self, topic: &str, isolation: Isolation, timeout: Duration) -> Vec<Received> {
        let deadline = Instant::now() + timeout;
        let mut cfg = self.reader_config(isolation);
        cfg.set("enable.partition.eof", "true");
        let consumer: BaseConsumer = cfg.create().expect("create rdkafka reader");
        let partitions = partition_count(&consumer, topic).unwrap_or_else(|| panic!("topic {topic} is unknown"));
        let mut assignment = TopicPartitionList::new();
        for p in 0..partitions as i32 {
            assignment.add_partition_offset(topic, p, Offset::Beginning).expect("add partition to assignment");
        }
        consumer.assign(&assignment).expect("assign partitions");
        let mut at_end = vec![false; partitions];
        let mut out = Vec::new();
        while at_end.iter().any(|e| !e) {
            assert!(
                Instant::now() < deadline,
                "read_to_end({topic}, {isolation:?}): partitions at end {at_end:?} after {timeout:?}, {} records \
                 read\n{}",
                out.len(),
                self.log_tail(20)
            );
            match consumer.poll(Duration::from_millis(50)) {
                Some(Ok(m)) => out.push(received(&m)),
                Some(Err(KafkaError::PartitionEOF(p))) => at_end[p as usize] = true,
                Some(Err(e)) => eprintln!("read_to_end({topic}) on {}: {e}", self.bootstrap()),
                None => {}
            }
        }
        out
    }

    /// `(low, high)` offsets of `topic`/`partition` as a reader with `isolation` sees them: for
    /// read_committed `high` is the last stable offset, for read_uncommitted the high watermark.
    /// (Wrong on Tansu's memory engine, see the notes: use it on noida-db and Tansu SQLite.)
    ///
    /// # Panics
    /// When ListOffsets fails within 10 s.
    pub fn watermarks(&self, topic: &str, partition: i32, isolation: Isolation) -> (i64, i64) {
        let consumer: BaseConsumer = self.reader_config(isolation).create().expect("create rdkafka reader");
        consumer
            .fetch_watermarks(topic, partition, Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("watermarks of {topic}/{partition} ({isolation:?}): {e}\n{}", self.log_tail(20)))
    }

    /// [`Broker::read_all`] that, once `expected_min` records are in, reads on until nothing new came for
    /// `quiet` (instead of 1 s): "these records, and no more within `quiet`" while a producer still runs, with
    /// a `timeout` as long as a loaded machine needs to read the first `expected_min`.
    pub fn read_all_quiet(
        &self,
        topic: &str,
        expected_min: usize,
        quiet: Duration,
        timeout: Duration,
    ) -> Vec<Received> {
        self.read_until_quiet(topic, expected_min, timeout, Isolation::ReadCommitted, quiet)
    }

    fn read(&self, topic: &str, expected_min: usize, timeout: Duration, isolation: Isolation) -> Vec<Received> {
        self.read_until_quiet(topic, expected_min, timeout, isolation, QUIET_PERIOD)
    }

    fn read_until_quiet(
        &self,
        topic: &str,
        expected_min: usize,
        timeout: Duration,
        isolation: Isolation,
        quiet: Duration,
    ) -> Vec<Received> {
        let deadline = Instant::now() + timeout;
        let consumer: BaseConsumer = self.reader_config(isolation).create().expect("create rdkafka reader");
        let partitions = loop {
            if let Some(n) = partition_count(&consumer, topic) {
                break n;
            }
            if Instant::now() >= deadline {
                return Vec::new();
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let mut assignment = TopicPartitionList::new();
        for p in 0..partitions as i32 {
            assignment.add_partition_offset(topic, p, Offset::Beginning).expect("add partition to assignment");
        }
        consumer.assign(&assignment).expect("assign partitions");

        let mut out = Vec::new();
        let mut last_new = Instant::now();
        loop {
            match consumer.poll(Duration::from_millis(50)) {
                Some(Ok(m)) => {
                    out.push(received(&m));
                    last_new = Instant::now();
                }
                Some(Err(e)) => eprintln!("read_all({topic}) on {}: {e}", self.bootstrap()),
                None => {}
            }
            let now = Instant::now();
            if (out.len() >= expected_min && now.duration_since(last_new) >= quiet) || now >= deadline {
                return out;
            }
        }
    }

    /// Config of the verification reader: assigned partitions only, nothing committed.
    fn reader_config(&self, isolation: Isolation) -> ClientConfig {
        let mut cfg = self.client_config();
        cfg.set("isolation.level", isolation.as_str());
        cfg.set("group.id", format!("harness-reader-{:016x}", rand::random::<u64>()))
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("enable.partition.eof", "false")
            .set("fetch.wait.max.ms", "20")
            .set("topic.metadata.refresh.interval.ms", "1000");
        cfg
    }

    fn spawn_and_wait(&mut self) {
        assert!(self.child.is_none(), "broker on port {} is already running", self.port);
        let name = self.engine.broker_name();
        let log = self.log_path();
        let (mut cmd, program) = match self.engine.tansu_url() {
            Some(url) => {
                let listener = format!("tcp://127.0.0.1:{}", self.port);
                let advertised = format!("tcp://127.0.0.1:{}", self.advertised.unwrap_or(self.port));
                let mut cmd = Command::new(tansu_path());
                cmd.arg("broker")
                    .arg("--listener-url")
                    .arg(&listener)
                    .arg("--advertised-listener-url")
                    .arg(&advertised)
                    .arg("--storage-engine")
                    .arg(url);
                (cmd, tansu_path())
            }
            None => {
                let bin = noida_db_path();
                let mut cmd = Command::new(&bin);
                cmd.args(["start", "--only", "kafka", "--host", "127.0.0.1", "--kafka-port"])
                    .arg(self.port.to_string())
                    .arg("--data-dir")
                    .arg(self.dir.path().join("noida"));
                (cmd, bin)
            }
        };
        cmd.current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(process::append_log(&log))
            .stderr(process::append_log(&log));
        let child = process::spawn(cmd)
            .unwrap_or_else(|e| panic!("cannot start {name} ({}): {e}; run scripts/provision.sh", program.display()));
        self.child = Some(child);

        let started = Instant::now();
        loop {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                self.child = None;
                panic!("{name} on port {} exited during start-up ({status}):\n{}", self.port, self.log_tail(30));
            }
            if port_accepts(self.port) && self.metadata_ok() {
                return;
            }
            if started.elapsed() > READY_TIMEOUT {
                self.kill();
                panic!("{name} on port {} not ready after {READY_TIMEOUT:?}:\n{}", self.port, self.log_tail(30));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn admin(&self) -> AdminClient<DefaultClientContext> {
        self.client_config().create().expect("create rdkafka AdminClient")
    }

    fn metadata_ok(&self) -> bool {
        let Ok(consumer) = self.client_config().create::<BaseConsumer>() else {
            return false;
        };
        consumer.fetch_metadata(None, Duration::from_secs(2)).is_ok()
    }

    fn wait_port_free(&self) {
        let free = wait_until(STOP_TIMEOUT, || port_is_free(self.port));
        assert!(free, "port {} still busy {STOP_TIMEOUT:?} after {} exited", self.port, self.engine.broker_name());
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            process::kill_now(child);
        }
    }
}

fn admin_options() -> AdminOptions {
    AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))).request_timeout(Some(Duration::from_secs(10)))
}

fn received(m: &BorrowedMessage<'_>) -> Received {
    let headers = m
        .headers()
        .map(|h| h.iter().map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec).unwrap_or_default())).collect())
        .unwrap_or_default();
    Received {
        topic: m.topic().to_owned(),
        partition: m.partition(),
        offset: m.offset(),
        key: m.key().map(<[u8]>::to_vec),
        value: m.payload().map(<[u8]>::to_vec),
        headers,
        timestamp: m.timestamp().to_millis(),
    }
}

fn partition_count(consumer: &BaseConsumer, topic: &str) -> Option<usize> {
    let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(5)).ok()?;
    let t = md.topics().iter().find(|t| t.name() == topic)?;
    (t.error().is_none() && !t.partitions().is_empty()).then(|| t.partitions().len())
}

/// Runs a runtime-agnostic future (rdkafka admin) to completion on a fresh thread with its own
/// current-thread runtime, so it works from sync tests and from inside a tokio runtime alike.
fn block_on_thread<F>(fut: F) -> F::Output
where
    F: std::future::Future + Send,
    F::Output: Send,
{
    std::thread::scope(|s| {
        s.spawn(|| {
            tokio::runtime::Builder::new_current_thread().enable_time().build().expect("build runtime").block_on(fut)
        })
        .join()
        .expect("admin thread panicked")
    })
}

/// `tansu` from `$TANSU`, `PATH`, or `~/.cargo/bin`.
pub fn tansu_path() -> PathBuf {
    if let Some(path) = std::env::var_os("TANSU") {
        return PathBuf::from(path);
    }
    let mut dirs: Vec<PathBuf> =
        std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default();
    if let Some(home) = std::env::var_os("CARGO_HOME") {
        dirs.push(PathBuf::from(home).join("bin"));
    }
    if let Some(home) = std::env::var_os("HOME") {
        dirs.push(PathBuf::from(home).join(".cargo/bin"));
    }
    dirs.into_iter().map(|d| d.join("tansu")).find(|p| p.is_file()).unwrap_or_else(|| PathBuf::from("tansu"))
}

/// The packaged noida-db binary (not pip's Python wrapper, which would orphan the broker when
/// signalled), checked once to be [`NOIDA_DB_VERSION`]. Found from `$NOIDA_DB`, else by asking the
/// Python interpreters that may hold the `noida_db` package: the one in the shebang of a `noida-db`
/// script on `PATH`, in `~/.local/bin` or `~/.pyenv/shims`, then `python3` (and pyenv's).
///
/// # Panics
/// When no such binary is found or `noida-db version` does not print the pinned version; the message
/// says to run `scripts/provision.sh`.
pub fn noida_db_path() -> PathBuf {
    static FOUND: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    FOUND.get_or_init(find_noida_db).clone().unwrap_or_else(|e| panic!("{e}"))
}

fn find_noida_db() -> Result<PathBuf, String> {
    let bin = match std::env::var_os("NOIDA_DB") {
        Some(path) => PathBuf::from(path),
        None => locate_noida_db().ok_or_else(|| {
            format!(
                "noida-db {NOIDA_DB_VERSION} not found (no Python with the noida_db package): run \
                 scripts/provision.sh, or set NOIDA_DB to the packaged binary"
            )
        })?,
    };
    let out = Command::new(&bin).arg("version").stdin(Stdio::null()).output().map_err(|e| {
        format!("cannot run {} version: {e}; run scripts/provision.sh (noida-db {NOIDA_DB_VERSION})", bin.display())
    })?;
    let printed = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if printed != format!("noida-db {NOIDA_DB_VERSION}") {
        return Err(format!(
            "{} version printed {printed:?}, the tests are pinned to noida-db {NOIDA_DB_VERSION}: run \
             scripts/provision.sh",
            bin.display()
        ));
    }
    Ok(bin)
}

fn locate_noida_db() -> Option<PathBuf> {
    const LOCATE: &str = "from importlib.resources import files; print(files('noida_db').joinpath('noida-db'))";
    let mut dirs: Vec<PathBuf> =
        std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default();
    let home = std::env::var_os("HOME").map(PathBuf::from);
    if let Some(home) = &home {
        dirs.push(home.join(".local/bin"));
        dirs.push(home.join(".pyenv/shims"));
    }
    // A pip-installed script names its interpreter in the shebang (pyenv's shims are bash: skipped).
    let mut pythons: Vec<PathBuf> = dirs
        .iter()
        .filter_map(|d| std::fs::read_to_string(d.join("noida-db")).ok())
        .filter_map(|text| {
            let interpreter = text.lines().next()?.strip_prefix("#!")?.split_whitespace().next()?.to_owned();
            interpreter.contains("python").then(|| PathBuf::from(interpreter))
        })
        .collect();
    pythons.push(PathBuf::from("python3"));
    if let Some(home) = &home {
        pythons.push(home.join(".pyenv/shims/python3"));
    }
    pythons.into_iter().find_map(|python| {
        let out = Command::new(python).args(["-c", LOCATE]).stdin(Stdio::null()).output().ok()?;
        let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        (out.status.success() && path.is_file()).then_some(path)
    })
}
