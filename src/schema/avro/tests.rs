//! Each rule of the module docs, one case per row; every datum is read back by apache-avro's own reader
//! (an implementation other than the writer's) and compared with what the JSON meant.

use apache_avro::types::Value as Avro;
use serde_json::json;

use super::*;

fn codec(schema: serde_json::Value) -> AvroCodec {
    AvroCodec::parse(&schema.to_string(), &[]).unwrap()
}

/// Encodes `value` and reads the datum back with apache-avro's reader.
fn round_trip(codec: &AvroCodec, value: serde_json::Value) -> Result<Avro, Mismatch> {
    let mut out = Vec::new();
    codec.encode(&value, &mut out)?;
    let read = apache_avro::from_avro_datum(&codec.schema, &mut out.as_slice(), None).unwrap();
    Ok(read)
}

fn field<'a>(record: &'a Avro, name: &str) -> &'a Avro {
    match record {
        Avro::Record(fields) => &fields.iter().find(|(n, _)| n == name).unwrap().1,
        other => panic!("not a record: {other:?}"),
    }
}

fn order_schema() -> serde_json::Value {
    json!({
        "type": "record", "name": "OrderCreated", "namespace": "com.acme",
        "fields": [
            {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
            {"name": "total", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
            {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
            {"name": "lines", "type": {"type": "array", "items": {
                "type": "record", "name": "Line", "fields": [
                    {"name": "sku", "type": "string"},
                    {"name": "qty", "type": "int"}]}}},
            {"name": "tags", "type": {"type": "map", "values": "long"}},
            {"name": "note", "type": ["null", "string"], "default": null},
            {"name": "day", "type": {"type": "int", "logicalType": "date"}},
            {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
            {"name": "hash", "type": {"type": "fixed", "name": "Hash", "size": 4}},
            {"name": "blob", "type": "bytes", "default": ""},
            {"name": "next", "type": ["null", "Line"], "default": null},
            {"name": "price", "type": {"type": "fixed", "name": "Price", "size": 8, "logicalType": "decimal", "precision": 12, "scale": 3}},
            {"name": "ratio", "type": "double", "default": 0.5}
        ]
    })
}

fn order() -> serde_json::Value {
    json!({
        "id": "0b0e1c9e-8d2f-4f7e-9c1a-2a2b3c4d5e6f",
        "total": "199.00",
        "status": "PAID",
        "lines": [{"sku": "A", "qty": 2}, {"sku": "B", "qty": -1}],
        "tags": {"x": 1},
        "day": "2026-12-03",
        "at": "2026-12-03T12:34:56.123456Z",
        "hash": "\u{00}\u{ff}ab",
        "next": {"Line": {"sku": "C", "qty": 1}},
        "price": "-1.5"
    })
}

/// The whole record: defaults for absent fields (null, bytes, double), a union's JSON encoding with a
/// named type's simple name, every logical type from text.
#[test]
fn a_record_with_every_type_reads_back() {
    let codec = codec(order_schema());
    let read = round_trip(&codec, order()).unwrap();
    assert_eq!(field(&read, "id"), &Avro::Uuid("0b0e1c9e-8d2f-4f7e-9c1a-2a2b3c4d5e6f".parse().unwrap()));
    assert_eq!(field(&read, "total"), &Avro::Decimal(apache_avro::Decimal::from(19900i32.to_be_bytes().to_vec())));
    assert_eq!(field(&read, "status"), &Avro::Enum(1, "PAID".into()));
    assert_eq!(field(&read, "note"), &Avro::Union(0, Box::new(Avro::Null)));
    assert_eq!(field(&read, "day"), &Avro::Date(20_790));
    assert_eq!(field(&read, "at"), &Avro::TimestampMicros(1_796_042_096_123_456 + 86_400_000_000 * 3));
    assert_eq!(field(&read, "hash"), &Avro::Fixed(4, vec![0, 255, b'a', b'b']));
    assert_eq!(field(&read, "blob"), &Avro::Bytes(vec![]));
    assert_eq!(field(&read, "ratio"), &Avro::Double(0.5));
    let lines = match field(&read, "lines") {
        Avro::Array(items) => items.len(),
        other => panic!("{other:?}"),
    };
    assert_eq!(lines, 2);
    match field(&read, "next") {
        Avro::Union(1, line) => assert_eq!(field(line, "qty"), &Avro::Int(1)),
        other => panic!("{other:?}"),
    }
    // -1.500 at scale 3 is -1500: two's complement, sign-extended to the fixed's 8 bytes.
    assert_eq!(field(&read, "price"), &Avro::Decimal(apache_avro::Decimal::from((-1500i64).to_be_bytes().to_vec())));
}

/// Mismatches name the path and the reason; nothing is truncated or rounded silently.
#[test]
fn mismatches_name_the_path() {
    let codec = codec(order_schema());
    let cases: &[(&str, serde_json::Value, &str, &str)] = &[
        ("/lines/1/qty", json!("two"), "$.lines[1].qty", "expected an integer (int)"),
        ("/total", json!(199.5), "$.total", "JSON float"),
        ("/total", json!("1.999"), "$.total", "scale is 2"),
        ("/total", json!("12345678.00"), "$.total", "precision is 9"),
        ("/status", json!("LOST"), "$.status", "not a symbol of enum com.acme.Status"),
        ("/day", json!("2026-02-30"), "$.day", "not a date"),
        ("/at", json!("2026-12-03T12:34:56.1234567Z"), "$.at", "more precise than timestamp-micros"),
        ("/id", json!("nope"), "$.id", "not a UUID"),
        ("/hash", json!("abc"), "$.hash", "3 bytes for fixed com.acme.Hash of 4"),
        ("/tags/x", json!(1.5), "$.tags[\"x\"]", "integer"),
        ("/note", json!(5), "$.note", "fits no branch"),
        ("/lines/0/extra", json!(1), "$.lines[0].extra", "not a field of record com.acme.Line"),
    ];
    for (pointer, bad, path, reason) in cases {
        let mut value = order();
        let (parent, key) = pointer.rsplit_once('/').unwrap();
        let parent = value.pointer_mut(parent).unwrap();
        match parent {
            serde_json::Value::Array(items) => items[key.parse::<usize>().unwrap()] = bad.clone(),
            object => object[key] = bad.clone(),
        }
        let mismatch = round_trip(&codec, value).unwrap_err();
        assert_eq!(mismatch.path(), *path, "{pointer}: {mismatch}");
        assert!(mismatch.reason().contains(reason), "{pointer}: {mismatch}");
    }
    let mut value = order();
    value.as_object_mut().unwrap().remove("status");
    let missing = round_trip(&codec, value).unwrap_err();
    assert_eq!(missing.path(), "$.status");
    assert!(missing.reason().contains("no default"), "{missing}");
}

/// A plain value picks the one branch it fits; one that fits two must use the JSON union encoding.
#[test]
fn unions_take_both_encodings() {
    let codec = codec(
        json!(["null", "string", "int", "long", {"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]}]),
    );
    assert_eq!(round_trip(&codec, json!(null)).unwrap(), Avro::Union(0, Box::new(Avro::Null)));
    assert_eq!(round_trip(&codec, json!("x")).unwrap(), Avro::Union(1, Box::new(Avro::String("x".into()))));
    assert_eq!(round_trip(&codec, json!({"long": 5})).unwrap(), Avro::Union(3, Box::new(Avro::Long(5))));
    assert_eq!(round_trip(&codec, json!({"int": 5})).unwrap(), Avro::Union(2, Box::new(Avro::Int(5))));
    // Only long holds it.
    assert_eq!(round_trip(&codec, json!(1_i64 << 40)).unwrap(), Avro::Union(3, Box::new(Avro::Long(1 << 40))));
    let record = round_trip(&codec, json!({"a": 1})).unwrap();
    assert!(matches!(record, Avro::Union(4, _)), "{record:?}");
    let ambiguous = round_trip(&codec, json!(5)).unwrap_err();
    assert!(ambiguous.reason().contains("several branches of the union (int, long)"), "{ambiguous}");
}

/// Time types from text and numbers; zones move the instant; local timestamps take no zone.
#[test]
fn times_from_text_and_numbers() {
    let cases: &[(&str, serde_json::Value, Avro)] = &[
        ("date", json!(3), Avro::Date(3)),
        ("time-millis", json!("01:00:00.5"), Avro::TimeMillis(3_600_500)),
        ("time-micros", json!("00:00:01.000002"), Avro::TimeMicros(1_000_002)),
        ("timestamp-millis", json!("1970-01-01T01:00:00+01:00"), Avro::TimestampMillis(0)),
        ("timestamp-millis", json!("1970-01-01 00:00:01"), Avro::TimestampMillis(1000)),
        ("timestamp-millis", json!(-5), Avro::TimestampMillis(-5)),
        ("timestamp-nanos", json!("1970-01-01T00:00:00.000000001Z"), Avro::TimestampNanos(1)),
        ("local-timestamp-micros", json!("1970-01-02T00:00:00"), Avro::LocalTimestampMicros(86_400_000_000)),
    ];
    for (logical, value, want) in cases {
        let underlying = if matches!(*logical, "date" | "time-millis") { "int" } else { "long" };
        let codec = codec(json!({"type": underlying, "logicalType": logical}));
        assert_eq!(&round_trip(&codec, value.clone()).unwrap(), want, "{logical} {value}");
    }
    let local = codec(json!({"type": "long", "logicalType": "local-timestamp-millis"}));
    assert!(round_trip(&local, json!("1970-01-01T00:00:00Z")).is_err());
}

/// Named types from a referenced schema (another subject) resolve by full name.
#[test]
fn references_supply_named_types() {
    let money = json!({"type": "record", "name": "Money", "namespace": "com.acme", "fields": [
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {"name": "currency", "type": "string"}]});
    let order = json!({"type": "record", "name": "Order", "namespace": "com.acme", "fields": [
        {"name": "total", "type": "com.acme.Money"}]});
    let codec = AvroCodec::parse(&order.to_string(), &[money.to_string()]).unwrap();
    let mut out = Vec::new();
    codec.encode(&json!({"total": {"amount": "3.10", "currency": "CHF"}}), &mut out).unwrap();
    // 310 = 0x0136: length 2, then the bytes; "CHF": length 3, then the text.
    assert_eq!(out, [4, 0x01, 0x36, 6, b'C', b'H', b'F']);
}

/// Arrays and maps are written as one block and an end marker; longs zig-zag.
#[test]
fn binary_layout_of_blocks_and_varints() {
    let mut out = Vec::new();
    codec(json!({"type": "array", "items": "long"})).encode(&json!([0, -1, 64]), &mut out).unwrap();
    assert_eq!(out, [6, 0, 1, 0x80, 0x01, 0]);
    out.clear();
    codec(json!({"type": "map", "values": "boolean"})).encode(&json!({}), &mut out).unwrap();
    assert_eq!(out, [0]);
    out.clear();
    AvroCodec::string().encode(&json!("A-1"), &mut out).unwrap();
    assert_eq!(out, [6, b'A', b'-', b'1']);
}
