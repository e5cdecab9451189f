//! The engine: ties the store, GPU sampler, scheduler, backend and drop folder together.
//!
//! The main loop runs in named phases (pueue's task handler is the model), the same for every
//! [`backend::Backend`] (Docker on this machine, or a Slurm cluster):
//! 1. [`reconcile`]: on start (and when the backend comes back), every open attempt is matched with
//!    what the backend has; a pure table per backend decides follow / record / requeue / lost.
//! 2. [`pass`]: the backend places what starts now (Docker: `scheduler::plan` on this machine's
//!    GPUs; Slurm: every ready job), and each start is claimed with a compare-and-set in SQLite
//!    (queued -> starting), so a job never starts twice.
//! 3. [`supervisor`]: one owned task per attempt launches it, follows it (output, timeout, cancel)
//!    through the backend's [`backend::Watch`], and records its end through [`crate::outcome`]
//!    (pure) exactly once. What the attempt leaves (a container) is removed only after its end is
//!    committed.
//! 4. [`sampler`]: GPUs at 1 Hz, per-minute aggregates to SQLite.
//!
//! [`ops`] is the API facade. Time is read through one [`Clock`] (tokio's paused time in tests).
//!
//! Invariants: the database is the source of truth; the in-memory `running` map mirrors its open
//! attempts. When the database cannot be written, nothing new starts and the problem is reported
//! until a write succeeds again.

pub(crate) mod backend;
mod bookings;
mod idle;
mod joblog;
mod lab;
mod limits;
mod ops;
mod pass;
pub mod ports;
mod preview;
mod reconcile;
pub(crate) mod results;
mod sampler;
pub mod session;
pub mod submit;
mod supervisor;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use tokio::sync::{broadcast, Notify};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{error, info, warn};

use crate::clock::Clock;
use crate::executor::{DockerExecutor, ExecError, Executor};
use crate::gpu::{BackendKind, GpuBackend, GpuSample};
use crate::slurm::SlurmClient;
use crate::spec::SpecError;
use crate::store::{JobState, RunRef, Store, StoreError};

