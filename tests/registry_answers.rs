//! What each answer of a Schema Registry (or of something that is not one) becomes: the row's poison
//! (`Cached::Missing`, its aggregate held while the others flow), a transient error (the run waits) or a
//! definite one (the connector stops), as the rule table of `src/schema/registry.rs` says. The counterpart
//! is a canned HTTP server on 127.0.0.1 ([`Canned`]: each request answered with the status and body a test
//! chose, every request recorded), asked through the public API the publish path uses
//! (`Schemas::resolve`, `Schemas::resolve_key`, `Schemas::cached`).
//!
//! Also here: credentials read from their file at every request (a token a sidecar rewrites), and a stale
//! `latest` that is refreshed in the background while publishing goes on with the cached one.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use outbox_cdc::config::Config;
use outbox_cdc::schema::{Cached, Schemas};

/// The value subject of topic `t` (`topic_name`).
const SUBJECT: &str = "t-value";
/// A schema version body for the value subject, with global id `id`.
fn version_body(subject: &str, version: i64, id: u32, schema: &str) -> String {
    serde_json::json!({"subject": subject, "version": version, "id": id, "schema": schema}).to_string()
}
/// An Avro record schema.
const RECORD: &str = r#"{"type":"record","name":"Order","fields":[{"name":"id","type":"string"}]}"#;

/// Long enough for anything a loaded machine does between two steps; only reached when a test fails.
const PATIENCE: Duration = Duration::from_secs(60);

/// One request as the server read it.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    authorization: Option<String>,
}

/// A gate the server waits at before answering, until the test opens it.
#[derive(Clone, Default)]
struct Gate(Arc<(Mutex<bool>, Condvar)>);

impl Gate {
    fn open(&self) {
        *self.0 .0.lock().unwrap() = true;
        self.0 .1.notify_all();
    }

    fn wait(&self) {
        let mut open = self.0 .0.lock().unwrap();
        while !*open {
            open = self.0 .1.wait(open).unwrap();
        }
    }
}

/// What the server does with a request.
enum Reply {
    /// Answers with this status and body.
    Answer(u16, String),
    /// Waits at the gate, then answers.
    After(Gate, u16, String),
    /// Never answers (holds the connection until the server is dropped).
    Silent,
}

fn json(status: u16, body: serde_json::Value) -> Reply {
    Reply::Answer(status, body.to_string())
}

/// Confluent's error body.
fn error(status: u16, code: i64, message: &str) -> Reply {
    json(status, serde_json::json!({"error_code": code, "message": message}))
}

type Responder = dyn Fn(&Seen, usize) -> Reply + Send + Sync;

/// A canned HTTP server: each request answered by `respond(request, how many came before it)`.
struct Canned {
    port: u16,
    seen: Arc<Mutex<Vec<Seen>>>,
    /// Opened on drop: releases the connections held by [`Reply::Silent`].
    closing: Gate,
    stop: Arc<AtomicBool>,
}

impl Canned {
    fn start(respond: impl Fn(&Seen, usize) -> Reply + Send + Sync + 'static) -> Canned {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let closing = Gate::default();
        let stop = Arc::new(AtomicBool::new(false));
        let respond: Arc<Responder> = Arc::new(respond);
        let (seen_, closing_, stop_) = (seen.clone(), closing.clone(), stop.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stop_.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                let (seen, closing, respond) = (seen_.clone(), closing_.clone(), respond.clone());
                std::thread::spawn(move || serve(stream, &seen, &closing, &*respond));
            }
        });
        Canned { port, seen, closing, stop }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every request so far.
    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// The requests so far, as `METHOD path`.
    fn lines(&self) -> Vec<String> {
        self.seen().iter().map(|s| format!("{} {}", s.method, s.path)).collect()
    }
}

