//! Units: parsing and formatting of bytes, CPUs, durations and text positions. One formatter per
//! unit and purpose; pure, imports nothing from the crate (a leaf every other module may use).

use std::time::Duration;

/// Parse `20GiB`, `512MiB`, `24G`, `1.5TiB`, `1000000` (bytes). Binary units throughout.
pub fn parse_bytes(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let num: f64 = num.parse().ok()?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return None,
    };
    if !num.is_finite() || num < 0.0 {
        return None;
    }
    Some((num * mult as f64).round() as u64)
}

/// `25769803776` -> `24.0 GiB`.
pub fn format_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

/// `unlimited` (-1) or a size of at least 1 KiB, as a ulimit in bytes.
pub fn parse_limit(s: &str) -> Option<i64> {
    if s.trim().eq_ignore_ascii_case("unlimited") {
        return Some(-1);
    }
    parse_bytes(s)
        .filter(|b| *b >= 1024)
        .and_then(|b| i64::try_from(b).ok())
}

/// `16`, `0.5`: CPUs as people write them.
pub fn format_cpus(milli: u64) -> String {
    if milli.is_multiple_of(1000) {
        (milli / 1000).to_string()
    } else {
        format!("{:.2}", milli as f64 / 1000.0)
            .trim_end_matches('0')
            .to_string()
    }
}

/// `1 CPU`, `16 CPUs`, `0.5 CPUs`: a number of CPUs in a sentence.
pub fn cpus_count(milli: u64) -> String {
    format!("{} CPU{}", format_cpus(milli), if milli == 1000 { "" } else { "s" })
}

/// 1-based line and column of a byte offset in `text` (for error messages).
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.rfind('\n').map(|p| offset - p).unwrap_or(offset + 1);
    (line, col)
}

/// A duration for people, to the second: `2h 3m 4s` (reasons, ETAs, notes in logs).
pub fn duration_ms(ms: i64) -> String {
    humantime::format_duration(Duration::from_secs((ms / 1000).max(0) as u64)).to_string()
}

/// A duration for a table column: its two largest parts (`2h 3m`).
pub fn duration_brief_ms(ms: i64) -> String {
    duration_ms(ms).split(' ').take(2).collect::<Vec<_>>().join(" ")
}

/// How long something has lasted, for a sentence (`idle for 2 h 10 min`): minutes under an hour
/// (`45 s` under a minute), hours and minutes under a day, then days and hours.
pub fn duration_words_ms(ms: i64) -> String {
    let s = (ms / 1000).max(0);
    let (d, h, m) = (s / 86_400, s / 3600 % 24, s / 60 % 60);
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{m} min"),
        3600..86_400 if m == 0 => format!("{h} h"),
        3600..86_400 => format!("{h} h {m} min"),
        _ if h == 0 => format!("{d} d"),
        _ => format!("{d} d {h} h"),
    }
}

/// A duration as the lab config writes it (`10m`, `1d`, `90s`, `500ms`): the largest whole unit.
pub fn duration_setting(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => format!("{}ms", d.as_millis()),
        _ if s.is_multiple_of(86_400) => format!("{}d", s / 86_400),
        _ if s.is_multiple_of(3600) => format!("{}h", s / 3600),
        _ if s.is_multiple_of(60) => format!("{}m", s / 60),
        _ => format!("{s}s"),
    }
}

/// A moment in this machine's local time zone (the `TZ` variable, else `/etc/localtime`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalTime {
    pub year: i32,
    /// 1-12.
    pub month: u32,
    /// 1-31.
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
}

/// `ms` (since the epoch) in local time.
pub fn local_time(ms: i64) -> LocalTime {
    let t: libc::time_t = ms.div_euclid(1000) as libc::time_t;
    // SAFETY: localtime_r writes only into `tm`, which lives for the call.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    unsafe { libc::localtime_r(&t, &mut tm) };
    LocalTime {
        year: tm.tm_year + 1900,
        month: (tm.tm_mon + 1) as u32,
        day: tm.tm_mday as u32,
        hour: tm.tm_hour as u32,
        minute: tm.tm_min as u32,
    }
}

/// The local date and time as ms since the epoch (`None`: no such moment, e.g. a bad date); the
/// day may run past the month's end (the 32nd is the next month's 1st), as `mktime` allows.
pub fn from_local(t: LocalTime) -> Option<i64> {
    if !(1..=12).contains(&t.month) || t.day < 1 || t.hour > 23 || t.minute > 59 {
        return None;
    }
    // SAFETY: mktime reads and normalizes `tm`, which lives for the call.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    tm.tm_year = t.year - 1900;
    tm.tm_mon = t.month as i32 - 1;
    tm.tm_mday = t.day as i32;
    tm.tm_hour = t.hour as i32;
    tm.tm_min = t.minute as i32;
    tm.tm_isdst = -1;
    let secs = unsafe { libc::mktime(&mut tm) };
    (secs != -1).then_some(secs as i64 * 1000)
}

/// `14:00` in local time.
pub fn local_hhmm(ms: i64) -> String {
    let t = local_time(ms);
    format!("{:02}:{:02}", t.hour, t.minute)
}

/// `2026-12-03 14:00` in local time.
pub fn local_datetime(ms: i64) -> String {
    let t = local_time(ms);
    format!("{}-{:02}-{:02} {:02}:{:02}", t.year, t.month, t.day, t.hour, t.minute)
}

/// The forms [`parse_when`] reads.
pub const WHEN_FORMS: &str = "write \"14:00\", \"tomorrow 14:00\", \"2026-12-03 09:30\" or \"+2h\" (in local time)";

