//! Avro datums from the payload's JSON: one pass over the JSON and the schema, writing the binary encoding
//! as it goes.
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2.
//!
//! apache-avro parses the schema (named types, namespaces, logical types, references to other subjects);
//! the encoding is ours. Its own path (`serde_json::Value` → `apache_avro::types::Value` → validate →
//! write) would build a second tree per record and read decimals through `f64`; Avro's binary encoding is a
//! page of the specification (zig-zag varints, length-prefixed bytes, blocked arrays and maps), and writing
//! it here lets a mismatch name the field path where it happened.
//!
//! # How JSON meets the schema
//! - A record field absent from the object takes the field's default; absent without a default, or a key
//!   the record does not have, is a mismatch (a payload is never published with part of it dropped).
//! - A union takes Avro's JSON encoding (`{"string": "x"}`, `{"com.acme.Money": {…}}`, named types by full
//!   or simple name) or a plain value that fits exactly one branch (`null` for the null branch); a plain
//!   value fitting two branches (`5` for `["int", "long"]`) is a mismatch saying how to write it.
//! - `bytes` and `fixed` are strings whose characters U+0000-U+00FF are the bytes (Avro's JSON encoding).
//! - decimal: a JSON string (`"199.00"`) or an integer, never a float: the digits are read as text, the
//!   scale must hold them, the precision must hold the whole.
//! - date: `"2026-12-03"` or days since the epoch; time-millis/micros: `"12:34:56.789"` or the count;
//!   timestamp-*/local-timestamp-*: ISO-8601 text (`2026-12-03T12:34:56.123456Z`, an offset, or none,
//!   read as UTC) or the count. Text more precise than the type holds is a mismatch, never truncated.
//! - uuid: its canonical text; duration: `{"months": m, "days": d, "millis": n}`.

use std::collections::HashMap;
use std::fmt;

use apache_avro::schema::{DecimalSchema, RecordSchema, Schema, UnionSchema};
use num_bigint::BigInt;
use serde_json::Value;

/// A parsed Avro schema with its named types (its own and those of the schemas it references).
#[derive(Debug)]
pub struct AvroCodec {
    schema: Schema,
    names: HashMap<String, Schema>,
}

/// Where in the payload a value does not fit its schema, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    path: Vec<Segment>,
    reason: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Field(String),
    Index(usize),
    Key(String),
}

impl Mismatch {
    /// A mismatch at the current value.
    pub fn new(reason: impl Into<String>) -> Self {
        Mismatch { path: Vec::new(), reason: reason.into() }
    }

    fn at(mut self, segment: Segment) -> Self {
        self.path.push(segment);
        self
    }

    /// An object key on the way to the mismatch, outermost last.
    pub fn in_field(self, name: &str) -> Self {
        self.at(Segment::Field(name.to_string()))
    }

    /// An array index on the way to the mismatch.
    pub fn in_item(self, index: usize) -> Self {
        self.at(Segment::Index(index))
    }

    /// The JSON path of the value, e.g. `$.lines[2].price`.
    pub fn path(&self) -> String {
        let mut path = String::from("$");
        for segment in self.path.iter().rev() {
            match segment {
                Segment::Field(name) if name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') => {
                    path.push('.');
                    path.push_str(name);
                }
                Segment::Field(name) | Segment::Key(name) => {
                    path.push('[');
                    path.push_str(&serde_json::to_string(name).expect("a string serializes"));
                    path.push(']');
                }
                Segment::Index(i) => path.push_str(&format!("[{i}]")),
            }
        }
        path
    }

    /// Why the value does not fit.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path(), self.reason)
    }
}

type Fit = Result<(), Mismatch>;

impl AvroCodec {
    /// Parses `schema`, whose named types may come from `references` (the referenced subjects' schemas, in
    /// dependency order).
    ///
    /// # Errors
    /// apache-avro's reason when a schema does not parse.
    pub fn parse(schema: &str, references: &[String]) -> Result<Self, String> {
        let (schema, referenced) = match references.is_empty() {
            true => (Schema::parse_str(schema).map_err(|e| e.to_string())?, Vec::new()),
            false => Schema::parse_str_with_list(schema, references).map_err(|e| e.to_string())?,
        };
        let mut names = HashMap::new();
        for s in referenced.iter().chain(std::iter::once(&schema)) {
            collect_names(s, &mut names);
        }
        Ok(AvroCodec { schema, names })
    }

