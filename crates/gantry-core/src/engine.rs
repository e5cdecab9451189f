//! The engine: ties the store, GPU sampler, scheduler, executor and drop folder together.
//!
//! Invariants:
//! - The database is the source of truth; the in-memory `running` map mirrors its open attempts.
//! - queued -> starting is a compare-and-set in SQLite, so a job never starts twice.
//! - Containers outlive the engine; on start, `recover` reconciles every open attempt with Docker.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::{broadcast, Notify};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::executor::{ExecError, Executor, Exit, GpuBinding, Launch};
use crate::gpu::{BackendKind, GpuBackend, GpuSample, SimLoad};
use crate::scheduler::{self, GpuView, QueuedJob, RunningJob};
use crate::spec::{self, Format, Origin, SpecError, ValidJob};
use crate::store::{now_ms, Attempt, EndReason, Ending, Job, JobState, Owner, Store, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error(transparent)]
    Gpu(#[from] crate::gpu::GpuError),
    #[error(transparent)]
    Exec(#[from] ExecError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("no job {0}")]
    NoSuchJob(i64),
    #[error("job {job} belongs to {owner}; only its owner or root may change it")]
    NotOwner { job: i64, owner: String },
    #[error("another Gantry engine already uses {0}")]
    AlreadyRunning(PathBuf),
}

/// Where an engine keeps its state.
#[derive(Debug, Clone)]
pub struct Paths {
    pub state_dir: PathBuf,
    pub inbox: PathBuf,
}

impl Paths {
    pub fn db(&self) -> PathBuf {
        self.state_dir.join("gantry.db")
    }
    pub fn socket(&self) -> PathBuf {
        self.state_dir.join("gantry.sock")
    }
    pub fn logs(&self) -> PathBuf {
        self.state_dir.join("logs")
    }
    pub fn log_of(&self, job: i64) -> PathBuf {
        self.logs().join(format!("{job}.log"))
    }
    /// XDG default: `$XDG_STATE_HOME/gantry` (or `~/.local/state/gantry`), inbox `~/Gantry/inbox`.
    pub fn default_state_dir() -> PathBuf {
        if let Some(x) = std::env::var_os("XDG_STATE_HOME").filter(|x| !x.is_empty()) {
            return PathBuf::from(x).join("gantry");
        }
        home().join(".local/state/gantry")
    }
    pub fn default_inbox() -> PathBuf {
        home().join("Gantry/inbox")
    }
}

fn home() -> PathBuf {
    std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/tmp"))
}

#[derive(Debug, Clone)]
pub struct Config {
    pub paths: Paths,
    /// `sim:NxMEM` forces simulated GPUs.
    pub gpus: Option<String>,
    pub scheduler: scheduler::Config,
    /// SIGTERM -> SIGKILL grace on cancel and timeout.
    pub stop_grace: Duration,
    pub log_cap: u64,
    /// First retry delay; doubles per attempt, capped at 10 minutes.
    pub retry_backoff: Duration,
    pub sample_every: Duration,
    /// Fair share: a user's GPU-hours count half as much after this long.
    pub fair_share_half_life: Duration,
    /// API connection limits and header-read timeout.
    pub api: crate::api::Limits,
}

impl Config {
    pub fn new(paths: Paths) -> Self {
        Config {
            paths,
            gpus: None,
            scheduler: scheduler::Config::default(),
            stop_grace: Duration::from_secs(10),
            log_cap: 64 << 20,
            retry_backoff: Duration::from_secs(10),
            sample_every: Duration::from_secs(1),
            fair_share_half_life: Duration::from_secs(24 * 3600),
            api: crate::api::Limits::default(),
        }
    }
}

/// Pushed to API subscribers.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EngineEvent {
    Job { job_id: i64, state: JobState, at: i64 },
    Gpus { at: i64, gpus: Vec<GpuSample> },
}

struct RunHandle {
    gpus: Vec<u32>,
    gpu_memory: Option<u64>,
    container_id: Option<String>,
    cancel: CancellationToken,
    /// A task follows this attempt (so recovery must not start a second one).
    monitored: bool,
    /// Start + expected runtime, when known.
    expected_end: Option<i64>,
}

/// Figures the scheduler needs that change slowly; refreshed every 30 s.
#[derive(Default)]
struct Stats {
    at: i64,
    usage: HashMap<String, f64>,
    typical_wait: Option<i64>,
    runtimes: HashMap<(String, String), Option<i64>>,
}

