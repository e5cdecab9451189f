//! The durable queue: SQLite in WAL mode, versioned migrations, every state change in one
//! transaction together with its event-log row.

use std::path::Path;

use rusqlite::{params, Connection, OptionalExtension, Row};
use serde::{Deserialize, Serialize};

use crate::spec::ValidJob;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("stored job data is corrupt: {0}")]
    Json(#[from] serde_json::Error),
    #[error("cannot open the database file: {0}")]
    Io(std::io::Error),
    #[error("the database was written by a newer Gantry (schema {found}, this build knows {known}); upgrade Gantry")]
    TooNew { found: i64, known: i64 },
}

pub type Result<T> = std::result::Result<T, StoreError>;

/// Migrations, applied in order; `PRAGMA user_version` records how many ran.
const MIGRATIONS: &[&str] = &[
    include_str!("../migrations/0001_init.sql"),
    include_str!("../migrations/0002_history_columns.sql"),
    include_str!("../migrations/0003_identity.sql"),
    include_str!("../migrations/0004_hold.sql"),
    include_str!("../migrations/0005_user_inboxes.sql"),
    include_str!("../migrations/0006_history_fast.sql"),
    include_str!("../migrations/0007_slurm.sql"),
];

/// Filters matching more runs than this walk the sort key's index (filtering on the way) instead of
/// collecting and sorting every match: past a few thousand matches the walk is the cheaper plan.
const BROAD_FILTER: i64 = 2000;
/// A text search with at most this many candidates in the trigram index is counted through it;
/// with more, by testing each finished run (about as fast at 10k, faster above).
const FTS_CANDIDATES_MAX: i64 = 10_000;
/// How many filters keep a cached count (`history_counts`; every one costs a little on each job end).
const CACHED_COUNTS: i64 = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Queued,
    Starting,
    Running,
    Succeeded,
    Failed,
    Cancelled,
    TimedOut,
}

impl JobState {
    pub const ALL: [JobState; 7] = [
        JobState::Queued,
        JobState::Starting,
        JobState::Running,
        JobState::Succeeded,
        JobState::Failed,
        JobState::Cancelled,
        JobState::TimedOut,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Starting => "starting",
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
            JobState::TimedOut => "timed_out",
        }
    }
    pub fn parse(s: &str) -> Option<JobState> {
        JobState::ALL.into_iter().find(|x| x.as_str() == s)
    }
    pub fn is_final(self) -> bool {
        matches!(self, JobState::Succeeded | JobState::Failed | JobState::Cancelled | JobState::TimedOut)
    }
}

/// Why an attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndReason {
    Exited,
    Oom,
    Timeout,
    Cancelled,
    Lost,
    EngineError,
}

impl EndReason {
    pub fn as_str(self) -> &'static str {
        match self {
            EndReason::Exited => "exited",
            EndReason::Oom => "oom",
            EndReason::Timeout => "timeout",
            EndReason::Cancelled => "cancelled",
            EndReason::Lost => "lost",
            EndReason::EngineError => "engine_error",
        }
    }
    fn parse(s: &str) -> Option<EndReason> {
        [Self::Exited, Self::Oom, Self::Timeout, Self::Cancelled, Self::Lost, Self::EngineError]
            .into_iter()
            .find(|r| r.as_str() == s)
    }
}

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

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attempt {
    pub id: i64,
    pub job_id: i64,
    pub n: u32,
    pub container_id: Option<String>,
    pub gpus: Vec<u32>,
    pub gpu_uuids: Vec<String>,
    pub started_at: i64,
    pub ended_at: Option<i64>,
    pub exit_code: Option<i64>,
    pub reason: Option<EndReason>,
    pub message: Option<String>,
    /// The Slurm job id of an attempt submitted to Slurm (the Slurm backend).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_job_id: Option<u64>,
    /// Its task in that Slurm job array, when a `matrix` went to Slurm as one array.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_array_task: Option<u32>,
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
            Some((i, k)) => Some(RunRef::Slurm { id: i.parse().ok()?, task: Some(k.parse().ok()?) }),
            None => Some(RunRef::Slurm { id: t.parse().ok()?, task: None }),
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
            (Some(id), _) => Some(RunRef::Slurm { id, task: self.slurm_array_task }),
            (None, Some(c)) => Some(RunRef::from_text(c)),
            (None, None) => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub job_id: i64,
    pub at: i64,
    pub from: Option<String>,
    pub to: String,
    pub message: Option<String>,
}

/// Who submits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
    pub name: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct HistoryFilter {
    pub user: Option<String>,
    pub status: Option<JobState>,
    /// Finished at or after (ms).
    pub since: Option<i64>,
    pub limit: Option<u32>,
    pub offset: Option<u32>,
    /// Substring of name or image.
    pub text: Option<String>,
    /// Image name (exact).
    pub image: Option<String>,
    /// Finished before (ms).
    pub until: Option<i64>,
    /// Sort key: finished (default), started, duration, gpu_hours, name, owner, exit_code, id.
    pub sort: Option<String>,
    /// Ascending instead of descending.
    pub asc: Option<bool>,
}

/// A run on the GPU timeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimelineRun {
    pub job_id: i64,
    pub name: String,
    pub owner: String,
    pub gpus: Vec<u32>,
    pub start: i64,
    pub end: Option<i64>,
    pub reason: Option<EndReason>,
}

/// One completed run for `history`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryRow {
    pub id: i64,
    pub name: String,
    pub owner: String,
    pub image: String,
    pub status: JobState,
    pub exit_code: Option<i64>,
    pub gpus: Vec<u32>,
    pub gpu_uuids: Vec<String>,
    pub submitted_at: i64,
    pub started_at: Option<i64>,
    pub finished_at: Option<i64>,
    pub attempts: u32,
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

pub struct Store {
    conn: Connection,
    /// The queue in memory, when this connection keeps it (see [`Store::track_queue`]).
    queue: Option<SharedQueue>,
    /// What "now" is for the timestamps this store writes: the engine's clock.
    clock: std::sync::Arc<dyn crate::clock::Clock>,
}

/// The queued jobs in memory, kept up to date by the store's own transitions, so neither a submit
/// nor a scheduling pass reads the whole queue from SQLite. SQLite stays the truth: this is rebuilt
/// from it at open, and whenever a change could not be read back (`stale`).
#[derive(Debug, Default)]
pub struct QueueMirror {
    rows: std::collections::BTreeMap<i64, std::sync::Arc<QueuedRow>>,
    per_user: std::collections::HashMap<u32, usize>,
    stale: bool,
    /// Bumped by every change: a scheduling pass with the same version (and nothing else changed)
    /// would plan the same thing.
    version: u64,
}

pub type SharedQueue = std::sync::Arc<std::sync::Mutex<QueueMirror>>;

impl QueueMirror {
    /// The queued jobs, by id (cheap: the rows are shared).
    pub fn rows(&self) -> Vec<std::sync::Arc<QueuedRow>> {
        self.rows.values().cloned().collect()
    }
    /// How many jobs are queued.
    pub fn len(&self) -> usize {
        self.rows.len()
    }
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
    /// How many jobs `owner_uid` has queued.
    pub fn count_of(&self, owner_uid: u32) -> usize {
        self.per_user.get(&owner_uid).copied().unwrap_or(0)
    }
    /// A change could not be read back: rebuild with [`Store::track_queue`] before use.
    pub fn is_stale(&self) -> bool {
        self.stale
    }
    /// Does a queued job's retry backoff end in `(since, now]`? (Then a pass must plan again.)
    pub fn retry_due(&self, since: i64, now: i64) -> bool {
        self.rows.values().any(|r| r.not_before.is_some_and(|t| t > since && t <= now))
    }
    /// Changes so far (see the field).
    pub fn version(&self) -> u64 {
        self.version
    }
    fn set(&mut self, id: i64, row: Option<QueuedRow>) {
        self.version += 1;
        if let Some(old) = self.rows.remove(&id) {
            if let Some(n) = self.per_user.get_mut(&old.owner_uid) {
                *n -= 1;
                if *n == 0 {
                    self.per_user.remove(&old.owner_uid);
                }
            }
        }
        if let Some(r) = row {
            *self.per_user.entry(r.owner_uid).or_default() += 1;
            self.rows.insert(id, std::sync::Arc::new(r));
        }
    }
}


pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

const JOB_COLS: &str = "id, name, owner_uid, owner_gid, owner, image, gpus, gpu_memory, priority, retries, timeout_ms, \
    spec_json, state, source, submitted_at, not_before, started_at, finished_at, exit_code, attempts, cancel_requested, message";

/// `%text%` for LIKE, with LIKE's wildcards in `text` taken literally.
fn like_pattern(t: &str) -> String {
    format!("%{}%", t.replace('\\', "\\\\").replace('%', "\\%").replace('_', "\\_"))
}

fn after_json(j: &ValidJob) -> Result<Option<String>> {
    let ids: Vec<i64> = j.spec.after.iter().filter_map(|a| if let crate::spec::IdOrName::Id(i) = a { Some(*i) } else { None }).collect();
    Ok(if ids.is_empty() { None } else { Some(serde_json::to_string(&ids)?) })
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
    pub not_before: Option<i64>,
    pub expected_runtime_ms: Option<i64>,
    pub after: Vec<i64>,
    /// Held by `gantry hold`: stays queued, never starts.
    pub held: bool,
    /// Which GPUs it accepts (`gpu_type`, `min_gpu_memory` of its spec).
    pub gpu_filter: crate::scheduler::GpuFilter,
    /// The spec's `cpus` (thousandths) and `memory`; `None`: the lab's default.
    pub cpus_milli: Option<u64>,
    pub memory: Option<u64>,
}

