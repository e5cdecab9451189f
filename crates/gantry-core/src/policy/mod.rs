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
mod tests {
    use super::*;
    use std::path::Path;

    fn parse(t: &str) -> Result<LabConfig, PolicyError> {
        LabConfig::parse(t, Path::new("/etc/gantry/config.toml"))
    }
    fn err(t: &str) -> String {
        parse(t).unwrap_err().to_string()
    }

    #[test]
    fn the_documented_example_parses_and_an_empty_file_is_the_defaults() {
        let full = r#"
gpus = [0, 1, "GPU-5160a7ed-0000-4000-8000-000000000002"]
[access]
admins = ["root"]
admin_group = "root"
see_others = "all"
[limits]
priority = [-5, 5]
admin_priority = [-100, 100]
max_queued_jobs = 10
max_running_gpus = 4
default_timeout = "7d"
max_timeout = "30d"
[fair_share]
half_life = "12h"
[jobs]
stop_grace = "20s"
retry_backoff = "5s"
reserve_after = "1h"
[logs]
cap = "1GiB"
keep = "90d"
streams_per_user = 4
[history]
keep = "365d"
[inbox]
group = "gantry"
path = "Gantry/inbox"
templates = "/etc/gantry/templates"
max_watches = 32
"#;
        let c = parse(full).unwrap();
        let p = &c.policy;
        assert_eq!(
            (
                p.user_priority,
                p.admin_priority,
                p.max_queued_per_user,
                p.max_running_gpus
            ),
            ((-5, 5), (-100, 100), 10, Some(4))
        );
        assert_eq!(p.default_timeout, Some(Duration::from_secs(7 * 86400)));
        assert_eq!(
            (p.log_cap, p.see_others, p.admin_gid),
            (1 << 30, SeeOthers::All, Some(0))
        );
        assert_eq!(p.log_keep, Some(Duration::from_secs(90 * 86400)));
        assert_eq!((p.log_streams_per_user, p.inbox_watches_per_user), (4, 32));
        assert_eq!(c.gpus.as_ref().unwrap().gpus.len(), 3);
        assert_eq!(
            (c.inbox_path.as_deref(), c.inbox_group.as_deref()),
            (Some(Path::new("Gantry/inbox")), Some("gantry"))
        );
        let d = parse("").unwrap();
        assert_eq!(d.policy, Policy::default());
        assert_eq!(d.gpus, None);
        assert_eq!(parse("gpus = \"all\"\n").unwrap().gpus, None);
    }

