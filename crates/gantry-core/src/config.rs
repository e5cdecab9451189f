//! Engine configuration: where state lives and every tunable, with its default and the reason for it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::policy::{LabConfig, Policy, PolicyError};

/// SIGTERM -> SIGKILL grace on cancel and timeout: long enough for a training loop to write a checkpoint.
pub const STOP_GRACE: Duration = Duration::from_secs(10);
/// Per-job log cap: a runaway `print` in a loop must not fill the disk the queue lives on.
pub const LOG_CAP: u64 = 64 << 20;
/// First retry delay; doubles per attempt, capped at [`RETRY_BACKOFF_MAX`].
pub const RETRY_BACKOFF: Duration = Duration::from_secs(10);
/// A failing job retries at most every 10 minutes, so it cannot churn through containers.
pub const RETRY_BACKOFF_MAX: Duration = Duration::from_secs(600);
/// GPU sampling period: NVML's utilization counters are averaged over ~1 s anyway.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// Fair share: a user's GPU-hours count half as much after a day (a day's burst is forgiven by tomorrow).
pub const FAIR_SHARE_HALF_LIFE: Duration = Duration::from_secs(24 * 3600);
/// A job that cannot start for this long reserves GPUs (no starvation).
pub const RESERVE_AFTER: Duration = Duration::from_secs(30 * 60);
/// Retention is enforced at start and then this often.
pub const PRUNE_EVERY: Duration = Duration::from_secs(3600);
/// Fair share looks back this many half-lives (older use has decayed below 1/32).
pub const FAIR_SHARE_REACH: i64 = 5;
/// Priorities a plain user may set: enough to order one's own work, too little to jump everyone.
pub const USER_PRIORITY: (i32, i32) = (-10, 10);
/// Root (the admin) may go further, still bounded so ordering stays meaningful.
pub const ADMIN_PRIORITY: (i32, i32) = (-1000, 1000);
/// Queued jobs per user: a week of a busy lab's work; a runaway script hits it long before the database hurts.
pub const MAX_QUEUED_PER_USER: usize = 2000;
/// Scheduling passes run at least this often (time-based events: backoff ends, timeouts, reservations).
pub const PASS_EVERY: Duration = Duration::from_secs(1);
/// ... and at most every 50 ms, so a burst of submits coalesces into few passes.
pub const PASS_MIN_GAP: Duration = Duration::from_millis(50);
/// A pass whose inputs (queue, running jobs, GPUs, health) have not changed plans again only after
/// this long: what the clock alone moves (reservations past `reserve_after`, backfill windows) is
/// measured in minutes, so 10 s is never noticed; at 100k queued it keeps an idle engine's planning
/// under 1% of a core. A retry's backoff ending triggers a pass on time.
pub const FULL_PASS_EVERY_MS: i64 = 10_000;
/// With nothing queued, other containers' GPUs are listed this often (only `gantry gpus` shows them;
/// the app re-reads holders every 5 s). With jobs queued, every pass lists them: placement needs them.
pub const FOREIGN_IDLE_EVERY_MS: i64 = 5_000;
/// Fair-share usage and typical waits change slowly: refresh every 30 s.
pub const STATS_EVERY_MS: i64 = 30_000;
/// The runtime estimator learns from this many most recent successful runs (each group keeps its
/// last `estimate::WINDOW`); reread with the other stats.
pub const HISTORY_RUNS: usize = 5000;
/// Start estimates replay the queue (quadratic): every 5 s at most, and only for up to this many jobs.
pub const ETA_EVERY_MS: i64 = 5_000;
pub const ETA_MAX_QUEUE: usize = 500;
/// When the database cannot be written, try again this often (nothing starts meanwhile).
pub const STORE_RETRY: Duration = Duration::from_secs(2);
/// When Docker is unreachable, retry waits and log streams this often.
pub const DOCKER_RETRY: Duration = Duration::from_secs(1);
/// A start that failed for a reason outside the job (Docker away) is retried after this long.
pub const TRANSIENT_RETRY_MS: i64 = 5_000;

/// The system engine's socket: a fixed place every user's CLI and app look for first.
pub const SYSTEM_SOCKET: &str = "/run/gantry/gantry.sock";
/// The system engine's state.
pub const SYSTEM_STATE_DIR: &str = "/var/lib/gantry";
/// Lab-wide template folders of the system engine (root-owned; users drop into `<inbox>/<name>/`).
pub const SYSTEM_TEMPLATES_DIR: &str = "/etc/gantry/templates";
/// Each user's drop folder under the system engine, relative to their home.
pub const INBOX_PATH: &str = "Gantry/inbox";
/// The system engine looks for new group members (and drop folders that went away) this often.
pub const USER_INBOX_RESCAN: Duration = Duration::from_secs(60);

/// Where an engine keeps its state, and where it listens.
#[derive(Debug, Clone)]
pub struct Paths {
    pub state_dir: PathBuf,
    pub inbox: PathBuf,
    socket: PathBuf,
    /// `Some(root)` for the system engine (`/` except in tests): it serves every user's drop folder.
    pub system_root: Option<PathBuf>,
}

