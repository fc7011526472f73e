//! Secrets from the environment and from files (`source.password_file`, `[kafka] properties_env` and
//! `properties_file`), through the real binary: a missing variable or file stops `check` and `run` with a
//! definite error (exit 2) naming it, `status` does not need them, a secret read from a file or a variable
//! is never printed nor stored, and the database passwords from files stream, audit and prune against a
//! real MariaDB and broker.
//!
//! No test here authenticates to Kafka with SASL: the test broker (Tansu) offers no mechanism librdkafka
//! shares, and librdkafka's mock cluster implements no SASL. That the secrets reach librdkafka's
//! configuration is `sink::kafka`'s unit test `secrets_from_files_and_the_environment_reach_the_client`.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::connector::toml_str;
use common::mariadb::CDC_PASSWORD;
use common::{insert_event, Broker, Connector, Engine, MariaDb, OutboxRow};
use outbox_cdc::config::Config;
use outbox_cdc::error::EXIT_DEFINITE;
use outbox_cdc::ops::prune::{self, PruneOptions};

const TIMEOUT: Duration = Duration::from_secs(60);
const PASSWORD: &str = "hunter2-from-a-file";

/// A config for a server on a port where none listens, with `source_extra` in `[source]`: what fails
/// must fail before connecting.
fn server_config(connector: &Connector, source_extra: &str) {
    let text = format!(
        "[source]\nhost = \"127.0.0.1\"\nport = 9\nuser = \"cdc\"\nserver_id = 5\n{source_extra}\n\n\
         [outbox]\ntable = \"shop.outbox_events\"\n\n[state]\ndir = {state}\n\n[metrics]\nenabled = false\n\n\
         [kafka]\nbootstrap_servers = \"127.0.0.1:9\"\n",
        state = toml_str(&connector.state_dir().to_string_lossy()),
    );
    std::fs::write(connector.config_path(), text).unwrap();
}

/// Runs `outbox-cdc <args> --config <config>` with `env` set and `unset` removed: exit status, stdout,
/// stderr.
fn command(connector: &Connector, args: &[&str], env: &[(&str, &str)], unset: &str) -> (Option<i32>, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_outbox-cdc"))
        .args(args)
        .arg("--config")
        .arg(connector.config_path())
        .current_dir(connector.dir())
        .env_remove(unset)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run outbox-cdc");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (output.status.code(), text(&output.stdout), text(&output.stderr))
}

fn write_secret(dir: &Path, name: &str, content: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, content).unwrap();
    path
}

/// A secret file that is not there (an unmounted Kubernetes Secret, a typo in the path) stops `check`
/// and `run` with exit 2, naming the setting and the path; `status` does not read secrets and still works.
#[test]
fn a_missing_secret_file_is_a_definite_error_naming_it() {
    let connector = Connector::new();
    let missing = connector.dir().join("no-such-secret");
    let missing_text = missing.display().to_string();
    let kafka = format!("\n[kafka.properties_file]\n\"sasl.password\" = {}\n", toml_str(&missing_text));
    let source = format!("password_file = {}", toml_str(&missing_text));
    for what in ["kafka", "source"] {
        let setting = match what {
            "kafka" => {
                connector.write_files_config(&kafka);
                "kafka.properties_file (for sasl.password) names the file"
            }
            _ => {
                server_config(&connector, &source);
                "source.password_file names the file"
            }
        };
        for args in [&["check"][..], &["run"]] {
            let (code, out, err) = command(&connector, args, &[], "");
            assert_eq!(code, Some(EXIT_DEFINITE), "{what} {args:?}: {out}{err}");
            assert!(err.contains(setting) && err.contains(&missing_text), "{what} {args:?}: {err}");
        }
        let (code, out, err) = command(&connector, &["status"], &[], "");
        assert_eq!(code, Some(0), "{what}: status needs no secret: {out}{err}");
    }
}

/// A variable `properties_env` names must be set: unset or empty is exit 2 naming it.
#[test]
fn a_missing_environment_variable_is_a_definite_error_naming_it() {
    let connector = Connector::new();
    connector.write_files_config("\n[kafka.properties_env]\n\"sasl.password\" = \"OUTBOX_CDC_TEST_KAFKA_PASSWORD\"\n");
    for (env, expected) in [(&[][..], "is not set"), (&[("OUTBOX_CDC_TEST_KAFKA_PASSWORD", "")][..], "is empty")] {
        for args in [&["check"][..], &["run"]] {
            let (code, out, err) = command(&connector, args, env, "OUTBOX_CDC_TEST_KAFKA_PASSWORD");
            let err = err.replace('\n', " ");
            assert_eq!(code, Some(EXIT_DEFINITE), "{args:?}: {out}{err}");
            assert!(
                err.contains("kafka.properties_env (for sasl.password) names OUTBOX_CDC_TEST_KAFKA_PASSWORD")
                    && err.contains(expected),
                "{args:?}: {err}"
            );
        }
    }
}