impl Drop for Canned {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.closing.open();
        // Wakes the accept loop so that it sees `stop`.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// Reads one request from `stream`, records it, answers it as `respond` says, and closes.
fn serve(stream: TcpStream, seen: &Mutex<Vec<Seen>>, closing: &Gate, respond: &Responder) {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or_default().to_string(), parts.next().unwrap_or_default().to_string());
    let (mut authorization, mut length) = (None, 0usize);
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).unwrap_or(0) == 0 || header == "\r\n" {
            break;
        }
        let (name, value) = header.split_once(':').unwrap_or((&header, ""));
        match name.to_ascii_lowercase().as_str() {
            "authorization" => authorization = Some(value.trim().to_string()),
            "content-length" => length = value.trim().parse().unwrap_or(0),
            _ => {}
        }
    }
    let mut body = vec![0; length];
    let _ = reader.read_exact(&mut body);
    let request = Seen { method, path, authorization };
    let before = {
        let mut seen = seen.lock().unwrap();
        seen.push(request.clone());
        seen.len() - 1
    };
    let (status, body) = match respond(&request, before) {
        Reply::Answer(status, body) => (status, body),
        Reply::After(gate, status, body) => {
            gate.wait();
            (status, body)
        }
        Reply::Silent => {
            closing.wait();
            return;
        }
    };
    let mut stream = reader.into_inner();
    let _ = write!(
        stream,
        "HTTP/1.1 {status} Canned\r\nContent-Type: application/vnd.schemaregistry.v1+json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.flush();
}

/// The schemas of a connector with `value_format = "avro"`, reading from `urls`, with `kafka` and
/// `registry` lines added to those sections.
fn schemas_at(urls: &[String], kafka: &str, registry: &str) -> Arc<Schemas> {
    let urls: Vec<String> = urls.iter().map(|u| format!("{u:?}")).collect();
    let config = Config::parse(&format!(
        "[source]\nhost = \"h\"\nuser = \"u\"\nserver_id = 1\n[outbox]\ntable = \"s.t\"\n\
         [kafka]\nbootstrap_servers = \"k:9092\"\nvalue_format = \"avro\"\n{kafka}\n\
         [schema_registry]\nurl = [{}]\n{registry}\n",
        urls.join(", ")
    ))
    .unwrap();
    Schemas::for_config(&config).unwrap()
}

fn schemas(server: &Canned, registry: &str) -> Arc<Schemas> {
    schemas_at(&[server.url()], "", registry)
}

/// What resolving a (subject, version) came to.
#[derive(Debug)]
enum Outcome {
    /// The schema, by its id.
    Known(u32),
    /// The row's poison: why.
    Poison(String),
    /// A transient error.
    Transient(String),
    /// A definite error.
    Definite(String),
}

fn outcome(schemas: &Schemas, subject: &str, version: Option<i64>) -> Outcome {
    match schemas.resolve(subject, version) {
        Err(e) if e.is_definite() => Outcome::Definite(e.to_string()),
        Err(e) => Outcome::Transient(e.to_string()),
        Ok(()) => cached(schemas, subject, version),
    }
}

fn cached(schemas: &Schemas, subject: &str, version: Option<i64>) -> Outcome {
    match schemas.cached(subject, version) {
        Cached::Known(schema) => Outcome::Known(schema.id),
        Cached::Missing(why) => Outcome::Poison(why),
        Cached::Unknown => panic!("{subject} {version:?} was resolved and is not cached"),
    }
}

fn assert_says(text: &str, parts: &[&str]) {
    for part in parts {
        assert!(text.contains(part), "{part:?} is not in: {text}");
    }
}

fn poison(outcome: Outcome, parts: &[&str]) {
    match outcome {
        Outcome::Poison(why) => assert_says(&why, parts),
        other => panic!("expected the row's poison, got {other:?}"),
    }
}

fn definite(outcome: Outcome, parts: &[&str]) {
    match outcome {
        Outcome::Definite(why) => assert_says(&why, parts),
        other => panic!("expected a definite error, got {other:?}"),
    }
}

fn transient(outcome: Outcome, parts: &[&str]) {
    match outcome {
        Outcome::Transient(why) => assert_says(&why, parts),
        other => panic!("expected a transient error, got {other:?}"),
    }
}