    #[test]
    fn problems_name_the_file_line_and_column_and_how_to_fix() {
        let cases: &[(&str, &str)] = &[
            (
                "[limits]\nmax_queud_jobs = 3\n",
                "config.toml:2:1: unknown field `max_queud_jobs`",
            ),
            (
                "[limits]\npriority = [10, -10]\n",
                "config.toml:2:12: `priority` = [10, -10]: the lowest value is above the highest; swap them: [-10, 10]",
            ),
            (
                "[limits]\ndefault_timeout = \"40d\"\nmax_timeout = \"30d\"\n",
                "config.toml:2:19: `default_timeout` (40d) is longer than `max_timeout` (30d)",
            ),
            (
                "[access]\nadmins = [\"root\", \"nosuchuser-x\"]\n",
                "config.toml:2:19: `admins` names \"nosuchuser-x\", which is not a user",
            ),
            (
                "[access]\nadmin_group = \"nosuchgroup-x\"\n",
                "config.toml:2:15: `admin_group` = \"nosuchgroup-x\" is not a group",
            ),
            (
                "[access]\nsee_others = \"some\"\n",
                "`see_others` = \"some\" is not a choice",
            ),
            (
                "[logs]\ncap = \"lots\"\n",
                "config.toml:2:7: `cap` = \"lots\" is not a size",
            ),
            (
                "[jobs]\nstop_grace = \"soon\"\n",
                "`stop_grace` = \"soon\" is not a duration",
            ),
            ("gpus = [0, 0]\n", "GPU 0 twice"),
            ("gpus = \"some\"\n", "config.toml:1:8: `gpus` = \"some\" is not \"all\""),
            (
                "[limits]\nmax_running_gpus = 0\n",
                "`max_running_gpus` = 0 is out of range",
            ),
            (
                "[limits]\nmax_queued_jobs = \"many\"\n",
                "config.toml:2:19: invalid type: string \"many\", expected i64",
            ),
            ("[inbox]\npath = \"../x\"\n", "not a plain path"),
            (
                "[logs]\nstreams_per_user = 0\n",
                "config.toml:2:20: `streams_per_user` = 0 is out of range; use a number from 1 to 1024",
            ),
            (
                "[inbox]\nmax_watches = 1000000\n",
                "config.toml:2:15: `max_watches` = 1000000 is out of range; use a number from 1 to 65536",
            ),
            ("simulate = \"sim:lots\"\n", "invalid simulated GPU spec"),
        ];
        for (text, want) in cases {
            let e = err(text);
            assert!(e.contains(want), "{text:?}\n  got:  {e}\n  want: {want}");
        }
        // Every problem is reported, not just the first.
        let e = parse("[limits]\npriority = [1, 0]\nadmin_priority = [1, 0]\n").unwrap_err();
        assert_eq!(e.problems.iter().map(|p| p.line).collect::<Vec<_>>(), vec![2, 3]);
    }

    #[test]
    fn containers_table_parses_and_explains_its_mistakes() {
        use crate::resources::{Amount, Containers};
        let c = parse("[containers]\nshm_size = \"16GiB\"\nmemlock = \"unlimited\"\nstack = \"32MiB\"\nallow_ipc_host = true\nhome = \"mount\"\ncpus_per_gpu = 8\nmemory_per_gpu = \"64GiB\"\ncpu_only_cpus = 0.5\ncpu_only_memory = \"none\"\nreserve_cpus = 2\nreserve_memory = \"4GiB\"\npids_limit = 1024\nhost_image = false\n").unwrap().policy.containers;
        assert_eq!(
            c,
            Containers {
                shm_size: Some(16 << 30),
                memlock: -1,
                stack: 32 << 20,
                allow_ipc_host: true,
                home: crate::spec::Home::Mount,
                cpus_per_gpu: Amount::Is(8000),
                memory_per_gpu: Amount::Is(64 << 30),
                cpu_only_cpus: Amount::Is(500),
                cpu_only_memory: Amount::Unlimited,
                reserve_cpus_milli: 2000,
                reserve_memory: 4 << 30,
                pids_limit: 1024,
                host_image: false,
            }
        );
        assert_eq!(
            parse("[containers]\nshm_size = \"auto\"\ncpus_per_gpu = \"auto\"\n")
                .unwrap()
                .policy
                .containers,
            Containers::default()
        );
        let cases: &[(&str, &str)] = &[
            ("[containers]\nshm = \"1GiB\"\n", "config.toml:2:1: unknown field `shm`"),
            (
                "[containers]\nshm_size = \"lots\"\n",
                "config.toml:2:12: `shm_size` = \"lots\" is not \"auto\" or a size",
            ),
            (
                "[containers]\nmemlock = \"-1\"\n",
                "`memlock` = \"-1\" is not \"unlimited\" or a size",
            ),
            (
                "[containers]\nhome = \"nfs\"\n",
                "`home` = \"nfs\" is not a choice; write \"tmpfs\"",
            ),
            (
                "[containers]\ncpus_per_gpu = 0\n",
                "config.toml:2:16: `cpus_per_gpu` = 0 is not a number of CPUs from 0.01 to 1024",
            ),
            ("[containers]\ncpus_per_gpu = \"many\"\n", "is not a number of CPUs"),
            (
                "[containers]\nmemory_per_gpu = \"1KiB\"\n",
                "`memory_per_gpu` = \"1KiB\" is not a size of at least 6 MiB",
            ),
            (
                "[containers]\nreserve_cpus = \"auto\"\n",
                "`reserve_cpus` = \"auto\" is not a number of CPUs from 0 to 1024",
            ),
            (
                "[containers]\nallow_ipc_host = \"yes\"\n",
                "config.toml:2:18: invalid type: string \"yes\", expected a boolean",
            ),
            (
                "[containers]\npids_limit = 8\n",
                "config.toml:2:14: `pids_limit` = 8 is not a number of processes from 16 to 4194304",
            ),
            (
                "[containers]\npids_limit = \"many\"\n",
                "config.toml:2:14: invalid type: string \"many\", expected i64",
            ),
        ];
        for (text, want) in cases {
            let e = err(text);
            assert!(e.contains(want), "{text:?}\n  got:  {e}\n  want: {want}");
        }
        let changed = parse("[containers]\nallow_ipc_host = true\n")
            .unwrap()
            .policy
            .changes_from(&Policy::default());
        assert_eq!(changed, vec!["containers.allow_ipc_host: false -> true"]);
    }