fn job_from_row(r: &Row) -> rusqlite::Result<Job> {
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

fn attempt_from_row(r: &Row) -> rusqlite::Result<Attempt> {
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

const QUEUED_SELECT: &str = "SELECT id, name, owner, image, gpus, gpu_memory, priority, submitted_at, not_before, expected_runtime_ms, after_ids, held, \
     json_extract(spec_json, '$.spec.gpu_type'), json_extract(spec_json, '$.spec.min_gpu_memory'), \
     json_extract(spec_json, '$.limits.cpus_milli'), json_extract(spec_json, '$.limits.memory'), owner_uid \
     FROM jobs WHERE state = 'queued'";

fn queued_from_row(r: &Row) -> rusqlite::Result<QueuedRow> {
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
        gpu_filter: crate::spec::gpu_filter(r.get::<_, Option<String>>(12)?.as_deref(), r.get::<_, Option<String>>(13)?.as_deref()),
        cpus_milli: r.get::<_, Option<i64>>(14)?.map(|v| v as u64),
        memory: r.get::<_, Option<i64>>(15)?.map(|v| v as u64),
    })
}

const ATTEMPT_COLS: &str = "id, job_id, n, container_id, gpus, gpu_uuids, started_at, ended_at, exit_code, reason, message, slurm_job_id, slurm_array_task";

