//! Secrets never leave the config: not on stderr, not in the state store's `last_error`, not in
//! `outbox-cdc status`, not in `Debug`; and the state directory is the connector's alone. Through the real
//! binary and the real librdkafka; most cases need no database or broker, because each leak happened before
//! either is reached; one runs the live path against a real MariaDB and broker.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use common::connector::toml_str;
use common::{Broker, Connector, Engine, MariaDb};
use outbox_cdc::config::Config;
use outbox_cdc::error::{classify_kafka, EXIT_DEFINITE};
use outbox_cdc::source::SourceConn;
use rdkafka::config::ClientConfig;
use rdkafka::producer::BaseProducer;

const TIMEOUT: Duration = Duration::from_secs(60);
const PASSWORD: &str = "hunter2-secret";

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// Regression: a misspelled secret key under `[source]` made toml quote the line, `5 | pasword="hunter2"`,
/// on stderr. The error still says where and what is wrong.
#[test]
fn a_misspelled_source_password_is_not_printed() {
    let connector = Connector::new();
    let text = format!(
        "[source]\nhost = \"127.0.0.1\"\nuser = \"cdc\"\nserver_id = 5\npasword = {}\n\n[outbox]\n\
         table = \"shop.outbox_events\"\n\n[kafka]\nbootstrap_servers = \"127.0.0.1:9\"\n",
        toml_str(PASSWORD)
    );
    std::fs::write(connector.config_path(), text).unwrap();
    for command in [&["check"][..], &["run"], &["status"]] {
        let (status, out, err) = connector.command(command, TIMEOUT).unwrap();
        assert_eq!(status.code(), Some(EXIT_DEFINITE), "{command:?}: {out}{err}");
        assert!(!err.contains(PASSWORD) && !out.contains(PASSWORD), "{command:?} printed the password:\n{out}{err}");
        assert!(err.contains("line 5") && err.contains("unknown field `pasword`"), "{command:?}: {err}");
    }
}

/// Regression: librdkafka's error for a misspelled `sasl.pasword` in `[kafka.properties]` repeats the
/// value; it reached stderr, the stored `last_error` and `outbox-cdc status`. Now none of them has it, all
/// still name the key; and the state directory the run created is 0700.
#[test]
fn a_misspelled_kafka_password_is_not_printed_nor_stored() {
    let connector = Connector::new();
    connector.write_files_config(&format!("\n[kafka.properties]\n\"sasl.pasword\" = {}\n", toml_str(PASSWORD)));
    let (status, out, err) = connector.command(&["run"], TIMEOUT).unwrap();
    assert_eq!(status.code(), Some(EXIT_DEFINITE), "{out}{err}");
    assert!(!err.contains(PASSWORD) && !out.contains(PASSWORD), "run printed the password:\n{out}{err}");
    assert!(err.contains("sasl.pasword"), "the error names the key: {err}");

    for command in [&["status"][..], &["status", "--json"]] {
        let (status, out, err) = connector.command(command, TIMEOUT).unwrap();
        assert!(status.success(), "{command:?}: {out}{err}");
        assert!(out.contains("sasl.pasword"), "{command:?} shows the stored error: {out}");
        assert!(!out.contains(PASSWORD) && !err.contains(PASSWORD), "{command:?} printed the password:\n{out}{err}");
    }
    let store = std::fs::read(connector.state_dir().join("outbox-cdc.redb")).unwrap();
    assert!(!String::from_utf8_lossy(&store).contains(PASSWORD), "the state store holds the password");
    assert_eq!(mode(&connector.state_dir()), 0o700);
}

/// The live path: the replication connection is up when the producer is created; nothing is checkpointed
/// yet, and `status` shows the stored error, without the password.
#[test]
fn a_misspelled_kafka_password_is_not_printed_on_the_live_path() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let extra = format!("\n[kafka.properties]\n\"sasl.pasword\" = {}\n", toml_str(PASSWORD));
    let mut connector = Connector::start(&db, &broker, &extra);
    let status = connector.wait_exit(TIMEOUT).expect("a configuration error stops the run");
    assert_eq!(status.code(), Some(EXIT_DEFINITE), "{}", connector.logs());
    assert!(!connector.logs().contains(PASSWORD), "{}", connector.logs());
    assert!(connector.stderr().contains("sasl.pasword"), "{}", connector.logs());
    let (status, out, err) = connector.command(&["status"], TIMEOUT).unwrap();
    assert!(status.success(), "{out}{err}");
    assert!(out.contains("last error") && out.contains("sasl.pasword"), "{out}");
    assert!(!out.contains(PASSWORD) && !err.contains(PASSWORD), "{out}{err}");
}