/// Waits for `condition`; false if [`PATIENCE`] runs out first.
fn wait_until(mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + PATIENCE;
    while !condition() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

/// A `GET /subjects` that answers a registry's list.
fn is_subject_list(seen: &Seen) -> bool {
    seen.method == "GET" && seen.path == "/subjects"
}

/// 404 with Confluent's codes 40401 (subject), 40402 (version), 40403 (schema): the row's poison, the
/// reason naming the subject, the version, the status, the code, the registry's message and the fix. The
/// class was poison before too; the reason lacked the status and the code.
#[test]
fn not_found_codes_are_the_rows_poison() {
    for code in [40401, 40402, 40403] {
        let server = Canned::start(move |_, _| error(404, code, "Subject 't-value' not found."));
        let schemas = schemas(&server, "");
        poison(
            outcome(&schemas, SUBJECT, Some(3)),
            &[
                "has no subject \"t-value\" version 3",
                &format!("HTTP 404, error code {code}"),
                "Subject 't-value' not found.",
                "quarantine release",
            ],
        );
        assert_eq!(server.lines(), ["GET /subjects/t-value/versions/3"]);
    }
}

/// A bare 404 (no Confluent code) where `GET /subjects` on the same URL answers a list: the registry
/// serves the API, so the 404 is about the subject: the row's poison. Guards against issue 44: a bare 404
/// was definite and stopped the connector for one row.
#[test]
fn a_bare_404_from_a_registry_is_the_rows_poison() {
    let server = Canned::start(|seen, _| match is_subject_list(seen) {
        true => json(200, serde_json::json!(["t-value", "other-value"])),
        false => Reply::Answer(404, "<html><body>Not Found</body></html>".into()),
    });
    let schemas = schemas(&server, "");
    poison(outcome(&schemas, SUBJECT, Some(1)), &["has no subject \"t-value\" version 1", "HTTP 404: \"<html>"]);
    assert_eq!(server.lines(), ["GET /subjects/t-value/versions/1", "GET /subjects"]);
}

/// A bare 404 where `GET /subjects` is a 404 too: the URL does not serve the Schema Registry API (a
/// missing path prefix): definite, saying so and what to check. Before, definite with only the status.
#[test]
fn a_bare_404_from_something_else_is_definite() {
    let server = Canned::start(|_, _| Reply::Answer(404, "Not Found".into()));
    let schemas = schemas(&server, "");
    definite(
        outcome(&schemas, SUBJECT, Some(1)),
        &["does not serve the Schema Registry API", "schema_registry.url", "GET /subjects with HTTP 404"],
    );
    assert_eq!(server.lines(), ["GET /subjects/t-value/versions/1", "GET /subjects"]);
}

/// 422 42202 (a version the registry does not accept) is the row's poison. Before: definite, exit 2.
#[test]
fn an_invalid_version_is_the_rows_poison() {
    let server = Canned::start(|_, _| error(422, 42202, "The specified version '7' is not a valid version id."));
    let schemas = schemas(&server, "");
    poison(
        outcome(&schemas, SUBJECT, Some(7)),
        &["subject \"t-value\" version 7 as invalid", "HTTP 422, error code 42202", "not a valid version id"],
    );
}

/// The key schema's subject, its latest version missing, with `auto_register`.
const KEY_LOOKUP: &str = "GET /subjects/t-key/versions/latest";
const KEY_REGISTER: &str = "POST /subjects/t-key/versions";

/// `auto_register` of the key schema answered `refusal`: the topic's rows are poison (the key is
/// `Missing`, so each row of the topic is held), not the connector; within the retry interval the registry
/// is not asked again.
fn key_registration_refused(refusal: fn() -> Reply, parts: &[&str]) {
    let server = Canned::start(move |seen, _| match seen.method.as_str() {
        "GET" => error(404, 40401, "Subject 't-key' not found."),
        _ => refusal(),
    });
    let schemas = schemas_at(&[server.url()], "key_format = \"avro\"", "auto_register = true");
    schemas.resolve_key("t").unwrap_or_else(|e| panic!("one topic's key must not stop the connector: {e}"));
    poison(cached(&schemas, "t-key", None), parts);
    assert_eq!(server.lines(), [KEY_LOOKUP, KEY_REGISTER]);
    schemas.resolve_key("t").unwrap();
    assert_eq!(server.lines(), [KEY_LOOKUP, KEY_REGISTER], "asked again at once");
}

/// 422 42201 (invalid schema) on the key's auto-registration: that topic's poison. Before: definite.
#[test]
fn an_invalid_schema_on_key_registration_is_the_topics_poison() {
    key_registration_refused(
        || error(422, 42201, "Invalid schema"),
        &["auto_register", "a new version of subject \"t-key\" as invalid", "HTTP 422, error code 42201"],
    );
}

/// 409 on the key's auto-registration (incompatible with the subject's versions): that topic's poison,
/// not the connector's stop. Before: definite, exit 2.
#[test]
fn an_incompatible_key_registration_is_the_topics_poison() {
    key_registration_refused(
        || error(409, 409, "Schema being registered is incompatible with an earlier schema"),
        &["auto_register", "as a conflict", "HTTP 409, error code 409", "incompatible with an earlier schema"],
    );
}

/// 403 with Confluent RBAC's 40301 on a subject: the credentials work elsewhere, this subject is denied:
/// the row's poison, without asking anything else. Before: definite ("refused the connector's
/// credentials"), exit 2.
#[test]
fn a_subject_rbac_denies_is_the_rows_poison() {
    let server = Canned::start(|_, _| error(403, 40301, "User is denied operation Read on Subject: t-value"));
    let schemas = schemas(&server, "");
    poison(
        outcome(&schemas, SUBJECT, Some(1)),
        &["denies the connector subject \"t-value\" version 1", "HTTP 403, error code 40301", "DeveloperRead"],
    );
    assert_eq!(server.lines(), ["GET /subjects/t-value/versions/1"]);
}

/// 403 without RBAC's code: the registry is asked for its subjects. A list: the 403 is about the subject
/// (poison); a 403 there too: the credentials (definite). Before: definite in both cases.
#[test]
fn a_403_without_a_code_is_decided_by_the_subject_list() {
    let lists = Canned::start(|seen, _| match is_subject_list(seen) {
        true => json(200, serde_json::json!([])),
        false => Reply::Answer(403, "Forbidden".into()),
    });
    poison(outcome(&schemas(&lists, ""), SUBJECT, Some(1)), &["denies the connector", "HTTP 403: \"Forbidden\""]);
    let refuses = Canned::start(|_, _| Reply::Answer(403, "Forbidden".into()));
    definite(
        outcome(&schemas(&refuses, ""), SUBJECT, Some(1)),
        &["refused the connector's credentials (HTTP 403", "GET /subjects with HTTP 403"],
    );
    assert_eq!(refuses.lines(), ["GET /subjects/t-value/versions/1", "GET /subjects"]);
}

/// 401: the credentials: definite, naming the settings to fix; the next URL is not tried.
#[test]
fn a_401_is_definite() {
    let server = Canned::start(|_, _| error(401, 40101, "Unauthorized"));
    let other = Canned::start(|_, _| Reply::Answer(200, version_body(SUBJECT, 1, 7, RECORD)));
    let schemas = schemas_at(&[server.url(), other.url()], "", "");
    definite(
        outcome(&schemas, SUBJECT, Some(1)),
        &["refused the connector's credentials (HTTP 401, error code 40101", "schema_registry.username"],
    );
    assert!(other.seen().is_empty(), "{:?}", other.lines());
}

/// 500, 502, 503, 408 and 429 from every URL: the registry is away: transient, every URL asked in turn.
#[test]
fn server_errors_and_throttling_are_transient_after_every_url() {
    for status in [500, 502, 503, 408, 429] {
        let first = Canned::start(move |_, _| error(status, i64::from(status) * 100 + 1, "busy"));
        let second = Canned::start(move |_, _| Reply::Answer(status, "busy".into()));
        let schemas = schemas_at(&[first.url(), second.url()], "", "");
        transient(
            outcome(&schemas, SUBJECT, Some(1)),
            &["cannot be reached", &format!("HTTP {status}"), "waiting for it", &first.url(), &second.url()],
        );
        assert_eq!((first.seen().len(), second.seen().len()), (1, 1), "HTTP {status}");
    }
}

/// A registry that accepts and never answers: past `timeout_ms`, transient.
#[test]
fn a_registry_that_never_answers_is_transient() {
    let server = Canned::start(|_, _| Reply::Silent);
    let schemas = schemas(&server, "timeout_ms = 300");
    transient(outcome(&schemas, SUBJECT, Some(1)), &["cannot be reached", "timeout"]);
    assert_eq!(server.lines(), ["GET /subjects/t-value/versions/1"]);
}

/// A port nobody listens on.
fn closed_url() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    format!("http://127.0.0.1:{port}")
}

