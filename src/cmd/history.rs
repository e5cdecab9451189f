//! What ran: `gantry history` and `gantry usage`.

use anyhow::{Context, Result};
use gantry_core::protocol::{HistoryFilter, JobState};
use gantry_core::clock::now_ms;

use super::Ctx;
use crate::print::{print_history, print_json, print_usage};

pub async fn history(ctx: &Ctx, user: Option<String>, status: Option<&str>, since: Option<&str>, limit: u32) -> Result<()> {
    let status = match status {
        Some(s) => Some(JobState::parse(s).with_context(|| format!("unknown status {s:?}: use succeeded, failed, cancelled or timed_out"))?),
        None => None,
    };
    let since = since.map(parse_since).transpose()?;
    let rows = ctx.client.history(&HistoryFilter { user, status, since, limit: Some(limit), ..HistoryFilter::default() }).await?;
    if ctx.json {
        print_json(&rows)
    } else {
        print_history(&rows);
        Ok(())
    }
}

pub async fn usage(ctx: &Ctx, since: &str) -> Result<()> {
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
    let t = humantime::parse_rfc3339_weak(s).with_context(|| format!("--since {s:?}: write a duration like `2h` or a time like `2026-11-01T09:00:00`"))?;
    Ok(t.duration_since(std::time::UNIX_EPOCH)?.as_millis() as i64)
}
