//! The stored model: jobs (states, attempts, events and history rows are the protocol's), the
//! engine's views of them, and how rows map to them.

use rusqlite::Row;
use serde::{Deserialize, Serialize};

use super::*;
use crate::spec::ValidJob;
// The rows the store returns to clients are wire types, defined in the protocol.
pub use crate::protocol::{
    Attempt, EndReason, Event, HistoryFilter, HistoryRow, JobState, QueueJob, QueueSession, TimelineRun,
};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    pub id: i64,
    pub name: String,
    pub owner_uid: u32,
    pub owner_gid: u32,
    pub owner: String,
    pub image: String,
    pub gpus: u32,
    pub gpu_memory: Option<u64>,
    pub priority: i32,
    pub retries: u32,
    pub timeout_ms: Option<i64>,
    pub job: ValidJob,
    pub state: JobState,
    pub source: String,
    pub submitted_at: i64,
    pub not_before: Option<i64>,
    pub started_at: Option<i64>,
    pub finished_at: Option<i64>,
    pub exit_code: Option<i64>,
    pub attempts: u32,
    pub cancel_requested: bool,
    pub message: Option<String>,
}

/// A job with its attempts and events, as the engine reports it (the API shows each caller a
/// `protocol::JobDetailView` of it).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobDetail {
    pub job: Job,
    pub attempts: Vec<Attempt>,
    pub events: Vec<Event>,
    pub reason: Option<String>,
}

/// What runs an attempt, typed: a container of the Docker backend, or a Slurm job (or one task of a
/// Slurm job array). Encoded in the attempt's columns and decoded back only here ([`Attempt::run_ref`],
/// [`Store::set_run`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RunRef {
    Container(String),
    Slurm { id: u64, task: Option<u32> },
}

impl RunRef {
    /// The container id, for a container.
    pub fn container(&self) -> Option<&str> {
        match self {
            RunRef::Container(c) => Some(c),
            RunRef::Slurm { .. } => None,
        }
    }

    /// The text form an older build kept in memory for a Slurm attempt (`slurm:ID` or `slurm:ID_TASK`),
    /// should it ever be found in the `container_id` column.
    fn from_text(text: &str) -> RunRef {
        let slurm = text.strip_prefix("slurm:").and_then(|t| match t.split_once('_') {
            Some((i, k)) => Some(RunRef::Slurm {
                id: i.parse().ok()?,
                task: Some(k.parse().ok()?),
            }),
            None => Some(RunRef::Slurm {
                id: t.parse().ok()?,
                task: None,
            }),
        });
        slurm.unwrap_or_else(|| RunRef::Container(text.to_string()))
    }
}

/// How its backend names it: a container id, or Slurm's `ID` / `ID_TASK` (what `scancel` and
/// `--dependency` take).
impl std::fmt::Display for RunRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunRef::Container(c) => f.write_str(c),
            RunRef::Slurm { id, task: None } => write!(f, "{id}"),
            RunRef::Slurm { id, task: Some(t) } => write!(f, "{id}_{t}"),
        }
    }
}

impl Attempt {
    /// What runs this attempt, once recorded: `None` while it is being created or submitted.
    pub fn run_ref(&self) -> Option<RunRef> {
        match (self.slurm_job_id, &self.container_id) {
            (Some(id), _) => Some(RunRef::Slurm {
                id,
                task: self.slurm_array_task,
            }),
            (None, Some(c)) => Some(RunRef::from_text(c)),
            (None, None) => None,
        }
    }
}

/// Who submits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
    pub name: String,
}

/// What ends an attempt and what happens to the job next.
#[derive(Debug, Clone, PartialEq)]
pub struct Ending {
    pub exit_code: Option<i64>,
    pub reason: EndReason,
    pub message: Option<String>,
    /// Final state, or `Queued` (with `not_before`) to retry.
    pub next: JobState,
    pub not_before: Option<i64>,
}

impl Job {
    /// The key the runtime estimator groups this job by (the same fields as [`QueuedRow::key`]).
    pub fn key(&self) -> crate::estimate::JobKey {
        crate::estimate::JobKey {
            user: self.owner.clone(),
            name: self.name.clone(),
            image: self.image.clone(),
            gpus: self.gpus,
            gpu_memory: self.gpu_memory,
            cpus_milli: self.job.limits.cpus_milli.unwrap_or(0),
            memory: self.job.limits.memory.unwrap_or(0),
        }
    }
}

