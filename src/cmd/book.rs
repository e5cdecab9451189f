//! `gantry book`, `gantry book cancel ID`, `gantry bookings`: GPU bookings.

use std::time::Duration;

use anyhow::{bail, Result};
use gantry_core::protocol::{BookRequest, BookingRules, BookingState, BookingView, BookingsQuery};
use gantry_core::units::{duration_setting, local_datetime, local_hhmm, parse_when};

use gantry_core::client::Client;

use super::Ctx;
use crate::print::print_json;
use crate::term::{esc, outln};

/// `--at` as ms since the epoch (local time), and whether it was rounded up to a slot (`+2h`):
/// the parser `begin:` and `--begin` use too ([`gantry_core::units::parse_when`]).
pub fn parse_at(s: &str, now: i64, slot_ms: i64) -> Result<(i64, bool)> {
    parse_when(s, now, slot_ms, "--at").map_err(|e| anyhow::anyhow!(e))
}

fn gpus_of(b: &BookingView) -> String {
    let n = if b.gpus == 1 {
        "1 GPU".to_string()
    } else {
        format!("{} GPUs", b.gpus)
    };
    match &b.gpu_type {
        Some(t) => format!("{n} ({})", esc(t)),
        None => n,
    }
}

fn when(b: &BookingView) -> String {
    let (a, z) = (local_datetime(b.start_ms), local_datetime(b.end_ms));
    if a[..10] == z[..10] {
        format!("{a}–{}", &z[11..])
    } else {
        format!("{a}–{z}")
    }
}

fn state_of(b: &BookingView) -> String {
    match b.state {
        BookingState::Active => {
            let mut s = String::from("active");
            if !b.gpu_indices.is_empty() {
                s.push_str(&format!(
                    " on GPU {}",
                    b.gpu_indices
                        .iter()
                        .map(|g| g.to_string())
                        .collect::<Vec<_>>()
                        .join(",")
                ));
            }
            if !b.waiting_for.is_empty() {
                let jobs: Vec<String> = b.waiting_for.iter().map(|j| j.to_string()).collect();
                s.push_str(&format!(
                    "; waiting for job{} {}",
                    if jobs.len() == 1 { "" } else { "s" },
                    jobs.join(", ")
                ));
            }
            s
        }
        BookingState::Cancelled | BookingState::Released => b
            .closed_why
            .as_deref()
            .map(|w| esc(w).into_owned())
            .unwrap_or_else(|| b.state.as_str().to_string()),
        s => s.as_str().to_string(),
    }
}

fn rules_line(r: &BookingRules) -> String {
    if !r.enabled {
        return "Bookings are turned off on this machine ([bookings] enabled = false).".into();
    }
    let d = |ms: i64| duration_setting(Duration::from_millis(ms.max(0) as u64));
    let week = r
        .max_gpu_hours_week
        .map(|h| format!(", {h} GPU-hours per user per week"))
        .unwrap_or_default();
    let long = if r.max_length_ms > 0 {
        format!(", at most {} long", d(r.max_length_ms))
    } else {
        String::new()
    };
    format!(
        "Lab rules: {} slots, up to {} ahead{long}, at most {} GPU{} per booking{week}; a booking unused {} after its start (or after its owner's last use) is released.",
        d(r.slot_ms),
        d(r.max_ahead_ms),
        r.max_gpus,
        if r.max_gpus == 1 { "" } else { "s" },
        d(r.release_after_ms)
    )
}

/// The booking `gantry book` (and the MCP tool `book_gpus`) asks for: `at` read in local time on the
/// lab's slots (rounded up for `+2h`), lasting `length`. Also whether it was rounded, and the slot.
pub async fn request(
    client: &Client,
    gpus: u32,
    gpu_type: Option<String>,
    at: &str,
    length: Duration,
    note: Option<String>,
) -> Result<(BookRequest, bool, i64)> {
    let now = gantry_core::store::now_ms();
    let rules = client
        .bookings(&BookingsQuery {
            all: false,
            limit: None,
        })
        .await?
        .rules;
    let (start, rounded) = parse_at(at, now, rules.slot_ms)?;
    // Saturating: a length past what a time can hold is the engine's to refuse (`max_length`), not a panic.
    let end = start.saturating_add(i64::try_from(length.as_millis()).unwrap_or(i64::MAX));
    let req = BookRequest {
        gpus,
        gpu_type,
        start_ms: start,
        end_ms: end,
        note,
    };
    Ok((req, rounded, rules.slot_ms))
}