pub use crate::config::{Config, Paths};
pub use crate::protocol::QueueEntryView as QueueEntry;
pub use crate::protocol::{EngineEvent, GpuStatus, GpuUser, Health, Orphan};
pub use crate::store::JobDetail;
pub(crate) use joblog::append_log;
pub use joblog::{strip_stamps, strip_stamps_live, LogReader};

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
    #[error(transparent)]
    Staging(#[from] crate::staging::StagingError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("no job {0}")]
    NoSuchJob(i64),
    /// A query that cannot be answered as asked (`gantry compare` of nothing): what and how to fix.
    #[error("{0}")]
    BadQuery(String),
    #[error("job {job} belongs to {owner}; only its owner or root may change it")]
    NotOwner { job: i64, owner: String },
    #[error("another Gantry engine already uses {0}")]
    AlreadyRunning(PathBuf),
    #[error("{0}")]
    Refused(String),
    #[error("no booking {0} (`gantry bookings` lists them)")]
    NoSuchBooking(i64),
    #[error("booking {id} belongs to {owner}; only its owner or root may cancel it")]
    NotBookingOwner { id: i64, owner: String },
    #[error("{0}")]
    BookingRefused(String),
    #[error("{0}")]
    Policy(#[from] crate::policy::PolicyError),
    #[error("the engine cannot trust its state and stopped: {0}")]
    Fatal(String),
}

pub(crate) struct RunHandle {
    /// Since when (ms) it uses more GPU memory than declared (past the margin): warned, stopped after
    /// the grace; and, once stopping, why (see `Engine::enforce_gpu_memory`).
    pub over_memory: Option<(i64, Option<String>)>,
    /// Its shape (owner, name, image, GPUs, declared memory): what a GPU memory stop corrects.
    pub key: crate::estimate::JobKey,
    /// The job owner's name (per-user GPU cap).
    pub owner: String,
    pub gpus: Vec<u32>,
    pub gpu_memory: Option<u64>,
    /// What runs it, once recorded (a container, a Slurm job).
    pub run: Option<RunRef>,
    pub cancel: CancellationToken,
    /// A task follows this attempt (so recovery must not start a second one).
    pub monitored: bool,
    /// Start + declared runtime, when declared (and trusted: see `estimate::trusted_runtime`).
    pub expected_end: Option<i64>,
    /// The owner's declaration and this attempt's start: past it by the lab's `overrun_margin`, the
    /// scheduler stops trusting its end (issue 18 item 7).
    pub declared: Option<crate::scheduler::Declared>,
    /// Without a declared runtime: its key and start, so each pass asks the learned history for the
    /// remaining runtime given how long it has run (as the simulator does).
    pub learn: Option<(crate::estimate::JobKey, i64)>,
    /// CPU and RAM it holds (its limits).
    pub needs: crate::scheduler::CpuRam,
    /// The CPUs it is pinned to (a whole-CPU share), chosen at launch; none pinned by another job.
    pub cpuset: Vec<u32>,
    /// What the scheduler needs to preempt it; `None`: not preemptible.
    pub victim: Option<crate::scheduler::Victim>,
    /// Cancelled when the scheduler preempts it: its supervisor stops it with its checkpoint signal.
    pub preempt: CancellationToken,
}

/// Figures the scheduler needs that change slowly.
#[derive(Default)]
pub(crate) struct Stats {
    pub at: i64,
    pub usage: HashMap<String, f64>,
    pub typical_wait: Option<i64>,
    /// Recent successful runs, for learned runtime estimates (`estimate::History`).
    pub history: Arc<crate::estimate::History>,
    /// The mix of the last `sim::SHAPE_WINDOW` submissions' shapes, for FGD packing (as in the sim).
    pub shapes: Vec<crate::scheduler::Shape>,
    /// Per owner, attempts that overran their declared runtime in the last `OVERRUN_WINDOW_MS`
    /// (`estimate::trusted_runtime`).
    pub overruns: HashMap<String, u32>,
}

/// One 1 Hz sample of every GPU: (ms, per GPU (util %, memory used)).
type RecentSample = (i64, Vec<(u32, u64)>);

pub struct Engine {
    pub cfg: Config,
    /// The lab policy in force: replaced whole by a reload, so every reader sees one consistent policy.
    policy: RwLock<Arc<crate::policy::Policy>>,
    /// The GPUs Gantry may use (`None`: all); the others are kept for interactive work.
    usable: Option<BTreeSet<u32>>,
    /// Random per database (legacy databases keep their old id so their containers are still found).
    pub engine_id: String,
    /// Random per database: names log files and containers.
    pub db_uid: String,
    store: Mutex<Store>,
    /// The queued jobs in memory, kept by `store`'s own changes (a pass never reads the queue from SQLite).
    queue: crate::store::SharedQueue,
    /// A second connection for long reads (scheduling pass, history), so they never hold up writes.
    reader: Mutex<Store>,
    /// What runs the jobs: Docker here, or Slurm (see [`backend`]).
    backend: Arc<dyn backend::Backend>,
    /// The engine's "now" (see [`crate::clock`]).
    clock: Arc<dyn Clock>,
    /// This machine's GPUs (NVML, or simulated).
    gpu: Mutex<Box<dyn GpuBackend>>,
    backend_kind: BackendKind,
    backend_note: Option<String>,
    /// The NVML library loaded instead of the driver's (`GANTRY_NVML_LIB`).
    backend_library: Option<String>,
    /// The machine's CPUs and RAM, read at start.
    machine: crate::resources::Machine,
    /// The CPUs jobs may be pinned to and the NUMA nodes, read at start.
    topology: crate::resources::Topology,
    /// The NUMA node of each GPU (by index), where the machine says.
    gpu_numa: HashMap<u32, u32>,
    latest: RwLock<Vec<GpuSample>>,
    /// Last hour of 1 Hz samples: (ms, per GPU (util %, memory used)).
    recent: Mutex<VecDeque<RecentSample>>,
    /// Since when (ms) each GPU (by UUID) has read 0 % utilization in every sample (`sampler::track_idle`).
    /// In memory only: an engine restart starts every count again.
    idle_since: Mutex<HashMap<String, i64>>,
    /// Why each queued job waits, by job id (ordered: `queue` walks it alongside the queue in memory).
    waiting: RwLock<BTreeMap<i64, crate::scheduler::Waiting>>,
    eta: RwLock<HashMap<i64, i64>>,
    eta_at: std::sync::atomic::AtomicI64,
    /// The last planning pass: a hash of its inputs and when it ran (see `Engine::plan_local`).
    last_pass: Mutex<Option<(u64, i64)>>,
    /// The GPUs as the last pass saw them (Docker backend): what a dry run plans on.
    last_gpus: RwLock<Option<Vec<crate::scheduler::GpuView>>>,
    stats: Mutex<Stats>,
    running: Mutex<HashMap<i64, RunHandle>>,
    /// When each job was last preempted (its wait toward the overdue rule counts from then), and
    /// by what (its reason in the queue until it runs again).
    preempted_at: Mutex<HashMap<i64, (i64, String)>>,
    /// GPUs freed by preemption for a job, until it starts (`scheduler::Config::claims`).
    claims: Mutex<BTreeMap<i64, Vec<u32>>>,
    /// GPU memory a shape (owner, name, image, GPUs, declared `gpu_memory`) was stopped for using:
    /// trusted instead of the declaration when that user submits the shape again (until a restart).
    learned_gpu_memory: Mutex<HashMap<crate::estimate::JobKey, u64>>,
    health: RwLock<Health>,
    /// High-water mark of job ids, kept outside the database (see [`Engine::open_with`]).
    id_mark: Mutex<std::fs::File>,
    wake: Notify,
    events: broadcast::Sender<EngineEvent>,
    /// Lines for a session's attached terminals (job, text): the idle warning.
    session_notices: broadcast::Sender<(i64, String)>,
    shutdown: CancellationToken,
    /// Every background task the engine starts (attempt supervisors, recovery), awaited on shutdown.
    tasks: TaskTracker,
    /// Loopback forwards to jobs' `ports` (`gantry open`), by job and container port.
    forwards: Mutex<HashMap<(i64, u16), std::net::SocketAddr>>,
    /// Open bookings, their GPUs this pass (see `engine::bookings`).
    book_cache: Mutex<bookings::BookCache>,
    _lock: std::fs::File,
}

/// What runs the jobs: containers on this machine through an [`Executor`], or a Slurm cluster
/// through a [`SlurmClient`]. Tests hand in fakes of either.
pub enum RunOn {
    Docker(Arc<dyn Executor>),
    Slurm(Arc<dyn SlurmClient>),
}

fn lock_state_dir(dir: &Path) -> Result<std::fs::File, EngineError> {
    use std::os::fd::AsRawFd;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(dir.join("engine.lock"))?;
    // SAFETY: flock on a valid, owned fd.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(EngineError::AlreadyRunning(dir.to_path_buf()));
    }
    Ok(f)
}

