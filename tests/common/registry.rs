//! A Schema Registry for the tests ([`SchemaRegistry`]: `schema_registry.py serve` as a child process on a
//! free port, its state in a temp dir so it survives a kill and a start again), and confluent-kafka's
//! deserializers decoding what the connector wrote ([`SchemaRegistry::decode`]).
//!
//! A registry may require basic auth or a bearer token that the test rotates ([`SchemaRegistry::rotate_bearer`]),
//! serve HTTPS with a certificate of the test's own CA, or answer every request 503 ([`RegistryBuilder`]).
//! The handle's own requests (registering schemas) and the decoder authenticate and trust the CA as a
//! client of that registry must.
//!
//! Needs Python's `confluent-kafka` with its schema-registry extras (scripts/provision.sh pins them).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::{free_port, port_accepts, process, ServerTls};

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/common/schema_registry.py")
}

/// What a registry requires of a request.
#[derive(Debug, Clone)]
enum Auth {
    /// Nothing.
    None,
    /// HTTP basic auth with `user:password`.
    Basic(String),
    /// `Authorization: Bearer` with the content of the registry's token file ([`SchemaRegistry::bearer_file`]),
    /// read at each request.
    Bearer,
}

/// The registry process; killed on drop.
#[derive(Debug)]
pub struct SchemaRegistry {
    child: Option<Child>,
    port: u16,
    auth: Auth,
    /// The certificate it serves HTTPS with, and the CA that signed it; `None`: plain HTTP.
    tls: Option<ServerTls>,
    /// Whether it answers every request 503.
    unavailable: bool,
    dir: TempDir,
}

/// How a [`SchemaRegistry`] is started: [`SchemaRegistry::builder`].
#[derive(Debug, Default)]
pub struct RegistryBuilder {
    credentials: Option<String>,
    bearer: Option<String>,
    tls: Option<ServerTls>,
    unavailable: bool,
}

impl RegistryBuilder {
    /// Requires HTTP basic auth with `credentials` (`user:password`).
    pub fn basic(mut self, credentials: &str) -> Self {
        self.credentials = Some(credentials.to_string());
        self
    }

    /// Requires `Authorization: Bearer <token>`, `token` until [`SchemaRegistry::rotate_bearer`] replaces it.
    pub fn bearer(mut self, token: &str) -> Self {
        self.bearer = Some(token.to_string());
        self
    }

    /// Serves HTTPS with `tls.cert` and `tls.key`; clients trust `tls.ca`.
    pub fn tls(mut self, tls: ServerTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Answers every request 503.
    pub fn unavailable(mut self) -> Self {
        self.unavailable = true;
        self
    }

    /// Starts it on a free port and waits until it accepts connections.
    ///
    /// # Panics
    /// When it exits during start-up or does not accept connections within 30 s.
    pub fn start(self) -> SchemaRegistry {
        assert!(!(self.credentials.is_some() && self.bearer.is_some()), "basic auth or a bearer token, not both");
        let dir = tempfile::Builder::new().prefix("registry-").tempdir().expect("registry temp dir");
        let auth = match (self.credentials, &self.bearer) {
            (Some(credentials), _) => Auth::Basic(credentials),
            (None, Some(_)) => Auth::Bearer,
            (None, None) => Auth::None,
        };
        let mut registry =
            SchemaRegistry { child: None, port: free_port(), auth, tls: self.tls, unavailable: self.unavailable, dir };
        if let Some(token) = &self.bearer {
            registry.rotate_bearer(token);
        }
        registry.spawn_and_wait();
        registry
    }
}

/// One framed record to decode.
pub struct Framed<'a> {
    /// Its topic (the deserializer's context).
    pub topic: &'a str,
    /// "avro", "protobuf" or "json".
    pub format: &'a str,
    /// Whether it is a key.
    pub key: bool,
    /// The bytes.
    pub bytes: &'a [u8],
}

/// `text` written to `path` whole: into a file beside it, then renamed over it, so that a reader (the
/// registry at each request, the connector) sees the old content or the new, never a part.
pub fn replace_file(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap_or_else(|e| panic!("write {}: {e}", tmp.display()));
    std::fs::rename(&tmp, path).unwrap_or_else(|e| panic!("rename {} to {}: {e}", tmp.display(), path.display()));
}

impl SchemaRegistry {
    /// A registry without authentication.
    pub fn start() -> SchemaRegistry {
        Self::builder().start()
    }

