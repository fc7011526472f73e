//! Numbers as the drafts mean them: the integer literals of the payload's text, and `multipleOf`.
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2.
//!
//! # Integer literals
//! serde_json reads an integer of up to 64 bits exactly and anything else as a double, so the tree the
//! validator sees loses two facts the text holds:
//! - an integer beyond 64 bits (`18446744073709551616`) becomes the nearest double. Readers differ on such a
//!   number (a double for JavaScript and for orjson, confluent-kafka's Python reader; the exact integer for
//!   Java and Python's json), and `maximum`, `const`, `multipleOf` cannot be checked exactly: the payload is
//!   refused where the literal is, and the reason says to write it as a string;
//! - `-0` becomes the double -0.0, which draft-04 does not count as an integer; it is put back as the
//!   integer 0 (which it equals) before validating.
//!
//! # `multipleOf`
//! The `jsonschema` crate divides the doubles as binary fractions (so 0.5 is no multiple of 0.1), refuses
//! every negative number under a fractional divisor, and divides integers above 2^53 as doubles (so
//! 2^53 + 1 is even). A number is a multiple here when it is one in decimal, the number as written (the
//! double's shortest decimal, or the exact integer): what the specification means, and what Confluent's
//! Java serializers compute (BigDecimal).
//!
//! Python's jsonschema, which confluent-kafka's Python consumers validate with, divides doubles instead, and
//! refuses some decimal multiples (`0.07` and `19.99` under `multipleOf: 0.01`: 7.000000000000001). Those
//! are published, not held: refusing them would make the most common money schema unusable, and a record
//! Confluent's own Java serializer writes would be dead-lettered here. docs/CONTRACT.md tells Python
//! consumers so; tests/json_schema_corpus.rs records each such case as Python's departure.

use jsonschema::paths::Location;
use jsonschema::{Keyword, ValidationError};
use num_bigint::{BigInt, Sign};
use serde_json::{Map, Number, Value};

use crate::schema::avro::Mismatch;

/// One step from the payload's root to a value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Step {
    Key(String),
    Index(usize),
}

/// The places of the `-0` literals of `text` (a JSON text serde_json has read), outermost step first.
///
/// # Errors
/// Where `text` holds an integer literal beyond 64 bits (below -2^63 or above 2^64 - 1).
pub(super) fn negative_zeros(text: &str) -> Result<Vec<Vec<Step>>, Mismatch> {
    let bytes = text.as_bytes();
    // Keys as the spans of their string tokens: a key is only read when a literal's place is wanted.
    let mut path: Vec<Frame> = Vec::new();
    let mut zeros = Vec::new();
    let mut expect_key = false;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'{' => {
                path.push(Frame::Key(0..0));
                expect_key = true;
            }
            b'[' => path.push(Frame::Index(0)),
            b'}' | b']' => {
                path.pop();
                expect_key = false;
            }
            b',' => match path.last_mut() {
                Some(Frame::Index(n)) => *n += 1,
                Some(Frame::Key(_)) => expect_key = true,
                None => {}
            },
            b':' => expect_key = false,
            b'"' => {
                let end = string_end(bytes, i);
                if let (true, Some(Frame::Key(key))) = (expect_key, path.last_mut()) {
                    *key = i..end;
                }
                i = end;
                continue;
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                while i < bytes.len() && matches!(bytes[i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9') {
                    i += 1;
                }
                let literal = &text[start..i];
                if !literal.contains(['.', 'e', 'E']) {
                    if literal == "-0" {
                        zeros.push(steps(text, &path));
                    } else if literal.parse::<i64>().is_err() && literal.parse::<u64>().is_err() {
                        return Err(at(&steps(text, &path), beyond_64_bits(literal)));
                    }
                }
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    Ok(zeros)
}

/// A step of the scan: an object's current key (the span of its string token), an array's index.
enum Frame {
    Key(std::ops::Range<usize>),
    Index(usize),
}

fn steps(text: &str, path: &[Frame]) -> Vec<Step> {
    path.iter()
        .map(|frame| match frame {
            Frame::Key(span) => Step::Key(serde_json::from_str(&text[span.clone()]).unwrap_or_default()),
            Frame::Index(index) => Step::Index(*index),
        })
        .collect()
}

/// The index just past the string starting at `bytes[start]` (a `"`).
fn string_end(bytes: &[u8], start: usize) -> usize {
    let mut i = start + 1;
    while i < bytes.len() && bytes[i] != b'"' {
        i += if bytes[i] == b'\\' { 2 } else { 1 };
    }
    (i + 1).min(bytes.len())
}

fn beyond_64_bits(literal: &str) -> Mismatch {
    let shown = match literal.len() > 40 {
        true => format!("{}… ({} digits)", &literal[..40], literal.trim_start_matches('-').len()),
        false => literal.to_string(),
    };
    Mismatch::new(format!(
        "the integer {shown} is beyond 64 bits, where JSON readers differ (a double for JavaScript and for \
         confluent-kafka's Python reader, exact for Java) and the schema cannot be checked exactly: write it \
         as a string"
    ))
}

fn at(path: &[Step], mismatch: Mismatch) -> Mismatch {
    path.iter().rev().fold(mismatch, |mismatch, step| match step {
        Step::Key(key) => mismatch.in_field(key),
        Step::Index(index) => mismatch.in_item(*index),
    })
}

/// `payload` with the integer 0 where `zeros` point at -0.0.
pub(super) fn with_integer_zeros(payload: &Value, zeros: &[Vec<Step>]) -> Value {
    let mut payload = payload.clone();
    for path in zeros {
        let mut at = Some(&mut payload);
        for step in path {
            at = match (at, step) {
                (Some(Value::Object(map)), Step::Key(key)) => map.get_mut(key),
                (Some(Value::Array(items)), Step::Index(index)) => items.get_mut(*index),
                _ => None,
            };
        }
        // A duplicated key keeps its last value, which may be another one than this literal's.
        if let Some(value @ Value::Number(_)) = at {
            if value.as_f64() == Some(0.0) {
                *value = Value::from(0);
            }
        }
    }
    payload
}

/// The `multipleOf` keyword of the module doc.
pub(super) fn multiple_of<'a>(
    _: &'a Map<String, Value>,
    value: &'a Value,
    _: Location,
) -> Result<Box<dyn Keyword>, ValidationError<'a>> {
    match value {
        Value::Number(divisor) if divisor.as_f64().is_some_and(|d| d > 0.0) => {
            Ok(Box::new(MultipleOf { divisor: divisor.clone() }))
        }
        _ => Err(ValidationError::custom(format!("multipleOf must be a number above 0, not {value}"))),
    }
}

