//! What apache-avro's schema model does not carry, read from the schema text before apache-avro parses it.
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2.
//!
//! apache-avro 0.21 turns a `fixed` with a logical type into a type without the fixed's name (`Decimal`
//! over it, `Uuid`, `Duration`): a second reference to the name then finds the plain fixed, and a decimal
//! was written there as raw text (issue 44, finding 1); a uuid `fixed(16)` became the string-based `Uuid`,
//! 37 bytes where readers take 16 (finding 2). And it refuses a field default written as the
//! specification says: a default is in the *underlying* type's JSON encoding, so a decimal's is its bytes
//! (`"\u0000"`), which apache-avro checks as a decimal and refuses, making the whole subject unusable
//! (finding 4). So before apache-avro sees a schema text, [`amend`] takes out of it, and keeps by full name:
//! - the logical type of every `fixed`: apache-avro then sees a plain named fixed, every reference finds
//!   it, and the writer looks the meaning up by the fixed's full name;
//! - the default of every record field: the writer writes it in the underlying type's JSON encoding, and
//!   [`super::AvroCodec::parse`] proves each one by writing it once.
//!
//! Neither changes what apache-avro knows of a datum's layout (names, types, field order).
//!
//! # Refused here
//! A decimal whose precision or scale is invalid (precision < 1, scale > precision, or more digits than
//! the fixed holds), and a uuid or duration `fixed` of the wrong size. The specification lets readers
//! ignore such a logical type, and they differ in whether they do: a value in them could not be written
//! so that every reader reads the same, so the schema is refused with the reason.

use std::collections::HashMap;

use serde_json::{Map, Value};

/// The meaning of a `fixed` with a logical type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FixedMeaning {
    /// Two's-complement big-endian unscaled integer, sign-extended to the size.
    Decimal { precision: usize, scale: usize },
    /// The UUID's 16 bytes (Avro 1.12).
    Uuid,
    /// Months, days, milliseconds: three little-endian `u32`.
    Duration,
}

/// What [`amend`] took out of the schema texts.
#[derive(Debug, Default)]
pub(super) struct Meaning {
    /// By the fixed's full name.
    pub(super) fixed: HashMap<String, FixedMeaning>,
    /// By record full name, then field name.
    pub(super) defaults: HashMap<String, HashMap<String, Value>>,
}

/// The text apache-avro parses: `text` without logical types on `fixed` and without field defaults,
/// which go to `meaning`.
///
/// # Errors
/// Text that is not JSON, a named type without a name, or a logical type no reader can agree on (see the
/// module docs).
pub(super) fn amend(text: &str, meaning: &mut Meaning) -> Result<String, String> {
    let mut schema: Value = serde_json::from_str(text).map_err(|e| format!("the schema is not JSON: {e}"))?;
    walk(&mut schema, None, meaning)?;
    Ok(schema.to_string())
}

