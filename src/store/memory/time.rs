//! Timestamps of memories and feedback: milliseconds since the epoch inside,
//! RFC 3339 (UTC, milliseconds) on the wire and in the markdown files.

use std::time::{Duration, UNIX_EPOCH};

/// Now, in milliseconds since the epoch.
pub fn now_ms() -> i64 {
    crate::ids::now_ms() as i64
}

/// `2026-05-20T12:34:56.789Z` (the audit trail's format).
pub fn format_ms(ms: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64);
    crate::store::audit::rfc3339_utc(t)
}

/// Parse `YYYY-MM-DD`, optionally followed by `THH:MM[:SS[.fff…]]` (or a
/// space instead of `T`) and `Z` or `±HH:MM`; no offset means UTC. Returns
/// milliseconds since the epoch, or `None` for anything else.
pub fn parse_rfc3339_ms(s: &str) -> Option<i64> {
    let s = s.trim();
    let b = s.as_bytes();
    let num = |from: usize, len: usize| -> Option<i64> {
        let part = s.get(from..from + len)?;
        if !part.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        part.parse().ok()
    };
    if b.len() < 10 || b[4] != b'-' || b[7] != b'-' {
        return None;
    }
    let (year, month, day) = (num(0, 4)?, num(5, 2)?, num(8, 2)?);
    if !(1..=12).contains(&month) || !(1..=days_in_month(year, month)).contains(&day) {
        return None;
    }
    let mut ms = days_from_civil(year, month, day) * 86_400_000;
    let mut i = 10;
    if i < b.len() && (b[i] == b'T' || b[i] == b't' || b[i] == b' ') {
        let (h, m) = (num(i + 1, 2)?, num(i + 4, 2)?);
        if b.get(i + 3) != Some(&b':') || h > 23 || m > 59 {
            return None;
        }
        ms += (h * 3600 + m * 60) * 1000;
        i += 6;
        if b.get(i) == Some(&b':') {
            let sec = num(i + 1, 2)?;
            if sec > 60 {
                return None;
            }
            ms += sec * 1000;
            i += 3;
            if b.get(i) == Some(&b'.') {
                let digits = s[i + 1..].bytes().take_while(u8::is_ascii_digit).count();
                if digits == 0 {
                    return None;
                }
                let frac = &s[i + 1..i + 1 + digits.min(3)];
                let scale = [100, 10, 1];
                ms += frac.bytes().zip(scale).map(|(c, k)| i64::from(c - b'0') * k).sum::<i64>();
                i += 1 + digits;
            }
        }
    } else if i != b.len() {
        return None;
    }
    match b.get(i) {
        None => Some(ms),
        Some(b'Z' | b'z') if i + 1 == b.len() => Some(ms),
        Some(&sign @ (b'+' | b'-')) if i + 6 == b.len() && b[i + 3] == b':' => {
            let (oh, om) = (num(i + 1, 2)?, num(i + 4, 2)?);
            let offset = (oh * 60 + om) * 60_000;
            Some(if sign == b'+' { ms - offset } else { ms + offset })
        }
        _ => None,
    }
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_and_parses_round_trip() {
        for ms in [0, 1_700_000_000_123, 951_782_400_000 /* 2000-02-29 */] {
            assert_eq!(parse_rfc3339_ms(&format_ms(ms)), Some(ms), "{}", format_ms(ms));
        }
    }

    #[test]
    fn accepts_the_common_iso_forms() {
        let base = parse_rfc3339_ms("2026-05-20T12:00:00Z").unwrap();
        assert_eq!(parse_rfc3339_ms("2026-05-20"), Some(base - 12 * 3_600_000));
        assert_eq!(parse_rfc3339_ms("2026-05-20T12:00"), Some(base));
        assert_eq!(parse_rfc3339_ms("2026-05-20 12:00:00.5Z"), Some(base + 500));
        assert_eq!(parse_rfc3339_ms("2026-05-20T14:00:00+02:00"), Some(base));
        assert_eq!(parse_rfc3339_ms("2026-05-20T12:00:00.123456Z"), Some(base + 123));
    }

    #[test]
    fn rejects_nonsense() {
        for s in ["", "yesterday", "2026-13-01", "2026-02-30", "2026-05-20T25:00", "2026-05-20Tx", "2026-05-20Z1"] {
            assert_eq!(parse_rfc3339_ms(s), None, "{s}");
        }
    }
}
