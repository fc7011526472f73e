//! Time helpers: the wall clock in Unix milliseconds, `occurred_at` read as UTC, and Unix times written as
//! RFC 3339 UTC text for people. Both directions use Howard Hinnant's civil-date algorithms
//! (<https://howardhinnant.github.io/date_algorithms.html>), exact over the proleptic Gregorian calendar:
//! no date library for two small functions.
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
    let days = days_from_civil(y, mo, d);
    Some(((days * 24 + h) * 60 + mi) * 60_000 + s * 1000 + millis)
}

/// A Unix time in milliseconds as RFC 3339 UTC text to the second, e.g. `2026-12-01T21:34:12Z`: what
/// `status` and `quarantine list` print next to an age. Milliseconds are truncated, not rounded, like a
/// clock's seconds hand: the text never names a second that had not begun yet.
pub fn utc_text(unix_ms: u64) -> String {
    let secs = (unix_ms / 1000) as i64;
    let (days, secs_of_day) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, mo, d) = civil_from_days(days);
    let (h, mi, s) = (secs_of_day / 3600, secs_of_day / 60 % 60, secs_of_day % 60);
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z")
}

/// Days since 1970-01-01 of a proleptic Gregorian date (`month` 1-12).
pub fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    // Years start in March, so the leap day is the last day of its year.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The inverse of [`days_from_civil`]: (year, month 1-12, day 1-31).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
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

    #[test]
    fn utc_text_is_rfc_3339_to_the_second() {
        let cases: &[(u64, &str, &str)] = &[
            (0, "1970-01-01T00:00:00Z", "the epoch"),
            (999, "1970-01-01T00:00:00Z", "milliseconds truncate, never round up into the next second"),
            (1_000, "1970-01-01T00:00:01Z", "a whole second"),
            (86_399_999, "1970-01-01T23:59:59Z", "the last millisecond of a day"),
            (951_782_399_000, "2000-02-28T23:59:59Z", "the eve of a leap day in a year divisible by 400"),
            (951_782_400_000, "2000-02-29T00:00:00Z", "a leap day"),
            (951_868_800_000, "2000-03-01T00:00:00Z", "the day after a leap day"),
            (4_107_542_399_000, "2100-02-28T23:59:59Z", "2100 is not a leap year (divisible by 100, not 400)..."),
            (4_107_542_400_000, "2100-03-01T00:00:00Z", "...so 28 February is followed by 1 March"),
            (1_796_042_096_789, "2026-11-30T12:34:56Z", "a recent time with milliseconds"),
            (1_798_761_599_000, "2026-12-31T23:59:59Z", "the last second of a year"),
            (2_147_483_647_000, "2038-01-19T03:14:07Z", "the last second a signed 32-bit time_t holds"),
            (2_147_483_648_000, "2038-01-19T03:14:08Z", "one second later: no 2038 overflow"),
            (u64::from(u32::MAX) * 1000, "2106-02-07T06:28:15Z", "the largest binlog timestamp (u32 seconds)"),
            (253_402_300_799_999, "9999-12-31T23:59:59Z", "the last second with a four-digit year"),
        ];
        for &(ms, text, why) in cases {
            assert_eq!(utc_text(ms), text, "{why}");
        }
    }

    /// The two directions agree, on days spread over 1970-9999 (a round trip through the
    /// parser, which `occurred_at` already relies on).
    #[test]
    fn utc_text_and_the_parser_agree() {
        for day in (0..=2_932_896_i64).step_by(97) {
            let ms = day * 86_400_000 + 45_296_000;
            let text = utc_text(ms as u64);
            assert_eq!(parse_occurred_at_ms(text.trim_end_matches('Z')), Some(ms), "{text}");
        }
    }
}
