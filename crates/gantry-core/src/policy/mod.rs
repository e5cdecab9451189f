//! The lab policy: `/etc/gantry/config.toml` for the system engine, `daemon --config FILE` (or
//! `GANTRY_CONFIG`) for any other. Every key is optional; the defaults are the constants in
//! [`crate::config`]. The file is checked before the engine starts, and again on every reload
//! (SIGHUP): each problem names the file, line and column, and how to fix it. A reload that fails
//! keeps the policy in force.

use std::collections::BTreeSet;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::defaults as config;

use crate::units::duration_setting as human;

mod disk;
mod images;
mod parse;
pub use disk::{layer_bound, low_disk, Disk, MinFree, Writer};
pub use images::{is_local_registry, registry_of, Images};
pub use parse::*;

pub use crate::notify::check::EmailTo;

/// The system engine's lab config.
pub const SYSTEM_CONFIG: &str = "/etc/gantry/config.toml";
/// A lab config is a page of settings; anything this large is not one.
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Whether users see other users' specs (command, env, mounts) and output, or only their queue rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SeeOthers {
    Queue,
    All,
}

/// A GPU named in `gpus`: its index or its UUID (UUIDs survive a reordering of the cards).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuRef {
    Index(u32),
    Uuid(String),
}

impl fmt::Display for GpuRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuRef::Index(i) => write!(f, "{i}"),
            GpuRef::Uuid(u) => write!(f, "{u:?}"),
        }
    }
}

/// The settings that apply live (a reload changes them at once).
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub admins: Vec<String>,
    pub admin_group: Option<String>,
    pub see_others: SeeOthers,
    pub user_priority: (i32, i32),
    pub admin_priority: (i32, i32),
    pub max_queued_per_user: usize,
    /// GPUs one user's running jobs may hold together (`None`: no limit).
    pub max_running_gpus: Option<u32>,
    /// Given to jobs that set no `timeout`.
    pub default_timeout: Option<Duration>,
    pub max_timeout: Option<Duration>,
    /// How far ahead a job's `begin` may be (`[limits] max_begin`).
    pub max_begin: Duration,
    pub fair_share_half_life: Duration,
    pub stop_grace: Duration,
    pub retry_backoff: Duration,
    pub reserve_after: Duration,
    /// A job past its declared runtime by this much (or a tenth of it) broke its promise (`[jobs] overrun_margin`).
    pub overrun_margin: Duration,
    /// `[preemption]`: off unless `enabled`.
    pub preemption: Preemption,
    pub log_cap: u64,
    /// Log files of jobs that ended longer ago are deleted (`None`: kept).
    pub log_keep: Option<Duration>,
    /// Log streams (`gantry logs`, `logs -f`, the app's log views) one uid may have open at once.
    pub log_streams_per_user: usize,
    /// Folders of one user's drop folder the engine watches (inotify); past it, they are scanned.
    pub inbox_watches_per_user: usize,
    /// Finished jobs that ended longer ago are deleted from history (`None`: kept).
    pub history_keep: Option<Duration>,
    /// `[containers]`: shm, ulimits, IPC, HOME, and each job's CPU and RAM.
    pub containers: crate::resources::Containers,
    /// `[images]`: the registries allowed, the pull timeout.
    pub images: Images,
    /// `[disk]`: free space Docker's disk keeps, each job's writable layer.
    pub disk: Disk,
    /// A job on a shared GPU using more than its `gpu_memory` by this many percent is warned ...
    pub gpu_memory_margin_pct: f64,
    /// ... and stopped once it has stayed over this long.
    pub gpu_memory_grace: Duration,
    /// `[sessions]`: interactive sessions (`gantry shell`).
    pub sessions: Sessions,
    /// `[bookings]`: GPU bookings (`gantry book`).
    pub bookings: Bookings,
    /// `[results]`: bounds on each job's metrics (points per series, series, name length, bytes read).
    pub results: crate::store::ResultsLimits,
    /// Resolved when the file is read: the uids of `admins` and of `admin_group`'s listed members,
    /// and the group's gid (users whose primary group it is are admins too).
    admin_uids: BTreeSet<u32>,
    admin_gid: Option<u32>,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            admins: vec!["root".into()],
            admin_group: None,
            see_others: SeeOthers::Queue,
            user_priority: config::USER_PRIORITY,
            admin_priority: config::ADMIN_PRIORITY,
            max_queued_per_user: config::MAX_QUEUED_PER_USER,
            max_running_gpus: None,
            default_timeout: None,
            max_timeout: None,
            max_begin: config::MAX_BEGIN,
            fair_share_half_life: config::FAIR_SHARE_HALF_LIFE,
            stop_grace: config::STOP_GRACE,
            retry_backoff: config::RETRY_BACKOFF,
            reserve_after: config::RESERVE_AFTER,
            overrun_margin: config::OVERRUN_MARGIN,
            preemption: Preemption::default(),
            log_cap: config::LOG_CAP,
            log_keep: None,
            log_streams_per_user: config::LOG_STREAMS_PER_USER,
            inbox_watches_per_user: config::INBOX_WATCHES_PER_USER,
            history_keep: None,
            containers: Default::default(),
            images: Default::default(),
            disk: Default::default(),
            gpu_memory_margin_pct: config::GPU_MEMORY_MARGIN_PCT,
            gpu_memory_grace: config::GPU_MEMORY_GRACE,
            sessions: Sessions::default(),
            bookings: Bookings::default(),
            results: Default::default(),
            admin_uids: BTreeSet::new(),
            admin_gid: None,
        }
    }
}

