//! The JSON Schema validator against Python's jsonschema and confluent-kafka's JSONDeserializer, from the
//! schema *text*.
//!
//! Every case of `tests/fixtures/json_schema_corpus/*.json` (a schema, the registry references it may `$ref`
//! under the names the references give them, and payloads as raw JSON text, each with its verdict) goes
//! through the connector's [`JsonSchemaCodec`], which reads the schema text and the references' texts, and
//! the payload as the router reads a row (its text, parsed by serde_json). A payload it accepts is framed as
//! [`outbox_cdc::schema`]'s `Resolved::encode` frames it (`0x00`, the schema id big-endian, then what the
//! codec appends, which must be the text, byte for byte). Then `tests/json_schema_corpus.py` reads every
//! case twice, from the untouched texts:
//! - with Python's jsonschema, the validator class of the schema's draft (draft-07 when `$schema` names
//!   none, as Confluent's registry reads it), no format checker, the references under their names, and the
//!   payload read exactly by Python's json;
//! - with confluent-kafka's JSONDeserializer (a consumer), from the framed bytes, its registry a mock holding
//!   the schema under the framed id and each reference under its subject;
//!
//! and checks the framing (magic byte, id, the unchanged text). A case's `valid` is the connector's verdict
//! (with the path of a refusal where one is given); `python` and `confluent_python` name, with `why`, the
//! cases where a Python reading departs from it, so each departure is written down and fails the test the
//! day it changes. Every disagreement is listed; the test fails on any. The files are written by
//! `tests/fixtures/json_schema_corpus/generate.py`, whose verdicts are written by hand from the drafts and
//! docs/CONTRACT.md, never taken from a validator.

#[path = "common/corpus.rs"]
mod corpus;

use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine as _;
use outbox_cdc::schema::json_schema::JsonSchemaCodec;
use serde_json::value::RawValue;

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/json_schema_corpus")
}

/// A corpus file, read as text: the schema and the references reach the codec as the file spells them.
#[derive(serde::Deserialize)]
struct Corpus {
    schema: Box<RawValue>,
    #[serde(default)]
    references: Vec<Reference>,
    /// The connector must refuse the schema, for a reason containing this.
    refused_schema: Option<String>,
    cases: Vec<Case>,
}

/// A registry reference: the name `$ref` uses, the subject and version holding the schema, and the names of
/// the references that schema has itself.
#[derive(serde::Deserialize)]
struct Reference {
    name: String,
    subject: String,
    version: u32,
    references: Vec<String>,
    schema: Box<RawValue>,
}

#[derive(serde::Deserialize)]
struct Case {
    name: String,
    /// The row's payload, as text.
    payload: String,
    valid: bool,
    /// Where the connector must say a refused payload breaks the schema.
    path: Option<String>,
    python: Option<bool>,
    confluent_python: Option<bool>,
    why: Option<String>,
}

/// One case, for the Python script.
#[derive(serde::Serialize)]
struct Entry<'a> {
    file: &'a str,
    case: &'a str,
    schema: &'a str,
    references: Vec<ReferenceEntry<'a>>,
    refused_schema: bool,
    payload: &'a str,
    id: u32,
    /// The framed record (base64) where the connector accepted the payload.
    framed: Option<String>,
    valid: bool,
    python: Option<bool>,
    confluent_python: Option<bool>,
    why: Option<&'a str>,
}

#[derive(serde::Serialize)]
struct ReferenceEntry<'a> {
    name: &'a str,
    subject: &'a str,
    version: u32,
    references: &'a [String],
    schema: &'a str,
}

