//! Jobs as clients see them: states, attempts, events, the queue, submission bodies and errors.
//! The only module of the protocol that names the job spec's types (`crate::spec`, pure data).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use ts_rs::TS;

use super::gpu::GpuSample;
use crate::spec::{SpecError, ValidJob};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, TS)]
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
        matches!(
            self,
            JobState::Succeeded | JobState::Failed | JobState::Cancelled | JobState::TimedOut
        )
    }
}

/// Why an attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, TS)]
#[serde(rename_all = "snake_case")]
pub enum EndReason {
    Exited,
    Oom,
    Timeout,
    Cancelled,
    Lost,
    EngineError,
    /// Stopped for another job and queued again (preemption).
    Preempted,
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
            EndReason::Preempted => "preempted",
        }
    }
    pub fn parse(s: &str) -> Option<EndReason> {
        [
            Self::Exited,
            Self::Oom,
            Self::Timeout,
            Self::Cancelled,
            Self::Lost,
            Self::EngineError,
            Self::Preempted,
        ]
        .into_iter()
        .find(|r| r.as_str() == s)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
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

/// A state change of a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
#[ts(rename = "JobEvent")]
pub struct Event {
    pub job_id: i64,
    pub at: i64,
    pub from: Option<String>,
    pub to: String,
    pub message: Option<String>,
}

/// A job as one caller sees it. The row is public; `job` (the validated spec: command, env, mounts,
/// workdir) and `message` (free text that can quote the spec, e.g. Docker's errors about a mount)
/// are `None` with `spec_hidden: true` unless the caller may see the owner's private parts (the
/// owner, root and the lab's admins).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
#[ts(rename = "Job")]
pub struct JobView {
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
    pub job: Option<ValidJob>,
    pub spec_hidden: bool,
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

/// A queued, starting or running job as `gantry ls` and the app's Queue view show it: its public row
/// only, the same for every caller (everyone sees the queue of a shared machine). The spec (command,
/// env, mounts, workdir), messages and output are not here; `gantry show` gives them to whoever may
/// see them. A field added here is shown to every user: add only what a row already shows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
pub struct QueueJob {
    pub id: i64,
    pub name: String,
    pub owner_uid: u32,
    pub owner: String,
    pub image: String,
    /// GPUs it asks for (0: CPU only).
    pub gpus: u32,
    /// Declared memory per GPU in bytes; `None`: whole GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional = nullable)]
    pub gpu_memory: Option<u64>,
    pub priority: i32,
    pub state: JobState,
    pub submitted_at: i64,
    /// When its first attempt started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional = nullable)]
    pub started_at: Option<i64>,
    /// Set for an interactive session (`gantry shell`, `gantry notebook`): the `interactive` class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional = nullable)]
    pub session: Option<QueueSession>,
}

/// What the queue shows of a session besides its row: when it ends and the ports `gantry open`
/// reaches (numbers inside its container; only its owner may open them).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, TS)]
pub struct QueueSession {
    /// When it ends at the latest (its attempt's start plus its length); `None` while queued.
    pub ends_at: Option<i64>,
    /// Its spec's `ports` (known once it started).
    pub ports: Vec<u16>,
}

/// `GET /v1/queue`: the part of the queue `gantry ls` shows: every starting and running job, the
/// first `limit` queued jobs in scheduling order and the first `limit` of the caller's own (by id).
#[derive(Debug, Clone, Serialize, Deserialize, TS)]
pub struct QueuePage {
    pub jobs: Vec<QueueEntryView>,
    /// Jobs queued in all (shown or not).
    pub queued: usize,
}

/// `?limit=` of `GET /v1/queue`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct QueuePageQuery {
    pub limit: usize,
}

/// `GET /v1/jobs`: a running or queued job with the scheduler's verdict. A field that is `None` is
/// left out (a deep queue is 100,000 of these).
#[derive(Debug, Clone, Serialize, Deserialize, TS)]
#[ts(rename = "QueueEntry")]
pub struct QueueEntryView {
    pub job: QueueJob,
    /// GPU indexes it holds (running); empty while queued and for CPU-only jobs.
    pub gpus_assigned: Vec<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional = nullable)]
    pub position: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional = nullable)]
    pub reason: Option<String>,
    /// Estimated start (ms) from declared or learned runtimes, assuming nothing new arrives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional = nullable)]
    pub estimated_start: Option<i64>,
    /// How sure `estimated_start` is (`p50`: even odds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional = nullable)]
    pub eta_confidence: Option<String>,
}

/// `GET /v1/jobs/{id}`. When `job.spec_hidden`, attempt and event messages are `None` too.
#[derive(Debug, Clone, Serialize, Deserialize, TS)]
#[ts(rename = "JobDetail")]
pub struct JobDetailView {
    pub job: JobView,
    pub attempts: Vec<Attempt>,
    pub events: Vec<Event>,
    pub reason: Option<String>,
    /// How well it used what it held (owner and admins only, like its log; absent before it ran).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional = nullable)]
    pub efficiency: Option<super::efficiency::Efficiency>,
}

