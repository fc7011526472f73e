//! Avro datums from the payload's JSON: one pass over the JSON and the schema, writing the binary encoding
//! as it goes.
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2.
//!
//! apache-avro parses the schema (named types, namespaces, logical types, references to other subjects);
//! the encoding is ours. Its own path (`serde_json::Value` → `apache_avro::types::Value` → validate →
//! write) would build a second tree per record and read decimals through `f64`; Avro's binary encoding is a
//! page of the specification (zig-zag varints, length-prefixed bytes, blocked arrays and maps), and writing
//! it here lets a mismatch name the field path where it happened. What apache-avro's model drops (the
//! logical type of a named `fixed`, defaults in the underlying type's encoding) is read from the schema
//! text before apache-avro parses it ([`meaning`]), so the writer never relies on apache-avro's model for
//! it; tests/avro_corpus.rs proves the datums against two readers of the schema text.
//!
//! # How JSON meets the schema
//! - A record field absent from the object takes the field's default; absent without a default, or a key
//!   the record does not have, is a mismatch (a payload is never published with part of it dropped).
//! - A key that is one of a field's `aliases` is that field (a producer still writing a renamed field's
//!   old name means that field); a field named twice (by its name and an alias, or two aliases) is a
//!   mismatch at the second key.
//! - A default is written as the specification reads it: in the underlying type's JSON encoding (a
//!   decimal's default is its bytes, `"\u0000"`; a date's is its day count), a union's as its first
//!   branch. Every default is written once when the schema is parsed: one that does not fit refuses the
//!   schema.
//! - A union takes Avro's JSON encoding (`{"string": "x"}`, `{"com.acme.Money": {…}}`, named types by full
//!   or simple name) or a plain value that fits exactly one branch (`null` for the null branch); a plain
//!   value fitting two branches (`5` for `["int", "long"]`) is a mismatch saying how to write it.
//! - `bytes` and `fixed` are strings whose characters U+0000-U+00FF are the bytes (Avro's JSON encoding).
//! - decimal: a JSON string (`"199.00"`) or an integer, never a float: the digits are read as text, the
//!   scale must hold them, the precision must hold the whole.
//! - date: `"2026-12-03"` or days since the epoch; time-millis/micros: `"12:34:56.789"` or the count;
//!   timestamp-*/local-timestamp-*: ISO-8601 text (`2026-12-03T12:34:56.123456Z`, an offset, or none,
//!   read as UTC) or the count. Text more precise than the type holds is a mismatch, never truncated; so is
//!   a leap second (`23:59:60`).
//! - uuid (on `string` or on a `fixed` of 16): its canonical text; duration: `{"months": m, "days": d,
//!   "millis": n}`.
//! - float: a number within ±3.4028235e38 (rounded to the nearest float); beyond, a mismatch, never
//!   infinity. double: the number as its text says, exactly (serde_json's `float_roundtrip`).

use std::collections::HashMap;

use apache_avro::schema::{FixedSchema, Name, RecordField, RecordSchema, Schema, UnionSchema};
use num_bigint::BigInt;
use serde_json::Value;

mod from_text;
mod meaning;
mod mismatch;

use from_text::{parse_date, time_of_day, timestamp, unscaled_decimal};
use meaning::{FixedMeaning, Meaning};
pub use mismatch::Mismatch;
use mismatch::{describe, expected, long, Segment};

/// A parsed Avro schema with its named types (its own and those of the schemas it references).
#[derive(Debug)]
pub struct AvroCodec {
    schema: Schema,
    names: HashMap<String, Schema>,
    /// What apache-avro's model does not carry, from the schema texts ([`Meaning`]), by apache-avro's
    /// `Name` of the type: looked up on the hot path without building a full name.
    fixed: HashMap<Name, FixedMeaning>,
    defaults: HashMap<Name, HashMap<String, Value>>,
}

/// Whose JSON a value is: a payload's, or a schema's default (in the underlying type's JSON encoding).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Payload,
    Default,
}

type Fit = Result<(), Mismatch>;