impl Store {
    /// Open (or create) the database, readable and writable by the engine's user only: it holds
    /// every user's specs and environment.
    pub fn open(path: &Path) -> Result<Store> {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        let f = std::fs::OpenOptions::new().create(true).truncate(false).write(true).mode(0o600).open(path).map_err(StoreError::Io)?;
        f.set_permissions(std::fs::Permissions::from_mode(0o600)).map_err(StoreError::Io)?;
        let conn = Connection::open(path)?;
        let store = Self::init(conn)?;
        // SQLite creates -wal/-shm with the database's mode; tighten ones left by older versions.
        for ext in ["-wal", "-shm"] {
            let mut p = path.as_os_str().to_owned();
            p.push(ext);
            let _ = std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600));
        }
        Ok(store)
    }

    pub fn open_in_memory() -> Result<Store> {
        Self::init(Connection::open_in_memory()?)
    }

    fn init(mut conn: Connection) -> Result<Store> {
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
        let known = MIGRATIONS.len() as i64;
        if version > known {
            return Err(StoreError::TooNew { found: version, known });
        }
        for (i, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
            let tx = conn.transaction()?;
            tx.execute_batch(sql)?;
            tx.pragma_update(None, "user_version", (i + 1) as i64)?;
            tx.commit()?;
        }
        // Refresh the query planner's statistics when they are stale (cheap when they are not).
        conn.execute_batch("PRAGMA optimize=0x10002;")?;
        Ok(Store { conn, queue: None, clock: crate::clock::system() })
    }

    /// Timestamps written from now on read `clock` (the engine's: paused tokio time in its tests).
    pub fn set_clock(&mut self, clock: std::sync::Arc<dyn crate::clock::Clock>) {
        self.clock = clock;
    }

    fn now(&self) -> i64 {
        self.clock.now_ms()
    }

    fn event(tx: &Connection, job_id: i64, at: i64, from: Option<JobState>, to: JobState, msg: Option<&str>) -> Result<()> {
        tx.prepare_cached("INSERT INTO events (job_id, at, from_state, to_state, message) VALUES (?1, ?2, ?3, ?4, ?5)")?
            .execute(params![job_id, at, from.map(|s| s.as_str()), to.as_str(), msg])?;
        Ok(())
    }

    /// Insert a queued job. `finalize` may rewrite the job once its id is known (template mounts).
    pub fn insert_job(
        &mut self,
        job: &ValidJob,
        owner: &Owner,
        source: &str,
        source_key: Option<&str>,
        finalize: impl Fn(i64, &ValidJob) -> Option<ValidJob>,
    ) -> Result<i64> {
        let now = self.now();
        let tx = self.conn.transaction()?;
        tx.prepare_cached(
            "INSERT INTO jobs (name, owner_uid, owner_gid, owner, image, gpus, gpu_memory, priority, retries, timeout_ms, \
             spec_json, state, source, source_key, submitted_at, expected_runtime_ms, after_ids) \
             VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,'queued',?12,?13,?14,?15,?16)",
        )?
        .execute(params![
            job.name,
            owner.uid,
            owner.gid,
            owner.name,
            job.spec.image,
            job.gpus,
            job.gpu_memory.map(|m| m as i64),
            job.spec.priority,
            job.retries,
            job.timeout.map(|t| t.as_millis() as i64),
            serde_json::to_string(job)?,
            source,
            source_key,
            now,
            job.expected_runtime.map(|d| d.as_millis() as i64),
            after_json(job)?
        ])?;
        let id = tx.last_insert_rowid();
        if let Some(j) = finalize(id, job) {
            tx.execute("UPDATE jobs SET spec_json = ?2, name = ?3, after_ids = ?4 WHERE id = ?1", params![id, serde_json::to_string(&j)?, j.name, after_json(&j)?])?;
        }
        Self::event(&tx, id, now, None, JobState::Queued, Some(&format!("submitted from {source}")))?;
        tx.commit()?;
        self.requeue_check(id);
        Ok(id)
    }

    pub fn meta(&self, key: &str) -> Result<Option<String>> {
        Ok(self.conn.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0)).optional()?)
    }

    pub fn set_meta(&mut self, key: &str, value: &str) -> Result<()> {
        self.conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?1, ?2)", params![key, value])?;
        Ok(())
    }

    /// The highest job id ever handed out by this database (0 if none).
    pub fn job_id_high_water(&self) -> Result<i64> {
        let seq: Option<i64> = self.conn.query_row("SELECT seq FROM sqlite_sequence WHERE name = 'jobs'", [], |r| r.get(0)).optional()?;
        let max: Option<i64> = self.conn.query_row("SELECT MAX(id) FROM jobs", [], |r| r.get(0))?;
        Ok(seq.unwrap_or(0).max(max.unwrap_or(0)))
    }

    /// Make the next job id larger than `floor`: ids are never reused, even after a lost WAL.
    pub fn raise_job_ids_above(&mut self, floor: i64) -> Result<()> {
        if self.job_id_high_water()? >= floor {
            return Ok(());
        }
        let tx = self.conn.transaction()?;
        let n = tx.execute("UPDATE sqlite_sequence SET seq = ?1 WHERE name = 'jobs'", [floor])?;
        if n == 0 {
            tx.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('jobs', ?1)", [floor])?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Users who set up their drop folder with `gantry inbox init`.
    pub fn user_inboxes(&self) -> Result<Vec<u32>> {
        let mut q = self.conn.prepare("SELECT uid FROM user_inboxes ORDER BY uid")?;
        let uids = q.query_map([], |r| r.get(0))?.collect::<rusqlite::Result<_>>()?;
        Ok(uids)
    }

    pub fn add_user_inbox(&mut self, uid: u32) -> Result<()> {
        self.conn.execute("INSERT OR IGNORE INTO user_inboxes (uid, registered_at) VALUES (?1, ?2)", params![uid, self.now()])?;
        Ok(())
    }

    /// Queued jobs of one user (for the per-user cap): from the queue in memory when this store keeps it.
    pub fn queued_count(&self, owner_uid: u32) -> Result<usize> {
        if let Some(q) = &self.queue {
            let q = q.lock().unwrap_or_else(|p| p.into_inner());
            if !q.stale {
                return Ok(q.count_of(owner_uid));
            }
        }
        let n: i64 = self.conn.prepare_cached("SELECT COUNT(*) FROM jobs WHERE owner_uid = ?1 AND state = 'queued'")?.query_row([owner_uid], |r| r.get(0))?;
        Ok(n as usize)
    }

    /// Keep the queue in memory from now on: built from the database now (call again when it went
    /// stale), then updated by every change this connection commits.
    pub fn track_queue(&mut self) -> Result<SharedQueue> {
        let mut m = QueueMirror::default();
        for r in self.queued_rows()? {
            m.set(r.id, Some(r));
        }
        let q = self.queue.clone().unwrap_or_default();
        let mut old = q.lock().unwrap_or_else(|p| p.into_inner());
        // Versions only grow, across rebuilds too.
        m.version += old.version + 1;
        *old = m;
        drop(old);
        self.queue = Some(q.clone());
        Ok(q)
    }

    /// After a committed change to job `id`: its queued row (if it is still queued) into the queue in memory.
    fn requeue_check(&self, id: i64) {
        let Some(q) = &self.queue else { return };
        let row = self.conn.prepare_cached(&format!("{QUEUED_SELECT} AND id = ?1")).and_then(|mut st| st.query_row([id], queued_from_row).optional());
        let mut q = q.lock().unwrap_or_else(|p| p.into_inner());
        match row {
            Ok(row) => q.set(id, row),
            Err(e) => {
                tracing::warn!("cannot read job {id} back into the queue in memory ({e}); it is rebuilt from the database");
                q.stale = true;
            }
        }
    }

    /// Open attempts with their jobs (for recovery).
    pub fn open_attempts(&self) -> Result<Vec<(Job, Attempt)>> {
        let mut out = vec![];
        // Not `active_jobs`: that would parse every queued job's spec (a restart with 100k queued).
        let mut st = self.conn.prepare_cached(&format!("SELECT {JOB_COLS} FROM jobs WHERE state IN ('starting','running') ORDER BY id"))?;
        let started = st.query_map([], job_from_row)?.collect::<rusqlite::Result<Vec<_>>>()?;
        for j in started {
            if let Some(a) = self.open_attempt(j.id)? {
                out.push((j, a));
            }
        }
        Ok(out)
    }

    /// Does any attempt of this job carry this container id?
    pub fn attempt_with_container(&self, job_id: i64, container_id: &str) -> Result<Option<Attempt>> {
        Ok(self
            .conn
            .prepare_cached(&format!("SELECT {ATTEMPT_COLS} FROM attempts WHERE job_id = ?1 AND container_id = ?2"))?
            .query_row(params![job_id, container_id], attempt_from_row)
            .optional()?)
    }

    pub fn job_by_source_key(&self, key: &str) -> Result<Option<i64>> {
        Ok(self.conn.query_row("SELECT id FROM jobs WHERE source_key = ?1", [key], |r| r.get(0)).optional()?)
    }

    pub fn job(&self, id: i64) -> Result<Option<Job>> {
        Ok(self.conn.prepare_cached(&format!("SELECT {JOB_COLS} FROM jobs WHERE id = ?1"))?.query_row([id], job_from_row).optional()?)
    }

    /// Queued jobs, light rows for the scheduler (no spec parsing).
    pub fn queued_rows(&self) -> Result<Vec<QueuedRow>> {
        let mut st = self.conn.prepare_cached(&format!("{QUEUED_SELECT} ORDER BY priority DESC, submitted_at, id"))?;
        let rows = st.query_map([], queued_from_row)?.collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// Jobs that are queued, starting or running, in submission order.
    pub fn active_jobs(&self) -> Result<Vec<Job>> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {JOB_COLS} FROM jobs WHERE state IN ('queued','starting','running') ORDER BY id"
        ))?;
        let rows = st.query_map([], job_from_row)?.collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    pub fn attempts(&self, job_id: i64) -> Result<Vec<Attempt>> {
        let mut st = self.conn.prepare_cached(&format!("SELECT {ATTEMPT_COLS} FROM attempts WHERE job_id = ?1 ORDER BY n"))?;
        let rows = st.query_map([job_id], attempt_from_row)?.collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// The attempt that has not ended yet, if any.
    pub fn open_attempt(&self, job_id: i64) -> Result<Option<Attempt>> {
        Ok(self
            .conn
            .prepare_cached(&format!("SELECT {ATTEMPT_COLS} FROM attempts WHERE job_id = ?1 AND ended_at IS NULL"))?
            .query_row([job_id], attempt_from_row)
            .optional()?)
    }

    pub fn events(&self, job_id: i64) -> Result<Vec<Event>> {
        let mut st = self.conn.prepare_cached("SELECT job_id, at, from_state, to_state, message FROM events WHERE job_id = ?1 ORDER BY id")?;
        let rows = st
            .query_map([job_id], |r| Ok(Event { job_id: r.get(0)?, at: r.get(1)?, from: r.get(2)?, to: r.get(3)?, message: r.get(4)? }))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// queued -> starting, with a new attempt row. Returns `None` if the job is no longer queued:
    /// this compare-and-set is what guarantees a job never starts twice.
    pub fn begin_attempt(&mut self, job_id: i64, gpus: &[u32], uuids: &[String]) -> Result<Option<Attempt>> {
        self.begin_attempt_noted(job_id, gpus, uuids, None)
    }

    /// [`Store::begin_attempt`], with a note on the placement in its event ("GPUs 0,1: NVLink").
    pub fn begin_attempt_noted(&mut self, job_id: i64, gpus: &[u32], uuids: &[String], note: Option<&str>) -> Result<Option<Attempt>> {
        let now = self.now();
        let tx = self.conn.transaction()?;
        let changed = tx.execute(
            "UPDATE jobs SET state = 'starting', attempts = attempts + 1, not_before = NULL, started_at = COALESCE(started_at, ?2) \
             WHERE id = ?1 AND state = 'queued' AND cancel_requested = 0 AND held = 0",
            params![job_id, now],
        )?;
        if changed == 0 {
            return Ok(None);
        }
        let n: u32 = tx.query_row("SELECT attempts FROM jobs WHERE id = ?1", [job_id], |r| r.get(0))?;
        tx.execute(
            "INSERT INTO attempts (job_id, n, gpus, gpu_uuids, started_at) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![job_id, n, serde_json::to_string(gpus)?, serde_json::to_string(uuids)?, now],
        )?;
        let aid = tx.last_insert_rowid();
        let gl = if gpus.is_empty() { "no GPU".to_string() } else { format!("GPU {}", gpus.iter().map(|g| g.to_string()).collect::<Vec<_>>().join(",")) };
        let note = note.map(|n| format!(" ({n})")).unwrap_or_default();
        Self::event(&tx, job_id, now, Some(JobState::Queued), JobState::Starting, Some(&format!("attempt {n} on {gl}{note}")))?;
        let a = tx.query_row(&format!("SELECT {ATTEMPT_COLS} FROM attempts WHERE id = ?1"), [aid], attempt_from_row)?;
        tx.commit()?;
        self.requeue_check(job_id);
        Ok(Some(a))
    }

    /// Record what runs an attempt: its container (right after create), or its Slurm id (right after
    /// `sbatch` answers). The other form's columns stay empty. Read back by [`Attempt::run_ref`].
    pub fn set_run(&mut self, attempt_id: i64, run: &RunRef) -> Result<()> {
        match run {
            RunRef::Container(c) => self.conn.execute("UPDATE attempts SET container_id = ?2 WHERE id = ?1", params![attempt_id, c])?,
            RunRef::Slurm { id, task } => {
                self.conn.execute("UPDATE attempts SET slurm_job_id = ?2, slurm_array_task = ?3 WHERE id = ?1", params![attempt_id, *id as i64, task])?
            }
        };
        Ok(())
    }

    /// The GPUs Slurm gave a running attempt (indexes on its node), for `gantry ls` and the GPUs view.
    pub fn set_attempt_gpus(&mut self, attempt_id: i64, gpus: &[u32]) -> Result<()> {
        self.conn.execute("UPDATE attempts SET gpus = ?2 WHERE id = ?1", params![attempt_id, serde_json::to_string(gpus)?])?;
        Ok(())
    }

    /// When the attempt really began running (the Slurm backend: Slurm's start, not the submission).
    /// The job's start moves too while this is its first attempt, so history and waits count Slurm's queue as waiting.
    pub fn set_attempt_started(&mut self, job_id: i64, attempt_id: i64, at: i64) -> Result<()> {
        let tx = self.conn.transaction()?;
        tx.execute("UPDATE attempts SET started_at = ?2 WHERE id = ?1", params![attempt_id, at])?;
        tx.execute("UPDATE jobs SET started_at = ?2 WHERE id = ?1 AND attempts = 1", params![job_id, at])?;
        tx.commit()?;
        Ok(())
    }

    /// starting -> running.
    pub fn set_running(&mut self, job_id: i64) -> Result<bool> {
        let now = self.now();
        let tx = self.conn.transaction()?;
        let n = tx.execute("UPDATE jobs SET state = 'running' WHERE id = ?1 AND state = 'starting'", [job_id])?;
        if n == 1 {
            Self::event(&tx, job_id, now, Some(JobState::Starting), JobState::Running, None)?;
        }
        tx.commit()?;
        Ok(n == 1)
    }

    /// Close the open attempt and move the job to its next state, atomically.
    pub fn end_attempt(&mut self, job_id: i64, attempt_id: i64, end: &Ending) -> Result<()> {
        let now = self.now();
        let tx = self.conn.transaction()?;
        let closed = tx.execute(
            "UPDATE attempts SET ended_at = ?2, exit_code = ?3, reason = ?4, message = ?5 WHERE id = ?1 AND ended_at IS NULL",
            params![attempt_id, now, end.exit_code, end.reason.as_str(), end.message],
        )?;
        if closed == 0 {
            return Ok(()); // already recorded (e.g. by recovery): record once
        }
        let from: String = tx.query_row("SELECT state FROM jobs WHERE id = ?1", [job_id], |r| r.get(0))?;
        let finished = if end.next.is_final() { Some(now) } else { None };
        tx.execute(
            "UPDATE jobs SET state = ?2, exit_code = ?3, finished_at = ?4, not_before = ?5, message = ?6, \
             duration_ms = ?4 - started_at, gpu_ms = (?4 - started_at) * gpus WHERE id = ?1",
            params![job_id, end.next.as_str(), end.exit_code, finished, end.not_before, end.message],
        )?;
        let msg = match (&end.message, end.exit_code) {
            (Some(m), _) => m.clone(),
            (None, Some(c)) => format!("{} with code {c}", end.reason.as_str()),
            (None, None) => end.reason.as_str().to_string(),
        };
        Self::event(&tx, job_id, now, JobState::parse(&from), end.next, Some(&msg))?;
        tx.commit()?;
        self.requeue_check(job_id); // a retry is queued again
        Ok(())
    }

    /// Ask to cancel. A queued job is cancelled at once; a starting/running one is flagged for the
    /// executor. Returns the state before, or `None` when the job does not exist.
    pub fn request_cancel(&mut self, job_id: i64) -> Result<Option<JobState>> {
        let now = self.now();
        let tx = self.conn.transaction()?;
        let st: Option<String> = tx.query_row("SELECT state FROM jobs WHERE id = ?1", [job_id], |r| r.get(0)).optional()?;
        let Some(st) = st.and_then(|s| JobState::parse(&s)) else { return Ok(None) };
        match st {
            JobState::Queued => {
                tx.execute("UPDATE jobs SET state = 'cancelled', cancel_requested = 1, finished_at = ?2 WHERE id = ?1", params![job_id, now])?;
                Self::event(&tx, job_id, now, Some(st), JobState::Cancelled, Some("cancelled while queued"))?;
            }
            JobState::Starting | JobState::Running => {
                tx.execute("UPDATE jobs SET cancel_requested = 1 WHERE id = ?1", [job_id])?;
            }
            _ => {}
        }
        tx.commit()?;
        self.requeue_check(job_id);
        Ok(Some(st))
    }

    pub fn set_priority(&mut self, job_id: i64, priority: i32) -> Result<bool> {
        let changed = self.conn.execute("UPDATE jobs SET priority = ?2 WHERE id = ?1 AND state = 'queued'", params![job_id, priority])? == 1;
        self.requeue_check(job_id);
        Ok(changed)
    }

    /// Hold or release a queued job, with an event naming who did it. Returns false (and changes
    /// nothing) when the job is not queued or already in that state.
    pub fn set_held(&mut self, job_id: i64, held: bool, by: &str) -> Result<bool> {
        let now = self.now();
        let tx = self.conn.transaction()?;
        let n = tx.execute("UPDATE jobs SET held = ?2 WHERE id = ?1 AND state = 'queued' AND held != ?2", params![job_id, held])?;
        if n == 1 {
            let msg = if held { format!("held by {by}") } else { format!("released by {by}") };
            Self::event(&tx, job_id, now, Some(JobState::Queued), JobState::Queued, Some(&msg))?;
        }
        tx.commit()?;
        self.requeue_check(job_id);
        Ok(n == 1)
    }

    /// The filter as SQL. `fts`: find text matches through the trigram index (worth it when they are few;
    /// for many, testing each row of a covering index is cheaper).
    fn where_clause(f: &HistoryFilter, fts: bool) -> (String, Vec<rusqlite::types::Value>) {
        let mut sql = String::from(" WHERE j.finished_at IS NOT NULL");
        let mut args: Vec<rusqlite::types::Value> = vec![];
        let mut add = |cond: &str, v: rusqlite::types::Value| {
            args.push(v);
            sql += &cond.replace("?", &format!("?{}", args.len()));
        };
        if let Some(u) = &f.user {
            add(" AND j.owner = ?", u.clone().into());
        }
        if let Some(s) = f.status {
            add(" AND j.state = ?", s.as_str().to_string().into());
        }
        if let Some(s) = f.since {
            add(" AND j.finished_at >= ?", s.into());
        }
        if let Some(s) = f.until {
            add(" AND j.finished_at < ?", s.into());
        }
        if let Some(i) = &f.image {
            add(" AND j.image = ?", i.clone().into());
        }
        if let Some(t) = Self::text_of(f) {
            add(" AND (j.name LIKE ? ESCAPE '\\' OR j.image LIKE ? ESCAPE '\\')", like_pattern(t).into());
            // The trigram index finds the candidates (a superset: it folds case beyond ASCII); LIKE
            // above decides. It knows nothing of substrings shorter than 3 characters.
            if fts && t.chars().count() >= 3 {
                add(" AND j.id IN (SELECT rowid FROM jobs_fts WHERE jobs_fts MATCH ?)", format!("\"{}\"", t.replace('"', "\"\"")).into());
            }
        }
        (sql, args)
    }

    /// The text filter; an empty one matches everything, as no filter.
    fn text_of(f: &HistoryFilter) -> Option<&str> {
        f.text.as_deref().filter(|t| !t.is_empty())
    }

    /// Completed runs, newest first (or as `sort` says), one page.
    pub fn history(&mut self, f: &HistoryFilter) -> Result<Vec<HistoryRow>> {
        let total = self.history_count(f)?;
        let broad = total > BROAD_FILTER;
        let (wh, args) = Self::where_clause(f, !broad);
        let (key, index) = match f.sort.as_deref().unwrap_or("finished") {
            "started" => ("j.started_at", "jobs_hs_started"),
            "duration" => ("j.duration_ms", "jobs_hs_duration"),
            "gpu_hours" => ("j.gpu_ms", "jobs_hs_gpu"),
            "name" => ("j.name", "jobs_hs_name"),
            "owner" => ("j.owner", "jobs_hs_owner"),
            "exit_code" => ("j.exit_code", "jobs_hs_exit"),
            "id" => ("j.id", "jobs_hs_id"),
            _ => ("j.finished_at", "jobs_hs_finished"),
        };
        let limit = f.limit.unwrap_or(100).min(10_000) as i64;
        let offset = f.offset.unwrap_or(0) as i64;
        // A page past the middle is read from the other end, in reverse: no walk passes more than half.
        let reverse = offset > total / 2 && offset < total;
        let (limit, offset) = if reverse { (limit.min(total - offset), (total - offset - limit).max(0)) } else { (limit, offset) };
        let dir = if f.asc.unwrap_or(false) != reverse { "ASC" } else { "DESC" };
        // For a broad filter the planner would collect every match and sort it; walking the sort key's
        // covering index and filtering on the way reads only what the page needs.
        let hint = if broad { format!(" INDEXED BY {index}") } else { String::new() };
        let sql = format!(
            "SELECT j.id, j.name, j.owner, j.image, j.state, j.exit_code, a.gpus, a.gpu_uuids, j.submitted_at, j.started_at, j.finished_at, j.attempts \
             FROM (SELECT j.id AS pid FROM jobs j{hint}{wh} ORDER BY {key} {dir}, j.id {dir} LIMIT {limit} OFFSET {offset}) p \
             JOIN jobs j ON j.id = p.pid LEFT JOIN attempts a ON a.job_id = j.id AND a.n = j.attempts ORDER BY {key} {dir}, j.id {dir}",
        );
        let mut st = self.conn.prepare_cached(&sql)?;
        let mut rows = st
            .query_map(rusqlite::params_from_iter(args), |r| {
                let state: String = r.get(4)?;
                let gpus: Option<String> = r.get(6)?;
                let uuids: Option<String> = r.get(7)?;
                Ok(HistoryRow {
                    id: r.get(0)?,
                    name: r.get(1)?,
                    owner: r.get(2)?,
                    image: r.get(3)?,
                    status: JobState::parse(&state).unwrap_or(JobState::Failed),
                    exit_code: r.get(5)?,
                    gpus: gpus.and_then(|g| serde_json::from_str(&g).ok()).unwrap_or_default(),
                    gpu_uuids: uuids.and_then(|g| serde_json::from_str(&g).ok()).unwrap_or_default(),
                    submitted_at: r.get(8)?,
                    started_at: r.get(9)?,
                    finished_at: r.get(10)?,
                    attempts: r.get(11)?,
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        if reverse {
            rows.reverse();
        }
        Ok(rows)
    }

    /// How many completed runs match (for paging). Counted once per filter, then kept exact by
    /// triggers (`history_counts`); when the cache cannot be written, counted every time.
    pub fn history_count(&mut self, f: &HistoryFilter) -> Result<i64> {
        let key = serde_json::to_string(&(&f.user, f.status, f.since, f.until, &f.image, Self::text_of(f)))?;
        let cached = |c: &Connection| c.prepare_cached("SELECT n FROM history_counts WHERE key = ?1")?.query_row([&key], |r| r.get(0)).optional();
        if let Some(n) = cached(&self.conn)? {
            return Ok(n);
        }
        // Count and record in one write transaction, so no job can end between the two unseen.
        let counted = (|| -> Result<i64> {
            let tx = self.conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let n = match cached(&tx)? {
                Some(n) => n,
                None => {
                    let n = Self::count_matches(&tx, f)?;
                    tx.execute(
                        "INSERT INTO history_counts (key, owner, state, since, until, image, text, n) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                        params![key, f.user, f.status.map(|s| s.as_str()), f.since, f.until, f.image, Self::text_of(f).map(like_pattern), n],
                    )?;
                    tx.execute("DELETE FROM history_counts WHERE rowid NOT IN (SELECT rowid FROM history_counts ORDER BY rowid DESC LIMIT ?1)", [CACHED_COUNTS])?;
                    n
                }
            };
            tx.commit()?;
            Ok(n)
        })();
        match counted {
            Ok(n) => Ok(n),
            Err(e) => {
                tracing::warn!("cannot cache the history count ({e}); counting every time");
                Self::count_matches(&self.conn, f)
            }
        }
    }

    /// COUNT(*) of the runs matching `f`, from the rows themselves.
    fn count_matches(c: &Connection, f: &HistoryFilter) -> Result<i64> {
        // The trigram index's own count (a superset) says whether going through it pays.
        let fts = match Self::text_of(f).filter(|t| t.chars().count() >= 3) {
            Some(t) => {
                let q = format!("\"{}\"", t.replace('"', "\"\""));
                let candidates: i64 = c.prepare_cached("SELECT COUNT(*) FROM jobs_fts WHERE jobs_fts MATCH ?1")?.query_row([q], |r| r.get(0))?;
                candidates <= FTS_CANDIDATES_MAX
            }
            None => false,
        };
        let (wh, args) = Self::where_clause(f, fts);
        // Text tested row by row: on an index that holds every filter column (the planner may pick a
        // narrower one and read each job row).
        let hint = if Self::text_of(f).is_some() && !fts { " INDEXED BY jobs_hs_finished" } else { "" };
        Ok(c.prepare_cached(&format!("SELECT COUNT(*) FROM jobs j{hint}{wh}"))?.query_row(rusqlite::params_from_iter(args), |r| r.get(0))?)
    }

    /// Attempts that overlapped [from, to): which runs held which GPUs.
    pub fn timeline(&self, from: i64, to: i64) -> Result<Vec<TimelineRun>> {
        let mut st = self.conn.prepare_cached(
            "SELECT a.job_id, j.name, j.owner, a.gpus, a.started_at, a.ended_at, a.reason FROM attempts a JOIN jobs j ON j.id = a.job_id \
             WHERE a.started_at < ?2 AND (a.ended_at IS NULL OR a.ended_at >= ?1) ORDER BY a.started_at LIMIT 20000",
        )?;
        let rows = st
            .query_map(params![from, to], |r| {
                let gpus: String = r.get(3)?;
                Ok(TimelineRun {
                    job_id: r.get(0)?,
                    name: r.get(1)?,
                    owner: r.get(2)?,
                    gpus: serde_json::from_str(&gpus).unwrap_or_default(),
                    start: r.get(4)?,
                    end: r.get(5)?,
                    reason: r.get::<_, Option<String>>(6)?.and_then(|s| EndReason::parse(&s)),
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// The caller's most recent job with this name (for `after: [name]`).
    pub fn latest_by_name(&self, owner_uid: u32, name: &str) -> Result<Option<i64>> {
        Ok(self
            .conn
            .prepare_cached("SELECT id FROM jobs WHERE owner_uid = ?1 AND name = ?2 ORDER BY id DESC LIMIT 1")?
            .query_row(params![owner_uid, name], |r| r.get(0))
            .optional()?)
    }

    pub fn state_of(&self, id: i64) -> Result<Option<JobState>> {
        let s: Option<String> = self.conn.prepare_cached("SELECT state FROM jobs WHERE id = ?1")?.query_row([id], |r| r.get(0)).optional()?;
        Ok(s.and_then(|s| JobState::parse(&s)))
    }

    /// queued -> failed without an attempt (e.g. a dependency failed).
    pub fn fail_queued(&mut self, id: i64, message: &str) -> Result<bool> {
        let now = self.now();
        let tx = self.conn.transaction()?;
        let n = tx.execute("UPDATE jobs SET state = 'failed', finished_at = ?2, message = ?3 WHERE id = ?1 AND state = 'queued'", params![id, now, message])?;
        if n == 1 {
            Self::event(&tx, id, now, Some(JobState::Queued), JobState::Failed, Some(message))?;
        }
        tx.commit()?;
        self.requeue_check(id);
        Ok(n == 1)
    }

    /// GPU use per owner since `since` (ms): (owner, GPUs, start, end or None while running).
    pub fn usage_since(&self, since: i64) -> Result<Vec<UsageRow>> {
        let mut st = self.conn.prepare_cached(
            "SELECT j.owner, json_array_length(a.gpus), a.started_at, a.ended_at FROM attempts a JOIN jobs j ON j.id = a.job_id \
             WHERE a.ended_at IS NULL OR a.ended_at >= ?1",
        )?;
        let rows = st.query_map([since], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?.collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// Finished jobs per owner since `since` (ms), as `gantry history --since` counts them.
    pub fn finished_since(&self, since: i64) -> Result<Vec<(String, u64)>> {
        let mut st = self.conn.prepare_cached("SELECT owner, COUNT(*) FROM jobs WHERE finished_at >= ?1 GROUP BY owner")?;
        let rows = st.query_map([since], |r| Ok((r.get(0)?, r.get::<_, i64>(1)? as u64)))?.collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// (owner, ms from submit to first start) of jobs first started since `since`.
    pub fn waits_since(&self, since: i64) -> Result<Vec<(String, i64)>> {
        let mut st = self.conn.prepare_cached("SELECT owner, started_at - submitted_at FROM jobs WHERE started_at >= ?1")?;
        let rows = st.query_map([since], |r| Ok((r.get(0)?, r.get(1)?)))?.collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// Ids of jobs that ended (succeeded, failed, cancelled, timed out) before `cutoff` (ms).
    pub fn ended_before(&self, cutoff: i64) -> Result<Vec<i64>> {
        let mut st = self.conn.prepare_cached(
            "SELECT id FROM jobs WHERE finished_at < ?1 AND state IN ('succeeded','failed','cancelled','timed_out') ORDER BY id",
        )?;
        let rows = st.query_map([cutoff], |r| r.get(0))?.collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// Delete these jobs with their attempts and events; only jobs that have ended (a queued, held,
    /// starting or running job is never deleted, whatever the ids say). Returns the ids deleted.
    pub fn delete_ended(&mut self, ids: &[i64]) -> Result<Vec<i64>> {
        let mut gone = vec![];
        let tx = self.conn.transaction()?;
        for id in ids {
            let ended: bool = tx
                .query_row("SELECT state IN ('succeeded','failed','cancelled','timed_out') FROM jobs WHERE id = ?1", [id], |r| r.get(0))
                .optional()?
                .unwrap_or(false);
            if ended {
                tx.execute("DELETE FROM events WHERE job_id = ?1", [id])?;
                tx.execute("DELETE FROM attempts WHERE job_id = ?1", [id])?;
                tx.execute("DELETE FROM jobs WHERE id = ?1", [id])?;
                gone.push(*id);
            }
        }
        tx.commit()?;
        Ok(gone)
    }

    /// Mean wait (ms) of first attempts started since `since`.
    pub fn typical_wait(&self, since: i64) -> Result<Option<i64>> {
        let v: Option<f64> = self
            .conn
            .prepare_cached("SELECT AVG(a.started_at - j.submitted_at) FROM attempts a JOIN jobs j ON j.id = a.job_id WHERE a.n = 1 AND a.started_at >= ?1")?
            .query_row([since], |r| r.get(0))?;
        Ok(v.map(|v| v as i64))
    }

    /// The last `limit` successful runs as (what was known before they ran, wall time in ms): the
    /// runtime estimator's input (see `estimate::History`).
    /// The request shapes (GPUs, memory per GPU) of the last `limit` jobs submitted: FGD packing's mix.
    pub fn recent_shapes(&self, limit: usize) -> Result<Vec<(u32, Option<u64>)>> {
        let mut st = self.conn.prepare_cached("SELECT gpus, gpu_memory FROM jobs ORDER BY id DESC LIMIT ?1")?;
        let rows = st.query_map([limit as i64], |r| Ok((r.get::<_, u32>(0)?, r.get::<_, Option<i64>>(1)?.map(|m| m as u64))))?;
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
    }

    pub fn recent_runtimes(&self, limit: usize) -> Result<Vec<(crate::estimate::JobKey, i64)>> {
        let mut st = self.conn.prepare_cached(
            "SELECT owner, name, image, gpus, gpu_memory, json_extract(spec_json, '$.limits.cpus_milli'), json_extract(spec_json, '$.limits.memory'), \
             finished_at - started_at FROM jobs WHERE state = 'succeeded' AND started_at IS NOT NULL AND finished_at IS NOT NULL ORDER BY id DESC LIMIT ?1",
        )?;
        let mut v = st
            .query_map([limit as i64], |r| {
                Ok((
                    crate::estimate::JobKey {
                        user: r.get(0)?,
                        name: r.get(1)?,
                        image: r.get(2)?,
                        gpus: r.get(3)?,
                        gpu_memory: r.get::<_, Option<i64>>(4)?.map(|v| v as u64),
                        cpus_milli: r.get::<_, Option<i64>>(5)?.unwrap_or(0) as u64,
                        memory: r.get::<_, Option<i64>>(6)?.unwrap_or(0) as u64,
                    },
                    r.get(7)?,
                ))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        v.reverse(); // oldest first, as they completed
        Ok(v)
    }

    /// Median duration (ms) of the last 20 successful runs with this name and image.
    pub fn typical_runtime(&self, name: &str, image: &str) -> Result<Option<i64>> {
        let mut st = self.conn.prepare_cached(
            "SELECT finished_at - started_at FROM jobs WHERE name = ?1 AND image = ?2 AND state = 'succeeded' ORDER BY id DESC LIMIT 20",
        )?;
        let mut v: Vec<i64> = st.query_map(params![name, image], |r| r.get(0))?.collect::<rusqlite::Result<Vec<_>>>()?;
        v.sort();
        Ok(v.get(v.len() / 2).copied())
    }

    /// Run `f` with fsync off (bulk loading for benchmarks and imports), then restore durability.
    pub fn bulk<T>(&mut self, f: impl FnOnce(&mut Store) -> T) -> Result<T> {
        self.conn.pragma_update(None, "synchronous", "OFF")?;
        let out = f(self);
        self.conn.pragma_update(None, "synchronous", "NORMAL")?;
        Ok(out)
    }

    /// Fill the store with `n` completed runs from 8 users, 20 job names and 5 images (every 7th
    /// failed), for benchmarks of history queries and the app. Returns the users' names.
    pub fn seed_completed_runs(&mut self, n: usize) -> Result<Vec<&'static str>> {
        use crate::spec::{validate_text, Format, Origin};
        let users = vec!["ada", "bob", "cy", "dee", "eve", "fay", "gus", "hal"];
        let jobs: Vec<ValidJob> = (0..20)
            .map(|i| validate_text(&format!("name: exp-{i}\nimage: img{}:1\ngpus: {}\n", i % 5, 1 + i % 4), Format::Yaml, &Origin::default()).expect("valid seed spec"))
            .collect();
        self.bulk(|st| -> Result<()> {
            for i in 0..n {
                let o = Owner { uid: 1000 + (i % users.len()) as u32, gid: 1000, name: users[i % users.len()].into() };
                let id = st.insert_job(&jobs[i % jobs.len()], &o, "seed", None, |_, _| None)?;
                let Some(a) = st.begin_attempt(id, &[(i % 8) as u32], &[])? else { continue };
                let next = if i % 7 == 0 { JobState::Failed } else { JobState::Succeeded };
                st.end_attempt(id, a.id, &Ending { exit_code: Some((i % 7 == 0) as i64), reason: EndReason::Exited, message: None, next, not_before: None })?;
            }
            Ok(())
        })??;
        Ok(users)
    }

    /// Record one minute of GPU aggregates (replacing a partial one for the same minute).
    pub fn record_gpu_minute(&mut self, gpu: u32, minute_ms: i64, util_avg: f64, util_max: u32, mem_used_avg: u64, mem_total: u64) -> Result<()> {
        self.conn
            .prepare_cached("INSERT OR REPLACE INTO gpu_minutes VALUES (?1, ?2, ?3, ?4, ?5, ?6)")?
            .execute(params![gpu, minute_ms, util_avg, util_max, mem_used_avg as i64, mem_total as i64])?;
        Ok(())
    }

    /// Per-minute aggregates for one GPU since `since_ms`: (minute, util_avg, mem_used_avg).
    pub fn gpu_minutes(&self, gpu: u32, since_ms: i64) -> Result<Vec<(i64, f64, i64)>> {
        let mut st = self.conn.prepare_cached("SELECT minute, util_avg, mem_used_avg FROM gpu_minutes WHERE gpu_index = ?1 AND minute >= ?2 ORDER BY minute")?;
        let rows = st.query_map(params![gpu, since_ms], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?.collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }
}

/// One user's figures in `gantry usage`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UserUsage {
    pub user: String,
    /// GPU count x run time of attempts, clipped to the window.
    pub gpu_hours: f64,
    /// Jobs that ended in the window (as `gantry history --since` lists them).
    pub jobs_finished: u64,
    /// Mean time from submit to first start of jobs first started in the window.
    pub mean_wait_ms: Option<i64>,
    /// Decayed GPU-hours now: what fair share orders equal-priority jobs by (lighter users first).
    pub fair_share_usage: f64,
}

/// `gantry usage`: per user, over [since_ms, until_ms).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UsageReport {
    pub since_ms: i64,
    pub until_ms: i64,
    pub fair_share_half_life_ms: i64,
    pub users: Vec<UserUsage>,
}

/// An attempt as [`Store::usage_since`] returns it: (owner, GPUs, start, end or `None` while running).
pub type UsageRow = (String, u32, i64, Option<i64>);
pub type UsageRows = [UsageRow];

/// Fair share: each attempt's GPU-hours, halved for every `half_life_ms` since it ended.
pub fn decayed_usage(rows: &UsageRows, now: i64, half_life_ms: i64) -> std::collections::HashMap<String, f64> {
    let hl = half_life_ms.max(1) as f64;
    let mut usage = std::collections::HashMap::new();
    for (owner, gpus, start, end) in rows {
        let end = end.unwrap_or(now);
        let hours = (end - start).max(0) as f64 / 3_600_000.0 * *gpus as f64;
        *usage.entry(owner.clone()).or_default() += hours * 0.5f64.powf((now - end) as f64 / hl);
    }
    usage
}

/// The usage report from the store's rows: GPU-hours clipped to the window, jobs finished, mean wait
/// and the decayed usage fair share acts on. Users sorted by GPU-hours, most first.
pub fn usage_report(since: i64, now: i64, half_life_ms: i64, attempts: &UsageRows, finished: &[(String, u64)], waits: &[(String, i64)]) -> UsageReport {
    let mut users: std::collections::BTreeMap<String, UserUsage> = std::collections::BTreeMap::new();
    fn entry<'a>(users: &'a mut std::collections::BTreeMap<String, UserUsage>, u: &str) -> &'a mut UserUsage {
        users.entry(u.to_string()).or_insert_with(|| UserUsage { user: u.to_string(), gpu_hours: 0.0, jobs_finished: 0, mean_wait_ms: None, fair_share_usage: 0.0 })
    }
    for (owner, gpus, start, end) in attempts {
        let (a, b) = ((*start).max(since), end.unwrap_or(now).min(now));
        if b > a {
            entry(&mut users, owner).gpu_hours += (b - a) as f64 / 3_600_000.0 * *gpus as f64;
        } else {
            entry(&mut users, owner);
        }
    }
    for (owner, n) in finished {
        entry(&mut users, owner).jobs_finished += n;
    }
    let mut wait_sums: std::collections::BTreeMap<&str, (i64, i64)> = std::collections::BTreeMap::new();
    for (owner, w) in waits {
        let s = wait_sums.entry(owner).or_default();
        s.0 += w;
        s.1 += 1;
    }
    for (owner, (sum, n)) in wait_sums {
        entry(&mut users, owner).mean_wait_ms = Some(sum / n);
    }
    for (owner, u) in decayed_usage(attempts, now, half_life_ms) {
        entry(&mut users, &owner).fair_share_usage = u;
    }
    let mut users: Vec<UserUsage> = users.into_values().collect();
    users.sort_by(|a, b| b.gpu_hours.total_cmp(&a.gpu_hours).then(a.user.cmp(&b.user)));
    UsageReport { since_ms: since, until_ms: now, fair_share_half_life_ms: half_life_ms, users }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{validate_text, Format, Origin};

    fn vj(t: &str) -> ValidJob {
        validate_text(t, Format::Yaml, &Origin::default()).unwrap()
    }
    fn owner() -> Owner {
        Owner { uid: 1000, gid: 1000, name: "ada".into() }
    }

    #[test]
    fn job_lifecycle_is_recorded_with_events() {
        let mut s = Store::open_in_memory().unwrap();
        let id = s.insert_job(&vj("image: a\ngpus: 1\n"), &owner(), "cli", None, |_, _| None).unwrap();
        let a = s.begin_attempt(id, &[0], &["GPU-x".into()]).unwrap().unwrap();
        assert!(s.begin_attempt(id, &[1], &[]).unwrap().is_none(), "a job must never start twice");
        assert!(s.set_running(id).unwrap());
        let end = Ending { exit_code: Some(0), reason: EndReason::Exited, message: None, next: JobState::Succeeded, not_before: None };
        s.end_attempt(id, a.id, &end).unwrap();
        s.end_attempt(id, a.id, &Ending { exit_code: Some(3), ..end }).unwrap();
        let j = s.job(id).unwrap().unwrap();
        assert_eq!((j.state, j.exit_code, j.attempts), (JobState::Succeeded, Some(0), 1));
        let ev: Vec<String> = s.events(id).unwrap().into_iter().map(|e| e.to).collect();
        assert_eq!(ev, ["queued", "starting", "running", "succeeded"]);
        let h = s.history(&HistoryFilter::default()).unwrap();
        assert_eq!(h.len(), 1);
        assert_eq!(h[0].gpu_uuids, vec!["GPU-x"]);
    }

    /// A run handle is written into the attempt's columns and read back as it was, for both backends;
    /// a row that holds the older text form `slurm:ID_TASK` in `container_id` reads as a Slurm run.
    #[test]
    fn run_refs_round_trip_through_the_attempts_columns() {
        let mut s = Store::open_in_memory().unwrap();
        let rows = [RunRef::Container("3f2a9c0d1e".into()), RunRef::Slurm { id: 42, task: None }, RunRef::Slurm { id: 56, task: Some(3) }];
        for run in rows {
            let id = s.insert_job(&vj("image: a\ngpus: 0\n"), &owner(), "cli", None, |_, _| None).unwrap();
            let a = s.begin_attempt(id, &[], &[]).unwrap().unwrap();
            assert_eq!(a.run_ref(), None, "nothing recorded yet");
            s.set_run(a.id, &run).unwrap();
            let back = s.open_attempt(id).unwrap().unwrap();
            assert_eq!(back.run_ref(), Some(run.clone()), "{run:?}");
            // The wire form (Attempt's JSON) keeps its fields: a container id, or Slurm's id and task.
            match &run {
                RunRef::Container(c) => assert_eq!((back.container_id.as_deref(), back.slurm_job_id), (Some(c.as_str()), None)),
                RunRef::Slurm { id, task } => assert_eq!((back.container_id.as_deref(), back.slurm_job_id, back.slurm_array_task), (None, Some(*id), *task)),
            }
        }
        let id = s.insert_job(&vj("image: a\ngpus: 0\n"), &owner(), "cli", None, |_, _| None).unwrap();
        let a = s.begin_attempt(id, &[], &[]).unwrap().unwrap();
        s.conn.execute("UPDATE attempts SET container_id = 'slurm:77_1' WHERE id = ?1", [a.id]).unwrap();
        assert_eq!(s.open_attempt(id).unwrap().unwrap().run_ref(), Some(RunRef::Slurm { id: 77, task: Some(1) }));
        assert_eq!(RunRef::Slurm { id: 77, task: Some(1) }.to_string(), "77_1");
        assert_eq!(RunRef::Slurm { id: 77, task: None }.to_string(), "77");
    }

    #[test]
    fn cancel_queued_is_immediate_and_blocks_start() {
        let mut s = Store::open_in_memory().unwrap();
        let id = s.insert_job(&vj("image: a\n"), &owner(), "cli", None, |_, _| None).unwrap();
        assert_eq!(s.request_cancel(id).unwrap(), Some(JobState::Queued));
        assert_eq!(s.job(id).unwrap().unwrap().state, JobState::Cancelled);
        assert!(s.begin_attempt(id, &[0], &[]).unwrap().is_none());
        assert_eq!(s.request_cancel(999).unwrap(), None);
    }

    #[test]
    fn survives_reopen_and_filters_history() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("g.db");
        {
            let mut s = Store::open(&p).unwrap();
            for (i, name) in ["alpha", "beta", "gamma"].iter().enumerate() {
                let id = s.insert_job(&vj(&format!("name: {name}\nimage: img{i}\n")), &Owner { name: if i == 0 { "bob".into() } else { "ada".into() }, ..owner() }, "cli", None, |_, _| None).unwrap();
                let a = s.begin_attempt(id, &[], &[]).unwrap().unwrap();
                let next = if i == 2 { JobState::Failed } else { JobState::Succeeded };
                s.end_attempt(id, a.id, &Ending { exit_code: Some(i as i64), reason: EndReason::Exited, message: None, next, not_before: None }).unwrap();
            }
            s.insert_job(&vj("image: q\n"), &owner(), "cli", None, |_, _| None).unwrap();
        }
        let mut s = Store::open(&p).unwrap();
        assert_eq!(s.active_jobs().unwrap().len(), 1);
        let mut f = |f: HistoryFilter| s.history(&f).unwrap().into_iter().map(|r| r.name).collect::<Vec<_>>();
        assert_eq!(f(HistoryFilter::default()), ["gamma", "beta", "alpha"]);
        assert_eq!(f(HistoryFilter { user: Some("bob".into()), ..Default::default() }), ["alpha"]);
        assert_eq!(f(HistoryFilter { status: Some(JobState::Failed), ..Default::default() }), ["gamma"]);
        assert_eq!(f(HistoryFilter { text: Some("img1".into()), ..Default::default() }), ["beta"]);
        assert_eq!(f(HistoryFilter { limit: Some(1), offset: Some(1), ..Default::default() }), ["beta"]);
    }

    #[test]
    fn held_jobs_stay_queued_until_released() {
        let mut s = Store::open_in_memory().unwrap();
        let id = s.insert_job(&vj("image: a\n"), &owner(), "cli", None, |_, _| None).unwrap();
        assert!(s.set_held(id, true, "ada").unwrap());
        assert!(!s.set_held(id, true, "ada").unwrap(), "holding twice changes nothing");
        assert!(s.queued_rows().unwrap()[0].held);
        assert!(s.begin_attempt(id, &[0], &[]).unwrap().is_none(), "a held job must not start");
        assert!(s.set_held(id, false, "root").unwrap());
        assert!(!s.queued_rows().unwrap()[0].held);
        let ev: Vec<Option<String>> = s.events(id).unwrap().into_iter().map(|e| e.message).collect();
        assert_eq!(ev[1..], [Some("held by ada".into()), Some("released by root".into())]);
        let a = s.begin_attempt(id, &[0], &[]).unwrap().unwrap();
        s.end_attempt(id, a.id, &Ending { exit_code: Some(0), reason: EndReason::Exited, message: None, next: JobState::Succeeded, not_before: None }).unwrap();
        assert!(!s.set_held(id, true, "ada").unwrap(), "only queued jobs can be held");
        assert!(!s.set_held(999, true, "ada").unwrap());
    }

    #[test]
    fn retry_requeues_with_backoff() {
        let mut s = Store::open_in_memory().unwrap();
        let id = s.insert_job(&vj("image: a\nretries: 1\n"), &owner(), "cli", None, |_, _| None).unwrap();
        let a = s.begin_attempt(id, &[], &[]).unwrap().unwrap();
        s.end_attempt(id, a.id, &Ending { exit_code: Some(1), reason: EndReason::Exited, message: None, next: JobState::Queued, not_before: Some(123) }).unwrap();
        let j = s.job(id).unwrap().unwrap();
        assert_eq!((j.state, j.not_before, j.finished_at), (JobState::Queued, Some(123), None));
        let a2 = s.begin_attempt(id, &[], &[]).unwrap().unwrap();
        assert_eq!(a2.n, 2);
    }

    #[test]
    fn retention_deletes_only_jobs_that_ended_before_the_cutoff() {
        let mut s = Store::open_in_memory().unwrap();
        let end = |s: &mut Store, id: i64, next: JobState| {
            let a = s.begin_attempt(id, &[0], &[]).unwrap().unwrap();
            s.end_attempt(id, a.id, &Ending { exit_code: Some(0), reason: EndReason::Exited, message: None, next, not_before: None }).unwrap();
        };
        let job = |s: &mut Store| s.insert_job(&vj("image: a\n"), &owner(), "cli", None, |_, _| None).unwrap();
        let (ok, failed, cancelled, queued, held, running, retrying) = (job(&mut s), job(&mut s), job(&mut s), job(&mut s), job(&mut s), job(&mut s), job(&mut s));
        end(&mut s, ok, JobState::Succeeded);
        end(&mut s, failed, JobState::Failed);
        s.request_cancel(cancelled).unwrap();
        s.set_held(held, true, "ada").unwrap();
        s.begin_attempt(running, &[1], &[]).unwrap().unwrap();
        end(&mut s, retrying, JobState::Queued);
        // Table: cutoff -> jobs listed as ended before it.
        let later = now_ms() + 60_000;
        for (cutoff, want) in [(0, vec![]), (later, vec![ok, failed, cancelled])] {
            assert_eq!(s.ended_before(cutoff).unwrap(), want, "cutoff {cutoff}");
        }
        // Even when asked to, jobs that have not ended stay.
        let all = vec![ok, failed, cancelled, queued, held, running, retrying, 999];
        assert_eq!(s.delete_ended(&all).unwrap(), vec![ok, failed, cancelled]);
        for id in [queued, held, running, retrying] {
            assert!(s.job(id).unwrap().is_some(), "job {id} must stay");
        }
        assert!(s.job(ok).unwrap().is_none() && s.attempts(ok).unwrap().is_empty() && s.events(ok).unwrap().is_empty());
        assert_eq!(s.active_jobs().unwrap().len(), 4);
    }

    #[test]
    fn usage_sums_match_history_and_clip_to_the_window() {
        let mut s = Store::open_in_memory().unwrap();
        let mut ids = vec![];
        for (who, gpus) in [("ada", "2"), ("ada", "1"), ("bob", "0"), ("bob", "1")] {
            let id = s.insert_job(&vj(&format!("image: a\ngpus: {gpus}\n")), &Owner { name: who.into(), ..owner() }, "cli", None, |_, _| None).unwrap();
            let g: Vec<u32> = (0..gpus.parse().unwrap()).collect();
            let a = s.begin_attempt(id, &g, &[]).unwrap().unwrap();
            std::thread::sleep(std::time::Duration::from_millis(3));
            s.end_attempt(id, a.id, &Ending { exit_code: Some(0), reason: EndReason::Exited, message: None, next: JobState::Succeeded, not_before: None }).unwrap();
            ids.push(id);
        }
        let now = now_ms() + 1;
        let r = usage_report(0, now, 86_400_000, &s.usage_since(0).unwrap(), &s.finished_since(0).unwrap(), &s.waits_since(0).unwrap());
        let hist = s.history(&HistoryFilter::default()).unwrap();
        for u in &r.users {
            let rows: Vec<&HistoryRow> = hist.iter().filter(|h| h.owner == u.user).collect();
            let hours: f64 = rows.iter().map(|h| (h.finished_at.unwrap() - h.started_at.unwrap()) as f64 / 3_600_000.0 * h.gpus.len() as f64).sum();
            assert!((u.gpu_hours - hours).abs() < 1e-12, "{}: {} vs history {hours}", u.user, u.gpu_hours);
            assert_eq!(u.jobs_finished, rows.len() as u64);
            assert!(u.mean_wait_ms.is_some() && u.fair_share_usage > 0.0 || u.user == "bob");
        }
        assert_eq!(r.users.iter().map(|u| u.user.as_str()).collect::<Vec<_>>(), ["ada", "bob"], "most GPU-hours first");
        // Clipping: an attempt 0..10h with 2 GPUs, window from 6h to 8h (still running at 8h) -> 4 GPU-hours.
        let h = 3_600_000;
        let r = usage_report(6 * h, 8 * h, h, &[("cy".into(), 2, 0, None), ("cy".into(), 1, 0, Some(5 * h))], &[], &[("cy".into(), 10), ("cy".into(), 20)]);
        assert_eq!((r.users[0].gpu_hours, r.users[0].mean_wait_ms), (4.0, Some(15)));
        // Fair share: the finished attempt (5 GPU-hours, ended 3 half-lives ago) counts 1/8; the running one in full.
        assert!((r.users[0].fair_share_usage - (16.0 + 5.0 / 8.0)).abs() < 1e-9, "{}", r.users[0].fair_share_usage);
    }

    fn finish(s: &mut Store, id: i64, next: JobState) {
        let a = s.begin_attempt(id, &[0], &[]).unwrap().unwrap();
        s.end_attempt(id, a.id, &Ending { exit_code: Some(0), reason: EndReason::Exited, message: None, next, not_before: None }).unwrap();
    }

    #[test]
    fn every_page_of_every_sort_and_filter_matches_the_full_ordering() {
        let mut s = Store::open_in_memory().unwrap();
        // More than BROAD_FILTER runs: broad filters walk the sort key's index, narrow ones do not.
        s.seed_completed_runs(2600).unwrap();
        let all = s.history(&HistoryFilter { limit: Some(10_000), sort: Some("id".into()), ..Default::default() }).unwrap();
        assert_eq!(all.len(), 2600);
        type Pred = Box<dyn Fn(&HistoryRow) -> bool>;
        let text = |t: &'static str| -> Pred { Box::new(move |r: &HistoryRow| r.name.to_lowercase().contains(t) || r.image.to_lowercase().contains(t)) };
        let filters: Vec<(HistoryFilter, Pred)> = vec![
            (HistoryFilter::default(), Box::new(|_| true)),
            (HistoryFilter { status: Some(JobState::Succeeded), ..Default::default() }, Box::new(|r| r.status == JobState::Succeeded)),
            (HistoryFilter { status: Some(JobState::Failed), ..Default::default() }, Box::new(|r| r.status == JobState::Failed)),
            (HistoryFilter { user: Some("ada".into()), ..Default::default() }, Box::new(|r| r.owner == "ada")),
            (HistoryFilter { text: Some("XP-1".into()), ..Default::default() }, text("xp-1")),
            (HistoryFilter { text: Some("g3".into()), ..Default::default() }, text("g3")),
        ];
        for (f, keep) in &filters {
            let rows: Vec<&HistoryRow> = all.iter().filter(|r| keep(r)).collect();
            let total = rows.len();
            assert_eq!(s.history_count(f).unwrap(), total as i64, "{f:?}");
            for sort in ["id", "name", "owner", "finished", "started", "exit_code"] {
                let mut want = rows.clone();
                want.sort_by(|a, b| {
                    let k = match sort {
                        "name" => a.name.cmp(&b.name),
                        "owner" => a.owner.cmp(&b.owner),
                        "finished" => a.finished_at.cmp(&b.finished_at),
                        "started" => a.started_at.cmp(&b.started_at),
                        "exit_code" => a.exit_code.cmp(&b.exit_code),
                        _ => std::cmp::Ordering::Equal,
                    };
                    k.then(a.id.cmp(&b.id))
                });
                for asc in [true, false] {
                    let want: Vec<i64> = if asc { want.iter().map(|r| r.id).collect() } else { want.iter().rev().map(|r| r.id).collect() };
                    for offset in [0, 150, total / 2 - 10, total / 2 + 1, total.saturating_sub(90), total - 10, total, total + 5] {
                        let page = HistoryFilter { sort: Some(sort.into()), asc: Some(asc), offset: Some(offset as u32), limit: Some(100), ..f.clone() };
                        let got: Vec<i64> = s.history(&page).unwrap().into_iter().map(|r| r.id).collect();
                        assert_eq!(got, want[offset.min(total)..(offset + 100).min(total)], "{page:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn text_search_is_a_literal_case_insensitive_substring_of_name_or_image() {
        let mut s = Store::open_in_memory().unwrap();
        let mut ids = vec![];
        for (name, image) in [("a_b%c-train", "pytorch:2"), ("axbyc-train", "jax:1"), ("eval", "Py_Torch:3"), ("draft", "x:1")] {
            let id = s.insert_job(&vj(&format!("name: {name}\nimage: {image}\n")), &owner(), "cli", None, |_, _| None).unwrap();
            finish(&mut s, id, JobState::Succeeded);
            ids.push(id);
        }
        // Renamed once its id is known (templates): found by its new name only.
        let renamed = s.insert_job(&vj("name: old-name\nimage: x:1\n"), &owner(), "cli", None, |_, j| Some(ValidJob { name: "fresh-name".into(), ..j.clone() })).unwrap();
        finish(&mut s, renamed, JobState::Succeeded);
        // Table: text -> the jobs it finds.
        for (text, want) in [
            ("_b%", vec![ids[0]]),
            ("TRAIN", vec![ids[0], ids[1]]),
            ("py_torch", vec![ids[2]]),
            ("pytorch", vec![ids[0]]),
            ("b%", vec![ids[0]]),
            ("%", vec![ids[0]]),
            ("old-name", vec![]),
            ("fresh", vec![renamed]),
            ("", vec![ids[0], ids[1], ids[2], ids[3], renamed]),
        ] {
            let f = HistoryFilter { text: Some(text.into()), sort: Some("id".into()), asc: Some(true), ..Default::default() };
            let got: Vec<i64> = s.history(&f).unwrap().into_iter().map(|r| r.id).collect();
            assert_eq!(got, want, "text {text:?}");
            assert_eq!(s.history_count(&f).unwrap(), want.len() as i64, "count for {text:?}");
        }
    }

    #[test]
    fn cached_history_counts_equal_a_fresh_count_through_changes() {
        let mut s = Store::open_in_memory().unwrap();
        s.seed_completed_runs(300).unwrap();
        let mid = s.history(&HistoryFilter { sort: Some("id".into()), asc: Some(true), offset: Some(150), limit: Some(1), ..Default::default() }).unwrap()[0].finished_at;
        let later = now_ms() + 3_600_000;
        let filters = [
            HistoryFilter::default(),
            HistoryFilter { status: Some(JobState::Succeeded), ..Default::default() },
            HistoryFilter { status: Some(JobState::Cancelled), ..Default::default() },
            HistoryFilter { user: Some("ada".into()), ..Default::default() },
            HistoryFilter { text: Some("exp-1".into()), ..Default::default() },
            HistoryFilter { text: Some("NEW".into()), ..Default::default() },
            HistoryFilter { image: Some("img2:1".into()), ..Default::default() },
            HistoryFilter { since: mid, until: Some(later), ..Default::default() },
            HistoryFilter { user: Some("ada".into()), status: Some(JobState::Failed), text: Some("exp".into()), ..Default::default() },
        ];
        let check = |s: &mut Store, step: &str| {
            for f in &filters {
                let fresh = Store::count_matches(&s.conn, f).unwrap();
                assert_eq!(s.history_count(f).unwrap(), fresh, "after {step}: {f:?}");
            }
            let cached: i64 = s.conn.query_row("SELECT COUNT(*) FROM history_counts", [], |r| r.get(0)).unwrap();
            assert_eq!(cached, filters.len() as i64, "every filter's count is cached");
        };
        check(&mut s, "seeding");
        let ada = Owner { name: "ada".into(), ..owner() };
        let q: Vec<i64> = (0..6).map(|i| s.insert_job(&vj(&format!("name: new-{i}\nimage: img2:1\nretries: 1\n")), &ada, "cli", None, |_, _| None).unwrap()).collect();
        check(&mut s, "queueing");
        finish(&mut s, q[0], JobState::Succeeded);
        finish(&mut s, q[1], JobState::Failed);
        check(&mut s, "finishing");
        s.request_cancel(q[2]).unwrap();
        s.fail_queued(q[3], "dependency failed").unwrap();
        finish(&mut s, q[4], JobState::Queued);
        check(&mut s, "cancel, fail and retry");
        let old = s.ended_before(mid.unwrap() + 1).unwrap();
        s.delete_ended(&old[..old.len() / 2]).unwrap();
        s.delete_ended(&[q[0]]).unwrap();
        check(&mut s, "retention");
    }

    #[test]
    fn queue_in_memory_equals_the_database_through_every_transition() {
        enum Op {
            Submit(u32),
            Start(usize),
            Retry(usize),
            Finish(usize),
            Cancel(usize),
            Hold(usize, bool),
            Priority(usize, i32),
            FailQueued(usize),
            Reopen,
        }
        use Op::*;
        let ops = [
            Submit(1000), Submit(1001), Submit(1000), Submit(1002), Submit(1001),
            Start(0), Hold(1, true), Priority(2, 5), Cancel(3), Retry(0), Hold(1, false), Priority(1, -3),
            Start(0), Finish(0), Start(2), Cancel(2), FailQueued(4), Submit(1000), Reopen, Hold(5, true),
            Cancel(5), Submit(1001), Start(6), Retry(6), Reopen, Priority(6, 2), Start(1), Finish(1),
        ];
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("g.db");
        let mut s = Store::open(&p).unwrap();
        let mut q = s.track_queue().unwrap();
        let (mut ids, mut attempts) = (vec![], std::collections::HashMap::new());
        for (step, op) in ops.iter().enumerate() {
            match *op {
                Submit(uid) => {
                    let o = Owner { uid, gid: uid, name: format!("u{uid}") };
                    ids.push(s.insert_job(&vj("image: a\ngpus: 1\nretries: 3\n"), &o, "cli", None, |_, _| None).unwrap());
                }
                Start(i) => {
                    attempts.insert(i, s.begin_attempt(ids[i], &[0], &[]).unwrap().unwrap().id);
                }
                Retry(i) | Finish(i) => {
                    let next = if matches!(op, Retry(_)) { JobState::Queued } else { JobState::Succeeded };
                    let end = Ending { exit_code: Some(1), reason: EndReason::Exited, message: None, next, not_before: Some(now_ms() + 60_000) };
                    s.end_attempt(ids[i], attempts[&i], &end).unwrap();
                }
                Cancel(i) => drop(s.request_cancel(ids[i]).unwrap()),
                Hold(i, h) => drop(s.set_held(ids[i], h, "ada").unwrap()),
                Priority(i, p) => drop(s.set_priority(ids[i], p).unwrap()),
                FailQueued(i) => drop(s.fail_queued(ids[i], "dependency failed").unwrap()),
                Reopen => {
                    drop(s);
                    s = Store::open(&p).unwrap();
                    q = s.track_queue().unwrap();
                }
            }
            let db: Vec<String> = s.queued_rows().unwrap().into_iter().map(|r| format!("{r:?}")).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
            let mem: Vec<String> = q.lock().unwrap().rows().iter().map(|r| format!("{r:?}")).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
            assert_eq!(mem, db, "step {step}");
            for uid in [1000, 1001, 1002] {
                let n: i64 = s.conn.query_row("SELECT COUNT(*) FROM jobs WHERE owner_uid = ?1 AND state = 'queued'", [uid], |r| r.get(0)).unwrap();
                assert_eq!(s.queued_count(uid).unwrap(), n as usize, "step {step}: queued jobs of {uid}");
            }
        }
        assert!(!q.lock().unwrap().is_stale());
    }
}
