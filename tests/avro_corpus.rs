//! The Avro writer against two decoders we did not write, reading from the schema *text*.
//!
//! Every case of `tests/fixtures/avro_corpus/*.json` (a schema, the schemas it references, and payloads
//! each with the value it must decode to, or the path and reason of its refusal) is encoded with the
//! connector's writer ([`AvroCodec`]). Each datum is then decoded
//! - by apache-avro's reader, with a schema parsed here from the text (not the writer's parsed schema),
//!   with no bytes left over; its value is put in the corpus's canonical form by walking the schema text;
//! - by fastavro (`tests/avro_corpus.py`), from the untouched schema text, with no bytes left over;
//!
//! and both are compared with the expected value by the Python script (whose JSON reader reads every
//! double exactly, so the comparison does not depend on how this crate reads numbers). The schema and the
//! payloads reach the writer as the file spells them (raw JSON text, as the connector reads a row). The
//! files are written by `tests/fixtures/avro_corpus/generate.py`, whose expected values are computed by
//! hand and with Python's datetime, never by the connector.
//!
//! # The canonical form of a decoded value (what `expected` holds)
//! Avro's JSON encoding, with logical types as their meaning: a union is `null` or `{"<branch>": value}`
//! (the branch's full name, or its type name: `"long"`, `"bytes"`, `"array"`, ...), `bytes` and `fixed`
//! are strings of characters U+0000-U+00FF, a decimal is its text with exactly `scale` digits after the
//! point, a uuid its lowercase text, date / time-* / timestamp-* / local-timestamp-* their count
//! (days, millis, micros, nanos), a duration `{"months", "days", "millis"}`.
//!
//! # Why apache-avro reads an amended text
//! apache-avro 0.21 cannot read two things the specification allows: a `fixed` with `logicalType: uuid`
//! (it reads a length-prefixed string) and a decimal `fixed` referenced by name a second time (it reads
//! the plain fixed); and it refuses a field default written as the specification says (`"\u0000"` for a
//! decimal). So the text it parses has the `logicalType` of every `fixed` and every field `default`
//! removed — neither changes the binary encoding of a writer's datum — and the fixed's meaning is read
//! from the original text by this file's walker. fastavro reads the text as registered.

#[path = "common/corpus.rs"]
mod corpus;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use apache_avro::types::Value as Avro;
use apache_avro::Schema;
use base64::Engine as _;
use num_bigint::BigInt;
use outbox_cdc::schema::avro::AvroCodec;
use serde_json::value::RawValue;
use serde_json::{json, Value as Json};

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/avro_corpus")
}

/// Every named type of a schema text, by full name, with the namespace its own references resolve in.
#[derive(Default)]
struct Names(HashMap<String, (Json, Option<String>)>);

const PRIMITIVES: [&str; 8] = ["null", "boolean", "int", "long", "float", "double", "bytes", "string"];

/// The full name and namespace of a named type's definition `object`, inside `enclosing`.
fn full_name(object: &serde_json::Map<String, Json>, enclosing: Option<&str>) -> (String, Option<String>) {
    let name = object["name"].as_str().expect("a named type has a name");
    if let Some((namespace, _)) = name.rsplit_once('.') {
        return (name.to_string(), Some(namespace.to_string()));
    }
    let namespace = match object.get("namespace").and_then(Json::as_str) {
        Some("") => None,
        Some(ns) => Some(ns.to_string()),
        None => enclosing.map(str::to_string),
    };
    match &namespace {
        Some(ns) => (format!("{ns}.{name}"), namespace),
        None => (name.to_string(), None),
    }
}

impl Names {
    fn collect(&mut self, schema: &Json, enclosing: Option<&str>) {
        match schema {
            Json::Array(branches) => branches.iter().for_each(|b| self.collect(b, enclosing)),
            Json::Object(object) => match object.get("type") {
                Some(Json::String(t)) if matches!(t.as_str(), "record" | "error" | "enum" | "fixed") => {
                    let (full, namespace) = full_name(object, enclosing);
                    self.0.insert(full, (schema.clone(), namespace.clone()));
                    for field in object.get("fields").and_then(Json::as_array).into_iter().flatten() {
                        self.collect(&field["type"], namespace.as_deref());
                    }
                }
                Some(Json::String(t)) if t == "array" => self.collect(&object["items"], enclosing),
                Some(Json::String(t)) if t == "map" => self.collect(&object["values"], enclosing),
                Some(nested @ (Json::Object(_) | Json::Array(_))) => self.collect(nested, enclosing),
                _ => {}
            },
            _ => {}
        }
    }

