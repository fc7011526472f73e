//! Which draft a registered schema is read in, where its references are, and the schema as the validator
//! must be given it to keep that draft's rules.
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2.
//!
//! # The draft
//! Confluent's registry and Java serializers read a `$schema` naming a draft, by `http` or `https`, as that
//! draft (`json-schema.org/schema`, the former "latest", as draft-04), and any other `$schema`, or none, as
//! draft-07. So does the connector, a trailing `#` or not (the drafts' own identifiers up to draft-07 have
//! it, Python's jsonschema accepts it on every draft): a schema the registry accepted is never unusable
//! here for naming a meta-schema nobody fetches.
//!
//! # What the validator is given
//! The `jsonschema` crate reads `dependencies` in 2019-09 and 2020-12 too, where it is no keyword (the
//! drafts replaced it with `dependentRequired` and `dependentSchemas`, and Python's jsonschema ignores it),
//! and its regex engines read a pattern in Rust's syntax where ECMA-262 means otherwise
//! ([`super::pattern`]). [`adapt`] walks every subschema of a schema and removes the one, rewrites the
//! other, remembering each rewritten pattern's text so a refusal names the pattern as registered.

use std::collections::HashMap;

use jsonschema::Draft;
use serde_json::Value;

use super::pattern;

/// The draft `schema`'s `$schema` names, if it names one.
pub(super) fn named_draft(schema: &Value) -> Option<Draft> {
    let uri = schema.get("$schema")?.as_str()?;
    let uri = uri.strip_suffix('#').unwrap_or(uri);
    let path = uri.strip_prefix("https://").or_else(|| uri.strip_prefix("http://"))?;
    match path {
        "json-schema.org/draft-04/schema" | "json-schema.org/schema" => Some(Draft::Draft4),
        "json-schema.org/draft-06/schema" => Some(Draft::Draft6),
        "json-schema.org/draft-07/schema" => Some(Draft::Draft7),
        "json-schema.org/draft/2019-09/schema" => Some(Draft::Draft201909),
        "json-schema.org/draft/2020-12/schema" => Some(Draft::Draft202012),
        _ => None,
    }
}

/// The root's base URL (its `$id`, `id` in draft-04) where it is absolute with an authority.
pub(super) fn base_url(schema: &Value, draft: Draft) -> Option<&str> {
    let id = schema.get(if draft == Draft::Draft4 { "id" } else { "$id" })?.as_str()?;
    let (scheme, rest) = id.split_once("://")?;
    (is_scheme(scheme) && !rest.is_empty()).then_some(id)
}

fn is_scheme(text: &str) -> bool {
    text.starts_with(|c: char| c.is_ascii_alphabetic())
        && text.bytes().all(|b| b.is_ascii_alphanumeric() || b"+.-".contains(&b))
}

/// Where a reference named `name` (relative) lies under the base URL `base` (RFC 3986 §5.2), as
/// Confluent's Java serializers register it; `None` for an absolute name or one with a fragment.
pub(super) fn resolve(base: &str, name: &str) -> Option<String> {
    if name.split_once(':').is_some_and(|(scheme, _)| is_scheme(scheme)) || name.contains('#') || name.is_empty() {
        return None;
    }
    let (scheme, rest) = base.split_once("://")?;
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    let path = &path[..path.find(['?', '#']).unwrap_or(path.len())];
    let merged = match name.strip_prefix("//") {
        Some(network) => return Some(format!("{scheme}://{network}")),
        None if name.starts_with('/') => name.to_string(),
        None => format!("{}{name}", &path[..path.rfind('/').map_or(0, |i| i + 1)]),
    };
    let merged = if merged.starts_with('/') { merged } else { format!("/{merged}") };
    Some(format!("{scheme}://{authority}{}", remove_dot_segments(&merged)))
}

/// RFC 3986 §5.2.4, on a path starting with `/`.
fn remove_dot_segments(path: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    for (i, segment) in segments.iter().enumerate() {
        let last = i + 1 == segments.len();
        match *segment {
            "." if last => out.push(""),
            "." => {}
            ".." => {
                out.pop();
                if last {
                    out.push("");
                }
            }
            other => out.push(other),
        }
    }
    format!("/{}", out.join("/"))
}

/// Keywords whose value is a schema, or an array of schemas.
const SUBSCHEMA: [&str; 16] = [
    "items",
    "prefixItems",
    "additionalItems",
    "contains",
    "allOf",
    "anyOf",
    "oneOf",
    "not",
    "if",
    "then",
    "else",
    "additionalProperties",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
    "contentSchema",
];

/// Keywords whose value maps names (or patterns) to schemas.
const SUBSCHEMA_MAP: [&str; 6] =
    ["properties", "patternProperties", "definitions", "$defs", "dependentSchemas", "dependencies"];

