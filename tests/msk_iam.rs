//! `[kafka] auth = "aws_iam"` (Amazon MSK's IAM access control) against its counterparts:
//!
//! - The token is compared with the one AWS's MSK signer for Python (`aws-msk-iam-sasl-signer-python`,
//!   `tests/msk_token.py`) makes at the same frozen time: parameter for parameter, signature included.
//! - An MSK IAM listener (`tests/msk_front.py`) sits in front of Tansu: TLS, SASL/OAUTHBEARER, every token
//!   checked as MSK checks it, its signature recomputed by botocore, for credentials the listener issued as
//!   ECS's container endpoint does, each valid for [`CREDENTIALS_LIFETIME_S`]. A session ends with its token's
//!   credentials (KIP-368), and a request after that closes the connection. Against it, `check`, `run`,
//!   `audit`, `replay` and `quarantine release` each authenticate; the running connector signs new tokens as
//!   its credentials expire and re-authenticates its open connections with them; every event reaches Kafka
//!   once and in order, judged on every record by a reader of the broker itself; no token or secret is
//!   logged.
//!
//! Not run here: the Kafka state backend's clients (its writer is transactional, and Tansu has no
//! transactions; noida-db, which has, advertises only its own port). They are made through the same
//! `kafka::identity::create` as every client above.

mod common;

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use aws_credential_types::Credentials;
use base64::Engine as _;
use common::pki::Pki;
use common::{audit, free_port, insert_event, Broker, Connector, Engine, Expected, MariaDb, OutboxRow};
use outbox_cdc::kafka::identity::msk_auth_token;
use serde_json::{json, Value};

const REGION: &str = "eu-west-1";
/// How long each set of credentials the listener issues is valid: a connector that kept a token past it
/// would be refused at its next authentication.
const CREDENTIALS_LIFETIME_S: u64 = 20;
const TOPIC: &str = "outbox.event.order";
const DLQ: &str = "dlq";
const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);
const READ_TIMEOUT: Duration = Duration::from_secs(120);

/// The URL a token encodes.
fn decode(token: &str) -> String {
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(token).expect("base64url without padding");
    String::from_utf8(bytes).expect("a URL")
}

/// A URL's part before `?` and its query parameters, as a set, without `User-Agent` (each signer names
/// itself there, after the signature).
fn params(url: &str) -> (String, BTreeSet<String>) {
    let (base, query) = url.split_once('?').unwrap_or_else(|| panic!("no ? in {url}"));
    (base.to_string(), query.split('&').filter(|p| !p.starts_with("User-Agent=")).map(str::to_string).collect())
}

/// AWS's Python signer's token and expiry (epoch ms) for the same inputs.
fn aws_signer_token(c: &Credentials, region: &str, epoch: u64) -> (String, u64) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/msk_token.py");
    let output = Command::new("python3")
        .arg(script)
        .args([c.access_key_id(), c.secret_access_key(), c.session_token().unwrap_or(""), region])
        .arg(epoch.to_string())
        .env("AWS_CONFIG_FILE", "/nonexistent")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
        .output()
        .expect("python3 runs (aws-msk-iam-sasl-signer-python: scripts/provision.sh)");
    assert!(output.status.success(), "msk_token.py: {}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8(output.stdout).unwrap();
    let mut lines = text.lines();
    let token = lines.next().expect("a token").to_string();
    let expiry = lines.next().expect("an expiry").parse().expect("epoch ms");
    (token, expiry)
}

/// The connector's MSK tokens equal those of AWS's signer at the same frozen time, for long-term keys and
/// temporary ones with a session token, in two regions: the signed host, the query's order and encoding,
/// the service name and the expiry are all under the signature, so any difference fails here.
#[test]
fn msk_token_matches_aws_signer() {
    let (long_term, temporary) = common::example_aws_credentials();
    for (credentials, region, epoch) in
        [(&long_term, "eu-west-1", 1_700_000_000), (&temporary, "us-east-1", 1_765_432_109)]
    {
        let ours = msk_auth_token(credentials, region, UNIX_EPOCH + Duration::from_secs(epoch)).unwrap();
        let (theirs, their_expiry) = aws_signer_token(credentials, region, epoch);
        let (ours_url, theirs_url) = (decode(ours.token.expose()), decode(&theirs));
        assert_eq!(params(&ours_url), params(&theirs_url), "\nours:   {ours_url}\ntheirs: {theirs_url}");
        // (The order differs: the SigV4 crate puts X-Amz-Security-Token after the signature, botocore before
        // it. It is not signed, and MSK reads the parameters by name.)
        assert!(ours_url.contains("&X-Amz-Signature="), "{ours_url}");
        assert!(ours_url.ends_with(concat!("&User-Agent=outbox-cdc%2F", env!("CARGO_PKG_VERSION"))), "{ours_url}");
        let ours_expiry = ours.expires.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
        assert_eq!(ours_expiry, their_expiry);
    }
}

