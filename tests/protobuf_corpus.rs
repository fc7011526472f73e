//! The Protobuf writer against protoc and Python's protobuf runtime, reading from the schema *text*.
//!
//! Every case of `tests/fixtures/protobuf_corpus/*.json` (a registered `.proto`, the files it imports as
//! registry references, and payloads each with the message it must be written as and the value it must
//! decode to, or the path and reason of its refusal) is encoded with the connector's writer
//! ([`ProtobufCodec`]), from the payload's text as the file spells it. `tests/protobuf_corpus.py` then
//! compiles the schema text with protoc (`python3 -m grpc_tools.protoc --include_imports`: Google's compiler,
//! not the writer's protox), builds the message classes with Python's protobuf runtime, and for each datum
//! - reads Confluent's message-index array itself and checks that it names the expected message;
//! - parses the rest with `ParseFromString`, with no unknown field anywhere (a field the reader does not
//!   know, or a closed enum's unknown number, would land there), every proto2 `required` field present, and
//!   the message re-serialized (deterministically) to exactly the bytes written;
//! - compares the message with the expected value, and with what Python's own JSON reader makes of the
//!   same payload text (byte for byte).
//!
//! For each refused payload, Python's JSON reader (or, for a missing `required` field, its
//! `IsInitialized`) must refuse it too, unless the case says why the writer refuses what Python accepts
//! (`python_accepts`). The script also checks that the built-in imports the writer embeds
//! (`src/schema/protobuf/builtin/`) are Google's `google/type/*.proto` as googleapis-common-protos ships
//! them, and define what confluent-kafka's own `confluent/*` descriptors define. The files are written by
//! `tests/fixtures/protobuf_corpus/generate.py`, whose expected values are written by hand, never computed
//! by the connector.
//!
//! # The canonical form of a decoded value (what `expected` holds)
//! Python's `json_format.MessageToDict(message, preserving_proto_field_name=True)`: the proto3 JSON
//! mapping with fields named as the `.proto` names them (so a payload's lowerCamel or `json_name` keys are
//! checked to land in the right field), fields without presence left out at their default, 64-bit integers
//! as strings, enums by name (an open enum's unknown number as a number), bytes as padded standard base64,
//! floats as the shortest text that reads back as the same float, NaN and the infinities as strings, and
//! the well-known types in their JSON forms. The comparison tells -0.0 from 0.0.

#[path = "common/corpus.rs"]
mod corpus;

use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine as _;
use outbox_cdc::schema::protobuf::ProtobufCodec;
use serde_json::value::RawValue;

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/protobuf_corpus")
}

/// A corpus file, read as text: the payloads reach the writer as the file spells them.
#[derive(serde::Deserialize)]
struct Corpus {
    schema: String,
    #[serde(default)]
    references: Vec<Reference>,
    /// The writer must refuse the schema, for a reason containing this.
    refused_schema: Option<String>,
    #[serde(default)]
    cases: Vec<Case>,
}

#[derive(serde::Deserialize, serde::Serialize, Clone)]
struct Reference {
    name: String,
    schema: String,
}

#[derive(serde::Deserialize)]
struct Case {
    name: String,
    event_type: String,
    /// The full name of the message the payload is written as (none where the event type names none).
    message: Option<String>,
    /// The payload (`null` too: it is kept as text).
    #[serde(default, deserialize_with = "present")]
    payload: Option<Box<RawValue>>,
    /// The payload's exact text where JSON cannot spell it as a value (duplicate keys).
    payload_text: Option<String>,
    /// The canonical value Python must decode (`null` too: it is kept as text).
    #[serde(default, deserialize_with = "present")]
    expected: Option<Box<RawValue>>,
    /// Or the refusal: the path and a part of the reason.
    refused: Option<Refused>,
    /// Why the writer refuses a payload Python's JSON reader accepts.
    python_accepts: Option<String>,
}

#[derive(serde::Deserialize, Debug)]
struct Refused {
    path: String,
    reason: String,
}

fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Box<RawValue>>, D::Error> {
    <Box<RawValue> as serde::Deserialize>::deserialize(d).map(Some)
}

/// A schema the Python script compiles with protoc.
#[derive(serde::Serialize)]
struct Schema<'a> {
    file: &'a str,
    schema: &'a str,
    references: &'a [Reference],
}

/// One written datum or one refusal, for the Python script.
#[derive(serde::Serialize)]
struct Checked<'a> {
    file: &'a str,
    case: &'a str,
    message: &'a str,
    payload: &'a str,
    /// The writer's bytes (base64), message-index array included; none for a refusal.
    datum: Option<String>,
    expected: Option<&'a RawValue>,
    python_accepts: Option<&'a str>,
}

