//! Runs attempts as Docker containers through bollard.
//!
//! Every container carries labels naming the engine, job and attempt, so a restarted engine can find
//! its containers again. Jobs run as the submitter's uid:gid with `no-new-privileges` and every
//! capability dropped.

use std::collections::HashMap;
use std::time::Duration;

use bollard::errors::Error as DockerError;
use bollard::models::{
    ContainerCreateBody, DeviceRequest, HostConfig, HostConfigLogConfig, Mount, MountType, ResourcesUlimits,
};
use bollard::query_parameters as qp;
use bollard::Docker;
use bytes::Bytes;
use futures_util::stream::BoxStream;
use futures_util::StreamExt;

use crate::access::ResolvedMount;
use crate::resources::ContainerSettings;
use crate::spec::ValidJob;

#[cfg(test)]
pub mod fake;
mod settle;
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
}

/// The image an `image: host` job starts from: empty folders and this machine's top-level links
/// (`/bin -> usr/bin` on a merged-/usr system), with the machine's system folders bind-mounted
/// read-only on it ([`HostRoot::binds`]). Made once per layout with `docker import`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRoot {
    /// `gantry-host-root:<hash of the layout>`.
    pub tag: String,
    /// Its only layer, a tar archive.
    pub tar: Vec<u8>,
    /// The machine's folders mounted read-only at the same path.
    pub binds: Vec<String>,
}

/// Empty folders of the host root (mount points, scratch space; `tmp` is sticky and writable by all).
/// `sbin` is the container's own: Docker puts its init at `/sbin/docker-init`, which it could not
/// create inside the machine's read-only `/sbin` (the machine's are in `/usr/sbin` on a merged-/usr
/// system, which Debian 12 and Ubuntu are).
const HOST_ROOT_DIRS: [(&str, u32); 13] = [
    ("sbin", 0o755),
    ("tmp", 0o1777),
    ("var", 0o755),
    ("var/tmp", 0o1777),
    ("home", 0o755),
    ("root", 0o700),
    ("proc", 0o555),
    ("sys", 0o555),
    ("dev", 0o755),
    ("run", 0o755),
    ("mnt", 0o755),
    ("media", 0o755),
    ("srv", 0o755),
];

/// What a top-level system folder is on this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopLevel {
    Dir,
    /// A symbolic link, and where it points (`usr/bin`).
    Link(String),
}

impl HostRoot {
    /// The host root of a machine whose top-level system folders are `layout` (name, what it is).
    pub fn of(layout: &[(&str, TopLevel)]) -> HostRoot {
        let mut tar = vec![];
        for (dir, mode) in HOST_ROOT_DIRS {
            tar.extend(tar_header(dir, b'5', mode, ""));
        }
        let mut binds = vec![];
        let mut described = String::new();
        for (name, what) in layout.iter().filter(|(n, _)| *n != "sbin") {
            match what {
                TopLevel::Dir => {
                    tar.extend(tar_header(name, b'5', 0o755, ""));
                    binds.push(format!("/{name}"));
                    described.push_str(&format!("{name}/;"));
                }
                TopLevel::Link(to) => {
                    tar.extend(tar_header(name, b'2', 0o777, to));
                    described.push_str(&format!("{name}->{to};"));
                }
            }
        }
        tar.extend([0u8; 1024]);
        // FNV-1a of the layout: another machine's (or a changed) layout is another image.
        let hash = described.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        HostRoot {
            tag: format!("gantry-host-root:{:012x}", hash >> 16),
            tar,
            binds,
        }
    }

    /// This machine's.
    pub fn of_this_machine() -> HostRoot {
        let mut layout = vec![];
        for name in crate::spec::HOST_SYSTEM_FOLDERS.map(|d| d.trim_start_matches('/')) {
            match std::fs::symlink_metadata(format!("/{name}")) {
                Ok(m) if m.file_type().is_symlink() => {
                    if let Ok(to) = std::fs::read_link(format!("/{name}")) {
                        layout.push((name, TopLevel::Link(to.to_string_lossy().into_owned())));
                    }
                }
                Ok(m) if m.is_dir() => layout.push((name, TopLevel::Dir)),
                _ => {}
            }
        }
        HostRoot::of(&layout)
    }
}

/// One ustar header (a directory or a symbolic link: no data follows), owned by root.
fn tar_header(name: &str, kind: u8, mode: u32, link: &str) -> [u8; 512] {
    let mut h = [0u8; 512];
    let name = if kind == b'5' {
        format!("{name}/")
    } else {
        name.to_string()
    };
    h[..name.len().min(100)].copy_from_slice(&name.as_bytes()[..name.len().min(100)]);
    let octal = |h: &mut [u8; 512], at: usize, width: usize, v: u64| {
        let s = format!("{v:0w$o}\0", w = width - 1);
        h[at..at + width].copy_from_slice(s.as_bytes());
    };
    octal(&mut h, 100, 8, u64::from(mode));
    octal(&mut h, 108, 8, 0);
    octal(&mut h, 116, 8, 0);
    octal(&mut h, 124, 12, 0);
    octal(&mut h, 136, 12, 0);
    h[156] = kind;
    h[157..157 + link.len().min(100)].copy_from_slice(&link.as_bytes()[..link.len().min(100)]);
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|b| u32::from(*b)).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    h
}

/// An interactive session's terminal, joined to its container's TTY ([`Executor::terminal`]).
pub struct Terminal {
    /// What the terminal shows from now on (raw bytes: the TTY merges stdout and stderr). Ends when
    /// the container does.
    pub output: BoxStream<'static, Result<Bytes, ExecError>>,
    /// Keys typed. Dropping it leaves the container running (its stdin stays open).
    pub input: std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
}

/// The argv of a session without a command: `shell` (the owner's login shell on this machine) as a
/// login shell where the image has it, else the image's `/bin/sh`.
pub fn session_argv(shell: Option<&str>) -> Vec<String> {
    let shell = shell
        .filter(|s| s.starts_with('/') && !s.ends_with("/nologin") && !s.ends_with("/false"))
        .unwrap_or("/bin/sh");
    vec![
        "/bin/sh".into(),
        "-c".into(),
        r#"if [ -x "$0" ]; then exec "$0" -l; fi; exec /bin/sh -l"#.into(),
        shell.into(),
    ]
}