/// Regression: an error that stopped the first run before anything was checkpointed was stored, but
/// `status` only said "the connector has not started yet".
#[test]
fn status_shows_the_last_error_before_any_checkpoint() {
    let connector = Connector::new();
    let config = connector.write_files_config("");
    let missing = connector.dir().join("no-such-binlog.000001");
    let text = std::fs::read_to_string(&config).unwrap();
    let text = text.replace(
        &toml_str(
            &common::binlog_fixture("mariadb-operator-mariadb-poc/domain_id_0.mariadb-repl-bin.000010")
                .to_string_lossy(),
        ),
        &toml_str(&missing.to_string_lossy()),
    );
    std::fs::write(&config, text).unwrap();
    let (status, out, err) = connector.command(&["run"], TIMEOUT).unwrap();
    assert_eq!(status.code(), Some(EXIT_DEFINITE), "{out}{err}");
    let (status, out, err) = connector.command(&["status"], TIMEOUT).unwrap();
    assert!(status.success(), "{out}{err}");
    assert!(out.contains("no checkpoint") && out.contains("last error") && out.contains("no-such-binlog"), "{out}");
}

/// An existing state directory that others may read is left as it is, with a warning that says so.
#[test]
fn an_open_state_directory_is_warned_about() {
    let connector = Connector::new();
    connector.write_files_config("");
    std::fs::create_dir(connector.state_dir()).unwrap();
    std::fs::set_permissions(connector.state_dir(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (_, out, err) = connector.command(&["run"], TIMEOUT).unwrap();
    assert!(err.contains("state directory is open to other users"), "{out}{err}");
    assert_eq!(mode(&connector.state_dir()), 0o755);
}

/// Regression: rust-rdkafka's text of a configuration error is `<description> <key> <value>`.
#[test]
fn kafka_configuration_errors_never_repeat_a_secret_value() {
    let cases =
        [("sasl.pasword", true), ("sasl.jaas.config", true), ("ssl.keystore.passwrd", true), ("lingr.ms", false)];
    for (key, secret) in cases {
        let value = format!("{key}-{PASSWORD}");
        let raw = ClientConfig::new().set(key, &value).create::<BaseProducer>().err().expect("librdkafka refuses it");
        assert!(raw.to_string().contains(&value), "rust-rdkafka repeats the value: {raw}");
        let error = classify_kafka(&raw).to_string();
        assert!(error.contains(key), "{error}");
        assert!(!error.contains(&value), "{key} (secret-looking: {secret}): {error}");
    }
}

/// Regression: `Debug` of the config printed `[kafka.properties]` in clear, and `Debug` of the connection
/// settings built from it printed the password (`mysql_async`'s `Opts`).
#[test]
fn debug_of_the_config_and_its_connection_shows_no_secret() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("connector.toml");
    let text = format!(
        "[source]\nhost = \"127.0.0.1\"\nuser = \"cdc\"\nserver_id = 5\npassword = {p}\n\n[outbox]\n\
         table = \"shop.outbox_events\"\n\n[kafka]\nbootstrap_servers = \"127.0.0.1:9\"\n\n[kafka.properties]\n\
         \"sasl.password\" = {p}\n\"sasl.pasword\" = {p}\n\"sasl.jaas.config\" = {jaas}\n\n\
         [prune]\nuser = \"pruner\"\npassword = {p}\n",
        p = toml_str(PASSWORD),
        jaas = toml_str(&format!(
            "org.apache.kafka.common.security.plain.PlainLoginModule required password=\"{PASSWORD}\";"
        )),
    );
    std::fs::write(&path, text).unwrap();
    let config = Config::load(&path).unwrap();
    let debug = format!("{config:?}");
    assert!(!debug.contains(PASSWORD), "{debug}");
    assert!(debug.contains("sasl.pasword"), "{debug}");
    let conn = format!("{:?}", SourceConn::from_config(&config).unwrap());
    assert!(!conn.contains(PASSWORD), "{conn}");
    assert!(conn.contains("127.0.0.1:3306"), "{conn}");
}
