//! Runs attempts as Docker containers through bollard.
//!
//! Every container carries labels naming the engine, job and attempt, so a restarted engine can find
//! its containers again. Jobs run as the submitter's uid:gid with `no-new-privileges` and every
//! capability dropped.
//!
//! This module owns the seam: the [`Executor`] trait, what an attempt's container is given
//! ([`Launch`]), the labels and what comes back ([`Found`], [`Exit`], [`Frame`]). The Docker
//! implementation is `docker` (with its users' networks in `network` and the settling of a start in
//! `settle`), the container's environment and HostConfig are `container`, the `image: host` root is
//! `host_root`; `fake` is the in-memory executor of unit tests.

use std::time::Duration;

use bollard::errors::Error as DockerError;
use bollard::models::DeviceRequest;
use bytes::Bytes;
use futures_util::stream::BoxStream;
use futures_util::StreamExt;

use crate::access::ResolvedMount;
use crate::resources::ContainerSettings;
use crate::spec::ValidJob;

mod container;
mod docker;
#[cfg(test)]
pub mod fake;
mod host_root;
mod network;
mod settle;
#[cfg(test)]
mod tests;

use container::container_host_config;
pub use container::{job_env, session_argv};
pub use docker::DockerExecutor;
pub use host_root::{HostRoot, TopLevel};
use network::NetworkLock;
pub use settle::Settled;

pub const LABEL_ENGINE: &str = "dev.gantry.engine";
pub const LABEL_JOB: &str = "dev.gantry.job";
pub const LABEL_ATTEMPT: &str = "dev.gantry.attempt";
/// The database's unique id: a container from a lost or replaced database is never taken for a new job's.
pub const LABEL_DB: &str = "dev.gantry.db";
/// GPU indexes the container holds, so an orphan's GPUs still count as busy.
pub const LABEL_GPUS: &str = "dev.gantry.gpus";
/// GPU UUIDs the container holds: machine-wide names, so other engines treat them as busy.
pub const LABEL_GPU_UUIDS: &str = "dev.gantry.gpu-uuids";
/// The CPUs the container is pinned to (a cpulist), so every engine on the machine pins around them.
pub const LABEL_CPUS: &str = "dev.gantry.cpus";
/// A container made only to read an image's files, never started.
pub const LABEL_PROBE: &str = "dev.gantry.probe";
/// The job owner's uid, so the top writers of Docker's disk are named by user.
pub const LABEL_UID: &str = "dev.gantry.uid";
/// A user's own bridge network (its value: the uid), made by any engine on demand.
pub const LABEL_NETWORK_UID: &str = "dev.gantry.network-uid";

/// The Docker network a user's jobs share: one per user on the machine, so one user's job cannot
/// connect to another user's ports (Docker isolates bridge networks from each other) while the same
/// user's jobs reach each other and every job keeps outbound access.
pub fn user_network(uid: u32) -> String {
    format!("gantry-u{uid}")
}

/// How long a placement waits for another engine's simultaneous placement to give way before giving
/// way itself: removing a container takes well under a second.
pub const CLAIM_WAIT: Duration = Duration::from_secs(10);

/// A foreign container created but not started counts as placing on its GPUs for this long: longer than
/// any create→start gap (the image is present before create), short enough that a container someone
/// created and never started does not block a GPU for good.
pub const CLAIM_WINDOW: Duration = Duration::from_secs(60);

/// GPUs a container that is not this engine's holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuSet {
    All,
    /// UUIDs (`GPU-…`) or indexes as Docker and the NVIDIA runtime accept them.
    Ids(Vec<String>),
}

impl GpuSet {
    pub fn holds(&self, index: u32, uuid: &str) -> bool {
        match self {
            GpuSet::All => true,
            GpuSet::Ids(ids) => ids.iter().any(|i| i == uuid || *i == index.to_string()),
        }
    }

