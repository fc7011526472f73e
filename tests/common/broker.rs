//! A Tansu 0.6 Kafka-protocol broker per test, and a group-less reader for verification.
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
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tempfile::TempDir;

/// How long start-up may take before the test fails.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a SIGTERM shutdown may take (measured 1.5–7 s) before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// [`Broker::read_all`] stops once it has enough records and nothing new arrived for this long.
const QUIET_PERIOD: Duration = Duration::from_secs(1);

/// Tansu storage engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// `sqlite://tansu.db` in the broker's dir: durable across kill -9 and restart. Topics must be
    /// created explicitly.
    Sqlite,
    /// `memory://tansu/`: fast; everything is lost on restart (topics then come back with 4
    /// partitions on first use). Never use it for restart tests.
    Memory,
}

impl Engine {
    fn url(self) -> &'static str {
        match self {
            Engine::Sqlite => "sqlite://tansu.db",
            Engine::Memory => "memory://tansu/",
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

/// A Tansu broker in a temp dir on a free loopback port; killed and deleted on drop.
#[derive(Debug)]
pub struct Broker {
    /// The running broker; `None` after `kill`/`stop`.
    child: Option<Child>,
    /// Listener port on 127.0.0.1, kept across restarts.
    port: u16,
    /// Storage engine, kept across restarts.
    engine: Engine,
    /// Working dir: `tansu.db` and `broker.log` (appended across restarts). Declared last.
    dir: TempDir,
}

impl Broker {
    /// Starts a broker and waits until it answers a metadata request.
    ///
    /// # Panics
    /// When `tansu` cannot be started or is not ready within 30 s (message includes its log).
    pub fn start(engine: Engine) -> Broker {
        let dir = tempfile::Builder::new().prefix("tansu-").tempdir().expect("create broker temp dir");
        let mut broker = Broker { child: None, port: free_port(), engine, dir };
        broker.spawn_and_wait();
        broker
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
            assert!(graceful, "tansu ignored SIGTERM for {STOP_TIMEOUT:?} ({status}):\n{}", self.log_tail(30));
        }
    }

    /// Stops the broker if it runs (gracefully), then starts it again with the same dir, port and
    /// engine, and waits until it is ready.
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
        let admin: AdminClient<DefaultClientContext> =
            self.client_config().create().expect("create rdkafka AdminClient");
        let opts = AdminOptions::new()
            .operation_timeout(Some(Duration::from_secs(10)))
            .request_timeout(Some(Duration::from_secs(10)));
        let new_topic = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
        let results = block_on_thread(admin.create_topics([&new_topic], &opts))
            .unwrap_or_else(|e| panic!("CreateTopics {topic} on {}: {e}\n{}", self.bootstrap(), self.log_tail(20)));
        for result in results {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((name, code)) => panic!("CreateTopics {name}: {code}\n{}", self.log_tail(20)),
            }
        }
        let visible = wait_until(READY_TIMEOUT, || self.partition_count(topic) == Some(partitions as usize));
        assert!(visible, "topic {topic} with {partitions} partitions not in metadata after {READY_TIMEOUT:?}");
    }

    /// Number of partitions of `topic` according to metadata; `None` if the topic is unknown.
    pub fn partition_count(&self, topic: &str) -> Option<usize> {
        let consumer: BaseConsumer = self.reader_config().create().expect("create metadata client");
        partition_count(&consumer, topic)
    }

    /// Reads every partition of `topic` from the beginning (no consumer group) until at least
    /// `expected_min` records were seen and nothing new arrived for 1 s, or `timeout` passed.
    /// Returns the records in arrival order (per partition: offset order). Returns what it has at the
    /// timeout, so the caller's assertion says what is missing. An unknown topic reads as empty.
    pub fn read_all(&self, topic: &str, expected_min: usize, timeout: Duration) -> Vec<Received> {
        let deadline = Instant::now() + timeout;
        let consumer: BaseConsumer = self.reader_config().create().expect("create rdkafka reader");
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
                    let headers = m
                        .headers()
                        .map(|h| {
                            h.iter()
                                .map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec).unwrap_or_default()))
                                .collect()
                        })
                        .unwrap_or_default();
                    out.push(Received {
                        topic: m.topic().to_owned(),
                        partition: m.partition(),
                        offset: m.offset(),
                        key: m.key().map(<[u8]>::to_vec),
                        value: m.payload().map(<[u8]>::to_vec),
                        headers,
                        timestamp: m.timestamp().to_millis(),
                    });
                    last_new = Instant::now();
                }
                Some(Err(e)) => eprintln!("read_all({topic}) on {}: {e}", self.bootstrap()),
                None => {}
            }
            let now = Instant::now();
            if (out.len() >= expected_min && now.duration_since(last_new) >= QUIET_PERIOD) || now >= deadline {
                return out;
            }
        }
    }

    /// Config of the verification reader: assigned partitions only, nothing committed.
    fn reader_config(&self) -> ClientConfig {
        let mut cfg = self.client_config();
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
        let listener = format!("tcp://127.0.0.1:{}", self.port);
        let log = self.log_path();
        let mut cmd = Command::new(tansu_path());
        cmd.arg("broker")
            .arg("--listener-url")
            .arg(&listener)
            .arg("--advertised-listener-url")
            .arg(&listener)
            .arg("--storage-engine")
            .arg(self.engine.url())
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(process::append_log(&log))
            .stderr(process::append_log(&log));
        let child = process::spawn(cmd).unwrap_or_else(|e| {
            panic!("cannot start tansu ({}): {e}; run scripts/provision.sh", tansu_path().display())
        });
        self.child = Some(child);

        let started = Instant::now();
        loop {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                self.child = None;
                panic!("tansu on port {} exited during start-up ({status}):\n{}", self.port, self.log_tail(30));
            }
            if port_accepts(self.port) && self.metadata_ok() {
                return;
            }
            if started.elapsed() > READY_TIMEOUT {
                self.kill();
                panic!("tansu on port {} not ready after {READY_TIMEOUT:?}:\n{}", self.port, self.log_tail(30));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn metadata_ok(&self) -> bool {
        let Ok(consumer) = self.client_config().create::<BaseConsumer>() else {
            return false;
        };
        consumer.fetch_metadata(None, Duration::from_secs(2)).is_ok()
    }

    fn wait_port_free(&self) {
        let free = wait_until(STOP_TIMEOUT, || port_is_free(self.port));
        assert!(free, "port {} still busy {STOP_TIMEOUT:?} after tansu exited", self.port);
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            process::kill_now(child);
        }
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
