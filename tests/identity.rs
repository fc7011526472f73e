//! `[source] auth`: database identities other than a password, against their counterparts.
//!
//! - The RDS IAM auth token is recomputed by botocore (`tests/rds_token.py`, the AWS SDK for Python) at the
//!   same frozen time, and must match parameter for parameter, signature included.
//! - A token from `token_file` is read again for every connection: a real MariaDB (serving TLS, verified)
//!   whose user's password changes under a running connector, its connections killed, loses no event, and
//!   the old token is refused by then.
//! - A token from a metadata endpoint (a local HTTP server answering as GCP's and Azure's do, refusing a
//!   request without their header) logs `check` in, and `check` names the identity; a token the server
//!   refuses, and AWS credentials from the environment, end in an access-denied message naming the
//!   identity and the likely causes, never the token.
//!
//! The test server's users log in with `mysql_native_password`, so the cleartext plugin that RDS, Cloud SQL
//! and Azure ask for is allowed by the connector but not exercised here.

mod common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use aws_credential_types::Credentials;
use common::connector::toml_str;
use common::pki::Pki;
use common::{insert_event, Broker, Connector, Engine, Expected, MariaDb, OutboxRow};
use mysql_async::prelude::Queryable;
use outbox_cdc::source::identity::rds_auth_token;

const READ_TIMEOUT: Duration = Duration::from_secs(120);
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);
const TOPIC: &str = "outbox.event.identity";

/// The query parameters of a token, as a set (their order is not part of what RDS checks).
fn params(token: &str) -> (String, BTreeSet<String>) {
    let (authority, query) = token.split_once("/?").unwrap_or_else(|| panic!("no /? in {token}"));
    (authority.to_string(), query.split('&').map(str::to_string).collect())
}

/// botocore's token for the same inputs.
fn botocore_token(c: &Credentials, region: &str, host: &str, port: u16, user: &str, epoch: u64) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/rds_token.py");
    let output = Command::new("python3")
        .arg(script)
        .args([c.access_key_id(), c.secret_access_key(), c.session_token().unwrap_or(""), region, host])
        .args([port.to_string(), user.to_string(), epoch.to_string()])
        // Nothing of the machine's own AWS setup may take part.
        .env("AWS_CONFIG_FILE", "/nonexistent")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
        .output()
        .expect("python3 runs (botocore: scripts/provision.sh)");
    assert!(output.status.success(), "rds_token.py: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap().trim().to_string()
}

/// The connector's RDS tokens equal botocore's `generate_db_auth_token` at the same frozen time: long-term
/// keys, temporary keys with a session token, a user name that needs percent-encoding, another port and
/// region. The signature covers the canonical request, so any difference in it (the signed host with its
/// port, the query's order or encoding, the service name, the expiry, the payload hash) fails this test.
#[test]
fn rds_token_matches_botocore() {
    let (long_term, temporary) = common::example_aws_credentials();
    let cases = [
        (&long_term, "us-east-1", "db.abc123.us-east-1.rds.amazonaws.com", 3306, "cdc", 1_440_938_160),
        (&long_term, "eu-west-1", "mydb.cluster-xyz.eu-west-1.rds.amazonaws.com", 3307, "cdc+iam user", 1_767_225_600),
        (&temporary, "ap-southeast-2", "db.example.internal", 3306, "cdc_iam", 1_767_225_600),
    ];
    for (credentials, region, host, port, user, epoch) in cases {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(epoch);
        let ours = rds_auth_token(credentials, region, host, port, user, at).unwrap();
        let theirs = botocore_token(credentials, region, host, port, user, epoch);
        assert_eq!(params(ours.expose()), params(&theirs), "\nours:     {}\nbotocore: {theirs}", ours.expose());
    }
}

/// `[source]` lines that replace the harness's password: `auth` with its keys, TLS verified by `ca`.
fn with_auth(config: &Path, auth_lines: &str) {
    let text = std::fs::read_to_string(config).unwrap();
    let password = format!("password = {}\n", toml_str(common::mariadb::CDC_PASSWORD));
    assert!(text.contains(&password), "write_config changed its layout:\n{text}");
    std::fs::write(config, text.replacen(&password, auth_lines, 1)).unwrap();
}

fn tls_lines(ca: &Path) -> String {
    format!("tls = \"verify_identity\"\ntls_ca_file = {}\n", toml_str(&ca.to_string_lossy()))
}

/// Sets the password of the test user `cdc` (both of its hosts).
async fn set_password(conn: &mut mysql_async::Conn, password: &str) {
    for host in ["127.0.0.1", "localhost"] {
        assert!(!password.contains('\''), "{password}");
        conn.query_drop(format!("ALTER USER 'cdc'@'{host}' IDENTIFIED BY '{password}'")).await.unwrap();
    }
}

/// Kills every connection of the user `cdc`; returns how many there were.
async fn kill_connections(conn: &mut mysql_async::Conn) -> usize {
    let ids: Vec<u64> = conn.query("SELECT ID FROM information_schema.PROCESSLIST WHERE USER = 'cdc'").await.unwrap();
    for id in &ids {
        // A connection may end by itself meanwhile.
        let _ = conn.query_drop(format!("KILL {id}")).await;
    }
    ids.len()
}

