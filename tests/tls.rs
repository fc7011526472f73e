//! TLS to the database, against a real MariaDB that serves TLS with certificates made by the test and refuses
//! plain TCP (`require_secure_transport=ON`), so that a connection that works is an encrypted one.
//!
//! Each `source.tls` mode streams an event end to end; each way a connection must be refused (a certificate
//! from another CA, a certificate without the host's name, plain TCP where the server requires TLS, TLS where
//! the server has none) stops `run` and `check` with a definite error (exit 2) that names the problem and the
//! setting to fix, instead of retrying forever.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::connector::toml_str;
use common::pki::Pki;
use common::{insert_event, Broker, Connector, Engine, MariaDb, OutboxRow};

/// How long an event may take to reach the topic.
const READ_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a refused connector may take to stop: connecting and classifying, no retries.
const EXIT_TIMEOUT: Duration = Duration::from_secs(60);

/// `tls = "<mode>"`, and `tls_ca_file` when `ca` is given.
fn tls(mode: &str, ca: Option<&Path>) -> String {
    match ca {
        Some(ca) => format!("tls = {}\ntls_ca_file = {}\n", toml_str(mode), toml_str(&ca.to_string_lossy())),
        None => format!("tls = {}\n", toml_str(mode)),
    }
}

/// Writes the connector's config for `db` and `broker` with `[source] host = host` and the `tls_lines`.
fn configure(connector: &Connector, db: &MariaDb, broker: &Broker, host: &str, tls_lines: &str) -> PathBuf {
    let config = connector.write_config(db, broker, "");
    let text = std::fs::read_to_string(&config).expect("read the config");
    let plain = "[source]\nhost = \"127.0.0.1\"\n";
    assert!(text.starts_with(plain), "write_config changed its layout:\n{text}");
    let text = text.replacen(plain, &format!("[source]\nhost = {}\n{tls_lines}", toml_str(host)), 1);
    std::fs::write(&config, text).expect("write the config");
    config
}

/// Runs the connector towards `host` with `tls_lines`, inserts an event of aggregate type `label` (its own
/// topic) and asserts that it arrives, then stops the connector gracefully.
async fn assert_streams(db: &MariaDb, broker: &Broker, host: &str, tls_lines: &str, label: &str) {
    let mut connector = Connector::new();
    let config = configure(&connector, db, broker, host, tls_lines);
    connector.run(&config);
    let row = OutboxRow::new(format!("A-{label}")).aggregate_type(label);
    insert_event(&mut db.conn().await, &row).await.expect("insert the event");
    let records = broker.read_all(&format!("outbox.event.{label}"), 1, READ_TIMEOUT);
    assert!(
        records.iter().any(|r| r.header_str("id") == Some(row.id.as_str())),
        "{label}: the event did not arrive over {tls_lines:?} to {host}\n{}",
        connector.logs()
    );
    assert!(connector.terminate().success(), "{label}:\n{}", connector.logs());
}

/// Runs `run`, then `check`, towards `host` with `tls_lines`: each must stop at once with exit 2 (definite:
/// an operator has to act, a retry cannot help) and say each of `expected`.
fn assert_refused(db: &MariaDb, broker: &Broker, host: &str, tls_lines: &str, expected: &[&str]) {
    let mut connector = Connector::new();
    let config = configure(&connector, db, broker, host, tls_lines);
    connector.run(&config);
    let status = connector
        .wait_exit(EXIT_TIMEOUT)
        .unwrap_or_else(|| panic!("run over {tls_lines:?} to {host} must stop, not retry:\n{}", connector.logs()));
    assert_eq!(status.code(), Some(2), "run over {tls_lines:?} to {host}:\n{}", connector.logs());
    let logs = connector.stderr();
    for text in expected {
        assert!(logs.contains(text), "run over {tls_lines:?} to {host} must say {text:?}:\n{logs}");
    }

    let (status, out, err) = connector.command(&["check"], EXIT_TIMEOUT).expect("check must finish");
    assert_eq!(status.code(), Some(2), "check over {tls_lines:?} to {host}:\n{out}{err}");
    for text in expected {
        assert!(
            out.contains(text) || err.contains(text),
            "check over {tls_lines:?} to {host} must say {text:?}:\n{out}{err}"
        );
    }
}