/// The MSK IAM listener of tests/msk_front.py, killed on drop.
struct MskFront {
    child: Child,
    credentials_port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl MskFront {
    /// Listens on `port` in front of the broker on `upstream`, with `pki`'s server certificate.
    fn start(port: u16, upstream: u16, pki: &Pki) -> MskFront {
        let dir = tempfile::Builder::new().prefix("msk-front-").tempdir().unwrap();
        let log = dir.path().join("front.jsonl");
        let credentials_port = free_port();
        let tls = pki.server_tls();
        let config = json!({
            "kafka_port": port,
            "upstream_port": upstream,
            "credentials_port": credentials_port,
            "cert": tls.cert,
            "key": tls.key,
            "region": REGION,
            "credentials_lifetime_s": CREDENTIALS_LIFETIME_S,
            "log": log,
        });
        let mut child = Command::new("python3")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/msk_front.py"))
            .arg(config.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.path().join("front.stderr")).unwrap())
            .spawn()
            .expect("python3 runs tests/msk_front.py (botocore: scripts/provision.sh)");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let stderr = std::fs::read_to_string(dir.path().join("front.stderr")).unwrap_or_default();
        assert_eq!(line.trim(), "ready", "msk_front.py did not start: {stderr}");
        MskFront { child, credentials_port, log, _dir: dir }
    }

    /// Every event the listener logged so far.
    fn events(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect()
    }

    /// The events of `kind` logged in `window` (epoch seconds).
    fn events_in(&self, kind: &str, window: (f64, f64)) -> Vec<Value> {
        let t = |e: &Value| e["t"].as_f64().unwrap_or(0.0);
        self.events().into_iter().filter(|e| e["event"] == kind && t(e) >= window.0 && t(e) <= window.1).collect()
    }
}