/// Connection refused: transient.
#[test]
fn a_refused_connection_is_transient() {
    let schemas = schemas_at(&[closed_url()], "", "");
    transient(outcome(&schemas, SUBJECT, Some(1)), &["cannot be reached"]);
}

/// Two URLs, the first refusing connections: the second answers, within the same lookup.
#[test]
fn the_next_url_answers_when_the_first_refuses() {
    let server = Canned::start(|_, _| Reply::Answer(200, version_body(SUBJECT, 1, 7, RECORD)));
    let schemas = schemas_at(&[closed_url(), server.url()], "", "");
    assert!(matches!(outcome(&schemas, SUBJECT, Some(1)), Outcome::Known(7)));
    assert_eq!(server.lines(), ["GET /subjects/t-value/versions/1"]);
}

/// A 2xx whose body is not what the API describes (a web page): definite, quoting it; other 4xx answers
/// (400, 405, 406, 415): definite, quoting the status and the message.
#[test]
fn answers_outside_the_api_are_definite_and_quoted() {
    let page = Canned::start(|_, _| Reply::Answer(200, "<html>Welcome to nginx!</html>".into()));
    definite(
        outcome(&schemas(&page, ""), SUBJECT, Some(1)),
        &["is not a schema version", "<html>Welcome to nginx!</html>", "schema_registry.url"],
    );
    for status in [400, 405, 406, 415] {
        let server = Canned::start(move |_, _| error(status, i64::from(status), "the registry's words"));
        definite(
            outcome(&schemas(&server, ""), SUBJECT, Some(1)),
            &[&format!("HTTP {status}, error code {status}: \"the registry's words\""), "GET /subjects/t-value"],
        );
    }
}