/// `schema` (read in `draft`) as the validator keeps that draft's rules with it (see the module doc);
/// `patterns` gets the registered text of each rewritten pattern, by its rewritten text.
pub(super) fn adapt(schema: &mut Value, draft: Draft, patterns: &mut HashMap<String, String>) {
    let draft = named_draft(schema).unwrap_or(draft);
    let Value::Object(map) = schema else { return };
    if matches!(draft, Draft::Draft201909 | Draft::Draft202012) {
        map.remove("dependencies");
    }
    if let Some(Value::String(text)) = map.get_mut("pattern") {
        if let Some(rewritten) = pattern::rewrite(text) {
            patterns.insert(rewritten.clone(), std::mem::replace(text, rewritten));
        }
    }
    if let Some(Value::Object(by_pattern)) = map.get_mut("patternProperties") {
        *by_pattern = std::mem::take(by_pattern)
            .into_iter()
            .map(|(text, subschema)| (pattern::rewrite(&text).unwrap_or(text), subschema))
            .collect();
    }
    for (keyword, value) in map.iter_mut() {
        match (keyword.as_str(), value) {
            (k, Value::Array(subschemas)) if SUBSCHEMA.contains(&k) => {
                subschemas.iter_mut().for_each(|s| adapt(s, draft, patterns));
            }
            (k, Value::Object(by_name)) if SUBSCHEMA_MAP.contains(&k) => {
                by_name.values_mut().for_each(|s| adapt(s, draft, patterns));
            }
            (k, subschema) if SUBSCHEMA.contains(&k) => adapt(subschema, draft, patterns),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Confluent's reading: http or https, with or without `#`, the former "latest" draft-04; anything else
    /// names no draft.
    #[test]
    fn a_draft_is_named_as_confluent_names_it() {
        for (uri, draft) in [
            ("http://json-schema.org/draft-04/schema#", Some(Draft::Draft4)),
            ("http://json-schema.org/schema#", Some(Draft::Draft4)),
            ("https://json-schema.org/draft-07/schema#", Some(Draft::Draft7)),
            ("http://json-schema.org/draft-07/schema", Some(Draft::Draft7)),
            ("https://json-schema.org/draft/2020-12/schema", Some(Draft::Draft202012)),
            ("http://json-schema.org/draft/2019-09/schema#", Some(Draft::Draft201909)),
            ("https://acme.example/meta.json", None),
            ("json-schema.org/draft-07/schema", None),
        ] {
            assert_eq!(named_draft(&json!({ "$schema": uri })), draft, "{uri}");
        }
        assert_eq!(named_draft(&json!({})), None);
    }

    /// A reference's name under the root's `$id`, as `java.net.URI#resolve` places it.
    #[test]
    fn a_relative_name_lies_under_the_base() {
        let base = "https://acme.example/schemas/order.json";
        for (name, url) in [
            ("customer.json", Some("https://acme.example/schemas/customer.json")),
            ("./customer.json", Some("https://acme.example/schemas/customer.json")),
            ("../common/money.json", Some("https://acme.example/common/money.json")),
            ("/root.json", Some("https://acme.example/root.json")),
            ("//cdn.example/x.json", Some("https://cdn.example/x.json")),
            ("https://other.example/x.json", None),
            ("urn:acme:x", None),
            ("x.json#/definitions/a", None),
        ] {
            assert_eq!(resolve(base, name).as_deref(), url, "{name}");
        }
        assert_eq!(resolve("https://acme.example", "x.json").as_deref(), Some("https://acme.example/x.json"));
        assert_eq!(base_url(&json!({"$id": base}), Draft::Draft7), Some(base));
        assert_eq!(base_url(&json!({"id": base}), Draft::Draft4), Some(base));
        assert_eq!(base_url(&json!({"$id": "order.json"}), Draft::Draft7), None);
        assert_eq!(base_url(&json!({"$id": "urn:acme:order"}), Draft::Draft7), None);
    }

    /// `dependencies` goes from 2019-09 and 2020-12 schemas only; patterns are rewritten at every depth and
    /// nowhere else (not in `const`, not a property named `pattern`).
    #[test]
    fn the_schema_is_adapted_where_it_holds_schemas() {
        let mut schema = json!({
            "dependencies": {"a": ["b"]},
            "properties": {"pattern": {"pattern": "^.$"}, "c": {"const": {"pattern": "^.$"}}},
            "patternProperties": {"^x.$": {"items": [{"pattern": "\\d"}]}},
            "$defs": {"old": {"$schema": "http://json-schema.org/draft-07/schema#", "dependencies": {"a": ["b"]}}}
        });
        let mut patterns = HashMap::new();
        adapt(&mut schema, Draft::Draft202012, &mut patterns);
        let dot = "[^\\n\\r\u{2028}\u{2029}]";
        assert_eq!(
            schema,
            json!({
                "properties": {"pattern": {"pattern": format!("^{dot}$")}, "c": {"const": {"pattern": "^.$"}}},
                "patternProperties": {format!("^x{dot}$"): {"items": [{"pattern": "[0-9]"}]}},
                "$defs": {"old": {"$schema": "http://json-schema.org/draft-07/schema#", "dependencies": {"a": ["b"]}}}
            })
        );
        assert_eq!(patterns.get(&format!("^{dot}$")).map(String::as_str), Some("^.$"));
    }
}