impl Paths {
    /// A per-user (or `--state-dir`) engine: the socket lives in the state dir.
    pub fn in_dir(state_dir: PathBuf, inbox: PathBuf) -> Paths {
        Paths { socket: state_dir.join("gantry.sock"), state_dir, inbox, system_root: None }
    }
    /// The machine's engine (`gantry daemon --system`): state in `/var/lib/gantry`, socket in
    /// `/run/gantry`, both under `root` (`/` except in tests). `inbox` is root's own drop folder (the
    /// state dir's `inbox`); users drop into `~/<Config::inbox_path>`.
    pub fn system(root: &Path) -> Paths {
        let state_dir = under(root, SYSTEM_STATE_DIR);
        Paths { inbox: state_dir.join("inbox"), socket: under(root, SYSTEM_SOCKET), state_dir, system_root: Some(root.to_path_buf()) }
    }
    pub fn db(&self) -> PathBuf {
        self.state_dir.join("gantry.db")
    }
    pub fn socket(&self) -> PathBuf {
        self.socket.clone()
    }
    pub fn logs(&self) -> PathBuf {
        self.state_dir.join("logs")
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

/// `abs` (an absolute path) re-rooted at `root`.
pub fn under(root: &Path, abs: &str) -> PathBuf {
    root.join(abs.trim_start_matches('/'))
}

fn home() -> PathBuf {
    std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/tmp"))
}

#[derive(Debug, Clone)]
pub struct Config {
    pub paths: Paths,
    /// `sim:NxMEM` forces simulated GPUs.
    pub gpus: Option<String>,
    pub scheduler: crate::scheduler::Config,
    /// The lab config as read at start (built-in defaults without a file). The engine's live policy
    /// starts as `lab.policy` with `overrides` applied, and changes on reload.
    pub lab: LabConfig,
    /// The file re-read on reload (SIGHUP); `None`: a per-user engine without `--config`.
    pub lab_file: Option<PathBuf>,
    /// Whether a missing `lab_file` means the defaults (the system engine's) or an error.
    pub lab_file_optional: bool,
    /// Daemon flags: they win over the file, also after a reload.
    pub overrides: Overrides,
    pub sample_every: Duration,
    /// API connection limits and header-read timeout.
    pub api: crate::api::Limits,
    /// System engine: members of this group (primary or supplementary) get `~/<inbox_path>` made
    /// (as themselves) and watched; others run `gantry inbox init`.
    pub inbox_group: Option<String>,
    /// System engine: each user's drop folder, relative to their home.
    pub inbox_path: PathBuf,
    /// Lab-wide template folders (`<dir>/<name>/gantry.toml`, owned by root), used by dropping into
    /// `<inbox>/<name>/`. The system engine's default is `/etc/gantry/templates`; `None` for others.
    pub templates_dir: Option<PathBuf>,
}

/// Settings given as daemon flags (`--stop-grace`, ...), which win over the lab config.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub stop_grace: Option<Duration>,
    pub retry_backoff: Option<Duration>,
    pub reserve_after: Option<Duration>,
}

impl Overrides {
    pub fn apply(&self, mut p: Policy) -> Policy {
        p.stop_grace = self.stop_grace.unwrap_or(p.stop_grace);
        p.retry_backoff = self.retry_backoff.unwrap_or(p.retry_backoff);
        p.reserve_after = self.reserve_after.unwrap_or(p.reserve_after);
        p
    }
}

impl Config {
    pub fn new(paths: Paths) -> Self {
        Config {
            gpus: None,
            scheduler: crate::scheduler::Config::default(),
            lab: LabConfig::default(),
            lab_file: None,
            lab_file_optional: false,
            overrides: Overrides::default(),
            sample_every: SAMPLE_EVERY,
            api: crate::api::Limits::default(),
            inbox_group: None,
            inbox_path: PathBuf::from(INBOX_PATH),
            templates_dir: paths.system_root.as_deref().map(|r| under(r, SYSTEM_TEMPLATES_DIR)),
            paths,
        }
    }

    /// Read the lab config `file` (see [`LabConfig::load`]); its settings apply where no daemon flag
    /// (`--gpus`, `--stop-grace`, ...) was given.
    pub fn load_lab(&mut self, file: PathBuf, missing_ok: bool) -> Result<(), PolicyError> {
        let lab = LabConfig::load(&file, missing_ok)?;
        if self.gpus.is_none() {
            self.gpus = lab.simulate.clone();
        }
        if let Some(g) = &lab.inbox_group {
            self.inbox_group = Some(g.clone());
        }
        if let Some(p) = &lab.inbox_path {
            self.inbox_path = p.clone();
        }
        if let Some(t) = &lab.templates_dir {
            self.templates_dir = Some(t.clone());
        }
        self.lab = lab;
        self.lab_file = Some(file);
        self.lab_file_optional = missing_ok;
        Ok(())
    }

    /// The policy the engine starts with.
    pub fn policy(&self) -> Policy {
        self.overrides.apply(self.lab.policy.clone())
    }
}

// Container defaults for deep learning ([containers] in the lab config).
/// `/dev/shm` of a job without a memory limit (with one: half of it). Docker's own 64 MiB kills
/// PyTorch DataLoader workers.
pub const SHM_WITHOUT_MEMORY_LIMIT: u64 = 8 << 30;
/// Thread stack limit: NVIDIA's recommended `--ulimit stack=67108864` for PyTorch/NCCL containers.
pub const STACK_LIMIT: i64 = 64 << 20;
/// CPU (thousandths) and RAM kept for the OS, Docker and the engine: jobs share the rest.
pub const RESERVE_CPUS_MILLI: u64 = 1000;
pub const RESERVE_MEMORY: u64 = 2 << 30;