/// The environment a job sees: the spec's own, then Gantry's (Gantry's wins).
pub fn job_env(l: &Launch) -> Vec<String> {
    let mut env: Vec<(String, String)> = l.job.spec.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    let mut set = |k: &str, v: String| {
        env.retain(|(ek, _)| ek != k);
        env.push((k.to_string(), v));
    };
    // A HOME the job can write (many tools cache there); one the spec sets itself is kept.
    if let Some(h) = l
        .container
        .home
        .as_ref()
        .filter(|_| !l.job.spec.env.contains_key("HOME"))
    {
        set("HOME", h.clone());
    }
    set("GANTRY_JOB_ID", l.job_id.to_string());
    set("GANTRY_ATTEMPT", l.attempt_n.to_string());
    // Attempts that ended by preemption (as Slurm's SLURM_RESTART_COUNT): resume from the checkpoint.
    set("GANTRY_RESTART_COUNT", l.restart_count.to_string());
    if l.preemptible {
        set("GANTRY_PREEMPTIBLE", "1".into());
    }
    set("GANTRY_GPU_UUIDS", l.gpu_uuids.join(","));
    for (k, v) in &l.results_env {
        // A script that logs to its own MLflow server keeps it.
        if k != "MLFLOW_TRACKING_URI" || !l.job.spec.env.contains_key(k) {
            set(k, v.clone());
        }
    }
    if l.gpu_uuids.is_empty() {
        // Images such as nvidia/cuda set NVIDIA_VISIBLE_DEVICES=all: make a CPU job see no GPU.
        set("NVIDIA_VISIBLE_DEVICES", "void".into());
        set("CUDA_VISIBLE_DEVICES", String::new());
    } else {
        set("NVIDIA_VISIBLE_DEVICES", l.gpu_uuids.join(","));
        set(
            "CUDA_VISIBLE_DEVICES",
            (0..l.gpu_uuids.len())
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(","),
        );
    }
    // Who the job runs as, by name (its passwd entry is in the container too), unless the spec says.
    if let Some(u) = l.container.user.as_ref() {
        for k in ["USER", "LOGNAME"] {
            if !l.job.spec.env.contains_key(k) {
                set(k, u.clone());
            }
        }
    }
    // Frameworks size their thread pools by the CPUs they see: tell them the job's share.
    if let Some(n) = l.container.threads {
        for k in ["OMP_NUM_THREADS", "MKL_NUM_THREADS"] {
            if !l.job.spec.env.contains_key(k) {
                set(k, n.to_string());
            }
        }
    }
    if let (Some(m), Some(total)) = (l.job.gpu_memory, l.gpu_total_memory) {
        let frac = (m as f64 / total as f64).clamp(0.01, 1.0);
        let f = format!("{frac:.3}");
        set("FLAGS_fraction_of_gpu_memory_to_use", f.clone());
        set("XLA_PYTHON_CLIENT_MEM_FRACTION", f);
        set("TF_FORCE_GPU_ALLOW_GROWTH", "true".into());
    }
    env.into_iter().map(|(k, v)| format!("{k}={v}")).collect()
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

/// The HostConfig part of [`ContainerSettings`]: CPU/RAM limits (no swap on top), pinned CPUs, shm,
/// ulimits, the process limit, IPC, HOME's tmpfs and Docker's own bounded log.
fn container_host_config(l: &Launch) -> HostConfig {
    let c = &l.container;
    let ulimit = |name: &str, v: Option<i64>| {
        v.map(|v| ResourcesUlimits {
            name: Some(name.into()),
            soft: Some(v),
            hard: Some(v),
        })
    };
    let ulimits: Vec<ResourcesUlimits> = [ulimit("memlock", c.memlock), ulimit("stack", c.stack)]
        .into_iter()
        .flatten()
        .collect();
    let tmpfs = c.home.as_ref().filter(|_| c.home_tmpfs).map(|h| {
        HashMap::from([(
            h.clone(),
            format!("rw,nosuid,nodev,mode=0700,uid={},gid={}", l.uid, l.gid),
        )])
    });
    let log_config = c.log_file_size.map(|size| HostConfigLogConfig {
        typ: Some("json-file".into()),
        config: Some(HashMap::from([
            ("max-size".to_string(), size.to_string()),
            ("max-file".to_string(), crate::defaults::DOCKER_LOG_FILES.to_string()),
        ])),
    });
    HostConfig {
        // With pinned CPUs the quota equals their number, so it never throttles the job.
        nano_cpus: c.nano_cpus,
        cpuset_cpus: c.cpuset.clone(),
        pids_limit: c.pids_limit,
        log_config,
        memory: c.memory,
        memory_swap: c.memory,
        shm_size: c.shm_size,
        ulimits: (!ulimits.is_empty()).then_some(ulimits),
        ipc_mode: Some(if c.ipc_host { "host" } else { "private" }.into()),
        tmpfs,
        storage_opt: c
            .layer_size
            .map(|b| HashMap::from([("size".to_string(), b.to_string())])),
        ..Default::default()
    }
}

/// Held by any engine on this machine while it makes a user's network and creates a container on
/// it, or looks whether one is unused and removes it: Docker (before API 1.44) lets two engines make
/// two networks of one name, and removes a network a created, not yet started, container is on. A
/// `flock` on one file every engine of the same kind opens (root's in `/run`, others' in `/tmp`; no
/// link followed, never written); whoever else holds it is waited for at most [`NETWORK_LOCK_WAIT`], then the engine goes on without (ids are deduplicated
/// and a vanished network retried anyway), so no user can stall the engine by holding it.
struct NetworkLock {
    _held: Option<std::fs::File>,
}

/// Where root's engines meet: `/run` is root's own (0755), so no other user can make or hold the
/// file there and delay a root engine's network changes.
const NETWORK_LOCK_ROOT: &str = "/run/gantry-networks.lock";
/// Where an engine that is not root (a user in the docker group running their own) meets others
/// like it: any user can create and hold this one, so it is only ever waited for a bounded time.
const NETWORK_LOCK_USER: &str = "/tmp/.gantry-networks.lock";
const NETWORK_LOCK_WAIT: Duration = Duration::from_secs(10);

/// The lock file for an engine running as `euid`.
fn network_lock_path(euid: u32) -> &'static str {
    if euid == 0 {
        NETWORK_LOCK_ROOT
    } else {
        NETWORK_LOCK_USER
    }
}