/// Writes `text` to `path` as a sidecar does: a new file renamed over the old one.
fn replace_file(path: &Path, text: &str) {
    let next = path.with_extension("next");
    std::fs::write(&next, text).unwrap();
    std::fs::rename(&next, path).unwrap();
}

fn token_file_config(path: &Path) -> String {
    format!("bearer_token_file = {:?}", path.to_str().unwrap())
}

/// A registry taking any token, answering every version.
fn any_token() -> Canned {
    Canned::start(|seen, _| {
        let version: i64 = seen.path.rsplit('/').next().unwrap().parse().unwrap();
        Reply::Answer(200, version_body(SUBJECT, version, 10 + version as u32, RECORD))
    })
}

/// `bearer_token_file` rewritten between two lookups: the second request carries the new token, with no
/// restart. Guards against issue 44: the token was read once per process, and the old one went on being
/// sent until the registry refused it (401, exit 2).
#[test]
fn a_token_file_is_read_at_every_request() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    replace_file(&file, "one\n");
    let server = any_token();
    let schemas = schemas(&server, &token_file_config(&file));
    assert!(matches!(outcome(&schemas, SUBJECT, Some(1)), Outcome::Known(11)));
    replace_file(&file, "two\n");
    assert!(matches!(outcome(&schemas, SUBJECT, Some(2)), Outcome::Known(12)));
    let sent: Vec<Option<String>> = server.seen().into_iter().map(|s| s.authorization).collect();
    assert_eq!(sent, [Some("Bearer one".to_string()), Some("Bearer two".to_string())]);
}

