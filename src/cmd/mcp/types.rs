//! The MCP tools' inputs and outputs: each a JSON Schema (schemars) the client sees in `tools/list`.
//! Engine views that other commands print whole (a job's detail, the GPUs) are passed on as the
//! engine's JSON (`detail`), beside the few fields an agent acts on.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One job, by id.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct JobId {
    /// The job's id (`list_jobs`, `job_history`).
    pub id: i64,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ListJobs {
    /// Queued jobs shown: the next N to start and your first N (default 20). Running jobs are all shown.
    #[serde(default)]
    pub limit: Option<usize>,
}

/// A running or queued job in the queue.
#[derive(Debug, Serialize, JsonSchema)]
pub struct QueueItem {
    pub id: i64,
    pub name: String,
    pub owner: String,
    /// queued, starting or running.
    pub state: String,
    /// GPUs it asks for (0: CPU only).
    pub gpus: u32,
    /// GPU indexes it holds (running).
    pub gpus_assigned: Vec<u32>,
    pub priority: i32,
    /// Place among queued jobs (1: next to start).
    pub position: Option<usize>,
    /// Why it waits, in the scheduler's words.
    pub reason: Option<String>,
    /// Estimated start, local time (`YYYY-MM-DD HH:MM`), assuming nothing new arrives.
    pub estimated_start: Option<String>,
    /// Submitted, local time.
    pub submitted_at: String,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct QueueOut {
    pub jobs: Vec<QueueItem>,
    /// Jobs queued in all (shown or not).
    pub queued_total: usize,
    /// Your user name, as the engine sees you.
    pub you: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct History {
    /// Only this user's runs.
    #[serde(default)]
    pub user: Option<String>,
    /// succeeded, failed, cancelled or timed_out.
    #[serde(default)]
    pub status: Option<String>,
    /// Finished within this long (`2h`, `7d`).
    #[serde(default)]
    pub since: Option<String>,
    /// Names containing this text.
    #[serde(default)]
    pub text: Option<String>,
    /// At most this many, newest first (default 20).
    #[serde(default)]
    pub limit: Option<u32>,
}

/// A finished run.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Run {
    pub id: i64,
    pub name: String,
    pub owner: String,
    pub image: String,
    /// succeeded, failed, cancelled or timed_out.
    pub status: String,
    pub exit_code: Option<i64>,
    pub gpus: Vec<u32>,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
    /// Seconds from start to end.
    pub runtime_s: Option<i64>,
    pub attempts: u32,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct HistoryOut {
    pub runs: Vec<Run>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct JobOut {
    pub id: i64,
    pub name: String,
    pub owner: String,
    pub state: String,
    pub exit_code: Option<i64>,
    /// How its last attempt ended: exited, oom, timeout, cancelled, lost, engine_error, preempted.
    pub end_reason: Option<String>,
    /// Why it waits (queued).
    pub reason: Option<String>,
    /// The engine's whole view of the job (spec, attempts, events; run results and efficiency where
    /// the engine has them). The spec is hidden unless it is yours.
    pub detail: Value,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ReadLog {
    /// The job's id.
    pub id: i64,
    /// The last N lines (default 100; at most 2000).
    #[serde(default)]
    pub tail: Option<usize>,
    /// Only lines containing this text (any case), e.g. `error` or `loss`.
    #[serde(default)]
    pub pattern: Option<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct LogOut {
    pub id: i64,
    /// The lines asked for, oldest first.
    pub lines: Vec<String>,
    /// Lines in the whole log (or that matched `pattern`).
    pub total_lines: usize,
    /// Some lines were left out (only the last `tail` are here).
    pub truncated: bool,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct GpuItem {
    pub index: u32,
    pub name: String,
    pub memory_total_mib: u64,
    pub memory_used_mib: u64,
    pub utilization_pct: u32,
    /// Jobs holding it.
    pub jobs: Vec<i64>,
    /// Reserved for a waiting job.
    pub reserved: bool,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct GpusOut {
    /// docker or slurm.
    pub backend: String,
    pub gpus: Vec<GpuItem>,
    /// Anything the engine says about its GPUs (simulated, NVML missing).
    pub note: Option<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct WaitOut {
    pub id: i64,
    pub state: String,
    pub position: Option<usize>,
    /// Why it is not running (empty once it runs).
    pub reason: Option<String>,
    /// Estimated start, local time (`YYYY-MM-DD HH:MM`).
    pub estimated_start: Option<String>,
    /// How sure the estimate is (`p50`: even odds).
    pub eta_confidence: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct Compare {
    /// Two or more job ids.
    pub ids: Vec<i64>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct CompareItem {
    pub id: i64,
    pub name: String,
    pub state: String,
    pub exit_code: Option<i64>,
    pub runtime_s: Option<i64>,
    /// The spec fields in `differences`, as this job has them (hidden unless yours).
    pub fields: Value,
    /// Its run results (metrics, params) where the engine records them.
    pub results: Option<Value>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct CompareOut {
    pub jobs: Vec<CompareItem>,
    /// Spec fields whose values differ between the jobs.
    pub differences: Vec<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct TriageOut {
    pub id: i64,
    pub name: String,
    pub state: String,
    pub exit_code: Option<i64>,
    /// The engine's reason for the end: exited, oom, timeout, cancelled, lost, engine_error, preempted.
    pub end_reason: Option<String>,
    /// The engine's message about it.
    pub message: Option<String>,
    pub attempts: u32,
    /// Lines that look like the error (tracebacks, `error`, CUDA, OOM, killed), then the last lines.
    pub log_lines: Vec<String>,
    /// What to change before running it again.
    pub advice: Vec<String>,
}

/// A job spec to preview or submit: a file on this machine, or the spec's text.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct SpecIn {
    /// A spec file (YAML or TOML), absolute or relative to the server's directory.
    #[serde(default)]
    pub path: Option<String>,
    /// The spec's text, YAML unless `file_name` ends in `.toml` (e.g. `image: pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime\ngpus: 1\ncommand: python train.py`).
    /// Relative mounts start from the server's directory.
    #[serde(default)]
    pub spec: Option<String>,
    /// With `spec`: its name (`train.yaml`), which names the job and picks the format.
    #[serde(default)]
    pub file_name: Option<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct PreviewOut {
    /// Each job it would queue: its checked spec, and the GPUs it would get now, or why it would
    /// wait and its estimated start.
    pub jobs: Value,
    /// The lab's limits it meets.
    pub checks: Vec<String>,
    /// Always true: nothing was queued.
    pub dry_run: bool,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct SubmittedOut {
    /// The new jobs (a `matrix` makes several).
    pub job_ids: Vec<i64>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ActionOut {
    pub id: i64,
    /// What happened, in words.
    pub result: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ListBookings {
    /// Also the ones that ended, were cancelled or released.
    #[serde(default)]
    pub all: bool,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct BookingsOut {
    /// Each booking: owner, GPUs, start and end (ms and local time), state; notes are the owner's.
    pub bookings: Value,
    /// The lab's rules for bookings.
    pub rules: Value,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct BookGpus {
    /// How many GPUs (the lab's `max_gpus` per booking bounds it).
    pub gpus: u32,
    /// Only GPUs of this type (a name as `gpus` lists it), if the machine has several kinds.
    #[serde(default)]
    pub gpu_type: Option<String>,
    /// When it starts, in the machine's local time: `14:00`, `tomorrow 08:00`, `2026-12-03 09:30`, or `+2h`
    /// (rounded up to the lab's slot).
    pub at: String,
    /// How long: `4h`, `90m` (a whole number of the lab's slots). `--for` in the engine's messages.
    #[serde(rename = "for")]
    pub length: String,
    /// A note for yourself (others see the owner and time, not the note).
    #[serde(default)]
    pub note: Option<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct BookedOut {
    /// The booking's id (cancel_booking takes it).
    pub id: i64,
    /// Its local start and end.
    pub start: String,
    pub end: String,
    /// A `+` start was rounded up to the lab's slot.
    pub rounded_up: bool,
    /// The engine's whole view of it (owner, GPUs, state, note).
    pub booking: Value,
}

/// One booking, by id.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct BookingId {
    /// The booking's id (`list_bookings`, `book_gpus`).
    pub id: i64,
}