fn walk(schema: &mut Value, enclosing: Option<&str>, meaning: &mut Meaning) -> Result<(), String> {
    let object = match schema {
        Value::Array(branches) => return branches.iter_mut().try_for_each(|b| walk(b, enclosing, meaning)),
        Value::Object(object) => object,
        _ => return Ok(()),
    };
    let kind = match object.get("type") {
        Some(Value::String(kind)) => kind.clone(),
        Some(Value::Object(_) | Value::Array(_)) => {
            return walk(object.get_mut("type").expect("just read"), enclosing, meaning);
        }
        _ => return Ok(()),
    };
    match kind.as_str() {
        "record" | "error" => {
            let (full, namespace) = full_name(object, enclosing)?;
            for field in object.get_mut("fields").and_then(Value::as_array_mut).into_iter().flatten() {
                let Value::Object(field) = field else { continue };
                let name = field.get("name").and_then(Value::as_str).unwrap_or_default().to_string();
                if let Some(default) = field.remove("default") {
                    meaning.defaults.entry(full.clone()).or_default().insert(name, default);
                }
                if let Some(field_type) = field.get_mut("type") {
                    walk(field_type, namespace.as_deref(), meaning)?;
                }
            }
        }
        "fixed" => {
            let (full, _) = full_name(object, enclosing)?;
            let size = object.get("size").and_then(Value::as_u64).unwrap_or(0) as usize;
            let fixed = match object.remove("logicalType").as_ref().and_then(Value::as_str) {
                Some("decimal") => {
                    let (precision, scale) = decimal(object, &format!("fixed {full}"))?;
                    let holds = max_digits(size);
                    if precision > holds {
                        return Err(format!(
                            "fixed {full}: a decimal of precision {precision} needs more than its {size} bytes \
                             (they hold {holds} digits)"
                        ));
                    }
                    Some(FixedMeaning::Decimal { precision, scale })
                }
                Some("uuid") if size == 16 => Some(FixedMeaning::Uuid),
                Some("duration") if size == 12 => Some(FixedMeaning::Duration),
                Some(logical @ ("uuid" | "duration")) => {
                    let needs = if logical == "uuid" { 16 } else { 12 };
                    return Err(format!("fixed {full}: the {logical} logical type needs size {needs}, not {size}"));
                }
                // An unknown logical type: the specification's readers use the plain fixed.
                _ => None,
            };
            if let Some(fixed) = fixed {
                meaning.fixed.insert(full, fixed);
            }
        }
        "bytes" if object.get("logicalType").and_then(Value::as_str) == Some("decimal") => {
            decimal(object, "bytes")?;
        }
        "array" => {
            if let Some(items) = object.get_mut("items") {
                walk(items, enclosing, meaning)?;
            }
        }
        "map" => {
            if let Some(values) = object.get_mut("values") {
                walk(values, enclosing, meaning)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// The full name and namespace of the named type defined by `object` inside namespace `enclosing`.
fn full_name(object: &Map<String, Value>, enclosing: Option<&str>) -> Result<(String, Option<String>), String> {
    let name = object.get("name").and_then(Value::as_str).ok_or("a named type (record, enum, fixed) has no name")?;
    if let Some((namespace, _)) = name.rsplit_once('.') {
        return Ok((name.to_string(), Some(namespace.to_string())));
    }
    let namespace = match object.get("namespace").and_then(Value::as_str) {
        Some("") => None,
        Some(namespace) => Some(namespace.to_string()),
        None => enclosing.map(str::to_string),
    };
    Ok(match &namespace {
        Some(namespace) => (format!("{namespace}.{name}"), Some(namespace.clone())),
        None => (name.to_string(), None),
    })
}

/// A decimal's precision and scale, checked.
fn decimal(object: &Map<String, Value>, what: &str) -> Result<(usize, usize), String> {
    let precision = object.get("precision").and_then(Value::as_u64).unwrap_or(0) as usize;
    let scale = match object.get("scale") {
        None => 0,
        Some(scale) => {
            scale.as_u64().ok_or_else(|| format!("{what}: the decimal's scale {scale} is not a count"))? as usize
        }
    };
    if precision < 1 || scale > precision {
        return Err(format!(
            "{what}: a decimal needs a precision of at least 1 and a scale no greater than it (precision {}, \
             scale {scale})",
            object.get("precision").map_or("missing".to_string(), Value::to_string)
        ));
    }
    Ok((precision, scale))
}

/// The number of decimal digits a two's-complement integer of `size` bytes always holds:
/// ⌊log10(2^(8·size−1) − 1)⌋ (8 bytes: 18, 16 bytes: 38).
fn max_digits(size: usize) -> usize {
    if size == 0 {
        return 0;
    }
    ((8 * size - 1) as f64 * std::f64::consts::LOG10_2).floor() as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_logical_types_and_defaults_move_out_of_the_text() {
        let mut meaning = Meaning::default();
        let text = r#"{"type": "record", "name": "Order", "namespace": "shop", "fields": [
            {"name": "total", "type": {"type": "fixed", "name": "Money", "size": 8, "logicalType": "decimal",
                "precision": 18, "scale": 2}, "default": "\u0000\u0000\u0000\u0000\u0000\u0000\u0000\u0000"},
            {"name": "id", "type": {"type": "fixed", "name": "x.Id", "size": 16, "logicalType": "uuid"}},
            {"name": "line", "type": {"type": "record", "name": "Line", "fields": [
                {"name": "d", "type": {"type": "fixed", "name": "D", "namespace": "", "size": 12,
                    "logicalType": "duration"}, "default": "abcdefghijkl"}]}}]}"#;
        let amended = amend(text, &mut meaning).unwrap();
        assert!(!amended.contains("logicalType") && !amended.contains("default"), "{amended}");
        assert_eq!(meaning.fixed["shop.Money"], FixedMeaning::Decimal { precision: 18, scale: 2 });
        assert_eq!(meaning.fixed["x.Id"], FixedMeaning::Uuid);
        assert_eq!(meaning.fixed["D"], FixedMeaning::Duration);
        assert!(meaning.defaults["shop.Order"].contains_key("total"));
        assert!(meaning.defaults["shop.Line"].contains_key("d"));
    }

    #[test]
    fn logical_types_no_reader_agrees_on_are_refused() {
        for (schema, reason) in [
            (
                r#"{"type": "fixed", "name": "M", "size": 8, "logicalType": "decimal", "precision": 19}"#,
                "hold 18 digits",
            ),
            (r#"{"type": "fixed", "name": "U", "size": 36, "logicalType": "uuid"}"#, "needs size 16"),
            (r#"{"type": "fixed", "name": "D", "size": 16, "logicalType": "duration"}"#, "needs size 12"),
            (r#"{"type": "bytes", "logicalType": "decimal", "precision": 2, "scale": 3}"#, "scale no greater"),
        ] {
            let refused = amend(schema, &mut Meaning::default()).unwrap_err();
            assert!(refused.contains(reason), "{schema}: {refused}");
        }
        assert_eq!(max_digits(2), 4);
        assert_eq!(max_digits(16), 38);
    }
}
