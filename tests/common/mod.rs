//! Integration-test harness: real services as child processes on free loopback ports, in temp dirs.
//!
//! - [`MariaDb`]: a private MariaDB server (ROW binlog, GTID strict mode, full row metadata) with the
//!   `shop` schema, the outbox table and a `cdc` replication user.
//! - [`Broker`]: a Tansu Kafka-protocol broker (SQLite engine = durable, memory engine = fast), or
//!   noida-db for transactions (`Engine::Noida`, not durable), and group-less readers
//!   ([`Broker::read_all`] = [`Broker::read_committed`], [`Broker::read_uncommitted`]).
//! - [`workload`]: outbox rows, business transactions and a concurrent [`Writer`] that records the
//!   per-aggregate commit order.
//! - [`audit()`]: checks a topic against what was committed: nothing lost, per-aggregate order kept,
//!   duplicates counted.
//! - [`Connector`]: the `outbox-cdc` binary as a child process, with [`write_config`].
//! - [`Proxy`]: a loopback TCP proxy that can cut or silently blackhole the connections through it.
//!
//! # Invariants
//! - Every child process is killed when its owner is dropped, also while a test panics, and is spawned
//!   with `PR_SET_PDEATHSIG = SIGKILL` from a thread that lives as long as the test binary, so it also
//!   dies when the test binary itself is killed (CI timeout).
//! - No fixed ports or paths: tests may run in parallel.
//!
//! The API is synchronous where it drives processes or Kafka (std::process, rdkafka's blocking
//! consumer; `Broker::create_topic` runs its admin future on a private thread) and async where it
//! speaks SQL (`MariaDb::pool`, [`workload`]; [`Writer::start`] needs a tokio runtime). Blocking calls
//! (`MariaDb::start`, `Broker::read_all`, …) are fine on the test thread of a
//! `#[tokio::test(flavor = "multi_thread")]`, which is not a runtime worker.
// Each test binary uses a subset of the harness.
#![allow(dead_code)]

pub mod audit;
pub mod broker;
pub mod connector;
pub mod mariadb;
pub mod patterns;
pub mod pki;
pub mod process;
pub mod proxy;
pub mod registry;
pub mod reliability;
pub mod workload;

#[allow(unused_imports)]
pub use audit::{audit, AuditReport, Expected};
#[allow(unused_imports)]
pub use broker::{ids_of_key, noida_db_path, Broker, Engine, Isolation, Received, NOIDA_DB_VERSION};
#[allow(unused_imports)]
pub use connector::{write_config, AuditRun, Connector};
#[allow(unused_imports)]
pub use mariadb::{purge_binlogs_before_current, MariaDb, MariaDbBuilder, ServerTls};
#[allow(unused_imports)]
pub use proxy::Proxy;
#[allow(unused_imports)]
pub use workload::{business_tx, insert_event, new_event_id, OutboxRow, Writer, WriterConfig, Written};

use std::collections::HashSet;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Ports handed out by [`free_port`] in this test binary, so that two parallel tests never get the
/// same one even if the kernel hands a just-released port out again.
static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

/// A TCP port on 127.0.0.1 that is free right now (bind to port 0, read the port, release it).
///
/// Never returns the same port twice within one test binary. Another process may still grab it
/// before the service binds it; that race is accepted (it shows as a clear start-up failure).
pub fn free_port() -> u16 {
    let mut guard = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    let seen = guard.get_or_insert_with(HashSet::new);
    loop {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind 127.0.0.1:0");
        let port = listener.local_addr().expect("local_addr").port();
        if seen.insert(port) {
            return port;
        }
    }
}

/// True when something accepts TCP connections on 127.0.0.1:`port`.
pub fn port_accepts(port: u16) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
}

/// True when 127.0.0.1:`port` can be bound (nobody listens on it any more).
pub fn port_is_free(port: u16) -> bool {
    TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
}

/// Polls `cond` every 50 ms until it is true or `timeout` passes; returns whether it became true.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A real binlog file of `../shared/fixtures/binlog` (its MANIFEST.md says where each comes from).
pub fn binlog_fixture(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/fixtures/binlog").join(name)
}

/// Body of `GET /metrics` on 127.0.0.1:`port`; `None` while nothing answers 200.
pub fn scrape(port: u16) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(stream, "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_string())
}

/// AWS's documentation example credentials, for signers compared with AWS's own: long-term keys, and
/// temporary keys with a session token.
#[allow(dead_code)]
pub fn example_aws_credentials() -> (aws_credential_types::Credentials, aws_credential_types::Credentials) {
    use aws_credential_types::Credentials;
    let long_term = Credentials::new("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", None, None, "test");
    let temporary = Credentials::new(
        "ASIAEXAMPLE",
        "je7MtGbClwBF/2Zp9Utk/h3yCo8nvbEXAMPLEKEY",
        Some("IQoJb3JpZ2luX2VjEXAMPLE+/token==".to_string()),
        None,
        "test",
    );
    (long_term, temporary)
}

/// The last `max_lines` lines of a text file, or a note that it can't be read (for panic messages).
pub fn tail_file(path: &std::path::Path, max_lines: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(max_lines)..].join("\n")
        }
        Err(e) => format!("<cannot read {}: {e}>", path.display()),
    }
}

/// Reads `topic` until at least `expected.len()` records arrived (or `timeout`), audits them, and fails the
/// test with the audit summary and the connector's logs unless nothing is missing, out of order or
/// unexpected. Returns the records and the report (duplicates are for the caller to judge).
pub fn read_and_audit(
    broker: &Broker,
    topic: &str,
    expected: &Expected,
    timeout: Duration,
    connector: &Connector,
) -> (Vec<Received>, AuditReport) {
    let records = broker.read_all(topic, expected.len(), timeout);
    let report = audit(expected, &records);
    assert!(report.is_clean(), "{}\n{}", report.summary(), connector.logs());
    (records, report)
}