    /// A registry requiring HTTP basic auth with `credentials` (`user:password`).
    pub fn start_with(credentials: Option<&str>) -> SchemaRegistry {
        match credentials {
            Some(credentials) => Self::builder().basic(credentials).start(),
            None => Self::start(),
        }
    }

    /// A registry to configure before it starts.
    pub fn builder() -> RegistryBuilder {
        RegistryBuilder::default()
    }

    /// Its base URL (`https://` when it serves TLS).
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// The file whose content is the bearer token it accepts.
    pub fn bearer_file(&self) -> PathBuf {
        self.dir.path().join("bearer-token")
    }

    /// Makes `token` the only bearer token it accepts, from its next request on (the file it reads at each
    /// request is replaced whole).
    ///
    /// # Panics
    /// When it does not take bearer tokens.
    pub fn rotate_bearer(&self, token: &str) {
        assert!(matches!(self.auth, Auth::Bearer), "this registry takes no bearer token");
        replace_file(&self.bearer_file(), &format!("{token}\n"));
    }

    /// Its log: a line per request (`"GET /subjects HTTP/1.1" 200 -`) and per refused connection.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    /// Kills it (its state stays on disk).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            process::kill_now(&mut child);
        }
    }

    /// Starts it again on the same port with the same state.
    pub fn start_again(&mut self) {
        self.spawn_and_wait();
    }

    fn spawn_and_wait(&mut self) {
        let log = self.dir.path().join("registry.log");
        let mut cmd = Command::new("python3");
        cmd.arg(script()).arg("serve").arg(self.port.to_string()).arg(self.dir.path().join("state.json"));
        match &self.auth {
            Auth::None => {}
            Auth::Basic(credentials) => {
                cmd.arg(credentials);
            }
            Auth::Bearer => {
                cmd.arg("--bearer-file").arg(self.bearer_file());
            }
        }
        if let Some(tls) = &self.tls {
            cmd.arg("--tls").arg(&tls.cert).arg(&tls.key);
        }
        if self.unavailable {
            cmd.arg("--unavailable");
        }
        cmd.stdin(Stdio::null()).stdout(process::append_log(&log)).stderr(process::append_log(&log));
        let child = process::spawn(cmd).expect("start python3 schema_registry.py");
        self.child = Some(child);
        let started = Instant::now();
        while !port_accepts(self.port) {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                self.child = None;
                panic!(
                    "registry exited during start-up ({status}): {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            assert!(started.elapsed() < Duration::from_secs(30), "registry not ready after 30 s");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The `Authorization` header its current credentials make, if it wants one.
    fn authorization(&self) -> Option<String> {
        use base64::Engine as _;
        match &self.auth {
            Auth::None => None,
            Auth::Basic(credentials) => {
                Some(format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(credentials)))
            }
            Auth::Bearer => {
                let text = std::fs::read_to_string(self.bearer_file()).expect("read the bearer token file");
                Some(format!("Bearer {}", text.trim_end_matches('\n')))
            }
        }
    }

    /// A client that trusts its CA and answers every HTTP status as a response.
    fn agent(&self) -> ureq::Agent {
        let mut tls = ureq::tls::TlsConfig::builder();
        if let Some(server) = &self.tls {
            let pem = std::fs::read(&server.ca).expect("read the registry's CA");
            let certs: Vec<ureq::tls::Certificate<'static>> = ureq::tls::parse_pem(&pem)
                .filter_map(|item| match item {
                    Ok(ureq::tls::PemItem::Certificate(cert)) => Some(cert),
                    _ => None,
                })
                .collect();
            tls = tls.root_certs(ureq::tls::RootCerts::new_with_certs(&certs));
        }
        ureq::Agent::config_builder().http_status_as_error(false).tls_config(tls.build()).build().new_agent()
    }

    /// The HTTP status of `GET <path>` sent with `authorization` (`None`: no header), e.g. to see that a
    /// rotated-out token is refused.
    pub fn status(&self, path: &str, authorization: Option<&str>) -> u16 {
        let mut request = self.agent().get(format!("{}{path}", self.url()));
        if let Some(authorization) = authorization {
            request = request.header("Authorization", authorization);
        }
        request.call().unwrap_or_else(|e| panic!("GET {path}: {e}")).status().as_u16()
    }

    /// Registers `schema` under `subject` (`schema_type` "AVRO", "PROTOBUF" or "JSON"; `references` as
    /// `(name, subject, version)`): the schema's id.
    pub fn register(&self, subject: &str, schema_type: &str, schema: &str, references: &[(&str, &str, i64)]) -> u32 {
        self.post_version(subject, serde_json::json!({"schema": schema, "schemaType": schema_type}), references)
    }

    /// Registers a Protobuf schema (`.proto` text) with `serialized`, its base64 FileDescriptorProto, for
    /// the deserializer's `?format=serialized` (see schema_registry.py).
    pub fn register_protobuf(
        &self,
        subject: &str,
        proto: &str,
        serialized: &str,
        references: &[(&str, &str, i64)],
    ) -> u32 {
        let body = serde_json::json!({"schema": proto, "schemaType": "PROTOBUF", "serialized": serialized});
        self.post_version(subject, body, references)
    }

    fn post_version(&self, subject: &str, mut body: serde_json::Value, references: &[(&str, &str, i64)]) -> u32 {
        body["references"] = references
            .iter()
            .map(|(name, subject, version)| serde_json::json!({"name": name, "subject": subject, "version": version}))
            .collect();
        let mut request = self.agent().post(format!("{}/subjects/{subject}/versions", self.url()));
        if let Some(authorization) = self.authorization() {
            request = request.header("Authorization", &authorization);
        }
        let mut response = request.send_json(&body).unwrap_or_else(|e| panic!("register {subject}: {e}"));
        let status = response.status();
        let answer: serde_json::Value = response.body_mut().read_json().expect("registry answer");
        assert!(status.is_success(), "register {subject}: HTTP {status}: {answer}");
        answer["id"].as_u64().expect("an id") as u32
    }

    /// Each record decoded by confluent-kafka's deserializer with its own registry client (authenticated as
    /// this registry wants now, trusting its CA): `{"id", "value"}` (the schema id from the frame, the
    /// decoded value as JSON) or `{"error"}`.
    pub fn decode(&self, records: &[Framed<'_>]) -> Vec<serde_json::Value> {
        let mut cmd = Command::new("python3");
        cmd.arg(script()).arg("decode").arg(self.url());
        match &self.auth {
            Auth::None => {}
            Auth::Basic(credentials) => {
                cmd.arg(credentials);
            }
            Auth::Bearer => {
                cmd.arg("--bearer-file").arg(self.bearer_file());
            }
        }
        if let Some(tls) = &self.tls {
            cmd.arg("--ca-file").arg(&tls.ca);
        }
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("start the decoder");
        let mut input = String::new();
        for r in records {
            let hex: String = r.bytes.iter().map(|b| format!("{b:02x}")).collect();
            let field = if r.key { "key" } else { "value" };
            input.push_str(
                &serde_json::json!({"topic": r.topic, "format": r.format, "field": field, "hex": hex}).to_string(),
            );
            input.push('\n');
        }
        child.stdin.take().expect("stdin").write_all(input.as_bytes()).expect("write to the decoder");
        let output = child.wait_with_output().expect("decoder output");
        assert!(output.status.success(), "decoder failed: {}", String::from_utf8_lossy(&output.stderr));
        let decoded: Vec<serde_json::Value> = String::from_utf8_lossy(&output.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).expect("decoder line is JSON"))
            .collect();
        assert_eq!(decoded.len(), records.len(), "decoder: {}", String::from_utf8_lossy(&output.stderr));
        decoded
    }
}

/// The value subjects confluent-kafka's own serializer computes under `strategy` ("record_name" or
/// "topic_record_name") for records in `topic`: `schema_registry.py subject` (see its docs), one per record
/// type: for "avro", `schema` is the schema's JSON file (one subject); for "protobuf", protoc's
/// FileDescriptorSet and `proto` the file in it (one subject per top-level message, in the file's order).
pub fn confluent_subjects(
    strategy: &str,
    topic: &str,
    format: &str,
    schema: &Path,
    proto: Option<&str>,
) -> Vec<String> {
    let output = Command::new("python3")
        .arg(script())
        .args(["subject", strategy, topic, format])
        .arg(schema)
        .args(proto)
        .stdin(Stdio::null())
        .output()
        .expect("run schema_registry.py subject");
    assert!(output.status.success(), "schema_registry.py subject: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).expect("subjects are UTF-8").lines().map(String::from).collect()
}

impl Drop for SchemaRegistry {
    fn drop(&mut self) {
        self.kill();
    }
}