impl AvroCodec {
    /// Parses `schema`, whose named types may come from `references` (the referenced subjects' schemas, in
    /// dependency order).
    ///
    /// # Errors
    /// apache-avro's reason when a schema does not parse; a logical type readers would not agree on
    /// ([`meaning`]); a field default that does not fit its field.
    pub fn parse(schema: &str, references: &[String]) -> Result<Self, String> {
        let mut meaning = Meaning::default();
        let references: Vec<String> =
            references.iter().map(|r| meaning::amend(r, &mut meaning)).collect::<Result<_, _>>()?;
        let schema = meaning::amend(schema, &mut meaning)?;
        let (schema, referenced) = match references.is_empty() {
            true => (Schema::parse_str(&schema).map_err(|e| e.to_string())?, Vec::new()),
            false => Schema::parse_str_with_list(&schema, &references).map_err(|e| e.to_string())?,
        };
        let mut names = HashMap::new();
        for s in referenced.iter().chain(std::iter::once(&schema)) {
            collect_names(s, &mut names);
        }
        let name = |full: String| Name::new(&full).map_err(|e| format!("{full:?} is not an Avro name: {e}"));
        let Meaning { fixed, defaults } = meaning;
        let fixed = fixed.into_iter().map(|(full, m)| Ok((name(full)?, m))).collect::<Result<_, String>>()?;
        let defaults = defaults.into_iter().map(|(full, d)| Ok((name(full)?, d))).collect::<Result<_, String>>()?;
        let codec = AvroCodec { schema, names, fixed, defaults };
        codec.check_defaults()?;
        Ok(codec)
    }

    /// Writes every field default once, so that a default that does not fit refuses the schema instead of
    /// the rows that would need it.
    fn check_defaults(&self) -> Result<(), String> {
        let mut scratch = Vec::new();
        for named in self.names.values() {
            let Schema::Record(record) = named else { continue };
            for field in &record.fields {
                if let Some(default) = self.default_of(record, field) {
                    scratch.clear();
                    self.write(&field.schema, default, Mode::Default, &mut scratch).map_err(|m| {
                        format!("the default of field `{}` of record {}: {m}", field.name, record.name.fullname(None))
                    })?;
                }
            }
        }
        Ok(())
    }

    fn default_of(&self, record: &RecordSchema, field: &RecordField) -> Option<&Value> {
        self.defaults.get(&record.name)?.get(&field.name)
    }

    /// A codec for the Avro `string` schema (`kafka.key_format = "avro"`).
    pub fn string() -> Self {
        AvroCodec { schema: Schema::String, names: HashMap::new(), fixed: HashMap::new(), defaults: HashMap::new() }
    }

    /// Whether the schema is the plain `string` schema.
    pub fn is_string(&self) -> bool {
        matches!(self.schema, Schema::String)
    }

    /// Appends the datum of `value` to `out`.
    ///
    /// # Errors
    /// The first place `value` does not fit the schema; `out` then holds a partial datum.
    pub fn encode(&self, value: &Value, out: &mut Vec<u8>) -> Fit {
        self.write(&self.schema, value, Mode::Payload, out)
    }