    /// [`GpuSet::holds`] for a GPU known by its UUID alone (`index` `None`: a simulated GPU, which no
    /// index or `--gpus all` of the real machine names).
    pub fn holds_claim(&self, index: Option<u32>, uuid: &str) -> bool {
        match index {
            Some(index) => self.holds(index, uuid),
            None => matches!(self, GpuSet::Ids(ids) if ids.iter().any(|i| i == uuid)),
        }
    }
}

/// A running container outside this engine that holds GPUs (another Gantry engine's job, or anyone's
/// `docker run --gpus`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignGpuUse {
    pub container_id: String,
    pub name: String,
    pub gpus: GpuSet,
}

/// What GPUs a container's configuration gives it: a GPU DeviceRequest, or NVIDIA_VISIBLE_DEVICES under
/// the nvidia runtime (the variable alone does nothing elsewhere; CUDA images set it to `all`).
pub fn gpus_of(device_requests: &[DeviceRequest], runtime: Option<&str>, env: &[String]) -> Option<GpuSet> {
    for r in device_requests {
        let gpu =
            r.driver.as_deref() == Some("nvidia") || r.capabilities.iter().flatten().flatten().any(|c| c == "gpu");
        if !gpu {
            continue;
        }
        return Some(match r.device_ids.as_deref() {
            Some(ids) if !ids.is_empty() => GpuSet::Ids(ids.to_vec()),
            _ => GpuSet::All, // `--gpus N` or `all`: which ones is the runtime's choice, so all count
        });
    }
    if runtime == Some("nvidia") {
        let v = env.iter().find_map(|e| e.strip_prefix("NVIDIA_VISIBLE_DEVICES="))?;
        return match v.trim() {
            "" | "void" | "none" => None,
            "all" => Some(GpuSet::All),
            ids => Some(GpuSet::Ids(ids.split(',').map(|s| s.trim().to_string()).collect())),
        };
    }
    None
}

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("the Docker engine is not reachable ({0}); start it (e.g. `sudo systemctl start docker`) — queued jobs wait until it is back")]
    DockerUnavailable(String),
    #[error("you cannot use Docker (permission denied on {0}): ask an admin to install the Gantry service, or add you to the docker group — queued jobs wait meanwhile")]
    DockerForbidden(String),
    #[error("image {image:?} is not on this machine and could not be pulled: {detail}. Build or load it locally (`docker build`, `docker load`, `docker import`) or fix the name")]
    ImageUnavailable { image: String, detail: String },
    #[error("Docker refused the container: {0}")]
    Rejected(String),
    #[error("no such container {0}")]
    NotFound(String),
    /// Another engine (or someone's `docker run --gpus`) placed on the same GPU at the same moment.
    #[error("{0}")]
    GpuTaken(String),
    /// The image was removed between its pull and the job's start.
    #[error("image {0:?} is no longer on this machine; it is pulled again before the job is placed")]
    ImageGone(String),
    /// The owner's network was removed by another engine between create and start.
    #[error("the job's network went away before it started ({0}); trying again shortly")]
    NetworkGone(String),
}

impl ExecError {
    /// Errors that say nothing about the job itself: retry later without using up the job's retries.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            ExecError::DockerUnavailable(_)
                | ExecError::DockerForbidden(_)
                | ExecError::GpuTaken(_)
                | ExecError::NetworkGone(_)
                | ExecError::ImageGone(_)
        )
    }
}

/// "Permission denied" on the socket is not an outage: say who can fix it.
fn unreachable_or_forbidden(e: DockerError) -> ExecError {
    // The io error sits deep in hyper's chain; its Debug form names it.
    let detail = format!("{e:?}");
    if detail.contains("PermissionDenied") || detail.contains("ermission denied") {
        let socket = std::env::var("DOCKER_HOST")
            .ok()
            .and_then(|h| h.strip_prefix("unix://").map(String::from))
            .unwrap_or_else(|| "/var/run/docker.sock".into());
        ExecError::DockerForbidden(socket)
    } else {
        ExecError::DockerUnavailable(e.to_string())
    }
}

