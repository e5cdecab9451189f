//! `gantry mcp`: a Model Context Protocol server on stdin/stdout (rmcp), for coding agents. It is a
//! client like the CLI: every tool is one or a few typed [`Client`] calls to the engine this
//! command found (the local socket, or `--host` over ssh), so the engine sees the user who started
//! it and every rule holds as for the CLI (owner-only logs and specs, the lab's limits). An engine
//! error is the tool's error (`isError`, the engine's message), never the server's end.

mod triage;
mod types;

use std::process::ExitCode;

use anyhow::Result;
use gantry_core::client::{Client, ClientError};
use gantry_core::protocol::{BookingsQuery, HistoryFilter, JobDetailView, JobState, SpecOrigin, SubmitRequest};
use gantry_core::units::local_datetime;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::model::{Implementation, ServerCapabilities, ServerInfo};
use rmcp::{tool, tool_handler, tool_router, ServerHandler, ServiceExt};
use serde_json::Value;

use super::Ctx;
use types::*;

/// What the server tells the agent on `initialize`: how to use the tools well.
const INSTRUCTIONS: &str = "Gantry is the GPU job queue of a shared workstation; you act as the user who started this \
server, under the lab's rules. Read first: `list_jobs` (the queue, why each job waits) and `gpus`. Before \
`submit_job`, call `preview_submit` with the same spec: it checks it and says which GPUs it would get now or \
why it would wait, and queues nothing. When a job failed, call `triage_job` (its end reason, exit code, the \
relevant log lines, what to change) before `rerun_job`: a rerun repeats the same spec. Cancel only your own \
jobs, and only when asked. Book GPUs (`book_gpus`) or cancel a booking only when asked; `list_bookings` says \
the lab's rules and who holds what.";

/// Lines `read_log` returns at most.
const MAX_TAIL: usize = 2000;

pub async fn serve(ctx: Ctx) -> Result<ExitCode> {
    let server = Gantry {
        client: ctx.client.clone(),
        local: ctx.remote.is_none(),
        tool_router: Gantry::tool_router(),
    };
    let running = server
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| anyhow::anyhow!("starting the MCP server on stdin/stdout: {e}"))?;
    running
        .waiting()
        .await
        .map_err(|e| anyhow::anyhow!("the MCP session ended with an error: {e}"))?;
    Ok(ExitCode::SUCCESS)
}

#[derive(Clone)]
pub struct Gantry {
    client: Client,
    /// The engine is on this machine: a spec's relative mounts start from the current directory.
    local: bool,
    tool_router: ToolRouter<Self>,
}

/// The engine's refusal as the agent should read it (with the spec's line and the fix, if any).
fn err(e: ClientError) -> String {
    match e {
        ClientError::Api {
            spec_error: Some(se), ..
        } => se.to_string(),
        e => e.to_string(),
    }
}

fn at(ms: i64) -> String {
    local_datetime(ms)
}

fn runtime_s(start: Option<i64>, end: Option<i64>) -> Option<i64> {
    Some((end? - start?) / 1000)
}

fn end_reason(d: &JobDetailView) -> Option<String> {
    d.attempts.last().and_then(|a| a.reason).map(|r| r.as_str().to_string())
}

impl Gantry {
    async fn detail(&self, id: i64) -> Result<JobDetailView, String> {
        self.client.job(id).await.map_err(err)
    }

    /// The request a [`SpecIn`] makes: a file read like `gantry submit` reads it, or the text.
    fn request(&self, s: &SpecIn) -> Result<SubmitRequest, String> {
        match (&s.path, &s.spec) {
            (Some(p), None) => self.client.spec_request(std::path::Path::new(p)).map_err(err),
            (None, Some(text)) => {
                let base_dir = if self.local { std::env::current_dir().ok() } else { None };
                Ok(SubmitRequest {
                    text: text.clone(),
                    file_name: s.file_name.clone().unwrap_or_else(|| "job.yaml".into()),
                    base_dir,
                    idempotency_key: None,
                    origin: SpecOrigin::File,
                    begin: None,
                })
            }
            _ => Err("give either `path` (a spec file) or `spec` (its text), not both and not neither".into()),
        }
    }
}