    fn write(&self, schema: &Schema, value: &Value, mode: Mode, out: &mut Vec<u8>) -> Fit {
        match schema {
            Schema::Null => match value {
                Value::Null => Ok(()),
                _ => Err(expected("null", value)),
            },
            Schema::Boolean => match value {
                Value::Bool(b) => {
                    out.push(u8::from(*b));
                    Ok(())
                }
                _ => Err(expected("a boolean", value)),
            },
            Schema::Int => write_long(out, int(value)?.into()),
            Schema::Long => write_long(out, long(value)?),
            Schema::Float => {
                let n = value.as_f64().ok_or_else(|| expected("a number (float)", value))?;
                let float = n as f32;
                if float.is_infinite() {
                    return Err(Mismatch::new(format!("{n} is out of the range of float (±{:e})", f32::MAX)));
                }
                out.extend_from_slice(&float.to_le_bytes());
                Ok(())
            }
            Schema::Double => {
                let n = value.as_f64().ok_or_else(|| expected("a number (double)", value))?;
                out.extend_from_slice(&n.to_le_bytes());
                Ok(())
            }
            Schema::Bytes => {
                let bytes = latin1(value)?;
                write_long(out, bytes.len() as i64)?;
                out.extend_from_slice(&bytes);
                Ok(())
            }
            Schema::String => write_str(out, text(value, "a string")?),
            Schema::Uuid => {
                let s = text(value, "a uuid string")?;
                if !is_uuid(s) {
                    return Err(Mismatch::new(format!("{s:?} is not a UUID (8-4-4-4-12 hex digits)")));
                }
                write_str(out, s)
            }
            Schema::Array(array) => {
                let items = value.as_array().ok_or_else(|| expected("an array", value))?;
                if !items.is_empty() {
                    write_long(out, items.len() as i64)?;
                    for (i, item) in items.iter().enumerate() {
                        self.write(&array.items, item, mode, out).map_err(|m| m.in_item(i))?;
                    }
                }
                out.push(0);
                Ok(())
            }
            Schema::Map(map) => {
                let entries = value.as_object().ok_or_else(|| expected("an object (map)", value))?;
                if !entries.is_empty() {
                    write_long(out, entries.len() as i64)?;
                    for (key, item) in entries {
                        write_str(out, key)?;
                        self.write(&map.types, item, mode, out).map_err(|m| m.at(Segment::Key(key.clone())))?;
                    }
                }
                out.push(0);
                Ok(())
            }
            Schema::Union(union) => self.write_union(union, value, mode, out),
            Schema::Record(record) => self.write_record(record, value, mode, out),
            Schema::Enum(e) => {
                let symbol = text(value, "an enum symbol")?;
                match e.symbols.iter().position(|s| s == symbol) {
                    Some(index) => write_long(out, index as i64),
                    None => Err(Mismatch::new(format!(
                        "{symbol:?} is not a symbol of enum {} ({})",
                        e.name.fullname(None),
                        e.symbols.join(", ")
                    ))),
                }
            }
            Schema::Fixed(fixed) => self.write_fixed(fixed, value, mode, out),
            Schema::Decimal(decimal) => match (mode, self.resolve(&decimal.inner)) {
                (Mode::Payload, Schema::Fixed(fixed)) => {
                    write_decimal(decimal.precision, decimal.scale, Some(fixed.size), value, out)
                }
                (Mode::Payload, _) => write_decimal(decimal.precision, decimal.scale, None, value, out),
                (Mode::Default, inner) => {
                    check_decimal_default(value, decimal.precision, decimal.scale)?;
                    self.write(inner, value, mode, out)
                }
            },
            // A default of a date, time or timestamp is in the underlying type's encoding: a count, never text.
            Schema::Date | Schema::TimeMillis if mode == Mode::Default => write_long(out, count(value, int)?.into()),
            Schema::TimeMicros
            | Schema::TimestampMillis
            | Schema::TimestampMicros
            | Schema::TimestampNanos
            | Schema::LocalTimestampMillis
            | Schema::LocalTimestampMicros
            | Schema::LocalTimestampNanos
                if mode == Mode::Default =>
            {
                write_long(out, count(value, long)?)
            }
            Schema::Date => match value {
                Value::String(s) => {
                    let days =
                        parse_date(s).ok_or_else(|| Mismatch::new(format!("{s:?} is not a date (YYYY-MM-DD)")))?;
                    let days = i32::try_from(days).map_err(|_| Mismatch::new(format!("{s:?} is out of range")))?;
                    write_long(out, days.into())
                }
                _ => write_long(out, int(value)?.into()),
            },
            Schema::TimeMillis => match value {
                Value::String(s) => write_long(out, time_of_day(s, 1_000_000, "time-millis")?),
                _ => write_long(out, int(value)?.into()),
            },
            Schema::TimeMicros => match value {
                Value::String(s) => write_long(out, time_of_day(s, 1_000, "time-micros")?),
                _ => write_long(out, long(value)?),
            },
            Schema::TimestampMillis => write_long(out, timestamp(value, 1_000_000, "timestamp-millis", true)?),
            Schema::TimestampMicros => write_long(out, timestamp(value, 1_000, "timestamp-micros", true)?),
            Schema::TimestampNanos => write_long(out, timestamp(value, 1, "timestamp-nanos", true)?),
            Schema::LocalTimestampMillis => {
                write_long(out, timestamp(value, 1_000_000, "local-timestamp-millis", false)?)
            }
            Schema::LocalTimestampMicros => write_long(out, timestamp(value, 1_000, "local-timestamp-micros", false)?),
            Schema::LocalTimestampNanos => write_long(out, timestamp(value, 1, "local-timestamp-nanos", false)?),
            // Not from a parsed schema (a `fixed`'s logical type is ours: `write_fixed`), kept for completeness.
            Schema::Duration => write_duration(value, out),
            Schema::BigDecimal => Err(Mismatch::new("the big-decimal logical type is not supported; use decimal")),
            Schema::Ref { name } => match self.names.get(&name.fullname(None)) {
                Some(named) => self.write(named, value, mode, out),
                None => {
                    Err(Mismatch::new(format!("the schema names the type {} but defines none", name.fullname(None))))
                }
            },
        }
    }

