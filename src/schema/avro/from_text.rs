//! Numbers from a payload's text: a decimal's unscaled integer, and the counts of dates, times and
//! timestamps from ISO-8601, each exact or a mismatch (never truncated, never moved).
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2.

use num_bigint::BigInt;
use serde_json::Value;

use super::mismatch::{expected, long, Mismatch};

/// The unscaled integer of a decimal written as text (`"-199.5"`) or a JSON integer, at `scale`.
pub(super) fn unscaled_decimal(value: &Value, scale: usize, precision: usize) -> Result<BigInt, Mismatch> {
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
pub(super) fn parse_date(s: &str) -> Option<i64> {
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
    // Avro counts no leap second: 23:59:60 would be the next day's midnight, so it is refused, not moved.
    if h > 23 || m > 59 || sec > 59 {
        return None;
    }
    Some((((h * 60 + m) * 60 + sec) * 1_000_000_000 + nanos, &s[rest..]))
}

pub(super) fn time_of_day(s: &str, unit_nanos: i64, type_name: &str) -> Result<i64, Mismatch> {
    match parse_time(s) {
        Some((nanos, "")) => in_unit(nanos.into(), unit_nanos, s, type_name),
        _ => Err(Mismatch::new(format!("{s:?} is not a time of day (HH:MM:SS[.fraction]) for {type_name}"))),
    }
}

/// A timestamp from ISO-8601 text (zone `Z`, `±HH:MM`, or none: UTC) or a count of the type's unit.
pub(super) fn timestamp(value: &Value, unit_nanos: i64, type_name: &str, zoned: bool) -> Result<i64, Mismatch> {
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