impl Policy {
    /// root, the listed admins and the members of `admin_group`. Admins get the admin priority range
    /// and may act on (and read) other users' jobs; never root's file access.
    pub fn is_admin(&self, uid: u32) -> bool {
        uid == 0
            || self.admin_uids.contains(&uid)
            || self.admin_gid.is_some_and(|g| {
                nix::unistd::User::from_uid(uid.into())
                    .ok()
                    .flatten()
                    .is_some_and(|u| u.gid.as_raw() == g)
            })
    }

    /// The priority range a caller may use.
    pub fn priority_range(&self, uid: u32) -> (i32, i32) {
        if self.is_admin(uid) {
            self.admin_priority
        } else {
            self.user_priority
        }
    }

    /// The one place that decides whether `caller` may see the private parts of a job owned by
    /// `owner`: its spec (command, env, mounts, workdir), its free-text messages and its output.
    pub fn may_see_private(&self, caller: u32, owner: u32) -> bool {
        caller == owner || self.sees_everyones(caller)
    }

    /// Whether `caller` may see every user's private parts (admins; everyone with `see_others = "all"`).
    pub fn sees_everyones(&self, caller: u32) -> bool {
        self.see_others == SeeOthers::All || self.is_admin(caller)
    }

    /// Each setting as `key = value`, for the reload log.
    fn entries(&self) -> Vec<(&'static str, String)> {
        let d = |d: Option<Duration>| d.map(human).unwrap_or_else(|| "none".into());
        let r = |(lo, hi): (i32, i32)| format!("[{lo}, {hi}]");
        let mut v = vec![
            ("access.admins", format!("{:?}", self.admins)),
            ("access.admin_group", format!("{:?}", self.admin_group)),
            ("access.see_others", format!("{:?}", self.see_others).to_lowercase()),
            ("limits.priority", r(self.user_priority)),
            ("limits.admin_priority", r(self.admin_priority)),
            ("limits.max_queued_jobs", self.max_queued_per_user.to_string()),
            (
                "limits.max_running_gpus",
                self.max_running_gpus
                    .map(|n| n.to_string())
                    .unwrap_or_else(|| "none".into()),
            ),
            ("limits.default_timeout", d(self.default_timeout)),
            ("limits.max_timeout", d(self.max_timeout)),
            ("limits.max_begin", d(Some(self.max_begin))),
            ("fair_share.half_life", d(Some(self.fair_share_half_life))),
            ("jobs.stop_grace", d(Some(self.stop_grace))),
            ("jobs.retry_backoff", d(Some(self.retry_backoff))),
            ("jobs.reserve_after", d(Some(self.reserve_after))),
            ("jobs.overrun_margin", d(Some(self.overrun_margin))),
            ("preemption.enabled", self.preemption.enabled.to_string()),
            (
                "preemption.default_preemptible",
                self.preemption.default_preemptible.to_string(),
            ),
            ("preemption.reserve_after", self.preemption.rules.overdue.to_string()),
            (
                "preemption.priority_gap",
                self.preemption
                    .rules
                    .priority_gap
                    .map_or("0 (off)".into(), |g| g.to_string()),
            ),
            ("preemption.fair_share", self.preemption.rules.fair_share.to_string()),
            (
                "preemption.min_run",
                d(Some(Duration::from_millis(self.preemption.rules.min_run_ms as u64))),
            ),
            ("preemption.max_per_day", self.preemption.rules.max_per_day.to_string()),
            ("jobs.gpu_memory_margin", format!("{}%", self.gpu_memory_margin_pct)),
            ("jobs.gpu_memory_grace", d(Some(self.gpu_memory_grace))),
            ("logs.cap", crate::units::format_bytes(self.log_cap)),
            ("logs.keep", d(self.log_keep)),
            ("logs.streams_per_user", self.log_streams_per_user.to_string()),
            ("inbox.max_watches", self.inbox_watches_per_user.to_string()),
            ("history.keep", d(self.history_keep)),
            (
                "images.allow",
                self.images
                    .allow
                    .as_ref()
                    .map(|a| format!("{a:?}"))
                    .unwrap_or_else(|| "any (no local registry)".into()),
            ),
            ("images.pull_timeout", d(Some(self.images.pull_timeout))),
            ("disk.min_free", self.disk.min_free.show()),
            (
                "disk.layer_size",
                self.disk
                    .layer_size
                    .map(crate::units::format_bytes)
                    .unwrap_or_else(|| "none".into()),
            ),
            (
                "admin uids",
                format!("{:?} (group gid {:?})", self.admin_uids, self.admin_gid),
            ),
        ];
        v.extend(self.containers.entries());
        let s = &self.sessions;
        v.extend([
            (
                "sessions.max_gpus",
                s.max_gpus.map(|n| n.to_string()).unwrap_or_else(|| "none".into()),
            ),
            ("sessions.default_length", d(Some(s.default_length))),
            ("sessions.max_length", d(Some(s.max_length))),
            ("sessions.before_batch", s.before_batch.to_string()),
            ("sessions.notebook_image", format!("{:?}", s.notebook_image)),
            ("sessions.idle_after", d(s.idle_after)),
            ("sessions.idle_batch", s.idle_batch.to_string()),
            ("sessions.keep_free", s.keep_free.to_string()),
            ("sessions.forward_port", s.forward_port.to_string()),
        ]);
        let b = &self.bookings;
        let none = |n: Option<u32>| n.map(|n| n.to_string()).unwrap_or_else(|| "none".into());
        v.extend([
            ("bookings.enabled", b.enabled.to_string()),
            ("bookings.max_gpu_hours_per_week", none(b.max_gpu_hours_per_week)),
            ("bookings.max_ahead", d(Some(b.max_ahead))),
            ("bookings.max_length", d(Some(b.max_length))),
            ("bookings.slot", d(Some(b.slot))),
            ("bookings.release_after", d(Some(b.release_after))),
            ("bookings.max_gpus", none(b.max_gpus)),
        ]);
        v
    }