/// Whether `password` logs `cdc` in (over TLS, not verified: only the password is in question).
async fn logs_in(db: &MariaDb, password: &str) -> Result<(), mysql_async::Error> {
    let url = format!(
        "mysql://cdc:{password}@127.0.0.1:{}?prefer_socket=false&require_ssl=true&verify_ca=false\
         &verify_identity=false",
        db.port()
    );
    let conn = mysql_async::Conn::new(mysql_async::Opts::from_url(&url).unwrap()).await?;
    conn.disconnect().await
}

/// Inserts `n` events of `aggregate`; returns their ids in order.
async fn insert(db: &MariaDb, aggregate: &str, n: usize) -> Vec<String> {
    let mut conn = db.conn().await;
    let mut ids = Vec::new();
    for _ in 0..n {
        let row = OutboxRow::new(aggregate).aggregate_type("identity");
        insert_event(&mut conn, &row).await.unwrap();
        ids.push(row.id.clone());
    }
    ids
}

/// Regression guard for a token read once at start-up: a connector whose token (`auth = "gcp_iam"`,
/// `token_file`) is rotated under it, the server's password changed to the new token and every
/// connection of its user killed, reconnects with the new token and delivers every event of before and
/// after, in order; the old token is refused by then, so the stream can only have come back by reading
/// the file again. No token appears in the connector's logs.
#[tokio::test(flavor = "multi_thread")]
async fn a_rotated_token_file_is_read_again_for_each_connection() {
    let (old, new) = ("ya29.first-access-token-0001", "ya29.second-access-token-0002");
    let pki = Pki::new();
    let db = MariaDb::builder().tls(pki.server_tls()).start();
    let broker = Broker::start(Engine::Memory);
    set_password(&mut db.conn().await, old).await;

    let mut connector = Connector::new();
    let token_file = connector.dir().join("token");
    std::fs::write(&token_file, format!("{old}\n")).unwrap();
    let config = connector.write_config(&db, &broker, "");
    let auth = format!("auth = \"gcp_iam\"\ntoken_file = {}\n", toml_str(&token_file.to_string_lossy()));
    with_auth(&config, &format!("{auth}{}", tls_lines(&pki.ca_pem())));
    connector.run(&config);

    let before = insert(&db, "A-1", 10).await;
    let first = broker.read_all(TOPIC, before.len(), READ_TIMEOUT);
    assert_eq!(first.len(), before.len(), "before the rotation:\n{}", connector.logs());

    let mut root = db.conn().await;
    set_password(&mut root, new).await;
    std::fs::write(&token_file, format!("{new}\n")).unwrap();
    assert!(kill_connections(&mut root).await > 0, "the connector had no connection to kill");
    let after = insert(&db, "A-1", 10).await;

    let expected = Expected::from_orders([("A-1", before.iter().chain(&after).cloned().collect::<Vec<_>>())]);
    common::read_and_audit(&broker, TOPIC, &expected, READ_TIMEOUT, &connector);
    // It reconnected: a connection of `cdc` is back, with the new token.
    let back = common::wait_until(READ_TIMEOUT, || {
        db.sql("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE USER = 'cdc'").trim() != "0"
    });
    assert!(back, "no connection of cdc after the rotation:\n{}", connector.logs());
    let refused = logs_in(&db, old).await.expect_err("the old token must be refused by now");
    assert!(matches!(&refused, mysql_async::Error::Server(e) if e.code == 1045), "{refused}");
    logs_in(&db, new).await.expect("the new token logs in");

    assert!(connector.terminate().success(), "{}", connector.logs());
    let logs = connector.logs();
    assert!(!logs.contains(old) && !logs.contains(new), "a token was logged:\n{logs}");
}

/// What the local metadata endpoint saw: requests with the cloud's header, and without.
#[derive(Default)]
struct Seen {
    with_header: usize,
    without_header: usize,
}

/// A local HTTP server answering token requests as a metadata endpoint does: `body` to a request that
/// carries `header` (a line, lower case), 403 to one without (as GCP's and Azure's refuse it). Returns its
/// URL and what it saw.
fn metadata_endpoint(header: &'static str, body: String) -> (String, Arc<Mutex<Seen>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://127.0.0.1:{}/token?resource=db", listener.local_addr().unwrap().port());
    let seen = Arc::new(Mutex::new(Seen::default()));
    let counts = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut head = Vec::new();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                head.push(line.trim_end().to_ascii_lowercase());
            }
            let ok = head.iter().any(|l| l == header);
            let mut counts = counts.lock().unwrap();
            let (status, body) = if ok {
                counts.with_header += 1;
                ("200 OK", body.as_str())
            } else {
                counts.without_header += 1;
                ("403 Forbidden", "{\"error\":\"missing metadata header\"}")
            };
            let _ = write!(
                stream,
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (url, seen)
}