fn classify(e: DockerError) -> ExecError {
    match e {
        DockerError::DockerResponseServerError {
            status_code: 404,
            message,
        } => ExecError::NotFound(message),
        DockerError::DockerResponseServerError { message, .. } => ExecError::Rejected(message),
        other => unreachable_or_forbidden(other),
    }
}

/// How GPUs reach the container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuBinding {
    /// NVIDIA container toolkit: a DeviceRequest with the GPU UUIDs.
    Nvidia,
    /// Simulated GPUs: only the environment the runtime would set.
    EnvOnly,
}

/// Everything needed to create one attempt's container.
#[derive(Debug, Clone)]
pub struct Launch<'a> {
    pub engine_id: &'a str,
    /// The database's unique id (label) and the container's name, unique across lost databases too.
    pub db_uid: &'a str,
    pub name: String,
    pub job_id: i64,
    pub attempt_id: i64,
    pub attempt_n: u32,
    pub job: &'a ValidJob,
    pub uid: u32,
    pub gid: u32,
    /// The owner's supplementary groups, so the job reads what the owner may read through a group.
    pub groups: Vec<u32>,
    /// The job's mounts as checked with the owner's permissions: staging paths pinning what the check
    /// opened (root engine), or the resolved host paths.
    pub mounts: Vec<ResolvedMount>,
    pub gpus: Vec<u32>,
    pub gpu_uuids: Vec<String>,
    /// Total memory of the assigned GPUs (first one), for memory-fraction hints when shared.
    pub gpu_total_memory: Option<u64>,
    pub binding: GpuBinding,
    /// CPU/RAM limits, shm, ulimits, IPC and HOME (`Default`: Docker's own).
    pub container: ContainerSettings,
    /// The argv when Gantry chooses it (an interactive session's login shell); `None`: the spec's
    /// command, or the image's CMD.
    pub command: Option<Vec<String>>,
    /// The image when Gantry chooses it (the host root of an `image: host` job); `None`: the spec's.
    pub image: Option<String>,
    /// The job may be preempted (`GANTRY_PREEMPTIBLE=1`).
    pub preemptible: bool,
    /// Its attempts that ended by preemption so far (`GANTRY_RESTART_COUNT`).
    pub restart_count: u32,
    /// Where its results go (`GANTRY_METRICS`; `MLFLOW_TRACKING_URI` unless its spec sets one).
    pub results_env: Vec<(String, String)>,
    /// A file (container path) a string command waits for before it runs, at most
    /// [`START_GATE_WAIT`](crate::defaults::START_GATE_WAIT): the engine makes it once the attempt's
    /// MLflow endpoint is bound, so the script's first connection finds it listening.
    pub start_gate: Option<String>,
}

/// The argv of the job's own command: a string's, behind its [`Launch::start_gate`] when it has one.
pub fn command_argv(c: &crate::spec::Command, gate: Option<&str>) -> Vec<String> {
    let mut argv = c.argv();
    if let (crate::spec::Command::Shell(_), Some(g)) = (c, gate) {
        let polls = crate::defaults::START_GATE_WAIT.as_millis() / 20;
        argv[2] = format!(
            "_gantry_wait=0; while [ ! -e {} ] && [ $_gantry_wait -lt {polls} ]; do sleep 0.02 2>/dev/null; _gantry_wait=$((_gantry_wait+1)); done; unset _gantry_wait; {}",
            crate::shell::word(g),
            argv[2]
        );
    }
    argv
}

/// An interactive session's terminal, joined to its container's TTY ([`Executor::terminal`]).
pub struct Terminal {
    /// What the terminal shows from now on (raw bytes: the TTY merges stdout and stderr). Ends when
    /// the container does.
    pub output: BoxStream<'static, Result<Bytes, ExecError>>,
    /// Keys typed. Dropping it leaves the container running (its stdin stays open).
    pub input: std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
}

