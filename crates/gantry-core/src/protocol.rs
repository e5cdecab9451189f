//! Wire types the engine hands to its API and clients (CLI, app).

use serde::{Deserialize, Serialize};

use crate::gpu::{BackendKind, GpuSample};
use crate::store::{Attempt, Event, Job, JobState};

/// Pushed to API subscribers.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EngineEvent {
    Job { job_id: i64, state: JobState, at: i64 },
    Gpus { at: i64, gpus: Vec<GpuSample> },
}

/// A queued or running job with the scheduler's verdict.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QueueEntry {
    pub job: Job,
    pub gpus_assigned: Vec<u32>,
    pub position: Option<usize>,
    pub reason: Option<String>,
    /// Estimated start (ms) from declared or learned runtimes, assuming nothing new arrives.
    pub estimated_start: Option<i64>,
    /// What `estimated_start` is: `p50` (a replay of the queue with median runtimes, learned from
    /// similar completed jobs or declared: about even odds of starting earlier or later).
    #[serde(default)]
    pub eta_confidence: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GpuStatus {
    pub backend: BackendKind,
    /// Why NVML is not used, when it is not.
    pub note: Option<String>,
    pub gpus: Vec<GpuSample>,
    /// Which Gantry jobs hold which GPU.
    pub holders: Vec<(u32, Vec<i64>)>,
    /// GPUs the lab config keeps for interactive use: Gantry never places jobs on them.
    #[serde(default)]
    pub reserved: Vec<u32>,
    /// Everything on each GPU: this engine's jobs, and every process or container outside them.
    #[serde(default)]
    pub users: Vec<GpuUser>,
    /// The NVML library loaded instead of the driver's (`GANTRY_NVML_LIB`, e.g. a test double).
    #[serde(default)]
    pub library: Option<String>,
}

/// One user of a GPU. A job of this engine has `job_id` (its processes on the GPU folded into one
/// row); anything else is outside Gantry: a process (`pid`, `user`, `command`, and `container` when it
/// runs in one), or a container that holds the GPU with no process on it yet (`container` only).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuUser {
    pub gpu: u32,
    pub job_id: Option<i64>,
    pub job_name: Option<String>,
    /// The job's owner, or the process's user.
    pub user: Option<String>,
    pub pid: Option<u32>,
    pub command: Option<String>,
    /// Container name (or short id) of a process or container outside this engine's jobs.
    pub container: Option<String>,
    /// GPU memory it uses, when NVML reports it.
    pub used_memory: Option<u64>,
    /// When the job started (ms).
    pub since: Option<i64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobDetail {
    pub job: Job,
    pub attempts: Vec<Attempt>,
    pub events: Vec<Event>,
    pub reason: Option<String>,
}

/// A container labelled for this engine that its database does not know (e.g. after a lost WAL).
/// Reported, never adopted under a new job; its GPUs count as busy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Orphan {
    pub container_id: String,
    pub name: String,
    pub job_id: i64,
    pub running: bool,
    pub gpus: Vec<u32>,
}

/// What keeps the engine from doing its work, for `gantry status` and the app's banner.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Health {
    /// The state database cannot be written: nothing starts until it can.
    pub store_problem: Option<String>,
    /// The backend that runs the jobs (Docker, Slurm) cannot be reached: queued jobs wait. Called
    /// `docker_problem` before 0.2 (still read under that name for one release).
    #[serde(alias = "docker_problem")]
    pub backend_problem: Option<String>,
    pub orphans: Vec<Orphan>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An engine from before the rename still reports its outage to a new client (and back).
    #[test]
    fn health_reads_the_old_docker_problem_name() {
        let h: Health = serde_json::from_str(r#"{"store_problem":null,"docker_problem":"Docker is away","orphans":[]}"#).unwrap();
        assert_eq!(h.backend_problem.as_deref(), Some("Docker is away"));
        let h: Health = serde_json::from_str(r#"{"store_problem":null,"backend_problem":"Slurm is not reachable","orphans":[]}"#).unwrap();
        assert_eq!(h.backend_problem.as_deref(), Some("Slurm is not reachable"));
    }
}
