//! Each rule of the module docs, one case per row; every datum is read back by apache-avro's own reader
//! (an implementation other than the writer's), with a schema it parses from the text, not the writer's
//! (the writer's has the meaning apache-avro's model drops taken out: [`super::meaning`]). The proof against
//! two independent readers over every schema shape is tests/avro_corpus.rs.

use apache_avro::types::Value as Avro;
use serde_json::json;

use super::*;

/// The writer of a schema, and apache-avro's reader of the same text.
struct Written {
    codec: AvroCodec,
    reader: apache_avro::Schema,
}

fn codec(schema: serde_json::Value) -> Written {
    let text = schema.to_string();
    Written { codec: AvroCodec::parse(&text, &[]).unwrap(), reader: apache_avro::Schema::parse_str(&text).unwrap() }
}

/// Encodes `value` and reads the datum back with apache-avro's reader, no byte left over.
fn round_trip(written: &Written, value: serde_json::Value) -> Result<Avro, Mismatch> {
    let mut out = Vec::new();
    written.codec.encode(&value, &mut out)?;
    let mut rest = out.as_slice();
    let read = apache_avro::from_avro_datum(&written.reader, &mut rest, None).unwrap();
    assert!(rest.is_empty(), "{} bytes left over", rest.len());
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
    codec(json!({"type": "array", "items": "long"})).codec.encode(&json!([0, -1, 64]), &mut out).unwrap();
    assert_eq!(out, [6, 0, 1, 0x80, 0x01, 0]);
    out.clear();
    codec(json!({"type": "map", "values": "boolean"})).codec.encode(&json!({}), &mut out).unwrap();
    assert_eq!(out, [0]);
    out.clear();
    AvroCodec::string().encode(&json!("A-1"), &mut out).unwrap();
    assert_eq!(out, [6, b'A', b'-', b'1']);
}

/// Issue 44: a decimal fixed named twice, a uuid fixed, an alias, a decimal default in its bytes, a float
/// beyond f32. Each was written wrong (or refused a whole subject); the bytes here are the specification's.
#[test]
fn what_apache_avros_model_drops_is_written_as_the_text_says() {
    let schema = json!({"type": "record", "name": "Order", "namespace": "shop", "fields": [
        {"name": "subtotal", "type": {"type": "fixed", "name": "Money", "size": 4, "logicalType": "decimal",
            "precision": 9, "scale": 2}},
        {"name": "total", "aliases": ["amount"], "type": "Money"},
        {"name": "id", "type": {"type": "fixed", "name": "Id", "size": 16, "logicalType": "uuid"}},
        {"name": "discount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 4, "scale": 2},
            "default": "\u{0}"},
        {"name": "ratio", "type": "float", "default": 0.5}]});
    let codec = AvroCodec::parse(&schema.to_string(), &[]).unwrap();
    let mut out = Vec::new();
    let payload = json!({"subtotal": "1.00", "amount": "-0.01", "id": "00112233-4455-6677-8899-aabbccddeeff"});
    codec.encode(&payload, &mut out).unwrap();
    let mut want = vec![0, 0, 0, 100, 0xff, 0xff, 0xff, 0xff];
    want.extend([0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff]);
    want.extend([2, 0]); // the default "\u0000": one byte, 0
    want.extend(0.5f32.to_le_bytes());
    assert_eq!(out, want);
    let twice = json!({"subtotal": "1", "total": "1", "amount": "1", "id": "00112233-4455-6677-8899-aabbccddeeff"});
    let refused = codec.encode(&twice, &mut Vec::new()).unwrap_err();
    assert_eq!(refused.path(), "$.amount", "{refused}");
    let huge = json!({"subtotal": "1", "total": "1", "id": "00112233-4455-6677-8899-aabbccddeeff", "ratio": 1e39});
    let refused = codec.encode(&huge, &mut Vec::new()).unwrap_err();
    assert_eq!((refused.path().as_str(), refused.reason().contains("out of the range of float")), ("$.ratio", true));
    // A default that does not fit refuses the schema, not the rows that would need it.
    let bad = json!({"type": "record", "name": "R", "fields": [{"name": "n", "type": "int", "default": "x"}]});
    let refused = AvroCodec::parse(&bad.to_string(), &[]).unwrap_err();
    assert!(refused.contains("default of field `n` of record R"), "{refused}");
}
