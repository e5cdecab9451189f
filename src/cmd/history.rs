//! What ran: `gantry history` and `gantry usage`.

use anyhow::{Context, Result};
use gantry_core::clock::now_ms;
use gantry_core::protocol::{HistoryFilter, JobState};

use super::Ctx;
use crate::print::{print_history, print_json, print_usage};

pub async fn history(
    ctx: &Ctx,
    user: Option<String>,
    status: Option<&str>,
    since: Option<&str>,
    limit: u32,
    metric: Option<String>,
) -> Result<()> {
    let status = match status {
        Some(s) => Some(
            JobState::parse(s)
                .with_context(|| format!("unknown status {s:?}: use succeeded, failed, cancelled or timed_out"))?,
        ),
        None => None,
    };
    let since = since.map(parse_since).transpose()?;
    let rows = ctx
        .client
        .history(&HistoryFilter {
            user,
            status,
            since,
            limit: Some(limit),
            metric: metric.clone(),
            ..HistoryFilter::default()
        })
        .await?;
    if ctx.json {
        print_json(&rows)
    } else {
        print_history(&rows, metric.as_deref());
        Ok(())
    }
}

pub async fn usage(ctx: &Ctx, since: &str, csv: bool, efficiency: bool) -> Result<()> {
    if efficiency {
        let q = gantry_core::protocol::EfficiencyQuery {
            since_ms: parse_since(since)?,
            tz_offset_min: 0,
        };
        let r = ctx.client.usage_efficiency(&q).await?;
        if ctx.json {
            return print_json(&r);
        }
        crate::print_efficiency::print_usage_efficiency(&r);
        return Ok(());
    }
    if csv {
        let q = gantry_core::protocol::UsageChartsQuery {
            since_ms: parse_since(since)?,
            bucket_ms: 86_400_000,
            tz_offset_min: 0,
        };
        let c = ctx.client.usage_charts(&q).await?;
        print!("{}", usage_csv(&c.buckets));
        return Ok(());
    }
    let r = ctx.client.usage(parse_since(since)?).await?;
    if ctx.json {
        print_json(&r)
    } else {
        print_usage(&r);
        Ok(())
    }
}

/// `--since`: a duration back from now (`2h`, `7d`) or an RFC 3339 time, as ms.
fn parse_since(s: &str) -> Result<i64> {
    if let Ok(d) = humantime::parse_duration(s) {
        return Ok(now_ms() - d.as_millis() as i64);
    }
    let t = humantime::parse_rfc3339_weak(s)
        .with_context(|| format!("--since {s:?}: write a duration like `2h` or a time like `2026-11-01T09:00:00`"))?;
    Ok(t.duration_since(std::time::UNIX_EPOCH)?.as_millis() as i64)
}

/// `day,user,gpu_hours` (UTC days, `YYYY-MM-DD`), one row per user and day; quoted where a user
/// name needs it (RFC 4180).
pub fn usage_csv(buckets: &[gantry_core::protocol::UsageBucket]) -> String {
    let mut out = String::from("day,user,gpu_hours\n");
    for b in buckets {
        let day = humantime::format_rfc3339_seconds(
            std::time::UNIX_EPOCH + std::time::Duration::from_millis(b.start.max(0) as u64),
        )
        .to_string();
        let user = if b.user.contains([',', '"', '\n', '\r']) {
            format!("\"{}\"", b.user.replace('"', "\"\""))
        } else {
            b.user.clone()
        };
        out.push_str(&format!("{},{user},{:.3}\n", &day[..10], b.gpu_hours));
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn usage_csv_has_a_header_a_row_per_user_and_day_and_quotes_odd_names() {
        use gantry_core::protocol::UsageBucket;
        let day = 86_400_000;
        let b = vec![
            UsageBucket {
                start: 20_000 * day,
                user: "ada".into(),
                gpu_hours: 1.5,
            },
            UsageBucket {
                start: 20_001 * day,
                user: "o\"brien,x".into(),
                gpu_hours: 0.25,
            },
        ];
        assert_eq!(
            super::usage_csv(&b),
            "day,user,gpu_hours\n2024-10-04,ada,1.500\n2024-10-05,\"o\"\"brien,x\",0.250\n"
        );
    }
}