    /// What differs from `old`, as `key: old -> new` lines.
    pub fn changes_from(&self, old: &Policy) -> Vec<String> {
        old.entries()
            .into_iter()
            .zip(self.entries())
            .filter(|(a, b)| a.1 != b.1)
            .map(|(a, b)| format!("{}: {} -> {}", a.0, a.1, b.1))
            .collect()
    }
}

/// `[sessions]`: what interactive sessions (`gantry shell`) may hold, and for how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sessions {
    /// GPUs one user's sessions (queued and running together) may ask for; `None` (`max_gpus = 0`
    /// in the lab config): no limit beyond `[limits] max_running_gpus`.
    pub max_gpus: Option<u32>,
    /// A session's length when `gantry shell` has no `--for` (its `timeout`).
    pub default_length: Duration,
    /// The longest a session may be.
    pub max_length: Duration,
    /// Sessions are placed before batch jobs, whatever their priorities (someone is waiting at a
    /// terminal); `false`: by priority and fair share like any job.
    pub before_batch: bool,
    /// The image `gantry notebook` runs without `--image` (one with `jupyter lab` in it).
    pub notebook_image: Option<String>,
    /// A running session whose GPUs have all been at 0 % utilization this long is warned, then
    /// ended a quarter of that later unless they were used meanwhile; `None` ("none"): never.
    pub idle_after: Option<Duration>,
    /// Batch jobs are given back when idle too.
    pub idle_batch: bool,
    /// GPUs kept free of batch jobs for sessions: a batch job may not take the last `keep_free`
    /// free GPUs; a session may (see [`crate::scheduler::keep_free`]).
    pub keep_free: u32,
    /// The port (below 1024: only root binds it) of `gantry open` forwards, each on a loopback
    /// address of its own; see [`crate::engine::ports`].
    pub forward_port: u16,
}

