//! A Schema Registry for the tests ([`SchemaRegistry`]: `schema_registry.py serve` as a child process on a
//! free port, its state in a temp dir so it survives a kill and a start again), and confluent-kafka's
//! deserializers decoding what the connector wrote ([`SchemaRegistry::decode`]).
//!
//! Needs Python's `confluent-kafka` with its schema-registry extras (scripts/provision.sh pins them).

use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::{free_port, port_accepts, process};

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/common/schema_registry.py")
}

/// The registry process; killed on drop.
#[derive(Debug)]
pub struct SchemaRegistry {
    child: Option<Child>,
    port: u16,
    /// `user:password` it requires, if any.
    credentials: Option<String>,
    dir: TempDir,
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

impl SchemaRegistry {
    /// A registry without authentication.
    pub fn start() -> SchemaRegistry {
        Self::start_with(None)
    }

    /// A registry requiring HTTP basic auth with `credentials` (`user:password`).
    pub fn start_with(credentials: Option<&str>) -> SchemaRegistry {
        let dir = tempfile::Builder::new().prefix("registry-").tempdir().expect("registry temp dir");
        let mut registry =
            SchemaRegistry { child: None, port: free_port(), credentials: credentials.map(String::from), dir };
        registry.spawn_and_wait();
        registry
    }

    /// Its base URL.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
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
        cmd.arg(script())
            .arg("serve")
            .arg(self.port.to_string())
            .arg(self.dir.path().join("state.json"))
            .args(self.credentials.iter())
            .stdin(Stdio::null())
            .stdout(process::append_log(&log))
            .stderr(process::append_log(&log));
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

    /// Registers `schema` under `subject` (`schema_type` "AVRO", "PROTOBUF" or "JSON"; `references` as
    /// `(name, subject, version)`): the schema's id.
    pub fn register(&self, subject: &str, schema_type: &str, schema: &str, references: &[(&str, &str, i64)]) -> u32 {
        let references: Vec<serde_json::Value> = references
            .iter()
            .map(|(name, subject, version)| serde_json::json!({"name": name, "subject": subject, "version": version}))
            .collect();
        let body = serde_json::json!({"schema": schema, "schemaType": schema_type, "references": references});
        let mut request = ureq::post(format!("{}/subjects/{subject}/versions", self.url()));
        if let Some(credentials) = &self.credentials {
            use base64::Engine as _;
            let token = base64::engine::general_purpose::STANDARD.encode(credentials);
            request = request.header("Authorization", &format!("Basic {token}"));
        }
        let mut response = request.send_json(&body).unwrap_or_else(|e| panic!("register {subject}: {e}"));
        let answer: serde_json::Value = response.body_mut().read_json().expect("registry answer");
        answer["id"].as_u64().expect("an id") as u32
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
        let references: Vec<serde_json::Value> = references
            .iter()
            .map(|(name, subject, version)| serde_json::json!({"name": name, "subject": subject, "version": version}))
            .collect();
        let body = serde_json::json!({"schema": proto, "schemaType": "PROTOBUF", "references": references,
            "serialized": serialized});
        let mut response = ureq::post(format!("{}/subjects/{subject}/versions", self.url()))
            .send_json(&body)
            .unwrap_or_else(|e| panic!("register {subject}: {e}"));
        let answer: serde_json::Value = response.body_mut().read_json().expect("registry answer");
        answer["id"].as_u64().expect("an id") as u32
    }

    /// Each record decoded by confluent-kafka's deserializer with its own registry client: `{"id", "value"}`
    /// (the schema id from the frame, the decoded value as JSON) or `{"error"}`.
    pub fn decode(&self, records: &[Framed<'_>]) -> Vec<serde_json::Value> {
        let mut cmd = Command::new("python3");
        cmd.arg(script()).arg("decode").arg(self.url()).args(self.credentials.iter());
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

impl Drop for SchemaRegistry {
    fn drop(&mut self) {
        self.kill();
    }
}
