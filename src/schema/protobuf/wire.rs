//! The Protobuf binary encoding of a dynamic message, as protoc's runtimes write it deterministically.
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2.
//!
//! # Invariants
//! - Fields are written in field-number order (extensions among them), each repeated scalar packed where the
//!   field is (proto3's default, or `[packed = true]`), map entries in key order with both key and value
//!   (protoc's C++ runtime orders them so when deterministic; Python's upb runtime keeps its own order, so
//!   the corpus compares maps as values).
//! - A field with presence (proto2, proto3 `optional`, a oneof member, a message) is written when set, also
//!   to its default; a field without presence is written unless it is its type's zero, which for a float
//!   or a double means the bits of +0.0: -0.0 is written (prost-reflect's encoder compared with `==`).
//!
//! tests/protobuf_corpus.rs checks that Python's protobuf runtime re-serializes every corpus message to
//! exactly these bytes.

use std::borrow::Cow;

use prost_reflect::prost_types::FieldDescriptorProto;
use prost_reflect::{DynamicMessage, Kind, MapKey, ReflectMessage, Syntax, Value};

/// Wire types.
const VARINT: u32 = 0;
const FIXED64: u32 = 1;
const LEN: u32 = 2;
const START_GROUP: u32 = 3;
const END_GROUP: u32 = 4;
const FIXED32: u32 = 5;

/// What the writer needs to know of a field or an extension.
struct Slot<'a> {
    number: u32,
    kind: Kind,
    list: bool,
    map: bool,
    packed: bool,
    group: bool,
    value: Cow<'a, Value>,
}

/// Appends `message`'s encoding to `out`.
pub(super) fn message(message: &DynamicMessage, out: &mut Vec<u8>) {
    let mut slots: Vec<Slot> = Vec::new();
    for field in message.descriptor().fields() {
        if field.supports_presence() && !message.has_field(&field) {
            continue;
        }
        let value = message.get_field(&field);
        if !field.supports_presence() && is_zero(&value) {
            continue;
        }
        slots.push(Slot {
            number: field.number(),
            kind: field.kind(),
            list: field.is_list(),
            map: field.is_map(),
            packed: packed(
                field.is_list(),
                &field.kind(),
                field.field_descriptor_proto(),
                field.parent_file().syntax(),
            ),
            group: field.is_group(),
            value,
        });
    }
    for (extension, value) in message.extensions() {
        slots.push(Slot {
            number: extension.number(),
            kind: extension.kind(),
            list: extension.is_list(),
            map: extension.is_map(),
            packed: packed(
                extension.is_list(),
                &extension.kind(),
                extension.field_descriptor_proto(),
                extension.parent_file().syntax(),
            ),
            group: extension.is_group(),
            value: Cow::Borrowed(value),
        });
    }
    slots.sort_by_key(|slot| slot.number);
    for slot in &slots {
        field(slot, out);
    }
    for unknown in message.unknown_fields() {
        unknown.encode(out);
    }
}

fn field(slot: &Slot, out: &mut Vec<u8>) {
    match &*slot.value {
        Value::List(items) if slot.packed => {
            if items.is_empty() {
                return;
            }
            let mut packed = Vec::new();
            for item in items {
                scalar(&slot.kind, item, &mut packed);
            }
            tag(slot.number, LEN, out);
            length_delimited(&packed, out);
        }
        Value::List(items) => {
            for item in items {
                single(slot.number, &slot.kind, slot.group, item, out);
            }
        }
        Value::Map(entries) => {
            let entry = slot.kind.as_message().expect("a map field's kind is its entry message");
            let key_kind = entry.map_entry_key_field().kind();
            let value_kind = entry.map_entry_value_field().kind();
            let mut sorted: Vec<(&MapKey, &Value)> = entries.iter().collect();
            sorted.sort_by(|a, b| a.0.cmp(b.0));
            for (key, value) in sorted {
                let mut bytes = Vec::new();
                single(1, &key_kind, false, &map_key(key), &mut bytes);
                single(2, &value_kind, false, value, &mut bytes);
                tag(slot.number, LEN, out);
                length_delimited(&bytes, out);
            }
        }
        value if slot.map || slot.list => unreachable!("a repeated field holds {value:?}"),
        value => single(slot.number, &slot.kind, slot.group, value, out),
    }
}