/// A queued job with the scheduler's verdict.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QueueEntry {
    pub job: Job,
    pub gpus_assigned: Vec<u32>,
    pub position: Option<usize>,
    pub reason: Option<String>,
    /// Estimated start (ms) from declared or learned runtimes, assuming nothing new arrives.
    pub estimated_start: Option<i64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GpuStatus {
    pub backend: BackendKind,
    /// Why NVML is not used, when it is not.
    pub note: Option<String>,
    pub gpus: Vec<GpuSample>,
    /// Which Gantry jobs hold which GPU.
    pub holders: Vec<(u32, Vec<i64>)>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobDetail {
    pub job: Job,
    pub attempts: Vec<Attempt>,
    pub events: Vec<crate::store::Event>,
    pub reason: Option<String>,
}

pub struct Engine {
    pub cfg: Config,
    pub engine_id: String,
    store: Mutex<Store>,
    /// A second connection for long reads (scheduling pass, history), so they never hold up writes:
    /// WAL lets readers and the writer proceed together.
    reader: Mutex<Store>,
    exec: Executor,
    backend: Mutex<Box<dyn GpuBackend>>,
    backend_kind: BackendKind,
    backend_note: Option<String>,
    latest: RwLock<Vec<GpuSample>>,
    /// Last hour of 1 Hz samples: (ms, per GPU (util %, memory used)).
    recent: Mutex<VecDeque<(i64, Vec<(u32, u64)>)>>,
    waiting: RwLock<HashMap<i64, scheduler::Waiting>>,
    eta: RwLock<HashMap<i64, i64>>,
    eta_at: std::sync::atomic::AtomicI64,
    stats: Mutex<Stats>,
    running: Mutex<HashMap<i64, RunHandle>>,
    docker_down: RwLock<Option<String>>,
    wake: Notify,
    events: broadcast::Sender<EngineEvent>,
    shutdown: CancellationToken,
    _lock: std::fs::File,
}

fn lock_state_dir(dir: &Path) -> Result<std::fs::File, EngineError> {
    use std::os::fd::AsRawFd;
    let f = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(dir.join("engine.lock"))?;
    // SAFETY: flock on a valid, owned fd.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(EngineError::AlreadyRunning(dir.to_path_buf()));
    }
    Ok(f)
}

impl Engine {
    /// Open the store and GPU backend; nothing runs until [`Engine::run`].
    pub fn open(cfg: Config) -> Result<Arc<Engine>, EngineError> {
        std::fs::create_dir_all(&cfg.paths.state_dir)?;
        std::fs::create_dir_all(cfg.paths.logs())?;
        let lock = lock_state_dir(&cfg.paths.state_dir)?;
        let store = Store::open(&cfg.paths.db())?;
        let reader = Store::open(&cfg.paths.db())?;
        let (backend, note) = crate::gpu::open(cfg.gpus.as_deref())?;
        let kind = backend.kind();
        match (&kind, &note) {
            (BackendKind::Simulated, Some(why)) => warn!("SIMULATED GPUs: NVML not available ({why})"),
            (BackendKind::Simulated, None) => warn!("SIMULATED GPUs ({})", cfg.gpus.as_deref().unwrap_or("")),
            _ => info!("using NVML"),
        }
        let engine_id = engine_id(&cfg.paths.state_dir);
        let exec = Executor::connect()?;
        let (events, _) = broadcast::channel(1024);
        let e = Arc::new(Engine {
            cfg,
            engine_id,
            store: Mutex::new(store),
            reader: Mutex::new(reader),
            exec,
            backend: Mutex::new(backend),
            backend_kind: kind,
            backend_note: note,
            latest: RwLock::new(vec![]),
            recent: Mutex::new(VecDeque::new()),
            waiting: RwLock::new(HashMap::new()),
            eta: RwLock::new(HashMap::new()),
            eta_at: std::sync::atomic::AtomicI64::new(0),
            stats: Mutex::new(Stats::default()),
            running: Mutex::new(HashMap::new()),
            docker_down: RwLock::new(None),
            wake: Notify::new(),
            events,
            shutdown: CancellationToken::new(),
            _lock: lock,
        });
        e.sample_gpus();
        Ok(e)
    }

    pub fn backend_kind(&self) -> BackendKind {
        self.backend_kind
    }

    pub fn subscribe(&self) -> broadcast::Receiver<EngineEvent> {
        self.events.subscribe()
    }

    pub fn shutdown(&self) {
        self.shutdown.cancel();
    }