/// The state dir is 0711: the socket inside stays reachable, nothing can be listed; logs are 0700.
fn prepare_state_dir(paths: &Paths) -> Result<(), EngineError> {
    std::fs::create_dir_all(&paths.state_dir)?;
    std::fs::set_permissions(&paths.state_dir, std::fs::Permissions::from_mode(0o711))?;
    std::fs::create_dir_all(paths.logs())?;
    std::fs::set_permissions(paths.logs(), std::fs::Permissions::from_mode(0o700))?;
    Ok(())
}

/// The engine's start-up line on what jobs may use: "CPU and RAM for jobs: 1 CPU, 3.0 GiB (the
/// machine's 2 CPUs and 4.0 GiB, ...)".
fn for_jobs_line(cap: crate::scheduler::CpuRam, total: crate::scheduler::CpuRam) -> String {
    use crate::units::{cpus_count, format_bytes};
    format!(
        "CPU and RAM for jobs: {}, {} (the machine's {} and {}, less the lab's reserve for the OS and Docker)",
        cpus_count(cap.cpus_milli),
        format_bytes(cap.memory),
        cpus_count(total.cpus_milli),
        format_bytes(total.memory)
    )
}

const ID_MARK_FILE: &str = ".job-id-high-water";
const ENGINE_ID_FILE: &str = ".engine-id";

/// The largest job id named by a log file (`<db>-<id>.log` or legacy `<id>.log`).
fn max_logged_job_id(logs: &Path) -> i64 {
    std::fs::read_dir(logs)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| {
                    let n = e.file_name().to_string_lossy().into_owned();
                    let stem = n.strip_suffix(".log")?;
                    stem.rsplit('-').next()?.parse::<i64>().ok()
                })
                .max()
                .unwrap_or(0)
        })
        .unwrap_or(0)
}