/// `HH:MM` as (hour, minute).
fn hhmm(s: &str) -> Option<(u32, u32)> {
    let (h, m) = s.split_once(':')?;
    let (h, m): (u32, u32) = (h.parse().ok()?, m.parse().ok()?);
    (h < 24 && m < 60 && s.len() <= 5).then_some((h, m))
}

/// A start time in local time (`14:00`: today, or tomorrow once past; `tomorrow 14:00`;
/// `2026-12-03 09:30`; `+2h`) as ms since the epoch, and whether it was rounded up to a slot of
/// `slot_ms` (`+2h`; 0: no slots). `what` names the field or flag in errors (`--at`, `begin`).
/// Bookings' `--at` and jobs' `begin:` / `--begin` read the same forms.
pub fn parse_when(s: &str, now: i64, slot_ms: i64, what: &str) -> Result<(i64, bool), String> {
    let s = s.trim();
    let bad = || format!("{what} {s:?} is not a time: {WHEN_FORMS}");
    if let Some(rel) = s.strip_prefix('+') {
        let d = humantime::parse_duration(rel.trim())
            .map_err(|_| format!("{what} {s:?}: after `+` write a duration such as 2h or 90m"))?;
        let t = now + d.as_millis() as i64;
        let up = if slot_ms > 0 && t.rem_euclid(slot_ms) != 0 {
            t - t.rem_euclid(slot_ms) + slot_ms
        } else {
            t
        };
        return Ok((up, up != t));
    }
    let today = local_time(now);
    let at_day = |day_offset: u32, (hour, minute): (u32, u32)| {
        from_local(LocalTime {
            day: today.day + day_offset,
            hour,
            minute,
            ..today
        })
        .ok_or_else(bad)
    };
    let words: Vec<&str> = s.split_whitespace().collect();
    let t = match words.as_slice() {
        [t] if hhmm(t).is_some() => {
            let at = at_day(0, hhmm(t).unwrap())?;
            // Today's, or tomorrow's once today's slot is over.
            if at + slot_ms.max(1) <= now {
                at_day(1, hhmm(t).unwrap())?
            } else {
                at
            }
        }
        ["today", t] => at_day(0, hhmm(t).ok_or_else(bad)?)?,
        ["tomorrow", t] => at_day(1, hhmm(t).ok_or_else(bad)?)?,
        [date, t] | [date, "at", t] => {
            let parts: Vec<&str> = date.split('-').collect();
            let [y, m, d] = parts.as_slice() else {
                return Err(bad());
            };
            let (Ok(year), Ok(month), Ok(day)) = (y.parse::<i32>(), m.parse::<u32>(), d.parse::<u32>()) else {
                return Err(bad());
            };
            let (hour, minute) = hhmm(t).ok_or_else(bad)?;
            if day == 0 || day > 31 {
                return Err(bad());
            }
            let ms = from_local(LocalTime {
                year,
                month,
                day,
                hour,
                minute,
            })
            .ok_or_else(bad)?;
            // mktime rolls 2026-02-31 over to March: not what was meant.
            if local_time(ms).day != day {
                return Err(format!("{what} {s:?}: {year}-{month:02} has no day {day}"));
            }
            ms
        }
        [one] if one.contains('T') => {
            let (d, t) = one.split_once('T').unwrap();
            return parse_when(&format!("{d} {}", t.get(..5).unwrap_or(t)), now, slot_ms, what);
        }
        _ => return Err(bad()),
    };
    Ok((t, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_times_round_trip() {
        let t = LocalTime {
            year: 2026,
            month: 12,
            day: 3,
            hour: 9,
            minute: 30,
        };
        let ms = from_local(t).unwrap();
        assert_eq!(local_time(ms), t);
        assert_eq!(
            (local_hhmm(ms), local_datetime(ms)),
            ("09:30".to_string(), "2026-12-03 09:30".to_string())
        );
        assert_eq!(from_local(LocalTime { month: 13, ..t }), None);
        assert_eq!(
            local_time(from_local(LocalTime { day: 32, ..t }).unwrap()),
            LocalTime {
                year: 2027,
                month: 1,
                day: 1,
                ..t
            }
        );
    }

    #[test]
    fn durations_per_purpose() {
        assert_eq!(duration_ms(3_723_400), "1h 2m 3s");
        assert_eq!(duration_ms(-5), "0s");
        assert_eq!(duration_brief_ms(3_723_400), "1h 2m");
        assert_eq!(duration_setting(Duration::from_secs(86_400)), "1d");
        assert_eq!(duration_setting(Duration::from_secs(90)), "90s");
        assert_eq!(duration_setting(Duration::from_millis(500)), "500ms");
        let words = [
            (45_000, "45 s"),
            (60_000, "1 min"),
            (3_599_000, "59 min"),
            (3_600_000, "1 h"),
            (7_800_000, "2 h 10 min"),
            (86_400_000, "1 d"),
            (97_200_000, "1 d 3 h"),
            (-1, "0 s"),
        ];
        for (ms, want) in words {
            assert_eq!(duration_words_ms(ms), want, "{ms} ms");
        }
    }

    #[test]
    fn bytes_round_trip_and_cpus() {
        assert_eq!(parse_bytes("1.5GiB"), Some(3 << 29));
        assert_eq!(format_bytes(24 << 30), "24.0 GiB");
        assert_eq!(parse_limit("unlimited"), Some(-1));
        assert_eq!(format_cpus(1500), "1.5");
        assert_eq!(
            (cpus_count(1000), cpus_count(2000), cpus_count(500)),
            ("1 CPU".into(), "2 CPUs".into(), "0.5 CPUs".into())
        );
        assert_eq!(line_col("a\nbc", 3), (2, 2));
    }
}