#[tool_router]
impl Gantry {
    #[tool(
        description = "The queue: every running job and the next queued ones, with why each waits and its estimated start.",
        annotations(
            title = "List the queue",
            read_only_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn list_jobs(&self, Parameters(p): Parameters<ListJobs>) -> Result<Json<QueueOut>, String> {
        let page = self
            .client
            .queue_page(p.limit.unwrap_or(20).max(1))
            .await
            .map_err(err)?;
        let you = self.client.whoami().await.map_err(err)?.name;
        let jobs = page
            .jobs
            .into_iter()
            .map(|e| QueueItem {
                id: e.job.id,
                name: e.job.name,
                owner: e.job.owner,
                state: e.job.state.as_str().into(),
                gpus: e.job.gpus,
                gpus_assigned: e.gpus_assigned,
                priority: e.job.priority,
                position: e.position,
                reason: e.reason,
                estimated_start: e.estimated_start.map(at),
                submitted_at: at(e.job.submitted_at),
            })
            .collect();
        Ok(Json(QueueOut {
            jobs,
            queued_total: page.queued,
            you,
        }))
    }

    #[tool(
        description = "Finished runs, newest first: status, exit code, GPUs, runtime. Filter by user, status, age or name.",
        annotations(
            title = "Job history",
            read_only_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn job_history(&self, Parameters(p): Parameters<History>) -> Result<Json<HistoryOut>, String> {
        let status = match p.status.as_deref() {
            None => None,
            Some(s) => Some(
                JobState::parse(s)
                    .filter(|s| s.is_final())
                    .ok_or_else(|| format!("status {s:?} is not one of succeeded, failed, cancelled, timed_out"))?,
            ),
        };
        let since = match p.since.as_deref() {
            None => None,
            Some(s) => {
                let d = humantime::parse_duration(s.trim())
                    .map_err(|_| format!("since {s:?} is not a duration: write e.g. 2h or 7d"))?;
                Some(gantry_core::clock::now_ms() - d.as_millis() as i64)
            }
        };
        let filter = HistoryFilter {
            user: p.user,
            status,
            since,
            limit: Some(p.limit.unwrap_or(20).clamp(1, 500)),
            text: p.text,
            ..Default::default()
        };
        let rows = self.client.history(&filter).await.map_err(err)?;
        let runs = rows
            .into_iter()
            .map(|r| Run {
                runtime_s: runtime_s(r.started_at, r.finished_at),
                id: r.id,
                name: r.name,
                owner: r.owner,
                image: r.image,
                status: r.status.as_str().into(),
                exit_code: r.exit_code,
                gpus: r.gpus,
                started_at: r.started_at.map(at),
                finished_at: r.finished_at.map(at),
                attempts: r.attempts,
            })
            .collect();
        Ok(Json(HistoryOut { runs }))
    }

    #[tool(
        description = "One job: state, exit code, end reason, why it waits, and the engine's whole view (spec, attempts, events, run results and efficiency where recorded; the spec only if it is yours).",
        annotations(
            title = "Show a job",
            read_only_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn show_job(&self, Parameters(p): Parameters<JobId>) -> Result<Json<JobOut>, String> {
        let d = self.detail(p.id).await?;
        let mut raw = serde_json::to_value(&d).map_err(|e| e.to_string())?;
        // Its run results (summaries: last and best per metric, params, tags) where the engine records
        // them and the caller may read them (owner, admins); else none.
        if let Ok(r) = self.client.job_results(p.id, Some(0)).await {
            if let Some(o) = raw.as_object_mut() {
                o.insert("results".into(), serde_json::to_value(&r).unwrap_or_default());
            }
        }
        Ok(Json(JobOut {
            id: d.job.id,
            end_reason: end_reason(&d),
            name: d.job.name,
            owner: d.job.owner,
            state: d.job.state.as_str().into(),
            exit_code: d.job.exit_code,
            reason: d.reason,
            detail: raw,
        }))
    }

    #[tool(
        description = "A job's output: the last N lines (default 100), or only the lines containing a text (any case). Only your own jobs' logs (admins: anyone's).",
        annotations(
            title = "Read a job's log",
            read_only_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn read_log(&self, Parameters(p): Parameters<ReadLog>) -> Result<Json<LogOut>, String> {
        let tail = p.tail.unwrap_or(100).clamp(1, MAX_TAIL);
        let (lines, total) = triage::log_lines(&self.client, p.id, tail, p.pattern.as_deref())
            .await
            .map_err(err)?;
        Ok(Json(LogOut {
            id: p.id,
            truncated: total > lines.len(),
            total_lines: total,
            lines,
        }))
    }

    #[tool(
        description = "The GPUs: name, memory, utilization, which jobs hold each, which are reserved for a waiting job.",
        annotations(
            title = "GPUs",
            read_only_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn gpus(&self) -> Result<Json<GpusOut>, String> {
        let g = self.client.gpus().await.map_err(err)?;
        let gpus = g
            .gpus
            .iter()
            .map(|s| GpuItem {
                index: s.index,
                name: s.name.clone(),
                memory_total_mib: s.memory_total >> 20,
                memory_used_mib: s.memory_used >> 20,
                utilization_pct: s.utilization,
                jobs: g
                    .holders
                    .iter()
                    .find(|h| h.0 == s.index)
                    .map(|h| h.1.clone())
                    .unwrap_or_default(),
                reserved: g.reserved.contains(&s.index),
            })
            .collect();
        Ok(Json(GpusOut {
            backend: format!("{:?}", g.backend).to_lowercase(),
            gpus,
            note: g.note,
        }))
    }

    #[tool(
        description = "Why a job is not running yet, its place in the queue and its estimated start.",
        annotations(
            title = "Why does a job wait",
            read_only_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn why_waiting(&self, Parameters(p): Parameters<JobId>) -> Result<Json<WaitOut>, String> {
        let q = self.client.queue().await.map_err(err)?;
        if let Some(e) = q.into_iter().find(|e| e.job.id == p.id) {
            return Ok(Json(WaitOut {
                id: p.id,
                state: e.job.state.as_str().into(),
                position: e.position,
                reason: e.reason,
                estimated_start: e.estimated_start.map(at),
                eta_confidence: e.eta_confidence,
            }));
        }
        let d = self.detail(p.id).await?;
        Ok(Json(WaitOut {
            id: p.id,
            state: d.job.state.as_str().into(),
            position: None,
            reason: Some(format!(
                "it is not waiting: it {} (see triage_job or show_job)",
                d.job.state.as_str()
            )),
            estimated_start: None,
            eta_confidence: None,
        }))
    }

    #[tool(
        description = "Compare runs: state, exit code, runtime, the spec fields that differ between them, and their run results where recorded.",
        annotations(
            title = "Compare runs",
            read_only_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn compare_jobs(&self, Parameters(p): Parameters<Compare>) -> Result<Json<CompareOut>, String> {
        triage::compare(&self.client, &p.ids).await.map(Json)
    }

    #[tool(
        description = "Why a job failed: its state, exit code, the engine's reason (oom, timeout, lost, preempted, ...), its message, the log lines that look like the error and the last lines, and what to change before running it again.",
        annotations(
            title = "Triage a failed job",
            read_only_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn triage_job(&self, Parameters(p): Parameters<JobId>) -> Result<Json<TriageOut>, String> {
        triage::triage(&self.client, p.id).await.map(Json)
    }

    #[tool(
        description = "Dry run of submit_job: checks the spec as a submit would (as you, the lab's limits) and says which GPUs each job would get now, or why it would wait and its estimated start. Queues nothing.",
        annotations(
            title = "Preview a submission",
            read_only_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn preview_submit(&self, Parameters(p): Parameters<SpecIn>) -> Result<Json<PreviewOut>, String> {
        let req = self.request(&p)?;
        let pv = self.client.preview(&req).await.map_err(err)?;
        Ok(Json(PreviewOut {
            jobs: serde_json::to_value(&pv.jobs).map_err(|e| e.to_string())?,
            checks: pv.checks,
            dry_run: true,
        }))
    }

    #[tool(
        description = "Queue a job spec (a file, or its text). Preview it first with preview_submit.",
        annotations(
            title = "Submit a job",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn submit_job(&self, Parameters(p): Parameters<SpecIn>) -> Result<Json<SubmittedOut>, String> {
        let req = self.request(&p)?;
        let s = self.client.submit(&req).await.map_err(err)?;
        Ok(Json(SubmittedOut { job_ids: s.job_ids }))
    }

    #[tool(
        description = "Cancel one of your jobs: a queued one is dropped, a running one stopped (SIGTERM, then SIGKILL after the grace period).",
        annotations(
            title = "Cancel a job",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn cancel_job(&self, Parameters(p): Parameters<JobId>) -> Result<Json<ActionOut>, String> {
        let was = self.client.cancel(p.id).await.map_err(err)?;
        let result = match was {
            JobState::Queued => "cancelled (it had not started)".to_string(),
            JobState::Starting | JobState::Running => {
                "being stopped (SIGTERM, then SIGKILL after the grace period)".to_string()
            }
            s => format!("it had already ended ({})", s.as_str()),
        };
        Ok(Json(ActionOut { id: p.id, result }))
    }

    #[tool(
        description = "Keep one of your queued jobs from starting until release_job.",
        annotations(
            title = "Hold a job",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn hold_job(&self, Parameters(p): Parameters<JobId>) -> Result<Json<ActionOut>, String> {
        if !self.client.hold(p.id).await.map_err(err)? {
            return Err(format!(
                "job {} is not waiting in the queue, or is held already; only queued jobs can be held",
                p.id
            ));
        }
        Ok(Json(ActionOut {
            id: p.id,
            result: "held: it stays queued until release_job".into(),
        }))
    }

    #[tool(
        description = "Let one of your held jobs start again.",
        annotations(
            title = "Release a job",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn release_job(&self, Parameters(p): Parameters<JobId>) -> Result<Json<ActionOut>, String> {
        if !self.client.release(p.id).await.map_err(err)? {
            return Err(format!(
                "job {} is not held (or no longer queued); nothing to release",
                p.id
            ));
        }
        Ok(Json(ActionOut {
            id: p.id,
            result: "released: it starts when the scheduler places it".into(),
        }))
    }

    #[tool(
        description = "Queue one of your jobs again with the same spec (triage_job first: the same spec fails the same way). A `begin` of the first run is not repeated.",
        annotations(
            title = "Run a job again",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn rerun_job(&self, Parameters(p): Parameters<JobId>) -> Result<Json<SubmittedOut>, String> {
        let s = self.client.rerun(p.id).await.map_err(err)?;
        Ok(Json(SubmittedOut { job_ids: s.job_ids }))
    }

    #[tool(
        description = "GPU bookings (who holds which GPUs when; notes are the owner's) and the lab's booking rules.",
        annotations(
            title = "Bookings",
            read_only_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn list_bookings(&self, Parameters(p): Parameters<ListBookings>) -> Result<Json<BookingsOut>, String> {
        let b = self
            .client
            .bookings(&BookingsQuery {
                all: p.all,
                limit: None,
            })
            .await
            .map_err(err)?;
        let bookings: Vec<Value> = b
            .bookings
            .iter()
            .map(|v| {
                let mut j = serde_json::to_value(v).unwrap_or_default();
                if let Some(o) = j.as_object_mut() {
                    o.insert("start".into(), at(v.start_ms).into());
                    o.insert("end".into(), at(v.end_ms).into());
                }
                j
            })
            .collect();
        Ok(Json(BookingsOut {
            bookings: bookings.into(),
            rules: serde_json::to_value(&b.rules).unwrap_or_default(),
        }))
    }

    #[tool(
        description = "Book GPUs for a time, as `gantry book` does: from then on your jobs and sessions get them. The lab's booking rules (slots, how far ahead, how long, GPUs per booking, GPU-hours per week, clashes) hold; a refusal says which and what to ask instead.",
        annotations(
            title = "Book GPUs",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn book_gpus(&self, Parameters(p): Parameters<BookGpus>) -> Result<Json<BookedOut>, String> {
        let length = humantime::parse_duration(p.length.trim())
            .map_err(|_| format!("for {:?} is not a duration: write e.g. 4h or 90m", p.length))?;
        let (req, rounded_up, _) = super::book::request(&self.client, p.gpus, p.gpu_type, &p.at, length, p.note)
            .await
            .map_err(|e| format!("{e:#}"))?;
        let b = self.client.book(&req).await.map_err(err)?;
        Ok(Json(BookedOut {
            id: b.id,
            start: at(b.start_ms),
            end: at(b.end_ms),
            rounded_up,
            booking: serde_json::to_value(&b).map_err(|e| e.to_string())?,
        }))
    }

    #[tool(
        description = "Cancel one of your bookings (its GPUs go back to the queue).",
        annotations(
            title = "Cancel a booking",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn cancel_booking(&self, Parameters(p): Parameters<BookingId>) -> Result<Json<ActionOut>, String> {
        let b = self.client.cancel_booking(p.id).await.map_err(err)?;
        Ok(Json(ActionOut {
            id: b.id,
            result: format!(
                "{} ({}–{})",
                b.closed_why.as_deref().unwrap_or(b.state.as_str()),
                at(b.start_ms),
                at(b.end_ms)
            ),
        }))
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Gantry {
    fn get_info(&self) -> ServerInfo {
        ServerInfo::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("gantry", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }
}