#[derive(serde::Serialize)]
struct Input<'a> {
    builtin_dir: PathBuf,
    schemas: Vec<Schema<'a>>,
    checked: Vec<Checked<'a>>,
}

#[test]
fn every_corpus_message_decodes_with_protoc_and_python_protobuf() {
    let corpus: Vec<(String, Corpus)> = corpus::read(&corpus_dir(), 30);
    let mut failures: Vec<String> = Vec::new();
    let mut input = Input {
        builtin_dir: Path::new(env!("CARGO_MANIFEST_DIR")).join("src/schema/protobuf/builtin"),
        schemas: Vec::new(),
        checked: Vec::new(),
    };
    let mut cases = 0;
    for (file, corpus) in &corpus {
        let references: Vec<(String, String)> =
            corpus.references.iter().map(|r| (r.name.clone(), r.schema.clone())).collect();
        let codec = ProtobufCodec::parse(&corpus.schema, &references);
        if let Some(reason) = &corpus.refused_schema {
            cases += 1;
            match codec {
                Err(e) if e.contains(reason.as_str()) => {}
                Err(e) => failures.push(format!("{file}: schema refused for another reason: {e}")),
                Ok(_) => failures.push(format!("{file}: the schema must be refused ({reason})")),
            }
            continue;
        }
        let codec = match codec {
            Ok(codec) => codec,
            Err(e) => {
                failures.push(format!("{file}: the writer refuses the schema: {e}"));
                cases += corpus.cases.len();
                continue;
            }
        };
        input.schemas.push(Schema { file, schema: &corpus.schema, references: &corpus.references });
        for case in &corpus.cases {
            cases += 1;
            let at = format!("{file} {}", case.name);
            let payload = match (&case.payload_text, &case.payload) {
                (Some(text), _) => text.as_str(),
                (None, Some(raw)) => raw.get(),
                (None, None) => panic!("{at}: the case has no payload"),
            };
            let mut datum = Vec::new();
            let written = codec.encode(&case.event_type, payload, &mut datum);
            match (&written, &case.message) {
                (Ok(()), Some(message)) => match codec.message_name(&case.event_type) {
                    Ok(name) if name == message => {}
                    Ok(name) => failures.push(format!("{at}: message_name says {name}, expected {message}")),
                    Err(e) => failures.push(format!("{at}: message_name refuses: {e}")),
                },
                (Ok(()), None) => failures.push(format!("{at}: written, but the event type names no message")),
                (Err(_), _) => {}
            }
            match (written, &case.refused, &case.expected) {
                (Err(m), Some(refused), _) => {
                    if m.path() != refused.path || !m.reason().contains(&refused.reason) {
                        failures.push(format!("{at}: refused as {m}, expected {refused:?}"));
                    }
                    // Python's reader is asked whether it refuses the payload too.
                    if let Some(message) = &case.message {
                        input.checked.push(Checked {
                            file,
                            case: &case.name,
                            message,
                            payload,
                            datum: None,
                            expected: None,
                            python_accepts: case.python_accepts.as_deref(),
                        });
                    }
                }
                (Err(m), None, _) => failures.push(format!("{at}: refused: {m}")),
                (Ok(()), Some(refused), _) => failures.push(format!("{at}: written, but must be refused: {refused:?}")),
                (Ok(()), None, None) => panic!("{at}: the case names neither `expected` nor `refused`"),
                (Ok(()), None, Some(expected)) => {
                    if let Some(message) = &case.message {
                        input.checked.push(Checked {
                            file,
                            case: &case.name,
                            message,
                            payload,
                            datum: Some(base64::engine::general_purpose::STANDARD.encode(&datum)),
                            expected: Some(expected),
                            python_accepts: None,
                        });
                    }
                }
            }
        }
    }
    let input_file = std::env::temp_dir().join(format!("protobuf_corpus-{}.json", std::process::id()));
    std::fs::write(&input_file, serde_json::to_vec(&input).unwrap()).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/protobuf_corpus.py");
    let run = Command::new("python3").arg(&script).arg(&input_file).output().expect("python3 runs");
    let _ = std::fs::remove_file(&input_file);
    let stderr = String::from_utf8_lossy(&run.stderr);
    failures.extend(String::from_utf8_lossy(&run.stdout).lines().filter(|l| !l.is_empty()).map(str::to_string));
    assert!(run.status.success() || !failures.is_empty(), "the Python script failed: {stderr}");
    assert!(
        failures.is_empty(),
        "{} failures in {cases} corpus cases:\n{}\n{stderr}",
        failures.len(),
        failures.join("\n")
    );
    eprintln!("{cases} corpus cases in {} schemas: {stderr}", corpus.len());
}