/// Docker's storage, from `docker info`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Storage {
    pub root_dir: String,
    pub driver: String,
    /// "Backing Filesystem" of the driver's status (overlay2: `extfs`, `xfs`, ...).
    pub backing: Option<String>,
}

/// Where a found container is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Life {
    /// Listed as created. Docker's list says so until a start in flight has finished, so its job
    /// may already run: never decided on before [`Executor::settle`].
    Unsettled,
    /// Created, never started (settled).
    Created,
    Running,
    Exited,
}

/// A container of ours found at startup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub container_id: String,
    pub name: String,
    pub job_id: i64,
    pub attempt_id: i64,
    pub db_uid: Option<String>,
    pub gpus: Vec<u32>,
    pub life: Life,
}

/// How a container ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exit {
    pub code: i64,
    pub oom_killed: bool,
}

/// Runs attempts. Docker today (Slurm later); an in-memory fake drives the engine's logic in unit tests.
#[async_trait::async_trait]
pub trait Executor: Send + Sync + 'static {
    async fn ping(&self) -> Result<(), ExecError>;
    /// Is the image on this machine?
    async fn has_image(&self, image: &str) -> Result<bool, ExecError>;
    /// Pull the image. Dropping the future stops Gantry's pull (the request to Docker ends; Docker
    /// 20.10 itself may keep its connection to a registry that never answers).
    async fn pull(&self, image: &str) -> Result<(), ExecError>;
    /// Create (not start) the attempt's container; returns its id.
    async fn create(&self, l: &Launch<'_>) -> Result<String, ExecError>;
    async fn start(&self, id: &str) -> Result<(), ExecError>;
    /// Wait for the container to exit; its real exit code and OOM flag.
    async fn wait(&self, id: &str) -> Result<Exit, ExecError>;
    /// Exit status of a stopped container; `None` while it runs.
    async fn exit_of(&self, id: &str) -> Result<Option<Exit>, ExecError>;
    /// SIGTERM, then SIGKILL after `grace`.
    async fn stop(&self, id: &str, grace: Duration) -> Result<(), ExecError>;
    /// `signal` (a job's checkpoint signal, e.g. `SIGUSR1`), then SIGKILL after `grace` (preemption).
    async fn stop_signal(&self, id: &str, signal: &str, grace: Duration) -> Result<(), ExecError>;
    async fn remove(&self, id: &str) -> Result<(), ExecError>;
    /// Every container this engine created that still exists.
    async fn list_ours(&self, engine_id: &str) -> Result<Vec<Found>, ExecError>;
    /// Where a container listed as [`Life::Unsettled`] really is, once any start in flight has
    /// settled (see `executor/settle.rs`); `None` once it is gone.
    async fn settle(&self, id: &str) -> Result<Option<Settled>, ExecError>;
    /// Running containers that are not this engine's and hold GPUs.
    async fn foreign_gpu_users(&self, engine_id: &str) -> Result<Vec<ForeignGpuUse>, ExecError>;
    /// Called between creating container `id` for `gpus` (index, UUID) and starting it. Two engines on
    /// one machine can both see a GPU free and both create a container for it. Returns the name of a
    /// container that is not this engine's and runs on one of `gpus`, or that was created for one of
    /// them at the same moment and wins the tie (see the Docker implementation); the caller then
    /// removes its own and tries again later.
    async fn gpu_taken(
        &self,
        id: &str,
        engine_id: &str,
        gpus: &[(Option<u32>, String)],
    ) -> Result<Option<String>, ExecError>;
    /// Stored output from `since_s` (Unix seconds), one [`Frame`] per message of Docker's log: its RFC
    /// 3339 timestamp, a space, and a line with its `\n`, or without one where Docker cut a long line
    /// (every 16 KiB) or the output ended. With `follow`, until the container ends. The stream ends or
    /// errors when Docker goes away.
    fn logs(&self, id: &str, since_s: i64, follow: bool) -> BoxStream<'static, Result<Frame, ExecError>>;
    /// Docker's storage: where its root dir is and what stores the containers' layers. `None`: not
    /// known (a fake).
    async fn storage(&self) -> Result<Option<Storage>, ExecError> {
        Ok(None)
    }
    /// Gantry's containers (any engine's) with what their writable layers hold (Docker measures it:
    /// slow, call it only when the disk runs low).
    async fn writers(&self) -> Result<Vec<crate::policy::Writer>, ExecError> {
        Ok(vec![])
    }
    /// The CPUs Gantry's containers (of any engine) that are created or running are pinned to.
    async fn pinned_cpus(&self) -> Result<Vec<u32>, ExecError> {
        Ok(vec![])
    }
    /// Plain files of `image` (`/etc/passwd`, `/etc/group`), each `None` where the image has none, it
    /// is not a plain file, or it is over `max` bytes. Read from a container made for it and removed at
    /// once, never started (nothing of the image runs); cached per image id.
    async fn image_files(&self, _image: &str, paths: &[&str], _max: usize) -> Result<Vec<Option<Vec<u8>>>, ExecError> {
        Ok(vec![None; paths.len()])
    }
    /// Make sure the host root image exists (`docker import` of its tar when missing); its tag.
    async fn ensure_host_root(&self, root: &HostRoot) -> Result<String, ExecError> {
        Ok(root.tag.clone())
    }
    /// An interactive session's terminal (its container was created with a TTY and open stdin).
    async fn terminal(&self, id: &str) -> Result<Terminal, ExecError> {
        Err(ExecError::Rejected(format!(
            "container {id} has no terminal to attach to here"
        )))
    }
    /// Set the size of a session's terminal.
    async fn resize(&self, _id: &str, _cols: u16, _rows: u16) -> Result<(), ExecError> {
        Ok(())
    }
    /// A TCP connection to `port` on 127.0.0.1 inside the container's network namespace (or, where
    /// this process may not enter it, to the container's own address).
    async fn connect_port(&self, id: &str, port: u16) -> Result<tokio::net::TcpStream, ExecError> {
        Err(ExecError::Rejected(format!(
            "cannot reach port {port} of container {id} here"
        )))
    }
    /// A TCP listener on 127.0.0.1:`port` inside the running container's network namespace, made
    /// by a thread that enters it (the socket keeps that namespace): reachable by the container's
    /// processes alone.
    async fn listen_in(&self, id: &str, port: u16) -> Result<std::net::TcpListener, ExecError> {
        Err(ExecError::Rejected(format!(
            "cannot listen on port {port} inside container {id} here"
        )))
    }
    /// The container's environment as it was created (`KEY=VALUE`).
    async fn env_of(&self, _id: &str) -> Result<Vec<String>, ExecError> {
        Ok(vec![])
    }
    /// Output as it is written from now on, without timestamps (Docker's log holds a line without
    /// `\n` back until 16 KiB of it have come): only for showing a progress bar's current state.
    /// Connected when this returns, so attaching before `start` misses nothing the job writes.
    async fn attach(&self, _id: &str) -> BoxStream<'static, Result<Frame, ExecError>> {
        futures_util::stream::empty().boxed()
    }
}

/// A piece of a container's output: one message of Docker's log ([`Executor::logs`]), or what one
/// write carried ([`Executor::attach`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub stderr: bool,
    pub data: Bytes,
}

impl Frame {
    pub fn stdout(data: impl Into<Bytes>) -> Frame {
        Frame {
            stderr: false,
            data: data.into(),
        }
    }

    fn of(o: bollard::container::LogOutput) -> Frame {
        use bollard::container::LogOutput;
        match o {
            LogOutput::StdErr { message } => Frame {
                stderr: true,
                data: message,
            },
            LogOutput::StdOut { message } | LogOutput::Console { message } | LogOutput::StdIn { message } => Frame {
                stderr: false,
                data: message,
            },
        }
    }
}