/// `POST /v1/jobs` and `POST /v1/validate`: one spec file's text.
#[derive(Debug, Clone, Serialize, Deserialize, TS)]
pub struct SubmitRequest {
    pub text: String,
    /// File name, for the format (`.yaml`/`.toml`) and the default job name.
    pub file_name: String,
    /// Directory relative mount paths are resolved against.
    pub base_dir: Option<PathBuf>,
    /// Chosen by the client, new for each submission (`Client::submit` makes one when absent): the
    /// same request sent again with the same key (its answer was lost) gets the first one's jobs.
    /// The engine keeps keys a day, per uid: another user's key is another key. 8 to 128 letters,
    /// digits, `-`, `_`, `.` or `:`. Ignored by `POST /v1/validate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// What wrote the text, for the job's source (`gantry show`: "from ..."). Absent: a file.
    #[serde(default, skip_serializing_if = "SpecOrigin::is_file")]
    pub origin: SpecOrigin,
    /// `gantry submit --begin`: in place of the spec's `begin` (`22:00`, `tomorrow 08:00`, `+2h`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional = nullable)]
    pub begin: Option<String>,
}

/// Where a submitted spec's text comes from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, TS)]
#[serde(rename_all = "snake_case")]
pub enum SpecOrigin {
    /// A spec file: the job's source is `api:<file_name>`.
    #[default]
    File,
    /// `gantry run` wrote it from its flags: there is no file, and the source says `gantry run`
    /// (not the command: a job's source is public, its command is not).
    RunFlags,
    /// A session (`gantry shell`, `gantry notebook`, the app): the source says `session` or `notebook`.
    Session,
}

impl SpecOrigin {
    pub fn is_file(&self) -> bool {
        *self == SpecOrigin::File
    }

    /// The job's source for a spec from `file_name` that came this way.
    pub fn source(self, file_name: &str) -> String {
        match self {
            SpecOrigin::File => format!("api:{file_name}"),
            SpecOrigin::RunFlags => "gantry run".into(),
            SpecOrigin::Session if file_name == "notebook.yaml" => "notebook".into(),
            SpecOrigin::Session => "session".into(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, TS)]
pub struct Submitted {
    /// The first (or only) job.
    pub job_id: i64,
    /// Every job created (a `matrix` makes several).
    #[serde(default)]
    pub job_ids: Vec<i64>,
}

impl Submitted {
    pub fn of(ids: Vec<i64>) -> Self {
        Submitted {
            job_id: ids.first().copied().unwrap_or(0),
            job_ids: ids,
        }
    }
}

/// `POST /v1/jobs/{id}/priority`.
#[derive(Debug, Clone, Serialize, Deserialize, TS)]
pub struct PriorityRequest {
    pub priority: i32,
}

/// The body of every failed request.
#[derive(Debug, Clone, Serialize, Deserialize, TS)]
pub struct ApiError {
    pub error: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec_error: Option<SpecError>,
}

/// A spec file checked by the engine without queueing it (the app's preview).
#[derive(Debug, Clone, Serialize, Deserialize, TS)]
pub struct Preview {
    pub path: PathBuf,
    pub file_name: String,
    pub job: Option<ValidJob>,
    pub error: Option<String>,
    pub spec_error: Option<SpecError>,
    /// The dry run of a valid file (`POST /v1/jobs/preview`): the GPUs it would get now, or why it
    /// would wait and until about when. `None` from an engine without dry runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional = nullable)]
    pub plan: Option<SubmitPreview>,
}

/// `GET /v1/events`, one per line: state changes and GPU samples.
#[derive(Debug, Clone, Serialize, Deserialize, TS)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EngineEvent {
    Job { job_id: i64, state: JobState, at: i64 },
    Gpus { at: i64, gpus: Vec<GpuSample> },
}

/// The app's `job-changed` event: [`EngineEvent::Job`] without its tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, TS)]
pub struct JobChanged {
    pub job_id: i64,
    pub state: JobState,
    pub at: i64,
}

/// `POST /v1/jobs/preview`: a dry run of `POST /v1/jobs` with the same [`SubmitRequest`], by the
/// same checks (as the caller: mounts, limits, the queue bound), and where and when its jobs would
/// start if queued now. Nothing is queued or written.
#[derive(Debug, Clone, Serialize, Deserialize, TS)]
pub struct SubmitPreview {
    /// The jobs it would queue (a `matrix` makes several), with the lab's defaults filled in.
    pub jobs: Vec<PreviewJob>,
    /// The lab's limits the submission meets, one line each (`priority 0 is within your range -10..10`).
    pub checks: Vec<String>,
}

/// One job of a [`SubmitPreview`].
#[derive(Debug, Clone, Serialize, Deserialize, TS)]
pub struct PreviewJob {
    pub job: ValidJob,
    /// It would start at once (on `gpus`).
    pub starts_now: bool,
    /// The GPUs it would get now (empty when it would wait, or needs none).
    pub gpus: Vec<u32>,
    /// Why it would wait (the scheduler's words, as `gantry ls` shows them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional = nullable)]
    pub reason: Option<String>,
    /// Estimated start (ms), from declared and learned runtimes, assuming nothing new arrives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional = nullable)]
    pub estimated_start: Option<i64>,
}
