//! Runs attempts as Docker containers through bollard.
//!
//! Every container carries labels naming the engine, job and attempt, so a restarted engine can find
//! its containers again. Jobs run as the submitter's uid:gid with `no-new-privileges` and every
//! capability dropped.

use std::collections::HashMap;
use std::time::Duration;

use bollard::errors::Error as DockerError;
use bollard::models::{ContainerCreateBody, DeviceRequest, HostConfig, HostConfigLogConfig, Mount, MountType, ResourcesUlimits};
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
        let gpu = r.driver.as_deref() == Some("nvidia") || r.capabilities.iter().flatten().flatten().any(|c| c == "gpu");
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
}

impl ExecError {
    /// Errors that say nothing about the job itself: retry later without using up the job's retries.
    pub fn is_transient(&self) -> bool {
        matches!(self, ExecError::DockerUnavailable(_) | ExecError::DockerForbidden(_) | ExecError::GpuTaken(_))
    }
}

/// "Permission denied" on the socket is not an outage: say who can fix it.
fn unreachable_or_forbidden(e: DockerError) -> ExecError {
    // The io error sits deep in hyper's chain; its Debug form names it.
    let detail = format!("{e:?}");
    if detail.contains("PermissionDenied") || detail.contains("ermission denied") {
        let socket = std::env::var("DOCKER_HOST").ok().and_then(|h| h.strip_prefix("unix://").map(String::from)).unwrap_or_else(|| "/var/run/docker.sock".into());
        ExecError::DockerForbidden(socket)
    } else {
        ExecError::DockerUnavailable(e.to_string())
    }
}