    fn write_record(&self, record: &RecordSchema, value: &Value, mode: Mode, out: &mut Vec<u8>) -> Fit {
        let object = value
            .as_object()
            .ok_or_else(|| expected(&format!("an object (record {})", record.name.fullname(None)), value))?;
        // apache-avro's lookup holds every field's name and aliases: longer than the fields, some have aliases.
        let aliased = record.lookup.len() > record.fields.len();
        for field in &record.fields {
            let given = match aliased {
                false => object.get(&field.name).map(|value| (&field.name, value)),
                true => given_once(record, field, object)?,
            };
            match given {
                Some((key, value)) => self.write(&field.schema, value, mode, out).map_err(|m| m.in_field(key))?,
                None => match self.default_of(record, field) {
                    Some(default) => self.write(&field.schema, default, Mode::Default, out),
                    None => Err(Mismatch::new(format!(
                        "missing, and field `{}` of record {} has no default",
                        field.name,
                        record.name.fullname(None)
                    ))),
                }
                .map_err(|m| m.in_field(&field.name))?,
            }
        }
        if let Some(extra) = object.keys().find(|key| !record.lookup.contains_key(*key)) {
            return Err(Mismatch::new(format!(
                "not a field of record {} (a field the schema does not have is never dropped silently)",
                record.name.fullname(None)
            ))
            .in_field(extra));
        }
        Ok(())
    }

    fn write_union(&self, union: &UnionSchema, value: &Value, mode: Mode, out: &mut Vec<u8>) -> Fit {
        let branches = union.variants();
        // A default is a value of the union's first branch.
        if mode == Mode::Default {
            let first = branches.first().ok_or_else(|| Mismatch::new("an empty union holds no value"))?;
            out.push(0);
            return self.write(first, value, mode, out);
        }
        // Avro's JSON encoding: {"<branch name>": value}.
        if let Value::Object(object) = value {
            if object.len() == 1 {
                let (name, inner) = object.iter().next().expect("one entry");
                if let Some(index) = branches.iter().position(|b| self.branch_names(b).iter().any(|n| n == name)) {
                    write_long(out, index as i64)?;
                    return self
                        .write(&branches[index], inner, mode, out)
                        .map_err(|m| m.at(Segment::Key(name.clone())));
                }
            }
        }
        // A plain value: every branch is tried in place; the first that fits stays, the others' trials are
        // cut off again, and exactly one may fit.
        let start = out.len();
        let mut fits: Vec<usize> = Vec::new();
        for (index, branch) in branches.iter().enumerate() {
            let mark = out.len();
            write_long(out, index as i64)?;
            let fit = self.write(branch, value, mode, out).is_ok();
            if fit {
                fits.push(index);
            }
            if !(fit && fits.len() == 1) {
                out.truncate(mark);
            }
        }
        match fits.as_slice() {
            [_] => Ok(()),
            [] => {
                out.truncate(start);
                let names: Vec<String> = branches.iter().map(|b| self.branch_names(b)[0].clone()).collect();
                Err(Mismatch::new(format!("{} fits no branch of the union [{}]", describe(value), names.join(", "))))
            }
            several => {
                out.truncate(start);
                let names: Vec<String> = several.iter().map(|i| self.branch_names(&branches[*i])[0].clone()).collect();
                Err(Mismatch::new(format!(
                    "{} fits several branches of the union ({}): write it in Avro's JSON union encoding, e.g. \
                     {{\"{}\": …}}",
                    describe(value),
                    names.join(", "),
                    names[0]
                )))
            }
        }
    }

