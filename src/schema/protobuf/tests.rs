//! Unit tests of the Protobuf writer; the proof against protoc and Python is tests/protobuf_corpus.rs.

use super::*;

const MONEY: &str = r#"syntax = "proto3"; package acme; message Money { string currency = 1; int64 units = 2; }"#;
const ORDER: &str = r#"syntax = "proto3"; package acme.orders; import "acme/money.proto";
    import "google/protobuf/timestamp.proto";
    message OrderCreated {
      message Line { string sku = 1; int32 qty = 2; }
      enum Status { NEW = 0; PAID = 1; }
      string order_id = 1; repeated Line lines = 2; acme.Money total = 3; Status status = 4;
      google.protobuf.Timestamp placed_at = 5; map<string, string> attributes = 6;
    }
    message Other { string x = 1; }"#;

fn codec() -> ProtobufCodec {
    ProtobufCodec::parse(ORDER, &[("acme/money.proto".to_string(), MONEY.to_string())]).unwrap()
}

/// The message the event type names, nested and imported messages, a well-known type, from canonical
/// JSON; the bytes read back with prost-reflect's decoder equal the JSON.
#[test]
fn canonical_json_becomes_the_named_message() {
    let codec = codec();
    assert_eq!(codec.message_name("OrderCreated").unwrap(), "acme.orders.OrderCreated");
    let json = r#"{"orderId": "o-1", "lines": [{"sku": "A", "qty": 2}], "total": {"currency": "CHF", "units": "12"},
        "status": "PAID", "placedAt": "2026-12-03T12:34:56.123Z", "attributes": {"k": "v"}}"#;
    let mut out = Vec::new();
    codec.encode("OrderCreated", json, &mut out).unwrap();
    assert_eq!(out[0], 0, "message index [0]");
    let read = DynamicMessage::decode(codec.top_level[0].clone(), &out[1..]).unwrap();
    let back: serde_json::Value = serde_json::to_value(&read).unwrap();
    let want: serde_json::Value = serde_json::from_str(json).unwrap();
    assert_eq!(back, want);
}