    #[test]
    fn images_table_parses_and_explains_its_mistakes() {
        let i = parse("[images]\nallow = [\"registry.lab.example/*\", \"pytorch/*\"]\npull_timeout = \"10m\"\n")
            .unwrap()
            .policy
            .images;
        assert_eq!(
            i,
            Images {
                allow: Some(vec!["registry.lab.example/*".into(), "pytorch/*".into()]),
                pull_timeout: Duration::from_secs(600)
            }
        );
        assert_eq!(parse("").unwrap().policy.images, Images::default());
        let cases: &[(&str, &str)] = &[
            (
                "[images]\nallow = [\"https://r.example/*\"]\n",
                "config.toml:2:10: images `allow` lists \"https://r.example/*\", which is not an image pattern",
            ),
            (
                "[images]\nallow = [\"a b\"]\n",
                "is not an image pattern; write an image name with `*`",
            ),
            (
                "[images]\nallow = \"pytorch/*\"\n",
                "config.toml:2:9: invalid type: string \"pytorch/*\", expected a sequence",
            ),
            (
                "[images]\npull_timeout = \"2d\"\n",
                "`pull_timeout` = \"2d\" is longer than 1d; use at most \"1d\"",
            ),
            ("[images]\npull = \"1m\"\n", "config.toml:2:1: unknown field `pull`"),
        ];
        for (text, want) in cases {
            let e = err(text);
            assert!(e.contains(want), "{text:?}\n  got:  {e}\n  want: {want}");
        }
        let changed = parse("[images]\npull_timeout = \"1h\"\n")
            .unwrap()
            .policy
            .changes_from(&Policy::default());
        assert_eq!(changed, vec!["images.pull_timeout: 30m -> 1h"]);
    }

    #[test]
    fn gpu_memory_enforcement_settings_parse() {
        let p = parse("[jobs]\ngpu_memory_margin = \"50%\"\ngpu_memory_grace = \"1m\"\n")
            .unwrap()
            .policy;
        assert_eq!(
            (p.gpu_memory_margin_pct, p.gpu_memory_grace),
            (50.0, Duration::from_secs(60))
        );
        let d = Policy::default();
        assert_eq!(
            (d.gpu_memory_margin_pct, d.gpu_memory_grace),
            (20.0, Duration::from_secs(30))
        );
        assert!(err("[jobs]\ngpu_memory_margin = \"lots\"\n")
            .contains("config.toml:2:21: `gpu_memory_margin` = \"lots\" is not a percentage from 0% to 1000%"));
        assert!(err("[jobs]\ngpu_memory_margin = \"20\"\n").contains("is not a percentage"));
        assert!(
            err("[jobs]\ngpu_memory_grace = \"soon\"\n").contains("`gpu_memory_grace` = \"soon\" is not a duration")
        );
    }