/// `auth = "gcp_iam"` and `"azure_ad"` through a metadata endpoint: `check` logs in with the token the
/// endpoint gave (GCP's numeric `expires_in`, Azure's textual one), asks with the cloud's header, and says
/// which identity was accepted. A token the server refuses stops `check` with exit 2 and the likely causes,
/// naming the identity and never the token.
#[tokio::test(flavor = "multi_thread")]
async fn check_logs_in_with_a_metadata_endpoint_token_and_names_it() {
    let token = "eyJ0eXAiOiJKV1QiLCJhbGciOi.metadata-token-0003";
    let pki = Pki::new();
    let db = MariaDb::builder().tls(pki.server_tls()).start();
    let broker = Broker::start(Engine::Memory);
    set_password(&mut db.conn().await, token).await;

    let clouds = [
        (
            "gcp_iam",
            "metadata-flavor: google",
            format!("{{\"access_token\":\"{token}\",\"expires_in\":3599,\"token_type\":\"Bearer\"}}"),
        ),
        (
            "azure_ad",
            "metadata: true",
            format!("{{\"access_token\":\"{token}\",\"expires_in\":\"3599\",\"token_type\":\"Bearer\"}}"),
        ),
    ];
    for (auth, header, body) in clouds {
        let (url, seen) = metadata_endpoint(header, body);
        let connector = Connector::new();
        let config = connector.write_config(&db, &broker, "");
        let lines = format!("auth = \"{auth}\"\nmetadata_url = {}\n{}", toml_str(&url), tls_lines(&pki.ca_pem()));
        with_auth(&config, &lines);
        let (status, out, err) = connector.command(&["check"], COMMAND_TIMEOUT).expect("check finishes");
        let identity =
            format!("identity: user cdc by auth = \"{auth}\" (metadata endpoint {})", url.split('?').next().unwrap());
        assert!(out.contains(&identity), "{auth}: {identity}\n{out}{err}");
        assert!(status.success(), "{auth}:\n{out}{err}");
        assert!(!out.contains(token) && !err.contains(token), "{auth}: the token was printed\n{out}{err}");
        let seen = seen.lock().unwrap();
        assert!(
            seen.with_header >= 1 && seen.without_header == 0,
            "{auth}: {} / {}",
            seen.with_header,
            seen.without_header
        );
    }

    // A token the server does not know.
    let (url, _) = metadata_endpoint(
        "metadata: true",
        "{\"access_token\":\"not-the-password-0004\",\"expires_in\":\"3599\"}".to_string(),
    );
    let connector = Connector::new();
    let config = connector.write_config(&db, &broker, "");
    with_auth(
        &config,
        &format!("auth = \"azure_ad\"\nmetadata_url = {}\n{}", toml_str(&url), tls_lines(&pki.ca_pem())),
    );
    let (status, out, err) = connector.command(&["check"], COMMAND_TIMEOUT).expect("check finishes");
    assert_eq!(status.code(), Some(outbox_cdc::error::EXIT_DEFINITE), "{out}{err}");
    let text = format!("{out}{err}");
    for expected in ["1045", "as user cdc by auth = \"azure_ad\" (metadata endpoint", "Likely causes", "CREATE AADUSER"]
    {
        assert!(text.contains(expected), "{expected}:\n{text}");
    }
    assert!(!text.contains("not-the-password-0004"), "the token was printed:\n{text}");
}

/// `auth = "aws_iam"` with credentials from the environment (the SDK's default chain): the token is made
/// and sent, and the server's refusal (it has no AWSAuthenticationPlugin) stops `check` with exit 2, the
/// identity (the access key id's last four characters, the region) and the likely causes, never the token
/// nor the secret key.
#[test]
fn check_names_the_aws_identity_when_the_server_refuses_it() {
    let pki = Pki::new();
    let db = MariaDb::builder().tls(pki.server_tls()).start();
    let broker = Broker::start(Engine::Memory);
    let connector = Connector::new();
    let config = connector.write_config(&db, &broker, "");
    with_auth(&config, &format!("auth = \"aws_iam\"\naws_region = \"eu-central-1\"\n{}", tls_lines(&pki.ca_pem())));
    let secret = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
    let output = Command::new(env!("CARGO_BIN_EXE_outbox-cdc"))
        .args(["check", "--config"])
        .arg(&config)
        .current_dir(connector.dir())
        .env("AWS_ACCESS_KEY_ID", "AKIAIOSFODNN7EXAMPLE")
        .env("AWS_SECRET_ACCESS_KEY", secret)
        .env("AWS_CONFIG_FILE", "/nonexistent")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .stdin(Stdio::null())
        .output()
        .expect("run outbox-cdc check");
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert_eq!(output.status.code(), Some(outbox_cdc::error::EXIT_DEFINITE), "{text}");
    for expected in [
        "as user cdc by auth = \"aws_iam\" (access key id ...MPLE, region eu-central-1)",
        "1045",
        "IDENTIFIED WITH AWSAuthenticationPlugin AS 'RDS'",
        "rds-db:connect",
        "clock",
    ] {
        assert!(text.contains(expected), "{expected}:\n{text}");
    }
    assert!(!text.contains(secret) && !text.contains("X-Amz-Signature"), "a secret was printed:\n{text}");
}