struct MultipleOf {
    divisor: Number,
}

impl Keyword for MultipleOf {
    fn validate<'i>(&self, instance: &'i Value) -> Result<(), ValidationError<'i>> {
        match instance {
            Value::Number(number) if !multiple(number, &self.divisor) => {
                Err(ValidationError::custom(format!("{number} is not a multiple of {}", self.divisor)))
            }
            _ => Ok(()),
        }
    }

    fn is_valid(&self, instance: &Value) -> bool {
        match instance {
            Value::Number(number) => multiple(number, &self.divisor),
            _ => true,
        }
    }
}

/// Whether `x` is a multiple of `d` in decimal (the module doc).
fn multiple(x: &Number, d: &Number) -> bool {
    divides(decimal(x), decimal(d), 10)
}

/// A number as `mantissa * 10^exponent`: an integer exactly, a double as its shortest decimal.
fn decimal(n: &Number) -> (BigInt, i32) {
    if let Some(u) = n.as_u64() {
        return (BigInt::from(u), 0);
    }
    if let Some(i) = n.as_i64() {
        return (BigInt::from(i), 0);
    }
    let text = format!("{:e}", n.as_f64().unwrap_or(0.0));
    let (mantissa, exponent) = text.split_once('e').unwrap_or((&text, "0"));
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits: BigInt = format!("{whole}{fraction}").parse().unwrap_or_default();
    let exponent: i32 = exponent.parse().unwrap_or(0);
    (digits, exponent - i32::try_from(fraction.len()).unwrap_or(0))
}

/// Whether `x / d` is an integer, both as `mantissa * base^exponent`.
fn divides((mx, ex): (BigInt, i32), (md, ed): (BigInt, i32), base: u32) -> bool {
    if md.sign() == Sign::NoSign {
        return false;
    }
    let scale = BigInt::from(base).pow(ex.abs_diff(ed));
    let remainder = match ex >= ed {
        true => (mx * scale) % md,
        false => mx % (md * scale),
    };
    remainder.sign() == Sign::NoSign
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(text: &str) -> Number {
        serde_json::from_str(text).unwrap()
    }

    /// Each row a rule of the module doc: decimal arithmetic, whatever doubles (and Python) say.
    #[test]
    fn multiple_of_is_decimal() {
        for (x, d, want) in [
            ("0.5", "0.1", true),   // binary fractions say no
            ("-0.5", "0.25", true), // a negative multiple
            ("0.07", "0.01", true), // Python's jsonschema: 7.000000000000001, no
            ("19.99", "0.01", true),
            ("0.3", "0.1", true),               // Python: 2.9999999999999996, no
            ("1e16", "0.3", false),             // Python: every double above 2^53 is whole, yes
            ("9007199254740993", "2", false),   // exact integers, not doubles
            ("9007199254740993", "2.0", false), // Python divides doubles: yes
            ("18446744073709551615", "3", true),
            ("1e20", "2", true),
            ("1e308", "1e-300", true),
            ("0", "0.1", true),
            ("0.35", "0.1", false),
            ("0.001", "0.01", false),
        ] {
            assert_eq!(multiple(&n(x), &n(d)), want, "{x} / {d}");
        }
    }

    /// An integer literal beyond 64 bits is refused where it is; `-0` literals are found, `-0.0` ones not.
    #[test]
    fn integer_literals_are_read_from_the_text() {
        let zeros = negative_zeros(r#"{"a": [1, -0, -0.0, {"b": -0}], "c\"d": "-0", "e": {}, "f": -0}"#).unwrap();
        let key = |k: &str| Step::Key(k.into());
        assert_eq!(
            zeros,
            vec![vec![key("a"), Step::Index(1)], vec![key("a"), Step::Index(3), key("b")], vec![key("f")],]
        );
        for (text, path) in [
            ("18446744073709551616", "$"),
            ("-9223372036854775809", "$"),
            (r#"{"a": {"b\"": [0, 1, 100000000000000000000]}}"#, r#"$.a["b\""][2]"#),
        ] {
            let mismatch = negative_zeros(text).unwrap_err();
            assert_eq!(mismatch.path(), path, "{text}: {mismatch}");
        }
        for fits in ["18446744073709551615", "-9223372036854775808", "1e400", "184467440737095516160.0"] {
            assert!(negative_zeros(fits).is_ok(), "{fits}");
        }
        let payload: Value = serde_json::from_str(r#"{"a": [-0], "b": -0.0}"#).unwrap();
        let fixed = with_integer_zeros(&payload, &negative_zeros(r#"{"a": [-0], "b": -0.0}"#).unwrap());
        assert!(fixed["a"][0].is_u64() && fixed["b"].is_f64(), "{fixed}");
    }
}