impl Engine {
    /// Open the store, GPUs and the backend the lab config names (Docker unless `backend = "slurm"`);
    /// nothing runs until [`Engine::run`].
    pub fn open(cfg: Config) -> Result<Arc<Engine>, EngineError> {
        let on = match cfg.lab.backend {
            crate::slurm::BackendChoice::Slurm => RunOn::Slurm(Arc::new(crate::slurm::Slurm)),
            crate::slurm::BackendChoice::Docker => RunOn::Docker(Arc::new(DockerExecutor::connect()?)),
        };
        Self::open_on(cfg, on, crate::clock::system())
    }

    /// [`Engine::open`] with this executor for the Docker backend.
    pub fn open_with(cfg: Config, exec: Arc<dyn Executor>) -> Result<Arc<Engine>, EngineError> {
        let on = if cfg.lab.backend == crate::slurm::BackendChoice::Slurm {
            RunOn::Slurm(Arc::new(crate::slurm::Slurm))
        } else {
            RunOn::Docker(exec)
        };
        Self::open_on(cfg, on, crate::clock::system())
    }

    /// The engine on `on`, reading time from `clock`.
    pub fn open_on(cfg: Config, on: RunOn, clock: Arc<dyn Clock>) -> Result<Arc<Engine>, EngineError> {
        prepare_state_dir(&cfg.paths)?;
        let lock = lock_state_dir(&cfg.paths.state_dir)?;
        let mut store = Store::open(&cfg.paths.db())?;
        store.set_clock(clock.clone());
        let queue = store.track_queue()?;
        let mut reader = Store::open(&cfg.paths.db())?;
        reader.set_clock(clock.clone());
        let db_uid = store
            .meta("db_uid")?
            .ok_or_else(|| EngineError::Fatal("the database has no db_uid".into()))?;
        // The engine id is kept in the database and, like the id high-water mark, in the logs dir: a
        // database that lost its WAL must still recognize (and report) its engine's containers.
        let id_file = cfg.paths.logs().join(ENGINE_ID_FILE);
        let kept = std::fs::read_to_string(&id_file)
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty());
        let engine_id = match (store.meta("engine_id")?, kept) {
            (Some(id), _) => id,
            (None, Some(id)) => {
                store.set_meta("engine_id", &id)?;
                id
            }
            (None, None) => {
                // Databases from before 0003 named their containers by a hash of the state dir: keep it so
                // running containers are found after the upgrade. New databases get a random id.
                let id = if store.job_id_high_water()? > 0 {
                    legacy_engine_id(&cfg.paths.state_dir)
                } else {
                    db_uid.clone()
                };
                store.set_meta("engine_id", &id)?;
                id
            }
        };
        std::fs::write(&id_file, format!("{engine_id}\n"))?;
        rename_legacy_logs(&cfg.paths.logs(), &db_uid);
        // Ids never restart: the high-water mark lives in the database AND in the logs dir. If the
        // database lost commits (a cut WAL), new ids continue after the highest id ever handed out.
        let mark_path = cfg.paths.logs().join(ID_MARK_FILE);
        let id_mark = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .mode(0o600)
            .open(&mark_path)?;
        let marked: i64 = std::fs::read_to_string(&mark_path)?.trim().parse().unwrap_or(0);
        let floor = marked.max(max_logged_job_id(&cfg.paths.logs()));
        let have = store.job_id_high_water()?;
        if floor > have {
            error!("the database knows job ids up to {have}, but ids up to {floor} were handed out: it lost commits (cut or lost WAL?). New jobs continue after {floor}");
            store.raise_job_ids_above(floor)?;
        }
        let crate::gpu::Opened {
            backend: mut gpu,
            note,
            library,
        } = crate::gpu::open(cfg.gpus.as_deref())?;
        let kind = gpu.kind();
        // `gpus` in the lab config can only be checked against the machine, so here, before anything runs.
        let usable = match &cfg.lab.gpus {
            Some(choice) => {
                // Devices, and the physical GPUs of MIG instances: `gpus = [0]` keeps GPU 0's instances.
                let mut inventory: Vec<(u32, String)> = vec![];
                for g in gpu.sample()? {
                    if let Some(p) = g.mig_parent.filter(|p| !inventory.iter().any(|i| i.0 == p.index)) {
                        inventory.push((p.index, p.uuid));
                    }
                    inventory.push((g.index, g.uuid));
                }
                let usable = choice.resolve(&inventory)?;
                let kept: Vec<u32> = inventory.iter().map(|g| g.0).filter(|i| !usable.contains(i)).collect();
                info!(
                    "Gantry uses GPUs {}; {} kept for interactive use (lab config `gpus`)",
                    gpu_list(&usable.iter().copied().collect::<Vec<_>>()),
                    gpu_list(&kept)
                );
                Some(usable)
            }
            None => None,
        };
        match (&kind, &note, &library) {
            (BackendKind::Simulated, Some(why), _) => warn!("SIMULATED GPUs: NVML not available ({why})"),
            (BackendKind::Simulated, None, _) => warn!("SIMULATED GPUs ({})", cfg.gpus.as_deref().unwrap_or("")),
            (_, _, Some(lib)) => warn!(
                "using NVML from {lib} ({}), not the driver's library",
                crate::gpu::NVML_LIB_ENV
            ),
            _ => info!("using NVML"),
        }
        let machine = crate::resources::Machine::read();
        let topology = crate::resources::Topology::read();
        let gpu_numa: HashMap<u32, u32> = gpu.numa_nodes().into_iter().collect();
        let cap = machine.for_jobs(&cfg.policy().containers);
        info!("{}", for_jobs_line(cap, machine.total));
        if let Some(m) = machine.memlock_max {
            warn!("containers may not lock unlimited memory on this host (no CAP_SYS_RESOURCE): jobs get memlock = {} at most", crate::units::format_bytes(m as u64));
        }
        let (events, _) = broadcast::channel(1024);
        let backend: Arc<dyn backend::Backend> = match on {
            RunOn::Docker(exec) => Arc::new(backend::docker::DockerBackend::new(exec)),
            RunOn::Slurm(client) => Arc::new(backend::slurm::SlurmBackend::new(client, cfg.lab.slurm.clone())),
        };
        let e = Arc::new(Engine {
            policy: RwLock::new(Arc::new(cfg.policy())),
            usable,
            cfg,
            engine_id,
            db_uid,
            store: Mutex::new(store),
            queue,
            reader: Mutex::new(reader),
            backend,
            clock,
            gpu: Mutex::new(gpu),
            backend_kind: kind,
            backend_note: note,
            backend_library: library,
            machine,
            topology,
            gpu_numa,
            latest: RwLock::new(vec![]),
            recent: Mutex::new(VecDeque::new()),
            idle_since: Mutex::new(HashMap::new()),
            waiting: RwLock::new(BTreeMap::new()),
            eta: RwLock::new(HashMap::new()),
            eta_at: std::sync::atomic::AtomicI64::new(0),
            last_pass: Mutex::new(None),
            last_gpus: RwLock::new(None),
            stats: Mutex::new(Stats::default()),
            running: Mutex::new(HashMap::new()),
            preempted_at: Mutex::new(HashMap::new()),
            claims: Mutex::new(BTreeMap::new()),
            learned_gpu_memory: Mutex::new(HashMap::new()),
            health: RwLock::new(Health::default()),
            id_mark: Mutex::new(id_mark),
            wake: Notify::new(),
            events,
            session_notices: broadcast::channel(64).0,
            shutdown: CancellationToken::new(),
            tasks: TaskTracker::new(),
            forwards: Mutex::new(HashMap::new()),
            book_cache: Mutex::new(bookings::BookCache::default()),
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

    /// Resolves once the engine stops (shutdown, or a fatal error).
    pub async fn stopped(&self) {
        self.shutdown.cancelled().await
    }

    /// The log file of a job: named by the database's id, so a new database never shows an old job's output.
    pub fn log_of(&self, job: i64) -> PathBuf {
        self.cfg.paths.logs().join(format!("{}-{job}.log", self.db_uid))
    }

    /// The container name of an attempt: unique across databases (db_uid) and attempts.
    pub fn container_name(&self, job: i64, attempt_n: u32) -> String {
        format!("gantry-{}-j{job}-a{attempt_n}", self.db_uid)
    }

    /// Where a root engine pins the checked mounts of its containers.
    fn staging(&self) -> crate::staging::Staging {
        crate::staging::Staging::in_state_dir(&self.cfg.paths.state_dir)
    }

    /// Unmount the pinned mounts of a container that is gone or will never start again.
    fn release_staging(&self, container_name: &str) {
        if let Err(e) = self.staging().release(container_name) {
            warn!("{e}");
        }
    }

    /// Unmount the pinned mounts of a container that has started (it holds its own copy of each).
    fn unpin_staging(&self, container_name: &str) {
        if let Err(e) = self.staging().unpin(container_name) {
            warn!("{e}");
        }
    }

    fn store(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn reader(&self) -> std::sync::MutexGuard<'_, Store> {
        self.reader.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The engine's "now" (ms since the epoch).
    fn now(&self) -> i64 {
        self.clock.now_ms()
    }

    /// Sleep until the engine's clock reads `at_ms`.
    async fn sleep_until_ms(&self, at_ms: i64) {
        tokio::time::sleep(std::time::Duration::from_millis((at_ms - self.now()).max(0) as u64)).await
    }

    fn notify_job(&self, job_id: i64, state: JobState) {
        let _ = self.events.send(EngineEvent::Job {
            job_id,
            state,
            at: self.now(),
        });
    }

    pub fn health(&self) -> Health {
        self.health.read().unwrap().clone()
    }

    /// Why the backend (Docker, Slurm) cannot be reached, when it cannot.
    pub fn backend_problem(&self) -> Option<String> {
        self.health.read().unwrap().backend_problem.clone()
    }

    /// A state write failed: stop starting work and say why (cleared by the next successful write).
    pub(crate) fn store_failed(&self, what: &str, e: &StoreError) {
        let msg = format!(
            "cannot write the state database ({what}: {e}); no job starts until it can — free disk space in {}",
            self.cfg.paths.state_dir.display()
        );
        let mut h = self.health.write().unwrap();
        if h.store_problem.as_deref() != Some(&msg) {
            error!("{msg}");
        }
        h.store_problem = Some(msg);
    }

    fn store_ok(&self) {
        if self.health.write().unwrap().store_problem.take().is_some() {
            info!("the state database is writable again");
            self.wake.notify_one();
        }
    }

    /// Run until shutdown: reconcile, then the sampler and a pass on every tick or wake-up (each
    /// start supervised by its own task). Returns an error when the engine cannot trust its state (it
    /// then stops loudly).
    pub async fn run(self: Arc<Self>) -> Result<(), EngineError> {
        let own = self.backend.start(&self).await;
        self.clone().recover().await?;
        // Open browser tabs keep their URLs: forwards listen again before the first pass.
        self.reopen_forwards().await;
        let sampler = tokio::spawn(self.clone().sampler_loop());
        let pruner = tokio::spawn(self.clone().prune_loop());
        let mut tick = tokio::time::interval(crate::config::PASS_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = self.shutdown.cancelled() => break,
                _ = self.wake.notified() => {},
                _ = tick.tick() => {},
            }
            let t0 = tokio::time::Instant::now();
            self.clone().pass().await;
            tracing::debug!(
                took_ms = t0.elapsed().as_secs_f64() * 1e3,
                queued = self.queue.lock().unwrap().len(),
                "pass"
            );
            // Coalesce bursts (hundreds of submits), and follow a long pass (a very deep queue) by an
            // equal pause so it never takes over the engine.
            tokio::time::sleep(t0.elapsed().max(crate::config::PASS_MIN_GAP)).await;
        }
        sampler.abort();
        pruner.abort();
        for t in own {
            t.abort();
        }
        // Supervisors see the shutdown and return, leaving what runs running.
        self.tasks.close();
        self.tasks.wait().await;
        info!("engine stopped; {}", self.backend.left_running());
        Ok(())
    }
}

fn legacy_engine_id(state_dir: &Path) -> String {
    use std::hash::{Hash, Hasher};
    let canon = std::fs::canonicalize(state_dir).unwrap_or_else(|_| state_dir.to_path_buf());
    let mut h = std::collections::hash_map::DefaultHasher::new();
    canon.hash(&mut h);
    format!("{:016x}", h.finish())
}

/// Logs from before 0003 are `<id>.log`: give them the database's prefix once.
fn rename_legacy_logs(logs: &Path, db_uid: &str) {
    let Ok(rd) = std::fs::read_dir(logs) else { return };
    for e in rd.flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        if let Some(id) = n.strip_suffix(".log").filter(|s| s.parse::<i64>().is_ok()) {
            let _ = std::fs::rename(e.path(), logs.join(format!("{db_uid}-{id}.log")));
        }
    }
}

pub(crate) fn gpu_list(g: &[u32]) -> String {
    if g.is_empty() {
        "no GPU".into()
    } else {
        format!("GPU {}", g.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(","))
    }
}

#[cfg(test)]
mod tests;