    /// A codec for the Avro `string` schema (`kafka.key_format = "avro"`).
    pub fn string() -> Self {
        AvroCodec { schema: Schema::String, names: HashMap::new() }
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
        self.write(&self.schema, value, out)
    }

    fn write(&self, schema: &Schema, value: &Value, out: &mut Vec<u8>) -> Fit {
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
                out.extend_from_slice(&(n as f32).to_le_bytes());
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
                        self.write(&array.items, item, out).map_err(|m| m.in_item(i))?;
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
                        self.write(&map.types, item, out).map_err(|m| m.at(Segment::Key(key.clone())))?;
                    }
                }
                out.push(0);
                Ok(())
            }
            Schema::Union(union) => self.write_union(union, value, out),
            Schema::Record(record) => self.write_record(record, value, out),
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
            Schema::Fixed(fixed) => {
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
            Schema::Decimal(decimal) => self.write_decimal(decimal, value, out),
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
            Schema::Duration => {
                let object = value.as_object().ok_or_else(|| expected("{\"months\", \"days\", \"millis\"}", value))?;
                for part in ["months", "days", "millis"] {
                    let n = object.get(part).and_then(Value::as_u64).and_then(|n| u32::try_from(n).ok());
                    let n =
                        n.ok_or_else(|| Mismatch::new(format!("duration needs {part} as a number 0-4294967295")))?;
                    out.extend_from_slice(&n.to_le_bytes());
                }
                Ok(())
            }
            Schema::BigDecimal => Err(Mismatch::new("the big-decimal logical type is not supported; use decimal")),
            Schema::Ref { name } => match self.names.get(&name.fullname(None)) {
                Some(named) => self.write(named, value, out),
                None => {
                    Err(Mismatch::new(format!("the schema names the type {} but defines none", name.fullname(None))))
                }
            },
        }
    }

    fn write_record(&self, record: &RecordSchema, value: &Value, out: &mut Vec<u8>) -> Fit {
        let object = value
            .as_object()
            .ok_or_else(|| expected(&format!("an object (record {})", record.name.fullname(None)), value))?;
        for field in &record.fields {
            match (object.get(&field.name), &field.default) {
                (Some(value), _) => self.write(&field.schema, value, out),
                // A union's default is a value of its first branch.
                (None, Some(default)) => match &field.schema {
                    Schema::Union(union) => {
                        out.push(0);
                        let first = union.variants().first().expect("a union has a branch");
                        self.write(first, default, out)
                    }
                    schema => self.write(schema, default, out),
                },
                (None, None) => Err(Mismatch::new(format!(
                    "missing, and field `{}` of record {} has no default",
                    field.name,
                    record.name.fullname(None)
                ))),
            }
            .map_err(|m| m.in_field(&field.name))?;
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

    fn write_union(&self, union: &UnionSchema, value: &Value, out: &mut Vec<u8>) -> Fit {
        let branches = union.variants();
        // Avro's JSON encoding: {"<branch name>": value}.
        if let Value::Object(object) = value {
            if object.len() == 1 {
                let (name, inner) = object.iter().next().expect("one entry");
                if let Some(index) = branches.iter().position(|b| self.branch_names(b).iter().any(|n| n == name)) {
                    write_long(out, index as i64)?;
                    return self.write(&branches[index], inner, out).map_err(|m| m.at(Segment::Key(name.clone())));
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
            let fit = self.write(branch, value, out).is_ok();
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

    fn write_decimal(&self, decimal: &DecimalSchema, value: &Value, out: &mut Vec<u8>) -> Fit {
        let unscaled = unscaled_decimal(value, decimal.scale, decimal.precision)?;
        let bytes = unscaled.to_signed_bytes_be();
        match self.resolve(&decimal.inner) {
            Schema::Fixed(fixed) => {
                if bytes.len() > fixed.size {
                    return Err(Mismatch::new(format!(
                        "the decimal needs {} bytes, fixed holds {}",
                        bytes.len(),
                        fixed.size
                    )));
                }
                let fill = if unscaled.sign() == num_bigint::Sign::Minus { 0xff } else { 0 };
                out.extend(std::iter::repeat_n(fill, fixed.size - bytes.len()));
                out.extend_from_slice(&bytes);
                Ok(())
            }
            _ => {
                write_long(out, bytes.len() as i64)?;
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

fn expected(what: &str, value: &Value) -> Mismatch {
    Mismatch::new(format!("expected {what}, found {}", describe(value)))
}

/// A short description of a JSON value for a mismatch (its type, and a short value).
fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("the boolean {b}"),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) if s.chars().count() <= 40 => format!("the string {s:?}"),
        Value::String(s) => format!("a string of {} characters", s.chars().count()),
        Value::Array(a) => format!("an array of {}", a.len()),
        Value::Object(_) => "an object".into(),
    }
}

fn int(value: &Value) -> Result<i32, Mismatch> {
    let n = value.as_i64().ok_or_else(|| expected("an integer (int)", value))?;
    i32::try_from(n).map_err(|_| Mismatch::new(format!("{n} is out of the range of int (32 bits)")))
}

fn long(value: &Value) -> Result<i64, Mismatch> {
    match value {
        Value::Number(n) => {
            n.as_i64().ok_or_else(|| Mismatch::new(format!("{n} is not an integer in the range of long")))
        }
        _ => Err(expected("an integer (long)", value)),
    }
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

fn is_uuid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

/// The unscaled integer of a decimal written as text (`"-199.5"`) or a JSON integer, at `scale`.
fn unscaled_decimal(value: &Value, scale: usize, precision: usize) -> Result<BigInt, Mismatch> {
    let owned;
    let text = match value {
        Value::String(s) => s.as_str(),
        Value::Number(n) if n.is_i64() || n.is_u64() => {
            owned = n.to_string();
            owned.as_str()
        }
        Value::Number(n) => {
            return Err(Mismatch::new(format!(
                "the decimal {n} is a JSON float, which cannot hold every decimal exactly: write it as a string, \
                 e.g. \"{n}\""
            )))
        }
        _ => return Err(expected("a decimal as a string such as \"199.00\"", value)),
    };
    let bad = || Mismatch::new(format!("{text:?} is not a decimal number (digits, an optional sign and point)"));
    let (negative, unsigned) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    let (whole, fraction) = unsigned.split_once('.').unwrap_or((unsigned, ""));
    if whole.is_empty() && fraction.is_empty() || !(whole.bytes().chain(fraction.bytes())).all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    if fraction.len() > scale {
        let (kept, dropped) = fraction.split_at(scale);
        if dropped.bytes().any(|b| b != b'0') {
            return Err(Mismatch::new(format!(
                "{text:?} has {} digits after the point, the schema's scale is {scale}",
                fraction.len()
            )));
        }
        return unscaled_decimal(
            &Value::String(format!("{}{whole}.{kept}", if negative { "-" } else { "" })),
            scale,
            precision,
        );
    }
    let mut digits = String::with_capacity(whole.len() + scale);
    digits.push_str(whole);
    digits.push_str(fraction);
    digits.extend(std::iter::repeat_n('0', scale - fraction.len()));
    let significant = digits.trim_start_matches('0').len();
    if significant > precision {
        return Err(Mismatch::new(format!("{text:?} has {significant} digits, the schema's precision is {precision}")));
    }
    let magnitude: BigInt = if digits.is_empty() { BigInt::from(0) } else { digits.parse().map_err(|_| bad())? };
    Ok(if negative { -magnitude } else { magnitude })
}

/// Days since the epoch of `YYYY-MM-DD`.
fn parse_date(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
        return None;
    }
    let (y, m, d) = (digits(&b[0..4])?, digits(&b[5..7])?, digits(&b[8..10])?);
    if !(1..=12).contains(&m) || !(1..=days_in_month(y, m)).contains(&d) {
        return None;
    }
    Some(crate::time::days_from_civil(y, m, d))
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

fn digits(b: &[u8]) -> Option<i64> {
    match !b.is_empty() && b.iter().all(u8::is_ascii_digit) {
        true => std::str::from_utf8(b).ok()?.parse().ok(),
        false => None,
    }
}

/// `HH:MM[:SS[.fraction]]` in nanoseconds after midnight, and what is left after it.
fn parse_time(s: &str) -> Option<(i64, &str)> {
    let b = s.as_bytes();
    if b.len() < 5 || b[2] != b':' {
        return None;
    }
    let (h, m) = (digits(&b[0..2])?, digits(&b[3..5])?);
    let (mut sec, mut nanos, mut rest) = (0, 0, 5);
    if b.len() >= 8 && b[5] == b':' {
        sec = digits(&b[6..8])?;
        rest = 8;
        if b.get(8) == Some(&b'.') {
            let end = b[9..].iter().position(|c| !c.is_ascii_digit()).map_or(b.len(), |p| p + 9);
            let fraction = &b[9..end];
            if fraction.is_empty() || fraction.len() > 9 {
                return None;
            }
            nanos = digits(fraction)? * 10i64.pow(9 - fraction.len() as u32);
            rest = end;
        }
    }
    if h > 23 || m > 59 || sec > 60 {
        return None;
    }
    Some((((h * 60 + m) * 60 + sec) * 1_000_000_000 + nanos, &s[rest..]))
}

fn time_of_day(s: &str, unit_nanos: i64, type_name: &str) -> Result<i64, Mismatch> {
    match parse_time(s) {
        Some((nanos, "")) => in_unit(nanos.into(), unit_nanos, s, type_name),
        _ => Err(Mismatch::new(format!("{s:?} is not a time of day (HH:MM:SS[.fraction]) for {type_name}"))),
    }
}

/// A timestamp from ISO-8601 text (zone `Z`, `±HH:MM`, or none: UTC) or a count of the type's unit.
fn timestamp(value: &Value, unit_nanos: i64, type_name: &str, zoned: bool) -> Result<i64, Mismatch> {
    let s = match value {
        Value::String(s) => s,
        _ => return long(value),
    };
    let bad = || {
        Mismatch::new(format!(
            "{s:?} is not an ISO-8601 timestamp (YYYY-MM-DDTHH:MM:SS[.fraction]{}) for {type_name}",
            if zoned { "[Z|±HH:MM]" } else { ", no zone" }
        ))
    };
    if s.len() < 16 || !matches!(s.as_bytes()[10], b'T' | b't' | b' ') {
        return Err(bad());
    }
    let days = parse_date(&s[..10]).ok_or_else(bad)?;
    let (nanos_of_day, zone) = parse_time(&s[11..]).ok_or_else(bad)?;
    let offset_s: i64 = match zone.as_bytes() {
        [] => 0,
        [b'Z' | b'z'] if zoned => 0,
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] if zoned => {
            let (h, m) = (digits(&[*h1, *h2]).ok_or_else(bad)?, digits(&[*m1, *m2]).ok_or_else(bad)?);
            (h * 3600 + m * 60) * if *sign == b'-' { -1 } else { 1 }
        }
        _ => return Err(bad()),
    };
    let nanos = (i128::from(days) * 86_400 - i128::from(offset_s)) * 1_000_000_000 + i128::from(nanos_of_day);
    in_unit(nanos, unit_nanos, s, type_name)
}

fn in_unit(nanos: i128, unit_nanos: i64, text: &str, type_name: &str) -> Result<i64, Mismatch> {
    let unit = i128::from(unit_nanos);
    if nanos % unit != 0 {
        return Err(Mismatch::new(format!("{text:?} is more precise than {type_name} holds")));
    }
    i64::try_from(nanos / unit).map_err(|_| Mismatch::new(format!("{text:?} is out of the range of {type_name}")))
}

#[cfg(test)]
mod tests;