    #[test]
    fn overrun_margin_parses_and_is_checked() {
        assert_eq!(Policy::default().overrun_margin, Duration::from_secs(30));
        assert_eq!(
            parse("[jobs]\noverrun_margin = \"2m\"\n")
                .unwrap()
                .policy
                .overrun_margin,
            Duration::from_secs(120)
        );
        assert!(
            err("[jobs]\noverrun_margin = \"late\"\n")
                .contains("config.toml:2:18: `overrun_margin` = \"late\" is not a duration"),
            "{}",
            err("[jobs]\noverrun_margin = \"late\"\n")
        );
        assert!(
            err("[jobs]\noverrun_margin = \"2d\"\n").contains("`overrun_margin` = \"2d\" is longer than 1d"),
            "{}",
            err("[jobs]\noverrun_margin = \"2d\"\n")
        );
    }

    #[test]
    fn disk_table_parses_and_explains_its_mistakes() {
        let d = parse("[disk]\nmin_free = \"5%\"\nlayer_size = \"none\"\n")
            .unwrap()
            .policy
            .disk;
        assert_eq!(
            d,
            Disk {
                min_free: MinFree::Percent(5.0),
                layer_size: None
            }
        );
        assert_eq!(
            parse("[disk]\nmin_free = \"20GiB\"\nlayer_size = \"50GiB\"\n")
                .unwrap()
                .policy
                .disk,
            Disk {
                min_free: MinFree::Bytes(20 << 30),
                layer_size: Some(50 << 30)
            }
        );
        assert_eq!(parse("").unwrap().policy.disk, Disk::default());
        for (text, want) in [
            ("[disk]\nmin_free = \"lots\"\n", "config.toml:2:12: disk `min_free` = \"lots\" is not a size or a percentage; write e.g. \"10GiB\" or \"5%\""),
            ("[disk]\nmin_free = \"120%\"\n", "is not a size or a percentage"),
            ("[disk]\nlayer_size = \"10MiB\"\n", "config.toml:2:14: disk `layer_size` = \"10MiB\" is not a size of at least 1 GiB or \"none\""),
            ("[disk]\nfree = \"1GiB\"\n", "config.toml:2:1: unknown field `free`"),
        ] {
            let e = err(text);
            assert!(e.contains(want), "{text:?}\n  got:  {e}\n  want: {want}");
        }
    }

