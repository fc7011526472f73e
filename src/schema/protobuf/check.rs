//! The rules a payload must keep beyond what prost-reflect's JSON reader checks, each of which it broke
//! silently (tests/protobuf_corpus.rs has a case for each).
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2.
//!
//! - A proto2 `required` field is present (JSON `null` is absent): protoc's runtimes refuse a message
//!   without it ("missing required fields"); prost-reflect wrote it without.
//! - A field is given once, by one of its names, and a map key once (also `"1"` and `"01"` for an
//!   integer key), and so is a key of a `Struct` or an `Any`: prost-reflect kept the last.
//! - A 64-bit integer field holds the number its text says: a number serde_json reads as a double (a fraction,
//!   an exponent, or more than 64 bits: `-9223372036854775809`, `18446744073709551616`) is refused from 2⁵³
//!   on, where a double no longer holds every integer. prost-reflect took the double, and saturated it to
//!   the type's limit (its range check compares with the limit `as f64`, which is 2⁶³ or 2⁶⁴).
//! - A float or double given as text holds it: `"3.5e38"` for a float, `"1e400"` for a double became
//!   infinity (the number forms were refused; `"Infinity"` stays infinity).
//! - A proto2 enum is closed: a number it does not define was written, and readers put it into the
//!   message's unknown fields, so the field reads as unset.
//!
//! The payload is read a second time, into a tree that keeps every key as the text spells it (a
//! `serde_json::Value` keeps one of two equal keys), after prost-reflect has read it without error: a
//! value of the wrong type is its mismatch, with its reason.

use std::collections::HashMap;
use std::fmt;

use prost_reflect::{FieldDescriptor, Kind, MessageDescriptor, Syntax};
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Number;

use crate::schema::avro::Mismatch;