pub async fn book(
    ctx: &Ctx,
    gpus: u32,
    gpu_type: Option<String>,
    at: Option<&str>,
    length: Option<Duration>,
    note: Option<String>,
) -> Result<()> {
    let (Some(at), Some(length)) = (at, length) else {
        bail!("say when and for how long: gantry book --gpus {gpus} --at \"tomorrow 14:00\" --for 4h (or `gantry book cancel ID`, `gantry bookings`)");
    };
    let (req, rounded, slot_ms) = request(&ctx.client, gpus, gpu_type, at, length, note).await?;
    let b = ctx.client.book(&req).await?;
    if ctx.json {
        return print_json(&b);
    }
    let round = if rounded {
        format!(
            " (rounded up to the lab's {} slots)",
            duration_setting(Duration::from_millis(slot_ms as u64))
        )
    } else {
        String::new()
    };
    outln!("booked {} as booking {}: {}{round}", gpus_of(&b), b.id, when(&b));
    outln!(
        "your jobs and sessions get them from {}; cancel with `gantry book cancel {}`",
        local_hhmm(b.start_ms),
        b.id
    );
    Ok(())
}

pub async fn cancel(ctx: &Ctx, id: i64) -> Result<()> {
    let b = ctx.client.cancel_booking(id).await?;
    if ctx.json {
        return print_json(&b);
    }
    outln!("booking {} ({}, {}) cancelled", b.id, gpus_of(&b), when(&b));
    Ok(())
}

pub async fn bookings(ctx: &Ctx, all: bool) -> Result<()> {
    let list = ctx.client.bookings(&BookingsQuery { all, limit: None }).await?;
    if ctx.json {
        return print_json(&list);
    }
    if list.bookings.is_empty() {
        outln!(
            "no bookings{}",
            if all {
                ""
            } else {
                " ahead (`gantry bookings --all` shows past ones)"
            }
        );
    } else {
        let rows: Vec<[String; 6]> = list
            .bookings
            .iter()
            .map(|b| {
                [
                    b.id.to_string(),
                    esc(&b.owner).into_owned(),
                    gpus_of(b),
                    when(b),
                    state_of(b),
                    b.note
                        .as_deref()
                        .map(|n| esc(n).into_owned())
                        .unwrap_or_else(|| "-".into()),
                ]
            })
            .collect();
        let head = ["ID", "OWNER", "GPUS", "WHEN", "STATE", "NOTE"];
        let w: Vec<usize> = (0..6)
            .map(|i| {
                rows.iter()
                    .map(|r| r[i].chars().count())
                    .chain([head[i].len()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |r: [&str; 6]| {
            let mut s = String::new();
            for (i, c) in r.iter().enumerate() {
                if i == 5 {
                    s.push_str(c);
                } else {
                    s.push_str(&format!("{c:<width$}  ", width = w[i]));
                }
            }
            s.trim_end().to_string()
        };
        outln!("{}", line(head));
        for r in &rows {
            outln!("{}", line([&r[0], &r[1], &r[2], &r[3], &r[4], &r[5]]));
        }
    }
    outln!("{}", rules_line(&list.rules));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gantry_core::units::{from_local, LocalTime};

    const SLOT: i64 = 30 * 60_000;

    fn at(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> i64 {
        from_local(LocalTime {
            year: y,
            month: mo,
            day: d,
            hour: h,
            minute: mi,
        })
        .unwrap()
    }

    #[test]
    fn at_forms_in_local_time() {
        let now = at(2026, 12, 2, 10, 7);
        assert_eq!(parse_at("14:00", now, SLOT).unwrap(), (at(2026, 12, 2, 14, 0), false));
        assert_eq!(
            parse_at("09:00", now, SLOT).unwrap().0,
            at(2026, 12, 3, 9, 0),
            "past today: tomorrow"
        );
        assert_eq!(
            parse_at("10:00", now, SLOT).unwrap().0,
            at(2026, 12, 2, 10, 0),
            "the current slot is still today"
        );
        assert_eq!(parse_at("tomorrow 14:00", now, SLOT).unwrap().0, at(2026, 12, 3, 14, 0));
        assert_eq!(parse_at("today 16:30", now, SLOT).unwrap().0, at(2026, 12, 2, 16, 30));
        assert_eq!(
            parse_at("2026-12-03 09:30", now, SLOT).unwrap().0,
            at(2026, 12, 3, 9, 30)
        );
        assert_eq!(
            parse_at("2026-12-03T09:30", now, SLOT).unwrap().0,
            at(2026, 12, 3, 9, 30)
        );
        assert_eq!(
            parse_at("+2h", now, SLOT).unwrap(),
            (at(2026, 12, 2, 12, 30), true),
            "rounded up to the slot"
        );
        assert_eq!(parse_at("+1h53m", now, SLOT).unwrap(), (at(2026, 12, 2, 12, 0), false));
        let dec31 = at(2026, 12, 31, 23, 0);
        assert_eq!(
            parse_at("tomorrow 08:00", dec31, SLOT).unwrap().0,
            at(2027, 1, 1, 8, 0),
            "across the year"
        );
        for (s, want) in [
            ("teatime", "is not a time"),
            ("25:00", "is not a time"),
            ("tomorrow 9", "is not a time"),
            ("2026-02-31 10:00", "2026-02 has no day 31"),
            ("2026-13-01 10:00", "is not a time"),
            ("+soon", "after `+` write a duration"),
        ] {
            let e = parse_at(s, now, SLOT).unwrap_err().to_string();
            assert!(e.contains(want), "{s}: {e}");
        }
    }
}
