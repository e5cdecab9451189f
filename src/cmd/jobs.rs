//! The queue and one job: `ls`, `show`, `logs`, `cancel`, `priority`, `hold`, `release`.

use anyhow::{bail, Result};
use gantry_core::protocol::JobState;

use super::Ctx;
use crate::print::{print_detail, print_json, print_queue};
use crate::term::{outln, write_out, TermSafe};

/// `gantry ls`: with `limit`, a page of the queue (the next jobs to start and the caller's own);
/// without, all of it.
pub async fn ls(ctx: &Ctx, limit: Option<usize>) -> Result<()> {
    let (q, queued) = match limit {
        Some(n) => {
            let p = ctx.client.queue_page(n).await?;
            (p.jobs, p.queued)
        }
        None => {
            let q = ctx.client.queue().await?;
            let n = q.iter().filter(|e| e.job.state == JobState::Queued).count();
            (q, n)
        }
    };
    if ctx.json {
        return print_json(&q);
    }
    print_queue(&q);
    let shown = q.iter().filter(|e| e.job.state == JobState::Queued).count();
    if shown < queued {
        outln!(
            "… {} more queued jobs not shown (gantry ls --all shows every job)",
            queued - shown
        );
    }
    Ok(())
}

pub async fn show(ctx: &Ctx, id: i64) -> Result<()> {
    let d = ctx.client.job(id).await?;
    if ctx.json {
        print_json(&d)
    } else {
        print_detail(&d);
        // Its metrics and params, for whoever may see them (owner and admins, like its output).
        if !d.job.spec_hidden {
            if let Ok(r) = ctx.client.job_results(id, Some(0)).await {
                super::results::print_results(&r);
            }
        }
        Ok(())
    }
}

pub async fn logs(ctx: &Ctx, id: i64, follow: bool) -> Result<()> {
    // Raw for the job's owner (progress bars, colours); escaped when someone else (root)
    // reads it on a terminal, since the owner wrote it.
    let me = ctx.client.whoami().await?;
    let d = ctx.client.job(id).await?;
    let mut safe =
        (std::io::IsTerminal::is_terminal(&std::io::stdout()) && me.uid != d.job.owner_uid).then(TermSafe::default);
    // A job that has not started has no output (of this attempt) yet: say so, on stderr.
    if d.job.state == JobState::Queued {
        let why = d.reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default();
        let next = if follow {
            "its output follows once it starts".to_string()
        } else {
            format!("`gantry logs -f {id}` waits for its output")
        };
        eprintln!("gantry: job {id} is queued, not started yet{why}; {next}");
    }
    let mut show = |chunk: &[u8]| match safe.as_mut() {
        Some(s) => write_out(s.feed(chunk).as_bytes()),
        None => write_out(chunk),
    };
    if follow {
        ctx.client
            .follow_logs(id, |chunk| {
                show(chunk);
                true
            })
            .await?;
    } else {
        ctx.client
            .logs_chunks(id, |chunk| {
                show(chunk);
                true
            })
            .await?;
    }
    Ok(())
}

pub async fn cancel(ctx: &Ctx, id: i64) -> Result<()> {
    match ctx.client.cancel(id).await? {
        JobState::Queued => outln!("job {id} cancelled"),
        JobState::Starting | JobState::Running => {
            outln!("job {id} is being stopped (SIGTERM, then SIGKILL after the grace period)")
        }
        s => outln!("job {id} had already ended ({})", s.as_str()),
    }
    Ok(())
}

pub async fn priority(ctx: &Ctx, id: i64, priority: i32) -> Result<()> {
    if !ctx.client.set_priority(id, priority).await? {
        bail!("job {id} is no longer queued; only queued jobs change priority");
    }
    outln!("job {id} priority set to {priority}");
    Ok(())
}

/// `gantry hold` (`held`) and `gantry release`.
pub async fn hold(ctx: &Ctx, id: i64, held: bool) -> Result<()> {
    let ok = if held {
        ctx.client.hold(id).await?
    } else {
        ctx.client.release(id).await?
    };
    match (ok, held) {
        (true, true) => outln!("job {id} is held: it stays queued until `gantry release {id}`"),
        (true, false) => outln!("job {id} released: it starts when the scheduler places it"),
        (false, true) => {
            bail!("job {id} is not waiting in the queue, or is held already; only queued jobs can be held")
        }
        (false, false) => bail!("job {id} is not held (or no longer queued); nothing to release"),
    }
    Ok(())
}