impl QueuedRow {
    /// A queued job's estimator key, as the engine knows it.
    pub fn key(&self) -> crate::estimate::JobKey {
        crate::estimate::JobKey {
            user: self.owner.clone(),
            name: self.name.clone(),
            image: self.image.clone(),
            gpus: self.gpus,
            gpu_memory: self.gpu_memory,
            cpus_milli: self.cpus_milli.unwrap_or(0),
            memory: self.memory.unwrap_or(0),
        }
    }
}

pub(super) const JOB_COLS: &str = "id, name, owner_uid, owner_gid, owner, image, gpus, gpu_memory, priority, retries, timeout_ms, \
    spec_json, state, source, submitted_at, not_before, started_at, finished_at, exit_code, attempts, cancel_requested, message";

/// `%text%` for LIKE, with LIKE's wildcards in `text` taken literally.
pub(super) fn like_pattern(t: &str) -> String {
    format!("%{}%", t.replace('\\', "\\\\").replace('%', "\\%").replace('_', "\\_"))
}

pub(super) fn after_json(j: &ValidJob) -> Result<Option<String>> {
    let ids: Vec<i64> = j
        .spec
        .after
        .iter()
        .filter_map(|a| {
            if let crate::spec::IdOrName::Id(i) = a {
                Some(*i)
            } else {
                None
            }
        })
        .collect();
    Ok(if ids.is_empty() {
        None
    } else {
        Some(serde_json::to_string(&ids)?)
    })
}

/// What the scheduler needs of a queued job, without parsing its spec.
#[derive(Debug, Clone)]
pub struct QueuedRow {
    pub id: i64,
    pub name: String,
    pub owner_uid: u32,
    pub owner: String,
    pub image: String,
    pub gpus: u32,
    pub gpu_memory: Option<u64>,
    pub priority: i32,
    pub submitted_at: i64,
    /// When its first attempt started (a job queued again to retry).
    pub started_at: Option<i64>,
    pub not_before: Option<i64>,
    pub expected_runtime_ms: Option<i64>,
    pub after: Vec<i64>,
    /// Held by `gantry hold`: stays queued, never starts.
    pub held: bool,
    /// Which GPUs it accepts (`gpu_type`, `min_gpu_memory` of its spec).
    pub gpu_filter: crate::spec::GpuFilter,
    /// The spec's `cpus` (thousandths) and `memory`; `None`: the lab's default.
    pub cpus_milli: Option<u64>,
    pub memory: Option<u64>,
    /// An interactive session (`gantry shell`).
    pub interactive: bool,
    /// Its spec's `begin`, as a moment: it waits until then ("starts at 22:00").
    pub begin_ms: Option<i64>,
}

pub(super) fn job_from_row(r: &Row) -> rusqlite::Result<Job> {
    let state: String = r.get(12)?;
    let spec_json: String = r.get(11)?;
    let job = serde_json::from_str(&spec_json)
        .map_err(|e| rusqlite::Error::FromSqlConversionFailure(11, rusqlite::types::Type::Text, Box::new(e)))?;
    Ok(Job {
        id: r.get(0)?,
        name: r.get(1)?,
        owner_uid: r.get(2)?,
        owner_gid: r.get(3)?,
        owner: r.get(4)?,
        image: r.get(5)?,
        gpus: r.get(6)?,
        gpu_memory: r.get::<_, Option<i64>>(7)?.map(|v| v as u64),
        priority: r.get(8)?,
        retries: r.get(9)?,
        timeout_ms: r.get(10)?,
        job,
        state: JobState::parse(&state).unwrap_or(JobState::Failed),
        source: r.get(13)?,
        submitted_at: r.get(14)?,
        not_before: r.get(15)?,
        started_at: r.get(16)?,
        finished_at: r.get(17)?,
        exit_code: r.get(18)?,
        attempts: r.get(19)?,
        cancel_requested: r.get::<_, i64>(20)? != 0,
        message: r.get(21)?,
    })
}