    #[test]
    fn sessions_table_parses_and_explains_its_mistakes() {
        let s = parse("[sessions]\nmax_gpus = 2\ndefault_length = \"1h\"\nmax_length = \"8h\"\nbefore_batch = false\nnotebook_image = \"quay.io/jupyter/pytorch-notebook:cuda12-latest\"\n").unwrap().policy.sessions;
        let nb = Some("quay.io/jupyter/pytorch-notebook:cuda12-latest".to_string());
        assert_eq!(
            s,
            Sessions {
                max_gpus: Some(2),
                default_length: Duration::from_secs(3600),
                max_length: Duration::from_secs(8 * 3600),
                before_batch: false,
                notebook_image: nb,
                ..Sessions::default()
            }
        );
        let idle = parse("[sessions]\nidle_after = \"4s\"\nidle_batch = true\nkeep_free = 2\n")
            .unwrap()
            .policy
            .sessions;
        assert_eq!(
            (idle.idle_after, idle.idle_batch, idle.keep_free),
            (Some(Duration::from_secs(4)), true, 2)
        );
        let off = parse("[sessions]\nidle_after = \"none\"\nkeep_free = 0\n")
            .unwrap()
            .policy
            .sessions;
        assert_eq!((off.idle_after, off.keep_free), (None, 0));
        assert_eq!(Sessions::default().idle_after, Some(Duration::from_secs(3600)));
        assert_eq!(parse("").unwrap().policy.sessions, Sessions::default());
        // A fresh machine bounds what sessions (which jump the queue, never preempted) may claim; 0 lifts it.
        assert_eq!(Sessions::default().max_gpus, Some(2));
        assert_eq!(
            parse("[sessions]\nmax_gpus = 0\n").unwrap().policy.sessions.max_gpus,
            None
        );
        let cases: &[(&str, &str)] = &[
            ("[sessions]\nmax_gpu = 2\n", "config.toml:2:1: unknown field `max_gpu`"),
            ("[sessions]\nmax_gpus = -1\n", "config.toml:2:12: `max_gpus` = -1 is out of range"),
            ("[sessions]\nmax_length = \"forever\"\n", "config.toml:2:14: `max_length` = \"forever\" is not a duration"),
            ("[sessions]\nmax_length = \"30d\"\n", "`max_length` = \"30d\" is longer than 7d"),
            ("[sessions]\ndefault_length = \"10h\"\nmax_length = \"2h\"\n", "config.toml:2:18: sessions `default_length` (10h) is longer than `max_length` (2h)"),
            ("[sessions]\nmax_length = \"1h\"\n", "config.toml:2:14: sessions `default_length` (4h) is longer than `max_length` (1h); lower `default_length`"),
            ("[sessions]\nidle_after = \"soon\"\n", "config.toml:2:14: `idle_after` = \"soon\" is not a duration"),
            ("[sessions]\nforward_port = 8888\n", "config.toml:2:16: sessions `forward_port` = 8888 is not a port below 1024; only root may bind"),
            ("[sessions]\nforward_port = 0\n", "`forward_port` = 0 is not a port below 1024"),
            ("[sessions]\nkeep_free = -1\n", "config.toml:2:13: `keep_free` = -1 is out of range"),
            ("[sessions]\nidle_batch = \"yes\"\n", "invalid type: string \"yes\", expected a boolean"),
            ("[sessions]\nbefore_batch = 1\n", "invalid type: integer `1`, expected a boolean"),
            ("[sessions]\nnotebook_image = \"a b\"\n", "config.toml:2:18: sessions `notebook_image` = \"a b\" is not an image name"),
        ];
        for (text, want) in cases {
            let e = err(text);
            assert!(e.contains(want), "{text:?}\n  got:  {e}\n  want: {want}");
        }
    }

    #[test]
    fn bookings_table_parses_and_explains_its_mistakes() {
        let b = parse("[bookings]\nenabled = false\nmax_gpu_hours_per_week = 40\nmax_ahead = \"7d\"\nmax_length = \"8h\"\nslot = \"1h\"\nrelease_after = \"15m\"\nmax_gpus = 2\n").unwrap().policy.bookings;
        let h = |n: u64| Duration::from_secs(n * 3600);
        assert_eq!(
            b,
            Bookings {
                enabled: false,
                max_gpu_hours_per_week: Some(40),
                max_ahead: h(7 * 24),
                max_length: h(8),
                slot: h(1),
                release_after: Duration::from_secs(900),
                max_gpus: Some(2)
            }
        );
        // A fresh machine is bounded: a day per booking, 48 GPU-hours a week per user, two weeks ahead.
        let d = parse("").unwrap().policy.bookings;
        assert_eq!(
            (
                d.enabled,
                d.slot,
                d.release_after,
                d.max_ahead,
                d.max_gpus,
                d.max_length,
                d.max_gpu_hours_per_week
            ),
            (
                true,
                Duration::from_secs(1800),
                Duration::from_secs(1800),
                h(14 * 24),
                None,
                h(24),
                Some(48)
            )
        );
        // 0 turns the weekly limit off.
        assert_eq!(
            parse("[bookings]\nmax_gpu_hours_per_week = 0\n")
                .unwrap()
                .policy
                .bookings
                .max_gpu_hours_per_week,
            None
        );
        let cases: &[(&str, &str)] = &[
            (
                "[bookings]\nslots = \"30m\"\n",
                "config.toml:2:1: unknown field `slots`",
            ),
            (
                "[bookings]\nslot = \"7m\"\n",
                "config.toml:2:8: bookings `slot` = \"7m\" is not a whole number of minutes that divides a day",
            ),
            ("[bookings]\nslot = \"90s\"\n", "is not a whole number of minutes"),
            (
                "[bookings]\nmax_ahead = \"2y\"\n",
                "`max_ahead` = \"2y\" is longer than",
            ),
            (
                "[bookings]\nmax_length = \"8760h\"\n",
                "`max_length` = \"8760h\" is longer than 31d",
            ),
            (
                "[bookings]\nrelease_after = \"later\"\n",
                "config.toml:2:17: `release_after` = \"later\" is not a duration",
            ),
            (
                "[bookings]\nmax_gpus = 0\n",
                "config.toml:2:12: `max_gpus` = 0 is out of range",
            ),
            (
                "[bookings]\nmax_gpu_hours_per_week = -3\n",
                "`max_gpu_hours_per_week` = -3 is out of range",
            ),
            (
                "[bookings]\nenabled = \"yes\"\n",
                "invalid type: string \"yes\", expected a boolean",
            ),
        ];
        for (text, want) in cases {
            let e = err(text);
            assert!(e.contains(want), "{text:?}\n  got:  {e}\n  want: {want}");
        }
    }