/// A JSON value with every object key kept, in order, duplicates too.
enum Json {
    Null,
    Bool,
    Number(Number),
    String(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

/// Checks the payload `text`, which prost-reflect has read as `message` without error.
///
/// # Errors
/// The first rule the payload breaks, at its path.
pub(super) fn payload(message: &MessageDescriptor, text: &str) -> Result<(), Mismatch> {
    let json: Json = serde_json::from_str(text).map_err(|e| Mismatch::new(e.to_string()))?;
    check_message(message, &json)
}

fn check_message(message: &MessageDescriptor, json: &Json) -> Result<(), Mismatch> {
    match message.full_name() {
        "google.protobuf.Any" => check_any(message, json),
        "google.protobuf.Struct" => check_struct(json),
        "google.protobuf.Value" => check_value(json),
        "google.protobuf.ListValue" => check_list_value(json),
        "google.protobuf.Int64Value" => check_kind(&Kind::Int64, json),
        "google.protobuf.UInt64Value" => check_kind(&Kind::Uint64, json),
        "google.protobuf.FloatValue" => check_kind(&Kind::Float, json),
        "google.protobuf.DoubleValue" => check_kind(&Kind::Double, json),
        // The other well-known types have JSON forms prost-reflect reads whole.
        name if is_well_known(name) => Ok(()),
        _ => match json {
            Json::Object(entries) => check_fields(message, entries.iter().map(|(k, v)| (k.as_str(), v))),
            _ => Ok(()),
        },
    }
}

fn is_well_known(name: &str) -> bool {
    matches!(
        name,
        "google.protobuf.Timestamp"
            | "google.protobuf.Duration"
            | "google.protobuf.FieldMask"
            | "google.protobuf.Empty"
            | "google.protobuf.Int32Value"
            | "google.protobuf.UInt32Value"
            | "google.protobuf.BoolValue"
            | "google.protobuf.StringValue"
            | "google.protobuf.BytesValue"
    )
}

/// The members of a message's JSON object: each field once, required ones present, each value checked.
fn check_fields<'a>(
    message: &MessageDescriptor,
    entries: impl Iterator<Item = (&'a str, &'a Json)>,
) -> Result<(), Mismatch> {
    let mut given: HashMap<u32, &str> = HashMap::new();
    let mut present: Vec<u32> = Vec::new();
    for (key, value) in entries {
        let Some(field) = message.get_field_by_json_name(key).or_else(|| message.get_field_by_name(key)) else {
            continue; // an extension's `[name]`; prost-reflect has refused an unknown key
        };
        if let Some(first) = given.insert(field.number(), key) {
            let reason = match first == key {
                true => format!("the field {} is given twice", field.name()),
                false => format!("the field {} is given twice (as {first:?} and as {key:?})", field.name()),
            };
            return Err(Mismatch::new(reason).in_field(key));
        }
        if let Json::Null = value {
            continue;
        }
        present.push(field.number());
        check_field(&field, value).map_err(|m| m.in_field(key))?;
    }
    if let Some(missing) = message.fields().find(|f| f.is_required() && !present.contains(&f.number())) {
        return Err(Mismatch::new(format!(
            "the required field {} (JSON {:?}) of {} is missing: a reader refuses the message without it",
            missing.name(),
            missing.json_name(),
            message.full_name()
        )));
    }
    Ok(())
}

fn check_field(field: &FieldDescriptor, json: &Json) -> Result<(), Mismatch> {
    match json {
        Json::Object(entries) if field.is_map() => {
            let entry = field.kind();
            let entry = entry.as_message().expect("a map field's kind is its entry message");
            let key_kind = entry.map_entry_key_field().kind();
            let value_kind = entry.map_entry_value_field().kind();
            let mut keys: HashMap<MapKeyText, &str> = HashMap::new();
            for (key, value) in entries {
                if let Some(first) = keys.insert(MapKeyText::of(&key_kind, key), key) {
                    let reason = match first == key {
                        true => format!("the map key {key:?} is given twice"),
                        false => format!("the map key {key:?} is given twice (also as {first:?})"),
                    };
                    return Err(Mismatch::new(reason).in_field(key));
                }
                check_kind(&value_kind, value).map_err(|m| m.in_field(key))?;
            }
            Ok(())
        }
        Json::Array(items) if field.is_list() => {
            for (index, item) in items.iter().enumerate() {
                check_kind(&field.kind(), item).map_err(|m| m.in_item(index))?;
            }
            Ok(())
        }
        json => check_kind(&field.kind(), json),
    }
}

/// A map key as the value it names: `"1"` and `"01"` are one integer key.
#[derive(PartialEq, Eq, Hash)]
enum MapKeyText {
    Signed(i64),
    Unsigned(u64),
    Text(String),
}

impl MapKeyText {
    fn of(kind: &Kind, key: &str) -> Self {
        let signed =
            matches!(kind, Kind::Int32 | Kind::Int64 | Kind::Sint32 | Kind::Sint64 | Kind::Sfixed32 | Kind::Sfixed64);
        let unsigned = matches!(kind, Kind::Uint32 | Kind::Uint64 | Kind::Fixed32 | Kind::Fixed64);
        match (signed, unsigned) {
            (true, _) => key.parse().map_or_else(|_| MapKeyText::Text(key.to_string()), MapKeyText::Signed),
            (_, true) => key.parse().map_or_else(|_| MapKeyText::Text(key.to_string()), MapKeyText::Unsigned),
            _ => MapKeyText::Text(key.to_string()),
        }
    }
}

/// 2⁵³: every integer up to it is a double.
const TWO_53: f64 = 9_007_199_254_740_992.0;

fn check_kind(kind: &Kind, json: &Json) -> Result<(), Mismatch> {
    match (kind, json) {
        (_, Json::Null) => Ok(()),
        (Kind::Message(message), json) => check_message(message, json),
        (Kind::Int64 | Kind::Sint64 | Kind::Sfixed64, Json::Number(n)) => integer(n, "int64"),
        (Kind::Uint64 | Kind::Fixed64, Json::Number(n)) => integer(n, "uint64"),
        (Kind::Float, Json::String(text)) => floating(text, f64::from(f32::MAX), "float"),
        (Kind::Double, Json::String(text)) => floating(text, f64::MAX, "double"),
        (Kind::Enum(e), Json::Number(n)) if e.parent_file().syntax() == Syntax::Proto2 => {
            match n.as_i64().and_then(|n| i32::try_from(n).ok()).and_then(|n| e.get_value(n)) {
                Some(_) => Ok(()),
                None => Err(Mismatch::new(format!(
                    "{n} is not a value of the enum {}: a proto2 enum is closed, and a reader would put the \
                     number into the message's unknown fields (the field would read as unset)",
                    e.full_name()
                ))),
            }
        }
        _ => Ok(()),
    }
}

/// A number serde_json could read only as a double (a fraction, an exponent, or an integer beyond 64 bits)
/// is exactly the integer its text says only below 2⁵³.
fn integer(n: &Number, kind: &str) -> Result<(), Mismatch> {
    match n.as_f64() {
        Some(x) if n.is_f64() && x.abs() >= TWO_53 => Err(Mismatch::new(format!(
            "{n} is read as a double, which is not exactly an integer of its text beyond 2^53 (and may be beyond \
             the range of {kind}): write the integer's digits, as a number or a string"
        ))),
        _ => Ok(()), // an integer serde_json read exactly: prost-reflect checked its range
    }
}

/// Text with digits that reads as a number beyond `max`: not an infinity the JSON mapping spells.
fn floating(text: &str, max: f64, kind: &str) -> Result<(), Mismatch> {
    match text.parse::<f64>() {
        Ok(x) if x.abs() > max && text.bytes().any(|b| b.is_ascii_digit()) => {
            Err(Mismatch::new(format!("{text:?} is beyond the range of {kind} (write \"Infinity\" for infinity)")))
        }
        _ => Ok(()),
    }
}

/// `Any`: its keys once; the message `@type` names, with its members (or its JSON form under `value`).
fn check_any(any: &MessageDescriptor, json: &Json) -> Result<(), Mismatch> {
    let Json::Object(entries) = json else { return Ok(()) };
    once(entries)?;
    let type_url = entries.iter().find_map(|(k, v)| match (k.as_str(), v) {
        ("@type", Json::String(url)) => Some(url.as_str()),
        _ => None,
    });
    let name = type_url.and_then(|url| url.rsplit_once('/')).map_or("", |(_, name)| name);
    let Some(packed) = any.parent_pool().get_message_by_name(name) else { return Ok(()) };
    let mut members = entries.iter().filter(|(k, _)| k != "@type");
    match packed.full_name().starts_with("google.protobuf.") {
        true => match members.find(|(k, _)| k == "value") {
            Some((_, value)) => check_message(&packed, value).map_err(|m| m.in_field("value")),
            None => Ok(()),
        },
        false => check_fields(&packed, members.map(|(k, v)| (k.as_str(), v))),
    }
}

fn check_struct(json: &Json) -> Result<(), Mismatch> {
    let Json::Object(entries) = json else { return Ok(()) };
    once(entries)?;
    for (key, value) in entries {
        check_value(value).map_err(|m| m.in_field(key))?;
    }
    Ok(())
}

fn check_value(json: &Json) -> Result<(), Mismatch> {
    match json {
        Json::Object(_) => check_struct(json),
        Json::Array(_) => check_list_value(json),
        _ => Ok(()),
    }
}

fn check_list_value(json: &Json) -> Result<(), Mismatch> {
    let Json::Array(items) = json else { return Ok(()) };
    for (index, item) in items.iter().enumerate() {
        check_value(item).map_err(|m| m.in_item(index))?;
    }
    Ok(())
}

/// Each key of an object once.
fn once(entries: &[(String, Json)]) -> Result<(), Mismatch> {
    let mut seen: Vec<&str> = Vec::with_capacity(entries.len());
    for (key, _) in entries {
        if seen.contains(&key.as_str()) {
            return Err(Mismatch::new(format!("the key {key:?} is given twice")).in_field(key));
        }
        seen.push(key);
    }
    Ok(())
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(JsonVisitor)
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Json;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }

    fn visit_bool<E>(self, _: bool) -> Result<Json, E> {
        Ok(Json::Bool)
    }

    fn visit_i64<E>(self, n: i64) -> Result<Json, E> {
        Ok(Json::Number(n.into()))
    }

    fn visit_u64<E>(self, n: u64) -> Result<Json, E> {
        Ok(Json::Number(n.into()))
    }

    fn visit_f64<E: serde::de::Error>(self, x: f64) -> Result<Json, E> {
        Number::from_f64(x).map(Json::Number).ok_or_else(|| E::custom("a JSON number is finite"))
    }

    fn visit_str<E>(self, s: &str) -> Result<Json, E> {
        Ok(Json::String(s.to_string()))
    }

    fn visit_string<E>(self, s: String) -> Result<Json, E> {
        Ok(Json::String(s))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Json::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
        let mut entries = Vec::new();
        while let Some(entry) = map.next_entry::<String, Json>()? {
            entries.push(entry);
        }
        Ok(Json::Object(entries))
    }
}