    fn lookup(&self, name: &str, enclosing: Option<&str>) -> (&Json, Option<&str>, String) {
        let qualified = match (name.contains('.'), enclosing) {
            (false, Some(ns)) => format!("{ns}.{name}"),
            _ => name.to_string(),
        };
        let (full, (schema, namespace)) = self
            .0
            .get_key_value(&qualified)
            .or_else(|| self.0.get_key_value(name))
            .unwrap_or_else(|| panic!("the corpus schema names {name} but defines none"));
        (schema, namespace.as_deref(), full.clone())
    }

    /// The name of a union branch in Avro's JSON encoding.
    fn branch_name(&self, branch: &Json, enclosing: Option<&str>) -> String {
        match branch {
            Json::String(s) if PRIMITIVES.contains(&s.as_str()) => s.clone(),
            Json::String(s) => self.lookup(s, enclosing).2,
            Json::Object(object) => match object.get("type") {
                Some(Json::String(t)) if matches!(t.as_str(), "record" | "error" | "enum" | "fixed") => {
                    full_name(object, enclosing).0
                }
                Some(Json::String(t)) if t == "array" || t == "map" => t.clone(),
                Some(t @ Json::String(_)) => self.branch_name(t, enclosing),
                Some(nested) => self.branch_name(nested, enclosing),
                None => panic!("a schema object without a type: {branch}"),
            },
            Json::Array(_) => panic!("a union directly inside a union"),
            other => panic!("not a schema: {other}"),
        }
    }

    /// `value` as apache-avro decoded it, in the corpus's canonical form, walking the schema text.
    fn canonical(&self, schema: &Json, enclosing: Option<&str>, value: &Avro) -> Json {
        match (schema, value) {
            (Json::String(s), _) if !PRIMITIVES.contains(&s.as_str()) => {
                let (named, namespace, _) = self.lookup(s, enclosing);
                self.canonical(named, namespace, value)
            }
            (Json::Array(branches), Avro::Union(index, inner)) => {
                let branch = &branches[*index as usize];
                match branch.as_str() {
                    Some("null") => Json::Null,
                    _ => json!({ self.branch_name(branch, enclosing): self.canonical(branch, enclosing, inner) }),
                }
            }
            (Json::Array(_), _) => json!({"error": format!("a union read as {value:?}")}),
            (Json::Object(object), _) => {
                let logical = object.get("logicalType").and_then(Json::as_str);
                match (object.get("type"), value) {
                    (Some(Json::String(t)), Avro::Record(fields)) if t == "record" || t == "error" => {
                        let (_, namespace) = full_name(object, enclosing);
                        let types = object["fields"].as_array().unwrap();
                        let mut out = serde_json::Map::new();
                        for ((name, value), field) in fields.iter().zip(types) {
                            assert_eq!(field["name"].as_str(), Some(name.as_str()));
                            out.insert(name.clone(), self.canonical(&field["type"], namespace.as_deref(), value));
                        }
                        Json::Object(out)
                    }
                    (Some(Json::String(t)), Avro::Array(items)) if t == "array" => {
                        items.iter().map(|item| self.canonical(&object["items"], enclosing, item)).collect()
                    }
                    (Some(Json::String(t)), Avro::Map(entries)) if t == "map" => Json::Object(
                        entries
                            .iter()
                            .map(|(k, v)| (k.clone(), self.canonical(&object["values"], enclosing, v)))
                            .collect(),
                    ),
                    (Some(Json::String(t)), Avro::Fixed(_, bytes)) if t == "fixed" => match logical {
                        Some("decimal") => decimal_text(BigInt::from_signed_bytes_be(bytes), scale(object)),
                        Some("uuid") if bytes.len() == 16 => {
                            Json::String(uuid_text(bytes.as_slice().try_into().unwrap()))
                        }
                        Some("duration") if bytes.len() == 12 => {
                            let part = |i: usize| u32::from_le_bytes(bytes[i * 4..i * 4 + 4].try_into().unwrap());
                            json!({"months": part(0), "days": part(1), "millis": part(2)})
                        }
                        _ => latin1(bytes),
                    },
                    (Some(Json::String(t)), Avro::Enum(_, symbol)) if t == "enum" => json!(symbol),
                    (Some(Json::String(_)), Avro::Decimal(decimal)) => {
                        decimal_text(BigInt::from(decimal.clone()), scale(object))
                    }
                    (Some(Json::String(t)), _) if PRIMITIVES.contains(&t.as_str()) => primitive(value),
                    (Some(nested @ (Json::Object(_) | Json::Array(_))), _) => self.canonical(nested, enclosing, value),
                    _ => json!({"error": format!("schema {schema} cannot hold the decoded {value:?}")}),
                }
            }
            (_, value) => primitive(value),
        }
    }
}

