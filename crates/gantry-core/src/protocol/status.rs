//! The engine as clients see it: its status and health, the caller, their drop folder.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use ts_rs::TS;

use super::gpu::BackendKind;

/// `GET /v1/status`.
#[derive(Debug, Clone, Serialize, Deserialize, TS)]
#[ts(rename = "Status")]
pub struct StatusInfo {
    pub version: String,
    pub pid: u32,
    pub gpu_backend: BackendKind,
    pub gpu_note: Option<String>,
    /// The NVML library loaded instead of the driver's (`GANTRY_NVML_LIB`).
    #[serde(default)]
    pub gpu_library: Option<String>,
    pub gpu_count: usize,
    /// The caller's drop folder (under the system engine, the one in their home).
    pub inbox: PathBuf,
    pub state_dir: PathBuf,
    /// The backend that runs the jobs (Docker, Slurm) cannot be reached (`docker_problem` before 0.2).
    #[serde(alias = "docker_problem")]
    pub backend_problem: Option<String>,
    /// The state database cannot be written: nothing starts until it can.
    #[serde(default)]
    pub store_problem: Option<String>,
    /// Docker's disk is below the lab's free-space minimum: no new job starts (the top writers named).
    #[serde(default)]
    pub disk_problem: Option<String>,
    /// Whether each job's writable layer is bounded (`[disk] layer_size`), and why not where not.
    #[serde(default)]
    pub disk_note: Option<String>,
    /// Containers labelled for this engine that its database does not know (never adopted).
    #[serde(default)]
    pub orphans: Vec<Orphan>,
    /// Value of the `dev.gantry.engine` label on this engine's containers.
    pub engine_id: String,
    /// GPUs the lab config keeps for interactive use (never scheduled on).
    #[serde(default)]
    pub reserved_gpus: Vec<u32>,
    /// The lab config the engine read (`None`: built-in defaults).
    #[serde(default)]
    pub config_file: Option<PathBuf>,
    /// The machine's engine (`gantry daemon --system`), for every user.
    #[serde(default)]
    pub system: bool,
    /// The image `gantry notebook` uses without `--image` (`[sessions] notebook_image`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional = nullable)]
    pub notebook_image: Option<String>,
}

/// A container labelled for this engine that its database does not know (e.g. after a lost WAL).
/// Reported, never adopted under a new job; its GPUs count as busy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, TS)]
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
    /// Docker's disk is below the lab's free-space minimum: no new job starts.
    #[serde(default)]
    pub disk_problem: Option<String>,
    /// Whether jobs' writable layers are bounded, and why not.
    #[serde(default)]
    pub disk_note: Option<String>,
}

/// `GET /v1/whoami`: the caller, from the socket's peer credentials.
#[derive(Debug, Clone, Serialize, Deserialize, TS)]
pub struct WhoAmI {
    pub uid: u32,
    pub name: String,
}

/// A caller's drop folder, as `GET /v1/inbox` reports it.
#[derive(Debug, Clone, Serialize, Deserialize, TS)]
pub struct InboxInfo {
    /// The caller's drop folder.
    pub path: PathBuf,
    /// The engine watches it now.
    pub watched: bool,
    /// Why it is not watched, when it is not; while it is, what of it is only scanned and why
    /// (too many folders for the lab's bound, the kernel's watch limit).
    pub problem: Option<String>,
    /// The engine serves one drop folder per user (`gantry inbox init` sets one up); otherwise it
    /// has a single drop folder, its own.
    pub per_user: bool,
    /// Lab-wide templates: a file dropped into `<path>/<name>/` runs template `<name>`.
    pub lab_templates: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An engine from before the rename still reports its outage to a new client (and back).
    #[test]
    fn health_reads_the_old_docker_problem_name() {
        let h: Health =
            serde_json::from_str(r#"{"store_problem":null,"docker_problem":"Docker is away","orphans":[]}"#).unwrap();
        assert_eq!(h.backend_problem.as_deref(), Some("Docker is away"));
        let h: Health =
            serde_json::from_str(r#"{"store_problem":null,"backend_problem":"Slurm is not reachable","orphans":[]}"#)
                .unwrap();
        assert_eq!(h.backend_problem.as_deref(), Some("Slurm is not reachable"));
    }
}