impl Default for Sessions {
    fn default() -> Self {
        Sessions {
            max_gpus: Some(config::SESSION_MAX_GPUS),
            default_length: config::SESSION_LENGTH,
            max_length: config::SESSION_MAX_LENGTH,
            before_batch: true,
            notebook_image: None,
            idle_after: Some(config::SESSION_IDLE_AFTER),
            idle_batch: false,
            keep_free: 0,
            forward_port: config::FORWARD_PORT,
        }
    }
}

/// `[bookings]`: GPU bookings (`gantry book`).
#[derive(Debug, Clone, PartialEq)]
pub struct Bookings {
    pub enabled: bool,
    /// GPU-hours one user may book in a week (Monday 00:00 UTC to the next, by start); `None`: no
    /// limit (only where the lab config says `max_gpu_hours_per_week = 0`).
    pub max_gpu_hours_per_week: Option<u32>,
    /// How far ahead a booking may start.
    pub max_ahead: Duration,
    /// The longest a booking may be.
    pub max_length: Duration,
    /// Starts and lengths are multiples of this (from midnight UTC): whole minutes dividing a day.
    pub slot: Duration,
    /// A booking none of its owner's jobs or sessions used this long after its start is released.
    pub release_after: Duration,
    /// The most GPUs one booking may hold (`None`: the machine's count).
    pub max_gpus: Option<u32>,
}

impl Default for Bookings {
    fn default() -> Self {
        Bookings {
            enabled: true,
            max_gpu_hours_per_week: Some(config::BOOKING_MAX_GPU_HOURS_PER_WEEK),
            max_ahead: config::BOOKING_MAX_AHEAD,
            max_length: config::BOOKING_MAX_LENGTH,
            slot: config::BOOKING_SLOT,
            release_after: config::BOOKING_RELEASE_AFTER,
            max_gpus: None,
        }
    }
}

/// `[preemption]`: whether Gantry may stop preemptible jobs for others, by which rules, and whether
/// jobs are preemptible unless their spec says.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Preemption {
    pub enabled: bool,
    /// A spec without `preemptible` is preemptible.
    pub default_preemptible: bool,
    pub rules: crate::scheduler::PreemptRules,
}

impl Preemption {
    /// The scheduler's rules, `None` when preemption is off.
    pub fn rules(&self) -> Option<crate::scheduler::PreemptRules> {
        self.enabled.then(|| self.rules.clone())
    }
    /// Whether a job with this spec may be preempted.
    pub fn preemptible(&self, spec: &crate::spec::JobSpec) -> bool {
        // Someone is at a session's terminal: never preempted, whatever its spec says.
        !spec.interactive && spec.preemptible.unwrap_or(self.default_preemptible)
    }
}

/// `gpus = [...]`: the GPUs Gantry may use, checked against the machine when the engine starts.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuChoice {
    pub gpus: Vec<GpuRef>,
    file: PathBuf,
    line: usize,
    column: usize,
}