    #[test]
    fn notify_and_metrics_tables_parse_and_explain_their_mistakes() {
        use crate::protocol::notify::NotifyEvent;
        let c = parse("[notify]\nsmtp_host = \"smtp.lab.org\"\nsmtp_from = \"gantry@lab.org\"\nwebhook_hosts = [\"Hooks.Slack.com\", \"127.0.0.1:9000\"]\nwebhooks = [{ url = \"https://chat.lab.org/h\", on = [\"failed\"] }, { url = \"http://x.org/\" }]\nmax_tries = 3\n[metrics]\nlisten = \"127.0.0.1:9464\"\n").unwrap();
        let smtp = c.notify.smtp.as_ref().unwrap();
        assert_eq!(
            (smtp.host.as_str(), smtp.port, smtp.starttls),
            ("smtp.lab.org", 587, true),
            "STARTTLS on the submission port by default"
        );
        assert_eq!(c.notify.webhook_hosts, ["hooks.slack.com", "127.0.0.1:9000"]);
        assert_eq!(
            c.notify.webhooks,
            vec![
                ("https://chat.lab.org/h".to_string(), vec![NotifyEvent::Failed]),
                ("http://x.org/".to_string(), vec![NotifyEvent::StoreProblem])
            ]
        );
        assert_eq!(
            (c.notify.max_tries, c.metrics.listen.map(|a| a.port())),
            (3, Some(9464))
        );
        assert_eq!(parse("").unwrap().metrics.listen, None, "metrics are off by default");
        let bounded = parse("[metrics]\nlisten = \"127.0.0.1:9464\"\nmax_connections = 8\nidle_timeout = \"3s\"\n")
            .unwrap()
            .metrics;
        assert_eq!(
            (bounded.max_connections, bounded.idle_timeout),
            (8, Duration::from_secs(3))
        );
        assert_eq!(
            (
                parse("").unwrap().metrics.max_connections,
                parse("").unwrap().metrics.idle_timeout
            ),
            (64, Duration::from_secs(10)),
            "bounded by default"
        );
        assert_eq!(parse("").unwrap().policy.sessions.forward_port, 1021);
        assert_eq!(
            parse("[sessions]\nforward_port = 999\n")
                .unwrap()
                .policy
                .sessions
                .forward_port,
            999
        );
        assert!(parse("[metrics]\nlisten = \"0.0.0.0:9464\"\nallow_remote = true\n")
            .unwrap()
            .metrics
            .listen
            .is_some());
        let cases: &[(&str, &str)] = &[
            (
                "[metrics]\nlisten = \"0.0.0.0:9464\"\n",
                "config.toml:2:10: metrics `listen` = \"0.0.0.0:9464\" is not a loopback address",
            ),
            ("[metrics]\nlisten = \"localhost\"\n", "is not an address and port"),
            (
                "[metrics]\nmax_connections = 0\n",
                "config.toml:2:19: `max_connections` = 0 is out of range",
            ),
            (
                "[metrics]\nidle_timeout = \"never\"\n",
                "`idle_timeout` = \"never\" is not a duration",
            ),
            (
                "[notify]\nsmtp_host = \"smtp.lab.org\"\n",
                "config.toml:2:13: `smtp_host` is set but `smtp_from` is not",
            ),
            (
                "[notify]\nsmtp_host = \"a\"\nsmtp_from = \"nobody\"\n",
                "`smtp_from` = \"nobody\" is not an email address",
            ),
            (
                "[notify]\nsmtp_port = 25\n",
                "`smtp_port` is set but `smtp_host` is not",
            ),
            (
                "[notify]\nwebhook_hosts = [\"a b\"]\n",
                "`webhook_hosts` lists \"a b\": it is not a host name",
            ),
            (
                "[notify]\nwebhooks = [{ url = \"ftp://x/\" }]\n",
                "is not an http:// or https:// URL",
            ),
            (
                "[notify]\nwebhooks = [{ url = \"http://x.org/\", on = [\"sometimes\"] }]\n",
                "lists \"sometimes\", which is not an event",
            ),
            ("[notify]\nsmtp_relay = \"x\"\n", "unknown field `smtp_relay`"),
            ("[notify]\nmax_tries = 0\n", "`max_tries` = 0 is out of range"),
        ];
        for (text, want) in cases {
            let e = err(text);
            assert!(e.contains(want), "{text:?}\n  got:  {e}\n  want: {want}");
        }
        let changed = parse("[metrics]\nlisten = \"127.0.0.1:9464\"\n")
            .unwrap()
            .restart_only_changes(&LabConfig::default());
        assert_eq!(changed, ["metrics"]);
    }

