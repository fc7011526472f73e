//! Where a payload does not fit its Avro schema, as a JSON path and a reason, and the helpers that say so.
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2.

use std::fmt;

use serde_json::Value;

/// Where in the payload a value does not fit its schema, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    path: Vec<Segment>,
    reason: String,
}

/// One step of a mismatch's path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Segment {
    Field(String),
    Index(usize),
    Key(String),
}

impl Mismatch {
    /// A mismatch at the current value.
    pub fn new(reason: impl Into<String>) -> Self {
        Mismatch { path: Vec::new(), reason: reason.into() }
    }

    pub(super) fn at(mut self, segment: Segment) -> Self {
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

pub(super) fn expected(what: &str, value: &Value) -> Mismatch {
    Mismatch::new(format!("expected {what}, found {}", describe(value)))
}

/// A short description of a JSON value for a mismatch (its type, and a short value).
pub(super) fn describe(value: &Value) -> String {
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

pub(super) fn long(value: &Value) -> Result<i64, Mismatch> {
    match value {
        Value::Number(n) => {
            n.as_i64().ok_or_else(|| Mismatch::new(format!("{n} is not an integer in the range of long")))
        }
        _ => Err(expected("an integer (long)", value)),
    }
}