    /// A fixed, as what its logical type means ([`FixedMeaning`]), or as its bytes.
    fn write_fixed(&self, fixed: &FixedSchema, value: &Value, mode: Mode, out: &mut Vec<u8>) -> Fit {
        match (mode, self.fixed.get(&fixed.name)) {
            (Mode::Payload, Some(FixedMeaning::Decimal { precision, scale })) => {
                write_decimal(*precision, *scale, Some(fixed.size), value, out)
            }
            (Mode::Payload, Some(FixedMeaning::Uuid)) => {
                let s = text(value, "a uuid string")?;
                let bytes = uuid_bytes(s)
                    .ok_or_else(|| Mismatch::new(format!("{s:?} is not a UUID (8-4-4-4-12 hex digits)")))?;
                out.extend_from_slice(&bytes);
                Ok(())
            }
            (Mode::Payload, Some(FixedMeaning::Duration)) => write_duration(value, out),
            (Mode::Default, meaning) | (Mode::Payload, meaning @ None) => {
                if let Some(FixedMeaning::Decimal { precision, scale }) = meaning {
                    check_decimal_default(value, *precision, *scale)?;
                }
                let bytes = latin1(value)?;
                if bytes.len() != fixed.size {
                    return Err(Mismatch::new(format!(
                        "{} bytes for fixed {} of {} bytes",
                        bytes.len(),
                        fixed.name.fullname(None),
                        fixed.size
                    )));
                }
                out.extend_from_slice(&bytes);
                Ok(())
            }
        }
    }

    fn resolve<'s>(&'s self, schema: &'s Schema) -> &'s Schema {
        match schema {
            Schema::Ref { name } => self.names.get(&name.fullname(None)).unwrap_or(schema),
            other => other,
        }
    }

    /// The names a union branch goes by in Avro's JSON encoding: its type name, or a named type's full and
    /// simple names.
    fn branch_names(&self, schema: &Schema) -> Vec<String> {
        let named = |name: &apache_avro::schema::Name| {
            let full = name.fullname(None);
            match full == name.name {
                true => vec![full],
                false => vec![full, name.name.clone()],
            }
        };
        match self.resolve(schema) {
            Schema::Record(r) => named(&r.name),
            Schema::Enum(e) => named(&e.name),
            Schema::Fixed(f) => named(&f.name),
            Schema::Decimal(d) => self.branch_names(&d.inner),
            Schema::Null => vec!["null".into()],
            Schema::Boolean => vec!["boolean".into()],
            Schema::Int | Schema::Date | Schema::TimeMillis => vec!["int".into()],
            Schema::Float => vec!["float".into()],
            Schema::Double => vec!["double".into()],
            Schema::Bytes | Schema::BigDecimal => vec!["bytes".into()],
            Schema::String | Schema::Uuid => vec!["string".into()],
            Schema::Array(_) => vec!["array".into()],
            Schema::Map(_) => vec!["map".into()],
            Schema::Duration => vec!["fixed".into()],
            Schema::Union(_) => vec!["union".into()],
            _ => vec!["long".into()],
        }
    }
}

/// The field's value by its name or one of its aliases, and which key gave it; a field given by two keys
/// is a mismatch at the second.
fn given_once<'v>(
    record: &RecordSchema,
    field: &'v RecordField,
    object: &'v serde_json::Map<String, Value>,
) -> Result<Option<(&'v String, &'v Value)>, Mismatch> {
    let mut given = object.get(&field.name).map(|value| (&field.name, value));
    for alias in field.aliases.iter().flatten() {
        let Some(value) = object.get(alias) else { continue };
        if let Some((first, _)) = given {
            return Err(Mismatch::new(format!(
                "{alias:?} names field `{}` of record {}, which {first:?} already gives: write the field once",
                field.name,
                record.name.fullname(None),
            ))
            .in_field(alias));
        }
        given = Some((alias, value));
    }
    Ok(given)
}

/// A default's count of a date, time or timestamp (text, which a payload may use, is refused).
fn count<T>(value: &Value, read: fn(&Value) -> Result<T, Mismatch>) -> Result<T, Mismatch> {
    match value {
        Value::String(_) => Err(expected("a count (a default is in the underlying type's JSON encoding)", value)),
        _ => read(value),
    }
}

/// Every named type under `schema`, by full name.
fn collect_names(schema: &Schema, names: &mut HashMap<String, Schema>) {
    match schema {
        Schema::Record(record) => {
            names.insert(record.name.fullname(None), schema.clone());
            for field in &record.fields {
                collect_names(&field.schema, names);
            }
        }
        Schema::Enum(e) => {
            names.insert(e.name.fullname(None), schema.clone());
        }
        Schema::Fixed(f) => {
            names.insert(f.name.fullname(None), schema.clone());
        }
        Schema::Array(array) => collect_names(&array.items, names),
        Schema::Map(map) => collect_names(&map.types, names),
        Schema::Union(union) => union.variants().iter().for_each(|b| collect_names(b, names)),
        Schema::Decimal(decimal) => collect_names(&decimal.inner, names),
        _ => {}
    }
}