fn scale(object: &serde_json::Map<String, Json>) -> usize {
    object.get("scale").and_then(Json::as_u64).unwrap_or(0) as usize
}

fn decimal_text(unscaled: BigInt, scale: usize) -> Json {
    let negative = unscaled.sign() == num_bigint::Sign::Minus;
    let digits = unscaled.magnitude().to_string();
    let digits = format!("{digits:0>width$}", width = scale + 1);
    let (whole, fraction) = digits.split_at(digits.len() - scale);
    let sign = if negative { "-" } else { "" };
    Json::String(match scale {
        0 => format!("{sign}{whole}"),
        _ => format!("{sign}{whole}.{fraction}"),
    })
}

fn uuid_text(b: [u8; 16]) -> String {
    let hex: String = b.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &hex[0..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..32])
}

fn latin1(bytes: &[u8]) -> Json {
    Json::String(bytes.iter().map(|b| char::from(*b)).collect())
}

fn primitive(value: &Avro) -> Json {
    match value {
        Avro::Null => Json::Null,
        Avro::Boolean(b) => json!(b),
        Avro::Int(n) | Avro::Date(n) | Avro::TimeMillis(n) => json!(n),
        Avro::Long(n)
        | Avro::TimeMicros(n)
        | Avro::TimestampMillis(n)
        | Avro::TimestampMicros(n)
        | Avro::TimestampNanos(n)
        | Avro::LocalTimestampMillis(n)
        | Avro::LocalTimestampMicros(n)
        | Avro::LocalTimestampNanos(n) => json!(n),
        Avro::Float(x) => json!(f64::from(*x)),
        Avro::Double(x) => json!(x),
        Avro::Bytes(b) => latin1(b),
        Avro::String(s) | Avro::Enum(_, s) => json!(s),
        Avro::Uuid(u) => json!(u.to_string()),
        Avro::Duration(d) => {
            json!({"months": u32::from(d.months()), "days": u32::from(d.days()), "millis": u32::from(d.millis())})
        }
        other => panic!("a decoded value the corpus does not expect: {other:?}"),
    }
}

/// The schema text apache-avro parses: without the `logicalType` of a `fixed` and without field
/// defaults (see the module docs).
fn amended(schema: &Json) -> Json {
    match schema {
        Json::Array(items) => Json::Array(items.iter().map(amended).collect()),
        Json::Object(object) => {
            let fixed = object.get("type").and_then(Json::as_str) == Some("fixed");
            let is_field = object.contains_key("name") && object.contains_key("type") && !object.contains_key("fields");
            Json::Object(
                object
                    .iter()
                    .filter(|(k, _)| !(fixed && *k == "logicalType"))
                    .filter(|(k, _)| !(is_field && *k == "default" && !is_named_type(object)))
                    .map(|(k, v)| (k.clone(), amended(v)))
                    .collect(),
            )
        }
        other => other.clone(),
    }
}

fn is_named_type(object: &serde_json::Map<String, Json>) -> bool {
    matches!(object.get("type").and_then(Json::as_str), Some("record" | "error" | "enum" | "fixed"))
}

/// A corpus file, read as text: the schema and every payload reach the writer as the file spells them.
#[derive(serde::Deserialize)]
struct Corpus {
    schema: Box<RawValue>,
    #[serde(default)]
    references: Vec<Box<RawValue>>,
    /// The writer must refuse the schema, for a reason containing this.
    refused_schema: Option<String>,
    #[serde(default)]
    cases: Vec<Case>,
}

#[derive(serde::Deserialize)]
struct Case {
    name: String,
    payload: Box<RawValue>,
    /// The canonical value both decoders must read (`null` too: it is kept as text).
    #[serde(default, deserialize_with = "present")]
    expected: Option<Box<RawValue>>,
    /// Or the refusal: the path and a part of the reason.
    refused: Option<Refused>,
}

#[derive(serde::Deserialize, Debug)]
struct Refused {
    path: String,
    reason: String,
}

fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Box<RawValue>>, D::Error> {
    <Box<RawValue> as serde::Deserialize>::deserialize(d).map(Some)
}