/// A 401 while the sidecar was rewriting the file: the file, read again, holds another token, so the
/// request is sent once more with it, and succeeds. Before: the 401 was definite (exit 2).
#[test]
fn a_401_is_retried_once_when_the_token_file_changed() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    replace_file(&file, "old\n");
    let rotate = file.clone();
    let server = Canned::start(move |seen, _| match seen.authorization.as_deref() {
        Some("Bearer new") => Reply::Answer(200, version_body(SUBJECT, 1, 7, RECORD)),
        _ => {
            // The sidecar rotates the token as the registry stops taking the old one.
            replace_file(&rotate, "new\n");
            error(401, 40101, "token expired")
        }
    });
    let schemas = schemas(&server, &token_file_config(&file));
    assert!(matches!(outcome(&schemas, SUBJECT, Some(1)), Outcome::Known(7)));
    let sent: Vec<Option<String>> = server.seen().into_iter().map(|s| s.authorization).collect();
    assert_eq!(sent, [Some("Bearer old".to_string()), Some("Bearer new".to_string())]);
}

/// A 401 with a token file that did not change: definite after one request, naming the file (no retry:
/// the same token would be refused again).
#[test]
fn a_401_with_an_unchanged_token_file_is_definite() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    replace_file(&file, "stale\n");
    let server = Canned::start(|_, _| error(401, 40101, "token expired"));
    let schemas = schemas(&server, &token_file_config(&file));
    definite(
        outcome(&schemas, SUBJECT, Some(1)),
        &["refused the connector's credentials (HTTP 401", "schema_registry.bearer_token_file"],
    );
    assert_eq!(server.seen().len(), 1);
}

/// A credential file that cannot be read at a request: definite, naming the setting and the file. Before:
/// the file was read once, so its loss went unnoticed until a restart.
#[test]
fn a_credential_file_gone_at_a_request_is_definite() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("password");
    replace_file(&file, "s3cret\n");
    let server = any_token();
    let schemas = schemas(&server, &format!("username = \"u\"\npassword_file = {:?}", file.to_str().unwrap()));
    assert!(matches!(outcome(&schemas, SUBJECT, Some(1)), Outcome::Known(11)));
    std::fs::remove_file(&file).unwrap();
    definite(outcome(&schemas, SUBJECT, Some(2)), &["schema_registry.password_file", &file.display().to_string()]);
    assert_eq!(server.seen().len(), 1, "no request without its credentials");
}

/// `version = "latest"`, refreshed at every lookup past the first (`latest_refresh_ms = 0`), against a
/// registry that answers id 1 first and holds each later request at its own gate.
struct Refreshing {
    server: Canned,
    gates: Vec<Gate>,
    schemas: Arc<Schemas>,
}

impl Refreshing {
    /// The answers after the first one: `(status, id)` each, each held at its gate (the last one answers
    /// any request after it too).
    fn start(later: &'static [(u16, u32)]) -> Refreshing {
        let gates: Vec<Gate> = later.iter().map(|_| Gate::default()).collect();
        let held = gates.clone();
        let server = Canned::start(move |_, before| {
            if before == 0 {
                return Reply::Answer(200, version_body(SUBJECT, 1, 1, RECORD));
            }
            let n = (before - 1).min(later.len() - 1);
            let (status, id) = later[n];
            let body = match status {
                200 => version_body(SUBJECT, i64::from(id), id, RECORD),
                _ => "unavailable".to_string(),
            };
            Reply::After(held[n].clone(), status, body)
        });
        let schemas = schemas(&server, "version = \"latest\"\nlatest_refresh_ms = 0\ntimeout_ms = 30000");
        Refreshing { server, gates, schemas }
    }

    fn resolve(&self) -> Outcome {
        outcome(&self.schemas, SUBJECT, None)
    }

    fn requests(&self) -> usize {
        self.server.seen().len()
    }
}

/// A stale `latest` is returned at once while its refresh is in flight (the registry holds the refresh
/// until the test opens the gate, which it does only after `resolve` returned: a `resolve` that waited for
/// the registry would never return in time); one refresh in flight per subject; the new id is used once
/// the refresh answered. Guards against issue 44: the refresh ran on the publish path, the run's one task
/// waiting on the registry (up to `timeout_ms` per URL) while every aggregate waited. On the old code the
/// second `resolve` blocks until the timeout, and the new id is never seen.
#[test]
fn a_stale_latest_is_refreshed_off_the_publish_path() {
    let refreshing = Refreshing::start(&[(200, 2)]);
    assert!(matches!(refreshing.resolve(), Outcome::Known(1)));
    assert!(matches!(refreshing.resolve(), Outcome::Known(1)), "the cached latest, at once");
    assert!(wait_until(|| refreshing.requests() == 2), "the refresh is asked: {:?}", refreshing.server.lines());
    for _ in 0..3 {
        assert!(matches!(refreshing.resolve(), Outcome::Known(1)), "still the cached latest");
    }
    assert_eq!(refreshing.requests(), 2, "one refresh in flight per subject");
    refreshing.gates[0].open();
    assert!(
        wait_until(|| matches!(cached(&refreshing.schemas, SUBJECT, None), Outcome::Known(2))),
        "the refresh's answer replaces the cached latest"
    );
}

