//! JSON Schema: the payload validated against its registered schema, then framed as it is (the row's
//! JSON text, unchanged).
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2.
//!
//! The `jsonschema` crate validates (drafts 4 to 2020-12, the draft the schema's `$schema` names, draft-07
//! otherwise: the draft Confluent's serializers and registry assume for a schema that names none, where
//! `items: [...]` is a tuple and `definitions` the place for subschemas). Referenced schemas come from the registry, each under the name its reference gives
//! (the `$ref` URL); nothing is fetched from the network or the disk on a schema's say-so.

use serde_json::Value;

use super::avro::Mismatch;

/// A compiled JSON Schema.
pub struct JsonSchemaCodec {
    validator: jsonschema::Validator,
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
    /// Why the schema or a reference is not a JSON Schema the validator accepts.
    pub fn parse(schema: &str, references: &[(String, String)]) -> Result<Self, String> {
        let schema: Value = serde_json::from_str(schema).map_err(|e| format!("not JSON: {e}"))?;
        let mut options = jsonschema::options();
        if schema.get("$schema").is_none() {
            options = options.with_draft(jsonschema::Draft::Draft7);
        }
        for (name, text) in references {
            let contents: Value =
                serde_json::from_str(text).map_err(|e| format!("reference {name:?} is not JSON: {e}"))?;
            options = options.with_resource(name.clone(), jsonschema::Resource::from_contents(contents));
        }
        let validator = options.build(&schema).map_err(|e| e.to_string())?;
        Ok(JsonSchemaCodec { validator })
    }

    /// Validates `payload` and appends `text` (its JSON as the row holds it) to `out`.
    ///
    /// # Errors
    /// The first place the payload breaks the schema, with the validator's reason.
    pub fn encode(&self, payload: &Value, text: &str, out: &mut Vec<u8>) -> Result<(), Mismatch> {
        if let Some(error) = self.validator.iter_errors(payload).next() {
            return Err(at_pointer(payload, error.instance_path().as_str(), error.to_string()));
        }
        out.extend_from_slice(text.as_bytes());
        Ok(())
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