impl GpuChoice {
    /// The indexes of the chosen GPUs on this machine, or where the file names a GPU it lacks.
    pub fn resolve(&self, inventory: &[(u32, String)]) -> Result<BTreeSet<u32>, PolicyError> {
        let have = || {
            inventory
                .iter()
                .map(|(i, u)| format!("{i} ({u})"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut out = BTreeSet::new();
        for g in &self.gpus {
            let found = inventory.iter().find(|(i, u)| match g {
                GpuRef::Index(n) => i == n,
                GpuRef::Uuid(s) => u.eq_ignore_ascii_case(s),
            });
            match found {
                Some((i, _)) => out.insert(*i),
                None => {
                    return Err(PolicyError::at(
                        &self.file,
                        self.line,
                        self.column,
                        format!("`gpus` names GPU {g}, which this machine does not have"),
                        format!(
                            "use indexes or UUIDs of this machine's GPUs: {}; or write gpus = \"all\"",
                            have()
                        ),
                    ))
                }
            };
        }
        Ok(out)
    }
}

/// Everything a lab config says: the live [`Policy`] and the settings that need a restart.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LabConfig {
    /// The file read (`None`: built-in defaults).
    pub file: Option<PathBuf>,
    pub policy: Policy,
    /// `None`: every GPU.
    pub gpus: Option<GpuChoice>,
    pub simulate: Option<String>,
    pub inbox_group: Option<String>,
    pub inbox_path: Option<PathBuf>,
    pub templates_dir: Option<PathBuf>,
    /// `backend`: Docker on this machine (default) or Slurm.
    pub backend: crate::slurm::BackendChoice,
    /// `[slurm]`: used when `backend = "slurm"`.
    pub slurm: crate::slurm::Settings,
    /// `[notify]`: email relay, allowed webhook hosts, the lab's own webhooks, delivery bounds.
    pub notify: NotifySettings,
    /// `[metrics]`: the Prometheus endpoint (off unless `listen` is set).
    pub metrics: MetricsSettings,
}

/// `[notify]` of the lab config (read at start; a reload warns "restart to apply").
#[derive(Debug, Clone, PartialEq)]
pub struct NotifySettings {
    /// The SMTP relay for `gantry notify add email` (`None`: email is refused at `notify add`).
    pub smtp: Option<SmtpSettings>,
    /// Hosts users' webhooks may go to: `name`, `*.domain`, an IP address, each optionally with
    /// `:port`. Loopback and link-local addresses only where the address itself (or `localhost`) is listed.
    pub webhook_hosts: Vec<String>,
    /// The lab's own webhooks (every job's listed events, and store problems), public fields only.
    pub webhooks: Vec<(String, Vec<crate::protocol::notify::NotifyEvent>)>,
    /// A delivery is tried this many times, then given up (shown failed in `gantry notify log`).
    pub max_tries: u32,
    /// The wait after the first failed try, doubled after each (at most [`config::NOTIFY_BACKOFF_MAX`]).
    pub retry_backoff: Duration,
    /// A user's notifications waiting to be sent at once; more are dropped (logged as dropped).
    pub max_pending: usize,
    /// Targets (`gantry notify add`) per user.
    pub max_targets: usize,
    /// `gantry notify test` calls per user per hour.
    pub max_tests_per_hour: usize,
    /// Domains email targets may be at (`None`: the domain of `smtp_from`).
    pub email_domains: Option<Vec<String>>,
    /// Which addresses at those domains a user may add: only their own (`<login name>@domain`,
    /// the default) or any.
    pub email_to: EmailTo,
}

impl Default for NotifySettings {
    fn default() -> Self {
        NotifySettings {
            smtp: None,
            webhook_hosts: vec![],
            webhooks: vec![],
            max_tries: config::NOTIFY_MAX_TRIES,
            retry_backoff: config::NOTIFY_BACKOFF,
            max_pending: config::NOTIFY_MAX_PENDING,
            max_targets: config::NOTIFY_MAX_TARGETS,
            max_tests_per_hour: config::NOTIFY_MAX_TESTS_PER_HOUR,
            email_domains: None,
            email_to: EmailTo::Own,
        }
    }
}

/// The SMTP relay (`smtp_*` keys of `[notify]`).
#[derive(Debug, Clone, PartialEq)]
pub struct SmtpSettings {
    pub host: String,
    pub port: u16,
    /// Upgrade the connection with STARTTLS (refuse to send without it).
    pub starttls: bool,
    pub from: String,
    /// `USER:PASSWORD` on its first line; must be owned by the engine's user and unreadable by
    /// anyone else (checked when the engine starts).
    pub credentials: Option<PathBuf>,
}

/// `[metrics]` of the lab config.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricsSettings {
    /// Where `/metrics` is served (`None`: off).
    pub listen: Option<std::net::SocketAddr>,
    /// Let `listen` be a non-loopback address (anyone who can reach it sees GPU use per user).
    pub allow_remote: bool,
    /// Scrape connections open at once; more are closed as they come.
    pub max_connections: usize,
    /// A connection without a whole request head this long (after it opened or its last answer) is closed.
    pub idle_timeout: Duration,
}

impl Default for MetricsSettings {
    fn default() -> Self {
        MetricsSettings {
            listen: None,
            allow_remote: false,
            max_connections: config::METRICS_MAX_CONNECTIONS,
            idle_timeout: config::METRICS_IDLE_TIMEOUT,
        }
    }
}
#[cfg(test)]
mod tests;