/// A refresh that fails (503) keeps the cached latest, and the next refresh replaces it.
#[test]
fn a_failed_refresh_keeps_the_cached_latest() {
    let refreshing = Refreshing::start(&[(503, 0), (200, 3)]);
    refreshing.gates[0].open();
    assert!(matches!(refreshing.resolve(), Outcome::Known(1)));
    assert!(matches!(refreshing.resolve(), Outcome::Known(1)));
    // A refresh starts only once the one before it has answered: the third request comes after the 503.
    assert!(wait_until(|| {
        assert!(matches!(refreshing.resolve(), Outcome::Known(1)), "kept after the 503");
        refreshing.requests() == 3
    }));
    assert!(matches!(cached(&refreshing.schemas, SUBJECT, None), Outcome::Known(1)), "kept after the 503");
    refreshing.gates[1].open();
    assert!(wait_until(|| matches!(cached(&refreshing.schemas, SUBJECT, None), Outcome::Known(3))));
}

/// `openssl s_server` with a certificate for 127.0.0.1 that a private CA signed (a CA the connector is not
/// told of), killed on drop.
struct TlsServer {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

/// Runs `openssl` with `args` in `dir`.
fn openssl(dir: &Path, args: &[&str]) {
    let status = Command::new("openssl").args(args).current_dir(dir).stderr(Stdio::null()).status().unwrap();
    assert!(status.success(), "openssl {args:?}");
}

impl TlsServer {
    fn start() -> TlsServer {
        let dir = tempfile::tempdir().unwrap();
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
        openssl(
            dir.path(),
            &[
                &["req", "-x509"],
                &ec[..],
                &["-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=private CA"],
            ]
            .concat(),
        );
        openssl(
            dir.path(),
            &[&["req", "-new"], &ec[..], &["-keyout", "key.pem", "-out", "server.csr", "-subj", "/CN=127.0.0.1"]]
                .concat(),
        );
        std::fs::write(dir.path().join("ext.cnf"), "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n").unwrap();
        let sign = ["x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial"];
        openssl(dir.path(), &[&sign[..], &["-days", "2", "-extfile", "ext.cnf", "-out", "cert.pem"]].concat());
        let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
        let port = {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let child = Command::new("openssl")
            .args(["s_server", "-quiet", "-www", "-accept", &format!("127.0.0.1:{port}")])
            .arg("-cert")
            .arg(&cert)
            .arg("-key")
            .arg(&key)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let server = TlsServer { child, port, dir };
        assert!(wait_until(|| TcpStream::connect(("127.0.0.1", port)).is_ok()), "openssl s_server listens");
        server
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A registry whose certificate the trusted CAs do not sign: waiting cannot fix it: definite, naming the
/// certificate problem and `tls_ca_file`. Before: "cannot be reached", transient, waited for forever. With
/// the private CA in `tls_ca_file` the handshake passes (and `s_server`'s status page is no schema).
#[test]
fn a_certificate_the_cas_do_not_sign_is_definite() {
    let server = TlsServer::start();
    let url = format!("https://127.0.0.1:{}", server.port);
    definite(
        outcome(&schemas_at(std::slice::from_ref(&url), "", ""), SUBJECT, Some(1)),
        &["invalid peer certificate: UnknownIssuer", "schema_registry.tls_ca_file"],
    );
    let ca = format!("tls_ca_file = {:?}", server.dir.path().join("ca.pem").to_str().unwrap());
    definite(outcome(&schemas_at(&[url], "", &ca), SUBJECT, Some(1)), &["is not a schema version"]);
}
