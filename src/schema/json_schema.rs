//! JSON Schema: the payload validated against its registered schema, then framed as it is (the row's
//! JSON text, unchanged).
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2.
//!
//! The `jsonschema` crate validates, in the draft the schema's `$schema` names, draft-07 otherwise
//! ([`dialect`]: Confluent's registry and serializers read a schema so). Referenced schemas come from the
//! registry, each under the name its reference gives it and, under a root `$id`, under that name resolved
//! against it (where Confluent's Java serializers register it); a reference without its own `$schema` is
//! read in the root's draft. Nothing is fetched from the network or the disk on a schema's say-so.
//!
//! # What a consumer's validator decides, the connector decides first
//! confluent-kafka's consumers validate every record with Python's jsonschema (its JSONDeserializer's
//! default), Confluent's Java ones on request. Where the crate's defaults depart from the draft or from
//! those validators, the codec sets them right (each found by tests/json_schema_corpus.rs, which reads
//! every case with jsonschema and confluent-kafka's JSONDeserializer):
//! - `format`, `contentMediaType` and `contentEncoding` are annotations, in every draft: confluent-kafka
//!   validates without a format checker (the crate asserted formats in drafts 4 to 7);
//! - `multipleOf` holds in decimal and in the arithmetic Python's jsonschema divides with
//!   ([`numbers`]); an integer literal beyond 64 bits is refused, `-0` is the integer 0;
//! - `pattern` is ECMA-262 ([`pattern`]); `dependencies` is no keyword in 2019-09 and 2020-12.
//!
//! The corpus lists where Python's readings still depart from the connector's, and why (`\d` matching any
//! digit in Python's `re`, a schema without `$schema` read as 2020-12 by confluent-kafka, …).

mod dialect;
mod numbers;
mod pattern;

use std::borrow::Cow;
use std::collections::HashMap;

use jsonschema::error::ValidationErrorKind;
use jsonschema::paths::Location;
use jsonschema::{Draft, Keyword, ValidationError};
use serde_json::{Map, Value};

use super::avro::Mismatch;

/// A compiled JSON Schema.
pub struct JsonSchemaCodec {
    validator: jsonschema::Validator,
    /// The registered text of each pattern the validator compiled rewritten ([`pattern`]), by the
    /// rewritten text its refusals name.
    patterns: HashMap<String, String>,
}

impl std::fmt::Debug for JsonSchemaCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JsonSchemaCodec")
    }
}

impl JsonSchemaCodec {
    /// Compiles `schema`; `references` are (name, schema text) of the schemas it may `$ref`.
    ///
    /// # Errors
    /// Why the schema or a reference is not a JSON Schema the validator accepts, and where.
    pub fn parse(schema: &str, references: &[(String, String)]) -> Result<Self, String> {
        let mut schema: Value = serde_json::from_str(schema).map_err(|e| format!("not JSON: {e}"))?;
        let draft = dialect::named_draft(&schema).unwrap_or(Draft::Draft7);
        let mut patterns = HashMap::new();
        dialect::adapt(&mut schema, draft, &mut patterns);
        let mut options = jsonschema::options()
            .with_draft(draft)
            .should_validate_formats(false)
            .with_keyword("contentMediaType", annotation)
            .with_keyword("contentEncoding", annotation)
            .with_keyword("multipleOf", numbers::multiple_of);
        let base = dialect::base_url(&schema, draft);
        for (name, text) in references {
            let mut contents: Value =
                serde_json::from_str(text).map_err(|e| format!("reference {name:?} is not JSON: {e}"))?;
            let own = dialect::named_draft(&contents).unwrap_or(draft);
            dialect::adapt(&mut contents, own, &mut patterns);
            let resource = own.create_resource(contents);
            if let Some(url) = base.and_then(|base| dialect::resolve(base, name)) {
                options = options.with_resource(url, resource.clone());
            }
            options = options.with_resource(name.clone(), resource);
        }
        let validator = options.build(&schema).map_err(|e| match e.instance_path().as_str() {
            "" => e.to_string(),
            at => format!("{e} (at {at})"),
        })?;
        Ok(JsonSchemaCodec { validator, patterns })
    }

    /// Validates `payload` (read from `text`) and appends `text`, the row's JSON as it is, to `out`.
    ///
    /// # Errors
    /// The first place the payload breaks the schema, with the validator's reason; an integer literal of
    /// `text` beyond 64 bits, where it is.
    pub fn encode(&self, payload: &Value, text: &str, out: &mut Vec<u8>) -> Result<(), Mismatch> {
        let zeros = numbers::negative_zeros(text)?;
        let payload = match zeros.is_empty() {
            true => Cow::Borrowed(payload),
            false => Cow::Owned(numbers::with_integer_zeros(payload, &zeros)),
        };
        if let Some(error) = self.validator.iter_errors(&payload).next() {
            let reason = match error.kind() {
                ValidationErrorKind::Pattern { pattern } if self.patterns.contains_key(pattern) => {
                    format!(r#"{} does not match "{}""#, error.instance(), self.patterns[pattern])
                }
                _ => error.to_string(),
            };
            return Err(at_pointer(&payload, error.instance_path().as_str(), reason));
        }
        out.extend_from_slice(text.as_bytes());
        Ok(())
    }
}

/// A keyword that only annotates: every instance meets it.
fn annotation<'a>(
    _: &'a Map<String, Value>,
    _: &'a Value,
    _: Location,
) -> Result<Box<dyn Keyword>, ValidationError<'a>> {
    Ok(Box::new(Annotation))
}