/// One written datum, for the Python script.
#[derive(serde::Serialize)]
struct Encoded<'a> {
    file: &'a str,
    case: &'a str,
    schema: &'a RawValue,
    references: &'a [Box<RawValue>],
    datum: String,
    apache: Json,
    expected: &'a RawValue,
}

#[test]
fn every_corpus_datum_decodes_with_apache_avro_and_fastavro() {
    let corpus: Vec<(String, Corpus)> = corpus::read(&corpus_dir(), 50);
    let mut failures: Vec<String> = Vec::new();
    let mut encoded: Vec<Encoded> = Vec::new();
    let mut cases = 0;
    for (file, corpus) in &corpus {
        let reference_texts: Vec<String> = corpus.references.iter().map(|r| r.get().to_string()).collect();
        let codec = AvroCodec::parse(corpus.schema.get(), &reference_texts);
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
        let schema: Json = serde_json::from_str(corpus.schema.get()).unwrap();
        let references: Vec<Json> = reference_texts.iter().map(|r| serde_json::from_str(r).unwrap()).collect();
        let mut names = Names::default();
        for s in references.iter().chain(std::iter::once(&schema)) {
            names.collect(s, None);
        }
        let amended_references: Vec<String> = references.iter().map(|r| amended(r).to_string()).collect();
        let (reader, referenced) = match references.is_empty() {
            true => Schema::parse_str(&amended(&schema).to_string()).map(|s| (s, Vec::new())),
            false => Schema::parse_str_with_list(&amended(&schema).to_string(), &amended_references),
        }
        .unwrap_or_else(|e| panic!("{file}: apache-avro refuses the schema: {e}"));
        for case in &corpus.cases {
            cases += 1;
            let at = format!("{file} {}", case.name);
            // The payload is read as the connector reads it: from its text.
            let payload: Json = serde_json::from_str(case.payload.get()).unwrap();
            let mut datum = Vec::new();
            match (codec.encode(&payload, &mut datum), &case.refused, &case.expected) {
                (Err(m), Some(refused), _) => {
                    if m.path() != refused.path || !m.reason().contains(&refused.reason) {
                        failures.push(format!("{at}: refused as {m}, expected {refused:?}"));
                    }
                }
                (Err(m), None, _) => failures.push(format!("{at}: refused: {m}")),
                (Ok(()), Some(refused), _) => failures.push(format!("{at}: written, but must be refused: {refused:?}")),
                (Ok(()), None, None) => panic!("{at}: the case names neither `expected` nor `refused`"),
                (Ok(()), None, Some(expected)) => {
                    let mut rest = datum.as_slice();
                    let read = match referenced.is_empty() {
                        true => apache_avro::from_avro_datum(&reader, &mut rest, None),
                        false => {
                            let all = referenced.iter().chain(std::iter::once(&reader)).collect();
                            apache_avro::from_avro_datum_schemata(&reader, all, &mut rest, None)
                        }
                    };
                    let apache = match read {
                        Ok(_) if !rest.is_empty() => json!({"error": format!("{} bytes left over", rest.len())}),
                        Ok(value) => names.canonical(&schema, None, &value),
                        Err(e) => json!({"error": e.to_string()}),
                    };
                    encoded.push(Encoded {
                        file,
                        case: &case.name,
                        schema: &corpus.schema,
                        references: &corpus.references,
                        datum: base64::engine::general_purpose::STANDARD.encode(&datum),
                        apache,
                        expected,
                    });
                }
            }
        }
    }
    let encoded_file = std::env::temp_dir().join(format!("avro_corpus-{}.json", std::process::id()));
    std::fs::write(&encoded_file, serde_json::to_vec(&encoded).unwrap()).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/avro_corpus.py");
    let run = Command::new("python3").arg(&script).arg(&encoded_file).output().expect("python3 runs");
    let _ = std::fs::remove_file(&encoded_file);
    let stderr = String::from_utf8_lossy(&run.stderr);
    failures.extend(String::from_utf8_lossy(&run.stdout).lines().filter(|l| !l.is_empty()).map(str::to_string));
    assert!(run.status.success() || !failures.is_empty(), "the Python script failed: {stderr}");
    assert!(
        failures.is_empty(),
        "{} failures in {cases} corpus cases:\n{}\n{stderr}",
        failures.len(),
        failures.join("\n")
    );
    eprintln!("{cases} corpus cases in {} schemas: every datum read back by apache-avro and fastavro", corpus.len());
}