/// One value with its tag.
fn single(number: u32, kind: &Kind, group: bool, value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Message(nested) if group => {
            tag(number, START_GROUP, out);
            message(nested, out);
            tag(number, END_GROUP, out);
        }
        Value::Message(nested) => {
            let mut bytes = Vec::new();
            message(nested, &mut bytes);
            tag(number, LEN, out);
            length_delimited(&bytes, out);
        }
        Value::String(text) => {
            tag(number, LEN, out);
            length_delimited(text.as_bytes(), out);
        }
        Value::Bytes(bytes) => {
            tag(number, LEN, out);
            length_delimited(bytes, out);
        }
        _ => {
            tag(number, wire_type(kind), out);
            scalar(kind, value, out);
        }
    }
}

/// A scalar's encoding without its tag (as packed lists hold them).
fn scalar(kind: &Kind, value: &Value, out: &mut Vec<u8>) {
    match (kind, value) {
        (Kind::Sint32, Value::I32(n)) => varint(((n << 1) ^ (n >> 31)) as u32 as u64, out),
        (Kind::Sint64, Value::I64(n)) => varint(((n << 1) ^ (n >> 63)) as u64, out),
        (Kind::Sfixed32, Value::I32(n)) => out.extend(n.to_le_bytes()),
        (Kind::Sfixed64, Value::I64(n)) => out.extend(n.to_le_bytes()),
        (Kind::Fixed32, Value::U32(n)) => out.extend(n.to_le_bytes()),
        (Kind::Fixed64, Value::U64(n)) => out.extend(n.to_le_bytes()),
        (Kind::Float, Value::F32(x)) => out.extend(x.to_le_bytes()),
        (Kind::Double, Value::F64(x)) => out.extend(x.to_le_bytes()),
        // A negative int32 or enum number is sign-extended to ten bytes, as every runtime writes it.
        (_, Value::I32(n) | Value::EnumNumber(n)) => varint(i64::from(*n) as u64, out),
        (_, Value::I64(n)) => varint(*n as u64, out),
        (_, Value::U32(n)) => varint(u64::from(*n), out),
        (_, Value::U64(n)) => varint(*n, out),
        (_, Value::Bool(b)) => varint(u64::from(*b), out),
        (kind, value) => unreachable!("prost-reflect holds {value:?} for a {kind:?}"),
    }
}

/// Whether a repeated field is written packed: `[packed = …]` where the field says, else packed in proto3
/// and not in proto2. prost-reflect 0.16's `is_packed` answers true for a proto3 `[packed = false]` and false
/// for a proto2 `[packed = true]` (tests/fixtures/protobuf_corpus/ has both).
fn packed(list: bool, kind: &Kind, proto: &FieldDescriptorProto, syntax: Syntax) -> bool {
    let packable = !matches!(kind, Kind::String | Kind::Bytes | Kind::Message(_));
    let option = proto.options.as_ref().and_then(|o| o.packed);
    list && packable && option.unwrap_or(syntax != Syntax::Proto2)
}

fn wire_type(kind: &Kind) -> u32 {
    match kind {
        Kind::Double | Kind::Fixed64 | Kind::Sfixed64 => FIXED64,
        Kind::Float | Kind::Fixed32 | Kind::Sfixed32 => FIXED32,
        Kind::String | Kind::Bytes | Kind::Message(_) => LEN,
        _ => VARINT,
    }
}

/// Whether a field without presence holds its zero, which is not written.
fn is_zero(value: &Value) -> bool {
    match value {
        Value::Bool(b) => !b,
        Value::I32(n) | Value::EnumNumber(n) => *n == 0,
        Value::I64(n) => *n == 0,
        Value::U32(n) => *n == 0,
        Value::U64(n) => *n == 0,
        // NOTE: the bits, not `==`: -0.0 == 0.0, and -0.0 is a value to write.
        Value::F32(x) => x.to_bits() == 0,
        Value::F64(x) => x.to_bits() == 0,
        Value::String(s) => s.is_empty(),
        Value::Bytes(b) => b.is_empty(),
        Value::List(items) => items.is_empty(),
        Value::Map(entries) => entries.is_empty(),
        Value::Message(_) => false,
    }
}

fn map_key(key: &MapKey) -> Value {
    match key {
        MapKey::Bool(b) => Value::Bool(*b),
        MapKey::I32(n) => Value::I32(*n),
        MapKey::I64(n) => Value::I64(*n),
        MapKey::U32(n) => Value::U32(*n),
        MapKey::U64(n) => Value::U64(*n),
        MapKey::String(s) => Value::String(s.clone()),
    }
}

fn tag(number: u32, wire_type: u32, out: &mut Vec<u8>) {
    varint(u64::from(number << 3 | wire_type), out);
}

fn length_delimited(bytes: &[u8], out: &mut Vec<u8>) {
    varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

fn varint(mut n: u64, out: &mut Vec<u8>) {
    while n >= 0x80 {
        out.push((n as u8 & 0x7f) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}