/// A row whose event type names another top-level message is written as that message, behind its
/// index: `[1]` is the count 1 and the index 1, each a zigzag varint.
#[test]
fn the_event_type_names_the_message() {
    let codec = codec();
    assert_eq!(codec.message_name("Other").unwrap(), "acme.orders.Other");
    let mut out = Vec::new();
    codec.encode("Other", r#"{"x": "y"}"#, &mut out).unwrap();
    assert_eq!(out[..2], [2, 2], "message index [1]");
    let read = DynamicMessage::decode(codec.top_level[1].clone(), &out[2..]).unwrap();
    assert_eq!(serde_json::to_value(&read).unwrap(), serde_json::json!({"x": "y"}));
    let wrong = codec.encode("Other", r#"{"orderId": "o-1"}"#, &mut Vec::new()).unwrap_err();
    assert!(wrong.reason().contains("orderId"), "{wrong}");
}

/// Issue 44: an event type that names none of several messages was written as the first message,
/// and a full name (the `record_name` preset's event type) found none. The only message of a schema
/// is written whatever the event type.
#[test]
fn the_event_type_picks_among_several_messages_or_is_refused() {
    let codec = codec();
    assert_eq!(codec.message_name("acme.orders.Other").unwrap(), "acme.orders.Other");
    let mut out = Vec::new();
    codec.encode("acme.orders.Other", r#"{"x": "y"}"#, &mut out).unwrap();
    assert_eq!(out[..2], [2, 2], "message index [1]");
    let refused = codec.encode("OrderPlaced", r#"{"orderId": "o-1"}"#, &mut Vec::new()).unwrap_err();
    assert_eq!(refused.path(), "$");
    assert!(refused.reason().contains("names none of the schema's messages"), "{refused}");
    assert!(refused.reason().contains("acme.orders.OrderCreated, acme.orders.Other"), "{refused}");
    let single = ProtobufCodec::parse(MONEY, &[]).unwrap();
    assert_eq!(single.message_name("MoneyMoved").unwrap(), "acme.Money");
}

/// Issue 44: a double was read through serde_json's fast float parser, one unit in the last place off.
#[test]
fn doubles_are_read_exactly() {
    let codec = ProtobufCodec::parse(r#"syntax = "proto3"; message M { double d = 1; }"#, &[]).unwrap();
    let mut out = Vec::new();
    codec.encode("M", r#"{"d": 0.9999999999999999}"#, &mut out).unwrap();
    // Message index [0], then field 1 as a fixed64 (tag 0x09) and the double's little-endian bits.
    let mut want = vec![0, 0x09];
    want.extend(0.9999999999999999f64.to_le_bytes());
    assert_eq!(out, want);
}

#[test]
fn message_indexes_are_zigzag_varints() {
    for (indexes, bytes) in [
        (vec![0], vec![0]),
        (vec![1], vec![2, 2]),
        (vec![63], vec![2, 126]),
        (vec![64], vec![2, 0x80, 1]),
        (vec![130], vec![2, 0x84, 2]),
        // A nested message: the count 2, then its path.
        (vec![0, 0], vec![4, 0, 0]),
        (vec![1, 2, 3], vec![6, 2, 4, 6]),
    ] {
        let mut out = Vec::new();
        write_message_indexes(&indexes, &mut out);
        assert_eq!(out, bytes, "{indexes:?}");
    }
}

/// A nested message named by its full name (the `record_name` preset's event type) is written behind its
/// path of indexes; its simple name alone names nothing, and the only top-level message is still the one
/// any other event type gets.
#[test]
fn a_nested_message_is_chosen_by_its_full_name() {
    let codec = codec();
    assert_eq!(codec.message_name("acme.orders.OrderCreated.Line").unwrap(), "acme.orders.OrderCreated.Line");
    let mut out = Vec::new();
    codec.encode("acme.orders.OrderCreated.Line", r#"{"sku": "A"}"#, &mut out).unwrap();
    assert_eq!(out[..3], [4, 0, 0], "message index [0, 0]");
    assert!(codec.encode("Line", r#"{"sku": "A"}"#, &mut Vec::new()).is_err());
    let single = ProtobufCodec::parse(r#"syntax = "proto3"; message A { message B { int32 b = 1; } B b = 1; }"#, &[]);
    let single = single.unwrap();
    assert_eq!(single.message_name("Anything").unwrap(), "A");
    assert_eq!(single.message_name("A.B").unwrap(), "A.B");
}

/// The rules prost-reflect's reader does not keep, each at its path (tests/protobuf_corpus.rs shows what
/// Python's runtime makes of them).
#[test]
fn what_prost_reflect_let_through_is_refused() {
    let proto2 = r#"syntax = "proto2"; message M { required string id = 1; optional Sub sub = 2;
        message Sub { required int32 n = 1; } enum E { A = 1; } optional E e = 3; optional int64 big = 4;
        map<int32, string> m = 5; optional float f = 6; }"#;
    let codec = ProtobufCodec::parse(proto2, &[]).unwrap();
    for (json, path, reason) in [
        (r#"{}"#, "$", "required field id"),
        (r#"{"id": null}"#, "$", "required field id"),
        (r#"{"id": "x", "sub": {}}"#, "$.sub", "required field n"),
        (r#"{"id": "x", "e": 2}"#, "$.e", "closed"),
        (r#"{"id": "x", "big": -9223372036854775809}"#, "$.big", "2^53"),
        (r#"{"id": "x", "id": "y"}"#, "$.id", "given twice"),
        (r#"{"id": "x", "m": {"1": "a", "01": "b"}}"#, "$.m.01", "given twice"),
        (r#"{"id": "x", "f": "1e39"}"#, "$.f", "range of float"),
    ] {
        let Err(mismatch) = codec.encode("M", json, &mut Vec::new()) else { panic!("{json} is written") };
        assert_eq!((mismatch.path().as_str(), mismatch.reason().contains(reason)), (path, true), "{json}: {mismatch}");
    }
}

/// -0.0 is a value a proto3 double holds: prost-reflect's encoder compared it with 0.0 and left it out.
#[test]
fn negative_zero_is_written() {
    let codec = ProtobufCodec::parse(r#"syntax = "proto3"; message M { double d = 1; float f = 2; }"#, &[]).unwrap();
    let mut out = Vec::new();
    codec.encode("M", r#"{"d": -0.0, "f": 0.0}"#, &mut out).unwrap();
    let mut want = vec![0, 0x09];
    want.extend((-0.0f64).to_le_bytes());
    assert_eq!(out, want);
}

/// Confluent's built-in imports compile without a reference; a reference under the same path wins.
#[test]
fn confluent_builtins_need_no_reference() {
    let schema = r#"syntax = "proto3"; import "confluent/meta.proto"; import "google/type/money.proto";
        message M { google.type.Money m = 1 [(confluent.field_meta) = { tags: "PII" }]; }"#;
    let codec = ProtobufCodec::parse(schema, &[]).unwrap();
    codec.encode("M", r#"{"m": {"currencyCode": "CHF", "units": "1"}}"#, &mut Vec::new()).unwrap();
    let own = r#"syntax = "proto3"; package google.type; message Money { string amount = 1; }"#;
    let codec = ProtobufCodec::parse(schema, &[("google/type/money.proto".into(), own.into())]).unwrap();
    codec.encode("M", r#"{"m": {"amount": "1.5"}}"#, &mut Vec::new()).unwrap();
}

#[test]
fn mismatches_name_the_path() {
    for (json, path) in [
        (r#"{"lines": [{"sku": "A"}, {"qty": "many"}]}"#, "$.lines[1].qty"),
        // An unknown field is reported at its object, the reason naming it.
        (r#"{"total": {"cents": 1}}"#, "$.total"),
        (r#"{"status": "LOST"}"#, "$.status"),
    ] {
        let mismatch = codec().encode("OrderCreated", json, &mut Vec::new()).unwrap_err();
        assert_eq!(mismatch.path(), path, "{json}: {mismatch}");
    }
    let unknown = codec().encode("OrderCreated", r#"{"total": {"cents": 1}}"#, &mut Vec::new()).unwrap_err();
    assert!(unknown.reason().contains("cents"), "{unknown}");
    assert!(ProtobufCodec::parse(ORDER, &[]).unwrap_err().contains("acme/money.proto"));
}