#[test]
fn every_corpus_case_agrees_with_python_jsonschema_and_confluent_kafka() {
    let corpus: Vec<(String, Corpus)> = corpus::read(&corpus_dir(), 40);
    let mut failures: Vec<String> = Vec::new();
    let mut entries: Vec<Entry> = Vec::new();
    let mut cases = 0;
    for (index, (file, corpus)) in corpus.iter().enumerate() {
        // Four distinct bytes, so a byte-order or width slip shows.
        let id = 0x0102_0300 + u32::try_from(index).unwrap();
        let named: Vec<(String, String)> =
            corpus.references.iter().map(|r| (r.name.clone(), r.schema.get().to_string())).collect();
        let codec = match (JsonSchemaCodec::parse(corpus.schema.get(), &named), &corpus.refused_schema) {
            (Ok(codec), None) => Some(codec),
            (Err(e), None) => {
                failures.push(format!("{file}: the connector refuses the schema: {e}"));
                None
            }
            (Err(e), Some(reason)) if e.contains(reason.as_str()) => None,
            (Err(e), Some(reason)) => {
                failures.push(format!("{file}: schema refused for another reason than {reason:?}: {e}"));
                None
            }
            (Ok(_), Some(reason)) => {
                failures.push(format!("{file}: the connector must refuse the schema ({reason})"));
                None
            }
        };
        for case in &corpus.cases {
            cases += 1;
            let at = format!("{file} {}", case.name);
            assert_eq!(
                case.python.is_some() || case.confluent_python.is_some(),
                case.why.is_some(),
                "{at}: a departure names its reason"
            );
            let mut framed = None;
            if let Some(codec) = &codec {
                // The payload is read as the router reads a row: from its text.
                let payload: serde_json::Value =
                    serde_json::from_str(&case.payload).unwrap_or_else(|e| panic!("{at}: not JSON: {e}"));
                let mut out = vec![0u8];
                out.extend_from_slice(&id.to_be_bytes());
                let prefix = out.clone();
                match (codec.encode(&payload, &case.payload, &mut out), case.valid) {
                    (Ok(()), true) => {
                        if out[..5] != prefix[..] || &out[5..] != case.payload.as_bytes() {
                            failures.push(format!("{at}: framed {out:?}, not the prefix and the text unchanged"));
                        }
                        framed = Some(base64::engine::general_purpose::STANDARD.encode(&out));
                    }
                    (Ok(()), false) => failures.push(format!("{at}: accepted, but must be refused")),
                    (Err(m), true) => failures.push(format!("{at}: refused, but valid: {m}")),
                    (Err(m), false) => {
                        if case.path.as_ref().is_some_and(|path| *path != m.path()) {
                            failures.push(format!("{at}: refused at {m}, expected at {}", case.path.as_ref().unwrap()));
                        }
                    }
                }
            }
            entries.push(Entry {
                file,
                case: &case.name,
                schema: corpus.schema.get(),
                references: corpus
                    .references
                    .iter()
                    .map(|r| ReferenceEntry {
                        name: &r.name,
                        subject: &r.subject,
                        version: r.version,
                        references: &r.references,
                        schema: r.schema.get(),
                    })
                    .collect(),
                refused_schema: corpus.refused_schema.is_some(),
                payload: &case.payload,
                id,
                framed,
                valid: case.valid,
                python: case.python,
                confluent_python: case.confluent_python,
                why: case.why.as_deref(),
            });
        }
    }
    let entries_file = std::env::temp_dir().join(format!("json_schema_corpus-{}.json", std::process::id()));
    std::fs::write(&entries_file, serde_json::to_vec(&entries).unwrap()).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/json_schema_corpus.py");
    let run = Command::new("python3").arg(&script).arg(&entries_file).output().expect("python3 runs");
    let _ = std::fs::remove_file(&entries_file);
    let stderr = String::from_utf8_lossy(&run.stderr);
    failures.extend(String::from_utf8_lossy(&run.stdout).lines().filter(|l| !l.is_empty()).map(str::to_string));
    assert!(run.status.success() || !failures.is_empty(), "the Python script failed: {stderr}");
    assert!(
        failures.is_empty(),
        "{} failures in {cases} corpus cases:\n{}\n{stderr}",
        failures.len(),
        failures.join("\n")
    );
    eprintln!("{cases} corpus cases in {} schemas: the connector, jsonschema and confluent-kafka agree", corpus.len());
}