/// Regression guard for the secrets' new sources: librdkafka's error for an unknown property repeats its
/// value, here the content of a file or of a variable (a misspelled `sasl.pasword`). Neither reaches
/// stderr, the stored `last_error` or `status`; the error still names the key.
#[test]
fn a_secret_from_a_file_or_the_environment_is_never_printed_nor_stored() {
    let dir = tempfile::tempdir().unwrap();
    let file = write_secret(dir.path(), "kafka-password", &format!("{PASSWORD}\n"));
    let from_file = format!("\n[kafka.properties_file]\n\"sasl.pasword\" = {}\n", toml_str(&file.to_string_lossy()));
    let from_env = "\n[kafka.properties_env]\n\"sasl.pasword\" = \"OUTBOX_CDC_TEST_KAFKA_PASSWORD\"\n";
    for extra in [from_file.as_str(), from_env] {
        let connector = Connector::new();
        connector.write_files_config(extra);
        let env = [("OUTBOX_CDC_TEST_KAFKA_PASSWORD", PASSWORD)];
        for args in [&["run"][..], &["check"]] {
            let (code, out, err) = command(&connector, args, &env, "");
            assert_eq!(code, Some(EXIT_DEFINITE), "{extra} {args:?}: {out}{err}");
            assert!(!out.contains(PASSWORD) && !err.contains(PASSWORD), "{args:?} printed the secret:\n{out}{err}");
            assert!(err.contains("sasl.pasword"), "the error names the key: {err}");
        }
        for args in [&["status"][..], &["status", "--json"]] {
            let (code, out, err) = command(&connector, args, &[], "");
            assert_eq!(code, Some(0), "{args:?}: {out}{err}");
            assert!(out.contains("sasl.pasword"), "{args:?} shows the stored error: {out}");
            assert!(!out.contains(PASSWORD) && !err.contains(PASSWORD), "{args:?} printed the secret:\n{out}{err}");
        }
        let store = std::fs::read(connector.state_dir().join("outbox-cdc.redb")).unwrap();
        assert!(!String::from_utf8_lossy(&store).contains(PASSWORD), "the state store holds the secret");
    }
}

/// The live path: the replication user's password and the prune user's come from files ending in a
/// newline (as `echo` and editors write them); `check` connects with the first, `run` streams with it,
/// `audit` reads the table with it, and `prune` deletes as the prune user with the second.
#[tokio::test(flavor = "multi_thread")]
async fn database_passwords_from_files_stream_audit_and_prune() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    db.sql(
        "CREATE USER 'pruner'@'127.0.0.1' IDENTIFIED BY 'prune-pw'; \
         GRANT SELECT, DELETE ON shop.outbox_events TO 'pruner'@'127.0.0.1'",
    );
    let mut conn = db.conn().await;
    let row = OutboxRow::new("A-1").occurred_at("2001-02-03 04:05:06.000000");
    insert_event(&mut conn, &row).await.unwrap();

    let mut connector = Connector::new();
    let cdc = write_secret(connector.dir(), "db-password", &format!("{CDC_PASSWORD}\n"));
    let pruner = write_secret(connector.dir(), "prune-password", "prune-pw\r\n");
    let prune = format!("\n[prune]\nuser = \"pruner\"\npassword_file = {}\n", toml_str(&pruner.to_string_lossy()));
    let config = connector.write_config(&db, &broker, &prune);
    let text = std::fs::read_to_string(&config).unwrap().replace(
        &format!("password = {}", toml_str(CDC_PASSWORD)),
        &format!("password_file = {}", toml_str(&cdc.to_string_lossy())),
    );
    assert!(!text.contains(CDC_PASSWORD) && !text.contains("prune-pw"), "{text}");
    std::fs::write(&config, text).unwrap();

    let (status, out, err) = connector.command(&["check"], TIMEOUT).unwrap();
    assert!(status.success(), "check connects with the password from the file:\n{out}{err}");
    connector.run(&config);
    let records = broker.read_all("outbox.event.order", 1, TIMEOUT);
    assert_eq!(records.len(), 1, "{}", connector.logs());
    assert_eq!(records[0].header_str("id"), Some(row.id.as_str()));
    let audit = connector.audit(&[]);
    assert_eq!(audit.code, Some(0), "{}\n{}", audit.report, audit.stderr);

    let options = PruneOptions { older_than: Duration::from_secs(86_400), wait: TIMEOUT, dry_run: false };
    let report = prune::prune(&Config::load(&config).unwrap(), &options)
        .await
        .unwrap_or_else(|e| panic!("prune: {e}\n{}", connector.logs()));
    assert_eq!(report.rows_deleted, 1, "the old row is deleted as the prune user");
    connector.terminate();
}