fn classify(e: DockerError) -> ExecError {
    match e {
        DockerError::DockerResponseServerError { status_code: 404, message } => ExecError::NotFound(message),
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
    /// The job may be preempted (`GANTRY_PREEMPTIBLE=1`).
    pub preemptible: bool,
    /// Its attempts that ended by preemption so far (`GANTRY_RESTART_COUNT`).
    pub restart_count: u32,
}

/// The environment a job sees: the spec's own, then Gantry's (Gantry's wins).
pub fn job_env(l: &Launch) -> Vec<String> {
    let mut env: Vec<(String, String)> = l.job.spec.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    let mut set = |k: &str, v: String| {
        env.retain(|(ek, _)| ek != k);
        env.push((k.to_string(), v));
    };
    // A HOME the job can write (many tools cache there); one the spec sets itself is kept.
    if let Some(h) = l.container.home.as_ref().filter(|_| !l.job.spec.env.contains_key("HOME")) {
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
    if l.gpu_uuids.is_empty() {
        // Images such as nvidia/cuda set NVIDIA_VISIBLE_DEVICES=all: make a CPU job see no GPU.
        set("NVIDIA_VISIBLE_DEVICES", "void".into());
        set("CUDA_VISIBLE_DEVICES", String::new());
    } else {
        set("NVIDIA_VISIBLE_DEVICES", l.gpu_uuids.join(","));
        set("CUDA_VISIBLE_DEVICES", (0..l.gpu_uuids.len()).map(|i| i.to_string()).collect::<Vec<_>>().join(","));
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
    /// Make sure the image is present; try one pull if not.
    async fn ensure_image(&self, image: &str) -> Result<(), ExecError>;
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
    async fn gpu_taken(&self, id: &str, engine_id: &str, gpus: &[(u32, String)]) -> Result<Option<String>, ExecError>;
    /// Stored output from `since_s` (Unix seconds), one [`Frame`] per message of Docker's log: its RFC
    /// 3339 timestamp, a space, and a line with its `\n`, or without one where Docker cut a long line
    /// (every 16 KiB) or the output ended. With `follow`, until the container ends. The stream ends or
    /// errors when Docker goes away.
    fn logs(&self, id: &str, since_s: i64, follow: bool) -> BoxStream<'static, Result<Frame, ExecError>>;
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
    /// Output as it is written from now on, without timestamps (Docker's log holds a line without
    /// `\n` back until 16 KiB of it have come): only for showing a progress bar's current state.
    fn attach(&self, _id: &str) -> BoxStream<'static, Result<Frame, ExecError>> {
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
        Frame { stderr: false, data: data.into() }
    }

    fn of(o: bollard::container::LogOutput) -> Frame {
        use bollard::container::LogOutput;
        match o {
            LogOutput::StdErr { message } => Frame { stderr: true, data: message },
            LogOutput::StdOut { message } | LogOutput::Console { message } | LogOutput::StdIn { message } => Frame { stderr: false, data: message },
        }
    }
}

/// The HostConfig part of [`ContainerSettings`]: CPU/RAM limits (no swap on top), pinned CPUs, shm,
/// ulimits, the process limit, IPC, HOME's tmpfs and Docker's own bounded log.
fn container_host_config(l: &Launch) -> HostConfig {
    let c = &l.container;
    let ulimit = |name: &str, v: Option<i64>| v.map(|v| ResourcesUlimits { name: Some(name.into()), soft: Some(v), hard: Some(v) });
    let ulimits: Vec<ResourcesUlimits> = [ulimit("memlock", c.memlock), ulimit("stack", c.stack)].into_iter().flatten().collect();
    let tmpfs = c.home.as_ref().filter(|_| c.home_tmpfs).map(|h| HashMap::from([(h.clone(), format!("rw,nosuid,nodev,mode=0700,uid={},gid={}", l.uid, l.gid))]));
    let log_config = c.log_file_size.map(|size| HostConfigLogConfig {
        typ: Some("json-file".into()),
        config: Some(HashMap::from([("max-size".to_string(), size.to_string()), ("max-file".to_string(), crate::defaults::DOCKER_LOG_FILES.to_string())])),
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
        ..Default::default()
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
}

/// The first plain file in a tar stream (as Docker's archive API sends one path), skipping extended
/// headers; `None` for anything else (a link, a directory) or a broken archive.
fn first_plain_file(tar: &[u8]) -> Option<Vec<u8>> {
    let mut at = 0;
    for _ in 0..4 {
        let h = tar.get(at..at + 512)?;
        let size_field = std::str::from_utf8(&h[124..136]).ok()?.trim_matches(|c: char| c == '\0' || c == ' ');
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
        let info = self.docker.inspect_container(&id, None::<qp::InspectContainerOptions>).await.ok()?;
        let hc = info.host_config.unwrap_or_default();
        let env = info.config.and_then(|c| c.env).unwrap_or_default();
        let g = gpus_of(&hc.device_requests.unwrap_or_default(), hc.runtime.as_deref(), &env);
        self.inspected.lock().unwrap().insert(id, g.clone());
        g
    }

    pub fn connect() -> Result<DockerExecutor, ExecError> {
        let docker = Docker::connect_with_local_defaults().map_err(|e| ExecError::DockerUnavailable(e.to_string()))?;
        Ok(DockerExecutor { docker, inspected: Default::default(), image_files: Default::default() })
    }
}

#[async_trait::async_trait]
impl Executor for DockerExecutor {
    async fn ping(&self) -> Result<(), ExecError> {
        self.docker.ping().await.map(|_| ()).map_err(unreachable_or_forbidden)
    }

    async fn ensure_image(&self, image: &str) -> Result<(), ExecError> {
        match self.docker.inspect_image(image).await {
            Ok(_) => return Ok(()),
            Err(DockerError::DockerResponseServerError { status_code: 404, .. }) => {}
            Err(e) => return Err(classify(e)),
        }
        let opts = qp::CreateImageOptions { from_image: Some(image.to_string()), ..Default::default() };
        let mut stream = self.docker.create_image(Some(opts), None, None);
        while let Some(item) = stream.next().await {
            if let Err(e) = item {
                let detail = match e {
                    DockerError::DockerResponseServerError { message, .. } => message,
                    DockerError::DockerStreamError { error } => error,
                    other => other.to_string(),
                };
                return Err(ExecError::ImageUnavailable { image: image.into(), detail });
            }
        }
        match self.docker.inspect_image(image).await {
            Ok(_) => Ok(()),
            Err(e) => Err(ExecError::ImageUnavailable { image: image.into(), detail: e.to_string() }),
        }
    }

    async fn create(&self, l: &Launch<'_>) -> Result<String, ExecError> {
        let labels = HashMap::from([
            (LABEL_ENGINE.to_string(), l.engine_id.to_string()),
            (LABEL_JOB.to_string(), l.job_id.to_string()),
            (LABEL_ATTEMPT.to_string(), l.attempt_id.to_string()),
            (LABEL_DB.to_string(), l.db_uid.to_string()),
            (LABEL_GPUS.to_string(), l.gpus.iter().map(|g| g.to_string()).collect::<Vec<_>>().join(",")),
            (LABEL_GPU_UUIDS.to_string(), l.gpu_uuids.join(",")),
        ]);
        let mut labels = labels;
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
        let groups: Vec<String> = l.groups.iter().filter(|g| **g != l.gid).map(|g| g.to_string()).collect();
        let device_requests = (l.binding == GpuBinding::Nvidia && !l.gpu_uuids.is_empty()).then(|| {
            vec![DeviceRequest {
                driver: Some("nvidia".into()),
                device_ids: Some(l.gpu_uuids.clone()),
                capabilities: Some(vec![vec!["gpu".into()]]),
                ..Default::default()
            }]
        });
        let body = ContainerCreateBody {
            image: Some(l.job.spec.image.clone()),
            cmd: l.job.spec.command.as_ref().map(|c| c.argv()),
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
        let opts = qp::CreateContainerOptions { name: Some(l.name.clone()), ..Default::default() };
        Ok(self.docker.create_container(Some(opts), body).await.map_err(classify)?.id)
    }

    async fn pinned_cpus(&self) -> Result<Vec<u32>, ExecError> {
        let filters = HashMap::from([
            ("label".to_string(), vec![LABEL_CPUS.to_string()]),
            ("status".to_string(), vec!["created".to_string(), "running".to_string(), "restarting".to_string(), "paused".to_string()]),
        ]);
        let opts = qp::ListContainersOptions { all: true, filters: Some(filters), ..Default::default() };
        let list = self.docker.list_containers(Some(opts)).await.map_err(classify)?;
        Ok(list.iter().filter_map(|c| c.labels.as_ref()?.get(LABEL_CPUS)).flat_map(|l| crate::resources::parse_cpu_list(l)).collect())
    }

    async fn image_files(&self, image: &str, paths: &[&str], max: usize) -> Result<Vec<Option<Vec<u8>>>, ExecError> {
        let id = self.docker.inspect_image(image).await.map_err(classify)?.id.unwrap_or_else(|| image.to_string());
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
        let probe = self.docker.create_container(None::<qp::CreateContainerOptions>, body).await.map_err(classify)?.id;
        let mut out = vec![];
        for p in paths {
            let mut s = self.docker.download_from_container(&probe, Some(qp::DownloadFromContainerOptions { path: p.to_string() }));
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
        let opts = qp::RemoveContainerOptions { force: true, v: true, ..Default::default() };
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
        self.docker.start_container(id, None::<qp::StartContainerOptions>).await.map_err(classify)
    }

    async fn wait(&self, id: &str) -> Result<Exit, ExecError> {
        let mut s = self.docker.wait_container(id, None::<qp::WaitContainerOptions>);
        match s.next().await {
            Some(Ok(_)) | Some(Err(DockerError::DockerContainerWaitError { .. })) | None => {}
            Some(Err(e)) => return Err(classify(e)),
        }
        self.exit_of(id).await?.ok_or_else(|| ExecError::Rejected(format!("container {id} still running after wait")))
    }

    async fn exit_of(&self, id: &str) -> Result<Option<Exit>, ExecError> {
        let info = self.docker.inspect_container(id, None::<qp::InspectContainerOptions>).await.map_err(classify)?;
        let st = info.state.unwrap_or_default();
        if st.running.unwrap_or(false) {
            return Ok(None);
        }
        Ok(Some(Exit { code: st.exit_code.unwrap_or(-1), oom_killed: st.oom_killed.unwrap_or(false) }))
    }

    async fn stop(&self, id: &str, grace: Duration) -> Result<(), ExecError> {
        let opts = qp::StopContainerOptions { t: Some(grace.as_secs() as i32), signal: None };
        match self.docker.stop_container(id, Some(opts)).await {
            Ok(()) | Err(DockerError::DockerResponseServerError { status_code: 304, .. }) => Ok(()),
            Err(e) => Err(classify(e)),
        }
    }

    async fn stop_signal(&self, id: &str, signal: &str, grace: Duration) -> Result<(), ExecError> {
        let opts = qp::StopContainerOptions { t: Some(grace.as_secs().max(1) as i32), signal: Some(signal.to_string()) };
        match self.docker.stop_container(id, Some(opts)).await {
            Ok(()) | Err(DockerError::DockerResponseServerError { status_code: 304, .. }) => Ok(()),
            Err(e) => Err(classify(e)),
        }
    }

    async fn remove(&self, id: &str) -> Result<(), ExecError> {
        let opts = qp::RemoveContainerOptions { force: true, v: true, ..Default::default() };
        match self.docker.remove_container(id, Some(opts)).await {
            Ok(()) | Err(DockerError::DockerResponseServerError { status_code: 404, .. }) => Ok(()),
            Err(e) => Err(classify(e)),
        }
    }

    async fn list_ours(&self, engine_id: &str) -> Result<Vec<Found>, ExecError> {
        let filters = HashMap::from([("label".to_string(), vec![format!("{LABEL_ENGINE}={engine_id}")])]);
        let opts = qp::ListContainersOptions { all: true, filters: Some(filters), ..Default::default() };
        let list = self.docker.list_containers(Some(opts)).await.map_err(classify)?;
        Ok(list
            .into_iter()
            .filter_map(|c| {
                let labels = c.labels.unwrap_or_default();
                let state = c.state.map(|s| s.to_string()).unwrap_or_default();
                Some(Found {
                    container_id: c.id?,
                    name: c.names.unwrap_or_default().first().map(|n| n.trim_start_matches('/').to_string()).unwrap_or_default(),
                    job_id: labels.get(LABEL_JOB)?.parse().ok()?,
                    attempt_id: labels.get(LABEL_ATTEMPT)?.parse().ok()?,
                    db_uid: labels.get(LABEL_DB).cloned(),
                    gpus: labels.get(LABEL_GPUS).map(|g| g.split(',').filter_map(|x| x.parse().ok()).collect()).unwrap_or_default(),
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
        let list = self.docker.list_containers(Some(qp::ListContainersOptions { all: false, ..Default::default() })).await.map_err(classify)?;
        let mut out = vec![];
        let mut seen = vec![];
        for c in list {
            let Some(id) = c.id.clone() else { continue };
            if c.labels.as_ref().and_then(|l| l.get(LABEL_ENGINE)).is_some_and(|e| e == engine_id) {
                continue;
            }
            seen.push(id.clone());
            if let Some(gpus) = self.gpus_of_listed(&c).await {
                out.push(ForeignGpuUse { container_id: id, name: listed_name(&c), gpus });
            }
        }
        self.inspected.lock().unwrap().retain(|k, _| seen.contains(k));
        Ok(out)
    }

    async fn gpu_taken(&self, id: &str, engine_id: &str, gpus: &[(u32, String)]) -> Result<Option<String>, ExecError> {
        if gpus.is_empty() {
            return Ok(None);
        }
        let began = std::time::Instant::now();
        loop {
            let filters = HashMap::from([("status".to_string(), vec!["created".to_string(), "running".to_string(), "restarting".to_string()])]);
            let opts = qp::ListContainersOptions { all: true, filters: Some(filters), ..Default::default() };
            let list = self.docker.list_containers(Some(opts)).await.map_err(classify)?;
            let now_s = now_ns() / 1_000_000_000;
            let mut later: Option<String> = None;
            for c in list {
                let Some(cid) = c.id.clone() else { continue };
                if cid == id || c.labels.as_ref().and_then(|l| l.get(LABEL_ENGINE)).is_some_and(|e| e == engine_id) {
                    continue;
                }
                let Some(theirs) = self.gpus_of_listed(&c).await else { continue };
                if !gpus.iter().any(|(i, u)| theirs.holds(*i, u)) {
                    continue;
                }
                let created_only = c.state.as_ref().is_some_and(|s| matches!(s, bollard::models::ContainerSummaryStateEnum::CREATED));
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
        let opts = qp::LogsOptions { follow, stdout: true, stderr: true, timestamps: true, since: since_s as i32, ..Default::default() };
        self.docker.logs(id, Some(opts)).map(|r| r.map(Frame::of).map_err(classify)).boxed()
    }

    fn attach(&self, id: &str) -> BoxStream<'static, Result<Frame, ExecError>> {
        let (docker, id) = (self.docker.clone(), id.to_string());
        let opts = qp::AttachContainerOptions { stream: true, stdout: true, stderr: true, ..Default::default() };
        futures_util::stream::once(async move { docker.attach_container(&id, Some(opts)).await })
            .flat_map(|r| match r {
                // The input half is kept with the output: dropping it could end the attachment.
                Ok(a) => {
                    let input = a.input;
                    a.output.map(move |o| {
                        let _ = &input;
                        o.map(Frame::of).map_err(classify)
                    })
                    .boxed()
                }
                Err(e) => futures_util::stream::once(async move { Err(classify(e)) }).boxed(),
            })
            .boxed()
    }
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
            container: ContainerSettings { home: Some("/home/u".into()), ..Default::default() },
        })
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
        assert_eq!(first_plain_file(&pax).as_deref(), Some(&body[..]), "an extended header first");
        assert_eq!(first_plain_file(&header("passwd", b'2', 0)), None, "a symlink is not read");
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
        let rows: Vec<(Vec<DeviceRequest>, Option<&str>, Vec<String>, Option<GpuSet>)> = vec![
            (vec![req(Some(vec!["GPU-a", "GPU-b"]), None)], None, vec![], Some(GpuSet::Ids(vec!["GPU-a".into(), "GPU-b".into()]))),
            (vec![req(None, Some(-1))], None, vec![], Some(GpuSet::All)),
            (vec![req(None, Some(2))], None, vec![], Some(GpuSet::All)),
            // A CUDA image's own `NVIDIA_VISIBLE_DEVICES=all` gives no GPU without the nvidia runtime.
            (vec![], Some("runc"), env("all"), None),
            (vec![], Some("nvidia"), env("all"), Some(GpuSet::All)),
            (vec![], Some("nvidia"), env("0,GPU-c"), Some(GpuSet::Ids(vec!["0".into(), "GPU-c".into()]))),
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
        let j = validate_text("image: a\ngpus: 2\nenv: {CUDA_VISIBLE_DEVICES: '5', MY: x}\n", Format::Yaml, &Origin::default()).unwrap();
        let env = launch(&j, &["GPU-a", "GPU-b"]);
        assert!(env.contains(&"NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b".to_string()));
        assert!(env.contains(&"CUDA_VISIBLE_DEVICES=0,1".to_string()), "a spec must not override the GPU binding: {env:?}");
        assert!(env.contains(&"GANTRY_JOB_ID=7".to_string()));
        assert!(env.contains(&"MY=x".to_string()));
        assert!(!env.iter().any(|e| e.starts_with("XLA_")));
        assert!(env.contains(&"HOME=/home/u".to_string()), "{env:?}");
        let own = validate_text("image: a\nenv: {HOME: /w}\n", Format::Yaml, &Origin::default()).unwrap();
        assert!(launch(&own, &[]).contains(&"HOME=/w".to_string()), "a spec's HOME is kept");
    }

    #[test]
    fn shared_gpu_gets_memory_hints_and_cpu_job_sees_none() {
        let j = validate_text("image: a\ngpu_memory: 10GiB\n", Format::Yaml, &Origin::default()).unwrap();
        let env = launch(&j, &["GPU-a"]);
        assert!(env.contains(&"FLAGS_fraction_of_gpu_memory_to_use=0.250".to_string()), "{env:?}");
        assert!(env.contains(&"XLA_PYTHON_CLIENT_MEM_FRACTION=0.250".to_string()));
        assert!(env.contains(&"TF_FORCE_GPU_ALLOW_GROWTH=true".to_string()));
        let cpu = validate_text("image: a\ngpus: 0\n", Format::Yaml, &Origin::default()).unwrap();
        let env = launch(&cpu, &[]);
        assert!(env.contains(&"NVIDIA_VISIBLE_DEVICES=void".to_string()));
    }
}

fn listed_name(c: &bollard::models::ContainerSummary) -> String {
    c.names.as_ref().and_then(|n| n.first()).map(|n| n.trim_start_matches('/').to_string()).unwrap_or_default()
}

fn now_ns() -> i128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as i128).unwrap_or(0)
}