impl NetworkLock {
    async fn take() -> NetworkLock {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::OpenOptionsExt;
        let path = network_lock_path(nix::unistd::geteuid().as_raw());
        let Ok(f) = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
            .or_else(|_| {
                std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                    .open(path)
            })
        else {
            return NetworkLock { _held: None };
        };
        let began = std::time::Instant::now();
        loop {
            // SAFETY: flock on an fd this function owns.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return NetworkLock { _held: Some(f) };
            }
            if began.elapsed() > NETWORK_LOCK_WAIT {
                tracing::warn!(
                    "{path} stayed locked for {}s; going on without it",
                    NETWORK_LOCK_WAIT.as_secs()
                );
                return NetworkLock { _held: None };
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Files read from images, by image id and paths (images do not change; a few dozen are in use).
type ImageFiles = std::sync::Arc<std::sync::Mutex<HashMap<(String, Vec<String>), Vec<Option<Vec<u8>>>>>>;

#[derive(Clone)]
pub struct DockerExecutor {
    docker: Docker,
    /// Container id -> its GPUs (a container's configuration never changes): one inspect per container.
    inspected: std::sync::Arc<std::sync::Mutex<HashMap<String, Option<GpuSet>>>>,
    image_files: ImageFiles,
    /// Held while this engine makes or removes a user's network.
    networks: std::sync::Arc<tokio::sync::Mutex<()>>,
}

/// The first plain file in a tar stream (as Docker's archive API sends one path), skipping extended
/// headers; `None` for anything else (a link, a directory) or a broken archive.
fn first_plain_file(tar: &[u8]) -> Option<Vec<u8>> {
    let mut at = 0;
    for _ in 0..4 {
        let h = tar.get(at..at + 512)?;
        let size_field = std::str::from_utf8(&h[124..136])
            .ok()?
            .trim_matches(|c: char| c == '\0' || c == ' ');
        let size = usize::from_str_radix(size_field, 8).ok()?;
        let data = at + 512;
        match h[156] {
            b'0' | 0 => return tar.get(data..data + size).map(<[u8]>::to_vec),
            b'x' | b'g' => at = data + size.div_ceil(512) * 512,
            _ => return None,
        }
    }
    None
}

impl DockerExecutor {
    /// The GPUs a listed container holds: from Gantry's label, else from its configuration (inspected
    /// once per container; a container's configuration never changes).
    async fn gpus_of_listed(&self, c: &bollard::models::ContainerSummary) -> Option<GpuSet> {
        let id = c.id.clone()?;
        if let Some(u) = c.labels.as_ref().and_then(|l| l.get(LABEL_GPU_UUIDS)) {
            return (!u.is_empty()).then(|| GpuSet::Ids(u.split(',').map(String::from).collect()));
        }
        if let Some(g) = self.inspected.lock().unwrap().get(&id).cloned() {
            return g;
        }
        let info = self
            .docker
            .inspect_container(&id, None::<qp::InspectContainerOptions>)
            .await
            .ok()?;
        let hc = info.host_config.unwrap_or_default();
        let env = info.config.and_then(|c| c.env).unwrap_or_default();
        let g = gpus_of(&hc.device_requests.unwrap_or_default(), hc.runtime.as_deref(), &env);
        self.inspected.lock().unwrap().insert(id, g.clone());
        g
    }

    /// The id of user `uid`'s network, made if missing (a bridge, labeled, with outbound access).
    /// Docker before API 1.44 lets two engines make two networks of one name at the same moment:
    /// every engine then uses the one with the smallest id and removes its own extra one.
    /// Called with `networks` held.
    async fn ensure_network(&self, uid: u32) -> Result<String, ExecError> {
        let name = user_network(uid);
        let find = || async {
            let filters = HashMap::from([("name".to_string(), vec![name.clone()])]);
            let list = self
                .docker
                .list_networks(Some(qp::ListNetworksOptions { filters: Some(filters) }))
                .await
                .map_err(classify)?;
            // `name` filters by substring: only the exact name counts.
            let mut ids: Vec<String> = list
                .into_iter()
                .filter(|n| n.name.as_deref() == Some(name.as_str()))
                .filter_map(|n| n.id)
                .collect();
            ids.sort();
            Ok::<_, ExecError>(ids)
        };
        let ids = find().await?;
        if let Some(id) = ids.first().cloned() {
            // Extra ones of the same name (two engines made it at once): removed while unused.
            for extra in &ids[1..] {
                let _ = self.docker.remove_network(extra).await;
            }
            return Ok(id);
        }
        let req = bollard::models::NetworkCreateRequest {
            name: name.clone(),
            driver: Some("bridge".into()),
            labels: Some(HashMap::from([(LABEL_NETWORK_UID.to_string(), uid.to_string())])),
            ..Default::default()
        };
        let mine = self.docker.create_network(req).await.map_err(classify)?.id;
        let ids = find().await?;
        let first = ids.first().cloned().unwrap_or_else(|| mine.clone());
        for extra in ids.iter().filter(|i| **i != first) {
            let _ = self.docker.remove_network(extra).await;
        }
        tracing::info!("made network {name} for uid {uid}'s jobs");
        Ok(first)
    }

    /// Remove a user's network (by name or id) once no container of any state is on it; Docker
    /// itself refuses while one is attached.
    async fn remove_network_if_unused(&self, network: &str) {
        let _one = self.networks.lock().await;
        let _all = NetworkLock::take().await;
        let Ok(info) = self
            .docker
            .inspect_network(network, None::<qp::InspectNetworkOptions>)
            .await
        else {
            return;
        };
        if !info.labels.as_ref().is_some_and(|l| l.contains_key(LABEL_NETWORK_UID)) {
            return;
        }
        let Some(id) = info.id else { return };
        // By name: Docker 20.10 lists a created, not yet started, container under its network's
        // name only (its NetworkID is filled in at start), so a filter by id missed another engine's
        // container between its create and its start and removed the network under it.
        let Some(name) = info.name else { return };
        let filters = HashMap::from([("network".to_string(), vec![name])]);
        let opts = qp::ListContainersOptions {
            all: true,
            filters: Some(filters),
            ..Default::default()
        };
        match self.docker.list_containers(Some(opts)).await {
            Ok(list) if list.is_empty() => {
                if let Err(e) = self.docker.remove_network(&id).await {
                    tracing::debug!("network {network} stays: {e}");
                }
            }
            _ => {}
        }
    }

    pub fn connect() -> Result<DockerExecutor, ExecError> {
        let docker = Docker::connect_with_local_defaults().map_err(|e| ExecError::DockerUnavailable(e.to_string()))?;
        Ok(DockerExecutor {
            docker,
            inspected: Default::default(),
            image_files: Default::default(),
            networks: Default::default(),
        })
    }
}

#[async_trait::async_trait]
impl Executor for DockerExecutor {
    async fn ping(&self) -> Result<(), ExecError> {
        self.docker.ping().await.map(|_| ()).map_err(unreachable_or_forbidden)
    }

    async fn has_image(&self, image: &str) -> Result<bool, ExecError> {
        match self.docker.inspect_image(image).await {
            Ok(_) => Ok(true),
            Err(DockerError::DockerResponseServerError { status_code: 404, .. }) => Ok(false),
            Err(e) => Err(classify(e)),
        }
    }

    async fn pull(&self, image: &str) -> Result<(), ExecError> {
        let opts = qp::CreateImageOptions {
            from_image: Some(image.to_string()),
            ..Default::default()
        };
        let mut stream = self.docker.create_image(Some(opts), None, None);
        while let Some(item) = stream.next().await {
            if let Err(e) = item {
                let detail = match e {
                    DockerError::DockerResponseServerError { message, .. } => message,
                    DockerError::DockerStreamError { error } => error,
                    other => other.to_string(),
                };
                return Err(ExecError::ImageUnavailable {
                    image: image.into(),
                    detail,
                });
            }
        }
        match self.has_image(image).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(ExecError::ImageUnavailable {
                image: image.into(),
                detail: "Docker finished the pull without the image".into(),
            }),
            Err(e) => Err(e),
        }
    }

    async fn create(&self, l: &Launch<'_>) -> Result<String, ExecError> {
        let labels = HashMap::from([
            (LABEL_ENGINE.to_string(), l.engine_id.to_string()),
            (LABEL_JOB.to_string(), l.job_id.to_string()),
            (LABEL_ATTEMPT.to_string(), l.attempt_id.to_string()),
            (LABEL_DB.to_string(), l.db_uid.to_string()),
            (
                LABEL_GPUS.to_string(),
                l.gpus.iter().map(|g| g.to_string()).collect::<Vec<_>>().join(","),
            ),
            (LABEL_GPU_UUIDS.to_string(), l.gpu_uuids.join(",")),
        ]);
        let mut labels = labels;
        labels.insert(LABEL_UID.to_string(), l.uid.to_string());
        if let Some(c) = &l.container.cpuset {
            labels.insert(LABEL_CPUS.to_string(), c.clone());
        }
        // `Mounts`, not `Binds`: Docker refuses a missing source instead of creating it as root. The source
        // is what the owner's check opened, pinned by a root engine under its state dir (`staging`), so no
        // swap after the check can redirect it; a non-root engine passes the resolved path (Docker 20.10's
        // runc cannot bind /proc/<pid>/fd/<n> itself).
        let mounts: Vec<Mount> = l
            .mounts
            .iter()
            .map(|m| Mount {
                typ: Some(MountType::BIND),
                source: Some(m.host.to_string_lossy().into_owned()),
                target: Some(m.container.clone()),
                read_only: Some(m.read_only),
                ..Default::default()
            })
            .collect();
        let groups: Vec<String> = l
            .groups
            .iter()
            .filter(|g| **g != l.gid)
            .map(|g| g.to_string())
            .collect();
        let device_requests = (l.binding == GpuBinding::Nvidia && !l.gpu_uuids.is_empty()).then(|| {
            vec![DeviceRequest {
                driver: Some("nvidia".into()),
                device_ids: Some(l.gpu_uuids.clone()),
                capabilities: Some(vec![vec!["gpu".into()]]),
                ..Default::default()
            }]
        });
        let tty = l.job.spec.interactive;
        let body = ContainerCreateBody {
            image: Some(l.image.clone().unwrap_or_else(|| l.job.spec.image.clone())),
            cmd: l
                .command
                .clone()
                .or_else(|| l.job.spec.command.as_ref().map(|c| c.argv())),
            // A session's shell gets a terminal, and its stdin stays open between attachments.
            tty: tty.then_some(true),
            open_stdin: tty.then_some(true),
            stdin_once: tty.then_some(false),
            env: Some(job_env(l)),
            working_dir: l.job.spec.workdir.clone(),
            user: Some(format!("{}:{}", l.uid, l.gid)),
            labels: Some(labels),
            host_config: Some(HostConfig {
                mounts: (!mounts.is_empty()).then_some(mounts),
                group_add: (!groups.is_empty()).then_some(groups),
                security_opt: Some(vec!["no-new-privileges".into()]),
                cap_drop: Some(vec!["ALL".into()]),
                init: Some(true),
                device_requests,
                ..container_host_config(l)
            }),
            ..Default::default()
        };
        let opts = qp::CreateContainerOptions {
            name: Some(l.name.clone()),
            ..Default::default()
        };
        // On the owner's own network. This engine never removes it between ensure and create (the
        // lock); another engine may, when its last container goes (see `remove`): then once more.
        let mut body = body;
        // Two engines making it at the same moment leave two of that name for a moment (Docker then
        // calls the name ambiguous): the extra one goes (see `ensure_network`), so try again shortly.
        let _one = self.networks.lock().await;
        let _all = NetworkLock::take().await;
        let mut tries = 0;
        loop {
            tries += 1;
            let net = self.ensure_network(l.uid).await?;
            body.host_config.as_mut().unwrap().network_mode = Some(net);
            match self.docker.create_container(Some(opts.clone()), body.clone()).await {
                Ok(c) => return Ok(c.id),
                Err(DockerError::DockerResponseServerError { status_code, message })
                    if (status_code == 404 || message.contains("ambiguous")) && message.contains("network") =>
                {
                    if tries >= 20 {
                        return Err(ExecError::NetworkGone(message));
                    }
                    tracing::debug!("network of uid {} changed before create ({message}); again", l.uid);
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(e) => return Err(classify(e)),
            }
        }
    }

    async fn storage(&self) -> Result<Option<Storage>, ExecError> {
        let info = self.docker.info().await.map_err(unreachable_or_forbidden)?;
        let backing = info
            .driver_status
            .unwrap_or_default()
            .into_iter()
            .find(|kv| kv.first().is_some_and(|k| k == "Backing Filesystem"))
            .and_then(|kv| kv.get(1).cloned());
        Ok(Some(Storage {
            root_dir: info.docker_root_dir.unwrap_or_else(|| "/var/lib/docker".into()),
            driver: info.driver.unwrap_or_default(),
            backing,
        }))
    }

    async fn writers(&self) -> Result<Vec<crate::policy::Writer>, ExecError> {
        let filters = HashMap::from([("label".to_string(), vec![LABEL_JOB.to_string()])]);
        let opts = qp::ListContainersOptions {
            all: true,
            size: true,
            filters: Some(filters),
            ..Default::default()
        };
        let list = self.docker.list_containers(Some(opts)).await.map_err(classify)?;
        Ok(list
            .into_iter()
            .map(|c| {
                let labels = c.labels.unwrap_or_default();
                let uid = labels.get(LABEL_UID).and_then(|u| u.parse::<u32>().ok());
                let owner = match uid {
                    Some(u) => nix::unistd::User::from_uid(u.into())
                        .ok()
                        .flatten()
                        .map(|p| p.name)
                        .unwrap_or_else(|| format!("uid {u}")),
                    None => "owner unknown".into(),
                };
                crate::policy::Writer {
                    job_id: labels.get(LABEL_JOB).and_then(|j| j.parse().ok()),
                    owner,
                    size_rw: c.size_rw.unwrap_or(0).max(0) as u64,
                }
            })
            .collect())
    }

    async fn pinned_cpus(&self) -> Result<Vec<u32>, ExecError> {
        let filters = HashMap::from([
            ("label".to_string(), vec![LABEL_CPUS.to_string()]),
            (
                "status".to_string(),
                vec![
                    "created".to_string(),
                    "running".to_string(),
                    "restarting".to_string(),
                    "paused".to_string(),
                ],
            ),
        ]);
        let opts = qp::ListContainersOptions {
            all: true,
            filters: Some(filters),
            ..Default::default()
        };
        let list = self.docker.list_containers(Some(opts)).await.map_err(classify)?;
        Ok(list
            .iter()
            .filter_map(|c| c.labels.as_ref()?.get(LABEL_CPUS))
            .flat_map(|l| crate::resources::parse_cpu_list(l))
            .collect())
    }

    async fn image_files(&self, image: &str, paths: &[&str], max: usize) -> Result<Vec<Option<Vec<u8>>>, ExecError> {
        let id = self
            .docker
            .inspect_image(image)
            .await
            .map_err(classify)?
            .id
            .unwrap_or_else(|| image.to_string());
        let key = (id, paths.iter().map(|p| p.to_string()).collect::<Vec<_>>());
        if let Some(hit) = self.image_files.lock().unwrap().get(&key) {
            return Ok(hit.clone());
        }
        let body = ContainerCreateBody {
            image: Some(image.to_string()),
            cmd: Some(vec!["true".into()]),
            network_disabled: Some(true),
            labels: Some(HashMap::from([(LABEL_PROBE.to_string(), "1".to_string())])),
            ..Default::default()
        };
        let probe = self
            .docker
            .create_container(None::<qp::CreateContainerOptions>, body)
            .await
            .map_err(classify)?
            .id;
        let mut out = vec![];
        for p in paths {
            let mut s = self
                .docker
                .download_from_container(&probe, Some(qp::DownloadFromContainerOptions { path: p.to_string() }));
            let mut tar = vec![];
            let mut ok = true;
            while let Some(chunk) = s.next().await {
                match chunk {
                    Ok(c) if tar.len() + c.len() <= max + 4096 => tar.extend_from_slice(&c),
                    _ => {
                        ok = false;
                        break;
                    }
                }
            }
            out.push(ok.then(|| first_plain_file(&tar)).flatten().filter(|f| f.len() <= max));
        }
        let opts = qp::RemoveContainerOptions {
            force: true,
            v: true,
            ..Default::default()
        };
        if let Err(e) = self.docker.remove_container(&probe, Some(opts)).await {
            tracing::warn!("could not remove the container {probe} made to read {image}'s files: {e}");
        }
        let mut cache = self.image_files.lock().unwrap();
        if cache.len() >= 64 {
            cache.clear();
        }
        cache.insert(key, out.clone());
        Ok(out)
    }

    async fn start(&self, id: &str) -> Result<(), ExecError> {
        match self.docker.start_container(id, None::<qp::StartContainerOptions>).await {
            // Another engine removed the user's network between our create and start (its last
            // container went at that moment): the next try makes it again.
            Err(DockerError::DockerResponseServerError { status_code, message })
                if message.contains("network") && (status_code == 404 || message.contains("ambiguous")) =>
            {
                Err(ExecError::NetworkGone(message))
            }
            r => r.map_err(classify),
        }
    }

    async fn wait(&self, id: &str) -> Result<Exit, ExecError> {
        let mut s = self.docker.wait_container(id, None::<qp::WaitContainerOptions>);
        match s.next().await {
            Some(Ok(_)) | Some(Err(DockerError::DockerContainerWaitError { .. })) | None => {}
            Some(Err(e)) => return Err(classify(e)),
        }
        self.exit_of(id)
            .await?
            .ok_or_else(|| ExecError::Rejected(format!("container {id} still running after wait")))
    }

    async fn exit_of(&self, id: &str) -> Result<Option<Exit>, ExecError> {
        let info = self
            .docker
            .inspect_container(id, None::<qp::InspectContainerOptions>)
            .await
            .map_err(classify)?;
        let st = info.state.unwrap_or_default();
        if st.running.unwrap_or(false) {
            return Ok(None);
        }
        Ok(Some(Exit {
            code: st.exit_code.unwrap_or(-1),
            oom_killed: st.oom_killed.unwrap_or(false),
        }))
    }

    async fn stop(&self, id: &str, grace: Duration) -> Result<(), ExecError> {
        let opts = qp::StopContainerOptions {
            t: Some(grace.as_secs() as i32),
            signal: None,
        };
        match self.docker.stop_container(id, Some(opts)).await {
            Ok(()) | Err(DockerError::DockerResponseServerError { status_code: 304, .. }) => Ok(()),
            Err(e) => Err(classify(e)),
        }
    }

    async fn stop_signal(&self, id: &str, signal: &str, grace: Duration) -> Result<(), ExecError> {
        // The signal is sent with `kill`, not as `stop`'s `signal`: Docker before API 1.42 (Debian 12's
        // 20.10 speaks 1.41) ignores that parameter and sends SIGTERM, which kills a job that saves
        // its checkpoint on SIGUSR1. Then the grace, then `stop` (SIGTERM, SIGKILL a second later).
        match self
            .docker
            .kill_container(
                id,
                Some(qp::KillContainerOptions {
                    signal: signal.to_string(),
                }),
            )
            .await
        {
            Ok(()) => {}
            // Not running (any more): nothing to stop.
            Err(DockerError::DockerResponseServerError {
                status_code: 304 | 409, ..
            }) => return Ok(()),
            Err(e) => return Err(classify(e)),
        }
        let mut exited = self.docker.wait_container(id, None::<qp::WaitContainerOptions>);
        if tokio::time::timeout(grace, exited.next()).await.is_ok() {
            return Ok(());
        }
        self.stop(id, Duration::from_secs(1)).await
    }

    async fn remove(&self, id: &str) -> Result<(), ExecError> {
        // Its user's network goes with the user's last container (bridge networks come from a small
        // address pool: about 30 on Docker's defaults).
        let network = match self
            .docker
            .inspect_container(id, None::<qp::InspectContainerOptions>)
            .await
        {
            Ok(c) => c
                .host_config
                .and_then(|h| h.network_mode)
                .filter(|n| n.starts_with("gantry-u") || n.len() == 64),
            Err(_) => None,
        };
        let opts = qp::RemoveContainerOptions {
            force: true,
            v: true,
            ..Default::default()
        };
        match self.docker.remove_container(id, Some(opts)).await {
            Ok(()) | Err(DockerError::DockerResponseServerError { status_code: 404, .. }) => {}
            Err(e) => return Err(classify(e)),
        }
        if let Some(n) = network {
            self.remove_network_if_unused(&n).await;
        }
        Ok(())
    }

    async fn list_ours(&self, engine_id: &str) -> Result<Vec<Found>, ExecError> {
        let filters = HashMap::from([("label".to_string(), vec![format!("{LABEL_ENGINE}={engine_id}")])]);
        let opts = qp::ListContainersOptions {
            all: true,
            filters: Some(filters),
            ..Default::default()
        };
        let list = self.docker.list_containers(Some(opts)).await.map_err(classify)?;
        Ok(list
            .into_iter()
            .filter_map(|c| {
                let labels = c.labels.unwrap_or_default();
                let state = c.state.map(|s| s.to_string()).unwrap_or_default();
                Some(Found {
                    container_id: c.id?,
                    name: c
                        .names
                        .unwrap_or_default()
                        .first()
                        .map(|n| n.trim_start_matches('/').to_string())
                        .unwrap_or_default(),
                    job_id: labels.get(LABEL_JOB)?.parse().ok()?,
                    attempt_id: labels.get(LABEL_ATTEMPT)?.parse().ok()?,
                    db_uid: labels.get(LABEL_DB).cloned(),
                    gpus: labels
                        .get(LABEL_GPUS)
                        .map(|g| g.split(',').filter_map(|x| x.parse().ok()).collect())
                        .unwrap_or_default(),
                    life: match state.as_str() {
                        "running" | "restarting" | "paused" => Life::Running,
                        "created" => Life::Unsettled,
                        _ => Life::Exited,
                    },
                })
            })
            .collect())
    }

    async fn settle(&self, id: &str) -> Result<Option<Settled>, ExecError> {
        settle::settle(self, id).await
    }

    async fn foreign_gpu_users(&self, engine_id: &str) -> Result<Vec<ForeignGpuUse>, ExecError> {
        let list = self
            .docker
            .list_containers(Some(qp::ListContainersOptions {
                all: false,
                ..Default::default()
            }))
            .await
            .map_err(classify)?;
        let mut out = vec![];
        let mut seen = vec![];
        for c in list {
            let Some(id) = c.id.clone() else { continue };
            if c.labels
                .as_ref()
                .and_then(|l| l.get(LABEL_ENGINE))
                .is_some_and(|e| e == engine_id)
            {
                continue;
            }
            seen.push(id.clone());
            if let Some(gpus) = self.gpus_of_listed(&c).await {
                out.push(ForeignGpuUse {
                    container_id: id,
                    name: listed_name(&c),
                    gpus,
                });
            }
        }
        self.inspected.lock().unwrap().retain(|k, _| seen.contains(k));
        Ok(out)
    }

    async fn gpu_taken(
        &self,
        id: &str,
        engine_id: &str,
        gpus: &[(Option<u32>, String)],
    ) -> Result<Option<String>, ExecError> {
        if gpus.is_empty() {
            return Ok(None);
        }
        let began = std::time::Instant::now();
        loop {
            let filters = HashMap::from([(
                "status".to_string(),
                vec!["created".to_string(), "running".to_string(), "restarting".to_string()],
            )]);
            let opts = qp::ListContainersOptions {
                all: true,
                filters: Some(filters),
                ..Default::default()
            };
            let list = self.docker.list_containers(Some(opts)).await.map_err(classify)?;
            let now_s = now_ns() / 1_000_000_000;
            let mut later: Option<String> = None;
            for c in list {
                let Some(cid) = c.id.clone() else { continue };
                if cid == id
                    || c.labels
                        .as_ref()
                        .and_then(|l| l.get(LABEL_ENGINE))
                        .is_some_and(|e| e == engine_id)
                {
                    continue;
                }
                let Some(theirs) = self.gpus_of_listed(&c).await else {
                    continue;
                };
                if !gpus.iter().any(|(i, u)| theirs.holds_claim(*i, u)) {
                    continue;
                }
                let created_only = c
                    .state
                    .as_ref()
                    .is_some_and(|s| matches!(s, bollard::models::ContainerSummaryStateEnum::CREATED));
                if !created_only {
                    return Ok(Some(listed_name(&c))); // it runs: it was first
                }
                if now_s - c.created.unwrap_or(0) as i128 > CLAIM_WINDOW.as_secs() as i128 {
                    continue; // created long ago and never started: not a placement in flight
                }
                // Both only created. Whichever engine checks second sees the other's container (each
                // checks after its own create), so a fixed order between the two ids decides: the
                // larger id gives way; the smaller waits until the larger is gone (it gave way) or runs
                // (it never saw ours).
                if cid.as_str() < id {
                    return Ok(Some(listed_name(&c)));
                }
                later = Some(listed_name(&c));
            }
            match later {
                None => return Ok(None),
                Some(name) if began.elapsed() > CLAIM_WAIT => return Ok(Some(name)),
                Some(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    fn logs(&self, id: &str, since_s: i64, follow: bool) -> BoxStream<'static, Result<Frame, ExecError>> {
        let opts = qp::LogsOptions {
            follow,
            stdout: true,
            stderr: true,
            timestamps: true,
            since: since_s as i32,
            ..Default::default()
        };
        self.docker
            .logs(id, Some(opts))
            .map(|r| r.map(Frame::of).map_err(classify))
            .boxed()
    }

    async fn terminal(&self, id: &str) -> Result<Terminal, ExecError> {
        // Docker's own detach keys stay its default (Ctrl-P Ctrl-Q), the ones the CLI detaches on itself.
        let opts = qp::AttachContainerOptions {
            stream: true,
            stdin: true,
            stdout: true,
            stderr: true,
            ..Default::default()
        };
        let a = self.docker.attach_container(id, Some(opts)).await.map_err(classify)?;
        Ok(Terminal {
            output: a.output.map(|o| o.map(|o| Frame::of(o).data).map_err(classify)).boxed(),
            input: a.input,
        })
    }

    async fn ensure_host_root(&self, root: &HostRoot) -> Result<String, ExecError> {
        match self.docker.inspect_image(&root.tag).await {
            Ok(_) => return Ok(root.tag.clone()),
            Err(DockerError::DockerResponseServerError { status_code: 404, .. }) => {}
            Err(e) => return Err(classify(e)),
        }
        let (repo, tag) = root.tag.split_once(':').unwrap_or((&root.tag, "latest"));
        let opts = qp::CreateImageOptions {
            from_src: Some("-".into()),
            repo: Some(repo.into()),
            tag: Some(tag.into()),
            ..Default::default()
        };
        let mut stream = self.docker.create_image(
            Some(opts),
            Some(bollard::body_full(Bytes::from(root.tar.clone()))),
            None,
        );
        while let Some(item) = stream.next().await {
            item.map_err(|e| ExecError::ImageUnavailable {
                image: root.tag.clone(),
                detail: e.to_string(),
            })?;
        }
        tracing::info!("made {}, the root of jobs in this machine's own folders", root.tag);
        Ok(root.tag.clone())
    }

    async fn connect_port(&self, id: &str, port: u16) -> Result<tokio::net::TcpStream, ExecError> {
        let info = self
            .docker
            .inspect_container(id, None::<qp::InspectContainerOptions>)
            .await
            .map_err(classify)?;
        let pid = info
            .state
            .as_ref()
            .and_then(|s| s.pid)
            .filter(|p| *p > 0)
            .ok_or_else(|| ExecError::Rejected(format!("container {id} is not running")))?;
        let inside = tokio::task::spawn_blocking(move || connect_in_netns(pid as u32, port))
            .await
            .map_err(|e| ExecError::Rejected(e.to_string()))?;
        let stream = match inside {
            Ok(s) => s,
            // Not root (a user's own engine): the container's address on its Docker network.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EPERM | libc::EACCES)) => {
                let ip = info
                    .network_settings
                    .and_then(|n| n.networks)
                    .and_then(|n| n.into_values().find_map(|v| v.ip_address.filter(|a| !a.is_empty())));
                let ip = ip.ok_or_else(|| {
                    ExecError::Rejected(format!("container {id} has no address to reach port {port} at"))
                })?;
                std::net::TcpStream::connect((ip.as_str(), port))
                    .map_err(|e| ExecError::Rejected(format!("port {port} of the job: {e}")))?
            }
            Err(e) => {
                return Err(ExecError::Rejected(format!(
                    "port {port} of the job: {e}; is its server listening on 127.0.0.1:{port} inside?"
                )))
            }
        };
        stream
            .set_nonblocking(true)
            .map_err(|e| ExecError::Rejected(e.to_string()))?;
        tokio::net::TcpStream::from_std(stream).map_err(|e| ExecError::Rejected(e.to_string()))
    }

    async fn resize(&self, id: &str, cols: u16, rows: u16) -> Result<(), ExecError> {
        let opts = qp::ResizeContainerTTYOptions {
            w: cols.max(1) as i32,
            h: rows.max(1) as i32,
        };
        self.docker.resize_container_tty(id, opts).await.map_err(classify)
    }

    async fn attach(&self, id: &str) -> BoxStream<'static, Result<Frame, ExecError>> {
        let opts = qp::AttachContainerOptions {
            stream: true,
            stdout: true,
            stderr: true,
            ..Default::default()
        };
        match self.docker.attach_container(id, Some(opts)).await {
            // The input half is kept with the output: dropping it could end the attachment.
            Ok(a) => {
                let input = a.input;
                a.output
                    .map(move |o| {
                        let _ = &input;
                        o.map(Frame::of).map_err(classify)
                    })
                    .boxed()
            }
            Err(e) => futures_util::stream::once(async move { Err(classify(e)) }).boxed(),
        }
    }
}

/// Connect to 127.0.0.1:`port` in the network namespace of process `pid`, from a thread made for
/// it (a thread's namespace is its own; the socket keeps the namespace it was made in, and the
/// thread ends there).
fn connect_in_netns(pid: u32, port: u16) -> std::io::Result<std::net::TcpStream> {
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/net"))?;
    std::thread::spawn(move || {
        nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).map_err(std::io::Error::from)?;
        std::net::TcpStream::connect_timeout(
            &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
            Duration::from_secs(10),
        )
    })
    .join()
    .map_err(|_| std::io::Error::other("the connecting thread panicked"))?
}

fn listed_name(c: &bollard::models::ContainerSummary) -> String {
    c.names
        .as_ref()
        .and_then(|n| n.first())
        .map(|n| n.trim_start_matches('/').to_string())
        .unwrap_or_default()
}

fn now_ns() -> i128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{validate_text, Format, Origin};

    fn launch(job: &ValidJob, uuids: &[&str]) -> Vec<String> {
        job_env(&Launch {
            preemptible: false,
            restart_count: 0,
            engine_id: "e",
            db_uid: "d",
            name: "gantry-d-j7-a1".into(),
            job_id: 7,
            attempt_id: 1,
            attempt_n: 1,
            job,
            uid: 1000,
            gid: 1000,
            groups: vec![],
            mounts: vec![],
            gpus: (0..uuids.len() as u32).collect(),
            gpu_uuids: uuids.iter().map(|s| s.to_string()).collect(),
            gpu_total_memory: Some(40 << 30),
            binding: GpuBinding::EnvOnly,
            container: ContainerSettings {
                home: Some("/home/u".into()),
                ..Default::default()
            },
            command: None,
            image: None,
            results_env: vec![("GANTRY_METRICS".into(), "/gantry/results/metrics-1.jsonl".into())],
        })
    }

    #[test]
    fn the_host_root_mirrors_the_machines_links_and_mounts_its_folders() {
        let merged = [
            ("usr", TopLevel::Dir),
            ("bin", TopLevel::Link("usr/bin".into())),
            ("lib", TopLevel::Link("usr/lib".into())),
            ("etc", TopLevel::Dir),
            ("opt", TopLevel::Dir),
        ];
        let r = HostRoot::of(&merged);
        assert_eq!(r.binds, ["/usr", "/etc", "/opt"]);
        assert!(r.tag.starts_with("gantry-host-root:"));
        let split = HostRoot::of(&[
            ("usr", TopLevel::Dir),
            ("bin", TopLevel::Dir),
            ("sbin", TopLevel::Dir),
            ("etc", TopLevel::Dir),
        ]);
        assert_eq!(
            split.binds,
            ["/usr", "/bin", "/etc"],
            "/sbin is the container's own (Docker's init is there)"
        );
        assert_ne!(r.tag, split.tag, "another layout, another image");
        assert_eq!(r.tag, HostRoot::of(&merged).tag);
        // Headers a tar reader takes: checksum, link, sticky /tmp.
        let h = &r.tar[512..1024];
        assert_eq!(&h[..4], b"tmp/");
        assert_eq!(&h[100..107], b"0001777");
        let sum: u32 = h
            .iter()
            .enumerate()
            .map(|(i, b)| if (148..156).contains(&i) { 32 } else { u32::from(*b) })
            .sum();
        assert_eq!(std::str::from_utf8(&h[148..154]).unwrap(), format!("{sum:06o}"));
        let link = r.tar.chunks(512).find(|c| c.starts_with(b"bin\0")).unwrap();
        assert_eq!((link[156], &link[157..164]), (b'2', &b"usr/bin"[..]));
        assert_eq!(r.tar.len() % 512, 0);
    }

    #[test]
    fn the_first_plain_file_of_a_tar_stream() {
        fn header(name: &str, typ: u8, size: usize) -> Vec<u8> {
            let mut h = vec![0u8; 512];
            h[..name.len()].copy_from_slice(name.as_bytes());
            h[124..135].copy_from_slice(format!("{size:011o}").as_bytes());
            h[156] = typ;
            h
        }
        let body = b"root:x:0:0::/root:/bin/sh\n";
        let mut tar = header("passwd", b'0', body.len());
        tar.extend_from_slice(body);
        tar.resize(1024 + 1024, 0);
        assert_eq!(first_plain_file(&tar).as_deref(), Some(&body[..]));
        let mut pax = header("PaxHeaders/passwd", b'x', 20);
        pax.extend_from_slice(&[b'p'; 20]);
        pax.resize(1024, 0);
        pax.extend_from_slice(&tar);
        assert_eq!(
            first_plain_file(&pax).as_deref(),
            Some(&body[..]),
            "an extended header first"
        );
        assert_eq!(
            first_plain_file(&header("passwd", b'2', 0)),
            None,
            "a symlink is not read"
        );
        assert_eq!(first_plain_file(&tar[..520]), None, "a cut archive");
    }

    #[test]
    fn gpus_held_by_foreign_containers() {
        let req = |ids: Option<Vec<&str>>, count: Option<i64>| DeviceRequest {
            driver: Some("nvidia".into()),
            device_ids: ids.map(|v| v.into_iter().map(String::from).collect()),
            count,
            capabilities: Some(vec![vec!["gpu".into()]]),
            ..Default::default()
        };
        let env = |v: &str| vec![format!("NVIDIA_VISIBLE_DEVICES={v}")];
        #[allow(clippy::type_complexity)] // a table test: one tuple per case reads as the table
        let rows: Vec<(Vec<DeviceRequest>, Option<&str>, Vec<String>, Option<GpuSet>)> = vec![
            (
                vec![req(Some(vec!["GPU-a", "GPU-b"]), None)],
                None,
                vec![],
                Some(GpuSet::Ids(vec!["GPU-a".into(), "GPU-b".into()])),
            ),
            (vec![req(None, Some(-1))], None, vec![], Some(GpuSet::All)),
            (vec![req(None, Some(2))], None, vec![], Some(GpuSet::All)),
            // A CUDA image's own `NVIDIA_VISIBLE_DEVICES=all` gives no GPU without the nvidia runtime.
            (vec![], Some("runc"), env("all"), None),
            (vec![], Some("nvidia"), env("all"), Some(GpuSet::All)),
            (
                vec![],
                Some("nvidia"),
                env("0,GPU-c"),
                Some(GpuSet::Ids(vec!["0".into(), "GPU-c".into()])),
            ),
            (vec![], Some("nvidia"), env("void"), None),
            (vec![], None, vec![], None),
        ];
        for (reqs, rt, e, want) in rows {
            assert_eq!(gpus_of(&reqs, rt, &e), want, "{reqs:?} {rt:?} {e:?}");
        }
        assert!(GpuSet::Ids(vec!["1".into()]).holds(1, "GPU-x") && GpuSet::Ids(vec!["GPU-x".into()]).holds(3, "GPU-x"));
        assert!(!GpuSet::Ids(vec!["GPU-y".into()]).holds(0, "GPU-x"));
    }

    #[test]
    fn env_binds_exactly_the_assigned_gpus() {
        let j = validate_text(
            "image: a\ngpus: 2\nenv: {CUDA_VISIBLE_DEVICES: '5', MY: x}\n",
            Format::Yaml,
            &Origin::default(),
        )
        .unwrap();
        let env = launch(&j, &["GPU-a", "GPU-b"]);
        assert!(env.contains(&"NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b".to_string()));
        assert!(
            env.contains(&"CUDA_VISIBLE_DEVICES=0,1".to_string()),
            "a spec must not override the GPU binding: {env:?}"
        );
        assert!(env.contains(&"GANTRY_JOB_ID=7".to_string()));
        assert!(env.contains(&"GANTRY_METRICS=/gantry/results/metrics-1.jsonl".to_string()));
        assert!(env.contains(&"MY=x".to_string()));
        assert!(!env.iter().any(|e| e.starts_with("XLA_")));
        assert!(env.contains(&"HOME=/home/u".to_string()), "{env:?}");
        let own = validate_text("image: a\nenv: {HOME: /w}\n", Format::Yaml, &Origin::default()).unwrap();
        assert!(
            launch(&own, &[]).contains(&"HOME=/w".to_string()),
            "a spec's HOME is kept"
        );
    }

    #[test]
    fn shared_gpu_gets_memory_hints_and_cpu_job_sees_none() {
        let j = validate_text("image: a\ngpu_memory: 10GiB\n", Format::Yaml, &Origin::default()).unwrap();
        let env = launch(&j, &["GPU-a"]);
        assert!(
            env.contains(&"FLAGS_fraction_of_gpu_memory_to_use=0.250".to_string()),
            "{env:?}"
        );
        assert!(env.contains(&"XLA_PYTHON_CLIENT_MEM_FRACTION=0.250".to_string()));
        assert!(env.contains(&"TF_FORCE_GPU_ALLOW_GROWTH=true".to_string()));
        let cpu = validate_text("image: a\ngpus: 0\n", Format::Yaml, &Origin::default()).unwrap();
        let env = launch(&cpu, &[]);
        assert!(env.contains(&"NVIDIA_VISIBLE_DEVICES=void".to_string()));
    }
}
