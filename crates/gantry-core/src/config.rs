//! Engine configuration: where state lives and every tunable, with its default and the reason for it.

use std::path::{Path, PathBuf};
use std::time::Duration;

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
/// Fair-share usage and typical waits change slowly: refresh every 30 s.
pub const STATS_EVERY_MS: i64 = 30_000;
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
    pub stop_grace: Duration,
    pub log_cap: u64,
    pub retry_backoff: Duration,
    pub sample_every: Duration,
    pub fair_share_half_life: Duration,
    pub user_priority: (i32, i32),
    pub admin_priority: (i32, i32),
    pub max_queued_per_user: usize,
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

impl Config {
    pub fn new(paths: Paths) -> Self {
        Config {
            gpus: None,
            scheduler: crate::scheduler::Config::default(),
            stop_grace: STOP_GRACE,
            log_cap: LOG_CAP,
            retry_backoff: RETRY_BACKOFF,
            sample_every: SAMPLE_EVERY,
            fair_share_half_life: FAIR_SHARE_HALF_LIFE,
            user_priority: USER_PRIORITY,
            admin_priority: ADMIN_PRIORITY,
            max_queued_per_user: MAX_QUEUED_PER_USER,
            api: crate::api::Limits::default(),
            inbox_group: None,
            inbox_path: PathBuf::from(INBOX_PATH),
            templates_dir: paths.system_root.as_deref().map(|r| under(r, SYSTEM_TEMPLATES_DIR)),
            paths,
        }
    }

    /// The priority range a caller may use.
    pub fn priority_range(&self, caller_uid: u32) -> (i32, i32) {
        if caller_uid == 0 {
            self.admin_priority
        } else {
            self.user_priority
        }
    }
}