    fn store(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn reader(&self) -> std::sync::MutexGuard<'_, Store> {
        self.reader.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn notify_job(&self, job_id: i64, state: JobState) {
        let _ = self.events.send(EngineEvent::Job { job_id, state, at: now_ms() });
    }

    /// Run until shutdown: recovery, then sampler and scheduler loops.
    pub async fn run(self: Arc<Self>) {
        self.clone().recover().await;
        let sampler = tokio::spawn(self.clone().sampler_loop());
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = self.shutdown.cancelled() => break,
                _ = self.wake.notified() => {},
                _ = tick.tick() => {},
            }
            let t0 = std::time::Instant::now();
            self.clone().schedule_once().await;
            // Coalesce bursts (hundreds of submits): at most ~20 passes a second, and a long pass
            // (a very deep queue) is followed by an equal pause so it never takes over the engine.
            tokio::time::sleep(t0.elapsed().max(Duration::from_millis(50))).await;
        }
        sampler.abort();
        info!("engine stopped; running containers keep running and are reattached on next start");
    }

    async fn sampler_loop(self: Arc<Self>) {
        let mut tick = tokio::time::interval(self.cfg.sample_every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut minute: Option<(i64, Vec<(u64, u32, u64, u64)>)> = None; // per GPU: (util sum, util max, mem sum, count)
        loop {
            tick.tick().await;
            let samples = self.sample_gpus();
            let now = now_ms();
            let m = now - now.rem_euclid(60_000);
            if let Some((start, acc)) = &minute {
                if *start != m {
                    let mut st = self.store();
                    for (i, (us, umax, ms, n)) in acc.iter().enumerate() {
                        let total = samples.get(i).map(|g| g.memory_total).unwrap_or(0);
                        if let Err(e) = st.record_gpu_minute(i as u32, *start, *us as f64 / *n as f64, *umax, ms / n, total) {
                            warn!("could not save GPU minute: {e}");
                        }
                    }
                    minute = None;
                }
            }
            let acc = &mut minute.get_or_insert_with(|| (m, vec![(0, 0, 0, 0); samples.len()])).1;
            for (a, g) in acc.iter_mut().zip(&samples) {
                a.0 += g.utilization as u64;
                a.1 = a.1.max(g.utilization);
                a.2 += g.memory_used;
                a.3 += 1;
            }
            let _ = self.events.send(EngineEvent::Gpus { at: now, gpus: samples });
        }
    }

    /// Read the GPUs once (the simulated backend first learns what Gantry runs).
    fn sample_gpus(&self) -> Vec<GpuSample> {
        let load = self.sim_load();
        let samples = {
            let mut b = self.backend.lock().unwrap_or_else(|p| p.into_inner());
            b.set_load(&load);
            match b.sample() {
                Ok(s) => s,
                Err(e) => {
                    warn!("GPU sampling failed: {e}");
                    return self.latest.read().unwrap().clone();
                }
            }
        };
        let now = now_ms();
        {
            let mut r = self.recent.lock().unwrap();
            r.push_back((now, samples.iter().map(|g| (g.utilization, g.memory_used)).collect()));
            while r.len() > 3600 {
                r.pop_front();
            }
        }
        *self.latest.write().unwrap() = samples.clone();
        samples
    }

    fn sim_load(&self) -> Vec<SimLoad> {
        let mut load: HashMap<u32, SimLoad> = HashMap::new();
        for h in self.running.lock().unwrap().values() {
            for g in &h.gpus {
                let l = load.entry(*g).or_insert_with(|| SimLoad { index: *g, ..Default::default() });
                match h.gpu_memory {
                    None => l.exclusive = true,
                    Some(m) => {
                        l.shared_declared += m;
                        l.shared_jobs += 1;
                    }
                }
            }
        }
        load.into_values().collect()
    }

    /// Last hour of 1 Hz samples.
    pub fn recent_samples(&self, since_ms: i64) -> Vec<(i64, Vec<(u32, u64)>)> {
        self.recent.lock().unwrap().iter().filter(|(t, _)| *t >= since_ms).cloned().collect()
    }

    fn gpu_views(&self) -> Vec<GpuView> {
        let ours: Vec<String> = self.running.lock().unwrap().values().filter_map(|h| h.container_id.clone()).collect();
        self.latest
            .read()
            .unwrap()
            .iter()
            .map(|g| GpuView {
                index: g.index,
                memory_total: g.memory_total,
                memory_used: g.memory_used,
                external_busy: g.processes.iter().any(|p| match &p.container_id {
                    Some(c) => !ours.iter().any(|o| o == c),
                    None => true,
                }),
            })
            .collect()
    }

    /// One scheduling pass.
    pub async fn schedule_once(self: Arc<Self>) {
        let mut queued: Vec<crate::store::QueuedRow> = match self.reader().queued_rows() {
            Ok(j) => j,
            Err(e) => {
                error!("cannot read the queue: {e}");
                return;
            }
        };
        if queued.is_empty() {
            self.waiting.write().unwrap().clear();
            return;
        }
        let blocked = self.check_dependencies(&mut queued);
        self.refresh_stats();
        let docker_down = match self.exec.ping().await {
            Ok(()) => {
                if self.docker_down.write().unwrap().take().is_some() {
                    info!("Docker engine is back");
                    tokio::spawn(self.clone().recover());
                }
                None
            }
            Err(e) => {
                let msg = e.to_string();
                let mut d = self.docker_down.write().unwrap();
                if d.is_none() {
                    warn!("{msg}");
                }
                *d = Some(msg.clone());
                Some(msg)
            }
        };
        let running: Vec<RunningJob> = self
            .running
            .lock()
            .unwrap()
            .iter()
            .map(|(id, h)| RunningJob { job_id: *id, gpus: h.gpus.clone(), gpu_memory: h.gpu_memory, expected_end_ms: h.expected_end })
            .collect();
        let state = scheduler::State {
            now_ms: now_ms(),
            gpus: self.gpu_views(),
            running,
            queued: queued
                .iter()
                .map(|j| QueuedJob {
                    job_id: j.id,
                    priority: j.priority,
                    submitted_at_ms: j.submitted_at,
                    gpus: j.gpus,
                    gpu_memory: j.gpu_memory,
                    not_before_ms: j.not_before,
                    expected_runtime_ms: self.expected_runtime(j.expected_runtime_ms, &j.name, &j.image),
                    user_usage: self.stats.lock().unwrap().usage.get(&j.owner).copied().unwrap_or(0.0),
                })
                .collect(),
            config: self.cfg.scheduler.clone(),
            typical_wait_ms: self.stats.lock().unwrap().typical_wait,
        };
        let mut plan = scheduler::plan(&state);
        // Start estimates replay the queue forward (quadratic in its length): every 5 s at most.
        if state.now_ms - self.eta_at.load(std::sync::atomic::Ordering::Relaxed) >= 5_000 {
            self.eta_at.store(state.now_ms, std::sync::atomic::Ordering::Relaxed);
            *self.eta.write().unwrap() = if state.queued.len() <= 500 { scheduler::estimate_starts(&state, 3_600_000, 500) } else { HashMap::new() };
        }
        for (id, reason) in blocked {
            plan.waiting.push(scheduler::Waiting { job_id: id, position: plan.waiting.len() + 1, reason, reserved: vec![] });
        }
        if let Some(msg) = docker_down {
            for (i, p) in plan.placements.drain(..).enumerate() {
                plan.waiting.push(scheduler::Waiting { job_id: p.job_id, position: i + 1, reason: msg.clone(), reserved: vec![] });
            }
        }
        *self.waiting.write().unwrap() = plan.waiting.iter().map(|w| (w.job_id, w.clone())).collect();
        let uuids: Vec<(u32, String, u64)> = self.latest.read().unwrap().iter().map(|g| (g.index, g.uuid.clone(), g.memory_total)).collect();
        for p in plan.placements {
            let Ok(Some(job)) = self.store().job(p.job_id) else { continue };
            let gpu_uuids: Vec<String> = p.gpus.iter().filter_map(|i| uuids.iter().find(|u| u.0 == *i).map(|u| u.1.clone())).collect();
            let total = p.gpus.first().and_then(|i| uuids.iter().find(|u| u.0 == *i).map(|u| u.2));
            let attempt = match self.store().begin_attempt(job.id, &p.gpus, &gpu_uuids) {
                Ok(Some(a)) => a,
                Ok(None) => continue, // cancelled or taken meanwhile
                Err(e) => {
                    error!("cannot start job {}: {e}", job.id);
                    continue;
                }
            };
            let cancel = CancellationToken::new();
            self.running.lock().unwrap().insert(
                job.id,
                RunHandle {
                    gpus: p.gpus.clone(),
                    gpu_memory: job.gpu_memory,
                    container_id: None,
                    cancel: cancel.clone(),
                    monitored: true,
                    expected_end: self
                        .expected_runtime(job.job.expected_runtime.map(|d| d.as_millis() as i64), &job.name, &job.image)
                        .map(|r| now_ms() + r),
                },
            );
            self.notify_job(job.id, JobState::Starting);
            tokio::spawn(self.clone().launch(job, attempt, total, cancel));
        }
    }

    async fn launch(self: Arc<Self>, job: Job, attempt: Attempt, gpu_total: Option<u64>, cancel: CancellationToken) {
        let log = self.cfg.paths.log_of(job.id);
        append_log(&log, &format!("[gantry] attempt {} of job {} on {}", attempt.n, job.id, gpu_list(&attempt.gpus)));
        let binding = if self.backend_kind == BackendKind::Nvml { GpuBinding::Nvidia } else { GpuBinding::EnvOnly };
        let l = Launch {
            engine_id: &self.engine_id,
            job_id: job.id,
            attempt_id: attempt.id,
            attempt_n: attempt.n,
            job: &job.job,
            uid: job.owner_uid,
            gid: job.owner_gid,
            gpu_uuids: attempt.gpu_uuids.clone(),
            gpu_total_memory: gpu_total,
            binding,
        };
        let started = async {
            self.exec.ensure_image(&job.image).await?;
            let cid = self.exec.create(&l).await?;
            self.store().set_container(attempt.id, &cid).map_err(|e| ExecError::Rejected(e.to_string()))?;
            if let Some(h) = self.running.lock().unwrap().get_mut(&job.id) {
                h.container_id = Some(cid.clone());
            }
            if cancel.is_cancelled() || self.store().job(job.id).ok().flatten().is_some_and(|j| j.cancel_requested) {
                return Ok((cid, false));
            }
            self.exec.start(&cid).await?;
            Ok::<_, ExecError>((cid, true))
        }
        .await;
        match started {
            Ok((cid, true)) => {
                if let Err(e) = self.store().set_running(job.id) {
                    error!("job {}: {e}", job.id);
                }
                self.notify_job(job.id, JobState::Running);
                info!(job = job.id, container = %&cid[..12], "job running");
                self.monitor(job, attempt, cid, cancel, 0).await;
            }
            Ok((cid, false)) => {
                let _ = self.exec.remove(&cid).await;
                self.finish(&job, &attempt, Ending { exit_code: None, reason: EndReason::Cancelled, message: Some("cancelled before it started".into()), next: JobState::Cancelled, not_before: None });
            }
            Err(e) => {
                append_log(&log, &format!("[gantry] could not start: {e}"));
                warn!(job = job.id, "could not start: {e}");
                let end = if e.is_transient() {
                    Ending { exit_code: None, reason: EndReason::EngineError, message: Some(e.to_string()), next: JobState::Queued, not_before: Some(now_ms() + 5_000) }
                } else {
                    Ending { exit_code: None, reason: EndReason::EngineError, message: Some(e.to_string()), next: JobState::Failed, not_before: None }
                };
                self.finish(&job, &attempt, end);
            }
        }
    }

    /// Follow a started container to its end: logs, timeout, cancel, then record the outcome once.
    async fn monitor(self: Arc<Self>, job: Job, attempt: Attempt, cid: String, cancel: CancellationToken, log_since_s: i64) {
        let logs = {
            let exec = self.exec.clone();
            let (cid, path, cap) = (cid.clone(), self.cfg.paths.log_of(job.id), self.cfg.log_cap);
            tokio::spawn(async move {
                if let Err(e) = exec.stream_logs(&cid, &path, cap, log_since_s).await {
                    warn!("log copy for {cid}: {e}");
                }
            })
        };
        let deadline = job.timeout_ms.map(|t| attempt.started_at + t);
        let until_deadline = async {
            match deadline {
                Some(d) => tokio::time::sleep(Duration::from_millis((d - now_ms()).max(0) as u64)).await,
                None => std::future::pending().await,
            }
        };
        let waited = async {
            loop {
                match self.exec.wait(&cid).await {
                    Ok(x) => return Ok(x),
                    Err(ExecError::DockerUnavailable(m)) => {
                        warn!(job = job.id, "lost contact with Docker while waiting ({m}); retrying");
                        tokio::time::sleep(Duration::from_secs(2)).await;
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        tokio::pin!(waited);
        let mut stop_reason: Option<EndReason> = None;
        let result: Result<Exit, ExecError> = tokio::select! {
            r = &mut waited => r,
            _ = until_deadline => { stop_reason = Some(EndReason::Timeout); Err(ExecError::Rejected(String::new())) }
            _ = cancel.cancelled() => { stop_reason = Some(EndReason::Cancelled); Err(ExecError::Rejected(String::new())) }
            _ = self.shutdown.cancelled() => return, // leave it running; reattached on next start
        };
        let result = match stop_reason {
            Some(_) => {
                if let Err(e) = self.exec.stop(&cid, self.cfg.stop_grace).await {
                    warn!(job = job.id, "stop failed: {e}");
                }
                waited.await
            }
            None => result,
        };
        let _ = tokio::time::timeout(Duration::from_secs(5), logs).await;
        let end = match (stop_reason, result) {
            (Some(EndReason::Timeout), r) => Ending {
                exit_code: r.ok().map(|x| x.code),
                reason: EndReason::Timeout,
                message: Some(format!("stopped after the {} timeout", human(job.timeout_ms.unwrap_or(0)))),
                next: JobState::TimedOut,
                not_before: None,
            },
            (Some(_), r) => Ending { exit_code: r.ok().map(|x| x.code), reason: EndReason::Cancelled, message: Some("cancelled".into()), next: JobState::Cancelled, not_before: None },
            (None, Ok(x)) if x.code == 0 && !x.oom_killed => {
                Ending { exit_code: Some(0), reason: EndReason::Exited, message: None, next: JobState::Succeeded, not_before: None }
            }
            (None, Ok(x)) => {
                let reason = if x.oom_killed { EndReason::Oom } else { EndReason::Exited };
                let what = if x.oom_killed { format!("killed: out of memory (code {})", x.code) } else { format!("exited with code {}", x.code) };
                self.failure(&job, &attempt, Some(x.code), reason, what)
            }
            (None, Err(e)) => self.failure(&job, &attempt, None, EndReason::Lost, format!("container vanished: {e}")),
        };
        self.finish(&job, &attempt, end);
        if let Err(e) = self.exec.remove(&cid).await {
            warn!(job = job.id, "could not remove container {cid}: {e}");
        }
    }

    /// Declared runtime, else the median of this name+image's recent successful runs.
    fn expected_runtime(&self, declared: Option<i64>, name: &str, image: &str) -> Option<i64> {
        if declared.is_some() {
            return declared;
        }
        let key = (name.to_string(), image.to_string());
        if let Some(v) = self.stats.lock().unwrap().runtimes.get(&key) {
            return *v;
        }
        let v = self.store().typical_runtime(name, image).ok().flatten();
        self.stats.lock().unwrap().runtimes.insert(key, v);
        v
    }

    /// Fair-share usage (decayed GPU-hours per owner) and the typical wait, every 30 s.
    fn refresh_stats(&self) {
        let now = now_ms();
        if now - self.stats.lock().unwrap().at < 30_000 {
            return;
        }
        let hl = self.cfg.fair_share_half_life.as_millis().max(1) as f64;
        let (rows, typical) = {
            let st = self.store();
            (st.usage_since(now - (hl * 5.0) as i64).unwrap_or_default(), st.typical_wait(now - 24 * 3_600_000).ok().flatten())
        };
        let mut usage: HashMap<String, f64> = HashMap::new();
        for (owner, gpus, start, end) in rows {
            let end = end.unwrap_or(now);
            let hours = (end - start).max(0) as f64 / 3_600_000.0 * gpus as f64;
            *usage.entry(owner).or_default() += hours * 0.5f64.powf((now - end) as f64 / hl);
        }
        let mut s = self.stats.lock().unwrap();
        *s = Stats { at: now, usage, typical_wait: typical, runtimes: HashMap::new() };
    }

    /// Drop jobs whose dependencies have not succeeded yet from `queued` (returned with a reason);
    /// fail jobs whose dependencies ended without success.
    fn check_dependencies(&self, queued: &mut Vec<crate::store::QueuedRow>) -> Vec<(i64, String)> {
        let mut blocked = vec![];
        let mut failed = vec![];
        queued.retain(|j| {
            for d in &j.after {
                match self.store().state_of(*d).ok().flatten() {
                    Some(JobState::Succeeded) => continue,
                    Some(s) if s.is_final() => {
                        failed.push((j.id, format!("dependency job {d} ended {}; this job will not run", s.as_str())));
                        return false;
                    }
                    Some(s) => {
                        blocked.push((j.id, format!("waiting for job {d} to succeed (it is {})", s.as_str())));
                        return false;
                    }
                    None => {
                        failed.push((j.id, format!("dependency job {d} no longer exists")));
                        return false;
                    }
                }
            }
            true
        });
        for (id, msg) in failed {
            if let Ok(true) = self.store().fail_queued(id, &msg) {
                self.notify_job(id, JobState::Failed);
            }
        }
        blocked
    }

    /// A failed attempt: retry with backoff while retries remain.
    fn failure(&self, job: &Job, attempt: &Attempt, code: Option<i64>, reason: EndReason, what: String) -> Ending {
        if attempt.n <= job.retries {
            let delay = self.cfg.retry_backoff.as_millis() as i64 * (1i64 << (attempt.n - 1).min(10));
            let delay = delay.min(600_000);
            Ending {
                exit_code: code,
                reason,
                message: Some(format!("{what}; retry {} of {} in {}", attempt.n, job.retries, human(delay))),
                next: JobState::Queued,
                not_before: Some(now_ms() + delay),
            }
        } else {
            Ending { exit_code: code, reason, message: Some(what), next: JobState::Failed, not_before: None }
        }
    }

    fn finish(&self, job: &Job, attempt: &Attempt, end: Ending) {
        append_log(&self.cfg.paths.log_of(job.id), &format!("[gantry] attempt {} ended: {}", attempt.n, end.message.clone().unwrap_or_else(|| end.next.as_str().into())));
        if let Err(e) = self.store().end_attempt(job.id, attempt.id, &end) {
            error!(job = job.id, "cannot record the end of attempt {}: {e}", attempt.n);
        }
        self.running.lock().unwrap().remove(&job.id);
        info!(job = job.id, state = end.next.as_str(), "attempt ended");
        self.notify_job(job.id, end.next);
        self.wake.notify_one();
    }

    /// Reconcile every open attempt with Docker (on start, and when Docker comes back).
    pub async fn recover(self: Arc<Self>) {
        let open: Vec<(Job, Attempt)> = {
            let st = self.store();
            let jobs = st.active_jobs().unwrap_or_default();
            jobs.into_iter()
                .filter(|j| j.state != JobState::Queued)
                .filter_map(|j| st.open_attempt(j.id).ok().flatten().map(|a| (j, a)))
                .collect()
        };
        // Hold their GPUs before anything else is scheduled.
        {
            let mut r = self.running.lock().unwrap();
            for (j, a) in &open {
                r.entry(j.id).or_insert_with(|| RunHandle {
                    gpus: a.gpus.clone(),
                    gpu_memory: j.gpu_memory,
                    container_id: a.container_id.clone(),
                    cancel: CancellationToken::new(),
                    monitored: false,
                    expected_end: j.job.expected_runtime.map(|r| a.started_at + r.as_millis() as i64),
                });
            }
        }
        let found = match self.exec.list_ours(&self.engine_id).await {
            Ok(f) => f,
            Err(e) => {
                warn!("cannot reconcile running jobs yet: {e}");
                *self.docker_down.write().unwrap() = Some(e.to_string());
                return;
            }
        };
        for (job, attempt) in open {
            let mine = found.iter().find(|f| f.attempt_id == attempt.id);
            let cancel = {
                let mut r = self.running.lock().unwrap();
                let Some(h) = r.get_mut(&job.id) else { continue };
                if h.monitored {
                    continue;
                }
                h.monitored = true;
                h.cancel.clone()
            };
            match mine {
                Some(f) if f.running => {
                    info!(job = job.id, "reattaching to running container");
                    if let Some(h) = self.running.lock().unwrap().get_mut(&job.id) {
                        h.container_id = Some(f.container_id.clone());
                    }
                    let _ = self.store().set_running(job.id);
                    let since = std::fs::metadata(self.cfg.paths.log_of(job.id))
                        .and_then(|m| m.modified())
                        .ok()
                        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                        .map(|d| d.as_secs() as i64 + 1)
                        .unwrap_or(0);
                    tokio::spawn(self.clone().monitor(job, attempt, f.container_id.clone(), cancel, since));
                }
                Some(f) if !f.created_only => {
                    // Ended while we were away: record its real exit code. Copy the output we missed first.
                    let log = self.cfg.paths.log_of(job.id);
                    let since = std::fs::metadata(&log).and_then(|m| m.modified()).ok()
                        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map(|d| d.as_secs() as i64 + 1).unwrap_or(0);
                    let _ = self.exec.stream_logs(&f.container_id, &log, self.cfg.log_cap, since).await;
                    let end = match self.exec.exit_of(&f.container_id).await {
                        Ok(Some(x)) if x.code == 0 && !x.oom_killed => Ending { exit_code: Some(0), reason: EndReason::Exited, message: Some("exited with code 0 while the engine was down".into()), next: JobState::Succeeded, not_before: None },
                        Ok(Some(x)) => self.failure(&job, &attempt, Some(x.code), if x.oom_killed { EndReason::Oom } else { EndReason::Exited }, format!("exited with code {} while the engine was down", x.code)),
                        _ => self.failure(&job, &attempt, None, EndReason::Lost, "container state unreadable".into()),
                    };
                    self.finish(&job, &attempt, end);
                    let _ = self.exec.remove(&f.container_id).await;
                }
                Some(f) => {
                    // Created but never started: it never ran, so queue it again without using a retry.
                    let _ = self.exec.remove(&f.container_id).await;
                    self.finish(&job, &attempt, Ending { exit_code: None, reason: EndReason::Lost, message: Some("engine stopped before the container started; queued again".into()), next: JobState::Queued, not_before: None });
                }
                None => {
                    let end = self.failure(&job, &attempt, None, EndReason::Lost, "its container is gone (removed or lost with the Docker engine)".into());
                    self.finish(&job, &attempt, end);
                }
            }
        }
        // Containers of ours whose attempt is already recorded: clean up.
        for f in found {
            let open = self.store().open_attempt(f.job_id).ok().flatten().is_some_and(|a| a.id == f.attempt_id);
            if !open && !f.running {
                let _ = self.exec.remove(&f.container_id).await;
            }
        }
        self.wake.notify_one();
    }

    // ---- API operations ----

    /// Validate and queue one spec. `origin` resolves relative mounts and the default name.
    pub fn submit_text(&self, text: &str, format: Format, origin: &Origin, owner: &Owner, source: &str) -> Result<Vec<i64>, EngineError> {
        let job = spec::validate_text(text, format, origin)?;
        self.submit(&job, owner, source, None, |_, _| None)
    }

    /// Everything `submit_text` checks, without queueing.
    pub fn validate_text(&self, text: &str, format: Format, origin: &Origin) -> Result<ValidJob, EngineError> {
        let job = spec::validate_text(text, format, origin)?;
        self.check_fits(&job)?;
        Ok(job)
    }

    /// Queue the same spec again ("Run again"), owned by the caller.
    pub fn rerun(&self, id: i64, owner: &Owner) -> Result<Vec<i64>, EngineError> {
        let old = self.store().job(id)?.ok_or(EngineError::NoSuchJob(id))?;
        self.submit(&old.job, owner, &format!("rerun:{id}"), None, |_, _| None)
    }

    pub fn history_count(&self, f: &crate::store::HistoryFilter) -> Result<i64, EngineError> {
        Ok(self.reader().history_count(f)?)
    }

    pub fn timeline(&self, from: i64, to: i64) -> Result<Vec<crate::store::TimelineRun>, EngineError> {
        Ok(self.reader().timeline(from, to)?)
    }

    pub fn gpu_minutes(&self, gpu: u32, from: i64, to: i64) -> Result<Vec<(i64, f64, i64)>, EngineError> {
        Ok(self.store().gpu_minutes(gpu, from)?.into_iter().filter(|m| m.0 < to).collect())
    }

    /// Queue a job (a `matrix` expands into one job per combination). Returns the new job ids.
    /// `finalize` may rewrite each job once its id is known (template mounts).
    pub fn submit(
        &self,
        job: &ValidJob,
        owner: &Owner,
        source: &str,
        source_key: Option<&str>,
        finalize: impl Fn(i64, &ValidJob) -> Option<ValidJob>,
    ) -> Result<Vec<i64>, EngineError> {
        self.check_fits(job)?;
        let job = self.resolve_after(job, owner)?;
        let mut ids = vec![];
        for (i, j) in spec::expand(&job).iter().enumerate() {
            let id = self.store().insert_job(j, owner, source, if i == 0 { source_key } else { None }, &finalize)?;
            info!(job = id, owner = %owner.name, "queued {}", j.name);
            self.notify_job(id, JobState::Queued);
            ids.push(id);
        }
        self.wake.notify_one();
        Ok(ids)
    }

    /// Turn `after: [name]` into job ids (the owner's latest job of that name); check ids exist.
    fn resolve_after(&self, job: &ValidJob, owner: &Owner) -> Result<ValidJob, EngineError> {
        let mut job = job.clone();
        let st = self.store();
        for a in job.spec.after.iter_mut() {
            match a {
                spec::IdOrName::Id(id) => {
                    if st.state_of(*id)?.is_none() {
                        return Err(SpecError::new(format!("`after` refers to job {id}, which does not exist"), "check the id with `gantry ls` or `gantry history`").into());
                    }
                }
                spec::IdOrName::Name(n) => match st.latest_by_name(owner.uid, n)? {
                    Some(id) => *a = spec::IdOrName::Id(id),
                    None => {
                        return Err(SpecError::new(format!("`after` refers to {n:?}, but you have no job with that name"), "submit that job first, or use its id").into())
                    }
                },
            }
        }
        Ok(job)
    }

    /// Reject jobs this machine can never run.
    pub fn check_fits(&self, job: &ValidJob) -> Result<(), SpecError> {
        let gpus = self.latest.read().unwrap();
        if job.gpus as usize > gpus.len() {
            return Err(SpecError::new(
                format!("the job asks for {} GPUs, this machine has {}", job.gpus, gpus.len()),
                format!("ask for at most {} GPUs", gpus.len()),
            ));
        }
        if let Some(m) = job.gpu_memory {
            let max = gpus.iter().map(|g| g.memory_total).max().unwrap_or(0);
            if m > max {
                return Err(SpecError::new(
                    format!("the job asks for {} per GPU, the largest GPU here has {}", spec::format_bytes(m), spec::format_bytes(max)),
                    "lower `gpu_memory`, or leave it out to get whole GPUs",
                ));
            }
        }
        Ok(())
    }

    pub fn source_known(&self, key: &str) -> Option<i64> {
        self.store().job_by_source_key(key).ok().flatten()
    }

    pub fn queue(&self) -> Result<Vec<QueueEntry>, EngineError> {
        let jobs = self.store().active_jobs()?;
        let waiting = self.waiting.read().unwrap();
        let eta = self.eta.read().unwrap();
        let running = self.running.lock().unwrap();
        Ok(jobs
            .into_iter()
            .map(|j| {
                let w = waiting.get(&j.id);
                QueueEntry {
                    gpus_assigned: running.get(&j.id).map(|h| h.gpus.clone()).unwrap_or_default(),
                    position: w.map(|w| w.position),
                    reason: match (j.state, w) {
                        (JobState::Queued, Some(w)) => Some(w.reason.clone()),
                        (JobState::Queued, None) => Some("about to be scheduled".into()),
                        _ => None,
                    },
                    estimated_start: if j.state == JobState::Queued { eta.get(&j.id).copied() } else { None },
                    job: j,
                }
            })
            .collect())
    }

    pub fn job_detail(&self, id: i64) -> Result<JobDetail, EngineError> {
        let st = self.store();
        let job = st.job(id)?.ok_or(EngineError::NoSuchJob(id))?;
        let reason = self.waiting.read().unwrap().get(&id).map(|w| w.reason.clone());
        Ok(JobDetail { attempts: st.attempts(id)?, events: st.events(id)?, job, reason })
    }

    fn owned(&self, id: i64, caller_uid: u32) -> Result<Job, EngineError> {
        let job = self.store().job(id)?.ok_or(EngineError::NoSuchJob(id))?;
        if caller_uid != 0 && caller_uid != job.owner_uid {
            return Err(EngineError::NotOwner { job: id, owner: job.owner });
        }
        Ok(job)
    }

    /// Cancel: queued jobs end at once; running ones get SIGTERM, then SIGKILL after the grace period.
    pub fn cancel(&self, id: i64, caller_uid: u32) -> Result<JobState, EngineError> {
        self.owned(id, caller_uid)?;
        let before = self.store().request_cancel(id)?.ok_or(EngineError::NoSuchJob(id))?;
        match before {
            JobState::Queued => self.notify_job(id, JobState::Cancelled),
            JobState::Starting | JobState::Running => {
                if let Some(h) = self.running.lock().unwrap().get(&id) {
                    h.cancel.cancel();
                }
            }
            _ => {}
        }
        self.wake.notify_one();
        Ok(before)
    }

    pub fn set_priority(&self, id: i64, priority: i32, caller_uid: u32) -> Result<bool, EngineError> {
        self.owned(id, caller_uid)?;
        let ok = self.store().set_priority(id, priority)?;
        self.wake.notify_one();
        Ok(ok)
    }

    pub fn gpu_status(&self) -> GpuStatus {
        let mut holders: HashMap<u32, Vec<i64>> = HashMap::new();
        for (id, h) in self.running.lock().unwrap().iter() {
            for g in &h.gpus {
                holders.entry(*g).or_default().push(*id);
            }
        }
        let mut holders: Vec<(u32, Vec<i64>)> = holders.into_iter().map(|(g, mut v)| { v.sort(); (g, v) }).collect();
        holders.sort();
        GpuStatus { backend: self.backend_kind, note: self.backend_note.clone(), gpus: self.latest.read().unwrap().clone(), holders }
    }

    pub fn history(&self, f: &crate::store::HistoryFilter) -> Result<Vec<crate::store::HistoryRow>, EngineError> {
        Ok(self.reader().history(f)?)
    }

    pub fn docker_problem(&self) -> Option<String> {
        self.docker_down.read().unwrap().clone()
    }
}

fn engine_id(state_dir: &Path) -> String {
    use std::hash::{Hash, Hasher};
    let canon = std::fs::canonicalize(state_dir).unwrap_or_else(|_| state_dir.to_path_buf());
    let mut h = std::collections::hash_map::DefaultHasher::new();
    canon.hash(&mut h);
    format!("{:016x}", h.finish())
}

fn gpu_list(g: &[u32]) -> String {
    if g.is_empty() {
        "no GPU".into()
    } else {
        format!("GPU {}", g.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(","))
    }
}

fn human(ms: i64) -> String {
    humantime::format_duration(Duration::from_secs((ms / 1000).max(0) as u64)).to_string()
}

fn append_log(path: &Path, line: &str) {
    use std::io::Write;
    let ts = humantime::format_rfc3339_millis(std::time::SystemTime::now());
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
        let _ = writeln!(f, "{ts} {line}");
    }
}
