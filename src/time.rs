//! Time helpers: the wall clock in Unix milliseconds, and `occurred_at` read as UTC.
//!
//! Floor 0, the ground floor (docs/ARCHITECTURE.md): imports nothing of ours but other ground-floor modules.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// `occurred_at` (`YYYY-MM-DDTHH:MM:SS[.ffffff]`, no zone) read as UTC, in Unix milliseconds.
pub fn parse_occurred_at_ms(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    if b.len() < 19 || b[4] != b'-' || b[7] != b'-' || b[13] != b':' || b[16] != b':' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> { std::str::from_utf8(&b[r]).ok()?.parse().ok() };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, s) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let mut millis = 0;
    if b.len() > 20 && b[19] == b'.' {
        for i in 20..23 {
            let digit = match b.get(i) {
                Some(c) if c.is_ascii_digit() => i64::from(c - b'0'),
                Some(_) => return None,
                None => 0,
            };
            millis = millis * 10 + digit;
        }
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 24 + h) * 60 + mi) * 60_000 + s * 1000 + millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn occurred_at_parses_as_utc() {
        assert_eq!(parse_occurred_at_ms("1970-01-01T00:00:00"), Some(0));
        assert_eq!(parse_occurred_at_ms("2026-11-30T12:34:56.789123"), Some(1_796_042_096_789));
        assert_eq!(parse_occurred_at_ms("2000-02-29T00:00:01.5"), Some(951_782_401_500));
        assert_eq!(parse_occurred_at_ms("garbage"), None);
    }
}