fn int(value: &Value) -> Result<i32, Mismatch> {
    let n = value.as_i64().ok_or_else(|| expected("an integer (int)", value))?;
    i32::try_from(n).map_err(|_| Mismatch::new(format!("{n} is out of the range of int (32 bits)")))
}

fn text<'v>(value: &'v Value, what: &str) -> Result<&'v str, Mismatch> {
    value.as_str().ok_or_else(|| expected(what, value))
}

/// Avro's JSON encoding of bytes: each character U+0000-U+00FF is one byte.
fn latin1(value: &Value) -> Result<Vec<u8>, Mismatch> {
    let s = text(value, "a string of bytes (characters U+0000-U+00FF)")?;
    s.chars()
        .map(|c| u8::try_from(u32::from(c)).ok())
        .collect::<Option<Vec<u8>>>()
        .ok_or_else(|| Mismatch::new("bytes are written as characters U+0000-U+00FF (Avro's JSON encoding)"))
}

fn write_long(out: &mut Vec<u8>, n: i64) -> Fit {
    let mut zigzag = ((n << 1) ^ (n >> 63)) as u64;
    while zigzag >= 0x80 {
        out.push(zigzag as u8 | 0x80);
        zigzag >>= 7;
    }
    out.push(zigzag as u8);
    Ok(())
}

fn write_str(out: &mut Vec<u8>, s: &str) -> Fit {
    write_long(out, s.len() as i64)?;
    out.extend_from_slice(s.as_bytes());
    Ok(())
}

/// A decimal's default is its two's-complement bytes (Avro's JSON encoding of `bytes`): the number they
/// hold must fit the precision (`"12.00"` as a default is five bytes of text, not twelve).
///
/// # Errors
/// Bytes that hold more digits than the precision.
fn check_decimal_default(value: &Value, precision: usize, scale: usize) -> Fit {
    let unscaled = BigInt::from_signed_bytes_be(&latin1(value)?);
    let digits = unscaled.magnitude().to_string().len();
    if digits > precision {
        let one = BigInt::from(10).pow(scale as u32).to_signed_bytes_be();
        let example: String = one.iter().map(|b| format!("\\u{b:04x}")).collect();
        return Err(Mismatch::new(format!(
            "the default's bytes hold an unscaled {unscaled}, more digits than its precision {precision}: a \
             decimal's default is its two's-complement bytes (\"{example}\" for 1 at scale {scale})"
        )));
    }
    Ok(())
}

/// A duration from `{"months", "days", "millis"}`: three little-endian `u32`.
fn write_duration(value: &Value, out: &mut Vec<u8>) -> Fit {
    let object = value.as_object().ok_or_else(|| expected("{\"months\", \"days\", \"millis\"}", value))?;
    for part in ["months", "days", "millis"] {
        let n = object.get(part).and_then(Value::as_u64).and_then(|n| u32::try_from(n).ok());
        let n = n.ok_or_else(|| Mismatch::new(format!("duration needs {part} as a number 0-4294967295")))?;
        out.extend_from_slice(&n.to_le_bytes());
    }
    Ok(())
}

/// A decimal's two's-complement unscaled integer: in `fixed` bytes sign-extended, or length-prefixed.
fn write_decimal(precision: usize, scale: usize, fixed: Option<usize>, value: &Value, out: &mut Vec<u8>) -> Fit {
    let unscaled = unscaled_decimal(value, scale, precision)?;
    let bytes = unscaled.to_signed_bytes_be();
    match fixed {
        Some(size) => {
            if bytes.len() > size {
                return Err(Mismatch::new(format!("the decimal needs {} bytes, fixed holds {size}", bytes.len())));
            }
            let fill = if unscaled.sign() == num_bigint::Sign::Minus { 0xff } else { 0 };
            out.extend(std::iter::repeat_n(fill, size - bytes.len()));
        }
        None => write_long(out, bytes.len() as i64)?,
    }
    out.extend_from_slice(&bytes);
    Ok(())
}

/// The 16 bytes of a UUID's canonical text.
fn uuid_bytes(s: &str) -> Option<[u8; 16]> {
    if !is_uuid(s) {
        return None;
    }
    let hex: Vec<u8> = s.bytes().filter(|b| *b != b'-').collect();
    let mut bytes = [0u8; 16];
    for (byte, pair) in bytes.iter_mut().zip(hex.chunks(2)) {
        *byte = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(bytes)
}

fn is_uuid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

#[cfg(test)]
mod tests;