/// `required` (encrypted, not verified) and `verify_identity` by IP address and by name stream through a
/// server that refuses plain TCP, and `check` passes under `verify_identity`.
#[tokio::test(flavor = "multi_thread")]
async fn required_and_verify_identity_stream_over_tls() {
    let pki = Pki::new();
    let db = MariaDb::builder().tls(pki.server_tls()).start();
    let broker = Broker::start(Engine::Memory);
    let ca = pki.ca_pem();
    assert_streams(&db, &broker, "127.0.0.1", &tls("required", None), "required").await;
    assert_streams(&db, &broker, "127.0.0.1", &tls("verify_identity", Some(&ca)), "verify_ip").await;
    assert_streams(&db, &broker, "localhost", &tls("verify_identity", Some(&ca)), "verify_name").await;

    let connector = Connector::new();
    configure(&connector, &db, &broker, "localhost", &tls("verify_identity", Some(&ca)));
    let (status, out, err) = connector.command(&["check"], EXIT_TIMEOUT).expect("check must finish");
    assert!(status.success(), "check under verify_identity:\n{out}{err}");
    assert!(out.contains("all checks passed"), "{out}{err}");
}

/// `disabled` streams over plain TCP, and is refused with a definite error that points at `source.tls`
/// where the server has `require_secure_transport=ON` (MariaDB answers "Access denied", which alone would
/// send the operator to check the password).
///
/// Guards against that message being the whole diagnosis: it said only "Check source.user and the password".
#[tokio::test(flavor = "multi_thread")]
async fn disabled_streams_and_is_refused_where_the_server_requires_tls() {
    let broker = Broker::start(Engine::Memory);
    let plain = MariaDb::start();
    assert_streams(&plain, &broker, "127.0.0.1", &tls("disabled", None), "disabled").await;

    let pki = Pki::new();
    let secure = MariaDb::builder().tls(pki.server_tls()).start();
    assert_refused(
        &secure,
        &broker,
        "127.0.0.1",
        &tls("disabled", None),
        &["Access denied", "require_secure_transport", "source.tls"],
    );
}

/// A server certificate that the configured CA did not sign is refused under `verify_identity`, definitely
/// and naming `tls_ca_file`: a certificate from another CA, the public roots alone (no `tls_ca_file`), a CA
/// file that does not exist, and one that holds no certificate.
///
/// Guards against the refusal being classified transient: the connector then retried the handshake forever
/// (and `check` would have exited 3, the code of a transient failure).
#[tokio::test(flavor = "multi_thread")]
async fn a_certificate_from_another_ca_is_refused() {
    let pki = Pki::new();
    let db = MariaDb::builder().tls(pki.server_tls()).start();
    let broker = Broker::start(Engine::Memory);
    let wrong_ca = pki.wrong_ca_pem();
    let refusal = ["invalid peer certificate: UnknownIssuer", "source.tls_ca_file"];
    assert_refused(&db, &broker, "127.0.0.1", &tls("verify_identity", Some(&wrong_ca)), &refusal);
    assert_refused(&db, &broker, "localhost", &tls("verify_identity", None), &refusal);

    let missing = pki.path("missing-ca.pem");
    let lines = tls("verify_identity", Some(&missing));
    assert_refused(&db, &broker, "127.0.0.1", &lines, &["source.tls_ca_file", &missing.to_string_lossy()]);

    let garbage = pki.path("garbage-ca.pem");
    std::fs::write(&garbage, "not a certificate\n").expect("write the garbage CA file");
    let lines = tls("verify_identity", Some(&garbage));
    assert_refused(&db, &broker, "127.0.0.1", &lines, &["TLS to the database cannot be set up", "source.tls_ca_file"]);
}

/// A certificate that the right CA signed for another host is refused under `verify_identity`, by IP and by
/// name, with the names it is valid for; `required` (which does not verify) still streams from it.
///
/// Guards against the refusal being classified transient (the handshake was retried forever).
#[tokio::test(flavor = "multi_thread")]
async fn a_certificate_without_the_host_name_is_refused() {
    let pki = Pki::new();
    let db = MariaDb::builder().tls(pki.nameless_tls()).start();
    let broker = Broker::start(Engine::Memory);
    let ca = pki.ca_pem();
    for host in ["127.0.0.1", "localhost"] {
        let expected = ["certificate not valid for name", host, "db.example.test", "source.host"];
        assert_refused(&db, &broker, host, &tls("verify_identity", Some(&ca)), &expected);
    }
    assert_streams(&db, &broker, "127.0.0.1", &tls("required", None), "required_nameless").await;
}

/// `required` against a server that offers no TLS is refused with a definite error, never downgraded to
/// plain TCP; and `tls = "preferred"` (TLS when offered) is not a mode: the config is refused with the
/// modes there are.
///
/// Guards against the missing capability being classified transient (the connector retried forever).
#[tokio::test(flavor = "multi_thread")]
async fn required_is_refused_by_a_server_without_tls() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    assert_refused(&db, &broker, "127.0.0.1", &tls("required", None), &["does not offer TLS", "source.tls"]);
    assert_refused(&db, &broker, "127.0.0.1", &tls("preferred", None), &["preferred", "verify_identity"]);
}
