//! `gantry notify add|ls|rm|test|log`: the caller's notification targets.

use anyhow::{bail, Result};
use gantry_core::protocol::{DeliveryState, NotifyAdd, NotifyEvent, NotifyTarget};

use super::Ctx;
use crate::cli::NotifyAction;
use crate::print::{ago, print_json};

/// `--on a,b`: each an event name; none given is the default.
fn events(on: &[String]) -> Result<Vec<NotifyEvent>> {
    on.iter()
        .filter(|s| !s.trim().is_empty())
        .map(|s| match NotifyEvent::parse(s.trim()) {
            Some(e) => Ok(e),
            None => bail!("--on {s:?} is not an event; use some of: started, finished, failed, timed_out, cancelled, preempted, session_idle, booking_starting, booking_released"),
        })
        .collect()
}

fn names(on: &[NotifyEvent]) -> String {
    on.iter().map(|e| e.as_str()).collect::<Vec<_>>().join(",")
}

pub async fn notify(ctx: &Ctx, action: &NotifyAction) -> Result<()> {
    match action {
        NotifyAction::Add { kind, address, on, job } => {
            let target = match kind.as_str() {
                "email" => NotifyTarget::Email { address: address.clone() },
                "webhook" => NotifyTarget::Webhook { url: address.clone() },
                other => bail!("`{other}` is not a kind of target: write `gantry notify add email ADDRESS` or `gantry notify add webhook URL`"),
            };
            let s = ctx
                .client
                .notify_add(&NotifyAdd {
                    target,
                    on: events(on)?,
                    job: *job,
                })
                .await?;
            if ctx.json {
                return print_json(&s);
            }
            println!(
                "added target {}: {} {} on {}{}",
                s.id,
                s.target.kind(),
                s.target.address(),
                names(&s.on),
                s.job.map(|j| format!(" (job {j} only)")).unwrap_or_default()
            );
            println!("check it with `gantry notify test`");
        }
        NotifyAction::Ls => {
            let subs = ctx.client.notify_list().await?;
            if ctx.json {
                return print_json(&subs);
            }
            if subs.is_empty() {
                println!("no notification targets; add one with `gantry notify add email ADDRESS` or `gantry notify add webhook URL`");
            }
            println!("{:<5} {:<8} {:<40} {:<28} WHOSE", "ID", "KIND", "TARGET", "ON");
            for s in subs {
                let whose = match (&s.owner, s.job) {
                    (None, _) => "the lab's".to_string(),
                    (Some(_), Some(j)) => format!("yours, job {j}"),
                    (Some(_), None) => "yours".to_string(),
                };
                println!(
                    "{:<5} {:<8} {:<40} {:<28} {whose}",
                    s.id,
                    s.target.kind(),
                    s.target.address(),
                    names(&s.on)
                );
            }
        }
        NotifyAction::Rm { id } => {
            let gone = ctx.client.notify_remove(*id).await?;
            if ctx.json {
                return print_json(&gone);
            }
            if !gone {
                bail!("you have no notification target {id} (`gantry notify ls` lists yours)");
            }
            println!("removed target {id}");
        }
        NotifyAction::Test => {
            let sent = ctx.client.notify_test().await?;
            if ctx.json {
                return print_json(&sent);
            }
            for d in sent {
                println!(
                    "test notification {} queued for {} {}; `gantry notify log` shows when it is delivered",
                    d.id,
                    d.target.kind(),
                    d.target.address()
                );
            }
        }
        NotifyAction::Log { limit } => {
            let log = ctx.client.notify_log(*limit).await?;
            if ctx.json {
                return print_json(&log);
            }
            println!(
                "{:<10} {:<16} {:<6} {:<40} {:<10} {:>5}  NOTE",
                "WHEN", "EVENT", "JOB", "TARGET", "STATE", "TRIES"
            );
            for d in log {
                let note = match d.state {
                    DeliveryState::Pending if d.tries > 0 => format!(
                        "next try {}; {}",
                        d.next_at
                            .map(|t| format!("in {}s", ((t - gantry_core::clock::now_ms()) / 1000).max(0)))
                            .unwrap_or_default(),
                        d.last_error.unwrap_or_default()
                    ),
                    _ => d.last_error.unwrap_or_default(),
                };
                let job = d.job_id.map(|j| j.to_string()).unwrap_or_else(|| "-".into());
                println!(
                    "{:<10} {:<16} {:<6} {:<40} {:<10} {:>5}  {note}",
                    ago(d.at),
                    d.event.as_str(),
                    job,
                    d.target.address(),
                    d.state.as_str(),
                    d.tries
                );
            }
        }
    }
    Ok(())
}