impl Drop for MskFront {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn now_s() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

/// The machine's own AWS settings, which would come before the listener's credentials in the SDK's chain.
const AWS_OWN: [&str; 7] = [
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_REGION",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
];

/// What every command of the test runs with: AWS credentials only from the listener's container endpoint.
fn aws_env(front: &MskFront) -> Vec<(OsString, OsString)> {
    [
        ("AWS_CONTAINER_CREDENTIALS_FULL_URI", format!("http://127.0.0.1:{}/creds", front.credentials_port)),
        ("AWS_CONFIG_FILE", "/nonexistent".into()),
        ("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent".into()),
        ("AWS_EC2_METADATA_DISABLED", "true".into()),
        ("RUST_LOG", "debug".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.into(), v.into()))
    .collect()
}

/// Runs `outbox-cdc <args> --config <config>` with the AWS environment, and the environment's own AWS
/// variables removed. Returns its exit status, its stdout, its stdout and stderr, and the time window it ran
/// in.
fn command(connector: &Connector, front: &MskFront, args: &[&str]) -> (ExitStatus, String, String, (f64, f64)) {
    let started = now_s();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_outbox-cdc"));
    cmd.args(args).arg("--config").arg(connector.config_path()).current_dir(connector.dir());
    for key in AWS_OWN {
        cmd.env_remove(key);
    }
    cmd.envs(aws_env(front));
    // Into files, not pipes: a debug log fills a pipe that no one reads until the command ends.
    let (out, err) = (connector.dir().join("command.stdout"), connector.dir().join("command.stderr"));
    let mut child = cmd
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .expect("start outbox-cdc");
    let deadline = Instant::now() + COMMAND_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "outbox-cdc {args:?} did not finish within {COMMAND_TIMEOUT:?}:\n{}",
                std::fs::read_to_string(&err).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let stdout = std::fs::read_to_string(&out).unwrap_or_default();
    let text = format!("{stdout}{}", std::fs::read_to_string(&err).unwrap_or_default());
    (status, stdout, text, (started, now_s()))
}

/// Asserts that `text` holds none of the listener's issued secrets and no token.
fn assert_no_secret(front: &MskFront, what: &str, text: &str) {
    // base64url of "https://kafka.": the start of every token.
    let token_start = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode("https://kafka.");
    let token_start = &token_start[..16];
    assert!(!text.contains(token_start), "{what} logged a token:\n{text}");
    assert!(!text.contains("X-Amz-Signature"), "{what} logged a presigned URL:\n{text}");
    for issued in front.events().iter().filter(|e| e["event"] == "issued") {
        for field in ["secret", "session_token"] {
            let secret = issued[field].as_str().unwrap();
            assert!(!text.contains(secret), "{what} logged an issued {field}");
        }
    }
}

/// See the module docs. The connector runs for about three credential lifetimes under one writer, with a
/// poison row held and released at the end.
#[tokio::test(flavor = "multi_thread")]
async fn every_client_authenticates_with_renewed_msk_tokens() {
    let pki = Pki::new();
    let db = MariaDb::start();
    let front_port = free_port();
    let mut broker = Broker::start_behind(Engine::Sqlite, front_port);
    let front = MskFront::start(front_port, broker.port(), &pki);

    let mut connector = Connector::new();
    let config = connector.write_config(&db, &broker, "");
    let text = std::fs::read_to_string(&config).unwrap();
    let text = text.replace(&broker.bootstrap(), &format!("127.0.0.1:{front_port}")).replace(
        "topic = \"outbox.event.${aggregate_type}\"\n",
        &format!(
            "topic = \"outbox.event.${{aggregate_type}}\"\nauth = \"aws_iam\"\naws_region = \"{REGION}\"\n\
             max_record_bytes = 20000\ndead_letter_topic = \"{DLQ}\"\n\
             topic_config = {{ \"max.message.bytes\" = \"1048588\" }}\n\
             [kafka.properties]\n\"ssl.ca.location\" = {}\n\"debug\" = \"security\"\n",
            common::connector::toml_str(&pki.ca_pem().to_string_lossy())
        ),
    );
    std::fs::write(&config, &text).unwrap();

    // A token the listener refuses (signed for another region): `check` fails for good, naming the identity
    // and the likely causes.
    let mut outputs = String::new();
    let elsewhere = text.replace(&format!("aws_region = \"{REGION}\""), "aws_region = \"us-east-2\"");
    std::fs::write(&config, elsewhere).unwrap();
    let (status, _, out, window) = command(&connector, &front, &["check"]);
    outputs.push_str(&out);
    assert_eq!(status.code(), Some(2), "check with a refused token:\n{out}");
    assert!(out.contains("refused the MSK IAM token of kafka.auth = \"aws_iam\""), "{out}");
    assert!(out.contains("region us-east-2") && out.contains("kafka.aws_region"), "{out}");
    assert!(front.events_in("auth", window).iter().all(|e| e["ok"] == false), "the listener took a wrong token");
    std::fs::write(&config, &text).unwrap();

    // `check` authenticates (its producer and admin client alike) and says as whom.
    let (status, _, out, window) = command(&connector, &front, &["check"]);
    outputs.push_str(&out);
    assert!(status.success(), "check failed through the MSK IAM listener:\n{out}");
    assert!(!front.events_in("auth", window).is_empty(), "check did not authenticate:\n{out}");
    assert!(out.contains("kafka identity: kafka.auth = \"aws_iam\" (access key id ..."), "{out}");
    assert!(out.contains(&format!("region {REGION}): accepted by the cluster")), "{out}");

    // The run: one writer for about three credential lifetimes, a poison row (too large) and a held event.
    for (k, v) in aws_env(&front) {
        connector.env(k, v);
    }
    for key in AWS_OWN {
        connector.unset_env(key);
    }
    let run_started = now_s();
    connector.run(&config);
    let mut conn = db.conn().await;
    let poison = OutboxRow::new("P-1").payload(json!({ "blob": "x".repeat(30_000) }));
    let held = OutboxRow::new("P-1");
    let mut per_aggregate: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    let writing = Instant::now();
    let mut n = 0;
    while writing.elapsed() < Duration::from_secs(3 * CREDENTIALS_LIFETIME_S + 5) {
        if n == 10 {
            for row in [&poison, &held] {
                insert_event(&mut conn, row).await.unwrap();
                per_aggregate.entry("P-1".into()).or_default().push(row.id.clone());
            }
        }
        let row = OutboxRow::new(format!("A-{}", n % 7));
        insert_event(&mut conn, &row).await.unwrap();
        per_aggregate.entry(row.aggregate_id.clone()).or_default().push(row.id.clone());
        n += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let expected = Expected::from_orders(per_aggregate.clone());

    // `audit`, through the listener too, until everything but the held aggregate is in Kafka.
    let deadline = Instant::now() + READ_TIMEOUT;
    let audited = loop {
        let (status, json, out, window) = command(&connector, &front, &["audit", "--json", "--limit", "1000000"]);
        let report: Value = serde_json::from_str(&json).unwrap_or(Value::Null);
        if report["missing"].as_u64() == Some(2) {
            outputs.push_str(&out);
            let missing: BTreeSet<&str> =
                report["missing_ids"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
            assert_eq!(
                missing,
                BTreeSet::from([poison.id.as_str(), held.id.as_str()]),
                "only the held aggregate waits"
            );
            assert!(!front.events_in("auth", window).is_empty(), "audit did not authenticate");
            break report;
        }
        let logs = connector.logs();
        assert!(
            Instant::now() < deadline,
            "the run did not publish within {READ_TIMEOUT:?} ({status}):\n{out}\n{logs}"
        );
        std::thread::sleep(Duration::from_secs(2));
    };
    assert_eq!(audited["order_violations"].as_u64(), Some(0), "{audited}");
    assert!(connector.terminate().success(), "{}", connector.logs());
    let run_window = (run_started, now_s());

    // The run's authentications: every one accepted, by keys of several credential sets, and connections
    // re-authenticated on the open connection (KIP-368) rather than only reconnected.
    let auths = front.events_in("auth", run_window);
    let refused: Vec<&Value> = auths.iter().filter(|e| e["ok"] != true).collect();
    assert!(refused.is_empty(), "refused authentications: {refused:?}\n{}", connector.logs());
    let keys: BTreeSet<&str> = auths.iter().filter_map(|e| e["key"].as_str()).collect();
    let seconds = run_window.1 - run_window.0;
    assert!(keys.len() >= 3, "the run signed with {} credential set(s) over {seconds:.0}s: {keys:?}", keys.len());
    let reauths = auths.iter().filter(|e| e["reauth"] == true).count();
    assert!(reauths >= 2, "{reauths} re-authentication(s) on open connections:\n{auths:?}");
    for kind in ["unauthenticated_request", "session_expired"] {
        let seen = front.events_in(kind, run_window);
        assert!(seen.is_empty(), "{kind}: {seen:?}\n{}", connector.logs());
    }

    // `replay` and `quarantine release` (after the operator's fix, a higher limit) authenticate.
    let replay = ["replay", "--aggregate-id", "A-1", "--topic", "msk.replay"];
    let (status, _, out, window) = command(&connector, &front, &replay);
    outputs.push_str(&out);
    assert!(status.success(), "replay failed:\n{out}");
    assert!(!front.events_in("auth", window).is_empty(), "replay did not authenticate");
    std::fs::write(&config, text.replace("max_record_bytes = 20000", "max_record_bytes = 100000")).unwrap();
    let (status, _, out, window) = command(&connector, &front, &["quarantine", "release", "order", "P-1"]);
    outputs.push_str(&out);
    assert!(status.success() && out.contains("2 event(s) republished"), "quarantine release failed:\n{out}");
    assert!(!front.events_in("auth", window).is_empty(), "quarantine release did not authenticate");

    assert_no_secret(&front, "the connector", &connector.logs());
    assert_no_secret(&front, "the commands", &outputs);

    // Every record, read from the broker itself: each event once, each aggregate in commit order.
    drop(front);
    broker.advertise_itself();
    let records = broker.read_all(TOPIC, expected.len(), READ_TIMEOUT);
    let report = audit(&expected, &records);
    assert!(report.is_clean() && report.duplicates == 0, "{}\n{}", report.summary(), connector.logs());
    let replayed = broker.read_all("msk.replay", per_aggregate["A-1"].len(), READ_TIMEOUT);
    let replayed: Vec<&str> = replayed.iter().filter_map(|r| r.header_str("id")).collect();
    assert_eq!(replayed, per_aggregate["A-1"], "the replay of A-1");
}