struct Annotation;

impl Keyword for Annotation {
    fn validate<'i>(&self, _: &'i Value) -> Result<(), ValidationError<'i>> {
        Ok(())
    }

    fn is_valid(&self, _: &Value) -> bool {
        true
    }
}

/// A mismatch at a JSON pointer into `root`, its path written as the Avro mismatches write theirs.
fn at_pointer(root: &Value, pointer: &str, reason: String) -> Mismatch {
    let mut segments = Vec::new();
    let mut at = root;
    for raw in pointer.split('/').skip(1) {
        let segment = raw.replace("~1", "/").replace("~0", "~");
        match at {
            Value::Array(items) => {
                let index: usize = segment.parse().unwrap_or(0);
                segments.push((true, segment));
                at = items.get(index).unwrap_or(&Value::Null);
            }
            _ => {
                at = at.get(&segment).unwrap_or(&Value::Null);
                segments.push((false, segment));
            }
        }
    }
    let mut mismatch = Mismatch::new(reason);
    for (index, segment) in segments.into_iter().rev() {
        mismatch = match index {
            true => mismatch.in_item(segment.parse().unwrap_or(0)),
            false => mismatch.in_field(&segment),
        };
    }
    mismatch
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn codec() -> JsonSchemaCodec {
        let money = json!({"$id": "https://acme.example/money.json", "type": "object",
            "properties": {"amount": {"type": "string", "pattern": "^[0-9]+\\.[0-9]{2}$"}},
            "required": ["amount"]});
        let order = json!({"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
            "properties": {
                "lines": {"type": "array", "items": {"type": "object", "properties": {"qty": {"type": "integer"}}}},
                "total": {"$ref": "https://acme.example/money.json"}},
            "required": ["lines"], "additionalProperties": false});
        let references = [("https://acme.example/money.json".to_string(), money.to_string())];
        JsonSchemaCodec::parse(&order.to_string(), &references).unwrap()
    }

    /// A valid payload is framed as written, byte for byte; a breach names its path, through arrays and
    /// a referenced schema.
    #[test]
    fn validates_then_keeps_the_text() {
        let text = r#"{"lines": [{"qty": 1}], "total": {"amount": "1.00"}}"#;
        let mut out = Vec::new();
        codec().encode(&serde_json::from_str(text).unwrap(), text, &mut out).unwrap();
        assert_eq!(out, text.as_bytes());
        for (bad, path) in [
            (json!({"lines": [{"qty": 1}, {"qty": "2"}]}), "$.lines[1].qty"),
            (json!({"lines": [], "total": {"amount": "1"}}), "$.total.amount"),
            (json!({"lines": [], "extra": 1}), "$"),
            (json!({}), "$"),
        ] {
            let mismatch = codec().encode(&bad, &bad.to_string(), &mut Vec::new()).unwrap_err();
            assert_eq!(mismatch.path(), path, "{bad}: {mismatch}");
        }
    }

    /// A pattern rewritten for the regex engine (ECMA-262's `.` matches no `\r`) is named as registered
    /// when it refuses a payload, never as the engine's spelling.
    #[test]
    fn a_refusing_pattern_is_named_as_registered() {
        let codec = JsonSchemaCodec::parse(r#"{"properties": {"code": {"pattern": "^a.c$"}}}"#, &[]).unwrap();
        let text = r#"{"code": "a\rc"}"#;
        let mismatch = codec.encode(&serde_json::from_str(text).unwrap(), text, &mut Vec::new()).unwrap_err();
        assert_eq!(mismatch.path(), "$.code");
        assert!(mismatch.reason().ends_with(r#"does not match "^a.c$""#), "{mismatch}");
    }

    /// Issue 44: a schema without `$schema` was read as 2020-12, where Confluent reads draft-07: a
    /// draft-07 tuple (`items` as an array, `additionalItems`) did not compile, and the subject was
    /// unusable. It is draft-07 now; a schema that names its draft keeps it.
    #[test]
    fn a_schema_without_its_draft_is_draft_07() {
        let tuple = json!({"type": "array", "items": [{"type": "integer"}], "additionalItems": false});
        let codec = JsonSchemaCodec::parse(&tuple.to_string(), &[]).unwrap();
        codec.encode(&json!([1]), "[1]", &mut Vec::new()).unwrap();
        let extra = codec.encode(&json!([1, "x"]), r#"[1, "x"]"#, &mut Vec::new()).unwrap_err();
        assert_eq!(extra.path(), "$", "{extra}");
        let named = json!({"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "array",
            "prefixItems": [{"type": "integer"}], "items": false});
        let codec = JsonSchemaCodec::parse(&named.to_string(), &[]).unwrap();
        codec.encode(&json!([1]), "[1]", &mut Vec::new()).unwrap();
        assert!(codec.encode(&json!([1, 2]), "[1, 2]", &mut Vec::new()).is_err());
    }
}