pub(super) fn attempt_from_row(r: &Row) -> rusqlite::Result<Attempt> {
    let gpus: String = r.get(4)?;
    let uuids: String = r.get(5)?;
    Ok(Attempt {
        id: r.get(0)?,
        job_id: r.get(1)?,
        n: r.get(2)?,
        container_id: r.get(3)?,
        gpus: serde_json::from_str(&gpus).unwrap_or_default(),
        gpu_uuids: serde_json::from_str(&uuids).unwrap_or_default(),
        started_at: r.get(6)?,
        ended_at: r.get(7)?,
        exit_code: r.get(8)?,
        reason: r.get::<_, Option<String>>(9)?.and_then(|s| EndReason::parse(&s)),
        message: r.get(10)?,
        slurm_job_id: r.get::<_, Option<i64>>(11)?.map(|v| v as u64),
        slurm_array_task: r.get::<_, Option<i64>>(12)?.map(|v| v as u32),
    })
}

pub(super) const QUEUED_SELECT: &str = "SELECT id, name, owner, image, gpus, gpu_memory, priority, submitted_at, not_before, expected_runtime_ms, after_ids, held, \
     json_extract(spec_json, '$.spec.gpu_type'), json_extract(spec_json, '$.spec.min_gpu_memory'), \
     json_extract(spec_json, '$.limits.cpus_milli'), json_extract(spec_json, '$.limits.memory'), owner_uid, started_at, \
     COALESCE(json_extract(spec_json, '$.spec.interactive'), 0), json_extract(spec_json, '$.begin_ms') \
     FROM jobs WHERE state = 'queued'";

pub(super) fn queued_from_row(r: &Row) -> rusqlite::Result<QueuedRow> {
    let after: Option<String> = r.get(10)?;
    Ok(QueuedRow {
        id: r.get(0)?,
        name: r.get(1)?,
        owner_uid: r.get(16)?,
        owner: r.get(2)?,
        image: r.get(3)?,
        gpus: r.get(4)?,
        gpu_memory: r.get::<_, Option<i64>>(5)?.map(|v| v as u64),
        priority: r.get(6)?,
        submitted_at: r.get(7)?,
        not_before: r.get(8)?,
        expected_runtime_ms: r.get(9)?,
        after: after.and_then(|a| serde_json::from_str(&a).ok()).unwrap_or_default(),
        held: r.get(11)?,
        gpu_filter: crate::spec::gpu_filter(
            r.get::<_, Option<String>>(12)?.as_deref(),
            r.get::<_, Option<String>>(13)?.as_deref(),
        ),
        cpus_milli: r.get::<_, Option<i64>>(14)?.map(|v| v as u64),
        memory: r.get::<_, Option<i64>>(15)?.map(|v| v as u64),
        started_at: r.get(17)?,
        interactive: r.get(18)?,
        begin_ms: r.get(19)?,
    })
}

/// Jobs starting or running, as queue rows (no spec). The second `IN` lets SQLite use the
/// `jobs_active` partial index (its condition must appear in the query) instead of scanning history.
pub(super) const STARTED_SELECT: &str = "SELECT id, name, owner_uid, owner, image, gpus, gpu_memory, priority, state, submitted_at, started_at, \
     COALESCE(json_extract(spec_json, '$.spec.interactive'), 0), timeout_ms + (SELECT MAX(a.started_at) FROM attempts a WHERE a.job_id = jobs.id), \
     json_extract(spec_json, '$.spec.ports') \
     FROM jobs WHERE state IN ('starting','running') AND state IN ('queued','starting','running') ORDER BY id";

pub(super) fn started_from_row(r: &Row) -> rusqlite::Result<QueueJob> {
    let state: String = r.get(8)?;
    Ok(QueueJob {
        id: r.get(0)?,
        name: r.get(1)?,
        owner_uid: r.get(2)?,
        owner: r.get(3)?,
        image: r.get(4)?,
        gpus: r.get(5)?,
        gpu_memory: r.get::<_, Option<i64>>(6)?.map(|v| v as u64),
        priority: r.get(7)?,
        state: JobState::parse(&state).unwrap_or(JobState::Running),
        submitted_at: r.get(9)?,
        started_at: r.get(10)?,
        // A session: it ends at its (last) attempt's start plus its length, as its terminal says.
        session: r
            .get::<_, bool>(11)?
            .then(|| -> rusqlite::Result<QueueSession> {
                let ports: Option<String> = r.get(13)?;
                Ok(QueueSession {
                    ends_at: r.get(12)?,
                    ports: ports.and_then(|p| serde_json::from_str(&p).ok()).unwrap_or_default(),
                })
            })
            .transpose()?,
    })
}

pub(super) const ATTEMPT_COLS: &str = "id, job_id, n, container_id, gpus, gpu_uuids, started_at, ended_at, exit_code, reason, message, slurm_job_id, slurm_array_task";