    #[test]
    fn preemption_table_parses_and_explains_its_mistakes() {
        let p = Policy::default().preemption;
        assert_eq!(
            (p.enabled, p.default_preemptible, p.rules()),
            (false, false, None),
            "off out of the box"
        );
        assert_eq!(
            (p.rules.min_run_ms, p.rules.max_per_day, p.rules.priority_gap),
            (10 * 60_000, 3, Some(11))
        );
        // A user's highest priority does not preempt a priority-0 job by priority alone.
        assert!(Policy::default().user_priority.1 < p.rules.priority_gap.unwrap());
        let p = parse("[preemption]\nenabled = true\ndefault_preemptible = true\nreserve_after = false\npriority_gap = 5\nfair_share = true\nmin_run = \"30m\"\nmax_per_day = 2\n").unwrap().policy.preemption;
        let want = crate::scheduler::PreemptRules {
            overdue: false,
            priority_gap: Some(5),
            fair_share: true,
            min_run_ms: 30 * 60_000,
            max_per_day: 2,
        };
        assert_eq!((p.enabled, p.default_preemptible, p.rules()), (true, true, Some(want)));
        assert_eq!(
            parse("[preemption]\npriority_gap = 0\n")
                .unwrap()
                .policy
                .preemption
                .rules
                .priority_gap,
            None
        );
        let cases: &[(&str, &str)] = &[
            (
                "[preemption]\nenable = true\n",
                "config.toml:2:1: unknown field `enable`",
            ),
            (
                "[preemption]\nenabled = \"yes\"\n",
                "config.toml:2:11: invalid type: string \"yes\", expected a boolean",
            ),
            (
                "[preemption]\npriority_gap = -1\n",
                "config.toml:2:16: `priority_gap` = -1 is out of range; use a number from 1 to 2000",
            ),
            (
                "[preemption]\nmin_run = \"soon\"\n",
                "config.toml:2:11: `min_run` = \"soon\" is not a duration",
            ),
            (
                "[preemption]\nmin_run = \"2d\"\n",
                "`min_run` = \"2d\" is longer than 1d",
            ),
            (
                "[preemption]\nmax_per_day = 0\n",
                "config.toml:2:15: `max_per_day` = 0 is out of range",
            ),
        ];
        for (text, want) in cases {
            let e = err(text);
            assert!(e.contains(want), "{text:?}\n  got:  {e}\n  want: {want}");
        }
        let changed = parse("[preemption]\nenabled = true\n")
            .unwrap()
            .policy
            .changes_from(&Policy::default());
        assert_eq!(changed, vec!["preemption.enabled: false -> true"]);
    }

    #[test]
    fn gpus_resolve_against_the_machine_by_index_or_uuid() {
        let inv: Vec<(u32, String)> = (0..4).map(|i| (i, format!("GPU-{i}"))).collect();
        let c = parse("\n\ngpus = [0, \"GPU-3\"]\n").unwrap();
        assert_eq!(c.gpus.as_ref().unwrap().resolve(&inv).unwrap(), BTreeSet::from([0, 3]));
        let c = parse("gpus = [0, 7]\n").unwrap();
        let e = c.gpus.unwrap().resolve(&inv).unwrap_err().to_string();
        assert!(
            e.starts_with("/etc/gantry/config.toml:1:8: `gpus` names GPU 7, which this machine does not have"),
            "{e}"
        );
        assert!(e.contains("0 (GPU-0), 1 (GPU-1)"), "{e}");
    }

    #[test]
    fn admins_and_what_they_may_do() {
        let p = Policy::default();
        assert!(p.is_admin(0) && !p.is_admin(4242));
        assert_eq!(
            (p.priority_range(0), p.priority_range(4242)),
            (config::ADMIN_PRIORITY, config::USER_PRIORITY)
        );
        assert!(p.may_see_private(4242, 4242) && p.may_see_private(0, 4242) && !p.may_see_private(4243, 4242));
        let all = Policy {
            see_others: SeeOthers::All,
            ..Policy::default()
        };
        assert!(all.may_see_private(4243, 4242));
        // The root group's members (gid 0 is root's primary group) are admins.
        let g = parse("[access]\nadmin_group = \"root\"\n").unwrap().policy;
        assert_eq!(g.admin_gid, Some(0));
        let changes = g.changes_from(&p);
        assert!(
            changes
                .iter()
                .any(|c| c.starts_with("access.admin_group: None -> Some(\"root\")")),
            "{changes:?}"
        );
    }

    /// The packaged /etc/gantry/config.toml is valid as shipped, and every key it documents (the
    /// commented `#key = value` lines) is one the engine reads, with a valid example value.
    #[test]
    fn the_packaged_config_is_valid_and_documents_only_real_keys() {
        let shipped = include_str!("../../../../packaging/config.toml").replace("\"gantry-admins\"", "\"root\"");
        let path = Path::new("/etc/gantry/config.toml");
        LabConfig::parse(&shipped, path).unwrap_or_else(|e| panic!("as shipped: {e}"));
        let mut documented = 0;
        let all: String = shipped
            .lines()
            .map(|l| match l.strip_prefix('#') {
                Some(kv)
                    if kv.split_once(" = ").is_some_and(|(k, _)| {
                        !k.is_empty() && k.chars().all(|c| c.is_ascii_lowercase() || c == '_')
                    }) =>
                {
                    documented += 1;
                    format!("{kv}\n")
                }
                _ => format!("{l}\n"),
            })
            .collect();
        assert!(documented >= 19, "only {documented} documented keys found");
        LabConfig::parse(&all, path).unwrap_or_else(|e| panic!("with every documented key set: {e}"));
    }
}
